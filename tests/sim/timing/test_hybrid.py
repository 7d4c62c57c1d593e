"""Experts computed on the host CPU: the ``cpu`` source through the engine (sim/timing/engine.py), the host stream's
timing, the reporting, and the three hybrid policies (fiddler, ktransformers, hybrid-cache)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest

from sim.compare import COLUMNS, compare, table_csv, table_markdown
from sim.core.cache import CPU, HPC
from sim.costs.costs import CostModel
from sim.decisions.protocol import cpu_tokens
from sim.results import ITERATION_COLUMNS, iterations_csv
from sim.run import simulate
from tests.reference.fiddler import fiddler_restated
from tests.support.engine import comparable, config_for
from tests.support.paths import ROOT
from tests.support.traces import make_trace, random_trace
from traces.io import save_trace

#: The policies that compute experts on the host CPU, named: no registry attribute marks all three (fiddler and
#: hybrid-cache set ``wants_counts``; ktransformers places experts without token counts).
HYBRID = ("fiddler", "ktransformers", "hybrid-cache")


def skewed_trace(seed=0, tokens=120, layers=3, experts=8, k=2, requests=4):
    rng = np.random.default_rng(seed)
    t = random_trace(rng, tokens=tokens, layers=layers, experts=experts, k=k, requests=requests)
    hot = rng.random(t.experts.shape[:2])[:, :, None] < 0.5
    e = np.where(hot, (np.arange(k)[None, None, :] + t.experts[:, :, :1] % 2 * k) % experts, t.experts)
    return make_trace(e.astype(np.int16), np.diff(t.request_offsets), num_experts=experts)


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    trace = skewed_trace()
    path = save_trace(trace, tmp_path_factory.mktemp("hy") / "t.npz")
    return path, trace


def run(path, trace, policy, batch=2, hpc=1, mpc=1, buffers=3, predictor="none", **kw):
    cfg = config_for(
        path, trace, policy=policy, predictor=predictor, batch=batch, hpc=hpc, mpc=mpc, buffers=buffers, **kw
    )
    return cfg, simulate(cfg, trace=trace, check_invariants=True, record_decisions=True, timeline=True)


@pytest.mark.parametrize("policy", HYBRID)
@pytest.mark.parametrize("batch", [1, 3])
def test_accesses_capacity_and_host_experts_never_in_a_buffer(skewed, policy, batch):
    path, trace = skewed
    cfg, out = run(path, trace, policy, batch=batch)
    pol, res = out.policy, out.engine
    c = pol.cache.counters
    assert c.accesses == sum(c.hits.values()) + c.misses + c.cpu
    assert out.summary["accesses"] == c.accesses
    assert out.summary["cpu_experts"] == c.cpu == res.cpu_experts == sum(r.cpu_experts for r in res.iterations)
    for d in res.decisions:
        promoted = {e for e, _ in d.promote}
        for e, src in d.sources:
            if src == CPU:
                assert e not in promoted
    # a host expert never enters a working buffer: replay the steps and look at the LPC at each plan
    from sim.core.workload import build_iterations
    from sim.decisions.build import build_decisions
    from sim.decisions.protocol import DecisionProtocol

    w = cfg.workload
    its, _ = build_iterations(trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests)
    p2, pr2 = build_decisions(cfg, trace, its)
    proto = DecisionProtocol(trace, p2, pr2)
    n = 0
    for it in its:
        for step in proto.steps(it):
            proto.decide(step)
            held = p2.cache.lpc_of[step.layer]
            for e in step.cpu:
                assert step.plan.sources[e] == CPU and e not in held and e not in step.plan.promote
                assert not p2.cache.cached(step.layer, e)
                n += 1
            assert set(step.cpu).isdisjoint(step.resident)
            assert set(step.cpu).isdisjoint(e for e, _ in step.copied)
            assert len(step.resident) + len(step.copied) + len(step.cpu) == len(step.active)
            p2.cache.check()
            assert all(len(m) <= p2.cache.mpc_slots for m in p2.cache.mpc)
            assert all(len(h) <= p2.cache.hpc_slots for h in p2.cache.hpc)
    assert n == c.cpu


def test_ktransformers_never_copies(skewed):
    path, trace = skewed
    _, out = run(path, trace, "ktransformers", predictor="oracle")
    s = out.summary
    assert s["copies"] == 0 and s["pcie_bytes"] == 0 and s["misses"] == 0 and s["promotions"] == 0
    assert s["cpu_experts"] > 0
    pol = out.policy
    for d in out.engine.decisions:
        for e, src in d.sources:
            assert src == (HPC if e in pol.cache.hpc[d.layer] else CPU)


def with_hardware(cfg, **hw):
    """The config with hardware fields changed."""
    from sim.config.run_config import config_from_dict
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    d = dict(cfg.resolved)
    d["hardware"] = {**d["hardware"], **hw}
    return config_from_dict(d, "test", POLICIES.names(), PREDICTORS.names())


@pytest.mark.parametrize("overhead_us,batch", [(5.0, 1), (5.0, 4), (0.0, 4), (30.0, 4)])
def test_fiddler_is_its_rule(tmp_path, overhead_us, batch):
    # a hand-made trace: 3 layers, 6 experts, top-2, 4 requests; experts 0 and 1 hot. With the tiny model the host
    # and the copy are close (~26 us), so the choice depends on the tokens per expert and the host's overhead
    rng = np.random.default_rng(5)
    e = np.where(rng.random((40, 3, 1)) < 0.6, [[[0, 1]]], np.sort(rng.choice(6, (40, 3, 2)), axis=2))
    e[:, :, 1] = np.where(e[:, :, 1] == e[:, :, 0], (e[:, :, 0] + 1) % 6, e[:, :, 1])
    trace = make_trace(e.astype(np.int16), [10, 10, 10, 10], num_experts=6)
    path = save_trace(trace, tmp_path / "t.npz")
    cfg = with_hardware(
        config_for(path, trace, policy="fiddler", batch=batch, hpc=1, mpc=1, buffers=3),
        cpu_expert_overhead_us=overhead_us,
    )
    out = simulate(cfg, trace=trace, record_decisions=True, check_invariants=True)
    from sim.core.workload import build_iterations
    from sim.decisions.build import hot_ranking

    w = cfg.workload
    its, _ = build_iterations(trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests)
    want = fiddler_restated(trace, its, CostModel(cfg.model, cfg.hardware), hot_ranking(cfg, trace), 2)
    got = [d.sources for d in out.engine.decisions]
    assert got == want
    s = out.summary
    assert s["promotions"] == 0 and s["prefetch"]["issued"] == 0
    assert s["hits"][HPC] + s["misses"] + s["cpu_experts"] == s["accesses"]
    if (overhead_us, batch) == (5.0, 4):  # both choices occur
        assert s["misses"] > 0 and s["cpu_experts"] > 0
    if overhead_us == 30.0:
        assert s["cpu_experts"] == 0
    if overhead_us == 0.0:
        assert s["misses"] == 0


def test_fiddler_copies_when_the_host_is_slower(tmp_path):
    """With a slow host (a hardware file with 1 GB/s of host memory) fiddler copies its misses, on the GPU."""
    import yaml

    trace = skewed_trace(1)
    path = save_trace(trace, tmp_path / "t.npz")
    hw = yaml.safe_load((ROOT / "configs/hardware/h200.yaml").read_text())
    hw.update(name="slow-host", cpu_mem_bw_gb_s=0.5, cpu_bf16_tflops=0.001, cpu_int8_tops=0.001, cpu_int4_tops=0.001)
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(hw))
    cfg = config_for(path, trace, policy="fiddler", batch=2, hpc=1, mpc=1, buffers=3)
    from sim.config.run_config import config_from_dict
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    cfg = config_from_dict(
        {**cfg.resolved, "hardware": str(tmp_path / "slow.yaml")}, "test", POLICIES.names(), PREDICTORS.names()
    )
    s = simulate(cfg, trace=trace).summary
    assert s["cpu_experts"] == 0 and s["misses"] > 0 and s["copies"] == s["misses"]


def test_host_stream_time_one_layer(tmp_path):
    """One layer, one decode step of 3 tokens: expert 0 on the GPU (pinned), experts 1, 2 on the host (ktransformers).
    The layer's expert part ends at max(GPU work, d2h + cpu(1) + cpu(2) + h2d)."""
    e = np.array([[[0, 1]], [[0, 2]], [[1, 2]]], dtype=np.int16)  # 3 tokens, 1 layer, top-2
    trace = make_trace(e, [1, 1, 1], num_experts=4)
    path = save_trace(trace, tmp_path / "t.npz")
    cfg = config_for(path, trace, policy="ktransformers", batch=3, hpc=1, mpc=0, buffers=2)
    out = simulate(cfg, trace=trace, timeline=True)
    costs = CostModel(cfg.model, cfg.hardware)
    recs = out.engine.iterations
    assert len(recs) == 1
    r = recs[0]
    # experts 0, 1, 2 are selected twice each: the hottest by id, 0, is pinned on the GPU; 1 and 2 on the host,
    # and every token routes to one of them
    assert out.policy.cache.hpc[0] == frozenset({0})
    gpu_e, host, counts, n_host_tokens = 0, [1, 2], {0: 2, 1: 2, 2: 2}, 3
    dense = out.engine.timeline[0][3]  # the layer's dense work, as the engine timed it
    hw = costs.hw
    start = dense + hw.layer_roundtrip_s
    host_done = (
        start
        + costs.activation_copy_s(n_host_tokens, "d2h")
        + sum(costs.cpu_expert_s(counts[x]) for x in host)
        + costs.activation_copy_s(n_host_tokens, "h2d")
    )
    gpu_done = start + costs.expert_s(counts[gpu_e])
    lm = costs.lm_head_s(3)
    assert r.cpu_experts == 2
    assert r.cpu_s == sum(costs.cpu_expert_s(counts[x]) for x in host)
    assert r.end_s - r.start_s == pytest.approx(max(host_done, gpu_done) + lm, rel=1e-9)
    assert r.cpu_wait_s == pytest.approx(max(0.0, host_done - gpu_done), rel=1e-9, abs=1e-15)
    lanes = {x[0] for x in out.engine.timeline}
    assert "cpu" in lanes
    cpu_items = [x for x in out.engine.timeline if x[0] == "cpu"]
    assert [x[1] for x in cpu_items] == [
        "L0 activations d2h",
        f"L0 E{host[0]} cpu",
        f"L0 E{host[1]} cpu",
        "L0 activations h2d",
    ]


