"""The host CPU in hardware profiles and the cost model: every profile carries usable host
memory bandwidth, matrix throughput per weight format, cores and a per-call cost; ``CostModel.cpu_expert_s`` is a
roofline over them (memory-bound at one token, compute-bound at many) or a ``cpu_expert`` table;
``activation_copy_s`` prices activations crossing the link. None of it moves an existing result."""

from __future__ import annotations

import dataclasses
import json

import pytest

from moebase.errors import ConfigError
from moebase.model import load_model
from moebase.profiles import available
from sim.config.hardware import CPU_FIELDS, CalibrationTables, cpu_format_rate, load_hardware
from sim.costs.costs import CostModel

NEW_PROFILES = {"rtx4090", "rtx4090-spr", "h200-granite-rapids", "h200-epyc-genoa", "h200-epyc-turin"}
MODELS = (
    "deepseek-v3",
    "kimi-k2",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "gpt-oss-120b",
    "gpt-oss-20b",
    "mixtral-8x7b",
    "switch-xxl-128",
)
GPU_KEYS = (
    "gpu_memory_gb",
    "hbm_bw_gb_s",
    "flops_tflops",
    "flops_fp32_tflops",
    "pcie_bw_gb_s",
    "pcie_latency_us",
    "d2d_bw_gb_s",
    "launch_overhead_us",
    "reserved_gb",
)


# ------------------------------------------------------------------------------------------------ profiles
def test_every_hardware_profile_loads_with_a_host():
    names = set(available("hardware"))
    assert names >= {"h200", "h100-pcie", "a100-pcie", "gh200"} | NEW_PROFILES
    for name in names:
        h = load_hardware(name)
        assert h.name == name and load_hardware(h.to_dict()) == h
        assert h.cpu_mem_bw > 0 and h.cpu_cores >= 1 and h.cpu_expert_overhead_s >= 0
        assert h.cpu_int4_flops >= h.cpu_int8_flops >= h.cpu_bf16_flops > 0
        assert h.cpu_mem_bw < h.hbm_bw and h.cpu_bf16_flops < h.flops  # a host is slower than its GPU
        assert h.d2h_bw > 0 and h.activation_latency_s >= 0


@pytest.mark.parametrize("variant", ["h200-granite-rapids", "h200-epyc-genoa", "h200-epyc-turin"])
def test_host_variants_keep_their_base_gpu(variant):
    base, v = load_hardware("h200").to_dict(), load_hardware(variant).to_dict()
    assert {k: v[k] for k in GPU_KEYS} == {k: base[k] for k in GPU_KEYS}
    assert {k: v[k] for k in CPU_FIELDS} != {k: base[k] for k in CPU_FIELDS}
    assert v["source"] == f"configs/hardware/{variant}.yaml"


def test_host_figures_of_the_bundled_profiles():
    h = load_hardware("h200")
    assert (h.cpu_mem_bw, h.cpu_bf16_flops, h.cpu_int8_flops, h.cpu_int4_flops) == (460e9, 40e12, 80e12, 80e12)
    assert h.cpu_cores == 112 and h.cpu_expert_overhead_s == pytest.approx(5e-6)
    assert h.d2h_bw == h.pcie_bw == 52e9 and h.activation_latency_s == h.pcie_latency_s  # defaults
    g = load_hardware("gh200")
    assert g.d2h_bw == 297e9 and g.pcie_bw == 400e9 and g.cpu_mem_bw == 480e9 and g.cpu_cores == 72
    r = load_hardware("rtx4090")
    assert r.gpu_memory_bytes == 24e9 and r.pcie_bw == 25e9 and r.cpu_mem_bw == 62e9 and r.cpu_cores == 16
    assert load_hardware("rtx4090-spr").hbm_bw == r.hbm_bw and load_hardware("rtx4090-spr").cpu_cores == 56


