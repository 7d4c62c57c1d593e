"""The validator: the executor runs the simulator's policies for real (CPU as the device) and makes exactly the
simulator's decisions; its copy thread keeps the copy engine's rules; `validate cpu` + `validate compare` write a
measurement folder and an error report; the measuring side needs no SimPy."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import threading
import time

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.decisions.replay import replay
from sim.policies import POLICIES
from sim.run import build_decisions, simulate
from tests.support.paths import ROOT
from tests.support.validate import FakeBackend, tiny_config, with_hardware
from validate.backends import CpuBackend, Landed
from validate.copier import Copier
from validate.executor import Executor
from validate.microbench import combine

CASES = [
    ("arc", "none"),
    ("s3fifo", "noisy"),
    ("least-stale", "oracle"),
    ("learned-rf", "none"),
    ("reuse-distance", "noisy"),
    ("on-demand", "none"),
    ("pregated", "oracle"),
    ("prefetch-all", "none"),
    ("lru", "noisy"),
    ("lfu", "none"),
    ("diffmoe", "noisy"),
    ("diffmoe-arc", "oracle"),
    ("moe-infinity", "moe-infinity"),
    ("belady", "noisy"),
    ("gpu-only", "none"),
    ("next-use-odds", "noisy"),
    ("fiddler", "none"),
    ("ktransformers", "none"),
    ("hybrid-cache", "none"),
    ("lookahead", "oracle"),
]


def test_every_policy_is_covered():
    assert {p for p, _ in CASES} == set(POLICIES.names())


@pytest.mark.parametrize("policy,predictor", CASES)
def test_the_executor_makes_the_simulators_decisions(tiny, policy, predictor):
    cfg = tiny_config(tiny, policy, predictor)
    trace = tiny[2]
    ex = Executor(cfg, trace, CpuBackend(__import__("torch")), host_pool_bytes=6 * 2**16, warmup=1)
    res = ex.run()
    # the protocol replayed without time gives the very decisions the executor made
    policy_obj, predictor_obj = build_decisions(cfg, trace, ex.iterations)
    assert res.decisions == replay(trace, ex.iterations, policy_obj, predictor_obj)
    # and the simulator counts the same hits per tier and misses in every iteration
    sim = simulate(cfg, trace=trace).engine.iterations
    assert len(sim) == len(res.iterations) > 0
    for s, r in zip(sim, res.iterations):
        assert (
            s.hits_hpc,
            s.hits_mpc,
            s.hits_lpc,
            s.misses,
            s.prefetches,
            s.unused_prefetches,
            s.promotions,
            s.evictions,
        ) == (
            r.hits_hpc,
            r.hits_mpc,
            r.hits_lpc,
            r.misses,
            r.prefetches,
            r.unused_prefetches,
            r.promotions,
            r.evictions,
        )
        assert r.latency_s > 0 and r.copies >= r.misses
    assert 0 < res.max_buffers_in_use <= cfg.cache.lpc_buffers or res.copies == 0
    assert res.copies == sum(r.copies for r in res.iterations)
    if res.host_pool < res.logical_experts:
        assert any("physical host buffers" in n for n in res.notes)


def test_promotions_and_d2d_hits_run_on_the_device_buffers(tiny):
    cfg = tiny_config(tiny, "diffmoe", "oracle", batch=8, hpc=1, mpc=5, hit_d2d=True)
    res = Executor(cfg, tiny[2], CpuBackend(__import__("torch")), host_pool_bytes=1 << 20).run()
    assert any(d.promote for d in res.decisions)
    assert sum(r.promotions for r in res.iterations) > 0 and sum(r.evictions for r in res.iterations) > 0
    assert sum(r.hits_mpc for r in res.iterations) > 0


# ------------------------------------------------------------------------------------------------ the copier
def test_demand_copies_overtake_queued_prefetches_but_not_a_copy_in_flight():
    be = FakeBackend(0.02)
    c = Copier(be, lambda layer, e: (layer, e), [None] * 4, reserve=1)
    try:
        c.submit(1, 0, True)  # starts at once: the link is idle
        time.sleep(0.005)
        for e in (1, 2):
            c.submit(1, e, True)  # queued prefetches
        c.submit(0, 9, False)  # demand: goes before the queued prefetches
        got = [c.take(0).expert]
        assert got == [9]
        for _ in range(3):
            job = c.take(1)
            c.release(job, None)
    finally:
        c.close()
    assert be.order[:2] == [(1, 0), (0, 9)]


def test_prefetches_leave_the_reserve_free_and_unused_ones_are_dropped():
    be = FakeBackend(0.001)
    c = Copier(be, lambda layer, e: (layer, e), [None] * 3, reserve=1)
    try:
        jobs = [c.submit(1, e, True) for e in range(5)]
        time.sleep(0.05)
        assert c.copies == 2  # 3 buffers, 1 reserved for demand copies
        c.drop(jobs[0])  # landed and unused: its buffer frees, the next prefetch starts
        time.sleep(0.05)
        assert c.copies == 3
        for j in jobs[3:]:
            c.drop(j)  # never started: cancelled
        time.sleep(0.02)
        assert c.copies == 3 and all(not j.started for j in jobs[3:])
    finally:
        c.close()


def test_a_failing_copy_surfaces_on_the_compute_thread():
    class Broken(FakeBackend):
        def copy_in(self, dst, src, after=None):
            raise OSError("no memory")

    c = Copier(Broken(), lambda layer, e: None, [None] * 2)
    c.submit(0, 1, False)
    with pytest.raises(RuntimeError, match="copy thread failed"):
        c.take(0)
    with pytest.raises(RuntimeError):
        c.close()


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["demand", "prefetch", "drop", "take"]), st.integers(0, 5)), max_size=30),
    st.integers(1, 4),
    st.integers(1, 3),
)
def test_copier_never_overfills_its_buffers_and_lands_every_kept_copy_once(ops, buffers, reserve):
    in_use, peak, lock = set(), [0], threading.Lock()

    class Tracking(FakeBackend):
        def copy_in(self, dst, src, after=None):
            with lock:
                in_use.add(dst)
                peak[0] = max(peak[0], len(in_use))
            return Landed(0.0, 0.0)

    bufs = list(range(buffers))
    c = Copier(Tracking(0), lambda layer, e: e, bufs, reserve=reserve)
    prefetched, demanded = [], []
    try:
        for op, e in ops:
            if op == "demand" and len(demanded) < buffers:  # a layer never waits on more than it can hold
                demanded.append(c.submit(0, e, False))
            elif op == "prefetch":
                prefetched.append(c.submit(1, e, True))
            elif op == "drop" and prefetched:
                c.drop(prefetched.pop(0))
            elif op == "take" and demanded:
                job = c.take(0)
                demanded.remove(job)
                with lock:
                    in_use.discard(job.buffer)
                c.release(job, None)
        while demanded:
            job = c.take(0)
            demanded.remove(job)
            c.release(job, None)
        for j in prefetched:
            c.drop(j)
    finally:
        c.close()
    assert peak[0] <= buffers
    assert len(c.queue.free) == buffers  # every buffer came back


# ------------------------------------------------------------------------------------ measuring and comparing
def test_combined_calibration_is_the_median_of_its_passes():
    def cal(v):
        return {
            "base": "h200",
            "source": "x",
            "compute_slowdown": v,
            "copy_slowdown": 1.0,
            "tables": {"model": "m", "copy": [[1, v], [2, 2 * v]], "dense": [[1, 8, v]]},
        }

    c = combine([cal(1.0), cal(3.0), cal(2.0)])
    assert c["tables"]["copy"] == [[1, 2.0], [2, 4.0]] and c["tables"]["dense"] == [[1, 8, 2.0]]
    assert c["compute_slowdown"] == 2.0 and "median of 3 passes" in c["source"]
    light = {k: v for k, v in cal(9.0).items() if k not in ("compute_slowdown", "copy_slowdown")}
    c = combine([cal(1.0), light, light])  # light passes add table samples, not interference ones
    assert c["compute_slowdown"] == 1.0 and c["tables"]["copy"][0] == [1, 9.0]


def test_interference_slows_the_simulation_but_never_past_its_factors(tiny):
    base = tiny_config(tiny, "lru", "oracle", batch=8)
    slow = with_hardware(base, compute_slowdown=1.5, copy_slowdown=1.2)
    t0 = simulate(base, trace=tiny[2]).summary["sim_time_s"]
    t1 = simulate(slow, trace=tiny[2]).summary["sim_time_s"]
    assert t0 < t1 <= 1.5 * t0 + 1e-12


def test_handoffs_delay_stalled_compute_and_idle_copies_by_at_most_two_per_copy(tiny):
    base = tiny_config(tiny, "on-demand", batch=8)
    r0 = simulate(base, trace=tiny[2], check_invariants=True)
    r1 = simulate(with_hardware(base, handoff_us=50), trace=tiny[2], check_invariants=True)
    t0, t1 = r0.summary["sim_time_s"], r1.summary["sim_time_s"]
    assert t0 < t1 <= t0 + 2 * 50e-6 * r1.summary["copies"] + 1e-12
    assert r1.summary["stall_ms"] > r0.summary["stall_ms"]
    assert [(r.hits_hpc, r.misses, r.copies) for r in r0.engine.iterations] == [
        (r.hits_hpc, r.misses, r.copies) for r in r1.engine.iterations
    ]  # time moves, decisions do not


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """`validate cpu` on three configurations of the CPU suite (quick: 4 decode steps, one round)."""
    out = tmp_path_factory.mktemp("v") / "cpu"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "validate",
            "cpu",
            "--out",
            str(out),
            "--quick",
            "--rounds",
            "1",
            "--repeat",
            "3",
            "--configs",
            "on-demand-b4,diffmoe-b8-c6,moe-infinity-b8-c6",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    return out, res.stdout


def test_validate_cpu_writes_a_measurement_folder(measured):
    out, log = measured
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["configs"] == ["on-demand-b4", "diffmoe-b8-c6", "moe-infinity-b8-c6"]
    assert manifest["device_kind"] == "cpu" and len(manifest["traces"]) == 1
    for name in manifest["configs"]:
        s = json.loads((out / "runs" / name / "summary.json").read_text())
        assert s["iterations"] == 4 and s["iteration_ms"]["mean"] > 0 and s["rounds"] == 1
        assert s["decisions_same_every_round"]
        assert (out / "runs" / name / "round-0" / "iterations.csv").exists()
        written = yaml.safe_load((out / "runs" / name / "config.yaml").read_text())["policy"]
        assert set(POLICIES.get(written["name"]).PARAMS) <= set(written["params"])  # defaults written out
        # the compute stream's stall is part of an iteration; the host's busy time is never negative
        assert 0 <= s["stall_ms"] <= s["iteration_ms"]["mean"] and s["host_busy_ms"] > 0
        assert s["mean_copy_ms"] > 0 and s["copy_gaps"] <= s["copies"]
    cal = yaml.safe_load((out / "calibration.yaml").read_text())
    assert cal["compute_slowdown"] >= 1 and cal["copy_slowdown"] >= 1 and cal["handoff_us"] >= 0
    assert cal["copy_gap_us"] >= 0
    assert all(cal[k] > 0 for k in ("layer_roundtrip_us", "copy_issue_us", "expert_issue_us", "hit_issue_us"))
    assert manifest["machine_before"]["mem_total_gib"] > 0 and "machine_after" in manifest
    passes = json.loads((out / "calibration-passes.json").read_text())
    assert ["handoff_us" in p for p in passes] == [True, False, False, False]  # one full, a light one per run
    assert "median of 4 passes" in cal["source"]
    assert "next: python -m validate compare" in log


def test_validate_compare_reports_the_error_and_identical_decisions(measured, tmp_path):
    out, _ = measured
    res = subprocess.run(
        [sys.executable, "-m", "validate", "compare", str(out), "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    rows = list(csv.DictReader((tmp_path / "compare.csv").open()))
    assert [r["config"] for r in rows] == ["on-demand-b4", "diffmoe-b8-c6", "moe-infinity-b8-c6"]
    for r in rows:
        assert r["decisions_identical"] == "True", r
        real, sim = float(r["real_mean_ms"]), float(r["sim_mean_ms"])
        # the CSV rounds to 6 significant digits: near 0% the recomputed error differs by ~1e-3 points
        assert float(r["err_mean_pct"]) == pytest.approx(100 * (sim - real) / real, rel=1e-3, abs=1e-2), r
    md = (tmp_path / "compare.md").read_text()
    assert "Median absolute error over 3 configurations" in md
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert "median |error|" in res.stdout


def test_compare_fails_when_the_trace_changed(measured, tmp_path):
    out, _ = measured
    copy = tmp_path / "m"
    subprocess.run(["cp", "-r", str(out), str(copy)], check=True)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["traces"] = {k: "0" * 64 for k in manifest["traces"]}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    res = subprocess.run(
        [sys.executable, "-m", "validate", "compare", str(copy)], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 2 and "checksum" in res.stderr


@pytest.mark.parametrize(
    "args,word",
    [
        (["compare", "/no/such/folder"], "/no/such/folder"),
        (["cpu", "--out", "{tmp}/x", "--configs", "no-such-config"], "--configs"),
        (["gpu", "--out", "{tmp}/x"], "--device"),
        (["cpu", "--out", "{tmp}/x", "--host-pool-gb", "1e9"], "--host-pool-gb"),
        (["cpu", "--out", "{tmp}/x", "--host-pool-gb", "0"], "--host-pool-gb"),
    ],
)
def test_bad_input_exits_2_with_the_field_named(tmp_path, args, word):
    import torch

    if args[0] == "gpu" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = subprocess.run([sys.executable, "-m", "validate", *args], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and word in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_measuring_needs_no_simpy():
    code = (
        "import sys; sys.modules['simpy'] = None; sys.modules['matplotlib'] = None\n"
        "import validate.cli, validate.measure, validate.executor, validate.microbench\n"
        "print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_the_gpu_check_script_runs_the_same_path_on_the_cpu(tmp_path):
    out = tmp_path / "check"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "DEVICE": "cpu",
        "ROUNDS": "1",
        "EXTRA": "--quick --configs lru-b8-c6 --repeat 3",
    }
    res = subprocess.run(
        ["bash", str(ROOT / "validate" / "run_gpu_check.sh"), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    assert (out / "runs" / "lru-b8-c6" / "summary.json").exists() and (out / "calibration.yaml").exists()
    assert (out / "env-before.txt").exists() and (out / "env-after.txt").exists() and (out / "run.log").exists()
    assert f"next: python -m validate compare {out}" in res.stdout


def test_the_packed_gpu_check_leaves_five_flat_files_and_compare_reads_the_archive(tmp_path):
    pack = tmp_path / "out"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "DEVICE": "cpu",
        "ROUNDS": "1",
        "EXTRA": "--quick --configs on-demand-b4 --repeat 3",
    }
    res = subprocess.run(
        ["bash", str(ROOT / "validate" / "run_gpu_check.sh"), "--pack", str(pack)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    files = sorted(p.name for p in pack.iterdir())
    assert files == ["calibration.yaml", "env-after.txt", "env-before.txt", "gpu-check.tar.gz", "run.log"]
    assert all(p.is_file() for p in pack.iterdir())  # flat: a runner returning plain files gets all of them
    assert "[1/1] on-demand-b4" in (pack / "run.log").read_text()
    res = subprocess.run(
        [sys.executable, "-m", "validate", "compare", str(pack / "gpu-check.tar.gz")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr + res.stdout
    rows = list(csv.DictReader((pack / "gpu-check" / "compare" / "compare.csv").open()))
    assert [r["config"] for r in rows] == ["on-demand-b4"] and rows[0]["decisions_identical"] == "True"
    assert (pack / "gpu-check" / "env-before.txt").exists()
    manifest = json.loads((pack / "gpu-check" / "manifest.json").read_text())
    before, after = manifest["machine_before"], manifest["machine_after"]
    assert before["torch"] and after["date"] >= before["date"]


def test_compare_refuses_an_archive_that_is_not_a_measurement(tmp_path):
    import tarfile

    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    with tarfile.open(tmp_path / "junk.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "junk", arcname="junk")
    (tmp_path / "junk" / "notes.txt").unlink()
    (tmp_path / "junk").rmdir()
    (tmp_path / "broken.tar.gz").write_bytes(b"\x1f\x8b not really gzip")
    for name in ("junk.tar.gz", "broken.tar.gz"):
        res = subprocess.run(
            [sys.executable, "-m", "validate", "compare", str(tmp_path / name)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 2 and name in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.tar.gz", "junk.tar.gz"]  # nothing left behind


def test_the_gpu_check_script_refuses_a_machine_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    res = subprocess.run(
        ["bash", str(ROOT / "validate" / "run_gpu_check.sh"), str(tmp_path / "o")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "CUDA is not available" in res.stderr
    assert not (tmp_path / "o").exists()
