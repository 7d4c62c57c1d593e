"""ktransformers' ``cpu_layers`` (llama.cpp's --n-cpu-moe) counts MoE layers: a value above the model's is refused
when the config loads, naming the field and the model's count, and by the policy itself for any context."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.model import load_model
from sim.config.params import MAX_EXPERTS, RunFacts
from sim.config.run_config import load_run_config
from sim.policies.base import PolicyContext
from sim.policies.ktransformers import KTransformers
from tests.support.paths import ROOT

MODELS = sorted(p.stem for p in (ROOT / "configs" / "models").glob("*.yaml"))


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(MODELS), data=st.data())
def test_cpu_layers_above_the_models_moe_layers_is_refused_naming_its_count(model, data):
    """For every model profile: cpu_layers in [-1, its MoE layers] passes the run's check, anything above (up to
    the param's own bound) is refused on one line naming the field and the model's count."""
    spec = load_model(model)
    facts = RunFacts(model=spec, trace_path=Path("unused"), trace=None)
    ok = data.draw(st.integers(-1, spec.moe_layers))
    KTransformers.check_for_run(KTransformers.check_params({"cpu_layers": ok}), "policy.params", facts)
    over = data.draw(st.integers(spec.moe_layers + 1, MAX_EXPERTS))
    with pytest.raises(ConfigError) as exc:
        KTransformers.check_for_run(KTransformers.check_params({"cpu_layers": over}), "policy.params", facts)
    msg = str(exc.value)
    assert (
        msg.startswith("policy.params.cpu_layers:") and f"the {spec.moe_layers} MoE layers" in msg and "\n" not in msg
    )


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(1, 8), experts=st.integers(1, 8), data=st.data())
def test_the_policy_refuses_more_cpu_layers_than_its_context_has(layers, experts, data):
    """Built directly (the validator's executor does), the policy refuses cpu_layers above its layers too; at most
    them, the first cpu_layers layers hold nothing on the GPU and the others all their experts."""
    ctx = PolicyContext(
        num_layers=layers,
        num_experts=experts,
        layer_roles=("decoder",) * layers,
        cached_layers=frozenset(range(layers)),
        hpc_slots=0,
        mpc_slots=0,
        hot_ranking=tuple(tuple(range(experts)) for _ in range(layers)),
        organization="shared",
        shared_slots=layers * experts,
    )
    n = data.draw(st.integers(0, layers))
    pol = KTransformers({"cpu_layers": n}, ctx)
    assert [len(pol.cache.hpc[layer]) for layer in range(layers)] == [0] * n + [experts] * (layers - n)
    with pytest.raises(ConfigError, match=rf"cpu_layers: is \d+, more than the {layers} MoE layers"):
        KTransformers({"cpu_layers": data.draw(st.integers(layers + 1, MAX_EXPERTS))}, ctx)


def test_a_run_config_with_too_many_cpu_layers_is_refused_at_load():
    sets = ["policy.name=ktransformers", "cache.organization=shared", "cache.shared_slots=256"]
    with pytest.raises(ConfigError, match=r"policy.params.cpu_layers: is 59, more than the 58 MoE layers"):
        load_run_config("configs/deepseek_v3.yaml", [*sets, "policy.params.cpu_layers=59"])
    cfg = load_run_config("configs/deepseek_v3.yaml", [*sets, "policy.params.cpu_layers=57"])
    assert cfg.policy.params["cpu_layers"] == 57
