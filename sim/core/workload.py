"""Batches formed from a trace's requests, as the sequence of iterations an engine runs.

An *iteration* is one forward pass of the model over some trace rows:

- ``prefill``: the prompt tokens of requests entering the batch (routed in the encoder layers of an
  encoder-decoder model, in every layer of a decoder-only one);
- ``decode``: one generated token of every running request.

Static batching (the Diff-MoE evaluation): ``batch_size`` requests start together, are prefilled in one
iteration, then decode until the last of them finishes; the next batch starts after. Continuous batching: a
finished request's place is taken by the next one waiting, whose prompt is prefilled in its own iteration just
before the decode iteration it joins.

Requests are served in trace order; when the workload needs more than the trace has (``requests`` above the
trace's count, or static batches to fill), requests are re-used from the start, and ``WorkloadInfo.reused``
says how many times that happened.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.format import Trace
from traces.summary import prompt_with_info


@dataclass(frozen=True)
class Iteration:
    index: int
    batch: int  # static batch number (0 for continuous batching)
    kind: str  # "prefill" | "decode"
    rows: np.ndarray  # trace rows processed
    requests: int  # requests in the batch during this iteration
    context: float  # mean attention context (tokens) of the rows
    new_batch: bool  # first iteration of a static batch (or of the run)
    # chunked prefill (sim/core/serving.py): a decode iteration's leading rows that are prompt chunks, and the
    # tokens its LM head runs over (None: every row of a decode iteration, one per request of a prefill)
    prompt_rows: int = 0
    emits: int | None = None

    @property
    def decode_tokens(self) -> int:
        return int(self.rows.size) - self.prompt_rows if self.kind == "decode" else 0

    @property
    def lm_head_tokens(self) -> int:
        """The tokens the LM head runs over: every row of a decode iteration (or ``emits``), each prefilled
        request's last token."""
        if self.emits is not None:
            return self.emits
        return int(self.rows.size) if self.kind == "decode" else self.requests


@dataclass(frozen=True)
class WorkloadInfo:
    requests_served: int
    distinct_requests: int
    reused: int  # requests served beyond the trace's distinct ones
    iterations: int
    decode_tokens: int
    prefill_tokens: int


def prompt_context(trace: Trace) -> np.ndarray:
    """Per request, the prompt tokens its decode steps attend over: its prefill rows, or, for a request whose
    prompt's routing was not recorded (a decode-only import), ``request_info.prompt_len`` where the trace has it."""
    return prompt_with_info(trace.prefill_lengths, trace.meta.request_info)


def _request_plan(trace: Trace, max_decode_tokens: int | None):
    """Per request: first prompt row, prompt length, first decode row, decode length (capped)."""
    start = trace.request_offsets[:-1]
    prompt = trace.prefill_lengths
    decode = trace.request_lengths - prompt
    if max_decode_tokens is not None:
        decode = np.minimum(decode, max_decode_tokens)
    return start, prompt, start + prompt, decode


class _Iterations:
    """A workload's iterations as they are appended (``its``): a prefill iteration of some requests, a decode
    iteration of some running requests at their decode steps."""

    def __init__(
        self, trace: Trace, max_decode_tokens: int | None, prefill: bool, depth: int = 0, ubatch: int | None = None
    ):
        start, prompt, dstart, decode = _request_plan(trace, max_decode_tokens)
        self.start, self.prompt, self.decode, self.prefill = start, prompt, decode, prefill
        self.depth, self.ubatch = depth, ubatch  # the KV depth each request starts at; the micro-batch (None: whole)
        # per request, as Python ints: a decode iteration's row and context are sums of a few of them
        attended = prompt_context(trace)
        if depth:
            attended = attended + depth
        self.attended, self.first_decode = attended.tolist(), dstart.tolist()
        self.decode_of = decode.tolist()
        self.its: list[Iteration] = []

    def add_prefill(self, reqs: np.ndarray, batch: int, size: int, new_batch: bool) -> bool:
        """The prefill iteration of ``reqs``' prompts (those that have one), in a batch of ``size`` requests; False
        when there is none (prefill off, or no prompt)."""
        if not self.prefill:
            return False
        start, prompt = self.start, self.prompt
        reqs = reqs[prompt[reqs] > 0]
        if reqs.size == 0:
            return False
        rows = np.asarray(np.concatenate([np.arange(start[r], start[r] + prompt[r]) for r in reqs]), dtype=np.int64)
        if self.ubatch is not None:
            self._micro_batches(reqs, rows, batch, size, new_batch)
            return True
        ctx = float(np.mean([(prompt[r] + 1) / 2 for r in reqs]))
        if self.depth:
            ctx += self.depth
        self.its.append(Iteration(len(self.its), batch, "prefill", rows, size, ctx, new_batch))
        return True

    def _micro_batches(self, reqs: np.ndarray, rows: np.ndarray, batch: int, size: int, new_batch: bool) -> None:
        """A prefill of ``rows`` in passes of at most ``ubatch`` tokens (llama.cpp's micro-batches), each attending
        over the depth plus its tokens' mean position + 1 in their prompt; only the last pass runs the LM head (over
        one token per request), the others emit nothing."""
        ub = int(self.ubatch or 1)
        pos = np.concatenate([np.arange(1, int(self.prompt[r]) + 1) for r in reqs]).astype(np.float64)
        n = int(rows.size)
        for i, lo in enumerate(range(0, n, ub)):
            hi = min(n, lo + ub)
            ctx = float(np.mean(pos[lo:hi])) + self.depth
            emits = None if hi == n else 0
            self.its.append(
                Iteration(len(self.its), batch, "prefill", rows[lo:hi], size, ctx, new_batch and i == 0, emits=emits)
            )

    def add_decode(self, reqs: list[int], steps: list[int], batch: int, new_batch: bool) -> None:
        """The decode iteration of ``reqs``, each at its decode step in ``steps``."""
        first_decode, attended = self.first_decode, self.attended
        if len(reqs) == 1:  # np.mean of one value is that value
            r, s = reqs[0], steps[0]
            rows = np.array([first_decode[r] + s], dtype=np.int64)
            ctx = float(attended[r] + s + 1)
        else:
            rows = np.array([first_decode[r] + s for r, s in zip(reqs, steps)], dtype=np.int64)
            ctx = float(np.mean([attended[r] + s + 1 for r, s in zip(reqs, steps)]))
        self.its.append(Iteration(len(self.its), batch, "decode", rows, len(reqs), ctx, new_batch))


