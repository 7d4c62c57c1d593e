"""Both phases (docs/phases.md): prompt processing of experts held in host memory, and attention at a KV depth.

Used by the engine only when the run's system sets a setting of :data:`sim.config.system.PHASE_FIELDS` or the
workload sets ``context_tokens``; otherwise nothing here runs and every result is what it was.

- **Attention over the context.** A layer's dense work is :meth:`CostModel.dense_s` over no context (its weights,
  projections, FFN, gate, launches) plus the attention over ``ctx`` tokens of KV cache, a roofline of its FLOPs
  (``n * ctx * attention_pair_flops``, i.e. ``4 * n * ctx * n_heads * head_dim`` unless the model states
  ``context_pair_flops``, per attention sublayer) against the KV bytes it reads. A flash-attention
  kernel reads the KV once per tile of :data:`QUERY_TILE` query rows, not once per query token (assumption: a tile of
  128 rows, FlashAttention-2's and llama.cpp's CUDA kernels' order of size), so the bytes are
  ``ceil(n / QUERY_TILE) * ctx * kv_bytes_per_block_token``; at decode (n = 1) that is the whole KV once, as the
  engine's own roofline has it. With the system's ``kv_on_host`` (llama.cpp ``-nkvo``) that attention runs on the
  host CPU instead: the same FLOPs at the host's 16-bit rate against the KV bytes at its memory bandwidth (both in
  the share of the sockets and threads the system's host kernels use: ``numa``, ``host_threads``), plus the
  query activations to the host and the attention's output back over the link (two activation copies per
  attention block); the GPU keeps the rest of the dense work.
- **Prompt processing with experts in host memory.** Below the threshold a layer's host experts are computed on
  the host by the engine's host stream as before. With ``prefill_upload`` a prefill pass (a micro-batch, ``ubatch``)
  of at least :meth:`PhaseCosts.upload_threshold` tokens copies the layer's host-held experts' weights over the link
  instead (the used experts only with ``upload_used_only``; else every host-held expert of the layer) and computes
  them on the GPU. The copy and the compute of a layer are serial (assumption: the ggml scheduler copies a split's
  inputs before it computes the split), and the copy is not queued with the copy engine's expert copies (nothing
  else uses the link under the placements that upload: llama.cpp copies nothing at decode).
"""

from __future__ import annotations

import math

from sim.config.hardware import cpu_format_rate
from sim.core.workload import Iteration
from sim.costs.costs import CostModel

#: Query rows per flash-attention tile: the KV is read once per tile (assumption, see the module's docstring).
QUERY_TILE = 128
#: Activation copies per attention block computed on the host (-nkvo): the query to the host, the output back.
HOST_ATTENTION_COPIES = ("d2h", "h2d")


