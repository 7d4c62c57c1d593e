"""The SimPy engine: replays a workload's iterations through the compute stream and the copy engine, asking the
policy and the predictor for every decision through the decision protocol (``sim/protocol.py``, shared with the
validator). It owns time and nothing else.

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
for a copy; ``copy_gap_us`` idles the link between a landed copy and the next queued one (``sim/copy_engine.py``).
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
per-copy costs, formats, de-quantization and pageable copies are in the durations (``sim/costs.py``).

Host CPU experts (issue 13; Fiddler, kTransformers): a policy may have an active expert computed on the host CPU
from its weights in host memory (source ``CPU``, ``LayerStep.cpu``). When the layer's decisions are taken (after
its gate and round trip), the input activations of the tokens routed to at least one of the layer's host experts
(:func:`sim.protocol.cpu_tokens`) cross the link device->host (``CostModel.activation_copy_s(tokens, "d2h")``);
the host then computes its experts one after another, each with all its cores (``cpu_expert_s`` of the expert's
tokens), and the outputs cross back host->device (``activation_copy_s(tokens, "h2d")``). Meanwhile the GPU computes
the layer's cached and copied experts; the layer ends when both are done, the GPU's wait for the host counted as
``cpu_wait`` (apart from the copy stall). The host is free when a layer's activations arrive: every layer waits for
its host experts. Assumptions: the activation copies do not queue behind the weight copies (a GPU has a copy
engine per direction, so device->host is separate; that the small host->device activation copy is not delayed by
a weight copy on the same direction is an assumption), they do not slow the weight copies, and the host's compute
neither slows the GPU nor the weight copies (host memory bandwidth shared with the link's DMA is ignored), nor is
it slowed by the host thread issuing copies. A run without host experts is timed exactly as before.

Events are coarse: one per copy, one per expert compute that waits on a copy, one for the dense work and one for
all cached experts of a layer together. They are numbered and ordered as SimPy numbers its events (``env._eid``),
so the ``events`` count is SimPy's; only the copy engine's landings and wake-ups sit on SimPy's event heap, as
light entries this engine steps by hand (``sim/copy_engine.py``), and the compute stream is plain code.
"""

from __future__ import annotations

import time
from collections import deque
from heapq import heappop
from dataclasses import dataclass, field

import simpy

from sim.cache import HPC, LPC, MPC
from sim.copy_engine import CopyEngine
from sim.costs import CostModel, Memo
from sim.policies.base import Policy
from sim.records import IterationRecord
from sim.predictors.base import PredictionScore, Predictor
from sim.protocol import DecisionProtocol, LayerDecision, cpu_tokens
from sim.workload import Iteration, phase_layers
from traces.format import Trace


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
    decisions: list[LayerDecision] | None = field(default=None)   # with record_decisions
    cpu_busy_s: float = 0.0      # the host CPU computing experts (source CPU)
    cpu_wait_s: float = 0.0      # the compute stream waiting for the host's experts at the end of a layer
    cpu_experts: int = 0         # expert computations on the host


def _events_processed(env: simpy.Environment) -> int:
    """Events SimPy has processed: it numbers every scheduled event (``_eid``, a counter); the ones still queued
    were not processed. Reading the counter once at the end costs nothing during the run."""
    return next(env._eid) - len(env._queue)


