"""The SimPy engine end to end: invariants on random traces and configs (hypothesis), independent hit counts,
determinism, the timeline, the real Mixtral trace, and the `python -m sim run` command."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, make_trace, random_trace
from sim.cache import HPC, MPC
from sim.config import config_from_dict
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.run import simulate
from test_policies import plain_diffmoe, plain_lru_hits
from traces.io import save_trace

POLICY_NAMES = POLICIES.names()
PREDICTOR_NAMES = PREDICTORS.names()


def tiny_model(trace, d_model=256, d_ff=512):
    """An inline model matching a test trace's shape (small experts, so copies are ~100 us)."""
    roles = [x.role for x in trace.meta.model.layers]
    enc, dec = roles.count("encoder"), roles.count("decoder")
    return {"name": trace.meta.model.name, "d_model": d_model, "d_ff": d_ff, "expert_matrices": 2,
            "num_experts": trace.num_experts, "top_k": trace.top_k, "encoder_blocks": enc, "decoder_blocks": dec,
            "encoder_moe_layers": enc, "decoder_moe_layers": dec, "n_heads": 4, "n_kv_heads": 4, "head_dim": 64,
            "dense_d_ff": 0, "dense_ffn_matrices": 2, "shared_expert_d_ff": 0, "dtype_bytes": 2, "vocab_size": 1000}


def config_for(trace_path, trace, policy="lru", predictor="none", batch=1, hpc=0, mpc=2, buffers=4,
               batching="static", layers="all", seed=0, policy_params=None, predictor_params=None, **workload):
    d = {"model": tiny_model(trace), "hardware": "h200",
         "workload": {"trace": str(trace_path), "batch_size": batch, "batching": batching, **workload},
         "cache": {"hpc_slots": hpc, "mpc_slots": mpc, "lpc_buffers": buffers, "prefetch_reserve": min(1, buffers - 1),
                   "layers": layers},
         "policy": {"name": policy, "params": policy_params or {}},
         "predictor": {"name": predictor, "params": predictor_params or {}}, "seed": seed}
    return config_from_dict(d, "test", POLICY_NAMES, PREDICTOR_NAMES)


def comparable(summary):
    return {k: v for k, v in summary.items() if k not in ("wall_s", "events_per_s")}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), batch=st.integers(1, 5), hpc=st.integers(0, 2), mpc=st.integers(0, 3),
       buffers=st.integers(1, 6), k=st.integers(1, 2), predictor=st.sampled_from(["none", "oracle", "noisy"]),
       batching=st.sampled_from(["static", "continuous"]), enc_dec=st.booleans())
def test_engine_invariants_on_random_traces_and_configs(tmp_path, seed, batch, hpc, mpc, buffers, k, predictor,
                                                       batching, enc_dec):
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, tokens=48, layers=4, experts=8, k=k, requests=4)
    if enc_dec:  # first two layers encoder (prompt rows), last two decoder (generated rows)
        e = trace.experts.copy()
        prefill = np.minimum(trace.request_lengths, 3)
        decode = trace.position_in_request() >= np.repeat(prefill, trace.request_lengths)
        e[decode, :2] = -1
        e[~decode, 2:] = -1
        trace = make_trace(e, trace.request_lengths, prefill, 8, ["encoder", "encoder", "decoder", "decoder"])
    path = save_trace(trace, tmp_path / f"t{seed}.npz")
    pred_params = {"recall": 0.7, "precision": 0.5} if predictor == "noisy" else None
    results = {}
    for policy in POLICY_NAMES:
        cfg = config_for(path, trace, policy, predictor, batch, hpc, mpc, buffers, batching, seed=seed,
                         predictor_params=pred_params)
        out = simulate(cfg, timeline=True, check_invariants=True, trace=trace)  # tiers checked after every layer
        s, res = out.summary, out.engine
        hits = s["hits"]
        assert hits["hpc"] + hits["mpc"] + hits["lpc"] + s["misses"] + s["cpu_experts"] == s["accesses"]
        assert s["accesses"] == sum(r.hits_hpc + r.hits_mpc + r.hits_lpc + r.misses + r.cpu_experts
                                    for r in res.iterations)
        assert s["pcie_bytes"] == s["copies"] * cfg.model.expert_bytes
        assert s["max_buffers_in_use"] <= buffers
        ends = [r.end_s for r in res.iterations]
        assert all(r.start_s <= r.end_s for r in res.iterations)
        assert all(b.start_s >= a.end_s for a, b in zip(res.iterations, res.iterations[1:]))
        assert ends[-1] == pytest.approx(s["sim_time_s"])
        for track in ("compute", "copy", "cpu"):  # one stream each: spans never overlap, never go back in time
            spans = sorted((t0, d) for tr, _, t0, d in res.timeline if tr == track)
            assert all(d >= 0 for _, d in spans)
            assert all(a[0] + a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))
        results[policy] = s
        again = simulate(cfg, trace=trace).summary
        assert comparable(again) == comparable(s)  # same seed -> identical summary
    ceiling = results["gpu-only"]["throughput_tok_s"]
    for policy, s in results.items():
        # a policy that computes experts on the host beside the GPU may beat every-expert-on-the-GPU (the host's
        # experts run in parallel with the GPU's): the ceiling bounds the GPU-only policies
        if not s["cpu_experts"]:
            assert ceiling >= s["throughput_tok_s"] * (1 - 1e-9), policy


