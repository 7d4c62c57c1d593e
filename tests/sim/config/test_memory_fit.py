"""Never a number that cannot happen: a config whose parts (dense weights, KV cache, reserved memory, and the tiers,
or every expert for a policy that keeps them all resident) do not fit in the GPU's memory is refused with
``DoesNotFit``, one line listing each part and the GPU's memory, and ``sim run`` prints no throughput for it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.config.memory import DoesNotFit, gb, gb_pair
from sim.config.run_config import config_from_dict, load_run_config
from sim.config.units import GB
from tests.support.cli import run_module
from tests.support.engine import tiny_model
from tests.support.fuzz import fuzz_settings
from tests.support.messages import checked_message
from tests.support.paths import ROOT
from tests.support.traces import random_trace
from traces.io import save_trace

TRACE = random_trace(np.random.default_rng(3), tokens=40, layers=2, experts=8, k=2, requests=4)
MAX_MESSAGE = 500


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    return save_trace(TRACE, tmp_path_factory.mktemp("fit") / "t.npz")


def _config(trace_path, policy: str, gpu_gb: float, reserved_gb: float, hpc: int, mpc: int, buffers: int, batch: int):
    model = tiny_model(TRACE, d_model=1024, d_ff=4096)  # 16 MiB experts: a few fill a small GPU
    return {
        "model": model,
        "hardware": {"base": "h200", "gpu_memory_gb": gpu_gb, "reserved_gb": reserved_gb},
        "workload": {"trace": str(trace_path), "batch_size": batch},
        "cache": {"hpc_slots": hpc, "mpc_slots": mpc, "lpc_buffers": buffers},
        "policy": policy,
    }


def _parts(cfg: dict, policy: str) -> dict[str, int]:
    """What the run keeps on the GPU, computed here from the model's own figures (not by the code under test)."""
    loaded = config_from_dict({**cfg, "hardware": {"base": "h200", "gpu_memory_gb": 1e5}})
    model, eb = loaded.model, loaded.model.expert_bytes
    lengths = np.diff(TRACE.request_offsets)
    kv = cfg["workload"]["batch_size"] * int(lengths.max()) * model.kv_bytes_per_token
    c = cfg["cache"]
    experts = (
        model.num_experts * model.moe_layers * eb
        if policy == "gpu-only"
        else ((c["hpc_slots"] + c["mpc_slots"]) * model.moe_layers + c["lpc_buffers"]) * eb
    )
    return {"dense": model.dense_bytes, "kv_cache": kv, "experts": experts}


@fuzz_settings(60)
@given(
    policy=st.sampled_from(["lru", "gpu-only", "on-demand"]),
    gpu_gb=st.floats(0.05, 2.0),
    reserved_gb=st.sampled_from([0.0, 0.01, 0.1]),
    hpc=st.integers(0, 2),
    mpc=st.integers(0, 4),
    buffers=st.integers(1, 6),
    batch=st.integers(1, 4),
)
def test_a_config_loads_exactly_when_its_parts_fit(trace_path, policy, gpu_gb, reserved_gb, hpc, mpc, buffers, batch):
    """Over GPU sizes: the sum of the parts decides, for a caching policy, a policy that keeps nothing (its
    configured tiers count all the same: the memory a comparison gives every policy), and the all-resident ceiling
    (every expert); a refusal holds that sum and the GPU's memory, and says them in one line."""
    cfg = _config(trace_path, policy, gpu_gb, reserved_gb, hpc, mpc, buffers, batch)
    parts = _parts(cfg, policy)
    need = sum(parts.values()) + int(round(reserved_gb * GB))
    gpu = int(round(gpu_gb * GB))
    try:
        config_from_dict(cfg)
    except DoesNotFit as exc:
        assert need > gpu, (need, gpu)
        assert exc.need_bytes == need and exc.gpu_bytes == gpu
        assert sum(exc.parts.values()) == need
        msg = checked_message(exc, MAX_MESSAGE)
        assert msg.split(": ", 1)[0] in ("cache", "policy.name"), msg
        assert f"but hardware.gpu_memory_gb is {gpu_gb:g}" in msg, msg
        assert exc.config is not None and exc.config.policy.name == policy  # the config rides along
        larger, smaller = exc.short()[len("does not fit (") : -len(" GB)")].split(" GB > ")
        assert float(larger.replace(",", "")) > float(smaller.replace(",", ""))
        return
    assert need <= gpu, (need, gpu)


