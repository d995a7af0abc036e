"""Which models the OpenAI-compatible routes serve, as ``OpenAIModel`` entries."""

from __future__ import annotations

from reposerve.config import ModelConfig
from reposerve.config.openai import openai_tensors
from reposerve.errors import ErrorKind, RepositoryError
from reposerve.operations import OpenAIModel
from reposerve.repository import ModelState, ModelVersion


def describe(name: str, config: ModelConfig, version: ModelVersion | None) -> OpenAIModel:
    """``name``'s entry: from its loaded ``version`` (with its chat template), or from its
    config alone when it is not loaded."""
    table = config.openai
    assert table is not None
    name_in, name_out = openai_tensors(config)
    return OpenAIModel(
        name=name,
        kind=table.kind,
        input=name_in,
        output=name_out,
        inputs={tensor.name: tensor.datatype for tensor in config.input},
        outputs=[tensor.name for tensor in config.output],
        max_tokens=table.max_tokens,
        decoupled=config.decoupled,
        batched=config.max_batch_size > 0,
        input_shape=next((t.shape for t in config.input if t.name == name_in), []),
        created=version.created if version is not None else 0,
        chat_template=version.chat_template if version is not None else None,
    )


def check_opted_in(name: str, config: ModelConfig) -> None:
    """RepositoryError (404) unless ``name`` is on the routes."""
    if config.openai is None:
        raise RepositoryError(
            f"model '{name}' is not served on the OpenAI-compatible routes. Hint: add "
            '[openai] kind = "chat" | "completion" | "embedding" to its config.toml',
            kind=ErrorKind.NOT_FOUND,
        )


def served(version: ModelVersion) -> OpenAIModel:
    """The entry of a model about to serve a request on the routes."""
    check_opted_in(version.name, version.config)
    return describe(version.name, version.config, version)


def listing(versions: list[ModelVersion], others: dict[str, ModelConfig]) -> list[OpenAIModel]:
    """Every model that opts in: the ready ones of ``versions`` (the newest version of
    each), and ``others`` (on-demand models not loaded, by name), sorted by name."""
    entries: dict[str, OpenAIModel] = {}
    for version in versions:
        if version.config.openai is not None and version.state is ModelState.READY:
            entries[version.name] = describe(version.name, version.config, version)
    for name, config in others.items():
        if config.openai is not None and name not in entries:
            entries[name] = describe(name, config, None)
    return [entries[name] for name in sorted(entries)]
