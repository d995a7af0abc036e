"""Command line: flags -> Settings -> serve, and ``reposerve check PATH``. No logic here."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from reposerve.access import API_CATEGORIES
from reposerve.arguments import (
    boolean,
    memory_budget,
    non_negative,
    positive,
    positive_int,
    positive_int_at_most,
)
from reposerve.errors import ConfigError
from reposerve.fronts import WORKERS_PER_CORE, default_workers, max_workers, usable_cores
from reposerve.metrics import MetricsOptions, parse_metrics_setting
from reposerve.repository import gpus
from reposerve.repository.roots import all_model_names, find_root
from reposerve.repository.scan import read_model
from reposerve.settings import RestrictedApi, Settings
from reposerve.shared_memory import MAX_REGIONS

LOG_LEVELS = ("debug", "info", "warning", "error")


def _metrics_setting(value: str) -> tuple[str, object]:
    try:
        return parse_metrics_setting(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _openai_keys(given: list[str]) -> list[str]:
    from_environment = os.environ.get("REPOSERVE_OPENAI_API_KEYS", "").split(",")
    return [key.strip() for key in [*given, *from_environment] if key.strip()]


def _restricted(value: str) -> RestrictedApi:
    apis, _, header = value.partition(":")
    key, _, secret = header.partition("=")
    names = frozenset(api.strip() for api in apis.split(",") if api.strip())
    unknown = names - API_CATEGORIES
    if not names or not key or not secret or unknown:
        raise argparse.ArgumentTypeError(
            f"expected API[,API]:KEY=VALUE with API in {', '.join(sorted(API_CATEGORIES))}, "
            f"got {value!r}"
        )
    return RestrictedApi(names, key.lower(), secret)


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reposerve",
        description="Serve a model repository over KServe V2 HTTP. "
        "`reposerve check PATH` validates a repository instead.",
    )
    add = parser.add_argument
    add(
        "--model-repository",
        type=Path,
        action="append",
        metavar="PATH",
        help="folder of model folders (default: ./model_repository); repeat it to serve "
        "several as one (a model name in two of them does not load)",
    )
    add(
        "--strict-model-config",
        type=boolean,
        default=False,
        metavar="BOOL",
        help="Triton's older flag: true = --disable-auto-complete-config (false)",
    )
    add(
        "--disable-auto-complete-config",
        action="store_true",
        help="read nothing from model files into configs: onnxruntime and torch models "
        "must declare their inputs and outputs",
    )
    add(
        "--model-load-thread-count",
        type=positive_int,
        default=4,
        metavar="N",
        help="how many models load at once, at start-up and after (4)",
    )
    add("--http-host", default="0.0.0.0", metavar="H", help="address to listen on (0.0.0.0)")
    add(
        "--allow-http",
        type=boolean,
        default=True,
        metavar="BOOL",
        help="serve the V2 HTTP/REST protocol (true); false serves gRPC (and metrics) alone",
    )
    add("--http-port", type=int, default=8000, metavar="PORT", help="HTTP port (8000)")
    add("--metrics-port", type=int, default=8002, metavar="PORT", help="metrics port (8002)")
    add(
        "--allow-metrics",
        type=boolean,
        default=True,
        metavar="BOOL",
        help="serve Prometheus metrics on --metrics-port (true)",
    )
    add(
        "--metrics-address",
        metavar="H",
        help="address the metrics port listens on (default: --http-host's)",
    )
    add(
        "--metrics-interval-ms",
        type=positive("milliseconds"),
        default=2000.0,
        metavar="MS",
        help="how often CPU and GPU usage is sampled for the metrics (2000)",
    )
    add(
        "--metrics-config",
        type=_metrics_setting,
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="Triton's metrics settings: counter_latencies=true|false (true), "
        "summary_latencies=true|false (false), summary_quantiles=Q:E,... "
        "(0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001); repeatable",
    )
    for kind in ("cpu", "gpu"):
        add(
            f"--allow-{kind}-metrics",
            type=boolean,
            default=True,
            metavar="BOOL",
            help=f"sample {kind.upper()} utilisation and memory for nv_{kind}_* (true)",
        )
    add(
        "--model-control-mode",
        choices=("explicit", "poll", "none", "on-demand"),
        default=None,
        help="explicit: the load/unload endpoints work and only --load-model models load at "
        "start-up (none without it), as in Triton; poll: changes on disk are loaded every "
        "--repository-poll-secs; none: the repository is fixed; on-demand: a model loads "
        "when its first request comes (which waits for it), and the load/unload endpoints "
        "work. Not given: every model loads and the load/unload endpoints work (explicit "
        "with --load-model '*')",
    )
    add(
        "--host-memory-budget",
        type=memory_budget,
        default=None,
        metavar="BYTES|SHARE",
        help="keep the loaded models' host memory (their instances' PSS) within this: bytes "
        "(1500000000, 1.5G) or a share of the machine's (60%%); idle models are unloaded, "
        "least recently used first, to make room (none: no budget)",
    )
    add(
        "--gpu-memory-budget",
        type=memory_budget,
        default=None,
        metavar="BYTES|SHARE",
        help="the same on each GPU alone, by the GPU memory NVML lists for the instances: "
        "bytes or a share of each GPU's memory (80%%); needs a visible GPU (none: no budget)",
    )

    add(
        "--server-name",
        default="triton",
        metavar="NAME",
        help="the name server metadata (GET /v2, gRPC ServerMetadata) gives: Triton's, which "
        "its clients and scripts check, by default; its version is reposerve's (triton)",
    )
    add(
        "--allow-model-file-override",
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="accept file: parameters on load requests (Triton's model files override; "
        "true, as Triton). They bring code the server runs: the load endpoint answers only "
        "local clients unless --http-restricted-api model-repository:KEY=VALUE opens it, "
        "and false refuses them",
    )
    add(
        "--allow-client-shm",
        type=boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="let clients register shared-memory regions and place tensors in them "
        "(Triton's shared-memory extension; false). Registering answers only local clients "
        "unless --http-restricted-api shared-memory:KEY=VALUE opens it",
    )
    add(
        "--client-shm-max-regions",
        type=positive_int,
        default=MAX_REGIONS,
        metavar="N",
        help=f"most client shared-memory regions held at once, each an open file ({MAX_REGIONS}; "
        "at most a quarter of the process's open-file limit); a registration past it is refused",
    )
    add(
        "--repository-poll-secs",
        type=float,
        default=15.0,
        metavar="S",
        help="how often poll mode looks at the repository (15)",
    )
    add(
        "--load-model",
        action="append",
        metavar="NAME",
        help="load only these models at start-up (repeatable; '*' = all; default: all, "
        "or none with an explicit --model-control-mode explicit)",
    )
    add(
        "--http-server",
        choices=("auto", "uvicorn", "hypercorn"),
        default="auto",
        help="auto: uvicorn for HTTP/1.1, Hypercorn with --http2",
    )
    add("--http2", action="store_true", help="serve HTTP/2 with Hypercorn (h2c, or h2 with TLS)")
    add("--ssl-certfile", metavar="PEM", help="serve HTTPS with this certificate (chain)")
    add("--ssl-keyfile", metavar="PEM", help="the certificate's private key")
    add(
        "--http-max-input-size",
        type=int,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="refuse infer request bodies larger than this, compressed or once inflated "
        "(default 64 MiB)",
    )
    add(
        "--http-header-timeout-secs",
        type=non_negative(float),
        default=30.0,
        metavar="S",
        help="a request head (request line and headers) must be complete within S seconds "
        "of the connection opening or of its first byte; else 408 and close (30; 0 = off)",
    )
    add(
        "--http-body-timeout-secs",
        type=non_negative(float),
        default=60.0,
        metavar="S",
        help="longest silence allowed while a request body arrives (an idle timeout, so "
        "slow links are fine while bytes flow); then 408 and close (60; 0 = off)",
    )
    add(
        "--http-max-connections",
        type=non_negative(int),
        default=1024,
        metavar="N",
        help="most open connections; at the cap a new one closes the connection waiting "
        "longest without a running request, or gets 503 if all run one (1024; 0 = no cap; "
        "uvicorn only)",
    )
    add(
        "--allow-grpc",
        type=boolean,
        default=True,
        metavar="BOOL",
        help="serve Triton's gRPC protocol (GRPCInferenceService and grpc.health.v1; true)",
    )
    add("--grpc-port", type=int, default=8001, metavar="PORT", help="gRPC port (8001)")
    most = max_workers(usable_cores())
    for protocol in ("http", "grpc"):
        add(
            f"--{protocol}-workers",
            type=positive_int_at_most(most, f"{WORKERS_PER_CORE} per usable core"),
            metavar="N",
            help=f"{protocol.upper().replace('GRPC', 'gRPC')} front processes on the one port, "
            "this one included, all feeding the same schedulers (default: 1 below 4 usable "
            f"cores, then one per two cores, at most 8; {WORKERS_PER_CORE} per usable core "
            f"at most, {most} here)",
        )
    add(
        "--grpc-address",
        default=None,
        metavar="H",
        help="address the gRPC port listens on (default: --http-host's)",
    )
    add("--grpc-use-ssl", type=boolean, default=False, metavar="BOOL", help="TLS on gRPC")
    add(
        "--grpc-use-ssl-mutual",
        type=boolean,
        default=False,
        metavar="BOOL",
        help="mutual TLS on gRPC: clients need a certificate signed by --grpc-root-cert",
    )
    add("--grpc-server-cert", metavar="PEM", help="gRPC TLS certificate (chain)")
    add("--grpc-server-key", metavar="PEM", help="gRPC TLS private key")
    add("--grpc-root-cert", metavar="PEM", help="CA certificate(s) client certificates chain to")
    add(
        "--grpc-restricted-protocol",
        type=_restricted,
        action="append",
        default=[],
        metavar="API:KEY=VALUE",
        help="require metadata KEY: VALUE on these gRPC APIs (as --http-restricted-api)",
    )
    add(
        "--http-restricted-api",
        type=_restricted,
        action="append",
        default=[],
        metavar="API:KEY=VALUE",
        help="require header KEY: VALUE on these APIs (e.g. model-repository:admin-key=s3cret)",
    )
    add(
        "--openai-api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require Authorization: Bearer KEY on the OpenAI-compatible routes (/v1/...); "
        "repeat for several keys. REPOSERVE_OPENAI_API_KEYS (comma-separated) adds more, "
        "out of sight of ps",
    )
    add(
        "--shutdown-grace-secs",
        type=non_negative(float),
        default=None,
        metavar="S",
        help="after SIGTERM, report not ready but keep serving for S seconds (while load "
        "balancers stop sending) before the shutdown; a second signal skips it (default: 5 "
        "under Kubernetes, where KUBERNETES_SERVICE_HOST is set; else 0)",
    )
    parser.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        metavar="S",
        help="one budget for a shutdown or an unload: queued and running requests may "
        "finish within it; then each left gets an error and the instances are killed (30)",
    )
    add(
        "--strict-readiness",
        type=boolean,
        default=True,
        metavar="BOOL",
        help="true: /v2/health/ready only while every loaded model is ready; "
        "false: while the server is up (true)",
    )
    add(
        "--instance-restart",
        choices=("immediate", "on-request"),
        default="immediate",
        help="when an instance process that died is replaced: at once (immediate), or as "
        "Triton's python backend does, once the next request comes, which fails "
        "(on-request; the model is not ready meanwhile)",
    )
    add(
        "--exit-on-error",
        type=boolean,
        default=True,
        metavar="BOOL",
        help="exit at start-up if a model fails to load (true)",
    )
    add(
        "--load-timeout-secs",
        type=float,
        default=120.0,
        metavar="S",
        help="how long an instance may take to load its model",
    )
    add(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="the lowest level logged (info); Triton's --log-* flags below refine it",
    )
    add(
        "--log-verbose",
        type=non_negative(int),
        metavar="N",
        help="verbose messages up to level N (0 = none; default 1 with --log-level debug)",
    )
    for level in ("info", "warning", "error"):
        add(
            f"--log-{level}",
            type=boolean,
            metavar="BOOL",
            help=f"log {level.upper()} messages (default: as --log-level says)",
        )
    add(
        "--log-file",
        default="",
        metavar="PATH",
        help="append the log (and everything the server and its instances write) to PATH "
        "instead of the console",
    )
    add(
        "--log-format",
        choices=("default", "ISO8601", "json", "text"),
        default="default",
        help="default (text is the same), ISO8601 (UTC times), json (one object a line)",
    )
    return parser


KUBERNETES_GRACE_SECS = 5.0  # endpoint removal reaches kube-proxy and ingresses in seconds


def _shutdown_grace(value: float | None) -> float:
    """The flag, else a few seconds when running under Kubernetes (which sends SIGTERM
    while the replica is still in its Service's endpoints), else none."""
    if value is not None:
        return value
    return KUBERNETES_GRACE_SECS if os.environ.get("KUBERNETES_SERVICE_HOST") else 0.0


def _log_flags(args: argparse.Namespace) -> dict[str, object]:
    """--log-level sets the defaults; Triton's own flags, when given, win."""
    rank = LOG_LEVELS.index(args.log_level)
    chosen = {
        "log_verbose": 1 if args.log_level == "debug" else 0,
        "log_info": rank <= LOG_LEVELS.index("info"),
        "log_warning": rank <= LOG_LEVELS.index("warning"),
        "log_error": True,
    }
    given = {
        "log_verbose": args.log_verbose,
        "log_info": args.log_info,
        "log_warning": args.log_warning,
        "log_error": args.log_error,
    }
    chosen.update({key: value for key, value in given.items() if value is not None})
    style = "default" if args.log_format == "text" else args.log_format
    return {**chosen, "log_file": args.log_file, "log_format": style}


def _start_models(mode: str | None, names: list[str] | None) -> list[str] | None:
    """The models loaded at start-up (None: every one). Triton's explicit mode loads only
    --load-model ones; reposerve's default (no mode given) loads every model."""
    if names is not None:
        return None if "*" in names else names
    return [] if mode in ("explicit", "on-demand") else None


def settings_from(args: argparse.Namespace) -> Settings:
    names = _start_models(args.model_control_mode, args.load_model)
    return Settings(
        model_repositories=tuple(args.model_repository or [Path("model_repository")]),
        auto_complete=not (args.disable_auto_complete_config or args.strict_model_config),
        model_load_thread_count=args.model_load_thread_count,
        instance_restart=args.instance_restart,
        http_host=args.http_host,
        http_port=args.http_port if args.allow_http else None,
        metrics_port=args.metrics_port if args.allow_metrics else None,
        metrics=MetricsOptions(
            address=args.metrics_address,
            interval_ms=args.metrics_interval_ms,
            cpu=args.allow_cpu_metrics,
            gpu=args.allow_gpu_metrics,
            **dict(args.metrics_config),  # later settings win, as in Triton
        ),
        model_control_mode=args.model_control_mode or "explicit",
        host_memory_budget=args.host_memory_budget,
        gpu_memory_budget=args.gpu_memory_budget,
        repository_poll_secs=args.repository_poll_secs,
        load_models=names,
        http_server=args.http_server,
        http2=args.http2,
        http_max_input_size=args.http_max_input_size,
        http_header_timeout_secs=args.http_header_timeout_secs,
        http_body_timeout_secs=args.http_body_timeout_secs,
        http_max_connections=args.http_max_connections,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        restricted=args.http_restricted_api,
        openai_api_keys=_openai_keys(args.openai_api_key),
        grpc_port=args.grpc_port if args.allow_grpc else None,
        http_workers=args.http_workers or default_workers(usable_cores()),
        grpc_workers=args.grpc_workers or default_workers(usable_cores()),
        grpc_address=args.grpc_address,
        grpc_use_ssl=args.grpc_use_ssl or args.grpc_use_ssl_mutual,
        grpc_use_ssl_mutual=args.grpc_use_ssl_mutual,
        grpc_server_cert=args.grpc_server_cert,
        grpc_server_key=args.grpc_server_key,
        grpc_root_cert=args.grpc_root_cert,
        grpc_restricted=args.grpc_restricted_protocol,
        exit_timeout_secs=args.exit_timeout_secs,
        shutdown_grace_secs=_shutdown_grace(args.shutdown_grace_secs),
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        allow_model_file_override=args.allow_model_file_override,
        allow_client_shm=args.allow_client_shm,
        client_shm_max_regions=args.client_shm_max_regions,
        server_name=args.server_name,
        load_timeout_secs=args.load_timeout_secs,
        **_log_flags(args),
    )


def check_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reposerve check",
        description="Validate model repositories as a load would, one line per model; exit "
        "status 1 if a model is broken, 2 if a path is not a folder.",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="repository folders, served together as several --model-repository would be "
        "(default: model_repository)",
    )
    return parser


