"""Model and server lifecycle: L0_backend_python/{lifecycle,restart,model_readiness,
model_control,logging}/test.sh."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

from ..shell import Dir
from ..spec import Hook, LogCheck, Pytest, Step, Suite

PM = "../../python_models"
BACKEND_DIR = "--backend-directory=/opt/tritonserver/backends"


def args(sub: str, *more: str) -> tuple[str, ...]:
    return (f"--model-repository={{MODELDIR}}/{sub}/models", BACKEND_DIR, "--log-verbose=1", *more)


# -- hooks shared by several test.sh ------------------------------------------------------
def kill_children(sig: int = signal.SIGKILL):
    """for proc in $(pgrep --parent $SERVER_PID); do kill -9 $proc; done"""

    def hook(live) -> None:
        for child in live.children():
            child.send_signal(sig)

    return hook


def kill_stubs(sig: int):
    """kill -$SIGNAL $(pgrep -f triton_python_backend_stub); sleep 1 (the stubs are
    reposerve's instance processes)."""

    def hook(live) -> str | None:
        stubs = live.stubs()
        if not stubs:
            return "AssertionError: no instance process found (pgrep -f triton_python_backend_stub)"
        for stub in stubs:
            stub.send_signal(sig)
        time.sleep(1)
        return None

    return hook


def post_logging(settings: dict):
    """curl -d'SETTINGS' localhost:8000/v2/logging; test.sh wants 200."""

    def hook(live) -> str | None:
        request = urllib.request.Request(
            "http://localhost:8000/v2/logging", data=json.dumps(settings).encode(), method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                code, body = r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            code, body = e.code, e.read().decode(errors="replace")
        if code != 200:
            return f"AssertionError: POST /v2/logging {json.dumps(settings)}: {code} {body[:200]}"
        return None

    return hook


# -- lifecycle ----------------------------------------------------------------------------
def setup_lifecycle(d: Dir) -> None:
    d.rm("*.log", "models")
    for name in ("error_code", "execute_cancel"):
        d.model(name, f"{PM}/{name}")
    for name, delay in (("execute_error", 12000000), ("execute_grpc_error", 1200000)):
        d.model(name, f"{PM}/{name}")
        config = f"models/{name}/config.pbtxt"
        d.sed(config, r"^name:.*", f'name: "{name}"')
        d.sed(config, r"^max_batch_size:.*", "max_batch_size: 8")
        d.append(
            config,
            "dynamic_batching { preferred_batch_size: [8], "
            f"max_queue_delay_microseconds: {delay} }}",
        )
    for name in ("decoupled_grpc_error", "execute_return_error", "wrong_model"):
        d.model(name, f"{PM}/{name}")
    d.sed("models/wrong_model/config.pbtxt", r"^name:.*", 'name: "wrong_model"')
    d.sed("models/wrong_model/config.pbtxt", "TYPE_FP32", "TYPE_UINT32", every=True)


def only(name: str, files: tuple[str, ...] = ("model.py",), config: bool = True):
    """rm -rf models/; mkdir -p models/NAME/1/; cp the model (and its config)."""

    def setup(d: Dir) -> None:
        d.rm("models")
        if config:
            d.model(name, f"{PM}/{name}", files=files)
        else:
            d.mkdir(f"models/{name}/1")
            for file in files:
                d.cp(f"{PM}/{name}/{file}", f"models/{name}/1/")

    return setup


LIFECYCLE = Suite(
    name="lifecycle",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/lifecycle",
            setup=setup_lifecycle,
            args=args("lifecycle"),
            log="lifecycle_server.log",
            clients=tuple(Pytest("lifecycle_test.py", label=f"iter{i}/") for i in range(5)),
        ),
        Step(
            name="init_error",
            cwd="qa/L0_backend_python/lifecycle",
            setup=only("init_error"),
            args=args("lifecycle"),
            log="lifecycle_server.log",
            expect="exit",
            start_case="server_exits",
            log_checks=(LogCheck("log:lorem_ipsum", "name 'lorem_ipsum' is not defined"),),
        ),
        Step(
            name="fini_error",
            cwd="qa/L0_backend_python/lifecycle",
            setup=only("fini_error"),
            args=args("lifecycle"),
            log="lifecycle_server.log",
            start_case="server_ready",
            log_checks=(
                LogCheck("log:undefined_variable", "name 'undefined_variable' is not defined"),
            ),
        ),
        Step(
            name="auto_complete_error",
            cwd="qa/L0_backend_python/lifecycle",
            setup=only("auto_complete_error", config=False),
            args=args("lifecycle", "--strict-model-config=false"),
            log="lifecycle_server.log",
            expect="exit",
            start_case="server_exits",
            log_checks=(
                LogCheck("log:undefined_variable", "name 'undefined_variable' is not defined"),
            ),
        ),
    ),
    skipped=(
        (
            "shm_pages_cleaned",
            "counts /dev/shm entries around each server; /dev/shm is shared with other "
            "processes on this machine",
        ),
    ),
)


