"""The Diff-MoE paper reproduction and what moves its ratios: runs `configs/sweeps/diffmoe_paper.yaml` and one
variant sweep per factor, then prints the ratio tables (`benchmarks/paper_ratios.py`).

    python benchmarks/paper_reproduction.py [--out runs/paper] [--workers 2]

The variants change one thing each against the reference setting (H200 with host costs: the second hardware of
the sweep): decode length, the hit copy into the working arena, Diff-MoE's starting cache, the old Diff-MoE rules,
the per-layer round trip, the encoder's prefill, and the workload (the bundled synthetic Switch trace, with assumed
knobs, instead of the real logs). Finished sweeps are kept (`--resume`), so a rerun only fills what is missing.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "configs" / "sweeps" / "diffmoe_paper.yaml"
sys.path.insert(0, str(ROOT / "benchmarks"))
from paper_ratios import BASELINES, load, means, report  # noqa: E402

REFERENCE_HW = {"base": "h200", "layer_roundtrip_us": 21, "copy_issue_us": 5}


def variant(base: dict, name: str) -> dict:
    """The sweep with one factor changed, on the reference hardware only."""
    d = copy.deepcopy(base)
    d["name"] = f"diffmoe_paper_{name}"
    d["base"] = str(ROOT / "configs" / "switch_xxl.yaml")
    d["zip"] = [z for z in d["zip"] if "hardware" not in z]
    d["set"]["hardware"] = dict(REFERENCE_HW)
    policies = next(z for z in d["zip"] if "policy.name" in z)
    diffmoe = policies["policy.name"].index("diffmoe")
    if name == "decode64":
        d["set"]["workload.max_decode_tokens"] = 64
    elif name == "no_hit_copy":
        policies["policy.params"][diffmoe] = {"fill": "expert0", "hit_d2d": False}
    elif name == "hot_start":
        policies["policy.params"][diffmoe] = {}  # the cache starts with each layer's hottest experts (this trace's)
    elif name == "old_rules":
        policies["policy.params"][diffmoe] = {"floor": True, "victim_order": "legacy", "arithmetic": "float64"}
    elif name == "roundtrip100":
        d["set"]["hardware"]["layer_roundtrip_us"] = 100
    elif name == "no_prefill":
        d["set"]["workload.prefill"] = False
    elif name == "fitted_1_128":
        batches = next(z for z in d["zip"] if "workload.trace" in z)
        d["zip"].remove(batches)
        d["zip"].append({"workload.batch_size": [1, 2, 4, 8, 16, 32, 64, 128]})
        d["zip"].append(
            {
                "model": [
                    {"base": "switch-base-128", "dtype_bytes": 4},
                    {"base": "switch-large-128", "dtype_bytes": 4},
                ],
                "workload.trace": ["traces/data/switch_base_128_fitted.npz", "traces/data/switch_large_128.npz"],
                "workload.requests": [256, 128],
            }
        )
        del d["set"]["model"]
    elif name == "synthetic":
        batches = next(z for z in d["zip"] if "workload.trace" in z)
        batches["workload.trace"] = ["traces/data/switch_base_128.npz"] * len(batches["workload.batch_size"])
        d["set"]["workload.requests"] = 64
    else:
        raise ValueError(name)
    return d


VARIANTS = {
    "decode64": "decode length 64 instead of 256",
    "no_hit_copy": "Diff-MoE without the artifact's hit copy into the working arena",
    "hot_start": "Diff-MoE's cache starting with each layer's hottest experts (profiled on this trace) "
    "instead of expert 0",
    "old_rules": "Diff-MoE with the earlier rules (score floor, old victim order, float64) and a hot start",
    "roundtrip100": "a per-layer routing round trip of 100 us instead of 21",
    "no_prefill": "decode only (the encoder's on-demand prefill left out)",
    "synthetic": "the bundled synthetic Switch trace (assumed knobs) instead of the real logs, 64 requests",
    "fitted_1_128": "batch 1-128 on workloads fitted to the real logs: switch-base-128 and switch-large-128",
}


def run_sweep(path: Path, out: Path, workers: int) -> None:
    cmd = [sys.executable, "-m", "sim", "sweep", str(path), "--out", str(out), "--workers", str(workers), "--resume"]
    subprocess.run(cmd, cwd=ROOT, check=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "paper")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    run_sweep(SWEEP, args.out / "main", args.workers)
    base = yaml.safe_load(SWEEP.read_text())
    for name in VARIANTS:
        path = args.out / f"{name}.yaml"
        path.write_text(yaml.safe_dump(variant(base, name), sort_keys=False))
        run_sweep(path, args.out / name, args.workers)
    main_df = load(args.out / "main")
    lines = [
        "### Summary: Diff-MoE's mean throughput ratio",
        "",
        "| setting | " + " | ".join(f"x {t} (paper {v})" for _, t, v in BASELINES) + " |",
        "| --- |" + " ---: |" * len(BASELINES),
    ]
    for setting, m in means(main_df):
        lines.append(f"| {setting} | " + " | ".join(f"{m.get(b, float('nan')):.2f}" for b, _, _ in BASELINES) + " |")
    for name, what in VARIANTS.items():
        for setting, m in means(load(args.out / name)):
            label = what if setting == "all" else f"{what}: {setting}"
            lines.append(
                f"| reference, {label} | " + " | ".join(f"{m.get(b, float('nan')):.2f}" for b, _, _ in BASELINES) + " |"
            )
    print("\n".join(lines) + "\n")
    print(report(main_df, "The paper's setting on the real logs, four machines"))
    for name, what in VARIANTS.items():
        print(report(load(args.out / name), f"H200 with host costs, {what}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
