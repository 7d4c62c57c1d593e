"""`python -m sim sweep configs/sweeps/NAME.yaml [--executor local|ray] [--workers N] [--resume] [--out DIR]`:
many runs of one base config.

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
(the swept fields, the summary metrics, status, error, wall time) as ``OUT/rows/POINT.parquet``, each written
atomically as soon as the point finishes, so an interrupted sweep (Ctrl-C, kill -9, a dead worker) keeps every
finished row and ``--resume`` runs only the missing points. A failing point records its error and the sweep goes
on. At the end ``OUT/results.parquet`` holds every row and ``OUT/report.md`` the table, checks and plots.
"""

from __future__ import annotations

import copy
import hashlib
import io
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import yaml

from sim.errors import ConfigError
from traces.io import atomic_write_bytes

SWEEP_KEYS = {"base", "set", "grid", "zip", "checks", "name", "plots"}
METRICS = {  # row column -> path in summary.json
    "throughput_tok_s": ("throughput_tok_s",), "iteration_ms_mean": ("iteration_ms", "mean"),
    "iteration_ms_p50": ("iteration_ms", "p50"), "iteration_ms_p99": ("iteration_ms", "p99"),
    "hit_rate": ("hit_rate", "overall"), "hit_rate_hpc": ("hit_rate", "hpc"), "hit_rate_mpc": ("hit_rate", "mpc"),
    "hit_rate_lpc": ("hit_rate", "lpc"), "pcie_bytes": ("pcie_bytes",), "link_busy_frac": ("link_busy_frac",),
    "compute_busy_frac": ("compute_busy_frac",), "stall_ms": ("stall_ms",),
    "prefetch_precision": ("prefetch", "precision"), "prefetch_recall": ("prefetch", "recall"),
    "prefetch_wasted_bytes": ("prefetch", "wasted_bytes"), "requests_reused": ("requests_reused",),
    "events": ("events",), "sim_wall_s": ("wall_s",),
}


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its overrides (swept fields and values) and the id of its resolved config."""

    id: str
    fields: dict
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Sweep:
    name: str
    base: object            # path (str) of the base run config, or an inline mapping
    common: dict            # overrides for every point
    axes: list[str]
    points: list[Point]
    checks: list[str]
    source: str
    plots: list[str] | None = None   # x axes of the throughput plots (None: every numeric swept axis)


def _override(key: str, value) -> str:
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file, expand its points and resolve each (bad input -> ConfigError)."""
    from sim.config import apply_override, config_from_dict, load_run_config
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), "no such sweep file")
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(d, dict):
        raise ConfigError(str(path), "must hold a mapping with base and grid")
    unknown = sorted(set(d) - SWEEP_KEYS)
    if unknown:
        raise ConfigError(f"sweep.{unknown[0]}", f"unknown key (known: {', '.join(sorted(SWEEP_KEYS))})")
    if "base" not in d:
        raise ConfigError("sweep.base", "missing: name the base run config")
    base = d["base"]
    if isinstance(base, str):
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        base = str(base_path.resolve() if base_path.exists() else base)  # absolute: workers may run elsewhere
    elif not isinstance(base, dict):
        raise ConfigError("sweep.base", "must be a path to a run config or an inline mapping")
    common = d.get("set") or {}
    grid = d.get("grid") or {}
    groups = d.get("zip") or []
    groups = [groups] if isinstance(groups, dict) else groups
    if not isinstance(groups, list):
        raise ConfigError("sweep.zip", "must be a mapping of zipped axes, or a list of such mappings")
    for name, axes in [("set", common), ("grid", grid)] + [(f"zip[{i}]", g) for i, g in enumerate(groups)]:
        if not isinstance(axes, dict):
            raise ConfigError(f"sweep.{name}", "must be a mapping of config field -> value(s)")
    for name, axes in [("grid", grid)] + [("zip" if len(groups) == 1 else f"zip[{i}]", g) for i, g in enumerate(groups)]:
        for key, values in axes.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"sweep.{name}.{key}", "must be a non-empty list of values")
        if name.startswith("zip") and len({len(v) for v in axes.values()}) > 1:
            raise ConfigError(f"sweep.{name}", "every zipped axis needs the same number of values")
    if not grid and not groups:
        raise ConfigError("sweep.grid", "give at least one axis (grid or zip)")
    plots = d.get("plots")
    if plots is not None and (not isinstance(plots, list) or not all(isinstance(x, str) for x in plots)):
        raise ConfigError("sweep.plots", "must list swept fields (or cache_slots) to plot throughput against")
    checks = d.get("checks") or []
    for c in checks:
        if c not in CHECKS:
            raise ConfigError("sweep.checks", f"unknown check {c!r} (known: {', '.join(CHECKS)})")
    base_overrides = [_override(k, v) for k, v in common.items()]
    grid_keys = list(grid)
    zip_keys = [k for g in groups for k in g]
    # each zip group is one axis of tuples; the groups and the grid axes are crossed
    group_rows = [list(zip(*g.values())) for g in groups]
    combos = []
    for g in itertools.product(*grid.values()) if grid else [()]:
        for zs in itertools.product(*group_rows) if group_rows else [()]:
            values = list(g) + [v for z in zs for v in z]
            combos.append(dict(zip(grid_keys + zip_keys, values)))
    points, seen = [], set()
    for fields in combos:
        overrides = tuple(base_overrides + [_override(k, v) for k, v in fields.items()])
        try:
            if isinstance(base, dict):
                raw = copy.deepcopy(base)
                for o in overrides:
                    apply_override(raw, o)
                cfg = config_from_dict(raw, str(path), POLICIES.names(), PREDICTORS.names())
            else:
                cfg = load_run_config(base, overrides, POLICIES.names(), PREDICTORS.names())
        except ConfigError as exc:
            raise ConfigError(f"{exc} (sweep point {json.dumps(fields)})") from None
        pid = hashlib.sha256(json.dumps(cfg.resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]
        if pid in seen:
            continue
        seen.add(pid)
        points.append(Point(pid, fields, overrides))
    for x in plots or []:
        if x not in grid_keys + zip_keys + ["cache_slots"]:
            raise ConfigError("sweep.plots", f"{x!r} is not a swept field (nor cache_slots)")
    return Sweep(d.get("name") or path.stem, base, common, grid_keys + zip_keys, points, list(checks), str(path),
                 plots)


# --------------------------------------------------------------------------------------------------- running

def run_point(base, overrides: tuple[str, ...], source: str = "sweep") -> dict:
    """Simulate one point in this process; returns its metrics (raises on failure)."""
    from sim.config import apply_override, config_from_dict, load_run_config
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS
    from sim.run import simulate

    if isinstance(base, dict):
        raw = copy.deepcopy(base)
        for o in overrides:
            apply_override(raw, o)
        cfg = config_from_dict(raw, source, POLICIES.names(), PREDICTORS.names())
    else:
        cfg = load_run_config(base, overrides, POLICIES.names(), PREDICTORS.names())
    s = simulate(cfg).summary
    out = {}
    for col, keys in METRICS.items():
        v = s
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        out[col] = v
    out["cache_slots"] = cfg.cache.hpc_slots + cfg.cache.mpc_slots
    return out


def _guarded(base, overrides, source) -> tuple[str, dict | None, str | None, float]:
    t0 = time.perf_counter()
    try:
        return "ok", run_point(base, overrides, source), None, time.perf_counter() - t0
    except Exception as exc:  # a failing point is recorded, the sweep goes on
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        return "failed", None, msg, time.perf_counter() - t0


def row_of(sweep: Sweep, point: Point, status: str, metrics: dict | None, error: str | None, wall: float) -> dict:
    row = {"point": point.id, "status": status, "error": error, "wall_s": wall}
    row.update({k: _scalar(v) for k, v in point.fields.items()})
    row.update(metrics or {k: None for k in list(METRICS) + ["cache_slots"]})
    return row


def _scalar(v):
    return v if isinstance(v, (int, float, str, bool)) or v is None else json.dumps(v)


def write_row(out: Path, row: dict) -> None:
    """One point's row as ``OUT/rows/POINT.parquet``, atomically."""
    import pandas as pd

    buf = io.BytesIO()
    pd.DataFrame([row]).to_parquet(buf, index=False)
    atomic_write_bytes(out / "rows" / f"{row['point']}.parquet", buf.getvalue())


def read_rows(out: Path):
    """Every stored row (a pandas DataFrame; empty when none)."""
    import pandas as pd

    files = sorted((out / "rows").glob("*.parquet"))
    if not files:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


class Progress:
    """points done / failed / left and time left, on one stderr line."""

    def __init__(self, total: int, quiet: bool = False):
        self.total, self.done, self.failed, self.t0 = total, 0, 0, time.perf_counter()
        self.quiet = quiet or not sys.stderr.isatty()

    def update(self, status: str) -> None:
        self.done += 1
        self.failed += status != "ok"
        if self.quiet:
            return
        elapsed = time.perf_counter() - self.t0
        left = (self.total - self.done) * elapsed / self.done if self.done else 0.0
        print(f"\r  sweep: {self.done}/{self.total} points, {self.failed} failed, ~{left:.0f} s left   ",
              end="" if self.done < self.total else "\n", file=sys.stderr, flush=True)


def run_local(sweep: Sweep, todo: list[Point], out: Path, workers: int, progress: Progress) -> None:
    """Run points in a process pool (or in this process when workers == 1), storing each row as it finishes."""
    if workers <= 1:
        for p in todo:
            status, metrics, error, wall = _guarded(sweep.base, p.overrides, sweep.source)
            write_row(out, row_of(sweep, p, status, metrics, error, wall))
            progress.update(status)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_guarded, sweep.base, p.overrides, sweep.source): p for p in todo}
        for fut in as_completed(futures):
            p = futures[fut]
            try:
                status, metrics, error, wall = fut.result()
            except BrokenProcessPool as exc:  # a worker died: this point is recorded as failed, resume reruns it
                status, metrics, error, wall = "failed", None, f"worker died: {exc}", 0.0
            write_row(out, row_of(sweep, p, status, metrics, error, wall))
            progress.update(status)


