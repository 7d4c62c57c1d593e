"""Benchmark: wall time and events per second of `python -m sim run CONFIG`, beside bare SimPy's timeouts per
second measured in the same process. Targets on the 2-core machine: the default run under 10 s; events per second
at least a quarter of bare SimPy's.

Run: .venv/bin/python benchmarks/bench_sim.py [CONFIG] [--set key.path=value ...] [--repeat N]
"""

from __future__ import annotations

import argparse
import time

import simpy

from sim.config.run_config import load_run_config
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.run import simulate


def bare_simpy_timeouts_per_s(n: int = 300_000) -> float:
    """One process yielding n timeouts: the cheapest SimPy event loop there is."""
    env = simpy.Environment()

    def proc():
        for _ in range(n):
            yield env.timeout(1e-6)

    env.process(proc())
    t0 = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="configs/switch_xxl.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cfg = load_run_config(args.config, args.set, POLICIES.names(), PREDICTORS.names())
    # Interleave the two measurements so that both see the same machine state (this machine's speed drifts).
    pairs = []
    for _ in range(args.repeat):
        bare = bare_simpy_timeouts_per_s()
        t0 = time.perf_counter()
        out = simulate(cfg)
        pairs.append((bare, time.perf_counter() - t0, out.summary))
    pairs.sort(key=lambda p: p[2]["events_per_s"] / p[0])
    bare, wall, s = pairs[len(pairs) // 2]  # the median ratio
    ratios = [p[2]["events_per_s"] / p[0] for p in pairs]
    print(
        f"config {args.config} {' '.join(args.set)}: policy {s['policy']}, batch {s['batch_size']}, "
        f"{s['iterations']} iterations, {s['decode_tokens']} decode tokens"
    )
    print(
        f"run wall time (load + workload + simulate): median {sorted(p[1] for p in pairs)[len(pairs) // 2]:.2f} s,"
        f" best {min(p[1] for p in pairs):.2f} s   (target < 10 s)"
    )
    print(f"engine: {s['events']:,} events in {s['wall_s']:.2f} s = {s['events_per_s']:,.0f} events/s")
    print(f"bare SimPy in the same process: {bare:,.0f} timeouts/s")
    print(
        f"ratio engine/bare: median {ratios[len(ratios) // 2]:.2f} (range {ratios[0]:.2f}-{ratios[-1]:.2f} over "
        f"{len(ratios)} interleaved pairs)   (target >= 0.25)"
    )


if __name__ == "__main__":
    main()
