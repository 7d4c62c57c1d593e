"""Issue 32 item 4's run settings: fewer experts per token than the model's top-k (``system.experts_per_token``,
sim/core/experts_per_token.py) and a placement by layer ranges (``system.placement.experts_on_gpu_layers``,
llama.cpp's ``-ot``, sim/config/placement.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.config.placement import host_layers, parse_ranges, placement_from, ranges_text
from sim.config.run_config import config_from_dict
from sim.core.experts_per_token import keep_top_experts
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.run import simulate
from tests.support.engine import tiny_model
from tests.support.fuzz import fuzz_settings
from tests.support.paths import ROOT
from tests.support.traces import make_trace
from traces.io import save_trace

# ------------------------------------------------------------------------------------------ experts per token


@st.composite
def routings(draw):
    """A trace's experts [T, L, k] (distinct ids per token and layer, some rows -1 in part or whole) and weights."""
    t, layers, k, e = draw(st.integers(1, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 6)), 12
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    ids = np.argsort(rng.random((t, layers, e)), axis=2)[:, :, :k].astype(np.int16)
    drop = rng.random((t, layers, k)) < draw(st.sampled_from([0.0, 0.3]))
    ids[drop] = -1
    weights = None
    if draw(st.booleans()):
        w = rng.integers(0, 4, (t, layers, k)).astype(np.float16) / 4  # ties on purpose
        weights = np.where(ids < 0, np.float16(0), w).astype(np.float16)
    return ids, weights, e


@fuzz_settings(60)
@given(routing=routings(), n=st.integers(1, 8))
def test_experts_per_token_keeps_min_n_r_of_a_tokens_experts_and_never_adds_one(routing, n):
    ids, weights, e = routing
    trace = make_trace(ids, num_experts=e, weights=weights)
    out = keep_top_experts(trace, n)
    out.validate()
    assert out.top_k == min(n, trace.top_k)
    for tok in range(trace.num_tokens):
        for layer in range(trace.num_layers):
            before = [int(x) for x in trace.experts[tok, layer] if x >= 0]
            after = [int(x) for x in out.experts[tok, layer] if x >= 0]
            assert len(after) == min(n, len(before))
            assert set(after) <= set(before)
            if weights is None:  # the stored (router's) order: the first N routed ones
                assert after == before[: len(after)]
            else:  # no dropped expert outranks a kept one
                w = {int(x): float(v) for x, v in zip(trace.experts[tok, layer], weights[tok, layer]) if x >= 0}
                dropped = set(before) - set(after)
                assert all(w[d] <= min(w[a] for a in after) for d in dropped) if after else not before


def test_experts_per_token_at_or_above_top_k_is_the_trace_itself():
    trace = make_trace([[[0, 1]], [[2, 3]]], num_experts=4)
    assert keep_top_experts(trace, None) is trace and keep_top_experts(trace, 2) is trace
    assert keep_top_experts(trace, 5) is trace


def _tiny_run(tmp_path, trace, system: dict, policy="lru", cache=None):
    path = tmp_path / "t.npz"
    save_trace(trace, path)
    d = {
        "model": tiny_model(trace),
        "hardware": "h200",
        "system": system,
        "workload": {"trace": str(path), "batch_size": 1},
        "cache": cache if cache is not None else {"hpc_slots": 0, "mpc_slots": 2, "lpc_buffers": 4},
        "policy": policy,
        "predictor": "none",
    }
    return config_from_dict(d, "test", POLICY_NAMES, PREDICTOR_NAMES)


POLICY_NAMES, PREDICTOR_NAMES = POLICIES.names(), PREDICTORS.names()


