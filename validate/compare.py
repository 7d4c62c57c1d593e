"""`validate compare DIR`: calibrate the simulator from DIR's microbenchmarks only, simulate every configuration
that was measured, and report how far the simulator is from the real runs.

Per configuration: mean and p50 decode-iteration latency and throughput, real and simulated, and the simulator's
signed relative error ``(sim - real) / real``; where the time went, to explain an error: mean copy time (timed on
the device), the compute stream's stall per iteration (real: timed on the device around each wait; simulated),
the host's busy time per iteration (real: deciding and issuing work, not waiting for copies: where it comes near
the latency, the run is bound by the host, which the simulator does not model), the link's mean idle gap between
queued copies (real) and the link's busy fraction; whether the simulator's engine made the very decisions the
executor made (every (iteration, layer): sources per active expert, promotions, prefetches, unused prefetches); the
median
absolute errors over the configurations. For experts computed on the host CPU (hybrid policies): their
share of the active experts (``cpu_expert_frac``), their count, the host's busy time per iteration and the compute
stream's idle time waiting for it (``cpu_wait``), real and simulated, and a section of the report of the hybrid
configurations alone, with their median error. A policy that weighs costs (fiddler: the host against a copy) decides
with the calibration as it stood when its configuration ran (``runs/NAME/hardware.yaml``, which ``measure`` keeps);
where the final calibration would make it decide otherwise, the configuration is simulated on that snapshot
(``sim_hardware`` says which). Written to ``DIR/compare/`` (or ``--out``): ``compare.csv``,
``compare.md`` and ``compare.png`` (simulated against real latency, and the errors per configuration).

DIR may also be the archive ``run_gpu_check.sh`` packs (``gpu-check.tar.gz``): it is unpacked beside itself first
(``gpu-check.tar.gz`` -> ``gpu-check/``), and kept. Archives and folders are untrusted input (validate/archive.py):
regular files and folders only, every read and write kept inside the folder, and the figures compare uses checked
(``check_summary``, ``check_manifest``) before anything is simulated.

How steady the machine stayed (``validate.steadiness``): the calibration passes' table totals set beside their
median; a table beyond the tolerance (``--drift-tolerance``, default 25%) prints a warning on stderr, and
``compare.md`` states the verdict in its ``## Machine steadiness`` section ("not recorded" for a folder that kept
no passes).
"""

from __future__ import annotations

import csv
import io
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

import sim.core.cache
from moebase.checks import kind_of, show
from moebase.errors import ConfigError, InputError, one_line
from moebase.files import PROJECT_ROOT, confined_to
from moebase.outputs import ensure_folder
from sim.config.run_config import config_from_dict
from sim.decisions.protocol import LayerDecision
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.run import RunOutput, simulate
from traces.io import atomic_write_bytes, check_output_folder, file_kind, file_sha256, load_trace
from validate.archive import (
    ARCHIVE_SUFFIXES,
    MAX_MEMBERS,
    find_file,
    output_file,
    output_folder,
    plain_name,
    read_inside,
    regular_file,
    unpack,
)
from validate.measure import decisions_digest
from validate.steadiness import TOLERANCE, Verdict, markdown_section, of_folder

COLUMNS = [
    "config",
    "policy",
    "predictor",
    "batch_size",
    "hpc_slots",
    "mpc_slots",
    "iterations",
    "real_mean_ms",
    "sim_mean_ms",
    "err_mean_pct",
    "real_p50_ms",
    "sim_p50_ms",
    "err_p50_pct",
    "real_tok_s",
    "sim_tok_s",
    "err_tok_s_pct",
    "real_copies",
    "sim_copies",
    "real_copy_ms",
    "sim_copy_ms",
    "real_stall_ms",
    "sim_stall_ms",
    "real_host_busy_ms",
    "real_decide_ms",
    "real_gate_sync_ms",
    "real_copy_gap_us",
    "real_link_busy",
    "sim_link_busy",
    "cpu_expert_frac",
    "real_cpu_experts",
    "sim_cpu_experts",
    "real_cpu_busy_ms",
    "sim_cpu_busy_ms",
    "real_cpu_wait_ms",
    "sim_cpu_wait_ms",
    "sim_hardware",
    "decisions_identical",
]

#: A plan's source for an expert computed on the host CPU (``sim.core.cache.CPU`` where the simulator has it).
CPU_SOURCE = getattr(sim.core.cache, "CPU", "cpu")