def test_defaults_hold_without_host_keys():
    d = {
        k: v
        for k, v in load_hardware("h200").to_dict().items()
        if k not in CPU_FIELDS + ("d2h_bw_gb_s", "activation_latency_us", "name", "source", "gpu", "host", "link")
    }
    h = load_hardware({**d, "pcie_bw_gb_s": 30, "pcie_latency_us": 7})
    assert h.d2h_bw == 30e9 and h.activation_latency_s == pytest.approx(7e-6)
    assert (h.cpu_mem_bw, h.cpu_bf16_flops, h.cpu_int8_flops, h.cpu_int4_flops, h.cpu_cores) == (
        230e9,
        20e12,
        40e12,
        40e12,
        56,
    )
    assert load_hardware({**d, "d2h_bw_gb_s": None, "activation_latency_us": None}).d2h_bw == d["pcie_bw_gb_s"] * 1e9


@pytest.mark.parametrize(
    "key, value",
    [
        ("cpu_mem_bw_gb_s", 0),
        ("cpu_mem_bw_gb_s", -5),
        ("cpu_mem_bw_gb_s", "fast"),
        ("cpu_bf16_tflops", 0),
        ("cpu_int8_tops", float("nan")),
        ("cpu_int4_tops", float("inf")),
        ("cpu_int4_tops", [1]),
        ("cpu_cores", 0),
        ("cpu_cores", 1.5),
        ("cpu_cores", True),
        ("cpu_cores", "all"),
        ("cpu_expert_overhead_us", -1),
        ("cpu_expert_overhead_us", 1e10),
        ("d2h_bw_gb_s", 0),
        ("d2h_bw_gb_s", "x"),
        ("activation_latency_us", -3),
    ],
)
def test_bad_host_values_name_the_field(key, value):
    with pytest.raises(ConfigError) as exc:
        load_hardware({"base": "h200", key: value})
    text = str(exc.value)
    assert text.startswith(f"hardware.{key}: ") and "\n" not in text and len(text) < 300


def test_a_blank_host_figure_falls_back_to_the_machines_host_part():
    """On a machine composed from parts, a host figure left blank is the part's derived figure (as a blank
    d2h_bw_gb_s is the link's), not an error: h200 names two Xeon 8480C sockets of 8 x DDR5-4800."""
    h = load_hardware({"base": "h200", "cpu_mem_bw_gb_s": None})
    assert h.cpu_mem_bw != load_hardware("h200").cpu_mem_bw and h.cpu_mem_bw > 0
    with pytest.raises(ConfigError, match=r"^hardware\.host: missing"):
        d = {k: v for k, v in load_hardware("h200").to_dict().items() if k not in ("host", "tables", "source")}
        load_hardware({**d, "cpu_mem_bw_gb_s": None})


def test_bad_host_value_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "host.yaml"
    path.write_text("base: h200\ncpu_cores: 0\n")
    with pytest.raises(ConfigError, match=r"^hardware\.cpu_cores: .*\(in .*host\.yaml\)$"):
        load_hardware(str(path))


# ------------------------------------------------------------------------------------------------ weight formats
@pytest.mark.parametrize(
    "bits, fmt",
    [
        (2, "int4"),
        (4, "int4"),
        (4.25, "int4"),
        (4.5, "int4"),
        (5, "int4"),
        (6.5625, "int8"),
        (8, "int8"),
        (8.5, "int8"),
        (9, "int8"),
        (16, "bf16"),
        (32, "bf16"),
    ],
)
def test_the_host_rate_follows_the_weight_format(bits, fmt):
    h = load_hardware("rtx4090")
    rates = {"int4": h.cpu_int4_flops, "int8": h.cpu_int8_flops, "bf16": h.cpu_bf16_flops}
    assert cpu_format_rate(h, bits) == (fmt, rates[fmt]) and h.cpu_rate(bits) == rates[fmt]


def test_each_model_is_computed_at_its_storage_format():
    h = load_hardware("h200")
    assert CostModel(load_model("gpt-oss-120b"), h).cpu_format == "int4"  # MXFP4
    assert CostModel(load_model("deepseek-v3"), h).cpu_format == "int8"  # FP8
    assert CostModel(load_model("qwen3-235b-a22b"), h).cpu_format == "bf16"
    assert CostModel(load_model("switch-xxl-128"), h).cpu_format == "bf16"  # fp32 weights at the 16-bit rate


# ------------------------------------------------------------------------------------------------ cpu_expert_s
def _terms(cost: CostModel, n: int) -> tuple[float, float]:
    m, hw = cost.model, cost.hw
    memory = (m.expert_bytes + 2 * n * m.d_model * m.dtype_bytes) / hw.cpu_mem_bw
    compute = n * m.expert_flops_per_token / hw.cpu_rate(m.expert_bits_per_weight)
    return memory, compute


