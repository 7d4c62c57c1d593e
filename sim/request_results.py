"""Per-request results of a run with arrivals: the summary's latency figures, ``requests.csv`` and the header lines.

Definitions (a request's times are in ``requests.csv``; see ``sim/core/serving.py`` for when each is taken):

- TTFT, time to first token: ``first_token_s - arrival_s`` (queueing, then the prefill of its prompt);
- TPOT, time per output token: ``(finish_s - first_token_s) / (output_tokens - 1)``, for requests of two output
  tokens or more;
- E2E, end to end: ``finish_s - arrival_s``.

Each is summarised as ``{mean, p50, p90, p99}`` in seconds (numpy's linear percentiles) over the requests with at
least one output token (TPOT: two). With an SLO (``workload.slo``), ``slo_attainment`` is the share of those
requests whose TTFT is at most ``ttft_s`` and whose TPOT is at most ``tpot_s`` (a bound not given holds; a request
of one output token has no TPOT and meets that bound), and ``goodput_req_s`` those requests per second of the run
(its simulated time). ``throughput_req_s`` is every served request per second of the run.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

from sim.core.serving import RequestRecord

REQUEST_COLUMNS = [
    "request",
    "arrival_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "start_s",
    "trace_request",
]
PERCENTILES = (50, 90, 99)

__all__ = [
    "REQUEST_COLUMNS",
    "request_lane",
    "request_lanes",
    "request_summary",
    "requests_csv",
    "serving_lines",
    "serving_metrics",
    "stats_s",
]
REQUEST_PID = 2  # the Chrome trace's process of the requests' lanes (the simulated GPU is 1)


def stats_s(values: list[float]) -> dict:
    """``{mean, p50, p90, p99}`` of durations in seconds (each None for no values)."""
    if not values:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), **{f"p{q}": float(np.percentile(a, q)) for q in PERCENTILES}}


def latencies(records: list[RequestRecord]) -> tuple[list[float], list[float], list[float]]:
    """TTFT, TPOT and E2E (s) of the requests with output tokens (TPOT: of those with two or more)."""
    ttft, tpot, e2e = [], [], []
    for r in records:
        if r.output_tokens < 1 or r.first_token_s is None or r.finish_s is None:
            continue
        ttft.append(r.first_token_s - r.arrival_s)
        e2e.append(r.finish_s - r.arrival_s)
        if r.output_tokens >= 2:
            tpot.append((r.finish_s - r.first_token_s) / (r.output_tokens - 1))
    return ttft, tpot, e2e


def meets(r: RequestRecord, slo) -> bool:
    """Whether a served request (one output token or more) meets the SLO's bounds."""
    assert r.first_token_s is not None and r.finish_s is not None, "a served request"
    if slo.ttft_s is not None and r.first_token_s - r.arrival_s > slo.ttft_s:
        return False
    if slo.tpot_s is not None and r.output_tokens >= 2:
        return (r.finish_s - r.first_token_s) / (r.output_tokens - 1) <= slo.tpot_s
    return True


def request_summary(records: list[RequestRecord], slo, sim_time_s: float) -> dict:
    """The summary fields of a run with arrivals (``slo``: a :class:`sim.config.serving.SloConfig` or None)."""
    ttft, tpot, e2e = latencies(records)
    out: dict = {
        "ttft_s": stats_s(ttft),
        "tpot_s": stats_s(tpot),
        "e2e_s": stats_s(e2e),
        "throughput_req_s": float(len(records) / sim_time_s) if sim_time_s > 0 else None,
    }
    if slo is not None:
        served = [r for r in records if r.output_tokens >= 1 and r.finish_s is not None]
        met = sum(1 for r in served if meets(r, slo))
        out["slo"] = {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}
        out["slo_attainment"] = float(met / len(served)) if served else None
        out["goodput_req_s"] = float(met / sim_time_s) if sim_time_s > 0 else None
    return out


def requests_csv(records: list[RequestRecord]) -> bytes:
    """``requests.csv``: one row per request served, times in seconds (9 decimals: ns)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(REQUEST_COLUMNS)
    for r in records:
        row = [getattr(r, k) for k in REQUEST_COLUMNS]
        w.writerow(["" if v is None else f"{v:.9f}" if isinstance(v, float) else v for v in row])
    return buf.getvalue().encode()


def serving_lines(s: dict) -> list[str]:
    """The header's lines of a run with arrivals (none without): TTFT, TPOT and E2E, and the SLO's attainment."""
    if "ttft_s" not in s:
        return []

    def ms(x) -> str:
        return "-" if x is None else f"{x * 1e3:,.1f}"

    def line(label: str, st: dict) -> str:
        return (
            f"  {label:<18}mean {ms(st['mean'])} ms   p50 {ms(st['p50'])}   p90 {ms(st['p90'])}   "
            f"p99 {ms(st['p99'])} ms"
        )

    rate = s.get("throughput_req_s")
    lines = [
        f"  requests          {s.get('requests_served', 0):,} served, {'-' if rate is None else f'{rate:,.2f}'} "
        "requests/s",
        line("TTFT", s["ttft_s"]),
        line("TPOT", s["tpot_s"]),
        line("E2E", s["e2e_s"]),
    ]
    if "slo_attainment" in s:
        slo, att, good = s["slo"], s["slo_attainment"], s["goodput_req_s"]
        bounds = ", ".join(f"{k.removesuffix('_s')} <= {v * 1e3:,.1f} ms" for k, v in slo.items() if v is not None)
        lines.append(
            f"  SLO               {bounds}: attainment {'-' if att is None else f'{att:.3f}'}   goodput "
            f"{'-' if good is None else f'{good:,.2f}'} requests/s"
        )
    return lines


def request_lane(track: str) -> tuple[int, int]:
    """The Chrome trace's (process, thread) of a timeline track ``request N``: one lane per request."""
    return REQUEST_PID, int(track.removeprefix("request ")) + 1


def request_lanes(timeline: list) -> list[dict]:
    """The Chrome trace's metadata of the requests' lanes (none in a run without arrivals)."""
    tracks = sorted({t for t, *_ in timeline if t.startswith("request ")}, key=lambda t: request_lane(t)[1])
    if not tracks:
        return []
    events = [{"name": "process_name", "ph": "M", "pid": REQUEST_PID, "args": {"name": "requests"}}]
    for t in tracks:
        pid, tid = request_lane(t)
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": t}})
    return events


#: A sweep row's columns of a run with arrivals -> their path in the summary (rows of runs without have none)
SWEEP_METRICS = {
    "ttft_s_mean": ("ttft_s", "mean"),
    "ttft_s_p99": ("ttft_s", "p99"),
    "tpot_s_mean": ("tpot_s", "mean"),
    "tpot_s_p99": ("tpot_s", "p99"),
    "e2e_s_p99": ("e2e_s", "p99"),
    "throughput_req_s": ("throughput_req_s",),
    "slo_attainment": ("slo_attainment",),
    "goodput_req_s": ("goodput_req_s",),
}


def serving_metrics(summary: dict) -> dict:
    """The sweep row's columns of a run with arrivals (``SWEEP_METRICS``; none for a run without, so that the rows
    of earlier sweeps keep their columns)."""
    if "ttft_s" not in summary:
        return {}
    out = {}
    for col, keys in SWEEP_METRICS.items():
        v: Any = summary
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        out[col] = v
    return out
