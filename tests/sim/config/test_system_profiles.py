"""Serving-system profiles (sim/config/system.py): ``ideal`` (the default) changes no result, and each software knob
moves time or bytes as it says it does."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.model import load_model
from sim.config.hardware import load_hardware
from sim.config.parts import cpu_part
from sim.config.run_config import load_run_config
from sim.config.system import FORMATS, IDEAL, SystemSpec, load_system
from sim.costs.costs import CostModel
from sim.run import simulate
from tests.support.paths import ROOT

SMALL = ("workload.requests=2", "workload.max_decode_tokens=8")
SLOW = settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))


def _cfg(path: str, *sets: str):
    return load_run_config(path, list(SMALL) + list(sets))


def _summary(result) -> dict:
    """The figures of a run, without how long it took or how its hardware profile was given (a label)."""
    return {k: v for k, v in result.summary.items() if k not in ("wall_s", "events_per_s", "hardware_source")}


def _iterations(result) -> list:
    return [dataclasses.astuple(x) for x in result.engine.iterations]


@pytest.mark.parametrize(
    "path,policy",
    [
        ("configs/switch_xxl.yaml", None),
        ("configs/mixtral.yaml", "lru"),
        ("configs/gpt_oss_20b.yaml", None),
        ("configs/qwen3_30b_a3b.yaml", None),
        ("configs/mixtral.yaml", "fiddler"),
        ("configs/deepseek_v3.yaml", "ktransformers"),
    ],
)
def test_the_ideal_system_changes_nothing_bit_for_bit(path, policy):
    sets = [] if policy is None else [f"policy.name={policy}"]
    absent = simulate(_cfg(path, *sets))
    ideal = simulate(_cfg(path, *sets, "system=ideal"))
    assert _summary(absent) == _summary(ideal)
    assert _iterations(absent) == _iterations(ideal)
    assert absent.resolved["system"]["name"] == "ideal"  # config.resolved.yaml shows the system
    assert "system" not in _cfg(path, *sets).resolved  # ... but a config's id is as before systems existed


def test_layer_overhead_adds_exactly_its_count_on_the_critical_path():
    base = _cfg("configs/mixtral.yaml", "policy.name=gpu-only")
    slow = _cfg("configs/mixtral.yaml", "policy.name=gpu-only", "system.layer_overhead_us=250")
    r0, r1 = simulate(base), simulate(slow)
    layers = base.model.moe_layers
    for a, b in zip(r0.engine.iterations, r1.engine.iterations):
        assert (b.end_s - b.start_s) == pytest.approx(a.end_s - a.start_s + layers * 250e-6, rel=1e-9)


def test_expert_call_adds_exactly_its_count_when_every_expert_is_resident():
    r0 = simulate(_cfg("configs/mixtral.yaml", "policy.name=gpu-only"))
    r1 = simulate(_cfg("configs/mixtral.yaml", "policy.name=gpu-only", "system.expert_call_us=40"))
    calls = r1.summary["accesses"]
    assert r1.summary["sim_time_s"] == pytest.approx(r0.summary["sim_time_s"] + calls * 40e-6, rel=1e-9)


@SLOW
@given(
    path=st.sampled_from(["configs/mixtral.yaml", "configs/switch_xxl.yaml"]),
    policy=st.sampled_from(["lru", "on-demand", "diffmoe"]),
)
def test_a_serial_copy_stream_is_never_faster_and_never_overlaps(path, policy):
    # Under the oracle every prefetch is of an expert the layer uses. With a guessing predictor the copy counts need
    # not order: which wrong guesses are copied before they are dropped depends on timing (mixtral, diffmoe,
    # transition: 1,247 copies serial against 1,246 overlapped).
    over = simulate(_cfg(path, f"policy.name={policy}", "predictor.name=oracle"))
    serial = simulate(_cfg(path, f"policy.name={policy}", "predictor.name=oracle", "system.copy_stream=serial"))
    assert serial.summary["sim_time_s"] >= over.summary["sim_time_s"] * (1 - 1e-12)
    assert serial.summary["copies"] <= over.summary["copies"]
    e = serial.engine  # nothing overlaps: the compute stream's time and the link's add up to at most the total
    assert e.compute_busy_s + e.link_busy_s <= e.sim_time_s * (1 + 1e-9)


def test_write_back_adds_the_evicted_experts_to_the_link():
    r0 = simulate(_cfg("configs/mixtral.yaml", "policy.name=lru"))
    r1 = simulate(_cfg("configs/mixtral.yaml", "policy.name=lru", "system.writeback_evicted=true"))
    eb = _cfg("configs/mixtral.yaml").model.expert_bytes
    assert r1.summary["copies"] == r0.summary["copies"]
    evictions = r1.summary["evictions"]
    assert evictions > 0
    extra = r1.summary["pcie_bytes"] - r0.summary["pcie_bytes"]
    assert extra % eb == 0 and 0 < extra <= evictions * eb
    assert r1.engine.link_busy_s > r0.engine.link_busy_s
    assert r1.summary["sim_time_s"] >= r0.summary["sim_time_s"]


@SLOW
@given(fmt=st.sampled_from(["hqq-2bit", "hqq-3bit", "hqq-4bit", "gptq-4bit", "mxfp4", "q4_k_m", "q8_0", "int8"]))
def test_a_lower_bit_expert_format_cuts_pcie_bytes_in_proportion(fmt):
    base = _cfg("configs/mixtral.yaml", "policy.name=on-demand")
    cfg = _cfg("configs/mixtral.yaml", "policy.name=on-demand", f"system.expert_format={fmt}")
    r0, r1 = simulate(base), simulate(cfg)
    assert r1.summary["copies"] == r0.summary["copies"]
    ratio = r1.summary["pcie_bytes"] / r0.summary["pcie_bytes"]
    assert ratio == pytest.approx(FORMATS[fmt] / 16, rel=1e-6)
    assert cfg.model.expert_bits == FORMATS[fmt]
    assert "expert_bits" not in cfg.resolved["model"]  # the model as given; the system applies on loading


def test_host_bandwidth_half_doubles_a_memory_bound_host_expert():
    model, hw = load_model("deepseek-v3"), load_hardware("h200")
    ideal = CostModel(model, hw)
    half = CostModel(model, hw, SystemSpec(host_bw_fraction=0.5))
    ovh = hw.cpu_expert_overhead_s
    assert half.cpu_expert_s(1) - ovh == pytest.approx(2 * (ideal.cpu_expert_s(1) - ovh), rel=1e-12)
    r0 = simulate(_cfg("configs/deepseek_v3.yaml", "policy.name=ktransformers"))
    r1 = simulate(_cfg("configs/deepseek_v3.yaml", "policy.name=ktransformers", "system.host_bw_fraction=0.5"))
    n = r0.engine.cpu_experts
    assert n > 0 and r1.engine.cpu_experts == n
    assert r1.engine.cpu_busy_s - n * ovh == pytest.approx(2 * (r0.engine.cpu_busy_s - n * ovh), rel=1e-6)


def test_host_threads_and_call_cost():
    # a host whose CPU part states no per-thread bandwidth: threads take their share of bandwidth and compute
    model, hw = load_model("deepseek-v3"), load_hardware("gh200")
    ideal = CostModel(model, hw)
    sixteen = CostModel(model, hw, SystemSpec(host_threads=16, host_call_s=20e-6))
    assert sixteen.cpu_expert_s(4) == pytest.approx(
        ideal.cpu_expert_s(4, cores=16) - hw.cpu_expert_overhead_s + 20e-6, rel=1e-12
    )
    # one whose CPU part states it (h200's Xeon 8480C: core_bw_gb_s): 16 threads draw 16 x that, not 16/112 of all
    hw = load_hardware("h200")
    sixteen = CostModel(model, hw, SystemSpec(host_threads=16, host_call_s=20e-6))
    core_bw = cpu_part(hw.host.cpu).value("core_bw_gb_s") * 1e9
    assert 16 * core_bw < hw.cpu_mem_bw
    weights = model.expert_bytes + 2 * 4 * model.d_model * model.dtype_bytes
    assert sixteen.cpu_expert_s(4) == pytest.approx(20e-6 + weights / (16 * core_bw), rel=1e-12)


@given(frac=st.floats(0.05, 1.0))
def test_pageable_copies_run_at_their_fraction_of_the_bandwidth(frac):
    model, hw = load_model("mixtral-8x7b"), load_hardware("h200")
    eb = model.expert_bytes
    pinned = CostModel(model, hw).copy_s(eb)
    pageable = CostModel(model, hw, SystemSpec(pageable_copies=True, pageable_fraction=frac)).copy_s(eb)
    assert pageable - hw.pcie_latency_s == pytest.approx((pinned - hw.pcie_latency_s) / frac, rel=1e-9)
    half = CostModel(model, hw, SystemSpec(pageable_copies=True)).copy_s(eb)  # the default fraction: 0.5
    assert half - hw.pcie_latency_s == pytest.approx(2 * (pinned - hw.pcie_latency_s), rel=1e-12)


@given(us=st.floats(0.0, 1e4))
def test_copy_overhead_adds_to_every_copy(us):
    model, hw = load_model("mixtral-8x7b"), load_hardware("h200")
    eb = model.expert_bytes
    c = CostModel(model, hw, SystemSpec(copy_overhead_s=us / 1e6))
    assert c.copy_s(eb) == pytest.approx(CostModel(model, hw).copy_s(eb) + us / 1e6, rel=1e-12, abs=1e-15)


def test_dequant_roofline_and_table():
    model = dataclasses.replace(load_model("mixtral-8x7b"), expert_bits=FORMATS["hqq-2bit"])
    hw = load_hardware("h200")
    plain = CostModel(model, hw)
    roof = CostModel(model, hw, SystemSpec(dequant="roofline"))
    want = (model.expert_bytes + 2 * model.expert_params) / hw.hbm_bw
    assert roof.expert_s(1) == pytest.approx(plain.expert_s(1) + want, rel=1e-12)
    assert roof.expert_s(0) == 0.0
    table = load_system({"dequant": "table", "tables": {"dequant": [[0, 1e-4], [1e9, 2e-4]]}})
    assert CostModel(model, hw, table).dequant_s == pytest.approx(1e-4 + 1e-4 * model.expert_bytes / 1e9)
    bf16 = CostModel(load_model("mixtral-8x7b"), hw, SystemSpec(dequant="roofline"))
    assert bf16.dequant_s == 0.0  # nothing to de-quantize


def test_a_lower_bit_dense_format_reads_fewer_dense_bytes():
    model, hw = load_model("mixtral-8x7b"), load_hardware("h200")
    bf16 = CostModel(model, hw).dense_s("decoder", 1, 128)
    int4 = CostModel(model, hw, SystemSpec(dense_format="hqq-4bit")).dense_s("decoder", 1, 128)
    assert int4 < bf16
    with_dequant = CostModel(model, hw, SystemSpec(dense_format="hqq-4bit", dequant="roofline"))
    assert with_dequant.dense_s("decoder", 1, 128) > int4


def test_system_host_issue_costs_replace_the_hardwares_and_default_to_them():
    hw_set = simulate(_cfg("configs/mixtral.yaml", "policy.name=on-demand", "hardware.layer_roundtrip_us=30"))
    sys_set = simulate(_cfg("configs/mixtral.yaml", "policy.name=on-demand", "system.layer_roundtrip_us=30"))
    assert _summary(hw_set) == _summary(sys_set)
    both = simulate(
        _cfg(
            "configs/mixtral.yaml",
            "policy.name=on-demand",
            "hardware.layer_roundtrip_us=30",
            "system.layer_roundtrip_us=0",
        )
    )
    plain = simulate(_cfg("configs/mixtral.yaml", "policy.name=on-demand"))
    assert _summary(both) == _summary(plain)


def test_the_formats_carry_their_scales():
    assert FORMATS["mxfp4"] == 4.25 and FORMATS["q8_0"] == 8.5 and FORMATS["bf16"] == 16
    assert 3.0 < FORMATS["hqq-2bit"] < 3.1
    assert all(0 < b <= 32 for b in FORMATS.values())


def test_profiles_load_by_name_path_and_inline_with_base_and_bad_values_name_their_field(tmp_path):
    assert load_system("ideal") == dataclasses.replace(IDEAL, source="configs/systems/ideal.yaml")
    f = tmp_path / "mine.yaml"
    f.write_text("base: ideal\nlayer_overhead_us: 12\n")
    s = load_system(str(f))
    assert s.layer_overhead_s == pytest.approx(12e-6) and s.source == str(f)
    cfg = _cfg("configs/mixtral.yaml", f"system={f}")
    assert cfg.resolved["system"]["layer_overhead_us"] == pytest.approx(12)
    from sim.config.run_config import config_from_dict

    assert config_from_dict(cfg.resolved) == dataclasses.replace(cfg, source="inline")
    for key, value in [
        ("expert_format", "int9"),
        ("copy_stream", "parallel"),
        ("host_bw_fraction", 0),
        ("layer_overhead_us", -1),
        ("pageable_copies", "maybe"),
        ("dequant", "table"),
    ]:
        with pytest.raises(ConfigError) as exc:
            _cfg("configs/mixtral.yaml", f"system.{key}={value}")
        assert f"system.{key}" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        _cfg("configs/mixtral.yaml", "system.nonsense=1")
    assert "system" in str(exc.value)


def test_a_policy_that_weighs_host_against_copy_prices_both_with_the_runs_system():
    fast = simulate(_cfg("configs/mixtral.yaml", "policy.name=fiddler"))
    slow_host = simulate(_cfg("configs/mixtral.yaml", "policy.name=fiddler", "system.host_call_us=1000000"))
    assert fast.summary["cpu_experts"] > 0
    assert slow_host.summary["cpu_experts"] == 0  # a host call dearer than any copy: fiddler copies every miss


def test_a_dense_format_shrinks_the_dense_weights_in_gpu_memory():
    from sim.config.run_config import dense_bytes_of

    cfg = _cfg("configs/mixtral.yaml", "system.dense_format=hqq-4bit")
    m = cfg.model
    assert dense_bytes_of(m, cfg.system) == pytest.approx(m.dense_params * FORMATS["hqq-4bit"] / 8, abs=1)
    assert dense_bytes_of(m, IDEAL) == m.dense_bytes


@given(
    st.one_of(
        st.sampled_from(sorted(FORMATS)),
        st.text(max_size=12),
        st.builds(lambda n, fam: f"{fam}{n}", st.integers(0, 12), st.sampled_from(["int", "hqq-", "gptq-"])),
        st.builds(lambda x: f"{x:g}bpw", st.floats(0, 40, allow_nan=False)),
    )
)
@settings(max_examples=200, deadline=None)
def test_a_weight_format_is_a_known_width_or_refused_at_load(name):
    """Every name a system (or a published row) may give: a width of 1 to 32 bits, or one line naming the field."""
    from sim.config.system import format_bits

    bits = format_bits(name)
    if bits is None:
        with pytest.raises(ConfigError) as exc:
            load_system({"base": "ideal", "expert_format": name})
        assert "system.expert_format" in str(exc.value) and "\n" not in str(exc.value)
    else:
        assert 1 <= bits <= 32
        assert load_system({"base": "ideal", "expert_format": name}).expert_bits == bits


def test_a_systems_own_predictor_applies_when_the_run_config_names_none():
    """mixtral-offloading's speculative loading travels with its profile; a config's own predictor wins."""
    import yaml

    from sim.config.run_config import config_from_dict
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    d = yaml.safe_load((ROOT / "configs" / "mixtral.yaml").read_text())
    d.pop("predictor", None)
    d["system"] = {"base": "ideal", "predictor": {"name": "noisy", "params": {"recall": 0.5, "precision": 0.9}}}
    cfg = config_from_dict(copy.deepcopy(d), "t", POLICIES.names(), PREDICTORS.names())
    assert cfg.predictor.name == "noisy" and cfg.predictor.params["recall"] == 0.5
    assert config_from_dict(cfg.resolved, "t", POLICIES.names(), PREDICTORS.names()).predictor == cfg.predictor
    d["predictor"] = {"name": "none"}
    assert config_from_dict(copy.deepcopy(d), "t", POLICIES.names(), PREDICTORS.names()).predictor.name == "none"
    assert load_system("mixtral-offloading").predictor["name"] == "noisy"
    d.pop("predictor")
    d["system"]["predictor"] = {"name": "no-such-predictor"}
    with pytest.raises(ConfigError) as exc:
        config_from_dict(copy.deepcopy(d), "t", POLICIES.names(), PREDICTORS.names())
    assert "predictor" in str(exc.value)


@pytest.mark.parametrize("system", [None, "ideal", "mixtral-offloading"])
def test_a_resolved_config_loads_where_the_projects_configs_are_not(tmp_path, monkeypatch, system):
    """What a sweep ships to a Ray node: the resolved config (model, hardware and system expanded), without the
    project's configs/ folder beside it."""
    import moebase.profiles
    from sim.config.run_config import config_from_dict
    from sim.policies import POLICIES
    from sim.predictors import PREDICTORS

    cfg = _cfg("configs/mixtral.yaml", *([] if system is None else [f"system={system}"]))
    monkeypatch.setattr(moebase.profiles, "CONFIG_DIR", tmp_path / "no-configs")
    again = config_from_dict(copy.deepcopy(cfg.resolved), "node", POLICIES.names(), PREDICTORS.names())
    assert again.resolved == cfg.resolved
