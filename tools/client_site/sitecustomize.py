"""Run first by the interpreters tools.triton_client_examples starts (PYTHONPATH): gives
Triton's examples the pkg_resources their tritonclient imports."""

import tests.pkg_resources_stand_in  # noqa: F401
