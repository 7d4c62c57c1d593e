"""`sim compare` and our policy `diffmoe-arc`."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.cache import MPC
from tests.support.cli import run_module
from tests.support.engine import tiny_model
from tests.support.policies import policy_for, run_decisions
from tests.support.traces import make_trace, random_trace
from traces.io import save_trace


def test_compare_writes_csv_and_markdown_with_ratios_and_the_belady_bound(tmp_path):
    out = tmp_path / "cmp"
    res = run_module(
        "sim",
        "compare",
        "configs/switch_xxl.yaml",
        "--policies",
        "gpu-only,on-demand,lru@none,diffmoe",
        "--set",
        "workload.requests=16",
        "--set",
        "workload.max_decode_tokens=16",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader((out / "compare.csv").open()))
    by = {r["policy"]: r for r in rows}
    assert [r["policy"] for r in rows] == ["gpu-only", "on-demand", "lru", "diffmoe"]
    assert float(by["on-demand"]["ratio_vs_baseline"]) == 1.0
    assert by["lru"]["predictor"] == "none" and by["diffmoe"]["predictor"] == "oracle"
    # Switch-XXL's 773 GB of experts do not fit one H200: no ceiling figure, the others run
    assert by["gpu-only"]["status"].startswith("does not fit (") and by["gpu-only"]["status"].endswith(" GB > 141 GB)")
    assert by["gpu-only"]["throughput_tok_s"] == "" and by["gpu-only"]["uses_predictor"] == "False"
    assert all(by[p]["status"] == "ok" for p in ("on-demand", "lru", "diffmoe"))
    tput = {p: float(r["throughput_tok_s"]) for p, r in by.items() if p != "gpu-only"}
    for p in ("lru", "diffmoe"):  # no policy beats the offline optimum in cache hits at equal slots
        assert float(by[p]["belady_cache_hit_rate"]) >= float(by[p]["cache_hit_rate"]) - 1e-12
        assert abs(float(by[p]["ratio_vs_baseline"]) - tput[p] / tput["on-demand"]) < 1e-4
    md = (out / "compare.md").read_text()
    assert "| lru | none |" in md and "x on-demand" in md


def test_compare_rejects_unknown_names_before_running(tmp_path):
    out = tmp_path / "cmp"
    for policies, word in (("lru,clairvoyant", "clairvoyant"), ("lru@psychic", "psychic")):
        res = run_module("sim", "compare", "configs/switch_xxl.yaml", "--policies", policies, "--out", out)
        assert res.returncode == 2 and word in res.stderr and res.stderr.count("\n") == 1
    res = run_module(
        "sim",
        "compare",
        "configs/switch_xxl.yaml",
        "--policies",
        "lru",
        "--baseline",
        "diffmoe",
        "--out",
        out,
        "--set",
        "workload.requests=16",
        "--set",
        "workload.max_decode_tokens=4",
    )
    assert res.returncode == 2 and "--baseline" in res.stderr
    assert not (out / "compare.csv").exists()


# ------------------------------------------------------------------------------------- the config's predictor


@pytest.fixture()
def transition_config(tmp_path):
    """A tiny run config whose predictor is transition trained on the trace's other requests."""
    trace = random_trace(np.random.default_rng(5), tokens=48, layers=3, experts=8, k=2, requests=6)
    path = save_trace(trace, tmp_path / "tiny.npz")
    cfg = {
        "model": tiny_model(trace),
        "hardware": "h200",
        "workload": {"trace": str(path), "batch_size": 2, "batching": "static"},
        "cache": {"hpc_slots": 1, "mpc_slots": 1, "lpc_buffers": 4, "prefetch_reserve": 1, "layers": "all"},
        "policy": {"name": "diffmoe", "params": {}},
        "predictor": {"name": "transition", "params": {"train": "other-requests"}},
        "seed": 0,
    }
    out = tmp_path / "tiny.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


NOTE = "lru ran with the config's predictor transition (train: other-requests); give lru@none to run without prediction"


def test_compare_says_under_the_table_which_rows_ran_with_the_configs_predictor(transition_config, tmp_path):
    out = tmp_path / "cmp"
    res = run_module(
        "sim", "compare", transition_config, "--policies", "on-demand,lru,diffmoe@oracle,lfu@none", "--out", out
    )
    assert res.returncode == 0, res.stderr
    rows = {r["policy"]: r["predictor"] for r in csv.DictReader((out / "compare.csv").open())}
    assert rows == {"on-demand": "none", "lru": "transition", "diffmoe": "oracle", "lfu": "none"}  # on-demand: none
    md = (out / "compare.md").read_text()
    for text in (res.stdout, md):
        lines = text.splitlines()
        assert lines.count(NOTE) == 1
        last_row = max(i for i, line in enumerate(lines) if line.startswith("| "))
        assert lines.index(NOTE) > last_row  # under the table
        assert "| lru | transition |" in text and "| diffmoe | oracle |" in text and "| lfu | none |" in text
        assert "| on-demand | - |" in text
    # every entry names its predictor: no such line
    res = run_module(
        "sim", "compare", transition_config, "--policies", "lru@transition,lfu@none", "--out", tmp_path / "c2"
    )
    assert res.returncode == 0, res.stderr
    assert "config's predictor" not in res.stdout + (tmp_path / "c2/compare.md").read_text()


