"""The executor: runs a workload for real, with the very policy and predictor objects the simulator uses
(``sim.run.build_decisions``), asked through the simulator's decision protocol (``sim/decisions/protocol.py``), and
measures each iteration's latency.

Memory, as an offloading server lays it out:

- expert weights in host memory (pinned on a GPU). When the host cannot hold every expert, a pool of physical
  buffers serves all logical experts (expert ``i`` of the model reads pool buffer ``i mod pool``): a copy's time
  depends on its bytes, not its contents. ``host_pool`` in the result says how many there were;
- per cached MoE layer, the HPC and MPC slots, preallocated on the device (again a physical pool when the slots
  would not fit the budget); an expert of a layer lives in slot ``expert mod slots`` of it (the policy says which
  experts are cached; which slot holds which changes no timing);
- the ``lpc_buffers`` shared working buffers that every copy from the host lands in, and the arena buffers (a
  ring of 4) that a cached expert is copied into before it computes when the policy says hits are not free
  (``hit_d2d``);
- the dense weights and a KV cache per MoE layer (``validate.kernels.DenseLayer``), and the LM head.

Every expert buffer (host, slot, working, arena) is exactly ``model.expert_bytes``, the simulator's copy size. A
model with quantized experts (``expert_bits``: int8 or packed int4, ``validate.kernels.QuantLayout``) holds them
quantized everywhere; each computed expert (cached or copied) is de-quantized on the device into one working buffer
at ``dtype_bytes`` (``validate.kernels.ExpertStore``) just before its GEMMs; experts on the host CPU de-quantize
their blocks there.

Per iteration, per MoE layer: dense work; the gate's routing brought to the host (a device -> host copy the host
waits for, as an offloading server must before it issues the layer's copies: the simulator's
``layer_roundtrip_us``); the gate (prediction, then ``plan_prefetch``); ``plan_layer``; unused
prefetches dropped; demand copies submitted (queued prefetches that are now needed move up); prefetches for the
next layer submitted; cached experts computed; copied experts computed in landing order, each promoted by a device
copy into its slot when the plan says so; ``finish_layer``. The LM head closes the iteration. Copies run on the
copier's thread (``validate.copier``). Latency is measured with the backend's timestamps (CUDA events on a GPU),
and so is the stall: how long the compute stream stood idle waiting for each copied expert (from the end of the
work before the wait to the moment it could go on: the copy's landing plus the host's hand-off), the simulator's
``stall``. The host's own blocking time is kept beside it (``host_wait_s``).

Experts the policy computes on the host CPU (Fiddler / kTransformers style: the plan's source ``"cpu"``,
``LayerStep.cpu``) are computed there for real, beside their weights: at the layer's decision point the tokens
routed to any of them (``sim.decisions.protocol.cpu_tokens``) are copied device -> host on the compute stream (one
copy for the layer; each host expert reads its tokens' rows from it),
a host pool (``validate.kernels.HostExperts``: worker threads standing for the host's cores, each computing a block
of every expert, the experts one after another) computes them from the expert's host buffer, while the compute
thread issues the device's own experts (cached and copied) as above; then it waits for the host, the outputs of
those tokens go host -> device on the compute stream (one copy), and the next layer's work is ordered after it: the
layer ends when both the device's experts and the host's are done. On the CPU backend the "device" is the CPU too:
the pool's workers are threads of their own beside the compute thread (see ``HostExperts`` for torch's intra-op
threads).
Recorded per iteration: the host experts (``cpu_experts``), the pool's busy time (``cpu_busy_s``: its first worker
starting to its last finishing, per layer), the compute thread's wait for it (``cpu_wait_s``, also the host phase
``cpu_wait``) and the compute stream's idle time waiting for it (``cpu_stall_s``, timed on the device; kept apart
from ``stall``, which is the copies'). The pool is only started for a policy that puts an expert on the host.

Warm-up, untimed: every token count an expert, a layer's dense work and the LM head will see (GEMM kernels load on
first use of a shape; the host pool's too, for a policy that uses it), then the first iteration on throwaway
decision objects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

import sim.core.cache
import sim.decisions.protocol
from sim.config.run_config import RunConfig
from sim.config.units import GIB  # binary: 2**30 bytes
from sim.core.accounting import IterationTally, iteration_record
from sim.core.cache import LPC
from sim.core.records import IterationRecord
from sim.core.workload import build_iterations, phase_layers
from sim.decisions.build import build_decisions
from sim.decisions.protocol import DecisionProtocol, LayerDecision
from traces.format import Trace
from validate.copier import Copier
from validate.kernels import (
    DenseLayer,
    ExpertStore,
    HostExperts,
    HostJob,
    LMHead,
    check_runnable,
    expert_forward,
    torch_dtype,
)

#: The plan's source of an expert computed on the host CPU (``sim.core.cache.CPU`` once the simulator has it).
CPU = getattr(sim.core.cache, "CPU", "cpu")
ARENA_BUFFERS = 4
#: Where the compute thread's time goes, per MoE layer: issuing the dense work, waiting for the gate's routing on
#: the host (the device finishing the work queued before it), deciding, issuing the copies and the cached experts,
#: and the copied experts (waiting for their copies to land, ``copy_wait``, included; reported apart as well); for
#: experts on the host CPU: gathering their inputs, the device -> host copy and handing them to the host pool
#: (``cpu_issue``), and waiting for the pool and issuing the outputs' host -> device copy (``cpu_wait``).
HOST_PHASES = (
    "dense_issue",
    "gate_sync",
    "decide",
    "issue_copies_and_hits",
    "copied_experts",
    "copy_wait",
    "cpu_issue",
    "cpu_wait",
)


def _cpu_tokens(trace: Trace, iteration, layer: int, experts) -> int:
    """The tokens of ``iteration`` routed to at least one of ``experts`` at ``layer`` (the simulator's
    ``sim.decisions.protocol.cpu_tokens`` where it has one)."""
    if not experts:
        return 0
    rows = iteration.rows
    if rows.size == 1:
        return 1
    ids = trace.experts[rows, layer]
    return int(np.isin(ids, np.fromiter(experts, dtype=ids.dtype)).any(axis=1).sum())


cpu_tokens = getattr(sim.decisions.protocol, "cpu_tokens", _cpu_tokens)


def cpu_experts_of(step) -> list[int]:
    """The step's experts computed on the host CPU, in active order: ``step.cpu`` where the protocol has it, else
    the active experts whose plan source is ``CPU``."""
    cpu = getattr(step, "cpu", None)
    if cpu is not None:
        return list(cpu)
    sources = step.plan.sources
    return [e for e in step.active if sources[e] == CPU]


@dataclass
class ExecResult:
    iterations: list[IterationRecord]
    decisions: list[LayerDecision]
    total_s: float
    copies: int
    copy_s: float  # device seconds the copies took (events on the copy stream on a GPU)
    gap_s: float  # device seconds the link idled before copies that were queued when the last landed
    gaps: int
    host_wait_s: float  # host seconds the compute thread blocked waiting for copies
    prefetch_copies: int
    max_buffers_in_use: int
    host_pool: int  # physical host buffers serving all logical experts
    logical_experts: int
    device_slots: int  # physical slot buffers on the device
    logical_slots: int
    device: str
    warmup_iterations: int
    layers: int  # MoE layers run
    host_busy_s: float  # host seconds the compute thread spent issuing work and deciding (not waiting)
    host_phases: dict = field(default_factory=dict)  # host seconds per phase (HOST_PHASES), over the run
    notes: list[str] = field(default_factory=list)
    # experts on the host CPU, per iteration: how many, the host pool's busy seconds, the compute thread's wait for
    # it, the compute stream's idle seconds waiting for it (device-timed)
    cpu_experts: list[int] = field(default_factory=list)
    cpu_busy_s: list[float] = field(default_factory=list)
    cpu_wait_s: list[float] = field(default_factory=list)
    cpu_stall_s: list[float] = field(default_factory=list)
    active_experts: int = 0  # active experts over the run (every layer of every iteration)
    host_threads: int = 0  # the host pool's worker threads (0: the pool was not started)


class Executor:
    """Runs one config on a backend (``validate.backends``)."""

    def __init__(
        self,
        cfg: RunConfig,
        trace: Trace,
        backend,
        host_pool_bytes: int = 2 * GIB,
        slot_budget_bytes: int = 4 * GIB,
        warmup: int = 1,
        progress=None,
        host_pool: list | None = None,
        host_threads: int | None = None,
    ):
        """``host_pool``: host buffers of one expert each, from an earlier executor of the same model, to reuse
        (pinning gigabytes takes seconds). ``host_threads``: the host pool's workers for experts on the host CPU
        (default ``validate.backends.default_host_threads``)."""
        from validate.backends import default_host_threads

        check_runnable(cfg.model, "model")  # an expert width no format here holds: one line naming expert_bits
        self.cfg, self.trace, self.backend = cfg, trace, backend
        self.host_threads = int(host_threads) if host_threads else default_host_threads(backend)
        self.host_experts: HostExperts | None = None
        self.host: list = [] if host_pool is None else host_pool  # the host buffers, one expert each (_allocate)
        self.host_pool_bytes, self.slot_budget_bytes = host_pool_bytes, slot_budget_bytes
        self.warmup = warmup
        self.progress = progress
        w = cfg.workload
        self.iterations, self.info = build_iterations(
            trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests
        )
        self.phase_layers = phase_layers(trace)
        self.roles = [x.role for x in trace.meta.model.layers]

    # -------------------------------------------------------------------------------------------- memory
    def _allocate(self, policy) -> None:
        torch, be, m = self.backend.torch, self.backend, self.cfg.model
        self.dtype = torch_dtype(torch, m)
        store = self.store = ExpertStore(torch, m, be.device)
        nbytes = store.nbytes  # model.expert_bytes: a quantized expert is copied and held at the simulator's size
        n_layers, n_exp = self.trace.num_layers, self.trace.num_experts
        self.logical_experts = n_layers * n_exp
        pool = max(2, min(self.logical_experts, self.host_pool_bytes // nbytes))
        seed = be.device_buffer(nbytes)
        store.fill(seed)
        if not self.host or self.host[0].numel() != nbytes or len(self.host) < pool:
            if self.host:  # another model's buffers (the list is the caller's too): freed before pinning anew
                self.host.clear()
            self.host = [be.host_buffer(nbytes) for _ in range(pool)]
            for buf in self.host:
                buf.copy_(seed)
        self.host = self.host[:pool]
        cache = policy.cache
        self.slot_counts = {
            layer: cache.hpc_slots + cache.mpc_slots
            for layer in range(n_layers)
            if layer in cache.cached_layers and cache.hpc_slots + cache.mpc_slots > 0
        }
        self.logical_slots = sum(self.slot_counts.values())
        physical = min(self.logical_slots, max(1, self.slot_budget_bytes // nbytes)) if self.logical_slots else 0
        self.slots = [be.device_buffer(nbytes) for _ in range(physical)]
        for s in self.slots:
            s.copy_(seed)
        self.slot_views = [store.handle(s) for s in self.slots]
        base, self.slot_base = 0, {}
        for layer, n in sorted(self.slot_counts.items()):
            self.slot_base[layer] = base
            base += n
        self.physical_slots = physical
        lpc = self.cfg.cache.lpc_buffers
        self.work = [be.device_buffer(nbytes) for _ in range(lpc)]
        self.work_views = [store.handle(b) for b in self.work]
        # a ring of arena buffers: one would stay in a CPU's cache between hits, which no GPU arena of real
        # experts does (nor the microbenchmarks' rotating buffers)
        self.arena = [be.device_buffer(nbytes) for _ in range(ARENA_BUFFERS)]
        for a in self.arena:
            a.copy_(seed)
        self.arena_views = [store.handle(a) for a in self.arena]
        self.arena_next = 0
        max_ctx = int(np.ceil(max((it.context for it in self.iterations), default=1))) + 1
        run = {layer for it in self.iterations for layer in self.phase_layers[it.kind]}
        self.dense = {layer: DenseLayer(torch, m, self.roles[layer], be.device, max_ctx) for layer in sorted(run)}
        self.lm_head = LMHead(torch, m, be.device)
        max_tokens = max((int(it.rows.size) for it in self.iterations), default=1)
        self.x = torch.randn(max_tokens, m.d_model, device=be.device, dtype=self.dtype) * 0.1
        self.host_views: list = []  # the host buffers' matrices, for experts on the host CPU (_start_host)
        be.synchronize()

    def _start_host(self) -> None:
        """The host pool and its activation buffers (room for every routed token of an iteration's layer)."""
        be, m = self.backend, self.cfg.model
        self.host_views = [self.store.handle(b) for b in self.host]
        rows = self.x.shape[0] * max(m.top_k, int(self.trace.experts.shape[-1]))
        self.act_in = be.activations(rows, m.d_model, self.dtype, host=True)
        self.act_out = be.activations(rows, m.d_model, self.dtype, host=True)
        self.act_dev_out = be.activations(rows, m.d_model, self.dtype, host=False)
        self.act_in.zero_()
        self.host_experts = HostExperts(be.torch, m, self.host_threads, be.host_intra_op)

    def _uses_cpu(self) -> bool:
        """Whether the policy puts any expert on the host CPU in this workload: its decisions replayed without time
        on throwaway decision objects."""
        from sim.decisions.replay import replay

        decisions = replay(self.trace, self.iterations, *build_decisions(self.cfg, self.trace, self.iterations))
        return any(src == CPU for d in decisions for _, src in d.sources)

    def _source(self, layer: int, expert: int):
        return self.host[(layer * self.trace.num_experts + expert) % len(self.host)]

    def _slot(self, layer: int, expert: int) -> int:
        return (self.slot_base[layer] + expert % self.slot_counts[layer]) % self.physical_slots

    # ---------------------------------------------------------------------------------------------- run
    def _warm_shapes(self) -> None:
        """Run every GEMM shape of the workload once: expert FFNs at 1..max tokens, dense work and the LM head at
        each iteration's token count."""
        be, m = self.backend, self.cfg.model
        gated = m.expert_matrices == 3
        with be.torch.inference_mode():
            for n in range(1, self.x.shape[0] + 1):
                expert_forward(be.torch, self.store.weights(self.work_views[0]), self.x[:n], gated)
                if self.host_experts is not None:
                    self.host_experts.run([(self.host_views[0], self.act_in[:n], self.act_out[:n])]).wait()
            shapes = {(int(it.rows.size), it.kind, it.requests, int(it.context)) for it in self.iterations}
            for n, kind, requests, ctx in sorted(shapes):
                for layer in self.phase_layers[kind]:
                    self.dense[layer](self.x[:n], ctx)
                    break
                self.lm_head(self.x[:n] if kind == "decode" else self.x[:requests])
        be.synchronize()

    def run(self) -> ExecResult:
        policy, predictor = build_decisions(self.cfg, self.trace, self.iterations)
        self._allocate(policy)  # the tier sizes
        if self._uses_cpu():
            self._start_host()
        try:
            if self.warmup:
                self._warm_shapes()
            warm = self.iterations[: self.warmup]
            if warm:  # cuBLAS/allocator start-up and first-touch page faults, on these throwaway decision objects
                self._run(warm, policy, predictor, record=False)
                policy, predictor = build_decisions(self.cfg, self.trace, self.iterations)
            return self._run(self.iterations, policy, predictor, record=True)
        finally:
            if self.host_experts is not None:
                self.host_experts.close()
                self.host_experts = None

    def _host_source(self, layer: int, expert: int):
        return self.host_views[(layer * self.trace.num_experts + expert) % len(self.host_views)]

    def _run(self, iterations, policy, predictor, record: bool) -> ExecResult:
        run = _Run(self, policy, predictor, record)
        try:
            with self.backend.torch.inference_mode():
                self.backend.synchronize()
                run.marks.append(self.backend.mark())
                for it in iterations:
                    run.iteration(it)
                    if self.progress is not None and record:
                        self.progress(it.index + 1, len(iterations))
                self.backend.synchronize()
        finally:
            run.copier.close()
        return run.result()


@dataclass
class _IterationTimes:
    """One iteration's counts and waits as the compute thread sees them: prefetches issued and dropped unused, host
    seconds blocked on copies (``wait``), the compute stream's idle spans waiting for copies (``stalled``: pairs of
    backend marks), and for experts on the host CPU: how many, the pool's busy seconds, the thread's wait for the
    pool, and the stream's idle spans waiting for it."""

    issued: int = 0
    unused: int = 0
    wait: float = 0.0
    stalled: list = field(default_factory=list)
    n_cpu: int = 0
    cpu_busy: float = 0.0
    cpu_wait: float = 0.0
    cpu_stalled: list = field(default_factory=list)


class _Run:
    """One pass of the executor over a workload: the compute thread's loop (iteration -> MoE layer -> the layer's
    experts) and what it records, turned into an :class:`ExecResult` at the end."""

    def __init__(self, ex: Executor, policy, predictor, record: bool):
        self.ex, self.be, self.trace = ex, ex.backend, ex.trace
        self.torch = self.be.torch
        self.gated = ex.cfg.model.expert_matrices == 3
        self.dequant = ex.store.weights  # a quantized expert de-quantized into the working buffer; a dense one as is
        self.copier = Copier(self.be, ex._source, ex.work, ex.cfg.cache.prefetch_reserve)
        self.protocol = DecisionProtocol(self.trace, policy, predictor, record=record)
        self.tally = IterationTally(policy.cache.counters, self.copier)
        self.hit_d2d = policy.hit_d2d
        self.promote_d2d = not policy.promotion_is_free
        self.host = ex.host_experts
        self.marks: list = []
        self.rows: list = []  # per iteration: (iteration, tokens, host wait, counts)
        self.stalls: list = []
        self.host_busy: list[float] = []
        self.cpu_rows: list = []  # per iteration: (cpu experts, busy s, wait s, [(idle from, resumed)])
        self.active_total = 0
        self.phases = dict.fromkeys(HOST_PHASES, 0.0)
        self.jobs: dict = {}  # (layer, expert) -> its copy job, for prefetches and demand copies in flight

    def iteration(self, it) -> None:
        h0 = time.perf_counter()
        n_tok = int(it.rows.size)
        x = self.ex.x[:n_tok]
        self.tally.begin()
        self.jobs = {}
        st = _IterationTimes()
        for step in self.protocol.steps(it):
            self.layer(it, step, x, st)
        self.ex.lm_head(x if it.kind == "decode" else x[: it.requests])
        self.marks.append(self.be.mark())
        self.stalls.append(st.stalled)
        self.host_busy.append(time.perf_counter() - h0 - st.wait - st.cpu_wait)
        self.phases["copy_wait"] += st.wait
        self.cpu_rows.append((st.n_cpu, st.cpu_busy, st.cpu_wait, st.cpu_stalled))
        self.rows.append((it, n_tok, st.wait, self.tally.counts(st.issued, st.unused)))

    def layer(self, it, step, x, st: _IterationTimes) -> None:
        """One MoE layer: dense work, the routing on the host, the decisions, then the experts (cached, copied, on
        the host CPU) and the next layer's prefetches."""
        clock, phases, layer, jobs, copier = time.perf_counter, self.phases, step.layer, self.jobs, self.copier
        dense = self.ex.dense[layer]
        t0 = clock()
        dense(x, it.context)
        t1 = clock()
        self.be.to_host(dense.routing)  # the trace decides; the round trip is paid all the same
        t2 = clock()
        self.protocol.decide(step)
        t3 = clock()
        phases["dense_issue"] += t1 - t0
        phases["gate_sync"] += t2 - t1
        phases["decide"] += t3 - t2
        for e in step.plan.unused_prefetch:
            copier.drop(jobs.pop((layer, e)))
            st.unused += 1
        cpu = cpu_experts_of(step)
        self.active_total += len(step.active)
        copied = [c for c in step.copied if c[1] != CPU] if cpu else step.copied
        for e, src in copied:
            if src == LPC:
                copier.upgrade(jobs.pop((layer, e)))
            else:
                copier.submit(layer, e, False)
        host_job = self._start_host_experts(it, step, x, cpu, st) if cpu else None  # (job, tokens)
        nxt = step.next_layer
        for e in step.prefetch:
            jobs[(nxt, e)] = copier.submit(nxt, e, True)
            st.issued += 1
        self._compute_resident(step, x)
        t4 = clock()
        phases["issue_copies_and_hits"] += t4 - t3
        self._compute_copied(step, x, len(copied), st)
        t5 = clock()
        phases["copied_experts"] += t5 - t4
        if host_job is not None:  # the layer ends when the host's experts are done too
            self._finish_host_experts(*host_job, t5, st)

    def _start_host_experts(self, it, step, x, cpu: list[int], st: _IterationTimes) -> tuple[HostJob, int]:
        """Hands the layer's host experts to the host pool: their tokens' activations device -> host (one copy; each
        expert reads its tokens' rows from it), each expert's weights from its host buffer. Returns the pool's job
        and the tokens it computes."""
        layer, be, ex = step.layer, self.be, self.ex
        if self.host is None:
            raise RuntimeError(
                f"iteration {it.index}, layer {layer}: experts {cpu} on the host "
                "CPU, but the decisions replayed beforehand put none there"
            )
        tc = time.perf_counter()
        st.n_cpu += len(cpu)
        for e in cpu:  # prefetched, yet computed on the host: the copy goes unused
            if (layer, e) in self.jobs:
                self.copier.drop(self.jobs.pop((layer, e)))
        total = cpu_tokens(self.trace, it, layer, cpu)
        ready = be.to_host_async(ex.act_in[:total], x[:total])
        work, at = [], 0
        for e in cpu:
            c = step.counts[e]
            work.append((ex._host_source(layer, e), ex.act_in[:c], ex.act_out[at : at + c]))
            at += c
        job = self.host.run(work, None if ready is None else (lambda marker=ready: be.wait_host(marker)))
        self.phases["cpu_issue"] += time.perf_counter() - tc
        return job, total

    def _compute_resident(self, step, x) -> None:
        """The layer's cached experts, each from its slot (through an arena buffer when hits are not free)."""
        ex, layer, counts = self.ex, step.layer, step.counts
        for e in step.resident:
            weights = ex.slot_views[ex._slot(layer, e)]
            if self.hit_d2d:
                a = ex.arena_next = (ex.arena_next + 1) % ARENA_BUFFERS
                self.be.device_copy(ex.arena[a], ex.slots[ex._slot(layer, e)])
                weights = ex.arena_views[a]
            expert_forward(self.torch, self.dequant(weights), x[: counts[e]], self.gated)

    def _compute_copied(self, step, x, waiting: int, st: _IterationTimes) -> None:
        """The layer's ``waiting`` copied experts in landing order, each promoted into its slot by a device copy
        when the plan says so; the compute stream's idle span before each is a stall."""
        be, ex, layer, counts, promote = self.be, self.ex, step.layer, step.counts, step.plan.promote
        while waiting:
            idle_from = be.mark()
            t0 = time.perf_counter()
            job = self.copier.take(layer)
            st.wait += time.perf_counter() - t0
            waiting -= 1
            e, buffer = job.expert, job.buffer
            assert buffer is not None, "a landed copy holds its working buffer until released"
            be.wait_landed(job.landed)
            st.stalled.append((idle_from, be.mark()))
            expert_forward(self.torch, self.dequant(ex.work_views[buffer]), x[: counts[e]], self.gated)
            if e in promote and self.promote_d2d:
                be.device_copy(ex.slots[ex._slot(layer, e)], ex.work[buffer])
            self.copier.release(job, be.compute_done())

    def _finish_host_experts(self, job, tokens: int, since: float, st: _IterationTimes) -> None:
        """Waits for the host pool, then brings its outputs host -> device (one copy)."""
        be, ex = self.be, self.ex
        idle_from = be.mark()
        job.wait()
        t6 = time.perf_counter()
        st.cpu_wait += t6 - since
        st.cpu_stalled.append((idle_from, be.mark()))
        be.from_host(ex.act_dev_out[:tokens], ex.act_out[:tokens])
        st.cpu_busy += job.busy_s
        self.phases["cpu_wait"] += time.perf_counter() - since

    def result(self) -> ExecResult:
        be, copier, host = self.be, self.copier, self.host
        times = [be.elapsed(self.marks[0], mk) for mk in self.marks]
        cpu_stall_s = [sum(max(0.0, be.elapsed(a, b)) for a, b in r[3]) for r in self.cpu_rows]
        records = []
        host_wait = 0.0
        for i, (it, n_tok, wait, counts) in enumerate(self.rows):
            stall = sum(max(0.0, be.elapsed(a, b)) for a, b in self.stalls[i])
            host_wait += wait
            # the host experts as the simulator records them: how many, the host's busy time, and the compute
            # stream's wait for them (timed on the device)
            n_cpu, cpu_busy = self.cpu_rows[i][0], self.cpu_rows[i][1]
            records.append(
                iteration_record(it, n_tok, times[i], times[i + 1], stall, counts, n_cpu, cpu_busy, cpu_stall_s[i])
            )
        ex = self.ex
        return ExecResult(
            records,
            self.protocol.decisions or [],
            times[-1],
            copier.copies,
            *copier.timings(),
            host_wait,
            copier.prefetch_copies,
            copier.max_in_use,
            len(ex.host),
            ex.logical_experts,
            ex.physical_slots,
            ex.logical_slots,
            be.name,
            ex.warmup,
            self.trace.num_layers,
            sum(self.host_busy),
            self.phases,
            self.notes(),
            cpu_experts=[r[0] for r in self.cpu_rows],
            cpu_busy_s=[r[1] for r in self.cpu_rows],
            cpu_wait_s=[r[2] for r in self.cpu_rows],
            cpu_stall_s=cpu_stall_s,
            active_experts=self.active_total,
            host_threads=host.threads if host is not None else 0,
        )

    def notes(self) -> list[str]:
        """What a reader of the result should know about how the memory was laid out."""
        ex, host = self.ex, self.host
        notes = []
        if ex.store.quantized:
            notes.append(f"{ex.store.describe()}, de-quantized on the device before computing")
        if len(ex.host) < ex.logical_experts:
            notes.append(
                f"{len(ex.host)} physical host buffers served {ex.logical_experts} logical experts "
                f"(a copy's time depends on its bytes, not its contents)"
            )
        if ex.physical_slots < ex.logical_slots:
            notes.append(f"{ex.physical_slots} physical device slots served {ex.logical_slots} logical cache slots")
        if host is not None:
            notes.append(
                f"experts on the host CPU: {host.threads} worker thread(s), {len(host.blocks)} block(s) per "
                f"expert, torch intra-op threads {self.torch.get_num_threads()}"
            )
        return notes
