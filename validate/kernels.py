"""The torch work of one model, shared by the microbenchmarks and the executor so that what is calibrated is what
runs: one expert's FFN, the dense work attached to one MoE layer, and the LM head.

Weights are random (timings depend on shapes and dtype, not values). An expert's weights live in one flat byte
buffer (a host pool buffer, a cache slot or a working buffer); :func:`expert_views` sees its matrices in it.

The dense work of one MoE layer is what the simulator's ``dense`` table stands for: ``blocks / MoE layers``
attention blocks (q/k/v/o projections, attention of every token over ``context`` cached keys and values, the new
token's keys and values written into the cache), the dense FFN blocks between MoE layers, and the gate GEMM. All
tokens attend over the same (mean) context, as the simulator assumes.

Experts computed on the host CPU beside their weights in host memory (issue 13: Fiddler, kTransformers) run on a
:class:`HostExperts` pool: worker threads standing for the host's cores, each computing one block of every expert's
FFN (:func:`expert_block`), so that the pool works while the calling thread issues the device's work.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sim.specs import ModelSpec

DTYPES = {2: "bfloat16", 4: "float32"}


def check_runnable(model: ModelSpec, where: str) -> None:
    """The validator runs experts' GEMMs in ``dtype_bytes`` weights: quantized experts (``expert_bits``) would need
    a dequantizing kernel it does not have."""
    from sim.errors import ConfigError

    if model.expert_bits is not None and model.expert_bits != 8 * model.dtype_bytes:
        raise ConfigError(f"{where}.expert_bits", f"the validator cannot run quantized experts ({model.name}: "
                          f"{model.expert_bits:g} bits per weight); it runs experts in {8 * model.dtype_bytes}-bit "
                          "weights only")


def torch_dtype(torch, model: ModelSpec):
    return getattr(torch, DTYPES[model.dtype_bytes])


def expert_shapes(model: ModelSpec, d_ff: int | None = None, matrices: int | None = None) -> list[tuple[int, int]]:
    d_ff = model.d_ff if d_ff is None else d_ff
    matrices = model.expert_matrices if matrices is None else matrices
    return [(model.d_model, d_ff)] * (matrices - 1) + [(d_ff, model.d_model)]


def expert_views(flat, model: ModelSpec, dtype):
    """The matrices of one expert inside a flat uint8 buffer of ``model.expert_bytes`` bytes."""
    typed = flat.view(dtype)
    out, at = [], 0
    for r, c in expert_shapes(model):
        out.append(typed[at:at + r * c].view(r, c))
        at += r * c
    return out


def expert_forward(torch, weights, x, gated: bool):
    """One expert FFN: gated: act(x @ w1) * (x @ w3) @ w_out; else act(x @ w_in) @ w_out."""
    if gated:
        h = torch.nn.functional.gelu(x @ weights[0]) * (x @ weights[1])
    else:
        h = torch.relu(x @ weights[0])
    return h @ weights[-1]


def expert_block(torch, weights, x, a: int, b: int, gated: bool):
    """Columns ``a:b`` of an expert's hidden layer and their share of its output: the expert FFN is the sum of its
    blocks (``expert_forward`` is the one block ``0:d_ff``)."""
    if gated:
        h = torch.nn.functional.gelu(x @ weights[0][:, a:b]) * (x @ weights[1][:, a:b])
    else:
        h = torch.relu(x @ weights[0][:, a:b])
    return h @ weights[-1][a:b]


def fill_random(torch, flat, model: ModelSpec, dtype) -> None:
    """Small random values in an expert buffer (so GEMMs see ordinary numbers, not denormals or NaNs)."""
    for w in expert_views(flat, model, dtype):
        w.copy_(torch.randn(w.shape, dtype=torch.float32, device=w.device) * 0.02)


class DenseLayer:
    """The resident (non-expert) weights and KV cache of one MoE layer, and its work per iteration."""

    def __init__(self, torch, model: ModelSpec, role: str, device: str, max_context: int):
        self.torch, self.model = torch, model
        dtype = torch_dtype(torch, model)
        d, h, hd, kv = model.d_model, model.n_heads, model.head_dim, model.n_kv_heads
        per = model.blocks(role) / max(model.moe_layers_of(role), 1)
        self.n_attn = max(1, round(per))
        self.n_ffn = max(0, round(per) - 1) if model.dense_d_ff else 0
        self.max_context = max(1, int(max_context))

        def rnd(*shape):
            return torch.randn(*shape, device=device, dtype=dtype) * 0.02

        self.attn = [(rnd(d, h * hd), rnd(d, 2 * kv * hd), rnd(h * hd, d)) for _ in range(self.n_attn)]
        self.kv = [(rnd(kv, self.max_context, hd), rnd(kv, self.max_context, hd)) for _ in range(self.n_attn)]
        self.ffn = [[rnd(r, c) for r, c in expert_shapes(model, model.dense_d_ff, model.dense_ffn_matrices)]
                    for _ in range(self.n_ffn)]
        self.gate = rnd(d, model.num_experts)

    def __call__(self, x, context: int):
        """The layer's dense work on activations ``x`` [tokens, d_model] over ``context`` cached tokens."""
        torch, m = self.torch, self.model
        t = x.shape[0]
        h, hd, kv = m.n_heads, m.head_dim, m.n_kv_heads
        c = min(max(1, int(context)), self.max_context)
        y = x
        for (wq, wkv, wo), (k_cache, v_cache) in zip(self.attn, self.kv):
            q = (y @ wq).view(t, h, hd).transpose(0, 1)                      # [h, t, hd]
            new = (y @ wkv).view(t, 2, kv, hd)
            k_cache[:, c - 1] = new[0, 0]                                     # the cache grows by a token
            v_cache[:, c - 1] = new[0, 1]
            k, v = k_cache[:, :c], v_cache[:, :c]
            if h != kv:
                k, v = k.repeat_interleave(h // kv, dim=0), v.repeat_interleave(h // kv, dim=0)
            att = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5, dim=-1) @ v  # [h, t, hd]
            y = att.transpose(0, 1).reshape(t, h * hd) @ wo
        for weights in self.ffn:
            y = expert_forward(torch, weights, y, m.dense_ffn_matrices == 3)
        self.routing = torch.topk(y @ self.gate, m.top_k, dim=-1).indices  # the gate's choice, on the device
        return y


