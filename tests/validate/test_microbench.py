"""`python -m validate microbench`: a calibration file the simulator accepts, from real measurements (CPU)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml

from moebase.model import load_model
from sim.config.hardware import load_hardware
from sim.costs.costs import CostModel
from tests.support.paths import ROOT
from tests.support.traces import TINY_MODEL, random_trace
from traces.io import save_trace

TINY = TINY_MODEL


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    d = tmp_path_factory.mktemp("cal")
    model_path = d / "tiny-moe.yaml"
    model_path.write_text(yaml.safe_dump(TINY))
    out = d / "cal.yaml"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "validate",
            "microbench",
            "--model",
            str(model_path),
            "--out",
            str(out),
            "--quick",
            "--repeat",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    return model_path, out


def test_the_calibration_file_is_a_hardware_profile_with_measured_tables(calibration):
    model_path, out = calibration
    hw = load_hardware(str(out))
    t = hw.tables
    assert t.model == "tiny-moe" and hw.name == "h200"
    assert "CPU" in yaml.safe_load(out.read_text())["source"]  # the machine it came from
    assert len(t.copy) == 4 and len(t.expert) == 4 and len(t.dense) == 6
    assert all(s > 0 for _, s in t.copy) and all(s > 0 for _, s in t.expert)
    # the host CPU's expert time, by the executor's host pool, whose threads are the profile's cores
    assert [int(n) for n, _ in t.cpu_expert] == [1, 4, 16, 64] and all(s > 0 for _, s in t.cpu_expert)
    assert hw.cpu_cores == yaml.safe_load(out.read_text())["cpu_cores"] >= 1
    assert t.copy[-1][1] > t.copy[0][1]  # 2 experts' bytes take longer than 1/64 of one
    model = load_model(str(model_path))
    costs = CostModel(model, hw)
    tokens, seconds = t.expert[1]
    assert costs.expert_s(int(tokens)) == pytest.approx(seconds)  # the table replaces the roofline
    nbytes, seconds = t.copy[2]
    assert costs.copy_s(int(nbytes)) == pytest.approx(seconds)


def test_the_simulator_runs_on_the_calibration(calibration, tmp_path):
    from sim.config.run_config import config_from_dict
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS
    from sim.run import simulate

    model_path, out = calibration
    trace = random_trace(np.random.default_rng(0), tokens=60, layers=2, experts=8, k=2)
    trace = type(trace)(
        trace.experts,
        trace.request_offsets,
        trace.prefill_lengths,
        type(trace.meta)(
            **{**trace.meta.__dict__, "model": type(trace.meta.model)("tiny-moe", 8, 2, trace.meta.model.layers)}
        ),
    )
    path = save_trace(trace, tmp_path / "t.npz")
    cfg = config_from_dict(
        {
            "model": str(model_path),
            "hardware": str(out),
            "workload": {"trace": str(path), "batch_size": 2},
            "cache": {"hpc_slots": 1, "mpc_slots": 2, "lpc_buffers": 4},
            "policy": "lru",
        },
        "test",
        POLICIES.names(),
        PREDICTORS.names(),
    )
    s = simulate(cfg, trace=trace).summary
    assert s["throughput_tok_s"] > 0 and s["copies"] > 0


def test_bad_device_and_model_exit_2(tmp_path):
    for args, word in (
        (["--model", "no-such-model"], "--model"),
        (["--model", "switch-base-128", "--device", "cuda"], "--device"),
    ):
        res = subprocess.run(
            [sys.executable, "-m", "validate", "microbench", *args, "--out", str(tmp_path / "c.yaml")],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 2 and word in res.stderr, res.stderr
        assert not (tmp_path / "c.yaml").exists()
