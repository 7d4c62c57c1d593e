"""The torch work of one model, shared by the microbenchmarks and the executor so that what is calibrated is what
runs: one expert's FFN, the dense work attached to one MoE layer, and the LM head.

Weights are random (timings depend on shapes and dtype, not values). An expert's weights live in one flat byte
buffer (a host pool buffer, a cache slot or a working buffer); :func:`expert_views` sees its matrices in it.

The dense work of one MoE layer is what the simulator's ``dense`` table stands for: ``blocks / MoE layers``
attention blocks (q/k/v/o projections, attention of every token over ``context`` cached keys and values, the new
token's keys and values written into the cache), the dense FFN blocks between MoE layers, and the gate GEMM. All
tokens attend over the same (mean) context, as the simulator assumes.

Experts computed on the host CPU beside their weights in host memory (as Fiddler and kTransformers do) run on a
:class:`HostExperts` pool: worker threads standing for the host's cores, each computing one block of every expert's
FFN (:func:`expert_block`), so that the pool works while the calling thread issues the device's work.

Quantized experts (a model's ``expert_bits``, :func:`expert_format`): weight-only int8 (per-output-channel fp16
scales) from 8 to 8.5 bits per weight, packed int4 (two weights per byte, fp16 scales per group of input rows) from
4 to 4.5; any other width than these and ``8 * dtype_bytes`` is refused. A quantized expert's buffer is exactly
``model.expert_bytes`` (the simulator's copy size; layout in :class:`QuantLayout`); :class:`ExpertStore`
de-quantizes it on the device into a working buffer at ``dtype_bytes`` (torch ops: nibbles unpacked with bit ops,
the zero point subtracted, the scales multiplied) before its GEMMs, which then run as a dense expert's.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from moebase.model import ModelSpec

DTYPES = {2: "bfloat16", 4: "float32"}


#: The quantized expert formats the validator runs, by ``expert_bits`` (bits per weight, scales included): packed
#: int4 from 4 to 4.5 bits, int8 from 8 to 8.5; ``8 * dtype_bytes`` (or no ``expert_bits``) is the dense path.
QUANT_RANGES = {"int4": (4.0, 4.5), "int8": (8.0, 8.5)}
#: Bytes of one scale (fp16).
SCALE_BYTES = 2
#: int4 group sizes (weights per scale along a matrix's input dimension), largest first: the smallest whose scales
#: fit the model's ``expert_bits`` is used (4 + 16/g bits per weight: 64 -> 4.25, 32 -> 4.5).
INT4_GROUPS = (128, 64, 32)
INT4_ZERO = 8  # a nibble stores q + 8 for q in [-8, 7]


def expert_format(model: ModelSpec) -> str | None:
    """The format the validator holds ``model``'s routed experts in: None (dense, ``dtype_bytes`` per weight),
    ``"int8"`` or ``"int4"``; ValueError (a one-line message) for an ``expert_bits`` it cannot run."""
    bits = model.expert_bits
    if bits is None or bits == 8 * model.dtype_bytes:
        return None
    for name, (lo, hi) in QUANT_RANGES.items():
        if lo <= bits <= hi:
            return name
    raise ValueError(
        f"the validator runs experts in packed int4 (4 to 4.5 bits per weight, scales included), int8 "
        f"(8 to 8.5) or unquantized ({8 * model.dtype_bytes} bits), not {bits:g} bits ({model.name})"
    )


def check_runnable(model: ModelSpec, where: str) -> None:
    """Raise a ConfigError naming ``WHERE.expert_bits`` when the validator cannot hold ``model``'s experts in any
    format it runs (:func:`expert_format`)."""
    from moebase.errors import ConfigError

    try:
        expert_format(model)
    except ValueError as exc:
        raise ConfigError(f"{where}.expert_bits", str(exc)) from None


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
        out.append(typed[at : at + r * c].view(r, c))
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


def dense_expert_bytes(model: ModelSpec) -> int:
    """Bytes of one routed expert's weights at ``dtype_bytes`` per weight: what a quantized expert is de-quantized
    into before its GEMMs (and what a dense expert is copied as)."""
    return model.expert_params * model.dtype_bytes


def _dequant_part(torch, fmt: str, group: int | None, q, s, out):
    """De-quantize one (part of a) matrix into ``out`` [in, out_features] (working dtype): int8 ``q`` [in, out]
    times its per-output-channel scales ``s`` [out]; int4 ``q`` [in/2, out] (two input rows per byte: the low
    nibble the even row, the high one the odd row, each ``q + 8``) less the zero point 8, times its group scales
    ``s`` [in/group, out]."""
    if fmt == "int8":
        out.copy_(q)
        out.mul_(s)
        return out
    assert group is not None, "an int4 layout has its group"
    r, c = out.shape
    pairs = out.view(r // 2, 2, c)
    pairs[:, 0].copy_(torch.bitwise_and(q, 15))
    pairs[:, 1].copy_(torch.bitwise_right_shift(q, 4))
    out.sub_(INT4_ZERO)
    out.view(r // group, group, c).mul_(s.unsqueeze(1))
    return out


class QuantLayout:
    """Where a quantized expert's parts lie in its flat buffer of exactly ``model.expert_bytes`` bytes (what a copy
    moves, a host buffer and a device slot hold: the simulator's size).

    Each matrix ``W`` [in, out] of the expert (``expert_shapes``; the FFN computes ``x @ W``) is stored as:

    - ``int8``: ``q`` int8 [in, out], row-major (``W ~ q * s``), and one fp16 scale per output channel ``s`` [out]
      (symmetric: ``s = max|W[:, j]| / 127``);
    - ``int4``: ``q`` uint8 [in/2, out], row-major, two 4-bit values per byte: byte ``(i, j)`` holds input rows
      ``2i`` (low nibble) and ``2i + 1`` (high nibble) of column ``j``, each stored as ``q + 8`` (``q`` in [-8, 7],
      zero point 8), and fp16 scales ``s`` [in/group, out], one per ``group`` consecutive input rows of a column
      (``s = max|W| / 7`` over the group). ``group`` is the smallest of 32, 64, 128 whose scales fit
      ``expert_bits`` (4 + 16/group bits per weight: 4.5 -> 32, 4.25 -> 64, else 128) and divides every input
      dimension.

    The buffer holds every matrix's ``q`` in order, then (from an even offset) every matrix's scales in order, then
    zero padding up to ``expert_bytes``. Where the scales do not fit (``expert_bits`` 8 exactly: the simulator's
    bytes leave them out) they stay resident on the device instead (``scales_inline`` False), a few kilobytes per
    expert: one resident copy serves every expert here, since values change no timing."""

    def __init__(self, model: ModelSpec, fmt: str | None = None):
        self.model = model
        fmt = fmt or expert_format(model)
        if fmt is None or fmt not in QUANT_RANGES:
            raise ValueError(f"{model.name}: not a quantized expert format: {fmt!r}")
        self.format: str = fmt
        self.nbytes = model.expert_bytes
        self.shapes = expert_shapes(model)
        bits = model.expert_bits if model.expert_bits is not None else QUANT_RANGES[self.format][0]
        #: weights per int4 scale along a matrix's input dimension; None for int8 (one scale per output channel)
        self.group: int | None = None
        if self.format == "int4":
            ins = {r for r, _ in self.shapes}
            fits = [g for g in INT4_GROUPS if all(r % g == 0 for r in ins)]
            if not fits:  # a small model: the largest power of two dividing every input dimension
                g = 64
                while g > 2 and any(r % g for r in ins):
                    g //= 2
                if any(r % g for r in ins):
                    raise ValueError(f"{model.name}: int4 experts need even d_model and d_ff")
                fits = [g]
            within = [g for g in fits if 4 + 8 * SCALE_BYTES / g <= bits + 1e-9]
            self.group = min(within) if within else max(fits)
        self.q_parts, self.s_parts = [], []  # (offset, shape) in bytes / elements
        at = 0
        for r, c in self.shapes:
            shape = (r // 2, c) if self.format == "int4" else (r, c)
            self.q_parts.append((at, shape))
            at += shape[0] * shape[1]
        self.q_bytes = at
        at += at % 2
        s_at = at
        for r, c in self.shapes:
            s_shape = (r // self.group, c) if self.group is not None else (c,)  # int4 by groups; int8 per column
            n = s_shape[0] * (s_shape[1] if len(s_shape) > 1 else 1)
            self.s_parts.append((at, s_shape, n))
            at += n * SCALE_BYTES
        self.s_bytes = at - s_at
        if self.q_bytes > self.nbytes:
            raise ValueError(
                f"{model.name}: {self.format} weights ({self.q_bytes} bytes) exceed expert_bytes ({self.nbytes})"
            )
        self.scales_inline = at <= self.nbytes
        if not self.scales_inline:  # resident: offsets within the resident scale buffer
            self.s_parts = [(o - s_at, shape, n) for o, shape, n in self.s_parts]
        self.payload_bytes = at if self.scales_inline else self.q_bytes
        self.resident: dict[str, Any] = {}  # device type -> the resident scales' flat buffer, when not inline

    @property
    def bits_per_weight(self) -> float:
        """The format's own width, scales included."""
        return 8 * (self.q_bytes + self.s_bytes) / self.model.expert_params

    def describe(self) -> str:
        where = "in the copied buffer" if self.scales_inline else "resident on the device"
        grp = f", group {self.group}" if self.group else ", per output channel"
        return (
            f"{self.format} experts ({self.bits_per_weight:.3f} bits per weight{grp}; fp16 scales {where}) in "
            f"{self.nbytes} bytes each"
        )

    def views(self, torch, flat) -> QuantExpert:
        """The parts of the quantized expert held in ``flat`` (uint8, ``nbytes``)."""
        if flat.numel() != self.nbytes:
            raise ValueError(f"a {self.format} expert buffer holds {self.nbytes} bytes, got {flat.numel()}")
        if not self.scales_inline:
            self.allocate_resident(torch, flat.device)
        src = flat if self.scales_inline else self.resident[flat.device.type]
        parts = []
        for (qo, qs), (so, ss, n) in zip(self.q_parts, self.s_parts):
            q = flat[qo : qo + qs[0] * qs[1]].view(*qs)
            if self.format == "int8":
                q = q.view(torch.int8)
            s = src[so : so + n * SCALE_BYTES].view(torch.float16).view(*ss)
            parts.append((q, s))
        return QuantExpert(self, parts)

    def allocate_resident(self, torch, device) -> None:
        """The resident scales on ``device`` (when not inline): a copy of those on another device if any."""
        kind = torch.device(device).type
        if not self.scales_inline and kind not in self.resident:
            other = next(iter(self.resident.values()), None)
            self.resident[kind] = (
                torch.zeros(self.s_bytes, dtype=torch.uint8, device=device) if other is None else other.to(device)
            )

    def quantize_into(self, torch, flat, weights) -> None:
        """Quantize dense matrices ``weights`` ([in, out] each, any float dtype) into ``flat`` (and the resident
        scales); the padding is zeroed."""
        self.allocate_resident(torch, flat.device)
        flat[self.q_bytes :].zero_()
        qe = self.views(torch, flat)
        for (q, s), w in zip(qe.parts, weights):
            w = w.float()
            if self.format == "int8":
                scale = (w.abs().amax(0) / 127).clamp_min(2.0**-24).half()  # fp16's smallest: never 0
                s.copy_(scale)
                q.copy_(torch.round(w / scale.float()).clamp(-127, 127).to(torch.int8))
            else:
                r, c = w.shape
                g = self.group
                assert g is not None, "an int4 layout has its group"
                grouped = w.view(r // g, g, c)
                scale = (grouped.abs().amax(1) / 7).clamp_min(2.0**-24).half()  # fp16's smallest: never 0
                s.copy_(scale)
                n = (torch.round(grouped / scale.float().unsqueeze(1)).clamp(-8, 7) + INT4_ZERO).to(torch.uint8)
                n = n.view(r, c)
                q.copy_(torch.bitwise_or(n[0::2], torch.bitwise_left_shift(n[1::2], 4)))


class QuantExpert:
    """One quantized expert in its buffer: ``parts`` (q, scales) per matrix, laid out by a :class:`QuantLayout`."""

    __slots__ = ("layout", "parts")

    def __init__(self, layout: QuantLayout, parts: list):
        self.layout, self.parts = layout, parts

    def dequantize(self, torch, out: list) -> list:
        """De-quantize every matrix into ``out`` (the working buffer's matrices, ``expert_views``); returns it."""
        fmt, g = self.layout.format, self.layout.group
        for (q, s), w in zip(self.parts, out):
            _dequant_part(torch, fmt, g, q, s, w)
        return out

    def block(self, torch, a: int, b: int, dtype) -> list:
        """The matrices of hidden columns ``a:b`` (the first matrices' columns, the output matrix's rows),
        de-quantized into new tensors: what :func:`expert_block` reads as the block ``0:b-a``. For int4, ``a`` and
        ``b`` must be multiples of the layout's group."""
        fmt, g = self.layout.format, self.layout.group
        out = []
        last = len(self.parts) - 1
        for i, (q, s) in enumerate(self.parts):
            if i < last:  # [d_model, d_ff]: output columns a:b
                qq, ss = q[:, a:b], (s[a:b] if fmt == "int8" else s[:, a:b])
                rows = q.shape[0] * (2 if fmt == "int4" else 1)
                w = torch.empty(rows, b - a, dtype=dtype)
            else:  # [d_ff, d_model]: input rows a:b
                if fmt == "int8":
                    qq, ss = q[a:b], s
                else:
                    assert g is not None, "an int4 layout has its group"
                    qq, ss = q[a // 2 : b // 2], s[a // g : b // g]
                w = torch.empty(b - a, q.shape[1], dtype=dtype)
            out.append(_dequant_part(torch, fmt, g, qq, ss, w))
        return out


class ExpertStore:
    """How the validator holds one model's routed experts: flat uint8 buffers of ``nbytes`` (``model.expert_bytes``:
    what the simulator copies) that :meth:`handle` turns into what :meth:`weights` makes ready for
    :func:`expert_forward`. Dense experts: the buffer's matrices (``expert_views``). Quantized ones
    (:class:`QuantLayout`): de-quantized on the device into one working buffer of ``dense_bytes`` (the expert at
    ``dtype_bytes``) before every use, then computed as a dense expert."""

    def __init__(self, torch, model: ModelSpec, device: str):
        self.torch, self.model = torch, model
        self.dtype = torch_dtype(torch, model)
        self.format = expert_format(model)
        self.nbytes = model.expert_bytes
        self.dense_bytes = dense_expert_bytes(model)
        self.layout = QuantLayout(model, self.format) if self.format else None
        if self.layout is not None:
            self.layout.allocate_resident(torch, device)
            self.scratch = torch.empty(self.dense_bytes, dtype=torch.uint8, device=device)
            self.scratch_views = expert_views(self.scratch, model, self.dtype)

    @property
    def quantized(self) -> bool:
        return self.layout is not None

    def handle(self, flat):
        """What :meth:`weights` takes for the expert in ``flat``: its matrices, or its :class:`QuantExpert`."""
        return (
            self.layout.views(self.torch, flat)
            if self.layout is not None
            else expert_views(flat, self.model, self.dtype)
        )

    def weights(self, handle) -> list:
        """The expert's matrices, ready for :func:`expert_forward` (a quantized one de-quantized first)."""
        if self.layout is None:
            return handle
        return handle.dequantize(self.torch, self.scratch_views)

    def fill(self, flat) -> None:
        """Random weights in ``flat`` (quantized from small random values for a quantized format)."""
        torch = self.torch
        if self.layout is None:
            fill_random(torch, flat, self.model, self.dtype)
            return
        dense = [torch.randn(r, c, dtype=torch.float32, device=flat.device) * 0.02 for r, c in self.layout.shapes]
        self.layout.quantize_into(torch, flat, dense)

    def describe(self) -> str:
        if self.layout is None:
            return f"dense experts ({8 * self.model.dtype_bytes}-bit) in {self.nbytes} bytes each"
        return self.layout.describe()


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
        self.ffn = [
            [rnd(r, c) for r, c in expert_shapes(model, model.dense_d_ff, model.dense_ffn_matrices)]
            for _ in range(self.n_ffn)
        ]
        self.gate = rnd(d, model.num_experts)

    def __call__(self, x, context: int):
        """The layer's dense work on activations ``x`` [tokens, d_model] over ``context`` cached tokens."""
        torch, m = self.torch, self.model
        t = x.shape[0]
        h, hd, kv = m.n_heads, m.head_dim, m.n_kv_heads
        c = min(max(1, int(context)), self.max_context)
        y = x
        for (wq, wkv, wo), (k_cache, v_cache) in zip(self.attn, self.kv):
            q = (y @ wq).view(t, h, hd).transpose(0, 1)  # [h, t, hd]
            new = (y @ wkv).view(t, 2, kv, hd)
            k_cache[:, c - 1] = new[0, 0]  # the cache grows by a token
            v_cache[:, c - 1] = new[0, 1]
            k, v = k_cache[:, :c], v_cache[:, :c]
            if h != kv:
                k, v = k.repeat_interleave(h // kv, dim=0), v.repeat_interleave(h // kv, dim=0)
            att = torch.softmax(q @ k.transpose(1, 2) / hd**0.5, dim=-1) @ v  # [h, t, hd]
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
        self.partial: list[list] = [[None] * parts for _ in experts]  # an expert's blocks; [] once summed
        self.left = [parts] * len(experts)
        self.lock = threading.Lock()
        self.futures: list = []
        self.start: float | None = None
        self.end: float | None = None

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
            self.partial[i] = []

    def span(self, t0: float, t1: float) -> None:
        with self.lock:
            self.start = t0 if self.start is None else min(self.start, t0)
            self.end = t1 if self.end is None else max(self.end, t1)

    def wait(self) -> None:
        for f in self.futures:
            f.result()

    @property
    def busy_s(self) -> float:
        return 0.0 if self.start is None or self.end is None else self.end - self.start


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
        fmt = expert_format(model)
        # an int4 expert's blocks start at whole groups of its output matrix's input rows
        group = QuantLayout(model, fmt).group if fmt == "int4" else None
        align = 1 if group is None else group
        parts = max(1, min(self.threads, model.d_ff // max(32, align)))
        bounds = [align * round(i * model.d_ff / parts / align) for i in range(parts + 1)]
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
        """Start computing ``experts``, in order: (weights, x, out) each: the expert's matrices in host memory (or
        its :class:`QuantExpert`: each worker de-quantizes its block's slices before computing them), its
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
                if isinstance(weights, QuantExpert):  # its block de-quantized by this worker, then computed
                    y = expert_block(torch, weights.block(torch, a, b, x.dtype), x, 0, b - a, self.gated)
                else:
                    y = expert_block(torch, weights, x, a, b, self.gated)
                job.add(torch, i, k, y)
            job.span(t0, time.perf_counter())

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        if self._saved is not None:
            self.torch.set_num_threads(self._saved)
            self._saved = None
