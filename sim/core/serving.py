"""Serving requests that arrive in time: continuous batching, with or without chunked prefill, its iterations
made one by one as the engine reaches them (the schedule depends on when requests arrive, and so on how long the
iterations before took). Plain Python, no time of its own: the engine asks :meth:`ServingBatches.next` at its
current time and reports each iteration's end (:meth:`ServingBatches.done`).

Requests are served first come, first served, in the run's order (the trace's requests, re-used from the start
when the run serves more), request ``i`` arriving at ``arrivals[i]``. At each iteration's start the scheduler
admits the requests that have arrived, oldest first, while the batch has a place (``batch_size`` requests at
most: a request holds its place from its admission to its last token). When no request is running and the next
has not arrived, the engine idles until it arrives. Then:

- without a token budget (``budget`` None): the prompts of the requests admitted now are prefilled whole in one
  iteration of their own, and then every running request decodes one token in the next iteration, the new ones
  included: the continuous batching of a run without arrivals (``sim/core/workload.py``), made online; with every
  request there at time zero, the same iterations;
- with a token budget (``workload.max_batch_tokens``, chunked prefill): one iteration holds every running
  request's next decode token, then prompt chunks of the requests still prefilling, oldest first, each as much of
  the rest of its prompt as the budget leaves (a prompt may take several iterations); in a decoder-only model the
  chunks and the decodes are one iteration (its rows the chunks' then the decodes', its experts the union of
  their routing); in an encoder-decoder model, whose prompts run the encoder and decodes the decoder, the chunks
  run in an iteration of their own before the decodes. A request decodes from the iteration after the one that
  ends its prompt.

Tokens, as the per-request figures count them: a request's prefill (when it has prompt rows and prefill is on)
ends with its first output token, and each of its decode rows is one more, so ``output_tokens`` is its decode rows,
plus one when it was prefilled. ``first_token_s`` is the end of the iteration that ends its prompt (without one:
of its first decode), ``finish_s`` the end of its last iteration. A mixed iteration's LM head runs over its decode
tokens and one token per prompt it ends (``Iteration.emits``); its attention context is the mean over its tokens
(a chunk of ``c`` tokens from prompt position ``a`` attends over ``a + (c + 1) / 2`` on average).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from moebase.errors import ConfigError
from sim.config.serving import read_arrival_times
from sim.core.arrivals import arrival_times
from sim.core.workload import Iteration, WorkloadInfo, _Iterations, phase_layers, requests_served
from traces.format import Trace

if TYPE_CHECKING:
    from sim.config.run_config import RunConfig

__all__ = ["RequestRecord", "ServingBatches", "serving_batches"]


@dataclass
class RequestRecord:
    """One served request: its place in the run's order (its id), the trace request it replays, when it arrived,
    its prompt tokens prefilled and output tokens, and (once served) when it entered the batch (the start of the
    first iteration after its admission), when its prompt was done, its first token and its end (s)."""

    request: int
    trace_request: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    start_s: float | None = None
    prompt_done_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None


@dataclass
class _Planned:
    """An iteration made and not yet run, and what its end means for its requests."""

    it: Iteration
    members: list[int]  # the requests in the batch while it runs (their places), served by it or waiting for room
    prompt_done: list[int] = field(default_factory=list)  # requests whose prompt it ends
    decoded: list[tuple[int, int]] = field(default_factory=list)  # (request, decode step) of its decode tokens


class ServingBatches:
    """The iterations of requests arriving at ``arrivals`` (one time per request served, non-decreasing), made
    online. ``records`` holds every request's figures once the engine has run them all."""

    def __init__(
        self,
        trace: Trace,
        arrivals: Sequence[float],
        batch_size: int,
        max_decode_tokens: int | None = None,
        prefill: bool = True,
        budget: int | None = None,
    ):
        n = len(arrivals)
        if n < 1:
            raise ValueError("a run serves at least one request")
        if any(b < a for a, b in zip(arrivals, arrivals[1:])):
            raise ValueError("arrival times must be non-decreasing")
        if budget is not None and budget < batch_size:
            raise ValueError(f"the token budget {budget} is less than the batch size {batch_size}")
        self.out = out = _Iterations(trace, max_decode_tokens, prefill)
        self.batch_size, self.budget = batch_size, budget
        phases = phase_layers(trace)
        self.mix = phases["prefill"] == phases["decode"]  # chunks and decodes run the same layers
        self.order = (np.arange(n) % trace.num_requests).tolist()
        self.arrivals = [float(a) for a in arrivals]
        prompt = out.prompt.tolist() if prefill else [0] * trace.num_requests
        self.prompt_of = [int(prompt[r]) for r in self.order]
        self.decode_of = [int(out.decode_of[r]) for r in self.order]
        self.records = [
            RequestRecord(i, r, self.arrivals[i], self.prompt_of[i], self.decode_of[i] + (self.prompt_of[i] > 0))
            for i, r in enumerate(self.order)
        ]
        self.left = list(self.prompt_of)  # prompt rows still to prefill, per request
        self.step = [0] * n  # the next decode step, per request
        self.admitted = 0  # requests admitted so far (the next to admit)
        self.running: list[int] = []  # admitted and unfinished, in admission order
        self.planned: deque[_Planned] = deque()
        self.first = True  # the next iteration is the run's first
        self.finished = 0
        self.prefill_tokens = 0

    # --------------------------------------------------------------------------------------------- the engine's side
    def next(self, now: float) -> Iteration | float | None:
        """What the engine does at ``now``: run this iteration, idle until this time (the next arrival: no request
        is running), or nothing more (None: every request is served)."""
        while not self.planned:
            if not self.running:
                if self.admitted == len(self.arrivals):
                    return None
                due = self.arrivals[self.admitted]
                if due > now:
                    return due
            self.plan(now)
        return self.planned[0].it

    def done(self, it: Iteration, start: float, end: float) -> None:
        """The engine ran ``it`` (the one :meth:`next` gave) from ``start`` to ``end``."""
        p = self.planned.popleft()
        assert p.it is it, "the engine runs the iterations in the order they are given"
        recs = self.records
        for r in p.members:
            if recs[r].start_s is None:
                recs[r].start_s = start
        for r in p.prompt_done:
            rec = recs[r]
            rec.prompt_done_s = rec.first_token_s = end
            if self.decode_of[r] == 0:
                self._finish(rec, end)
        for r, s in p.decoded:
            rec = recs[r]
            if rec.first_token_s is None:
                rec.first_token_s = end
            if s == self.decode_of[r] - 1:
                self._finish(rec, end)

    def _finish(self, rec: RequestRecord, end: float) -> None:
        rec.finish_s = end
        self.finished += 1

    @property
    def total(self) -> int:
        return len(self.arrivals)

    def info(self) -> WorkloadInfo:
        """The workload's summary, once every iteration has run."""
        its, n = self.out.its, len(self.arrivals)
        n_trace = len(set(self.order))
        return WorkloadInfo(
            requests_served=n,
            distinct_requests=n_trace,
            reused=n - n_trace,
            iterations=len(its),
            decode_tokens=sum(it.decode_tokens for it in its),
            prefill_tokens=self.prefill_tokens,
        )

    # --------------------------------------------------------------------------------------------- the schedule
    def admit(self, now: float) -> list[int]:
        """The requests that have arrived by ``now``, oldest first, while the batch has places; those with nothing
        to run are served at once."""
        joining: list[int] = []
        places = self.batch_size - len(self.running)
        arrivals, n = self.arrivals, len(self.arrivals)
        while places > 0 and self.admitted < n and arrivals[self.admitted] <= now:
            joining.append(self.admitted)
            self.admitted += 1
            places -= 1
        for r in joining:
            if self.prompt_of[r] == 0 and self.decode_of[r] == 0:
                rec = self.records[r]
                rec.start_s = rec.first_token_s = now
                self._finish(rec, now)
        return joining

    def plan(self, now: float) -> None:
        """The next step's iterations (none when the requests admitted now have nothing to run)."""
        before = len(self.running)
        joining = self.admit(now)
        if self.budget is None:
            self._whole_prompts(joining, before)
        else:
            self.running.extend(r for r in joining if self.prompt_of[r] or self.decode_of[r])
            self._chunked()

    def _whole_prompts(self, joining: list[int], before: int) -> None:
        """The joining requests' prompts whole in a prefill iteration, then a decode iteration of every running
        request (``sim.core.workload``'s continuous batching)."""
        out, order = self.out, self.order
        if joining:
            reqs = np.array([order[r] for r in joining], dtype=np.int64)
            if out.add_prefill(reqs, 0, before + len(joining), self.first):
                self.first = False
                done = [r for r in joining if self.prompt_of[r] > 0]
                self.prefill_tokens += sum(self.prompt_of[r] for r in done)
                for r in done:
                    self.left[r] = 0
                batch = self.running + [r for r in joining if self.prompt_of[r] or self.decode_of[r]]
                self.planned.append(_Planned(out.its[-1], batch, prompt_done=done))
            self.running.extend(r for r in joining if self.decode_of[r] > 0)
        self._decodes(list(self.running))

    def _decodes(self, reqs: list[int]) -> None:
        """A decode iteration of ``reqs`` (each at its next step), the finished ones leaving the batch."""
        if not reqs:
            return
        steps = [self.step[r] for r in reqs]
        self.out.add_decode([self.order[r] for r in reqs], steps, 0, self.first)
        if len(self.running) != len(reqs):  # requests still prefilling are in the batch too (chunked prefill)
            self.out.its[-1] = replace(self.out.its[-1], requests=len(self.running))
        self.first = False
        batch = list(self.running)
        self.planned.append(_Planned(self.out.its[-1], batch, decoded=list(zip(reqs, steps))))
        for r in reqs:
            self.step[r] += 1
        self.running = [r for r in self.running if self.left[r] or self.step[r] < self.decode_of[r]]

    def _chunked(self) -> None:
        """Every running request's decode token, then prompt chunks within what is left of the budget: one
        iteration where chunks and decodes run the same layers, else the chunks' and then the decodes'."""
        decoding = [r for r in self.running if self.left[r] == 0]
        room = self.budget - len(decoding) if self.budget is not None else 0
        chunks: list[tuple[int, int, int]] = []  # (request, first prompt position, tokens)
        for r in self.running:
            if room <= 0:
                break
            if self.left[r]:
                c = min(self.left[r], room)
                chunks.append((r, self.prompt_of[r] - self.left[r], c))
                room -= c
        if not self.mix:
            if chunks:
                self._chunk_iteration(chunks, [])
            self._decodes([r for r in self.running if self.left[r] == 0])
        elif chunks:
            self._chunk_iteration(chunks, decoding)
        else:
            self._decodes(decoding)

    def _chunk_iteration(self, chunks: list[tuple[int, int, int]], decoding: list[int]) -> None:
        """One iteration of prompt chunks (and decode tokens): rows the chunks' then the decodes'; its context the
        mean over its tokens; its LM head over the decode tokens and one token per prompt it ends."""
        out, order = self.out, self.order
        start, first_decode, attended = out.start, out.first_decode, out.attended
        parts, ctx_sum, ended = [], 0.0, []
        for r, a, c in chunks:
            s = int(start[order[r]]) + a
            parts.append(np.arange(s, s + c, dtype=np.int64))
            ctx_sum += c * (2 * a + c + 1) / 2
            if a + c == self.prompt_of[r]:
                ended.append(r)
        steps = [self.step[r] for r in decoding]
        if decoding:
            parts.append(np.array([first_decode[order[r]] + s for r, s in zip(decoding, steps)], dtype=np.int64))
            ctx_sum += sum(attended[order[r]] + s + 1 for r, s in zip(decoding, steps))
        rows = np.concatenate(parts)
        chunk_rows = sum(c for _, _, c in chunks)
        it = Iteration(
            len(out.its),
            0,
            "decode" if decoding else "prefill",
            rows,
            len(self.running),  # the requests in the batch: those this iteration serves, and those it has no room for
            float(ctx_sum / rows.size),
            self.first,
            prompt_rows=chunk_rows if decoding else 0,
            emits=len(decoding) + len(ended),
        )
        out.its.append(it)
        self.first = False
        self.prefill_tokens += chunk_rows
        self.planned.append(_Planned(it, list(self.running), prompt_done=ended, decoded=list(zip(decoding, steps))))
        for r, _, c in chunks:
            self.left[r] -= c
        for r in decoding:
            self.step[r] += 1
        self.running = [r for r in self.running if self.left[r] or self.step[r] < self.decode_of[r]]


def serving_batches(cfg: RunConfig, trace: Trace) -> ServingBatches:
    """The scheduler of a run config with ``workload.arrivals``: its requests (``workload.requests``, else the
    trace's, at least a batch) arriving as the arrivals say; a ConfigError naming the file when a file of arrivals
    holds fewer timestamps than the run serves."""
    w = cfg.workload
    a = w.arrivals
    assert a is not None, "a run with arrivals"
    n = requests_served(trace.num_requests, w.batch_size, "continuous", w.requests)
    times = None
    if a.process == "trace":
        assert a.file is not None, "a trace of arrivals names its file"
        times = read_arrival_times(a.file, a.column)
        if len(times) < n:
            raise ConfigError(
                "workload.arrivals.file",
                f"{a.file} holds {len(times)} timestamps, fewer than the {n} requests the run serves "
                "(set workload.requests)",
            )
    arrivals = arrival_times(a.process, n, a.rate_per_s, a.seed, a.cv, times)
    return ServingBatches(trace, arrivals, w.batch_size, w.max_decode_tokens, w.prefill, w.max_batch_tokens)
