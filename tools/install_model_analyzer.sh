#!/usr/bin/env bash
# Install Triton Model Analyzer for its test, in a virtual environment of its own.
#
# It cannot share .venv: it needs tritonclient[all], whose 2.51.0 (the one pinned in the
# test extra, for its perf_analyzer binary) holds protobuf below 5, against reposerve's
# protobuf>=5.26. Model Analyzer runs perf_analyzer from PATH, so its test puts .venv's
# binary there. The test skips, saying why, when this environment is missing.
set -u
python=${1:-python3}
venv=${2:-.venv-analyzer}
"$python" -m venv "$venv" &&
  "$venv/bin/python" -m pip install -q --upgrade pip &&
  "$venv/bin/python" -m pip install -q 'triton-model-analyzer==1.58.0' ||
  echo "model-analyzer: could not install into $venv; its test will be skipped"
exit 0
