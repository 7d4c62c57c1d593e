"""The ``host_compute_bound`` sweep check (sim/sweep/checks.py) and the bound it reads (sim/timing/bound.py): the
ideal GPU/host split is the optimum of its linear program (a dual certificate at its breakpoints) and below every
assignment of experts; on real runs of the host-compute policies (fiddler, ktransformers, hybrid-cache) and the
GPU ones, with and without arrivals, the throughput stays under the recorded bound and the check passes; a planted
engine bug (the host's experts for free) and a planted row break it, naming the policy and its point; the bound
changes no result."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sim.cli import main
from sim.config.run_config import load_run_config
from sim.run import simulate
from sim.sweep.checks import CHECKS, check_state
from sim.timing.bound import split_s
from tests.support.engine import tiny_model
from tests.support.fuzz import fuzz_settings
from tests.support.traces import make_trace
from traces.io import save_trace

HOST_POLICIES = ("fiddler", "ktransformers", "hybrid-cache")
times = st.lists(st.floats(1e-6, 1e-2), min_size=1, max_size=7)


@fuzz_settings(max_examples=80)
@given(st.data())
def test_the_split_is_the_linear_programs_optimum_and_below_every_assignment(data):
    gpu = data.draw(times)
    host = data.draw(st.lists(st.floats(1e-6, 1e-2), min_size=len(gpu), max_size=len(gpu)))
    t = split_s(gpu, host)

    def dual(lam: float) -> float:  # any lam in [0, 1] bounds the optimum from below (weak duality)
        return sum(min(lam * g, (1 - lam) * h) for g, h in zip(gpu, host))

    breakpoints = [0.0, 1.0] + [h / (g + h) for g, h in zip(gpu, host)]
    assert t == pytest.approx(max(dual(lam) for lam in breakpoints), rel=1e-9)  # and strong duality: optimal
    for on_gpu in itertools.product((0, 1), repeat=len(gpu)):
        g = sum(x * v for x, v in zip(on_gpu, gpu))
        h = sum((1 - x) * v for x, v in zip(on_gpu, host))
        assert t <= max(g, h) * (1 + 1e-12)


def test_the_split_of_equal_experts_is_their_harmonic_share():
    # W of work at rates g and h: W / (g + h); two experts of 1 ms on the GPU and 3 ms on the host: 1.5 ms
    assert split_s([1e-3, 1e-3], [3e-3, 3e-3]) == pytest.approx(2e-3 * 3e-3 * 2 / (2e-3 + 6e-3))
    assert split_s([1e-3], [0.0]) == 0.0 and split_s([], []) == 0.0


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> str:
    """A tiny MoE (4 layers of 16 experts, top-2) on the H200, where the host computes a good share of experts."""
    folder = tmp_path_factory.mktemp("host-bound")
    rng = np.random.default_rng(0)
    e = np.argsort(rng.random((16 * 14, 4, 16)), axis=2)[:, :, :2]
    trace = make_trace(e, [14] * 16, [6] * 16, num_experts=16)
    path = save_trace(trace, folder / "t.npz")
    cfg = {
        "model": tiny_model(trace, d_model=1024, d_ff=4096),
        "hardware": "h200",
        "workload": {"trace": str(path), "batch_size": 4},
        "cache": {"hpc_slots": 0, "mpc_slots": 4, "lpc_buffers": 4, "prefetch_reserve": 1},
        "policy": "lru",
        "predictor": "none",
    }
    (folder / "c.yaml").write_text(yaml.safe_dump(cfg))
    return str(folder / "c.yaml")


def _sweep(folder, config: str):
    path = folder / "s.yaml"
    doc = {
        "base": config,
        "grid": {"policy.name": [*HOST_POLICIES, "lru", "gpu-only"], "workload.batch_size": [1, 4]},
        "checks": ["host_compute_bound", "gpu_only_ceiling"],
        "plots": [],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_bound_holds_on_real_runs_and_the_check_passes(tmp_path, config):
    out = tmp_path / "out"
    assert main(["sweep", str(_sweep(tmp_path, config)), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 10 and (df["status"] == "ok").all()
    host = df["policy.name"].isin(HOST_POLICIES)
    assert (df.loc[host, "cpu_expert_frac"] > 0.5).all() and (df.loc[~host, "cpu_expert_frac"] == 0).all()
    assert (df["throughput_tok_s"] <= df["throughput_bound_tok_s"]).all()
    # the bound is not idle: gpu-only, with nothing to copy, comes within 20% of it
    gpu = df[df["policy.name"] == "gpu-only"]
    assert (gpu["throughput_tok_s"] > 0.8 * gpu["throughput_bound_tok_s"]).all()
    report = (out / "report.md").read_text()
    assert "- `host_compute_bound`: passed (6 of 10 row(s) computed experts on the host CPU)" in report


@pytest.mark.parametrize("policy", HOST_POLICIES)
def test_the_bound_holds_with_arrivals_and_changes_no_result(config, policy):
    sets = [f"policy.name={policy}", "workload.batching=continuous"]
    sets.append("workload.arrivals={process: poisson, rate_per_s: 2000, seed: 0}")
    cfg = load_run_config(config, sets)
    plain, bounded = simulate(cfg).summary, simulate(cfg, bound=True).summary
    assert bounded["cpu_expert_frac"] > 0 and bounded["throughput_tok_s"] <= bounded["throughput_bound_tok_s"]
    drop = ("wall_s", "events_per_s", "throughput_bound_tok_s")
    assert {k: v for k, v in bounded.items() if k not in drop} == {k: v for k, v in plain.items() if k not in drop}


def test_a_planted_engine_bug_breaks_the_check(tmp_path, config, monkeypatch, capsys):
    from sim.timing.engine import HostStream

    monkeypatch.setattr(HostStream, "run", lambda self, now, *args: (now, 0.0))  # the host's experts for free
    out = tmp_path / "out"
    assert main(["sweep", str(_sweep(tmp_path, config)), "--out", str(out), "--workers", "1", "--quiet"]) == 3
    assert "CHECK FAILED host_compute_bound: " in capsys.readouterr().err
    line = next(x for x in (out / "report.md").read_text().splitlines() if x.startswith("- `host_compute_bound`"))
    for policy, batch in itertools.product(("fiddler", "ktransformers"), (1, 4)):
        assert f"{policy} at workload.batch_size={batch}: " in line
    assert "lru at" not in line and "gpu-only at" not in line and "above the bound" in line


def test_a_planted_row_breaks_the_check_and_rows_without_the_figure_are_said():
    rows = pd.DataFrame(
        {
            "policy.name": ["fiddler", "lru", "gpu-only"],
            "workload.batch_size": [4, 4, 4],
            "throughput_tok_s": [100.0, 50.0, 90.0],
            "throughput_bound_tok_s": [99.0, 60.0, None],
            "cpu_expert_frac": [0.5, 0.0, 0.0],
        }
    )
    bad = CHECKS["host_compute_bound"](rows, ["policy.name", "workload.batch_size"])
    assert list(bad) == ["fiddler at workload.batch_size=4: 100 tok/s above the bound 99"]
    assert check_state(bad).startswith("FAILED: fiddler at workload.batch_size=4")
    assert "1 row(s) without throughput_bound_tok_s" in bad.note
    fixed = CHECKS["host_compute_bound"](rows.assign(throughput_bound_tok_s=[101.0, 60.0, 90.0]), ["policy.name"])
    assert list(fixed) == [] and check_state(fixed) == "passed (1 of 3 row(s) computed experts on the host CPU)"
    assert check_state(CHECKS["host_compute_bound"](rows.drop(columns="throughput_bound_tok_s"), [])).startswith(
        "not applicable"
    )
