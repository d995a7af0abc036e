"""Draw a benchmark report: throughput and latency against concurrency for closed-loop
runs, latency against send order for open-loop runs."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tools.bench.loadgen import RunResult


def plot(results: list[RunResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    closed = [r for r in results if r.mode == "closed"]
    opened = [r for r in results if r.mode == "open"]
    panels = (2 if closed else 0) + (1 if opened else 0)
    figure, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    axes = list(axes[0])
    if closed:
        by_label: dict[str, list[RunResult]] = defaultdict(list)
        for result in closed:
            by_label[result.label].append(result)
        throughput, latency = axes.pop(0), axes.pop(0)
        for label, runs in by_label.items():
            runs.sort(key=lambda r: r.concurrency)
            x = [r.concurrency for r in runs]
            throughput.plot(x, [r.throughput for r in runs], marker="o", label=label)
            line = latency.plot(x, [r.p50_ms for r in runs], marker="o", label=f"{label} p50")[0]
            latency.plot(
                x,
                [r.p99_ms for r in runs],
                marker="x",
                linestyle="--",
                color=line.get_color(),
                label=f"{label} p99",
            )
        throughput.set(
            xlabel="concurrency", ylabel="requests / s", title="throughput", xscale="log"
        )
        latency.set(xlabel="concurrency", ylabel="ms", title="latency", xscale="log", yscale="log")
        throughput.legend(fontsize=7)
        latency.legend(fontsize=6)
    for result in opened:
        order = axes.pop(0)
        order.plot(
            range(len(result.samples)),
            [s.latency * 1000 for s in result.samples],
            ".",
            markersize=2,
        )
        order.set(
            xlabel="request (send order)",
            ylabel="latency ms",
            title=f"{result.label} at {result.rate:g}/s",
        )
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
