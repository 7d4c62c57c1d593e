"""A model profile (the fields of :class:`moebase.model.ModelSpec`, as in ``configs/models/*.yaml``) derived from a
Hugging Face checkpoint's ``config.json``, for simulating a recorded or imported trace of a model that has no
bundled profile.

What is read, by quantity (the first field present wins; a required one that is missing is a one-line InputError
naming it):

- ``d_model``: ``hidden_size`` (``d_model`` for Switch); ``vocab_size``.
- ``d_ff`` (one routed expert's width): ``moe_intermediate_size``, else ``intermediate_size`` (``d_ff`` for Switch);
  ``dense_d_ff`` (the FFN of blocks without a router): ``intermediate_size`` (``d_ff`` for Switch).
- ``num_experts``: ``num_local_experts``, ``num_experts`` or ``n_routed_experts``; ``top_k``:
  ``num_experts_per_tok`` or ``experts_per_token`` (Switch routes top-1).
- Which blocks are MoE: ``first_k_dense_replace`` and ``moe_layer_freq`` (DeepSeek: block i >= k with
  i % freq == 0), ``mlp_only_layers`` and ``decoder_sparse_step`` (Qwen-MoE: block i not listed with
  (i + 1) % step == 0), Switch's ``encoder_sparse_step``/``decoder_sparse_step`` (block i with i % step == 1, or
  every block at step 1); otherwise every block of ``num_hidden_layers``.
- Shared experts: ``shared_expert_intermediate_size`` (Qwen2-MoE) or ``n_shared_experts * moe_intermediate_size``
  (DeepSeek).
- Attention: ``num_attention_heads``, ``num_key_value_heads`` (default: the heads), ``head_dim`` (default:
  ``hidden_size / heads``); Switch ``num_heads`` and ``d_kv``. Multi-head latent attention (``kv_lora_rank``,
  ``q_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``) is stated with those widths (its
  weights and compressed KV cache are counted from them), with the plain shape the bundled DeepSeek profiles use to
  price its attention over the context (``n_kv_heads * head_dim * 2 = kv_lora_rank + qk_rope_head_dim``).
  Full attention every ``full_attention_interval`` blocks and Gated DeltaNet linear attention in the others
  (``linear_num_value_heads``..., Qwen3-Next) becomes one plain shape for every block with the full blocks' KV
  cache exactly and the blocks' mean attention weights.
- Experts are gated (3 matrices: gate, up, down) except Switch's (2: wi, wo).
- ``dtype_bytes``: ``torch_dtype``/``dtype`` (bfloat16 and float16: 2, float32: 4), else the caller's default (an
  assumption, said in the file). ``expert_bits``: MXFP4 experts 4.25 (4 bits and one 8-bit scale per 32), FP8
  experts 8 (block scales ignored), a ``bits`` field of another quantization method as it is (scales ignored).

Known layouts (``model_type``): mixtral, olmoe, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss and
switch_transformers (every tiny model of :mod:`traces.record.tiny_models`), glm4_moe, minimax_m2 and qwen3_next.
Another ``model_type`` is read by the same rules, which the file then says as an assumption.
"""

from __future__ import annotations

import builtins
import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moebase.errors import InputError, brief
from traces.importers.common import INT16_MAX
from traces.importers.ktparquet import MAX_LAYERS

KNOWN_TYPES = (
    "mixtral",
    "olmoe",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "switch_transformers",
    "glm4_moe",
    "minimax_m2",
    "qwen3_next",
)
#: Bytes per weight of a checkpoint dtype.
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float64": 8,
    "double": 8,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}
