"""The sweep's plots can be trusted by a reader: every policy keeps a style of its own (colour, marker, line style)
across the full registry, legends sit outside the data, titles name the model, the hardware and the batch and what
each point averages, labels do not collide, an x axis with one value draws nothing (and the report says why), the
tier plot shows the experts served on the host, and an axis zipped with the x axis is not held at one value."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.plot_style import PALETTE, policy_styles
from sim.policies import POLICIES
from sim.sweep.plots import (
    MAX_LINES,
    TIER_PLOT,
    plan_plots,
    plot_file,
    plot_view,
    setting_words,
    throughput_figure,
    tier_figure,
    tier_shares,
)
from sim.sweep.report import write_report
from sim.sweep.spec import load_sweep
from tests.support.figures import colliding, drawn, legends_off_the_data, tick_labels
from tests.support.fuzz import fuzz_settings
from tests.support.paths import ROOT

ALL = POLICIES.names()
AXES = ["policy.name", "workload.batch_size", "cache.hpc_slots", "cache.mpc_slots"]


def _rows(policies=ALL, batches=(1, 8), caches=((0, 2), (2, 6), (4, 9)), cpu=0.0) -> pd.DataFrame:
    """One ok row per (policy, batch, cache size), throughput differing per point and policy."""
    rows = []
    for k, p in enumerate(policies):
        for b in batches:
            for i, (h, m) in enumerate(caches):
                rows.append(
                    {
                        "point": f"p{k}-{b}-{i}",
                        "policy.name": p,
                        "workload.batch_size": b,
                        "cache.hpc_slots": h,
                        "cache.mpc_slots": m,
                        "cache_slots": h + m,
                        "status": "ok",
                        "throughput_tok_s": 10.0 * b + 3 * i + k,
                        "hit_rate_hpc": 0.1,
                        "hit_rate_mpc": 0.2,
                        "hit_rate_lpc": 0.1,
                        "cpu_expert_frac": cpu if p in ("fiddler", "ktransformers", "hybrid-cache") else 0.0,
                    }
                )
    return pd.DataFrame(rows)


def _sweep(axes=AXES):
    return SimpleNamespace(axes=list(axes), plots=None, points=[])


def _policy_lines(fig) -> dict[str, tuple]:
    """policy -> (colour, marker, line style) of its line, over every panel; a policy drawn twice differently
    fails."""
    out: dict[str, tuple] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            label = line.get_label()
            if label.startswith("_") or label.endswith("(reference)"):
                continue
            name = label.split(" (")[0].split("@")[0]
            style = (line.get_color(), line.get_marker(), line.get_linestyle())
            assert out.setdefault(name, style) == style, name
    return out


# ------------------------------------------------------------------------------------------------ styles
def test_every_registered_policy_has_its_own_colour_marker_and_line_style():
    styles = policy_styles(ALL)
    triples = [(s.color, s.marker, s.linestyle) for s in styles.values()]
    assert len(set(triples)) == len(ALL)
    assert len({s.color for s in styles.values()}) == min(len(ALL), len(PALETTE))  # colour alone, too
    assert styles["gpu-only"].linestyle == styles["belady"].linestyle == "--"  # the bounds read as bounds


@fuzz_settings(40)
@given(st.lists(st.sampled_from(ALL), min_size=1, unique=True), st.lists(st.text("abc-", min_size=1), max_size=5))
def test_a_policy_looks_the_same_in_every_figure(subset, others):
    full = policy_styles(ALL)
    mine = policy_styles(subset + [o for o in others if o not in ALL])
    assert all(mine[p] == full[p] for p in subset)
    assert len({(s.color, s.marker) for s in mine.values()}) == len(mine)


# ------------------------------------------------------------------------------------------------ throughput
@pytest.mark.parametrize("axis", ["cache_slots", "workload.batch_size"])
def test_the_full_policy_list_is_drawn_with_distinct_styles_and_legends_off_the_data(axis):
    df = _rows()
    view = plot_view(_sweep(), df, axis, "policy.name")
    fig = throughput_figure(view, "policy.name", "gpt-oss-20b on h200")
    try:
        renderer = drawn(fig)
        lines = _policy_lines(fig)
        assert set(lines) == set(ALL)
        assert len(set(lines.values())) == len(ALL)
        panels = [ax for ax in fig.axes if ax.get_visible()]
        assert len(panels) > 1  # past MAX_LINES: small multiples
        for ax in panels:
            assert len([x for x in ax.get_lines() if "(reference)" not in x.get_label()]) <= MAX_LINES
        assert legends_off_the_data(fig, renderer) == []
        for ax in panels:
            assert colliding(tick_labels(ax, "x"), renderer) == []
            assert colliding(ax.get_legend().get_texts(), renderer) == []
        assert "throughput (tok/s" in panels[0].get_ylabel()
        assert "per cached layer" in panels[-1].get_xlabel() or "batch size" in panels[-1].get_xlabel()
    finally:
        plt.close(fig)


def test_a_few_policies_share_one_axes_with_the_legend_beside_it():
    df = _rows(policies=["lru", "on-demand", "belady"])
    view = plot_view(_sweep(), df, "cache_slots", "policy.name")
    fig = throughput_figure(view, "policy.name", "")
    try:
        renderer = drawn(fig)
        assert len([ax for ax in fig.axes if ax.get_visible()]) == 1
        assert legends_off_the_data(fig, renderer) == []
        assert set(_policy_lines(fig)) == {"lru", "on-demand", "belady"}
        assert "slots per cached layer" in fig.axes[0].get_xlabel()
    finally:
        plt.close(fig)


def test_throughput_over_decades_gets_a_log_axis_with_labels_apart():
    df = _rows(policies=["gpu-only", "on-demand", "lru"], batches=(1, 4, 16, 64, 256))
    df["throughput_tok_s"] = df["throughput_tok_s"] * df["workload.batch_size"] ** 2
    view = plot_view(_sweep(), df, "workload.batch_size", "policy.name")
    assert view.log_scale
    fig = throughput_figure(view, "policy.name", "")
    try:
        renderer = drawn(fig)
        ax = fig.axes[0]
        assert ax.get_yscale() == "log" and ax.get_xscale() == "log"  # batch 1 to 256: a log x axis too
        for which in ("x", "y"):
            labels = tick_labels(ax, which)
            assert len(labels) >= 2 and colliding(labels, renderer) == []
            assert all("10^" not in t.get_text() for t in labels)
        assert [t.get_text() for t in tick_labels(ax, "x")] == ["1", "4", "16", "64", "256"]
    finally:
        plt.close(fig)


def test_a_text_axis_chosen_as_x_axis_plots_one_tick_per_value(tmp_path):
    df = pd.concat([_rows(policies=["lru", "fiddler"]).assign(system=s) for s in ("llama-cpp", "fiddler")])
    sweep = SimpleNamespace(axes=[*AXES, "system"], plots=["system"], points=[])
    (plot,) = [p for p in plan_plots(tmp_path, sweep, df) if p.path.name != TIER_PLOT]
    assert plot.drawn and plot.path.is_file()
    fig = throughput_figure(plot_view(sweep, df, "system", "policy.name"), "policy.name", "")
    try:
        renderer = drawn(fig)
        assert sorted(t.get_text() for t in tick_labels(fig.axes[0], "x")) == ["fiddler", "llama-cpp"]
        assert colliding(tick_labels(fig.axes[0], "x"), renderer) == []
    finally:
        plt.close(fig)


def test_the_title_names_model_hardware_batch_and_what_is_averaged(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"base: {ROOT / 'configs' / 'gpt_oss_20b.yaml'}\n"
        "set: {workload.batch_size: 4}\n"
        "grid: {policy.name: [lru, on-demand]}\n"
        "zip: {cache.hpc_slots: [0, 2], cache.mpc_slots: [2, 6]}\n"
    )
    sweep = load_sweep(spec)
    df = pd.DataFrame(
        [
            {
                **p.fields,
                "point": p.id,
                "cache_slots": p.fields["cache.hpc_slots"] + p.fields["cache.mpc_slots"],
                "throughput_tok_s": 1.0 + i,
                "status": "ok",
            }
            for i, p in enumerate(sweep.points)
        ]
    )
    assert setting_words(sweep, df) == "gpt-oss-20b on h200, batch 4, predictor transition"
    plots = plan_plots(tmp_path, sweep, df)
    assert [p.path.name for p in plots] == [plot_file("cache_slots"), TIER_PLOT] and all(p.drawn for p in plots)
    view = plot_view(sweep, df, "cache_slots", "policy.name")
    fig = throughput_figure(view, "policy.name", setting_words(sweep, view.rows))
    try:
        title = fig._suptitle.get_text()
        assert all(w in title for w in ("gpt-oss-20b", "h200", "batch 4", "each point one run")), title
    finally:
        plt.close(fig)
    averaged = plot_view(_sweep(), _rows(policies=["lru"]), "workload.batch_size", "policy.name")
    fig = throughput_figure(averaged, "policy.name", "m on hw")
    try:
        assert "mean over 3 cache sizes" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------------------------ one value
def test_an_axis_with_one_value_draws_no_plot_and_the_report_says_why(tmp_path):
    df = _rows(policies=["lru", "on-demand"], batches=(1,))
    sweep = SimpleNamespace(axes=AXES, plots=["workload.batch_size", "cache_slots"], points=[], name="t", source="t")
    stale = tmp_path / plot_file("workload.batch_size")
    stale.write_bytes(b"an earlier run's plot")
    plots = {p.path.name: p for p in plan_plots(tmp_path, sweep, df)}
    batch = plots[plot_file("workload.batch_size")]
    assert not batch.drawn and "not drawn" in batch.words and "one value (1)" in batch.words
    assert not stale.exists()  # no plot left that the report would contradict
    assert plots[plot_file("cache_slots")].drawn and (tmp_path / plot_file("cache_slots")).is_file()
    write_report(tmp_path, sweep, df.assign(error=None, iteration_ms_mean=1.0, hit_rate=0.4, pcie_bytes=1e9), {})
    report = (tmp_path / "report.md").read_text()
    assert f"- `{plot_file('workload.batch_size')}`: not drawn: workload.batch_size takes one value" in report
    assert f"]({plot_file('workload.batch_size')})" not in report and f"]({plot_file('cache_slots')})" in report


# ------------------------------------------------------------------------------------------------ cpu_layers
@pytest.mark.parametrize("layers", [[32, 24, 16, 12], [12, 16, 24, 32]])
def test_an_axis_zipped_with_the_cache_is_not_held_at_one_value(layers):
    """cpu_layers zipped with cache.shared_slots (llama.cpp's --n-cpu-moe with the room its GPU layers need): the
    cache_slots plot once held cpu_layers at its first value and drew one point (at x=0 when it was 32)."""
    rows = [
        {
            "policy.name": "ktransformers",
            "policy.params.cpu_layers": n,
            "cache.shared_slots": 8 * (32 - n),
            "cache_slots": 8 * (32 - n) / 32,
            "throughput_tok_s": 100.0 - n,
        }
        for n in layers
    ]
    df = pd.DataFrame(rows)
    sweep = _sweep(["policy.name", "policy.params.cpu_layers", "cache.shared_slots"])
    view = plot_view(sweep, df, "cache_slots", "policy.name")
    assert len(view.rows) == len(layers) and view.rows["cache_slots"].nunique() == len(layers)
    assert view.along == ("policy.params.cpu_layers",)
    fig = throughput_figure(view, "policy.name", "")
    try:
        assert "policy.params.cpu_layers varies with it" in fig.axes[0].get_xlabel().replace("\n", " ")
        assert len(fig.axes[0].get_lines()[0].get_xdata()) == len(layers)
    finally:
        plt.close(fig)
    own = plot_view(sweep, df, "policy.params.cpu_layers", "policy.name")
    assert len(own.rows) == len(layers) and own.title == ""


def test_without_a_policy_axis_a_text_axis_makes_the_lines(tmp_path):
    df = pd.DataFrame(
        [
            {"system": s, "policy.params.cpu_layers": n, "throughput_tok_s": 10.0 * n + len(s), "point": f"{s}{n}"}
            for s in ("llama-cpp", "ktransformers")
            for n in (0, 8, 16)
        ]
    )
    sweep = _sweep(["system", "policy.params.cpu_layers"])
    words = [p.words for p in plan_plots(tmp_path, sweep, df)]
    assert words[0] == "throughput against policy.params.cpu_layers, one line per system; every point; linear scale"
    assert words[1].endswith("one bar per system; mean over 3 values of policy.params.cpu_layers")


# ------------------------------------------------------------------------------------------------ tiers
def test_the_tier_plot_has_a_host_segment_when_experts_were_served_on_the_host():
    shares = tier_shares(_rows(cpu=0.4), "policy.name")
    assert shares.loc["ktransformers", "cpu_expert_frac"] == pytest.approx(0.4)
    assert shares.loc["ktransformers", "miss"] == pytest.approx(0.2)
    assert shares.loc["lru", "miss"] == pytest.approx(0.6)
    fig = tier_figure(shares, "mean over 3 cache sizes", "gpt-oss-20b on h200")
    try:
        renderer = drawn(fig)
        ax = fig.axes[0]
        segments = {c.get_label(): [b.get_width() for b in c] for c in ax.containers}
        host = segments["computed on the host CPU"]
        names = [t.get_text() for t in ax.get_yticklabels()]
        assert len(names) == len(ALL)
        assert host[names.index("ktransformers")] == pytest.approx(0.4) and host[names.index("lru")] == 0
        assert colliding(tick_labels(ax, "y"), renderer) == []
        assert legends_off_the_data(fig, renderer) == []
        assert "mean over 3 cache sizes" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    none = tier_figure(tier_shares(_rows(policies=["lru"]), "policy.name"), "t", "")
    try:
        assert "computed on the host CPU" not in {c.get_label() for c in none.axes[0].containers}
    finally:
        plt.close(none)


def test_the_collision_check_sees_labels_that_collide():
    """The checks above can fail: 20 long labels side by side on a narrow axis overlap, and are found."""
    fig, ax = plt.subplots(figsize=(4, 3))
    try:
        ax.bar(range(len(ALL)), 1.0)
        ax.set_xticks(range(len(ALL)))
        ax.set_xticklabels(ALL)
        ax.legend(["bars"], loc="center")
        renderer = drawn(fig)
        assert colliding(tick_labels(ax, "x"), renderer)
        assert legends_off_the_data(fig, renderer)
    finally:
        plt.close(fig)
