"""Run configs, model and hardware profiles: every bad input is a ConfigError whose message starts with the field."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from moebase.errors import ConfigError, InputError
from moebase.model import load_model
from moebase.profiles import available
from sim.config.hardware import load_hardware
from sim.config.run_config import apply_override, config_from_dict, load_run_config, read_trace_summary
from sim.policies import POLICIES as POLICY_CLASSES
from sim.predictors import PREDICTORS as PREDICTORS_REGISTRY
from tests.support.paths import ROOT

SWITCH = ROOT / "configs" / "switch_xxl.yaml"
MIXTRAL = ROOT / "configs" / "mixtral.yaml"
#: Short fixed name lists (not the registry's), so that the "known: ..." part of an unknown-name error is known here.
POLICIES = ["diffmoe", "gpu-only", "lru", "on-demand"]
PREDICTORS = ["noisy", "none", "oracle", "transition"]


def base(path: Path = SWITCH) -> dict:
    return yaml.safe_load(path.read_text())


def build(sets=(), path: Path = SWITCH, **names):
    d = base(path)
    for s in sets:
        apply_override(d, s)
    return config_from_dict(d, **names)


def field_error(exc: pytest.ExceptionInfo, field: str) -> None:
    msg = str(exc.value)
    assert msg.startswith(field + ":"), f"{msg!r} does not start with {field!r}"
    assert "\n" not in msg
    assert isinstance(exc.value, InputError)


# ------------------------------------------------------------------------------------------ bad values
BAD = [
    # workload
    (["workload.batch_size=0"], "workload.batch_size"),
    (["workload.batch_size='16'"], "workload.batch_size"),
    (["workload.batch_size=true"], "workload.batch_size"),
    (["workload.batch_size=1.5"], "workload.batch_size"),
    (["workload.batching=dynamic"], "workload.batching"),
    (["workload.max_decode_tokens=-1"], "workload.max_decode_tokens"),
    (["workload.prefill=yes please"], "workload.prefill"),
    (["workload.requests=0"], "workload.requests"),
    (["workload.trace=no/such/trace.npz"], "workload.trace"),
    (["workload.trace=5"], "workload.trace"),
    (["workload.trace=null"], "workload.trace"),
    (["workload.trace=configs/switch_xxl.yaml"], "workload.trace"),  # not a trace file
    (["workload.trace=traces/data/mixtral_8x7b.npz"], "workload.trace"),  # another model's trace
    (["workload=3"], "workload"),
    # cache
    (["cache.hpc_slots=-1"], "cache.hpc_slots"),
    (["cache.mpc_slots=1.5"], "cache.mpc_slots"),
    (["cache.lpc_buffers=0"], "cache.lpc_buffers"),
    (["cache.prefetch_reserve=16"], "cache.prefetch_reserve"),
    (["cache.prefetch_reserve=-1"], "cache.prefetch_reserve"),
    (["cache.layers=some"], "cache.layers"),
    (["cache.hpc_slots=100", "cache.mpc_slots=100"], "cache.mpc_slots"),  # more than the layer's 128 experts
    (["cache.gpu_memory_gb=60"], "cache"),  # sizes given both ways
    (["cache.hpc_slots=null"], "cache.hpc_slots"),  # slot form incomplete
    (["cache.hpc_slots=null", "cache.mpc_slots=null", "cache.lpc_buffers=null"], "cache"),  # neither form
    (
        [
            "cache.hpc_slots=null",
            "cache.mpc_slots=null",
            "cache.lpc_buffers=null",
            "cache.split={hpc: 0.3, mpc: 0.5, lpc: 0.2}",
        ],
        "cache.gpu_memory_gb",
    ),
    (
        ["cache.hpc_slots=null", "cache.mpc_slots=null", "cache.lpc_buffers=null", "cache.gpu_memory_gb=60"],
        "cache.split",
    ),
    (
        [
            "cache.hpc_slots=null",
            "cache.mpc_slots=null",
            "cache.lpc_buffers=null",
            "cache.gpu_memory_gb=60",
            "cache.split={hpc: 0.6, mpc: 0.5, lpc: 0.2}",
        ],
        "cache.split",
    ),
    (
        [
            "cache.hpc_slots=null",
            "cache.mpc_slots=null",
            "cache.lpc_buffers=null",
            "cache.gpu_memory_gb=60",
            "cache.split={hpc: -0.1, mpc: 0.5, lpc: 0.2}",
        ],
        "cache.split.hpc",
    ),
    (
        [
            "cache.hpc_slots=null",
            "cache.mpc_slots=null",
            "cache.lpc_buffers=null",
            "cache.gpu_memory_gb=60",
            "cache.split={hpc: 0.5, mpc: 0.5}",
        ],
        "cache.split.lpc",
    ),
    (
        [
            "cache.hpc_slots=null",
            "cache.mpc_slots=null",
            "cache.lpc_buffers=null",
            "cache.gpu_memory_gb=60",
            "cache.split={hpc: 0.5, mpc: 0.5, lpc: 0.0}",
        ],
        "cache.split.lpc",
    ),  # no working buffer
    (
        [
            "cache.hpc_slots=null",
            "cache.mpc_slots=null",
            "cache.lpc_buffers=null",
            "cache.gpu_memory_gb=0",
            "cache.split={hpc: 0.5, mpc: 0.3, lpc: 0.2}",
        ],
        "cache.gpu_memory_gb",
    ),
    (["cache.hot_profile=7"], "cache.hot_profile"),
    (["cache.hot_profile=no/such.npz"], "cache.hot_profile"),
    (["cache.hpc_slots=12", "cache.mpc_slots=30"], "cache"),  # the memory check
    # policy, predictor, seed
    (["policy=null"], "policy"),
    (["policy.name=5"], "policy.name"),
    (["policy.name=''"], "policy.name"),
    (["policy.params=[1, 2]"], "policy.params"),
    (["seed=-1"], "seed"),
    (["seed=x"], "seed"),
    # model
    (["model=no-such-model"], "model"),
    (["model=7"], "model"),
    (["model=no/such/model.yaml"], "model"),
    (["model.d_model=0"], "model.d_model"),
    (["model.top_k=129"], "model.top_k"),
    (["model.expert_matrices=4"], "model.expert_matrices"),
    (["model.dtype_bytes=3"], "model.dtype_bytes"),
    (["model.n_kv_heads=65"], "model.n_kv_heads"),
    (["model.decoder_moe_layers=25"], "model.decoder_moe_layers"),
    (["model.dense_d_ff=0"], "model.dense_d_ff"),
    (["model.name=null"], "model.name"),
    (["model={name: m, d_model: 8}"], "model.d_ff"),  # missing fields
    (["model.base=no-such-model"], "model.base"),
    (["model.num_experts=64"], "workload.trace"),  # no longer the trace's model
    # hardware
    (["hardware=no-such-gpu"], "hardware"),
    (["hardware.pcie_bw_gb_s=0"], "hardware.pcie_bw_gb_s"),
    (["hardware.pcie_bw_gb_s=fast"], "hardware.pcie_bw_gb_s"),
    (["hardware.hbm_bw_gb_s=-1"], "hardware.hbm_bw_gb_s"),
    (["hardware.pcie_latency_us=-1"], "hardware.pcie_latency_us"),
    (["hardware.gpu_memory_gb=.nan"], "hardware.gpu_memory_gb"),
    (["hardware.reserved_gb=200"], "hardware.reserved_gb"),
    (["hardware.tables={copy: [[1, 2]]}"], "hardware.tables.copy"),
    (["hardware.tables={copy: [[1, 2], [1, 3]]}"], "hardware.tables.copy"),
    (["hardware.tables={copy: [[1, 2], [2, -3]]}"], "hardware.tables.copy[1]"),
    (["hardware.tables={copy: 5}"], "hardware.tables.copy"),
    (["hardware.tables={expert: [[1, 1.0e-5], [8, 2.0e-5]]}"], "hardware.tables.model"),
    (["hardware.tables={model: mixtral-8x7b, expert: [[1, 1.0e-5], [8, 2.0e-5]]}"], "hardware.tables.model"),
    (
        ["hardware.tables={model: switch-xxl-128, dense: [[1, 64, 1.0e-4], [8, 64, 2.0e-4], [1, 128, 2.0e-4]]}"],
        "hardware.tables.dense",
    ),
    (["hardware.tables={model: switch-xxl-128, bogus: 1}"], "hardware.tables.bogus"),
]


@pytest.mark.parametrize("sets,field", BAD, ids=[" ".join(s)[:70] for s, _ in BAD])
def test_bad_value_names_its_field(sets, field):
    with pytest.raises(ConfigError) as exc:
        build(sets)
    field_error(exc, field)


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d.update(engine={}), "engine"),
        (lambda d: d["workload"].update(foo=1), "workload.foo"),
        (lambda d: d["cache"].update(slots=1), "cache.slots"),
        (lambda d: d["policy"].update(kind="x"), "policy.kind"),
        (lambda d: d["predictor"].update(name=None), "predictor.name"),
        (lambda d: d.update(model={"base": "switch-xxl-128", "experts": 3}), "model.experts"),
        (lambda d: d.update(hardware={"base": "h200", "pcie_gb_s": 3}), "hardware.pcie_gb_s"),
        (lambda d: d.pop("workload"), "workload"),
        (lambda d: d.pop("policy"), "policy"),
        (lambda d: d.pop("model"), "model"),
        (lambda d: d["workload"].pop("trace"), "workload.trace"),
        (lambda d: d.update(cache=None), "cache"),
    ],
)
def test_unknown_and_missing_keys(mutate, field):
    d = base()
    mutate(d)
    with pytest.raises(ConfigError) as exc:
        config_from_dict(d)
    field_error(exc, field)


def test_unknown_policy_and_predictor_names_list_the_known_ones():
    with pytest.raises(ConfigError) as exc:
        build(["policy.name=belady2"], policy_names=POLICIES)
    field_error(exc, "policy.name")
    assert "unknown policy 'belady2'" in str(exc.value) and "diffmoe, gpu-only, lru, on-demand" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        build(["predictor=crystal-ball"], predictor_names=PREDICTORS)
    field_error(exc, "predictor.name")
    assert "known: noisy, none, oracle, transition" in str(exc.value)
    cfg = build(policy_names=POLICIES, predictor_names=PREDICTORS)
    assert (cfg.policy.name, cfg.predictor.name) == ("diffmoe", "oracle")


def test_unknown_model_name_lists_the_profiles():
    with pytest.raises(ConfigError) as exc:
        load_model("switch-xxxl")
    msg, n = str(exc.value), len(available("models"))
    assert "switch-xxl-128" in msg and ("mixtral-8x7b" in msg or f"{n} in all: see configs/models/" in msg)
    with pytest.raises(ConfigError) as exc:
        load_hardware("h300")
    msg = str(exc.value)
    n = len(list((ROOT / "configs" / "hardware").glob("*.yaml")))
    assert "h200" in msg and len(msg) <= 400  # the closest names, and the list bounded however many profiles exist
    assert "a100-pcie, gh200, h100-pcie, h200" in msg or f"{n} in all: see configs/hardware/" in msg


# ------------------------------------------------------------------------------------------ overrides
def test_overrides_set_fields():
    cfg = build(
        [
            "workload.batch_size=32",
            "workload.batching=continuous",
            "workload.max_decode_tokens=null",
            "cache.layers=all",
            "seed=7",
            "policy.params.threshold=1.5",
            "policy.params.fill=expert0",
            "predictor=none",
            "cache.prefetch_reserve=0",
        ]
    )
    assert cfg.workload.batch_size == 32 and cfg.workload.batching == "continuous"
    assert cfg.workload.max_decode_tokens is None and cfg.cache.layers == "all" and cfg.seed == 7
    assert cfg.policy.params == {**POLICY_CLASSES.get("diffmoe").PARAMS, "threshold": 1.5, "fill": "expert0"}
    assert cfg.resolved["policy"]["params"] == cfg.policy.params  # every param, defaults filled
    assert cfg.predictor.name == "none" and cfg.predictor.params == {} and cfg.cache.prefetch_reserve == 0


def test_override_of_a_named_profile_field_keeps_the_profile():
    cfg = build(["model.dtype_bytes=4", "hardware.pcie_bw_gb_s=25", "cache.lpc_buffers=4"])
    assert cfg.model.name == "switch-xxl-128" and cfg.model.dtype_bytes == 4
    assert cfg.model.expert_bytes == 2 * load_model("switch-xxl-128").expert_bytes
    assert cfg.hardware.name == "h200" and cfg.hardware.pcie_bw == 25e9
    assert cfg.hardware.hbm_bw == load_hardware("h200").hbm_bw
    assert cfg.hardware.source.startswith("configs/hardware/h200.yaml")


def test_split_sizes_become_slots():
    cfg = build(
        [
            "cache.hpc_slots=null",
            "cache.mpc_slots=null",
            "cache.lpc_buffers=null",
            "cache.gpu_memory_gb=60",
            "cache.split={hpc: 0.3, mpc: 0.5, lpc: 0.2}",
        ]
    )
    eb = load_model("switch-xxl-128").expert_bytes
    assert cfg.cache.hpc_slots == int(18e9 // (eb * 12)) == 5
    assert cfg.cache.mpc_slots == int(30e9 // (eb * 12)) == 9
    assert cfg.cache.lpc_buffers == int(12e9 // eb) == 47
    assert cfg.resolved["cache"]["hpc_slots"] == 5 and "split" not in cfg.resolved["cache"]


@pytest.mark.parametrize(
    "text,field",
    [
        ("workload.nope=1", "workload.nope"),
        ("nope=1", "nope"),
        ("cache.split.x=1", "cache.split.x"),
        ("seed.x=1", "seed.x"),
        ("model.colour=red", "model.colour"),
        ("hardware.tables.foo=1", "hardware.tables.foo"),
        ("workload.batch_size", "--set"),
        ("=3", "--set"),
        ("workload..batch_size=3", "--set"),
        ("workload.batch_size=[1", "workload.batch_size"),
    ],
)
def test_bad_overrides_are_rejected(text, field):
    with pytest.raises(ConfigError) as exc:
        apply_override(base(), text)
    field_error(exc, field)


def test_load_run_config_applies_overrides_in_order(tmp_path):
    cfg = load_run_config(SWITCH, ["workload.batch_size=8", "workload.batch_size=4"])
    assert cfg.workload.batch_size == 4 and cfg.source == str(SWITCH)
    with pytest.raises(ConfigError) as exc:
        load_run_config(SWITCH, ["workload.batch_size=0"])
    field_error(exc, "workload.batch_size")


def test_config_file_problems_name_the_file(tmp_path):
    missing = tmp_path / "none.yaml"
    with pytest.raises(ConfigError) as exc:
        load_run_config(missing)
    field_error(exc, str(missing))
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError) as exc:
        load_run_config(bad)
    field_error(exc, str(bad))
    assert "line" in str(exc.value)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError) as exc:
        load_run_config(scalar)
    field_error(exc, str(scalar))


# ------------------------------------------------------------------------------------------ shipped configs
@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_run_configs_load(path):
    cfg = load_run_config(path, policy_names=POLICY_CLASSES.names(), predictor_names=PREDICTORS_REGISTRY.names())
    json.dumps(cfg.resolved)  # plain data
    assert yaml.safe_load(yaml.safe_dump(cfg.resolved)) == cfg.resolved
    again = config_from_dict(cfg.resolved)  # resolved loads back to the same config
    assert (again.model, again.hardware, again.workload, again.cache, again.policy, again.predictor, again.seed) == (
        cfg.model,
        cfg.hardware,
        cfg.workload,
        cfg.cache,
        cfg.policy,
        cfg.predictor,
        cfg.seed,
    )
    assert again.resolved == cfg.resolved


def test_shipped_configs_load_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_run_config("configs/switch_xxl.yaml")
    assert cfg.workload.trace == ROOT / "traces" / "data" / "switch_xxl_128.npz"
    assert cfg.model.name == "switch-xxl-128" and cfg.hardware.name == "h200"


def test_switch_xxl_example_values():
    cfg = build()
    cache = cfg.cache
    assert (cache.hpc_slots, cache.mpc_slots, cache.lpc_buffers, cache.prefetch_reserve) == (4, 9, 16, 1)
    assert cfg.cache.layers == "decoder" and cfg.cache.hot_profile == "trace"
    assert cfg.workload.batch_size == 16 and cfg.workload.max_decode_tokens == 128 and cfg.workload.prefill is True


def test_defaults_fill_in():
    d = {
        "model": "mixtral-8x7b",
        "hardware": "h200",
        "workload": {"trace": "traces/data/mixtral_8x7b.npz"},
        "cache": {"hpc_slots": 0, "mpc_slots": 2, "lpc_buffers": 1},
        "policy": "lru",
    }
    cfg = config_from_dict(d)
    assert cfg.workload.batch_size == 1 and cfg.workload.batching == "static" and cfg.workload.prefill is True
    assert cfg.workload.max_decode_tokens is None and cfg.workload.requests is None
    assert cfg.cache.prefetch_reserve == 0 and cfg.cache.layers == "all"
    assert cfg.policy.params == {"pin_hot": False} and cfg.predictor.name == "none" and cfg.seed == 0
    assert cfg.source == "inline"


# ------------------------------------------------------------------------------------------ memory check
def test_memory_check_fires_for_too_large_tiers():
    with pytest.raises(ConfigError) as exc:
        build(["cache.hpc_slots=10", "cache.mpc_slots=40"])
    msg = str(exc.value)
    field_error(exc, "cache")
    assert "tiers need" in msg and "dense weights" in msg and "KV cache" in msg
    assert msg.endswith("hardware.gpu_memory_gb is 141")


def test_memory_check_counts_kv_cache():
    sets = ["cache.hpc_slots=4", "cache.mpc_slots=20"]
    build(sets + ["workload.batch_size=1"])  # fits
    with pytest.raises(ConfigError) as exc:  # the KV cache of 4096 requests does not
        build(sets + ["workload.batch_size=4096"])
    field_error(exc, "cache")


def test_memory_check_counts_every_expert_for_gpu_only():
    """gpu-only needs no tier sizes, but every expert: Switch-XXL's 773 GB do not fit an H200, Mixtral's do
    (tests/sim/config/test_memory_fit.py has the rest)."""
    with pytest.raises(ConfigError) as exc:
        build(["cache.hpc_slots=10", "cache.mpc_slots=40", "policy.name=gpu-only"])
    field_error(exc, "policy.name")
    assert "the experts need 773 GB (128 experts x 24 MoE layers" in str(exc.value)
    d = base(MIXTRAL)
    del d["cache"]
    d["policy"] = {"name": "gpu-only"}
    cfg = config_from_dict(d)  # no tier sizes needed
    assert (cfg.cache.hpc_slots, cfg.cache.mpc_slots, cfg.cache.lpc_buffers) == (0, 0, 1)


def test_memory_check_uses_the_hardware():
    build(["hardware=a100-pcie", "cache.hpc_slots=2", "cache.mpc_slots=4"])
    with pytest.raises(ConfigError) as exc:
        build(["hardware=a100-pcie", "cache.mpc_slots=16"])  # 20 slots x 12 layers = 60 GB + 16 GB dense ...
    assert str(exc.value).endswith("hardware.gpu_memory_gb is 80")


# ------------------------------------------------------------------------------------------ traces
def test_model_trace_mismatch():
    with pytest.raises(ConfigError) as exc:
        build(["workload.trace=traces/data/mixtral_8x7b.npz"])
    field_error(exc, "workload.trace")
    msg = str(exc.value)
    assert "trace model 'mixtral-8x7b' (8 experts, top-2, 0 encoder + 32 decoder MoE layers)" in msg
    assert "does not match model 'switch-xxl-128' (128 experts, top-1, 12 encoder + 12 decoder MoE layers)" in msg


def test_trace_with_a_broken_file(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ConfigError) as exc:
        build([f"workload.trace={bad}"])
    field_error(exc, "workload.trace")
    assert str(bad) in str(exc.value)
    partial = tmp_path / "partial.npz"
    with zipfile.ZipFile(partial, "w") as zf:
        zf.writestr("meta.json", "{}")
    with pytest.raises(ConfigError) as exc:
        build([f"workload.trace={partial}"])
    field_error(exc, "workload.trace")


def test_trace_summary_matches_the_trace():
    from traces.io import load_trace

    path = ROOT / "traces" / "data" / "switch_xxl_128.npz"
    s, t = read_trace_summary(path), load_trace(path)
    assert s.num_requests == t.num_requests
    assert (s.prefill_lengths == t.prefill_lengths).all()
    assert (s.decode_lengths == t.request_lengths - t.prefill_lengths).all()
    assert s.layer_counts() == (12, 12)
    assert s.max_request_tokens(None) == int(t.request_lengths.max())
    decode = (t.request_lengths - t.prefill_lengths).clip(max=8)
    assert s.max_request_tokens(8) == int((t.prefill_lengths + decode).max())


# ------------------------------------------------------------------------------------------ profiles
DOCUMENTED_BYTES_PER_EXPERT = {  # docs/architecture.md 5.2, bf16
    "switch-xxl-128": 251.7e6,
    "switch-large-128": 16.8e6,
    "switch-base-128": 9.4e6,
    "mixtral-8x7b": 352e6,
    "qwen1.5-moe-a2.7b": 17.3e6,
    "deepseek-v2-lite": 17.3e6,
    "olmoe-1b-7b": 12.6e6,
}
# beyond those (tests/moebase/test_model_profiles.py has details); gpt-oss-20b: MXFP4 experts
ADDED_BYTES_PER_EXPERT = {
    "switch-base-64": 9.4e6,
    "switch-base-8": 9.4e6,
    "gpt-oss-20b": 13.2e6,
    # today's models (configs/models/*.yaml hold their sources)
    "deepseek-v3": 44.0e6,
    "kimi-k2": 44.0e6,
    "qwen3-30b-a3b": 9.4e6,
    "qwen3-235b-a22b": 37.7e6,
    "gpt-oss-120b": 13.2e6,
    # Qwen3.5-35B-A3B: 3 matrices x 2048 x 512 at bf16
    "qwen3.5-35b-a3b": 6.3e6,
    # derived from the configs in configs/models/sources/ (3 matrices at bf16; MiniMax-M2.1's FP8 experts at 8 bits)
    "deepseek-v2": 47.2e6,
    "deepseek-v2.5": 47.2e6,
    "deepseek-coder-v2-lite": 17.3e6,
    "qwen2-57b-a14b": 55.1e6,
    "minimax-m2.1": 14.2e6,
    "qwen3-coder-next": 6.3e6,
    "glm-4.5-air": 34.6e6,
}
BYTES_PER_EXPERT = {**DOCUMENTED_BYTES_PER_EXPERT, **ADDED_BYTES_PER_EXPERT}


@pytest.mark.parametrize("name", sorted(BYTES_PER_EXPERT))
def test_model_profiles_match_design(name):
    m = load_model(name)
    assert m.name == name
    assert m.expert_bytes == pytest.approx(BYTES_PER_EXPERT[name], rel=0.01)
    assert m.dense_bytes > 0 and m.kv_bytes_per_token > 0
    assert m.dense_bytes < m.moe_layers * m.num_experts * m.expert_bytes  # experts dominate an MoE model


def test_every_profile_is_shipped():
    assert set(available("models")) == set(BYTES_PER_EXPERT)
    assert set(available("hardware")) >= {"h200", "a100-pcie", "gh200"}


def test_model_shapes():
    xxl = load_model("switch-xxl-128")
    assert (xxl.encoder_moe_layers, xxl.decoder_moe_layers, xxl.moe_layers) == (12, 12, 24)
    assert xxl.total_params == pytest.approx(395e9, rel=0.02)  # Fedus et al., Switch Transformers (JMLR 2022): 395 B
    assert xxl.attention_params("decoder") == 2 * xxl.attention_params("encoder") == 2 * 4 * 4096 * 4096
    assert xxl.expert_flops_per_token == 2 * 3 * 4096 * 10240
    mix = load_model("mixtral-8x7b")
    assert mix.total_params == pytest.approx(46.7e9, rel=0.01)
    assert mix.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    assert mix.attention_params_per_block == 2 * 4096 * 4096 + 2 * 4096 * 1024
    assert load_model("qwen1.5-moe-a2.7b").total_params == pytest.approx(14.3e9, rel=0.02)
    assert load_model("olmoe-1b-7b").total_params == pytest.approx(6.9e9, rel=0.02)
    assert load_model("deepseek-v2-lite").total_params == pytest.approx(15.7e9, rel=0.02)
    assert load_model("switch-base-128").total_params == pytest.approx(7.4e9, rel=0.05)
    assert load_model("switch-large-128").total_params == pytest.approx(26.3e9, rel=0.05)


def test_hardware_units():
    h = load_hardware("h200")
    assert h.gpu_memory_bytes == 141_000_000_000 and h.hbm_bw == 4.8e12 and h.pcie_bw == 52e9
    assert h.pcie_latency_s == pytest.approx(10e-6) and h.flops == 790e12 and h.d2d_bw == h.hbm_bw / 2
    assert h.tables is None and h.source == "configs/hardware/h200.yaml"
    assert load_hardware("gh200").pcie_bw > 5 * load_hardware("h200").pcie_bw
    assert load_hardware(h.to_dict()) == h  # the file schema round-trips


def test_calibration_file(tmp_path):
    cal = {
        "base": "h200",
        "pcie_bw_gb_s": 50.5,
        "tables": {
            "model": "switch-xxl-128",
            "copy": [[1e8, 2.1e-3], [1e6, 3e-5]],
            "expert": [[1, 6e-5], [64, 7e-5], [512, 2e-4]],
            "dense": [[1, 64, 1e-4], [64, 64, 2e-4], [1, 1024, 3e-4], [64, 1024, 5e-4]],
        },
    }
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    h = load_hardware(str(path))
    assert h.name == "h200" and h.pcie_bw == 50.5e9 and h.source == str(path)
    assert h.tables.copy == ((1e6, 3e-5), (1e8, 2.1e-3))  # sorted
    assert h.tables.model == "switch-xxl-128" and h.tables.d2d is None and len(h.tables.dense) == 4
    cfg = build([f"hardware={path}"])
    assert cfg.hardware == h and cfg.resolved["hardware"]["tables"]["model"] == "switch-xxl-128"
    with pytest.raises(ConfigError) as exc:
        build([f"hardware={path}", "model=switch-large-128", "workload.trace=traces/data/switch_xxl_128.npz"])
    assert str(exc.value).startswith(("hardware.tables.model:", "workload.trace:"))
    broken = tmp_path / "broken.json"
    broken.write_text("{nope")
    with pytest.raises(ConfigError) as exc:
        load_hardware(str(broken))
    field_error(exc, "hardware")
    assert "not valid JSON" in str(exc.value)


def test_profile_file_errors_name_the_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"base": "mixtral-8x7b", "top_k": 0}))
    with pytest.raises(ConfigError) as exc:
        load_model(str(path))
    field_error(exc, "model.top_k")
    assert str(path) in str(exc.value)
    path.write_text(yaml.safe_dump({"base": "mixtral-8x7b", "dtype_bytes": 4}))
    m = load_model(str(path))
    assert m.name == "mixtral-8x7b" and m.expert_bytes == 2 * load_model("mixtral-8x7b").expert_bytes


# ------------------------------------------------------------------------------------------ declared once
def test_keys_schema_and_resolved_come_from_the_dataclasses():
    import dataclasses

    from moebase.model import ModelSpec
    from sim.config.hardware import HardwareSpec
    from sim.config.run_config import SCHEMA, CacheConfig, MemorySizing, NamedConfig, RunConfig, WorkloadConfig

    def names(cls):
        return [f.name for f in dataclasses.fields(cls)]

    assert list(SCHEMA) == [k for k in names(RunConfig) if k not in ("source", "resolved")]
    assert list(SCHEMA["workload"]) == names(WorkloadConfig)
    assert list(SCHEMA["cache"]) == names(CacheConfig) + names(MemorySizing)
    assert list(SCHEMA["policy"]) == names(NamedConfig) and SCHEMA["policy"]["params"] == "any"
    assert list(SCHEMA["model"]) == names(ModelSpec) + ["base"]
    assert len(SCHEMA["hardware"]) == len(names(HardwareSpec)) + 1 and "gpu_memory_gb" in SCHEMA["hardware"]
    cfg = build()
    for section in ("workload", "cache", "policy", "predictor"):
        assert set(cfg.resolved[section]) <= set(SCHEMA[section])
    assert set(cfg.resolved["hardware"]) == set(SCHEMA["hardware"]) - {"base"}


def test_policy_params_are_checked_when_the_config_loads():
    with pytest.raises(ConfigError) as exc:
        load_run_config(SWITCH, ["policy.params.bogus=1"])  # before anything runs
    field_error(exc, "policy.params.bogus")
    for sets, field in (
        (["policy=moe-infinity", "policy.params.capacity=1000000"], "policy.params.capacity"),
        (["policy=lfu", "policy.params.counts=most"], "policy.params.counts"),
        (["policy=lru", "policy.params.pin_hot=null"], "policy.params.pin_hot"),
        (["policy.params.fill=expert0", "policy.params.victim_order=legacy"], "policy.params.fill"),
        (["predictor=noisy", "predictor.params.precision=0"], "predictor.params.precision"),
        (["predictor=transition", "predictor.params.train=null"], "predictor.params.train"),
    ):
        with pytest.raises(ConfigError) as exc:
            build(sets)
        field_error(exc, field)
    cfg = build(["policy=moe-infinity", "predictor=moe-infinity", "predictor.params.budget=3"])
    assert cfg.policy.params == {"pin_hot": False, "capacity": 256, "activation": "mix"}
    assert cfg.predictor.params == {"threshold": 0.1, "budget": 3, "capacity": 256, "train": None}


def test_the_ceiling_policy_is_known_by_its_flag():
    from sim.policies import is_ceiling

    assert is_ceiling("gpu-only") and not is_ceiling("lru") and not is_ceiling("no-such-policy")
    assert POLICY_CLASSES.get("gpu-only").all_resident


def test_decimal_and_binary_gigabytes():
    import sim.config.units

    assert sim.config.units.GB == 1e9 and sim.config.units.GIB == 2**30 and sim.config.units.GB is sim.config.units.GB
