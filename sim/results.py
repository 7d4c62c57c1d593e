"""A run's results: the summary every user and sweep reads, the per-iteration table, and their files.

Summary fields (``summary.json``):

- ``throughput_tok_s``: generated tokens per second of simulated time (prefill time included);
- ``iteration_ms``: ``mean``, ``p50``, ``p99`` of decode-iteration latency; ``prefill_ms`` likewise for prefills;
- ``hit_rate``: ``overall`` and per tier (``hpc``, ``mpc``, ``lpc`` = prefetched into a working buffer in time
  to be used), each as a share of all expert accesses; hits + misses + cpu_experts = accesses;
- ``pcie_bytes`` (= copies x expert bytes, plus the write-backs of evicted experts under a system with
  ``writeback_evicted``), ``link_busy_frac`` and ``compute_busy_frac`` (busy time over
  simulated time), ``stall_ms`` (compute stream waiting on copies);
- ``cpu_experts`` (accesses served by computing the expert on the host CPU: 0 for a GPU-only policy),
  ``cpu_expert_frac`` (their share of accesses), ``cpu_busy_frac`` (the host's expert time over simulated time),
  ``cpu_wait_ms`` (the compute stream waiting for the host's experts at a layer's end, apart from ``stall_ms``);
- ``prefetch``: ``precision`` and ``recall`` of the predictor (null without predictions), copies issued, used
  and unused, ``wasted_bytes`` (unused prefetches that crossed the link), per layer precision/recall;
- ``events`` (SimPy events processed), ``wall_s`` (real seconds the simulation took);
- labels: ``policy``, ``predictor``, ``model``, ``hardware`` (the profile's name) and ``hardware_source`` (the
  file it came from, such as a calibration file, or "inline"), ``batch_size``, ``batching``, ``seed``.

Per-iteration columns (``iterations.csv``): index, batch, kind, requests, tokens, decode_tokens, start/end/latency
and stall (ms), hits per tier, misses, copies, prefetches, unused prefetches, promotions, evictions, and
``cpu_experts`` and ``cpu_ms`` (the host's expert computations and its time on them).
"""

from __future__ import annotations

import csv
import functools
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.core.cache import HPC, LPC, MPC
from sim.core.records import IterationRecord
from sim.core.workload import WorkloadInfo
from sim.request_results import request_lane, request_lanes, requests_csv, serving_lines
from traces.io import atomic_write_bytes

if TYPE_CHECKING:  # the engine needs SimPy; results are read where it may be absent
    from sim.config.run_config import RunConfig
    from sim.timing.engine import EngineResult


