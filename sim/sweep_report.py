"""A sweep's report: ``OUT/results.parquet`` (every row), ``OUT/report.md`` (the table, checks and failed points)
and the throughput and hit-rate plots that the swept axes allow."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from traces.io import atomic_write_bytes

if TYPE_CHECKING:
    from sim.sweep_spec import Sweep


RESULTS, REPORT, TIER_PLOT = "results.parquet", "report.md", "hit_rate_per_tier.png"


def plot_file(axis: str) -> str:
    """The file name of the throughput plot against ``axis``: a plain name whatever the axis is called."""
    from sim.sweep_spec import safe_name

    return f"throughput_vs_{safe_name(axis.replace('.', '_'), 'axis')}.png"


def report_files(sweep: Sweep) -> list[str]:
    """Every file name the report may write in the results folder (the plots the axes could make included), so
    that the places can be checked before the sweep runs."""
    axes = list(sweep.axes) + ["cache_slots"] + list(sweep.plots or [])
    return [RESULTS, REPORT, TIER_PLOT, *dict.fromkeys(plot_file(a) for a in axes)]


def write_report(out: Path, sweep: Sweep, df, checks: dict) -> list[Path]:
    """results.parquet, report.md and the plots that the swept axes allow."""
    import pandas as pd

    files = []
    for a in sweep.axes:  # an axis whose values mix types (1.0 and "high") is stored as text
        if a in df and len({type(v) for v in df[a] if v is not None}) > 1:
            df[a] = df[a].map(lambda v: None if v is None else str(v))
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(out / RESULTS, buf.getvalue())
    files.append(out / RESULTS)
    plots = make_plots(out, sweep, df[df["status"] == "ok"] if len(df) else df)
    files += plots
    shown = df.assign(pcie_gb=pd.to_numeric(df["pcie_bytes"], errors="coerce") / 1e9) if "pcie_bytes" in df else df
    cols = [a for a in sweep.axes if a in df] + ["status", "throughput_tok_s", "iteration_ms_mean", "hit_rate",
                                                 "hit_rate_hpc", "hit_rate_mpc", "hit_rate_lpc", "pcie_gb"]
    table = _sorted(shown[cols], [a for a in sweep.axes if a in df]) if len(df) else pd.DataFrame(columns=cols)
    lines = [f"# Sweep {sweep.name}", "", f"{len(df)} points from `{sweep.source}`; "
             f"{int((df['status'] != 'ok').sum()) if len(df) else 0} failed.", ""]
    if checks:
        lines += ["## Checks", ""]
        for name, bad in checks.items():
            state = "not applicable" if bad is None else ("passed" if not bad else f"FAILED: {'; '.join(bad)}")
            lines.append(f"- `{name}`: {state}")
        lines.append("")
    lines += ["## Points", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        lines.append("| " + " | ".join(_cell(r[c]) for c in cols) + " |")
    if len(df) and (df["status"] != "ok").any():
        lines += ["", "## Failed points", ""]
        for _, r in df[df["status"] != "ok"].iterrows():
            lines.append(f"- {r['point']}: {r['error']}{_attempts_note(r)}")
        lines += ["", "`python -m sim sweep ... --resume` runs them again (and only them)."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    atomic_write_bytes(out / REPORT, ("\n".join(lines) + "\n").encode())
    files.append(out / REPORT)
    return files


def _sorted(table, by: list[str]):
    """``table`` sorted by the swept columns; by their text where values of several types (1.0 and "high")
    cannot be compared."""
    try:
        return table.sort_values(by)
    except TypeError:
        return table.sort_values(by, key=lambda col: col.astype(str))


def _attempts_note(row) -> str:
    try:
        n = int(row.get("attempts"))
    except (TypeError, ValueError):  # rows stored before attempts were counted
        return ""
    return f" ({n} attempts)" if n > 1 else ""


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}"
    return str(v)


def make_plots(out: Path, sweep: Sweep, df) -> list[Path]:
    """Throughput against each numeric axis (one line per policy), and hit rate per tier per policy."""
    if not len(df):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    series = "policy.name" if "policy.name" in df else None
    numeric = [a for a in sweep.axes if a in df and a != series and df[a].map(lambda v: isinstance(v, (int, float))
                                                                               and not isinstance(v, bool)).all()]
    if any(a.startswith("cache.") for a in numeric):
        numeric = [a for a in numeric if not a.startswith("cache.")] + ["cache_slots"]
    if sweep.plots is not None:  # the sweep file chose its plots
        numeric = [a for a in sweep.plots if a in df]
    for axis in numeric:
        fig, ax = plt.subplots(figsize=(6, 4))
        others = [a for a in sweep.axes if a in df and a not in (axis, series) and not a.startswith("cache.")
                  and not (series and (df.groupby(series)[a].nunique() <= 1).all())]  # zipped with the series
        sub = df
        if others:  # one line per series at the first value of every other axis
            for a in others:
                sub = sub[sub[a] == sub[a].iloc[0]]
        for name, g in (sub.groupby(series) if series else [("all", sub)]):
            g = g.groupby(axis, as_index=False)["throughput_tok_s"].mean().sort_values(axis)
            ax.plot(g[axis], g["throughput_tok_s"], marker="o", label=str(name))
        ax.set_xlabel(axis)
        ax.set_ylabel("throughput (tokens/s)")
        lo, hi = sub["throughput_tok_s"].min(), sub["throughput_tok_s"].max()
        if lo > 0 and hi / lo > 20:  # gpu-only dwarfs the offloading policies
            ax.set_yscale("log")
        if others:
            title = ", ".join(f"{a}={sub[a].iloc[0]}" for a in others)
            ax.set_title(title if len(title) <= 90 else title[:87] + "...", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save_png(plt, fig, out / plot_file(axis)))
    if series:
        tiers = df.groupby(series)[["hit_rate_hpc", "hit_rate_mpc", "hit_rate_lpc"]].mean()
        fig, ax = plt.subplots(figsize=(6, 4))
        bottom = None
        for col, label in (("hit_rate_hpc", "HPC"), ("hit_rate_mpc", "MPC"), ("hit_rate_lpc", "LPC (prefetched)")):
            vals = tiers[col].fillna(0.0)
            ax.bar(tiers.index.astype(str), vals, bottom=bottom, label=label)
            bottom = vals if bottom is None else bottom + vals
        ax.set_ylabel("hit rate (mean over points)")
        ax.tick_params(axis="x", rotation=30, labelsize=7)
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save_png(plt, fig, out / TIER_PLOT))
    return made


def _save_png(plt, fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
