"""Benchmark: how fast the decision path runs, against the cheapest loop that makes the same kind of decisions.

For each case (policy x batch size, on the bundled real gpt-oss-20b routing, no predictor) it prints, measured in
one process and interleaved so that both see the same machine state:

- ``sim run``'s layer-steps per second (one layer-step: one MoE layer of one iteration; the whole run, workload
  building and the SimPy engine included);
- ``replay``'s layer-steps per second (the shared decision protocol alone, without time);
- a bare Python per-layer LRU loop over the same token rows (an OrderedDict per layer, capacity the HPC + MPC
  slots): the floor any Python decision path pays;
- the ratio sim / bare (target >= 0.33).

Run: .venv/bin/python benchmarks/bench_decisions.py [--requests 40] [--repeat 3] [--cases lru:1,diffmoe:16]
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict

from sim.config.run_config import load_run_config
from sim.core.decisions import build_decisions
from sim.core.replay import replay
from sim.core.workload import build_iterations, phase_layers
from sim.run import simulate
from traces.io import load_trace

CONFIG = "configs/gpt_oss_20b.yaml"


def bare_lru(trace, iterations, slots: int) -> tuple[int, float]:
    """(layer-steps, seconds) of a plain per-layer LRU over every iteration's rows: the same accesses the engine's
    policy sees, counted as hits and misses, nothing else."""
    layers_of = phase_layers(trace)
    experts = trace.experts
    caches = [OrderedDict() for _ in range(trace.num_layers)]
    steps = hits = misses = 0
    t0 = time.perf_counter()
    for it in iterations:
        block = experts[it.rows]
        for layer in layers_of[it.kind]:
            cache = caches[layer]
            active = set(block[:, layer, :].ravel().tolist())
            active.discard(-1)
            for e in active:
                if e in cache:
                    cache.move_to_end(e)
                    hits += 1
                else:
                    misses += 1
                    cache[e] = True
                    if len(cache) > slots:
                        cache.popitem(last=False)
            steps += 1
    return steps, time.perf_counter() - t0


def one_case(policy: str, batch: int, requests: int) -> dict:
    overrides = [
        f"policy.name={policy}",
        "predictor.name=none",
        f"workload.batch_size={batch}",
        f"workload.requests={requests}",
        "policy.params={}",
    ]
    cfg = load_run_config(CONFIG, overrides)
    t0 = time.perf_counter()
    out = simulate(cfg)
    sim_s = time.perf_counter() - t0
    trace = load_trace(cfg.workload.trace)
    w = cfg.workload
    iterations, _ = build_iterations(trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests)
    steps = sum(len(phase_layers(trace)[it.kind]) for it in iterations)
    pol, pred = build_decisions(cfg, trace, iterations)
    t0 = time.perf_counter()
    replay(trace, iterations, pol, pred)
    replay_s = time.perf_counter() - t0
    bare_steps, bare_s = bare_lru(trace, iterations, cfg.cache.hpc_slots + cfg.cache.mpc_slots)
    assert bare_steps == steps
    return {
        "steps": steps,
        "sim": steps / sim_s,
        "replay": steps / replay_s,
        "bare": steps / bare_s,
        "events": out.summary["events"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="lru:1,lru:16,diffmoe:1,diffmoe:16")
    args = ap.parse_args()
    print(
        f"{CONFIG}, first {args.requests} requests, no predictor; rates in layer-steps per second "
        f"(median of {args.repeat} interleaved runs)"
    )
    print(f"{'case':<14} {'layer-steps':>11} {'sim run':>10} {'replay':>10} {'bare LRU':>10} {'sim/bare':>9}")
    for case in args.cases.split(","):
        policy, batch = case.split(":")
        runs = sorted(
            (one_case(policy, int(batch), args.requests) for _ in range(args.repeat)),
            key=lambda r: r["sim"] / r["bare"],
        )
        r = runs[len(runs) // 2]
        print(
            f"{case:<14} {r['steps']:>11,} {r['sim']:>10,.0f} {r['replay']:>10,.0f} {r['bare']:>10,.0f} "
            f"{r['sim'] / r['bare']:>9.2f}"
        )


if __name__ == "__main__":
    main()
