"""The engine serving requests that arrive in time, checked against queueing rules rather than snapshots: at batch
1 a work-conserving first-come-first-served server (it starts the next request the moment the last finishes or it
arrives, never idles while one waits, finishes in arrival order); at any batch the GPU idles only while the system
is empty, until the next arrival; with every request there at time zero the run is today's to the last figure;
Little's law over the run, for the system, the queue and the batch (the batch counted from iterations.csv, the
requests' times from requests.csv); SLO attainment non-increasing in the rate on average over seeds."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from sim.request_results import requests_csv
from sim.results import iterations_csv
from sim.run import simulate
from tests.support.engine import comparable, config_for
from tests.support.traces import make_trace
from traces.io import save_trace

SERVING_KEYS = ("ttft_s", "tpot_s", "e2e_s", "throughput_req_s", "slo", "slo_attainment", "goodput_req_s")


def _trace(requests=24, prompt=6, decode=8, layers=2, experts=8, seed=0):
    rng = np.random.default_rng(seed)
    rows = requests * (prompt + decode)
    e = np.argsort(rng.random((rows, layers, experts)), axis=2)[:, :, :2]
    return make_trace(e, [prompt + decode] * requests, [prompt] * requests, num_experts=experts)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    trace = _trace()
    path = save_trace(trace, tmp_path_factory.mktemp("serving") / "t.npz")
    return path, trace


def _run(trace_file, rate=None, seed=0, batch=1, budget=None, slo=None, times=None, tmp=None, **workload):
    path, trace = trace_file
    if times is not None:
        f = tmp / "arrivals.csv"
        f.write_text("arrival_s\n" + "".join(f"{t!r}\n" for t in times))
        arrivals = {"process": "trace", "file": str(f)}
    elif rate is not None:
        arrivals = {"process": "poisson", "rate_per_s": rate, "seed": seed}
    else:
        arrivals = None
    extra = {"arrivals": arrivals} if arrivals else {}
    if budget is not None:
        extra["max_batch_tokens"] = budget
    if slo is not None:
        extra["slo"] = slo
    cfg = config_for(path, trace, batch=batch, batching="continuous", **extra, **workload)
    return simulate(cfg)


def _rows(res) -> list[dict]:
    return list(csv.DictReader(io.StringIO(requests_csv(res.engine.requests).decode())))


def test_at_batch_1_a_work_conserving_fcfs_server(trace_file):
    for budget in (None, 4):
        res = _run(trace_file, rate=400.0, seed=3, budget=budget)
        recs = res.engine.requests
        free = 0.0  # when the server finished the request before
        waited = idled = 0
        for rec in recs:
            assert rec.start_s == max(rec.arrival_s, free), "starts the moment it is both here and the server free"
            waited += rec.start_s > rec.arrival_s
            idled += rec.start_s > free
            assert rec.finish_s > free
            free = rec.finish_s
        assert waited and idled, "the rate both queues requests and idles the server (the test means something)"
        finishes = [r.finish_s for r in recs]
        assert finishes == sorted(finishes), "finished in arrival order"


@pytest.mark.parametrize(("batch", "budget"), [(3, None), (4, 6)])
def test_the_gpu_idles_only_while_the_system_is_empty_until_an_arrival(trace_file, batch, budget):
    res = _run(trace_file, rate=150.0, seed=1, batch=batch, budget=budget)
    its, recs = res.engine.iterations, res.engine.requests
    arrivals = {r.arrival_s for r in recs}
    gaps = 0
    for before, it in zip(its, its[1:]):
        if it.start_s > before.end_s:
            gaps += 1
            t = before.end_s
            assert all(r.finish_s <= t for r in recs if r.arrival_s <= t), "idle while a request waits"
            assert it.start_s in arrivals, "idle until exactly the next arrival"
        else:
            assert it.start_s == before.end_s
    assert gaps, "the rate leaves the GPU idle at times (the test means something)"
    assert its[0].start_s == recs[0].arrival_s


@pytest.mark.parametrize(("batch", "prefill"), [(1, True), (4, True), (3, False)])
def test_every_request_at_time_zero_gives_todays_figures(trace_file, tmp_path, batch, prefill):
    today = _run(trace_file, batch=batch, prefill=prefill, max_decode_tokens=5)
    zero = _run(trace_file, times=[0.0] * 24, tmp=tmp_path, batch=batch, prefill=prefill, max_decode_tokens=5)
    a, b = comparable(today.summary), comparable(zero.summary)
    assert set(b) - set(a) == {"ttft_s", "tpot_s", "e2e_s", "throughput_req_s"}
    assert {k: v for k, v in b.items() if k in a} == a
    assert iterations_csv(today.engine.iterations) == iterations_csv(zero.engine.iterations)
    assert [r.__dict__ for r in today.engine.iterations] == [r.__dict__ for r in zero.engine.iterations]
    assert (today.engine.events, today.engine.link_busy_s) == (zero.engine.events, zero.engine.link_busy_s)


def _area(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """The time integral of the number of intervals open, by a sweep over their ends (events sorted), and the last
    end."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    area, n, t0 = 0.0, 0, 0.0
    for t, step in events:
        area += n * (t - t0)
        n, t0 = n + step, t
    assert n == 0
    return area, t0


