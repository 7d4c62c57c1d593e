"""What a worker does with one sweep point: simulate it and return its metrics.

``attempt`` never raises: a point whose config or simulation fails returns status "failed" and its error, so a
failing point is recorded and the sweep goes on. A point whose parts do not fit in the GPU's memory is not run and
is no failure: status "does not fit", its error ``does not fit (X GB > Y GB): `` and the memory table (a result,
which ``--resume`` keeps). A worker that dies (killed by the out-of-memory killer, a crash in
native code) cannot report anything; the executors in ``sim.sweep.local`` notice and retry the point.

Test hooks, read from the environment (each names overrides of the points it acts on, e.g. ``policy.name=lru``;
several may be given, separated by ``;``):

- ``SIM_SWEEP_TEST_FAIL``: ``attempt`` fails the point with a RuntimeError (as a bug in the simulator would).
- ``SIM_SWEEP_TEST_KILL``: ``attempt_in_worker`` (what pool and Ray workers run) kills its own process with
  SIGKILL; ``SIM_SWEEP_TEST_KILL_HOW=exit`` makes it ``os._exit(1)`` instead, and ``SIM_SWEEP_TEST_KILL_ONCE=DIR``
  kills it only on the point's first attempt (a marker file in DIR remembers it). Points run in the sweep's own
  process (``--workers 1``) are never killed.
- ``SIM_SWEEP_TEST_DELAY=SECONDS``: ``attempt_in_worker`` sleeps that long before each point (so that a test can
  kill a worker, or a Ray node, while it runs one).

A Ray worker runs a point from its resolved config (``sim.sweep.ray.task``), with no overrides to resolve: it
passes the point's overrides as ``hooks``, which is what the test hooks look at.

A pool worker ends when the sweep process that started it dies, however it dies (kill -9, the out-of-memory
killer): ``exit_with_parent`` is the pool's initializer (see ``sim.sweep.local`` for the start method).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import sys
import threading
import time
from typing import Any

FAIL_ENV = "SIM_SWEEP_TEST_FAIL"
KILL_ENV = "SIM_SWEEP_TEST_KILL"
KILL_HOW_ENV = "SIM_SWEEP_TEST_KILL_HOW"
KILL_ONCE_ENV = "SIM_SWEEP_TEST_KILL_ONCE"
DELAY_ENV = "SIM_SWEEP_TEST_DELAY"
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): the signal this process gets when its parent dies
#: A row's status: it ran; its parts do not fit in the GPU's memory (not run, a result all the same); it failed.
OK, DOES_NOT_FIT, FAILED = "ok", "does not fit", "failed"
#: The statuses of a point that is done (``--resume`` runs the others again).
DONE = (OK, DOES_NOT_FIT)
PARENT_POLL_S = 0.5  # how often the watcher thread checks that the parent lives

METRICS = {  # row column -> path in summary.json
    "throughput_tok_s": ("throughput_tok_s",),
    "iteration_ms_mean": ("iteration_ms", "mean"),
    "iteration_ms_p50": ("iteration_ms", "p50"),
    "iteration_ms_p99": ("iteration_ms", "p99"),
    "hit_rate": ("hit_rate", "overall"),
    "hit_rate_hpc": ("hit_rate", "hpc"),
    "hit_rate_mpc": ("hit_rate", "mpc"),
    "hit_rate_lpc": ("hit_rate", "lpc"),
    "pcie_bytes": ("pcie_bytes",),
    "link_busy_frac": ("link_busy_frac",),
    "compute_busy_frac": ("compute_busy_frac",),
    "stall_ms": ("stall_ms",),
    "prefetch_precision": ("prefetch", "precision"),
    "prefetch_recall": ("prefetch", "recall"),
    "prefetch_wasted_bytes": ("prefetch", "wasted_bytes"),
    "requests_reused": ("requests_reused",),
    "cpu_expert_frac": ("cpu_expert_frac",),
    "cpu_busy_frac": ("cpu_busy_frac",),
    "cpu_wait_ms": ("cpu_wait_ms",),
    "events": ("events",),
    "sim_wall_s": ("wall_s",),
}
METRIC_COLUMNS = [*METRICS, "cache_slots"]
#: The check that needs each run's bound, and the row column holding it (the most tokens/s the cost model allows)
BOUND_CHECK, BOUND_COLUMN = "host_compute_bound", "throughput_bound_tok_s"


def misfit_words(error) -> str:
    """``does not fit (X GB > Y GB)``: the words a table shows in place of the throughput of a point whose status
    is "does not fit" (the head of its error)."""
    return str(error).split("): ", 1)[0] + ")" if "): " in str(error) else str(error)


def task_options(sweep) -> dict | None:
    """What a point's task does besides its run, as plain data a worker or a Ray task receives (None: nothing):
    ``capacity``, the sweep's capacity option (``sim.sweep.capacity``: its search runs in the task); ``bound``,
    when the sweep checks ``host_compute_bound``: the run also adds up the least time the cost model allows it
    (``sim/timing/bound.py``), recorded as ``throughput_bound_tok_s``."""
    capacity = getattr(sweep, "capacity", None)
    bound = BOUND_CHECK in (getattr(sweep, "checks", None) or ())
    if capacity is None and not bound:
        return None
    return {"capacity": capacity, "bound": bound}


def run_point(base, overrides: tuple[str, ...], source: str = "sweep", options: dict | None = None) -> dict:
    """Simulate one point in this process; returns its metrics (raises on failure). ``options``
    (:func:`task_options`): with ``capacity``, also the capacity columns, searched here, in the point's task."""
    options = options or {}
    from sim.config.run_config import resolve_config
    from sim.request_results import serving_metrics
    from sim.run import simulate

    cfg = resolve_config(base, overrides, source)
    run = simulate(cfg, bound=bool(options.get("bound")))
    s = run.summary
    out: dict[str, Any] = {}
    for col, keys in METRICS.items():
        v: Any = s
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        out[col] = v
    out["cache_slots"] = cache_slots(cfg, len(run.policy.ctx.cached_layers))
    out.update(serving_metrics(s))  # with workload.arrivals: TTFT, TPOT, E2E, SLO attainment, goodput
    if options.get("bound"):
        out[BOUND_COLUMN] = s.get(BOUND_COLUMN)
    if options.get("capacity") is not None:
        from sim.sweep.capacity import capacity_metrics

        out.update(capacity_metrics(base, overrides, source, options["capacity"]))
    return out