class LMHead:
    """The vocabulary projection and greedy sampling over the iteration's tokens."""

    def __init__(self, torch, model: ModelSpec, device: str):
        self.torch = torch
        self.w = torch.randn(model.d_model, model.vocab_size, device=device, dtype=torch_dtype(torch, model)) * 0.02

    def __call__(self, x):
        return (x @ self.w).argmax(dim=-1)


class HostJob:
    """Experts handed to a :class:`HostExperts` pool: :meth:`wait` blocks until all are computed (and raises what a
    worker raised); ``start`` and ``end`` (``time.perf_counter``) span the workers' computing, once waited for."""

    def __init__(self, experts: list, parts: int):
        self.experts = experts
        self.parts = parts
        self.partial = [[None] * parts for _ in experts]
        self.left = [parts] * len(experts)
        self.lock = threading.Lock()
        self.futures: list = []
        self.start = self.end = None

    def add(self, torch, i: int, k: int, y) -> None:
        """Block ``k`` of expert ``i`` is computed; the worker that computes an expert's last block sums them."""
        with self.lock:
            self.partial[i][k] = y
            self.left[i] -= 1
            last = self.left[i] == 0
        if last:
            parts, out = self.partial[i], self.experts[i][2]
            out.copy_(parts[0])
            for p in parts[1:]:
                out.add_(p)
            self.partial[i] = None

    def span(self, t0: float, t1: float) -> None:
        with self.lock:
            self.start = t0 if self.start is None else min(self.start, t0)
            self.end = t1 if self.end is None else max(self.end, t1)

    def wait(self) -> None:
        for f in self.futures:
            f.result()

    @property
    def busy_s(self) -> float:
        return 0.0 if self.start is None else self.end - self.start


class HostExperts:
    """Experts computed on the host CPU, beside their weights in host memory (Fiddler / kTransformers style): a pool
    of ``threads`` worker threads standing for the host's cores.

    Each expert's FFN is split along ``d_ff`` into one block per worker (at least 32 columns each; the first
    matrices' columns, the output matrix's rows: :func:`expert_block`); a job's experts are computed one after
    another, each by every worker (the simulator's ``cpu_expert`` time is one expert over all the host's cores),
    and the worker that finishes an expert's last block sums the blocks into the expert's output rows. Torch ops
    release the interpreter lock, so the pool computes while the calling thread issues the device's work.

    Torch's intra-op thread count: ``intra_op`` sets it while the pool is open (restored by :meth:`close`): 1 beside
    a GPU, where the calling thread only launches kernels, so that each worker is one core and the workers do not
    oversubscribe the host; None keeps the calling thread's (the CPU backend: its ``threads`` then hold for the
    device's work and for each worker alike, and the pool's size is chosen so that together they fit the cores,
    ``validate.backends.default_host_threads``). Every worker sets it again for itself when it starts: a new
    thread's OpenMP (and so MKL's GEMMs) otherwise runs at the machine's default, all cores, and a worker's GEMM
    then waits for straggler threads on busy cores (seen: 10-20x slower at 4 tokens on a loaded 2-core VM)."""

    def __init__(self, torch, model: ModelSpec, threads: int, intra_op: int | None = None):
        self.torch = torch
        self.gated = model.expert_matrices == 3
        self.threads = max(1, int(threads))
        parts = max(1, min(self.threads, model.d_ff // 32))
        bounds = [round(i * model.d_ff / parts) for i in range(parts + 1)]
        self.blocks = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
        self._saved = None
        if intra_op is not None and torch.get_num_threads() != intra_op:
            self._saved = torch.get_num_threads()
            torch.set_num_threads(intra_op)
        self.intra_op = torch.get_num_threads()
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="host-expert", initializer=self._init_worker)
        # start every worker now, not inside a timed layer: each start waits until all have started
        barrier = threading.Barrier(self.threads, timeout=30)
        for f in [self.pool.submit(barrier.wait) for _ in range(self.threads)]:
            f.result()

    def _init_worker(self) -> None:
        self.torch.set_num_threads(self.intra_op)

    def run(self, experts: list, ready=None) -> HostJob:
        """Start computing ``experts``, in order: (weights, x, out) each: the expert's matrices in host memory, its
        input rows [tokens, d_model] and its output rows, both host tensors. ``ready()``, if given, is waited for
        first by every worker (the inputs' device -> host copy)."""
        job = HostJob(experts, len(self.blocks))
        job.futures = [self.pool.submit(self._work, job, k, ready) for k in range(len(self.blocks))]
        return job

    def _work(self, job: HostJob, k: int, ready) -> None:
        torch = self.torch
        a, b = self.blocks[k]
        with torch.inference_mode():  # thread-local: the workers enter it themselves
            if ready is not None:
                ready()
            t0 = time.perf_counter()
            for i, (weights, x, _) in enumerate(job.experts):
                job.add(torch, i, k, expert_block(torch, weights, x, a, b, self.gated))
            job.span(t0, time.perf_counter())

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        if self._saved is not None:
            self.torch.set_num_threads(self._saved)
            self._saved = None
