"""``compare.png`` of ``validate compare``: the simulator against the real runs, readable without the table.

Left: each configuration's simulated against its real mean decode-iteration latency, inside a +-15% band around
sim = real, each configuration with its own colour and marker (a legend below the axes, never over the points;
names are not written beside the points, where they would collide). Right: each configuration's signed error of
mean latency and of throughput, as horizontal bars, one configuration a row (its name on its own line). The title
names the suite, the device, the date and the median errors, wrapped, never cut."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moebase.errors import one_line
from sim.plot_style import legend_outside, log_axis, plain_styles, save_png, wrap

BAND = 0.15  # the band drawn around sim = real
PLOT_LABEL_CHARS = 240  # a manifest string (suite, device, date) in the title, wrapped
NAME_CHARS = 60  # a configuration's name on the plot
TITLE_FONT = 9.0
WIDTH_IN = 13.0


def _text(value, limit: int) -> str:
    """A manifest string as the plot shows it: one line of at most ``limit`` characters ("unknown" for none)."""
    return "unknown" if value is None else one_line(value, limit)


def title(rows: list[dict], manifest: dict) -> str:
    """The plot's title: what is compared, on which suite, device and date, and the median errors."""
    med = [float(np.median([abs(r[k]) for r in rows])) for k in ("err_mean_pct", "err_tok_s_pct")]
    return (
        f"Simulator against real runs: {_text(manifest.get('suite'), PLOT_LABEL_CHARS)} suite on "
        f"{_text(manifest.get('device'), PLOT_LABEL_CHARS)}, measured {_text(manifest.get('date'), 80)}\n"
        f"{len(rows)} configurations, each its mean decode-iteration latency; error = (sim - real) / real; median "
        f"|error| {med[0]:.1f}% (mean latency), {med[1]:.1f}% (throughput)"
    )


def compare_figure(rows: list[dict], manifest: dict):
    """The figure of ``compare.png`` (a matplotlib Figure; rows as ``compare_run`` returns them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [one_line(r["config"], NAME_CHARS) for r in rows]
    height = min(max(5.0, 1.8 + 0.34 * len(rows)), 60.0)
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(WIDTH_IN, height), gridspec_kw={"width_ratios": [1.0, 1.0]}, layout="constrained"
    )
    _scatter(ax, rows, names)
    _errors(bx, rows, names)
    fig.suptitle(wrap(title(rows, manifest), WIDTH_IN, TITLE_FONT), fontsize=TITLE_FONT)
    return fig


def _scatter(ax, rows: list[dict], names: list[str]) -> None:
    """Simulated against real mean latency, a style per configuration, the band and the identity line."""
    real = np.array([r["real_mean_ms"] for r in rows], dtype=float)
    sim = np.array([r["sim_mean_ms"] for r in rows], dtype=float)
    lo, hi = min(real.min(), sim.min()) * 0.8, max(real.max(), sim.max()) * 1.2
    log = bool(lo > 0 and hi / lo > 20)
    xs = np.geomspace(lo, hi, 50) if log else np.linspace(lo, hi, 50)
    ax.fill_between(xs, xs * (1 - BAND), xs * (1 + BAND), color="0.9", label=f"±{BAND:.0%} of real")
    ax.plot(xs, xs, color="0.4", lw=1, label="sim = real")
    styles = plain_styles(range(len(rows)))
    for i, name in enumerate(names):
        s = styles[i]
        ax.scatter(real[i], sim[i], color=s.color, marker=s.marker, s=40, zorder=3, label=name)
    if log:
        log_axis(ax, "x", lo, hi)
        log_axis(ax, "y", lo, hi)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal", adjustable="box")
    scale = ", log scale" if log else ""
    ax.set_xlabel(f"real mean iteration latency (ms{scale})", fontsize=8.5)
    ax.set_ylabel(f"simulated mean iteration latency (ms{scale})", fontsize=8.5)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7, borderaxespad=0.0)


def _errors(bx, rows: list[dict], names: list[str]) -> None:
    """Each configuration's error of mean latency and of throughput, horizontal bars, one configuration a row."""
    y = np.arange(len(rows))
    bx.barh(y - 0.2, [r["err_mean_pct"] for r in rows], 0.4, color="0.25", label="mean latency")
    bx.barh(y + 0.2, [r["err_tok_s_pct"] for r in rows], 0.4, color="0.65", label="throughput")
    bx.axvline(0, color="0.3", lw=0.8)
    for edge in (-100 * BAND, 100 * BAND):
        bx.axvline(edge, color="0.6", lw=0.8, linestyle=":")
    bx.set_yticks(y)
    bx.set_yticklabels(names, fontsize=7.5)
    bx.set_ylim(len(rows) - 0.5, -0.5)  # the manifest's first configuration on top
    bx.set_xlabel(f"simulator error (%), dotted: ±{100 * BAND:.0f}%", fontsize=8.5)
    bx.tick_params(axis="x", labelsize=8)
    bx.grid(axis="x", alpha=0.3)
    legend_outside(bx)


def plot(rows: list[dict], manifest: dict, path: Path) -> Path:
    """Write ``compare.png`` (atomically) at ``path``."""
    return save_png(compare_figure(rows, manifest), path)


__all__ = ["compare_figure", "plot", "title"]
