"""A sweep's plots: throughput against each numeric swept axis (one line per policy) and, per policy, where its
expert accesses were served (``hit_rate_per_tier.png``).

What a reader can trust in them: every policy keeps one style (colour, marker, line style; ``sim/plot_style.py``)
in every figure, and past ``MAX_LINES`` policies the lines are split into panels that share their axes (small
multiples); legends sit outside the data; each title names the model, the hardware (and the serving system, when
it is not ``ideal``), the batch when it is not an axis, what each point holds fixed and what it averages over;
axes carry units. A plot whose x axis would take one value is not drawn, and the report says why."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.plot_style import (
    ORIGIN_WORDS,
    PALETTE,
    Style,
    legend_outside,
    log_axis,
    origin_rank,
    plain_styles,
    policy_styles,
    save_png,
    series_label,
    wrap,
)

if TYPE_CHECKING:
    from sim.sweep.spec import Sweep


TIER_PLOT = "hit_rate_per_tier.png"
CACHE = "cache"  # the cache's axes (cache.hpc_slots, cache.mpc_slots, ...) counted together as cache sizes
MAX_LINES = 8  # more series than this: one panel per kind of policy (at most PANEL_LINES lines each)
PANEL_LINES = 6
MAX_HEADER_CONFIGS = 6  # settings (model, hardware, system) named in a title before "..."
TITLE_FONT = 9.0
#: plain words for the axes users sweep most: (one value, several values)
AXIS_WORDS = {"workload.batch_size": ("batch", "batch sizes"), CACHE: ("cache size", "cache sizes")}
#: x-axis labels with units; any other axis is labelled by its field
AXIS_LABELS = {
    "cache_slots": "expert-cache slots per cached layer (HPC + MPC, or a shared cache's slots / layers)",
    "workload.batch_size": "batch size (sequences decoded together)",
    "workload.max_decode_tokens": "decode tokens per request",
    "workload.requests": "requests",
    "cache.hpc_slots": "HPC slots per layer",
    "cache.mpc_slots": "MPC slots per layer",
    "cache.lpc_buffers": "LPC working buffers (experts, all layers)",
    "cache.shared_slots": "shared-cache slots (all cached layers)",
    "cache.gpu_memory_gb": "GPU memory for the expert cache (GB)",
    "policy.params.cpu_layers": "MoE layers whose experts stay on the host CPU (cpu_layers)",
    "predictor.params.recall": "predictor recall (share of the next layer's experts predicted)",
    "predictor.params.precision": "predictor precision (share of predictions that are used)",
}
THROUGHPUT = "throughput (tok/s)"
#: the metrics plotted against the axes: row column -> (file prefix, y-axis label, words in the report)
PLOTTED = {
    "throughput_tok_s": ("throughput", THROUGHPUT, "throughput"),
    "capacity_req_s": (
        "capacity",
        "capacity (requests/s within the SLO)",
        "capacity (the highest request rate meeting the sweep's SLO)",
    ),
}
THROUGHPUT_COLUMN, CAPACITY_COLUMN = "throughput_tok_s", "capacity_req_s"
#: where an expert access was served, in the per-tier plot's order: (row column, legend words, colour)
TIERS = (
    ("hit_rate_hpc", "HPC hit (pinned experts)", "#08306b"),
    ("hit_rate_mpc", "MPC hit (cached)", "#2171b5"),
    ("hit_rate_lpc", "LPC hit (prefetched in time)", "#6baed6"),
    ("cpu_expert_frac", "computed on the host CPU", "#e6550d"),
)
MISS = ("miss", "copied on demand (miss)", "#d9d9d9")


def plot_file(axis: str, metric: str = THROUGHPUT_COLUMN) -> str:
    """The file name of the plot of ``metric`` (throughput, or a capacity sweep's capacity) against ``axis``: a
    plain name whatever the axis is called."""
    from sim.sweep.spec import safe_name

    return f"{PLOTTED[metric][0]}_vs_{safe_name(axis.replace('.', '_'), 'axis')}.png"


def slo_words(capacity: dict | None) -> str:
    """ "capacity: TTFT <= 0.5 s, TPOT <= 0.1 s for 90% of requests": what a capacity sweep's figure is found for
    ("" without the option)."""
    if not capacity:
        return ""
    slo = ", ".join(f"{k.removesuffix('_s').upper()} <= {v:g} s" for k, v in capacity["slo"].items() if v is not None)
    requests = f" of {capacity['requests']:,}" if capacity.get("requests") else ""
    return f"capacity: {slo} for {capacity['attainment']:.0%}{requests} requests"


def plotted_metrics(sweep: Sweep) -> list[str]:
    """The metrics plotted against each axis: throughput, and with the sweep's ``capacity`` option the capacity."""
    return [THROUGHPUT_COLUMN] + ([CAPACITY_COLUMN] if getattr(sweep, "capacity", None) is not None else [])


@dataclass(frozen=True)
class PlotView:
    """What one throughput plot shows: its rows, its title (the axes it holds fixed and those it averages over,
    read from the data), whether its y axis is logarithmic, and the swept axes that vary with the x axis (zipped
    with it: not held fixed, since each of the axis's values comes with its own)."""

    axis: str
    rows: Any
    title: str
    log_scale: bool
    along: tuple[str, ...] = ()
    metric: str = THROUGHPUT_COLUMN  # the row column on the y axis


@dataclass(frozen=True)
class Plot:
    """One plot of the report: its file, whether it was drawn, and its line in ``report.md`` (what it shows, or
    why it was not drawn)."""

    path: Path
    drawn: bool
    words: str


POLICY = "policy.name"


def _numeric(values) -> bool:
    """Whether every value is a number (numpy's included), not a boolean."""
    return bool(values.map(lambda v: isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))).all())