# -- restart ------------------------------------------------------------------------------
def _stops_after_stub_kill(live) -> str | None:
    kill_children()(live)
    live.proc.terminate()
    try:
        live.proc.wait(timeout=60)
    except Exception:
        return "AssertionError: the server did not exit within 60 s of SIGTERM after its stubs died"
    return None


RESTART = Suite(
    name="restart",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/restart",
            setup=lambda d: d.rm("*.log", "free_memory.txt"),
            args=args("restart"),
            log="restart_server.log",
            clients=(
                Pytest("restart_test.py::RestartTest::test_infer"),
                Hook(kill_children()),
                Pytest("restart_test.py::RestartTest::test_restart"),
            ),
        ),
        Step(
            name="kill_stubs_then_stop",
            cwd="qa/L0_backend_python/restart",
            args=args("restart"),
            log="restart_server.log",
            clients=(Hook(_stops_after_stub_kill, case="server_stops"),),
        ),
    ),
)


# -- model_readiness ----------------------------------------------------------------------
def setup_readiness_identity(d: Dir) -> None:
    d.rm("*.log", "models")
    d.model("identity_fp32", f"{PM}/identity_fp32")


def setup_readiness_models(d: Dir) -> None:
    for name, value, delay in (
        ("is_ready_fn_returns_true", "true", "0.1"),
        ("is_ready_fn_returns_false", "false", "0.1"),
        ("is_ready_fn_raises_error", "exception", "0.1"),
        ("is_ready_fn_returns_non_boolean", "non_boolean", "0.1"),
        ("is_ready_fn_timeout", "true", "8"),
        ("is_ready_fn_coroutine_returns_true", "coroutine", "0.1"),
    ):
        d.mkdir(f"models/{name}/1")
        source = "readiness_coroutine_model.py" if "coroutine" in name else "readiness_model.py"
        d.cp(f"test_models/{source}", f"models/{name}/1/model.py")
        config = f"models/{name}/config.pbtxt"
        d.cp("models/identity_fp32/config.pbtxt", config)
        d.sed(config, r"^name:.*", f'name: "{name}"')
        d.append(
            config,
            'parameters: {\n  key: "READINESS_FN_RETURN_VALUE"\n'
            f'  value: {{ string_value: "{value}" }}\n}}\n'
            'parameters: {\n  key: "READINESS_FN_DELAY_SECS"\n'
            f'  value: {{ string_value: "{delay}" }}\n}}',
        )
    name = "is_ready_fn_returns_true_decoupled"
    d.mkdir(f"models/{name}/1")
    d.cp(f"test_models/{name}/model.py", f"models/{name}/1/model.py")
    d.cp(f"test_models/{name}/config.pbtxt", f"models/{name}/config.pbtxt")


UNITTEST = "python3 -m unittest test_model_readiness.{}"