def check(argv: list[str]) -> int:
    """Validate repositories (served together, as several --model-repository would be):
    one line per model, exit 1 if any model is broken."""
    paths = check_parser().parse_args(argv).paths
    roots = [Path(path) for path in paths or ["model_repository"]]
    for root in roots:
        if not root.is_dir():
            print(f"{root}: not a folder")
            return 2
    broken = 0
    for name in all_model_names(roots):
        try:
            source = read_model(find_root(roots, name), name)
        except ConfigError as exc:
            broken += 1
            print(f"FAIL {exc.message}")
            continue
        versions = ",".join(str(v.number) for v in source.versions)
        backends = ",".join(sorted({v.backend for v in source.versions}))
        print(f"ok   {name} (versions {versions}; {backends})")
    return 1 if broken else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:
        return check(argv[1:])
    if argv[:1] == ["convert"]:
        from reposerve.convert import convert

        return convert(argv[1:])
    if argv[:1] == ["tune"]:
        from reposerve.tune.command import tune

        return tune(argv[1:])
    args = serve_parser().parse_args(argv)
    settings = settings_from(args)
    if bool(settings.ssl_certfile) != bool(settings.ssl_keyfile):
        print("reposerve: --ssl-certfile and --ssl-keyfile go together", file=sys.stderr)
        return 2
    for root in settings.model_repositories:
        if not root.is_dir():
            print(f"reposerve: model repository {root} is not a folder", file=sys.stderr)
            return 2
    if len({root.resolve() for root in settings.model_repositories}) < len(
        settings.model_repositories
    ):
        print("reposerve: a --model-repository is given twice", file=sys.stderr)
        return 2
    folder = os.path.dirname(os.path.abspath(settings.log_file))
    if settings.log_file and not os.access(folder, os.W_OK):
        print(f"reposerve: --log-file: cannot write in {folder}", file=sys.stderr)
        return 2
    if settings.gpu_memory_budget and not gpus.discover().visible:
        print(
            f"reposerve: --gpu-memory-budget {settings.gpu_memory_budget.text}: "
            f"{gpus.discover().describe()}; drop the flag, or make a GPU visible",
            file=sys.stderr,
        )
        return 2
    if settings.http_port is None and settings.grpc_port is None:
        print(
            "reposerve: nothing to serve inference on: --allow-http and --allow-grpc are both "
            "false; allow one",
            file=sys.stderr,
        )
        return 2
    from reposerve.server import serve

    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