def series_axis(sweep: Sweep, df) -> str | None:
    """The field that makes one line (and one bar of the tier plot) per value: ``policy.name`` when swept, else
    the first swept field whose values are not all numbers (a system, a hardware, a trace); None when none."""
    if POLICY in df:
        return POLICY
    return next((a for a in sweep.axes if a in df and df[a].nunique() > 1 and not _numeric(df[a])), None)


def numeric_axes(sweep: Sweep, df, series: str | None) -> list[str]:
    """The x axes of the throughput plots: every numeric swept axis (the cache's axes as one, ``cache_slots``),
    or the sweep file's ``plots``."""
    if sweep.plots is not None:  # the sweep file chose its plots
        return [a for a in sweep.plots if a in df]
    numeric = [a for a in sweep.axes if a in df and a != series and _numeric(df[a])]
    if any(a.startswith("cache.") for a in numeric):
        numeric = [a for a in numeric if not a.startswith("cache.")] + ["cache_slots"]
    return numeric


def _determined_by(df, axis: str, keys: list[str]) -> bool:
    """Whether ``axis`` takes one value in every group of ``df`` sharing ``keys`` (it is zipped with them)."""
    keys = [k for k in keys if k in df]
    return bool(keys) and bool((df.groupby(keys)[axis].nunique() <= 1).all())


def plot_view(sweep: Sweep, df, axis: str, series: str | None, metric: str = THROUGHPUT_COLUMN) -> PlotView:
    """The rows, title and scale of the throughput plot against ``axis``: one line per ``series`` value, at the
    first value of every other swept axis, the cache's axes excepted (they are averaged, and the title says so),
    and so are the axes zipped with the series or with the x axis (they vary with the lines or along them: a
    ``cpu_layers`` zipped with the cache's slots is not held at its first value, which would leave one point)."""
    keys = [k for k in (series, axis) if k]
    candidates = [a for a in sweep.axes if a in df and a not in keys and not a.startswith("cache.")]
    along = tuple(a for a in candidates if df[a].nunique() > 1 and _determined_by(df, a, [axis]))
    others = [a for a in candidates if df[a].nunique() <= 1 or not _determined_by(df, a, keys)]
    sub = df
    for a in others:  # one line per series at the first value of every other axis, in the sweep file's order
        sub = sub[sub[a] == _first_value(sweep, sub, a)]
    fixed = [_fixed_words(a, sub[a].iloc[0]) for a in others]
    keys = [k for k in keys if k in sub]
    title = "; ".join(fixed + [w for w in [averaged_words(sweep, sub, keys)] if w])
    lo, hi = sub[metric].min(), sub[metric].max()
    log = bool(lo > 0 and hi / lo > 20)  # gpu-only dwarfs the offloading policies
    return PlotView(axis, sub, title, log, along, metric)


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