def stats_ms(values) -> dict:
    """count, mean, p50, p99 and total, in ms, of durations in seconds (None for no values)."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p99": None, "total": 0.0}
    a = np.asarray(values) * 1e3
    return {
        "count": int(a.size),
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "total": float(a.sum()),
    }


def summarize(res: EngineResult, counters, workload: WorkloadInfo, labels: dict) -> dict:
    """The summary dict of one run."""
    decode = [r.latency_s for r in res.iterations if r.kind == "decode"]
    prefill = [r.latency_s for r in res.iterations if r.kind == "prefill"]
    accesses = counters.accesses
    hits = counters.hits
    t = res.sim_time_s

    def share(n):
        return float(n / accesses) if accesses else None

    return {
        **labels,
        "throughput_tok_s": float(workload.decode_tokens / t) if t > 0 else None,
        "iteration_ms": stats_ms(decode),
        "prefill_ms": stats_ms(prefill),
        "hit_rate": {
            "overall": share(hits[HPC] + hits[MPC] + hits[LPC]),
            "hpc": share(hits[HPC]),
            "mpc": share(hits[MPC]),
            "lpc": share(hits[LPC]),
        },
        "accesses": accesses,
        "hits": {k: int(v) for k, v in hits.items()},
        "misses": counters.misses,
        "pcie_bytes": int(res.pcie_bytes),
        "copies": res.copies,
        "link_busy_frac": float(res.link_busy_s / t) if t > 0 else 0.0,
        "compute_busy_frac": float(res.compute_busy_s / t) if t > 0 else 0.0,
        "stall_ms": res.stall_s * 1e3,
        "cpu_experts": int(getattr(counters, "cpu", 0)),
        "cpu_expert_frac": share(getattr(counters, "cpu", 0)),
        "cpu_busy_frac": float(getattr(res, "cpu_busy_s", 0.0) / t) if t > 0 else 0.0,
        "cpu_wait_ms": getattr(res, "cpu_wait_s", 0.0) * 1e3,
        "prefetch": {
            "precision": res.prediction.precision(),
            "recall": res.prediction.recall(),
            "issued": res.prefetches_issued,
            "used": res.prefetches_used,
            "unused": res.unused_prefetches,
            "wasted_bytes": int(res.wasted_bytes),
            "per_layer": res.prediction.per_layer(),
        },
        "evictions": counters.evictions,
        "promotions": counters.promotions,
        "max_buffers_in_use": res.max_buffers_in_use,
        "sim_time_s": t,
        "iterations": len(res.iterations),
        "decode_tokens": workload.decode_tokens,
        "prefill_tokens": workload.prefill_tokens,
        "requests_served": workload.requests_served,
        "requests_reused": workload.reused,
        "events": res.events,
        "events_per_s": float(res.events / res.wall_s) if res.wall_s > 0 else None,
        "wall_s": res.wall_s,
    }


ITERATION_COLUMNS = [
    "index",
    "batch",
    "kind",
    "requests",
    "tokens",
    "decode_tokens",
    "start_ms",
    "end_ms",
    "latency_ms",
    "stall_ms",
    "hits_hpc",
    "hits_mpc",
    "hits_lpc",
    "misses",
    "copies",
    "prefetches",
    "unused_prefetches",
    "promotions",
    "evictions",
    "cpu_experts",
    "cpu_ms",
]


def iteration_rows(records: list[IterationRecord]) -> list[dict]:
    rows = []
    for r in records:
        d = asdict(r)
        start, end, stall = d.pop("start_s"), d.pop("end_s"), d.pop("stall_s")
        d.update(
            start_ms=start * 1e3,
            end_ms=end * 1e3,
            latency_ms=(end - start) * 1e3,
            stall_ms=stall * 1e3,
            cpu_ms=d.pop("cpu_s", 0.0) * 1e3,
        )
        d.setdefault("cpu_experts", 0)
        rows.append({k: d[k] for k in ITERATION_COLUMNS})
    return rows


def iterations_csv(records: list[IterationRecord]) -> bytes:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=ITERATION_COLUMNS, lineterminator="\n")
    w.writeheader()
    for row in iteration_rows(records):
        w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue().encode()


def chrome_trace(timeline: list) -> bytes:
    """Copies and computes as a Chrome trace (opens in Perfetto / chrome://tracing)."""
    tids = {"compute": 1, "copy": 2, "cpu": 3}
    events = [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": f"{name} stream"}}
        for name, tid in tids.items()
    ]
    events.append({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "simulated GPU"}})
    if not any(x[0] == "cpu" for x in timeline):  # the host lane only when the host computed experts
        events = [x for x in events if x.get("tid") != 3]
    events += request_lanes(timeline)
    for track, name, start, dur in timeline:
        pid, tid = (1, tids[track]) if track in tids else request_lane(track)
        events.append(
            {
                "name": name,
                "cat": track,
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "ts": round(start * 1e6, 3),
                "dur": round(dur * 1e6, 3),
            }
        )
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode()


def output_files(timeline: bool, requests: bool = False) -> list[str]:
    """The names of the files a run writes in its results folder (``requests``: a run with arrivals)."""
    return (
        ["config.resolved.yaml", "summary.json", "iterations.csv"]
        + (["requests.csv"] if requests else [])
        + (["timeline.json"] if timeline else [])
    )


def write_outputs(
    out: Path,
    resolved: dict,
    summary: dict,
    records: list[IterationRecord],
    timeline: list | None,
    requests: list | None = None,
) -> list[Path]:
    """Write a run's files into ``out``, each atomically (inside a command's output batch they appear together);
    returns their paths. ``requests``: a run with arrivals' served requests (``requests.csv``). ``out`` must be a
    folder or missing (a file, FIFO or device there is a TraceError), and no file replaces anything but a regular
    file."""
    import yaml

    from moebase.outputs import ensure_folder
    from traces.io import check_output_file, check_output_folder

    out = check_output_folder(out, "results folder (--out)")
    ensure_folder(out)
    files = {
        "config.resolved.yaml": yaml.safe_dump(resolved, sort_keys=False).encode(),
        "summary.json": (json.dumps(summary, indent=1) + "\n").encode(),
        "iterations.csv": iterations_csv(records),
    }
    if requests is not None:
        files["requests.csv"] = requests_csv(requests)
    if timeline is not None:
        files["timeline.json"] = chrome_trace(timeline)
    for name in files:  # every place checked before the first file is written
        check_output_file(out / name, "run result")
    written = []
    for name, data in files.items():
        atomic_write_bytes(out / name, data)
        written.append(out / name)
    return written