#: The largest config.json read (real ones are a few KB).
MAX_CONFIG_BYTES = 4 << 20
#: The sizes a config may give, checked before anything is derived, listed or built (real MoE checkpoints lie far
#: inside: DeepSeek-V3 has 61 blocks, 256 experts, width 7,168, 128 heads, a 129,280-token vocabulary). Blocks and
#: block counts: the MoE layers a trace may have; experts: a trace's int16 ids.
MAX_BLOCKS = MAX_LAYERS
MAX_EXPERTS = INT16_MAX
#: Widths (hidden, FFN, head, latent ranks; real: at most 65,536), heads (real: at most 128), the vocabulary (real:
#: at most 262,144) and positions (Llama 4 Scout: 10M).
MAX_WIDTH = 1 << 20
MAX_HEADS = 1 << 12
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 24
#: Routed experts over all blocks: some architectures build a module per expert (Kimi K2: 61 x 384 = 23,424).
MAX_ROUTED_EXPERTS = 1 << 17
#: Bits per quantized weight (``quantization_config.bits``): 1..32.
MAX_BITS = 32
_BLOCK_FIELDS = (
    "num_hidden_layers",
    "num_layers",
    "num_decoder_layers",
    "num_sparse_encoder_layers",
    "num_sparse_decoder_layers",
    "first_k_dense_replace",
    "moe_layer_freq",
    "decoder_sparse_step",
    "encoder_sparse_step",
    "full_attention_interval",
)
_EXPERT_FIELDS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "moe_topk",
    "n_shared_experts",
    "n_group",
    "topk_group",
)
_WIDTH_FIELDS = (
    "hidden_size",
    "d_model",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "d_ff",
    "head_dim",
    "d_kv",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
#: The most each size field may be, by name, wherever it appears in a config (nested ones, e.g. ``text_config``, too).
SIZE_LIMITS = {
    **dict.fromkeys(_BLOCK_FIELDS, MAX_BLOCKS),
    **dict.fromkeys(_EXPERT_FIELDS, MAX_EXPERTS),
    **dict.fromkeys(_WIDTH_FIELDS, MAX_WIDTH),
    **dict.fromkeys(
        ("num_attention_heads", "num_key_value_heads", "num_heads", "linear_num_key_heads", "linear_num_value_heads"),
        MAX_HEADS,
    ),
    "vocab_size": MAX_VOCAB,
    "max_position_embeddings": MAX_POSITIONS,
}


@dataclass
class DerivedProfile:
    """A model profile derived from a config: ``fields`` (ModelSpec's keys, file units), where each came from
    (``notes``) and what the config did not say (``assumptions``)."""

    fields: dict
    source: str
    notes: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.fields["name"]

    def yaml_text(self, made_by: str) -> str:
        """The profile file: comments saying where each figure came from, then the fields."""
        import yaml

        spec = self.spec()
        said = [
            f"Model profile of {self.name}, derived by {made_by} from {self.source}.",
            *self.notes,
            f"Bytes per routed expert: {spec.expert_matrices} * {spec.d_model} * {spec.d_ff} weights at "
            f"{spec.expert_bits_per_weight:g} bits = {spec.expert_bytes} bytes; {spec.total_params} parameters "
            f"in all.",
            "Assumptions (not in the config):" if self.assumptions else "Assumptions: none.",
        ]
        lines = comment_lines(said) + comment_lines(self.assumptions, "  - ")
        body = yaml.safe_dump(self.fields, sort_keys=False, default_flow_style=False)
        return "\n".join(lines) + "\n" + body

    def spec(self):
        """The profile checked as the simulator loads it (:func:`moebase.model.model_from_dict`); InputError
        naming the config when a derived figure breaks a profile's rule (e.g. top-k above the experts)."""
        from moebase.errors import ConfigError
        from moebase.model import model_from_dict

        try:
            return model_from_dict(self.fields, "model")
        except ConfigError as exc:
            raise InputError(f"{self.source}: the model profile derived from it is not valid ({exc})") from None


def comment_lines(texts: list[str], bullet: str = "", width: int = 116) -> list[str]:
    """YAML comment lines holding ``texts`` (one line each, no line break kept), wrapped at ``width``; with a
    ``bullet``, each text starts with it and its later lines are indented under it."""
    from moebase.errors import one_line

    out = []
    for text in texts:
        out += textwrap.wrap(
            one_line(text, 2000), width, initial_indent="# " + bullet, subsequent_indent="# " + " " * len(bullet)
        ) or ["#"]
    return out


class _Reader:
    """Fields of one config, each read once, with the notes and assumptions that reading them leaves."""

    def __init__(self, config: Mapping[str, Any], where: str):
        self.c, self.where = config, where
        self.notes: list[str] = []
        self.assumptions: list[str] = []

    def has(self, key: str) -> bool:
        return self.c.get(key) is not None

    def int(self, *keys: str, why: str, default: int | None = None, minimum: int = 1) -> int:
        """The first of ``keys`` the config gives, as an integer >= ``minimum``; when none is given, ``default``
        (what the architecture's own config class takes then), else an InputError naming the field."""
        for key in keys:
            value = self.c.get(key)
            if value is None:
                continue
            top = SIZE_LIMITS[key]
            if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= top:
                raise InputError(
                    f"{self.where}: field '{key}' ({why}) must be an integer {minimum}..{top}, got {brief(value)}"
                )
            return int(value)
        if default is not None:
            return default
        others = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
        raise InputError(f"{self.where}: no field '{keys[0]}'{others}, {why}: cannot derive a model profile")

    def int_list(self, key: str, why: str) -> list[builtins.int]:  # (int here names the method above)
        """Block indices: at most MAX_BLOCKS of them, each 0..MAX_BLOCKS - 1."""
        value = self.c.get(key) or []
        if (
            not isinstance(value, list)
            or len(value) > MAX_BLOCKS
            or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < MAX_BLOCKS for x in value)
        ):
            raise InputError(
                f"{self.where}: field '{key}' ({why}) must be a list of at most {MAX_BLOCKS} block indices "
                f"0..{MAX_BLOCKS - 1}, got {brief(value)}"
            )
        return [int(x) for x in value]


