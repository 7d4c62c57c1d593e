"""Every bundled model profile against its model's published size: total parameters and active parameters, each
within a stated tolerance of the figure its publisher gives; the profiles derived from a stored published config
(``configs/models/sources/``) equal what :mod:`traces.profile_from_config` derives from it; and their parameter
counts equal those of the real architecture built from the same config by transformers (on the meta device: shapes
only), attention block by attention block. Multi-head latent attention is counted from its own widths (weights and
compressed KV cache)."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.model import MLA_FIELDS, load_model, model_from_dict
from moebase.profiles import available
from tests.support.paths import ROOT
from traces.profile_from_config import derive_profile

SOURCES = ROOT / "configs" / "models" / "sources"
STORED = sorted(p.name.removesuffix(".config.json") for p in SOURCES.glob("*.config.json"))

#: name -> (total parameters, active parameters or None, where the figures are published). Figures as written
#: there: their rounding sets half of the tolerance (see ``tolerance``).
PUBLISHED = {
    "deepseek-v3": ("671e9", "37e9", "model card (README): 671B total, 37B activated"),
    "deepseek-v2": ("236e9", "21e9", "model card: 236B total, 21B activated"),
    "deepseek-v2.5": ("235.74e9", "21e9", "Hugging Face page: 235.74B parameters; V2 architecture, 21B activated"),
    "deepseek-v2-lite": ("15.7e9", "2.4e9", "model card: 15.7B total, 2.4B activated"),
    "deepseek-coder-v2-lite": ("16e9", "2.4e9", "deepseek-ai/DeepSeek-Coder-V2 README: 16B total, 2.4B active"),
    "kimi-k2": ("1.04e12", "32e9", "technical report (arXiv 2507.20534): 1.04T total, 32B activated"),
    "qwen2-57b-a14b": ("57e9", "14e9", "model card: 57B total, 14B activated"),
    "qwen3-coder-next": ("79.674391296e9", "3e9", "safetensors 79,674,391,296; model card: 3B activated"),
    "minimax-m2.1": ("228.703644928e9", "10e9", "safetensors 228,703,644,928; MiniMax-M2 README: 10B active"),
    "glm-4.5-air": ("106e9", "12e9", "model card: 106B total, 12B active"),
    "mixtral-8x7b": ("46.7e9", "12.9e9", "Mistral AI: 46.7B total, 12.9B per token"),
    "gpt-oss-20b": ("20.91e9", "3.61e9", "model card (arXiv 2508.10925): 20.91B total, 3.61B active"),
    "gpt-oss-120b": ("116.83e9", "5.13e9", "model card (arXiv 2508.10925): 116.83B total, 5.13B active"),
    "qwen3-30b-a3b": ("30.5e9", "3.3e9", "model card: 30.5B total, 3.3B activated"),
    "qwen3-235b-a22b": ("235e9", "22e9", "model card: 235B total, 22B activated"),
    "qwen3.5-35b-a3b": ("35e9", "3e9", "model card: 35B total, 3B activated"),
    "qwen1.5-moe-a2.7b": ("14.3e9", "2.7e9", "model card: 14.3B total, 2.7B activated"),
    "olmoe-1b-7b": ("6.9e9", "1.3e9", "OLMoE paper (arXiv 2409.02060): 6.9B total, 1.3B active"),
    "switch-base-8": ("619e6", None, "Hugging Face: 619M params (a fine-tune of google/switch-base-8, same shapes)"),
    "switch-base-64": ("3.8e9", None, "google/switch-base-64 safetensors: 9.8 + 5.46 GB at fp32, 3.8B"),
    "switch-base-128": ("7e9", None, "Switch Transformers (Fedus et al., JMLR 2022) Table 9: Switch-Base 7B"),
    "switch-large-128": ("26e9", None, "Switch Transformers (Fedus et al., JMLR 2022) Table 9: Switch-Large 26B"),
    "switch-xxl-128": ("395e9", None, "Switch Transformers (Fedus et al., JMLR 2022) Table 9: Switch-XXL 395B"),
}
#: A derived figure may differ from the published one by this share, or by half a unit of the figure's last written
#: digit when that is more (a card's "3B activated" is anything from 2.5 to 3.5 B).
RELATIVE = 0.02


def tolerance(published: str) -> float:
    """The allowed |derived - published|: the larger of RELATIVE of it and half a unit of its last written digit."""
    value = Decimal(published)
    return max(RELATIVE * float(value), 0.5 * 10.0 ** value.as_tuple().exponent)


#: Checkpoints whose embedding and LM head are one matrix (Switch, as T5: tie_word_embeddings true); the profiles
#: count both (moebase/model.py dense_params), so their published size is compared with one of them left out.
TIED = {"switch-base-8", "switch-base-64", "switch-base-128", "switch-large-128", "switch-xxl-128"}


def checkpoint_params(name: str) -> int:
    """The profile's parameters as its checkpoint holds them: one embedding matrix fewer where it is tied."""
    m = load_model(name)
    return m.total_params - (m.vocab_size * m.d_model if name in TIED else 0)