INLINE = " (modified inline)"  # how moebase.profiles marks a file's profile changed by inline settings


def hardware_words(s: dict) -> str:
    """The hardware a summary ran on: the bundled profile's name (``h200``), or the file it came from (a
    calibration file, a profile of one's own) with the profile it is based on (a file naming a ``base`` and no name of
    its own takes the base's) or, when the file names itself, that name; ", modified inline" when ``hardware.KEY``
    settings changed it."""
    name, source = str(s.get("hardware")), s.get("hardware_source")
    if not source or source == "inline":
        return name
    modified = source.endswith(INLINE)
    file = source[: -len(INLINE)] if modified else source
    if Path(file).parts[-3:] == ("configs", "hardware", f"{name}.yaml"):
        shown = name
    elif Path(file).stem == name:
        shown = file
    else:
        own, base = _own_name_and_base(file)
        if own == name:  # its own name, not a base's: "based on" itself would mislead
            shown = f"{file} ({name}" + (f", based on {Path(base).stem if '/' in base else base})" if base else ")")
        else:
            shown = f"{file}, based on {name}"
    return shown + (", modified inline" if modified else "")


@functools.lru_cache(maxsize=64)
def _own_name_and_base(file: str) -> tuple[str | None, str | None]:
    """The ``name`` and ``base`` a profile file gives itself (None for each it does not give, or when it cannot be
    read now)."""
    from moebase.files import PROJECT_ROOT, read_structured_file

    path = Path(file) if Path(file).is_absolute() else PROJECT_ROOT / file
    try:
        d = read_structured_file(path, "hardware")
    except Exception:  # shown without it: a label must never fail a run that has finished
        return None, None
    if not isinstance(d, dict):
        return None, None
    name, base = d.get("name"), d.get("base")
    return (name if isinstance(name, str) else None), (base if isinstance(base, str) else None)


def ms_words(ms: float) -> str:
    """A duration in ms (thousands separated) below 10 s, else in seconds."""
    return f"{ms:,.1f} ms" if ms < 10_000 else f"{ms / 1e3:,.2f} s"


def format_bits_words(bits: float) -> str:
    """Bits per weight, without trailing zeros (``4.85``, ``16``)."""
    return f"{bits:.4g}"


def system_words(cfg: RunConfig) -> str:
    """The serving system a run applied and the weight formats its experts and dense weights are stored in: the
    system's format names with their bits per weight, or the model's own widths (as under ``ideal``)."""
    from sim.config.run_config import dense_bytes_of

    system, model = cfg.system, cfg.model
    dense_bits = system.dense_bits if system.dense_bits is not None else 8.0 * model.dtype_bytes

    def width(fmt: str | None, bits: float) -> str:
        return f"{fmt} ({format_bits_words(bits)} bits/weight)" if fmt else f"{format_bits_words(bits)} bits/weight"

    return (
        f"{system.name}{_modified(system)} | experts {width(system.expert_format, model.expert_bits_per_weight)}, "
        f"{model.expert_bytes / 1e6:,.1f} MB each | dense weights {width(system.dense_format, dense_bits)}, "
        f"{dense_bytes_of(model, system) / 1e9:,.2f} GB"
    )


def _modified(system) -> str:
    """ ", modified" when ``system`` differs from the bundled profile it is named after (settings laid over it in the
    config or with ``--set system.KEY=...``), "" otherwise or when its name is no bundled profile."""
    from moebase.profiles import available
    from sim.config.system import load_system

    if system.name not in available("systems"):
        return ""
    plain = {k: v for k, v in system.to_dict().items() if k not in ("name", "source")}
    bundled = {k: v for k, v in load_system(system.name).to_dict().items() if k not in ("name", "source")}
    return "" if plain == bundled else ", modified"


