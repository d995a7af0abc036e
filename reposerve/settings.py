"""Server settings: what the CLI flags say, as one value. A field's default is also its
flag's (reposerve.options.table names the field each flag fills)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from reposerve.arguments import Budget
from reposerve.locations import RemoteRepository
from reposerve.metrics import MetricsOptions

LogFormat = Literal["default", "ISO8601", "json"]  # --log-format (its "text" is "default")


class RestrictedApi(msgspec.Struct, frozen=True):
    """``--http-restricted-api API[,API]:KEY=VALUE``: these APIs need header KEY: VALUE."""

    apis: frozenset[str]
    header: str
    value: str


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    # --model-repository, once or more: served as one (a name in two is an error); the
    # folders, and the remote ones (s3://, gs://, az://), served from their copies in the
    # cache folder below (two fields: msgspec, which sends settings to front processes,
    # takes no union of Path and a Struct)
    model_repositories: tuple[Path, ...] = (Path("model_repository"),)
    remote_repositories: tuple[RemoteRepository, ...] = ()
    repository_cache_dir: Path | None = None  # None: reposerve.repository.remote.mirrors's
    repository_cache_bytes: int | None = None  # the most one remote repository may hold
    http_host: str = "0.0.0.0"
    http_port: int | None = 8000  # None: no HTTP front (--allow-http false)
    metrics_port: int | None = 8002  # None: no metrics endpoint
    metrics: MetricsOptions = MetricsOptions()  # address, interval, --metrics-config
    model_control_mode: str = "explicit"  # "explicit" | "poll" | "none" | "on-demand"
    # Memory budgets: idle models are unloaded, least recently used first, to stay within
    host_memory_budget: Budget | None = None
    gpu_memory_budget: Budget | None = None  # on each GPU alone
    repository_poll_secs: float = 15.0
    load_models: list[str] | None = None  # None: every model in the repository
    http_server: str = "auto"
    http2: bool = False
    http_max_input_size: int = 64 * 1024 * 1024  # bytes, Triton's default; also inflated
    # Slow clients (reposerve.http.connections); 0 turns each off.
    http_header_timeout_secs: float = 30.0  # request head complete within this
    http_body_timeout_secs: float = 60.0  # longest silence inside a request body
    http_max_connections: int = 1024  # open connections (uvicorn)
    ssl_certfile: str | None = None  # TLS: PEM certificate (chain)
    ssl_keyfile: str | None = None
    restricted: list[RestrictedApi] = []
    openai_api_keys: list[str] = []  # the OpenAI-compatible routes need one (none: open)
    # The gRPC front (reposerve.grpc): None turns it off (--allow-grpc false).
    grpc_port: int | None = 8001
    # Front processes per protocol, the server's own included (reposerve.fronts.workers).
    http_workers: int = 1
    grpc_workers: int = 1
    grpc_address: str | None = None  # None: --http-host's
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False  # clients must present a certificate --grpc-root-cert signed
    grpc_server_cert: str | None = None
    grpc_server_key: str | None = None
    grpc_root_cert: str | None = None
    grpc_restricted: list[RestrictedApi] = []  # --grpc-restricted-protocol
    exit_timeout_secs: float = 30.0  # one budget for a whole shutdown or unload
    # After SIGTERM, seconds of reporting not ready while still serving (load balancers
    # take the replica out of rotation meanwhile) before the shutdown above begins.
    shutdown_grace_secs: float = 0.0
    strict_readiness: bool = True  # server ready only while every loaded model is
    exit_on_error: bool = True  # start-up fails when a model fails to load
    server_name: str = "triton"  # GET /v2's name (Triton's, which its clients check)
    allow_model_file_override: bool = True  # load requests may bring model files (code)
    allow_client_shm: bool = False  # clients may register shared memory (--allow-client-shm)
    # Client shared-memory regions held at once (--client-shm-max-regions); the default is
    # reposerve.shared_memory.MAX_REGIONS, which a leaf cannot import (it imports
    # reposerve.operations, which imports this module).
    client_shm_max_regions: int = 1024
    load_timeout_secs: float = 120.0
    # Triton's auto-complete (off: --disable-auto-complete-config / --strict-model-config)
    auto_complete: bool = True
    model_load_thread_count: int = 4  # models building their instances at once
    # A dead instance is replaced at once, or (Triton's) when the next request comes.
    instance_restart: Literal["immediate", "on-request"] = "immediate"
    # Logging (reposerve.logs): levels and format change at run time via /v2/logging.
    log_file: str = ""  # "": stderr
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose: int = 0
    log_format: LogFormat = "default"