# ------------------------------------------------------------------------------------------ the settings
SETTING_AXES = ("model", "hardware", "system")  # swept fields under these change what a title names


def setting_words(sweep: Sweep, rows) -> str:
    """ "mixtral-8x7b on rtx4090, llama-cpp system, batch 4, predictor transition": the model, the hardware, the
    serving system (unless ``ideal``) and, when not swept, the batch and the predictor, of the points among
    ``rows`` (one config resolved per distinct swept model, hardware or system; "" when none can be)."""
    swept = [a for a in sweep.axes if a in rows and a.split(".")[0] in SETTING_AXES]
    if "point" in rows and len(rows):  # one point per distinct swept model, hardware or system
        ids = list((rows.drop_duplicates(swept) if swept else rows.iloc[:1])["point"])
    else:
        ids = []
    configs = [c for c in (_config(sweep, pid) for pid in ids[:MAX_HEADER_CONFIGS] or [None]) if c is not None]
    if not configs:
        return ""
    more = " / ..." if len(ids) > MAX_HEADER_CONFIGS else ""
    models = _joined(c.model.name for c in configs) + more
    words = f"{models} on {_joined(c.hardware.name for c in configs)}{more}"
    systems = [s for s in (system_name(c.system) for c in configs) if s]
    if systems:
        words += f", {_joined(systems)} system"
    if "workload.batch_size" not in sweep.axes:
        words += f", batch {_joined(c.workload.batch_size for c in configs)}"
    if "predictor.name" not in sweep.axes:
        words += f", predictor {_joined(c.predictor.name for c in configs)}"
    return words


def _joined(values) -> str:
    return " / ".join(dict.fromkeys(str(v) for v in values))


def _config(sweep: Sweep, point_id):
    """The resolved config of the point ``point_id`` (the sweep's first point when None or unknown); None when
    the sweep holds no points or its base no longer resolves (the title then names no settings)."""
    points = list(getattr(sweep, "points", []) or [])
    point = next((p for p in points if p.id == point_id), points[0] if points else None)
    if point is None:
        return None
    from sim.config.run_config import resolve_config

    try:
        return resolve_config(sweep.base, point.overrides, sweep.source)
    except Exception:  # a title's words only: every point resolved when the sweep was loaded
        return None


def system_name(system) -> str | None:
    """The serving system's name as a title shows it: None for ``ideal`` (no software costs); a profile loaded
    from ``configs/systems/NAME.yaml`` is named by its file when its own name is ``ideal`` (the base it extends)."""
    name = str(getattr(system, "name", "") or "")
    source = str(getattr(system, "source", "") or "")
    if name and name not in ("ideal", "inline"):
        return name
    stem = Path(source).stem if source.endswith((".yaml", ".yml", ".json")) else ""
    return stem if stem and stem != "ideal" else None


# ------------------------------------------------------------------------------------------ the figures
def axis_label(axis: str, along: tuple[str, ...] = (), log: bool = False) -> str:
    """The x axis's label: its meaning and unit, the axes zipped with it, and its scale."""
    label = AXIS_LABELS.get(axis, axis)
    if along:
        label += f"; {', '.join(along)} {'varies' if len(along) == 1 else 'vary'} with it"
    return label + (" (log scale)" if log else "")