def _signal_step(sig: int, setup) -> Step:
    not_healthy = (
        "Model 'identity_fp32' version 1 is not ready: "
        "Stub process 'identity_fp32_0_0' is not healthy."
    )
    return Step(
        name=f"signal_{sig}",
        cwd="qa/L0_backend_python/model_readiness",
        setup=setup,
        args=args("model_readiness"),
        log=f"model_readiness_signal_{sig}_server.log",
        clients=(
            Pytest(
                "test_model_readiness.py::TestModelReadiness::test_model_ready",
                as_in_test_sh=UNITTEST.format("TestModelReadiness.test_model_ready"),
            ),
            Hook(kill_stubs(sig), case=f"kill_{sig}_stub"),
            Pytest(
                "test_model_readiness.py::TestModelReadiness::test_model_not_ready",
                as_in_test_sh=UNITTEST.format("TestModelReadiness.test_model_not_ready"),
            ),
        ),
        log_checks=(LogCheck("log:stub_not_healthy", not_healthy, "==2"),),
    )


MODEL_READINESS = Suite(
    name="model_readiness",
    steps=(
        _signal_step(11, setup_readiness_identity),
        _signal_step(9, None),
        Step(
            name="user_defined",
            cwd="qa/L0_backend_python/model_readiness",
            setup=setup_readiness_models,
            args=(
                "--model-repository={PWD}/models",
                BACKEND_DIR,
                "--log-verbose=1",
                "--strict-readiness=false",
            ),
            log="test_user_defined_model_readiness_function_server.log",
            clients=(
                Pytest(
                    "test_model_readiness.py::TestUserDefinedModelReadinessFunction",
                    as_in_test_sh=UNITTEST.format("TestUserDefinedModelReadinessFunction -v"),
                ),
            ),
        ),
    ),
)


# -- model_control ------------------------------------------------------------------------
def setup_model_control(d: Dir) -> None:
    d.rm("*.log", "models")
    d.model("identity_fp32", f"{PM}/identity_fp32")
    d.mkdir("models/simple_identity_fp32/1")
    d.cp(f"{PM}/simple_identity_fp32/config.pbtxt", "models/simple_identity_fp32/config.pbtxt")


MODEL_CONTROL = Suite(
    name="model_control",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/model_control",
            setup=setup_model_control,
            args=args("model_control", "--model-control-mode=explicit"),
            log="model_control_server.log",
            clients=(
                Pytest("model_control_test.py"),
                Pytest(
                    "model_control_test.py::ModelIDValidationTest", label="model_id_validation/"
                ),
            ),
        ),
    ),
)


# -- logging ------------------------------------------------------------------------------
def setup_logging(d: Dir) -> None:
    d.rm("*.log", "models")
    d.model("identity_fp32_logging", f"{PM}/identity_fp32_logging")


def _log_counts(non_verbose: int, verbose: int) -> tuple[LogCheck, ...]:
    checks = [
        LogCheck(f"log:{msg.split()[0].lower()}_msg_count", msg, f"=={non_verbose}")
        for msg in ("Specific Msg!", "Info Msg!", "Warning Msg!", "Error Msg!")
    ]
    return (*checks, LogCheck("log:verbose_msg_count", "Verbose Msg!", f"=={verbose}"))


LOGGING_ARGS = ("--model-repository={MODELDIR}/logging/models", BACKEND_DIR)
LOGGING = Suite(
    name="logging",
    steps=(
        Step(
            name="default",
            cwd="qa/L0_backend_python/logging",
            setup=setup_logging,
            args=LOGGING_ARGS,
            log="logging_server.log",
            clients=(Pytest("logging_test.py"),),
            log_checks=_log_counts(4, 0),
        ),
        Step(
            name="verbose",
            cwd="qa/L0_backend_python/logging",
            args=LOGGING_ARGS,
            log="logging_server.log",
            clients=(
                Hook(post_logging({"log_verbose_level": 1}), case="post_log_verbose_level"),
                Pytest("logging_test.py"),
            ),
            log_checks=_log_counts(4, 3),
        ),
        Step(
            name="disabled",
            cwd="qa/L0_backend_python/logging",
            args=LOGGING_ARGS,
            log="logging_server.log",
            clients=(
                *(
                    Hook(post_logging({name: False}), case=f"post_{name}_false")
                    for name in ("log_info", "log_warning", "log_error")
                ),
                Pytest("logging_test.py"),
            ),
            log_checks=_log_counts(1, 0),
        ),
    ),
)

SUITES = (LIFECYCLE, RESTART, MODEL_READINESS, MODEL_CONTROL, LOGGING)