@pytest.mark.parametrize("hw", sorted(available("hardware")))
@pytest.mark.parametrize("model", MODELS)
def test_cpu_expert_time_is_monotone_memory_bound_then_compute_bound(hw, model):
    cost = CostModel(load_model(model), load_hardware(hw))
    overhead = cost.hw.cpu_expert_overhead_s
    times = [cost.cpu_expert_s(n) for n in (0, 1, 2, 4, 8, 16, 64, 256, 1024, 4096, 16384, 65536)]
    assert times[0] == 0.0
    assert all(b >= a for a, b in zip(times, times[1:])) and times[-1] > times[1]
    memory, compute = _terms(cost, 1)  # one token: the weights' bytes over the bandwidth
    assert memory > compute
    assert times[1] == pytest.approx(overhead + memory, rel=1e-12)
    assert times[1] == pytest.approx(overhead + cost.expert_bytes / cost.hw.cpu_mem_bw, rel=1e-3)
    n = 65536  # a long prefill: the FLOPs at the format's rate
    memory, compute = _terms(cost, n)
    assert compute > memory and times[-1] == pytest.approx(overhead + compute, rel=1e-12)


def test_fewer_cores_stretch_the_roofline_in_proportion():
    cost = CostModel(load_model("deepseek-v3"), load_hardware("h200"))
    o = cost.hw.cpu_expert_overhead_s
    for n in (1, 4096):
        full = cost.cpu_expert_s(n)
        assert cost.cpu_expert_s(n, cores=112) == full == cost.cpu_expert_s(n, cores=500)
        assert cost.cpu_expert_s(n, cores=28) - o == pytest.approx(4 * (full - o), rel=1e-12)
    with pytest.raises(ValueError):
        cost.cpu_expert_s(1, cores=0)


def test_cpu_and_gpu_expert_times_compare_as_the_literature_says():
    """Fiddler's premise: at one token a host expert beats copying its weights over PCIe; at a long prefill the
    GPU (copy + compute) wins."""
    cost = CostModel(load_model("deepseek-v3"), load_hardware("h200"))
    one = cost.activation_copy_s(1, "d2h") + cost.cpu_expert_s(1) + cost.activation_copy_s(1, "h2d")
    assert one < cost.copy_s(cost.expert_bytes) + cost.expert_s(1)
    n = 8192
    many = cost.activation_copy_s(n, "d2h") + cost.cpu_expert_s(n) + cost.activation_copy_s(n, "h2d")
    assert many > cost.copy_s(cost.expert_bytes) + cost.expert_s(n)


# ------------------------------------------------------------------------------------------------ cpu_expert table
def _with_tables(hw, **tables):
    return dataclasses.replace(hw, tables=CalibrationTables(**tables))


def test_the_cpu_expert_table_replaces_the_roofline():
    hw = _with_tables(load_hardware("h200"), model="qwen3-30b-a3b", cpu_expert=((1, 1e-4), (64, 3e-4), (512, 2e-3)))
    cost = CostModel(load_model("qwen3-30b-a3b"), hw)
    assert cost.cpu_expert_s(0) == 0.0 and cost.cpu_expert_s(1) == 1e-4 and cost.cpu_expert_s(64) == 3e-4
    assert cost.cpu_expert_s(32) == pytest.approx(1e-4 + 2e-4 * 31 / 63)
    assert cost.cpu_expert_s(1024) > 2e-3  # extrapolated with the last slope
    assert cost.cpu_expert_s(64, cores=28) == pytest.approx(4 * 3e-4)
    plain = CostModel(load_model("qwen3-30b-a3b"), load_hardware("h200"))
    assert cost.expert_s(8) == plain.expert_s(8) and cost.copy_s(10**6) == plain.copy_s(10**6)  # nothing else moves


def test_a_cpu_expert_table_for_another_model_is_refused():
    hw = _with_tables(load_hardware("h200"), model="qwen3-30b-a3b", cpu_expert=((1, 1e-4), (64, 3e-4)))
    with pytest.raises(ConfigError, match=r"^hardware\.tables\.model: .*cpu_expert"):
        CostModel(load_model("deepseek-v3"), hw)


