"""`validate compare DIR`: calibrate the simulator from DIR's microbenchmarks only, simulate every configuration
that was measured, and report how far the simulator is from the real runs.

Per configuration: mean and p50 decode-iteration latency and throughput, real and simulated, and the simulator's
signed relative error ``(sim - real) / real``; where the time went, to explain an error: mean copy time (timed on
the device), the compute stream's stall per iteration (real: timed on the device around each wait; simulated),
the host's busy time per iteration (real: deciding and issuing work, not waiting for copies: where it comes near
the latency, the run is bound by the host, which the simulator does not model), the link's mean idle gap between
queued copies (real) and the link's busy fraction; whether the simulator's engine made the very decisions the
executor made (every (iteration, layer): sources per active expert, promotions, prefetches, unused prefetches); the median
absolute errors over the configurations. For experts computed on the host CPU (hybrid policies, issue 13): their
share of the active experts (``cpu_expert_frac``), their count, the host's busy time per iteration and the compute
stream's idle time waiting for it (``cpu_wait``), real and simulated, and a section of the report of the hybrid
configurations alone, with their median error. A policy that weighs costs (fiddler: the host against a copy) decides
with the calibration as it stood when its configuration ran (``runs/NAME/hardware.yaml``, which ``measure`` keeps);
where the final calibration would make it decide otherwise, the configuration is simulated on that snapshot
(``sim_hardware`` says which). Written to ``DIR/compare/`` (or ``--out``): ``compare.csv``,
``compare.md`` and ``compare.png`` (simulated against real latency, and the errors per configuration).

DIR may also be the archive ``run_gpu_check.sh`` packs (``gpu-check.tar.gz``): it is unpacked beside itself first
(``gpu-check.tar.gz`` -> ``gpu-check/``), and kept.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np

import sim.cache
from sim.config import config_from_dict
from sim.errors import ConfigError
from sim.files import file_status, read_structured_file
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.run import simulate
from traces.io import atomic_write_bytes, file_sha256, load_trace
from validate.measure import decisions_digest

COLUMNS = ["config", "policy", "predictor", "batch_size", "hpc_slots", "mpc_slots", "iterations",
           "real_mean_ms", "sim_mean_ms", "err_mean_pct", "real_p50_ms", "sim_p50_ms", "err_p50_pct",
           "real_tok_s", "sim_tok_s", "err_tok_s_pct", "real_copies", "sim_copies", "real_copy_ms", "sim_copy_ms",
           "real_stall_ms", "sim_stall_ms", "real_host_busy_ms", "real_decide_ms", "real_gate_sync_ms",
           "real_copy_gap_us", "real_link_busy", "sim_link_busy",
           "cpu_expert_frac", "real_cpu_experts", "sim_cpu_experts", "real_cpu_busy_ms", "sim_cpu_busy_ms",
           "real_cpu_wait_ms", "sim_cpu_wait_ms", "sim_hardware", "decisions_identical"]

#: A plan's source for an expert computed on the host CPU (``sim.cache.CPU`` where the simulator has it).
CPU_SOURCE = getattr(sim.cache, "CPU", "cpu")


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(str(path), f"missing: not a finished validate measurement ({what})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"is not valid JSON ({exc})") from None


def _err(sim: float, real: float) -> float:
    return 100.0 * (sim - real) / real


def compare_run(folder: Path, run_dir: Path, manifest: dict) -> dict:
    """One configuration's row: simulate it on the folder's calibration and set it beside the real run."""
    real = _read_json(run_dir / "summary.json", "summary.json")
    if file_status(run_dir / "config.yaml") is None:
        raise ConfigError(str(run_dir / "config.yaml"), "missing: not a finished validate measurement")
    raw = read_structured_file(run_dir / "config.yaml", str(run_dir / "config.yaml"), name_file=False)
    if not isinstance(raw, dict):
        raise ConfigError(str(run_dir / "config.yaml"), "must hold a run config mapping")
    raw["hardware"] = str(folder / "calibration.yaml")
    cfg = config_from_dict(raw, str(run_dir / "config.yaml"), POLICIES.names(), PREDICTORS.names())
    trace_key = raw["workload"]["trace"]
    want = manifest.get("traces", {}).get(str(cfg.workload.trace)) or manifest.get("traces", {}).get(trace_key)
    have = file_sha256(cfg.workload.trace)
    if want is not None and want != have:
        raise ConfigError(str(cfg.workload.trace), "differs from the trace that was measured (checksum mismatch)")
    trace = load_trace(cfg.workload.trace)
    out = simulate(cfg, trace=trace, record_decisions=True)
    # the decisions: the simulator's, step by step, must be what the executor recorded
    identical = decisions_digest(out.engine.decisions) == real["decisions_sha256"]
    sim_hardware = "calibration.yaml"
    snapshot = run_dir / "hardware.yaml"
    if not identical and snapshot.exists():
        # a policy that weighs costs (fiddler: the host against a copy) decided with the calibration as it stood
        # when the configuration ran (measure.py), which the passes after it moved: simulate on that one
        raw["hardware"] = str(snapshot)
        cfg = config_from_dict(raw, str(run_dir / "config.yaml"), POLICIES.names(), PREDICTORS.names())
        again = simulate(cfg, trace=trace, record_decisions=True)
        if decisions_digest(again.engine.decisions) == real["decisions_sha256"]:
            out, identical, sim_hardware = again, True, f"runs/{run_dir.name}/hardware.yaml"
    s = out.summary
    w = cfg.workload
    sim_cpu = sum(1 for d in out.engine.decisions for _, src in d.sources if src == CPU_SOURCE)
    sim_active = sum(len(d.active) for d in out.engine.decisions)
    real_frac = real.get("cpu_expert_frac")
    if real_frac is None:  # measured before host experts: none were
        real_frac = sim_cpu / sim_active if sim_active else 0.0
    rm, sm = real["iteration_ms"]["mean"], s["iteration_ms"]["mean"]
    rp, sp = real["iteration_ms"]["p50"], s["iteration_ms"]["p50"]
    rt, st = real["throughput_tok_s"], s["throughput_tok_s"]
    n_sim = max(1, s["iterations"])
    return {
        "config": run_dir.name, "policy": cfg.policy.name, "predictor": cfg.predictor.name,
        "batch_size": w.batch_size, "hpc_slots": cfg.cache.hpc_slots, "mpc_slots": cfg.cache.mpc_slots,
        "iterations": real["iterations"],
        "real_mean_ms": rm, "sim_mean_ms": sm, "err_mean_pct": _err(sm, rm),
        "real_p50_ms": rp, "sim_p50_ms": sp, "err_p50_pct": _err(sp, rp),
        "real_tok_s": rt, "sim_tok_s": st, "err_tok_s_pct": _err(st, rt),
        "real_copies": real["copies"], "sim_copies": s["copies"],
        "real_copy_ms": real.get("mean_copy_ms"),
        "sim_copy_ms": 1e3 * s["link_busy_frac"] * s["sim_time_s"] / s["copies"] if s["copies"] else None,
        "real_stall_ms": real.get("stall_ms", real.get("wait_ms")), "real_copy_gap_us": real.get("mean_copy_gap_us"),
        "real_host_busy_ms": real.get("host_busy_ms"),
        "real_decide_ms": (real.get("host_phase_ms") or {}).get("decide"),
        "real_gate_sync_ms": (real.get("host_phase_ms") or {}).get("gate_sync"),
        "sim_stall_ms": s["stall_ms"] / max(1, s["iterations"]),
        "real_link_busy": real.get("link_busy_frac"), "sim_link_busy": s["link_busy_frac"],
        "cpu_expert_frac": real_frac, "real_cpu_experts": real.get("cpu_experts", 0), "sim_cpu_experts": sim_cpu,
        "real_cpu_busy_ms": real.get("cpu_busy_ms"),
        "sim_cpu_busy_ms": 1e3 * s.get("cpu_busy_frac", 0.0) * s["sim_time_s"] / n_sim,
        "real_cpu_wait_ms": real.get("cpu_stall_ms"), "sim_cpu_wait_ms": s.get("cpu_wait_ms", 0.0) / n_sim,
        "sim_hardware": sim_hardware,
        "decisions_identical": identical,
    }


def median_abs(rows: list[dict], key: str) -> float:
    return float(np.median([abs(r[key]) for r in rows])) if rows else float("nan")


ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def unpack(archive: Path, log=print) -> Path:
    """The measurement folder inside ``archive`` (one top folder holding ``manifest.json``), unpacked beside the
    archive under the archive's name without its suffix; an existing folder of that name is used as it is."""
    name = archive.name
    for suffix in ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    target = archive.parent / name
    if target.is_dir():
        log(f"using {target}/ (already unpacked from {archive.name})")
        return target
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            tops = {Path(m.name).parts[0] for m in members if Path(m.name).parts}
            if len(tops) != 1 or not any(Path(m.name).parts[1:] == ("manifest.json",) for m in members):
                raise ConfigError(str(archive), "is not a measurement archive (one folder holding manifest.json)")
            tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=archive.parent))
            try:
                tar.extractall(tmp, filter="data")
                os.replace(tmp / tops.pop(), target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, FileNotFoundError) and not archive.exists():
            raise ConfigError(str(archive), "no such file") from None
        raise ConfigError(str(archive), f"cannot be unpacked ({exc.__class__.__name__}: {exc})") from None
    log(f"unpacked {archive.name} into {target}/")
    return target