def cache_slots(cfg, n_cached: int) -> float:
    """Cached-expert slots per cached layer, the x axis that compares organizations at equal GPU memory: HPC + MPC
    per layer, or a shared cache's budget over the cached layers."""
    if cfg.cache.organization == "shared" and n_cached:
        return cfg.cache.total_slots(n_cached) / n_cached
    return cfg.cache.hpc_slots + cfg.cache.mpc_slots


def attempt(
    base, overrides: tuple[str, ...], source: str, hooks: tuple[str, ...] | None = None, options: dict | None = None
) -> tuple[str, dict | None, str | None, float]:
    """Run one point: (status "ok", "does not fit" or "failed", metrics or None, error or None, wall seconds).
    ``hooks``: the overrides the test hooks match (default ``overrides``); ``options``: what the task does besides
    the run (:func:`task_options`)."""
    from sim.config.memory import DoesNotFit

    t0 = time.perf_counter()
    try:
        if _asked(FAIL_ENV, overrides if hooks is None else hooks):
            raise RuntimeError(f"failing on purpose ({FAIL_ENV} test hook)")
        return OK, run_point(base, overrides, source, options), None, time.perf_counter() - t0
    except DoesNotFit as exc:  # not run: the row says by how much
        return DOES_NOT_FIT, None, f"{exc.short()}: {exc}"[:700], time.perf_counter() - t0
    except Exception as exc:  # a failing point is recorded, the sweep goes on
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        return FAILED, None, msg, time.perf_counter() - t0


def attempt_in_worker(
    base, overrides: tuple[str, ...], source: str, hooks: tuple[str, ...] | None = None, options: dict | None = None
) -> tuple[str, dict | None, str | None, float]:
    """``attempt`` as run by a pool or Ray worker (where the test hooks may delay it or kill the process first)."""
    hooks = overrides if hooks is None else hooks
    delay = float(os.environ.get(DELAY_ENV) or 0)
    if delay > 0:
        time.sleep(delay)
    _die_if_asked(hooks)
    return attempt(base, overrides, source, hooks, options)


def _die_if_asked(overrides: tuple[str, ...]) -> None:
    """The kill test hook (see the module docstring): kill this worker process if the environment asks for it."""
    if not _asked(KILL_ENV, overrides):
        return
    once_dir = os.environ.get(KILL_ONCE_ENV)
    if once_dir:
        marker = os.path.join(once_dir, hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:16])
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # died once already: this attempt survives
    if os.environ.get(KILL_HOW_ENV) == "exit":
        os._exit(1)
    os.kill(os.getpid(), signal.SIGKILL)


def _asked(env: str, overrides: tuple[str, ...]) -> bool:
    """Whether the test hook ``env`` names one of ``overrides``."""
    return any(w.strip() in overrides for w in os.environ.get(env, "").split(";") if w.strip())


def exit_with_parent(parent: int) -> None:
    """Pool initializer: this worker dies with the sweep process ``parent`` (its parent). On Linux the kernel sends
    it SIGKILL when the parent dies (``PR_SET_PDEATHSIG``); everywhere, a daemon thread ends it once it has another
    parent. Exits at once when the parent died before this ran."""
    _kill_me_with_parent()
    if os.getppid() != parent:  # the parent died before prctl: this worker was already handed to another
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="sweep-parent-watch", daemon=True).start()


def _kill_me_with_parent() -> None:
    """Ask Linux for SIGKILL when the parent (the thread that forked this process) ends; elsewhere, or when prctl
    is missing or refuses, nothing (the watcher thread remains)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _watch_parent(parent: int) -> None:
    """End this process as soon as its parent is no longer ``parent`` (it died and this one was reparented)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)