def _panels(names: list, styles: dict[Any, Style]) -> list[tuple[str, list]]:
    """The series split into panels: one panel when at most ``MAX_LINES``; else by kind of policy (ceiling and
    baselines and bounds together when they fit), at most ``PANEL_LINES`` a panel. Each with its title."""
    if len(names) <= MAX_LINES:
        return [("", list(names))]
    kinds: dict[str, list] = {}
    for n in names:
        kinds.setdefault(styles[n].origin or "other", []).append(n)
    chunks = [
        (kind, group[i : i + PANEL_LINES]) for kind, group in kinds.items() for i in range(0, len(group), PANEL_LINES)
    ]
    panels: list[tuple[list[str], list]] = []
    for kind, chunk in chunks:
        if panels and len(panels[-1][1]) + len(chunk) <= PANEL_LINES:
            panels[-1][0].append(kind)
            panels[-1][1].extend(chunk)
        else:
            panels.append(([kind], list(chunk)))
    titles = [_and(list(dict.fromkeys(ORIGIN_WORDS.get(k, "other policies") for k in ks))) for ks, _ in panels]
    out: list[tuple[str, list]] = []
    for title, (_, ns) in zip(titles, panels):
        n, i = titles.count(title), titles[: len(out) + 1].count(title)
        out.append((f"{title} ({i} of {n})" if n > 1 else title, ns))
    return out


def _and(words: list[str]) -> str:
    """ "a, b and c"."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _legend_labels(rows, series: str | None, names: list, styles: dict[Any, Style]) -> dict:
    """Each series' legend entry: its name ("(ceiling)", "(bound)" where no system can deploy it) and, when the
    predictor is zipped with the policies, ``@PREDICTOR``."""
    pred = "predictor.name"
    zipped = series and pred in rows and rows[pred].nunique() > 1 and _determined_by(rows, pred, [series])
    out = {}
    for n in names:
        label = series_label(n, styles[n])
        if zipped:
            label = label.replace(str(n), f"{n}@{rows[rows[series] == n][pred].iloc[0]}", 1)
        out[n] = label
    return out


def _series_styles(rows, series: str | None, single: str) -> tuple[list, dict[Any, Style], dict]:
    """The series (``single`` names the one line when there is no series), their styles and legend entries: a
    policy's fixed style, or a plain one per value of another field."""
    if series is None:
        return [single], {single: Style(PALETTE[1], "o", "-")}, {single: single}
    if series != POLICY:
        names = list(dict.fromkeys(rows[series]))
        return names, plain_styles(names), {n: str(n) for n in names}
    names = sorted(rows[series].unique(), key=origin_rank)
    styles = policy_styles(names)
    return names, styles, _legend_labels(rows, series, names, styles)


def throughput_figure(view: PlotView, series: str | None, header: str, single: str = "every point"):
    """The throughput plot of ``view`` as a matplotlib Figure: mean throughput at each value of the axis, one line
    per ``series`` value in its fixed style (one line named ``single`` when there is no series), legends outside
    the data, panels past ``MAX_LINES`` lines."""
    import matplotlib.pyplot as plt
    import pandas as pd

    rows, axis = view.rows, view.axis
    names, styles, labels = _series_styles(rows, series, single)
    panels = _panels(names, styles)
    ncols = 1 if len(panels) == 1 else 2
    nrows = -(-len(panels) // ncols)
    width = 7.6 if ncols == 1 else 15.0
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 3.6 * nrows + 0.9), sharex=True, sharey=True, squeeze=False)
    refs = [n for n in panels[0][1] if styles[n].origin == "ceiling" or n == "on-demand"] if len(panels) > 1 else []
    xs = sorted(rows[axis].dropna().unique())
    numeric = _numeric(pd.Series(xs, dtype=object))
    xlog = bool(numeric and len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 16)
    metric = view.metric
    ys = (float(rows[metric].min()), float(rows[metric].max()))
    for ax, (title, group) in zip(axes.flat, panels):
        for n in [r for r in refs if r not in group]:  # the ceiling and the baseline in every panel, in grey
            ref = Style("0.65", "", styles[n].linestyle)
            _line(ax, rows, series, axis, n, ref, f"{n} (reference)", lw=1.0, metric=metric)
        for n in group:
            _line(ax, rows, series, axis, n, styles[n], labels[n], metric=metric)
        if title:
            ax.set_title(title, fontsize=8.5)
        _axes_format(ax, xs if numeric else [], xlog, view.log_scale, ys)  # text: one tick per value
        legend_outside(ax)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1, :]:
        ax.set_xlabel(wrap(axis_label(axis, view.along, xlog), 5.5, 8.5), fontsize=8.5)
    for ax in axes[:, 0]:
        ax.set_ylabel(PLOTTED[metric][1] + (", log scale" if view.log_scale else ""), fontsize=8.5)
    one = "each point one capacity search" if view.metric == CAPACITY_COLUMN else "each point one run"
    words = "; ".join(w for w in (view.title, "" if "mean over" in view.title else one) if w)
    fig.suptitle(wrap("\n".join(w for w in (header, words) if w), width, TITLE_FONT), fontsize=TITLE_FONT)
    fig.tight_layout()
    return fig


