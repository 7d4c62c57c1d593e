"""A sweep's report: ``OUT/results.parquet`` (every row), ``OUT/report.md`` (the table, checks and failed points)
and the throughput and hit-rate plots that the swept axes allow."""

from __future__ import annotations

import io
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traces.io import atomic_write_bytes

if TYPE_CHECKING:
    from sim.sweep.spec import Sweep


RESULTS, REPORT, TIER_PLOT = "results.parquet", "report.md", "hit_rate_per_tier.png"
CACHE = "cache"  # the cache's axes (cache.hpc_slots, cache.mpc_slots, ...) counted together as cache sizes


def plot_file(axis: str) -> str:
    """The file name of the throughput plot against ``axis``: a plain name whatever the axis is called."""
    from sim.sweep.spec import safe_name

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
    described = make_plots_described(out, sweep, df[df["status"] == "ok"] if len(df) else df)
    plots = [p for p, _ in described]
    files += plots
    shown = df.assign(pcie_gb=pd.to_numeric(df["pcie_bytes"], errors="coerce") / 1e9) if "pcie_bytes" in df else df
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
    table = _sorted(shown[cols], [a for a in sweep.axes if a in df]) if len(df) else pd.DataFrame(columns=cols)
    lines = [
        f"# Sweep {sweep.name}",
        "",
        f"{len(df)} points from `{sweep.source}`; {int((df['status'] != 'ok').sum()) if len(df) else 0} failed.",
        "",
    ]
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
        lines += ["", "## Plots", ""]
        for p, words in described:
            lines += [f"- `{p.name}`: {words}", "", f"![{p.stem}]({p.name})", ""]
        lines.pop()
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
    """A table cell: numbers with thousands separators (floats to 4 significant digits, or whole from 10,000
    up), "-" for none."""
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return str(v)
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    return f"{float(v):,.0f}" if abs(float(v)) >= 1e4 else f"{float(v):,.4g}"  # 123,457, never 1.235e+05


@dataclass(frozen=True)
class PlotView:
    """What one throughput plot shows: its rows, its title (the axes it holds fixed and those it averages over,
    read from the data) and whether its y axis is logarithmic."""

    axis: str
    rows: Any
    title: str
    log_scale: bool


#: plain words for the axes users sweep most: (one value, several values)
AXIS_WORDS = {"workload.batch_size": ("batch", "batch sizes"), CACHE: ("cache size", "cache sizes")}


def numeric_axes(sweep: Sweep, df, series: str | None) -> list[str]:
    """The x axes of the throughput plots: every numeric swept axis (the cache's axes as one, ``cache_slots``),
    or the sweep file's ``plots``."""
    if sweep.plots is not None:  # the sweep file chose its plots
        return [a for a in sweep.plots if a in df]
    numeric = [
        a
        for a in sweep.axes
        if a in df
        and a != series
        and df[a].map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)).all()
    ]
    if any(a.startswith("cache.") for a in numeric):
        numeric = [a for a in numeric if not a.startswith("cache.")] + ["cache_slots"]
    return numeric


def plot_view(sweep: Sweep, df, axis: str, series: str | None) -> PlotView:
    """The rows, title and scale of the throughput plot against ``axis``: one line per ``series`` value, at the
    first value of every other swept axis that is not zipped with the series, the cache's axes excepted (they
    are averaged, and the title says so)."""
    others = [
        a
        for a in sweep.axes
        if a in df
        and a not in (axis, series)
        and not a.startswith("cache.")
        and (df[a].nunique() <= 1 or not (series and (df.groupby(series)[a].nunique() <= 1).all()))
    ]
    # (an axis zipped with the series varies with the lines; one with a single value is held fixed)
    sub = df
    for a in others:  # one line per series at the first value of every other axis, in the sweep file's order
        sub = sub[sub[a] == _first_value(sweep, sub, a)]
    fixed = [_fixed_words(a, sub[a].iloc[0]) for a in others]
    keys = [k for k in (series, axis) if k and k in sub]
    title = "; ".join(fixed + [w for w in [averaged_words(sweep, sub, keys)] if w])
    lo, hi = sub["throughput_tok_s"].min(), sub["throughput_tok_s"].max()
    log = bool(lo > 0 and hi / lo > 20)  # gpu-only dwarfs the offloading policies
    return PlotView(axis, sub, title, log)


def _first_value(sweep: Sweep, rows, axis: str):
    """The first value ``axis`` takes among ``rows`` in the order of the sweep's points (the file's order), not in
    the rows' order, which follows the points' ids and so the folder the sweep ran in."""
    held = set(rows[axis])
    return next(
        (p.fields[axis] for p in sweep.points if axis in p.fields and p.fields[axis] in held), rows[axis].iloc[0]
    )


