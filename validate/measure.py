"""`validate gpu|cpu`: measure a machine into a folder that `validate compare` reads, needing only torch and the
decision code (no SimPy).

The folder::

    calibration.yaml           microbenchmarks (validate.microbench): the only thing compare calibrates from
    manifest.json              device, machine, suite, versions, the configurations and their trace checksums
    runs/NAME/config.yaml      the run config measured (a `sim run` config; hardware is replaced by compare)
    runs/NAME/iterations.csv   per iteration: real latency, host wait, hits per tier, misses, copies, prefetches
    runs/NAME/summary.json     throughput, iteration latency mean/p50/p99, totals, notes (physical buffer pools)
    runs/NAME/decisions.json   every (iteration, layer) decision the policy made, for the identical-decisions check

Every file is written atomically; a folder left by an interrupted run keeps its finished configurations, and
``--resume`` skips them.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

from sim.config import config_from_dict
from sim.errors import ConfigError
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.results import iterations_csv
from traces.io import atomic_write_bytes, load_trace
from validate.suites import SUITES

GB = 1 << 30


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()


def stats_ms(values) -> dict:
    a = np.asarray(list(values), dtype=float) * 1e3
    if a.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p99": None}
    return {"count": int(a.size), "mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p99": float(np.percentile(a, 99))}


def decisions_digest(decisions) -> str:
    return hashlib.sha256(json.dumps([asdict(d) for d in decisions]).encode()).hexdigest()


def real_summary(name: str, res, workload_info, description: str) -> dict:
    decode = [r.latency_s for r in res.iterations if r.kind == "decode"]
    return {
        "config": name,
        "device": description,
        "throughput_tok_s": workload_info.decode_tokens / res.total_s if res.total_s > 0 else None,
        "iteration_ms": stats_ms(decode),
        "total_s": res.total_s,
        "iterations": len(res.iterations),
        "decode_tokens": workload_info.decode_tokens,
        "warmup_iterations": res.warmup_iterations,
        "hits": {"hpc": sum(r.hits_hpc for r in res.iterations), "mpc": sum(r.hits_mpc for r in res.iterations),
                 "lpc": sum(r.hits_lpc for r in res.iterations)},
        "misses": sum(r.misses for r in res.iterations),
        "copies": res.copies,
        "mean_copy_ms": 1e3 * res.copy_s / res.copies if res.copies else None,
        "link_busy_frac": res.copy_s / res.total_s if res.total_s > 0 else None,
        "prefetch_copies": res.prefetch_copies,
        "max_buffers_in_use": res.max_buffers_in_use,
        "host_pool": {"physical": res.host_pool, "logical": res.logical_experts},
        "device_slots": {"physical": res.device_slots, "logical": res.logical_slots},
        "moe_layers": res.layers,
        "decisions_sha256": decisions_digest(res.decisions),
        "notes": res.notes,
    }


def _trace_sha(path: Path) -> str:
    h = hashlib.sha256()
    h.update(path.read_bytes())
    return h.hexdigest()


def measure(kind: str, out: str | Path, device: str, quick: bool = False, only: list[str] | None = None,
            repeat: int = 5, threads: int = 1, resume: bool = False, host_pool_gb: float | None = None,
            log=print) -> Path:
    """Calibrate, then run every configuration of suite ``kind`` on ``device``; returns the folder."""
    from validate.backends import make_backend
    from validate.executor import Executor
    from validate.microbench import calibrate, write_calibration

    suite = SUITES[kind]
    try:
        configs = suite.configs(quick, only)
    except KeyError as exc:
        raise ConfigError("--configs", str(exc.args[0]).split(": ", 1)[1]) from None
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} exists and is not a folder")
    cfgs = [(name, d, config_from_dict(d, f"{kind}:{name}", POLICIES.names(), PREDICTORS.names()))
            for name, d in configs]
    try:
        backend = make_backend(device, threads)
    except ValueError as exc:
        raise ConfigError("--device", str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    traces = {}
    for _, _, cfg in cfgs:
        traces.setdefault(str(cfg.workload.trace), load_trace(cfg.workload.trace))
    model = cfgs[0][2].model
    batch_sizes = sorted({c.workload.batch_size for _, _, c in cfgs})
    max_ctx = 0
    for _, _, c in cfgs:
        tr = traces[str(c.workload.trace)]
        max_ctx = max(max_ctx, int(tr.prefill_lengths.max()) + (c.workload.max_decode_tokens or 0) + 1)
    started = time.perf_counter()
    cal_path = out / "calibration.yaml"
    if resume and cal_path.exists():
        log(f"calibration: kept {cal_path}")
    else:
        log(f"calibration: microbenchmarks of {model.name} on {backend.describe()} ...")
        t0 = time.perf_counter()
        cal = calibrate(model, "h200", backend=backend, quick=quick, repeat=repeat, batch_sizes=batch_sizes,
                        max_context=max_ctx)
        write_calibration(cal_path, cal)
        log(f"calibration: wrote {cal_path} in {time.perf_counter() - t0:.1f} s")
    manifest = {
        "suite": kind, "quick": quick, "device": backend.describe(), "device_kind": backend.name,
        "threads": threads if backend.name == "cpu" else None,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
        "python": platform.python_version(), "torch": backend.torch.__version__,
        "command": " ".join(["python -m validate"] + sys.argv[1:]) if sys.argv and sys.argv[0].endswith(
            ("__main__.py", "validate")) else None,
        "configs": [name for name, _, _ in cfgs],
        "traces": {p: _trace_sha(Path(cfg.workload.trace)) for p, cfg in
                   {str(c.workload.trace): c for _, _, c in cfgs}.items()},
    }
    atomic_write_bytes(out / "manifest.json", _json(manifest))
    pool = int((host_pool_gb if host_pool_gb is not None else (8 if backend.name != "cpu" else 2)) * GB)
    if backend.name != "cpu":
        free, _ = backend.torch.cuda.mem_get_info()
        slot_budget = max(GB, free - 16 * GB)
    else:
        slot_budget = 4 * GB
    for i, (name, raw, cfg) in enumerate(cfgs, 1):
        run_dir = out / "runs" / name
        if resume and (run_dir / "summary.json").exists():
            log(f"[{i}/{len(cfgs)}] {name}: kept (--resume)")
            continue
        t0 = time.perf_counter()
        ex = Executor(cfg, traces[str(cfg.workload.trace)], backend, host_pool_bytes=pool,
                      slot_budget_bytes=slot_budget)
        res = ex.run()
        summary = real_summary(name, res, ex.info, backend.describe())
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(run_dir / "config.yaml", yaml.safe_dump(raw, sort_keys=False).encode())
        atomic_write_bytes(run_dir / "iterations.csv", iterations_csv(res.iterations))
        atomic_write_bytes(run_dir / "decisions.json", _json([asdict(d) for d in res.decisions]))
        atomic_write_bytes(run_dir / "summary.json", _json(summary))
        it = summary["iteration_ms"]
        log(f"[{i}/{len(cfgs)}] {name}: {summary['iterations']} iterations, mean {it['mean']:.2f} ms, "
            f"p50 {it['p50']:.2f} ms, {summary['throughput_tok_s']:.1f} tok/s, {res.copies} copies "
            f"({time.perf_counter() - t0:.1f} s)")
        del ex, res
    log(f"measured {len(cfgs)} configuration(s) into {out} in {time.perf_counter() - started:.1f} s; "
        f"next: python -m validate compare {out}")
    return out
