"""Model profiles: the shapes of an MoE model's weights (``configs/models/NAME.yaml``, or a path, or an inline
mapping that may name a ``base`` profile). Files use the :class:`ModelSpec` field names: sizes in elements,
``dtype_bytes`` per element, ``expert_bits`` (optional) per routed-expert weight."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from moebase.checks import check_keys, check_mapping, check_number, integer, join, show, text
from moebase.errors import ConfigError
from moebase.fields import keys_of, read_settings, required_keys, setting, to_si
from moebase.profiles import load_profile

ROLES = ("encoder", "decoder")
DTYPE_BYTES = (1, 2, 4, 8)


def _default_head_dim(values: dict, where: str) -> int:
    """``d_model / n_heads``, which must be whole when ``head_dim`` is not given."""
    d_model, n_heads = values["d_model"], values["n_heads"]
    if d_model % n_heads:
        raise ConfigError(where, f"missing, and d_model {d_model} is not a multiple of n_heads {n_heads}")
    return d_model // n_heads


def _dtype_bytes(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in DTYPE_BYTES:
        raise ConfigError(where, f"must be 1, 2, 4 or 8, got {show(value)}")
    return int(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(where, f"must be true or false, got {show(value)}")
    return value


def _expert_bits(value: Any, where: str) -> float | None:
    """``expert_bits``: None (absent: 8 * dtype_bytes), or a number of bits per weight in (0, 64]."""
    if value is None:
        return None
    try:
        return check_number(value, where, 0.0, strict=True, maximum=64.0)
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.problem + " (bits per expert weight, scales included)") from None


@dataclass(frozen=True)
class ModelSpec:
    """The shapes of an MoE model's weights. Sizes in elements; ``dtype_bytes`` per element.

    ``expert_bits`` (optional) is the routed experts' storage width in bits per weight, scales included, for
    checkpoints whose experts are quantized while the dense weights are not (e.g. gpt-oss: MXFP4 experts, 4 bits
    per weight plus one 8-bit scale per 32 weights = 4.25). It sets :attr:`expert_bytes` (what a copy moves and a
    slot holds); dense weights, shared experts, KV cache and activations keep ``dtype_bytes``. Default (None):
    ``8 * dtype_bytes``."""

    name: str = setting(check=text())
    d_model: int = setting(check=integer(1))
    d_ff: int = setting(check=integer(1))  # expert FFN width
    expert_matrices: int = setting(check=integer(2, 3))  # 2 (ReLU/GELU: wi, wo) or 3 (gated: w1, w3, w2)
    num_experts: int = setting(check=integer(1))  # routed experts per MoE layer
    top_k: int = setting(check=integer(1))
    encoder_blocks: int = setting(0, integer(0))  # transformer blocks in the encoder (0: decoder-only)
    decoder_blocks: int = setting(check=integer(1))  # transformer blocks in the decoder
    encoder_moe_layers: int = setting(0, integer(0))  # MoE layers among them (the trace's encoder layers)
    decoder_moe_layers: int = setting(check=integer(0))
    n_heads: int = setting(check=integer(1))
    n_kv_heads: int = setting(lambda v, where: v["n_heads"], integer(1))
    head_dim: int = setting(_default_head_dim, integer(1))
    dense_d_ff: int = setting(0, integer(0))  # FFN width of non-MoE blocks (0: every block is MoE)
    dense_ffn_matrices: int = setting(lambda v, where: v["expert_matrices"], integer(2, 3))  # 2 or 3
    shared_expert_d_ff: int = setting(0, integer(0))  # width of always-on shared experts per MoE layer
    dtype_bytes: int = setting(check=_dtype_bytes)  # 2 for bf16, 4 for fp32
    vocab_size: int = setting(check=integer(1))
    expert_bits: float | None = setting(None, _expert_bits, constructor_default=True)  # None = 8 * dtype_bytes
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi K2), as the checkpoint's config names its widths: with
    # ``kv_lora_rank`` set, the attention weights and the KV cache are counted from these (see MLA_FIELDS), and
    # ``n_kv_heads``/``head_dim`` only price the attention over the context (its FLOPs per token and context token).
    kv_lora_rank: int | None = setting(None, integer(1, allow_none=True), constructor_default=True)
    q_lora_rank: int = setting(0, integer(0), constructor_default=True)  # 0: queries projected from d_model directly
    qk_nope_head_dim: int = setting(0, integer(0), constructor_default=True)
    qk_rope_head_dim: int = setting(0, integer(0), constructor_default=True)
    v_head_dim: int = setting(0, integer(0), constructor_default=True)
    # With latent attention: whether the KV cache holds the compressed latent (true, as vLLM, SGLang and llama.cpp's
    # MLA mode cache it) or the decompressed per-head keys and values (false: ik_llama.cpp -mla 0, the HF reference
    # code), which sets the cache's bytes per token and the attention's FLOPs over the context
    latent_cache: bool = setting(True, lambda v, where: _bool(v, where), constructor_default=True)
    # FLOPs of one block's attention per (query token, context token) pair, averaged over the blocks, where the plain
    # ``4 x n_heads x head_dim`` does not hold (a hybrid model whose linear-attention blocks attend over no context:
    # Qwen3.5); None keeps that rule. Read by the attention at a KV depth (sim/costs/phase_costs.py).
    context_pair_flops: int | None = setting(None, integer(1, allow_none=True), constructor_default=True)

    @property
    def attention_pair_flops(self) -> int:
        """FLOPs of one block's attention per (query token, context token) pair: ``context_pair_flops``, or
        ``4 x n_heads x head_dim`` (QK^T and AV, a multiply-add each); latent attention with its keys and values
        decompressed (``latent_cache`` false): ``2 x n_heads x (qk_nope + qk_rope + v_head_dim)``."""
        if self.context_pair_flops:
            return self.context_pair_flops
        if self.latent_attention and not self.latent_cache:
            return 2 * self.n_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        return 4 * self.n_heads * self.head_dim

    # -- per expert
    @property
    def expert_params(self) -> int:
        return self.expert_matrices * self.d_model * self.d_ff

    @property
    def expert_bits_per_weight(self) -> float:
        """The routed experts' storage width in bits per weight (``expert_bits``, or ``8 * dtype_bytes``)."""
        return 8.0 * self.dtype_bytes if self.expert_bits is None else float(self.expert_bits)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert's weights: ``ceil(expert_params * expert_bits / 8)``, with ``expert_bits``
        taken as the decimal it is written as (4.4 is 22/5, not its binary neighbour)."""
        if self.expert_bits is None:
            return self.expert_params * self.dtype_bytes
        return math.ceil(self.expert_params * Fraction(repr(float(self.expert_bits))) / 8)

    @property
    def expert_flops_per_token(self) -> int:
        return 2 * self.expert_params

    # -- layers
    @property
    def moe_layers(self) -> int:
        return self.encoder_moe_layers + self.decoder_moe_layers

    @property
    def is_encoder_decoder(self) -> bool:
        return self.encoder_blocks > 0

    def blocks(self, role: str) -> int:
        """Transformer blocks of the ``role`` stack."""
        return self.encoder_blocks if _role(role) == "encoder" else self.decoder_blocks

    def moe_layers_of(self, role: str) -> int:
        """MoE layers of the ``role`` stack."""
        return self.encoder_moe_layers if _role(role) == "encoder" else self.decoder_moe_layers

    # -- attention
    @property
    def latent_attention(self) -> bool:
        """Whether the attention is multi-head latent attention (``kv_lora_rank`` set)."""
        return self.kv_lora_rank is not None

    @property
    def attention_params_per_block(self) -> int:
        """Self-attention weights of one block: q and o (d_model x n_heads*head_dim), k and v (x n_kv_heads*head_dim);
        with latent attention, its own projections (:meth:`latent_attention_params`).
        See :meth:`attention_params` for decoder blocks of an encoder-decoder model (with cross-attention)."""
        if self.latent_attention:
            return self.latent_attention_params
        return 2 * self.d_model * self.head_dim * (self.n_heads + self.n_kv_heads)

    @property
    def latent_attention_params(self) -> int:
        """Weights of one multi-head latent attention block (DeepSeek-V2 section 2.1; norms left out): the query
        (``d_model -> q_lora_rank -> n_heads x (nope + rope)``, or straight from ``d_model`` when q_lora_rank is 0),
        the compressed KV and the shared rotary key (``d_model -> kv_lora_rank + rope``), the KV up-projection
        (``kv_lora_rank -> n_heads x (nope + v)``) and the output (``n_heads x v -> d_model``)."""
        rank, heads, d = self.kv_lora_rank or 0, self.n_heads, self.d_model
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q_rank = self.q_lora_rank
        query = q_rank * (d + heads * qk) if q_rank else d * heads * qk
        kv_down = d * (rank + self.qk_rope_head_dim)
        kv_up = rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return query + kv_down + kv_up + heads * self.v_head_dim * d

    def attention_params(self, role: str) -> int:
        """Attention weights of one block of ``role``: doubled for decoder blocks of an encoder-decoder model,
        which have cross-attention beside self-attention."""
        double = _role(role) == "decoder" and self.is_encoder_decoder
        return self.attention_params_per_block * (2 if double else 1)

    @property
    def kv_bytes_per_block_token(self) -> int:
        """KV-cache bytes of one token in one decoder block: its K and V, or with latent attention the compressed
        latent and the shared rotary key (``kv_lora_rank + qk_rope_head_dim`` values, as vLLM and SGLang cache
        them), or with ``latent_cache`` false every head's decompressed key and value (``n_heads x (qk_nope +
        qk_rope + v_head_dim)`` values)."""
        if self.latent_attention and not self.latent_cache:
            heads = self.n_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
            return heads * self.dtype_bytes
        if self.latent_attention:
            return ((self.kv_lora_rank or 0) + self.qk_rope_head_dim) * self.dtype_bytes
        return 2 * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token over all decoder blocks. In an encoder-decoder model a prompt token holds
        the cross-attention K/V of every decoder block and a generated token the self-attention K/V, so
        ``(prompt + generated tokens) * kv_bytes_per_token`` is a request's cache either way."""
        return self.decoder_blocks * self.kv_bytes_per_block_token

    # -- resident (non-expert) weights
    @property
    def dense_ffn_params(self) -> int:
        """Weights of one non-MoE FFN block."""
        return self.dense_ffn_matrices * self.d_model * self.dense_d_ff

    @property
    def shared_expert_params(self) -> int:
        """Weights of the always-on shared experts of one MoE layer (same matrix count as the routed experts)."""
        return self.expert_matrices * self.d_model * self.shared_expert_d_ff

    @property
    def gate_params(self) -> int:
        return self.d_model * self.num_experts

    @property
    def dense_params(self) -> int:
        """Every weight that stays on the GPU: embedding and LM head (counted untied), attention of every block,
        the FFN of every non-MoE block, shared experts and gates of every MoE layer. Norms and biases ignored."""
        attention = self.encoder_blocks * self.attention_params(
            "encoder"
        ) + self.decoder_blocks * self.attention_params("decoder")
        dense_ffn_blocks = (self.encoder_blocks - self.encoder_moe_layers) + (
            self.decoder_blocks - self.decoder_moe_layers
        )
        return (
            2 * self.vocab_size * self.d_model
            + attention
            + dense_ffn_blocks * self.dense_ffn_params
            + self.moe_layers * (self.shared_expert_params + self.gate_params)
        )

    @property
    def dense_bytes(self) -> int:
        return self.dense_params * self.dtype_bytes

    @property
    def total_params(self) -> int:
        return self.dense_params + self.moe_layers * self.num_experts * self.expert_params

    def to_dict(self) -> dict:
        """The profile as a plain mapping (the model-file schema; loads back with :func:`load_model`).
        ``expert_bits`` and ``context_pair_flops`` appear only when set, the latent-attention fields only with
        ``kv_lora_rank``."""
        return {f: getattr(self, f) for f in MODEL_FIELDS if self._stated(f)}

    def _stated(self, field: str) -> bool:
        if field in ("expert_bits", "context_pair_flops"):
            return getattr(self, field) is not None
        if field == "latent_cache":  # stated only when false, so that every other profile reads (and hashes) as before
            return not self.latent_cache
        return field not in MLA_FIELDS or self.latent_attention

    # -- parameter counts, as model cards state them
    @property
    def embedding_params(self) -> int:
        """The embedding and the LM head (counted untied, as in :attr:`dense_params`)."""
        return 2 * self.vocab_size * self.d_model

    @property
    def active_params(self) -> int:
        """Weights one token uses: every dense weight (embeddings included) and ``top_k`` routed experts per MoE
        layer. Model cards count active parameters with or without the embeddings (see :attr:`embedding_params`)."""
        return self.dense_params + self.moe_layers * self.top_k * self.expert_params


