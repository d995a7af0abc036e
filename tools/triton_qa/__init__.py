"""Run Triton's own QA material (qa/L0_backend_python, python_backend's examples, L0_http's
generate tests) unchanged against reposerve.

    .venv/bin/python -m tools.triton_qa --server-repo PATH --backend-repo PATH [--suite NAME]

Each suite re-expresses its test.sh's repository setup as data (tools/triton_qa/suites/),
starts reposerve on Triton's ports with the mapped flags, runs the unchanged client files,
stops the server and prints one line per case. Not part of CI: it needs Triton's sources.
"""
