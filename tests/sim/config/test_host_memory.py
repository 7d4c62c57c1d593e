"""The host's memory is checked like the GPU's (sim/config/host_memory.py): a machine that states its capacity must
hold the experts it keeps in host memory beside its reserve, else the config is refused naming
hardware.host.memory.capacity_gb; a machine that states none is not checked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.model import load_model
from sim.config.hardware import load_hardware
from sim.config.host_memory import FIELD, host_expert_layers, host_memory_check
from sim.config.memory import DoesNotFit
from sim.config.run_config import load_run_config
from sim.config.units import GB
from sim.policies import POLICIES
from tests.support.fuzz import fuzz_settings

QWEN = "configs/qwen3_235b_a22b_rtx4090.yaml"  # 235B, bf16 experts: ~454 GB of routed experts


def test_a_model_that_does_not_fit_the_hosts_memory_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as exc:
        load_run_config(QWEN, ["hardware.host.memory.capacity_gb=128"])
    msg = str(exc.value)
    assert msg.startswith(f"{FIELD}: 128 GB of host memory cannot hold the run")
    assert "454.2 GB" in msg and "128 experts x 94 MoE layers" in msg and "\n" not in msg


def test_a_host_misfit_is_a_does_not_fit_that_compare_keeps_as_a_row():
    """Like a GPU misfit, the host's is a DoesNotFit: its short form names the host's memory, and a compared
    variant that does not fit is a row saying so instead of a failed comparison."""
    from sim.compare import load_variant, misfit_row

    with pytest.raises(DoesNotFit) as exc:
        load_run_config(QWEN, ["hardware.host.memory.capacity_gb=128"])
    assert exc.value.memory == "host" and exc.value.gpu_bytes == 128 * GB
    assert exc.value.short() == "does not fit (462 GB > 128 GB of host memory)"
    cfg, misfit = load_variant(exc.value.config, "on-demand", None)
    assert cfg.policy.name == "on-demand" and misfit is not None and misfit.memory == "host"
    assert misfit_row("on-demand", "none", False, misfit)["status"] == misfit.short()


def test_it_fits_with_more_memory_a_smaller_format_or_fewer_host_layers():
    load_run_config(QWEN, ["hardware.host.memory.capacity_gb=192", "system=llama-cpp"])  # Q4_K_M experts: ~128 GB
    with pytest.raises(ConfigError, match=FIELD):
        load_run_config(QWEN, ["hardware.host.memory.capacity_gb=192"])
    cfg = load_run_config(QWEN, [])  # the profile states no capacity: not checked
    assert cfg.hardware.host.memory.capacity_gb is None


def test_a_machine_without_a_stated_capacity_or_without_a_host_part_is_not_checked():
    model = load_model("kimi-k2")
    for hw in (load_hardware("rtx4090"), load_hardware("gh200"), load_hardware("t4-16gb")):
        assert host_memory_check(model, hw, POLICIES.get("lru"), {}, False) is None


@fuzz_settings(60)
@given(
    capacity=st.floats(1, 4096),
    reserved=st.floats(0, 64),
    layers=st.integers(-1, 60),
    resident=st.booleans(),
)
def test_the_check_refuses_exactly_when_experts_and_reserve_exceed_the_capacity(capacity, reserved, layers, resident):
    model = load_model("deepseek-v3")
    hw = load_hardware(
        {
            "base": "rtx4090-1x6454s",
            "host": {"memory": {"capacity_gb": capacity, "reserved_gb": reserved}},
        }
    )
    policy, params = POLICIES.get("ktransformers"), {"cpu_layers": layers}
    held = host_expert_layers(model, policy, params, resident)
    assert held == (0 if resident else (min(layers, model.moe_layers) if layers >= 0 else model.moe_layers))
    need = held * model.num_experts * model.expert_bytes + round(reserved * GB)
    if need > capacity * GB:
        with pytest.raises(ConfigError, match=f"^{FIELD}: "):
            host_memory_check(model, hw, policy, params, resident)
    else:
        assert sum(host_memory_check(model, hw, policy, params, resident).values()) == need
