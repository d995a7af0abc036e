"""Every flag of ``reposerve`` (the serve command), declared once: its name, how its value
is read, the topic it shows under in ``--help`` (Triton's groups), its help, the Settings
field it fills and what it refuses at start-up. A flag that fills a field takes that
field's default from ``Settings``; a flag read by a rule (``resolve``) carries its own."""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from reposerve.arguments import (
    boolean,
    memory_budget,
    non_negative,
    positive,
    positive_int,
)
from reposerve.fronts import WORKERS_PER_CORE
from reposerve.options import values
from reposerve.settings import Settings


class Group(enum.Enum):
    """The topics of ``--help`` and of docs/cli.md: Triton's ``tritonserver --help`` groups
    that reposerve has flags in, in Triton's order."""

    SERVER = "Server"
    LOGGING = "Logging"
    MODEL_REPOSITORY = "Model Repository"
    HTTP = "HTTP"
    GRPC = "GRPC"
    METRICS = "Metrics"
    MEMORY = "Memory/Device Management"
    DEPRECATED = "DEPRECATED"


class Option(msgspec.Struct, frozen=True, kw_only=True):
    flag: str
    group: Group
    help: str  # without the default: --help and the page add it from ``default_of``
    # The Settings field the value fills ("metrics.address": a field of that Struct), as
    # given (a rule in ``resolve`` may still adjust it); its default is the field's.
    # None: only a rule reads the flag, and ``default`` is its value when not given.
    field: str | None = None
    default: Any = None
    parse: Callable[[str], Any] | None = None  # None: the text as given
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    repeat: bool = False  # each use adds a value; given ones replace the default
    switch: bool = False  # takes no value: given means true
    alone_means_true: bool = False  # the value may be left out: ``--flag`` is ``--flag true``
    # A start-up refusal: what is wrong with the settings this flag made, or None.
    check: Callable[[Settings], str | None] | None = None

    @property
    def dest(self) -> str:
        """The flag's name in the parsed namespace (argparse's own choice)."""
        return self.flag[2:].replace("-", "_")


def default_of(option: Option, defaults: Settings) -> Any:
    """The value the flag has when not given: its field's default, else its own."""
    if option.field is None:
        return option.default
    value: Any = defaults
    for name in option.field.split("."):
        value = getattr(value, name)
    return value


_SERVER = (
    Option(
        flag="--exit-timeout-secs",
        group=Group.SERVER,
        field="exit_timeout_secs",
        parse=float,
        metavar="S",
        help="one budget for a shutdown or an unload: queued and running requests may "
        "finish within it; then each left gets an error and the instances are killed",
    ),
    Option(
        flag="--shutdown-grace-secs",
        group=Group.SERVER,
        parse=non_negative(float),
        metavar="S",
        help="after SIGTERM, report not ready but keep serving for S seconds (while load "
        "balancers stop sending) before the shutdown; a second signal skips it (default: 5 "
        "under Kubernetes, where KUBERNETES_SERVICE_HOST is set; else 0)",
    ),
    Option(
        flag="--instance-restart",
        group=Group.SERVER,
        field="instance_restart",
        choices=("immediate", "on-request"),
        help="when an instance process that died is replaced: at once (immediate), or as "
        "Triton's python backend does, once the next request comes, which fails "
        "(on-request; the model is not ready meanwhile)",
    ),
    Option(
        flag="--server-name",
        group=Group.SERVER,
        field="server_name",
        metavar="NAME",
        help="the name server metadata (GET /v2, gRPC ServerMetadata) gives: Triton's, which "
        "its clients and scripts check, by default; its version is reposerve's",
    ),
)

_LOGGING = (
    Option(
        flag="--log-level",
        group=Group.LOGGING,
        default="info",
        choices=values.LOG_LEVELS,
        help="the lowest level logged; Triton's --log-* flags below refine it",
    ),
    Option(
        flag="--log-verbose",
        group=Group.LOGGING,
        parse=non_negative(int),
        metavar="N",
        help="verbose messages up to level N (0 = none; default 1 with --log-level debug)",
    ),
    *(
        Option(
            flag=f"--log-{level}",
            group=Group.LOGGING,
            parse=boolean,
            metavar="BOOL",
            help=f"log {level.upper()} messages (default: as --log-level says)",
        )
        for level in ("info", "warning", "error")
    ),
    Option(
        flag="--log-file",
        group=Group.LOGGING,
        field="log_file",
        metavar="PATH",
        help="append the log (and everything the server and its instances write) to PATH "
        "instead of the console",
        check=values.log_file_writable,
    ),
    Option(
        flag="--log-format",
        group=Group.LOGGING,
        field="log_format",
        parse=values.log_format,
        choices=("default", "ISO8601", "json", "text"),
        help="default (text is the same), ISO8601 (UTC times), json (one object a line)",
    ),
)

