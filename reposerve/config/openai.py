"""``[openai]``: a model on the OpenAI-compatible routes, and the rules on it.

``kind = "chat"`` or ``"completion"`` is a text generator in Triton's text format: the
prompt goes in ``input`` (default ``text_input``, BYTES) and each response's ``output``
(default ``text_output``, BYTES) is the next piece of text. ``kind = "embedding"`` takes
one text in ``input`` (default: ``text_input``, or the model's only BYTES input) and gives
its vector in ``output`` (default: its only output; floating point). A chat model renders
its messages with a chat template: ``chat_template``, a Jinja file in the model folder, or
else the ``chat_template`` of a Hugging Face ``tokenizer_config.json`` there (with its
``bos_token`` and ``eos_token``); a load without one fails, saying so.
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from reposerve.config.chat_templates import ChatTemplate, TemplateError, compile_template
from reposerve.config.schema import ModelConfig, TensorConfig
from reposerve.errors import ConfigError

_FLOATS = ("FP16", "FP32", "FP64", "BF16")
TOKENIZER_CONFIG = "tokenizer_config.json"


def openai_tensors(config: ModelConfig) -> tuple[str, str]:
    """(input, output): the tensors the routes use, as named or by default. Call only on
    a config ``check_openai`` passed."""
    table = config.openai
    assert table is not None
    if table.kind != "embedding":
        return table.input or "text_input", table.output or "text_output"
    texts = [t.name for t in config.input if t.datatype == "BYTES"]
    default_input = "text_input" if "text_input" in texts else (texts[0] if texts else "")
    default_output = config.output[0].name if len(config.output) == 1 else ""
    return table.input or default_input, table.output or default_output


def check_openai(config: ModelConfig) -> str | None:
    """The first problem of the ``[openai]`` table against the config's tensors; a model
    that declares none (they come from its file or its auto_complete_config) is checked
    again once loaded, with them."""
    table = config.openai
    if table is None:
        return None
    if table.chat_template is not None and table.kind != "chat":
        return f'openai.chat_template: only a kind = "chat" model has one (this is "{table.kind}")'
    if not config.input and not config.output:
        return None  # its tensors come from the model (auto-complete): checked once loaded
    name_in, name_out = openai_tensors(config)
    if not name_in:
        return (
            "openai.input: name the input that takes the text (the model has no BYTES input "
            "to take by default)"
        )
    if not name_out:
        return "openai.output: name the output that holds the vector (the model has several)"
    inputs = {t.name: t for t in config.input}
    outputs = {t.name: t for t in config.output}
    problem = _check_tensor(inputs.get(name_in), "input", name_in, ("BYTES",), config)
    wanted = _FLOATS if table.kind == "embedding" else ("BYTES",)
    problem = problem or _check_tensor(outputs.get(name_out), "output", name_out, wanted, config)
    if problem:
        return problem
    text = inputs[name_in]
    if table.kind == "embedding" and math.prod(dim for dim in text.shape if dim != -1) != 1:
        return (
            f'openai.input: input "{name_in}" holds one text per request, so its shape has '
            f"no dim but 1 and -1 (it is {text.shape})"
        )
    if table.kind == "embedding" and config.decoupled:
        return (
            'openai.kind: an "embedding" model answers each text once; this model is '
            "decoupled (it streams responses)"
        )
    return None


def _check_tensor(
    tensor: TensorConfig | None,
    section: str,
    name: str,
    datatypes: tuple[str, ...],
    config: ModelConfig,
) -> str | None:
    if tensor is None:
        declared = ", ".join(t.name for t in getattr(config, section)) or "none"
        return (
            f'openai.{section}: "{name}" is not a declared {section} (declared: {declared}). '
            f"Hint: set openai.{section} to the one to use"
        )
    if tensor.datatype not in datatypes:
        return (
            f'openai.{section}: {section} "{name}" is {tensor.datatype}; the '
            f"{config.openai.kind if config.openai else ''} routes need {' or '.join(datatypes)}"
        )
    return None


def read_chat_template(folder: Path, config: ModelConfig, label: str) -> ChatTemplate | None:
    """A chat model's template, read and compiled once when it loads; None for others."""
    table = config.openai
    if table is None or table.kind != "chat":
        return None
    if table.chat_template is not None:
        key = f"{label}: openai.chat_template"
        path = folder / table.chat_template
        try:
            source = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(
                f'{key}: "{table.chat_template}" does not exist in the model folder'
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f'{key}: cannot read "{table.chat_template}": {exc}') from exc
        template = ChatTemplate(source)
    else:
        key = f"{label}: openai"
        template = _from_tokenizer_config(folder / TOKENIZER_CONFIG, key)
    try:
        compile_template(template.source)
    except TemplateError as exc:
        raise ConfigError(f"{key}: the chat template does not compile: {exc}") from exc
    return template


def _from_tokenizer_config(path: Path, key: str) -> ChatTemplate:
    missing = (
        f'{key}: a kind = "chat" model needs a chat template: set openai.chat_template to '
        f"a Jinja file in the model folder, or put a Hugging Face {TOKENIZER_CONFIG} with "
        "a chat_template there"
    )
    try:
        document = msgspec.json.decode(path.read_bytes())
    except FileNotFoundError:
        raise ConfigError(missing) from None
    except (OSError, msgspec.DecodeError, RecursionError) as exc:
        raise ConfigError(f"{key}: cannot read {TOKENIZER_CONFIG}: {exc}") from exc
    if not isinstance(document, dict):
        raise ConfigError(f"{key}: {TOKENIZER_CONFIG} is not a JSON object")
    source = document.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        named = {
            entry.get("name"): entry.get("template") for entry in source if isinstance(entry, dict)
        }
        source = named.get("default")
    if not isinstance(source, str):
        raise ConfigError(missing)
    return ChatTemplate(source, _token(document, "bos_token"), _token(document, "eos_token"))


def _token(document: dict, key: str) -> str:
    """A special token as tokenizer configs write it: text, or ``{"content": text}``."""
    value = document.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""