def test_every_bundled_profile_has_its_published_size():
    assert set(available("models")) == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_parameters_match_the_published_figure(name):
    total, _, where = PUBLISHED[name]
    derived = checkpoint_params(name)
    assert abs(derived - float(total)) <= tolerance(total), (name, derived, where)


@pytest.mark.parametrize("name", sorted(n for n, figures in PUBLISHED.items() if figures[1] is not None))
def test_active_parameters_match_the_published_figure(name):
    """Publishers count active parameters with the embedding and LM head or without them: the published figure must
    lie between the two counts (within the tolerance)."""
    _, active, where = PUBLISHED[name]
    assert active is not None
    m = load_model(name)
    low, high = m.active_params - m.embedding_params, m.active_params
    gap = max(low - float(active), float(active) - high, 0.0)
    assert gap <= tolerance(active), (name, low, high, where)


def test_the_tolerance_follows_the_written_precision():
    assert tolerance("3e9") == 0.5e9 and tolerance("3.3e9") == pytest.approx(0.066e9)
    assert tolerance("671e9") == pytest.approx(13.42e9)
    assert tolerance("79.674391296e9") == pytest.approx(RELATIVE * 79.674391296e9)


# ------------------------------------------------------------------------------------------ stored configs
def stored_config(name: str) -> dict:
    return json.loads((SOURCES / f"{name}.config.json").read_text())


def test_the_new_models_have_a_stored_config():
    assert {
        "deepseek-v2",
        "deepseek-v2.5",
        "deepseek-v2-lite",
        "deepseek-coder-v2-lite",
        "deepseek-v3",
        "qwen2-57b-a14b",
        "minimax-m2.1",
        "qwen3-coder-next",
        "glm-4.5-air",
    } <= set(STORED)


@pytest.mark.parametrize("name", STORED)
def test_a_profile_equals_the_one_derived_from_its_stored_config(name):
    config = stored_config(name)
    assert config["_source"], "a stored config says where its figures come from"
    derived = derive_profile(config, name, f"configs/models/sources/{name}.config.json")
    assert derived.spec().to_dict() == load_model(name).to_dict()


def _meta_model(config: dict):
    """The architecture transformers builds from ``config`` (its widths; no quantization), on the meta device."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    fields = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("quantization_config",)}
    fields.pop("architectures", None)
    built = tf.AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        return tf.AutoModelForCausalLM.from_config(built)


def _matrices(module) -> int:
    """Weights of ``module`` in matrices and larger (norms, biases and per-head scalars left out, as profiles do)."""
    return sum(p.numel() for p in module.parameters() if p.dim() >= 2)


def _attention_module(layer):
    return getattr(layer, "self_attn", None) or layer.linear_attn


@pytest.mark.parametrize("name", STORED)
def test_the_parameters_are_those_of_the_real_architecture(name):
    """Built by transformers from the same config: every parameter counted (the multi-token-prediction modules are
    not built; norms and biases are in the real count), and each block's attention weights (matrices) against the
    profile's, exactly for plain and latent attention, on average for a hybrid stack."""
    config = stored_config(name)
    model = _meta_model(config)
    m = load_model(name)
    real = sum(p.numel() for p in model.parameters())
    assert m.total_params == pytest.approx(real, rel=1e-3)
    blocks = [_matrices(_attention_module(layer)) for layer in model.model.layers]
    if "linear_num_value_heads" in config:
        assert m.attention_params_per_block == pytest.approx(sum(blocks) / len(blocks), rel=0.01)
    else:
        assert set(blocks) == {m.attention_params_per_block}


def test_deepseek_v3_dense_weights_come_from_its_latent_attention():
    """The defect: MLA counted as a plain shape (268 M per block) put DeepSeek-V3's dense weights at 44.1 GB, ~10 GB
    above the real model's, so a 40 GB GPU was refused."""
    m = load_model("deepseek-v3")
    assert (
        m.attention_params_per_block == 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    )
    assert m.dense_bytes == m.dense_params * 2 and 34.0e9 < m.dense_bytes < 34.5e9
    assert m.kv_bytes_per_token == 61 * 576 * 2


