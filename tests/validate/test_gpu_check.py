"""What the GPU check (validate/executor.py, copier.py, microbench.py) depends on, checked on the CPU path: copies timed
apart from the hand-offs between them, the simulator's copy gap, the host pool kept within the host's memory, every GEMM
shape warmed before timing, loads that run on the compute stream and are running before a loaded timing starts, and
progress that reaches a pipe."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.run import simulate
from tests.support.paths import ROOT
from tests.support.validate import FakeBackend, tiny_config, with_hardware
from validate.backends import CpuBackend
from validate.copier import Copier
from validate.measure import host_pool_size, pinned_bytes
from validate.microbench import Background

GIB = 1 << 30


@given(st.integers(1, 1 << 40))
def test_pinned_bytes_is_the_next_power_of_two(n):
    p = pinned_bytes(n)
    assert p & (p - 1) == 0 and n <= p < 2 * n


def test_an_explicit_host_pool_beyond_the_host_is_refused_counting_the_pinned_rounding():
    mem = {"MemTotal": 64 * GIB, "MemAvailable": 64 * GIB}  # can spare min(48, 56) = 48 GiB
    expert = 300 << 20  # pinned as 512 MiB
    assert host_pool_size(40, 8, expert, pinned=False, mem=mem, log=lambda m: None) == 40 * GIB
    with pytest.raises(ConfigError) as exc:
        host_pool_size(40, 8, expert, pinned=True, mem=mem, log=lambda m: None)  # 136 x 512 MiB = 68 GiB
    assert exc.value.field == "--host-pool-gb" and "512 MiB" in str(exc.value)
    with pytest.raises(ConfigError):
        host_pool_size(-1, 8, expert, pinned=True, mem=mem)


def test_the_default_host_pool_is_cut_down_to_what_the_host_can_spare():
    mem = {"MemTotal": 16 * GIB, "MemAvailable": 12 * GIB}  # can spare min(12, 4) = 4 GiB
    said = []
    got = host_pool_size(None, 8, 300 << 20, pinned=True, mem=mem, log=said.append)
    assert got // (300 << 20) * pinned_bytes(300 << 20) <= 4 * GIB and got >= 2 * (300 << 20)
    assert said and "does not fit" in said[0]
    with pytest.raises(ConfigError):  # not even two buffers fit
        host_pool_size(None, 8, 300 << 20, pinned=True, mem={"MemTotal": 10 * GIB, "MemAvailable": 8.5 * GIB})


def test_the_copier_times_copies_apart_from_the_link_gaps_between_queued_ones():
    be = FakeBackend(0.01)
    c = Copier(be, lambda layer, e: e, [0, 1, 2, 3], reserve=1)
    try:
        jobs = [c.submit(0, e, False) for e in range(4)]  # all queued before the first lands: back to back
        for _ in jobs:
            c.release(c.take(0), None)
        time.sleep(0.02)
        c.submit(0, 9, False)  # asked of an idle link: no gap counted
        c.release(c.take(0), None)
    finally:
        c.close()
    copy_s, gap_s, gaps = c.timings()
    assert c.copies == 5 and gaps == 3
    assert 5 * 0.01 <= copy_s < 5 * 0.01 + 0.05
    assert 0 <= gap_s < 0.03 * 3  # the copy thread's wake-up, never the copies themselves


def test_the_copy_gap_delays_only_queued_copies_and_changes_no_decision(tiny):
    base = tiny_config(tiny, "on-demand", batch=8)
    r0 = simulate(base, trace=tiny[2], check_invariants=True)
    r1 = simulate(with_hardware(base, copy_gap_us=40), trace=tiny[2], check_invariants=True)
    t0, t1 = r0.summary["sim_time_s"], r1.summary["sim_time_s"]
    assert t0 < t1 <= t0 + 40e-6 * r1.summary["copies"] + 1e-12
    assert [(r.misses, r.copies) for r in r0.engine.iterations] == [(r.misses, r.copies) for r in r1.engine.iterations]
    one = tiny_config(tiny, "on-demand", batch=1, lpc=1)  # one buffer: never a copy queued behind another
    assert simulate(with_hardware(one, copy_gap_us=40), trace=tiny[2]).summary["sim_time_s"] == pytest.approx(
        simulate(one, trace=tiny[2]).summary["sim_time_s"]
    )


def test_the_executor_warms_every_gemm_shape_it_will_time(tiny, monkeypatch):
    import torch

    import validate.executor as executor

    seen = {"warm": set(), "timed": set()}
    phase = {"now": "warm"}
    real = executor.expert_forward

    def recording(torch_, weights, x, gated):
        seen[phase["now"]].add(int(x.shape[0]))
        return real(torch_, weights, x, gated)

    monkeypatch.setattr(executor, "expert_forward", recording)
    ex = executor.Executor(tiny_config(tiny, "lru", batch=8), tiny[2], CpuBackend(torch), host_pool_bytes=6 << 16)
    original = ex._run

    def timed(iterations, policy, predictor, record):
        phase["now"] = "timed" if record else "warm"
        return original(iterations, policy, predictor, record)

    ex._run = timed
    ex.run()
    assert seen["timed"] and seen["timed"] <= seen["warm"]
    assert set(range(1, max(seen["timed"]) + 1)) <= seen["warm"]


def test_a_background_load_runs_on_the_compute_stream_and_is_running_before_the_block():
    local = threading.local()

    class Streams(FakeBackend):
        torch = __import__("torch")

        @contextmanager
        def on_compute(self):
            local.on = True
            yield

    calls = []

    def load():
        calls.append(getattr(local, "on", False))
        time.sleep(0.001)

    with Background(load, Streams()):
        assert calls and all(calls)


def test_progress_lines_reach_a_pipe_at_once():
    code = (
        "import sys; from validate.cli import main; main(['compare', '/no/such']); "
        "print(sys.stdout.line_buffering, sys.stderr.line_buffering)"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.stdout.strip() == "True True", res.stderr


def test_the_validator_refuses_an_expert_width_it_cannot_run_naming_the_field(tmp_path):
    # int4 and int8 run (test_executor_quantized)
    (tmp_path / "m.yaml").write_text("base: gpt-oss-20b\nexpert_bits: 6\n")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "validate",
            "microbench",
            "--model",
            str(tmp_path / "m.yaml"),
            "--out",
            str(tmp_path / "c.yaml"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "--model.expert_bits" in res.stderr, res.stderr
    assert not (tmp_path / "c.yaml").exists()
