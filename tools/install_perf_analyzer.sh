#!/usr/bin/env bash
# Make Triton's perf_analyzer runnable for the tests.
#
# The real binary ships inside the tritonclient==2.51.0 wheel (installed by the `test`
# extra; later wheels need a newer glibc than Debian 12). It links libcudart.so.12 even
# on CPU, which the nvidia-cuda-runtime-cu12 wheel carries (also in `test`), and libb64,
# which Debian packages as libb64-0d. The tests skip perf_analyzer, saying why, when it
# still cannot start.
set -u
venv=${1:-.venv}
binary="$venv/bin/perf_analyzer"
[ -x "$binary" ] || { echo "perf_analyzer: not in $venv (tritonclient wheel without it)"; exit 0; }
if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "perf_analyzer: installing libb64-0d"
    (apt-get install -y -q libb64-0d >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libb64-0d >/dev/null 2>&1; }) ||
      echo "perf_analyzer: could not install libb64-0d; its test will be skipped"
  else
    echo "perf_analyzer: libb64-0d missing and not root; its test will be skipped"
  fi
fi
exit 0