def _line(
    ax, rows, series, axis: str, name, style: Style, label: str, lw: float = 1.6, metric: str = THROUGHPUT_COLUMN
) -> None:
    """One series' mean ``metric`` (throughput) against ``axis``."""
    g = rows if series is None else rows[rows[series] == name]
    g = g.groupby(axis, as_index=False)[metric].mean().sort_values(axis)
    ax.plot(
        g[axis],
        g[metric],
        color=style.color,
        marker=style.marker or None,
        linestyle=style.linestyle,
        lw=lw,
        ms=5,
        label=label,
    )


def _axes_format(ax, xs: list, xlog: bool, ylog: bool, ys: tuple[float, float]) -> None:
    """Scales (log ones labelled in plain numbers; ``ys``: the lowest and highest throughput), ticks at the swept
    values where they fit, a light grid."""
    if ylog:
        log_axis(ax, "y", *ys)
    if xlog:
        log_axis(ax, "x", float(min(xs)), float(max(xs)))
    if _ticks_fit(xs, xlog):
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)


def _ticks_fit(xs: list, log: bool, width_in: float = 5.0, fontsize: float = 8.0) -> bool:
    """Whether a tick at each swept value leaves its label room (a label's width under the smallest gap)."""
    import math

    if not 1 < len(xs) <= 12:
        return False
    pos = [math.log(x) if log else float(x) for x in xs]
    span = pos[-1] - pos[0]
    gap = min(b - a for a, b in zip(pos, pos[1:])) / span * width_in
    widest = max(len(f"{x:g}") for x in xs) * fontsize * 0.62 / 72
    return gap > widest + 0.08


def tier_shares(df, series: str):
    """Per ``series`` value, the mean share of expert accesses served by each tier, computed on the host CPU,
    and copied on demand (the rest: hits + misses + host experts = accesses)."""
    import pandas as pd

    cols = [c for c, _, _ in TIERS]
    data = pd.DataFrame({c: pd.to_numeric(df[c], errors="coerce") if c in df else 0.0 for c in cols}, index=df.index)
    shares = data.fillna(0.0).groupby(df[series]).mean()
    shares[MISS[0]] = (1.0 - shares[cols].sum(axis=1)).clip(lower=0.0)
    return shares


def tier_figure(shares, title: str, header: str, policies: bool = True):
    """Where each policy's expert accesses were served, as a Figure: one horizontal stacked bar per policy
    (labels one a row, never colliding), the host CPU's segment when any access was computed there; listed by
    kind of policy, or in the rows' order when ``policies`` is False (the bars are systems, say)."""
    import matplotlib.pyplot as plt

    names = sorted(shares.index, key=origin_rank) if policies else list(shares.index)
    parts = [t for t in (*TIERS, MISS) if shares[t[0]].max() > 0]  # a tier that served nothing is left out
    width = 7.6
    fig, ax = plt.subplots(figsize=(width, 1.6 + 0.32 * len(names)))
    left = [0.0] * len(names)
    for col, words, color in parts:
        vals = [float(shares.loc[n, col]) for n in names]
        ax.barh(range(len(names)), vals, left=left, color=color, label=words, height=0.7)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([str(n) for n in names], fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)  # the first policy on top
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of expert accesses", fontsize=8.5)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    legend_outside(ax)
    words = f"where each expert access was served; {title}"
    fig.suptitle(wrap("\n".join(w for w in (header, words) if w), width, TITLE_FONT), fontsize=TITLE_FONT)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ the files