def test_a_calibration_file_with_a_cpu_expert_table(tmp_path):
    cal = {"base": "h200", "tables": {"model": "gpt-oss-20b", "cpu_expert": [[64, 5e-4], [1, 6e-5]]}}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    h = load_hardware(str(path))
    assert h.tables.cpu_expert == ((1.0, 6e-5), (64.0, 5e-4)) and h.tables.expert is None
    assert h.tables.to_dict()["cpu_expert"] == [[1.0, 6e-5], [64.0, 5e-4]] and load_hardware(h.to_dict()) == h
    path.write_text(json.dumps({"base": "h200", "tables": {"cpu_expert": [[1, 6e-5], [64, 5e-4]]}}))
    with pytest.raises(ConfigError, match=r"^hardware\.tables\.model: missing"):
        load_hardware(str(path))
    path.write_text(json.dumps({"base": "h200", "tables": {"model": "m", "cpu_expert": [[1, 6e-5]]}}))
    with pytest.raises(ConfigError, match=r"^hardware\.tables\.cpu_expert: needs at least 2 points"):
        load_hardware(str(path))


# ------------------------------------------------------------------------------------------------ activations
def test_activation_copies_cross_the_link_both_ways():
    cost = CostModel(load_model("deepseek-v3"), load_hardware("gh200"))
    hw = cost.hw
    assert cost.activation_bytes(3) == 3 * 7168 * 2
    assert cost.activation_copy_s(0, "d2h") == cost.activation_copy_s(0, "h2d") == 0.0
    assert cost.activation_copy_s(3, "d2h") == pytest.approx(hw.activation_latency_s + 3 * 7168 * 2 / 297e9)
    assert cost.activation_copy_s(3, "h2d") == pytest.approx(hw.activation_latency_s + 3 * 7168 * 2 / 400e9)
    assert cost.activation_copy_s(1, "d2h") < cost.copy_s(cost.expert_bytes)  # kilobytes, not megabytes
    for bad in ("up", "H2D", None):
        with pytest.raises(ValueError):
            cost.activation_copy_s(1, bad)
    pcie = CostModel(
        load_model("deepseek-v3"), load_hardware({"base": "h200", "d2h_bw_gb_s": 26, "activation_latency_us": 4})
    )
    assert pcie.activation_copy_s(1000, "d2h") == pytest.approx(4e-6 + 1000 * 7168 * 2 / 26e9)
    assert pcie.activation_copy_s(1000, "h2d") == pytest.approx(4e-6 + 1000 * 7168 * 2 / 52e9)


# ------------------------------------------------------------------------------------------------ no effect before
def test_host_figures_do_not_move_an_existing_run():
    from sim.config.run_config import load_run_config
    from sim.run import simulate
    from tests.support.paths import ROOT

    sets = ["workload.requests=16", "workload.max_decode_tokens=8"]
    base = simulate(load_run_config(ROOT / "configs/switch_xxl.yaml", sets)).summary
    odd = [
        "hardware.cpu_mem_bw_gb_s=1",
        "hardware.cpu_bf16_tflops=0.001",
        "hardware.cpu_int8_tops=0.001",
        "hardware.cpu_int4_tops=0.001",
        "hardware.cpu_cores=1",
        "hardware.cpu_expert_overhead_us=1000000",
        "hardware.d2h_bw_gb_s=0.001",
        "hardware.activation_latency_us=1000000",
    ]
    other = simulate(load_run_config(ROOT / "configs/switch_xxl.yaml", sets + odd)).summary
    assert "modified inline" in other["hardware_source"] and "modified" not in base["hardware_source"]
    for s in (base, other):
        for label in ("wall_s", "events_per_s", "hardware_source"):  # how long it took; how the profile was given
            s.pop(label, None)
    assert base == other and base["copies"] > 0


def test_a_bad_host_value_exits_2_from_the_cli_with_one_line(tmp_path):
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
            "configs/gpt_oss_20b.yaml",
            "--set",
            "hardware=h200-epyc-genoa",
            "--set",
            "hardware.cpu_cores=0",
            "--out",
            str(tmp_path / "o"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "hardware.cpu_cores" in lines[0] and "got 0" in lines[0]
    assert not (tmp_path / "o").exists()
