"""Machines composed from parts (sim/config/machine.py): a composition resolves to the HardwareSpec the engine reads,
equal to the bundled profile of the same parts where both describe the same thing; a child that changes a base's part
loses that part's figures (never the old part's figures under the new name); what a machine cannot be is refused
naming the field; the one-string name round-trips; a second socket adds its bandwidth in full (today's rule)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.profiles import available
from sim.config.hardware import HardwareSpec, load_hardware
from sim.config.machine import derived_figures, parse_parts_name, parts_name, resolve
from sim.config.parts import cpu_part, gpu_part, part_names
from sim.config.run_config import config_from_dict, load_run_config
from sim.config.units import GB
from tests.support.fuzz import fuzz_settings

COMPOSED = [n for n in available("hardware") if load_hardware(n).gpu is not None]
PARTS_KEYS = ("gpu", "gpu_count", "host", "link")


def parts_of(name: str) -> dict:
    """A bundled profile's parts, as a hardware mapping without any figure."""
    d = load_hardware(name).to_dict()
    return {k: d[k] for k in PARTS_KEYS if k in d}


def test_every_bundled_profile_but_the_gh200_names_its_parts():
    """The GH200's host is its own Grace CPU over NVLink-C2C, which no part describes; the T4 profile's host is a
    VM's share of one (its GPU and link are parts, its host figures its own)."""
    assert set(available("hardware")) - set(COMPOSED) == {"gh200"}
    assert load_hardware("t4-16gb").host is None and all(load_hardware(n).host for n in COMPOSED if n != "t4-16gb")


@pytest.mark.parametrize("name", COMPOSED)
def test_a_composed_machine_equals_its_profile_where_they_describe_the_same_thing(name):
    """The datasheet figures (GPU memory and bandwidth, cores, link) are equal; the rounded efficiencies of the
    profiles lie within a few percent of the parts' (flops 80%, host bandwidth 75% or 70% of peak)."""
    profile = load_hardware(name)
    if profile.host is None:  # t4-16gb: a VM's share of a host, no CPU part
        composed = load_hardware({**parts_of(name), **{k: v for k, v in profile.to_dict().items() if "cpu" in k}})
    else:
        composed = load_hardware(parts_of(name))
    for field in ("gpu_memory_bytes", "hbm_bw", "pcie_bw", "pcie_latency_s", "reserved_bytes", "d2d_bw", "cpu_cores"):
        assert getattr(composed, field) == getattr(profile, field), (name, field)
    assert composed.flops == pytest.approx(profile.flops, rel=0.03)
    assert composed.flops_fp32 == pytest.approx(profile.flops_fp32, rel=0.03)
    assert composed.cpu_mem_bw == pytest.approx(profile.cpu_mem_bw, rel=0.015)
    assert (composed.gpu, composed.host, composed.link) == (profile.gpu, profile.host, profile.link)


@pytest.mark.parametrize("name", COMPOSED)
def test_parts_with_the_profiles_figures_are_the_profile(name):
    """A profile is its parts with its own figures laid over them: the same spec, figure for figure."""
    profile = load_hardware(name)
    again = load_hardware({**profile.to_dict(), "source": profile.source})
    assert again == profile


def test_an_rtx4090_with_an_epyc_host_gets_the_epyc_never_the_profiles_ryzen():
    ryzen = load_hardware("rtx4090")
    epyc = load_hardware({"base": "rtx4090", "host": {"cpu": "epyc-9654", "sockets": 2}})
    assert epyc.host.cpu == "epyc-9654" and epyc.cpu_cores == 192
    assert epyc.cpu_mem_bw == pytest.approx(2 * 12 * 4800e6 * 8 * 0.75)  # the parts', not the 7950X's 62 GB/s
    assert epyc.flops == ryzen.flops and epyc.gpu_memory_bytes == ryzen.gpu_memory_bytes  # the GPU kept as it was
    assert epyc.name == "rtx4090-24gb+2x-epyc-9654+12xddr5-4800+gen4x16"  # another machine, named by its parts


