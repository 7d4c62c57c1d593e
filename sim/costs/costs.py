"""How long things take, in seconds: host->device copies, device->device copies, one expert's FFN, and the dense
(non-expert) work attached to one MoE layer.

By default every duration is a roofline over a :class:`~sim.config.hardware.HardwareSpec`: the larger of compute time
(FLOPs / FLOP rate) and memory time (bytes moved / HBM bandwidth), plus a fixed cost per kernel launch or copy.
A hardware profile's measured ``tables`` (from a calibration run) replace the roofline where given:

- ``copy``, ``d2d`` (bytes -> s), ``expert`` and ``lm_head`` (tokens -> s) are interpolated linearly between
  points, held at the first point's value below it, and extrapolated beyond the last point with the last two
  points' slope (never negative);
- ``dense`` (tokens, context -> s) is interpolated bilinearly over its grid, held at the edge below the grid and
  extrapolated (never below the edge value) above it. One table serves both stacks of an encoder-decoder model.

The expert and dense tables hold for one model's shapes: a :class:`CostModel` refuses tables measured for another
model (:class:`~moebase.errors.ConfigError` naming ``hardware.tables.model``).

Experts computed on the host CPU (as Fiddler, kTransformers and llama.cpp ``--n-cpu-moe`` do): :meth:`CostModel.
cpu_expert_s` is a roofline of the expert's weight bytes, at their storage width (``expert_bits``), read from host
memory against its FLOPs at the host's rate for that weight format, plus a fixed cost per call; a ``cpu_expert``
table (tokens -> s, measured with all ``cpu_cores``) replaces it. :meth:`CostModel.activation_copy_s` prices the
activations that cross the link instead of the weights. Neither is used by anything that existed before them.

A serving-system profile (:class:`~sim.config.system.SystemSpec`, the software) adds to these: a fixed time per
expert computed on the GPU (``expert_call_us``) and its de-quantization (``dequant``: a roofline of the quantized
weights read and the 16-bit weights written at HBM bandwidth, or the system's ``dequant`` table), a fixed time per
expert copy (``copy_overhead_us``) and pageable copies at ``pageable_fraction`` of the bandwidth, the dense weights'
format (``dense_format``: the bytes the dense roofline reads, and their de-quantization), and the host kernels'
threads, share of host memory bandwidth and per-call cost. The ``ideal`` system (the default) adds nothing, and
every duration is then computed exactly as without a system.

All methods are plain Python over scalars and memoise what they compute: they are called once per simulated event.
"""

from __future__ import annotations

from bisect import bisect_right

from moebase.model import ModelSpec
from sim.config.hardware import HardwareSpec, check_tables, cpu_format_rate
from sim.config.host_choice import uses_host_model
from sim.config.system import DEQUANT_OUT_BITS, IDEAL, SystemSpec
from sim.costs.host_costs import HostCosts

DIRECTIONS = ("h2d", "d2h")  # activation copies: host -> device, device -> host

ATTENTION_KERNELS = 5  # per attention sublayer: norm, fused q/k/v projection, attention, output projection, residual
FFN_EXTRA_KERNELS = 2  # around a dense FFN block, beside one GEMM per weight matrix: norm, residual
GATE_KERNELS = 2  # the router GEMM, then softmax + top-k
MOE_EXTRA_KERNELS = 1  # the norm in front of an MoE layer
_CACHE_LIMIT = 1 << 17  # memo entries kept per method before the memo is cleared


class _Table1D:
    """Piecewise-linear y(x) over sorted points; held below the first, extrapolated (slope >= 0) beyond the last."""

    __slots__ = ("xs", "ys", "tail")

    def __init__(self, points):
        self.xs = [float(p[0]) for p in points]
        self.ys = [float(p[1]) for p in points]
        if len(self.xs) < 2:
            raise ValueError("a table needs at least 2 points")
        self.tail = max(0.0, (self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2]))

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] + self.tail * (x - xs[-1])
        i = bisect_right(xs, x)
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