class Simulation:
    """One run: a trace, its iterations, a policy, a predictor and a cost model."""

    def __init__(self, trace: Trace, iterations: list[Iteration], policy: Policy, predictor: Predictor,
                 costs: CostModel, lpc_buffers: int, prefetch_reserve: int = 1, timeline: bool = False,
                 progress=None, check_invariants: bool = False, record_decisions: bool = False):
        self.trace = trace
        self.iterations = iterations
        self.policy = policy
        self.predictor = predictor
        self.costs = costs
        self.lpc_buffers = lpc_buffers
        self.prefetch_reserve = prefetch_reserve
        self.timeline = [] if timeline else None
        self.progress = progress
        self.check_invariants = check_invariants  # full tier check after every layer (tests)
        self.record_decisions = record_decisions  # keep every step's LayerDecision (the validator compares them)
        self.roles = [x.role for x in trace.meta.model.layers]
        self.phase_layers = phase_layers(trace)

    def _check(self, policy: Policy) -> None:
        """The full invariant check after a layer: the tiers, and the working buffers within their number."""
        policy.cache.check()
        if not 0 <= self.copy.queue.in_use <= self.copy.queue.capacity:
            raise AssertionError("working buffers over capacity")

    def run(self) -> EngineResult:
        wall0 = time.perf_counter()
        env = simpy.Environment()
        costs, policy, predictor = self.costs, self.policy, self.predictor
        expert_bytes = costs.expert_bytes
        system = costs.system
        serial = system.serial
        writeback = costs.writeback_s(expert_bytes) if system.writeback_evicted else 0.0
        copy = self.copy = CopyEngine(env, costs.copy_s(expert_bytes), expert_bytes, self.lpc_buffers,
                                      self.prefetch_reserve, self.timeline, costs.hw.copy_slowdown,
                                      costs.hw.handoff_s, costs.hw.copy_gap_s, writeback, serial)
        handoff = costs.hw.handoff_s
        def stretch(t: float, slow: float) -> float:
            """Compute of ``t`` seconds started now, slowed by ``slow`` while it overlaps a copy: the whole of it
            when more copies are queued, else only until the copy on the link lands."""
            job = copy.current
            if job is None:
                return t
            if copy.demand or copy.prefetch:
                return t * slow
            left = job.end - env._now
            return t * slow if left >= t * slow else left + (t - left / slow)
        d2d = costs.d2d_s(expert_bytes)
        expert_s = costs.expert_s
        tl = self.timeline
        score = PredictionScore(len(self.roles))
        records: list[IterationRecord] = []
        totals = {"busy": 0.0, "stall": 0.0, "issued": 0, "used": 0, "unused": 0, "wasted": 0,
                  "cpu_busy": 0.0, "cpu_wait": 0.0, "cpu_n": 0}
        counters = policy.cache.counters

        protocol = self.protocol = DecisionProtocol(self.trace, policy, predictor, score, self.record_decisions,
                                                    self._check if self.check_invariants else None)

        # The compute stream is the only process, so it runs as plain code: a wait (``advance``) first runs every
        # event SimPy would run before ``yield env.timeout(dt)`` resumes it (copy landings, the copy thread's
        # wake-ups: keys below the timeout's (time, priority, id)), then moves the clock to ``now + dt``, the same
        # float sum the timeout makes. Each wait still draws its event id, so ties and the events count are as with
        # one SimPy event per wait. Every heap entry has SimPy's NORMAL priority and an older id than the wait's,
        # so "below the wait's key" is "due at or before ``now + dt``".
        queue, eids = env._queue, env._eid

        def advance(dt: float) -> None:
            t = env._now + dt
            next(eids)
            while queue and queue[0][0] <= t:
                env._now, _, _, callback = heappop(queue)
                callback()
            env._now = t

        def compute_stream():
            submit, release, upgrade, drop = copy.submit, copy.release, copy.upgrade, copy.drop
            # while a copy is on the link (or the copy thread wakes up), a submission only queues, and a freed
            # buffer wakes the copy thread only when it is idle with copies queued (or a hand-off to pay): else
            # the copy queue's own calls do all that CopyEngine.submit/release would
            queue_submit, queue_release = copy.queue.submit, copy.queue.release
            hit_d2d = d2d if policy.hit_d2d else 0.0
            promote_d2d = 0.0 if policy.promotion_is_free else d2d
            slow, dense_slow = costs.hw.compute_slowdown, costs.hw.dense_slowdown
            slowed = slow != 1.0 or dense_slow != 1.0
            hw = costs.hw
            def host_cost(name: str) -> float:
                """A host issue cost: the system's when it sets one, else the hardware's (as calibrated)."""
                value = getattr(system, name)
                return getattr(hw, name) if value is None else value
            roundtrip, copy_issue = host_cost("layer_roundtrip_s"), host_cost("copy_issue_s")
            expert_issue, hit_issue = host_cost("expert_issue_s"), host_cost("hit_issue_s")
            if system.layer_overhead_s:
                roundtrip = roundtrip + system.layer_overhead_s
            roles, decide = self.roles, protocol.decide
            copy_ready = copy.ready
            expert_of = Memo(expert_s)  # tokens -> one expert's compute
            trace = self.trace
            cpu_of = Memo(costs.cpu_expert_s)  # tokens -> one expert's compute on the host CPU

            def host_experts(it, layer, counts, cpu) -> float:
                """The host side of a layer whose decisions are taken now: activations to the host, its experts
                one after another, outputs back. Returns when the outputs are on the GPU, and the host's busy time."""
                n = cpu_tokens(trace, it, layer, cpu)
                d2h = costs.activation_copy_s(n, "d2h")
                t0 = env._now
                t = t0 + d2h
                if tl is not None:
                    tl.append(("cpu", f"L{layer} activations d2h", t0, d2h))
                host = 0.0
                for e in cpu:
                    c = cpu_of[counts[e]]
                    if tl is not None:
                        tl.append(("cpu", f"L{layer} E{e} cpu", t + host, c))
                    host += c
                h2d = costs.activation_copy_s(n, "h2d")
                if tl is not None:
                    tl.append(("cpu", f"L{layer} activations h2d", t + host, h2d))
                return t + host + h2d, host

            def wait_host(done: float) -> float:
                """The compute stream waits for the layer's host experts (``done``); returns the wait."""
                w = done - env._now
                if w <= 0:
                    return 0.0
                if serial:  # one stream: no copy starts while it waits for the host
                    advance(w)
                    return w
                copy.computing = False
                advance(w)
                copy.computing = True
                return w
            for it in self.iterations:
                t_start = env._now
                stall = busy = 0.0
                cpu_wait = cpu_s = 0.0
                cpu_n = 0
                before = (dict(counters.hits), counters.misses, copy.copies, counters.promotions, counters.evictions)
                issued = unused = used = 0
                jobs = {}
                n_tok = int(it.rows.size)
                # role -> the dense work of one MoE layer of this iteration
                dense_of = Memo(lambda role: costs.dense_s(role, n_tok, it.context))
                for step in protocol.steps(it):
                    layer, counts = step.layer, step.counts
                    dense = dense_of[roles[layer]]
                    if slowed:
                        dense = stretch(dense, dense_slow)
                    if tl is not None:
                        tl.append(("compute", f"L{layer} dense", env._now, dense))
                    end = env._now + dense   # advance(dense), inline
                    next(eids)
                    while queue and queue[0][0] <= end:
                        env._now, _, _, callback = heappop(queue)
                        callback()
                    env._now = end
                    busy += dense
                    if roundtrip:  # the gate's choice reaches the host before anything of the layer is issued
                        advance(roundtrip)
                    if writeback:
                        evictions = counters.evictions
                        decide(step)
                        copy.evicted(counters.evictions - evictions)
                    else:
                        decide(step)
                    plan = step.plan
                    if plan.unused_prefetch:
                        for e in plan.unused_prefetch:
                            job = jobs.pop((layer, e))
                            if job.started:
                                totals["wasted"] += expert_bytes
                            drop(job)
                            unused += 1
                    resident_s = 0.0
                    resident = step.resident
                    for e in resident:
                        t = expert_of[counts[e]] + hit_d2d
                        if tl is not None:
                            tl.append(("compute", f"L{layer} E{e} {plan.sources[e]}", env._now + resident_s, t))
                        resident_s += t
                    cpu = step.cpu
                    if cpu:  # the host's side starts now, beside the GPU's
                        cpu_done, host_s = host_experts(it, layer, counts, cpu)
                        cpu_s += host_s
                        cpu_n += len(cpu)
                    new_copies = 0
                    copied = step.copied
                    for e, src in copied:
                        if src == LPC:
                            upgrade(jobs.pop((layer, e)))
                            used += 1
                        else:
                            if copy.current is None and not copy.waking:
                                submit(layer, e, False)
                            else:
                                queue_submit(layer, e, False)
                            new_copies += 1
                    # prefetches reach the copy engine after this layer's demand copies, so that an idle link
                    # starts a copy this layer waits for, not one for the next layer
                    if step.prefetch:
                        nxt = step.next_layer
                        for e in step.prefetch:
                            jobs[(nxt, e)] = submit(nxt, e, True)
                            issued += 1
                            new_copies += 1
                    if copy_issue and new_copies:  # the host issues the copies before the layer's experts
                        advance(copy_issue * new_copies)
                    if resident_s:
                        if slowed:
                            resident_s = stretch(resident_s, slow)
                        if hit_issue:
                            resident_s = max(resident_s, hit_issue * len(resident))
                        end = env._now + resident_s   # advance(resident_s), inline
                        next(eids)
                        while queue and queue[0][0] <= end:
                            env._now, _, _, callback = heappop(queue)
                            callback()
                        env._now = end
                        busy += resident_s
                    if not copied:
                        if cpu:
                            cpu_wait += wait_host(cpu_done)
                        continue
                    ready = copy_ready.get(layer)
                    if ready is None:
                        ready = copy_ready[layer] = deque()
                    promote = plan.promote
                    for _ in copied:   # each copied expert computes as soon as its copy lands, in landing order
                        if serial and (not ready or copy.current is not None or copy.waking):
                            # one stream: the copies run now, all of them, and the stream resumes on an idle link
                            t0 = env._now
                            copy.computing = False
                            copy.kick()
                            while not ready or copy.current is not None or copy.waking:
                                if not queue:
                                    raise RuntimeError("simulation deadlocked: the compute stream waits on a copy "
                                                       "that never comes")
                                env._now, _, _, callback = heappop(queue)
                                callback()
                            next(eids)
                            if handoff:
                                advance(handoff)
                            copy.computing = True
                            stall += env._now - t0
                        elif not ready:
                            t0 = env._now
                            copy.computing = False
                            # until the layer's next copy lands; SimPy would resume the stream on a landing
                            # event (its id drawn below), with nothing else due before it: the only other entry
                            # there can be was pushed after the landing (the next copy, or the thread's wake-up)
                            while not ready:
                                if not queue:
                                    raise RuntimeError("simulation deadlocked: the compute stream waits on a copy "
                                                       "that never comes")
                                env._now, _, _, callback = heappop(queue)
                                callback()
                            next(eids)
                            if handoff:  # the compute side wakes up to the landed copy
                                advance(handoff)
                            copy.computing = True
                            stall += env._now - t0
                        job = ready.popleft()
                        e = job.expert
                        t = expert_of[counts[e]]
                        if e in promote:
                            t += promote_d2d
                        if slowed:
                            t = stretch(t, slow)
                        if expert_issue:
                            t = max(t, expert_issue)
                        if tl is not None:
                            tl.append(("compute", f"L{layer} E{e} copied", env._now, t))
                        end = env._now + t   # advance(t), inline
                        next(eids)
                        while queue and queue[0][0] <= end:
                            env._now, _, _, callback = heappop(queue)
                            callback()
                        env._now = end
                        busy += t
                        if copy.current is None and not copy.waking and (handoff or copy.demand or copy.prefetch):
                            release(job)   # the freed buffer wakes the idle copy thread (CopyEngine.release)
                        else:
                            queue_release(job.buffer)
                    if cpu:
                        cpu_wait += wait_host(cpu_done)
                # the LM head closes the iteration: over every generated token, or each prefilled request's last
                lm = costs.lm_head_s(n_tok if it.kind == "decode" else it.requests)
                if lm and slowed:
                    lm = stretch(lm, dense_slow)
                if lm:
                    if tl is not None:
                        tl.append(("compute", "lm head", env._now, lm))
                    advance(lm)
                    busy += lm
                hits = counters.hits
                records.append(IterationRecord(
                    it.index, it.batch, it.kind, it.requests, n_tok, it.decode_tokens, t_start, env._now, stall,
                    hits[HPC] - before[0][HPC], hits[MPC] - before[0][MPC], hits[LPC] - before[0][LPC],
                    counters.misses - before[1], copy.copies - before[2], issued, unused,
                    counters.promotions - before[3], counters.evictions - before[4],
                    cpu_n, cpu_s, cpu_wait))
                totals["cpu_wait"] += cpu_wait
                totals["cpu_busy"] += cpu_s
                totals["cpu_n"] += cpu_n
                totals["busy"] += busy
                totals["stall"] += stall
                totals["issued"] += issued
                totals["unused"] += unused
                totals["used"] += used
                if self.progress is not None:
                    self.progress(it.index + 1, len(self.iterations))

        next(env._eid)     # the id SimPy's start of the stream's process would take
        compute_stream()
        advance(0.0)       # the events SimPy runs before the stream's process ends
        events = _events_processed(env)
        return EngineResult(
            iterations=records, sim_time_s=env.now, compute_busy_s=totals["busy"], link_busy_s=copy.busy_s,
            stall_s=totals["stall"], copies=copy.copies, prefetch_copies=copy.prefetch_copies,
            pcie_bytes=copy.pcie_bytes, prefetches_issued=totals["issued"], prefetches_used=totals["used"],
            unused_prefetches=totals["unused"], wasted_bytes=totals["wasted"], max_buffers_in_use=copy.max_in_use,
            events=events, wall_s=time.perf_counter() - wall0, prediction=score, timeline=self.timeline,
            decisions=protocol.decisions, cpu_busy_s=totals["cpu_busy"], cpu_wait_s=totals["cpu_wait"],
            cpu_experts=totals["cpu_n"])