def test_another_gpu_under_a_profile_takes_the_new_gpus_figures():
    hw = load_hardware({"base": "rtx4090", "gpu": "rtx5090-32gb"})
    g = gpu_part("rtx5090-32gb")
    assert hw.gpu_memory_bytes == 32 * GB and hw.hbm_bw == g.value("memory_bw_gb_s") * GB
    assert hw.flops == pytest.approx(g.value("tensor_tflops") * g.value("tensor_efficiency") * 1e12)
    assert hw.cpu_mem_bw == load_hardware("rtx4090").cpu_mem_bw  # the host unchanged, its figures kept


def test_stating_the_memory_capacity_or_the_same_parts_changes_no_figure():
    base = load_hardware("rtx4090")
    for child in (
        {"host": {"memory": {"capacity_gb": 128}}},
        {"host": {"cpu": "ryzen9-7950x"}},
        {"link": {"pcie_gen": 4}},
        {"gpu": "rtx4090-24gb"},
    ):
        hw = load_hardware({"base": "rtx4090", **child})
        assert dataclasses.replace(hw, host=base.host, name=base.name, source=base.source) == base, child
    assert load_hardware({"base": "rtx4090", "host": {"memory": {"capacity_gb": 128}}}).host.memory.capacity_gb == 128


def test_a_second_socket_adds_its_bandwidth_and_cores_in_full_today():
    one = load_hardware("rtx4090-24gb+1x-xeon-6454s+gen4")
    two = load_hardware("rtx4090-24gb+2x-xeon-6454s+gen4")
    assert two.cpu_mem_bw == pytest.approx(2 * one.cpu_mem_bw) and two.cpu_cores == 2 * one.cpu_cores
    assert two.cpu_bf16_flops == pytest.approx(2 * one.cpu_bf16_flops)


@pytest.mark.parametrize(
    "mapping, field, problem",
    [
        (
            {"gpu": "rtx4090-24gb", "gpu_count": 2, "host": {"cpu": "ryzen9-7950x"}},
            "hardware.gpu_count",
            "not modelled",
        ),
        ({"gpu": "rtx4090-24gb", "host": {"cpu": "ryzen9-7950x", "sockets": 2}}, "hardware.host.sockets", "at most 1"),
        (
            {"gpu": "rtx4090-24gb", "host": {"cpu": "ryzen9-7950x", "memory": {"channels": 4}}},
            "hardware.host.memory.channels",
            "2 memory channels",
        ),
        (
            {"gpu": "rtx4090-24gb", "host": {"cpu": "epyc-9654", "memory": {"type": "ddr4"}}},
            "hardware.host.memory.type",
            "takes ddr5",
        ),
        (
            {"gpu": "rtx4090-24gb", "host": {"cpu": "ryzen9-7950x", "memory": {"capacity_gb": 4096}}},
            "hardware.host.memory.capacity_gb",
            "at most 192",
        ),
        ({"gpu": "rtx4090-24gb", "host": {"cpu": "epyc-9654"}, "link": {"pcie_gen": 5}}, "hardware.link.pcie_gen", ""),
        ({"gpu": "rtx4090-24gb", "host": {"cpu": "epyc-9654"}, "link": {"lanes": 32}}, "hardware.link.lanes", ""),
        ({"gpu": "rtx4090-24gb"}, "hardware.host", "missing: a machine composed from parts names its host"),
        ({"gpu": "rtx4090", "host": {"cpu": "epyc-9654"}}, "hardware.gpu", "closest: rtx4090-24gb"),
        ({"gpu": "rtx4090-24gb", "host": {"cpu": "EPYC 9654"}}, "hardware.host.cpu", "unknown CPU part"),
        ({"base": "gh200", "gpu": "h200-sxm-141gb"}, "hardware.gpu", "names none"),
        ({"gpu": "rtx4090-24gb", "host": {"cpu": "epyc-9654", "fans": 3}}, "hardware.host.fans", "unknown key"),
    ],
)
def test_what_a_machine_cannot_be_is_refused_naming_the_field(mapping, field, problem):
    with pytest.raises(ConfigError) as exc:
        load_hardware(mapping)
    assert str(exc.value).startswith(f"{field}: ") and problem in str(exc.value), str(exc.value)


