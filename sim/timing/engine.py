"""The SimPy engine: replays a workload's iterations through the compute stream and the copy engine, asking the
policy and the predictor for every decision through the decision protocol (``sim/decisions/protocol.py``, shared
with the validator). It owns time and nothing else.

Per iteration, for each MoE layer of the iteration's phase, on the compute stream:

1. the layer's dense work (attention and the rest, ``CostModel.dense_s``);
2. the gate: the predictor guesses the next layer's experts and the policy picks prefetches, which the copy
   engine serves behind demand copies;
3. the policy's plan: active experts served from the HPC/MPC compute at once (after a device-to-device copy
   into the working arena when the policy says hits are not free); the others compute as their copies land
   (demand copies are issued now; prefetched ones are moved up to demand if still queued), each followed by its
   promotion into the MPC when the plan says so (a device-to-device copy unless the policy copies into slots);
4. the layer finishes: its working buffers are dropped.

After the last layer the LM head runs (``CostModel.lm_head_s``).

Hand-off (a calibrated machine's ``handoff_us``, 0 by default): the host threads that drive copies and compute
take that long to wake up, when the compute stream waits for a copy that lands, and when the idle link is asked
for a copy; ``copy_gap_us`` idles the link between a landed copy and the next queued one
(``sim/timing/copy_engine.py``).
Interference (a calibrated machine's ``compute_slowdown``, ``dense_slowdown`` and ``copy_slowdown``, 1 by default):
expert compute (and dense work and the LM head) that overlaps a copy on the link runs slower, and so
does a copy started while the compute stream computes.

Host costs (a calibrated machine's ``layer_roundtrip_us``, ``copy_issue_us``, ``expert_issue_us`` and
``hit_issue_us``, 0 by default): after each MoE layer's dense work and gate, the compute stream waits one round trip
while the gate's choice reaches the host (nothing of the layer is issued before it); then the host issues the
layer's new copies (the compute stream waits ``copy_issue_us`` per copy); an expert computed from a copy takes at
least ``expert_issue_us`` (the host's time to issue it: the GPU cannot run ahead of it), and the cached experts of
a layer at least ``hit_issue_us`` each. The measured ``dense``/``expert`` tables hold the kernels' own launches.

Software (the run's serving-system profile, ``CostModel.system``; the default ``ideal`` changes nothing): each MoE
layer's ``layer_overhead_us`` is host/framework time the compute stream waits after the layer's dense work and
gate, beside the round trip (nothing of the layer is issued before it); a system's host issue costs replace the
hardware's; each eviction is written back over the link with ``writeback_evicted`` (the copy engine's
``evicted``); with ``copy_stream: serial`` the copy engine starts copies only while the compute stream waits for
one, and the stream resumes when the link is idle again, so that a copy and compute never overlap. Per-expert and
per-copy costs, formats, de-quantization and pageable copies are in the durations (``sim/costs/costs.py``).

Host CPU experts (Fiddler, kTransformers): a policy may have an active expert computed on the host CPU
from its weights in host memory (source ``CPU``, ``LayerStep.cpu``). When the layer's decisions are taken (after
its gate and round trip), the input activations of the tokens routed to at least one of the layer's host experts
(:func:`sim.decisions.protocol.cpu_tokens`) cross the link device->host
(``CostModel.activation_copy_s(tokens, "d2h")``);
the host then computes its experts one after another, each with all its cores (``cpu_expert_s`` of the expert's
tokens), and the outputs cross back host->device (``activation_copy_s(tokens, "h2d")``). Meanwhile the GPU computes
the layer's cached and copied experts; the layer ends when both are done, the GPU's wait for the host counted as
``cpu_wait`` (apart from the copy stall). The host is free when a layer's activations arrive: every layer waits for
its host experts. Assumptions: the activation copies do not queue behind the weight copies (a GPU has a copy
engine per direction, so device->host is separate; that the small host->device activation copy is not delayed by
a weight copy on the same direction is an assumption), they do not slow the weight copies, and the host's compute
neither slows the GPU nor the weight copies (host memory bandwidth shared with the link's DMA is ignored), nor is
it slowed by the host thread issuing copies. A run without host experts is timed exactly as before.
Expert deferral (a system's ``deferral: D``, kTransformers SOSP'25; the rule: sim/core/deferral.py): the host
experts that every token of the layer ranks among its D lowest are computed after the others, beside the next
layer's GPU work; the GPU waits for the others only, the next layer's host work starts after the deferred, and a
layer without host experts (and the LM head) waits for them (:meth:`HostStream.run_deferring`). With D = 0 nothing
changes.

Processes and events (SimPy's public API only, so that other processes may share the environment): the compute
stream (:class:`ComputeStream`) is the run's driver and keeps its own clock (``sim/timing/clock.py``). The copy
engine's landings and its thread's wake-ups are events of that clock (``sim/timing/copy_engine.py``: nothing but
the stream waits on them), which the stream runs in order of time with the environment's events: during each of
its waits, every event due by the wait's end; when it waits for a copy, the events up to the one that lands it.
A wait with nothing due before its end is a float sum (nothing can happen in between), so most compute, and every
copy, costs no SimPy event; the results are those of a process that waits on one timeout per compute beside a copy
engine of timeouts with callbacks (every event due at or before a wait's end runs before the stream goes on). The
environment's other processes run at their own times, the stream's clock never ahead of SimPy's then, and SimPy's
clock is at the stream's at the run's end. The host CPU's work on a layer's experts is known when the layer's
decisions are taken (nothing else uses the host), so its spans are computed then (:class:`HostStream`) and the
compute stream waits for its end like for any compute.

Copies served back to back (:meth:`ComputeStream.runs_back_to_back` says when, in one predicate;
:meth:`ComputeStream.serve_back_to_back` times them): when a layer asks for its demand copies with the link idle,
nothing queued or prefetched, their working buffers free and the environment holding no event, on a machine where
nothing but the queue decides when a copy starts and how long it takes (no hand-off, gap, write-back, serial stream,
slowdown or timeline), the copies run one after another from now whatever the stream does, so their landings are
known when they are asked for: the stream times them without the copy engine's events, and the engine counts them
as if they had run (the same float sums, landings, and peak of working buffers in use).

Requests arriving in time (``workload.arrivals``): the iterations are a :class:`sim.core.serving.ServingBatches`,
which makes each at the stream's time (:meth:`Simulation.serve_loop`); while no request is running and the next has
not arrived, the stream idles until it arrives (:meth:`ComputeStream.idle_until`: one wait, the link going on with
any copy it has, at full speed), and each iteration's end goes back to the scheduler (first tokens, finishes).

Events (``events``): the stream's start, each of its waits (an idle one too), each resumption on a landed copy, and
each landing and wake-up of the copy engine processed (events of other processes are not counted).
"""

