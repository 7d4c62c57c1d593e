"""Model profiles: the bundled files (existing numbers unchanged, the new gpt-oss-20b and switch-base-64/8), the
optional ``expert_bits`` (quantized experts: bytes per expert follow the bit width, dense weights keep
``dtype_bytes``), its validation, and its effect on a simulated run."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.model import load_model, model_from_dict
from moebase.profiles import available
from sim.config.run_config import config_from_dict
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.run import simulate
from tests.support.traces import make_trace
from traces.io import save_trace

#: Bytes per expert of the profiles that existed before ``expert_bits`` (docs/architecture.md 5.2): they must not move.
EXISTING = {
    "switch-xxl-128": 251_658_240,
    "switch-large-128": 16_777_216,
    "switch-base-128": 9_437_184,
    "mixtral-8x7b": 352_321_536,
    "qwen1.5-moe-a2.7b": 17_301_504,
    "deepseek-v2-lite": 17_301_504,
    "olmoe-1b-7b": 12_582_912,
}


def test_every_bundled_profile_loads_and_round_trips():
    names = available("models")
    assert {"gpt-oss-20b", "switch-base-64", "switch-base-8", *EXISTING} <= set(names)
    for name in names:
        m = load_model(name)
        assert m.name == name
        assert load_model(m.to_dict()) == m


@pytest.mark.parametrize("name, nbytes", sorted(EXISTING.items()))
def test_existing_profiles_keep_their_expert_bytes(name, nbytes):
    m = load_model(name)
    assert m.expert_bits is None and "expert_bits" not in m.to_dict()
    assert m.expert_bytes == nbytes == m.expert_params * m.dtype_bytes
    assert m.expert_bits_per_weight == 8 * m.dtype_bytes


def test_gpt_oss_20b_profile():
    m = load_model("gpt-oss-20b")
    assert (m.d_model, m.d_ff, m.expert_matrices, m.num_experts, m.top_k) == (2880, 2880, 3, 32, 4)
    assert (m.encoder_blocks, m.decoder_blocks, m.decoder_moe_layers, m.dense_d_ff) == (0, 24, 24, 0)
    assert (m.n_heads, m.n_kv_heads, m.head_dim, m.vocab_size, m.dtype_bytes) == (64, 8, 64, 201088, 2)
    assert m.expert_bits == 4.25
    assert m.expert_bytes == 3 * 2880 * 2880 * 17 // 32 == 13_219_200  # MXFP4: 4 bits + 8-bit scale / 32
    assert m.dense_bytes == m.dense_params * 2  # dense weights stay bf16
    assert m.kv_bytes_per_token == 24 * 2 * 8 * 64 * 2
    assert 20.5e9 < m.total_params < 21.5e9  # "21B parameters" (model card)
    # the shared gpt-oss trace's shape matches (24 MoE layers, 32 experts, top-4)
    assert (m.moe_layers, m.num_experts, m.top_k) == (24, 32, 4)


@pytest.mark.parametrize("name, experts", [("switch-base-64", 64), ("switch-base-8", 8)])
def test_switch_base_variants_are_switch_base_128_with_fewer_experts(name, experts):
    m, base = load_model(name), load_model("switch-base-128")
    assert m.num_experts == experts
    assert {**m.to_dict(), "name": None, "num_experts": None} == {**base.to_dict(), "name": None, "num_experts": None}
    assert m.expert_bytes == base.expert_bytes
    assert m.dense_params - base.dense_params == m.moe_layers * m.d_model * (experts - 128)  # the gates


# ------------------------------------------------------------------------------------------------ expert_bits


@settings(max_examples=200, deadline=None)
@given(
    d_model=st.integers(1, 8192),
    d_ff=st.integers(1, 16384),
    matrices=st.sampled_from([2, 3]),
    dtype=st.sampled_from([1, 2, 4]),
    bits=st.one_of(
        st.sampled_from([4.25, 4.4, 4.5, 6.5625, 8, 16, 0.1, 64, 2.0 / 3.0]),
        st.floats(0.01, 64, allow_nan=False).map(lambda x: round(x, 3)),
    ),
)
def test_expert_bytes_follow_the_bit_width(d_model, d_ff, matrices, dtype, bits):
    base = {
        "name": "m",
        "d_model": d_model,
        "d_ff": d_ff,
        "expert_matrices": matrices,
        "num_experts": 4,
        "top_k": 1,
        "decoder_blocks": 1,
        "decoder_moe_layers": 1,
        "n_heads": 1,
        "head_dim": 8,
        "dtype_bytes": dtype,
        "vocab_size": 10,
    }
    plain, quant = model_from_dict(base), model_from_dict({**base, "expert_bits": bits})
    params = matrices * d_model * d_ff
    assert quant.expert_bytes == math.ceil(params * Fraction(str(bits)) / 8)  # the decimal as written, rounded up
    assert quant.expert_bytes >= 1
    assert plain.expert_bytes == params * dtype
    if bits == 8 * dtype:
        assert quant.expert_bytes == plain.expert_bytes
    # everything else keeps dtype_bytes
    assert (quant.dense_bytes, quant.kv_bytes_per_token, quant.total_params) == (
        plain.dense_bytes,
        plain.kv_bytes_per_token,
        plain.total_params,
    )
    assert quant.expert_flops_per_token == plain.expert_flops_per_token


def test_expert_bits_rounds_up_to_whole_bytes():
    base = {
        "name": "m",
        "d_model": 3,
        "d_ff": 1,
        "expert_matrices": 2,
        "num_experts": 2,
        "top_k": 1,
        "decoder_blocks": 1,
        "decoder_moe_layers": 1,
        "n_heads": 1,
        "head_dim": 8,
        "dtype_bytes": 2,
        "vocab_size": 10,
    }
    assert model_from_dict({**base, "expert_bits": 4}).expert_bytes == 3  # 6 weights x 4 bits = 3 bytes
    assert model_from_dict({**base, "expert_bits": 4.25}).expert_bytes == 4  # 25.5 bits -> 4 bytes
    assert model_from_dict({**base, "d_model": 20, "expert_bits": 4.4}).expert_bytes == 22  # 40 x 4.4 = 176 bits


@pytest.mark.parametrize("value", [0, -4, 64.5, 1e9, "4.25", True, float("nan"), float("inf"), [4]])
def test_bad_expert_bits_name_the_field(value):
    d = {**load_model("gpt-oss-20b").to_dict(), "expert_bits": value}
    with pytest.raises(ConfigError, match=r"^model\.expert_bits: must be a number > 0 and <= 64"):
        model_from_dict(d)


def test_bad_expert_bits_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("base: gpt-oss-20b\nexpert_bits: 0\n")
    with pytest.raises(ConfigError, match=r"^model\.expert_bits: .*\(in .*m\.yaml\)$"):
        load_model(str(path))


def test_expert_bits_64_and_null_are_accepted():
    m = load_model({"base": "gpt-oss-20b", "expert_bits": 64})
    assert m.expert_bytes == 3 * 2880 * 2880 * 8
    assert load_model({"base": "gpt-oss-20b", "expert_bits": None}).expert_bytes == 3 * 2880 * 2880 * 2


# ------------------------------------------------------------------------------------------- in a simulated run


def gpt_oss_trace(tmp_path):
    rng = np.random.default_rng(0)
    e = np.argsort(rng.random((12, 24, 32)), axis=2)[:, :, :4]
    trace = make_trace(e, lengths=[6, 6], num_experts=32)
    trace = type(trace)(
        trace.experts,
        trace.request_offsets,
        trace.prefill_lengths,
        type(trace.meta)(
            type(trace.meta.model)("gpt-oss-20b", 32, 4, trace.meta.model.layers), trace.meta.provenance, 0
        ),
        None,
    )
    return trace, save_trace(trace, tmp_path / "gpt_oss.npz")


def run_cfg(path, model, cache=None):
    d = {
        "model": model,
        "hardware": "h200",
        "workload": {"trace": str(path), "batch_size": 1},
        "cache": cache or {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 8},
        "policy": "on-demand",
        "predictor": "none",
    }
    return config_from_dict(d, "test", POLICIES.names(), PREDICTORS.names())


def test_quantized_experts_move_fewer_bytes_in_a_run(tmp_path):
    trace, path = gpt_oss_trace(tmp_path)
    quant = run_cfg(path, "gpt-oss-20b")
    bf16 = run_cfg(path, {"base": "gpt-oss-20b", "expert_bits": 16})
    sq, sb = simulate(quant, trace=trace).summary, simulate(bf16, trace=trace).summary
    assert sq["copies"] == sb["copies"] > 0
    assert sq["pcie_bytes"] == sq["copies"] * 13_219_200
    assert sb["pcie_bytes"] == sb["copies"] * 3 * 2880 * 2880 * 2
    assert sq["sim_time_s"] < sb["sim_time_s"]  # copies dominate on-demand: 4.25 bits copy faster than 16
    assert quant.resolved["model"]["expert_bits"] == 4.25 and "expert_bits" not in load_model("mixtral-8x7b").to_dict()


def test_cache_split_counts_slots_in_quantized_bytes(tmp_path):
    _, path = gpt_oss_trace(tmp_path)
    split = {"gpu_memory_gb": 1, "split": {"hpc": 0, "mpc": 0, "lpc": 1}}
    quant = run_cfg(path, "gpt-oss-20b", split)
    bf16 = run_cfg(path, {"base": "gpt-oss-20b", "expert_bits": 16}, split)
    assert quant.cache.lpc_buffers == math.floor(1e9 / 13_219_200) == 75
    assert bf16.cache.lpc_buffers == math.floor(1e9 / (3 * 2880 * 2880 * 2)) == 20


def test_bad_expert_bits_exit_2_from_the_cli(tmp_path):
    import os
    import subprocess
    import sys

    from tests.support.paths import ROOT

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "run",
            "configs/mixtral.yaml",
            "--set",
            "model.expert_bits=0",
            "--out",
            str(tmp_path / "o"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "model.expert_bits" in lines[0] and "got 0" in lines[0]
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------ current models

#: name -> (d_model, d_ff, experts, top_k, blocks, MoE layers, dense_d_ff, shared width, n_heads, n_kv_heads,
#: head_dim, vocab, expert_bits, bytes per expert, total parameters (approx.)), from each file's source config
CURRENT = {
    "deepseek-v3": (7168, 2048, 256, 8, 61, 58, 18432, 2048, 128, 2, 144, 129280, 8, 44_040_192, 671e9),
    "kimi-k2": (7168, 2048, 384, 8, 61, 60, 18432, 2048, 64, 2, 144, 163840, 8, 44_040_192, 1.04e12),
    "qwen3-30b-a3b": (2048, 768, 128, 8, 48, 48, 0, 0, 32, 4, 128, 151936, None, 9_437_184, 30.5e9),
    "qwen3-235b-a22b": (4096, 1536, 128, 8, 94, 94, 0, 0, 64, 4, 128, 151936, None, 37_748_736, 235e9),
    "gpt-oss-120b": (2880, 2880, 128, 4, 36, 36, 0, 0, 64, 8, 64, 201088, 4.25, 13_219_200, 116.8e9),
    "gpt-oss-20b": (2880, 2880, 32, 4, 24, 24, 0, 0, 64, 8, 64, 201088, 4.25, 13_219_200, 20.9e9),
}


@pytest.mark.parametrize("name", sorted(CURRENT))
def test_current_model_profiles(name):
    (
        d_model,
        d_ff,
        experts,
        top_k,
        blocks,
        moe,
        dense_ff,
        shared,
        heads,
        kv_heads,
        head_dim,
        vocab,
        bits,
        nbytes,
        total,
    ) = CURRENT[name]
    m = load_model(name)
    assert m.name == name and load_model(m.to_dict()) == m
    assert (m.d_model, m.d_ff, m.expert_matrices, m.num_experts, m.top_k) == (d_model, d_ff, 3, experts, top_k)
    assert (m.encoder_blocks, m.decoder_blocks, m.decoder_moe_layers, m.dense_d_ff) == (0, blocks, moe, dense_ff)
    assert (m.shared_expert_d_ff, m.n_heads, m.n_kv_heads, m.head_dim, m.vocab_size) == (
        shared,
        heads,
        kv_heads,
        head_dim,
        vocab,
    )
    assert m.dtype_bytes == 2 and m.expert_bits == bits
    assert m.expert_bytes == nbytes
    assert m.total_params == pytest.approx(total, rel=0.02)
    assert m.dense_bytes < m.moe_layers * m.num_experts * m.expert_bytes


def test_mla_models_cache_the_compressed_latent_exactly():
    for name in ("deepseek-v3", "kimi-k2"):
        m = load_model(name)
        assert m.kv_bytes_per_block_token == (512 + 64) * 2  # kv_lora_rank + qk_rope_head_dim values, bf16
        assert m.decoder_blocks - m.decoder_moe_layers == {"deepseek-v3": 3, "kimi-k2": 1}[name]  # dense first


@pytest.mark.parametrize("name", ["deepseek-v2-lite", "deepseek-v3", "kimi-k2"])
def test_an_mla_model_without_its_latent_cache_caches_every_head_s_key_and_value(name):
    """``latent_cache: false`` (ik_llama.cpp -mla 0): each head's decompressed key (nope + rope) and value in the
    cache and in the attention's FLOPs over it; the weights are the same; a model without MLA refuses it."""
    m = load_model(name)
    mha = load_model({"base": name, "latent_cache": False})
    per_head = m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim
    assert mha.kv_bytes_per_block_token == m.n_heads * per_head * m.dtype_bytes > m.kv_bytes_per_block_token
    assert mha.attention_pair_flops == 2 * m.n_heads * per_head
    assert (mha.dense_params, mha.expert_bytes) == (m.dense_params, m.expert_bytes)
    assert "latent_cache" not in m.to_dict() and load_model(mha.to_dict()) == mha
    if name == "deepseek-v2-lite":  # 16 heads x (128 + 64 + 128) against 512 + 64 latent values: ~9x (its profile)
        assert mha.kv_bytes_per_block_token == 10240 and m.kv_bytes_per_block_token == 1152
    with pytest.raises(ConfigError, match="latent_cache"):
        load_model({"base": "mixtral-8x7b", "latent_cache": False})