def test_lru_through_the_engine_matches_a_plain_lru(tmp_path):
    trace = random_trace(np.random.default_rng(8), tokens=120, layers=3, experts=10, k=2, requests=3)
    path = save_trace(trace, tmp_path / "t.npz")
    for cap in (1, 3, 5):
        s = simulate(config_for(path, trace, "lru", "none", batch=1, hpc=0, mpc=cap), trace=trace).summary
        assert s["hits"]["mpc"] == plain_lru_hits(trace, cap)
        assert s["hits"]["hpc"] == 0 and s["hits"]["lpc"] == 0
        assert s["hit_rate"]["overall"] == pytest.approx(plain_lru_hits(trace, cap) / s["accesses"])


def test_diffmoe_through_the_engine_matches_the_plain_rules(tmp_path):
    """The legacy rules (before issue 10) through the engine; the default (the artifact's rules) through the engine
    is checked against fetcher.cc in tests/test_diffmoe_artifact.py."""
    from test_policies import HAND_MADE, LEGACY

    trace = make_trace(HAND_MADE, num_experts=6)
    path = save_trace(trace, tmp_path / "t.npz")
    ranking = [list(range(6))]
    cfg = config_for(path, trace, "diffmoe", "none", batch=1, hpc=1, mpc=2, policy_params=LEGACY)
    cfg = config_from_dict({**cfg.resolved, "model": tiny_model(trace),
                            "cache": {**cfg.resolved["cache"], "hot_profile": ranking}}, "test", POLICY_NAMES,
                           PREDICTOR_NAMES)
    s = simulate(cfg, trace=trace).summary
    want = plain_diffmoe(trace, 1, 2, ranking)
    sources = [src for step in want for src in step[0].values()]
    assert s["hits"]["hpc"] == sources.count(HPC)
    assert s["hits"]["mpc"] == sources.count(MPC)
    assert s["misses"] == sources.count("miss") and s["hits"]["lpc"] == 0
    assert s["promotions"] > 0


def test_prefetch_with_an_oracle_hides_copies_and_beats_on_demand(tmp_path):
    trace = random_trace(np.random.default_rng(3), tokens=200, layers=6, experts=16, k=2, requests=4)
    path = save_trace(trace, tmp_path / "t.npz")
    on_demand = simulate(config_for(path, trace, "on-demand", "none", batch=2), trace=trace).summary
    oracle = simulate(config_for(path, trace, "lru", "oracle", batch=2, mpc=0, buffers=8), trace=trace).summary
    assert oracle["prefetch"]["precision"] == 1.0 and oracle["prefetch"]["recall"] == 1.0
    assert oracle["hit_rate"]["lpc"] > 0.5 and oracle["stall_ms"] < on_demand["stall_ms"]
    assert oracle["throughput_tok_s"] > on_demand["throughput_tok_s"]
    assert on_demand["prefetch"]["precision"] is None