#: The longest manifest string (suite, device, date) shown in a title or the report: a manifest is the
#: archive's, and a megabyte-long suite name would take minutes to lay out in the plot.
MAX_LABEL_CHARS = 80
#: The longest trace key in a manifest's ``traces`` (a path on the measuring machine, only looked up, never opened).
MAX_TRACE_KEY_CHARS = 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: The range of a measured latency (ms) or throughput (tokens/s) compare accepts: errors relative to a figure near
#: 0 (or to 1e300) would be meaningless and overflow the plot's axes.
MIN_FIGURE, MAX_FIGURE = 1e-6, 1e9
#: The largest optional figure (a copy time, a busy time) accepted.
MAX_OPTIONAL = 1e12

#: summary.json fields compare uses: (path of keys, kind). Kinds: "positive" (a number between MIN_FIGURE and
#: MAX_FIGURE), "count" (an
#: integer >= 0), "iterations" (an integer >= 1), "sha256" (64 hex digits), "nonneg" (a number between 0 and
#: MAX_OPTIONAL, or null: an optional figure), "fraction" (a number in [0, 1], or null), "table" (a mapping, or null).
SUMMARY_FIELDS = (
    (("iteration_ms",), "mapping"),
    (("iteration_ms", "mean"), "positive"),
    (("iteration_ms", "p50"), "positive"),
    (("throughput_tok_s",), "positive"),
    (("iterations",), "iterations"),
    (("copies",), "count"),
    (("decisions_sha256",), "sha256"),
    (("cpu_expert_frac",), "fraction"),
    (("cpu_experts",), "optional_count"),
    (("mean_copy_ms",), "nonneg"),
    (("stall_ms",), "nonneg"),
    (("wait_ms",), "nonneg"),
    (("mean_copy_gap_us",), "nonneg"),
    (("host_busy_ms",), "nonneg"),
    (("host_phase_ms",), "table"),
    (("host_phase_ms", "decide"), "nonneg"),
    (("host_phase_ms", "gate_sync"), "nonneg"),
    (("link_busy_frac",), "nonneg"),
    (("cpu_busy_ms",), "nonneg"),
    (("cpu_stall_ms",), "nonneg"),
)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _field_problem(value: Any, kind: str) -> str | None:
    """What is wrong with ``value`` as a summary field of ``kind`` (None: fine); a missing field is None."""
    optional = kind in ("fraction", "optional_count", "nonneg", "table")
    if value is None:
        return None if optional else "is missing"
    if kind == "mapping" or kind == "table":
        return None if isinstance(value, dict) else f"must be a mapping, got {show(value)}"
    if kind in ("count", "iterations", "optional_count"):
        low = 1 if kind == "iterations" else 0
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value < 1 << 62
        return None if ok else f"must be an integer >= {low}, got {show(value)}"
    if kind == "sha256":
        ok = isinstance(value, str) and _SHA256.fullmatch(value) is not None
        return None if ok else f"must be a SHA-256 (64 hex digits), got {show(value)}"
    if not _is_number(value):
        return f"must be a finite number, got {show(value)}"
    if kind == "positive" and value <= 0:
        return f"must be > 0, got {show(value)}"
    if kind == "positive" and not MIN_FIGURE <= value <= MAX_FIGURE:
        return f"must be between {MIN_FIGURE:g} and {MAX_FIGURE:g}, got {show(value)}"
    if kind == "nonneg" and value < 0:
        return f"must be >= 0, got {show(value)}"
    if kind == "nonneg" and value > MAX_OPTIONAL:
        return f"must be at most {MAX_OPTIONAL:g}, got {show(value)}"
    if kind == "fraction" and not 0 <= value <= 1:
        return f"must be between 0 and 1, got {show(value)}"
    return None


def check_summary(real: Any, path: Path) -> dict:
    """``real``, a run's summary.json, with every field compare uses present and of the right kind; else a
    ConfigError naming the file and the field."""
    if not isinstance(real, dict):
        raise ConfigError(str(path), f"must hold a mapping of the run's figures, got {kind_of(real)}")
    for keys, kind in SUMMARY_FIELDS:
        value: Any = real
        for k in keys:
            value = value.get(k) if isinstance(value, dict) else None
        problem = _field_problem(value, kind)
        if problem is not None:
            raise ConfigError(f"{path}: {'.'.join(keys)}", problem)
    return real


