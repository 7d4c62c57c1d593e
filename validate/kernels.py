"""The torch work of one model, shared by the microbenchmarks and the executor so that what is calibrated is what
runs: one expert's FFN, the dense work attached to one MoE layer, and the LM head.

Weights are random (timings depend on shapes and dtype, not values). An expert's weights live in one flat byte
buffer (a host pool buffer, a cache slot or a working buffer); :func:`expert_views` sees its matrices in it.

The dense work of one MoE layer is what the simulator's ``dense`` table stands for: ``blocks / MoE layers``
attention blocks (q/k/v/o projections, attention of every token over ``context`` cached keys and values, the new
token's keys and values written into the cache), the dense FFN blocks between MoE layers, and the gate GEMM. All
tokens attend over the same (mean) context, as the simulator assumes.
"""

from __future__ import annotations

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
