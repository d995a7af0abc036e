"""GPU readiness check: placement, precision, throughput and faults on a real server.

    python -m tools.gpu_check [--out gpu-check] [--budget-s 480] [--seconds 8]
                              [--phases placement,precision,throughput,faults] [--cpu-smoke]

One prepared script for a session lent a GPU machine (issue 8): it starts real reposerve
servers on temporary repositories, calls them with tritonclient.http, httpx and the bench
load generator, and writes one JSON document per phase to ``--out`` (``<phase>.json``:
status passed | failed | skipped, the reason, every check, the measured facts, and on a
failure the traceback and the servers' log tails), then ``summary.json``, and prints one
line per phase. Exit status 0 when no phase failed.

1. placement: instances of ``kind = "gpu"`` groups (``count = 2`` on every GPU, and a
   ``gpus`` subset) report their ``CUDA_VISIBLE_DEVICES`` and torch's device UUID, which
   must be the GPU nvidia-smi names; their pids must hold contexts in nvidia-smi; a model
   holding 4 GiB gives the memory back on unload. The CPU part (the NVML probe agrees with
   nvidia-smi; no ``[[instance_group]]`` resolves as Triton does) runs everywhere.
2. precision: a ResNet-18 ``.pt2`` (weights=None) served at fp32, bf16 (and fp16 on a GPU)
   equals a direct run in this process under the same ``torch.autocast``, and bf16 differs
   from fp32.
3. throughput (GPU): ResNet-50 bf16 images/s through the server against pure torch on the
   same GPU, batch 16 and 32, one and two instances (goal: >= 0.9x), and the latency of the
   first 50 requests after a warmed-up load. ``--cpu-smoke`` runs a tiny CPU version.
4. faults: out of device memory fails one request and the same instance serves the next; a
   device-side assert fails its request with "being replaced" and 20 requests after it
   succeed; SIGKILL of an instance holding 20 GiB (CPU: 1.5 GiB of RAM) while
   ``/v2/health/live`` is polled every 10 ms. Only the SIGKILL part runs without a GPU.

Goals (throughput ratios, first-request latency) are reported with their checks but never
fail a phase; ``--budget-s`` bounds the whole run: a phase that would not fit is skipped,
and one that runs past the budget is stopped and failed, its servers stopped.

The package: ``__main__`` (options, the budget, one report per phase, the summary) runs
``placement``, ``precision``, ``throughput`` and ``faults``, one module each, on what
``node`` (the GPUs, as nvidia-smi lists them), ``context`` (the run, the servers it starts)
and ``models`` (the model sources, configs and exports) provide; ``report`` holds the JSON
documents.
"""
