"""Fair comparisons and honest rows in `sim compare`: under ``--policies all`` every policy that reads a predictor
gets the same one (the config's), said in one line; a policy that never reads one runs with none and shows "-"; a
variant that does not fit in the GPU's memory is a "does not fit (X GB > Y GB)" row, not a throughput; the Belady
column is labelled for what it bounds; figures keep their significant digits on a tiny model."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sim.compare import BELADY_NOTE, all_entries, significant
from sim.policies import POLICIES
from sim.run import simulate
from tests.support.cli import run_module
from tests.support.engine import config_for, tiny_model
from tests.support.fuzz import fuzz_settings
from tests.support.traces import random_trace
from traces.io import save_trace

TRACE = random_trace(np.random.default_rng(11), tokens=48, layers=3, experts=8, k=2, requests=6)


def _reads(policy: str) -> bool:
    cls = POLICIES.get(policy)
    return cls.reads_predictions(cls.check_params({}))


@pytest.fixture()
def config(tmp_path):
    """A tiny run config (transition predictor, trained on the trace's other requests) and its folder."""
    path = save_trace(TRACE, tmp_path / "tiny.npz")
    cfg = {
        "model": tiny_model(TRACE),
        "hardware": "h200",
        "workload": {"trace": str(path), "batch_size": 2, "batching": "static"},
        "cache": {"hpc_slots": 1, "mpc_slots": 2, "lpc_buffers": 4, "prefetch_reserve": 1, "layers": "all"},
        "policy": {"name": "lru", "params": {}},
        "predictor": {"name": "transition", "params": {"train": "other-requests"}},
        "seed": 0,
    }
    out = tmp_path / "tiny.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


def _compare(config, out, *more):
    res = run_module("sim", "compare", config, "--out", out, *more)
    assert res.returncode == 0, res.stderr
    return res, {r["policy"]: r for r in csv.DictReader((out / "compare.csv").open())}


def test_all_gives_every_policy_that_reads_a_predictor_the_same_one_and_says_so_once(config, tmp_path):
    res, rows = _compare(config, tmp_path / "cmp", "--policies", "all")
    assert list(rows) == [p for p, _ in all_entries()]
    readers = {p for p in rows if _reads(p)}
    assert {"pregated", "diffmoe", "diffmoe-arc", "moe-infinity", "next-use-odds", "lru"} <= readers
    assert {"gpu-only", "on-demand", "prefetch-all", "fiddler", "ktransformers", "hybrid-cache"}.isdisjoint(readers)
    assert {rows[p]["predictor"] for p in readers} == {"transition"}  # one predictor for all
    assert {rows[p]["uses_predictor"] for p in readers} == {"True"}
    assert all(rows[p]["predictor"] == "none" and rows[p]["uses_predictor"] == "False" for p in set(rows) - readers)
    md = (tmp_path / "cmp" / "compare.md").read_text()
    for p in set(rows) - readers:
        assert f"| {p} | - |" in md
    said = [line for line in res.stdout.splitlines() if "predictor" in line and not line.startswith(("|", "#"))]
    assert len(said) == 1, said
    assert said[0].startswith(
        "every policy that reads a predictor ran with the same one, the config's predictor transition "
        "(train: other-requests)"
    )
    assert "--own-predictors" in said[0] and said[0] in md


def test_own_predictors_gives_each_policy_the_one_its_design_pairs_it_with(config, tmp_path):
    _, rows = _compare(config, tmp_path / "cmp", "--policies", "all", "--own-predictors")
    for p, own in all_entries():
        want = (own or "transition") if _reads(p) else "none"
        assert rows[p]["predictor"] == want, p
    assert rows["diffmoe"]["predictor"] == "oracle" and rows["moe-infinity"]["predictor"] == "moe-infinity"
    res = run_module("sim", "compare", config, "--policies", "lru", "--own-predictors", "--out", tmp_path / "c2")
    assert res.returncode == 2 and res.stderr.startswith("error: --own-predictors:") and res.stderr.count("\n") == 1


@pytest.mark.parametrize("policy", [p for p in POLICIES.names() if not _reads(p)])
def test_a_policy_that_never_reads_a_predictor_runs_the_same_whatever_it_is(tmp_path, policy):
    """What ``uses_predictor = False`` claims, checked: the oracle and no predictor give the same run (so showing
    no predictor for it hides nothing)."""
    path = save_trace(TRACE, tmp_path / "t.npz")
    runs = [
        simulate(config_for(path, TRACE, policy, p, batch=2, hpc=1, mpc=2), trace=TRACE) for p in ("none", "oracle")
    ]
    a, b = (r.summary for r in runs)
    for key in ("throughput_tok_s", "hit_rate", "pcie_bytes", "copies", "cpu_experts", "sim_time_s", "stall_ms"):
        assert a[key] == b[key], key
    assert [r.latency_s for r in runs[0].engine.iterations] == [r.latency_s for r in runs[1].engine.iterations]


def test_a_variant_that_does_not_fit_is_a_row_and_the_others_run(config, tmp_path):
    """On a GPU whose memory lies between what the tiny model's tiers need and what its every expert needs,
    gpu-only is a "does not fit" row, with no figure, in the CSV and the table; the others run."""
    from sim.config.memory import DoesNotFit
    from sim.config.run_config import load_run_config

    base = load_run_config(config, ["hardware.reserved_gb=0"])
    eb, m = base.model.expert_bytes, base.model
    gpu_gb = (base.model.dense_bytes + (m.num_experts * m.moe_layers - 1) * eb) / 1e9
    assert (1 + 2) * m.moe_layers + 4 < m.num_experts * m.moe_layers - 1  # the tiers fit below that
    with pytest.raises(DoesNotFit):
        load_run_config(config, ["hardware.reserved_gb=0", f"hardware.gpu_memory_gb={gpu_gb!r}", "policy=gpu-only"])
    out = tmp_path / "cmp"
    sets = ["--set", "hardware.reserved_gb=0", "--set", f"hardware.gpu_memory_gb={gpu_gb!r}"]
    res, rows = _compare(config, out, "--policies", "gpu-only,on-demand,lru", *sets)
    status = rows["gpu-only"]["status"]
    assert status.startswith("does not fit (") and status.endswith(" GB)"), status
    need, gpu = (float(x) for x in status[len("does not fit (") : -len(" GB)")].split(" GB > "))
    assert need > gpu == pytest.approx(gpu_gb, rel=1e-2)
    assert all(rows["gpu-only"][k] == "" for k in ("throughput_tok_s", "hit_rate", "ratio_vs_baseline"))
    assert rows["lru"]["status"] == rows["on-demand"]["status"] == "ok" and float(rows["lru"]["throughput_tok_s"]) > 0
    md = (out / "compare.md").read_text()
    assert f"| gpu-only | - | ceiling | {status} | - |" in md
    assert "gpu-only: does not fit" in res.stderr


def test_nothing_fits_nothing_to_compare_exits_2_with_the_memory_table(config, tmp_path):
    out = tmp_path / "cmp"
    res = run_module(
        "sim",
        "compare",
        config,
        "--policies",
        "gpu-only,lru",
        "--set",
        "hardware.gpu_memory_gb=0.001",
        "--set",
        "hardware.reserved_gb=0",
        "--out",
        out,
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("error: ") and "but hardware.gpu_memory_gb is 0.001" in res.stderr
    assert not (out / "compare.csv").exists()


def test_the_belady_column_is_labelled_for_the_cache_hits_it_bounds(config, tmp_path):
    """The bound covers HPC + MPC hits over every access: it bounds "cache hits" (next to it), never the hit rate
    with prefetched experts, which may exceed it; the line under the table says so."""
    out = tmp_path / "cmp"
    _, rows = _compare(config, out, "--policies", "on-demand,pregated@oracle,lru,belady")
    md = (out / "compare.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| policy |")).split(" | ")
    assert head.index("Belady (cache hits)") == head.index("cache hits") + 1
    assert md.splitlines()[-1] == BELADY_NOTE
    for p, r in rows.items():
        bound, hits, rate, lpc = (
            float(r[k]) for k in ("belady_cache_hit_rate", "cache_hit_rate", "hit_rate", "prefetch_hit_rate")
        )
        assert hits <= bound + 1e-12, p
        assert rate == pytest.approx(hits + lpc), p
        assert float(r["gap_to_belady"]) == pytest.approx(bound - hits, abs=2e-6), p  # CSV: 6 digits
    assert float(rows["belady"]["cache_hit_rate"]) == pytest.approx(float(rows["belady"]["belady_cache_hit_rate"]))
    assert float(rows["pregated"]["hit_rate"]) > float(rows["pregated"]["belady_cache_hit_rate"])  # prefetched hits


def test_a_tiny_models_figures_keep_their_digits(config, tmp_path):
    """Iteration time, traffic and stall time of a tiny model (microseconds, kilobytes) are shown to 4 significant
    digits: each table cell reads back as the CSV's figure to within its last digit, never as 0.0 for every row."""
    out = tmp_path / "cmp"
    _, rows = _compare(config, out, "--policies", "on-demand,lru,pregated@oracle")
    lines = [line.split(" | ") for line in (out / "compare.md").read_text().splitlines() if line.startswith("| ")]
    head, body = lines[0], lines[2:]
    for cells in body:
        r = rows[cells[0].strip("| ")]
        for col, key, scale in (("iter ms (mean)", "iteration_ms_mean", 1), ("PCIe GB", "pcie_gb", 1)):
            shown, exact = float(cells[head.index(col)].replace(",", "")), float(r[key]) * scale
            assert shown == pytest.approx(exact, rel=1e-3, abs=0), (col, shown, exact)
    assert float(rows["on-demand"]["iteration_ms_mean"]) < 1  # the case at stake: below a millisecond


@fuzz_settings(200)
@given(v=st.one_of(st.floats(-1e12, 1e12, allow_nan=False), st.integers(-(10**12), 10**12)))
def test_significant_keeps_four_digits_without_exponents(v):
    text = significant(v)
    assert "e" not in text and text.replace(",", "").replace(".", "").lstrip("-").isdigit()
    back = float(text.replace(",", ""))
    assert back == pytest.approx(v, rel=5e-4, abs=1e-12 if abs(v) < 1e-9 else 0)
    assert significant(None) == "-"
