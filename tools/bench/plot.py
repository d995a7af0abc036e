"""Draw a benchmark report: throughput and latency against concurrency for closed-loop
runs, latency against send order for open-loop runs."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from reposerve.tune.load import RunResult


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


def plot_fronts(results: list[RunResult], path: Path, title: str) -> None:
    """``tools.bench fronts``: requests/s of each workload by front count, one panel per
    concurrency (labels are "N front(s) WORKLOAD")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table: dict[int, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for result in results:
        count, _, rest = result.label.partition(" ")
        workload = rest.split(" ", 1)[1]
        table[result.concurrency][workload][int(count)] = result.throughput
    concurrencies = sorted(table)
    figure, axes = plt.subplots(
        1, len(concurrencies), figsize=(6 * len(concurrencies), 4.5), squeeze=False
    )
    for axis, concurrency in zip(axes[0], concurrencies, strict=True):
        workloads = list(table[concurrency])
        counts = sorted({count for found in table[concurrency].values() for count in found})
        width = 0.8 / len(counts)
        for index, count in enumerate(counts):
            axis.bar(
                [position + index * width for position in range(len(workloads))],
                [table[concurrency][workload].get(count, 0) for workload in workloads],
                width,
                label=f"{count} front{'s' if count > 1 else ''}",
            )
        axis.set_xticks(
            [position + width * (len(counts) - 1) / 2 for position in range(len(workloads))],
            workloads,
            rotation=20,
            ha="right",
            fontsize=8,
        )
        axis.set_ylabel("requests / s")
        axis.set_title(f"c={concurrency}")
        axis.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