def test_a_run_with_fewer_experts_per_token_computes_fewer_and_is_not_slower(tmp_path):
    rng = np.random.default_rng(1)
    ids = np.argsort(rng.random((40, 3, 8)), axis=2)[:, :, :4].astype(np.int16)
    trace = make_trace(ids, lengths=[20, 20], num_experts=8)
    full = simulate(_tiny_run(tmp_path, trace, {"base": "ideal"}, "on-demand", {"hpc_slots": 0, "mpc_slots": 0,
                                                                             "lpc_buffers": 8})).summary  # fmt: skip
    two = _tiny_run(tmp_path, trace, {"base": "ideal", "experts_per_token": 2}, "on-demand",
                    {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 8})  # fmt: skip
    assert two.system.experts_per_token == 2
    reduced = simulate(two).summary
    assert reduced["throughput_tok_s"] >= full["throughput_tok_s"]
    assert reduced["copies"] < full["copies"]
    with pytest.raises(ConfigError, match=r"^system\.experts_per_token: "):
        _tiny_run(tmp_path, trace, {"base": "ideal", "experts_per_token": 0})


# ------------------------------------------------------------------------------------------ layer ranges


@fuzz_settings(60)
@given(layers=st.sets(st.integers(0, 60), max_size=61), total=st.integers(61, 80))
def test_layer_ranges_round_trip_and_host_layers_are_the_rest(layers, total):
    if not layers:
        return
    text = ranges_text(layers)
    assert parse_ranges(text, "f") == tuple(sorted(layers))
    p = placement_from({"experts_on_gpu_layers": text}, "system.placement")
    assert p is not None and p.experts_on_gpu_layers == text
    assert set(host_layers(p, total)) == set(range(total)) - layers


def test_a_whole_number_is_one_layer():
    """``--set system.placement.experts_on_gpu_layers=3`` reads 3 as a number: it is layer 3, as "3" is."""
    assert placement_from({"experts_on_gpu_layers": 3}, "p").experts_on_gpu_layers == "3-3"
    assert placement_from({"experts_on_gpu_layers": "3"}, "p").experts_on_gpu_layers == "3-3"


@pytest.mark.parametrize(
    "bad, words",
    [
        ("9-0", "runs backwards"),
        ("0-9,5-7", "must increase"),
        ("0-3,3-4", "must increase"),
        ("x", "layer ranges"),
        ("", "layer ranges"),
        ("1--2", "layer ranges"),
        (-1, "layer ranges"),
        (True, "layer ranges"),
        (1.5, "layer ranges"),
    ],  # fmt: skip
)
def test_bad_ranges_are_refused_naming_the_field(bad, words):
    with pytest.raises(ConfigError) as exc:
        placement_from({"experts_on_gpu_layers": bad}, "system.placement")
    assert str(exc.value).startswith("system.placement.experts_on_gpu_layers: ") and words in str(exc.value)
    with pytest.raises(ConfigError, match=r"^system\.placement\.experts_on_gpu_layers: and n_cpu_moe \(2\)"):
        placement_from({"experts_on_gpu_layers": "0-1", "n_cpu_moe": 2}, "system.placement")


def test_a_placement_by_layer_ranges_puts_exactly_those_layers_experts_on_the_gpu(tmp_path):
    rng = np.random.default_rng(2)
    ids = np.argsort(rng.random((30, 5, 8)), axis=2)[:, :, :2].astype(np.int16)
    trace = make_trace(ids, lengths=[15, 15], num_experts=8)
    cfg = _tiny_run(tmp_path, trace, {"base": "llama-cpp", "expert_format": None, "dense_format": None,
                                      "placement": {"experts_on_gpu_layers": "0-0,3-4"}},
                    "ktransformers", {})  # fmt: skip
    assert cfg.policy.params["gpu_layers"] == "0-0,3-4" and cfg.cache.shared_slots == 8 * 3
    out = simulate(cfg, record_decisions=True)
    pinned = {layer: set(out.policy.cache.hpc[layer]) for layer in range(5)}
    assert pinned == {0: set(range(8)), 1: set(), 2: set(), 3: set(range(8)), 4: set(range(8))}
    with pytest.raises(ConfigError, match=r"^system\.placement\.experts_on_gpu_layers: names layer 5, but"):
        _tiny_run(tmp_path, trace, {"base": "llama-cpp", "placement": {"experts_on_gpu_layers": "3-5"}},
                  "ktransformers", {})  # fmt: skip


