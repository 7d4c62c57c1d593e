"""`python -m sim sweep`: the CI sweep's checks, resuming after SIGKILL, failing points, bad sweep files.
(Dying workers, retries and orphan temporary files: tests/sim/sweep/test_local_faults.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from tests.support.paths import ROOT

SWEEP_CMD = [sys.executable, "-m", "sim", "sweep"]


def _sweep(*args, **kw):
    return subprocess.run([*SWEEP_CMD, *map(str, args)], cwd=ROOT, capture_output=True, text=True, **kw)


def test_ci_sweep_runs_and_its_invariant_checks_pass(tmp_path):
    out = tmp_path / "ci"
    res = _sweep("configs/sweeps/ci.yaml", "--out", out, "--workers", "2")
    assert res.returncode == 0, res.stderr + res.stdout  # exit 3 would mean a check failed
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 36 and df["point"].is_unique
    # Switch-XXL's every expert does not fit one H200: gpu-only's 6 points are "does not fit" rows, the rest ran
    gpu_only = df["policy.name"] == "gpu-only"
    assert (df.loc[gpu_only, "status"] == "does not fit").all() and (df.loc[~gpu_only, "status"] == "ok").all()
    report = (out / "report.md").read_text()
    for check in ("belady_bound", "lru_monotone_in_cache"):
        assert f"`{check}`: passed" in report
    assert "`gpu_only_ceiling`: not applicable (gpu-only does not fit in the GPU's memory at 6 of its 6" in report
    assert (out / "throughput_vs_cache_slots.png").stat().st_size > 1000


def _write_sweep(path, body):
    path.write_text(f"base: {ROOT / 'configs' / 'switch_xxl.yaml'}\n" + body)
    return path


def test_a_sweep_killed_midway_resumes_without_recomputing_finished_points(tmp_path):
    sweep = _write_sweep(
        tmp_path / "s.yaml",
        """
set: {workload.requests: 16, workload.max_decode_tokens: 64, workload.prefill: false}
grid:
  policy.name: [on-demand, lru, diffmoe, lfu]
  workload.batch_size: [1, 4]
""",
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*SWEEP_CMD, str(sweep), "--out", str(out), "--workers", "1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    rows = out / "rows"
    deadline = time.time() + 120
    while time.time() < deadline and (not rows.exists() or len(list(rows.glob("*.parquet"))) < 2):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {f.name: f.stat().st_mtime_ns for f in rows.glob("*.parquet")}
    assert 2 <= len(finished) < 8, "the sweep should have been killed midway"
    again = _sweep(sweep, "--out", out)
    assert again.returncode == 2 and "--resume" in again.stderr  # never mixes two sweeps silently
    res = _sweep(sweep, "--out", out, "--resume", "--workers", "2")
    assert res.returncode == 0, res.stderr
    assert f"{len(finished)} already done" in res.stderr
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 8 and df["point"].is_unique and (df["status"] == "ok").all()
    for name, mtime in finished.items():  # finished points were not recomputed
        assert (rows / name).stat().st_mtime_ns == mtime


def test_a_failing_point_is_recorded_and_the_others_run(tmp_path):
    sweep = _write_sweep(
        tmp_path / "s.yaml",
        """
set: {workload.requests: 8, workload.max_decode_tokens: 8, policy.name: diffmoe}
grid:
  policy.params.threshold: [1.0, 0.7, 0.5]
""",
    )
    out = tmp_path / "out"
    # the test hook of sim.sweep.worker makes this point raise, as a bug in the simulator would
    res = _sweep(
        sweep, "--out", out, "--workers", "2", env={**os.environ, "SIM_SWEEP_TEST_FAIL": "policy.params.threshold=0.7"}
    )
    assert res.returncode == 4, res.stderr  # 4: the sweep finished with failed points
    assert "1 of 3 points failed" in res.stderr and "--resume" in res.stderr
    df = pd.read_parquet(out / "results.parquet").set_index("policy.params.threshold")
    assert df.loc[0.7, "status"] == "failed" and "RuntimeError: failing on purpose" in df.loc[0.7, "error"]
    assert (df["attempts"] == 1).all()  # a point that fails (rather than killing its worker) is not retried
    assert set(df.index) == {1.0, 0.7, 0.5}
    assert (df.drop(index=0.7)["status"] == "ok").all()
    assert "Failed points" in (out / "report.md").read_text()


def test_an_axis_of_mixed_types_is_stored_as_text(tmp_path):
    from sim.sweep.cli import Sweep, write_report

    sweep = Sweep("mixed", {}, {}, ["policy.params.threshold"], [], [], "inline")
    df = pd.DataFrame(
        {
            "point": ["a", "b"],
            "status": ["ok", "failed"],
            "error": [None, "ValueError: no"],
            "policy.params.threshold": [1.0, "high"],
            "throughput_tok_s": [5.0, None],
        }
    )
    for col in ("iteration_ms_mean", "hit_rate", "hit_rate_hpc", "hit_rate_mpc", "hit_rate_lpc", "pcie_bytes"):
        df[col] = [0.5, None]
    write_report(tmp_path, sweep, df, {})
    stored = pd.read_parquet(tmp_path / "results.parquet")
    assert list(stored["policy.params.threshold"]) == ["1.0", "high"]
    assert "- b: ValueError: no" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    "body, field",
    [
        ("grid: {policy.name: [lru]}\ncolour: red\n", "sweep.colour"),
        ("grid: {policy.name: []}\n", "sweep.grid.policy.name"),
        ("zip: {cache.hpc_slots: [1, 2], cache.mpc_slots: [3]}\n", "sweep.zip"),
        ("grid: {workload.batch_size: [0]}\n", "workload.batch_size"),
        ("grid: {policy.name: [lru]}\nchecks: [everything_fine]\n", "sweep.checks"),
    ],
)
def test_bad_sweep_files_exit_2_naming_the_field(tmp_path, body, field):
    sweep = _write_sweep(tmp_path / "s.yaml", body)
    out = tmp_path / "out"
    res = _sweep(sweep, "--out", out)
    assert res.returncode == 2 and field in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert not out.exists()


def test_the_ray_executor_gives_the_same_rows_as_the_local_one(tmp_path):
    pytest.importorskip("ray", reason="ray is part of the test extras; install with pip install -e '.[test]'")
    sweep = _write_sweep(
        tmp_path / "s.yaml",
        """