@pytest.mark.parametrize(("rate", "batch", "budget"), [(80.0, 2, None), (300.0, 4, 5), (40.0, 1, 3)])
def test_littles_law_over_the_run(trace_file, rate, batch, budget):
    res = _run(trace_file, rate=rate, seed=2, batch=batch, budget=budget, requests=40)
    rows = _rows(res)
    arrival = [float(r["arrival_s"]) for r in rows]
    start = [float(r["start_s"]) for r in rows]
    finish = [float(r["finish_s"]) for r in rows]
    horizon = res.summary["sim_time_s"]
    lam = len(rows) / horizon
    for ins, outs in ((arrival, finish), (arrival, start), (start, finish)):  # the system, the queue, the batch
        area, last = _area(list(zip(ins, outs)))
        assert last <= horizon + 1e-9
        mean_in_system = area / horizon
        mean_time = sum(b - a for a, b in zip(ins, outs)) / len(rows)
        assert mean_in_system == pytest.approx(lam * mean_time, rel=1e-6)
    # the batch again, from the iterations: requests in the batch x the iteration's time, and the idle time empty
    its = list(csv.DictReader(io.StringIO(iterations_csv(res.engine.iterations).decode())))
    in_batch = sum(int(it["requests"]) * float(it["latency_ms"]) / 1e3 for it in its) / horizon
    assert in_batch == pytest.approx(lam * sum(b - a for a, b in zip(start, finish)) / len(rows), rel=1e-5)


def test_slo_attainment_does_not_increase_with_the_rate_on_average(trace_file):
    slo = {"ttft_s": 0.004, "tpot_s": 0.002}
    means = []
    for rate in (50.0, 200.0, 800.0, 3200.0):
        att = [
            _run(trace_file, rate=rate, seed=s, batch=2, budget=4, slo=slo, requests=30).summary["slo_attainment"]
            for s in range(4)
        ]
        means.append(sum(att) / len(att))
    assert means == sorted(means, reverse=True)
    assert means[0] > means[-1], "the rates span the SLO's knee (the test means something)"


def test_the_definitions_hold_on_the_run_and_the_timeline_shows_each_request(trace_file):
    path, trace = trace_file
    cfg = config_for(
        path,
        trace,
        batch=2,
        batching="continuous",
        arrivals={"process": "gamma", "rate_per_s": 300.0, "cv": 2.0, "seed": 4},
        max_batch_tokens=5,
        slo={"ttft_s": 0.003},
    )
    res = simulate(cfg, timeline=True)
    recs, s = res.engine.requests, res.summary
    ttft = [r.first_token_s - r.arrival_s for r in recs]
    tpot = [(r.finish_s - r.first_token_s) / (r.output_tokens - 1) for r in recs]
    assert s["ttft_s"]["mean"] == pytest.approx(np.mean(ttft))
    assert s["tpot_s"]["p99"] == pytest.approx(np.percentile(tpot, 99))
    assert s["e2e_s"]["p50"] == pytest.approx(np.median([r.finish_s - r.arrival_s for r in recs]))
    met = sum(t <= 0.003 for t in ttft)
    assert s["slo_attainment"] == met / len(recs)
    assert s["goodput_req_s"] == pytest.approx(met / s["sim_time_s"])
    assert all(r.prompt_tokens == 6 and r.output_tokens == 9 for r in recs)  # the prefill's token and 8 decodes
    spans: dict[str, dict[str, tuple[float, float]]] = {}
    for track, name, start, dur in res.engine.timeline:
        if track.startswith("request "):
            spans.setdefault(track, {})[name] = (start, start + dur)
    assert len(spans) == len(recs)
    for r in recs:
        lane = spans[f"request {r.request}"]
        if r.start_s > r.arrival_s:
            assert lane["queued"] == pytest.approx((r.arrival_s, r.start_s))
        assert lane["prefill"] == pytest.approx((r.start_s, r.prompt_done_s))
        assert lane["decode"] == pytest.approx((r.prompt_done_s, r.finish_s))