def run_ray(sweep: Sweep, todo: list[Point], out: Path, workers: int, progress: Progress,
            address: str | None = None) -> None:
    """Run points as Ray tasks: on a local Ray instance of ``workers`` CPUs, or on the cluster at ``address``
    (whose nodes need this project installed and the traces at the same paths). Rows are stored by this process
    as the tasks finish, exactly as with the local executor."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor", "ray is not installed (pip install 'moe-offload-sim[ray]')") from None
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(_guarded)
        pending = {task.remote(sweep.base, p.overrides, sweep.source): p for p in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                p = pending.pop(ref)
                try:
                    status, metrics, error, wall = ray.get(ref)
                except Exception as exc:  # the worker died: recorded as failed, --resume reruns it
                    status, metrics, error, wall = "failed", None, f"ray task failed: {exc}".splitlines()[0], 0.0
                write_row(out, row_of(sweep, p, status, metrics, error, wall))
                progress.update(status)
    finally:
        ray.shutdown()


# ---------------------------------------------------------------------------------------------------- checks

def _check_gpu_only_ceiling(df, axes):
    """gpu-only's throughput >= every policy's at the same other fields."""
    if "policy.name" not in df or "gpu-only" not in set(df["policy.name"]):
        return None
    others = [a for a in axes if a not in ("policy.name", "predictor.name") and a in df]
    bad = []
    for key, g in (df.groupby(others) if others else [((), df)]):
        ceiling = g.loc[g["policy.name"] == "gpu-only", "throughput_tok_s"]
        if ceiling.empty:
            continue
        worse = g[g["throughput_tok_s"] > ceiling.max() * (1 + 1e-9)]
        bad += [f"{r['policy.name']} at {key}" for _, r in worse.iterrows()]
    return bad


def _check_belady_bound(df, axes):
    """belady's cache hit rate (HPC + MPC) >= every policy's at the same other fields."""
    if "policy.name" not in df or "belady" not in set(df["policy.name"]):
        return None
    df = df.assign(cache_hits=df["hit_rate_hpc"] + df["hit_rate_mpc"])
    others = [a for a in axes if a not in ("policy.name", "predictor.name") and a in df]
    bad = []
    for key, g in (df.groupby(others) if others else [((), df)]):
        bound = g.loc[g["policy.name"] == "belady", "cache_hits"]
        if bound.empty:
            continue
        above = g[(g["policy.name"] != "gpu-only") & (g["cache_hits"] > bound.max() + 1e-12)]
        bad += [f"{r['policy.name']} at {key}" for _, r in above.iterrows()]
    return bad


def _check_lru_monotone(df, axes):
    """lru's cache hit rate never falls as its cache grows (other fields fixed)."""
    if "policy.name" not in df or "lru" not in set(df["policy.name"]):
        return None
    lru = df[df["policy.name"] == "lru"].assign(cache_hits=lambda x: x["hit_rate_hpc"] + x["hit_rate_mpc"])
    size_axes = [a for a in axes if a.startswith("cache.") and a in lru]
    others = [a for a in axes if a not in size_axes and a != "policy.name" and a in lru]
    bad = []
    for key, g in (lru.groupby(others) if others else [((), lru)]):
        g = g.sort_values("cache_slots")
        hits = g["cache_hits"].tolist()
        if any(b < a - 1e-12 for a, b in zip(hits, hits[1:])):
            bad.append(f"lru at {key}: {[round(h, 4) for h in hits]}")
    return bad


