"""The soak itself: both servers started, every client and the fault loop run for the
duration, then the checks: nothing lost, pending 0, memory and descriptors flat, SIGTERM
answered, no orphans."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tools.bench import servers
from tools.soak import churn, regions, sequences
from tools.soak.faults import EXIT_TIMEOUT_S, faults, pending_gauges, sigterm_finale
from tools.soak.outcomes import Outcomes, http_client
from tools.soak.repository import write_repository
from tools.soak.traffic import client, large_grpc

MEMORY_GROWTH_MIB = 20.0  # allowed growth of a front after the first quarter of the run
DESCRIPTOR_GROWTH = 16  # allowed growth of a front's open descriptors, likewise
QUIET_S = 3.0  # after the load: the front reclaims what large messages left behind
WARM_UP_S = 10.0  # a front is warm after a quarter of the run, and not before this
SAMPLE_S = 0.5


class Watch:
    """A front's memory (PSS) and open descriptors, sampled while the load runs."""

    def __init__(self, label: str, server: servers.Launched) -> None:
        self.label, self.pid = label, server.process.pid
        self.samples: list[tuple[float, int]] = []
        self.settled = (0.0, 0)

    def sample(self) -> tuple[float, int]:
        return servers.pss_mib(self.pid), len(os.listdir(f"/proc/{self.pid}/fd"))

    async def run(self, running: asyncio.Event) -> None:
        while running.is_set():
            self.samples.append(self.sample())
            await asyncio.sleep(SAMPLE_S)

    def flat(self, duration: float) -> bool:
        """Print the growth from warm-up to settled; True when it is within bounds."""
        samples = self.samples
        # The lowest a few seconds past the warm-up: large messages come and go under load.
        warm_at = min(int(max(duration / 4, WARM_UP_S) / SAMPLE_S), max(len(samples) - 1, 0))
        window = samples[warm_at : warm_at + 10] or [self.settled]
        warm = (min(sample[0] for sample in window), min(sample[1] for sample in window))
        peak = max(sample[0] for sample in samples) if samples else self.settled[0]
        print(
            f"{self.label} memory (PSS): {warm[0]:.1f} -> {self.settled[0]:.1f} MiB after "
            f"warm-up (peak {peak:.1f}); descriptors: {warm[1]} -> {self.settled[1]}"
        )
        return (
            self.settled[0] - warm[0] < MEMORY_GROWTH_MIB
            and self.settled[1] - warm[1] <= DESCRIPTOR_GROWTH
        )


async def soak(
    duration: float,
    concurrency: int,
    fault_every: float,
    flags: Sequence[str] = (),
    logs: Path | None = None,
) -> bool:
    """``flags``: more of reposerve's for the main server (``--http-workers 2``, say);
    ``logs``: a folder the two servers' logs are copied to once they have stopped."""
    tally = Outcomes()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "repository"
        write_repository(root)
        metrics_port, grpc_port = servers.free_port(), servers.free_port()
        server = servers.reposerve(
            root,
            *("--allow-metrics", "true", "--metrics-port", str(metrics_port)),
            *("--grpc-port", str(grpc_port)),
            *("--exit-timeout-secs", str(EXIT_TIMEOUT_S)),
            *("--allow-client-shm", "true"),
            *flags,
            log_path=Path(folder) / "server.log",
        )
        on_demand = churn.start(Path(folder))
        watches = [Watch("front", server), Watch("on-demand front", on_demand)]
        instances = set(servers.children_of(server.process.pid))
        running = asyncio.Event()
        running.set()
        base = f"http://127.0.0.1:{server.port}"
        churn_base = f"http://127.0.0.1:{on_demand.port}"
        metrics = http_client(f"http://127.0.0.1:{metrics_port}", timeout=30)
        try:
            load = asyncio.gather(
                *(client(base, running, tally, seed) for seed in range(concurrency)),
                large_grpc(grpc_port, running, tally, concurrency),
                *(sequences.sequence_client(base, running, tally, seed) for seed in (1, 2)),
                sequences.abandoning_client(base, running, tally),
                regions.region_client(base, running, tally, concurrency),
                *(churn.churn_client(churn_base, running, tally, seed) for seed in (1, 2)),
                churn.unknown_names_client(churn_base, running, tally),
                faults(server, root, running, fault_every, tally),
                *(watch.run(running) for watch in watches),
            )
            await asyncio.sleep(duration)
            for launched in (server, on_demand):
                instances |= set(servers.children_of(launched.process.pid))
            running.clear()
            await load  # each client ends with an answer to its last request
            await asyncio.sleep(QUIET_S)
            for watch in watches:
                watch.settled = watch.sample()
            pending = await pending_gauges(metrics)
            print(f"pending after the load: {pending}")
            if any(pending.values()):
                tally.problem("pending gauge not 0 once every request was answered")
            instances |= set(servers.children_of(server.process.pid))
            await sigterm_finale(server, root, metrics, tally)
        finally:
            await metrics.aclose()
            server.stop()
            on_demand.stop()
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                for log in Path(folder).glob("*.log"):
                    shutil.copy(log, logs / log.name)
    orphans = [pid for pid in instances if Path(f"/proc/{pid}").exists()]
    for outcome, count in sorted(tally.seen.items()):
        print(f"{count:8d}  {outcome}")
    lost = tally.sent - tally.answered
    print(f"requests: {tally.sent} sent, {tally.answered} answered, {lost} lost")
    flat = all([watch.flat(duration) for watch in watches])  # each prints its numbers
    print(f"orphans: {len(orphans)}")
    answered_well = tally.seen["good request answered as it should"]
    passed = not tally.problems and not lost and answered_well > 0 and flat and not orphans
    print("soak: PASS" if passed else "soak: FAIL")
    return passed
