"""--model-repository values: local folders, and remote repositories in Triton's and
fsspec's spellings, each URL read into its parts or refused saying what is wrong; and the
credentials each cloud's filesystem is given from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from reposerve.errors import ConfigError
from reposerve.locations import RemoteRepository, parse_location
from reposerve.repository.remote.filesystems import filesystem_options, remote_problem

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("url", "scheme", "bucket", "prefix", "endpoint", "account"),
    [
        ("s3://models", "s3", "models", "", None, None),
        ("s3://models/team/prod/", "s3", "models", "team/prod", None, None),
        ("s3://127.0.0.1:9000/models/repo", "s3", "models", "repo", "http://127.0.0.1:9000", None),
        ("s3://minio.local:9000/models", "s3", "models", "", "http://minio.local:9000", None),
        ("s3://https://s3.example:443/b-1/x", "s3", "b-1", "x", "https://s3.example:443", None),
        ("gs://my_bucket/repo", "gs", "my_bucket", "repo", None, None),
        ("az://container/repo", "az", "container", "repo", None, None),
        ("as://account1/container/a/b", "az", "container", "a/b", None, "account1"),
    ],
)
def test_remote_urls_are_read_into_their_parts(url, scheme, bucket, prefix, endpoint, account):
    location = parse_location(url)
    assert location == RemoteRepository(
        url=url,
        scheme=scheme,
        bucket=bucket,
        prefix=prefix,
        endpoint_url=endpoint,
        account=account,
    )
    assert location.root == (f"{bucket}/{prefix}" if prefix else bucket)


def test_a_value_without_a_scheme_is_a_folder():
    assert parse_location("model_repository") == Path("model_repository")
    assert parse_location("/srv/models") == Path("/srv/models")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "http://host/models",
            "http://host/models: unsupported scheme 'http://'. Hint: a model repository is a "
            "folder, or s3://bucket/prefix, s3://host:port/bucket/prefix, gs://bucket/prefix, "
            "az://container/prefix or as://account/container/prefix",
        ),
        ("s3://", "s3://: no bucket named. Hint: s3://bucket/prefix"),
        ("gs:///repo", "gs:///repo: no bucket named. Hint: gs://bucket/prefix"),
        (
            "s3://Bad_Bucket/repo",
            "s3://Bad_Bucket/repo: 'Bad_Bucket' is not a bucket name (3 to 63 lower-case "
            "letters, digits, dots and dashes, starting and ending with a letter or digit)",
        ),
        (
            "s3://host:99999/models",
            "s3://host:99999/models: 'host:99999' is neither a bucket nor host:port. Hint: "
            "s3://bucket/prefix, or s3://host:port/bucket/prefix for an S3-compatible server",
        ),
        (
            "s3://models/a//b",
            "s3://models/a//b: the prefix has an empty, '.' or '..' segment. Hint: name the "
            "folder as the bucket lists it, e.g. s3://bucket/models",
        ),
        (
            "s3://models/../etc",
            "s3://models/../etc: the prefix has an empty, '.' or '..' segment. Hint: name the "
            "folder as the bucket lists it, e.g. s3://bucket/models",
        ),
        (
            "as://Account/container",
            "as://Account/container: 'Account' is not a storage account name (3 to 24 "
            "lower-case letters and digits). Hint: as://account/container/prefix",
        ),
    ],
)
def test_bad_urls_are_refused_saying_what_is_wrong(url, message):
    with pytest.raises(ConfigError) as raised:
        parse_location(url)
    assert raised.value.message == message


def _remote(url: str) -> RemoteRepository:
    location = parse_location(url)
    assert isinstance(location, RemoteRepository)
    return location


def test_s3_endpoint_comes_from_the_url_else_the_environment():
    triton_form = _remote("s3://127.0.0.1:9000/models")
    options = filesystem_options(triton_form, {"AWS_ENDPOINT_URL": "http://elsewhere:1"})
    assert options["endpoint_url"] == "http://127.0.0.1:9000"
    plain = _remote("s3://models")
    assert "endpoint_url" not in filesystem_options(plain, {})
    assert filesystem_options(plain, {"AWS_ENDPOINT_URL": "http://a:1"})["endpoint_url"] == (
        "http://a:1"
    )
    both = {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "http://s3:2"}
    assert filesystem_options(plain, both)["endpoint_url"] == "http://s3:2"
    # The keys themselves are botocore's to read (environment, profile, ~/.aws files).
    keys = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"}
    assert "secret" not in repr(filesystem_options(plain, keys))


def test_gcs_credentials_are_google_auths_own():
    assert filesystem_options(_remote("gs://bucket/repo"), {}) == {}


def test_azure_credentials_come_from_the_environment_as_triton_and_azure_name_them():
    fsspec_form, triton_form = _remote("az://container/repo"), _remote("as://acct1/container")
    connection = {"AZURE_STORAGE_CONNECTION_STRING": "AccountName=a;AccountKey=k"}
    assert filesystem_options(fsspec_form, connection) == {
        "connection_string": "AccountName=a;AccountKey=k"
    }
    tritons = {"AZURE_STORAGE_ACCOUNT": "acct2", "AZURE_STORAGE_KEY": "key2"}
    assert filesystem_options(fsspec_form, tritons) == {
        "account_name": "acct2",
        "account_key": "key2",
    }
    azures = {"AZURE_STORAGE_ACCOUNT_NAME": "acct3", "AZURE_STORAGE_SAS_TOKEN": "sv=1"}
    assert filesystem_options(fsspec_form, azures) == {"account_name": "acct3", "sas_token": "sv=1"}
    # The URL's account wins; with no key, Azure's default credential chain.
    assert filesystem_options(triton_form, connection) == {"account_name": "acct1", "anon": False}


def test_azure_without_an_account_is_refused_with_a_hint():
    message = (
        "az://container/repo: no storage account. Hint: set AZURE_STORAGE_CONNECTION_STRING "
        "or AZURE_STORAGE_ACCOUNT, or name it in the URL (as://account/container/prefix)"
    )
    assert remote_problem(_remote("az://container/repo"), {}) in (
        message,
        # where adlfs is not installed, that is said first
        "az://container/repo: reading az:// repositories needs adlfs. Hint: pip install "
        "'reposerve[remote]' (fsspec with s3fs, gcsfs and adlfs)",
    )


def test_folders_and_buckets_given_together_fill_their_own_settings():
    from reposerve.cli import serve_parser, settings_from

    argv = ["--model-repository", "local", "--model-repository", "s3://models/repo"]
    settings = settings_from(serve_parser().parse_args(argv))
    assert settings.model_repositories == (Path("local"),)
    assert settings.remote_repositories == (_remote("s3://models/repo"),)
    only_remote = settings_from(serve_parser().parse_args(argv[2:]))
    assert only_remote.model_repositories == ()
