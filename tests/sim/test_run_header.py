"""The header `python -m sim run` prints names what the config resolved to: the serving system applied (through
`--set system=...` too) with the weight formats of experts and dense weights, and the experts each tier holds (the
slots a `cache.gpu_memory_gb` split produced); `config.resolved.yaml` names the same system."""

from __future__ import annotations

import contextlib
import io
import math

import yaml

from sim.cli import main
from sim.config.run_config import load_run_config
from sim.config.system import FORMATS
from sim.config.units import GB

RTX = "configs/qwen3_30b_a3b_rtx4090.yaml"  # bf16 experts, per-layer slots


def _run(tmp_path, config: str, *sets: str) -> tuple[list[str], dict]:
    out = tmp_path / "run"
    args = ["run", config, "--set", "workload.requests=1", *[x for s in sets for x in ("--set", s)]]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main([*args, "--out", str(out)]) == 0
    return printed.getvalue().splitlines(), yaml.safe_load((out / "config.resolved.yaml").read_text())


def test_a_system_set_on_the_command_line_is_named_with_its_formats(tmp_path):
    lines, resolved = _run(tmp_path, RTX, "system=llama-cpp")
    system = lines[1]
    assert system.split()[:2] == ["system", "llama-cpp"], lines[:3]
    assert f"experts q4_k_m ({FORMATS['q4_k_m']:g} bits/weight)" in system
    assert f"dense weights q4_k_m ({FORMATS['q4_k_m']:g} bits/weight)" in system
    assert resolved["system"]["name"] == "llama-cpp" and resolved["system"]["expert_format"] == "q4_k_m"


def test_the_default_system_shows_the_models_own_widths(tmp_path):
    lines, resolved = _run(tmp_path, RTX)
    cfg = load_run_config(RTX)
    assert lines[1].split()[:2] == ["system", "ideal"]
    assert "experts 16 bits/weight" in lines[1] and "dense weights 16 bits/weight" in lines[1]
    assert f"{cfg.model.expert_bytes / 1e6:.1f} MB each" in lines[1]
    assert resolved["system"]["name"] == "ideal"
    hpc, mpc, lpc = cfg.cache.hpc_slots, cfg.cache.mpc_slots, cfg.cache.lpc_buffers
    assert lines[2].split()[:2] == ["GPU", "experts"]
    assert f"hpc {hpc} + mpc {mpc} of 128 per layer x 48 layers, {lpc} working buffers" in lines[2]
    gb = ((hpc + mpc) * 48 + lpc) * cfg.model.expert_bytes / 1e9
    assert f"= {gb:.2f} GB" in lines[2]


def test_the_slots_a_memory_split_produced_are_shown(tmp_path):
    split = ["cache.hpc_slots=null", "cache.mpc_slots=null", "cache.lpc_buffers=null", "cache.gpu_memory_gb=12"]
    lines, _ = _run(tmp_path, RTX, *split, "cache.split={hpc: 0.25, mpc: 0.5, lpc: 0.25}")
    eb = load_run_config(RTX).model.expert_bytes
    hpc, mpc, lpc = (math.floor(12 * GB * f / (eb * n)) for f, n in ((0.25, 48), (0.5, 48), (0.25, 1)))
    assert f"hpc {hpc} + mpc {mpc} of 128 per layer x 48 layers, {lpc} working buffers" in lines[2], lines[:3]


def test_a_shared_cache_and_a_resident_policy_are_said_as_such(tmp_path):
    lines, _ = _run(tmp_path, "configs/gpt_oss_20b.yaml", "cache.organization=shared", "policy=lru")
    cfg = load_run_config("configs/gpt_oss_20b.yaml", ["cache.organization=shared", "policy=lru"])
    total = cfg.cache.total_slots(24)
    assert f"one shared cache of {total} experts over 24 cached layers" in lines[2], lines[:3]
    lines, _ = _run(tmp_path, "configs/gpt_oss_20b.yaml", "policy=gpu-only")
    assert "every expert resident (32 x 24 MoE layers)" in lines[2], lines[:3]


def test_a_system_file_with_a_base_is_named_by_its_file(tmp_path):
    mine = tmp_path / "my-llama.yaml"
    mine.write_text("base: llama-cpp\nhost_threads: 8\n")
    lines, resolved = _run(tmp_path, RTX, f"system={mine}")
    assert resolved["system"]["name"] == "my-llama" and resolved["system"]["host_threads"] == 8
    assert lines[1].split()[:2] == ["system", "my-llama"]
    assert resolved["system"]["expert_format"] == "q4_k_m"  # the base's fields still apply


def test_a_system_with_settings_laid_over_its_profile_says_modified(tmp_path):
    lines, resolved = _run(tmp_path, RTX, "system=llama-cpp", "system.host_threads=4")
    assert lines[1].split()[:3] == ["system", "llama-cpp,", "modified"], lines[1]
    assert resolved["system"]["name"] == "llama-cpp" and resolved["system"]["host_threads"] == 4
    lines, _ = _run(tmp_path, RTX, "system=llama-cpp")
    assert "modified" not in lines[1]