CHECKS = {"gpu_only_ceiling": _check_gpu_only_ceiling, "belady_bound": _check_belady_bound,
          "lru_monotone_in_cache": _check_lru_monotone}


def run_checks(df, sweep: Sweep) -> dict[str, list[str] | None]:
    ok = df[df["status"] == "ok"] if len(df) else df
    return {name: CHECKS[name](ok, sweep.axes) for name in sweep.checks}


# ---------------------------------------------------------------------------------------------------- report

def write_report(out: Path, sweep: Sweep, df, checks: dict) -> list[Path]:
    """results.parquet, report.md and the plots that the swept axes allow."""
    import pandas as pd

    files = []
    for a in sweep.axes:  # an axis whose values mix types (1.0 and "high") is stored as text
        if a in df and len({type(v) for v in df[a] if v is not None}) > 1:
            df[a] = df[a].map(lambda v: None if v is None else str(v))
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(out / "results.parquet", buf.getvalue())
    files.append(out / "results.parquet")
    plots = make_plots(out, sweep, df[df["status"] == "ok"] if len(df) else df)
    files += plots
    cols = [a for a in sweep.axes if a in df] + ["status", "throughput_tok_s", "iteration_ms_mean", "hit_rate",
                                                 "hit_rate_hpc", "hit_rate_mpc", "hit_rate_lpc", "pcie_bytes"]
    table = df[cols].sort_values([a for a in sweep.axes if a in df]) if len(df) else pd.DataFrame(columns=cols)
    lines = [f"# Sweep {sweep.name}", "", f"{len(df)} points from `{sweep.source}`; "
             f"{int((df['status'] != 'ok').sum()) if len(df) else 0} failed.", ""]
    if checks:
        lines += ["## Checks", ""]
        for name, bad in checks.items():
            state = "not applicable" if bad is None else ("passed" if not bad else f"FAILED: {'; '.join(bad)}")
            lines.append(f"- `{name}`: {state}")
        lines.append("")
    lines += ["## Points", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        lines.append("| " + " | ".join(_cell(r[c]) for c in cols) + " |")
    if len(df) and (df["status"] != "ok").any():
        lines += ["", "## Failed points", ""]
        for _, r in df[df["status"] != "ok"].iterrows():
            lines.append(f"- {r['point']}: {r['error']}")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    atomic_write_bytes(out / "report.md", ("\n".join(lines) + "\n").encode())
    files.append(out / "report.md")
    return files


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:,.4g}"
    return str(v)