def _static_batches(out: _Iterations, order: np.ndarray, busy: np.ndarray, batch_size: int) -> None:
    """Static batching: each batch of ``batch_size`` places in ``order`` prefilled together, then decoding until
    its last request finishes; a batch of requests with nothing to run (``busy`` false) adds nothing."""
    decode, decode_of = out.decode, out.decode_of
    working = busy.reshape(order.size // batch_size, batch_size).any(axis=1)
    for b in np.flatnonzero(working).tolist():
        reqs = order[b * batch_size : (b + 1) * batch_size]
        new = not out.add_prefill(reqs, b, len(reqs), True)
        decoding = reqs[decode[reqs] > 0].tolist()
        for s in range(int(decode[reqs].max(initial=0))):
            live = [r for r in decoding if decode_of[r] > s]
            out.add_decode(live, [s] * len(live), b, new)
            new = False


def _continuous_batches(out: _Iterations, order: np.ndarray, busy: np.ndarray, batch_size: int) -> None:
    """Continuous batching: a finished request's place taken by the next in ``order``, prefilled in its own
    iteration just before the decode iteration it joins; whole rounds of requests with nothing to run (``busy``
    false) skipped while none is running."""
    decode, served = out.decode, order.size
    busy_at = np.flatnonzero(busy)  # the places in the order of requests with something to run
    nxt = 0  # the next place in the order to join
    running: list[list[int]] = []  # [request, next decode step]
    first = True
    while nxt < served or running:
        if not running:  # rounds that take only requests with nothing to run: skip them whole
            k = int(np.searchsorted(busy_at, nxt))
            upto = int(busy_at[k]) if k < busy_at.size else served
            nxt += (upto - nxt) // batch_size * batch_size
            if nxt >= served:
                break
        joining = order[nxt : nxt + batch_size - len(running)]
        nxt += joining.size
        if joining.size:
            if out.add_prefill(joining, 0, len(running) + joining.size, first):
                first = False
            running.extend([r, 0] for r in joining[decode[joining] > 0].tolist())
        if not running:
            continue
        out.add_decode([r for r, _ in running], [s for _, s in running], 0, first)
        first = False
        for item in running:
            item[1] += 1
        running = [item for item in running if item[1] < decode[item[0]]]


def requests_served(n_trace: int, batch_size: int, batching: str, requests: int | None) -> int:
    """The requests a workload serves: ``requests`` (else the trace's ``n_trace``), in whole batches for static
    batching, and at least a batch for continuous batching without ``requests``."""
    served = requests if requests is not None else n_trace
    if batching == "static":
        return -(-max(served, 1) // batch_size) * batch_size  # whole batches
    if requests is None:
        return max(served, batch_size)  # enough to fill the batch once
    return served


def build_iterations(
    trace: Trace,
    batch_size: int,
    batching: str = "static",
    max_decode_tokens: int | None = None,
    prefill: bool = True,
    requests: int | None = None,
    context_tokens: int | None = None,
    ubatch: int | None = None,
) -> tuple[list[Iteration], WorkloadInfo]:
    """The iterations of a workload, and a summary of it.

    Requests with nothing to run (no prompt to prefill, no token to generate) still take their place in the order
    and in the batches, but cost no work per request: static batches of them only are skipped at once, and so are
    whole rounds of them while no request is running in continuous batching (they would change nothing but how far
    the queue has gone), so that a trace of millions of empty requests costs time in its tokens, not its requests.

    ``context_tokens``: the KV depth every request starts at (its prompt and generated tokens attend over it too);
    ``ubatch``: prefills run in passes of at most that many tokens (docs/phases.md). None: as before."""
    if batching not in ("static", "continuous"):
        raise ValueError(f"unknown batching {batching!r}")
    out = _Iterations(trace, max_decode_tokens, prefill, int(context_tokens or 0), ubatch)
    n_trace = trace.num_requests
    served = requests_served(n_trace, batch_size, batching, requests)
    order = np.arange(served) % n_trace
    prefilled = out.prompt > 0 if prefill else np.zeros(n_trace, dtype=bool)  # requests with a prefill iteration
    busy = (prefilled | (out.decode > 0))[order]  # per place in the order: the request has something to run
    (_static_batches if batching == "static" else _continuous_batches)(out, order, busy, batch_size)
    its = out.its
    info = WorkloadInfo(
        requests_served=int(served),
        distinct_requests=int(min(served, n_trace)),
        reused=int(max(0, served - n_trace)),
        iterations=len(its),
        decode_tokens=sum(it.decode_tokens for it in its),
        prefill_tokens=sum(int(it.rows.size) for it in its if it.kind == "prefill"),
    )
    return its, info


def phase_layers(trace: Trace) -> dict[str, list[int]]:
    """The MoE layers each kind of iteration runs: encoder layers for prefill and decoder layers for decode in an
    encoder-decoder model; every layer in both for a decoder-only one."""
    roles = [x.role for x in trace.meta.model.layers]
    every = list(range(len(roles)))
    if "encoder" in roles and "decoder" in roles:
        return {
            "prefill": [i for i in every if roles[i] == "encoder"],
            "decode": [i for i in every if roles[i] == "decoder"],
        }
    return {"prefill": every, "decode": every}


#: Up to this many rows, :func:`active_sets` counts in plain Python (numpy's fixed cost per call is larger).
SMALL_BATCH = 2


def active_sets(trace: Trace, rows: np.ndarray, layers: list[int]) -> list[tuple[tuple[int, ...], dict[int, int]]]:
    """Per layer: the sorted active experts of the rows (the union of their top-k) and tokens routed to each
    (a dict in expert order)."""
    if len(rows) == 1:
        return _active_sets_one(np.sort(trace.experts[rows[0]], axis=-1).tolist(), layers)
    if len(rows) <= SMALL_BATCH:
        return _active_sets_small(trace.experts[rows].tolist(), layers)
    e = trace.num_experts
    ids = trace.experts[rows][:, layers, :].astype(np.int64)  # [rows, layers, k]
    codes = ids + (np.arange(len(layers)) * e)[None, :, None]
    counts = np.bincount(codes[ids >= 0], minlength=len(layers) * e).reshape(len(layers), e)
    layer_of, expert = np.nonzero(counts)  # row-major: grouped by layer, experts ascending
    bounds = np.searchsorted(layer_of, np.arange(len(layers) + 1)).tolist()
    experts, tokens = expert.tolist(), counts[layer_of, expert].tolist()
    out = []
    for j in range(len(layers)):
        ex = experts[bounds[j] : bounds[j + 1]]
        out.append((tuple(ex), dict(zip(ex, tokens[bounds[j] : bounds[j + 1]]))))
    return out


def _active_sets_one(row: list, layers: list[int]) -> list[tuple[tuple[int, ...], dict[int, int]]]:
    """:func:`active_sets` of one row, its routing as nested lists ([layers][k], each layer's ids sorted, -1 for no
    expert)."""
    out = []
    for layer in layers:
        ids = row[layer]
        ex = tuple(ids)
        counts = dict.fromkeys(ex, 1)
        if len(counts) != len(ex) or not ex or ex[0] < 0:  # not the usual top-k (each expert once)
            ex = tuple(x for x in counts if x != -1)
            counts = {x: ids.count(x) for x in ex}
        out.append((ex, counts))
    return out


def _active_sets_small(block: list, layers: list[int]) -> list[tuple[tuple[int, ...], dict[int, int]]]:
    """:func:`active_sets` over a few rows' routing as nested lists ([rows][layers][k], -1 for no expert)."""
    out = []
    for layer in layers:
        counts: dict[int, int] = {}
        for row in block:
            for x in row[layer]:
                if x >= 0:
                    counts[x] = counts.get(x, 0) + 1
        ex = tuple(sorted(counts))
        out.append((ex, {x: counts[x] for x in ex}))
    return out
