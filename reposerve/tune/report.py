"""``--out``: report.md, results.json, the plots, and each tuned model's config.toml."""

from __future__ import annotations

from pathlib import Path

import msgspec

from reposerve.tune.configs import Recommendation
from reposerve.tune.results import Trial, TuneResults

PLOTTED_TRIALS = 8  # the best ones, with the current configuration: more is unreadable
CONCURRENCY_PLOT = "throughput_vs_concurrency.png"
LATENCY_PLOT = "throughput_vs_p99.png"


def write_report(
    out: Path, results: TuneResults, recommendations: list[Recommendation]
) -> list[Path]:
    """Every file of the report, written to ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json"]
    written[0].write_bytes(msgspec.json.format(msgspec.json.encode(results)) + b"\n")
    for recommendation in recommendations:
        path = (
            out / "config.toml"
            if recommendation.model == results.model
            else out / "steps" / recommendation.model / "config.toml"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(recommendation.text)
        written.append(path)
    diff = "".join(r.diff for r in recommendations)
    (out / "config.diff").write_text(diff)
    written.append(out / "config.diff")
    plots, plot_note = _plots(out, results)
    written += plots
    (out / "report.md").write_text(_markdown(results, diff, plot_note, [p.name for p in plots]))
    written.append(out / "report.md")
    return written


def summary(results: TuneResults) -> str:
    """The verdict in one line, as tune prints it last."""
    base, best = results.baseline, results.best
    if results.ab is None and not results.trials:
        return f"{results.model}: no candidate was tried within the time budget: nothing changes"
    if results.ab is None and best.score == 0.0:
        return f"{results.model}: no configuration tried kept the p99 budget: nothing changes"
    if results.ab is None:
        return (
            f"{results.model}: the current configuration is best: no candidate beat its "
            f"{base.score:.1f} requests/s by 5% ({len(results.trials)} tried)"
        )
    return (
        f"{results.model}: {results.ab.verdict} ({best.label}; {base.score:.1f} -> "
        f"{best.score:.1f} requests/s in the search, {len(results.trials)} candidates tried)"
    )


def _markdown(results: TuneResults, diff: str, plot_note: str, plots: list[str]) -> str:
    budget = f"{results.p99_budget_ms:g} ms" if results.p99_budget_ms is not None else "none"
    machine = results.machine
    lines = [
        f"# reposerve tune: {results.model}",
        "",
        f"Machine: {machine.cores} usable cores, {machine.gpus} GPUs. p99 budget: {budget}. "
        f"Time budget {results.time_budget_s:g} s, used {results.seconds:.0f} s.",
        "",
        f"**{summary(results)}**",
        "",
        "## Current against tuned",
        "",
        "| | Requests/s | At concurrency | p99 (ms) |",
        "|---|---|---|---|",
        _row("current configuration", results.baseline),
        _row(f"tuned: {results.best.label}", results.best),
    ]
    if results.ab is not None:
        lines += [
            "",
            "Interleaved A/B, same run (each round loads one, then the other):",
            "",
            "| Round | Current (req/s, p99 ms) | Tuned (req/s, p99 ms) | Ratio |",
            "|---|---|---|---|",
        ]
        for index, pair in enumerate(results.ab.rounds, 1):
            ratio = (
                pair.tuned.throughput / pair.current.throughput if pair.current.throughput else 0
            )
            lines.append(
                f"| {index} | {pair.current.throughput:.1f}, {pair.current.p99_ms:.1f} | "
                f"{pair.tuned.throughput:.1f}, {pair.tuned.p99_ms:.1f} | {ratio:.2f}x |"
            )
        lines += ["", f"Median ratio {results.ab.ratio:.2f}x: {results.ab.verdict}."]
    lines += [
        "",
        "## Every candidate, in the order tried",
        "",
        "| Candidate | Status | Requests/s | Concurrency | p99 (ms) | Seconds | Note |",
        "|---|---|---|---|---|---|---|",
        _trial_row(results.baseline),
        *(_trial_row(trial) for trial in results.trials),
        "",
        "## Not tried",
        "",
        *(f"- {line}" for line in results.left_out or ["nothing: every knob was searched"]),
        "",
        "## Recommended configuration",
        "",
    ]
    lines += ["```diff", diff.rstrip("\n"), "```"] if diff else ["Unchanged."]
    lines += ["", "## Plots", ""]
    lines += [f"![{name}]({name})" for name in plots] or [plot_note]
    return "\n".join(lines) + "\n"


def _row(label: str, trial: Trial) -> str:
    p99 = _best_point_p99(trial)
    return f"| {label} | {trial.score:.1f} | {trial.concurrency} | {p99} |"


def _trial_row(trial: Trial) -> str:
    note = trial.reason
    if trial.output_error is not None:
        note = (note + "; " if note else "") + f"output difference {trial.output_error:.2g}"
    return (
        f"| {trial.label} | {trial.status} | {trial.score:.1f} | {trial.concurrency} | "
        f"{_best_point_p99(trial)} | {trial.seconds:.0f} | {note} |"
    )


def _best_point_p99(trial: Trial) -> str:
    point = next((p for p in trial.points if p.concurrency == trial.concurrency), None)
    return f"{point.p99_ms:.1f}" if point is not None else "-"


def _plots(out: Path, results: TuneResults) -> tuple[list[Path], str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        return [], "No plots: matplotlib is not installed (pip install 'reposerve[tune]')."
    measured = [t for t in results.trials if t.status == "measured" and t.points]
    shown = [results.baseline, *sorted(measured, key=lambda t: -t.score)[:PLOTTED_TRIALS]]
    figure, axes = pyplot.subplots(figsize=(8, 5))
    for trial in shown:
        style = "k--" if trial is results.baseline else "-"
        label = "current" if trial is results.baseline else trial.label
        axes.plot(
            [p.concurrency for p in trial.points],
            [p.throughput for p in trial.points],
            style,
            marker="o",
            label=label,
        )
    axes.set_xscale("log", base=2)
    axes.set(xlabel="concurrency", ylabel="requests/s", title=f"{results.model}: throughput")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(out / CONCURRENCY_PLOT, dpi=110)
    pyplot.close(figure)

    figure, axes = pyplot.subplots(figsize=(8, 5))
    everything = [results.baseline, *measured]
    axes.scatter(
        [p.p99_ms for t in everything for p in t.points],
        [p.throughput for t in everything for p in t.points],
        s=12,
        color="0.6",
        label="every point measured",
    )
    for trial, color, label in (
        (results.baseline, "black", "current"),
        (results.best, "C1", "tuned"),
    ):
        axes.plot([p.p99_ms for p in trial.points], [p.throughput for p in trial.points],
                  marker="o", color=color, label=label)  # fmt: skip
    if results.p99_budget_ms is not None:
        axes.axvline(results.p99_budget_ms, color="C3", linestyle=":", label="p99 budget")
    axes.set(xlabel="p99 latency (ms)", ylabel="requests/s", title=f"{results.model}: p99")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(out / LATENCY_PLOT, dpi=110)
    pyplot.close(figure)
    return [out / CONCURRENCY_PLOT, out / LATENCY_PLOT], ""
