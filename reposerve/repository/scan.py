"""Read one model folder: its config, the versions its policy selects, and their backend.

Reads file names only; the backends open the model files inside instance processes.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from reposerve.config import ModelConfig, find_config, load_model_config
from reposerve.config.backends import BACKENDS, BackendEntry, backend_entry
from reposerve.config.chat_templates import ChatTemplate
from reposerve.config.labels import read_labels
from reposerve.config.openai import read_chat_template
from reposerve.config.parameters import check_backend, check_files
from reposerve.errors import ConfigError

MODEL_NAME = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]*$")
NAME_MAX = 255  # a model name is a folder's name: the file system's limit on one


def is_model_name(name: str) -> bool:
    return len(name) <= NAME_MAX and MODEL_NAME.match(name) is not None


class VersionSource(msgspec.Struct, frozen=True):
    number: int
    path: Path
    backend: str

    @property
    def pipeline(self) -> bool:
        """Its steps are the model (an ensemble): no model file, no instance process."""
        return backend_entry(self.backend).pipeline


class ModelSource(msgspec.Struct, frozen=True):
    name: str
    path: Path
    config: ModelConfig
    versions: list[VersionSource]
    labels: dict[str, tuple[str, ...]] = {}  # output -> its class labels (label_filename)
    chat_template: ChatTemplate | None = None  # [openai] kind = "chat"


class ConfigOverride(msgspec.Struct, frozen=True):
    """A config that replaces the folder's for one load; ``label`` names it in errors."""

    config: ModelConfig
    label: str


def model_names(root: Path) -> list[str]:
    """Folders of ``root`` that name models, sorted."""
    return sorted(
        entry.name for entry in root.iterdir() if entry.is_dir() and is_model_name(entry.name)
    )


def check_model_name(name: str) -> None:
    """ConfigError unless ``name`` can name a model (Triton's words in it: tests look)."""
    if len(name) > NAME_MAX:
        raise ConfigError(
            f"failed to load '{name[:64]}...': not a valid model name: {len(name)} characters, "
            f"at most {NAME_MAX} (it names a folder)"
        )
    if not MODEL_NAME.match(name):
        raise ConfigError(
            f"failed to load '{name}': not a valid model name (letters, digits, _ . -): "
            "Invalid stub name: contains invalid characters"
        )


def check_model_folder(root: Path, name: str) -> Path:
    """``root/name`` if that can be a model folder; else ConfigError saying why not."""
    check_model_name(name)
    path = root / name
    if not path.is_dir():
        raise ConfigError(f"{name}: no such model folder in {root}")
    return path


def read_model(root: Path, name: str, override: ConfigOverride | None = None) -> ModelSource:
    """Parse ``root/name``; ConfigError names the file and what to fix. ``override`` is a
    config given with a load request, used instead of the folder's (Triton's rule)."""
    path = check_model_folder(root, name)
    if override is not None:
        config, label = override.config, override.label
    else:
        config_path = find_config(path)
        if config_path is None:
            config, label = _generated_config(path, name), f"{name} (no config file)"
        else:
            label = f"{name}/{config_path.name}"
            config = load_model_config(config_path, label=label)
    numbers = sorted(int(entry.name) for entry in path.iterdir() if _is_version_folder(entry))
    if not numbers:
        raise ConfigError(f"{name}: no version folders. Hint: put the model in {name}/1/")
    chosen = _apply_policy(config, numbers, label)
    found = {number: _backend(config, path / str(number), name) for number in chosen}
    versions = [
        VersionSource(number, path / str(number), backend) for number, (backend, _) in found.items()
    ]
    if config.backend is None:  # the backend's rules once the model files name it
        for backend in sorted({backend for backend, _ in found.values()}):
            check_backend(config, backend, label)
    for backend, files in found.values():
        check_files(config, backend, files, label)
    labels = read_labels(path, config, label)
    template = read_chat_template(path, config, label)
    return ModelSource(name, path, config, versions, labels, template)