# ------------------------------------------------------------------------------------------ latent attention
PLAIN = {
    "name": "toy",
    "d_model": 64,
    "d_ff": 32,
    "expert_matrices": 3,
    "num_experts": 8,
    "top_k": 2,
    "decoder_blocks": 2,
    "decoder_moe_layers": 2,
    "n_heads": 4,
    "dtype_bytes": 2,
    "vocab_size": 100,
}


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    heads=st.integers(1, 64),
    d=st.integers(1, 4096),
    rank=st.integers(1, 1024),
    q_rank=st.integers(0, 2048),
    nope=st.integers(0, 256),
    rope=st.integers(1, 128),
    v=st.integers(1, 256),
    dtype=st.sampled_from([1, 2, 4]),
)
def test_latent_attention_weights_and_kv_come_from_its_widths(heads, d, rank, q_rank, nope, rope, v, dtype):
    mla = {"kv_lora_rank": rank, "q_lora_rank": q_rank, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope}
    m = model_from_dict(
        {**PLAIN, "d_model": d, "n_heads": heads, "head_dim": 8, "dtype_bytes": dtype, **mla, "v_head_dim": v}
    )
    query = q_rank * (d + heads * (nope + rope)) if q_rank else d * heads * (nope + rope)
    want = query + d * (rank + rope) + rank * heads * (nope + v) + heads * v * d
    assert m.attention_params_per_block == want == m.attention_params("decoder")
    assert m.kv_bytes_per_block_token == (rank + rope) * dtype
    assert m.kv_bytes_per_token == 2 * (rank + rope) * dtype
    assert model_from_dict(m.to_dict()) == m
    plain = model_from_dict({**PLAIN, "d_model": d, "n_heads": heads, "head_dim": 8, "dtype_bytes": dtype})
    assert m.dense_params - plain.dense_params == 2 * (want - plain.attention_params_per_block)
    assert m.total_params - m.dense_params == plain.total_params - plain.dense_params  # experts untouched


def test_a_plain_profile_states_no_latent_attention():
    m = model_from_dict(PLAIN)
    assert not m.latent_attention and not set(MLA_FIELDS) & set(m.to_dict())
    assert m.kv_bytes_per_block_token == 2 * m.n_kv_heads * m.head_dim * m.dtype_bytes


@pytest.mark.parametrize("key", MLA_FIELDS[1:])
def test_a_latent_width_without_kv_lora_rank_is_refused_naming_it(key):
    with pytest.raises(ConfigError, match=rf"model\.{key}: .*needs kv_lora_rank"):
        model_from_dict({**PLAIN, key: 64})


@pytest.mark.parametrize(
    "extra, field",
    [({"qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 8}, "qk_nope_head_dim"), ({}, "v_head_dim")],
)
def test_latent_attention_needs_its_head_widths(extra, field):
    with pytest.raises(ConfigError, match=rf"model\.{field}:"):
        model_from_dict({**PLAIN, "kv_lora_rank": 16, "qk_rope_head_dim": 4, **extra})


def test_the_hybrid_equivalent_keeps_the_full_blocks_kv_cache():
    """Qwen3-Coder-Next: 12 of 48 blocks hold a KV cache (2 heads x 256, K and V); the profile's one shape per
    block holds the same values per token."""
    m = load_model("qwen3-coder-next")
    assert m.kv_bytes_per_token == 12 * 2 * 2 * 256 * m.dtype_bytes
    assert math.isclose(m.total_params, 79_674_391_296, rel_tol=1e-3)


@pytest.mark.parametrize(
    "trace_name, profile",
    [
        ("deepseek-v2-lite", "deepseek-v2-lite"),
        ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
        ("DeepSeek-V2-Chat-0628", "deepseek-v2"),
        ("deepseek-v2.5", "deepseek-v2.5"),
        ("deepseek-coder-v2-lite-instruct", "deepseek-coder-v2-lite"),
    ],
)
def test_a_trace_is_held_to_the_most_specific_profile_its_name_matches(trace_name, profile):
    """ "deepseek-v2-lite" is also "deepseek-v2" with a variant suffix by the name rule; the longer name wins."""
    from traces.importers.common import profiles_for

    assert [stem for stem, _ in profiles_for(trace_name)] == [profile]
