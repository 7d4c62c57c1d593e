"""A digest of the simulator's results over many run configs: one sha256 per (config, overrides) pair and one over
all of them, so that two versions of the engine can be compared bit for bit on the same data.

Each pair is run with ``record_decisions`` (and a timeline for some); its digest covers:

- ``summary.json``'s figures, every key but the wall-clock ones (``wall_s``, ``events_per_s``), floats exactly
  (JSON writes a float's shortest round-trip repr);
- ``iterations.csv`` as written, and the iteration records' exact floats;
- the engine's own totals (busy, stall, link and host seconds, copies, events), exactly;
- every layer's decisions (``engine.decisions``);
- the timeline's spans, for the pairs run with one.

The pairs cover every bundled run config (``configs/*.yaml``), most policies and predictors, batch sizes 1, 8 and
64, the serial copy stream, write-backs, calibrated hand-off, gap, interference and host costs, host-CPU experts and
the shared cache; each serves few requests so that the whole digest takes a few minutes. The predictor is always
given, so that a config's default does not matter.

Run: .venv/bin/python benchmarks/digest_configs.py [--only SUBSTRING] [--list]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import astuple
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from sim.config.run_config import load_run_config  # noqa: E402
from sim.policies import POLICIES  # noqa: E402
from sim.predictors import PREDICTORS  # noqa: E402
from sim.results import iterations_csv  # noqa: E402
from sim.run import simulate  # noqa: E402

#: Calibrated-machine settings that exercise the engine's hand-off, copy gap, interference and host-cost paths.
HANDOFF = ["hardware.handoff_us=7", "hardware.copy_gap_us=3"]
SLOW = ["hardware.compute_slowdown=1.3", "hardware.dense_slowdown=1.1", "hardware.copy_slowdown=1.2"]
HOST = [
    "hardware.layer_roundtrip_us=40",
    "hardware.copy_issue_us=6",
    "hardware.expert_issue_us=9",
    "hardware.hit_issue_us=4",
]
SMALL = ["workload.requests=8", "workload.max_decode_tokens=6"]


def pair(
    config: str,
    policy: str,
    predictor: str,
    batch: int,
    *extra: str,
    requests: int = 8,
    decode: int = 6,
    timeline: bool = False,
) -> tuple[str, list[str], bool]:
    """One (config, overrides, timeline) entry: the policy (its default params unless it is the config's own), the
    predictor (always given), the batch size and a small workload, then ``extra`` overrides."""
    own = yaml.safe_load((ROOT / config).read_text())["policy"]
    own = own["name"] if isinstance(own, dict) else own
    sets = [
        f"policy.name={policy}",
        *([] if policy == own else ["policy.params={}"]),
        f"predictor.name={predictor}",
        f"workload.batch_size={batch}",
        f"workload.requests={requests}",
        f"workload.max_decode_tokens={decode}",
        *extra,
    ]
    return config, sets, timeline


PAIRS = [
    # every bundled run config, its own policy with an explicit predictor
    pair("configs/switch_xxl.yaml", "diffmoe", "oracle", 16),
    pair("configs/switch_xxl.yaml", "diffmoe", "oracle", 1, timeline=True),
    pair("configs/switch_base_real.yaml", "diffmoe", "oracle", 8),
    pair("configs/deepseek_v3.yaml", "lru", "oracle", 1),
    pair("configs/gpt_oss_120b.yaml", "lru", "oracle", 8),
    pair("configs/gpt_oss_120b_rtx4090.yaml", "lru", "none", 1),
    pair("configs/gpt_oss_20b.yaml", "lru", "none", 1),
    pair("configs/kimi_k2.yaml", "lru", "oracle", 1, requests=2, decode=4),
    pair("configs/mixtral.yaml", "diffmoe", "oracle", 8),
    pair("configs/mixtral_rtx4090.yaml", "lru", "none", 1),
    pair("configs/qwen3_235b_a22b.yaml", "lru", "oracle", 1, requests=4),
    pair("configs/qwen3_235b_a22b_rtx4090.yaml", "lru", "none", 1, requests=4),
    pair("configs/qwen3_30b_a3b.yaml", "lru", "oracle", 8),
    pair("configs/qwen3_30b_a3b_rtx4090.yaml", "lru", "none", 1),
    pair("configs/qwen3_5_35b_a3b.yaml", "lru", "none", 1),
    pair("configs/qwen3_5_35b_a3b_rtx4090.yaml", "ktransformers", "none", 1),
    # policies and predictors on gpt-oss-20b (real routing)
    pair("configs/gpt_oss_20b.yaml", "lru", "oracle", 8),
    pair("configs/gpt_oss_20b.yaml", "diffmoe", "oracle", 1),
    pair("configs/gpt_oss_20b.yaml", "diffmoe-arc", "history", 8),
    pair("configs/gpt_oss_20b.yaml", "belady", "none", 8),
    pair("configs/gpt_oss_20b.yaml", "moe-infinity", "moe-infinity", 1),
    pair("configs/gpt_oss_20b.yaml", "pregated", "oracle", 1),
    pair("configs/gpt_oss_20b.yaml", "hybrid-cache", "none", 1),
    pair("configs/gpt_oss_20b.yaml", "fiddler", "none", 8),
    pair("configs/gpt_oss_20b.yaml", "ktransformers", "none", 1, timeline=True),
    pair("configs/gpt_oss_20b.yaml", "on-demand", "none", 8),
    pair("configs/gpt_oss_20b.yaml", "gpu-only", "none", 1),
    pair("configs/gpt_oss_20b.yaml", "arc", "history", 8),
    pair(
        "configs/switch_base_real.yaml",
        "arc",
        "transition",
        8,
        "predictor.params.train=traces/data/switch_base_128_real_b1.npz",
    ),
    pair("configs/gpt_oss_20b.yaml", "s3fifo", "cross-layer", 1),
    pair("configs/gpt_oss_20b.yaml", "lfu", "noisy", 8),
    pair("configs/gpt_oss_20b.yaml", "least-stale", "history", 1),
    pair("configs/gpt_oss_20b.yaml", "reuse-distance", "none", 8),
    pair("configs/gpt_oss_20b.yaml", "learned-rf", "none", 1),
    pair("configs/gpt_oss_20b.yaml", "lookahead", "oracle", 1),
    pair("configs/gpt_oss_20b.yaml", "next-use-odds", "none", 8),
    pair("configs/gpt_oss_20b.yaml", "prefetch-all", "oracle", 1),
    pair("configs/gpt_oss_20b.yaml", "lru", "none", 8, "cache.organization=shared"),
    # batch 64, and the switch-base real logs under many policies
    pair("configs/switch_xxl.yaml", "lru", "oracle", 64, requests=64, decode=4),
    pair("configs/switch_base_real.yaml", "pregated", "oracle", 64, requests=64, decode=4),
    pair("configs/mixtral.yaml", "fiddler", "none", 64, requests=64, decode=3),
    pair("configs/switch_base_real.yaml", "moe-infinity", "moe-infinity", 8),
    pair("configs/switch_base_real.yaml", "on-demand", "none", 1),
    # the engine's calibrated-machine paths: hand-off and gap, interference, host costs, timeline
    pair("configs/switch_xxl.yaml", "diffmoe", "oracle", 8, *HANDOFF),
    pair("configs/switch_xxl.yaml", "lru", "noisy", 1, *SLOW, timeline=True),
    pair("configs/gpt_oss_20b.yaml", "lru", "oracle", 8, *HOST),
    pair("configs/gpt_oss_20b.yaml", "diffmoe", "oracle", 1, *HANDOFF, *SLOW, *HOST, timeline=True),
    pair("configs/mixtral.yaml", "pregated", "oracle", 8, *HANDOFF, *SLOW),
    pair("configs/mixtral.yaml", "ktransformers", "none", 8, *HANDOFF, *SLOW, *HOST, timeline=True),
    pair("configs/switch_base_real.yaml", "lru", "oracle", 1, "hardware.handoff_us=7"),
    pair("configs/switch_base_real.yaml", "lru", "oracle", 1, "hardware.copy_gap_us=5"),
    # serving systems: serial copy stream, layer overhead, write-backs
    pair("configs/mixtral.yaml", "lru", "none", 1, "system=deepspeed"),
    pair("configs/mixtral.yaml", "lru", "oracle", 8, "system=deepspeed", *HANDOFF, timeline=True),
    pair("configs/mixtral.yaml", "lru", "none", 1, "system=mixtral-offloading"),
    pair("configs/mixtral.yaml", "lru", "none", 1, "system=mixtral-offloading", "system.writeback_evicted=true"),
    pair("configs/switch_xxl.yaml", "diffmoe", "oracle", 8, "system.copy_stream=serial", *HANDOFF, *SLOW),
    pair("configs/gpt_oss_20b.yaml", "lru", "oracle", 1, "system.writeback_evicted=true", *HANDOFF),
    pair("configs/mixtral.yaml", "fiddler", "none", 1, "system=fiddler"),
    pair("configs/deepseek_v3.yaml", "ktransformers", "none", 1, "system=ktransformers"),
    pair("configs/deepseek_v3.yaml", "hybrid-cache", "none", 8, "system=llama-cpp"),
    # continuous batching, no prefill, a working-buffer squeeze
    pair("configs/switch_xxl.yaml", "lru", "oracle", 8, "workload.batching=continuous"),
    pair(
        "configs/mixtral.yaml",
        "lru",
        "oracle",
        8,
        "workload.prefill=false",
        "cache.lpc_buffers=2",
        "cache.prefetch_reserve=1",
    ),
]


def engine_facts(res) -> list:
    """The engine's result fields that are the simulation's (not wall time, not the lists)."""
    return [
        res.sim_time_s,
        res.compute_busy_s,
        res.link_busy_s,
        res.stall_s,
        res.copies,
        res.prefetch_copies,
        res.pcie_bytes,
        res.prefetches_issued,
        res.prefetches_used,
        res.unused_prefetches,
        res.wasted_bytes,
        res.max_buffers_in_use,
        res.events,
        res.cpu_busy_s,
        res.cpu_wait_s,
        res.cpu_experts,
    ]


def digest(config: str, sets: list[str], timeline: bool) -> tuple[str, dict]:
    """The sha256 of one run's results, and its summary."""
    cfg = load_run_config(config, sets, POLICIES.names(), PREDICTORS.names())
    out = simulate(cfg, timeline=timeline, record_decisions=True)
    res = out.engine
    h = hashlib.sha256()
    summary = {k: v for k, v in out.summary.items() if k not in ("wall_s", "events_per_s")}
    h.update(json.dumps(summary, sort_keys=True).encode())
    h.update(iterations_csv(res.iterations))
    h.update(repr([astuple(r) for r in res.iterations]).encode())
    h.update(repr(engine_facts(res)).encode())
    h.update(repr([astuple(d) for d in res.decisions or []]).encode())
    if timeline:
        h.update(repr(res.timeline).encode())
    return h.hexdigest(), out.summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run only the pairs whose config or overrides contain this")
    ap.add_argument("--list", action="store_true", help="list the pairs and exit")
    args = ap.parse_args()
    pairs = [p for p in PAIRS if args.only in p[0] + " " + " ".join(p[1])]
    import sim

    print(f"sim from {Path(sim.__file__).parent}")
    overall = hashlib.sha256()
    t_all = time.perf_counter()
    for i, (config, sets, timeline) in enumerate(pairs):
        name = f"{config} {' '.join(sets)}{' +timeline' if timeline else ''}"
        if args.list:
            print(f"{i:3d} {name}")
            continue
        t0 = time.perf_counter()
        d, s = digest(config, sets, timeline)
        overall.update(d.encode())
        print(f"{i:3d} {d} events={s['events']} {time.perf_counter() - t0:5.2f}s {name}", flush=True)
    if not args.list:
        print(f"overall {overall.hexdigest()} over {len(pairs)} pairs in {time.perf_counter() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