def test_ranges_naming_the_last_layers_run_exactly_as_n_cpu_moe():
    from sim.config.run_config import load_run_config

    cfg = "configs/qwen3_5_35b_a3b_llamacpp_rtx4090.yaml"
    small = ["workload.requests=2", "workload.max_decode_tokens=4"]
    a = load_run_config(cfg, ["system.placement.n_cpu_moe=30", *small])
    ranges = ["system.placement.n_cpu_moe=null", "system.placement.experts_on_gpu_layers=30-39"]
    b = load_run_config(cfg, [*ranges, *small])
    assert a.cache == b.cache
    sa, sb = simulate(a).summary, simulate(b).summary
    assert sa["throughput_tok_s"] == sb["throughput_tok_s"] and sa["cpu_experts"] == sb["cpu_experts"] > 0


# ------------------------------------------------------------------------------------------ expert deferral


def _host_run(tmp_path, trace, deferral: int, batch: int):
    """Every routed expert on the host (ktransformers, no GPU slots), with ``deferral``."""
    path = tmp_path / "d.npz"
    save_trace(trace, path)
    d = {
        "model": tiny_model(trace, d_model=1024, d_ff=2048),
        "hardware": "rtx4090",
        "system": {"base": "ideal", "deferral": deferral},
        "workload": {"trace": str(path), "batch_size": batch, "prefill": False},
        "cache": {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 1},
        "policy": "ktransformers",
        "predictor": "none",
    }
    return config_from_dict(d, "test", POLICY_NAMES, PREDICTOR_NAMES)


@fuzz_settings(15)
@given(seed=st.integers(0, 2**31), k=st.integers(2, 4), deferral=st.integers(1, 4), batch=st.sampled_from([1, 3]))
def test_deferral_never_makes_a_host_bound_run_slower(tmp_path_factory, seed, k, deferral, batch):
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((24, 4, 8)), axis=2)[:, :, :k].astype(np.int16)
    trace = make_trace(ids, lengths=[12, 12], num_experts=8)
    tmp = tmp_path_factory.mktemp("defer")
    base = simulate(_host_run(tmp, trace, 0, batch)).summary
    out = simulate(_host_run(tmp, trace, deferral, batch)).summary
    assert out["cpu_experts"] == base["cpu_experts"] > 0  # the same work on the host, only reordered
    assert out["throughput_tok_s"] >= base["throughput_tok_s"] * (1 - 1e-12)


def test_deferral_hides_host_work_behind_the_gpu_at_batch_one(tmp_path):
    rng = np.random.default_rng(3)
    ids = np.argsort(rng.random((24, 4, 8)), axis=2)[:, :, :4].astype(np.int16)
    trace = make_trace(ids, lengths=[12, 12], num_experts=8)
    base = simulate(_host_run(tmp_path, trace, 0, 1)).summary
    out = simulate(_host_run(tmp_path, trace, 2, 1)).summary
    assert out["throughput_tok_s"] > base["throughput_tok_s"]
    cfg = _host_run(tmp_path, trace, 2, 1)
    assert cfg.system.deferral == 2 and cfg.system.to_dict()["deferral"] == 2
    assert "deferral" not in _host_run(tmp_path, trace, 0, 1).system.to_dict()  # a profile without it hashes as before


# ------------------------------------------------------------------------------------------ bundled profiles

SYSTEM_FILES = sorted(p.stem for p in (ROOT / "configs" / "systems").glob("*.yaml"))