def check_manifest(manifest: Any, path: Path) -> dict:
    """``manifest``, a measurement's manifest.json: a mapping whose ``configs`` are plain names (each the name of
    a folder under ``runs/``), listed once, and whose ``traces`` map bounded strings to SHA-256 checksums."""
    if not isinstance(manifest, dict):
        raise ConfigError(str(path), f"must hold a mapping, got {kind_of(manifest)}")
    configs = manifest.get("configs", [])
    if not isinstance(configs, list):
        raise ConfigError(f"{path}: configs", f"must be a list of configuration names, got {show(configs)}")
    if len(configs) > MAX_MEMBERS:
        raise ConfigError(f"{path}: configs", f"lists {len(configs)} configurations, more than {MAX_MEMBERS}")
    for i, name in enumerate(configs):
        plain_name(name, f"{path}: configs[{i}]")
        if name in configs[:i]:
            raise ConfigError(f"{path}: configs[{i}]", f"{show(name)} is listed twice")
    recorded = {field: checked_digests(manifest.get(field), f"{path}: {field}") for field in ("traces", "profiles")}
    return {**manifest, "configs": configs, **recorded}


def checked_digests(value: Any, where: str) -> dict:
    """A manifest's map of file paths (as on the measuring machine) to SHA-256 checksums, checked; {} if absent."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(where, f"must map file paths to SHA-256 checksums, got {show(value)}")
    for key, digest in value.items():
        if not isinstance(key, str) or not key or len(key) > MAX_TRACE_KEY_CHARS or not key.isprintable():
            raise ConfigError(
                where, f"a key must be a printable path of 1 to {MAX_TRACE_KEY_CHARS} characters, got {show(key)}"
            )
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ConfigError(f"{where}[{show(key)}]", f"must be a SHA-256 (64 hex digits), got {show(digest)}")
    return value


def label(value: Any) -> str:
    """A manifest string (suite, device, date) as shown in a title or the report: one line of at most
    ``MAX_LABEL_CHARS`` characters, whatever the manifest holds."""
    if value is None:
        return "unknown"
    text = value if isinstance(value, str) else show(value)
    return one_line(text, MAX_LABEL_CHARS).replace("|", "/")


def _err(sim: float, real: float) -> float:
    return 100.0 * (sim - real) / real


def reachable(folder: Path, manifest: dict) -> tuple[list[Path], list[Path]]:
    """What the files of a measurement may name (``confined_to``'s folders and files): the measurement folder,
    the project's bundled profiles and traces, and the files its manifest recorded with their checksums (a trace
    or profile outside the project that the measurement ran on). Nothing else on the machine."""
    recorded = [Path(p) for p in manifest.get("traces") or {}]  # each checked against its checksum before use
    for path, digest in (manifest.get("profiles") or {}).items():
        try:
            if file_sha256(path) == digest:
                recorded.append(Path(path))
        except (InputError, OSError, ValueError):  # missing or not a file: not reachable
            pass
    return [folder, PROJECT_ROOT / "configs", PROJECT_ROOT / "traces"], recorded


def measured_digest(traces: dict, resolved: Path, reference: Any) -> str | None:
    """The checksum the manifest recorded for the run's trace: under the path it resolves to here, under the
    config's own reference, or, since a measurement records the path on its machine (``/elsewhere/traces/data/x``),
    under the one recorded path that ends with the config's relative reference. None when the manifest does not
    say, or says it more than one way."""
    for key in (str(resolved), reference):
        if isinstance(key, str) and key in traces:
            return traces[key]
    if not isinstance(reference, str) or not reference or Path(reference).is_absolute():
        return None
    tail = "/" + reference.lstrip("./")
    found = {digest for key, digest in traces.items() if key.endswith(tail)}
    return found.pop() if len(found) == 1 else None


def _simulate_recorded(cfg, trace) -> tuple[RunOutput, list[LayerDecision]]:
    """``cfg`` simulated on ``trace`` with every step's decisions kept (what the executor recorded): the run and
    its decisions."""
    out = simulate(cfg, trace=trace, record_decisions=True)
    decisions = out.engine.decisions
    assert decisions is not None, "simulate(record_decisions=True) keeps every step's decisions"
    return out, decisions


def compare_run(folder: Path, run_dir: Path, manifest: dict) -> dict:
    """One configuration's row: simulate it on the folder's calibration and set it beside the real run. Every file
    is read inside ``folder`` (no link on the way, regular files only); ``manifest`` is checked (check_manifest)."""
    rel = Path("runs", plain_name(run_dir.name, "configuration name"))
    real = check_summary(
        read_inside(folder, rel / "summary.json", "not a finished validate measurement"), folder / rel / "summary.json"
    )
    config_path = regular_file(folder, rel / "config.yaml", "not a finished validate measurement")
    raw = read_inside(folder, rel / "config.yaml")
    if not isinstance(raw, dict):
        raise ConfigError(str(config_path), "must hold a run config mapping")
    raw["hardware"] = str(regular_file(folder, "calibration.yaml", "the microbenchmarks did not finish"))
    with confined_to(*reachable(folder, manifest)):
        cfg = config_from_dict(raw, str(config_path), POLICIES.names(), PREDICTORS.names())
    workload = raw.get("workload")
    trace_key = workload.get("trace") if isinstance(workload, dict) else None
    want = measured_digest(manifest.get("traces") or {}, cfg.workload.trace, trace_key)
    have = file_sha256(cfg.workload.trace)
    if want is not None and want != have:
        raise ConfigError(str(cfg.workload.trace), "differs from the trace that was measured (checksum mismatch)")
    trace = load_trace(cfg.workload.trace)
    out, decisions = _simulate_recorded(cfg, trace)
    # the decisions: the simulator's, step by step, must be what the executor recorded
    identical = decisions_digest(decisions) == real["decisions_sha256"]
    sim_hardware = "calibration.yaml"
    snapshot = find_file(folder, rel / "hardware.yaml")
    if not identical and snapshot is not None:
        # a policy that weighs costs (fiddler: the host against a copy) decided with the calibration as it stood
        # when the configuration ran (measure.py), which the passes after it moved: simulate on that one
        raw["hardware"] = str(snapshot)
        with confined_to(*reachable(folder, manifest)):
            cfg = config_from_dict(raw, str(config_path), POLICIES.names(), PREDICTORS.names())
        again, again_decisions = _simulate_recorded(cfg, trace)
        if decisions_digest(again_decisions) == real["decisions_sha256"]:
            out, decisions, identical = again, again_decisions, True
            sim_hardware = f"runs/{run_dir.name}/hardware.yaml"
    s = out.summary
    w = cfg.workload
    sim_cpu = sum(1 for d in decisions for _, src in d.sources if src == CPU_SOURCE)
    sim_active = sum(len(d.active) for d in decisions)
    real_frac = real.get("cpu_expert_frac")
    if real_frac is None:  # measured before host experts: none were
        real_frac = sim_cpu / sim_active if sim_active else 0.0
    rm, sm = real["iteration_ms"]["mean"], s["iteration_ms"]["mean"]
    rp, sp = real["iteration_ms"]["p50"], s["iteration_ms"]["p50"]
    rt, st = real["throughput_tok_s"], s["throughput_tok_s"]
    n_sim = max(1, s["iterations"])
    return {
        "config": run_dir.name,
        "policy": cfg.policy.name,
        "predictor": cfg.predictor.name,
        "batch_size": w.batch_size,
        "hpc_slots": cfg.cache.hpc_slots,
        "mpc_slots": cfg.cache.mpc_slots,
        "iterations": real["iterations"],
        "real_mean_ms": rm,
        "sim_mean_ms": sm,
        "err_mean_pct": _err(sm, rm),
        "real_p50_ms": rp,
        "sim_p50_ms": sp,
        "err_p50_pct": _err(sp, rp),
        "real_tok_s": rt,
        "sim_tok_s": st,
        "err_tok_s_pct": _err(st, rt),
        "real_copies": real["copies"],
        "sim_copies": s["copies"],
        "real_copy_ms": real.get("mean_copy_ms"),
        "sim_copy_ms": 1e3 * s["link_busy_frac"] * s["sim_time_s"] / s["copies"] if s["copies"] else None,
        "real_stall_ms": real.get("stall_ms", real.get("wait_ms")),
        "real_copy_gap_us": real.get("mean_copy_gap_us"),
        "real_host_busy_ms": real.get("host_busy_ms"),
        "real_decide_ms": (real.get("host_phase_ms") or {}).get("decide"),
        "real_gate_sync_ms": (real.get("host_phase_ms") or {}).get("gate_sync"),
        "sim_stall_ms": s["stall_ms"] / max(1, s["iterations"]),
        "real_link_busy": real.get("link_busy_frac"),
        "sim_link_busy": s["link_busy_frac"],
        "cpu_expert_frac": real_frac,
        "real_cpu_experts": real.get("cpu_experts", 0),
        "sim_cpu_experts": sim_cpu,
        "real_cpu_busy_ms": real.get("cpu_busy_ms"),
        "sim_cpu_busy_ms": 1e3 * s.get("cpu_busy_frac", 0.0) * s["sim_time_s"] / n_sim,
        "real_cpu_wait_ms": real.get("cpu_stall_ms"),
        "sim_cpu_wait_ms": s.get("cpu_wait_ms", 0.0) / n_sim,
        "sim_hardware": sim_hardware,
        "decisions_identical": identical,
    }


def median_abs(rows: list[dict], key: str) -> float:
    return float(np.median([abs(r[key]) for r in rows])) if rows else float("nan")


def _measurement_folder(folder: Path, log) -> Path:
    """The measurement folder named on the command line: the folder itself, or the archive's, unpacked."""
    kind = file_kind(folder)
    if folder.name.endswith(ARCHIVE_SUFFIXES) and kind != "folder":
        folder = unpack(folder, log)
        kind = file_kind(folder)
    if kind == "missing":
        raise ConfigError(str(folder), "no such measurement folder (run python -m validate cpu|gpu --out DIR)")
    if kind != "folder":
        raise ConfigError(str(folder), f"is {kind}, not a measurement folder")
    return folder


