"""qa/L0_http/test.sh's generate endpoint tests: generate_endpoint_test.py on mock_llm, a
python model (qa/python_models/generate_models)."""

from __future__ import annotations

from ..spec import Pytest, Step, Suite

SUITE = Suite(
    name="http_generate",
    steps=(
        Step(
            name="",
            cwd="qa/L0_http",
            args=("--model-repository={PWD}/../python_models/generate_models", "--log-verbose=1"),
            log="inference_server_generate_endpoint_test.log",
            clients=(
                Pytest(
                    "generate_endpoint_test.py",
                    as_in_test_sh="python generate_endpoint_test.py (needs sseclient-py)",
                    runner="unittest",  # its TestResultCollector needs unittest's result
                ),
            ),
        ),
    ),
)
