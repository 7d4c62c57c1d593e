"""`python -m sim sweep --executor ray --address ADDR` on a real two-node Ray cluster on this machine
(``ray.cluster_utils.Cluster``: a head of 1 CPU and a worker node of 1 CPU, 80 MB object stores, token
authentication on): the rows equal the local pool's, the code and the trace are shipped (the workers import
``sim`` from Ray's runtime environment and read the trace from the object store), losing the worker node
mid-sweep loses no point, ``--resume`` works across executors, and a wrong address or a missing token exits 2
with one line, fast.

One cluster serves the whole file (module fixture); the file is skipped when Ray cannot start one here. Every
process of the cluster carries a marker in its environment, and none is left when the file ends. The tests
without a cluster (address and token checks) run regardless.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.traces import TINY_MODEL, random_trace

MB = 1024 * 1024
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
MARK = "SIM_TEST_RAY_CLUSTER"  # set in the environment of every process of the test cluster
TIMING = ["wall_s", "sim_wall_s", "attempts"]
#: A small sweep on purpose (a handful of points spread over two one-CPU nodes), not every policy.
POLICIES = ["on-demand", "lru", "lfu", "diffmoe"]


# --------------------------------------------------------------------------------------------- helpers
def _env(**extra) -> dict:
    """This process's environment without Ray's auth variables and the sweep's test hooks, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in AUTH_VARS and not k.startswith("SIM_SWEEP_TEST_") and k != "RAY_ADDRESS"
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _sweep(*args, env=None, cwd=ROOT, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "sim", "sweep", *map(str, args), "--quiet"],
        cwd=cwd,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _rows(out: Path) -> pd.DataFrame:
    df = pd.read_parquet(out / "results.parquet")
    return df.sort_values("point").reset_index(drop=True)


def _same_results(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.drop(columns=TIMING), b.drop(columns=TIMING))