class PhaseCosts:
    """The costs of the two phases for one run: ``costs`` (the machine, model and system) and nothing else."""

    def __init__(self, costs: CostModel):
        self.costs = costs
        m, sy = costs.model, costs.system
        self.system = sy
        self.kv_on_host = sy.kv_on_host
        self.host_rate, self.host_bw = self._host_attention_rates()
        self._dense: dict[tuple, tuple[float, float]] = {}
        self.threshold = self.upload_threshold()
        self.expert_bytes = costs.expert_bytes
        self.num_experts = m.num_experts

    def _host_attention_rates(self) -> tuple[float, float]:
        """(FLOP/s, bytes/s) of the attention on the host (-nkvo): the host's 16-bit rate and its memory bandwidth
        (times the system's ``host_bw_fraction``), in the share of the sockets and threads the system gives its host
        kernels, as its experts see them: :class:`~sim.costs.host_costs.HostCosts` when the system sets ``numa``,
        kernels or threads there (no kernel family's share: attention is not an expert kernel), else the threads'
        share of the cores (:meth:`CostModel.cpu_expert_s`'s rule)."""
        costs = self.costs
        rate = cpu_format_rate(costs.hw, 16.0)[1]  # attention in 16 bits on the host
        host = costs.host
        if host is not None:
            t = host.threads()
            return rate * host.used_sockets / host.sockets * t / host.cores, host.bandwidth(t)
        if costs.cpu_threads is None:
            return rate, costs.cpu_mem_bw
        share = min(int(costs.cpu_threads), costs.hw.cpu_cores) / costs.hw.cpu_cores
        return rate * share, costs.cpu_mem_bw * share

    # ------------------------------------------------------------------ attention over the context
    def upload_threshold(self) -> int:
        """Tokens of a pass from which the host's experts are uploaded: ``upload_min_batch``, times num_experts /
        top_k with ``upload_moe_scaled`` (ik_llama.cpp PR 520: 32 x 256 / 8 = 1024 for DeepSeek-V3)."""
        sy, m = self.system, self.costs.model
        if sy.upload_moe_scaled:
            return math.ceil(sy.upload_min_batch * m.num_experts / m.top_k)
        return sy.upload_min_batch

    def _context(self, role: str, n: int, ctx: float) -> tuple[float, float, int]:
        """(FLOPs, KV bytes read, attention blocks) of one MoE layer's attention over ``ctx`` tokens of context."""
        m = self.costs.model
        blocks = m.blocks(role) / m.moe_layers_of(role)
        sublayers = 2 if (role == "decoder" and m.is_encoder_decoder) else 1
        flops = blocks * sublayers * n * ctx * m.attention_pair_flops
        nbytes = blocks * sublayers * math.ceil(n / QUERY_TILE) * ctx * m.kv_bytes_per_block_token
        return flops, nbytes, math.ceil(blocks * sublayers)

    def dense_s(self, role: str, tokens: int, context: float) -> tuple[float, float]:
        """(GPU seconds, host seconds) of one MoE layer's dense work over ``tokens`` tokens attending ``context``
        tokens: the work without context on the GPU, and the attention over the context on the GPU, or on the host
        with ``kv_on_host``."""
        key = (role, tokens, context)
        hit = self._dense.get(key)
        if hit is not None:
            return hit
        costs, n = self.costs, int(tokens)
        ctx = max(float(context), 0.0)
        if n <= 0:
            value = (0.0, 0.0)
        else:
            gpu = costs.dense_s(role, n, 0.0)
            flops, nbytes, blocks = self._context(role, n, ctx)
            if ctx <= 0:
                value = (gpu, 0.0)
            elif self.kv_on_host:
                host = max(flops / self.host_rate, nbytes / self.host_bw)
                host += blocks * sum(costs.activation_copy_s(n, d) for d in HOST_ATTENTION_COPIES)
                value = (gpu, host)
            else:
                value = (gpu + max(flops / costs.rate, nbytes / costs.hw.hbm_bw), 0.0)
        self._dense[key] = value
        return value

    # ------------------------------------------------------------------ prompt processing of host experts
    def uploads(self, it: Iteration) -> bool:
        """Whether a pass's host experts are uploaded to the GPU: ``prefill_upload`` and a prefill pass of at least
        the threshold's tokens."""
        return self.system.prefill_upload and it.kind == "prefill" and int(it.rows.size) >= self.threshold

    def upload_bytes(self, used: int, resident: int) -> int:
        """Bytes of one layer's upload: its ``used`` host experts (``upload_used_only``), else every expert of the
        layer that is not on the GPU (``resident`` of them are)."""
        n = used if self.system.upload_used_only else max(self.num_experts - resident, used)
        return n * self.expert_bytes

    def upload_copy_s(self, nbytes: int) -> float:
        """The upload of ``nbytes`` over the link, as one host->device copy (:meth:`CostModel.copy_s`)."""
        return self.costs.copy_s(nbytes)


def phase_costs_for(costs: CostModel, context_tokens: int | None) -> PhaseCosts | None:
    """The run's :class:`PhaseCosts`, or None when nothing of the two phases is set (the engine then runs as
    before)."""
    if costs.system.phases_set or context_tokens:
        return PhaseCosts(costs)
    return None


__all__ = ["HOST_ATTENTION_COPIES", "QUERY_TILE", "PhaseCosts", "phase_costs_for"]