def test_an_oracle_config_predictor_is_named_as_the_oracle(transition_config):
    from sim.compare import config_predictor_note
    from sim.config.run_config import load_run_config

    base = load_run_config(transition_config, ["predictor=oracle"])
    note = config_predictor_note(base, [("lru", None), ("lfu", "none")])
    assert note == (
        "lru ran with the config's predictor oracle, perfect knowledge of the next layer's experts; give "
        "lru@none to run without prediction"
    )
    assert config_predictor_note(base, [("lru", "oracle")]) is None


def test_variant_keeps_the_configs_predictor_params_when_the_entry_names_the_same_predictor(transition_config):
    from sim.compare import compare, variant
    from sim.config.run_config import load_run_config
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    base = load_run_config(transition_config)
    assert base.predictor.params["train"] == "other-requests"
    for predictor in (None, "transition"):
        cfg = variant(base, "lru", predictor)
        assert cfg.predictor.name == "transition" and cfg.predictor.params == base.predictor.params
        assert cfg.policy.name == "lru" and cfg.policy.params == POLICIES.get("lru").check_params({})
    assert variant(base, "lru", "oracle").predictor.params == {}  # another predictor: its own defaults (none)
    assert variant(base, "lru", "cross-layer").predictor.params == PREDICTORS.get("cross-layer").check_params({})
    by_entry = compare(base, [("lru", "transition")])[0], compare(base, [("lru", None)])[0]
    assert by_entry[0] == by_entry[1] and by_entry[0]["prefetch_precision"] is not None


def test_every_compare_argument_has_help():
    import argparse

    from sim.compare import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["compare"]
    args = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
    assert {a.dest for a in args} >= {"config", "policies", "baseline", "set", "out", "json"}
    assert all(a.help and len(a.help) > 10 for a in args), [a.dest for a in args if not a.help]


# ------------------------------------------------------------------------------------------------ diffmoe-arc


def _arc_consistent(policy):
    for layer, arc in policy.arc.items():
        assert set(arc.t1) | set(arc.t2) == set(policy.cache.mpc[layer])  # T1 + T2 is exactly the MPC
        assert not (set(arc.t1) & set(arc.t2)) and len(arc.t1) + len(arc.t2) <= arc.c
        assert not ((set(arc.b1) | set(arc.b2)) & set(policy.cache.mpc[layer]))  # ghosts are not cached
        assert len(arc.b1) + len(arc.b2) <= 2 * arc.c and 0 <= arc.p <= arc.c


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    hpc=st.integers(0, 2),
    mpc=st.integers(0, 5),
    k=st.integers(1, 3),
    batch=st.integers(1, 3),
)
def test_diffmoe_arc_keeps_its_lists_and_the_tiers_consistent(seed, hpc, mpc, k, batch):
    trace = random_trace(np.random.default_rng(seed), tokens=80, layers=2, experts=10, k=k, requests=3)
    policy = policy_for("diffmoe-arc", trace, hpc=hpc, mpc=mpc)
    from sim.core.workload import build_iterations
    from sim.decisions.replay import replay
    from sim.predictors import PREDICTORS, PredictorContext

    its, _ = build_iterations(trace, batch, "static", None, True, None)
    none = PREDICTORS.get("none")(None, PredictorContext(trace.num_layers, trace.num_experts))

    def check(p):
        p.cache.check()
        _arc_consistent(p)

    replay(trace, its, policy, none, after_step=check)


def test_diffmoe_arc_resists_a_scan_that_flushes_lru():
    """Two hot experts used again and again, then a one-time scan of new experts, then the hot ones again: ARC
    keeps them (they sit in its frequency list), LRU of the same size loses them to the scan."""
    seq = [0, 1] * 6 + list(range(2, 9)) + [0, 1] * 3
    trace = make_trace([[e] for e in seq], num_experts=10)
    ranking = [tuple(range(10))]
    arc = policy_for("diffmoe-arc", trace, hpc=0, mpc=3, ranking=ranking)
    lru = policy_for("lru", trace, hpc=0, mpc=3, ranking=ranking)
    da, dl = run_decisions(trace, arc), run_decisions(trace, lru)
    after_scan = slice(len(seq) - 6, len(seq))
    arc_hits = sum(src == MPC for d in da[after_scan] for _, src in d.sources)
    lru_hits = sum(src == MPC for d in dl[after_scan] for _, src in d.sources)
    assert lru_hits == 4 and arc_hits == 6