@pytest.mark.parametrize("name", SYSTEM_FILES)
def test_every_bundled_system_profile_loads_and_runs_on_a_tiny_model(tmp_path, name):
    rng = np.random.default_rng(4)
    ids = np.argsort(rng.random((12, 3, 8)), axis=2)[:, :, :2].astype(np.int16)
    trace = make_trace(ids, lengths=[6, 6], num_experts=8)
    path = tmp_path / "s.npz"
    save_trace(trace, path)
    d = {
        "model": tiny_model(trace),
        "hardware": "rtx4090-spr",  # a host with AMX, AVX-512 and AVX2: every kernel family runs there
        "system": name,
        "workload": {"trace": str(path), "batch_size": 1, "prefill": False},
        "cache": {"hpc_slots": 2, "mpc_slots": 0, "lpc_buffers": 1},
        "policy": "ktransformers",
        "predictor": "none",
    }
    cfg = config_from_dict(d, "test", POLICY_NAMES, PREDICTOR_NAMES)
    assert cfg.system.name == name or cfg.system.source.endswith(f"{name}.yaml")
    out = simulate(cfg).summary
    assert out["throughput_tok_s"] > 0 and out["decode_tokens"] == 12


# ------------------------------------------------------------------------------------------ switches


def test_switches_set_what_they_imply_and_load_back():
    from sim.config.host_kernels import load_family
    from sim.config.system import load_system

    on = load_system("ik-llama-cpp")
    assert (on.rtr, on.fmoe, on.host_kernel, on.host_call_s) == (True, True, "ik-llama-cpp", None)
    off = load_system({"base": "ik-llama-cpp", "rtr": False, "fmoe": False})
    assert off.host_kernel == "llama-cpp"  # row-major rows at mainline's rates
    assert off.host_call_s == pytest.approx(load_family("ik-llama-cpp").call_us * 5 / 2 / 1e6)
    assert load_system(off.to_dict()) == off  # applying a switch twice is applying it once
    own = load_system({"base": "ik-llama-cpp", "fmoe": False, "host_call_us": 7})
    assert own.host_call_s == pytest.approx(7e-6)  # a profile's own figure wins
    with pytest.raises(ConfigError, match=r"^system\.rtr: switches ik_llama\.cpp's repacked kernels"):
        load_system({"base": "ktransformers-v0.3", "rtr": True})


def test_an_unfused_moe_is_not_faster_than_a_fused_one(tmp_path):
    rng = np.random.default_rng(5)
    ids = np.argsort(rng.random((16, 4, 8)), axis=2)[:, :, :2].astype(np.int16)
    trace = make_trace(ids, lengths=[8, 8], num_experts=8)
    path = tmp_path / "f.npz"
    save_trace(trace, path)

    def run(fmoe: bool) -> float:
        d = {
            "model": tiny_model(trace),
            "hardware": "rtx4090",
            "system": {"base": "ik-llama-cpp", "fmoe": fmoe, "expert_format": None, "dense_format": None},
            "workload": {"trace": str(path), "batch_size": 1, "prefill": False},
            "cache": {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 1},
            "policy": "ktransformers",
            "predictor": "none",
        }
        return simulate(config_from_dict(d, "test", POLICY_NAMES, PREDICTOR_NAMES)).summary["throughput_tok_s"]

    assert run(False) < run(True)


def test_host_memory_counts_the_layers_ranges_leave_on_the_host():
    from moebase.model import load_model
    from sim.config.host_memory import host_expert_layers
    from sim.policies.ktransformers import KTransformers

    m = load_model("qwen3-30b-a3b")  # 48 MoE layers
    assert host_expert_layers(m, KTransformers, {"cpu_layers": -1, "gpu_layers": "0-33"}, False) == 14
    assert host_expert_layers(m, KTransformers, {"cpu_layers": -1, "gpu_layers": "0-9,20-29"}, False) == 28
    assert host_expert_layers(m, KTransformers, {"cpu_layers": 14, "gpu_layers": None}, False) == 14
