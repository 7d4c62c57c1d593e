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

from sim.config.run_config import config_from_dict
from sim.core.cache import HPC, MPC
from sim.run import simulate
from tests.reference.diffmoe import plain_diffmoe
from tests.reference.lru import plain_lru_hits
from tests.support.cli import run_module
from tests.support.engine import POLICY_NAMES, PREDICTOR_NAMES, comparable, config_for, tiny_model
from tests.support.paths import ROOT
from tests.support.traces import make_trace, random_trace
from traces.io import save_trace


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10**6),
    batch=st.integers(1, 5),
    hpc=st.integers(0, 2),
    mpc=st.integers(0, 3),
    buffers=st.integers(1, 6),
    k=st.integers(1, 2),
    predictor=st.sampled_from(["none", "oracle", "noisy"]),
    batching=st.sampled_from(["static", "continuous"]),
    enc_dec=st.booleans(),
)
def test_engine_invariants_on_random_traces_and_configs(
    tmp_path, seed, batch, hpc, mpc, buffers, k, predictor, batching, enc_dec
):
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
        cfg = config_for(
            path, trace, policy, predictor, batch, hpc, mpc, buffers, batching, seed=seed, predictor_params=pred_params
        )
        out = simulate(cfg, timeline=True, check_invariants=True, trace=trace)  # tiers checked after every layer
        s, res = out.summary, out.engine
        hits = s["hits"]
        assert hits["hpc"] + hits["mpc"] + hits["lpc"] + s["misses"] + s["cpu_experts"] == s["accesses"]
        assert s["accesses"] == sum(
            r.hits_hpc + r.hits_mpc + r.hits_lpc + r.misses + r.cpu_experts for r in res.iterations
        )
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
    """The legacy rules (this simulator's diffmoe before it followed the artifact) through the engine; the default
    (the artifact's rules) through the engine is checked against fetcher.cc in tests/test_diffmoe_artifact.py."""
    from tests.reference.diffmoe import LEGACY
    from tests.support.policies import ONE_LAYER_HAND_MADE

    trace = make_trace(ONE_LAYER_HAND_MADE, num_experts=6)
    path = save_trace(trace, tmp_path / "t.npz")
    ranking = [list(range(6))]
    cfg = config_for(path, trace, "diffmoe", "none", batch=1, hpc=1, mpc=2, policy_params=LEGACY)
    cfg = config_from_dict(
        {**cfg.resolved, "model": tiny_model(trace), "cache": {**cfg.resolved["cache"], "hot_profile": ranking}},
        "test",
        POLICY_NAMES,
        PREDICTOR_NAMES,
    )
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
    assert (
        simulate(config_for(path, trace, "lru", batch=3, batching="continuous"), trace=trace).summary["requests_served"]
        == 7
    )


# ------------------------------------------------------------------------------------------------ real trace


@pytest.mark.parametrize("policy", ["lru", "diffmoe"])
@pytest.mark.parametrize("batch", [1, 4])
def test_real_mixtral_trace_runs_end_to_end(mixtral_real, tmp_path, policy, batch):
    out = tmp_path / f"{policy}-{batch}"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "run",
            "configs/mixtral.yaml",
            "--json",
            "--out",
            str(out),
            "--set",
            f"workload.trace={mixtral_real['both']}",
            "--set",
            f"workload.batch_size={batch}",
            "--set",
            f"policy.name={policy}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["throughput_tok_s"] > 0 and 0 < s["hit_rate"]["overall"] <= 1
    assert s["requests_reused"] == (0 if batch <= 4 else s["requests_served"] - 4)
    assert {p.name for p in out.iterdir()} == {"config.resolved.yaml", "summary.json", "iterations.csv"}


# ------------------------------------------------------------------------------------------------------- CLI


def test_default_run_writes_every_result_file_and_a_perfetto_timeline(tmp_path):
    out = tmp_path / "run"
    res = run_module(
        "sim",
        "run",
        "configs/switch_xxl.yaml",
        "--out",
        out,
        "--timeline",
        "--set",
        "workload.requests=16",
        "--set",
        "workload.max_decode_tokens=8",
    )
    assert res.returncode == 0, res.stderr
    assert "throughput" in res.stdout and "hit rate" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "throughput_tok_s",
        "iteration_ms",
        "hit_rate",
        "pcie_bytes",
        "link_busy_frac",
        "compute_busy_frac",
        "stall_ms",
        "prefetch",
        "events",
        "wall_s",
    ):
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