from __future__ import annotations

import gc
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import simpy

from sim.core.accounting import IterationTally, iteration_record
from sim.core.deferral import deferred_experts
from sim.core.records import IterationRecord
from sim.core.serving import RequestRecord, ServingBatches
from sim.core.workload import Iteration
from sim.costs.costs import CostModel, Memo
from sim.costs.phase_costs import PhaseCosts
from sim.decisions.protocol import DecisionProtocol, LayerDecision, LayerStep, cpu_tokens
from sim.timing.clock import NEVER, StreamClock
from sim.timing.copy_engine import CopyEngine, CopyJob
from sim.timing.timeline import Timeline
from traces.format import Trace

if TYPE_CHECKING:
    from sim.predictors.base import PredictionScore  # the protocol's score, read from it


@dataclass
class EngineResult:
    iterations: list[IterationRecord]
    sim_time_s: float
    compute_busy_s: float
    link_busy_s: float
    stall_s: float
    copies: int
    prefetch_copies: int
    pcie_bytes: int
    prefetches_issued: int
    prefetches_used: int
    unused_prefetches: int
    wasted_bytes: int
    max_buffers_in_use: int
    events: int
    wall_s: float
    prediction: PredictionScore
    timeline: list | None = field(default=None)
    decisions: list[LayerDecision] | None = field(default=None)  # when the protocol records them
    requests: list[RequestRecord] | None = field(default=None)  # per request served, with arrivals
    cpu_busy_s: float = 0.0  # the host CPU computing experts (source CPU)
    cpu_wait_s: float = 0.0  # the compute stream waiting for the host's experts at the end of a layer
    cpu_experts: int = 0  # expert computations on the host
    upload_bytes: int = 0  # prompt processing: host experts' weights uploaded to the GPU (docs/phases.md)
    upload_s: float = 0.0  # the link's time on those uploads


def host_cost(costs: CostModel, name: str) -> float:
    """A host issue cost: the serving system's when it sets one, else the hardware's (as calibrated)."""
    value = getattr(costs.system, name)
    return getattr(costs.hw, name) if value is None else value