def test_gpu_only_counts_every_expert_and_names_the_policy():
    """The ceiling on a 24 GB card: 64 GB of experts are refused (it used to print ~97 tok/s); on an H200 it fits."""
    with pytest.raises(DoesNotFit) as exc:
        load_run_config(ROOT / "configs/qwen3_5_35b_a3b_rtx4090.yaml", ["policy.name=gpu-only"])
    msg = str(exc.value)
    model = exc.value.config.model
    experts = model.num_experts * model.moe_layers * model.expert_bytes
    assert msg.startswith("policy.name: gpu-only keeps every expert on the GPU, which does not fit")
    assert f"the experts need {gb(experts)} GB ({model.num_experts} experts x {model.moe_layers} MoE layers" in msg
    assert exc.value.parts["experts"] == experts and exc.value.need_bytes > exc.value.gpu_bytes == 24 * GB
    assert msg.endswith("hardware.gpu_memory_gb is 24 (a policy that offloads experts fits in less)")
    assert exc.value.short() == f"does not fit ({gb(exc.value.need_bytes)} GB > 24.0 GB)"
    load_run_config(ROOT / "configs/qwen3_5_35b_a3b.yaml", ["policy.name=gpu-only"])  # 141 GB: fits


def test_gpu_only_with_tier_sizes_still_counts_every_expert():
    """Tier sizes given beside an all-resident policy change nothing: every expert is counted."""
    cfg = load_run_config(ROOT / "configs/mixtral.yaml", ["policy.name=gpu-only", "cache.mpc_slots=0"])
    assert cfg.policy.name == "gpu-only"
    with pytest.raises(DoesNotFit):  # Mixtral's 90 GB of experts on an 80 GB card
        load_run_config(ROOT / "configs/mixtral.yaml", ["policy.name=gpu-only", "hardware=a100-pcie"])


def test_does_not_fit_is_a_config_error_whose_short_form_reads_larger():
    exc = DoesNotFit("cache", "does not fit", 24_010_000_000, 24 * GB, {"dense": 1})
    assert isinstance(exc, ConfigError) and str(exc) == "cache: does not fit"
    assert exc.short() == "does not fit (24.01 GB > 24.00 GB)"
    assert gb(0) == "0" and gb(773.1e9) == "773" and gb(4.891e9) == "4.89" and gb(2.13e7) == "0.0213"
    assert gb(12_345e9) == "12,345"
    assert gb_pair(2e9, 1e9) == ("2.00", "1.00")


def test_run_refuses_a_config_that_does_not_fit_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    res = run_module(
        "sim", "run", "configs/qwen3_5_35b_a3b_rtx4090.yaml", "--set", "policy.name=gpu-only", "--out", out, "--json"
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: policy.name: gpu-only keeps every expert"), res.stderr
    assert "GB, but hardware.gpu_memory_gb is 24" in lines[0]
    assert res.stdout == "" and "tok/s" not in res.stderr and not out.exists()


def test_run_prints_a_throughput_once_the_memory_allows(tmp_path):
    """The same ceiling on a (hypothetical) 80 GB card fits and runs: the refusal is about memory only."""
    out = tmp_path / "out"
    res = run_module(
        "sim",
        "run",
        "configs/qwen3_5_35b_a3b_rtx4090.yaml",
        "--set",
        "policy.name=gpu-only",
        "--set",
        "hardware.gpu_memory_gb=80",
        "--set",
        "workload.requests=1",
        "--set",
        "workload.max_decode_tokens=2",
        "--out",
        out,
        "--json",
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["throughput_tok_s"] > 0


def test_a_config_file_that_does_not_fit_is_refused_on_load(tmp_path, trace_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config(trace_path, "gpu-only", 0.05, 0.0, 0, 1, 1, 1)))
    with pytest.raises(DoesNotFit):
        load_run_config(path)
