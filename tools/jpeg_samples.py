"""Write JPEG samples for ``reposerve tune --inputs`` and the benchmarks: photo-sized images
(smooth colour fields with grain, so they compress like photographs do), made here, since
nothing is downloaded.

    python -m tools.jpeg_samples DIR [--count 32] [--size 640x480]
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np


def jpeg(rng: np.random.Generator, width: int, height: int) -> bytes:
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    channels = []
    for _ in range(3):
        a, b, c = rng.uniform(-6, 6, 3)
        field = np.sin(a * x + rng.uniform(0, 6)) * np.cos(b * y + c) + rng.uniform(-0.5, 0.5)
        channels.append(field)
    pixels = (np.stack(channels, axis=-1) + 1.5) * 80 + rng.normal(0, 12, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--size", default="640x480", help="WIDTHxHEIGHT")
    args = parser.parse_args()
    width, height = (int(part) for part in args.size.split("x"))
    args.folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sizes = []
    for index in range(args.count):
        data = jpeg(rng, width, height)
        (args.folder / f"sample_{index:03d}.jpg").write_bytes(data)
        sizes.append(len(data))
    print(f"wrote {args.count} JPEGs to {args.folder}, {np.mean(sizes) / 1024:.0f} KB on average")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