def _axis(xs: list[float], x: float) -> tuple[int, int, float]:
    """Bracketing indices and weight of ``x`` on a sorted axis: w = 0 below it, w > 1 beyond it."""
    n = len(xs)
    if n == 1 or x <= xs[0]:
        return 0, 0, 0.0
    if x >= xs[-1]:
        i = n - 1
    else:
        i = bisect_right(xs, x)
    return i - 1, i, (x - xs[i - 1]) / (xs[i] - xs[i - 1])


class _Table2D:
    """Bilinear y(t, c) over a full grid; held below it, extrapolated above it but never below the edge value."""

    __slots__ = ("ts", "cs", "v")

    def __init__(self, points):
        self.ts = sorted({float(p[0]) for p in points})
        self.cs = sorted({float(p[1]) for p in points})
        grid = {(float(p[0]), float(p[1])): float(p[2]) for p in points}
        try:
            self.v = [[grid[(t, c)] for c in self.cs] for t in self.ts]
        except KeyError as exc:
            raise ValueError(f"dense table is not a full grid: missing {exc.args[0]}") from None

    def _at(self, ti, ci, wt, wc) -> float:
        v = self.v
        t0, t1 = ti
        c0, c1 = ci
        lo = v[t0][c0] + (v[t0][c1] - v[t0][c0]) * wc
        hi = v[t1][c0] + (v[t1][c1] - v[t1][c0]) * wc
        return lo + (hi - lo) * wt

    def __call__(self, t: float, c: float) -> float:
        t0, t1, wt = _axis(self.ts, t)
        c0, c1, wc = _axis(self.cs, c)
        value = self._at((t0, t1), (c0, c1), wt, wc)
        if wt > 1.0 or wc > 1.0:
            value = max(value, self._at((t0, t1), (c0, c1), min(wt, 1.0), min(wc, 1.0)))
        return value


class Memo(dict):
    """``key -> f(key)``, each computed once (a subscript when known): a cost function of a token count, say, read
    many times per run."""

    def __init__(self, f):
        super().__init__()
        self.f = f

    def __missing__(self, key):
        value = self[key] = self.f(key)
        return value


