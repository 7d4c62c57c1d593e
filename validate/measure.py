"""`validate gpu|cpu`: measure a machine into a folder that `validate compare` reads, needing only torch and the
decision code (no SimPy).

The folder::

    calibration.yaml           microbenchmarks (validate.microbench): the only thing compare calibrates from; the
                               median of the passes in calibration-passes.json (one before each round and one
                               after the last, when there are several rounds)
    manifest.json              device, machine, suite, versions, the configurations and their trace checksums, the
                               machine's state before and after (GPU clocks, power, PCIe link, driver, CUDA), and
                               how steady it stayed over the calibration passes (``steadiness``:
                               validate.steadiness.Verdict.record, with the passes taken again)
    runs/NAME/config.yaml      the run config measured (a `sim run` config; hardware is replaced by compare)
    runs/NAME/round-R/         one run of it: iterations.csv (per iteration: real latency, the compute stream's
                               stall, hits per tier, misses, copies, prefetches) and summary.json (with, for
                               experts computed on the host CPU: their count and share of the active experts,
                               the host pool's busy time, the compute thread's wait and the compute stream's idle
                               time for them, per iteration)
    runs/NAME/summary.json     over its finished rounds: throughput, iteration latency mean/p50/p99, totals,
                               notes (physical buffer pools)
    runs/NAME/decisions.json   every (iteration, layer) decision the policy made, for the identical-decisions check
    runs/NAME/hardware.yaml    the calibration as it stood when the configuration first ran: the hardware its
                               decisions were made with (a policy that weighs costs, e.g. fiddler, reads it; the
                               same for every round)

With ``rounds`` > 1 every configuration runs that many times, the rounds interleaved (all configurations, then all
again), so that a machine whose speed drifts affects them alike. With ``calibrate_between`` a light calibration
pass (the tables only) follows every configuration run, so that the calibration samples the machine as often as
the runs do. The passes are set side by side (``validate.steadiness``): a pass that makes steady passes disagree
beyond ``drift_tolerance`` is taken again up to ``remeasure`` times, and the verdict goes into the manifest
(``steadiness``) and the log. Every file is written atomically; a folder left
by an interrupted run keeps its finished rounds, and ``--resume`` skips them.

A configuration whose policy this version does not register (a suite's hybrid configurations before the simulator
has their policies) is skipped with a message (:func:`runnable`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from moebase.errors import ConfigError
from moebase.files import resolve_path
from moebase.outputs import immediate_outputs
from moebase.profiles import is_path
from sim.config.run_config import config_from_dict
from sim.config.units import GIB  # binary: 2**30 bytes
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.results import iterations_csv, stats_ms
from traces.format import Trace
from traces.io import atomic_write_bytes, check_output_folder, file_sha256, load_trace
from validate.kernels import check_runnable
from validate.steadiness import REMEASURE, TOLERANCE, assess, remeasured, set_aside_record
from validate.suites import SUITES


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()


def decisions_digest(decisions) -> str:
    return hashlib.sha256(json.dumps([asdict(d) for d in decisions]).encode()).hexdigest()


def real_summary(name: str, res, workload_info, description: str) -> dict:
    decode = [r.latency_s for r in res.iterations if r.kind == "decode"]
    n = len(res.iterations)
    cpu = sum(res.cpu_experts)
    return {
        "config": name,
        "device": description,
        "throughput_tok_s": workload_info.decode_tokens / res.total_s if res.total_s > 0 else None,
        "iteration_ms": stats_ms(decode),
        "decode_latencies_ms": [1e3 * x for x in decode],
        "stall_ms": 1e3 * float(np.mean([r.stall_s for r in res.iterations])) if res.iterations else None,
        "host_wait_ms": 1e3 * res.host_wait_s / len(res.iterations) if res.iterations else None,
        "host_busy_ms": 1e3 * res.host_busy_s / len(res.iterations) if res.iterations else None,
        "host_phase_ms": {k: 1e3 * v / len(res.iterations) for k, v in res.host_phases.items()}
        if res.iterations
        else None,
        "total_s": res.total_s,
        "iterations": len(res.iterations),
        "decode_tokens": workload_info.decode_tokens,
        "warmup_iterations": res.warmup_iterations,
        "hits": {
            "hpc": sum(r.hits_hpc for r in res.iterations),
            "mpc": sum(r.hits_mpc for r in res.iterations),
            "lpc": sum(r.hits_lpc for r in res.iterations),
        },
        "misses": sum(r.misses for r in res.iterations),
        "copies": res.copies,
        "mean_copy_ms": 1e3 * res.copy_s / res.copies if res.copies else None,
        "mean_copy_gap_us": 1e6 * res.gap_s / res.gaps if res.gaps else None,
        "copy_gaps": res.gaps,
        "link_busy_frac": res.copy_s / res.total_s if res.total_s > 0 else None,
        "prefetch_copies": res.prefetch_copies,
        "max_buffers_in_use": res.max_buffers_in_use,
        "host_pool": {"physical": res.host_pool, "logical": res.logical_experts},
        "device_slots": {"physical": res.device_slots, "logical": res.logical_slots},
        "moe_layers": res.layers,
        "decisions_sha256": decisions_digest(res.decisions),
        # experts computed on the host CPU: per iteration, the pool's busy time, the compute thread's
        # wait for it, and the compute stream's idle time waiting for it (timed on the device)
        "cpu_experts": cpu,
        "active_experts": res.active_experts,
        "cpu_expert_frac": cpu / res.active_experts if res.active_experts else 0.0,
        "cpu_busy_ms": 1e3 * sum(res.cpu_busy_s) / n if n else None,
        "cpu_wait_ms": 1e3 * sum(res.cpu_wait_s) / n if n else None,
        "cpu_stall_ms": 1e3 * sum(res.cpu_stall_s) / n if n else None,
        "cpu_experts_per_iteration": list(res.cpu_experts),
        "host_threads": res.host_threads,
        "notes": res.notes,
    }


def aggregate(run_dir: Path) -> dict:
    """A configuration's summary over its finished rounds: latency statistics over every round's decode
    iterations, throughput over their total time; the first round's counts (decisions are the same each round)."""
    rounds = sorted(run_dir.glob("round-*/summary.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    summaries = [json.loads(p.read_text()) for p in rounds]
    first = dict(summaries[0])
    lat = [x for s in summaries for x in s["decode_latencies_ms"]]
    total = sum(s["total_s"] for s in summaries)
    tokens = sum(s["decode_tokens"] for s in summaries)
    first.update(
        rounds=len(summaries),
        iteration_ms=stats_ms([x / 1e3 for x in lat]),
        total_s=total,
        throughput_tok_s=tokens / total if total > 0 else None,
        round_mean_ms=[s["iteration_ms"]["mean"] for s in summaries],
        mean_copy_ms=_mean_of(summaries, "mean_copy_ms"),
        stall_ms=_mean_of(summaries, "stall_ms"),
        host_wait_ms=_mean_of(summaries, "host_wait_ms"),
        host_busy_ms=_mean_of(summaries, "host_busy_ms"),
        host_phase_ms={
            k: _mean_of([s.get("host_phase_ms") or {} for s in summaries], k)
            for k in (first.get("host_phase_ms") or {})
        },
        mean_copy_gap_us=_mean_of(summaries, "mean_copy_gap_us"),
        cpu_busy_ms=_mean_of(summaries, "cpu_busy_ms"),
        cpu_wait_ms=_mean_of(summaries, "cpu_wait_ms"),
        cpu_stall_ms=_mean_of(summaries, "cpu_stall_ms"),
        link_busy_frac=_mean_of(summaries, "link_busy_frac"),
        decisions_same_every_round=len({s["decisions_sha256"] for s in summaries}) == 1,
    )
    first.pop("decode_latencies_ms")
    return first


GPU_QUERY = (
    "name",
    "driver_version",
    "pstate",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "power.draw",
    "power.limit",
    "temperature.gpu",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "memory.used",
    "memory.total",
)


def machine_state(backend) -> dict:
    """What the figures depend on, read now: host memory and load, versions, and for a GPU its clocks, power,
    temperature and PCIe link (``nvidia-smi``; clocks in MHz, power in W, memory in MiB)."""
    torch = backend.torch
    mem = _meminfo()
    state = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "mem_total_gib": round(mem.get("MemTotal", 0) / GIB, 2),
        "mem_available_gib": round(mem.get("MemAvailable", 0) / GIB, 2),
    }
    if backend.name == "cuda":
        state["cuda"] = torch.version.cuda
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=" + ",".join(GPU_QUERY), "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            values = [v.strip() for v in out.stdout.splitlines()[0].split(",")] if out.returncode == 0 else []
            state["gpu"] = dict(zip(GPU_QUERY, values)) if values else {"error": out.stderr.strip()[:200]}
        except (OSError, subprocess.SubprocessError, IndexError) as exc:
            state["gpu"] = {"error": f"nvidia-smi: {exc}"[:200]}
    return state


def _meminfo() -> dict:
    """/proc/meminfo in bytes ({} where there is none)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def pinned_bytes(nbytes: int) -> int:
    """What the CUDA host allocator pins for a buffer of ``nbytes``: the next power of two."""
    return 1 << max(0, int(nbytes) - 1).bit_length()


def host_pool_size(
    requested_gb: float | None, default_gb: float, expert_bytes: int, pinned: bool, mem: dict | None = None, log=print
) -> int:
    """Bytes of host memory for the expert pool. An explicit ``--host-pool-gb`` that would pin more than the host
    can spare (three quarters of its memory, and 8 GiB less than is available now, buffers counted at what the
    allocator rounds them up to) is an error; the default is cut down to fit."""
    mem = _meminfo() if mem is None else mem
    if requested_gb is not None and not requested_gb > 0:
        raise ConfigError("--host-pool-gb", f"must be > 0, got {requested_gb:g}")
    want = int((requested_gb if requested_gb is not None else default_gb) * GIB)
    if not mem.get("MemTotal"):
        return want
    cap = min(0.75 * mem["MemTotal"], mem.get("MemAvailable", mem["MemTotal"]) - 8 * GIB)
    each = pinned_bytes(expert_bytes) if pinned else expert_bytes
    held = max(2, want // expert_bytes) * each
    if held <= cap:
        return want
    fits = int(max(0, cap) // each)
    if requested_gb is not None or fits < 2:
        raise ConfigError(
            "--host-pool-gb",
            f"{requested_gb if requested_gb is not None else default_gb:g} GiB "
            f"would hold {held / GIB:.1f} GiB of host memory ({max(2, want // expert_bytes)} experts of "
            f"{expert_bytes / 2**20:.1f} MiB, {each / 2**20:.0f} MiB each as allocated); this machine "
            f"can spare {max(0.0, cap) / GIB:.1f} GiB",
        )
    log(f"host pool: {want / GIB:g} GiB does not fit this machine; using {fits} experts ({fits * each / GIB:.1f} GiB)")
    return fits * expert_bytes


def explicit(raw: dict) -> dict:
    """The run config with the policy's and predictor's default parameters written out, so that a later version
    whose defaults changed still replays what was measured."""
    out = dict(raw)
    for key, registry in (("policy", POLICIES), ("predictor", PREDICTORS)):
        part = dict(out[key])
        part["params"] = {**registry.get(part["name"]).PARAMS, **(part.get("params") or {})}
        out[key] = part
    return out


def _mean_of(summaries: list[dict], key: str):
    values = [s[key] for s in summaries if s.get(key) is not None]
    return float(np.mean(values)) if values else None


def runnable(configs: list[tuple[str, dict]], policies) -> tuple[list, list]:
    """(kept, skipped): the configurations whose policy is one of ``policies`` (the registered ones), and the
    others."""
    known = set(policies)
    kept = [(n, d) for n, d in configs if d["policy"]["name"] in known]
    return kept, [(n, d) for n, d in configs if d["policy"]["name"] not in known]


def recorded_profiles(raws) -> dict[str, str]:
    """The model profile files (not bundled names or inline mappings) the configurations name, resolved, with their
    checksums: ``validate compare`` lets a measurement's configs reach these files and no others outside the
    project."""
    out = {}
    for raw in raws:
        ref = raw.get("model")
        if isinstance(ref, str) and is_path(ref):
            path = resolve_path(ref, "model", "model file").resolve()
            out[str(path)] = file_sha256(path)
    return out


class _Campaign:
    """One ``validate`` measurement of a suite into a folder: its configurations, backend, host pool and traces,
    the calibration passes so far (``passes``) with those taken again (``retaken``), and the runs of each round."""

    def __init__(
        self,
        kind: str,
        out: str | Path,
        device: str,
        quick: bool,
        only: list[str] | None,
        repeat: int,
        threads: int,
        resume: bool,
        host_pool_gb: float | None,
        host_threads: int | None,
        log,
        tolerance: float = TOLERANCE,
        remeasure: int = REMEASURE,
    ):
        from validate.backends import default_host_threads, make_backend

        self.kind, self.quick, self.repeat, self.threads, self.resume, self.log = (
            kind,
            quick,
            repeat,
            threads,
            resume,
            log,
        )
        configs, self.skipped = self._configs(kind, quick, only, log)
        self.out = check_output_folder(out, "measurement folder (--out)")
        self.cfgs = [
            (name, d, config_from_dict(d, f"{kind}:{name}", POLICIES.names(), PREDICTORS.names()))
            for name, d in configs
        ]
        try:
            self.backend = backend = make_backend(device, threads)
        except ValueError as exc:
            raise ConfigError("--device", str(exc)) from None
        self.host_threads = int(host_threads) if host_threads else default_host_threads(backend)
        self.model = model = self.cfgs[0][2].model
        check_runnable(model, "model")
        cpu = backend.name == "cpu"
        self.pool = host_pool_size(host_pool_gb, 2 if cpu else 8, model.expert_bytes, pinned=not cpu, log=log)
        self.out.mkdir(parents=True, exist_ok=True)
        self.traces: dict[str, Trace] = {}
        for _, _, cfg in self.cfgs:
            self.traces.setdefault(str(cfg.workload.trace), load_trace(cfg.workload.trace))
        self.cal_path = self.out / "calibration.yaml"
        self.passes_path = self.out / "calibration-passes.json"
        self.passes = json.loads(self.passes_path.read_text()) if resume and self.passes_path.exists() else []
        self.tolerance, self.remeasure = tolerance, max(0, int(remeasure))
        self.retaken: list[dict] = self._retaken_before() if resume else []
        self.host_pool: Any = None  # allocated (pinned) once, shared by every configuration

    @staticmethod
    def _configs(kind: str, quick: bool, only: list[str] | None, log) -> tuple[list, list]:
        """The suite's configurations to measure, and those skipped (their policy not registered)."""
        try:
            configs = SUITES[kind].configs(quick, only)
        except KeyError as exc:
            raise ConfigError("--configs", str(exc.args[0]).split(": ", 1)[1]) from None
        configs, skipped = runnable(configs, POLICIES.names())
        for name, d in skipped:
            log(f"skipped {name}: policy {d['policy']['name']!r} is not registered in this version")
        if not configs:
            raise ConfigError(
                "--configs", "no configuration left to measure: their policies are not registered in this version"
            )
        return configs, skipped

    def _retaken_before(self) -> list[dict]:
        """The passes taken again by the run that ``--resume`` continues (its manifest's record; none if absent)."""
        try:
            rec = json.loads((self.out / "manifest.json").read_text()).get("steadiness") or {}
        except (OSError, ValueError, AttributeError):
            return []
        retaken = rec.get("retaken") if isinstance(rec, dict) else None
        return list(retaken) if isinstance(retaken, list) else []

    def _measure_pass(self, light: bool) -> dict:
        """One microbenchmark pass, measured now (not yet kept)."""
        from validate.microbench import calibrate, measure_decisions

        max_ctx = max(
            int(self.traces[str(c.workload.trace)].prefill_lengths.max()) + (c.workload.max_decode_tokens or 0) + 1
            for _, _, c in self.cfgs
        )
        cal = calibrate(
            self.model,
            "h200",
            backend=self.backend,
            quick=self.quick,
            repeat=self.repeat,
            batch_sizes=sorted({c.workload.batch_size for _, _, c in self.cfgs}),
            max_context=max(0, max_ctx),
            light=light,
            host_threads=self.host_threads,
        )
        if not light:
            cal["decide_us"] = measure_decisions([c for _, _, c in self.cfgs], self.traces)
        return cal

    def calibration_pass(self, when: str, light: bool = False) -> None:
        """One microbenchmark pass, taken again up to ``remeasure`` times while it alone makes the passes
        disagree beyond ``tolerance`` (``validate.steadiness.remeasured``); calibration.yaml becomes the median of
        the passes so far."""
        from validate.microbench import combine, write_calibration

        model, backend, log = self.model, self.backend, self.log
        if not light:
            log(f"calibration ({when}): microbenchmarks of {model.name} on {backend.describe()} ...")
        t0 = time.perf_counter()
        number = len(self.passes) + 1

        def retake(attempt: int, beyond) -> None:
            log(
                f"calibration ({when}): pass {number} set aside, {beyond[0].describe(self.tolerance)}; "
                f"measuring it again ({attempt}/{self.remeasure})"
            )

        cal, aside = remeasured(lambda: self._measure_pass(light), self.passes, self.tolerance, self.remeasure, retake)
        if aside:
            self.retaken.append(set_aside_record(number, when, aside))
        self.passes.append(cal)
        atomic_write_bytes(self.passes_path, _json(self.passes))
        write_calibration(self.cal_path, combine(self.passes))
        log(
            f"calibration ({when}): {'light ' if light else ''}pass {len(self.passes)} done in "
            f"{time.perf_counter() - t0:.1f} s"
        )

    def manifest(self, rounds: int, calibrate_between: bool) -> dict:
        """What the folder was measured with (written before the runs; ``machine_after`` added at the end)."""
        backend, cfgs = self.backend, self.cfgs
        return {
            "suite": self.kind,
            "quick": self.quick,
            "device": backend.describe(),
            "device_kind": backend.name,
            "threads": self.threads if backend.name == "cpu" else None,
            "host_threads": self.host_threads,
            "skipped": [name for name, _ in self.skipped],
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            "torch": backend.torch.__version__,
            "command": " ".join(["python -m validate"] + sys.argv[1:])
            if sys.argv and sys.argv[0].endswith(("__main__.py", "validate"))
            else None,
            "configs": [name for name, _, _ in cfgs],
            "rounds": rounds,
            "calibrate_between": calibrate_between,
            "traces": {
                p: file_sha256(cfg.workload.trace) for p, cfg in {str(c.workload.trace): c for _, _, c in cfgs}.items()
            },
            "profiles": recorded_profiles(raw for _, raw, _ in cfgs),
            "machine_before": machine_state(backend),
        }

    def slot_budget(self) -> int:
        """Device bytes the executor may give the cache's slots: the free memory less 16 GiB (4 GiB on the CPU)."""
        if self.backend.name == "cpu":
            return 4 * GIB
        free, _ = self.backend.torch.cuda.mem_get_info()
        return max(GIB, free - 16 * GIB)

    def run(self, r: int, name: str, raw: dict, where: str, slot_budget: int) -> None:
        """Configuration ``name`` in round ``r``: its decisions made with the calibration as it stands, its
        iterations, summary and decisions written, the configuration's summary over its rounds so far."""
        from validate.executor import Executor
        from validate.microbench import combine, write_calibration

        kind, out, log = self.kind, self.out, self.log
        t0 = time.perf_counter()
        run_dir = out / "runs" / name
        round_dir = run_dir / f"round-{r}"
        # the decisions are made with this machine's calibration as it stands now (a policy that weighs costs,
        # e.g. fiddler, reads it), the same in every round: compare can simulate on the very same one
        hw_path = run_dir / "hardware.yaml"
        if not hw_path.exists():
            write_calibration(hw_path, combine(self.passes))
        cfg = config_from_dict(
            {**raw, "hardware": str(hw_path)}, f"{kind}:{name}", POLICIES.names(), PREDICTORS.names()
        )
        ex = Executor(
            cfg,
            self.traces[str(cfg.workload.trace)],
            self.backend,
            host_pool_bytes=self.pool,
            slot_budget_bytes=slot_budget,
            host_pool=self.host_pool,
            host_threads=self.host_threads,
        )
        res = ex.run()
        self.host_pool = ex.host
        summary = real_summary(name, res, ex.info, self.backend.describe())
        atomic_write_bytes(run_dir / "config.yaml", yaml.safe_dump(explicit(raw), sort_keys=False).encode())
        atomic_write_bytes(round_dir / "iterations.csv", iterations_csv(res.iterations))
        atomic_write_bytes(round_dir / "summary.json", _json(summary))
        if not (run_dir / "decisions.json").exists():
            atomic_write_bytes(run_dir / "decisions.json", _json([asdict(d) for d in res.decisions]))
        atomic_write_bytes(run_dir / "summary.json", _json(aggregate(run_dir)))
        it = summary["iteration_ms"]
        on_host = (
            f", {summary['cpu_experts']} experts on the host CPU ({summary['cpu_busy_ms']:.2f} ms busy per iteration)"
            if summary["cpu_experts"]
            else ""
        )
        log(
            f"{where}: {summary['iterations']} iterations, mean {it['mean']:.2f} ms, p50 {it['p50']:.2f} ms, "
            f"{summary['throughput_tok_s']:.1f} tok/s, {res.copies} copies{on_host} "
            f"({time.perf_counter() - t0:.1f} s)"
        )


@immediate_outputs()  # each run and calibration pass is kept as it lands: --resume continues from them
def measure(
    kind: str,
    out: str | Path,
    device: str,
    quick: bool = False,
    only: list[str] | None = None,
    repeat: int = 5,
    threads: int = 1,
    resume: bool = False,
    host_pool_gb: float | None = None,
    rounds: int = 1,
    calibrate_between: bool = False,
    host_threads: int | None = None,
    log=print,
    drift_tolerance: float = TOLERANCE,
    remeasure: int = REMEASURE,
) -> Path:
    """Calibrate, then run every configuration of suite ``kind`` on ``device``; returns the folder.
    ``host_threads``: the host pool's workers for experts on the host CPU, in the runs and the ``cpu_expert``
    microbenchmark alike (default ``validate.backends.default_host_threads``). ``drift_tolerance`` (a fraction)
    and ``remeasure``: a calibration pass that makes the passes disagree beyond the tolerance is taken again up to
    ``remeasure`` times; the verdict goes into the manifest (``validate.steadiness``)."""
    c = _Campaign(
        kind,
        out,
        device,
        quick,
        only,
        repeat,
        threads,
        resume,
        host_pool_gb,
        host_threads,
        log,
        tolerance=drift_tolerance,
        remeasure=remeasure,
    )
    started = time.perf_counter()
    manifest = c.manifest(rounds, calibrate_between)
    atomic_write_bytes(c.out / "manifest.json", _json(manifest))
    slot_budget = c.slot_budget()
    total, step = len(c.cfgs) * rounds, 0
    full_passes = sum("handoff_us" in p for p in c.passes)
    for r in range(rounds):  # rounds interleave the configurations, so that a drifting machine hits all alike
        if full_passes <= r:
            c.calibration_pass(f"before round {r + 1}" if rounds > 1 else "before the runs")
            full_passes += 1
        for name, raw, _ in c.cfgs:
            step += 1
            where = f"[{step}/{total}] {name}" + (f" round {r + 1}/{rounds}" if rounds > 1 else "")
            if resume and (c.out / "runs" / name / f"round-{r}" / "summary.json").exists():
                log(f"{where}: kept (--resume)")
                continue
            c.run(r, name, raw, where, slot_budget)
            if calibrate_between:
                c.calibration_pass(f"after {name}", light=True)
    if rounds > 1 and full_passes <= rounds:
        c.calibration_pass("after the last round")
    manifest["machine_after"] = machine_state(c.backend)
    verdict = assess(c.passes, c.tolerance, c.retaken)
    manifest["steadiness"] = verdict.record()
    atomic_write_bytes(c.out / "manifest.json", _json(manifest))
    for line in verdict.warnings():
        log(line)
    log(verdict.summary())
    log(
        f"measured {len(c.cfgs)} configuration(s) into {c.out} in {time.perf_counter() - started:.1f} s; "
        f"next: python -m validate compare {c.out}"
    )
    return c.out