def averaged_words(sweep: Sweep, rows, keys: list[str]) -> str:
    """ "mean over 3 cache sizes and 2 batch sizes": the swept axes that take several values within a group of
    ``rows`` sharing ``keys`` (the cache's axes counted together, as cache sizes); "" when nothing is averaged."""
    cache = [a for a in sweep.axes if a.startswith("cache.") and a in rows and a not in keys]
    groups = ([(CACHE, cache)] if cache else []) + [
        (a, [a]) for a in sweep.axes if a in rows and a not in keys and not a.startswith("cache.")
    ]
    out = []
    for name, cols in groups:
        counts = _distinct_per_group(rows, keys, cols)
        if not counts or max(counts) <= 1:
            continue
        lo, hi = min(counts), max(counts)
        n = str(hi) if lo == hi else f"{lo}-{hi}"
        out.append(f"{n} {AXIS_WORDS.get(name, (None, f'values of {name}'))[1]}")
    return "mean over " + " and ".join(out) if out else ""


def _distinct_per_group(rows, keys: list[str], cols: list[str]) -> list[int]:
    """How many distinct combinations of ``cols`` each group of ``rows`` sharing ``keys`` holds."""
    if not len(rows):
        return []
    tuples = rows[cols].astype(str).agg("|".join, axis=1)
    if not keys:
        return [int(tuples.nunique())]
    return [int(n) for n in tuples.groupby([rows[k] for k in keys]).nunique()]


def _fixed_words(axis: str, value) -> str:
    """``batch 1`` for the batch size, ``axis=value`` for any other axis held at one value."""
    return f"{AXIS_WORDS[axis][0]} {value}" if axis in AXIS_WORDS else f"{axis}={value}"


def tier_title(sweep: Sweep, df, series: str) -> str:
    """The title of the hit-rate-per-tier plot: what each policy's bar averages over."""
    return averaged_words(sweep, df, [series]) or "one point per " + series


def make_plots(out: Path, sweep: Sweep, df) -> list[Path]:
    """Throughput against each numeric axis (one line per policy), and hit rate per tier per policy."""
    return [path for path, _ in make_plots_described(out, sweep, df)]


def make_plots_described(out: Path, sweep: Sweep, df) -> list[tuple[Path, str]]:
    """The plots, each with its one-line description for the report (what it shows, holds fixed, averages over,
    and its scale)."""
    if not len(df):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    series = "policy.name" if "policy.name" in df else None
    for axis in numeric_axes(sweep, df, series):
        view = plot_view(sweep, df, axis, series)
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, g in view.rows.groupby(series) if series else [("all", view.rows)]:
            g = g.groupby(axis, as_index=False)["throughput_tok_s"].mean().sort_values(axis)
            ax.plot(g[axis], g["throughput_tok_s"], marker="o", label=str(name))
        ax.set_xlabel(axis)
        ax.set_ylabel("throughput (tokens/s)" + (", log scale" if view.log_scale else ""))
        if view.log_scale:
            ax.set_yscale("log")
        if view.title:
            ax.set_title(view.title if len(view.title) <= 90 else view.title[:87] + "...", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        scale = "log" if view.log_scale else "linear"
        what = f"throughput against {axis}" + (f", one line per {series}" if series else "")
        made.append(
            (_save_png(plt, fig, out / plot_file(axis)), f"{what}; {view.title or 'every point'}; {scale} scale")
        )
    if series:
        tiers = df.groupby(series)[["hit_rate_hpc", "hit_rate_mpc", "hit_rate_lpc"]].mean()
        title = tier_title(sweep, df, series)
        fig, ax = plt.subplots(figsize=(6, 4))
        bottom = None
        for col, label in (("hit_rate_hpc", "HPC"), ("hit_rate_mpc", "MPC"), ("hit_rate_lpc", "LPC (prefetched)")):
            vals = tiers[col].fillna(0.0)
            ax.bar(tiers.index.astype(str), vals, bottom=bottom, label=label)
            bottom = vals if bottom is None else bottom + vals
        ax.set_ylabel("hit rate")
        ax.set_title(title if len(title) <= 90 else title[:87] + "...", fontsize=8)
        ax.tick_params(axis="x", rotation=30, labelsize=7)
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append((_save_png(plt, fig, out / TIER_PLOT), f"hit rate per tier, one bar per {series}; {title}"))
    return made


def _save_png(plt, fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