def _output(folder: Path, out: str | Path | None) -> tuple[Path, bool]:
    """Where the comparison goes and whether it is the folder's own ``compare/``: checked before anything runs
    (a link, a file or a FIFO in its place is refused), made only when the results are ready."""
    if out is None:
        output_folder(folder, "compare", make=False)
        for name in ("compare.csv", "compare.md", "compare.png"):
            output_file(folder, Path("compare", name))
        return folder / "compare", True
    return check_output_folder(out, "--out folder"), False


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def compare(folder: str | Path, out: str | Path | None = None, log=print) -> tuple[list[dict], Path]:
    """The rows and the folder they were written to (:func:`compare_measurement`)."""
    rows, out_dir, _ = compare_measurement(folder, out, log)
    return rows, out_dir


def compare_measurement(
    folder: str | Path, out: str | Path | None = None, log=print, tolerance: float = TOLERANCE, warn=_stderr
) -> tuple[list[dict], Path, Verdict]:
    """Compare every finished configuration of the measurement ``folder`` (or archive); write compare.{csv,md,png}
    to ``out`` (default ``FOLDER/compare``). Returns the rows, the folder written and the machine's steadiness
    (``tolerance``: a fraction; each table beyond it is a line to ``warn``)."""
    folder = _measurement_folder(Path(folder), log)
    manifest = check_manifest(
        read_inside(folder, "manifest.json", "not a finished validate measurement"), folder / "manifest.json"
    )
    verdict = of_folder(folder, manifest, tolerance)
    regular_file(folder, "calibration.yaml", "the microbenchmarks did not finish")
    measured = {n for n in manifest["configs"] if find_file(folder, Path("runs", n, "summary.json")) is not None}
    runs = [folder / "runs" / n for n in manifest["configs"] if n in measured]
    if not runs:
        raise ConfigError(str(folder), "holds no finished configuration (runs/*/summary.json)")
    out_dir, own = _output(folder, out)
    rows = []
    for i, run_dir in enumerate(runs, 1):
        row = compare_run(folder, run_dir, manifest)
        rows.append(row)
        log(
            f"[{i}/{len(runs)}] {row['config']}: real {row['real_mean_ms']:,.2f} ms, sim {row['sim_mean_ms']:,.2f} ms "
            f"({row['err_mean_pct']:+.1f}%), decisions identical: {'yes' if row['decisions_identical'] else 'NO'}"
        )
    if own:
        output_folder(folder, "compare", make=False)
        ensure_folder(folder / "compare")  # made, or removed again if the outputs cannot all be written
        out_dir = output_folder(folder, "compare")
    else:
        ensure_folder(out_dir)
    atomic_write_bytes(out_dir / "compare.csv", _csv(rows))
    atomic_write_bytes(out_dir / "compare.md", markdown(rows, manifest, verdict).encode())
    plot(rows, manifest, out_dir / "compare.png")
    missing = [n for n in manifest["configs"] if n not in measured]
    if missing:
        log(f"not measured (skipped): {', '.join(missing)}")
    hybrid = [r for r in rows if (r.get("cpu_expert_frac") or 0) > 0]
    if hybrid:
        log(
            f"hybrid configurations (experts on the host CPU): median |error| of mean latency "
            f"{median_abs(hybrid, 'err_mean_pct'):.1f}% over {len(hybrid)}"
        )
    log(
        f"median |error|: mean latency {median_abs(rows, 'err_mean_pct'):.1f}%, p50 "
        f"{median_abs(rows, 'err_p50_pct'):.1f}%, throughput {median_abs(rows, 'err_tok_s_pct'):.1f}% over "
        f"{len(rows)} configurations; wrote {out_dir}/compare.{{csv,md,png}}"
    )
    log(verdict.summary())
    for line in verdict.warnings():
        warn(line)
    return rows, out_dir, verdict