_MODEL_REPOSITORY = (
    Option(
        flag="--model-repository",
        group=Group.MODEL_REPOSITORY,
        default=(Path("model_repository"),),  # Settings' (a rule fills two fields)
        parse=values.repository_location,
        repeat=True,
        metavar="PATH",
        help="folder of model folders, or a bucket's (s3://bucket/prefix, "
        "s3://host:port/bucket/prefix, gs://bucket/prefix, az://container/prefix; copied "
        "to --repository-cache-dir, see docs/object-storage.md); repeat it to serve several "
        "as one (a model name in two of them does not load)",
        check=values.repositories_are_folders,
    ),
    Option(
        flag="--repository-cache-dir",
        group=Group.MODEL_REPOSITORY,
        field="repository_cache_dir",
        parse=Path,
        metavar="PATH",
        help="where remote repositories are copied, one folder each, reused across "
        "restarts (default: TRITON_AWS_MOUNT_DIRECTORY, else repositories/ in reposerve's "
        "cache folder: $REPOSERVE_CACHE_DIR, else ~/.cache/reposerve)",
        check=values.cache_dir_writable,
    ),
    Option(
        flag="--repository-cache-bytes",
        group=Group.MODEL_REPOSITORY,
        field="repository_cache_bytes",
        parse=positive_int,
        metavar="BYTES",
        help="the most one remote repository may hold; a bucket over it is not copied "
        "(at start-up the server does not start; later, the last copy keeps serving)",
    ),
    Option(
        flag="--model-control-mode",
        group=Group.MODEL_REPOSITORY,
        choices=("explicit", "poll", "none", "on-demand"),
        help="explicit: the load/unload endpoints work and only --load-model models load at "
        "start-up (none without it), as in Triton; poll: changes on disk are loaded every "
        "--repository-poll-secs; none: the repository is fixed; on-demand: a model loads "
        "when its first request comes (which waits for it), and the load/unload endpoints "
        "work. Not given: every model loads and the load/unload endpoints work (explicit "
        "with --load-model '*')",
    ),
    Option(
        flag="--load-model",
        group=Group.MODEL_REPOSITORY,
        repeat=True,
        metavar="NAME",
        help="load only these models at start-up (repeatable; '*' = all; default: all, "
        "or none with an explicit --model-control-mode explicit)",
    ),
    Option(
        flag="--repository-poll-secs",
        group=Group.MODEL_REPOSITORY,
        field="repository_poll_secs",
        parse=float,
        metavar="S",
        help="how often poll mode looks at the repository",
    ),
    Option(
        flag="--disable-auto-complete-config",
        group=Group.MODEL_REPOSITORY,
        switch=True,
        help="read nothing from model files into configs: onnxruntime and torch models "
        "must declare their inputs and outputs",
    ),
    Option(
        flag="--model-load-thread-count",
        group=Group.MODEL_REPOSITORY,
        field="model_load_thread_count",
        parse=positive_int,
        metavar="N",
        help="how many models load at once, at start-up and after",
    ),
    Option(
        flag="--load-timeout-secs",
        group=Group.MODEL_REPOSITORY,
        field="load_timeout_secs",
        parse=float,
        metavar="S",
        help="how long an instance may take to load its model",
    ),
    Option(
        flag="--exit-on-error",
        group=Group.MODEL_REPOSITORY,
        field="exit_on_error",
        parse=boolean,
        metavar="BOOL",
        help="exit at start-up if a model fails to load",
    ),
    Option(
        flag="--strict-readiness",
        group=Group.MODEL_REPOSITORY,
        field="strict_readiness",
        parse=boolean,
        metavar="BOOL",
        help="true: /v2/health/ready only while every loaded model is ready; "
        "false: while the server is up",
    ),
    Option(
        flag="--allow-model-file-override",
        group=Group.MODEL_REPOSITORY,
        field="allow_model_file_override",
        parse=boolean,
        alone_means_true=True,
        metavar="BOOL",
        help="accept file: parameters on load requests (Triton's model files override, on "
        "as in Triton). They bring code the server runs: the load endpoint answers only "
        "local clients unless --http-restricted-api model-repository:KEY=VALUE opens it, "
        "and false refuses them",
    ),
)