MODEL_FIELDS = keys_of(ModelSpec)
#: The fields of multi-head latent attention (all but kv_lora_rank default to 0; they mean something only with it).
MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MODEL_KEYS = MODEL_FIELDS + ("base",)


def _role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def model_from_dict(d: Any, where: str = "model", suffix: str = "") -> ModelSpec:
    """Validate a model mapping (no ``base``) into a :class:`ModelSpec`. ``suffix`` ends every message
    (e.g. `` (in configs/models/x.yaml)``)."""
    d = check_mapping(d, where)
    check_keys(d, where, required_keys(ModelSpec), MODEL_FIELDS, suffix, see="moebase/model.py")
    spec = ModelSpec(**to_si(ModelSpec, read_settings(ModelSpec, d, where, suffix)))

    def fail(key, problem):
        raise ConfigError(join(where, key), problem + suffix)

    if spec.top_k > spec.num_experts:
        fail("top_k", f"({spec.top_k}) exceeds num_experts ({spec.num_experts})")
    if spec.n_kv_heads > spec.n_heads:
        fail("n_kv_heads", f"({spec.n_kv_heads}) exceeds n_heads ({spec.n_heads})")
    _check_latent_attention(spec, fail)
    for role in ROLES:
        if spec.moe_layers_of(role) > spec.blocks(role):
            fail(f"{role}_moe_layers", f"({spec.moe_layers_of(role)}) exceeds {role}_blocks ({spec.blocks(role)})")
        if spec.moe_layers_of(role) == 0 and spec.blocks(role) > 0:
            fail(
                f"{role}_moe_layers",
                f"must be >= 1 when {role}_blocks is {spec.blocks(role)}: every stack "
                "needs an MoE layer to carry its dense work",
            )
        if spec.blocks(role) > spec.moe_layers_of(role) and spec.dense_d_ff == 0:
            fail(
                "dense_d_ff",
                f"must be >= 1: the {role} has {spec.blocks(role) - spec.moe_layers_of(role)} non-MoE blocks",
            )
    return spec