def test_cpu_tokens_counts_tokens_routed_to_any_host_expert():
    e = np.array([[[0, 1]], [[0, 2]], [[1, 2]], [[0, 3]]], dtype=np.int16)
    trace = make_trace(e, [4], num_experts=4)

    class It:
        rows = np.arange(4)

    assert cpu_tokens(trace, It, 0, [1]) == 2
    assert cpu_tokens(trace, It, 0, [1, 2]) == 3
    assert cpu_tokens(trace, It, 0, [3, 1]) == 3
    assert cpu_tokens(trace, It, 0, []) == 0


@pytest.mark.parametrize("policy", HYBRID)
def test_reported_in_summary_iterations_and_compare(skewed, policy, tmp_path):
    path, trace = skewed
    cfg, out = run(path, trace, policy)
    s = out.summary
    for k in ("cpu_experts", "cpu_expert_frac", "cpu_busy_frac", "cpu_wait_ms"):
        assert k in s
    assert s["cpu_expert_frac"] == pytest.approx(s["cpu_experts"] / s["accesses"])
    assert s["cpu_busy_frac"] == pytest.approx(out.engine.cpu_busy_s / s["sim_time_s"])
    rows = list(csv.DictReader(io.StringIO(iterations_csv(out.engine.iterations).decode())))
    assert "cpu_experts" in rows[0] and "cpu_ms" in rows[0]
    assert sum(int(r["cpu_experts"]) for r in rows) == s["cpu_experts"]
    assert "cpu_experts" in ITERATION_COLUMNS and "cpu_ms" in ITERATION_COLUMNS
    table = compare(cfg, [("lru", None), (policy, None)], baseline="lru")
    assert "cpu_expert_frac" in COLUMNS
    assert table[0]["cpu_expert_frac"] == 0.0 and table[1]["cpu_expert_frac"] == pytest.approx(s["cpu_expert_frac"])
    assert "cpu_expert_frac" in table_csv(table).splitlines()[0]
    assert "cpu_expert_frac" in table_markdown(table, "lru", "t")