set: {workload.requests: 8, workload.max_decode_tokens: 16, workload.prefill: false}
grid:
  policy.name: [on-demand, lru, diffmoe]
  workload.batch_size: [1, 4]
""",
    )
    rows = {}
    for executor in ("local", "ray"):
        out = tmp_path / executor
        res = _sweep(
            sweep,
            "--out",
            out,
            "--executor",
            executor,
            "--workers",
            "2",
            env={**os.environ, "SIM_SWEEP_TRACE_CACHE": str(tmp_path / "trace-cache")},
        )
        assert res.returncode == 0, res.stderr[-2000:]
        df = pd.read_parquet(out / "results.parquet").sort_values("point").reset_index(drop=True)
        rows[executor] = df.drop(columns=["wall_s", "sim_wall_s"])
    assert len(rows["ray"]) == 6 and (rows["ray"]["status"] == "ok").all()
    pd.testing.assert_frame_equal(rows["local"], rows["ray"])


def test_zip_groups_are_crossed_with_each_other_and_the_grid(tmp_path):
    from sim.sweep.cli import load_sweep

    sweep = load_sweep(
        _write_sweep(
            tmp_path / "s.yaml",
            """
grid: {workload.batch_size: [1, 2]}
zip:
  - {policy.name: [lru, pregated], predictor.name: [none, oracle]}
  - {cache.hpc_slots: [1, 2, 4], cache.mpc_slots: [2, 4, 9]}
""",
        )
    )
    assert len(sweep.points) == 2 * 2 * 3
    pairs = {(p.fields["policy.name"], p.fields["predictor.name"]) for p in sweep.points}
    assert pairs == {("lru", "none"), ("pregated", "oracle")}  # zipped, not crossed
    slots = {(p.fields["cache.hpc_slots"], p.fields["cache.mpc_slots"]) for p in sweep.points}
    assert slots == {(1, 2), (2, 4), (4, 9)}


@pytest.mark.parametrize("name", ["ci", "cache_size", "predictor_accuracy", "diffmoe_paper", "diffmoe_paper_mixtral"])
def test_shipped_sweeps_load(name):
    from moebase.errors import ConfigError
    from sim.sweep.cli import load_sweep

    try:
        sweep = load_sweep(ROOT / "configs" / "sweeps" / f"{name}.yaml")
    except ConfigError as exc:  # the Mixtral one needs the real trace imported to runs/ first
        assert name == "diffmoe_paper_mixtral" and "workload.trace" in str(exc)
        return
    assert len(sweep.points) >= 30 and len({p.id for p in sweep.points}) == len(sweep.points)


def test_plots_chosen_in_the_sweep_file(tmp_path):
    sweep = _write_sweep(
        tmp_path / "s.yaml",
        """
set: {workload.requests: 8, workload.max_decode_tokens: 8, predictor.name: noisy, policy.name: pregated}
grid:
  predictor.params.recall: [0.0, 1.0]
  workload.batch_size: [1, 2]
plots: [predictor.params.recall]
""",
    )
    out = tmp_path / "out"
    res = _sweep(sweep, "--out", out, "--workers", "1")
    assert res.returncode == 0, res.stderr
    pngs = sorted(p.name for p in out.glob("throughput_vs_*.png"))
    assert pngs == ["throughput_vs_predictor_params_recall.png"]
    bad = _write_sweep(tmp_path / "b.yaml", "grid: {workload.batch_size: [1]}\nplots: [colour]\n")
    res = _sweep(bad, "--out", tmp_path / "o2")
    assert res.returncode == 2 and "sweep.plots" in res.stderr


def test_sim_sweep_still_exports_the_names_other_code_imports():
    import sim.sweep.cli

    for name in (
        "Sweep",
        "Point",
        "load_sweep",
        "run_point",
        "read_rows",
        "run_checks",
        "Progress",
        "run_local",
        "run_ray",
        "write_report",
        "register",
        "run",
    ):
        assert name in sim.sweep.cli.__all__ and getattr(sim.sweep.cli, name) is not None
