"""``python -m tools.image`` (``make image``): find the engine and the base, build the image
(or keep the one built from the same inputs), print its tag, size and build time."""

from __future__ import annotations

import argparse
import sys

from tools.image.base import DEBIAN_MIRROR, REGISTRY_BASE, ensure_base
from tools.image.build import DEFAULT_EXTRAS, DEFAULT_TAG, build, request_for
from tools.image.engine import EngineError, find_engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.image", description=__doc__)
    parser.add_argument("--engine", help="docker, podman or buildah (default: the first found)")
    parser.add_argument("--base", default=REGISTRY_BASE, help="the base image (build arg BASE)")
    parser.add_argument("--tag", default=DEFAULT_TAG)
    parser.add_argument("--extras", default=DEFAULT_EXTRAS, help="reposerve's extras to install")
    parser.add_argument(
        "--extra-index-url",
        action="append",
        default=[],
        help="an index pip reads besides the host's (e.g. https://download.pytorch.org/whl/cpu)",
    )
    parser.add_argument("--debian-mirror", default=DEBIAN_MIRROR)
    options = parser.parse_args(argv)
    try:
        engine = find_engine(options.engine)
        base = ensure_base(engine, options.base, options.debian_mirror)
        request = request_for(options.tag, base, options.extras, options.extra_index_url)
        built = build(request, engine)
        size = engine.size(built.tag)
    except EngineError as error:
        print(f"python -m tools.image: {error}", file=sys.stderr)
        return 1
    done = "kept (its inputs are unchanged)" if built.reused else f"built in {built.seconds:.0f} s"
    print(f"{built.tag}: {done}, on {base} with {engine.name}; {size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
