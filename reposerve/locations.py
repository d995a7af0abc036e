"""Where a model repository is: a ``--model-repository`` value, read once (a leaf: the
settings hold it).

Accepted, as Triton and fsspec spell them::

    s3://bucket/prefix                    AWS (or the endpoint AWS_ENDPOINT_URL names)
    s3://host:port/bucket/prefix          Triton's form for an S3-compatible server (http)
    s3://https://host:port/bucket/prefix  the same over https
    gs://bucket/prefix                    Google Cloud Storage
    az://container/prefix                 Azure Blob Storage (fsspec's; the account from
                                          the environment)
    as://account/container/prefix         Azure Blob Storage (Triton's)

Anything without ``://`` is a local folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import msgspec

from reposerve.errors import ConfigError

Scheme = Literal["s3", "gs", "az"]

# S3 and GCS bucket names, Azure container names: lower-case letters, digits, dots, dashes
# (and GCS's underscores), 3 to 63 of them, starting and ending with a letter or digit.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_HOST_PORT = re.compile(r"^(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})$")
_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_SCHEMES: dict[str, Scheme] = {"s3": "s3", "gs": "gs", "az": "az", "as": "az"}


class RemoteRepository(msgspec.Struct, frozen=True, kw_only=True):
    """A repository in a bucket: the objects under ``bucket/prefix``. ``url``: as given
    (what logs and errors name; it never holds a credential)."""

    url: str
    scheme: Scheme
    bucket: str
    prefix: str = ""  # no leading or trailing slash; "" = the whole bucket
    endpoint_url: str | None = None  # s3: an S3-compatible server (Triton's host:port form)
    account: str | None = None  # az: the storage account (Triton's as:// form)

    @property
    def root(self) -> str:
        """The repository's path in its filesystem (fsspec's ``bucket/prefix``)."""
        return f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket


RepositoryLocation = Path | RemoteRepository


def parse_location(text: str) -> RepositoryLocation:
    """A ``--model-repository`` value: a local folder, or a remote repository; ConfigError
    saying what is wrong with a URL that is neither."""
    scheme, found, rest = text.partition("://")
    if not found:
        return Path(text)
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"{text}: unsupported scheme '{scheme}://'. Hint: a model repository is a folder, "
            "or s3://bucket/prefix, s3://host:port/bucket/prefix, gs://bucket/prefix, "
            "az://container/prefix or as://account/container/prefix"
        )
    parts = rest.split("/")
    endpoint_url = account = None
    if scheme == "s3":
        endpoint_url, parts = _s3_endpoint(text, parts)
    elif scheme == "as":
        account, parts = parts[0], parts[1:]
        if not _ACCOUNT.match(account):
            raise ConfigError(
                f"{text}: '{account}' is not a storage account name (3 to 24 lower-case "
                "letters and digits). Hint: as://account/container/prefix"
            )
    while parts and parts[-1] == "":  # a trailing slash says nothing
        parts.pop()
    if not parts or not parts[0]:
        raise ConfigError(f"{text}: no bucket named. Hint: {scheme}://bucket/prefix")
    bucket, prefix = parts[0], parts[1:]
    if not _BUCKET.match(bucket):
        raise ConfigError(
            f"{text}: '{bucket}' is not a bucket name (3 to 63 lower-case letters, digits, "
            "dots and dashes, starting and ending with a letter or digit)"
        )
    for segment in prefix:
        if segment in ("", ".", ".."):
            raise ConfigError(
                f"{text}: the prefix has an empty, '.' or '..' segment. Hint: name the "
                "folder as the bucket lists it, e.g. s3://bucket/models"
            )
    return RemoteRepository(
        url=text,
        scheme=_SCHEMES[scheme],
        bucket=bucket,
        prefix="/".join(prefix),
        endpoint_url=endpoint_url,
        account=account,
    )


def _s3_endpoint(text: str, parts: list[str]) -> tuple[str | None, list[str]]:
    """Triton's ``s3://host:port/bucket/...`` (or ``s3://https://host:port/...``): the
    endpoint, and the parts after it. A bucket name holds no colon, so a first part with
    one names a server."""
    protocol = "http"
    if parts[0] in ("http:", "https:") and len(parts) > 2 and parts[1] == "":
        protocol, parts = parts[0][:-1], parts[2:]
    elif ":" not in parts[0]:
        return None, parts
    found = _HOST_PORT.match(parts[0])
    if found is None or not 0 < int(found["port"]) < 65536:
        raise ConfigError(
            f"{text}: '{parts[0]}' is neither a bucket nor host:port. Hint: "
            "s3://bucket/prefix, or s3://host:port/bucket/prefix for an S3-compatible server"
        )
    return f"{protocol}://{parts[0]}", parts[1:]
