"""A sweep's report says what each plot shows: the axes a plot holds fixed and those it averages over, read from
the data, and its scale; and it writes numbers in human units (no raw 10-digit byte counts)."""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd

from sim.sweep.report import _cell, plot_view, tier_title
from tests.support.paths import ROOT

AXES = ["policy.name", "workload.batch_size", "cache.hpc_slots", "cache.mpc_slots"]
LONG_INTEGER = re.compile(r"(?<![\d.,])\d{10,}(?![\d.])")


def _rows(caches, batches=(1, 8), policies=("lru", "belady")):
    """One ok row per (policy, batch, cache size), with a throughput that differs per point."""
    rows = []
    for p in policies:
        for b in batches:
            for i, (h, m) in enumerate(caches):
                rows.append(
                    {
                        "policy.name": p,
                        "workload.batch_size": b,
                        "cache.hpc_slots": h,
                        "cache.mpc_slots": m,
                        "cache_slots": h + m,
                        "throughput_tok_s": 10.0 * b + i + len(p),
                        "status": "ok",
                        "hit_rate_hpc": 0.1,
                        "hit_rate_mpc": 0.2,
                        "hit_rate_lpc": 0.3,
                    }
                )
    return pd.DataFrame(rows)


def _sweep(axes=AXES):
    return SimpleNamespace(axes=list(axes), plots=None, points=[])  # no points: each axis held at the rows' first


def test_the_batch_plot_says_it_averages_over_the_cache_sizes():
    df = _rows([(0, 2), (2, 6)])
    view = plot_view(_sweep(), df, "workload.batch_size", "policy.name")
    assert view.title == "mean over 2 cache sizes"
    assert len(view.rows) == len(df)  # every point is plotted, averaged per (policy, batch)
    three = plot_view(_sweep(), _rows([(0, 2), (2, 6), (4, 9)]), "workload.batch_size", "policy.name")
    assert three.title == "mean over 3 cache sizes"


def test_the_cache_plot_names_the_batch_it_holds_fixed():
    df = _rows([(0, 2), (2, 6)], batches=(4, 8))
    view = plot_view(_sweep(), df, "cache_slots", "policy.name")
    assert view.title == "batch 4"
    assert set(view.rows["workload.batch_size"]) == {4}


def test_a_cache_split_at_equal_slots_is_averaged_and_said():
    df = _rows([(0, 8), (4, 4), (2, 2)], batches=(1,))  # two splits of 8 slots, one of 4
    view = plot_view(_sweep(), df, "cache_slots", "policy.name")
    assert view.title == "batch 1; mean over 1-2 cache sizes"


def test_an_axis_without_plain_words_is_named_by_its_field():
    df = _rows([(0, 2)]).assign(seed=1)
    df = pd.concat([df, df.assign(seed=2, throughput_tok_s=df["throughput_tok_s"] + 1)], ignore_index=True)
    view = plot_view(_sweep(AXES + ["seed"]), df, "workload.batch_size", "policy.name")
    assert view.title == "seed=1"  # held at its first value
    assert set(view.rows["seed"]) == {1}
    assert tier_title(_sweep(AXES + ["seed"]), df, "policy.name") == "mean over 2 batch sizes and 2 values of seed"


def test_the_tier_plot_says_what_each_bar_averages():
    assert tier_title(_sweep(), _rows([(0, 2), (2, 6)]), "policy.name") == "mean over 2 cache sizes and 2 batch sizes"
    single = _rows([(0, 2)], batches=(1,))
    assert tier_title(_sweep(), single, "policy.name") == "one point per policy.name"


def test_the_log_scale_follows_the_spread_of_throughput():
    df = _rows([(0, 2), (2, 6)])
    assert not plot_view(_sweep(), df, "workload.batch_size", "policy.name").log_scale
    wide = df.assign(throughput_tok_s=df["throughput_tok_s"] * df["workload.batch_size"] ** 3)
    assert plot_view(_sweep(), wide, "workload.batch_size", "policy.name").log_scale


def test_a_small_sweep_report_describes_its_plots_in_human_units(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        f"base: {ROOT / 'configs' / 'switch_xxl.yaml'}\n"
        + """
set: {workload.requests: 4, workload.max_decode_tokens: 4, workload.prefill: false}
grid:
  policy.name: [on-demand, lru]
  workload.batch_size: [1, 2]
zip:
  cache.hpc_slots: [0, 2]
  cache.mpc_slots: [2, 6]
"""
    )
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, "-m", "sim", "sweep", str(sweep), "--out", str(out), "--workers", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    report = (out / "report.md").read_text()
    assert (
        "- `throughput_vs_workload_batch_size.png`: throughput against workload.batch_size, one line per "
        "policy.name; mean over 2 cache sizes;" in report
    )
    assert (
        "- `throughput_vs_cache_slots.png`: throughput against cache_slots, one line per policy.name; batch 1;"
        in report
    )
    df = pd.read_parquet(out / "results.parquet")
    assert df["pcie_bytes"].max() >= 1e10  # the raw figure has 11+ digits; the report shows it in GB
    assert not [line for line in report.splitlines() if LONG_INTEGER.search(line)]


def test_table_cells_are_human_numbers():
    assert [_cell(v) for v in (123456.7, 1260.4, 0.9928, 18_778_521_340_800, None, float("nan"), "lru", True)] == [
        "123,457",
        "1,260",
        "0.9928",
        "18,778,521,340,800",
        "-",
        "-",
        "lru",
        "True",
    ]