_HTTP = (
    Option(
        flag="--allow-http",
        group=Group.HTTP,
        default=True,
        parse=boolean,
        metavar="BOOL",
        help="serve the V2 HTTP/REST protocol; false serves gRPC (and metrics) alone",
    ),
    Option(
        flag="--http-host",
        group=Group.HTTP,
        field="http_host",
        metavar="H",
        help="address to listen on",
    ),
    Option(
        flag="--http-port",
        group=Group.HTTP,
        field="http_port",
        parse=int,
        metavar="PORT",
        help="HTTP port",
    ),
    Option(
        flag="--http-workers",
        group=Group.HTTP,
        parse=values.workers,
        metavar="N",
        help="HTTP front processes on the one port, this one included, all feeding the same "
        "schedulers (default: 1 below 4 usable cores, then one per two cores, at most 8; "
        f"{WORKERS_PER_CORE} per usable core at most)",
    ),
    Option(
        flag="--http-server",
        group=Group.HTTP,
        field="http_server",
        choices=("auto", "uvicorn", "hypercorn"),
        help="auto: uvicorn for HTTP/1.1, Hypercorn with --http2",
    ),
    Option(
        flag="--http2",
        group=Group.HTTP,
        field="http2",
        switch=True,
        help="serve HTTP/2 with Hypercorn (h2c, or h2 with TLS)",
    ),
    Option(
        flag="--ssl-certfile",
        group=Group.HTTP,
        field="ssl_certfile",
        metavar="PEM",
        help="serve HTTPS with this certificate (chain)",
    ),
    Option(
        flag="--ssl-keyfile",
        group=Group.HTTP,
        field="ssl_keyfile",
        metavar="PEM",
        help="the certificate's private key",
        check=values.tls_pair,
    ),
    Option(
        flag="--http-max-input-size",
        group=Group.HTTP,
        field="http_max_input_size",
        parse=int,
        metavar="BYTES",
        help="refuse infer request bodies larger than this, compressed or once inflated",
    ),
    Option(
        flag="--http-header-timeout-secs",
        group=Group.HTTP,
        field="http_header_timeout_secs",
        parse=non_negative(float),
        metavar="S",
        help="a request head (request line and headers) must be complete within S seconds "
        "of the connection opening or of its first byte; else 408 and close (0 = off)",
    ),
    Option(
        flag="--http-body-timeout-secs",
        group=Group.HTTP,
        field="http_body_timeout_secs",
        parse=non_negative(float),
        metavar="S",
        help="longest silence allowed while a request body arrives (an idle timeout, so "
        "slow links are fine while bytes flow); then 408 and close (0 = off)",
    ),
    Option(
        flag="--http-max-connections",
        group=Group.HTTP,
        field="http_max_connections",
        parse=non_negative(int),
        metavar="N",
        help="most open connections; at the cap a new one closes the connection waiting "
        "longest without a running request, or gets 503 if all run one (0 = no cap; "
        "uvicorn only)",
    ),
    Option(
        flag="--http-restricted-api",
        group=Group.HTTP,
        field="restricted",
        parse=values.restricted,
        repeat=True,
        metavar="API:KEY=VALUE",
        help="require header KEY: VALUE on these APIs (e.g. model-repository:admin-key=s3cret)",
    ),
    Option(
        flag="--openai-api-key",
        group=Group.HTTP,
        field="openai_api_keys",
        repeat=True,
        metavar="KEY",
        help="require Authorization: Bearer KEY on the OpenAI-compatible routes (/v1/...); "
        "repeat for several keys. REPOSERVE_OPENAI_API_KEYS (comma-separated) adds more, "
        "out of sight of ps",
    ),
)

