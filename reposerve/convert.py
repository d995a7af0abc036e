"""``reposerve convert MODEL_FOLDER [--write]``: a Triton model folder's config.pbtxt as the
equivalent config.toml, printed, or written beside it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reposerve.config import load_model_config
from reposerve.config.toml_writer import to_toml
from reposerve.errors import ConfigError


def convert(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="reposerve convert", description=__doc__)
    parser.add_argument("folder", type=Path, help="a model folder holding config.pbtxt")
    parser.add_argument("--write", action="store_true", help="write FOLDER/config.toml")
    args = parser.parse_args(argv)
    source = args.folder / "config.pbtxt"
    target = args.folder / "config.toml"
    try:
        config = load_model_config(source, label=f"{args.folder.name}/config.pbtxt")
    except ConfigError as exc:
        print(f"reposerve convert: {exc.message}", file=sys.stderr)
        return 1
    text = to_toml(config)
    if not args.write:
        sys.stdout.write(text)
        return 0
    if target.exists():
        print(f"reposerve convert: {target} exists; not overwritten", file=sys.stderr)
        return 1
    target.write_text(text)
    print(f"wrote {target} (config.toml is read before config.pbtxt from now on)")
    return 0
