"""llama.cpp's placement as one field (`system.placement.n_cpu_moe`, sim/config/placement.py): the policy's
cpu_layers and the GPU layers' shared cache follow from it, exactly as the five hand-set keys gave them; whatever
disagrees is refused naming its key; the shipped editable config runs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.config.run_config import config_from_dict, load_run_config
from sim.config.system import load_system
from sim.run import simulate
from tests.support.fuzz import fuzz_settings

LLAMA = "configs/qwen3_5_35b_a3b_llamacpp_rtx4090.yaml"  # Qwen3.5-35B-A3B: 40 MoE layers of 256 experts
RTX = "configs/qwen3_30b_a3b_rtx4090.yaml"  # Qwen3-30B-A3B: 48 MoE layers of 128 experts, per-layer slots


def _by_hand(path: str, n: int, experts: int, layers: int, *sets: str) -> list[str]:
    """The overrides that modelled --n-cpu-moe N before the field: five keys and a hand-computed shared_slots."""
    return [
        "system=llama-cpp",
        "policy=ktransformers",
        f"policy.params.cpu_layers={n}",
        "cache={hpc_slots: 0, mpc_slots: 0, lpc_buffers: 1, organization: shared, "
        f"shared_slots: {experts * (layers - n)}}}",
        *sets,
    ]


@fuzz_settings(12)
@given(n=st.integers(8, 40))
def test_the_tiers_and_cpu_layers_follow_from_n_cpu_moe(n):
    cfg = load_run_config(LLAMA, [f"system.placement.n_cpu_moe={n}"])
    assert cfg.system.placement is not None and cfg.system.placement.n_cpu_moe == n
    assert cfg.policy.name == "ktransformers" and cfg.policy.params["cpu_layers"] == n
    c = cfg.cache
    assert (c.hpc_slots, c.mpc_slots, c.lpc_buffers, c.organization) == (0, 0, 1, "shared")
    assert c.shared_slots == 256 * (40 - n) == c.total_slots(40)
    again = config_from_dict(cfg.resolved)  # what config.resolved.yaml holds loads back to the same run
    assert (again.cache, again.policy, again.system) == (cfg.cache, cfg.policy, cfg.system)


@pytest.mark.parametrize("n", [20, 36])
def test_one_field_runs_exactly_what_the_five_keys_ran(n):
    one = load_run_config(RTX, ["system=llama-cpp", "policy=ktransformers", "cache=null",
                                f"system.placement.n_cpu_moe={n}", "workload.requests=16"])  # fmt: skip
    five = load_run_config(RTX, _by_hand(RTX, n, 128, 48, "workload.requests=16"))
    assert (one.cache, one.policy, one.model) == (five.cache, five.policy, five.model)
    a, b = simulate(one).summary, simulate(five).summary
    assert a["throughput_tok_s"] == b["throughput_tok_s"] and a["cpu_experts"] == b["cpu_experts"] > 0


def test_a_placement_on_a_config_with_cache_sizes_names_the_key_to_drop():
    sets = ["system=llama-cpp", "policy=ktransformers", "system.placement.n_cpu_moe=30"]
    with pytest.raises(ConfigError) as exc:
        load_run_config(RTX, sets)
    assert str(exc.value).startswith("cache.hpc_slots: is 4, but system.placement.n_cpu_moe (30) places 2304")
    assert "--set cache=null" in str(exc.value)
    for key, value in [("shared_slots", 100), ("organization", "per-layer"), ("gpu_memory_gb", 10)]:
        with pytest.raises(ConfigError, match=rf"^cache\.{key}: "):
            load_run_config(LLAMA, [f"cache.{key}={value}"])
    with pytest.raises(ConfigError, match=r"^policy\.params\.cpu_layers: is 3, but system\.placement\.n_cpu_moe is 20"):
        load_run_config(LLAMA, ["policy.params.cpu_layers=3"])
    load_run_config(LLAMA, ["policy.params.cpu_layers=20", "cache.shared_slots=5120", "cache.lpc_buffers=4"])


def test_a_cache_policy_is_refused_naming_the_placement_and_gpu_only_ignores_it():
    with pytest.raises(ConfigError) as exc:
        load_run_config(LLAMA, ["policy=lru"])
    msg = str(exc.value)
    assert msg.startswith("system.placement.n_cpu_moe: ") and "'lru'" in msg and "policy.name: ktransformers" in msg
    ceiling = load_run_config(LLAMA, ["policy=gpu-only"])  # every expert on the GPU: 19.5 GB at Q4_K_M fits
    assert ceiling.policy.name == "gpu-only" and "cpu_layers" not in ceiling.policy.params
    free = load_run_config(LLAMA, ["system.placement.n_cpu_moe=null", "policy=lru",
                                   "cache={hpc_slots: 0, mpc_slots: 32, lpc_buffers: 16}"])  # fmt: skip
    assert free.system.placement is None and free.cache.organization == "per-layer"


@pytest.mark.parametrize(
    "sets, field",
    [
        (["system.placement.n_cpu_moe=41"], "system.placement.n_cpu_moe"),
        (["system.placement.n_cpu_moe=-1"], "system.placement.n_cpu_moe"),
        (["system.placement.n_cpu_moe=two"], "system.placement.n_cpu_moe"),
        (["system.placement.ot=blk.1"], "system.placement.ot"),
        (["system.placement=[1]"], "system.placement"),
    ],
)
def test_a_bad_placement_is_one_line_naming_its_key(sets, field):
    with pytest.raises(ConfigError) as exc:
        load_run_config(LLAMA, sets)
    assert str(exc.value).startswith(f"{field}: ") and "\n" not in str(exc.value)


def test_too_few_host_layers_are_refused_by_the_memory_check():
    load_run_config(LLAMA, ["system.placement.n_cpu_moe=0"])  # batch 1: every expert fits beside the rest
    with pytest.raises(ConfigError, match=r"^cache: .*shared_slots 10240"):
        load_run_config(LLAMA, ["system.placement.n_cpu_moe=0", "workload.batch_size=64"])
    load_run_config(LLAMA, ["system.placement.n_cpu_moe=10", "workload.batch_size=64"])


def test_a_profile_without_placement_reads_as_before():
    for name in ("ideal", "llama-cpp", "ktransformers"):
        assert "placement" not in load_system(name).to_dict()  # a config's id (its hash) is unchanged
    placed = load_system({"base": "llama-cpp", "placement": {"n_cpu_moe": 4}})
    assert placed.to_dict()["placement"] == {"n_cpu_moe": 4} and placed.name == "llama-cpp"


def test_the_room_error_of_cpu_layers_names_the_field_that_sizes_it():
    with pytest.raises(ConfigError) as exc:
        load_run_config(RTX, ["system=llama-cpp", "policy=ktransformers", "policy.params.cpu_layers=30"])
    msg = str(exc.value)
    assert msg.startswith("policy.params.cpu_layers: 30 leaves 2304 experts on the GPU")
    assert "system.placement.n_cpu_moe: 30" in msg and "cache.shared_slots: 2304" in msg
