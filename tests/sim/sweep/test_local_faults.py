"""`python -m sim sweep` when workers die: the pool is replaced, the points in flight are retried (at most
``--attempts`` starts each), a point that always kills its worker is recorded as failed (exit 4) and ``--resume``
runs it again; orphan temporary files of interrupted writes are cleaned; the Ray executor shares the retry,
store and resume logic (with a stand-in for Ray: no cluster is started here).

Worker deaths are real: the test hook of ``sim.sweep.worker`` (``SIM_SWEEP_TEST_KILL``) makes a pool worker
SIGKILL itself, or ``os._exit``, when it starts the chosen point.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types

import pandas as pd
import pytest

from tests.support.paths import ROOT

SWEEP = f"""base: {ROOT / "configs" / "switch_xxl.yaml"}
set: {{workload.requests: 8, workload.max_decode_tokens: 8, workload.prefill: false, workload.batch_size: 2}}
grid:
  policy.name: [on-demand, lru, diffmoe, lfu]
"""
KILLER = "policy.name=lru"  # the one point whose worker dies
HOOK_VARS = ("SIM_SWEEP_TEST_KILL", "SIM_SWEEP_TEST_KILL_HOW", "SIM_SWEEP_TEST_KILL_ONCE")


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP)
    return path


def _sweep(*args, **hook):
    env = {k: v for k, v in os.environ.items() if k not in HOOK_VARS}
    env.update({f"SIM_SWEEP_TEST_{k.upper()}": str(v) for k, v in hook.items()})
    return subprocess.run(
        [sys.executable, "-m", "sim", "sweep", *map(str, args), "--quiet"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _rows(out):
    return pd.read_parquet(out / "results.parquet").set_index("policy.name").sort_index()


def test_a_point_that_always_kills_its_worker_fails_after_two_attempts_and_resume_reruns_it(sweep_file, tmp_path):
    out = tmp_path / "out"
    res = _sweep(sweep_file, "--out", out, "--workers", "2", kill=KILLER)
    assert res.returncode == 4, res.stderr  # the sweep finished, with a failed point
    assert "a worker died" in res.stderr and "1 of 4 points failed" in res.stderr and "--resume" in res.stderr
    df = _rows(out)
    assert df.loc["lru", "status"] == "failed" and df.loc["lru", "attempts"] == 2
    assert "worker died in 2 attempt(s)" in df.loc["lru", "error"]
    assert (df.drop(index="lru")["status"] == "ok").all()  # the others finished in the replacement pools
    assert "(2 attempts)" in (out / "report.md").read_text()
    kept = {f.name: f.stat().st_mtime_ns for f in (out / "rows").glob("*.parquet") if f.stem != df.loc["lru", "point"]}

    res = _sweep(sweep_file, "--out", out, "--resume", "--workers", "2")  # the worker no longer dies
    assert res.returncode == 0, res.stderr
    assert "3 already done, 1 to run (1 failed before)" in res.stderr
    df = _rows(out)
    assert len(df) == 4 and (df["status"] == "ok").all() and df.loc["lru", "attempts"] == 1  # row replaced
    assert {n: (out / "rows" / n).stat().st_mtime_ns for n in kept} == kept  # ok rows were not recomputed


def test_a_worker_that_dies_once_is_retried_and_the_results_are_those_of_a_clean_run(sweep_file, tmp_path):
    once = tmp_path / "once"
    once.mkdir()
    res = _sweep(
        sweep_file, "--out", tmp_path / "faulty", "--workers", "2", kill=KILLER, kill_how="exit", kill_once=once
    )
    assert res.returncode == 0, res.stderr
    assert "a worker died" in res.stderr and len(list(once.iterdir())) == 1  # it did die, once
    faulty = _rows(tmp_path / "faulty")
    assert (faulty["status"] == "ok").all() and faulty.loc["lru", "attempts"] == 2
    res = _sweep(sweep_file, "--out", tmp_path / "clean", "--workers", "1")  # no pool, no deaths
    assert res.returncode == 0, res.stderr
    clean = _rows(tmp_path / "clean")
    assert (clean["attempts"] == 1).all()
    timing = ["wall_s", "sim_wall_s", "attempts"]
    pd.testing.assert_frame_equal(faulty.drop(columns=timing), clean.drop(columns=timing))  # same seed, same rows


def test_orphan_temporary_files_are_removed_on_resume(sweep_file, tmp_path):
    out = tmp_path / "out"
    assert _sweep(sweep_file, "--out", out, "--workers", "1").returncode == 0
    rows = sorted((out / "rows").glob("*.parquet"))
    rows[0].unlink()  # as if killed while writing this row
    orphans = [
        out / "rows" / f".{rows[0].name}.k3j2h1.tmp",
        out / ".results.parquet.a8x9.tmp",
        out / ".report.md.zz.tmp",
    ]
    for f in orphans:
        f.write_bytes(b"half a file")
    mine = [out / "notes.tmp", out / "rows" / "notes.txt"]  # not ours: kept
    for f in mine:
        f.write_text("keep")
    res = _sweep(sweep_file, "--out", out, "--resume", "--workers", "1")
    assert res.returncode == 0, res.stderr
    assert "3 already done, 1 to run" in res.stderr and "removed 3 unfinished temporary file(s)" in res.stderr
    assert not any(f.exists() for f in orphans) and all(f.exists() for f in mine)
    assert len(pd.read_parquet(out / "results.parquet")) == 4


def test_attempts_must_be_at_least_one(sweep_file, tmp_path):
    res = _sweep(sweep_file, "--out", tmp_path / "out", "--attempts", "0")
    assert res.returncode == 2 and "--attempts" in res.stderr and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------- the Ray executor, with a stand-in


class _WorkerCrashedError(Exception):
    """What Ray raises from ray.get when the worker running a task died."""


class _Ref:
    """A stand-in object reference: a task to run (fn and its args), or bytes put in the store."""

    def __init__(self, fn=None, args=(), data=None):
        self.fn, self.args, self.data = fn, args, data


def _fake_ray(deaths: dict[str, int]) -> types.ModuleType:
    """A stand-in for the ``ray`` module: tasks run in this process when ray.get asks for them; a task whose
    overrides hold a key of ``deaths`` crashes (that many times; -1: always). ``ray.put`` keeps the shipped trace
    bytes, which the task fetches with ``ray.get`` as on a real cluster."""
    ray = types.ModuleType("ray")
    ray.calls, ray.started, ray.puts = [], [], []
    ray.init = lambda **kw: ray.calls.append(("init", kw))
    ray.shutdown = lambda: ray.calls.append(("shutdown", {}))
    ray.nodes = lambda: [{"Alive": True, "NodeID": "n1", "NodeManagerAddress": "127.0.0.1"}]
    ray.cluster_resources = lambda: {"CPU": 2.0}

    def put(data):
        ray.puts.append(data)
        return _Ref(data=data)

    def remote(**opts):
        assert opts == {"num_cpus": 1, "max_retries": 0}  # retries are the sweep's, not Ray's
        return lambda fn: types.SimpleNamespace(remote=lambda *args: _Ref(fn, args))

    def get(ref):
        if ref.fn is None:
            return ref.data
        fn, args = ref.fn, ref.args
        overrides = args[4]  # run_shipped(config, files, refs, source, overrides, options)
        ray.started.append(overrides)
        for key, left in deaths.items():
            if key in overrides and left:
                deaths[key] = left - 1
                raise _WorkerCrashedError("The worker died unexpectedly while executing this task.")
        return fn(*args)

    ray.remote, ray.get, ray.put = remote, get, put
    ray.wait = lambda refs, num_returns=1: (refs[:num_returns], refs[num_returns:])
    return ray


def _run_ray(sweep_file, out, resume=False):
    from sim.sweep.cli import run

    return run(
        argparse.Namespace(
            sweep=str(sweep_file),
            executor="ray",
            address=None,
            workers=2,
            resume=resume,
            attempts=2,
            out=str(out),
            quiet=True,
        )
    )


def test_the_ray_executor_retries_dead_workers_and_resumes_like_the_local_one(sweep_file, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("SIM_SWEEP_TRACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fake = _fake_ray({KILLER: -1, "policy.name=lfu": 1})  # lru always crashes, lfu once
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert _run_ray(sweep_file, out) == 4
    assert fake.calls[0][0] == "init" and fake.calls[0][1]["num_cpus"] == 2  # a local instance of 2 CPUs
    assert fake.calls[-1][0] == "shutdown"
    assert len(fake.puts) == 1  # the one trace, shipped once for every point, and materialised on the "node"
    assert [p.name for p in (tmp_path / "cache").rglob("*.npz")] == ["switch_xxl_128.npz"]
    df = _rows(out)
    assert df.loc["lru", "status"] == "failed" and df.loc["lru", "attempts"] == 2
    assert "worker died in 2 attempt(s): _WorkerCrashedError" in df.loc["lru", "error"]
    assert df.loc["lfu", "status"] == "ok" and df.loc["lfu", "attempts"] == 2
    assert (df.drop(index=["lru", "lfu"])["attempts"] == 1).all()

    (out / "rows" / ".half.parquet.x.tmp").write_bytes(b"")
    fake = _fake_ray({})
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert _run_ray(sweep_file, out, resume=True) == 0
    assert [KILLER in o for o in fake.started] == [True]  # only the failed point ran again
    assert not (out / "rows" / ".half.parquet.x.tmp").exists()
    assert (_rows(out)["status"] == "ok").all()