def make_plots(out: Path, sweep: Sweep, df) -> list[Path]:
    """Throughput against each numeric axis (one line per policy), and hit rate per tier per policy."""
    if not len(df):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    series = "policy.name" if "policy.name" in df else None
    numeric = [a for a in sweep.axes if a in df and a != series and df[a].map(lambda v: isinstance(v, (int, float))
                                                                               and not isinstance(v, bool)).all()]
    if any(a.startswith("cache.") for a in numeric):
        numeric = [a for a in numeric if not a.startswith("cache.")] + ["cache_slots"]
    if sweep.plots is not None:  # the sweep file chose its plots
        numeric = [a for a in sweep.plots if a in df]
    for axis in numeric:
        fig, ax = plt.subplots(figsize=(6, 4))
        others = [a for a in sweep.axes if a in df and a not in (axis, series) and not a.startswith("cache.")
                  and not (series and (df.groupby(series)[a].nunique() <= 1).all())]  # zipped with the series
        sub = df
        if others:  # one line per series at the first value of every other axis
            for a in others:
                sub = sub[sub[a] == sub[a].iloc[0]]
        for name, g in (sub.groupby(series) if series else [("all", sub)]):
            g = g.groupby(axis, as_index=False)["throughput_tok_s"].mean().sort_values(axis)
            ax.plot(g[axis], g["throughput_tok_s"], marker="o", label=str(name))
        ax.set_xlabel(axis)
        ax.set_ylabel("throughput (tokens/s)")
        lo, hi = sub["throughput_tok_s"].min(), sub["throughput_tok_s"].max()
        if lo > 0 and hi / lo > 20:  # gpu-only dwarfs the offloading policies
            ax.set_yscale("log")
        if others:
            title = ", ".join(f"{a}={sub[a].iloc[0]}" for a in others)
            ax.set_title(title if len(title) <= 90 else title[:87] + "...", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save_png(plt, fig, out / f"throughput_vs_{axis.replace('.', '_')}.png"))
    if series:
        tiers = df.groupby(series)[["hit_rate_hpc", "hit_rate_mpc", "hit_rate_lpc"]].mean()
        fig, ax = plt.subplots(figsize=(6, 4))
        bottom = None
        for col, label in (("hit_rate_hpc", "HPC"), ("hit_rate_mpc", "MPC"), ("hit_rate_lpc", "LPC (prefetched)")):
            vals = tiers[col].fillna(0.0)
            ax.bar(tiers.index.astype(str), vals, bottom=bottom, label=label)
            bottom = vals if bottom is None else bottom + vals
        ax.set_ylabel("hit rate (mean over points)")
        ax.tick_params(axis="x", rotation=30, labelsize=7)
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save_png(plt, fig, out / "hit_rate_per_tier.png"))
    return made