@pytest.mark.parametrize(
    "override, field",
    [
        ("workload.batch_size=0", "workload.batch_size"),
        ("workload.batching=dynamic", "workload.batching"),
        ("workload.colour=red", "workload.colour"),
        ("cache.mpc_slots=2000", "cache"),
        ("policy.name=clairvoyant", "policy.name"),
        ("predictor.name=psychic", "predictor.name"),
        ("model=mixtral-8x7b", "workload.trace"),
        ("hardware.pcie_bw_gb_s=-1", "hardware"),
        ("policy.params.threshold=high", "policy.params.threshold"),
    ],
)
def test_bad_configs_exit_2_naming_the_field_and_write_nothing(tmp_path, override, field):
    out = tmp_path / "out"
    res = run_module("sim", "run", "configs/switch_xxl.yaml", "--out", out, "--set", override)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and field in res.stderr, res.stderr
    assert not out.exists()


def test_missing_config_and_bad_yaml_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    for path in (tmp_path / "absent.yaml", bad):
        res = run_module("sim", "run", path, "--out", tmp_path / "o")
        assert res.returncode == 2 and str(path) in res.stderr and res.stderr.count("\n") == 1


# --------------------------------------------------------------------------------- SimPy's public API only


def engine_for(cfg, trace, **kw):
    """The engine of one run, built as ``sim.run.simulate`` builds it (so that a test can hand it an environment)."""
    from sim.core.workload import build_iterations
    from sim.costs.costs import CostModel
    from sim.decisions.build import build_decisions
    from sim.decisions.protocol import DecisionProtocol
    from sim.predictors.base import PredictionScore
    from sim.timing.engine import Simulation

    w = cfg.workload
    iterations, _ = build_iterations(trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests)
    policy, predictor = build_decisions(cfg, trace, iterations)
    protocol = DecisionProtocol(trace, policy, predictor, PredictionScore(len(trace.meta.model.layers)), record=True)
    return Simulation(
        trace,
        iterations,
        protocol,
        CostModel(cfg.model, cfg.hardware, cfg.system),
        cfg.cache.lpc_buffers,
        cfg.cache.prefetch_reserve,
        **kw,
    )


def background_copies(env, link_s, seen, stream):
    """Another SimPy process in the run's environment: a background copy stream (an NVMe tier, say) that copies
    one block after another on a link of its own, and records, at each landing, SimPy's time and the compute
    stream's."""
    while True:
        yield env.timeout(link_s)
        seen.append((env.now, stream().now))


@pytest.mark.parametrize(
    "policy, predictor, batch, extra",
    [
        ("lru", "oracle", 2, {}),
        (
            "diffmoe",
            "noisy",
            1,
            {
                "hardware": {
                    "base": "h200",
                    "handoff_us": 7,
                    "copy_gap_us": 3,
                    "compute_slowdown": 1.3,
                    "layer_roundtrip_us": 40,
                }
            },
        ),
        ("lru", "none", 3, {"system": {"base": "ideal", "copy_stream": "serial", "writeback_evicted": True}}),
    ],
)
def test_an_extra_simpy_process_runs_beside_the_engine_and_changes_no_decision(
    tmp_path, policy, predictor, batch, extra
):
    import simpy

    trace = random_trace(np.random.default_rng(11), tokens=90, layers=4, experts=8, k=2, requests=3)
    path = save_trace(trace, tmp_path / "t.npz")
    cfg = config_for(path, trace, policy, predictor, batch, hpc=1, mpc=2, buffers=3)
    if extra:
        cfg = config_from_dict({**cfg.resolved, **extra}, "test", POLICY_NAMES, PREDICTOR_NAMES)
    alone = engine_for(cfg, trace).run()
    env = simpy.Environment()
    shared = engine_for(cfg, trace, timeline=True)
    seen = []
    env.process(background_copies(env, alone.sim_time_s / 97, seen, lambda: shared.stream))
    res = shared.run(env)
    assert res.decisions == alone.decisions and len(res.decisions) > 0
    assert res.iterations == alone.iterations  # the other process shares nothing: the same times and counts
    assert (res.sim_time_s, res.stall_s, res.copies, res.events) == (
        alone.sim_time_s,
        alone.stall_s,
        alone.copies,
        alone.events,
    )
    # the background stream ran all along, at its own times, and never saw the compute stream ahead of SimPy
    assert len(seen) >= 90 and all(b[0] > a[0] for a, b in zip(seen, seen[1:]))
    assert all(stream_now <= now for now, stream_now in seen)
    assert env.now == res.sim_time_s  # SimPy's clock at the run's end
    copies = [t for tr, _, t, _ in res.timeline if tr == "copy"]
    assert len(copies) == res.copies