def _check_latent_attention(spec: ModelSpec, fail) -> None:
    """Latent attention's widths: set only with kv_lora_rank, and then a query/key and a value head of width >= 1."""
    if not spec.latent_attention:
        for key in MLA_FIELDS[1:]:
            if getattr(spec, key):
                fail(key, "is a width of multi-head latent attention: it needs kv_lora_rank")
        if not spec.latent_cache:
            fail("latent_cache", "false decompresses multi-head latent attention's cache: it needs kv_lora_rank")
        return
    if spec.qk_nope_head_dim + spec.qk_rope_head_dim == 0:
        fail("qk_nope_head_dim", "and qk_rope_head_dim are both 0: latent attention needs a query/key head width")
    if spec.v_head_dim == 0:
        fail("v_head_dim", "must be >= 1 with kv_lora_rank (the width of a value head)")


def load_model(spec_or_name: Any, where: str = "model") -> ModelSpec:
    """A model profile from a name (``configs/models/NAME.yaml``), a path to a YAML/JSON file, an inline mapping
    (optionally with ``base``), or a :class:`ModelSpec` (returned as is)."""
    if isinstance(spec_or_name, ModelSpec):
        return spec_or_name
    d, source = load_profile(spec_or_name, where, "models", MODEL_KEYS)
    suffix = "" if source == "inline" else f" (in {source})"
    return model_from_dict(d, where, suffix)


__all__ = ["MLA_FIELDS", "MODEL_FIELDS", "MODEL_KEYS", "ROLES", "ModelSpec", "load_model", "model_from_dict"]