def check_sizes(config: Mapping[str, Any], where: str) -> None:
    """Every size field of ``config`` (SIZE_LIMITS, nested configs included) null or an integer 0..its limit,
    ``mlp_only_layers`` block indices, ``quantization_config.bits`` a number of bits 1..MAX_BITS, and at most
    MAX_ROUTED_EXPERTS routed experts over all blocks: InputError naming the field otherwise. Checked before anything
    is derived, listed or built from the config."""
    for prefix, d in _mappings(config):
        for key in SIZE_LIMITS.keys() & d.keys():
            value = d[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InputError(f"{where}: field '{prefix}{key}' must be an integer, got {brief(value)}")
            if value is not None and not 0 <= value <= SIZE_LIMITS[key]:
                raise InputError(f"{where}: field '{prefix}{key}' must be 0..{SIZE_LIMITS[key]}, got {value}")
        if d.get("mlp_only_layers") is not None:
            _Reader(d, where).int_list("mlp_only_layers", "the blocks without experts")
        if prefix.endswith("quantization_config.") and d.get("bits") is not None:
            _bits(d["bits"], f"{prefix}bits", where)
        _check_routed(d, prefix, where)


def _mappings(config: Mapping[str, Any]):
    """(``"a.b."`` prefix, mapping) of ``config`` and every mapping nested in it (in lists too)."""
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
        prefix, value = stack.pop()
        if isinstance(value, Mapping):
            yield prefix, value
            stack += [(f"{prefix}{k}.", v) for k, v in value.items() if isinstance(v, (Mapping, list))]
        elif isinstance(value, list):
            stack += [(f"{prefix[:-1]}[{i}].", v) for i, v in enumerate(value) if isinstance(v, (Mapping, list))]


def _bits(value: Any, field: str, where: str) -> float:
    """A bit width: a number 1..MAX_BITS."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= MAX_BITS:
        raise InputError(f"{where}: field '{field}' must be a number of bits 1..{MAX_BITS}, got {brief(value)}")
    return float(value)


def _check_routed(d: Mapping[str, Any], prefix: str, where: str) -> None:
    """At most MAX_ROUTED_EXPERTS experts over the blocks of one (sub)config (sizes already checked)."""
    blocks = sum(d.get(k) or 0 for k in ("num_hidden_layers", "num_layers", "num_decoder_layers"))
    experts = max(d.get(k) or 0 for k in ("num_local_experts", "num_experts", "n_routed_experts"))
    if blocks * experts > MAX_ROUTED_EXPERTS:
        raise InputError(
            f"{where}: {blocks} blocks x {experts} experts{f' (in {prefix[:-1]})' if prefix else ''} make "
            f"{blocks * experts} routed experts, more than the {MAX_ROUTED_EXPERTS} a model may have"
        )


def read_config_file(path: str | Path, flag: str = "--hf-config") -> dict:
    """The mapping of a checkpoint's ``config.json`` (a regular JSON file of at most MAX_CONFIG_BYTES); an
    InputError naming ``flag`` and the file otherwise."""
    from traces.importers.common import read_json_file

    try:
        value = read_json_file(path, MAX_CONFIG_BYTES, "checkpoint config")
    except InputError as exc:
        raise InputError(f"{flag}: {exc}") from None
    if not isinstance(value, dict):
        raise InputError(
            f"{flag}: {path} must hold a JSON object (a checkpoint's config.json), got {type(value).__name__}"
        )
    return value


def derive_profile(
    config: Mapping[str, Any],
    name: str,
    source: str,
    default_dtype_bytes: int | None = None,
    default_dtype_why: str = "",
) -> DerivedProfile:
    """The model profile called ``name`` of the checkpoint whose config is ``config`` (``source`` names it in
    messages and in the file). ``default_dtype_bytes`` is used when the config gives no dtype (with
    ``default_dtype_why`` saying why, as an assumption); without it the profile assumes bf16 (2 bytes)."""
    check_sizes(config, source)
    r = _Reader(config, source)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in KNOWN_TYPES:
        r.assumptions.append(
            f"model_type {brief(model_type, 40)} is none of {', '.join(KNOWN_TYPES)}: read with "
            f"their rules (gated experts, every block MoE unless the config says otherwise)"
        )
    switch = model_type == "switch_transformers"
    fields: dict[str, Any] = {"name": name}
    fields.update(_switch_shape(r) if switch else _decoder_shape(r))
    fields.update(_attention(r, fields["d_model"], switch, fields["decoder_blocks"]))
    fields["dtype_bytes"] = _dtype_bytes(r, default_dtype_bytes, default_dtype_why)
    bits = _expert_bits(r, fields["dtype_bytes"])
    if bits is not None:
        fields["expert_bits"] = bits
    fields["vocab_size"] = r.int("vocab_size", why="the vocabulary")
    r.notes.append(f"vocab_size {fields['vocab_size']}; embedding and LM head counted apart (as in every profile).")
    if config.get("tie_word_embeddings") is True:
        r.assumptions.append(
            "the checkpoint ties its embedding and LM head; the profile counts both (dense "
            "weights high by vocab_size x d_model)"
        )
    ordered = _ordered(fields)
    profile = DerivedProfile(ordered, source, r.notes, r.assumptions)
    profile.spec()
    return profile


def _ordered(fields: dict) -> dict:
    from moebase.model import MODEL_FIELDS

    return {k: fields[k] for k in MODEL_FIELDS if k in fields}


# --------------------------------------------------------------------------------------------- FFN and layers
def _decoder_shape(r: _Reader) -> dict:
    """Expert and FFN shapes and MoE layers of a decoder-only MoE (Mixtral, OLMoE, Qwen-MoE, DeepSeek, gpt-oss)."""
    d_model = r.int("hidden_size", "d_model", why="the model width")
    experts = r.int("num_local_experts", "num_experts", "n_routed_experts", why="the routed experts per MoE layer")
    top_k = r.int("num_experts_per_tok", "experts_per_token", "moe_topk", why="the experts each token is routed to")
    blocks = r.int("num_hidden_layers", "num_layers", why="the transformer blocks")
    width_key = "moe_intermediate_size" if r.has("moe_intermediate_size") else "intermediate_size"
    d_ff = r.int(width_key, why="one routed expert's FFN width")
    moe = _moe_blocks(r, blocks)
    if not moe:
        raise InputError(
            f"{r.where}: no block of the {blocks} is an MoE block (see first_k_dense_replace, "
            f"mlp_only_layers, decoder_sparse_step): nothing to simulate"
        )
    dense_d_ff = (
        r.int("intermediate_size", why="the FFN width of the blocks without experts") if len(moe) < blocks else 0
    )
    shared = _shared_width(r, d_ff)
    r.notes.append(
        f"{width_key} {d_ff} -> d_ff (gated experts: 3 matrices), {experts} routed experts, top-{top_k}, "
        f"{len(moe)} of {blocks} blocks MoE"
        + (f", dense FFN width {dense_d_ff}" if dense_d_ff else "")
        + (f", shared expert width {shared}" if shared else "")
        + "."
    )
    return {
        "d_model": d_model,
        "d_ff": d_ff,
        "expert_matrices": 3,
        "num_experts": experts,
        "top_k": top_k,
        "encoder_blocks": 0,
        "decoder_blocks": blocks,
        "encoder_moe_layers": 0,
        "decoder_moe_layers": len(moe),
        "dense_d_ff": dense_d_ff,
        "dense_ffn_matrices": 3,
        "shared_expert_d_ff": shared,
    }


def _moe_blocks(r: _Reader, blocks: int) -> list[int]:
    """Indices of the blocks with a router, by the rules of the architecture the config's fields belong to."""
    if r.has("first_k_dense_replace") or r.has("moe_layer_freq"):
        first = r.int("first_k_dense_replace", why="the leading dense blocks", default=0, minimum=0)
        freq = r.int("moe_layer_freq", why="every how many blocks one is MoE", default=1)
        return [i for i in range(blocks) if i >= first and i % freq == 0]
    if r.has("mlp_only_layers") or r.has("decoder_sparse_step"):
        dense = set(r.int_list("mlp_only_layers", "the blocks without experts"))
        step = r.int("decoder_sparse_step", why="every how many blocks one is MoE", default=1)
        return [i for i in range(blocks) if i not in dense and (i + 1) % step == 0]
    return list(range(blocks))


def _shared_width(r: _Reader, d_ff: int) -> int:
    """The width of the always-on shared experts of one MoE layer (0: none)."""
    if r.has("shared_expert_intermediate_size"):
        return r.int("shared_expert_intermediate_size", why="the shared expert's width", minimum=0)
    if r.has("n_shared_experts"):
        return r.int("n_shared_experts", why="the shared experts per MoE layer", minimum=0) * d_ff
    return 0


def _switch_shape(r: _Reader) -> dict:
    """Switch Transformers: encoder and decoder stacks, top-1, ReLU experts (wi, wo) as wide as the dense FFN."""
    d_model = r.int("d_model", "hidden_size", why="the model width")
    d_ff = r.int("d_ff", why="the FFN width of experts and dense blocks")
    experts = r.int("num_experts", why="the routed experts per MoE layer")
    enc = r.int("num_layers", why="the encoder blocks")
    dec = r.int("num_decoder_layers", why="the decoder blocks", default=enc)
    enc_moe = _switch_sparse(r, "encoder", enc)
    dec_moe = _switch_sparse(r, "decoder", dec)
    r.notes.append(
        f"Switch: d_ff {d_ff} (experts and dense blocks: wi, wo = 2 matrices), {experts} experts, "
        f"top-1, {enc_moe} of {enc} encoder and {dec_moe} of {dec} decoder blocks MoE."
    )
    return {
        "d_model": d_model,
        "d_ff": d_ff,
        "expert_matrices": 2,
        "num_experts": experts,
        "top_k": 1,
        "encoder_blocks": enc,
        "decoder_blocks": dec,
        "encoder_moe_layers": enc_moe,
        "decoder_moe_layers": dec_moe,
        "dense_d_ff": d_ff,
        "dense_ffn_matrices": 2,
        "shared_expert_d_ff": 0,
    }


def _switch_sparse(r: _Reader, role: str, blocks: int) -> int:
    """MoE blocks of a Switch stack: block i is sparse when i % step == 1 (every block at step 1), the step
    being ``{role}_sparse_step`` or ``blocks // num_sparse_{role}_layers``."""
    sparse = r.int(f"num_sparse_{role}_layers", why=f"the {role}'s MoE blocks", minimum=0)
    if sparse == 0:
        return 0
    step = r.int(
        f"{role}_sparse_step",
        why=f"every how many {role} blocks one is MoE",
        default=max(blocks // sparse, 1),
        minimum=0,
    )
    if step == 0:
        return 0
    return sum(1 for i in range(blocks) if step == 1 or i % step == 1)


# --------------------------------------------------------------------------------------------- attention
def _attention(r: _Reader, d_model: int, switch: bool, blocks: int) -> dict:
    if switch:
        heads = r.int("num_heads", why="the attention heads")
        head_dim = r.int("d_kv", why="the width of one head", default=d_model // heads)
        r.notes.append(f"attention: {heads} heads x {head_dim} (d_kv), no grouped KV heads.")
        return {"n_heads": heads, "n_kv_heads": heads, "head_dim": head_dim}
    heads = r.int("num_attention_heads", why="the attention heads")
    if r.has("kv_lora_rank"):
        return _latent_attention(r, heads)
    if r.has("linear_num_value_heads"):
        return _hybrid_attention(r, heads, d_model, blocks)
    kv = r.int("num_key_value_heads", why="the KV heads", default=heads)
    if r.has("head_dim"):
        head_dim = r.int("head_dim", why="the width of one head")
    elif d_model % heads == 0:
        head_dim = d_model // heads
    else:
        raise InputError(
            f"{r.where}: no field 'head_dim', and hidden size {d_model} is not a multiple of the "
            f"{heads} heads: cannot derive a model profile"
        )
    r.notes.append(f"attention: {heads} heads, {kv} KV heads, head_dim {head_dim}.")
    return {"n_heads": heads, "n_kv_heads": min(kv, heads), "head_dim": head_dim}


def _latent_attention(r: _Reader, heads: int) -> dict:
    """Multi-head latent attention, stated with its own widths (its weights and its compressed KV cache are counted
    from them: :class:`moebase.model.ModelSpec`), plus the plain shape that prices its attention over the context
    as the bundled DeepSeek profiles do: kv_lora_rank + qk_rope_head_dim values as 2 KV heads (1 when that is not
    whole)."""
    rank = r.int("kv_lora_rank", why="the compressed KV width")
    rope = r.int("qk_rope_head_dim", why="the rotary part of a key", minimum=0)
    nope = r.int("qk_nope_head_dim", why="the non-rotary part of a query/key head", minimum=0)
    v_dim = r.int("v_head_dim", why="the width of a value head")
    if "q_lora_rank" not in r.c:
        r.assumptions.append("no field 'q_lora_rank': queries projected straight from the hidden state")
    q_rank = r.int("q_lora_rank", why="the compressed query width (null: none)", default=0, minimum=0)
    values = rank + rope
    kv = 2 if values % 4 == 0 else 1
    head_dim = math.ceil(values / (2 * kv))
    r.notes.append(
        f"attention: multi-head latent attention, {heads} heads, q_lora_rank {q_rank or 'none'}, kv_lora_rank "
        f"{rank}, qk_nope_head_dim {nope}, qk_rope_head_dim {rope}, v_head_dim {v_dim}: weights counted from "
        f"these, KV cache {values} values per token and block; n_kv_heads {kv} and head_dim {head_dim} only "
        f"price the attention over the context, as the bundled DeepSeek profiles do."
    )
    r.assumptions.append(
        f"latent attention's FLOPs over the context are those of {heads} heads of width {head_dim} (the bundled "
        "DeepSeek profiles say by how much they differ)"
    )
    return {
        "n_heads": heads,
        "n_kv_heads": min(kv, heads),
        "head_dim": head_dim,
        "kv_lora_rank": rank,
        "q_lora_rank": q_rank,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v_dim,
    }


def _hybrid_attention(r: _Reader, heads: int, d_model: int, blocks: int) -> dict:
    """Full attention every ``full_attention_interval`` blocks (or where ``layer_types`` says), Gated DeltaNet
    linear attention in the others (Qwen3-Next): kept as one plain shape for every block that holds the KV cache of
    the full blocks exactly (1 KV head) and their mean attention weights (rounded to whole heads)."""
    full = _full_blocks(r, blocks)
    if full == 0:
        raise InputError(f"{r.where}: no block of the {blocks} has full attention (see full_attention_interval)")
    kv = r.int("num_key_value_heads", why="the KV heads of the full-attention blocks", default=heads)
    head_dim = r.int("head_dim", why="the head width of the full-attention blocks", default=d_model // heads)
    gate = 2 if r.c.get("model_type") == "qwen3_next" or r.c.get("attn_output_gate") is True else 1
    full_w = d_model * head_dim * (heads * gate + 2 * kv + heads)
    linear_w = _deltanet_params(r, d_model)
    mean = (full * full_w + (blocks - full) * linear_w) / blocks
    width = math.ceil(full * kv * head_dim / blocks)  # K (or V) values per token and block, all blocks alike
    n_heads = max(round(mean / (2 * d_model * width)) - 1, 1)
    if n_heads > MAX_HEADS:
        raise InputError(
            f"{r.where}: the linear-attention widths give {n_heads} equivalent heads, more than {MAX_HEADS}"
        )
    r.notes.append(
        f"attention: {full} of {blocks} blocks full attention ({heads} heads{' with an output gate' * (gate == 2)}, "
        f"{kv} KV heads, head_dim {head_dim}: {full_w} weights each), the others Gated DeltaNet ({linear_w} "
        f"weights each); kept as n_heads {n_heads}, n_kv_heads 1, head_dim {width} in every block: the KV cache of "
        f"the full blocks, and {2 * d_model * width * (n_heads + 1)} attention weights per block against their "
        f"mean {mean:.0f}."
    )
    r.assumptions.append(
        "the linear-attention blocks' recurrent and convolution state is left out, and their attention over the "
        "context is priced as the full blocks' (too much: only the full blocks attend over it)"
    )
    if width * blocks != full * kv * head_dim:
        r.assumptions.append(f"the KV cache rounds {full * kv * head_dim} values up to {width * blocks} per token")
    return {"n_heads": n_heads, "n_kv_heads": 1, "head_dim": width}


def _full_blocks(r: _Reader, blocks: int) -> int:
    """How many blocks have full attention: ``layer_types`` entries "full_attention", else every
    ``full_attention_interval``-th block (blocks i with (i + 1) % interval == 0)."""
    kinds = r.c.get("layer_types")
    if isinstance(kinds, list) and len(kinds) == blocks:
        return sum(1 for kind in kinds if kind == "full_attention")
    step = r.int("full_attention_interval", why="every how many blocks one has full attention")
    return blocks // step


def _deltanet_params(r: _Reader, d_model: int) -> int:
    """Weights of one Gated DeltaNet block (Qwen3-Next): the q/k/v/z and b/a input projections, the depthwise
    convolution over q, k and v, the output projection (the per-head decay and bias and the norm left out)."""
    k_heads = r.int("linear_num_key_heads", why="the linear-attention key heads")
    v_heads = r.int("linear_num_value_heads", why="the linear-attention value heads")
    k_dim = k_heads * r.int("linear_key_head_dim", why="the linear-attention key head width")
    v_dim = v_heads * r.int("linear_value_head_dim", why="the linear-attention value head width")
    kernel = r.int("linear_conv_kernel_dim", why="the linear-attention convolution width", default=4)
    return d_model * (2 * k_dim + 2 * v_dim + 2 * v_heads) + (2 * k_dim + v_dim) * kernel + v_dim * d_model


# --------------------------------------------------------------------------------------------- weights
def _dtype_bytes(r: _Reader, default: int | None, why: str) -> int:
    for key in ("torch_dtype", "dtype"):
        value = r.c.get(key)
        if value is None:
            continue
        name = str(value).replace("torch.", "")
        if name not in DTYPE_BYTES:
            raise InputError(
                f"{r.where}: field '{key}' names an unknown dtype {brief(value)} (known: {', '.join(DTYPE_BYTES)})"
            )
        r.notes.append(f"{key} {name} -> dtype_bytes {DTYPE_BYTES[name]}.")
        return DTYPE_BYTES[name]
    if default is not None:
        r.assumptions.append(f"dtype_bytes {default}: the config gives no torch_dtype{f' ({why})' if why else ''}")
        return default
    r.assumptions.append("dtype_bytes 2 (bf16): the config gives no torch_dtype")
    return 2


def _expert_bits(r: _Reader, dtype_bytes: int) -> float | None:
    """The experts' storage width when the checkpoint quantizes them, else None (``8 * dtype_bytes``)."""
    q = r.c.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method == "mxfp4":
        r.notes.append("quantization_config mxfp4: experts at 4.25 bits per weight (4 bits, one 8-bit scale per 32).")
        return 4.25
    if method == "fp8":
        r.notes.append("quantization_config fp8: experts at 8 bits per weight; dense weights counted at dtype_bytes.")
        r.assumptions.append("FP8 block scales left out of the expert bytes")
        return 8.0
    bits = None if q.get("bits") is None else _bits(q["bits"], "quantization_config.bits", r.where)
    if bits is not None:
        r.assumptions.append(
            f"quantization_config {brief(method, 30)}: experts at {bits:g} bits per weight, "
            f"scales and zero points left out"
        )
        return float(bits)
    r.assumptions.append(
        f"quantization_config {brief(method, 30)} not modelled: experts at {8 * dtype_bytes} bits per weight"
    )
    return None


__all__ = [
    "DTYPE_BYTES",
    "DerivedProfile",
    "KNOWN_TYPES",
    "MAX_CONFIG_BYTES",
    "SIZE_LIMITS",
    "check_sizes",
    "comment_lines",
    "derive_profile",
    "read_config_file",
]
