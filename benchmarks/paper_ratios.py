"""Diff-MoE's throughput ratios over its baselines, from sweep results (`python -m sim sweep ... --out DIR`).

    python benchmarks/paper_ratios.py DIR [DIR ...] [--label NAME ...]

Per sweep folder and per setting of every swept field other than the policy, batch size, trace and cache slots
(e.g. the hardware), the ratio of Diff-MoE's throughput to each baseline's at the same batch size and slots,
averaged over batch sizes and slots (the arithmetic mean, as the paper's "average", and the geometric mean), and
the ratio per batch size (averaged over slots). Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

POINT_KEYS = ["workload.batch_size", "cache.hpc_slots", "cache.mpc_slots"]
IGNORED = {
    "point",
    "status",
    "error",
    "wall_s",
    "workload.trace",
    "policy.name",
    "predictor.name",
    "policy.params",
    "cache_slots",
} | set(POINT_KEYS)
BASELINES = (
    ("on-demand", "on-demand (DeepSpeed)", 2.74),
    ("pregated", "Pre-gated", 2.22),
    ("moe-infinity", "MoE-Infinity", 1.55),
)


def load(folder: Path) -> pd.DataFrame:
    path = folder / "results.parquet"
    if not path.exists():
        sys.exit(f"error: {path}: missing (run the sweep with --out {folder} first)")
    df = pd.read_parquet(path)
    bad = df[df["status"] != "ok"]
    if len(bad):
        sys.exit(f"error: {folder}: {len(bad)} point(s) failed; first: {bad.iloc[0]['error']}")
    return df


def settings(df: pd.DataFrame) -> list[str]:
    """The swept fields other than policy, batch, trace and slots."""
    metric_start = df.columns.get_loc("throughput_tok_s")
    return [c for c in df.columns[:metric_start] if c not in IGNORED and df[c].nunique() > 1]


def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (batch, slots): Diff-MoE's throughput over each baseline's."""
    tp = df.pivot_table(index=POINT_KEYS, columns="policy.name", values="throughput_tok_s")
    out = pd.DataFrame(index=tp.index)
    for name, _, _ in BASELINES:
        if name in tp and "diffmoe" in tp:
            out[name] = tp["diffmoe"] / tp[name]
    return out


def describe(value) -> str:
    try:
        d = json.loads(value)
    except (TypeError, ValueError):
        return str(value)
    return ", ".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, dict) else str(d)


def means(df: pd.DataFrame) -> list[tuple[str, dict[str, float]]]:
    """Per setting (see :func:`settings`): Diff-MoE's mean ratio over each baseline."""
    keys = settings(df)
    groups = df.groupby(keys, sort=False) if keys else [((), df)]
    out = []
    for key, part in groups:
        key = key if isinstance(key, tuple) else (key,)
        r = ratios(part)
        out.append(
            ("; ".join(describe(v) for v in key) or "all", {b: float(r[b].mean()) for b, _, _ in BASELINES if b in r})
        )
    return out


def report(df: pd.DataFrame, label: str) -> str:
    keys = settings(df)
    groups = df.groupby(keys, sort=False) if keys else [((), df)]
    lines = [
        f"### {label}",
        "",
        "| setting | " + " | ".join(f"x {title} (mean / geo)" for _, title, _ in BASELINES) + " |",
        "| --- |" + " ---: |" * len(BASELINES),
    ]
    per_batch = []
    for key, part in groups:
        key = key if isinstance(key, tuple) else (key,)
        name = "; ".join(describe(v) for v in key) or "all"
        r = ratios(part)
        cells = []
        for b, _, _ in BASELINES:
            cells.append(f"{r[b].mean():.2f} / {np.exp(np.log(r[b]).mean()):.2f}" if b in r else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        by_batch = r.groupby(level=0).mean()
        per_batch.append((name, by_batch))
    lines += [
        "",
        "Per batch size (mean over slots), Diff-MoE over on-demand / Pre-gated / MoE-Infinity:",
        "",
        "| setting | " + " | ".join(f"b{b}" for b in per_batch[0][1].index) + " |",
        "| --- |" + " ---: |" * len(per_batch[0][1].index),
    ]
    for name, by_batch in per_batch:
        lines.append(
            f"| {name} | " + " | ".join(" / ".join(f"{v:.2f}" for v in row) for _, row in by_batch.iterrows()) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--label", action="append", default=[], help="a title per folder (default: the folder name)")
    args = p.parse_args(argv)
    print("Paper (Diff-MoE, SC 2025): " + ", ".join(f"x {t} {v}" for _, t, v in BASELINES) + "\n")
    for i, folder in enumerate(args.folders):
        print(report(load(folder), args.label[i] if i < len(args.label) else folder.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
