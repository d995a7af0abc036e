"""Command line: flags -> Settings -> serve, and ``reposerve check PATH``. No logic here."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from reposerve.errors import ConfigError
from reposerve.http.access import API_CATEGORIES
from reposerve.metrics import MetricsOptions, parse_metrics_setting
from reposerve.repository.scan import model_names, read_model
from reposerve.settings import RestrictedApi, Settings

LOG_LEVELS = ("debug", "info", "warning", "error")


def _boolean(value: str) -> bool:
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _non_negative(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError:
            number = -1
        if not number >= 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__} >= 0, got {value!r}")
        return number

    parse.__name__ = kind.__name__  # what argparse names in its messages
    return parse


def _metrics_setting(value: str) -> tuple[str, object]:
    try:
        return parse_metrics_setting(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_ms(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected milliseconds > 0, got {value!r}")
    return number


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
        default=Path("model_repository"),
        metavar="PATH",
        help="folder of model folders (default: ./model_repository)",
    )
    add("--http-host", default="0.0.0.0", metavar="H", help="address to listen on (0.0.0.0)")
    add("--http-port", type=int, default=8000, metavar="PORT", help="HTTP port (8000)")
    add("--metrics-port", type=int, default=8002, metavar="PORT", help="metrics port (8002)")
    add(
        "--allow-metrics",
        type=_boolean,
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
        type=_positive_ms,
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
            type=_boolean,
            default=True,
            metavar="BOOL",
            help=f"sample {kind.upper()} utilisation and memory for nv_{kind}_* (true)",
        )
    add(
        "--model-control-mode",
        choices=("explicit", "poll", "none"),
        default="explicit",
        help="explicit: the load/unload endpoints work; poll: changes on disk are loaded "
        "every --repository-poll-secs; none: the repository is fixed",
    )
    add(
        "--allow-model-file-override",
        type=_boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="accept file: parameters on load requests (Triton's model files override): "
        "they write code the server then runs, so only with this flag (false)",
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
        help="load only these models at start-up (repeatable; '*' = all, the default)",
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
        type=_non_negative(float),
        default=30.0,
        metavar="S",
        help="a request head (request line and headers) must be complete within S seconds "
        "of the connection opening or of its first byte; else 408 and close (30; 0 = off)",
    )
    add(
        "--http-body-timeout-secs",
        type=_non_negative(float),
        default=60.0,
        metavar="S",
        help="longest silence allowed while a request body arrives (an idle timeout, so "
        "slow links are fine while bytes flow); then 408 and close (60; 0 = off)",
    )
    add(
        "--http-max-connections",
        type=_non_negative(int),
        default=1024,
        metavar="N",
        help="most open connections; at the cap a new one closes the connection waiting "
        "longest without a running request, or gets 503 if all run one (1024; 0 = no cap; "
        "uvicorn only)",
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
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        metavar="S",
        help="one budget for a shutdown or an unload: queued and running requests may "
        "finish within it; then each left gets an error and the instances are killed (30)",
    )
    add(
        "--strict-readiness",
        type=_boolean,
        default=True,
        metavar="BOOL",
        help="true: /v2/health/ready only while every loaded model is ready; "
        "false: while the server is up (true)",
    )
    add(
        "--exit-on-error",
        type=_boolean,
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
    add("--log-level", choices=LOG_LEVELS, default="info")
    add("--log-format", choices=("text", "json"), default="text", help="json: one object a line")
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    names = args.load_model
    if names is None or "*" in names:
        names = None
    return Settings(
        model_repository=args.model_repository,
        http_host=args.http_host,
        http_port=args.http_port,
        metrics_port=args.metrics_port if args.allow_metrics else None,
        metrics=MetricsOptions(
            address=args.metrics_address,
            interval_ms=args.metrics_interval_ms,
            cpu=args.allow_cpu_metrics,
            gpu=args.allow_gpu_metrics,
            **dict(args.metrics_config),  # later settings win, as in Triton
        ),
        model_control_mode=args.model_control_mode,
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
        exit_timeout_secs=args.exit_timeout_secs,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        allow_model_file_override=args.allow_model_file_override,
        load_timeout_secs=args.load_timeout_secs,
        log_level=args.log_level,
        log_format=args.log_format,
    )


class _JsonFormatter(logging.Formatter):
    _encoder = msgspec.json.Encoder()

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return self._encoder.encode(document).decode()


def configure_logging(level: str, style: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if style == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def check(paths: list[str]) -> int:
    """Validate repositories: one line per model, exit 1 if any model is broken."""
    broken = 0
    for path in map(Path, paths or ["model_repository"]):
        if not path.is_dir():
            print(f"{path}: not a folder")
            return 2
        for name in model_names(path):
            try:
                source = read_model(path, name)
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
    args = serve_parser().parse_args(argv)
    settings = settings_from(args)
    if bool(settings.ssl_certfile) != bool(settings.ssl_keyfile):
        print("reposerve: --ssl-certfile and --ssl-keyfile go together", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    if not settings.model_repository.is_dir():
        print(
            f"reposerve: model repository {settings.model_repository} is not a folder",
            file=sys.stderr,
        )
        return 2
    from reposerve.http.server import serve

    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())