def test_a_calibrated_profile_keeps_its_parts(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text("base: h200\ntables: {copy: [[1000, 0.001], [2000, 0.002]]}\n")
    assert load_hardware(str(cal)).gpu == "h200-sxm-141gb"
    with pytest.raises(ConfigError, match=r"hardware\.gpu: changes a part of 'h200', whose tables were measured"):
        load_hardware({"base": str(cal), "gpu": "rtx5090-32gb"})


@fuzz_settings(60)
@given(
    gpu=st.sampled_from(part_names("gpu")),
    cpu=st.sampled_from(part_names("cpu")),
    sockets=st.integers(1, 2),
    gen=st.sampled_from([None, 3, 4, 5]),
    capacity=st.sampled_from([None, 64, 512]),
)
def test_a_machine_named_by_its_parts_round_trips(gpu, cpu, sockets, gen, capacity):
    c = cpu_part(cpu)
    top = min(gpu_part(gpu).value("pcie_gen"), c.value("pcie_gen"))
    if sockets > c.value("max_sockets") or (gen is not None and gen > top):
        with pytest.raises(ConfigError):
            load_hardware(f"{gpu}+{sockets}x-{cpu}" + (f"+gen{gen}" if gen else ""))
        return
    if capacity is not None and capacity > sockets * c.value("max_memory_gb"):
        capacity = None
    given_name = f"{gpu}+{sockets}x-{cpu}" + (f"+{capacity}gb" if capacity else "") + (f"+gen{gen}" if gen else "")
    hw = load_hardware(given_name)
    assert hw.name == given_name and hw.gpu == gpu and hw.host.cpu == cpu and hw.host.sockets == sockets
    assert hw.link.pcie_gen == (gen or top) and hw.host.memory.capacity_gb == capacity
    comp = resolve(parse_parts_name(given_name))
    assert load_hardware(parts_name(comp)) == dataclasses.replace(hw, name=parts_name(comp))
    assert set(derived_figures(comp)) >= {"gpu_memory_gb", "pcie_bw_gb_s", "cpu_mem_bw_gb_s", "cpu_cores"}


@pytest.mark.parametrize("bad", ["rtx4090-24gb+", "rtx4090-24gb+2x-epyc-9654+ddr9", "+epyc-9654", "rtx4090-24gb+12gbx"])
def test_a_bad_one_string_name_is_refused_on_one_line(bad):
    with pytest.raises(ConfigError) as exc:
        load_hardware(bad)
    assert "\n" not in str(exc.value) and str(exc.value).startswith("hardware")


def test_a_composed_machine_runs_and_its_resolved_config_loads_back(tmp_path):
    d = {
        "model": "mixtral-8x7b",
        "hardware": {"gpu": "l40s-48gb", "host": {"cpu": "epyc-9654", "sockets": 2}, "link": {"pcie_gen": 4}},
        "workload": {"trace": "traces/data/mixtral_8x7b.npz", "requests": 1, "max_decode_tokens": 2},
        "cache": {"hpc_slots": 0, "mpc_slots": 2, "lpc_buffers": 2},
        "policy": "lru",
    }
    cfg = config_from_dict(d)
    assert isinstance(cfg.hardware, HardwareSpec) and cfg.hardware.host.cpu == "epyc-9654"
    again = config_from_dict(cfg.resolved)
    assert again.hardware == cfg.hardware and again.resolved == cfg.resolved


def test_set_reaches_the_parts_of_a_profile_named_in_a_config():
    cfg = load_run_config("configs/mixtral_rtx4090.yaml", ["hardware.host.cpu=epyc-9654", "hardware.host.sockets=2"])
    assert cfg.hardware.host.cpu == "epyc-9654" and cfg.hardware.cpu_cores == 192
    with pytest.raises(ConfigError, match=r"^hardware\.host\.cpu: unknown CPU part 'epyc-9999'"):
        load_run_config("configs/mixtral_rtx4090.yaml", ["hardware.host.cpu=epyc-9999"])