@settings(max_examples=60, deadline=None)
@given(
    waits=st.lists(st.sampled_from([0.0, 1e-9, 3e-7, 1e-3, 0.1, 0.7, 3.0, 1 / 3, 1e-6 / 7]), min_size=1, max_size=40),
    others=st.lists(st.sampled_from([1e-9, 3e-7, 1e-3, 0.05, 1 / 3, 2.0]), max_size=12),
)
def test_a_stream_clock_keeps_a_process_times_and_runs_every_event_due_by_each_wait(waits, others):
    """The stream clock's times are those of a SimPy process that yields one timeout per wait (the same float
    sums), another process's events keep their times, and every event due by the end of a wait runs before the
    stream goes on (also one due at that very end): the log is in order of time, the other process first at a tie."""
    import simpy

    from sim.timing.clock import StreamClock

    def other(env, log):  # another process: its own waits, each logged at SimPy's time
        for i, d in enumerate(others):
            yield env.timeout(d)
            log.append((env.now, 0, i))

    env = simpy.Environment()
    log = []
    env.process(other(env, log))
    env.step()  # the other process starts
    clock = StreamClock(env)
    for i, dt in enumerate(waits):
        clock.wait(dt)
        log.append((clock.now, 1, i))
    clock.catch_up()

    ref_env, ref = simpy.Environment(), []

    def stream():
        for dt in waits:
            yield ref_env.timeout(dt)
            ref.append(ref_env.now)

    ref_env.run(until=ref_env.process(stream()))
    assert [t for t, who, _ in log if who == 1] == ref
    other_times, t = [], 0.0
    for d in others:
        t += d  # SimPy's sum: now + delay
        other_times.append(t)
    assert [t for t, who, _ in log if who == 0] == [t for t in other_times if t <= ref[-1]]
    assert log == sorted(log)
    assert env.now == clock.now == ref[-1]


def test_a_copy_event_due_at_the_end_of_a_wait_runs_before_the_stream_goes_on():
    """An event scheduled during a wait for that wait's very end (an older timeout than SimPy's order would put
    first) runs before the stream goes on, as in the engine's model: every event due by a wait's end has run."""
    import simpy

    from sim.timing.clock import StreamClock

    env = simpy.Environment()
    clock = StreamClock(env)
    ran = []
    first = env.timeout(0.25)
    first.callbacks.append(lambda ev: env.timeout(0.75).callbacks.append(lambda e: ran.append(env.now)))
    clock.wait(1.0)  # the second timeout lands at 0.25 + 0.75 = 1.0, scheduled after the wait's own
    assert ran == [1.0] and clock.now == 1.0


def test_the_engine_uses_only_simpys_public_api():
    """No private attribute of SimPy's (``_now``, ``_eid``, ``_queue``), and nothing pushed on its heap by hand."""
    import re

    for name in ("sim/timing/engine.py", "sim/timing/copy_engine.py", "sim/timing/clock.py"):
        text = (ROOT / name).read_text()
        assert not re.search(r"\b(env|environment)\._\w+|\._(now|eid|queue)\b|heappush|heappop", text), name


def test_the_copy_engine_alone_lands_one_copy_at_a_time_on_simpys_clock():
    """Without a stream clock the copy engine runs on SimPy's own: copies one after another, demand first, each
    landing ``copy_s`` after the last, in a working buffer that stays taken until released."""
    import simpy

    from sim.timing.copy_engine import CopyEngine

    env = simpy.Environment()
    copy = CopyEngine(env, copy_s=0.5, nbytes=10, buffers=2, reserve=1, handoff=0.0)
    first, second = copy.submit(0, 3, False), copy.submit(0, 4, False)
    prefetch = copy.submit(1, 7, True)
    env.run()
    assert [j.expert for j in copy.ready[0]] == [3, 4] and (first.end, second.end) == (0.5, 1.0)
    assert not prefetch.started and copy.copies == 2 and copy.events == 2  # both buffers taken
    copy.release(copy.ready[0].popleft())
    env.run()
    assert not prefetch.started  # a prefetch leaves the reserve free
    copy.release(copy.ready[0].popleft())
    env.run()
    assert prefetch.finished and (prefetch.start, prefetch.end) == (1.0, 1.5) and env.now == 1.5
    assert copy.pcie_bytes == 30 and copy.events == 3 and copy.busy_s == 1.5