def _csv(rows: list[dict]) -> bytes:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue().encode()


def markdown(rows: list[dict], manifest: dict, steadiness: Verdict | None = None) -> str:
    """compare.md: the error table, the median errors, the machine's steadiness (when given) and the hybrid
    configurations."""
    lines = [
        f"# Simulator against real runs: {label(manifest.get('suite'))} suite",
        "",
        f"Measured on {label(manifest.get('device'))} ({label(manifest.get('date'))}). "
        "The simulator is calibrated "
        f"from the microbenchmarks only (`calibration.yaml`). Error = (sim - real) / real.",
        "",
        "| config | real mean ms | sim mean ms | err mean | real p50 ms | sim p50 ms | err p50 | real tok/s | "
        "sim tok/s | err tok/s | same decisions |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['real_mean_ms']:,.2f} | {r['sim_mean_ms']:,.2f} "
            f"| {r['err_mean_pct']:+,.1f}% "
            f"| {r['real_p50_ms']:,.2f} | {r['sim_p50_ms']:,.2f} | {r['err_p50_pct']:+,.1f}% "
            f"| {r['real_tok_s']:,.1f} | {r['sim_tok_s']:,.1f} | {r['err_tok_s_pct']:+,.1f}% "
            f"| {'yes' if r['decisions_identical'] else 'NO'} |"
        )
    lines += [
        "",
        f"Median absolute error over {len(rows)} configurations: mean latency "
        f"{median_abs(rows, 'err_mean_pct'):.1f}%, p50 latency {median_abs(rows, 'err_p50_pct'):.1f}%, "
        f"throughput {median_abs(rows, 'err_tok_s_pct'):.1f}%.",
        "",
    ]
    if steadiness is not None:
        lines += markdown_section(steadiness)
    hybrid = [r for r in rows if (r.get("cpu_expert_frac") or 0) > 0]
    if hybrid:
        lines += [
            "## Experts on the host CPU (hybrid configurations)",
            "",
            "Share of the active experts computed on the host CPU; per iteration, the host's busy time on them "
            "and the compute stream's idle time waiting for them, real / simulated.",
            "",
            "| config | host expert share | host experts real / sim | host busy ms | device waits ms | "
            "real mean ms | sim mean ms | err mean |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in hybrid:
            lines.append(
                f"| {r['config']} | {100 * r['cpu_expert_frac']:.1f}% | {_count(r['real_cpu_experts'])} / "
                f"{_count(r['sim_cpu_experts'])} | {_ms(r.get('real_cpu_busy_ms'))} / "
                f"{_ms(r.get('sim_cpu_busy_ms'))} "
                f"| {_ms(r.get('real_cpu_wait_ms'))} / {_ms(r.get('sim_cpu_wait_ms'))} | "
                f"{r['real_mean_ms']:,.2f} | {r['sim_mean_ms']:,.2f} | {r['err_mean_pct']:+,.1f}% |"
            )
        lines += [
            "",
            f"Median absolute error over {len(hybrid)} hybrid configuration(s): mean latency "
            f"{median_abs(hybrid, 'err_mean_pct'):.1f}%.",
            "",
        ]
    return "\n".join(lines)


def _ms(v) -> str:
    """Milliseconds with thousands separators, "-" for none."""
    return "-" if v is None else f"{v:,.2f}"


def _count(v) -> str:
    """A count with thousands separators (as recorded when not a number)."""
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def plot(rows: list[dict], manifest: dict, path: Path) -> Path:
    """``compare.png`` (drawn by ``validate/compare_plot.py``)."""
    from validate.compare_plot import plot as draw

    return draw(rows, manifest, path)


__all__ = [
    "check_manifest",
    "check_summary",
    "compare",
    "compare_measurement",
    "compare_run",
    "label",
    "markdown",
    "median_abs",
]