def _generated_config(path: Path, name: str) -> ModelConfig:
    """A folder without a config file: Triton generates one for ONNX models (backend,
    inputs, outputs and max_batch_size from the graph, read when an instance loads it)
    and for python models (a TritonPythonModel's ``auto_complete_config`` fills it in).
    A file that tells its own tensors wins (model.onnx beside a model.py that loads it)."""
    versions = [entry for entry in path.iterdir() if _is_version_folder(entry)]
    configless = [entry for entry in BACKENDS if entry.configless]
    configless.sort(key=lambda entry: not entry.auto_complete)
    for entry in configless:
        if any(_present(version, entry) for version in versions):
            return ModelConfig(
                backend=entry.name, default_max_batch_size=entry.default_max_batch_size
            )
    models = " or ".join(entry.configless for entry in configless)
    raise ConfigError(
        f"{name}/config.toml: missing. Hint: every model folder needs one (or Triton's "
        f"config.pbtxt); only {models} may go without"
    )


def _is_version_folder(entry: Path) -> bool:
    return entry.is_dir() and entry.name.isdigit() and int(entry.name) > 0


def _apply_policy(config: ModelConfig, numbers: list[int], label: str) -> list[int]:
    policy = config.version_policy
    if policy.all:
        return numbers
    if policy.specific is not None:
        missing = [number for number in policy.specific if number not in numbers]
        if missing:
            raise ConfigError(
                f"{label}: version_policy.specific: no folder for version(s) "
                f"{', '.join(map(str, missing))}"
            )
        return sorted(set(policy.specific))
    return numbers[-(policy.latest or 1) :]


def _present(version_path: Path, entry: BackendEntry) -> tuple[str, ...]:
    """The names of ``entry``'s model files that ``version_path`` holds."""
    return tuple(file for file in entry.files if (version_path / file).is_file())


def _backend(config: ModelConfig, version_path: Path, name: str) -> tuple[str, tuple[str, ...]]:
    """The backend of a version folder, and the names of its model files there."""
    where = f"{name}/{version_path.name}"
    entry = None if config.backend is None else backend_entry(config.backend)
    if entry is not None and entry.pipeline:  # its steps are the model: the folder may be empty
        return entry.name, ()
    if config.default_model_filename is not None:
        backend = _named_file_backend(config, config.default_model_filename, version_path, where)
        return backend, (config.default_model_filename,)
    if entry is not None:
        files = _present(version_path, entry)
        if not files:
            hint = entry.missing_file.format(path=version_path.resolve() / entry.files[0])
            raise ConfigError(
                f"{where}: backend {entry.name} needs {' or '.join(entry.files)}{hint}"
            )
        return entry.name, files
    found = [(entry.name, files) for entry in BACKENDS if (files := _present(version_path, entry))]
    if len(found) != 1:
        wanted = ", ".join(file for entry in BACKENDS for file in entry.files)
        what = "several model files" if found else "no model file"
        raise ConfigError(
            f"{where}: {what}; put exactly one of {wanted} there or set the backend in its config"
        )
    return found[0]


def _named_file_backend(config: ModelConfig, filename: str, version_path: Path, where: str) -> str:
    """The backend of a version whose file is ``filename``, its ``default_model_filename``
    (Triton's): the configured one, else the one whose own file names end as this one does."""
    if not (version_path / filename).exists():  # a file, or a folder (a saved model)
        raise ConfigError(f"{where}: no {filename} (the config's default_model_filename)")
    if config.backend is not None:
        return config.backend
    suffix = Path(filename).suffix
    for entry in BACKENDS:
        if any(Path(file).suffix == suffix for file in entry.files):
            return entry.name
    raise ConfigError(
        f"{where}: cannot tell the backend of {filename} from its name. Hint: set the "
        "backend (or Triton's platform) in the config"
    )
