"""``pb_utils.ModelConfig``: what a Triton python model's ``auto_complete_config`` edits.

Written from Triton's python-backend documentation and the behaviour its tests assert (no
code of Triton's). The model gets the configuration as Triton's model-config JSON (what
``GET .../config`` shows) and may set ``max_batch_size``, turn on dynamic batching, add
inputs and outputs and set the transaction policy; what it returns becomes the model's
configuration. A change that contradicts the configuration file is a ``ValueError`` whose
text is Triton's, since models and their tests compare it.
"""

from __future__ import annotations

import copy
from typing import Any

# The properties a tensor added by auto-complete may have, per section.
_PROPERTIES = {
    "input": ("name", "data_type", "dims", "optional"),
    "output": ("name", "data_type", "dims"),
}
_PROPERTY_WORDS = {
    "input": "'name', 'data_type', 'dims' and 'optional'",
    "output": "'name', 'data_type' and 'dims'",
}


class ModelConfig:
    """The model's configuration under auto-complete (Triton's JSON form)."""

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._model_config = copy.deepcopy(model_config)
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        """The configuration as it stands (a copy: edit it through the setters)."""
        return copy.deepcopy(self._model_config)

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = self._model_config["max_batch_size"]
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Dynamic batching as the scheduler, unless the configuration chose another."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's name
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        unknown = [key for key in transaction_policy_dict if key != "decoupled"]
        if unknown:
            raise ValueError(
                "model transaction property in auto-complete-config function for model "
                f"'{self._name}' contains property other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" not in transaction_policy_dict:
            return
        wanted = transaction_policy_dict["decoupled"]
        if "decoupled" in policy and policy["decoupled"] != wanted:
            raise ValueError(
                "trying to change decoupled property in auto-complete-config for model "
                f"'{self._name}', which is already set to '{policy['decoupled']}'."
            )
        policy["decoupled"] = wanted

    def _add(self, section: str, tensor: dict[str, Any]) -> None:
        """A tensor the model says it has: new, or one the configuration names, which
        must then agree with it (a datatype or dims the file left out are taken)."""
        name = tensor.get("name")
        if any(key not in _PROPERTIES[section] for key in tensor):
            raise ValueError(
                f"{section} '{name}' in auto-complete-config function for model "
                f"'{self._name}' contains property other than {_PROPERTY_WORDS[section]}."
            )
        if name is None:
            raise ValueError(
                f"{section} in auto-complete-config function for model '{self._name}' is "
                "missing 'name' property."
            )
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    f"{section} '{name}' in auto-complete-config function for model "
                    f"'{self._name}' is missing '{required}' property."
                )
        current = next((t for t in self._model_config[section] if t["name"] == name), None)
        if current is None:
            self._model_config[section].append(dict(tensor))
            return
        configured_type = current.get("data_type", "TYPE_INVALID")
        if configured_type != "TYPE_INVALID" and configured_type != tensor["data_type"]:
            raise ValueError(
                f"unable to load model '{self._name}', configuration expects datatype "
                f"{configured_type} for {section} '{name}', model provides "
                f"{tensor['data_type']}"
            )
        for field in ("dims", "optional"):
            configured = current.get(field)
            if field in tensor and configured not in (None, []) and configured != tensor[field]:
                raise ValueError(
                    f"model '{self._name}', tensor '{name}': the model expects {field} "
                    f"{tensor[field]} but the model configuration specifies {field} "
                    f"{configured}"
                )
        current.update(tensor)