class HostStream:
    """The host CPU computing a layer's host experts: activations to the host, its experts one after another (each
    with all its cores), outputs back. Nothing else uses the host and it is free when a layer's activations arrive,
    so the work is known when it starts: :meth:`run` returns when it ends."""

    def __init__(self, costs: CostModel, trace: Trace, timeline: Timeline | None):
        self.costs, self.trace, self.timeline = costs, trace, timeline
        self.expert_s = Memo(costs.cpu_expert_s)  # tokens -> one expert's compute on the host CPU
        self.layer_s = costs.cpu_layer_s  # a kernel family's one call per MoE layer (0: its calls are per expert)
        self.deferral = costs.system.deferral  # experts per token deferred to the next layer (0: none)
        self.free = 0.0  # with deferral: when the host ends the deferred experts it has been given

    def run(self, now: float, it: Iteration, layer: int, counts, cpu) -> tuple[float, float]:
        """The host side of ``layer`` whose decisions are taken at ``now``: (when the outputs are on the GPU, the
        host's busy seconds)."""
        if self.deferral:
            return self.run_deferring(now, it, layer, counts, cpu)
        costs, tl, expert_s = self.costs, self.timeline, self.expert_s
        n = cpu_tokens(self.trace, it, layer, cpu)
        d2h = costs.activation_copy_s(n, "d2h")
        t = now + d2h
        if tl is not None:
            tl.host(layer, "activations d2h", now, d2h)
        host = self.layer_s
        for e in cpu:
            c = expert_s[counts[e]]
            if tl is not None:
                tl.host(layer, f"E{e} cpu", t + host, c)
            host += c
        h2d = costs.activation_copy_s(n, "h2d")
        if tl is not None:
            tl.host(layer, "activations h2d", t + host, h2d)
        return t + host + h2d, host

    def run_deferring(self, now: float, it: Iteration, layer: int, counts, cpu) -> tuple[float, float]:
        """Expert deferral: the host starts the layer's immediate experts when the activations arrive and it has
        ended the deferred experts it holds (those of the layer before, which ran beside this layer's GPU work);
        the outputs the GPU waits for are the immediate ones; the deferred experts follow at once (their outputs
        join the next layer's, whose immediate experts start after them; the LM head waits for the last:
        :meth:`ComputeStream.lm_head`)."""
        costs, tl, expert_s = self.costs, self.timeline, self.expert_s
        n = cpu_tokens(self.trace, it, layer, cpu)
        d2h = costs.activation_copy_s(n, "d2h")
        t = max(now + d2h, self.free)
        if tl is not None:
            tl.host(layer, "activations d2h", now, d2h)
        later = deferred_experts(self.trace, it.rows, layer, cpu, self.deferral)
        host = self.layer_s
        for e in cpu:
            if e not in later:
                c = expert_s[counts[e]]
                if tl is not None:
                    tl.host(layer, f"E{e} cpu", t + host, c)
                host += c
        deferred_s = 0.0
        for e in cpu:
            if e in later:
                c = expert_s[counts[e]]
                if tl is not None:
                    tl.host(layer, f"E{e} cpu deferred", t + host + deferred_s, c)
                deferred_s += c
        self.free = t + host + deferred_s
        h2d = costs.activation_copy_s(n, "h2d")
        if tl is not None:
            tl.host(layer, "activations h2d", t + host, h2d)
        return t + host + h2d, host + deferred_s


