"""Models calling models, and tensors in and out: L0_backend_python/{bls,ensemble,io,
argument_validation,custom_metrics}/test.sh."""

from __future__ import annotations

from ..shell import Dir
from ..spec import LogCheck, Pytest, Step, Suite
from .lifecycle import BACKEND_DIR, args

PM = "../../python_models"
SHM_LEAK = "../test_infer_shm_leak.py"
DATADIR = "needs /data/inferenceserver/{} (models Triton's CI generates; not on this machine)"
GPU = "needs a GPU ({})"


def in_model(model: str, **env: str) -> Pytest:
    """test_infer_shm_leak.py with MODEL_NAME: the model runs its own unittest and returns 1."""
    return Pytest(SHM_LEAK, label=f"{model}/", env={"MODEL_NAME": model, **env})


# -- bls ----------------------------------------------------------------------------------
def setup_bls(d: Dir) -> None:
    d.rm("*.log", "models", "*.txt", "*.xml")
    for name in (
        "bls",
        "dlpack_add_sub",
        "bls_async",
        "bls_memory",
        "bls_memory_async",
        "add_sub",
        "execute_error",
        "identity_fp32",
        "dlpack_identity",
    ):
        d.model(name, f"{PM}/{name}")
    # cp -r ${DATADIR}/qa_sequence_implicit_model_repository/onnx_nobatch_sequence_int32/:
    # not on this machine; only the bls and bls_async tests use it (skipped below).
    d.clone_python_backend()
    d.mkdir("models/square_int32/1")
    d.cp("python_backend/examples/decoupled/square_model.py", "models/square_int32/1/model.py")
    d.cp(
        "python_backend/examples/decoupled/square_config.pbtxt", "models/square_int32/config.pbtxt"
    )
    d.model("dlpack_square", f"{PM}/dlpack_square")
    d.model("identity_fp32_timeout", f"{PM}/identity_fp32_timeout")
    # libtorch_gpu / libtorch_cpu come from ${DATADIR}/qa_model_repository: not here either.


def setup_bls_error(name: str):
    def setup(d: Dir) -> None:
        d.rm("models")
        d.model(name, f"{PM}/{name}")

    return setup


def setup_bls_parameters(d: Dir) -> None:
    d.rm("params_models")
    d.mkdir("params_models/bls_parameters/1")
    d.cp(f"{PM}/bls_parameters/model.py", "params_models/bls_parameters/1")
    d.cp(f"{PM}/bls_parameters/config.pbtxt", "params_models/bls_parameters")


BLS_ONLY_IN_EXECUTE = "BLS is only supported during the 'execute' function."
BLS_MODEL_TESTS = "needs a GPU (the model's own tests move tensors to cuda) and " + DATADIR.format(
    "onnx_nobatch_sequence_int32 and libtorch_nobatch_float32_float32_float32"
)


def _bls_trial(trial: str, setup) -> Step:
    return Step(
        name=trial,
        cwd="qa/L0_backend_python/bls",
        setup=setup,
        args=args("bls", "--cuda-memory-pool-byte-size=0:67108864"),
        log=f"bls_{trial}.64.inference_server.log",
        env={"BLS_KIND": trial},
        clients=tuple(in_model(m) for m in ("bls_memory", "bls_memory_async")),
        notes="test.sh runs each trial with a 64 and a 256 MiB CUDA pool; reposerve has no "
        "pool flag, so the two passes would be the same: run once",
    )


BLS = Suite(
    name="bls",
    steps=(
        _bls_trial("non_decoupled", setup_bls),
        _bls_trial("decoupled", None),
        Step(
            name="bls_init_error",
            cwd="qa/L0_backend_python/bls",
            setup=setup_bls_error("bls_init_error"),
            args=args("bls"),
            log="bls_init_error_server.log",
            expect="fail",
            start_case="server_start_fails",
            log_checks=(LogCheck("log:bls_only_in_execute", BLS_ONLY_IN_EXECUTE),),
        ),
        Step(
            name="bls_finalize_error",
            cwd="qa/L0_backend_python/bls",
            setup=setup_bls_error("bls_finalize_error"),
            args=args("bls"),
            log="bls_finalize_error_server.log",
            start_case="server_ready",
            log_checks=(LogCheck("log:bls_only_in_execute", BLS_ONLY_IN_EXECUTE),),
        ),
        Step(
            name="bls_parameters",
            cwd="qa/L0_backend_python/bls",
            setup=setup_bls_parameters,
            args=(
                "--model-repository={MODELDIR}/bls/params_models",
                BACKEND_DIR,
                "--log-verbose=1",
            ),
            log="bls_parameters.server.log",
            clients=(
                Pytest("bls_parameters_test.py", as_in_test_sh="python3 bls_parameters_test.py"),
            ),
        ),
    ),
    skipped=(
        *(
            (f"{trial}::{model}/TestInferShmLeak::test_shm_leak", BLS_MODEL_TESTS)
            for trial in ("non_decoupled", "decoupled")
            for model in ("bls", "bls_async")
        ),
        *(
            (f"{trial}::log:request_timeout", "written by the bls model's test_timeout (skipped)")
            for trial in ("non_decoupled", "decoupled")
        ),
        ("log:no_cuda_pool_failure", GPU.format("grep for a CUDA memory pool failure")),
        (
            "bls_model_loading::TestInferShmLeak::test_shm_leak",
            DATADIR.format("qa_model_repository/onnx_int32_int32_int32"),
        ),
        (
            "bls_model_loading_warmup::load",
            DATADIR.format("qa_model_repository/onnx_int32_int32_int32"),
        ),
    ),
)