def compare(folder: str | Path, out: str | Path | None = None, log=print) -> tuple[list[dict], Path]:
    folder = Path(folder)
    if folder.is_file() and folder.name.endswith(ARCHIVE_SUFFIXES):
        folder = unpack(folder, log)
    if not folder.is_dir():
        raise ConfigError(str(folder), "no such measurement folder (run python -m validate cpu|gpu --out DIR)")
    manifest = _read_json(folder / "manifest.json", "manifest.json")
    if not (folder / "calibration.yaml").exists():
        raise ConfigError(str(folder / "calibration.yaml"), "missing: the microbenchmarks did not finish")
    runs = [folder / "runs" / n for n in manifest.get("configs", []) if (folder / "runs" / n / "summary.json").exists()]
    if not runs:
        raise ConfigError(str(folder), "holds no finished configuration (runs/*/summary.json)")
    rows = []
    for i, run_dir in enumerate(runs, 1):
        row = compare_run(folder, run_dir, manifest)
        rows.append(row)
        log(f"[{i}/{len(runs)}] {row['config']}: real {row['real_mean_ms']:.2f} ms, sim {row['sim_mean_ms']:.2f} ms "
            f"({row['err_mean_pct']:+.1f}%), decisions identical: {'yes' if row['decisions_identical'] else 'NO'}")
    out = Path(out) if out is not None else folder / "compare"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "compare.csv", _csv(rows))
    atomic_write_bytes(out / "compare.md", markdown(rows, manifest).encode())
    plot(rows, manifest, out / "compare.png")
    missing = [n for n in manifest.get("configs", []) if not (folder / "runs" / n / "summary.json").exists()]
    if missing:
        log(f"not measured (skipped): {', '.join(missing)}")
    hybrid = [r for r in rows if (r.get("cpu_expert_frac") or 0) > 0]
    if hybrid:
        log(f"hybrid configurations (experts on the host CPU): median |error| of mean latency "
            f"{median_abs(hybrid, 'err_mean_pct'):.1f}% over {len(hybrid)}")
    log(f"median |error|: mean latency {median_abs(rows, 'err_mean_pct'):.1f}%, p50 "
        f"{median_abs(rows, 'err_p50_pct'):.1f}%, throughput {median_abs(rows, 'err_tok_s_pct'):.1f}% over "
        f"{len(rows)} configurations; wrote {out}/compare.{{csv,md,png}}")
    return rows, out