_GRPC = (
    Option(
        flag="--allow-grpc",
        group=Group.GRPC,
        default=True,
        parse=boolean,
        metavar="BOOL",
        help="serve Triton's gRPC protocol (GRPCInferenceService and grpc.health.v1)",
        check=values.inference_front,
    ),
    Option(
        flag="--grpc-port",
        group=Group.GRPC,
        field="grpc_port",
        parse=int,
        metavar="PORT",
        help="gRPC port",
    ),
    Option(
        flag="--grpc-address",
        group=Group.GRPC,
        field="grpc_address",
        metavar="H",
        help="address the gRPC port listens on (default: --http-host's)",
    ),
    Option(
        flag="--grpc-workers",
        group=Group.GRPC,
        parse=values.workers,
        metavar="N",
        help="gRPC front processes on the one port, as --http-workers",
    ),
    Option(
        flag="--grpc-use-ssl",
        group=Group.GRPC,
        field="grpc_use_ssl",
        parse=boolean,
        metavar="BOOL",
        help="TLS on gRPC",
    ),
    Option(
        flag="--grpc-use-ssl-mutual",
        group=Group.GRPC,
        field="grpc_use_ssl_mutual",
        parse=boolean,
        metavar="BOOL",
        help="mutual TLS on gRPC: clients need a certificate signed by --grpc-root-cert",
    ),
    Option(
        flag="--grpc-server-cert",
        group=Group.GRPC,
        field="grpc_server_cert",
        metavar="PEM",
        help="gRPC TLS certificate (chain)",
    ),
    Option(
        flag="--grpc-server-key",
        group=Group.GRPC,
        field="grpc_server_key",
        metavar="PEM",
        help="gRPC TLS private key",
    ),
    Option(
        flag="--grpc-root-cert",
        group=Group.GRPC,
        field="grpc_root_cert",
        metavar="PEM",
        help="CA certificate(s) client certificates chain to",
    ),
    Option(
        flag="--grpc-restricted-protocol",
        group=Group.GRPC,
        field="grpc_restricted",
        parse=values.restricted,
        repeat=True,
        metavar="API:KEY=VALUE",
        help="require metadata KEY: VALUE on these gRPC APIs (as --http-restricted-api)",
    ),
)

_METRICS = (
    Option(
        flag="--allow-metrics",
        group=Group.METRICS,
        default=True,
        parse=boolean,
        metavar="BOOL",
        help="serve Prometheus metrics on --metrics-port",
    ),
    Option(
        flag="--metrics-port",
        group=Group.METRICS,
        field="metrics_port",
        parse=int,
        metavar="PORT",
        help="metrics port",
    ),
    Option(
        flag="--metrics-address",
        group=Group.METRICS,
        field="metrics.address",
        metavar="H",
        help="address the metrics port listens on (default: --http-host's)",
    ),
    Option(
        flag="--metrics-interval-ms",
        group=Group.METRICS,
        field="metrics.interval_ms",
        parse=positive("milliseconds"),
        metavar="MS",
        help="how often CPU and GPU usage is sampled for the metrics",
    ),
    Option(
        flag="--metrics-config",
        group=Group.METRICS,
        parse=values.metrics_setting,
        repeat=True,
        metavar="SETTING=VALUE",
        help=values.metrics_config_help(),
    ),
    *(
        Option(
            flag=f"--allow-{kind}-metrics",
            group=Group.METRICS,
            field=f"metrics.{kind}",
            parse=boolean,
            metavar="BOOL",
            help=f"sample {kind.upper()} utilisation and memory for nv_{kind}_*",
        )
        for kind in ("cpu", "gpu")
    ),
)

_MEMORY = (
    Option(
        flag="--host-memory-budget",
        group=Group.MEMORY,
        field="host_memory_budget",
        parse=memory_budget,
        metavar="BYTES|SHARE",
        help="keep the loaded models' host memory (their instances' PSS) within this: bytes "
        "(1500000000, 1.5G) or a share of the machine's (60%); idle models are unloaded, "
        "least recently used first, to make room (default: no budget)",
    ),
    Option(
        flag="--gpu-memory-budget",
        group=Group.MEMORY,
        field="gpu_memory_budget",
        parse=memory_budget,
        metavar="BYTES|SHARE",
        help="the same on each GPU alone, by the GPU memory NVML lists for the instances: "
        "bytes or a share of each GPU's memory (80%); needs a visible GPU (default: no budget)",
        check=values.gpu_visible,
    ),
    Option(
        flag="--allow-client-shm",
        group=Group.MEMORY,
        field="allow_client_shm",
        parse=boolean,
        alone_means_true=True,
        metavar="BOOL",
        help="let clients register shared-memory regions and place tensors in them "
        "(Triton's shared-memory extension). Registering answers only local clients "
        "unless --http-restricted-api shared-memory:KEY=VALUE opens it",
    ),
    Option(
        flag="--client-shm-max-regions",
        group=Group.MEMORY,
        field="client_shm_max_regions",
        parse=positive_int,
        metavar="N",
        help="most client shared-memory regions held at once, each an open file (at most a "
        "quarter of the process's open-file limit); a registration past it is refused",
    ),
)

_DEPRECATED = (
    Option(
        flag="--strict-model-config",
        group=Group.DEPRECATED,
        default=False,
        parse=boolean,
        metavar="BOOL",
        help="Triton's older flag: true = --disable-auto-complete-config",
    ),
)

OPTIONS: tuple[Option, ...] = (
    *_SERVER,
    *_LOGGING,
    *_MODEL_REPOSITORY,
    *_HTTP,
    *_GRPC,
    *_METRICS,
    *_MEMORY,
    *_DEPRECATED,
)
