"""A sweep's report: ``OUT/results.parquet`` (every row), ``OUT/report.md`` (the table, checks and failed points)
and the throughput and hit-rate plots that the swept axes allow (drawn by ``sim/sweep/plots.py``)."""

from __future__ import annotations

import io
import numbers
from pathlib import Path
from typing import TYPE_CHECKING

from sim.sweep.checks import check_state
from sim.sweep.plots import (
    TIER_PLOT,
    Plot,
    PlotView,
    make_plots,
    make_plots_described,
    numeric_axes,
    plan_plots,
    plot_file,
    plot_view,
    plotted_metrics,
    tier_title,
)
from sim.sweep.worker import DOES_NOT_FIT, DONE, misfit_words
from traces.io import atomic_write_bytes

if TYPE_CHECKING:
    from sim.sweep.spec import Sweep


RESULTS, REPORT = "results.parquet", "report.md"
CAPACITY_SHOWN = ("capacity_req_s", "capacity_above_saturation")  # the table's columns of a capacity sweep


def report_files(sweep: Sweep) -> list[str]:
    """Every file name the report may write in the results folder (the plots the axes could make included), so
    that the places can be checked before the sweep runs."""
    axes = list(sweep.axes) + ["cache_slots"] + list(sweep.plots or [])
    plots = (plot_file(a, m) for m in plotted_metrics(sweep) for a in axes)
    return [RESULTS, REPORT, TIER_PLOT, *dict.fromkeys(plots)]


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
    plots = plan_plots(out, sweep, df[df["status"] == "ok"] if len(df) else df)
    files += [p.path for p in plots if p.drawn]
    shown = df.assign(pcie_gb=pd.to_numeric(df["pcie_bytes"], errors="coerce") / 1e9) if "pcie_bytes" in df else df
    shown = _misfits_shown(shown)
    cols = [a for a in sweep.axes if a in df] + [
        "status",
        "throughput_tok_s",
        "iteration_ms_mean",
        "hit_rate",
        "hit_rate_hpc",
        "hit_rate_mpc",
        "hit_rate_lpc",
        "pcie_gb",
    ]
    if getattr(sweep, "capacity", None) is not None:  # the load each point holds within the SLO
        cols += [c for c in CAPACITY_SHOWN if c in shown]
    table = _sorted(shown[cols], [a for a in sweep.axes if a in df]) if len(df) else pd.DataFrame(columns=cols)
    failed = ~df["status"].isin(DONE) if len(df) else pd.Series([], dtype=bool)
    lines = [
        f"# Sweep {sweep.name}",
        "",
        f"{len(df)} points from `{sweep.source}`; {int(failed.sum())} failed{_misfit_words(df)}.",
        "",
    ]
    if checks:
        lines += ["## Checks", ""]
        for name, bad in checks.items():
            lines.append(f"- `{name}`: {check_state(bad)}")
        lines.append("")
    lines += ["## Points", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        lines.append("| " + " | ".join(_cell(r[c]) for c in cols) + " |")
    if failed.any():
        lines += ["", "## Failed points", ""]
        for _, r in df[failed].iterrows():
            lines.append(f"- {r['point']}: {r['error']}{_attempts_note(r)}")
        lines += ["", "`python -m sim sweep ... --resume` runs them again (and only them)."]
    lines += _plot_lines(plots)
    atomic_write_bytes(out / REPORT, ("\n".join(lines) + "\n").encode())
    files.append(out / REPORT)
    return files


def _misfits_shown(df):
    """The rows as the table shows them: a point that does not fit in the GPU's memory has ``does not fit (X GB >
    Y GB)`` in place of its throughput."""
    misfit = df["status"] == DOES_NOT_FIT if len(df) else None
    if misfit is None or not misfit.any():
        return df
    df = df.assign(throughput_tok_s=df["throughput_tok_s"].astype(object))
    df.loc[misfit, "throughput_tok_s"] = df.loc[misfit, "error"].map(misfit_words)
    return df


def _misfit_words(df) -> str:
    n = int((df["status"] == DOES_NOT_FIT).sum()) if len(df) else 0
    verb = "does" if n == 1 else "do"
    return f", {n} {verb} not fit in the GPU's memory (not run; their rows say by how much)" if n else ""


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
    """A table cell: numbers with thousands separators (floats to 4 significant digits, or whole from 10,000
    up), "-" for none."""
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return str(v)
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    return f"{float(v):,.0f}" if abs(float(v)) >= 1e4 else f"{float(v):,.4g}"  # 123,457, never 1.235e+05


def _plot_lines(plots: list[Plot]) -> list[str]:
    """The report's section on the plots: each drawn one with its line and the image, each one not drawn with
    the reason."""
    if not plots:
        return []
    lines = ["", "## Plots", ""]
    for p in plots:
        lines += [f"- `{p.path.name}`: {p.words}", ""]
        if p.drawn:
            lines += [f"![{p.path.stem}]({p.path.name})", ""]
    lines.pop()
    return lines


__all__ = [
    "REPORT",
    "RESULTS",
    "TIER_PLOT",
    "Plot",
    "PlotView",
    "make_plots",
    "make_plots_described",
    "numeric_axes",
    "plot_file",
    "plot_view",
    "report_files",
    "tier_title",
    "write_report",
]
