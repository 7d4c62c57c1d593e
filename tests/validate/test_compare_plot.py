"""``compare.png`` of ``validate compare`` can be read: no configuration names written over the points, one row
per configuration in the error bars (labels that cannot collide), legends outside the data, and a title that names
the suite, the whole device and the date, wrapped to the figure rather than cut."""

from __future__ import annotations

import csv
import json

import matplotlib.pyplot as plt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.figures import colliding, drawn, legends_off_the_data, overlap, tick_labels
from tests.support.fuzz import PLAIN_NAME_CHARS, fuzz_settings
from tests.support.paths import ROOT
from validate.compare_plot import compare_figure, plot

FOLDER = ROOT / "docs" / "validation" / "cpu-vm-2026-11-30-f"  # a committed report: its csv and manifest


def _committed() -> tuple[list[dict], dict]:
    def num(v: str):
        try:
            return float(v)
        except ValueError:
            return v

    rows = [{k: num(v) for k, v in r.items()} for r in csv.DictReader((FOLDER / "compare.csv").open())]
    return rows, json.loads((FOLDER / "manifest.json").read_text())


def _row(name: str, real: float, sim: float) -> dict:
    err = 100 * (sim - real) / real
    return {"config": name, "real_mean_ms": real, "sim_mean_ms": sim, "err_mean_pct": err, "err_tok_s_pct": -err}


def _readable(fig) -> None:
    """The checks every compare figure passes."""
    renderer = drawn(fig)
    scatter, bars = fig.axes[:2]
    assert not scatter.texts  # no names beside the points
    assert legends_off_the_data(fig, renderer) == []
    for ax, which in ((bars, "y"), (bars, "x"), (scatter, "x"), (scatter, "y")):
        assert colliding(tick_labels(ax, which), renderer) == [], which
    assert colliding(scatter.get_legend().get_texts(), renderer) == []
    title = fig._suptitle.get_window_extent(renderer)
    assert title.x0 >= 0 and title.x1 <= fig.bbox.width  # wrapped inside the figure, never cut at its edge
    for ax in (scatter, bars):
        assert not overlap(title, ax.get_window_extent(renderer))


def test_the_committed_measurement_plots_readably():
    rows, manifest = _committed()
    fig = compare_figure(rows, manifest)
    try:
        _readable(fig)
        title = fig._suptitle.get_text().replace("\n", " ")
        assert manifest["device"] in title and manifest["date"] in title and "cpu suite" in title
        assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == manifest["configs"]
        assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()][2:] == manifest["configs"]
    finally:
        plt.close(fig)


@fuzz_settings(12)
@given(
    st.lists(st.text(PLAIN_NAME_CHARS, min_size=1, max_size=40), min_size=1, max_size=24, unique=True),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=300),
    st.floats(0.05, 5000),
)
def test_any_names_and_latencies_plot_readably(names, device, scale):
    rows = [_row(n, scale * (1 + i), scale * (1 + i) * (0.9 + 0.01 * (i % 20))) for i, n in enumerate(names)]
    fig = compare_figure(rows, {"suite": "cpu", "device": device, "date": "2026-12-01"})
    try:
        _readable(fig)
    finally:
        plt.close(fig)


def test_latencies_over_decades_get_log_axes_with_plain_labels_apart():
    rows = [_row(f"c{i}", 0.5 * 3**i, 0.55 * 3**i) for i in range(8)]  # 0.5 to 1,093 ms
    fig = compare_figure(rows, {"suite": "gpu", "device": "NVIDIA H200", "date": "d"})
    try:
        _readable(fig)
        scatter = fig.axes[0]
        assert scatter.get_xscale() == scatter.get_yscale() == "log"
        assert "log scale" in scatter.get_xlabel()
        assert all("10^" not in t.get_text() and "times" not in t.get_text() for t in tick_labels(scatter, "x"))
    finally:
        plt.close(fig)


def test_plot_writes_a_png(tmp_path):
    rows, manifest = _committed()
    path = plot(rows, manifest, tmp_path / "compare.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert not plt.get_fignums()  # the figure was closed


@pytest.mark.parametrize("n", [1, 12])
def test_the_error_bars_hold_one_row_per_configuration(n):
    rows = [_row(f"config-{i}", 10.0 + i, 11.0 + i) for i in range(n)]
    fig = compare_figure(rows, {"suite": "gpu", "device": "NVIDIA H200", "date": "d"})
    try:
        bars = fig.axes[1]
        assert len(bars.get_yticks()) == n
        widths = sorted(round(b.get_width(), 6) for c in bars.containers for b in c)
        assert widths == sorted(round(v, 6) for r in rows for v in (r["err_mean_pct"], r["err_tok_s_pct"]))
    finally:
        plt.close(fig)
