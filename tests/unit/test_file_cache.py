"""Derived model files: built once however many instances ask at the same time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from reposerve.backends.file_cache import build_once, cache_root

pytestmark = pytest.mark.unit


def test_concurrent_callers_build_once_and_all_see_the_whole_file(tmp_path):
    target = tmp_path / "fresh" / "model.fp16.onnx"
    builds = []
    start = threading.Barrier(4)
    seen = []

    def build() -> bytes:
        builds.append(threading.get_ident())
        time.sleep(0.2)  # a slow conversion: the others arrive while it runs
        return b"converted"

    def instance() -> None:
        start.wait()
        build_once(target, build)
        seen.append(target.read_bytes())

    threads = [threading.Thread(target=instance) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert seen == [b"converted"] * 4
    # Only the entry and its lock remain: no temporary file left behind.
    assert sorted(p.name for p in target.parent.iterdir()) == [
        "model.fp16.onnx",
        "model.fp16.onnx.lock",
    ]


def test_an_existing_entry_is_not_rebuilt(tmp_path):
    target = tmp_path / "entry"
    assert build_once(target, lambda: b"first") is True
    inode = target.stat().st_ino
    assert build_once(target, lambda: b"second") is False
    assert target.read_bytes() == b"first"
    assert target.stat().st_ino == inode


def test_a_failed_build_leaves_nothing(tmp_path):
    def build() -> bytes:
        raise ValueError("cannot convert")

    with pytest.raises(ValueError, match="cannot convert"):
        build_once(tmp_path / "entry", build)
    assert [p.name for p in tmp_path.iterdir()] == ["entry.lock"]


def test_an_unwritable_cache_raises_oserror_before_building(tmp_path):
    (tmp_path / "file").write_text("")  # a file where the cache folder should be, even for root
    built = []

    def build() -> bytes:
        built.append(True)
        return b"x"

    with pytest.raises(OSError):
        build_once(tmp_path / "file" / "entry", build)
    assert built == []


def test_cache_root_prefers_the_reposerve_variable(monkeypatch):
    monkeypatch.setenv("REPOSERVE_CACHE_DIR", "/srv/cache")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert cache_root() == Path("/srv/cache")
    monkeypatch.delenv("REPOSERVE_CACHE_DIR")
    assert cache_root() == Path("/xdg/reposerve")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/someone")
    assert cache_root() == Path("/home/someone/.cache/reposerve")
