"""The Ray Serve application builder's arguments (``reposerve.ray.arguments``): text from
``serve run`` read as each field's type, Ray's deployment options made of them, the rest
checked as the reposerve command's flags, and each wrong one refused by name."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'reposerve[ray]')")

from reposerve.errors import EmbeddedError, RayServeError  # noqa: E402
from reposerve.ray import app  # noqa: E402
from reposerve.ray.arguments import read_arguments  # noqa: E402

pytestmark = pytest.mark.unit


def test_text_from_the_command_line_becomes_deployment_options(tmp_path):
    arguments, options = read_arguments(
        {
            "model_repository": str(tmp_path),
            "num_replicas": "2",
            "max_replicas_per_node": "1",
            "num_cpus": "0.5",
            "max_ongoing_requests": "16",
            "model_control_mode": "explicit",
        }
    )
    assert options == {"model_control_mode": "explicit"}
    assert arguments.deployment_options() == {
        "name": "reposerve",
        "num_replicas": 2,
        "max_ongoing_requests": 16,
        "max_replicas_per_node": 1,
        "ray_actor_options": {"num_cpus": 0.5},
    }


def test_autoscaling_on_ongoing_requests(tmp_path):
    arguments, _ = read_arguments(
        {
            "model_repository": str(tmp_path),
            "min_replicas": 1,
            "max_replicas": 4,
            "target_ongoing_requests": 8,
        }
    )
    assert arguments.deployment_options() == {
        "name": "reposerve",
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8},
    }
    # Ray takes them: its own check of the deployment's config passes.
    deployment = app({"model_repository": str(tmp_path), "num_replicas": "auto", "max_replicas": 3})
    config = deployment._bound_deployment._deployment_config
    assert config.autoscaling_config.max_replicas == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "model_repository: missing; Hint: serve run reposerve.ray:app model_repository=PATH"),
        (
            {"num_replicas": "0"},
            "reposerve.ray:app: Expected `int` >= 1 - at `$.num_replicas`",
        ),
        (
            {"target_ongoing_requests": "many"},
            "reposerve.ray:app: Expected `float | null`, got `str` - "
            "at `$.target_ongoing_requests`",
        ),
    ],
)
def test_a_wrong_argument_is_refused_by_name(tmp_path, args, message):
    if args:
        args = {"model_repository": str(tmp_path), **args}
    with pytest.raises(RayServeError) as refused:
        read_arguments(args)
    assert str(refused.value) == message


def test_a_fixed_count_and_autoscaling_are_refused_together(tmp_path):
    arguments, _ = read_arguments(
        {"model_repository": str(tmp_path), "num_replicas": "2", "max_replicas": "3"}
    )
    with pytest.raises(RayServeError) as refused:
        arguments.deployment_options()
    assert str(refused.value) == (
        "num_replicas=2 fixes the count, and max_replicas ask Ray to scale it: "
        "give one or the other"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"model_control_mode": "sometimes"},
            "model_control_mode: invalid choice: 'sometimes' (choose from 'explicit', "
            "'poll', 'none', 'on-demand')",
        ),
        (
            {"bogus": "1"},
            "unknown option 'bogus': the options are the command's flags, '-' written '_' "
            "(`reposerve --help` lists them)",
        ),
    ],
)
def test_the_servers_options_are_checked_before_any_replica_starts(tmp_path, options, message):
    with pytest.raises(EmbeddedError) as refused:
        app({"model_repository": str(tmp_path), **options})
    assert str(refused.value) == message