# -- ensemble -----------------------------------------------------------------------------
def setup_ensemble(d: Dir) -> None:
    d.rm("models", "ensemble_client.log")
    d.mkdir("models/ensemble/1")
    d.cp(f"{PM}/ensemble/config.pbtxt", "models/ensemble")
    for name in ("add_sub_1", "add_sub_2"):
        d.mkdir(f"models/{name}/1")
        d.cp(f"{PM}/add_sub/config.pbtxt", f"models/{name}/")
        d.cp(f"{PM}/add_sub/model.py", f"models/{name}/1/")
    # ensemble_gpu and ${DATADIR}/qa_model_repository/libtorch_float32_float32_float32 are
    # left out, as test.sh does where it cannot run them (its TEST_WINDOWS branch).


ENSEMBLE = Suite(
    name="ensemble",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/ensemble",
            setup=setup_ensemble,
            args=args("ensemble"),
            log="ensemble_server.log",
            clients=(
                Pytest(
                    "ensemble_test.py",
                    skip={
                        "EnsembleTest::test_ensemble_gpu": GPU.format("KIND_GPU libtorch step")
                        + " and "
                        + DATADIR.format("qa_model_repository/libtorch_float32_float32_float32")
                    },
                ),
            ),
        ),
    ),
)


# -- io -----------------------------------------------------------------------------------
def setup_io_requested_output(d: Dir) -> None:
    d.rm("*.log", "models")
    d.mkdir("models")
    d.model("add_sub", f"{PM}/add_sub")
    d.model("dlpack_io_identity_decoupled", f"{PM}/dlpack_io_identity_decoupled")


def setup_io_llm(d: Dir) -> None:
    d.rm("models")
    d.mkdir("models/llm/1")
    d.cp("requested_output_model/config.pbtxt", "models/llm/")
    d.cp("requested_output_model/model.py", "models/llm/1/")


IO_TEST = "io_test.py::IOTest::"
IO = Suite(
    name="io",
    steps=(
        Step(
            name="requested_output",
            cwd="qa/L0_backend_python/io",
            setup=setup_io_requested_output,
            args=args("io"),
            log="io_server.log",
            clients=(
                Pytest(IO_TEST + "test_requested_output_default"),
                Pytest(IO_TEST + "test_requested_output_decoupled"),
            ),
        ),
        Step(
            name="prior_crash",
            cwd="qa/L0_backend_python/io",
            setup=setup_io_llm,
            args=args("io"),
            log="io_server.log",
            clients=(Pytest(IO_TEST + "test_requested_output_decoupled_prior_crash"),),
        ),
    ),
    skipped=(
        *(
            (
                f"{trial}::IOTest::test_ensemble_io",
                GPU.format("every CPU/GPU placement of 3 models"),
            )
            for trial in ("default", "decoupled")
        ),
        ("IOTest::test_empty_gpu_output", GPU.format("dlpack_empty_output returns a GPU tensor")),
        ("IOTest::test_variable_gpu_output", GPU.format("variable_gpu_output is KIND_GPU")),
    ),
)


# -- argument_validation, custom_metrics ---------------------------------------------------
ARGUMENT_VALIDATION = Suite(
    name="argument_validation",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/argument_validation",
            setup=lambda d: d.rm("*.log"),
            args=args("argument_validation"),
            log="arg_validation_server.log",
            clients=(in_model("argument_validation"),),
        ),
    ),
)


def setup_custom_metrics(d: Dir) -> None:
    d.rm("*.log", "models", "*.txt")
    d.model("custom_metrics", f"{PM}/custom_metrics")


CUSTOM_METRICS = Suite(
    name="custom_metrics",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/custom_metrics",
            setup=setup_custom_metrics,
            args=args("custom_metrics"),
            log="custom_metrics_server.log",
            clients=(in_model("custom_metrics"),),
        ),
    ),
)

SUITES = (BLS, ENSEMBLE, IO, ARGUMENT_VALIDATION, CUSTOM_METRICS)
