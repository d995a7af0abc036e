"""Where the rules of reading a model folder are, found in the code: every ConfigError
raised and every problem a rule function returns, as a message pattern. The check-as-load
test asserts that some case breaks each one, so a new rule cannot go unwalked."""

from __future__ import annotations

import ast
import re

from tests.server import REPO_ROOT

# Rules check cannot meet, and why: they are not about a model folder's content.
EXEMPT = {
    ("repository/scan.py", "check_model_name"): "a load request's model name; check lists "
    "folders, whose names are valid",
    ("repository/scan.py", "check_model_folder"): "a load request naming no folder",
    ("config/load.py", "load_model_config", "cannot read"): "the operating system refusing "
    "a read (tests run as root, who reads anything)",
    ("config/labels.py", "read_labels", "cannot read"): "the same, for a label file",
    ("config/triton.py", "config_from_triton"): "Triton's schema gives the parameters map "
    "this shape before this code reads it",
    ("config/triton_parameters.py", "apply_triton_parameters"): "the same",
    ("config/triton.py", "from_triton"): "every field model_config.proto declares has a converter; "
    "the parser refuses the others first",
    ("config/triton.py", "_instance_groups"): "the same: every kind and field is read",
    ("config/triton.py", "_dynamic_batching"): "the same",
    ("config/triton.py", "_queue_policy", "not supported by"): "the same",
    ("config/triton.py", "_warmups", "not supported by"): "the same",
    ("config/triton.py", "_optimization", "not supported by"): "the same",
    ("config/triton.py", "_datatype"): "protobuf writes only the DataType enum's names, and "
    "leaves TYPE_INVALID (its default) out",
}
# The modules a model folder is read through before any process starts. Not here:
# config/complete.py (the model file's own tensors, read by an instance) and
# config/triton_json.py (a load request's JSON config, which no folder holds).
RULE_MODULES = (
    "config/load.py", "config/validate.py", "config/tables.py", "config/ensemble.py",
    "config/parameters.py", "config/onnx_options.py", "config/torch_options.py",
    "config/labels.py", "config/openai.py", "config/pbtxt.py", "config/triton.py",
    "config/triton_parameters.py", "repository/scan.py",
)  # fmt: skip


def _pattern(node: ast.expr) -> str | None:
    """A message expression as a regular expression: its text, with ``.*`` for each value
    put in; None when it is not a message."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            re.escape(part.value) if isinstance(part, ast.Constant) else ".*"
            for part in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _pattern(node.left), _pattern(node.right)
        return None if left is None else left + (right or ".*")
    return None


def rule_sites() -> list[tuple[str, str, int, str]]:
    """(module, function, line, message pattern) of every ConfigError raised and every
    problem a ``-> str | None`` rule function returns in ``RULE_MODULES``."""
    sites = []
    for module in RULE_MODULES:
        tree = ast.parse((REPO_ROOT / "reposerve" / module).read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            returns_problem = ast.unparse(function.returns or ast.Constant(None)) == "str | None"
            for node in ast.walk(function):
                message = None
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    if ast.unparse(node.exc.func) == "ConfigError" and node.exc.args:
                        message = node.exc.args[0]
                elif returns_problem and isinstance(node, ast.Return) and node.value:
                    message = node.value
                pattern = None if message is None else _pattern(message)
                if pattern is not None:
                    sites.append((module, function.name, node.lineno, pattern))
    return sites


def exempt(module: str, function: str, pattern: str) -> bool:
    return any(
        key[:2] == (module, function) and (len(key) == 2 or re.escape(key[2]) in pattern)
        for key in EXEMPT
    )


def breaks(pattern: str, message: str) -> bool:
    """Whether ``message`` is the rule's: a problem a rule function returns ends the message,
    after the file's label (``: ``) or the table it is about (``.``)."""
    return re.fullmatch(f"(.*(: |\\.))?{pattern}", message, re.DOTALL) is not None