@pytest.mark.parametrize("policy", HYBRID)
def test_same_seed_same_results(skewed, policy):
    path, trace = skewed
    a = run(path, trace, policy, seed=3)[1]
    b = run(path, trace, policy, seed=3)[1]
    assert comparable(a.summary) == comparable(b.summary)
    assert a.engine.iterations == b.engine.iterations and a.engine.timeline == b.engine.timeline


def test_gpu_only_policies_report_no_host(skewed):
    path, trace = skewed
    for policy in ("lru", "on-demand", "diffmoe"):
        _, out = run(path, trace, policy, predictor="oracle")
        s = out.summary
        assert s["cpu_experts"] == 0 and s["cpu_expert_frac"] == 0.0 and s["cpu_busy_frac"] == 0.0
        assert s["cpu_wait_ms"] == 0.0
        assert sum(s["hits"].values()) + s["misses"] == s["accesses"]
        assert not any(x[0] == "cpu" for x in out.engine.timeline)


# Exact summaries of git HEAD before the host stream (4d6af8e): runs without host experts are unchanged, bit for bit.
# (computed with the tree of 4d6af8e on this module's skewed trace, hpc 1, mpc 1, 3 buffers)
BEFORE = {
    ("lru", "none", 2): {
        "sim_time_s": 0.015118771657435878,
        "events": 1665,
        "copies": 410,
        "misses": 410,
        "hits": {"hpc": 0, "mpc": 227, "lpc": 0},
        "stall_ms": 5.735038244102443,
        "compute_busy_frac": 0.6206677120305687,
        "link_busy_frac": 0.5446083463215436,
    },
    ("diffmoe", "oracle", 3): {
        "sim_time_s": 0.014038379726410243,
        "events": 1747,
        "copies": 510,
        "misses": 168,
        "hits": {"hpc": 156, "mpc": 139, "lpc": 342},
        "stall_ms": 2.66212033641018,
        "compute_busy_frac": 0.8103684051655883,
        "link_busy_frac": 0.7295753202449033,
    },
    ("next-use-odds", "noisy", 1): {
        "sim_time_s": 0.017131886217435926,
        "events": 1903,
        "copies": 507,
        "misses": 178,
        "hits": {"hpc": 0, "mpc": 254, "lpc": 288},
        "stall_ms": 3.319241657435798,
        "compute_busy_frac": 0.806253577959339,
        "link_busy_frac": 0.5943191468104325,
    },
}


