"""What a Ray worker runs for one sweep point: the point's resolved config, with its trace files fetched from the
object store, simulated as ``sim.sweep.worker.attempt`` does.

The worker needs no copy of this project (Ray ships the ``sim`` and ``traces`` packages and ``configs/`` with the
job), no config files of its own (the config comes resolved: model and hardware expanded) and no traces: each file
the config names (the workload trace, a profiling or training trace) comes as the SHA-256 of its bytes and a
reference to them in the object store, and is written once per node to ``CACHE/SHA/NAME`` (``CACHE``:
``$SIM_SWEEP_TRACE_CACHE``, or ``moe-sim-traces`` in the temporary folder), where the config then points. What it
does need is Python and Ray, and the packages the simulator imports (``REQUIRED``): a node without them fails its
points with one line saying so.

Module-level imports are the standard library only, so that a node lacking a package still gets this far.

Test hook: ``SIM_SWEEP_TEST_STARTED=DIR`` makes each task leave a file ``DIR/NODE_ID.PID.N`` once its files are in
place, as the simulation starts (so that a test knows which node runs a point before it kills that node).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import re
import sys
import tempfile
from pathlib import Path

REQUIRED = ("numpy", "simpy", "yaml")  # what a worker imports to simulate (module names; yaml is PyYAML)
CACHE_ENV = "SIM_SWEEP_TRACE_CACHE"
STARTED_ENV = "SIM_SWEEP_TEST_STARTED"
_checked: set[str] = set()  # paths of copies this process has checked (or written)
_started = [0]
#: What a shipped file's cache path is made of: the SHA-256 of its bytes, and a plain file name (no folder, no
#: ``..``), so that every copy lands inside the cache folder.
_SHA = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,119}$")


class ShipError(Exception):
    """A shipped file could not be fetched or written on this node."""


class CacheError(Exception):
    """A shipped file's place in the node's cache cannot take it (a folder, a FIFO, a device there): the point
    fails with this line; running it again would not help."""


def cache_path(sha: str, name: str) -> Path:
    """``CACHE/SHA/NAME``, inside the cache folder: ``sha`` a SHA-256 in hex, ``name`` a plain file name."""
    if not (isinstance(sha, str) and _SHA.match(sha) and isinstance(name, str) and _NAME.match(name)):
        raise CacheError(
            f"refusing to write the shipped file {str(name)[:60]!r} ({str(sha)[:16]}): not a "
            f"SHA-256 and a plain file name"
        )
    return cache_dir() / sha / name


def missing_packages() -> list[str]:
    """The packages of ``REQUIRED`` this Python cannot import."""
    return [m for m in REQUIRED if importlib.util.find_spec(m) is None]


def node_report() -> dict:
    """This node as a sweep sees it: its address, Python, the missing packages, where ``sim`` comes from."""
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "missing": missing_packages(),
        "sim": str(Path(__file__).resolve().parents[2]),  # sim/sweep/ray/task.py
    }


def cache_dir() -> Path:
    """Where shipped files are written on this node."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "moe-sim-traces")


def materialise(sha: str, name: str, ref) -> str:
    """The path of a local copy of the shipped file ``name`` whose bytes hash to ``sha`` (fetched from the object
    store through ``ref`` unless this node has it already)."""
    path = cache_path(sha, name)
    if str(path) in _checked and path.is_file():
        return str(path)
    if not (path.is_file() and _sha256_file(path) == sha):
        import ray

        try:
            data = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - ObjectLostError, OwnerDiedError...
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ShipError(
                f"cannot fetch {name} on {platform.node()} from the sweep's object store: {type(exc).__name__}: {first}"
            ) from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise ShipError(f"{name} arrived corrupted (its SHA-256 differs from the sweep's)")
        try:
            _write(path, data)
        except OSError as exc:
            raise ShipError(
                f"cannot write {name} to {path.parent} on {platform.node()}: {exc.strerror or exc} "
                f"(set {CACHE_ENV} to a writable folder on the nodes)"
            ) from None
    _checked.add(str(path))
    return str(path)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write(path: Path, data: bytes) -> None:
    """Write atomically (tasks on one node may write the same file at once), and only where a regular file or
    nothing is: never renamed over a folder, a FIFO or a device (``traces.io.check_output_file``)."""
    _check_place(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _check_place(path)  # nothing special was put there meanwhile
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _check_place(path: Path) -> None:
    from moebase.errors import InputError
    from traces.io import check_output_file  # here, not at the top: a node without numpy still reports so

    try:
        check_output_file(path, "shipped file")
    except InputError as exc:
        raise CacheError(f"on {platform.node()}: {exc} (set {CACHE_ENV} to another folder)") from None


def with_local_files(config: dict, files: list, refs: dict) -> dict:
    """``config`` with each shipped file's field (``files``: (key path, sha, name)) pointing at its local copy."""
    import copy

    config = copy.deepcopy(config)
    for keys, sha, name in files:
        part = config
        for k in keys[:-1]:
            part = part[k]
        part[keys[-1]] = materialise(sha, name, refs[sha])
    return config


def run_shipped(
    config: dict, files: list, refs: dict, source: str, overrides: tuple[str, ...], options: dict | None = None
) -> tuple:
    """One point on a Ray worker: (status, metrics or None, error or None, wall seconds), as
    ``sim.sweep.worker.attempt`` returns (``options``: what the task does besides the run,
    ``sim.sweep.worker.task_options``). A problem of the point, or a node lacking packages, is a failed result; a
    shipped file that cannot be fetched or written raises ShipError (the node is likely going down: the sweep
    submits the point again)."""
    missing = missing_packages()
    if missing:
        return (
            "failed",
            None,
            f"node {platform.node()} lacks the Python package(s) {', '.join(missing)} "
            f"(Python {platform.python_version()} at {sys.executable}): install the project's "
            f"dependencies there (pip install numpy simpy pyyaml)",
            0.0,
        )
    try:
        local = with_local_files(config, files, refs)
    except CacheError as exc:
        return "failed", None, str(exc)[:500], 0.0
    _mark_started()
    from sim.sweep.worker import attempt_in_worker

    return attempt_in_worker(local, (), source, hooks=overrides, options=options)


def _mark_started() -> None:
    """The ``SIM_SWEEP_TEST_STARTED`` test hook (see the module docstring)."""
    folder = os.environ.get(STARTED_ENV)
    if not folder:
        return
    import ray

    _started[0] += 1
    node = ray.get_runtime_context().get_node_id()
    Path(folder, f"{node}.{os.getpid()}.{_started[0]}").touch()