def slots_words(cfg: RunConfig) -> str:
    """The experts a run keeps on the GPU, per tier, as its config gave them or a ``cache.gpu_memory_gb`` split
    produced them: per-layer HPC and MPC slots over the cached layers, or one shared cache, and the working
    buffers; every expert for a policy that keeps them all."""
    from sim.config.run_config import cached_layer_count

    cache, model = cfg.cache, cfg.model
    layers = cached_layer_count(model, cache.layers)
    buffers = f"{cache.lpc_buffers:,} working buffer{'' if cache.lpc_buffers == 1 else 's'}"
    if _policy_attr(cfg.policy.name, "all_resident"):
        return f"every expert resident ({model.num_experts:,} x {model.moe_layers:,} MoE layers)"
    total = cache.total_slots(layers)
    if cache.organization == "shared":
        tiers = f"one shared cache of {total:,} experts over {layers:,} cached layers"
    else:
        tiers = (
            f"hpc {cache.hpc_slots:,} + mpc {cache.mpc_slots:,} of {model.num_experts:,} per layer x {layers:,} layers"
        )
    return f"{tiers}, {buffers} = {(total + cache.lpc_buffers) * model.expert_bytes / 1e9:,.2f} GB"


def _policy_attr(name: str, attr: str) -> bool:
    from sim.policies import POLICIES

    return name in POLICIES.names() and bool(getattr(POLICIES.get(name), attr, False))


def format_summary(s: dict, cfg: RunConfig | None = None) -> str:
    """The short table printed on the terminal: every count with thousands separators, times in ms or s, bytes
    in GB. With the run's config, two lines under the header say the system and weight formats it applied and
    the experts its tiers hold (the slots a ``cache.gpu_memory_gb`` split produced)."""

    def f(x, spec=".3f"):
        return "-" if x is None else format(x, spec)

    hr, it, pf = s["hit_rate"], s["iteration_ms"], s["prefetch"]
    lines = [
        f"policy {s.get('policy')} | predictor {s.get('predictor')}"
        + (
            ""
            if pf["precision"] is None and pf["recall"] is None
            else f" (precision {f(pf['precision'])}, recall {f(pf['recall'])})"
        )
        + f" | model {s.get('model')} | "
        f"hardware {hardware_words(s)} | batch {s.get('batch_size')} ({s.get('batching')})",
        *([f"  system            {system_words(cfg)}", f"  GPU experts       {slots_words(cfg)}"] if cfg else []),
        f"  throughput        {f(s['throughput_tok_s'], ',.1f')} tokens/s   "
        f"({s['decode_tokens']:,} tokens, {s['requests_served']:,} requests"
        + (f", {s['requests_reused']:,} re-used" if s["requests_reused"] else "")
        + f", {f(s['sim_time_s'], ',.3f')} s simulated)",
        f"  iteration latency mean {f(it['mean'], ',.2f')} ms   p50 {f(it['p50'], ',.2f')} ms   "
        f"p99 {f(it['p99'], ',.2f')} ms"
        + (f"   (prefill total {ms_words(s['prefill_ms']['total'])})" if s["prefill_ms"]["count"] else ""),
        f"  hit rate          {f(hr['overall'])}  (hpc {f(hr['hpc'])}, mpc {f(hr['mpc'])}, "
        f"lpc/prefetched {f(hr['lpc'])})"
        f"   of {s['accesses']:,} accesses",
        f"  PCIe              {s['pcie_bytes'] / 1e9:,.2f} GB in {s['copies']:,} copies   link busy "
        f"{s['link_busy_frac']:.1%}   compute busy {s['compute_busy_frac']:.1%}   stall {ms_words(s['stall_ms'])}",
        *(
            [
                f"  host CPU          {s['cpu_experts']:,} experts ({f(s['cpu_expert_frac'])} of accesses)   busy "
                f"{s['cpu_busy_frac']:.1%}   GPU waiting for it {ms_words(s['cpu_wait_ms'])}"
            ]
            if s.get("cpu_experts")
            else []
        ),
        f"  prefetch          issued {pf['issued']:,}  "
        f"unused {pf['unused']:,}  wasted {pf['wasted_bytes'] / 1e9:,.2f} GB",
        *serving_lines(s),  # a run with arrivals: TTFT, TPOT, E2E, the SLO (sim/request_results.py)
        f"  simulator         {s['events']:,} events in {s['wall_s']:,.2f} s ({f(s['events_per_s'], ',.0f')} events/s)",
    ]
    return "\n".join(lines)