class ComputeStream(StreamClock):
    """The GPU's compute stream: one MoE layer (:meth:`layer`) and the LM head (:meth:`lm_head`), over the copy
    engine ``copy``, on its own clock (:class:`sim.timing.clock.StreamClock`: ``now``, ``wait``). It keeps the current
    iteration's figures (:meth:`start_iteration` resets them): ``busy``, ``stall``, the prefetches ``issued``,
    ``used`` and ``unused``, and the host experts (``cpu_n``, ``cpu_s``, ``cpu_wait``); ``wasted`` bytes and
    ``waits`` (its waits and resumptions) are over the run."""

    def __init__(
        self,
        env: simpy.Environment,
        costs: CostModel,
        copy: CopyEngine,
        protocol: DecisionProtocol,
        trace: Trace,
        timeline: Timeline | None,
        phase: PhaseCosts | None = None,
    ):
        super().__init__(env)
        self.phase = phase  # both phases (sim/costs/phase_costs.py): None prices every layer as before
        self.upload_now = False  # the current pass uploads its host experts to the GPU
        self.host_attention_of: Memo | None = None  # role -> host seconds of attention (kv_on_host)
        self.upload_bytes, self.upload_s = 0, 0.0
        self.costs, self.copy, self.protocol = costs, copy, protocol
        copy.clock = self  # the copy engine's requests come at the stream's time
        # bound once: what each layer and each copy calls
        self._decide, self._release, self._wait_copy = protocol.decide, copy.release, self.wait_copy
        self.timeline = timeline
        self.host = HostStream(costs, trace, timeline)
        self.roles = [x.role for x in trace.meta.model.layers]
        hw, system = costs.hw, costs.system
        expert_bytes = self.expert_bytes = costs.expert_bytes
        d2d = costs.d2d_s(expert_bytes)
        self.hit_d2d = d2d if protocol.hit_d2d else 0.0
        self.promote_d2d = 0.0 if protocol.promotion_is_free else d2d
        self.slow, self.dense_slow = hw.compute_slowdown, hw.dense_slowdown
        self.slowed = self.slow != 1.0 or self.dense_slow != 1.0
        self.handoff = hw.handoff_s
        self.serial = system.serial
        self.writeback = system.writeback_evicted
        self.roundtrip = host_cost(costs, "layer_roundtrip_s")
        if system.layer_overhead_s:  # the framework's time per layer, beside the round trip
            self.roundtrip = self.roundtrip + system.layer_overhead_s
        self.copy_issue, self.expert_issue = host_cost(costs, "copy_issue_s"), host_cost(costs, "expert_issue_s")
        self.hit_issue = host_cost(costs, "hit_issue_s")
        self.expert_of = Memo(costs.expert_s)  # tokens -> one expert's compute
        #: a one-token iteration (``one_token``, set by start_iteration) whose step has top-k active experts routes
        #: one token to each: the compute of n cached ones, one after another, is ``one_each[n]`` (resident_time's
        #: sum of n equal terms)
        self.one_token, self.top_k = False, trace.top_k
        self.one_each = [0.0]
        for _ in range(trace.top_k):
            self.one_each.append(self.one_each[-1] + (self.expert_of[1] + self.hit_d2d))
        self.lm_head_of = Memo(costs.lm_head_s)  # tokens -> the LM head over them
        self.jobs: dict[
            tuple[int, int], CopyJob
        ] = {}  # (layer, expert) -> the CopyJob of a prefetch not yet used or dropped
        self.wasted = 0  # bytes of unused prefetches that crossed the link
        self.dense_of: Memo | None = None  # role -> the dense work of a layer of the iteration (start_iteration)
        # copies may run back to back without events (``runs_back_to_back``): a plain copy engine, and nothing that
        # reads the copy on the link while the stream computes (slowdowns stretch compute by it)
        self.plain = copy.plain and not self.slowed and not self.handoff

    # ------------------------------------------------------------------------------------------------ time
    def stretch(self, t: float, slow: float) -> float:
        """Compute of ``t`` seconds started now, slowed by ``slow`` while it overlaps a copy: the whole of it when
        more copies are queued, else only until the copy on the link lands."""
        copy = self.copy
        job = copy.current
        if job is None:
            return t
        if copy.demand or copy.prefetch:
            return t * slow
        left = job.end - self.now
        return t * slow if left >= t * slow else left + (t - left / slow)

    def wait_copy(self, ready: deque) -> None:
        """The stream stalls until the layer's next copy has landed in ``ready`` (serial: and the link is idle
        again, the copies started meanwhile: one stream), waiting on the copy engine's events one by one, so that it
        goes on at the time of the one that lands it; then its host thread wakes up to it (the hand-off)."""
        copy, run_next = self.copy, self.run_next
        t = t0 = self.now
        copy.computing = False
        idle = self.serial
        if idle:
            copy.kick()
        while not ready or (idle and (copy.current is not None or copy.waking)):
            t = run_next()  # the copy engine's next event (the environment's due by then first)
        self.now = t
        self.waits += 1  # the stream resumes
        if self.handoff:
            self.wait(self.handoff)
        copy.computing = True
        self.stall += self.now - t0

    def wait_host(self, done: float) -> None:
        """The stream waits for the layer's host experts (``done``)."""
        w = done - self.now
        if w <= 0:
            return
        if self.serial:  # one stream: no copy starts while it waits for the host
            self.wait(w)
        else:
            self.copy.computing = False
            self.wait(w)
            self.copy.computing = True
        self.cpu_wait += w

    # ------------------------------------------------------------------------------------------- one layer
    def start_iteration(self, it: Iteration) -> None:
        """Reset the iteration's figures; the dense work of its layers, per role."""
        self.busy = self.stall = self.cpu_wait = self.cpu_s = 0.0
        self.cpu_n = self.issued = self.unused = self.used = 0
        n_tok, costs, phase = int(it.rows.size), self.costs, self.phase
        self.one_token = n_tok == 1
        if phase is None:
            self.dense_of = Memo(lambda role: costs.dense_s(role, n_tok, it.context))
        else:
            self.dense_of = Memo(lambda role: phase.dense_s(role, n_tok, it.context)[0])
            self.host_attention_of = Memo(lambda role: phase.dense_s(role, n_tok, it.context)[1])
            self.upload_now = phase.uploads(it)

    def layer(self, step: LayerStep) -> None:
        """One MoE layer: dense work and gate, the host's round trip, the decisions, then its experts."""
        layer, tl = step.layer, self.timeline
        dense_of = self.dense_of
        assert dense_of is not None, "start_iteration comes first"
        dense = dense_of[self.roles[layer]]
        if self.slowed:
            dense = self.stretch(dense, self.dense_slow)
        if tl is not None:
            tl.dense(layer, self.now, dense)
        self.work(dense)
        self.busy += dense
        if self.host_attention_of is not None:
            self.host_attention(layer)
        if self.roundtrip:  # the gate's choice reaches the host before anything of the layer is issued
            self.wait(self.roundtrip)
        self.decide(step)
        resident_s = self.resident_time(step)
        cpu = step.cpu
        if cpu and self.upload_now:  # prompt processing: the host experts' weights go to the GPU instead
            self.upload(step)
            cpu = ()
        if cpu:  # the host's side starts now, beside the GPU's
            cpu_done, host_s = self.host.run(self.now, step.iteration, layer, step.counts, cpu)
            self.cpu_s += host_s
            self.cpu_n += len(cpu)
        copied = step.copied
        asked = None  # when the layer's copies were asked for, if they run back to back (no event needed)
        if copied or step.prefetch:
            if not step.prefetch and self.runs_back_to_back(step):  # (a step that prefetches never does)
                asked = self.now
                new_copies = len(copied)
            else:
                new_copies = self.issue_copies(step)
            if self.copy_issue and new_copies:  # the host issues the copies before the layer's experts
                self.wait(self.copy_issue * new_copies)
        if resident_s:
            if self.slowed:
                resident_s = self.stretch(resident_s, self.slow)
            if self.hit_issue:
                resident_s = max(resident_s, self.hit_issue * len(step.resident))
            self.work(resident_s)
            self.busy += resident_s
        if copied:
            if asked is None:
                self.copied_experts(step)
            else:
                self.serve_back_to_back(step, asked)
        if cpu:
            self.wait_host(cpu_done)
        elif self.host.deferral:  # the layer before's deferred experts join this layer's output
            self.wait_host(self.host.free)

    def host_attention(self, layer: int) -> None:
        """-nkvo: the layer's attention over the context on the host CPU, the stream waiting for it."""
        assert self.host_attention_of is not None
        h = self.host_attention_of[self.roles[layer]]
        if h:
            if self.timeline is not None:
                self.timeline.host(layer, "attention", self.now, h)
            self.wait(h)
            self.cpu_s += h

    def upload(self, step: LayerStep) -> None:
        """A prompt pass at or above the threshold: the layer's host experts' weights cross the link as one copy,
        then the GPU computes them (serial: docs/phases.md); the stream stalls for the copy."""
        phase = self.phase
        assert phase is not None
        nbytes = phase.upload_bytes(len(step.cpu), len(step.resident) + len(step.copied))
        t = phase.upload_copy_s(nbytes)
        self.wait(t)
        self.stall += t
        self.upload_bytes += nbytes
        self.upload_s += t
        expert_of, counts = self.expert_of, step.counts
        gpu = 0.0
        for e in step.cpu:
            gpu += expert_of[counts[e]]
        if self.timeline is not None:
            self.timeline.host(step.layer, "upload", self.now - t, t)
        self.wait(gpu)
        self.busy += gpu

    def decide(self, step: LayerStep) -> None:
        """The layer's decisions (evictions written back, with a system that does), and its unused prefetches
        dropped."""
        if self.writeback:
            counters = self.protocol.counters
            evictions = counters.evictions
            self._decide(step)
            self.copy.evicted(counters.evictions - evictions)
        else:
            self._decide(step)
        if step.plan.unused_prefetch:
            self.drop_unused(step)

    def drop_unused(self, step: LayerStep) -> None:
        """The copies of the layer's unused prefetches are dropped (their bytes wasted if they started)."""
        unused = step.plan.unused_prefetch
        jobs, drop, layer = self.jobs, self.copy.drop, step.layer
        for e in unused:
            job = jobs.pop((layer, e))
            if job.started:
                self.wasted += self.expert_bytes
            drop(job)
        self.unused += len(unused)

    def resident_time(self, step: LayerStep) -> float:
        """The compute of the layer's cached experts, one after another from now (each after its copy into the
        working arena when hits are not free)."""
        resident_s, tl = 0.0, self.timeline
        expert_of, counts, hit_d2d = self.expert_of, step.counts, self.hit_d2d
        if tl is None:
            if self.one_token and len(counts) == self.top_k:  # one token on top-k experts: one each
                return self.one_each[len(step.resident)]
            for e in step.resident:
                resident_s += expert_of[counts[e]] + hit_d2d
            return resident_s
        now, sources = self.now, step.plan.sources
        for e in step.resident:
            t = expert_of[counts[e]] + hit_d2d
            tl.expert(step.layer, e, sources[e], now + resident_s, t)
            resident_s += t
        return resident_s

    def issue_copies(self, step: LayerStep) -> int:
        """The layer's demand copies (a queued prefetch it needs moves up), then the next layer's prefetches, so
        that an idle link starts a copy this layer waits for; returns the copies submitted."""
        prefetch = step.prefetch
        new_copies, used = self.copy.submit_layer(step.layer, step.copied, self.jobs, step.next_layer, prefetch)
        self.used += used
        self.issued += len(prefetch)
        return new_copies

    def runs_back_to_back(self, step: LayerStep) -> bool:
        """Whether the layer's demand copies, asked for now, run one after another from now whatever the stream
        does (each starting as the one before lands), so that :meth:`serve_back_to_back` may time them without the
        copy engine's events: a machine where nothing but the queue decides when a copy starts and how long it
        takes (``plain``: no hand-off, gap, write-back, serial stream, slowdown or timeline), no prefetch asked now
        or held from before, the environment holding no event, and the link idle with nothing queued and a
        working buffer free for each copy."""
        queue = self.copy.queue
        return (
            self.plain
            and not step.prefetch
            and not self.jobs
            and self.env_next == NEVER
            and self.copy.current is None
            and not queue.demand
            and not queue.prefetch
            and len(queue.free) >= len(step.copied)
        )

    def serve_back_to_back(self, step: LayerStep, asked: float) -> None:
        """:meth:`copied_experts` for copies served back to back (:meth:`runs_back_to_back`), asked for at
        ``asked``: each lands one copy time after the one before (the first after
        ``asked``: the float sums its landing event would hold), in the order asked for. The same times, sums and
        counts as the copy engine's events give, without them (nothing else waits on them: no prefetch is queued
        or held, and the environment has nothing to come). The stream stalls for a copy that has not landed by its
        time; a working buffer is free again when its expert has computed."""
        counts, expert_of, promote = step.counts, self.expert_of, step.plan.promote
        promote_d2d, expert_issue, copy = self.promote_d2d, self.expert_issue, self.copy
        copy_s = copy.copy_s
        now, land = self.now, asked
        lands, ends = [], []  # each copy's landing, and when its expert's buffer was released
        for e, _ in step.copied:
            land = land + copy_s
            lands.append(land)
            if land > now:  # not landed yet (one landing at the very end of a wait has): the stream stalls
                self.waits += 1
                self.stall += land - now
                now = land
            t = expert_of[counts[e]]
            if e in promote:
                t += promote_d2d
            if expert_issue:
                t = max(t, expert_issue)
            self.waits += 1
            now = now + t
            self.busy += t
            ends.append(now)
        self.now = now
        queue = copy.queue
        held = queue.capacity - len(queue.free)  # before the run
        peak = held + len(lands)  # a bound of the buffers in use as one started: exact only if it can matter
        if peak > queue.max_in_use:
            peak = self.buffers_peak(held, lands, ends)
        copy.served(len(lands), peak)

    @staticmethod
    def buffers_peak(held: int, lands: list[float], ends: list[float]) -> int:
        """The most working buffers in use as one of a back-to-back run's copies started, ``held`` before it: the
        ``i``-th (``i`` > 0) starts as the one before lands, after the buffers released strictly before then (a
        landing at the very end of a compute runs before the buffer of that compute is released)."""
        peak, released = held + 1, 0
        for i in range(1, len(lands)):
            start = lands[i - 1]
            while released < i - 1 and ends[released] < start:
                released += 1
            peak = max(peak, held + i + 1 - released)
        return peak

    def copied_experts(self, step: LayerStep) -> None:
        """Each copied expert computes as soon as its copy lands, in landing order (then its promotion into the
        MPC, a device copy unless promotion is free), and frees its working buffer."""
        copy, tl, layer = self.copy, self.timeline, step.layer
        ready = copy.ready.get(layer)
        if ready is None:
            ready = copy.ready[layer] = deque()
        promote, counts, expert_of = step.plan.promote, step.counts, self.expert_of
        serial, slowed, expert_issue, promote_d2d = self.serial, self.slowed, self.expert_issue, self.promote_d2d
        wait_copy, queue = self._wait_copy, copy.queue
        handoff, free, capacity = self.handoff, queue.free, queue.capacity
        for _ in step.copied:
            if serial:
                if not ready or copy.busy:
                    wait_copy(ready)
            elif not ready:  # wait_copy, inline (once per copy): the stream stalls until the next copy lands
                t0 = self.now
                copy.computing = False
                while not ready:  # the copy engine's next event, the environment's due by then first
                    t = self.due
                    if self.env_next <= t:  # (or none is pending: run_next names the deadlock)
                        t = self.run_next()
                    else:  # run_own, inline (once per copy)
                        callback = self._callback
                        assert callback is not None, "an own event is pending"
                        self._callback, self.due = None, NEVER
                        callback()
                self.now = t
                self.waits += 1
                if handoff:
                    self.wait(handoff)
                copy.computing = True
                self.stall += self.now - t0
            job = ready.popleft()
            e = job.expert
            t = expert_of[counts[e]]
            if e in promote:
                t += promote_d2d
            if slowed:
                t = self.stretch(t, self.slow)
            if expert_issue:
                t = max(t, expert_issue)
            if tl is not None:
                tl.expert(layer, e, "copied", self.now, t)
            self.waits += 1  # work(t), inline (once per copy)
            end = self.now + t
            if self.due <= end or self.env_next <= end:
                self.run_until(end)
            self.now = end
            self.busy += t
            # the copy engine's release of the job's buffer, inline (once per copy)
            if len(free) >= capacity:
                raise AssertionError("working buffer released twice")
            assert job.buffer is not None  # a landed copy holds a buffer
            free.append((job.buffer, None))
            if copy.current is None and not copy.waking and (handoff or queue.demand or queue.prefetch):
                copy._wake(end)

    def lm_head(self, it: Iteration) -> None:
        """The LM head closes the iteration: over every generated token, or each prefilled request's last."""
        if self.host.deferral:  # the last layer's deferred experts join its output before the LM head
            self.wait_host(self.host.free)
        lm = self.lm_head_of[it.lm_head_tokens]
        if lm and self.slowed:
            lm = self.stretch(lm, self.dense_slow)
        if lm:
            if self.timeline is not None:
                self.timeline.lm_head(self.now, lm)
            self.wait(lm)
            self.busy += lm

    def idle_until(self, t: float) -> None:
        """Nothing to compute until ``t`` (no request is running and the next arrives then): every event due by
        then runs (a copy on the link goes on, unslowed), then the stream is at ``t``."""
        if t <= self.now:
            return
        self.waits += 1
        if not self.serial:
            self.copy.computing = False
        if self.due <= t or self.peek() <= t:
            self.run_until(t)
        self.now = t
        if not self.serial:
            self.copy.computing = True


