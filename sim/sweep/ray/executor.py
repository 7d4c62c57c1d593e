"""The Ray executor: a sweep's points as Ray tasks, on a local Ray instance or on the cluster at ``--address``.

``start_ray`` connects (``sim.sweep.ray.connect``: bounded, one-line errors, token authentication), ships the code
(``sim.sweep.ray.ship``) and, on a cluster, asks every node once whether it can run points. ``run_ray`` keeps at
most ``workers`` tasks in flight (on a cluster, by default, its CPUs), each point's files shipped through the object
store, and stores each row in this process as its task finishes, exactly as the local executor does
(``sim.sweep.store``: the single truth for ``--resume``, whichever executor wrote a row).

Tasks run with Ray's retries off (``max_retries=0``): a task lost because its worker or its node died
(``WorkerCrashedError``, ``NodeDiedError``, ``ObjectLostError``, the out-of-memory killer...) is submitted again by
this module until the point has been started ``max_attempts`` times, then recorded as failed ("worker died in N
attempt(s)"); the attempts are counted in the row. A point whose simulation fails is not retried: its row holds
the error.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moebase.errors import ConfigError
from sim.sweep.ray.connect import WHERE, Cluster, connect
from sim.sweep.ray.ship import Shipment, check_nodes, runtime_env
from sim.sweep.recorder import MAX_ATTEMPTS, Progress, Recorder
from sim.sweep.spec import Point, Sweep


@dataclass
class RaySession:
    """A connected Ray: the module, the cluster it runs on, and what the node check noted."""

    ray: Any  # the ray module, imported when a sweep asks for it
    cluster: Cluster
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        self.ray.shutdown()


def import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor", "ray is not installed (pip install 'moe-offload-sim[ray]')") from None
    return ray


def start_ray(address: str | None, workers: int | None) -> RaySession:
    """Connect to the cluster at ``address`` (or start a local instance of ``workers`` CPUs) with the project's
    code; on a cluster, check its nodes. Bad address, refused authentication, a node without the simulator's
    packages: ConfigError (exit 2), nothing left running."""
    ray = import_ray()
    cluster = connect(ray, address, workers or 1, runtime_env())
    session = RaySession(ray, cluster)
    if address is None:
        return session
    try:
        problems, session.notes = check_nodes(ray)
    except Exception as exc:  # noqa: BLE001 - the cluster went away meanwhile, a Ray error...
        session.close()
        raise ConfigError(WHERE, f"the check of the cluster's nodes failed: {_first_line(exc, 200)}") from None
    except BaseException:
        session.close()
        raise
    if problems:
        session.close()
        more = f" (and {len(problems) - 1} more node(s))" if len(problems) > 1 else ""
        raise ConfigError(WHERE, problems[0] + more)
    return session


def run_ray(
    sweep: Sweep,
    todo: list[Point],
    out: Path,
    workers: int | None,
    progress: Progress,
    address: str | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    session: RaySession | None = None,
) -> None:
    """Run ``todo`` as Ray tasks, at most ``workers`` at a time (None: the cluster's CPUs), storing each row as it
    finishes and submitting a lost task again (see the module docstring). Uses ``session`` when given (the caller
    closes it), else connects to ``address`` (or a local instance) for this call."""
    own = session is None
    session = session or start_ray(address, workers)
    try:
        _run(session.ray, sweep, todo, out, workers or max(1, session.cluster.cpus), progress, max_attempts)
    finally:
        if own:
            session.close()


def _run(ray, sweep: Sweep, todo: list[Point], out: Path, width: int, progress: Progress, max_attempts: int) -> None:
    from sim.sweep.ray.task import run_shipped

    task = ray.remote(num_cpus=1, max_retries=0)(run_shipped)  # retries are counted here, not by Ray
    width = max(1, min(width, len(todo)))
    ship, rec = Shipment(ray, sweep), Recorder(sweep, out, progress)
    attempts: Counter[str] = Counter()
    pending: dict[Any, Point] = {}
    queue = deque(todo)
    while queue or pending:
        while queue and len(pending) < width:
            p = queue.popleft()
            attempts[p.id] += 1
            pending[task.remote(*ship.task_args(p))] = p
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            p = pending.pop(ref)
            kind, value = _outcome(ray, ref)
            if kind == "done":
                rec.finish(p, value, attempts[p.id])
            elif kind == "failed":
                rec.finish(p, ("failed", None, value, 0.0), attempts[p.id])
            elif attempts[p.id] < max_attempts:
                progress.note(
                    f"point {p.id} was lost (its worker or node died: {value[:160]}); submitting it "
                    f"again (attempt {attempts[p.id] + 1} of {max_attempts})"
                )
                queue.appendleft(p)
            else:
                rec.died(p, attempts[p.id], value)


def _outcome(ray, ref) -> tuple[str, Any]:
    """What became of a task: ("done", its result); ("lost", why): its worker or its node died, or the node could
    not fetch the point's trace (it is likely going down), so the point may run again; ("failed", error): the
    task raised (a bug, not a lost node: not retried)."""
    from sim.sweep.ray.task import ShipError

    task_error = getattr(getattr(ray, "exceptions", None), "RayTaskError", ())
    try:
        return "done", ray.get(ref)
    except task_error as exc:
        cause = getattr(exc, "cause", None) or exc
        return ("lost", _first_line(cause, 300)) if isinstance(exc, ShipError) else ("failed", _first_line(cause, 500))
    except Exception as exc:  # noqa: BLE001 - WorkerCrashedError, NodeDiedError, ObjectLostError, OOM...
        return "lost", _first_line(exc, 300)


def _first_line(exc: BaseException, limit: int) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no detail'}"[:limit]


def describe(session: RaySession) -> str:
    """The cluster line, and the node check's notes, for stderr."""
    return "\n".join([session.cluster.describe(), *(f"  ray: {n}" for n in session.notes)])


__all__ = ["RaySession", "import_ray", "run_ray", "start_ray", "describe"]
