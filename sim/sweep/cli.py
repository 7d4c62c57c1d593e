"""`python -m sim sweep configs/sweeps/NAME.yaml [--executor local|ray [--address ADDR]] [--workers N] [--resume]
[--attempts N] [--out DIR] [--wait]`: many runs of one base config.

A sweep file (every key, its type, default and limits: docs/sweeps.md; ``KEY_HELP`` below for ``--help``):

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

One sweep writes into a folder at a time: a sweep holds an advisory lock (``flock``) on ``OUT/.sweep.lock`` from
before its first point until it ends (the system drops it however the process ends), and a second sweep on the
same folder is refused (exit 2), or with ``--wait`` waits for it. The pool's workers die with the sweep process.

Bounds: a sweep has at most ``sim.sweep.spec.MAX_POINTS`` points, ``--workers`` is 1 to 256 (and never more
processes than points), ``--attempts`` 1 to 10; the sweep's ``name`` is a plain name (letters, digits, ``.``,
``_``, ``-``), so the default ``runs/sweep-NAME`` stays inside ``runs/``. ``--out`` and every file the sweep
writes are checked before anything runs: a FIFO, a device or a file where a folder goes is refused.

A point whose parts do not fit in the GPU's memory is not run: its row says ``does not fit (X GB > Y GB)`` (status
"does not fit", the memory table in its error), which is a result, not a failure.

Exit status: 0 every point ok (or not fitting) and every check passed; 2 bad input (sweep file, config,
arguments), or another sweep writing in ``OUT`` (nothing run); 3 a check failed; 4 some points failed (run again
with ``--resume`` to retry only them; 3 wins when both); 130 interrupted.

The parts: ``sim.sweep.spec`` (the sweep file and its points), ``sim.sweep.worker`` (one point in a worker),
``sim.sweep.local`` (executors: this process, a process pool), ``sim.sweep.ray.executor*`` (Ray: connecting, shipping,
the tasks), ``sim.sweep.store`` (the rows folder), ``sim.sweep.checks`` (invariants), ``sim.sweep.report``
(results.parquet, report.md, plots). This module is the command line and re-exports their public names.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

from moebase.errors import ConfigError, OutputError, one_line
from sim.sweep.checks import CHECKS, run_checks
from sim.sweep.local import run_local
from sim.sweep.ray.connect import check_address
from sim.sweep.ray.executor import describe, run_ray, start_ray
from sim.sweep.recorder import MAX_ATTEMPTS, Progress
from sim.sweep.report import make_plots, report_files, write_report
from sim.sweep.spec import (
    CONFIG_SUFFIXES,
    EXTRA_PLOT_AXES,
    MAX_AXES,
    MAX_FIELD_CHARS,
    MAX_FIELD_PARTS,
    MAX_NAME_CHARS,
    MAX_POINTS,
    MAX_SET_KEYS,
    MAX_SET_VALUE_CHARS,
    MAX_VALUE_CHARS,
    SWEEP_KEYS,
    Point,
    Sweep,
    is_safe_name,
    load_sweep,
)
from sim.sweep.store import ROWS, check_rows, clean_orphans, done_points, has_rows, read_rows, row_of, write_row
from sim.sweep.worker import DOES_NOT_FIT, DONE, METRICS, run_point
from traces.io import check_output_file, check_output_folder
from traces.locks import held_lock

EXIT_OK, EXIT_CHECK_FAILED, EXIT_POINTS_FAILED, EXIT_INTERRUPTED = 0, 3, 4, 130
MAX_WORKERS = 256  # --workers: points run at once (never more than the sweep has points)
MAX_ATTEMPTS_LIMIT = 10  # --attempts
LOCK_FILE = ".sweep.lock"  # in OUT: locked (flock) by the sweep writing there; removed when it ends
BUSY = (
    "another sweep is writing there (it holds .sweep.lock): let it end and run again with --resume, or pass "
    "--wait (with --resume to continue its rows) to start when it ends, or use another --out"
)


#: What each key of a sweep file (``SWEEP_KEYS``) holds, for ``sim sweep --help``; docs/sweeps.md says more.
KEY_HELP = {
    "base": f"required. The run config every point starts from: a path ({', '.join(CONFIG_SUFFIXES)}; looked for "
    f"beside the sweep file, then in the current folder, then in the project) or an inline mapping.",
    "set": f"optional mapping FIELD: VALUE applied to every point (at most {MAX_SET_KEYS:,} fields, a value at most "
    f"{MAX_SET_VALUE_CHARS:,} characters as JSON); a swept field, or a part of one, may not be set.",
    "grid": "optional mapping FIELD: [VALUE, ...]; the points are the cartesian product of its axes.",
    "zip": "optional mapping FIELD: [VALUE, ...] of axes varied together (equal lengths), or a list of such "
    "groups; each group is one axis, crossed with the grid and the other groups.",
    "checks": f"optional list of invariants checked on the results: {', '.join(CHECKS)}; a broken one makes the "
    f"exit status 3.",
    "name": f"optional plain name, 1 to {MAX_NAME_CHARS} of A-Z a-z 0-9 . _ - not starting with '.' (default: the "
    f"sweep file's name without its suffix); the default results folder is runs/sweep-NAME.",
    "plots": f"optional list of swept fields (or {', '.join(EXTRA_PLOT_AXES)}) to plot throughput against "
    f"(default: every numeric swept field, the cache fields as cache_slots; []: no throughput plot).",
    "capacity": "optional mapping {slo: {ttft_s: X, tpot_s: Y}, attainment: 0.9, requests: N, seeds: [0, 1, 2], "
    "tolerance: 0.02, cv: X} (slo required): each point's task also runs `sim capacity`'s search on its config; "
    "its row gets capacity_req_s (the highest Poisson rate meeting the SLO), capacity_bounded, "
    "capacity_saturation_req_s, capacity_above_saturation and capacity_check_holds; plotted as capacity_vs_AXIS.png.",
}


def schema_epilog(width: int = 100) -> str:
    """The sweep file's keys, types, defaults and limits in a few lines (the epilog of ``sim sweep --help``),
    built from ``SWEEP_KEYS`` and the limits of ``sim.sweep.spec``."""
    lines = [
        "sweep file: a YAML (or JSON) mapping with these keys and no other (reference: docs/sweeps.md;",
        "examples: configs/sweeps/*.yaml):",
    ]
    for key in SWEEP_KEYS:
        lines.append(textwrap.fill(KEY_HELP[key], width, initial_indent=f"  {key:<9}", subsequent_indent=" " * 11))
    notes = (
        f"FIELD is a run-config path as --set takes it (policy.name, cache.hpc_slots, ...; at most "
        f"{MAX_FIELD_CHARS} characters, {MAX_FIELD_PARTS} parts). VALUE is plain data (numbers, strings, "
        f"booleans, null, lists, mappings), at most {MAX_VALUE_CHARS:,} characters as JSON in grid and zip. "
        f"A sweep varies 1 to {MAX_AXES} fields (grid and zip together) and has at most {MAX_POINTS:,} points, "
        f"counted before anything is expanded; points whose resolved configs are equal run once.",
        "checks: gpu_only_ceiling: no policy serving its experts from the GPU above gpu-only (rows that computed "
        "experts on the host are left out); belady_bound: no cache hit rate above belady's; lru_monotone_in_cache: "
        "lru's hit rate never falls as its cache grows; host_compute_bound: no row's throughput above "
        "throughput_bound_tok_s, the most its run's cost model allows (per layer its dense work plus its expert work "
        "split ideally between the GPU and the host in parallel, W/(g+h); plus the LM head), the bound of the rows "
        "that computed experts on the host.",
        "exit status: 0 every point ok and every check passed; 2 bad input, or another sweep writing in --out "
        "(nothing run; --wait waits for it); 3 a check broke; 4 points failed (--resume runs only them again); "
        "130 interrupted.",
    )
    return "\n\n".join(["\n".join(lines)] + [textwrap.fill(n, width) for n in notes])


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a grid of configs (resumable), with a report and checks",
        description="Run every point of a sweep file (one simulator run each), storing each row as\n"
        "it finishes; then write results.parquet, report.md and plots.",
        epilog=schema_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sweep", help="sweep file, e.g. configs/sweeps/ci.yaml")
    p.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="local: a process pool (default); ray: Ray tasks, on --address or a local Ray instance",
    )
    p.add_argument(
        "--address",
        default=None,
        help="with --executor ray: the Ray cluster, HOST:PORT of its head (ray start --head --port), "
        "ray://HOST:PORT or auto (default: $RAY_ADDRESS, else a local Ray instance); "
        "see docs/ray_cluster.md",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"points run at once, 1 to {MAX_WORKERS} (default: all cores; on a Ray cluster, its CPUs; "
        f"never more than the sweep has points)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the ok rows already in --out; run only the missing and the failed points",
    )
    p.add_argument(
        "--attempts",
        type=int,
        default=MAX_ATTEMPTS,
        help=f"starts of a point whose worker dies before it is recorded as failed, 1 to "
        f"{MAX_ATTEMPTS_LIMIT} (default {MAX_ATTEMPTS})",
    )
    p.add_argument("--out", help="results folder (default runs/sweep-NAME)")
    p.add_argument(
        "--wait",
        action="store_true",
        help="when another sweep is writing in --out, wait for it to end instead of refusing (exit 2); "
        "the rows it leaves need --resume to be continued",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def run(args) -> int:
    workers, attempts, address = _check_args(args)
    if args.out is not None:
        check_output_folder(args.out, "results folder (--out)")
    sweep = load_sweep(args.sweep)
    out = Path(args.out) if args.out is not None else default_out(sweep.name)
    check_outputs(out, sweep)
    check_earlier(out, args.resume)
    with hold_folder(out, getattr(args, "wait", False)):
        check_earlier(out, args.resume)  # again: the sweep it waited for may have left rows
        return _start(args, sweep, out, workers, attempts, address)


def _start(args, sweep: Sweep, out: Path, workers: int | None, attempts: int, address: str | None) -> int:
    """Start Ray when asked, run the sweep, close Ray; the exit status."""
    workers = workers or (None if address else os.cpu_count() or 1)
    session = None
    if args.executor == "ray":  # a local instance gets no more CPUs than the sweep has points
        local_cpus = min(workers, max(1, len(sweep.points))) if workers else None
        session = start_ray(address, local_cpus)  # bad address, refused token, unfit node: exit 2 before anything
        print(describe(session), file=sys.stderr)
        workers = workers or max(1, session.cluster.cpus)
    assert workers is not None, "only --address leaves workers open, and it needs the ray executor"
    try:
        return _sweep(args, sweep, out, workers, attempts, session)
    finally:
        if session is not None:
            session.close()


def _check_args(args) -> tuple[int | None, int, str | None]:
    """--workers, --attempts and the Ray address, checked before anything is read or started: (workers or None,
    attempts, address or None)."""
    workers = args.workers
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise ConfigError("--workers", f"must be between 1 and {MAX_WORKERS}, got {_int_text(workers)}")
    attempts = getattr(args, "attempts", MAX_ATTEMPTS)
    if not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise ConfigError("--attempts", f"must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {_int_text(attempts)}")
    if args.address and args.executor != "ray":
        raise ConfigError("--address", "needs --executor ray")
    address = None
    if args.executor == "ray":
        address = args.address or os.environ.get("RAY_ADDRESS") or None
        if address is not None:
            check_address(address, "--address" if args.address else "--address (from $RAY_ADDRESS)")
    return workers, attempts, address


def check_earlier(out: Path, resume: bool) -> None:
    """Rows of an earlier sweep in ``out`` are continued only with ``--resume``; a file in its rows folder that no
    sweep wrote is refused."""
    if has_rows(out) and not resume:
        raise ConfigError(str(out), "holds results of an earlier sweep: pass --resume to continue it, or another --out")
    check_rows(out)


@contextlib.contextmanager
def hold_folder(out: Path, wait: bool) -> Iterator[None]:
    """Hold the sweep lock of ``out`` (``OUT/.sweep.lock``: :func:`traces.locks.held_lock`; made with its folders
    if missing) while the block runs. Another sweep holding it: a ConfigError, or with ``wait`` one line on stderr
    and a wait. On leaving, the folders this made go again if still empty (a sweep refused after locking leaves
    nothing)."""
    made = [f for f in (out, *out.parents) if not f.exists()]  # deepest first

    def when_busy() -> None:
        if not wait:
            raise ConfigError(str(out), BUSY)
        print(one_line(f"another sweep is writing in {out}: waiting for it to end (--wait)", 400), file=sys.stderr)
        sys.stderr.flush()

    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(str(out), f"cannot be made ({exc.strerror or exc})") from None
        with held_lock(out / LOCK_FILE, "the folder", when_busy):
            yield
    finally:
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _int_text(n: int) -> str:
    return str(n) if abs(n) < 10**12 else f"a number of {n.bit_length()} bits"


def default_out(name: str) -> Path:
    """``runs/sweep-NAME``: inside ``runs/`` (a sweep's name is a plain name, checked when it is loaded)."""
    if not is_safe_name(name):
        raise ConfigError("sweep.name", f"{name!r:.80} is not a plain name")
    return Path("runs") / f"sweep-{name}"


def check_outputs(out: Path, sweep: Sweep) -> None:
    """Every place the sweep writes, checked before it starts: the folder, its rows folder and the report's
    files (none may be a FIFO, a device, a folder where a file goes...)."""
    check_output_folder(out, "results folder (--out)")
    check_output_folder(out / ROWS, "rows folder")
    for name in report_files(sweep):
        check_output_file(out / name, "sweep report")


def _sweep(args, sweep: Sweep, out: Path, workers: int, attempts: int, session) -> int:
    """Run the points not done yet, then write the report; the exit status."""
    orphans = clean_orphans(out) if out.exists() else []
    done, failed_before = done_points(out) if args.resume else (set(), set())
    wanted = {p.id for p in sweep.points}
    todo = [p for p in sweep.points if p.id not in done]
    retry = len(wanted & (failed_before - done))
    print(
        f"sweep {sweep.name}: {len(sweep.points)} points, {len(sweep.points) - len(todo)} already done, "
        f"{len(todo)} to run{f' ({retry} failed before)' if retry else ''} on {min(workers, max(1, len(todo)))} "
        f"worker(s) -> {out}" + (f"; removed {len(orphans)} unfinished temporary file(s)" if orphans else ""),
        file=sys.stderr,
    )
    out.mkdir(parents=True, exist_ok=True)
    progress = Progress(len(todo), args.quiet)
    try:
        if session is not None:
            run_ray(sweep, todo, out, workers, progress, max_attempts=attempts, session=session)
        else:
            run_local(sweep, todo, out, workers, progress, attempts)
        df = read_rows(out)
        df = df[df["point"].isin(wanted)] if len(df) else df
        checks = run_checks(df, sweep)
        files = write_report(out, sweep, df, checks)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished rows are kept in {out}; rerun with --resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OutputError as exc:  # a full disk, a read-only mount...: the rows written so far are complete
        raise OutputError(exc.path, f"{exc.problem}; finished rows are kept in {out}: rerun with --resume") from None
    failed = int((~df["status"].isin(DONE)).sum()) if len(df) else 0
    misfit = int((df["status"] == DOES_NOT_FIT).sum()) if len(df) else 0
    unfit = f", {misfit} {'does' if misfit == 1 else 'do'} not fit in the GPU's memory" if misfit else ""
    print(f"{len(df)} points ({failed} failed{unfit}); wrote {', '.join(str(f) for f in files)}")
    broken = {k: v for k, v in checks.items() if v}
    for name, bad in broken.items():
        more = f" (and {len(bad) - 3} more in {out / 'report.md'})" if len(bad) > 3 else ""
        print(one_line(f"CHECK FAILED {name}: {'; '.join(bad[:3])}", 600) + more, file=sys.stderr)
    if failed:
        print(
            f"{failed} of {len(df)} points failed (errors in {out / 'report.md'}); to run only them again: "
            f"python -m sim sweep {args.sweep} --out {out} --resume",
            file=sys.stderr,
        )
    return EXIT_CHECK_FAILED if broken else EXIT_POINTS_FAILED if failed else EXIT_OK


__all__ = [
    "Sweep",
    "Point",
    "load_sweep",
    "run_point",
    "read_rows",
    "run_checks",
    "write_row",
    "row_of",
    "Progress",
    "run_local",
    "run_ray",
    "write_report",
    "make_plots",
    "CHECKS",
    "METRICS",
    "SWEEP_KEYS",
    "MAX_ATTEMPTS",
    "KEY_HELP",
    "register",
    "run",
    "schema_epilog",
]
