"""Benchmark: points per minute of a 64-point sweep with the local executor at 1 and 2 workers, and with Ray
(a local Ray instance of 2 CPUs; its start-up, a few seconds, is included).

Run: .venv/bin/python benchmarks/bench_sweep.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from sim.sweep.cli import Progress, load_sweep, run_local, run_ray

SWEEP = """
base: {root}/configs/switch_xxl.yaml
set: {{workload.requests: 16, workload.max_decode_tokens: 32, workload.prefill: false}}
grid:
  policy.name: [on-demand, lru, diffmoe, diffmoe-arc]
  workload.batch_size: [1, 4, 8, 16]
zip:
  cache.hpc_slots: [0, 1, 2, 4]
  cache.mpc_slots: [2, 4, 6, 9]
"""


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.yaml"
        path.write_text(SWEEP.format(root=root))
        sweep = load_sweep(path)
        assert len(sweep.points) == 64, len(sweep.points)
        rates = {}
        for workers in (1, 2):
            out = Path(d) / f"out{workers}"
            t0 = time.perf_counter()
            run_local(sweep, sweep.points, out, workers, Progress(len(sweep.points), quiet=True))
            wall = time.perf_counter() - t0
            rates[workers] = len(sweep.points) / wall * 60
            print(f"local executor, {workers} worker(s): 64 points in {wall:.1f} s = {rates[workers]:.0f} points/min")
        print(f"speed-up with 2 workers: {rates[2] / rates[1]:.2f}x   (target >= 1.6x)")
        out = Path(d) / "ray"
        t0 = time.perf_counter()
        run_ray(sweep, sweep.points, out, 2, Progress(len(sweep.points), quiet=True))
        wall = time.perf_counter() - t0
        print(
            f"ray executor, 2 workers (local instance, start-up included): 64 points in {wall:.1f} s = "
            f"{len(sweep.points) / wall * 60:.0f} points/min"
        )


if __name__ == "__main__":
    main()