@pytest.mark.parametrize("key", list(BEFORE))
def test_runs_without_host_experts_are_unchanged(skewed, key):
    """Exactly the summaries of the engine before the host stream (floats compared exactly, events too)."""
    path, trace = skewed
    policy, predictor, batch = key
    cfg = config_for(path, trace, policy=policy, predictor=predictor, batch=batch, hpc=1, mpc=1, buffers=3)
    s = simulate(cfg, trace=trace).summary
    assert {k: s[k] for k in BEFORE[key]} == BEFORE[key]
    assert s["cpu_experts"] == 0


def test_hybrid_cache_keeps_a_hot_working_set_the_profile_missed(tmp_path):
    """The hot-expert profile names experts 0, 1 (the first half of the trace) but the second half uses 4, 5: with a
    slow host, hybrid-cache copies 4 and 5 and keeps them once their reuse estimate passes the fading one of 0 and 1
    (cache hits after), while fiddler, its slots pinned, copies them again at every use; ktransformers computes
    them on the host."""
    layer_rows = [[0, 1]] * 60 + [[4, 5]] * 60
    e = np.array([[row] for row in layer_rows], dtype=np.int16)  # [120 tokens, 1 layer, top-2]
    trace = make_trace(e, [60, 60], num_experts=8)
    path = save_trace(trace, tmp_path / "t.npz")
    out = {}
    for policy in ("fiddler", "hybrid-cache", "ktransformers"):
        cfg = with_hardware(
            config_for(path, trace, policy=policy, batch=1, hpc=1, mpc=1, buffers=3), cpu_expert_overhead_us=200.0
        )
        out[policy] = simulate(cfg, trace=trace, check_invariants=True).summary
    hy, fi, kt = out["hybrid-cache"], out["fiddler"], out["ktransformers"]
    assert hy["accesses"] == fi["accesses"] == kt["accesses"] == 240
    assert fi["copies"] == 120 and hy["copies"] < 40
    assert fi["hit_rate"]["hpc"] == 0.5 and hy["hit_rate"]["mpc"] > 0.8
    assert kt["copies"] == 0 and kt["cpu_experts"] == 120
    assert hy["throughput_tok_s"] > fi["throughput_tok_s"] and hy["throughput_tok_s"] > kt["throughput_tok_s"]


def test_sim_run_prints_the_host_line(skewed, tmp_path):
    path, trace = skewed
    cfg = config_for(path, trace, policy="ktransformers", batch=2, hpc=1, mpc=1, buffers=3)
    import yaml

    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg.resolved))
    p = subprocess.run(
        [sys.executable, "-m", "sim", "run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "o"), "--timeline"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    assert "host CPU" in p.stdout
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["cpu_experts"] > 0
    tl = json.loads((tmp_path / "o" / "timeline.json").read_text())["traceEvents"]
    assert any(x.get("cat") == "cpu" for x in tl)
