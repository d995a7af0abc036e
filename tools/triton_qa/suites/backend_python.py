"""qa/L0_backend_python/test.sh, the top level: python_test.py and the server-start checks.

(Its subfolders are their own suites; see the other modules here.)
"""

from __future__ import annotations

import time

from ..shell import Dir
from ..spec import Hook, LogCheck, Pytest, Step, Suite

CWD = "qa/L0_backend_python"
BASE = (
    "--model-repository={MODELDIR}/models",
    "--backend-directory=/opt/tritonserver/backends",
    "--log-verbose=1",
)
SHM = ("--backend-config=python,shm-default-byte-size=5242880",)
PM = "../python_models"


def _identity_variant(
    d: Dir, name: str, *edits: tuple[str, str], append: str | None = None
) -> None:
    """cp -r ./models/identity_fp32 ./models/NAME; sed the name and EDITS; echo APPEND >>"""
    d.cp("models/identity_fp32", f"models/{name}")
    config = f"models/{name}/config.pbtxt"
    d.sed(config, r"^name:.*", f'name: "{name}"')
    for pattern, repl in edits:
        d.sed(config, pattern, repl, every=pattern.startswith("TYPE_"))
    if append:
        d.append(config, append)


def setup_main(d: Dir) -> None:
    d.rm("*.log", "models")
    d.model("identity_fp32", f"{PM}/identity_fp32")
    d.model("identity_bf16", f"{PM}/identity_bf16")
    _identity_variant(
        d,
        "identity_uint8",
        ("TYPE_FP32", "TYPE_UINT8"),
        (r"^max_batch_size:.*", "max_batch_size: 8"),
        append="dynamic_batching { preferred_batch_size: [8], "
        "max_queue_delay_microseconds: 12000000 }",
    )
    _identity_variant(
        d, "identity_uint8_nobatch", ("TYPE_FP32", "TYPE_UINT8"), (r"^max_batch_size:.*", "")
    )
    _identity_variant(d, "identity_uint32", ("TYPE_FP32", "TYPE_UINT32"))
    _identity_variant(d, "identity_bool", ("TYPE_FP32", "TYPE_BOOL"))
    # default_model_filename
    d.cp("models/identity_fp32", "models/default_model_name")
    d.mv("models/default_model_name/1/model.py", "models/default_model_name/1/mymodel.py")
    d.sed("models/default_model_name/config.pbtxt", r"^name:.*", 'name: "default_model_name"')
    d.append("models/default_model_name/config.pbtxt", 'default_model_filename: "mymodel.py"')
    d.model("pytorch_fp32_fp32", f"{PM}/pytorch_fp32_fp32")
    d.sed("models/pytorch_fp32_fp32/config.pbtxt", r"^name:.*", 'name: "pytorch_fp32_fp32"')
    d.model("delayed_model", f"{PM}/delayed_model")
    d.model("init_args", f"{PM}/init_args")
    # sed "s|TRITON_DIR_PATH|${TRITON_DIR}|": the runner exports TRITON_DIR as the folder
    # holding qa/, where Triton's image keeps it (/opt/tritonserver).
    d.sed("models/init_args/config.pbtxt", "TRITON_DIR_PATH", str(d.root))
    for name in ("optional", "non_contiguous", "string", "string_fixed", "dlpack_identity"):
        d.model(name, f"{PM}/{name}")


def _non_graceful_exit(live) -> str | None:
    """sleep 5; remember the server's children; kill -9 the server; sleep 10; each child
    must be gone (the stubs notice the parent died)."""
    time.sleep(5)
    children = live.children()
    live.proc.kill()
    live.proc.wait()
    time.sleep(10)
    alive = [c.pid for c in children if c.is_running() and c.status() != "zombie"]
    if alive:
        return f"AssertionError: instance processes {alive} outlived a kill -9 of the server"
    return None