class CostModel:
    """Durations, in seconds, of the operations the engine schedules, for one model on one machine."""

    def __init__(self, model: ModelSpec, hw: HardwareSpec, system: SystemSpec | None = None):
        check_tables(model, hw)
        self.model = model
        self.hw = hw
        if system is None:
            system = IDEAL
        self.system = sy = system
        # the software's costs, each applied only when it changes something (so that ideal is bit for bit)
        self.copy_overhead_s = sy.copy_overhead_s
        self.copy_fraction = sy.pageable_fraction if sy.pageable_copies else 1.0
        self.expert_call_s = sy.expert_call_s
        self.dense_weight_bytes = model.dtype_bytes if sy.dense_bits is None else sy.dense_bits / 8
        self.cpu_mem_bw = hw.cpu_mem_bw if sy.host_bw_fraction == 1.0 else hw.cpu_mem_bw * sy.host_bw_fraction
        self.cpu_overhead_s = hw.cpu_expert_overhead_s if sy.host_call_s is None else sy.host_call_s
        self.cpu_threads = sy.host_threads
        self._dequant_table = self._measured_dequant() if sy.dequant in ("table", "measured") else None
        self.dequant_s = self._dequant_expert_s()
        self.dense_dequant = sy.dequant == "roofline" and self.dense_weight_bytes * 8 < DEQUANT_OUT_BITS
        self.rate = hw.rate(model.dtype_bytes)
        t = hw.tables
        self._copy_table = _Table1D(t.copy) if t is not None and t.copy is not None else None
        self._d2d_table = _Table1D(t.d2d) if t is not None and t.d2d is not None else None
        self._expert_table = _Table1D(t.expert) if t is not None and t.expert is not None else None
        self._dense_table = _Table2D(t.dense) if t is not None and t.dense is not None else None
        self._lm_head_table = _Table1D(t.lm_head) if t is not None and t.lm_head is not None else None
        self._cpu_expert_table = _Table1D(t.cpu_expert) if t is not None and t.cpu_expert is not None else None
        self._expert_memo: dict[int, float] = {}
        self._dense_memo: dict[tuple, float] = {}
        self._cpu_expert_memo: dict[tuple, float] = {}
        self.cpu_format, self.cpu_rate = cpu_format_rate(hw, model.expert_bits_per_weight)
        if sy.host_compute_fraction != 1.0:  # the system's share of the host's compute (prompt batches)
            self.cpu_rate *= sy.host_compute_fraction
        # the host as it behaves (NUMA, threads, kernel family: sim/costs/host_costs.py), when the system sets it
        self.host = HostCosts(model, hw, sy) if uses_host_model(sy, hw) else None
        self.cpu_layer_s = 0.0 if self.host is None else self.host.layer_s  # per MoE layer with host experts

    @property
    def expert_bytes(self) -> int:
        return self.model.expert_bytes

    def _measured_dequant(self) -> _Table1D | None:
        """The de-quantization table a ``dequant: table`` or ``measured`` system prices with: its own
        ``tables.dequant``, else the calibration's table for the experts' format (``dequant_int4`` / ``dequant_int8``,
        ``validate microbench``); None when neither exists."""
        sy, t = self.system, self.hw.tables
        if sy.tables is not None and sy.tables.dequant is not None:
            return _Table1D(sy.tables.dequant)
        points = t.dequant_for(self.model.expert_bits_per_weight) if t is not None else None
        return _Table1D(points) if points is not None else None

    def _dequant_expert_s(self) -> float:
        """The system's de-quantization of one expert's weights on the GPU before it computes: 0 with ``dequant:
        none`` or 16-bit and wider weights; ``roofline``: the quantized bytes read plus the 16-bit weights written,
        over HBM bandwidth; ``table`` / ``measured``: the measured table (:meth:`_measured_dequant`) at the quantized
        expert's bytes (``measured``: the roofline where none was measured; ``table`` is refused at load then)."""
        mode, m = self.system.dequant, self.model
        if mode == "none" or m.expert_bits_per_weight >= DEQUANT_OUT_BITS:
            return 0.0
        if self._dequant_table is not None:
            return self._dequant_table(m.expert_bytes)
        return (m.expert_bytes + m.expert_params * DEQUANT_OUT_BITS / 8) / self.hw.hbm_bw

    def writeback_s(self, nbytes: int) -> float:
        """An evicted expert of ``nbytes`` written back device -> host: latency + bytes / ``d2h_bw_gb_s``."""
        if nbytes <= 0:
            return 0.0
        return self.hw.pcie_latency_s + nbytes / (self.hw.d2h_bw * self.copy_fraction)

    # ------------------------------------------------------------------ copies
    def copy_s(self, nbytes: int) -> float:
        """Host -> device copy of ``nbytes`` (pinned): latency + bytes / link bandwidth, or the copy table; with
        the system's pageable copies, the bandwidth times ``pageable_fraction`` (a table's time over it), and its
        ``copy_overhead_us`` on top."""
        if nbytes <= 0:
            return 0.0
        frac = self.copy_fraction
        if self._copy_table is not None:
            value = self._copy_table(nbytes) if frac == 1.0 else self._copy_table(nbytes) / frac
        elif frac == 1.0:
            value = self.hw.pcie_latency_s + nbytes / self.hw.pcie_bw
        else:
            value = self.hw.pcie_latency_s + nbytes / (self.hw.pcie_bw * frac)
        return value + self.copy_overhead_s if self.copy_overhead_s else value

    def d2d_s(self, nbytes: int) -> float:
        """Device -> device copy of ``nbytes``: one launch + bytes / d2d bandwidth, or the d2d table."""
        if nbytes <= 0:
            return 0.0
        if self._d2d_table is not None:
            return self._d2d_table(nbytes)
        return self.hw.launch_overhead_s + nbytes / self.hw.d2d_bw

    # ------------------------------------------------------------------ compute
    def _roofline(self, flops: float, nbytes: float) -> float:
        return max(flops / self.rate, nbytes / self.hw.hbm_bw)

    def expert_s(self, tokens: int) -> float:
        """One expert's FFN on ``tokens`` tokens (0 for none): a launch per weight matrix + the roofline of its
        FLOPs against its weight bytes plus the activations read and written; or the expert table."""
        memo = self._expert_memo
        try:
            return memo[tokens]
        except KeyError:
            pass
        n = int(tokens)
        if n <= 0:
            value = 0.0
        elif self._expert_table is not None:
            value = self._expert_table(n)
        else:
            m = self.model
            activations = 2 * n * m.d_model * m.dtype_bytes
            value = m.expert_matrices * self.hw.launch_overhead_s + self._roofline(
                n * m.expert_flops_per_token, m.expert_bytes + activations
            )
        if n > 0 and (self.dequant_s or self.expert_call_s):
            value = value + self.dequant_s + self.expert_call_s
        if len(memo) >= _CACHE_LIMIT:
            memo.clear()
        memo[tokens] = value
        return value

    def dense_s(self, role: str, tokens: int, context: float) -> float:
        """The dense work attached to ONE MoE layer of the ``role`` stack ("encoder"/"decoder") in one iteration
        over ``tokens`` tokens whose mean attention context is ``context`` tokens (0 for no tokens).

        A stack of B blocks with M MoE layers gives each MoE layer B/M attention blocks, (B-M)/M dense FFN blocks,
        its shared experts, its gate and the launches of all of them. Each part is a roofline: attention reads its
        weights once and each token's K/V over its context (``tokens * context * kv bytes per block``), with FLOPs
        ``2 * params * tokens + 4 * tokens * context * n_heads * head_dim``; decoder blocks of an encoder-decoder
        model have a second (cross-) attention sublayer, taken over the same context. The dense table, when given,
        replaces all of it.
        """
        key = (role, tokens, context)
        memo = self._dense_memo
        try:
            return memo[key]
        except KeyError:
            pass
        m = self.model
        if role not in ("encoder", "decoder"):
            raise ValueError(f"role must be 'encoder' or 'decoder', got {role!r}")
        moe = m.moe_layers_of(role)
        if moe == 0:
            raise ValueError(f"model {m.name!r} has no {role} MoE layers")
        n = int(tokens)
        ctx = max(float(context), 0.0)
        if n <= 0:
            value = 0.0
        elif self._dense_table is not None:
            value = self._dense_table(n, ctx)
        else:
            value = self._dense_roofline(role, n, ctx, moe)
        if len(memo) >= _CACHE_LIMIT:
            memo.clear()
        memo[key] = value
        return value

    def _dense_roofline(self, role: str, n: int, ctx: float, moe: int) -> float:
        m, launch, dt = self.model, self.hw.launch_overhead_s, self.model.dtype_bytes
        wb = self.dense_weight_bytes  # bytes per dense weight (dt unless the system sets dense_format)
        weights: float = 0  # dense weights read per MoE layer (for their de-quantization)
        blocks = m.blocks(role)
        act = n * m.d_model * dt  # one activation tensor [tokens, d_model]

        sublayers = 2 if (role == "decoder" and m.is_encoder_decoder) else 1
        ap = m.attention_params(role)
        attn_flops = 2 * ap * n + sublayers * 4 * n * ctx * m.n_heads * m.head_dim
        attn_bytes = ap * wb + sublayers * (n * ctx * m.kv_bytes_per_block_token + 2 * act)
        attention = self._roofline(attn_flops, attn_bytes) + sublayers * ATTENTION_KERNELS * launch

        total = (blocks / moe) * attention
        weights += (blocks / moe) * ap
        dense_blocks = blocks - moe
        if dense_blocks:
            p = m.dense_ffn_params
            ffn = self._roofline(2 * p * n, p * wb + 2 * act) + (m.dense_ffn_matrices + FFN_EXTRA_KERNELS) * launch
            total += (dense_blocks / moe) * ffn
            weights += (dense_blocks / moe) * p
        if m.shared_expert_d_ff:
            p = m.shared_expert_params
            total += self._roofline(2 * p * n, p * wb + 2 * act) + m.expert_matrices * launch
            weights += p
        p = m.gate_params
        total += self._roofline(2 * p * n, p * wb + act) + GATE_KERNELS * launch
        total += MOE_EXTRA_KERNELS * launch
        if self.dense_dequant:  # the quantized dense weights read, 16-bit ones written, before they compute
            total += weights * (wb + DEQUANT_OUT_BITS / 8) / self.hw.hbm_bw
        return total

    def lm_head_s(self, tokens: int) -> float:
        """The LM head (vocabulary projection) over ``tokens`` tokens, once per iteration: not part of any MoE
        layer's dense work; a roofline plus two launches (GEMM, sampling), or the lm_head table."""
        n = int(tokens)
        if n <= 0:
            return 0.0
        if self._lm_head_table is not None:
            return self._lm_head_table(n)
        m = self.model
        p = m.vocab_size * m.d_model
        return (
            self._roofline(2 * p * n, p * m.dtype_bytes + n * (m.d_model + m.vocab_size) * m.dtype_bytes)
            + 2 * self.hw.launch_overhead_s
        )

    # ------------------------------------------------------------------ the host CPU computing experts
    def cpu_expert_s(self, tokens: int, cores: int | None = None) -> float:
        """One routed expert's FFN on the host CPU over ``tokens`` tokens (0 for none), its weights in host memory.

        ``cpu_expert_overhead_us`` + the larger of the weight bytes (:attr:`expert_bytes`, at the experts' storage
        width) plus the activations read and written, over ``cpu_mem_bw_gb_s``, and ``tokens * 2 * expert_params``
        FLOPs at the host's rate for that width (:meth:`~sim.config.hardware.HardwareSpec.cpu_rate`). Memory-bound
        at a few tokens (a decode step), compute-bound at many (a prefill). A ``cpu_expert`` table replaces the
        roofline.

        ``cores`` (default: all ``cpu_cores``) gives the expert fewer cores: bandwidth and throughput both shrink in
        proportion (an approximation: a few cores of a server can draw more than their share of its bandwidth), and
        a table's time grows in inverse proportion (its fixed part too).

        A system that sets ``numa``, ``host_kernel``, ``host_isa`` (or ``host_threads`` on a CPU part stating
        ``core_bw_gb_s``) is priced by :class:`~sim.costs.host_costs.HostCosts` instead (a table still wins);
        :attr:`cpu_layer_s` is then its cost per MoE layer with host experts."""
        key = (tokens, cores)
        memo = self._cpu_expert_memo
        try:
            return memo[key]
        except KeyError:
            pass
        hw, given = self.hw, cores
        if cores is None:
            cores = self.cpu_threads  # the system's host threads (None: all cores)
        if cores is None:
            share = 1.0
        else:
            c = int(cores)
            if c < 1:
                raise ValueError(f"cores must be >= 1, got {cores!r}")
            share = min(c, hw.cpu_cores) / hw.cpu_cores
        n = int(tokens)
        if n <= 0:
            value = 0.0
        elif self._cpu_expert_table is not None:
            value = self._cpu_expert_table(n) / share
        elif self.host is not None:
            value = self.host.expert_s(n, given)
        else:
            m = self.model
            activations = 2 * n * m.d_model * m.dtype_bytes
            value = self.cpu_overhead_s + max(
                n * m.expert_flops_per_token / (self.cpu_rate * share),
                (m.expert_bytes + activations) / (self.cpu_mem_bw * share),
            )
        if len(memo) >= _CACHE_LIMIT:
            memo.clear()
        memo[key] = value
        return value

    def activation_bytes(self, tokens: int) -> int:
        """Bytes of ``tokens`` tokens' activations (one [tokens, d_model] tensor at ``dtype_bytes``)."""
        return max(int(tokens), 0) * self.model.d_model * self.model.dtype_bytes

    def activation_copy_s(self, tokens: int, direction: str) -> float:
        """``tokens`` tokens' activations crossing the link (0 for none): ``direction`` "d2h" (to the host CPU, at
        ``d2h_bw_gb_s``) or "h2d" (the expert outputs back, at ``pcie_bw_gb_s``), each ``activation_latency_us`` +
        ``tokens * d_model * dtype_bytes`` / bandwidth. Not the copy table: it was measured for expert-sized copies."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
        nbytes = self.activation_bytes(tokens)
        if nbytes <= 0:
            return 0.0
        bw = self.hw.d2h_bw if direction == "d2h" else self.hw.pcie_bw
        return self.hw.activation_latency_s + nbytes / bw
