"""Triton Model Analyzer profiles a model on a running reposerve (its remote launch mode).

In remote mode Model Analyzer reads the model's config from ``GET .../config`` (a strict
protobuf parse), loads each variant it searches by sending that config back, edited, as a
load override, and measures each with perf_analyzer. Here: the bundled add_sub, its
default config and one variant (max_batch_size 4, two CPU instances), CPU only, short.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.perf_tools import why_perf_analyzer_cannot_run
from tests.server import REPO_ROOT, start_server
from tools.bench.protocols import ANALYZER_REMOTE_MODE, analyzer_environment

pytestmark = [pytest.mark.e2e, pytest.mark.tool]

ANALYZER = Path(
    os.environ.get("REPOSERVE_MODEL_ANALYZER", REPO_ROOT / ".venv-analyzer/bin/model-analyzer")
)

CONFIG = (
    ANALYZER_REMOTE_MODE
    + """\
run_config_search_disable: true
perf_analyzer_flags:
  measurement-interval: 500
  stability-percentage: 100
  max-trials: 5
profile_models:
  add_sub:
    parameters:
      concurrency: [2]
    model_config_parameters:
      max_batch_size: [4]
      instance_group:
        - kind: KIND_CPU
          count: [2]
"""
)


def test_model_analyzer_profiles_remotely(tmp_path):
    if not ANALYZER.exists():
        pytest.skip(f"{ANALYZER} is missing: run tools/install_model_analyzer.sh")
    reason = why_perf_analyzer_cannot_run()
    if reason:
        pytest.skip(reason)
    repository = tmp_path / "repository"
    shutil.copytree(REPO_ROOT / "model_repository" / "add_sub", repository / "add_sub")
    server = start_server(repository, tmp_path)
    out = tmp_path / "analyzer"
    out.mkdir()  # Model Analyzer makes the folders it names, but not their parent
    config = tmp_path / "analyzer.yaml"
    config.write_text(
        CONFIG.format(
            repository=repository,
            address=server.address,
            metrics_port=server.metrics_port,
            out=out,
        )
    )
    env = analyzer_environment()
    try:
        result = subprocess.run(
            [str(ANALYZER), "profile", "-f", str(config)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        # The last variant profiled is the one still loaded: the override took effect.
        loaded = httpx.get(f"{server.url}/v2/models/add_sub/config").json()
    finally:
        assert server.stop() == 0, server.log()
    assert "load failed" not in result.stdout, result.stdout[-4000:]
    assert loaded["max_batch_size"] == 4
    assert [group["count"] for group in loaded["instance_group"]] == [2]
    with open(out / "export" / "results" / "metrics-model-inference.csv") as file:
        rows = {row["Model Config Path"]: row for row in csv.DictReader(file)}
    assert set(rows) == {"add_sub_config_default", "add_sub_config_0"}
    assert rows["add_sub_config_default"]["Max Batch Size"] == "8"
    assert rows["add_sub_config_0"]["Max Batch Size"] == "4"
    assert rows["add_sub_config_0"]["Instance Group"] == "2:CPU"
    assert all(float(row["Throughput (infer/sec)"]) > 0 for row in rows.values())
    summary = out / "export" / "reports" / "summaries" / "add_sub" / "result_summary.html"
    assert summary.is_file()
