"""Geometry of drawn matplotlib figures, for the tests of the project's plots: where legends, labels and titles
land once the figure is drawn (in display pixels)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")


def drawn(fig):
    """Draw ``fig`` (so every text has its place) and return its renderer."""
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def overlap(a, b, pad: float = 0.0) -> bool:
    """Whether two display boxes overlap (by more than ``pad`` pixels each way)."""
    return a.x0 + pad < b.x1 and b.x0 + pad < a.x1 and a.y0 + pad < b.y1 and b.y0 + pad < a.y1


def colliding(texts, renderer) -> list[tuple[str, str]]:
    """The pairs of visible, non-empty texts among ``texts`` whose boxes overlap."""
    shown = [t for t in texts if t.get_visible() and t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in shown]
    return [
        (shown[i].get_text(), shown[j].get_text())
        for i in range(len(shown))
        for j in range(i + 1, len(shown))
        if overlap(boxes[i], boxes[j])
    ]


def visible_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


def legends_off_the_data(fig, renderer) -> list[str]:
    """For each visible axes' legend, the axes (any of the figure's) whose data area it overlaps: [] when every
    legend lies outside every data area."""
    bad = []
    for ax in visible_axes(fig):
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        bad += [
            f"legend of axes {fig.axes.index(ax)} over axes {fig.axes.index(o)}"
            for o in visible_axes(fig)
            if overlap(box, o.get_window_extent(renderer))
        ]
    return bad


def tick_labels(ax, which: str) -> list:
    """The tick labels of one axis (``x`` or ``y``) that are shown."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    return [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