def make_plots(out: Path, sweep: Sweep, df) -> list[Path]:
    """Throughput against each numeric axis (one line per policy), and hit rate per tier per policy."""
    return [p.path for p in plan_plots(out, sweep, df) if p.drawn]


def make_plots_described(out: Path, sweep: Sweep, df) -> list[tuple[Path, str]]:
    """The plots drawn, each with its one-line description for the report (what it shows, holds fixed, averages
    over, and its scale)."""
    return [(p.path, p.words) for p in plan_plots(out, sweep, df) if p.drawn]


def plan_plots(out: Path, sweep: Sweep, df) -> list[Plot]:
    """Every plot the axes allow, drawn, or not drawn with the reason (an x axis with one value): each with its
    report line. A plot not drawn leaves no file (an earlier one of that name is removed)."""
    if not len(df):
        return []
    import matplotlib

    matplotlib.use("Agg")

    made = []
    series = series_axis(sweep, df)
    for metric in plotted_metrics(sweep):
        if metric not in df:
            continue
        for axis in numeric_axes(sweep, df, series):
            made.append(_throughput_plot(out, sweep, df, axis, series, metric))
    if series:
        title = tier_title(sweep, df, series)
        fig = tier_figure(tier_shares(df, series), title, setting_words(sweep, df), series == POLICY)
        words = f"where expert accesses were served (HPC, MPC, LPC, host CPU, copied on demand), one bar per {series}"
        made.append(Plot(save_png(fig, out / TIER_PLOT), True, f"{words}; {title}"))
    return made


def _throughput_plot(
    out: Path, sweep: Sweep, df, axis: str, series: str | None, metric: str = THROUGHPUT_COLUMN
) -> Plot:
    """The plot of ``metric`` (throughput, or capacity) against ``axis``, or why it is not drawn."""
    path = out / plot_file(axis, metric)
    view = plot_view(sweep, df, axis, series, metric)
    values = view.rows[axis].dropna().unique() if axis in view.rows else []
    if len(values) < 2:
        if path.is_file() and not path.is_symlink():
            path.unlink()  # a plot from an earlier run of this folder would contradict the report
        shown = f" ({values[0]})" if len(values) else ""
        return Plot(
            path,
            False,
            f"not drawn: {axis} takes one value{shown} among the ok rows it would show"
            f"{' (' + view.title + ')' if view.title else ''}, so there is no line to draw",
        )
    single = "every point"
    if series is None:  # one line: named by the policy the points run
        cfg = _config(sweep, view.rows["point"].iloc[0] if "point" in view.rows else None)
        single = cfg.policy.name if cfg is not None else single
    header = setting_words(sweep, view.rows)
    if metric == CAPACITY_COLUMN:  # the SLO the capacity is found for
        header = "; ".join(w for w in (header, slo_words(getattr(sweep, "capacity", None))) if w)
    fig = throughput_figure(view, series, header, single)
    scale = "log" if view.log_scale else "linear"
    what = f"{PLOTTED[metric][2]} against {axis}" + (f", one line per {series}" if series else "")
    return Plot(save_png(fig, path), True, f"{what}; {view.title or 'every point'}; {scale} scale")


__all__ = [
    "AXIS_LABELS",
    "PlotView",
    "Plot",
    "TIER_PLOT",
    "make_plots",
    "make_plots_described",
    "numeric_axes",
    "plan_plots",
    "plot_file",
    "plot_view",
    "plotted_metrics",
    "series_axis",
    "setting_words",
    "throughput_figure",
    "tier_figure",
    "tier_shares",
    "tier_title",
]