def _csv(rows: list[dict]) -> bytes:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue().encode()


def markdown(rows: list[dict], manifest: dict) -> str:
    lines = [f"# Simulator against real runs: {manifest.get('suite')} suite", "",
             f"Measured on {manifest.get('device')} ({manifest.get('date')}). The simulator is calibrated from the "
             f"microbenchmarks only (`calibration.yaml`). Error = (sim - real) / real.", "",
             "| config | real mean ms | sim mean ms | err mean | real p50 ms | sim p50 ms | err p50 | real tok/s | "
             "sim tok/s | err tok/s | same decisions |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['real_mean_ms']:.2f} | {r['sim_mean_ms']:.2f} | {r['err_mean_pct']:+.1f}% "
                     f"| {r['real_p50_ms']:.2f} | {r['sim_p50_ms']:.2f} | {r['err_p50_pct']:+.1f}% "
                     f"| {r['real_tok_s']:.1f} | {r['sim_tok_s']:.1f} | {r['err_tok_s_pct']:+.1f}% "
                     f"| {'yes' if r['decisions_identical'] else 'NO'} |")
    lines += ["", f"Median absolute error over {len(rows)} configurations: mean latency "
              f"{median_abs(rows, 'err_mean_pct'):.1f}%, p50 latency {median_abs(rows, 'err_p50_pct'):.1f}%, "
              f"throughput {median_abs(rows, 'err_tok_s_pct'):.1f}%.", ""]
    hybrid = [r for r in rows if (r.get("cpu_expert_frac") or 0) > 0]
    if hybrid:
        lines += ["## Experts on the host CPU (hybrid configurations)", "",
                  "Share of the active experts computed on the host CPU; per iteration, the host's busy time on them "
                  "and the compute stream's idle time waiting for them, real / simulated.", "",
                  "| config | host expert share | host experts real / sim | host busy ms | device waits ms | "
                  "real mean ms | sim mean ms | err mean |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in hybrid:
            lines.append(f"| {r['config']} | {100 * r['cpu_expert_frac']:.1f}% | {r['real_cpu_experts']} / "
                         f"{r['sim_cpu_experts']} | {_ms(r.get('real_cpu_busy_ms'))} / {_ms(r.get('sim_cpu_busy_ms'))} "
                         f"| {_ms(r.get('real_cpu_wait_ms'))} / {_ms(r.get('sim_cpu_wait_ms'))} | "
                         f"{r['real_mean_ms']:.2f} | {r['sim_mean_ms']:.2f} | {r['err_mean_pct']:+.1f}% |")
        lines += ["", f"Median absolute error over {len(hybrid)} hybrid configuration(s): mean latency "
                  f"{median_abs(hybrid, 'err_mean_pct'):.1f}%.", ""]
    return "\n".join(lines)


def _ms(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def plot(rows: list[dict], manifest: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5))
    real = np.array([r["real_mean_ms"] for r in rows])
    sim = np.array([r["sim_mean_ms"] for r in rows])
    lo, hi = min(real.min(), sim.min()) * 0.8, max(real.max(), sim.max()) * 1.2
    xs = np.linspace(lo, hi, 50)
    ax.fill_between(xs, xs * 0.85, xs * 1.15, color="0.9", label="±15%")
    ax.plot(xs, xs, color="0.4", lw=1, label="sim = real")
    ax.scatter(real, sim, zorder=3)
    for r in rows:
        ax.annotate(r["config"], (r["real_mean_ms"], r["sim_mean_ms"]), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("real mean iteration latency (ms)")
    ax.set_ylabel("simulated mean iteration latency (ms)")
    ax.set_title(f"{manifest.get('suite')} suite: {str(manifest.get('device'))[:60]}", fontsize=8)
    ax.legend(fontsize=7)
    names = [r["config"] for r in rows]
    x = np.arange(len(rows))
    bx.bar(x - 0.2, [r["err_mean_pct"] for r in rows], 0.4, label="mean latency")
    bx.bar(x + 0.2, [r["err_tok_s_pct"] for r in rows], 0.4, label="throughput")
    bx.axhline(0, color="0.3", lw=0.8)
    bx.set_xticks(x)
    bx.set_xticklabels(names, rotation=35, ha="right", fontsize=7)
    bx.set_ylabel("simulator error (%)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


__all__ = ["compare", "compare_run", "markdown", "median_abs"]