class RunTotals:
    """The run's sums of the compute stream's per-iteration figures (each added once per iteration)."""

    def __init__(self):
        self.busy = self.stall = self.cpu_busy = self.cpu_wait = 0.0
        self.issued = self.used = self.unused = self.cpu_n = 0

    def add(self, s: ComputeStream) -> None:
        self.cpu_wait += s.cpu_wait
        self.cpu_busy += s.cpu_s
        self.cpu_n += s.cpu_n
        self.busy += s.busy
        self.stall += s.stall
        self.issued += s.issued
        self.unused += s.unused
        self.used += s.used


#: The oldest generation's threshold while a run's layer loop runs (``full_collections_deferred``).
DEFERRED_FULL_COLLECTIONS = 1_000_000


@contextmanager
def full_collections_deferred():
    """Python's full garbage collections (of the oldest generation) put off while the body runs, its young ones
    as usual; the thresholds as they were after it. A run's loop frees what it makes by reference counting (it
    makes no garbage cycles: ``tests/sim/timing/test_engine_gc.py``) but keeps growing what it keeps (each step's
    records, the predictor's guesses), and each time that has grown by a quarter Python walks every object of the
    process again: about 7% of a run with the transition predictor. Cycles made young still go at once."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, max(old, DEFERRED_FULL_COLLECTIONS))
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)


class Simulation:
    """One run: a trace, its iterations, the decision protocol that asks its policy and predictor, and a cost model.

    ``check_invariants``: the protocol's full tier check after every layer, and the working buffers within their
    number (tests)."""

    def __init__(
        self,
        trace: Trace,
        iterations: list[Iteration] | ServingBatches,
        protocol: DecisionProtocol,
        costs: CostModel,
        lpc_buffers: int,
        prefetch_reserve: int = 1,
        timeline: bool = False,
        progress=None,
        check_invariants: bool = False,
        phase: PhaseCosts | None = None,
    ):
        self.trace = trace
        self.phase = phase  # both phases (sim/costs/phase_costs.py); None: as before
        self.iterations = iterations
        self.protocol = protocol
        self.costs = costs
        self.lpc_buffers = lpc_buffers
        self.prefetch_reserve = prefetch_reserve
        self.timeline = Timeline() if timeline else None
        self.progress = progress
        self.check_invariants = check_invariants
        self.roles = [x.role for x in trace.meta.model.layers]
        # built by setup(): the SimPy environment, the copy engine, the compute stream
        self.env: simpy.Environment | None = None
        self.copy: CopyEngine | None = None
        self.stream: ComputeStream | None = None

    def _check(self, _policy=None) -> None:
        """The full invariant check after a layer: the tiers, and the working buffers within their number."""
        self.protocol.check_tiers()
        assert self.copy is not None, "setup() comes first"
        if not 0 <= self.copy.queue.in_use <= self.copy.queue.capacity:
            raise AssertionError("working buffers over capacity")

    def setup(self, env: simpy.Environment | None = None) -> simpy.Environment:
        """The run's environment (a new one, or ``env`` with other processes of its own), its copy engine and
        compute stream, and the protocol's check after each layer (with ``check_invariants``)."""
        env = self.env = env if env is not None else simpy.Environment()
        costs, system, hw = self.costs, self.costs.system, self.costs.hw
        nbytes = costs.expert_bytes
        writeback = costs.writeback_s(nbytes) if system.writeback_evicted else 0.0
        copy = self.copy = CopyEngine(
            env,
            costs.copy_s(nbytes),
            nbytes,
            self.lpc_buffers,
            self.prefetch_reserve,
            self.timeline,
            hw.copy_slowdown,
            hw.handoff_s,
            hw.copy_gap_s,
            writeback,
            system.serial,
        )
        if self.check_invariants:
            self.protocol.after_step = self._check
        self.stream = ComputeStream(env, costs, copy, self.protocol, self.trace, self.timeline, self.phase)
        return env

    def layer_loop(self, records: list[IterationRecord], totals: RunTotals) -> None:
        """Every iteration's MoE layers of its phase, then its LM head, on the compute stream; one record per
        iteration."""
        stream, protocol, progress = self.stream, self.protocol, self.progress
        assert stream is not None and protocol is not None and self.copy is not None, "setup() comes first"
        tally = IterationTally(self.protocol.counters, self.copy)
        stream.sync()  # the environment's next event as the run starts; only the stream's clock runs it from here
        iterations = self.iterations
        if isinstance(iterations, ServingBatches):
            self.serve_loop(iterations, tally, records, totals)
        else:
            for it in iterations:
                self.iteration(it, tally, records, totals)
                if progress is not None:
                    progress(it.index + 1, len(iterations))
        stream.wait(0.0)  # the copy events due at the last instant run before the stream ends
        stream.catch_up()  # SimPy's clock at the run's end

    def iteration(self, it: Iteration, tally: IterationTally, records: list[IterationRecord], totals: RunTotals):
        """One iteration on the compute stream: its MoE layers, then its LM head; its record."""
        stream, protocol = self.stream, self.protocol
        assert stream is not None and protocol is not None, "setup() comes first"
        t_start = stream.now
        tally.begin()
        stream.start_iteration(it)
        for step in protocol.steps(it):
            stream.layer(step)
        stream.lm_head(it)
        records.append(
            iteration_record(
                it,
                int(it.rows.size),
                t_start,
                stream.now,
                stream.stall,
                tally.counts(stream.issued, stream.unused),
                stream.cpu_n,
                stream.cpu_s,
                stream.cpu_wait,
            )
        )
        totals.add(stream)

    def serve_loop(
        self, batches: ServingBatches, tally: IterationTally, records: list[IterationRecord], totals: RunTotals
    ) -> None:
        """Requests arriving in time: each iteration as the scheduler makes it at the stream's time, the stream
        idle while no request is running and the next has not arrived."""
        stream, progress = self.stream, self.progress
        assert stream is not None, "setup() comes first"
        while True:
            nxt = batches.next(stream.now)
            if nxt is None:
                break
            if isinstance(nxt, float):
                stream.idle_until(nxt)
                continue
            start = stream.now
            self.iteration(nxt, tally, records, totals)
            batches.done(nxt, start, stream.now)
            if progress is not None:
                progress(batches.finished, batches.total)
        if self.timeline is not None:
            for rec in batches.records:
                self.timeline.request(rec)

    def run(self, env: simpy.Environment | None = None) -> EngineResult:
        """Simulate the run (in ``env`` if given: other processes there run beside it, as long as the stream
        does)."""
        wall0 = time.perf_counter()
        env = self.setup(env)
        records: list[IterationRecord] = []
        totals = RunTotals()
        with full_collections_deferred():
            self.layer_loop(records, totals)
        copy, stream, protocol = self.copy, self.stream, self.protocol
        assert copy is not None and stream is not None and protocol.score is not None, "a protocol that scores"
        return EngineResult(
            iterations=records,
            sim_time_s=stream.now,
            compute_busy_s=totals.busy,
            link_busy_s=copy.busy_s + stream.upload_s,
            stall_s=totals.stall,
            copies=copy.copies,
            prefetch_copies=copy.prefetch_copies,
            pcie_bytes=copy.pcie_bytes + stream.upload_bytes,
            prefetches_issued=totals.issued,
            prefetches_used=totals.used,
            unused_prefetches=totals.unused,
            wasted_bytes=stream.wasted,
            max_buffers_in_use=copy.max_in_use,
            events=1 + stream.waits + copy.events,
            wall_s=time.perf_counter() - wall0,
            prediction=protocol.score,
            timeline=None if self.timeline is None else self.timeline.spans,
            decisions=protocol.decisions,
            cpu_busy_s=totals.cpu_busy,
            cpu_wait_s=totals.cpu_wait,
            cpu_experts=totals.cpu_n,
            upload_bytes=stream.upload_bytes,
            upload_s=stream.upload_s,
            requests=self.iterations.records if isinstance(self.iterations, ServingBatches) else None,
        )
