"""The fsspec filesystem of a remote repository, with its credentials found where each
cloud's own tools look (never passed on a command line, never logged):

- s3 (s3fs, botocore): ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
  ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` with ``~/.aws/credentials`` and ``~/.aws/config``,
  instance roles; ``AWS_DEFAULT_REGION``; the endpoint from the URL (Triton's host:port
  form), else ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``.
- gs (gcsfs): ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's login, the metadata server;
  ``STORAGE_EMULATOR_HOST`` for an emulator.
- az (adlfs): ``AZURE_STORAGE_CONNECTION_STRING``, else the account (as://account/..., or
  ``AZURE_STORAGE_ACCOUNT`` / ``AZURE_STORAGE_ACCOUNT_NAME``) with ``AZURE_STORAGE_KEY`` /
  ``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``, else Azure's default
  credential chain.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from reposerve.errors import ConfigError
from reposerve.locations import RemoteRepository

# The fsspec implementation of each scheme, and the package that brings it.
_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs"}
# Connections that hang or fail end a pull soon, as an error (the mirror keeps serving).
_S3_CLIENT = {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3}}


def remote_problem(location: RemoteRepository, environ: Mapping[str, str]) -> str | None:
    """Why ``location`` cannot be read from here (its fsspec package is not installed, its
    credentials are incomplete), or None; a start-up check."""
    package = _PACKAGES[location.scheme]
    if importlib.util.find_spec(package) is None:
        return (
            f"{location.url}: reading {location.scheme}:// repositories needs {package}. "
            f"Hint: pip install 'reposerve[remote]' (fsspec with s3fs, gcsfs and adlfs)"
        )
    try:
        filesystem_options(location, environ)
    except ConfigError as exc:
        return exc.message
    return None


def filesystem_options(location: RemoteRepository, environ: Mapping[str, str]) -> dict[str, Any]:
    """The keywords the scheme's filesystem is built with: what the URL says, and what the
    filesystem would not read from ``environ`` by itself. The result may hold secrets:
    it is handed to the filesystem and nowhere else."""
    if location.scheme == "s3":
        endpoint = (
            location.endpoint_url
            or environ.get("AWS_ENDPOINT_URL_S3")
            or environ.get("AWS_ENDPOINT_URL")
        )
        options: dict[str, Any] = {"config_kwargs": _S3_CLIENT}
        if endpoint:
            options["endpoint_url"] = endpoint
        return options  # botocore reads the keys, the profile and the region itself
    if location.scheme == "gs":
        return {}  # gcsfs: google.auth's default credentials, STORAGE_EMULATOR_HOST
    connection_string = environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if connection_string and location.account is None:
        return {"connection_string": connection_string}
    account = (
        location.account
        or environ.get("AZURE_STORAGE_ACCOUNT")
        or environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    )
    if not account:
        raise ConfigError(
            f"{location.url}: no storage account. Hint: set AZURE_STORAGE_CONNECTION_STRING "
            "or AZURE_STORAGE_ACCOUNT, or name it in the URL (as://account/container/prefix)"
        )
    options = {"account_name": account}
    key = environ.get("AZURE_STORAGE_KEY") or environ.get("AZURE_STORAGE_ACCOUNT_KEY")
    if key:
        options["account_key"] = key
    elif sas := environ.get("AZURE_STORAGE_SAS_TOKEN"):
        options["sas_token"] = sas
    else:
        options["anon"] = False  # Azure's DefaultAzureCredential chain
    return options


def open_filesystem(location: RemoteRepository, environ: Mapping[str, str]) -> Any:
    """A fresh filesystem for ``location`` (fsspec's instance cache off: a pull after a
    lost connection starts anew); an fsspec ``AbstractFileSystem``, which has no types."""
    if (problem := remote_problem(location, environ)) is not None:
        raise ConfigError(problem)
    import fsspec

    options = filesystem_options(location, environ)
    return fsspec.filesystem(location.scheme, skip_instance_cache=True, **options)
