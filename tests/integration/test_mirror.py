"""One remote repository's copy (``reposerve.repository.remote.mirror``) against a real
S3-compatible server (moto's, a process on a free port): what a pull copies, keeps and
removes, what it leaves behind when it fails, and the objects it refuses."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from reposerve.errors import RepositoryError
from reposerve.locations import RemoteRepository, parse_location
from reposerve.repository.remote.mirror import Mirror, Pulled
from tests.object_store import ACCESS_KEY, SECRET_KEY, MotoServer, s3_environment

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def bucket(moto: MotoServer, request: pytest.FixtureRequest, monkeypatch):
    """A fresh bucket, and a client to edit it; botocore reads the keys from the process."""
    for key, value in s3_environment().items():
        monkeypatch.setenv(key, value)
    name = request.node.name.replace("_", "-")[:40].strip("-").lower()
    client = moto.client()
    client.create_bucket(Bucket=name)
    return name, client


def _mirror(moto: MotoServer, bucket: str, folder: Path, max_bytes: int | None = None) -> Mirror:
    location = parse_location(f"s3://127.0.0.1:{moto.port}/{bucket}/repo")
    assert isinstance(location, RemoteRepository)
    return Mirror(location, folder, max_bytes, os.environ)


def _put(client, bucket: str, key: str, body: bytes) -> None:
    client.put_object(Bucket=bucket, Key=f"repo/{key}", Body=body)


def _served(mirror: Mirror) -> dict[str, bytes]:
    """Every file the server would read, by its path under the repository folder."""
    return {
        str(path.relative_to(mirror.root)): path.read_bytes()
        for name in sorted(os.listdir(mirror.root))
        for path in (mirror.root / name).rglob("*")
        if path.is_file()
    }


def test_a_pull_copies_what_changed_keeps_the_rest_and_removes_what_went(moto, bucket, tmp_path):
    name, client = bucket
    _put(client, name, "a/config.toml", b"a")
    _put(client, name, "b/config.toml", b"b")
    _put(client, name, "README.md", b"beside the models: not copied")
    mirror = _mirror(moto, name, tmp_path)
    assert mirror.pull() == Pulled(["a", "b"], [], [], 2)
    assert _served(mirror) == {"a/config.toml": b"a", "b/config.toml": b"b"}
    _put(client, name, "a/config.toml", b"a2")
    client.delete_object(Bucket=name, Key="repo/b/config.toml")
    assert mirror.pull() == Pulled(["a"], [], ["b"], 2)
    assert _served(mirror) == {"a/config.toml": b"a2"}
    assert len(os.listdir(tmp_path / "snapshots")) == 1  # the replaced copies are gone
    # Another process (a restart) finds the copy as it was left.
    assert _mirror(moto, name, tmp_path).pull() == Pulled([], ["a"], [], 0)


def test_a_pull_of_one_model_touches_no_other(moto, bucket, tmp_path):
    name, client = bucket
    _put(client, name, "a/config.toml", b"a")
    _put(client, name, "b/config.toml", b"b")
    mirror = _mirror(moto, name, tmp_path)
    mirror.pull(["a"])
    _put(client, name, "a/config.toml", b"a2")
    assert mirror.pull(["b"]) == Pulled(["b"], [], [], 1)
    assert _served(mirror) == {"a/config.toml": b"a", "b/config.toml": b"b"}


def test_over_the_bound_a_pull_fails_and_the_copy_stays(moto, bucket, tmp_path):
    name, client = bucket
    _put(client, name, "a/config.toml", b"a" * 10)
    mirror = _mirror(moto, name, tmp_path, max_bytes=50)
    mirror.pull()
    _put(client, name, "a/1/weights.bin", b"w" * 100)
    with pytest.raises(RepositoryError) as raised:
        mirror.pull()
    assert raised.value.message == (
        f"{mirror.location.url}: the repository holds 0 MiB (110 bytes), over "
        "--repository-cache-bytes 50. Hint: raise the bound, or serve a prefix holding "
        "fewer models"
    )
    assert _served(mirror) == {"a/config.toml": b"a" * 10}


def test_what_a_pull_cut_short_left_is_swept_by_the_next(moto, bucket, tmp_path):
    name, client = bucket
    _put(client, name, "a/config.toml", b"a")
    mirror = _mirror(moto, name, tmp_path)
    left = tmp_path / "snapshots" / ".partial-a.0123"
    (left / "1").mkdir(parents=True)
    (left / "1" / "model.py").write_bytes(b"half")
    mirror.pull()
    assert sorted(os.listdir(tmp_path / "snapshots")) == [os.readlink(mirror.root / "a")[13:]]


def test_an_object_whose_name_climbs_out_of_its_folder_is_refused(moto, bucket, tmp_path):
    name, client = bucket
    _put(client, name, "a/../../escape.py", b"x")
    mirror = _mirror(moto, name, tmp_path)
    with pytest.raises(RepositoryError) as raised:
        mirror.pull()
    assert raised.value.message == (
        f"{mirror.location.url}: object 'a/../../escape.py' has an empty, '.' or '..' "
        "segment in its name; it cannot be copied into a folder"
    )
    assert not (tmp_path / "escape.py").exists()


def test_credentials_come_from_a_profile_in_the_aws_files(moto, bucket, tmp_path, monkeypatch):
    name, client = bucket
    _put(client, name, "a/config.toml", b"a")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to ask for
    # Without any, the pull says so (moto takes any keys, but botocore signs with some).
    with pytest.raises(RepositoryError, match="NoCredentialsError: Unable to locate credentials"):
        _mirror(moto, name, tmp_path / "without").pull()
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[reposerve]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "reposerve")
    assert _mirror(moto, name, tmp_path / "with").pull() == Pulled(["a"], [], [], 1)
