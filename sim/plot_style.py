"""How the project's plots look, so that a reader can tell every series apart and read every label: one fixed
style (colour, marker, line style) per policy, the same in every figure; legends outside the data; titles wrapped,
never cut; PNGs written atomically with whatever lies outside the axes (legends, titles) included.

Used by the sweep's plots (``sim/sweep/plots.py``) and the validator's ``compare.png`` (``validate/compare_plot.py``).
Matplotlib is imported by the callers (with the ``Agg`` backend) before they use these helpers."""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass
from pathlib import Path

from moebase.errors import one_line
from traces.io import atomic_write_bytes

#: 20 colours, handed to the registered policies in their order by kind (``origin_rank``), so that the policies
#: listed together (one panel holds at most 6) get colours far apart: the ceiling black, then matplotlib's
#: ``tab10`` hues, then darker ones; grey is left for reference lines and misses
PALETTE = (
    "#000000",
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#0b3d91",
    "#8b0000",
    "#006400",
    "#b8860b",
    "#4b0082",
    "#ff1493",
    "#008b8b",
    "#e6550d",
    "#1b9e77",
    "#7570b3",
)
#: markers that differ in shape (13: a prime, so that colour and marker repeat together only after 260 series)
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">", "p", "d")
#: the line style says what kind of policy a line is: a bound or ceiling (not deployable) is dashed, a baseline
#: that caches nothing dotted, a published or our policy solid
ORIGIN_LINESTYLE = {"ceiling": "--", "bound": "--", "baseline": ":", "published": "-", "ours": "-"}
#: the order in which kinds of policy are listed (legends, bars, panels)
ORIGIN_ORDER = ("ceiling", "baseline", "bound", "published", "ours")
#: plain words for each kind, for legends and panel titles
ORIGIN_WORDS = {
    "ceiling": "ceiling",
    "baseline": "baselines",
    "bound": "bounds",
    "published": "published policies",
    "ours": "ours",
}
LINESTYLES = ("-", "--", ":", "-.")  # for series that are not registered policies
TITLE_CHARS = 600  # a title is bounded (an axis value may be any text)
DPI = 110


@dataclass(frozen=True)
class Style:
    """How one series is drawn: its colour, marker and line style, and its kind (a policy's origin, or None)."""

    color: str
    marker: str
    linestyle: str
    origin: str | None = None


def _registered() -> list[tuple[str, str | None]]:
    """Every registered policy and its origin, by kind (``ORIGIN_ORDER``), then by name."""
    from sim.policies import POLICIES

    pairs = [(name, POLICIES.get(name).origin) for name in POLICIES.names()]
    return sorted(pairs, key=lambda p: (_kind_rank(p[1]), p[0]))


def _kind_rank(origin: str | None) -> int:
    return ORIGIN_ORDER.index(origin) if origin in ORIGIN_ORDER else len(ORIGIN_ORDER)


def policy_styles(names) -> dict[str, Style]:
    """A style for each of ``names``: a registered policy always gets the same one, whichever policies a figure
    shows (its place among the registered policies listed by kind fixes its colour and marker, its origin its
    line style); any other name gets the next free colour and marker. Colour and marker together differ for
    every pair of names."""
    registered = _registered()
    index = {name: i for i, (name, _) in enumerate(registered)}
    origin = dict(registered)
    extra = sorted({str(n) for n in names} - set(index))
    index.update({name: len(registered) + i for i, name in enumerate(extra)})
    out = {}
    for name in names:
        i = index[str(name)]
        kind = origin.get(str(name))
        line = ORIGIN_LINESTYLE.get(kind or "", LINESTYLES[(i // len(PALETTE)) % len(LINESTYLES)])
        out[name] = Style(PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)], line, kind)
    return out


def plain_styles(names) -> dict:
    """A style for each of ``names`` that are not policies (systems, hardware, traces...), in their order: colour
    and marker together differ for every pair, all drawn solid."""
    return {n: Style(PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)], "-") for i, n in enumerate(names)}


def origin_rank(name: str) -> tuple[int, str]:
    """Sort key that lists policies by kind (ceiling, baselines, bounds, published, ours, others), then by name."""
    return (_kind_rank(dict(_registered()).get(str(name))), str(name))


def series_label(name: str, style: Style) -> str:
    """A legend entry: the name, with "(ceiling)" or "(bound)" for a policy that no system can deploy."""
    return f"{name} ({style.origin})" if style.origin in ("ceiling", "bound") else str(name)


def wrap(text: str, width_in: float, fontsize: float) -> str:
    """``text`` (bounded to one line of ``TITLE_CHARS``, then split at its own line breaks) wrapped to fit
    ``width_in`` inches at ``fontsize`` points, so that a title is never cut at the figure's edge."""
    chars = max(int(width_in * 72 / (fontsize * 0.55)), 20)
    lines = [one_line(part, TITLE_CHARS) for part in str(text).split("\n")]
    return "\n".join(textwrap.fill(line, chars) for line in lines if line)


def legend_outside(ax, fontsize: float = 7, **kw):
    """The axes' legend to the right of its data area, never over it."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=fontsize, **kw)


def log_axis(ax, which: str, lo: float, hi: float) -> None:
    """Make the ``which`` ("x" or "y") axis of ``ax``, showing ``lo`` to ``hi``, logarithmic, labelled in plain
    numbers ("20", "50", "100") at 1, 2 and 5 times each power of ten over 1.5 decades or less, 1 and 3 over 3
    decades or less, the powers alone beyond (so that labels keep apart), none on its minor ticks."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0, 2.0, 5.0) if decades <= 1.5 else (1.0, 3.0) if decades <= 3 else (1.0,)
    getattr(ax, f"set_{which}scale")("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def save_png(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` atomically, its legends and titles outside the axes included, and close
    it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


__all__ = [
    "MARKERS",
    "ORIGIN_LINESTYLE",
    "PALETTE",
    "Style",
    "legend_outside",
    "log_axis",
    "origin_rank",
    "plain_styles",
    "policy_styles",
    "save_png",
    "series_label",
    "wrap",
]