def setup_multi_file(d: Dir) -> None:
    d.rm("models")
    d.mkdir("models/multi_file/1")
    d.cp(f"{PM}/multi_file/*.py", "models/multi_file/1/")
    d.cp(f"{PM}/identity_fp32/config.pbtxt", "models/multi_file/")
    d.sed("models/multi_file/config.pbtxt", r"^name:.*", 'name: "multi_file"')


def setup_model_env(d: Dir) -> None:
    d.rm("models")
    d.model("model_env", f"{PM}/model_env")


def setup_init_exit(d: Dir) -> None:
    d.rm("models")
    d.model("init_exit", f"{PM}/init_exit")


def setup_non_existent(d: Dir) -> None:
    d.rm("models")
    d.mkdir("models/non_existent_model/1")
    d.cp(f"{PM}/identity_fp32/config.pbtxt", "models/non_existent_model/config.pbtxt")
    d.sed("models/non_existent_model/config.pbtxt", r"^name:.*", 'name: "non_existent_model"')


def _non_existent_checks() -> tuple[LogCheck, ...]:
    return (
        LogCheck(
            "log:python_model_file_not_found",
            "Failed to preinitialize Python stub: Python model file not found in "
            "'{PWD}/models/non_existent_model/1/model.py'",
        ),
        LogCheck("log:failed_to_load", "failed to load 'non_existent_model'"),
    )


GPU_SHM = "needs a GPU (CUDA shared memory via tritonclient.utils.cuda_shared_memory)"

SUITE = Suite(
    name="backend_python",
    steps=(
        Step(
            name="",
            cwd=CWD,
            setup=setup_main,
            args=(*BASE, "--allow-client-shm=true", *SHM),
            log="inference_server.log",
            clients=(
                Pytest(
                    "python_test.py",
                    skip={
                        "PythonTest::test_gpu_tensor_error": GPU_SHM,
                        "PythonTest::test_dlpack_tensor_error": GPU_SHM,
                    },
                ),
            ),
        ),
        Step(
            name="non_graceful_exit",
            cwd=CWD,
            args=(*BASE, *SHM),
            log="inference_server.log",
            clients=(Hook(_non_graceful_exit, case="stubs_exit_after_kill_9"),),
        ),
        Step(
            name="multi_file",
            cwd=CWD,
            setup=setup_multi_file,
            args=(*BASE, *SHM),
            log="inference_server.log",
            start_case="server_ready",
        ),
        Step(
            name="model_env",
            cwd=CWD,
            setup=setup_model_env,
            args=(*BASE, *SHM),
            log="inference_server.log",
            env={"MY_ENV": "MY_ENV"},
            start_case="server_ready",
        ),
        Step(
            name="init_exit",
            cwd=CWD,
            setup=setup_init_exit,
            args=(*BASE, *SHM),
            log="inference_server.log",
            expect="fail",
            start_case="server_start_fails",
            log_checks=(
                LogCheck("log:stub_not_healthy", "Stub process 'init_exit_0_0' is not healthy."),
            ),
        ),
        Step(
            name="non_existent_model",
            cwd=CWD,
            setup=setup_non_existent,
            args=BASE,
            log="non_existent_model_server.log",
            expect="fail",
            start_case="server_start_fails",
            log_checks=_non_existent_checks(),
        ),
        Step(
            name="non_existent_model_auto_config_disabled",
            cwd=CWD,
            args=(*BASE, "--disable-auto-complete-config"),
            log="non_existent_model_server_auto_config_disabled.log",
            expect="fail",
            start_case="server_start_fails",
            log_checks=_non_existent_checks(),
        ),
    ),
    skipped=(
        ("kind_gpu::server_ready", "needs a GPU (add_sub_gpu has instance_group KIND_GPU)"),
        (
            "shm_default_byte_size::region_size",
            "Triton-only: measures the python backend's "
            "/dev/shm/triton_python_backend_shm_region_* files",
        ),
        (
            "shm_pages_cleaned",
            "counts /dev/shm entries before and after each server; /dev/shm is shared with other "
            "processes on this machine",
        ),
    ),
    notes="test.sh also runs the subtests below; each is its own suite here.",
)
