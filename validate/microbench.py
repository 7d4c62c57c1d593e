"""Microbenchmarks that turn a machine into a calibration profile the simulator reads (``hardware:`` accepts it).

Each point is the mean of ``repeat`` timed runs after a warm-up (the simulator predicts means, and a busy machine's
timings are skewed: a median would miss their slow tail), of the very calls the executor makes
(``validate.backends``, ``validate.kernels``, ``validate.copier``), so that what is calibrated is what runs:

- ``copy``: host -> device copy time against size, per copy through the executor's own copy thread
  (``validate.copier``) kept busy with demand copies into rotating working buffers (a GPU: from pinned memory on
  the copy stream; the CPU: a copy between two buffers), the copy itself timed on the device (CUDA events on the
  copy stream): the hand-offs between copies are measured apart (``copy_gap_us``);
- ``d2d``: device -> device copy time against size;
- ``expert``: one expert FFN of the model's shape and dtype against tokens routed to it;
- ``cpu_expert``: one expert FFN computed on the host CPU from its weights in host memory, against tokens routed to
  it, by the executor's host pool (``validate.kernels.HostExperts``: ``host_threads`` worker threads, each a block
  of the expert); the inputs and outputs are on the host already (the simulator prices their copies apart). A few
  token counts (1, 4, 16 below the largest, and the largest) and a few runs each, within about two seconds
  (:func:`measure_cpu_expert`). ``cpu_cores`` is written beside it as the pool's threads: the table is the time
  over all of them;
- ``dense``: the dense work attached to one MoE layer (``validate.kernels.DenseLayer``) against batch tokens and
  context length;
- ``lm_head``: the vocabulary projection against tokens;
- ``handoff_us``: how long the idle host threads take to hand a copy over (the compute stream going on after a
  landed copy it waited for, the idle copy thread starting a requested copy), timed on the device;
- ``copy_gap_us``: how long the link idles between a copy landing and the next queued copy starting (the copy
  thread's wake-up), measured while the calling thread computes each landed expert as the executor does: the copy
  thread waits for the interpreter lock then;
- host costs, what the executor's compute thread spends that no kernel table holds: ``layer_roundtrip_us``, from
  a layer's routing done on the device to the host having it and issuing again (a device -> host copy and the
  wait for it, timed on the device); ``copy_issue_us``, host time to ask the copy thread for a copy;
  ``expert_issue_us``, host time to issue one copied expert as the executor does (take the landed copy, order the
  compute stream after it, timestamps, the expert's kernels, release its buffer), measured while the copy thread
  lands the next copies, as in a run; ``dense_issue_us``, host time to issue one MoE layer's dense work, and
  ``host_slowdown``, how much longer that takes while copies land (the copy thread takes the interpreter lock at
  every landing); ``decide_us``, per policy, host time per MoE layer of its decisions (``measure_decisions``, the
  decision protocol replayed without time over the measured configurations); ``hit_issue_us``, host time to issue one
  cached expert's kernels;
- interference: ``compute_slowdown`` and ``dense_slowdown``, how much longer an expert FFN and a layer's dense work
  take while the copy thread copies experts, and ``copy_slowdown``, how much longer a copy takes while experts
  compute (copies and compute share memory bandwidth; never below 1).

Sources and weights rotate over enough buffers (about 256 MB, or every MoE layer's dense weights) that a CPU's
caches cannot hold them, as they cannot in a real run. GPU work is timed with CUDA events, CPU work with
``time.perf_counter``.

- ``dequant_int8``, ``dequant_int4``: the time to de-quantize one quantized expert (weight-only int8, packed
  int4: ``validate.kernels.QuantLayout``) into its working buffer at ``dtype_bytes`` on the device, as the
  executor does before a quantized expert's GEMMs, against the expert's quantized bytes (``expert_bytes``, what a
  copy moves), for the model's expert shape at ``d_ff`` 1/4, 1/2, 1 and 2 times its own (:func:`measure_dequant`):
  ``[[bytes, seconds], ...]``, sorted by bytes. Each format at the model's own ``expert_bits`` where its experts
  are in that format, else at 8 (int8) and 4.25 (int4, group 64) bits per weight. A quantized expert's time is
  ``dequant_<format>(expert_bytes) + expert(tokens)``: the ``expert`` table is the FFN alone, on de-quantized
  weights. Tables the installed simulator does not accept yet are written beside the profile
  (:func:`write_calibration`).

The output is ``{base: HARDWARE, source: MACHINE, cpu_cores: HOST_THREADS, ..., tables: {model, copy, d2d,
expert, dense, lm_head, cpu_expert, dequant_int8, dequant_int4}}`` in YAML; tables are ``[x, seconds]`` points
(``dense``: ``[tokens, context, seconds]``).
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from moebase.model import ModelSpec
from traces.io import atomic_write_bytes
from validate.copier import Copier
from validate.kernels import (
    QUANT_RANGES,
    DenseLayer,
    ExpertStore,
    HostExperts,
    LMHead,
    dense_expert_bytes,
    expert_format,
    expert_forward,
    expert_views,
    fill_random,
    torch_dtype,
)

if TYPE_CHECKING:
    from validate.backends import Landed

ROTATE_BYTES = 256 << 20


class Timer:
    """Times a callable on a backend: CUDA events on a GPU, perf_counter on the CPU (mean of ``repeat``)."""

    def __init__(self, backend, repeat: int = 5):
        self.backend, self.repeat = backend, repeat

    def __call__(self, fn) -> float:
        """Seconds per call of ``fn``."""
        be = self.backend
        fn()  # warm-up
        times = []
        for _ in range(self.repeat):
            if be.name == "cpu":
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            else:
                a = be.mark()
                fn()
                times.append(be.elapsed(a, be.mark()))
        return statistics.fmean(times)


def _rotation(nbytes: int, most: int = 16) -> int:
    return max(2, min(most, ROTATE_BYTES // max(nbytes, 1) + 1))


def _cycle(items):
    state = {"i": -1}

    def nxt():
        state["i"] = (state["i"] + 1) % len(items)
        return items[state["i"]]

    return nxt


def copier_rate(backend, srcs: list, dsts: list, count: int, work=None) -> tuple[float, float | None]:
    """(seconds per copy, link gap per copy or None) when the executor's copy thread copies ``count`` experts back to
    back, the calling thread taking each as it lands, running ``work(job)`` on it if given (which returns the
    marker the buffer's release waits for), and releasing its buffer: the copies timed on the device, and the time
    the link stood idle between a landing and the next queued copy's start."""
    src = _cycle(srcs)
    copier = Copier(backend, lambda layer, expert: src(), dsts, reserve=1)
    try:
        backend.synchronize()
        submitted = min(count, len(dsts))
        for i in range(submitted):
            copier.submit(0, i, False)
        for _ in range(count):
            job = copier.take(0)
            copier.release(job, None if work is None else work(job))
            if submitted < count:
                copier.submit(0, submitted, False)
                submitted += 1
        backend.synchronize()
    finally:
        copier.close()
    copy_s, gap_s, gaps = copier.timings()
    return copy_s / copier.copies, (gap_s / gaps if gaps else None)


def measure_handoff(backend, nbytes: int, samples: int = 20) -> float:
    """Microseconds the host threads take to hand a copy over, timed on the device, the mean of both directions:
    from asking the idle copy thread for a copy to the copy's start, and from a copy's landing to the waiting
    compute stream going on. Both threads idle for milliseconds first, as in a run (an idle core wakes up slower
    than a busy one)."""
    srcs = [backend.host_buffer(nbytes) for _ in range(2)]
    dsts = [backend.device_buffer(nbytes) for _ in range(2)]
    for b in srcs + dsts:
        b.fill_(1)
    copier = Copier(backend, lambda layer, expert: srcs[expert % 2], dsts, reserve=1)
    pairs = []
    try:
        for i in range(samples + 2):
            time.sleep(0.002)
            asked = backend.mark()
            copier.submit(0, i, False)
            job = copier.take(0)
            backend.wait_landed(job.landed)
            resumed = backend.mark()
            copier.release(job, None)
            if i >= 2:
                landed: Landed | None = job.landed  # set by the copy thread (a backend's Landed)
                assert landed is not None, "take hands over landed copies only"
                pairs += [(asked, landed.start), (landed.end, resumed)]
        backend.synchronize()
    finally:
        copier.close()
    return max(0.0, statistics.fmean(backend.elapsed(a, b) for a, b in pairs)) * 1e6


def _executor_work(backend, views: list, x, gated: bool):
    """What the executor's compute thread does with a landed copy in working buffer ``job.buffer`` (whose expert
    matrices are ``views[job.buffer]``): order the compute stream after it, a timestamp, the expert's kernels; it
    returns the marker the buffer's release waits for."""
    torch = backend.torch

    def work(job):
        backend.wait_landed(job.landed)
        backend.mark()
        expert_forward(torch, views[job.buffer], x, gated)
        return backend.compute_done()

    return work


def _expert_buffers(backend, model: ModelSpec, n: int, dtype) -> tuple[list, list]:
    """``n`` device buffers of one expert each (``model.expert_bytes``: what a copy lands in), and the matrices of
    ``n`` experts filled with random weights at ``dtype_bytes``: the buffers' own for dense experts, buffers of
    their own for quantized ones (the FFN the ``expert`` table times; their de-quantization is timed apart,
    ``dequant_<format>``)."""
    bufs = [backend.device_buffer(model.expert_bytes) for _ in range(n)]
    dense = (
        bufs if expert_format(model) is None else [backend.device_buffer(dense_expert_bytes(model)) for _ in range(n)]
    )
    if dense is not bufs:
        for b in bufs:
            b.fill_(1)
    for b in dense:
        fill_random(backend.torch, b, model, dtype)
    return bufs, [expert_views(b, model, dtype) for b in dense]


def measure_copy_gap(backend, model: ModelSpec, copies: int = 24) -> float:
    """Microseconds the link stands idle between one copy's landing and the start of the next, already queued, while
    the calling thread does what the executor's compute thread does with each landed copy (takes it, orders the
    compute stream after it, computes the expert in it, releases the buffer after that compute): the copy thread
    waits for the interpreter lock then. The simulator's ``copy_gap_us``."""
    torch = backend.torch
    nbytes = model.expert_bytes
    dtype = torch_dtype(torch, model)
    srcs = [backend.host_buffer(nbytes) for _ in range(_rotation(nbytes))]
    for b in srcs:
        b.fill_(1)
    dsts, views = _expert_buffers(backend, model, _rotation(nbytes, 8), dtype)
    x = torch.randn(max(1, model.top_k), model.d_model, device=backend.device, dtype=dtype) * 0.1
    work = _executor_work(backend, views, x, model.expert_matrices == 3)
    with torch.inference_mode():
        copier_rate(backend, srcs, dsts, len(dsts), work)  # warm-up
        _, gap = copier_rate(backend, srcs, dsts, copies, work)
    return 1e6 * (gap or 0.0)


def measure_host_costs(backend, model: ModelSpec, samples: int = 32) -> dict:
    """The host's own costs per MoE layer, per copy and per expert, in microseconds (see the module docstring);
    the GPU is idle or ahead of nothing while they are timed, so what is measured is the host's time."""
    torch = backend.torch
    nbytes = model.expert_bytes
    dtype = torch_dtype(torch, model)
    gated = model.expert_matrices == 3
    x = torch.randn(max(1, model.top_k), model.d_model, device=backend.device, dtype=dtype) * 0.1
    gate = torch.randn(model.d_model, model.num_experts, device=backend.device, dtype=dtype) * 0.02
    srcs = [backend.host_buffer(nbytes) for _ in range(2)]
    for b in srcs:
        b.fill_(1)
    dsts, views = _expert_buffers(backend, model, min(samples, _rotation(nbytes, 8)), dtype)
    work = _executor_work(backend, views, x, gated)
    out = {}
    with torch.inference_mode():
        pairs = []
        for i in range(samples + 2):  # a layer's routing to the host, and the host issuing again
            routing = torch.topk(x @ gate, model.top_k, dim=-1).indices
            done = backend.mark()
            backend.to_host(routing)
            if i >= 2:
                pairs.append((done, backend.mark()))
        backend.synchronize()
        out["layer_roundtrip_us"] = statistics.fmean(backend.elapsed(a, b) for a, b in pairs) * 1e6
        for _ in range(3):  # warm the kernels
            expert_forward(torch, views[0], x, gated)
        backend.synchronize()
        t0 = time.perf_counter()
        for i in range(samples):
            expert_forward(torch, views[i % len(views)], x, gated)
        out["hit_issue_us"] = (time.perf_counter() - t0) / samples * 1e6
        backend.synchronize()
        copier = Copier(backend, lambda layer, expert: srcs[expert % 2], dsts, reserve=1)
        try:
            issue = expert = 0.0
            n = 3 * len(dsts)
            rounds = max(1, samples // n)
            for r in range(rounds + 1):
                t0 = time.perf_counter()
                for i in range(n):
                    copier.submit(0, i, False)
                spent = time.perf_counter() - t0
                # each landed copy handled as the executor does, while the copy thread lands the next ones (it
                # takes the interpreter lock at every landing, as in a run); only the handling is timed, not the
                # wait for a copy to land
                handling = 0.0
                for _ in range(n):
                    job = copier.take(0)
                    t0 = time.perf_counter()
                    backend.mark()
                    copier.release(job, work(job))
                    handling += time.perf_counter() - t0
                if r:  # the first round warms up
                    issue += spent
                    expert += handling
                backend.synchronize()
        finally:
            copier.close()
        out["copy_issue_us"] = issue / (rounds * n) * 1e6
        out["expert_issue_us"] = expert / (rounds * n) * 1e6
        alone, beside = measure_dense_issue(backend, model, srcs, dsts, samples)
        out["dense_issue_us"] = alone
        out["host_slowdown"] = max(1.0, beside / alone) if alone > 0 else 1.0
    return {k: round(v, 3 if k == "host_slowdown" else 1) for k, v in out.items()}


def measure_dense_issue(backend, model: ModelSpec, srcs: list, dsts: list, samples: int = 32) -> tuple[float, float]:
    """Host microseconds to issue one MoE layer's dense work (``DenseLayer``): (with the copy thread idle, while
    it lands copies as in a run: one copy asked for before each call and taken after it). Their ratio is the
    simulator's ``host_slowdown``: the copy thread's share of the interpreter."""
    torch = backend.torch
    dtype = torch_dtype(torch, model)
    role = "decoder" if model.moe_layers_of("decoder") else "encoder"
    layer = DenseLayer(torch, model, role, backend.device, 64)
    x = torch.randn(max(1, model.top_k), model.d_model, device=backend.device, dtype=dtype) * 0.1

    def issue(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            layer(x, 32)
        return (time.perf_counter() - t0) / n

    with torch.inference_mode():
        issue(4)
        backend.synchronize()
        alone = issue(samples)
        backend.synchronize()
        copier = Copier(backend, lambda _layer, expert: srcs[expert % len(srcs)], dsts, reserve=1)
        try:
            beside = 0.0
            for i in range(samples + 2):
                copier.submit(0, i, False)
                t0 = time.perf_counter()
                layer(x, 32)
                if i >= 2:
                    beside += time.perf_counter() - t0
                job = copier.take(0)
                copier.release(job, backend.compute_done())
            backend.synchronize()
        finally:
            copier.close()
    beside /= samples
    print(
        f"  dense work issued by the host: {alone * 1e3:,.2f} ms alone, {beside * 1e3:,.2f} ms while copies land",
        flush=True,
    )
    return alone * 1e6, beside * 1e6


def measure_decisions(configs: list, traces: dict, iterations: int = 24) -> dict:
    """Host microseconds per MoE layer that each policy's decisions take on this machine: the decision protocol
    replayed without time (``sim.decisions.replay``) over the first ``iterations`` iterations of each run config (a
    policy with several configurations: their mean). ``configs``: RunConfigs; ``traces``: path -> Trace."""
    from sim.core.workload import build_iterations
    from sim.decisions.build import build_decisions
    from sim.decisions.replay import replay

    per: dict[str, list[float]] = {}
    for cfg in configs:
        trace = traces[str(cfg.workload.trace)]
        w = cfg.workload
        its, _ = build_iterations(trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests)
        its = its[:iterations]
        replay(trace, its, *build_decisions(cfg, trace, its))  # warm-up
        policy, predictor = build_decisions(cfg, trace, its)
        t0 = time.perf_counter()
        steps = len(replay(trace, its, policy, predictor))
        per.setdefault(cfg.policy.name, []).append((time.perf_counter() - t0) / max(1, steps) * 1e6)
    return {name: round(statistics.fmean(v), 1) for name, v in sorted(per.items())}


def measure_copies(backend, timer: Timer, sizes: list[int]) -> tuple[list, list]:
    """(bytes, seconds) for host->device copies through the copy thread (the copies themselves, timed on the
    device), and device->device copies, of each size."""
    h2d, d2d = [], []
    for n in sizes:
        srcs = [backend.host_buffer(n) for _ in range(_rotation(n))]
        dsts = [backend.device_buffer(n) for _ in range(_rotation(n, 8))]  # as the working buffers rotate
        for s in srcs + dsts:
            s.fill_(1)
        copier_rate(backend, srcs, dsts, len(dsts))  # warm-up
        rates = [copier_rate(backend, srcs, dsts, 2 * len(dsts))[0] for _ in range(max(1, timer.repeat // 2))]
        h2d.append([n, statistics.fmean(rates)])
        dst, dev = _cycle(dsts), _cycle(dsts[1:] + dsts[:1])  # never a buffer onto itself
        d2d.append([n, timer(lambda: backend.device_copy(dst(), dev()))])  # noqa: B023
    return h2d, d2d


def measure_expert(backend, timer: Timer, model: ModelSpec, tokens: list[int]) -> list:
    torch = backend.torch
    dtype = torch_dtype(torch, model)
    weights = _cycle(_expert_buffers(backend, model, _rotation(model.expert_bytes), dtype)[1])
    gated = model.expert_matrices == 3
    out = []
    with torch.inference_mode():
        for t in tokens:
            x = torch.randn(t, model.d_model, device=backend.device, dtype=dtype) * 0.1
            out.append([t, timer(lambda: expert_forward(torch, weights(), x, gated))])  # noqa: B023
    return out


#: The width each format's ``dequant_<format>`` table is measured at, unless the model's own experts are in it.
DEQUANT_BITS = {"int8": 8.0, "int4": 4.25}


def dequant_models(model: ModelSpec, quick: bool = False) -> dict[str, list[ModelSpec]]:
    """Per quantized format, the model with its experts in that format (at the model's own ``expert_bits`` where
    they are in it, else ``DEQUANT_BITS``) and ``d_ff`` at 1/4, 1/2, 1 and 2 times the model's (``quick``: 1/2, 1,
    2), each a multiple of 64 where the model's is."""
    import dataclasses

    own = expert_format(model)
    out = {}
    for fmt in QUANT_RANGES:
        bits = model.expert_bits if own == fmt else DEQUANT_BITS[fmt]
        step = 64 if model.d_ff % 64 == 0 else 2
        widths = sorted(
            {max(step, round(model.d_ff * f / step) * step) for f in ((0.5, 1, 2) if quick else (0.25, 0.5, 1, 2))}
        )
        out[fmt] = [dataclasses.replace(model, d_ff=w, expert_bits=bits) for w in widths]
    return out


def measure_dequant(backend, timer: Timer, model: ModelSpec, quick: bool = False) -> dict[str, list]:
    """``{format: [[bytes, seconds], ...]}``: the time to de-quantize one expert of the model's shape (``d_ff``
    at a few widths, :func:`dequant_models`) from its quantized buffer of ``bytes`` (its ``expert_bytes``, what a
    copy moves) into the working buffer at ``dtype_bytes``, on the device, as the executor does before an expert's
    GEMMs (``validate.kernels.ExpertStore``); the sources rotate over buffers as the copies' do."""
    torch = backend.torch
    out = {}
    with torch.inference_mode():
        for fmt, models in dequant_models(model, quick).items():
            points = []
            for m in models:
                store = ExpertStore(torch, m, backend.device)
                bufs = [backend.device_buffer(store.nbytes) for _ in range(_rotation(store.nbytes, 8))]
                store.fill(bufs[0])
                for b in bufs[1:]:
                    b.copy_(bufs[0])
                expert = _cycle([store.handle(b) for b in bufs])
                points.append([store.nbytes, timer(lambda: store.weights(expert()))])  # noqa: B023, F821
                del store, bufs, expert
            out[fmt] = points
    return out


def cpu_expert_tokens(tokens: list[int]) -> list[int]:
    """The token counts the host's expert time is measured at: 1, 4 and 16 below the largest of ``tokens``, and the
    largest (at most four points: an expert on the host takes milliseconds)."""
    top = max(tokens)
    return sorted({t for t in (1, 4, 16) if t < top} | {top})


def measure_cpu_expert(
    backend, model: ModelSpec, tokens: list[int], threads: int, repeat: int = 3, budget_s: float = 2.0
) -> list:
    """(tokens, seconds) of one expert FFN on the host CPU by the executor's host pool, its weights rotating over
    host buffers (pinned on a GPU, as the executor's host pool), its input and output on the host: the mean of up
    to ``repeat`` timed runs after a warm-up, fewer where a point has used its share of ``budget_s``."""
    torch = backend.torch
    dtype = torch_dtype(torch, model)
    nbytes = model.expert_bytes
    store = ExpertStore(torch, model, "cpu")  # a quantized expert: each worker de-quantizes its block
    bufs = [backend.host_buffer(nbytes) for _ in range(_rotation(nbytes))]
    store.fill(bufs[0])
    for b in bufs[1:]:
        b.copy_(bufs[0])
    weights = _cycle([store.handle(b) for b in bufs])
    host = HostExperts(torch, model, threads, backend.host_intra_op)
    share = budget_s / max(1, len(tokens))
    out = []
    try:
        for t in tokens:
            x = torch.randn(t, model.d_model, dtype=dtype) * 0.1
            y = torch.empty_like(x)
            host.run([(weights(), x, y)]).wait()  # warm-up
            times: list[float] = []
            while len(times) < max(1, repeat) and sum(times) < share:
                t0 = time.perf_counter()
                host.run([(weights(), x, y)]).wait()
                times.append(time.perf_counter() - t0)
            out.append([t, statistics.fmean(times)])
    finally:
        host.close()
    return out


def measure_activation_latency(backend, model: ModelSpec, samples: int = 20) -> float:
    """Microseconds of one activation copy either way (a decode batch's ``top_k`` tokens: device -> host into
    pinned memory, then host -> device), the mean of both, timed on the device: the simulator's
    ``activation_latency_us`` (the bytes are negligible at this size)."""
    torch = backend.torch
    dtype = torch_dtype(torch, model)
    rows = max(1, model.top_k)
    dev = backend.activations(rows, model.d_model, dtype, host=False)
    host = backend.activations(rows, model.d_model, dtype, host=True)
    dev.fill_(1)
    spans = []
    for i in range(samples + 2):
        a = backend.mark()
        backend.wait_host(backend.to_host_async(host, dev))
        b = backend.mark()
        backend.from_host(dev, host)
        c = backend.mark()
        backend.synchronize()
        if i >= 2:
            spans += [(a, b), (b, c)]
    return max(0.0, statistics.fmean(backend.elapsed(x, y) for x, y in spans)) * 1e6


def measure_dense(
    backend, timer: Timer, model: ModelSpec, tokens: list[int], contexts: list[int], role: str = "decoder"
) -> list:
    """(tokens, context, seconds) of the dense work of one MoE layer, rotating over the role's MoE layers."""
    torch = backend.torch
    dtype = torch_dtype(torch, model)
    role = role if model.moe_layers_of(role) else ("encoder" if role == "decoder" else "decoder")
    layers = [
        DenseLayer(torch, model, role, backend.device, max(contexts))
        for _ in range(max(1, min(model.moe_layers_of(role), 8)))
    ]
    layer = _cycle(layers)
    out = []
    with torch.inference_mode():
        for t in tokens:
            x = torch.randn(t, model.d_model, device=backend.device, dtype=dtype) * 0.1
            for c in contexts:
                out.append([t, c, timer(lambda: layer()(x, c))])  # noqa: B023
    return out


def measure_lm_head(backend, timer: Timer, model: ModelSpec, tokens: list[int]) -> list:
    torch = backend.torch
    head = LMHead(torch, model, backend.device)
    out = []
    with torch.inference_mode():
        for t in tokens:
            x = torch.randn(t, model.d_model, device=backend.device, dtype=torch_dtype(torch, model)) * 0.1
            out.append([t, timer(lambda: head(x))])  # noqa: B023
    return out


class Background:
    """Runs ``fn`` in a loop on another thread, on the backend's compute stream, while the ``with`` block runs; the
    block starts once the first call has finished, so that everything it times is loaded."""

    def __init__(self, fn, backend):
        self.fn, self.backend, self.stop = fn, backend, threading.Event()
        self.running = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        try:
            with self.backend.torch.inference_mode(), self.backend.on_compute():
                self.fn()
                self.running.set()
                while not self.stop.is_set():
                    self.fn()
        except BaseException as exc:  # an unloaded "loaded" timing would pass for no interference
            self.error = exc
        finally:
            self.running.set()

    def __enter__(self):
        self.thread.start()
        self.running.wait()
        if self.error is not None:
            self.__exit__(None, None, None)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise RuntimeError(f"the background load failed: {self.error!r}") from self.error


def measure_interference(backend, timer: Timer, model: ModelSpec, batch: int, context: int, blocks: int = 5) -> dict:
    """How much copies and compute slow each other down (loaded over alone, at least 1 each, the median over
    ``blocks`` blocks of alone-then-loaded timings, so that a drifting machine cancels out):

    - ``compute_slowdown``: an expert FFN while the copy thread copies experts;
    - ``dense_slowdown``: the dense work of one MoE layer while the copy thread copies experts;
    - ``copy_slowdown``: an expert's copy while experts compute, which is what runs beside copies in an offloaded
      layer (the dense work runs mostly before its layer's copies start).

    Experts get the tokens a decode batch of ``batch`` gives each (``batch * top_k`` spread over as many experts,
    at most all of them); how much copies and compute interfere depends on how memory-bound the compute is."""
    torch = backend.torch
    dtype = torch_dtype(torch, model)
    nbytes = model.expert_bytes
    weights = _cycle(_expert_buffers(backend, model, _rotation(nbytes), dtype)[1])
    srcs = [backend.host_buffer(nbytes) for _ in range(_rotation(nbytes))]
    bg_srcs = [backend.host_buffer(nbytes) for _ in range(_rotation(nbytes))]
    dsts = [backend.device_buffer(nbytes) for _ in range(_rotation(nbytes, 8))]
    bg_dsts = [backend.device_buffer(nbytes) for _ in range(_rotation(nbytes, 8))]
    for s in srcs + bg_srcs + dsts + bg_dsts:
        s.fill_(1)
    src, bg_src, dst, bg_dst = _cycle(srcs), _cycle(bg_srcs), _cycle(dsts), _cycle(bg_dsts)
    gated = model.expert_matrices == 3
    role = "decoder" if model.moe_layers_of("decoder") else "encoder"
    dense = DenseLayer(torch, model, role, backend.device, context)
    n_exp = min(batch * model.top_k, model.num_experts)
    per = max(1, round(batch * model.top_k / n_exp))
    x = torch.randn(batch, model.d_model, device=backend.device, dtype=dtype) * 0.1

    def expert():
        expert_forward(torch, weights(), x[:per], gated)

    def expert_waited():
        expert()
        backend.wait_host(backend.compute_done())

    def layer_dense():
        dense(x, context)

    def cp() -> float:
        landed = backend.copy_in(dst(), src())
        return backend.elapsed(landed.start, landed.end)

    def copy_time() -> float:
        """Seconds per copy, timed on the device (the mean of the timer's repeats, after one warm-up)."""
        cp()
        return statistics.fmean(cp() for _ in range(timer.repeat))

    def copies():
        backend.copy_in(bg_dst(), bg_src())

    ratios: dict[str, list[float]] = {"compute_slowdown": [], "dense_slowdown": [], "copy_slowdown": []}
    with torch.inference_mode():
        for _ in range(blocks):
            alone = (timer(expert), timer(layer_dense), copy_time())
            with Background(copies, backend):
                loaded: tuple[float, ...] = (timer(expert), timer(layer_dense))
            with Background(expert_waited, backend):
                loaded += (copy_time(),)
            for key, a, b in zip(ratios, alone, loaded):
                ratios[key].append(b / a)
    return {key: max(1.0, round(statistics.median(v), 3)) for key, v in ratios.items()}


def grids(model: ModelSpec, quick: bool, batch_sizes: list[int] | None = None, max_context: int | None = None) -> dict:
    """The points measured: copy sizes around one expert; expert tokens at every power of two up to the largest
    batch (and the batch itself); dense and LM-head tokens at 1 and at each batch size of the workload (the curves
    are not linear between small sizes, so the workload's own sizes are measured, not interpolated); contexts
    covering the workload."""
    eb = model.expert_bytes
    sizes = sorted(
        {max(1, eb // 64), max(1, eb // 8), eb, 2 * eb}
        if quick
        else {max(1, eb // 256), max(1, eb // 64), max(1, eb // 16), max(1, eb // 4), eb, 2 * eb}
    )
    contexts = [32, 256] if quick else [32, 128, 512, 2048]
    if batch_sizes:
        top = max(batch_sizes)
        tokens = sorted({1 << i for i in range(top.bit_length()) if 1 << i < top} | {top})
        dense_tokens = sorted({1, *batch_sizes})
    else:
        tokens = [1, 4, 16, 64] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256]
        dense_tokens = [1, 8, 64] if quick else [1, 4, 16, 64, 256]
    if len(tokens) == 1:
        tokens = [1, 2]
    if len(dense_tokens) == 1:
        dense_tokens = [1, 2]
    if max_context is not None:
        contexts = sorted({c for c in contexts if c < max_context} | {max_context})
        if len(contexts) == 1:
            contexts = sorted({1, max_context})
    return {"sizes": sizes, "tokens": tokens, "dense_tokens": dense_tokens, "contexts": contexts}


def calibrate(
    model: ModelSpec,
    base: str,
    device: str = "cpu",
    quick: bool = False,
    repeat: int = 5,
    backend=None,
    batch_sizes: list[int] | None = None,
    max_context: int | None = None,
    light: bool = False,
    host_threads: int | None = None,
) -> dict:
    """Run every microbenchmark; returns the calibration mapping. A ``light`` pass measures the tables only (no
    hand-off, no interference): a cheap extra sample of a machine whose speed drifts. ``host_threads``: the host
    pool's workers for the ``cpu_expert`` table (default ``validate.backends.default_host_threads``)."""
    from validate.backends import default_host_threads, make_backend

    be = backend if backend is not None else make_backend(device)
    host_threads = int(host_threads) if host_threads else default_host_threads(be)
    timer = Timer(be, repeat)
    g = grids(model, quick, batch_sizes, max_context)
    h2d, d2d = measure_copies(be, timer, g["sizes"])
    scalars = (
        {}
        if light
        else {
            "handoff_us": round(measure_handoff(be, model.expert_bytes), 1),
            "copy_gap_us": round(measure_copy_gap(be, model), 1),
            **measure_host_costs(be, model),
            "activation_latency_us": round(measure_activation_latency(be, model), 1),
            **measure_interference(
                be, Timer(be, max(repeat, 20)), model, g["dense_tokens"][len(g["dense_tokens"]) // 2], g["contexts"][-1]
            ),
        }
    )
    return {
        "base": base,
        "source": f"calibrated with python -m validate microbench on {be.describe()}",
        "cpu_cores": host_threads,
        **scalars,
        "tables": {
            "model": model.name,
            "copy": h2d,
            "d2d": d2d,
            "expert": measure_expert(be, timer, model, g["tokens"]),
            "dense": measure_dense(be, timer, model, g["dense_tokens"], g["contexts"]),
            "lm_head": measure_lm_head(be, timer, model, g["dense_tokens"]),
            "cpu_expert": measure_cpu_expert(
                be, model, cpu_expert_tokens(g["tokens"]), host_threads, repeat=max(2, min(repeat, 3))
            ),
            **{f"dequant_{fmt}": points for fmt, points in measure_dequant(be, timer, model, quick).items()},
        },
    }


def combine(calibrations: list[dict]) -> dict:
    """One calibration from several passes over the same points: the median of each measured value (of the passes
    that measured it). Passes spread over a measurement (before, between and after its runs) describe a machine
    whose speed drifts better than any single pass."""
    first = calibrations[0]
    if len(calibrations) == 1:
        return first
    out = {k: v for k, v in first.items() if k != "tables"}
    for key in (
        "compute_slowdown",
        "dense_slowdown",
        "copy_slowdown",
        "handoff_us",
        "copy_gap_us",
        "layer_roundtrip_us",
        "copy_issue_us",
        "expert_issue_us",
        "hit_issue_us",
        "dense_issue_us",
        "host_slowdown",
        "activation_latency_us",
    ):  # full passes only
        values = [c[key] for c in calibrations if key in c]
        if values:
            out[key] = round(statistics.median(values), 3)
    decide = [c["decide_us"] for c in calibrations if c.get("decide_us")]
    if decide:
        out["decide_us"] = {
            name: round(statistics.median([d[name] for d in decide if name in d]), 1)
            for name in sorted({n for d in decide for n in d})
        }
    out["source"] = f"{first['source']} (median of {len(calibrations)} passes)"
    tables = {"model": first["tables"]["model"]}
    for name, points in first["tables"].items():
        if name == "model":
            continue
        merged = []
        same = [
            c["tables"][name]
            for c in calibrations  # passes that measured this table at the same points
            if len(c["tables"].get(name) or ()) == len(points)
        ]
        for i, p in enumerate(points):
            values = [t[i][-1] for t in same]
            merged.append(list(p[:-1]) + [statistics.median(values)])
        tables[name] = merged
    out["tables"] = tables
    return out


def write_calibration(path: str | Path, calibration: dict) -> Path:
    """The calibration as a hardware profile (YAML)."""
    text = "# Calibration profile: measured tables that replace the roofline (seconds; sizes in bytes).\n"
    text += yaml.safe_dump(calibration, sort_keys=False, default_flow_style=None)
    atomic_write_bytes(path, text.encode())
    return Path(path)
