"""The online scheduler of requests arriving in time (sim/core/serving.py), driven here by a plain clock (each
iteration takes a time that grows with its tokens): with every request at time zero and no token budget it makes
today's continuous batching exactly; with a budget, no iteration holds more tokens than it, every token of every
request is processed once and in order, no request starts before it arrives, at most a batch is in flight, and
requests are admitted first come, first served."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.core.serving import ServingBatches
from sim.core.workload import build_iterations, requests_served
from tests.support.fuzz import fuzz_settings
from tests.support.traces import make_trace


def _trace(rng: np.random.Generator, requests: int, roles=None, with_prompts: bool = True):
    """Random routing of ``requests`` requests of 1..12 rows, each with a prompt of 0..all of its rows."""
    lengths = rng.integers(1, 13, size=requests)
    prefill = [int(rng.integers(0, n + 1)) if with_prompts else 0 for n in lengths]
    layers = len(roles) if roles else 2
    e = np.argsort(rng.random((int(lengths.sum()), layers, 6)), axis=2)[:, :, :2]
    return make_trace(e, lengths, prefill, num_experts=6, roles=roles)


def drive(batches: ServingBatches, cost=lambda it: 0.001 + 1e-4 * it.rows.size):
    """Run the scheduler on a plain clock: (iterations with their start and end, idle waits)."""
    now, ran, idles = 0.0, [], []
    while True:
        nxt = batches.next(now)
        if nxt is None:
            return ran, idles
        if isinstance(nxt, float):
            assert nxt > now, "an idle wait ends in the future"
            idles.append((now, nxt))
            now = nxt
            continue
        end = now + cost(nxt)
        ran.append((nxt, now, end))
        batches.done(nxt, now, end)
        now = end


settings_ = fuzz_settings(60)
cases = st.tuples(
    st.integers(0, 2**32 - 1),  # the trace's seed
    st.integers(1, 9),  # requests in the trace
    st.integers(1, 5),  # batch size
    st.sampled_from([None, 0, 1, 3]),  # max_decode_tokens
    st.booleans(),  # prefill
    st.sampled_from([None, 1, 5, 17]),  # workload.requests
)


@settings_
@given(cases)
def test_every_request_at_zero_without_a_budget_is_todays_continuous_batching(case):
    seed, n_req, batch, max_decode, prefill, requests = case
    trace = _trace(np.random.default_rng(seed), n_req)
    its, info = build_iterations(trace, batch, "continuous", max_decode, prefill, requests)
    n = requests_served(trace.num_requests, batch, "continuous", requests)
    batches = ServingBatches(trace, [0.0] * n, batch, max_decode, prefill, None)
    ran, idles = drive(batches)
    assert not idles
    assert len(ran) == len(its)
    for a, (b, _, _) in zip(its, ran):
        assert (a.index, a.batch, a.kind, a.requests, a.context, a.new_batch) == (
            b.index,
            b.batch,
            b.kind,
            b.requests,
            b.context,
            b.new_batch,
        )
        assert np.array_equal(a.rows, b.rows)
        assert (b.prompt_rows, b.emits) == (0, None)
    assert batches.info() == info


budget_cases = st.tuples(
    st.integers(0, 2**32 - 1),
    st.integers(1, 9),
    st.integers(1, 4),  # batch size
    st.integers(0, 8),  # budget above the batch size
    st.sampled_from([None, 2]),
    st.booleans(),  # prefill
    st.sampled_from([0.0, 0.5, 20.0, 300.0, 3000.0]),  # arrival rate (0: all at once)
    st.booleans(),  # encoder-decoder model
)


def _served_rows(trace, batches, r):
    """The trace rows request ``r`` of the run must have processed: its prompt (when prefilled), its decode rows."""
    t = batches.order[r]
    start = int(trace.request_offsets[t])
    prompt = batches.prompt_of[r]
    first_decode = start + int(trace.prefill_lengths[t])
    return list(range(start, start + prompt)) + list(range(first_decode, first_decode + batches.decode_of[r]))


@settings_
@given(budget_cases)
def test_chunked_prefill_keeps_the_budget_and_processes_every_token_once_in_order(case):
    seed, n_req, batch, extra, max_decode, prefill, rate, enc_dec = case
    rng = np.random.default_rng(seed)
    roles = ["encoder", "decoder"] if enc_dec else None
    trace = _trace(rng, n_req, roles)
    n = requests_served(trace.num_requests, batch, "continuous", None)
    arrivals = np.cumsum(rng.exponential(1 / rate, n)).tolist() if rate > 0 else [0.0] * n
    budget = batch + extra
    batches = ServingBatches(trace, arrivals, batch, max_decode, prefill, budget)
    ran, _ = drive(batches)
    seen: dict[int, list[int]] = {r: [] for r in range(n)}
    owner = {}  # row -> requests in flight that may hold it (a trace request re-used is served again later)
    for it, _, _ in ran:
        assert it.rows.size <= budget, "an iteration holds no more tokens than the budget"
        assert it.requests <= batch, "at most a batch of requests is in flight"
        if enc_dec:
            assert it.prompt_rows == 0, "an encoder-decoder model runs chunks and decodes apart"
        assert it.decode_tokens == it.rows.size - it.prompt_rows if it.kind == "decode" else it.decode_tokens == 0
    for r in range(n):
        for row in _served_rows(trace, batches, r):
            owner.setdefault(row, []).append(r)
    # replay the iterations' rows onto the requests that own them, oldest unfinished first
    for it, _, _ in ran:
        for row in it.rows.tolist():
            r = next(x for x in owner[row] if row not in seen[x])
            seen[r].append(row)
    for r in range(n):
        assert seen[r] == _served_rows(trace, batches, r), "each token once, prompt then decodes, in order"
    infos = batches.info()
    assert infos.prefill_tokens == sum(batches.prompt_of)
    assert infos.decode_tokens == sum(batches.decode_of)


@settings_
@given(budget_cases, st.booleans())
def test_no_request_starts_before_it_arrives_and_admission_is_first_come_first_served(case, chunked):
    seed, n_req, batch, extra, max_decode, prefill, rate, enc_dec = case
    rng = np.random.default_rng(seed)
    trace = _trace(rng, n_req, ["encoder", "decoder"] if enc_dec else None)
    n = requests_served(trace.num_requests, batch, "continuous", None)
    arrivals = np.cumsum(rng.exponential(1 / rate, n)).tolist() if rate > 0 else [0.0] * n
    batches = ServingBatches(trace, arrivals, batch, max_decode, prefill, batch + extra if chunked else None)
    ran, idles = drive(batches)
    recs = batches.records
    for rec in recs:
        assert rec.start_s is not None and rec.finish_s is not None and rec.first_token_s is not None
        assert rec.arrival_s <= rec.start_s <= rec.first_token_s <= rec.finish_s
    starts = [rec.start_s for rec in recs]
    assert starts == sorted(starts), "requests are admitted in arrival order"
    # idle only while nothing is in flight, until exactly the next arrival
    for a, b in idles:
        assert all(rec.finish_s <= a for rec in recs if rec.arrival_s <= a)
        assert b in arrivals


def test_a_mixed_iteration_holds_the_decodes_and_a_chunk_within_the_budget():
    # two requests of a 6-token prompt and 3 decode rows, batch 2, budget 4: r0 chunks 4 then 2 (+1 budget to r1)
    trace = make_trace(np.zeros((18, 2, 1)), [9, 9], [6, 6], num_experts=2)
    batches = ServingBatches(trace, [0.0, 0.0], 2, None, True, 4)
    ran, _ = drive(batches)
    its = [it for it, _, _ in ran]
    assert [(it.kind, it.rows.tolist(), it.prompt_rows, it.emits) for it in its] == [
        ("prefill", [0, 1, 2, 3], 0, 0),  # r0's first chunk takes the budget; r1 waits in the batch
        ("prefill", [4, 5, 9, 10], 0, 1),  # r0's prompt ends (its first token), r1's first chunk
        ("decode", [11, 12, 13, 6], 3, 1),  # r0's first decode first in the budget, then r1's chunk
        ("decode", [14, 7], 1, 2),  # r1's prompt ends beside r0's decode
        ("decode", [8, 15], 0, None),
        ("decode", [16], 0, None),
        ("decode", [17], 0, None),
    ]
    assert [it.requests for it in its] == [2, 2, 2, 2, 2, 1, 1]
    assert its[2].decode_tokens == 1
    r0, r1 = batches.records
    assert r0.output_tokens == r1.output_tokens == 4  # the prefill's token and three decodes
    assert r0.first_token_s == ran[1][2] and r1.first_token_s == ran[3][2]  # the ends of their prompts
    assert r0.finish_s == ran[4][2] and r1.finish_s == ran[6][2]
    assert r0.start_s == r1.start_s == 0.0  # both in the batch from the first iteration
