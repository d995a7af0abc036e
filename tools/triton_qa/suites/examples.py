"""python_backend's examples, as L0_backend_python/examples/test.sh runs them: one server
per example on a repository that keeps the models of the examples before it."""

from __future__ import annotations

from ..shell import Dir
from ..spec import Script, Step, Suite
from .lifecycle import BACKEND_DIR

CWD = "qa/L0_backend_python/examples/python_backend"
ARGS = (
    "--model-repository={MODELDIR}/examples/python_backend/models",
    BACKEND_DIR,
    "--log-verbose=1",
)
AUTO = (*ARGS, "--strict-model-config=false")  # test.sh adds it at auto_complete, for good


def clone(d: Dir) -> None:
    """cd examples; rm -fr *.log python_backend/; git clone python_backend; cd python_backend"""
    parent = Dir(d.path.parent, root=d.root, backend_repo=d.backend_repo)
    parent.rm("*.log")
    parent.clone_python_backend()


def add(*pairs: tuple[str, str], first: bool = False):
    """mkdir -p models/NAME/1; cp examples/SRC models/NAME/... for each (src, dst) pair."""

    def setup(d: Dir) -> None:
        if first:
            clone(d)
        for src, dst in pairs:
            d.mkdir(str(d.p(dst).parent.relative_to(d.path)))
            d.cp(f"examples/{src}", dst)

    return setup


def example(name: str, setup, client: str, args=ARGS) -> Step:
    return Step(
        name=name,
        cwd=CWD,
        setup=setup,
        args=args,
        log="../examples_server.log",
        clients=(Script((f"examples/{client}",), case="client"),),
    )


SUITE = Suite(
    name="examples",
    steps=(
        example(
            "add_sub",
            add(
                ("add_sub/model.py", "models/add_sub/1/model.py"),
                ("add_sub/config.pbtxt", "models/add_sub/config.pbtxt"),
                first=True,
            ),
            "add_sub/client.py",
        ),
        example(
            "pytorch",
            add(
                ("pytorch/model.py", "models/pytorch/1/model.py"),
                ("pytorch/config.pbtxt", "models/pytorch/config.pbtxt"),
            ),
            "pytorch/client.py",
        ),
        example(
            "bls_sync",
            add(
                ("bls/sync_model.py", "models/bls_sync/1/model.py"),
                ("bls/sync_config.pbtxt", "models/bls_sync/config.pbtxt"),
            ),
            "bls/sync_client.py",
        ),
        example(
            "decoupled_repeat",
            add(
                ("decoupled/repeat_model.py", "models/repeat_int32/1/model.py"),
                ("decoupled/repeat_config.pbtxt", "models/repeat_int32/config.pbtxt"),
            ),
            "decoupled/repeat_client.py",
        ),
        example(
            "decoupled_square",
            add(
                ("decoupled/square_model.py", "models/square_int32/1/model.py"),
                ("decoupled/square_config.pbtxt", "models/square_int32/config.pbtxt"),
            ),
            "decoupled/square_client.py",
        ),
        example(
            "bls_async",
            add(
                ("bls/async_model.py", "models/bls_async/1/model.py"),
                ("bls/async_config.pbtxt", "models/bls_async/config.pbtxt"),
            ),
            "bls/async_client.py",
        ),
        example(
            "auto_complete",
            add(
                ("auto_complete/nobatch_model.py", "models/nobatch_auto_complete/1/model.py"),
                ("auto_complete/batch_model.py", "models/batch_auto_complete/1/model.py"),
            ),
            "auto_complete/client.py",
            args=AUTO,
        ),
        example(
            "bls_decoupled_sync",
            add(
                ("bls_decoupled/sync_model.py", "models/bls_decoupled_sync/1/model.py"),
                ("bls_decoupled/sync_config.pbtxt", "models/bls_decoupled_sync/config.pbtxt"),
            ),
            "bls_decoupled/sync_client.py",
            args=AUTO,
        ),
        example(
            "bls_decoupled_async",
            add(
                ("bls_decoupled/async_model.py", "models/bls_decoupled_async/1/model.py"),
                ("bls_decoupled/async_config.pbtxt", "models/bls_decoupled_async/config.pbtxt"),
            ),
            "bls_decoupled/async_client.py",
            args=AUTO,
        ),
        example(
            "custom_metrics",
            add(
                ("custom_metrics/model.py", "models/custom_metrics/1/model.py"),
                ("custom_metrics/config.pbtxt", "models/custom_metrics/config.pbtxt"),
            ),
            "custom_metrics/client.py",
            args=AUTO,
        ),
    ),
    skipped=(
        (
            "jax::client",
            "needs jax[cuda12] (test.sh pip-installs it; a download, and a GPU); its model is "
            "not added, so the later servers do not load it",
        ),
        (
            "instance_kind::client",
            "downloads resnet50 weights from torch hub and needs the `validators` package; "
            "its model is not added, so the later servers do not load it",
        ),
        (
            "preprocessing::client",
            "not in test.sh; needs a TensorRT resnet50 engine",
        ),
    ),
)
