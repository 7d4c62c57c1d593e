"""The cost model: roofline figures against docs/architecture.md 5.1, and calibration tables overriding and
interpolating."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.model import load_model
from sim.config.hardware import CalibrationTables, hardware_from_dict, load_hardware
from sim.costs.costs import CostModel

H200 = load_hardware("h200")
XXL = load_model("switch-xxl-128")
MIXTRAL = load_model("mixtral-8x7b")


def with_tables(hw=H200, **tables):
    return dataclasses.replace(hw, tables=CalibrationTables(**tables))


# ------------------------------------------------------------------------------------------ roofline
def test_copy_of_a_switch_xxl_expert_over_gen5_is_about_5_ms():
    c = CostModel(XXL, H200)
    assert c.expert_bytes == XXL.expert_bytes == pytest.approx(251.7e6, rel=0.001)
    assert c.copy_s(c.expert_bytes) == pytest.approx(5e-3, rel=0.05)  # docs/architecture.md 5.1
    assert c.copy_s(c.expert_bytes) == pytest.approx(10e-6 + 251.66e6 / 52e9, rel=1e-3)
    assert c.copy_s(0) == 0.0


def test_copies_scale_with_the_link():
    a100, gh200 = CostModel(XXL, load_hardware("a100-pcie")), CostModel(XXL, load_hardware("gh200"))
    h200 = CostModel(XXL, H200)
    assert a100.copy_s(XXL.expert_bytes) > 2 * h200.copy_s(XXL.expert_bytes) > 10 * gh200.copy_s(XXL.expert_bytes)


def test_d2d_copy_reads_and_writes_hbm():
    c = CostModel(XXL, H200)
    assert c.d2d_s(XXL.expert_bytes) == pytest.approx(3e-6 + XXL.expert_bytes / 2.4e12)
    assert c.d2d_s(XXL.expert_bytes) < c.copy_s(XXL.expert_bytes) / 40
    assert c.d2d_s(0) == 0.0


def test_expert_at_one_token_is_memory_bound_about_50_us():
    c = CostModel(XXL, H200)
    t1 = c.expert_s(1)
    assert 45e-6 < t1 < 75e-6  # docs/architecture.md 5.1: reading it once ~50 us
    read = XXL.expert_bytes / H200.hbm_bw
    assert t1 == pytest.approx(3 * H200.launch_overhead_s + read, rel=0.01)
    assert XXL.expert_flops_per_token / H200.flops < read / 100  # compute is negligible at 1 token
    assert c.copy_s(XXL.expert_bytes) / t1 > 50  # a miss costs ~100x the compute


def test_expert_grows_with_tokens_and_turns_compute_bound():
    c = CostModel(XXL, H200)
    times = [c.expert_s(n) for n in (0, 1, 2, 8, 64, 256, 1024, 8192)]
    assert times[0] == 0.0
    assert all(a <= b for a, b in zip(times, times[1:]))
    assert times[-1] > 10 * times[1]
    assert c.expert_s(8192) == pytest.approx(3 * 3e-6 + 8192 * XXL.expert_flops_per_token / H200.flops, rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 100_000), st.integers(0, 100_000))
def test_expert_is_monotone_in_tokens(a, b):
    c = CostModel(MIXTRAL, H200)
    lo, hi = sorted((a, b))
    assert c.expert_s(lo) <= c.expert_s(hi)


def test_fp32_models_use_the_fp32_rate():
    fp32 = dataclasses.replace(load_model("switch-base-128"), dtype_bytes=4)
    bf16 = load_model("switch-base-128")
    big = 1 << 16
    assert CostModel(fp32, H200).expert_s(big) == pytest.approx(
        2 * H200.launch_overhead_s + big * fp32.expert_flops_per_token / H200.flops_fp32, rel=1e-6
    )
    assert CostModel(fp32, H200).expert_s(big) > 5 * CostModel(bf16, H200).expert_s(big)


def test_dense_grows_with_tokens_and_context():
    for model in (XXL, MIXTRAL, load_model("deepseek-v2-lite"), load_model("qwen1.5-moe-a2.7b")):
        c = CostModel(model, H200)
        role = "decoder"
        by_tokens = [c.dense_s(role, n, 512) for n in (1, 16, 128, 1024, 8192)]
        by_context = [c.dense_s(role, 64, ctx) for ctx in (0, 64, 512, 4096, 32768)]
        assert all(a < b for a, b in zip(by_tokens, by_tokens[1:])), model.name
        assert all(a < b for a, b in zip(by_context, by_context[1:])), model.name
        assert c.dense_s(role, 0, 512) == 0.0


def test_dense_of_switch_xxl():
    c = CostModel(XXL, H200)
    # one decoder MoE layer carries 2 blocks (self + cross attention each) and 1 gated dense FFN block
    weights = (2 * XXL.attention_params("decoder") + XXL.dense_ffn_params + XXL.gate_params) * 2
    t = c.dense_s("decoder", 1, 1)
    assert t > weights / H200.hbm_bw  # reads its weights at least once
    assert t < weights / H200.hbm_bw + 100e-6  # plus launches and a little KV
    assert c.dense_s("decoder", 16, 256) > c.dense_s("encoder", 16, 256)  # cross-attention
    with pytest.raises(ValueError):
        c.dense_s("middle", 1, 1)
    with pytest.raises(ValueError):
        CostModel(MIXTRAL, H200).dense_s("encoder", 1, 1)  # decoder-only model


def test_lm_head():
    c = CostModel(MIXTRAL, H200)
    assert c.lm_head_s(0) == 0.0
    assert c.lm_head_s(1) == pytest.approx(2 * 3e-6 + (32000 * 4096 * 2 + (4096 + 32000) * 2) / 4.8e12)
    assert c.lm_head_s(4096) > c.lm_head_s(1)


# ------------------------------------------------------------------------------------------ tables
def test_copy_table_overrides_and_interpolates():
    c = CostModel(XXL, with_tables(copy=((1e6, 1e-3), (1e8, 3e-3)), d2d=((0, 1e-5), (1e9, 1e-3))))
    assert c.copy_s(1e6) == pytest.approx(1e-3)
    assert c.copy_s(1e8) == pytest.approx(3e-3)
    assert c.copy_s(0.5e8 + 0.5e6) == pytest.approx(2e-3)  # halfway
    assert c.copy_s(1e3) == pytest.approx(1e-3)  # held below the first point
    slope = 2e-3 / 99e6
    assert c.copy_s(3e8) == pytest.approx(3e-3 + slope * 2e8)  # extrapolated with the last slope
    assert c.d2d_s(5e8) == pytest.approx(0.505e-3)
    assert c.expert_s(1) == CostModel(XXL, H200).expert_s(1)  # other durations keep the roofline


def test_table_extrapolation_never_decreases():
    c = CostModel(XXL, with_tables(copy=((1e6, 1e-3), (1e7, 2e-3), (1e8, 1.9e-3))))
    assert c.copy_s(1e9) == pytest.approx(1.9e-3)


def test_expert_table_overrides_and_interpolates():
    tables = dict(model="switch-xxl-128", expert=((1, 60e-6), (64, 80e-6), (512, 400e-6)))
    c = CostModel(XXL, with_tables(**tables))
    assert c.expert_s(1) == pytest.approx(60e-6)
    assert c.expert_s(32) == pytest.approx(60e-6 + 20e-6 * 31 / 63)
    assert c.expert_s(1024) == pytest.approx(400e-6 + 320e-6 / 448 * 512)
    assert c.expert_s(0) == 0.0
    assert c.copy_s(XXL.expert_bytes) == CostModel(XXL, H200).copy_s(XXL.expert_bytes)


def test_tables_for_another_model_are_refused():
    hw = with_tables(model="mixtral-8x7b", expert=((1, 1e-5), (8, 2e-5)))
    with pytest.raises(ConfigError) as exc:
        CostModel(XXL, hw)
    assert str(exc.value).startswith("hardware.tables.model:")
    CostModel(MIXTRAL, hw)
    CostModel(XXL, with_tables(model="mixtral-8x7b", copy=((1, 1e-5), (8, 2e-5))))  # copies hold for any model


def test_dense_table_is_bilinear():
    grid = ((1, 64, 100e-6), (65, 64, 200e-6), (1, 1024, 300e-6), (65, 1024, 500e-6))
    c = CostModel(XXL, with_tables(model="switch-xxl-128", dense=grid))
    for t, ctx, s in grid:
        assert c.dense_s("decoder", t, ctx) == pytest.approx(s)
    mid_t, mid_c = (1 + 65) // 2, (64 + 1024) / 2
    assert c.dense_s("encoder", mid_t, mid_c) == pytest.approx((100 + 200 + 300 + 500) / 4 * 1e-6)
    assert c.dense_s("decoder", mid_t, 64) == pytest.approx(150e-6)
    assert c.dense_s("decoder", 1, 0) == pytest.approx(100e-6)  # held below the grid
    assert c.dense_s("decoder", 129, 64) == pytest.approx(300e-6)  # extrapolated above it
    assert c.dense_s("decoder", 129, 2048) > 500e-6
    assert c.dense_s("decoder", 0, 64) == 0.0


def test_dense_table_with_one_context():
    c = CostModel(XXL, with_tables(model="switch-xxl-128", dense=((1, 128, 1e-4), (9, 128, 2e-4))))
    assert c.dense_s("decoder", 5, 4096) == pytest.approx(1.5e-4)


def test_tables_from_a_mapping_are_sorted_and_checked():
    d = dict(H200.to_dict(), tables={"copy": [[1e8, 3e-3], [1e6, 1e-3]]})
    hw = hardware_from_dict(d)
    assert hw.tables.copy == ((1e6, 1e-3), (1e8, 3e-3))
    assert CostModel(XXL, hw).copy_s(1e6) == pytest.approx(1e-3)


def test_memoised_values_equal_a_fresh_cost_model():
    """A memoised duration is the one a new cost model computes (the memo may not go stale or mix up keys)."""
    c = CostModel(MIXTRAL, H200)
    first = [c.expert_s(t) for t in (7, 1, 7, 64)] + [c.dense_s("decoder", 16, 100.5), c.dense_s("decoder", 1, 9)]
    fresh = [CostModel(MIXTRAL, H200).expert_s(t) for t in (7, 1, 7, 64)] + [
        CostModel(MIXTRAL, H200).dense_s("decoder", 16, 100.5),
        CostModel(MIXTRAL, H200).dense_s("decoder", 1, 9),
    ]
    assert first == fresh and first[0] != first[1] and first[0] == first[2]
