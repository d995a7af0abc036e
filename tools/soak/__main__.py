"""``python -m tools.soak``: the command line of the soak (see the package docstring)."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

import tools.soak
from tools.soak.run import soak


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.soak", description=tools.soak.__doc__.split("\n\n")[0]
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (60)")
    parser.add_argument("--concurrency", type=int, default=8, help="clients (8)")
    parser.add_argument("--fault-every", type=float, default=3.0, help="seconds between faults (3)")
    parser.add_argument(
        "--server-args",
        default="",
        help="more reposerve flags, as one string (e.g. '--http-workers 2 --grpc-workers 2')",
    )
    parser.add_argument(
        "--logs", type=Path, help="a folder to keep the servers' logs in (they go with the run)"
    )
    args = parser.parse_args()
    flags = shlex.split(args.server_args)
    passed = asyncio.run(soak(args.duration, args.concurrency, args.fault_every, flags, args.logs))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