def _refresh_ray_auth() -> None:
    """Make this process's Ray read the auth variables again (it caches them)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # noqa: BLE001 - another Ray version
        pass


def _marked_pids(mark: str) -> list[int]:
    """The processes whose environment holds ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def _stop_leftovers(mark: str, wait_s: float = 15.0) -> list[int]:
    """Wait for the cluster's processes to end; SIGKILL (by pid) any still there. Returns those killed."""
    deadline = time.time() + wait_s
    while time.time() < deadline and _marked_pids(mark):
        time.sleep(0.25)
    left = _marked_pids(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def sweep_file(tmp_path_factory) -> Path:
    """A small sweep (8 points, milliseconds each) on a tiny generated trace, in a folder of its own."""
    d = tmp_path_factory.mktemp("raysweep")
    from traces.io import save_trace

    trace = save_trace(
        random_trace(np.random.default_rng(0), tokens=60, layers=2, experts=8, k=2, requests=3), d / "tiny.npz"
    )
    base = {
        "model": {**TINY_MODEL, "name": "test-model"},
        "hardware": "h200",
        "workload": {"trace": str(trace), "batch_size": 1, "max_decode_tokens": 4},
        "cache": {"hpc_slots": 1, "mpc_slots": 2, "lpc_buffers": 3},
        "policy": "lru",
    }
    path = d / "tiny.yaml"
    path.write_text(
        yaml.safe_dump({"name": "tiny", "base": base, "grid": {"policy.name": POLICIES, "workload.batch_size": [1, 2]}})
    )
    return path


@pytest.fixture(scope="module")
def local_rows(sweep_file, tmp_path_factory) -> pd.DataFrame:
    """The tiny sweep's rows from the local process pool: what every Ray run must reproduce."""
    out = tmp_path_factory.mktemp("local") / "out"
    res = _sweep(sweep_file, "--out", out, "--workers", "2")
    assert res.returncode == 0, res.stderr
    return _rows(out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head (1 CPU) and a worker node (1 CPU) with token authentication; the token in a file of its own."""
    pytest.importorskip("ray", reason="ray is part of the test extras; install with pip install -e '.[test]'")
    from ray.cluster_utils import Cluster

    d = tmp_path_factory.mktemp("raycluster")
    token = d / "auth_token"
    token.write_text(secrets.token_hex(16))
    mark = secrets.token_hex(8)
    saved = {k: os.environ.get(k) for k in (*AUTH_VARS, MARK, "SIM_SWEEP_TRACE_CACHE", "RAY_ADDRESS")}
    os.environ.update(
        {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            MARK: mark,
            "SIM_SWEEP_TRACE_CACHE": str(d / "trace-cache"),
        }
    )
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.pop("RAY_ADDRESS", None)
    _refresh_ray_auth()
    c = None
    try:
        try:
            c = Cluster(
                initialize_head=True,
                connect=False,
                head_node_args={"num_cpus": 1, "object_store_memory": 80 * MB, "include_dashboard": False},
            )
            worker = c.add_node(num_cpus=1, object_store_memory=80 * MB)
        except Exception as exc:  # noqa: BLE001 - no Ray cluster on this machine: skip, do not fail
            pytest.skip(f"cannot start a Ray cluster on this machine: {type(exc).__name__}: {exc}"[:300])
        yield types.SimpleNamespace(
            cluster=c, address=c.address, worker=worker, token=token, cache=d / "trace-cache", dir=d
        )
    finally:
        if c is not None:
            c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _refresh_ray_auth()
        left = _stop_leftovers(mark)
        assert not left, f"Ray processes of the test cluster were still running (killed): {left}"


def _on_cluster(cluster, **extra) -> dict:
    """The environment of a sweep run against the cluster: RAY_AUTH_MODE not set, the token in its file (the sweep
    finds it and turns token mode on by itself)."""
    return _env(RAY_AUTH_TOKEN_PATH=cluster.token, **extra)


# --------------------------------------------------------------------------------------------- on the cluster
def test_a_sweep_on_the_cluster_equals_the_local_pool(cluster, sweep_file, local_rows, tmp_path):
    out = tmp_path / "ray"
    t0 = time.time()
    res = _sweep(
        sweep_file,
        "--executor",
        "ray",
        "--address",
        cluster.address,
        "--out",
        out,
        env=_on_cluster(cluster),
        cwd=tmp_path,
    )  # not the checkout: the workers import the shipped code
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"the Ray cluster at {cluster.address}: 2 node(s), 2 CPU(s), token authentication" in res.stderr
    assert "on 2 worker(s)" in res.stderr and time.time() - t0 < 60
    rows = _rows(out)
    assert len(rows) == 8 and (rows["status"] == "ok").all() and (rows["attempts"] == 1).all()
    _same_results(rows, local_rows)  # same seed, same results, whichever executor
    shipped = list(cluster.cache.rglob("tiny.npz"))  # the trace came through the object store
    assert len(shipped) == 1 and shipped[0].read_bytes() == (sweep_file.parent / "tiny.npz").read_bytes()


def test_the_workers_run_the_shipped_code(cluster, tmp_path):
    code = (
        "import ray; from sim.sweep.ray.executor import start_ray; from sim.sweep.ray.task import node_report; "
        f"s = start_ray({cluster.address!r}, None); "
        "print(ray.get([ray.remote(num_cpus=1)(node_report).remote() for _ in range(2)])); s.close()"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_on_cluster(cluster),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    reports = eval(res.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr of plain dicts
    assert all("runtime_resources" in r["sim"] and not r["missing"] for r in reports), reports


def test_resume_works_across_executors(cluster, sweep_file, local_rows, tmp_path):
    # local first, two points failing; then --resume on the cluster runs only those
    out = tmp_path / "local-then-ray"
    res = _sweep(sweep_file, "--out", out, "--workers", "2", env=_env(SIM_SWEEP_TEST_FAIL="policy.name=lru"))
    assert res.returncode == 4, res.stderr
    res = _sweep(
        sweep_file,
        "--out",
        out,
        "--resume",
        "--executor",
        "ray",
        "--address",
        cluster.address,
        env=_on_cluster(cluster),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "6 already done, 2 to run (2 failed before)" in res.stderr
    _same_results(_rows(out), local_rows)
    # the cluster first (the failure hook travels to its workers), then --resume with the local pool
    out = tmp_path / "ray-then-local"
    res = _sweep(
        sweep_file,
        "--out",
        out,
        "--executor",
        "ray",
        "--address",
        cluster.address,
        env=_on_cluster(cluster, SIM_SWEEP_TEST_FAIL="policy.name=lfu"),
    )
    assert res.returncode == 4, res.stderr[-3000:]
    failed = _rows(out).query("status != 'ok'")
    assert set(failed["policy.name"]) == {"lfu"} and failed["error"].str.contains("failing on purpose").all()
    res = _sweep(sweep_file, "--out", out, "--resume", "--workers", "1")
    assert res.returncode == 0 and "6 already done, 2 to run (2 failed before)" in res.stderr, res.stderr
    _same_results(_rows(out), local_rows)


@pytest.mark.parametrize("case", ["no token", "wrong token", "token mode without a token"])
def test_token_problems_exit_2_with_one_line_saying_what_to_set(cluster, sweep_file, tmp_path, case):
    home = tmp_path / "home"  # no ~/.ray/auth_token there
    home.mkdir()
    env = {
        "no token": _env(HOME=home),
        "wrong token": _env(HOME=home, RAY_AUTH_TOKEN=secrets.token_hex(16)),
        "token mode without a token": _env(HOME=home, RAY_AUTH_MODE="token"),
    }[case]
    t0 = time.time()
    res = _sweep(sweep_file, "--executor", "ray", "--address", cluster.address, "--out", tmp_path / "out", env=env)
    assert res.returncode == 2 and time.time() - t0 < 30, res.stderr[-3000:]
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: --address: "), res.stderr
    assert "auth_token" in res.stderr and not (tmp_path / "out").exists()
    if case == "wrong token":
        assert "is not the cluster's" in res.stderr


def test_losing_the_worker_node_mid_sweep_loses_no_point(cluster, sweep_file, local_rows, tmp_path):
    """Runs last: the cluster has no worker node afterwards."""
    started = tmp_path / "started"
    started.mkdir()
    out = tmp_path / "out"
    env = _on_cluster(cluster, SIM_SWEEP_TEST_DELAY=1, SIM_SWEEP_TEST_STARTED=started)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sim",
            "sweep",
            str(sweep_file),
            "--executor",
            "ray",
            "--address",
            cluster.address,
            "--out",
            str(out),
            "--quiet",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        node = cluster.worker.node_id
        deadline = time.time() + 60
        while time.time() < deadline and not any(f.name.startswith(node) for f in started.iterdir()):
            time.sleep(0.02)
        assert any(f.name.startswith(node) for f in started.iterdir()), "no point ever ran on the worker node"
        cluster.cluster.remove_node(cluster.worker, allow_graceful=False)  # as if the machine went down
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "was lost (its worker or node died" in err and "attempt 2 of 2" in err, err[-3000:]
    rows = _rows(out)
    assert (rows["status"] == "ok").all() and (rows["attempts"] == 2).sum() >= 1
    _same_results(rows, local_rows)


# --------------------------------------------------------------------------------------------- no cluster needed
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_closed_port_exits_2_within_seconds_with_one_line(sweep_file, tmp_path):
    pytest.importorskip("ray")
    t0 = time.time()
    res = _sweep(sweep_file, "--executor", "ray", "--address", f"127.0.0.1:{_closed_port()}", "--out", tmp_path / "o")
    assert res.returncode == 2 and time.time() - t0 < 30, res.stderr[-2000:]
    assert res.stderr.count("\n") == 1 and "--address" in res.stderr and "connection refused" in res.stderr
    assert not (tmp_path / "o").exists()


def test_a_port_that_is_not_a_ray_gcs_exits_2_with_one_line(sweep_file, tmp_path):
    pytest.importorskip("ray")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve():  # accepts, answers something that is not HTTP/2, closes
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        res = _sweep(
            sweep_file,
            "--executor",
            "ray",
            "--address",
            f"127.0.0.1:{server.getsockname()[1]}",
            "--out",
            tmp_path / "o",
        )
    finally:
        stop.set()
        t.join()
        server.close()
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr[-2000:]
    assert "--address" in res.stderr and "is not a Ray GCS" in res.stderr


def test_a_ray_init_that_hangs_is_cut_at_the_time_limit_with_one_line():
    code = (
        "import time; from sim.sweep.ray.connect import _with_watchdog; "
        "_with_watchdog(lambda: time.sleep(60), 1, 'ray.init on 10.0.0.1:6379')"
    )
    t0 = time.time()
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and time.time() - t0 < 20 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("error: --address: ray.init on 10.0.0.1:6379 did not finish within 1 s")


def test_address_without_the_ray_executor_and_bad_addresses_exit_2(sweep_file, tmp_path):
    res = _sweep(sweep_file, "--address", "127.0.0.1:6379", "--out", tmp_path / "o")
    assert res.returncode == 2 and "--address: needs --executor ray" in res.stderr
    from moebase.errors import ConfigError
    from sim.sweep.ray.connect import parse_address

    assert str(parse_address("10.0.0.1:6379")) == "10.0.0.1:6379"
    assert parse_address("ray://head.example:10001").client
    assert parse_address("[::1]:6379").host == "::1"
    for bad in ("10.0.0.1", "10.0.0.1:0", "10.0.0.1:99999", "http://x:1", "a b:1", ""):
        with pytest.raises(ConfigError, match="--address: expected HOST:PORT"):
            parse_address(bad)


def test_token_detection(tmp_path, monkeypatch):
    from moebase.errors import ConfigError
    from sim.sweep.ray.connect import prepare_auth, token_source

    monkeypatch.setenv("HOME", str(tmp_path))
    assert token_source({}) is None
    env = {}
    assert prepare_auth(env) == "no authentication" and "RAY_AUTH_MODE" not in env
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t0k3n")
    env = {}  # a token at hand and no mode: token mode is turned on, as ray.init() does for a local cluster
    assert "token from ~/.ray/auth_token" in prepare_auth(env) and env["RAY_AUTH_MODE"] == "token"
    env = {"RAY_AUTH_MODE": "disabled"}  # an explicit choice is kept
    assert prepare_auth(env) == "no authentication" and env["RAY_AUTH_MODE"] == "disabled"
    assert token_source({"RAY_AUTH_TOKEN": "abc"}) == "RAY_AUTH_TOKEN"
    with pytest.raises(ConfigError, match="RAY_AUTH_TOKEN_PATH names .*not a file"):
        prepare_auth({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "nope")})
    (tmp_path / ".ray" / "auth_token").unlink()
    with pytest.raises(ConfigError, match="RAY_AUTH_MODE=token but no token here: copy the head node's"):
        prepare_auth({"RAY_AUTH_MODE": "token"})


@pytest.mark.parametrize(
    "cluster_wants, token, expect",
    [
        ("disabled", True, "disabled"),  # a token here, none on the cluster: stay without (else objects get lost)
        ("token", True, "token"),  # the cluster wants one and it is here: token mode
        ("token", False, "no token"),  # the cluster wants one and there is none: exit 2, saying what to copy
        ("token", "wrong", "not the cluster's"),
    ],
)
def test_the_driver_matches_the_clusters_authentication(tmp_path, monkeypatch, cluster_wants, token, expect):
    import sim.sweep.ray.connect as conn
    from moebase.errors import ConfigError

    monkeypatch.setattr(conn, "_have_gcs_client", lambda: True)
    env = {"HOME": str(tmp_path)}
    if token:
        (tmp_path / "tok").write_text("x")
        env["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / "tok")

    def accepts(addr, timeout):  # the GCS: what this process would send, judged as the cluster would
        mode = env.get("RAY_AUTH_MODE")
        return cluster_wants == "disabled" or (mode == "token" and token is True)

    monkeypatch.setattr(conn, "_gcs_accepts", accepts)
    addr = conn.parse_address("127.0.0.1:6379")
    if expect in ("disabled", "token"):
        said = conn.negotiate_auth(addr, 1.0, env)
        assert env["RAY_AUTH_MODE"] == expect and ("token from" in said) == (expect == "token")
    else:
        with pytest.raises(ConfigError, match=f"--address: .*{expect}"):
            conn.negotiate_auth(addr, 1.0, env)


def test_a_node_without_the_simulators_packages_fails_its_points_with_one_line(monkeypatch):
    import sim.sweep.ray.task as task

    monkeypatch.setattr(task, "REQUIRED", ("numpy", "no_such_package_for_the_sweep"))
    assert task.missing_packages() == ["no_such_package_for_the_sweep"]
    status, metrics, error, _ = task.run_shipped({}, [], {}, "s.yaml", ())
    assert status == "failed" and metrics is None and "\n" not in error
    assert "lacks the Python package(s) no_such_package_for_the_sweep" in error and "pip install" in error


def test_a_trace_that_cannot_be_fetched_on_a_node_is_one_clear_line(tmp_path, monkeypatch):
    from sim.sweep.ray.task import ShipError, with_local_files

    fake = types.ModuleType("ray")

    def get(ref):
        raise RuntimeError("ObjectLostError: all copies of the object are lost\n(long Ray explanation)")

    fake.get = get
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv("SIM_SWEEP_TRACE_CACHE", str(tmp_path))
    config = {"workload": {"trace": "/driver/only/tiny.npz"}}
    with pytest.raises(
        ShipError,
        match=r"^cannot fetch tiny.npz on .* from the sweep's object store: RuntimeError: "
        r"ObjectLostError: all copies of the object are lost$",
    ):
        with_local_files(config, [(("workload", "trace"), "ab" * 32, "tiny.npz")], {"ab" * 32: object()})
    data = b"trace bytes"
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    fake.get = lambda ref: data
    local = with_local_files(config, [(("workload", "trace"), sha, "tiny.npz")], {sha: object()})
    assert Path(local["workload"]["trace"]).read_bytes() == data and config["workload"]["trace"].startswith("/driver")