def test_continuous_batching_serves_every_decode_token_once(tmp_path):
    trace = random_trace(np.random.default_rng(6), tokens=300, layers=2, experts=8, k=2, requests=7)
    path = save_trace(trace, tmp_path / "t.npz")
    for batching in ("static", "continuous"):
        s = simulate(config_for(path, trace, "lru", batch=3, batching=batching), trace=trace).summary
        served = s["requests_served"]
        assert s["decode_tokens"] == sum(int(trace.request_lengths[r % 7]) for r in range(served))
        assert s["requests_reused"] == served - 7
    assert simulate(config_for(path, trace, "lru", batch=3, batching="continuous"), trace=trace).summary[
        "requests_served"] == 7


# ------------------------------------------------------------------------------------------------ real trace

@pytest.mark.parametrize("policy", ["lru", "diffmoe"])
@pytest.mark.parametrize("batch", [1, 4])
def test_real_mixtral_trace_runs_end_to_end(mixtral_real, tmp_path, policy, batch):
    out = tmp_path / f"{policy}-{batch}"
    res = subprocess.run([sys.executable, "-m", "sim", "run", "configs/mixtral.yaml", "--json", "--out", str(out),
                          "--set", f"workload.trace={mixtral_real['both']}", "--set", f"workload.batch_size={batch}",
                          "--set", f"policy.name={policy}"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["throughput_tok_s"] > 0 and 0 < s["hit_rate"]["overall"] <= 1
    assert s["requests_reused"] == (0 if batch <= 4 else s["requests_served"] - 4)
    assert {p.name for p in out.iterdir()} == {"config.resolved.yaml", "summary.json", "iterations.csv"}


# ------------------------------------------------------------------------------------------------------- CLI

def _sim(*args):
    return subprocess.run([sys.executable, "-m", "sim", *map(str, args)], cwd=ROOT, capture_output=True, text=True)


def test_default_run_writes_every_result_file_and_a_perfetto_timeline(tmp_path):
    out = tmp_path / "run"
    res = _sim("run", "configs/switch_xxl.yaml", "--out", out, "--timeline", "--set", "workload.requests=16",
               "--set", "workload.max_decode_tokens=8")
    assert res.returncode == 0, res.stderr
    assert "throughput" in res.stdout and "hit rate" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    for key in ("throughput_tok_s", "iteration_ms", "hit_rate", "pcie_bytes", "link_busy_frac", "compute_busy_frac",
                "stall_ms", "prefetch", "events", "wall_s"):
        assert key in summary
    assert set(summary["iteration_ms"]) >= {"mean", "p50", "p99"}
    assert set(summary["hit_rate"]) == {"overall", "hpc", "mpc", "lpc"}
    assert set(summary["prefetch"]) >= {"precision", "recall", "wasted_bytes"}
    import yaml

    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert len(resolved["provenance"]["trace_sha256"]) == 64 and resolved["provenance"]["versions"]["simpy"]
    trace_events = json.loads((out / "timeline.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "copy" for e in trace_events) and any(e.get("cat") == "compute" for e in trace_events)
    lines = (out / "iterations.csv").read_text().splitlines()
    assert lines[0].startswith("index,batch,kind") and len(lines) == summary["iterations"] + 1


@pytest.mark.parametrize("override, field", [
    ("workload.batch_size=0", "workload.batch_size"),
    ("workload.batching=dynamic", "workload.batching"),
    ("workload.colour=red", "workload.colour"),
    ("cache.mpc_slots=2000", "cache"),
    ("policy.name=clairvoyant", "policy.name"),
    ("predictor.name=psychic", "predictor.name"),
    ("model=mixtral-8x7b", "workload.trace"),
    ("hardware.pcie_bw_gb_s=-1", "hardware"),
    ("policy.params.threshold=high", "policy.params.threshold"),
])
def test_bad_configs_exit_2_naming_the_field_and_write_nothing(tmp_path, override, field):
    out = tmp_path / "out"
    res = _sim("run", "configs/switch_xxl.yaml", "--out", out, "--set", override)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and field in res.stderr, res.stderr
    assert not out.exists()


def test_missing_config_and_bad_yaml_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    for path in (tmp_path / "absent.yaml", bad):
        res = _sim("run", path, "--out", tmp_path / "o")
        assert res.returncode == 2 and str(path) in res.stderr and res.stderr.count("\n") == 1