def _save_png(plt, fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


# ---------------------------------------------------------------------------------------------------- cli

def register(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of configs (resumable), with a report and checks")
    p.add_argument("sweep", help="sweep file, e.g. configs/sweeps/ci.yaml")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: a process pool (default); ray: Ray tasks, on --address or a local Ray instance")
    p.add_argument("--address", default=None, help="address of an existing Ray cluster (with --executor ray)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    p.add_argument("--resume", action="store_true", help="keep the rows already in --out; run only missing points")
    p.add_argument("--out", help="results folder (default runs/sweep-NAME)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def run(args) -> int:
    sweep = load_sweep(args.sweep)
    if args.workers < 1:
        raise ConfigError("--workers", f"must be >= 1, got {args.workers}")
    out = Path(args.out) if args.out else Path("runs") / f"sweep-{sweep.name}"
    rows_dir = out / "rows"
    if rows_dir.exists() and any(rows_dir.glob("*.parquet")) and not args.resume:
        raise ConfigError(str(out), "holds results of an earlier sweep: pass --resume to continue it, or another --out")
    done = set(read_rows(out)["point"]) if args.resume and rows_dir.exists() else set()
    wanted = {p.id for p in sweep.points}
    todo = [p for p in sweep.points if p.id not in done]
    print(f"sweep {sweep.name}: {len(sweep.points)} points, {len(sweep.points) - len(todo)} already done, "
          f"{len(todo)} to run on {args.workers} worker(s) -> {out}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    progress = Progress(len(todo), args.quiet)
    try:
        if args.executor == "ray":
            run_ray(sweep, todo, out, args.workers, progress, args.address)
        else:
            run_local(sweep, todo, out, args.workers, progress)
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished rows are kept in {out}; rerun with --resume", file=sys.stderr)
        return 130
    df = read_rows(out)
    df = df[df["point"].isin(wanted)] if len(df) else df
    checks = run_checks(df, sweep)
    files = write_report(out, sweep, df, checks)
    failed = int((df["status"] != "ok").sum()) if len(df) else 0
    print(f"{len(df)} points ({failed} failed); wrote {', '.join(str(f) for f in files)}")
    broken = {k: v for k, v in checks.items() if v}
    for name, bad in broken.items():
        print(f"CHECK FAILED {name}: {'; '.join(bad)}", file=sys.stderr)
    return 3 if broken else 0


__all__ = ["Sweep", "Point", "load_sweep", "run_point", "read_rows", "run_checks"]
