"""How many front processes, and what each is told at its start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reposerve.cli import serve_parser
from reposerve.fronts import default_workers, max_workers, usable_cores
from reposerve.fronts.workers import FrontSpec, decode_spec, encode_spec
from reposerve.locations import RemoteRepository
from reposerve.server import fronts_line
from reposerve.settings import RestrictedApi, Settings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("cores", "fronts"), [(1, 1), (2, 1), (3, 1), (4, 2), (8, 4), (16, 8), (64, 8)]
)
def test_the_default_leaves_small_machines_one_process_and_grows_with_cores(cores, fronts):
    assert default_workers(cores) == fronts


def test_a_front_is_told_every_setting_as_the_server_has_it():
    settings = Settings(
        model_repositories=(Path("/srv/a"), Path("/srv/b")),
        remote_repositories=(RemoteRepository(url="s3://h:1/b/p", scheme="s3", bucket="b"),),
        http_workers=3,
        grpc_workers=2,
        restricted=[RestrictedApi(frozenset({"model-repository"}), "admin-key", "s3cret")],
        http_port=0,
    )
    spec = FrontSpec(2, settings, link_fd=7, http_fd=5, grpc=False)
    assert decode_spec(encode_spec(spec)) == spec


def test_the_start_up_line_says_each_protocol_s_fronts():
    line = fronts_line(Settings(http_workers=2, grpc_workers=1))
    assert line.startswith("fronts: HTTP 2 processes, gRPC 1 process (--http-workers")
    assert "gRPC" not in fronts_line(Settings(grpc_port=None)).split("(")[0]


@pytest.mark.parametrize("flag", ["--http-workers", "--grpc-workers"])
def test_more_fronts_than_four_per_core_are_refused_when_the_flags_are_read(flag):
    """A thousand fronts never all came up, and those that did outlived a SIGTERM."""
    most = max_workers(usable_cores())
    assert most == 4 * usable_cores()
    assert getattr(serve_parser().parse_args([flag, str(most)]), flag[2:].replace("-", "_")) == most
    refused = subprocess.run(
        [sys.executable, "-m", "reposerve", flag, str(most + 1)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (
        f"reposerve: error: argument {flag}: expected at most {most} (4 per usable core), "
        f"got '{most + 1}'"
    )