def test_fp8_experts_are_one_byte_per_weight():
    m = load_model("deepseek-v3")
    assert m.expert_bytes == m.expert_params == 3 * 7168 * 2048
    assert load_model({"base": "kimi-k2", "expert_bits": 4.5}).expert_bytes == 3 * 7168 * 2048 * 9 // 16  # K2 INT4


@pytest.mark.parametrize("name", sorted(set(CURRENT) - {"gpt-oss-20b"}))
def test_cli_runs_each_current_model_on_a_synthetic_trace(tmp_path, name):
    import json
    import os
    import subprocess
    import sys

    import yaml

    from tests.support.paths import ROOT

    m = load_model(name)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trace = tmp_path / "t.npz"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "traces",
            "synth",
            "--out",
            str(trace),
            "--model",
            name,
            "--experts",
            str(m.num_experts),
            "--top-k",
            str(m.top_k),
            "--layers",
            str(m.moe_layers),
            "--requests",
            "2",
            "--prompt-len",
            "3,3",
            "--decode-len",
            "2,2",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": name,
                "hardware": "h200",
                "workload": {"trace": str(trace), "batch_size": 2, "prefill": True},
                "cache": {"hpc_slots": 0, "mpc_slots": 2, "lpc_buffers": 8},
                "policy": "lru",
                "predictor": "none",
            }
        )
    )
    res = subprocess.run(
        [sys.executable, "-m", "sim", "run", str(cfg), "--json", "--out", str(tmp_path / "o")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["model"] == name and summary["copies"] > 0
    assert summary["pcie_bytes"] == summary["copies"] * m.expert_bytes
