"""Responses beyond one-in-one-out: L0_backend_python/{decoupled,response_sender,parameters,
async_execute,request_rescheduling}/test.sh."""

from __future__ import annotations

from ..shell import Dir
from ..spec import LogCheck, Pytest, Step, Suite
from .lifecycle import args

PM = "../../python_models"
DECOUPLED = "model_transaction_policy { decoupled: True }"


# -- decoupled ----------------------------------------------------------------------------
def setup_decoupled(d: Dir) -> None:
    d.rm("*.log")  # models/ ships with the test (decoupled_bls, ...); test.sh adds to it
    d.model("identity_fp32", f"{PM}/identity_fp32")
    d.model("execute_cancel", f"{PM}/execute_cancel")
    d.append("models/execute_cancel/config.pbtxt", DECOUPLED)
    d.model("response_sender_until_cancelled", f"{PM}/response_sender_until_cancelled")
    d.clone_python_backend()
    d.mkdir("models/square_int32/1")
    d.cp("python_backend/examples/decoupled/square_model.py", "models/square_int32/1/model.py")
    d.cp(
        "python_backend/examples/decoupled/square_config.pbtxt", "models/square_int32/config.pbtxt"
    )
    d.model("dlpack_add_sub", f"{PM}/dlpack_add_sub")


DECOUPLED_SUITE = Suite(
    name="decoupled",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/decoupled",
            setup=setup_decoupled,
            args=args("decoupled"),
            log="decoupled_server.log",
            clients=(
                Pytest(
                    "decoupled_test.py",
                    skip={
                        "DecoupledTest::test_decoupled_bls": "needs a GPU (decoupled_bls's "
                        "response thread runs its GPU BLS test, moving tensors to cuda)"
                    },
                ),
            ),
            log_checks=(
                LogCheck("log:specific_msg", "Specific Msg!"),
                LogCheck("log:info_msg", "Info Msg!"),
                LogCheck("log:warning_msg", "Warning Msg!"),
                LogCheck("log:error_msg", "Error Msg!"),
                LogCheck("log:finalize_invoked", "Finalize invoked", "==3"),
                LogCheck("log:finalize_complete", "Finalize complete...", "==3"),
            ),
        ),
    ),
)


# -- response_sender ----------------------------------------------------------------------
def setup_response_sender(d: Dir) -> None:
    d.rm("models")
    d.mkdir("models")
    src = f"{PM}/response_sender"
    for name, model, decoupled, batching in (
        ("response_sender", "model.py", False, False),
        ("response_sender_decoupled", "model.py", True, False),
        ("response_sender_async", "model_async.py", False, False),
        ("response_sender_decoupled_async", "model_async.py", True, False),
        ("response_sender_batching", "model.py", False, True),
        ("response_sender_decoupled_batching", "model.py", True, True),
        ("response_sender_async_batching", "model_async.py", False, True),
        ("response_sender_decoupled_async_batching", "model_async.py", True, True),
    ):
        d.mkdir(f"models/{name}/1")
        d.cp(f"{src}/model_common.py", f"models/{name}/1")
        d.cp(f"{src}/{model}", f"models/{name}/1/model.py")
        d.cp(f"{src}/config.pbtxt", f"models/{name}")
        if decoupled:
            d.append(f"models/{name}/config.pbtxt", DECOUPLED)
        if batching:
            d.append(
                f"models/{name}/config.pbtxt",
                "dynamic_batching { max_queue_delay_microseconds: 500000 }",
            )


def setup_complete_final(d: Dir) -> None:
    d.rm("models")
    d.mkdir("models/response_sender_complete_final/1")
    d.cp(f"{PM}/response_sender_complete_final/model.py", "models/response_sender_complete_final/1")
    d.cp(
        f"{PM}/response_sender_complete_final/config.pbtxt", "models/response_sender_complete_final"
    )


RESPONSE_SENDER = Suite(
    name="response_sender",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/response_sender",
            setup=setup_response_sender,
            args=args("response_sender"),
            log="response_sender_test.server.log",
            env={"SERVER_LOG": "response_sender_test.server.log"},
            clients=(Pytest("response_sender_test.py"),),
        ),
        Step(
            name="complete_final",
            cwd="qa/L0_backend_python/response_sender",
            setup=setup_complete_final,
            args=args("response_sender"),
            log="response_sender_complete_final_test.server.log",
            env={"SERVER_LOG": "response_sender_complete_final_test.server.log"},
            clients=(Pytest("response_sender_complete_final_test.py"),),
        ),
    ),
)


# -- parameters ---------------------------------------------------------------------------
def setup_parameters(d: Dir) -> None:
    d.rm("models")
    for name in ("response_parameters", "response_parameters_decoupled", "response_parameters_bls"):
        d.model(name, f"{PM}/{name}")


PARAMETERS = Suite(
    name="parameters",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/parameters",
            setup=setup_parameters,
            args=args("parameters"),
            log="response_parameters_test.server.log",
            clients=(Pytest("response_parameters_test.py"),),
        ),
    ),
)


# -- async_execute ------------------------------------------------------------------------
def setup_async_execute(d: Dir) -> None:
    d.rm("models")
    for name in ("async_execute_decouple", "async_execute_decouple_bls"):
        d.model(name, f"{PM}/{name}")


ASYNC_EXECUTE = Suite(
    name="async_execute",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/async_execute",
            setup=setup_async_execute,
            args=args("async_execute"),
            log="concurrency_test.server.log",
            env={"SERVER_LOG": "concurrency_test.server.log"},
            clients=(Pytest("concurrency_test.py"),),
        ),
    ),
)


# -- request_rescheduling -----------------------------------------------------------------
def setup_rescheduling(d: Dir) -> None:
    d.rm("*.log", "models", "*.txt")
    for name in (
        "bls_request_rescheduling",
        "request_rescheduling_addsub",
        "iterative_sequence",
        "wrong_return_type",
    ):
        d.model(name, f"{PM}/{name}")


REQUEST_RESCHEDULING = Suite(
    name="request_rescheduling",
    steps=(
        Step(
            name="",
            cwd="qa/L0_backend_python/request_rescheduling",
            setup=setup_rescheduling,
            args=args("request_rescheduling", "--model-control-mode=explicit", "--load-model=*"),
            log="request_rescheduling_server.log",
            clients=(
                Pytest(
                    "../test_infer_shm_leak.py",
                    label="bls_request_rescheduling/",
                    env={"MODEL_NAME": "bls_request_rescheduling"},
                ),
                Pytest("grpc_endpoint_test.py"),
            ),
        ),
    ),
)

SUITES = (DECOUPLED_SUITE, RESPONSE_SENDER, PARAMETERS, ASYNC_EXECUTE, REQUEST_RESCHEDULING)
