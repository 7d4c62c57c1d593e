"""Tiny, randomly initialised MoE models for offline recording and tests (no download, no tokenizer).

``build_tiny_model(arch, seed)`` builds one of :data:`TINY_ARCHS` from a small config (hidden size 32-48,
2-4 transformer blocks, 8-16 experts, a 320-token vocabulary) with weights drawn from ``torch.manual_seed(seed)``,
so the same arch and seed always give the same model. The configs keep each architecture's routing features:

- ``mixtral``: softmax top-2 of 8 experts in every block (``MixtralForCausalLM``).
- ``qwen2-moe``: softmax top-2 of 8 experts plus a gated shared expert; block 1 is dense (``mlp_only_layers``)
  so it has no router (``Qwen2MoeForCausalLM``).
- ``olmoe``: softmax top-2 of 8 experts, not renormalised (``OlmoeForCausalLM``).
- ``deepseek-v3``: sigmoid scores, grouped top-4 of 16 experts in 4 groups (2 groups kept) with a score
  correction bias, which is set to small random values here so that the bias actually matters; block 0 is dense
  (``first_k_dense_replace = 1``) (``DeepseekV3ForCausalLM``).
- ``switch``: encoder-decoder, top-1 of 8 experts with expert capacity 128 per sequence, 4 encoder and 4 decoder
  blocks of which 1 and 3 are sparse (``sparse_step`` 2) (``SwitchTransformersForConditionalGeneration``).

Text becomes token ids with :func:`encode_bytes`: the UTF-8 bytes of the text, byte ``b`` -> id ``b + 3``
(ids 0, 1, 2 are pad, bos and eos; no bos is added). It is trivial and deterministic, and it is only meant
for these tiny models; a real checkpoint uses its own tokenizer.
"""

from __future__ import annotations

from typing import Any

from moebase.errors import InputError

TINY_ARCHS = ("mixtral", "qwen2-moe", "olmoe", "deepseek-v3", "switch")
TINY_VOCAB = 320
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_OFFSET = 3


def encode_bytes(text: str) -> list[int]:
    """The tiny models' tokenizer: UTF-8 byte ``b`` of ``text`` -> token id ``b + 3``."""
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


def decode_bytes(ids) -> str:
    """Inverse of :func:`encode_bytes` (special ids are dropped, invalid UTF-8 is replaced)."""
    return bytes(int(i) - BYTE_OFFSET for i in ids if BYTE_OFFSET <= int(i) < BYTE_OFFSET + 256).decode(
        "utf-8", errors="replace"
    )


def tiny_config(arch: str):
    """The small config of a tiny ``arch`` (one of :data:`TINY_ARCHS`)."""
    import transformers as tf

    common: dict[str, Any] = dict(
        vocab_size=TINY_VOCAB,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        initializer_range=0.1,
        tie_word_embeddings=False,
    )
    decoder: dict[str, Any] = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        **common,
    )
    if arch == "mixtral":
        return tf.MixtralConfig(
            intermediate_size=64, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2, **decoder
        )
    if arch == "qwen2-moe":
        return tf.Qwen2MoeConfig(
            intermediate_size=64,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
            norm_topk_prob=True,
            **decoder,
        )
    if arch == "olmoe":
        return tf.OlmoeConfig(
            intermediate_size=32,
            num_hidden_layers=2,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            **decoder,
        )
    if arch == "deepseek-v3":
        return tf.DeepseekV3Config(
            intermediate_size=64,
            moe_intermediate_size=16,
            num_hidden_layers=3,
            n_shared_experts=1,
            n_routed_experts=16,
            n_group=4,
            topk_group=2,
            num_experts_per_tok=4,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            v_head_dim=8,
            qk_nope_head_dim=8,
            **{**decoder, "num_key_value_heads": 4},
        )
    if arch == "switch":
        return tf.SwitchTransformersConfig(
            vocab_size=TINY_VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_heads=4,
            num_layers=4,
            num_decoder_layers=4,
            num_sparse_encoder_layers=2,
            num_sparse_decoder_layers=2,
            num_experts=8,
            expert_capacity=128,
            router_dtype="float32",
            router_jitter_noise=0.0,
            dropout_rate=0.0,
            initializer_factor=1.0,
            # decoder_start_token_id is taken at run time but missing from the annotated signature
            pad_token_id=PAD_ID,
            eos_token_id=EOS_ID,
            decoder_start_token_id=PAD_ID,  # type: ignore[call-arg]
            tie_word_embeddings=False,
        )
    raise InputError(f"--tiny: unknown architecture {arch!r} (choose from {', '.join(TINY_ARCHS)})")


def build_tiny_model(arch: str, seed: int = 0, dtype=None):
    """A tiny randomly initialised ``arch`` model (eval mode, eager attention), the same for the same seed."""
    import torch
    import transformers as tf

    config = tiny_config(arch)
    classes = {
        "mixtral": tf.MixtralForCausalLM,
        "qwen2-moe": tf.Qwen2MoeForCausalLM,
        "olmoe": tf.OlmoeForCausalLM,
        "deepseek-v3": tf.DeepseekV3ForCausalLM,
        "switch": tf.SwitchTransformersForConditionalGeneration,
    }
    config._attn_implementation = "eager"
    gen = torch.random.fork_rng(devices=[])
    with gen:
        torch.manual_seed(seed)
        model = classes[arch](config)
        if arch == "deepseek-v3":
            with torch.no_grad():
                for module in model.modules():
                    if hasattr(module, "e_score_correction_bias"):
                        module.e_score_correction_bias.normal_(0.0, 0.05)
    if dtype is not None:
        model = model.to(dtype)
    model.eval()
    model.name_or_path = f"tiny-{arch}"
    return model
