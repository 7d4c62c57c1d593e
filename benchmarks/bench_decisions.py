"""Benchmark: how fast the decision path runs, against the cheapest loop that makes the same kind of decisions.

The first case is the target's: the bundled real gpt-oss-20b routing (``configs/gpt_oss_20b.yaml``), policy
``lru``, batch 1, 8 slots per layer (the config's ``hpc_slots + mpc_slots``: ``lru`` without ``pin_hot`` manages
them as one cache), no predictor. For each case it prints, measured in one process and interleaved so that all
see the same machine state:

- ``sim run``'s layer-steps per second (one layer-step: one MoE layer of one iteration): the whole ``simulate``
  call, trace loading, workload building and the SimPy engine included (at 40 requests the fixed costs, loading
  and building, are a few percent of it; ``engine`` is the engine's own rate, ``EngineResult.wall_s``);
- ``replay``'s layer-steps per second (the shared decision protocol alone, without time, recording every
  decision);
- a bare Python per-layer LRU loop over the same token rows: a dict of last use per layer, each missing expert
  evicting the least recently used expert that is not in the step when the layer's slots are full: the floor any
  Python decision path pays;
- the ratio sim run / bare, beside its target (``TARGETS``: 0.33 for the first case; the predictors' path, issue 35:
  0.2 for ``lru:1:transition`` and 0.15 for ``diffmoe:1:transition``) and the ratio the code had before it was sped
  up (``BEFORE``, measured with this benchmark on the same machine).

A case is ``policy:batch``, or ``policy:batch:predictor`` to run with a predictor (``diffmoe:1:transition`` is the
config's own policy and predictor: its prefetches keep most copies on the copy engine's events). The bare loop is
the same for every case.

Run: .venv/bin/python benchmarks/bench_decisions.py [--requests 40] [--repeat 3] [--cases lru:1,diffmoe:16]
(the transition cases alone: --cases lru:1,lru:1:transition,diffmoe:1:transition)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.config.run_config import load_run_config  # noqa: E402
from sim.core.workload import build_iterations, phase_layers  # noqa: E402
from sim.decisions.build import build_decisions  # noqa: E402
from sim.decisions.replay import replay  # noqa: E402
from sim.run import simulate  # noqa: E402
from traces.io import load_trace  # noqa: E402

CONFIG = "configs/gpt_oss_20b.yaml"
TARGETS = {"lru:1": 0.33, "lru:1:transition": 0.2, "diffmoe:1:transition": 0.15}  # sim run / bare LRU
SLOTS = 8  # the target case's slots per layer
#: sim run / bare LRU (median of 3, 40 requests) before each speed-up, on the 2-core machine this benchmark was
#: written on: lru:1 at commit 4423dde (``git worktree add /tmp/base 4423dde``, this file copied there, then ``cd
#: /tmp/base && .venv/bin/python benchmarks/bench_decisions.py --cases lru:1``); the transition cases at commit
#: 5e6c4a2, before the predictors' path was sped up (``git archive 5e6c4a2 | tar -x -C /tmp/base``, then ``cd /tmp/base
#: && .venv/bin/python benchmarks/bench_decisions.py --cases lru:1,lru:1:transition,diffmoe:1:transition``, the
#: machine otherwise idle).
BEFORE = {"lru:1": 0.22, "lru:1:transition": 0.13, "diffmoe:1:transition": 0.11}


def bare_lru(trace, iterations, slots: int) -> tuple[int, float]:
    """(layer-steps, seconds) of a plain per-layer LRU over every iteration's rows: per layer a dict of each cached
    expert's last use (the layer-step it was last active in); a missing expert enters, evicting the least recently
    used cached expert not active in the step when ``slots`` are full."""
    layers_of = phase_layers(trace)
    experts = trace.experts
    last_use: list[dict[int, int]] = [{} for _ in range(trace.num_layers)]
    steps = hits = misses = 0
    t0 = time.perf_counter()
    for it in iterations:
        block = experts[it.rows]
        for layer in layers_of[it.kind]:
            last = last_use[layer]
            active = set(block[:, layer, :].ravel().tolist())
            active.discard(-1)
            for e in active:
                if e in last:
                    hits += 1
                else:
                    misses += 1
                    if len(last) >= slots:
                        idle = [x for x in last if x not in active]
                        if idle:
                            del last[min(idle, key=last.__getitem__)]
                last[e] = steps
            steps += 1
    return steps, time.perf_counter() - t0


def one_case(policy: str, batch: int, requests: int, predictor: str = "none") -> dict:
    overrides = [
        f"policy.name={policy}",
        f"predictor.name={predictor}",
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
    slots = cfg.cache.hpc_slots + cfg.cache.mpc_slots
    bare_steps, bare_s = bare_lru(trace, iterations, slots)
    assert bare_steps == steps
    return {
        "steps": steps,
        "slots": slots,
        "sim": steps / sim_s,
        "engine": steps / out.engine.wall_s,
        "replay": steps / replay_s,
        "bare": steps / bare_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="lru:1,lru:16,diffmoe:1,diffmoe:16,lru:1:transition,diffmoe:1:transition")
    args = ap.parse_args()
    print(
        f"{CONFIG}, first {args.requests} requests, no predictor unless a case names one; rates in layer-steps per "
        f"second (median of {args.repeat} interleaved runs); {SLOTS} slots; targets sim/bare: "
        + ", ".join(f"{case} >= {t}" for case, t in TARGETS.items())
    )
    print(
        f"{'case':<21} {'slots':>5} {'layer-steps':>11} {'sim run':>9} {'engine':>9} {'replay':>9} "
        f"{'bare LRU':>9} {'sim/bare':>8} {'target':>6} {'before':>6}"
    )
    for case in args.cases.split(","):
        policy, batch, *predictor = case.split(":")
        runs = sorted(
            (one_case(policy, int(batch), args.requests, *predictor) for _ in range(args.repeat)),
            key=lambda r: r["sim"] / r["bare"],
        )
        r = runs[len(runs) // 2]
        target = f"{TARGETS[case]:.2f}" if case in TARGETS else "-"
        before = f"{BEFORE[case]:.2f}" if case in BEFORE else "-"
        print(
            f"{case:<21} {r['slots']:>5} {r['steps']:>11,} {r['sim']:>9,.0f} {r['engine']:>9,.0f} "
            f"{r['replay']:>9,.0f} {r['bare']:>9,.0f} {r['sim'] / r['bare']:>8.2f} {target:>6} {before:>6}"
        )


if __name__ == "__main__":
    main()
