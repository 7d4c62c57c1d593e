"""`python -m sim sweep configs/sweeps/NAME.yaml [--executor local|ray [--address ADDR]] [--workers N] [--resume]
[--attempts N] [--out DIR]`: many runs of one base config.

A sweep file:

```yaml
base: ../switch_xxl.yaml        # a run config (relative to the sweep file), or an inline mapping
set: {workload.requests: 32}    # overrides applied to every point (optional)
grid:                           # the cartesian product of these axes
  policy.name: [on-demand, lru, diffmoe]
  workload.batch_size: [1, 16]
zip:                            # optional: axes varied together (equal lengths), crossed with the grid;
  cache.hpc_slots: [1, 2, 4]    # a list of such mappings gives several groups, each crossed with the rest
  cache.mpc_slots: [2, 4, 9]
checks: [gpu_only_ceiling, belady_bound, lru_monotone_in_cache]   # optional invariants; a broken one -> exit 3
plots: [workload.batch_size, cache_slots]   # optional: x axes of the throughput plots (default: every numeric axis)
```

Each point is one simulator run, identified by a hash of its resolved config. Results are stored one row per point
(the swept fields, the summary metrics, status, error, wall time, attempts) as ``OUT/rows/POINT.parquet``, each
written atomically as soon as the point finishes, so an interrupted sweep (Ctrl-C, kill -9) keeps every finished
row and ``--resume`` runs only the points not done: the missing ones and the failed ones. A failing point records
its error and the sweep goes on; a point whose worker dies is retried (``--attempts``, default 2) and then
recorded as failed. With ``--executor ray --address HOST:PORT`` the points run on a Ray cluster, the code and
the traces shipped to it (docs/ray_cluster.md); the rows are stored here all the same, so a sweep started with
one executor can be resumed with the other. At the end ``OUT/results.parquet`` holds every row and
``OUT/report.md`` the table, checks and plots.

Exit status: 0 every point ok and every check passed; 2 bad input (sweep file, config, arguments; nothing run);
3 a check failed; 4 some points failed (run again with ``--resume`` to retry only them; 3 wins when both);
130 interrupted.

The parts: ``sim.sweep_spec`` (the sweep file and its points), ``sim.sweep_worker`` (one point in a worker),
``sim.sweep_exec`` (executors: this process, a process pool), ``sim.sweep_ray*`` (Ray: connecting, shipping,
the tasks), ``sim.sweep_store`` (the rows folder), ``sim.sweep_checks`` (invariants), ``sim.sweep_report``
(results.parquet, report.md, plots). This module is the command line and re-exports their public names.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sim.errors import ConfigError
from sim.sweep_checks import CHECKS, run_checks
from sim.sweep_exec import MAX_ATTEMPTS, Progress, run_local, run_ray
from sim.sweep_ray import describe, start_ray
from sim.sweep_report import make_plots, write_report
from sim.sweep_spec import SWEEP_KEYS, Point, Sweep, load_sweep
from sim.sweep_store import clean_orphans, done_points, has_rows, read_rows, row_of, write_row
from sim.sweep_worker import METRICS, run_point

EXIT_OK, EXIT_CHECK_FAILED, EXIT_POINTS_FAILED, EXIT_INTERRUPTED = 0, 3, 4, 130


def register(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of configs (resumable), with a report and checks")
    p.add_argument("sweep", help="sweep file, e.g. configs/sweeps/ci.yaml")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: a process pool (default); ray: Ray tasks, on --address or a local Ray instance")
    p.add_argument("--address", default=None,
                   help="with --executor ray: the Ray cluster, HOST:PORT of its head (ray start --head --port), "
                        "ray://HOST:PORT or auto (default: $RAY_ADDRESS, else a local Ray instance); "
                        "see docs/ray_cluster.md")
    p.add_argument("--workers", type=int, default=None,
                   help="points run at once (default: all cores; on a Ray cluster, its CPUs)")
    p.add_argument("--resume", action="store_true",
                   help="keep the ok rows already in --out; run only the missing and the failed points")
    p.add_argument("--attempts", type=int, default=MAX_ATTEMPTS,
                   help=f"starts of a point whose worker dies before it is recorded as failed (default {MAX_ATTEMPTS})")
    p.add_argument("--out", help="results folder (default runs/sweep-NAME)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def run(args) -> int:
    sweep = load_sweep(args.sweep)
    if args.workers is not None and args.workers < 1:
        raise ConfigError("--workers", f"must be >= 1, got {args.workers}")
    attempts = getattr(args, "attempts", MAX_ATTEMPTS)
    if attempts < 1:
        raise ConfigError("--attempts", f"must be >= 1, got {attempts}")
    if args.address and args.executor != "ray":
        raise ConfigError("--address", "needs --executor ray")
    address = (args.address or os.environ.get("RAY_ADDRESS") or None) if args.executor == "ray" else None
    out = Path(args.out) if args.out else Path("runs") / f"sweep-{sweep.name}"
    if has_rows(out) and not args.resume:
        raise ConfigError(str(out), "holds results of an earlier sweep: pass --resume to continue it, or another --out")
    workers = args.workers or (None if address else os.cpu_count() or 1)
    session = None
    if args.executor == "ray":
        session = start_ray(address, workers)  # bad address, refused token, unfit node: exit 2 before anything
        print(describe(session), file=sys.stderr)
        workers = workers or max(1, session.cluster.cpus)
    try:
        return _sweep(args, sweep, out, workers, attempts, session)
    finally:
        if session is not None:
            session.close()


def _sweep(args, sweep: Sweep, out: Path, workers: int, attempts: int, session) -> int:
    """Run the points not done yet, then write the report; the exit status."""
    orphans = clean_orphans(out) if out.exists() else []
    done, failed_before = done_points(out) if args.resume else (set(), set())
    wanted = {p.id for p in sweep.points}
    todo = [p for p in sweep.points if p.id not in done]
    retry = len(wanted & (failed_before - done))
    print(f"sweep {sweep.name}: {len(sweep.points)} points, {len(sweep.points) - len(todo)} already done, "
          f"{len(todo)} to run{f' ({retry} failed before)' if retry else ''} on {workers} worker(s) -> {out}"
          + (f"; removed {len(orphans)} unfinished temporary file(s)" if orphans else ""), file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    progress = Progress(len(todo), args.quiet)
    try:
        if session is not None:
            run_ray(sweep, todo, out, workers, progress, max_attempts=attempts, session=session)
        else:
            run_local(sweep, todo, out, workers, progress, attempts)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished rows are kept in {out}; rerun with --resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    df = read_rows(out)
    df = df[df["point"].isin(wanted)] if len(df) else df
    checks = run_checks(df, sweep)
    files = write_report(out, sweep, df, checks)
    failed = int((df["status"] != "ok").sum()) if len(df) else 0
    print(f"{len(df)} points ({failed} failed); wrote {', '.join(str(f) for f in files)}")
    broken = {k: v for k, v in checks.items() if v}
    for name, bad in broken.items():
        print(f"CHECK FAILED {name}: {'; '.join(bad)}", file=sys.stderr)
    if failed:
        print(f"{failed} of {len(df)} points failed (errors in {out / 'report.md'}); to run only them again: "
              f"python -m sim sweep {args.sweep} --out {out} --resume", file=sys.stderr)
    return EXIT_CHECK_FAILED if broken else EXIT_POINTS_FAILED if failed else EXIT_OK


__all__ = ["Sweep", "Point", "load_sweep", "run_point", "read_rows", "run_checks", "write_row", "row_of",
           "Progress", "run_local", "run_ray", "write_report", "make_plots", "CHECKS", "METRICS", "SWEEP_KEYS",
           "MAX_ATTEMPTS", "register", "run"]
