"""`sim compare` computes each value once: the ``--policies`` entries are parsed once, the baseline checked once
(twice only where a shared cache leaves some entries out), each variant config built and validated once, the trace
loaded once; and one run builds one cost model."""

from __future__ import annotations

import pytest

import sim.compare as compare_mod
from sim.cli import main
from sim.config.run_config import load_run_config
from sim.costs.costs import CostModel
from sim.run import simulate
from tests.support.configs import tiny_lru_config


@pytest.fixture()
def tiny_config(tmp_path):
    return tiny_lru_config(tmp_path, tokens=24)


def counting(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` with a wrapper that records each call's arguments; returns the record."""
    calls: list = []
    f = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return f(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def _compare(config, out, *more) -> int:
    return main(["compare", str(config), "--out", str(out), *map(str, more)])


POLICIES = "on-demand,lru,diffmoe@oracle,belady"


def test_compare_builds_each_variant_config_once(tiny_config, tmp_path, monkeypatch, capsys):
    built = counting(monkeypatch, compare_mod, "config_from_dict")
    assert _compare(tiny_config, tmp_path / "cmp", "--policies", POLICIES) == 0
    # one config_from_dict per variant (the base config is loaded by load_run_config)
    assert [d["policy"]["name"] for d, *_ in built] == ["on-demand", "lru", "diffmoe", "belady"]
    rows = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["on-demand", "lru", "diffmoe", "belady"]


def test_compare_parses_the_entries_and_checks_the_baseline_once(tiny_config, tmp_path, monkeypatch, capsys):
    entries = counting(monkeypatch, compare_mod, "_entry")
    baselines = counting(monkeypatch, compare_mod, "check_baseline")
    traces = counting(monkeypatch, compare_mod, "load_trace")
    assert _compare(tiny_config, tmp_path / "cmp", "--policies", POLICIES, "--baseline", "lru") == 0
    assert [item for item, *_ in entries] == POLICIES.split(",")
    assert len(baselines) == 1 and baselines[0][0] == "lru"
    assert len(traces) == 1
    assert "x lru" in (tmp_path / "cmp" / "compare.md").read_text()


def test_a_shared_cache_that_leaves_policies_out_checks_the_baseline_among_the_others(tiny_config, tmp_path, capsys):
    """``all`` under a shared cache leaves out the per-layer-only policies: a baseline among them is refused, as
    it was when the entries were parsed twice."""
    out = tmp_path / "cmp"
    shared = ("--set", "cache.organization=shared")
    code = _compare(tiny_config, out, "--policies", "all", "--baseline", "diffmoe", *shared)
    err = capsys.readouterr().err
    assert code == 2 and "leaving out" in err and "--baseline: 'diffmoe' is not among the compared policies" in err
    assert not (out / "compare.csv").exists()


def test_a_duplicate_variant_is_refused_before_the_next_is_built(tiny_config, tmp_path, monkeypatch, capsys):
    """The duplicate check runs as the variants are built: ``lru`` and ``lru@none`` (the config's predictor) are
    the same run, refused before ``on-demand`` after them is built."""
    built = counting(monkeypatch, compare_mod, "config_from_dict")
    code = _compare(tiny_config, tmp_path / "cmp", "--policies", "lru,lru@none,on-demand")
    assert code == 2 and "run the same policy with the same predictor" in capsys.readouterr().err
    assert len(built) == 2


def test_one_run_builds_one_cost_model(tiny_config, monkeypatch):
    cfg = load_run_config(tiny_config, ["policy.name=fiddler", "policy.params={}"])
    made = counting(monkeypatch, CostModel, "__init__")
    out = simulate(cfg)
    assert len(made) == 1
    assert out.policy.ctx.costs is made[0][0]  # the policy's cost model is the one the engine runs with
