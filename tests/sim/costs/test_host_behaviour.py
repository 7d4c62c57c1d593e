"""The host as it behaves (sim/costs/host_costs.py): NUMA modes order their bandwidth, threads raise bandwidth until
the channels are full and compute up to the cores, an expert costs the same per call until it turns compute-bound,
a kernel family or instruction set the CPU lacks is refused naming the field, replicated experts count per socket
in host memory, and systems that set none of it are priced as before."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.model import load_model
from moebase.profiles import available
from sim.config.hardware import load_hardware
from sim.config.host_choice import host_copies, uses_host_model
from sim.config.host_kernels import FORMAT_CLASSES, family_names, format_class, load_family
from sim.config.host_memory import host_memory_check
from sim.config.parts import load_table
from sim.config.run_config import config_from_dict
from sim.config.system import NUMA_MODES, format_bits, load_system
from sim.costs.costs import CostModel
from sim.costs.host_costs import HostCosts, numa_bandwidth
from sim.policies import POLICIES
from sim.run import simulate

TWO_SOCKETS = "rtx4090d-2x6454s"
ONE_SOCKET = "rtx4090d-1x6454s"


def model(fmt: str = "q4_k_m", name: str = "deepseek-v3"):
    return dataclasses.replace(load_model(name), expert_bits=format_bits(fmt))


def system(**keys):
    return load_system({"base": "ideal", **keys})


# ------------------------------------------------------------------------------------------------ NUMA
@settings(max_examples=200, deadline=None)
@given(
    total=st.floats(1.0, 5000.0),
    sockets=st.integers(2, 8),
    remote=st.floats(0.01, 1.0),
)
def test_numa_modes_order_their_bandwidth(total, sockets, remote):
    bw = {mode: numa_bandwidth(total, sockets, mode, remote) for mode in NUMA_MODES}
    assert bw["replicated"] == bw["numa_tp"] == pytest.approx(total)
    assert bw["replicated"] >= bw["interleaved"] * (1 - 1e-12)
    assert bw["one_socket"] == pytest.approx(total / sockets)
    # interleaving beats one socket while a remote read is at least 1/(S+1) of a local one; a slower link loses
    if remote >= 1 / (sockets + 1) * (1 + 1e-9):
        assert bw["interleaved"] >= bw["one_socket"] * (1 - 1e-12)
    elif remote <= 1 / (sockets + 1) * (1 - 1e-9):
        assert bw["interleaved"] < bw["one_socket"]
    assert numa_bandwidth(total, sockets, None, remote) == total  # today's rule: every socket in full
    if remote < 0.999:
        assert bw["interleaved"] < bw["replicated"]


@given(total=st.floats(1.0, 5000.0), remote=st.floats(0.01, 1.0))
def test_one_socket_has_no_numa(total, remote):
    assert {numa_bandwidth(total, 1, mode, remote) for mode in NUMA_MODES} == {total}


def test_two_socket_machine_under_each_mode():
    remote = load_table("memory").figures["remote_bw_fraction"].value
    assert remote > 1 / 3  # so that interleaving two sockets beats one
    hw, m = load_hardware(TWO_SOCKETS), model()
    bw = {mode: HostCosts(m, hw, system(numa=mode)).bandwidth(64) for mode in NUMA_MODES}
    assert bw["replicated"] == bw["numa_tp"] == pytest.approx(hw.cpu_mem_bw)
    assert bw["replicated"] > bw["interleaved"] > bw["one_socket"] == pytest.approx(hw.cpu_mem_bw / 2)
    # threads beyond one socket's cores do not help one_socket
    one = HostCosts(m, hw, system(numa="one_socket"))
    assert one.threads(64) == one.cores == hw.cpu_cores / 2
    # a call spanning both sockets pays the cross-socket barrier; one socket does not
    spanning = HostCosts(m, hw, system(numa="replicated")).call_s
    assert spanning > one.call_s == pytest.approx(hw.cpu_expert_overhead_s)


def test_replicated_experts_count_per_socket_in_host_memory():
    hw = load_hardware({"base": TWO_SOCKETS, "host": {"memory": {"capacity_gb": 4096}}})
    m, lru = model(), POLICIES.get("lru")
    assert host_copies(system(numa="replicated"), hw) == 2
    assert host_copies(system(numa="numa_tp"), hw) == 1
    once = host_memory_check(m, hw, lru, {}, False)["experts"]
    twice = host_memory_check(m, hw, lru, {}, False, host_copies(system(numa="replicated"), hw))["experts"]
    assert twice == 2 * once
    small = load_hardware({"base": TWO_SOCKETS, "host": {"memory": {"capacity_gb": 512}}})
    with pytest.raises(ConfigError, match="hardware.host.memory.capacity_gb: .*2 copies"):
        host_memory_check(m, small, lru, {}, False, 2)
    assert host_memory_check(m, small, lru, {}, False, 1) is not None  # one copy fits


# ------------------------------------------------------------------------------------------------ threads
@pytest.mark.parametrize("hw_name, family", [(ONE_SOCKET, "kt-llamafile"), ("rtx4090", "llama-cpp")])
def test_bandwidth_grows_with_threads_until_the_channels_are_full(hw_name, family):
    hw = load_hardware(hw_name)
    h = HostCosts(model("q4_0"), hw, system(host_kernel=family))
    isa = h.path(1)
    threads = range(1, 2 * hw.cpu_cores + 1)
    bws = [h.bandwidth(h.threads(t), isa) for t in threads]
    rates = [h.compute_rate(h.threads(t), isa) for t in threads]
    assert all(a <= b for a, b in zip(bws, bws[1:]))
    assert all(a <= b for a, b in zip(rates, rates[1:]))
    top = h.numa_bw * h.family.bw_fraction(isa, h.format)
    assert bws[-1] == pytest.approx(top)  # saturated: the channels, not the threads
    assert bws[0] < top  # one thread cannot fill them
    saturated = next(i for i, b in enumerate(bws) if b >= top * (1 - 1e-12))
    assert saturated < hw.cpu_cores - 1  # full before every core runs ...
    assert rates[hw.cpu_cores - 1] == rates[-1] > rates[saturated]  # ... while compute grows up to the cores


def test_threads_without_a_per_core_figure_take_their_share_as_before():
    hw = load_hardware("gh200")  # names no CPU part: no core_bw_gb_s
    sy = system(host_threads=8)
    assert not uses_host_model(sy, hw)
    h = HostCosts(model(), hw, system(host_threads=8, numa="one_socket"))
    assert h.bandwidth(h.threads()) == pytest.approx(hw.cpu_mem_bw * 8 / hw.cpu_cores)


# ------------------------------------------------------------------------------------------------ batches
@settings(max_examples=60, deadline=None)
@given(
    family=st.sampled_from(["kt-llamafile", "kt-amx", "llama-cpp", "ik-llama-cpp"]),
    tokens=st.integers(1, 4096),
)
def test_time_per_token_falls_until_compute_bound(family, tokens):
    fmt = "int4" if family == "kt-amx" else "q4_k_m"
    h = HostCosts(model(fmt), load_hardware(ONE_SOCKET), system(host_kernel=family, expert_format=fmt))
    a, b = h.expert_s(tokens), h.expert_s(tokens + 1)
    assert b >= a  # more tokens never take less time ...
    assert b / (tokens + 1) <= a / tokens * (1 + 1e-9)  # ... nor more per token
    if family != "kt-amx":  # one kernel path: bandwidth-bound below the crossover, compute-bound above
        cross = h.crossover_tokens()
        if tokens + 1 <= cross:  # the weights' stream alone (the activations add under 1%)
            assert b == pytest.approx(h.expert_s(1), rel=0.01)
        elif tokens >= 2 * cross:
            assert b > a


def _compute_bound(h: HostCosts, tokens: int) -> bool:
    """Whether an expert of ``tokens`` tokens outlasts its stream on the host: its FLOPs over the compute rate at
    least its weights' and activations' bytes over the bandwidth (``crossover_tokens`` leaves the activations out,
    so just above it the stream may still be the longer)."""
    m, t, isa = h.model, h.threads(), h.path(tokens)
    stream = (m.expert_bytes + 2 * tokens * m.d_model * m.dtype_bytes) / h.bandwidth(t, isa)
    return tokens * m.expert_flops_per_token / h.compute_rate(t, isa) >= stream


@settings(max_examples=40, deadline=None)
@given(
    family=st.sampled_from(["kt-llamafile", "llama-cpp", "ik-llama-cpp", None]),
    share=st.floats(0.02, 1.0),
    tokens=st.integers(1, 4096),
)
def test_the_compute_share_prices_prompt_batches_and_leaves_decode_alone(family, share, tokens):
    """``host_compute_fraction``: the kernels' compute rate times the share, so an expert's compute-bound time (many
    tokens) grows as 1 / share, while a bandwidth-bound one (a decode token, below the crossover) is unchanged."""
    kernel = {} if family is None else {"host_kernel": family}
    hw, m = load_hardware(ONE_SOCKET), model("q4_k_m")
    full = HostCosts(m, hw, system(expert_format="q4_k_m", host_threads=16, **kernel))
    part = HostCosts(m, hw, system(expert_format="q4_k_m", host_threads=16, host_compute_fraction=share, **kernel))
    t = full.threads()
    assert part.compute_rate(t, part.path(tokens)) == pytest.approx(share * full.compute_rate(t, full.path(tokens)))
    assert part.crossover_tokens() == pytest.approx(share * full.crossover_tokens())
    if tokens <= part.crossover_tokens():  # bandwidth-bound under both
        assert part.expert_s(tokens) == pytest.approx(full.expert_s(tokens))
    if _compute_bound(full, tokens):  # then under the smaller share too
        assert part.expert_s(tokens) - part.call_s == pytest.approx((full.expert_s(tokens) - full.call_s) / share)
    # the hardware's own rates (no family, no host model): the same rule in CostModel
    plain = CostModel(m, hw, system(expert_format="q4_k_m"))
    less = CostModel(m, hw, system(expert_format="q4_k_m", host_compute_fraction=share))
    assert less.cpu_rate == pytest.approx(share * plain.cpu_rate)
    assert less.cpu_expert_s(tokens) >= plain.cpu_expert_s(tokens)


def test_amx_takes_its_matrix_path_from_min_tokens():
    h = HostCosts(model("int4"), load_hardware(ONE_SOCKET), system(host_kernel="kt-amx", expert_format="int4"))
    least = load_family("kt-amx").min_tokens("amx")
    assert h.path(least - 1) == "avx512" and h.path(least) == "amx"
    assert h.compute_rate(32, "amx") > h.compute_rate(32, "avx512")


def test_a_family_calling_per_layer_pays_its_call_once_per_layer():
    base = {
        "model": "deepseek-v3",
        "hardware": ONE_SOCKET,
        "workload": {
            "trace": "traces/data/synth_deepseek_v3.npz",
            "batch_size": 2,
            "prefill": False,
            "max_decode_tokens": 2,
            "requests": 2,
        },
        "predictor": "none",
        "cache": {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 1},
        "policy": "ktransformers",
    }

    def host_s(call_us):
        sy = {"base": "ktransformers", "host_kernel": "kt-llamafile", "host_call_us": call_us}
        r = simulate(config_from_dict({**base, "system": sy}, source="test"), timeline=True)
        first = [s for s in r.engine.timeline if s[0] == "cpu" and s[1].startswith("L0 ") and "call" not in s[1]][:2]
        return r.engine.cpu_busy_s, r.summary["iterations"], first

    (zero, iterations, first0), (with_call, _, first1) = host_s(0), host_s(100)
    layers = load_model("deepseek-v3").moe_layers
    assert with_call - zero == pytest.approx(iterations * layers * 100e-6)
    # on the timeline, the layer's first host expert starts one call after its activations land
    (_, _, d2h_start0, d2h0), (_, _, expert0, _) = first0
    (_, _, d2h_start1, d2h1), (_, _, expert1, _) = first1
    assert expert0 == pytest.approx(d2h_start0 + d2h0)
    assert expert1 == pytest.approx(d2h_start1 + d2h1 + 100e-6)


# ------------------------------------------------------------------------------------------------ kernels and ISAs
def test_a_kernel_the_cpu_lacks_is_refused_naming_the_field():
    m = model("int4")
    with pytest.raises(ConfigError, match=r"^system\.host_isa: amx is not an instruction set of .*epyc-9654"):
        HostCosts(m, load_hardware("l40s-2x9654"), system(host_kernel="kt-amx", host_isa="amx"))
    with pytest.raises(ConfigError, match=r"^system\.host_kernel: kernel family kt-amx needs .*core-i7-10700"):
        HostCosts(m, load_hardware("rtx3060-12gb"), system(host_kernel="kt-amx"))  # an AVX2-only CPU
    with pytest.raises(ConfigError, match=r"^system\.expert_format: kernel family kt-amx has no q4_k"):
        HostCosts(model("q4_k_m"), load_hardware(ONE_SOCKET), system(host_kernel="kt-amx", expert_format="q4_k_m"))
    with pytest.raises(ConfigError, match=r"^system\.host_kernel: unknown host kernel family"):
        system(host_kernel="no-such-kernels")
    # and at loading a run config, as one line
    cfg = {
        "model": "deepseek-v3",
        "hardware": "l40s-2x9654",
        "system": {"base": "ktransformers", "host_kernel": "kt-amx", "host_isa": "amx", "expert_format": "int4"},
        "workload": {"trace": "traces/data/synth_deepseek_v3.npz", "batch_size": 1, "prefill": False, "requests": 1},
        "predictor": "none",
        "cache": {"hpc_slots": 0, "mpc_slots": 0, "lpc_buffers": 1},
        "policy": "ktransformers",
    }
    with pytest.raises(ConfigError, match=r"^system\.host_isa: ") as info:
        config_from_dict(cfg, source="test")
    assert "\n" not in str(info.value)


def test_every_family_loads_and_the_widest_shared_isa_is_chosen():
    for name in family_names():
        fam = load_family(name)
        assert fam.calls in ("layer", "expert") and fam.call_us >= 0
    h = HostCosts(model("int4"), load_hardware(ONE_SOCKET), system(host_kernel="kt-amx", expert_format="int4"))
    assert h.isa == "amx"  # Sapphire Rapids has amx, avx512 and avx2
    h = HostCosts(model("int4"), load_hardware("l40s-2x9654"), system(host_kernel="kt-amx", expert_format="int4"))
    assert h.isa == "avx512"  # Zen 4: no AMX


@pytest.mark.parametrize(
    "name, bits, cls",
    [
        ("bf16", 16, "bf16"),
        ("fp8", 8, "fp8"),
        ("iq4_xs", 4.25, "iq"),
        ("q4_k_m", 4.85, "q4_k"),
        ("q6_k", 6.5625, "q4_k"),
        ("q8_0", 8.5, "int8"),
        ("mxfp4", 4.25, "int4"),
        (None, 16, "bf16"),
        (None, 4.5, "int4"),
    ],
)
def test_format_classes(name, bits, cls):
    assert format_class(name, bits) == cls in FORMAT_CLASSES


# ------------------------------------------------------------------------------------------------ as before
def test_systems_setting_none_of_it_price_the_host_as_before():
    """A bundled system that sets none of numa, host_kernel, host_isa prices the host as before (no HostCosts); one
    that sets any of them (ik-llama-cpp's kernels, kTransformers' lines) does, and there are both kinds."""
    plain, own = [], []
    for name in available("systems"):
        sy = load_system(name)
        sets = any(k in sy.to_dict() for k in ("numa", "host_kernel", "host_isa"))
        (own if sets else plain).append(name)
        for hw_name in ("rtx4090", TWO_SOCKETS, "gh200"):
            if sets and hw_name == "gh200":
                continue  # gh200's host names no CPU part: a kernel family cannot be priced there
            assert (CostModel(model(), load_hardware(hw_name), sy).host is None) is not sets, (name, hw_name)
    assert {"ideal", "llama-cpp", "fiddler"} <= set(plain) and "ik-llama-cpp" in own
    # one socket: every mode is today's figure (no remote reads, no cross-socket barrier)
    hw, m = load_hardware(ONE_SOCKET), model()
    before = CostModel(m, hw, system())
    for mode in NUMA_MODES:
        after = CostModel(m, hw, system(numa=mode))
        assert after.host is not None
        for n in (1, 3, 64, 1000):
            assert after.cpu_expert_s(n) == pytest.approx(before.cpu_expert_s(n), rel=1e-12)
        assert after.cpu_layer_s == 0.0


def test_system_keys_round_trip():
    sy = system(numa="numa_tp", host_kernel="kt-amx", host_isa="amx", host_threads=64)
    d = sy.to_dict()
    assert (d["numa"], d["host_kernel"], d["host_isa"]) == ("numa_tp", "kt-amx", "amx")
    assert load_system(d) == sy


def test_hardware_show_gives_a_multi_socket_host_its_numa_figures():
    from sim.hardware_cli import format_show, show

    (two,) = show(TWO_SOCKETS)
    hw = load_hardware(TWO_SOCKETS)
    assert two["numa"]["null"]["bw_gb_s"] == pytest.approx(hw.cpu_mem_bw / 1e9)
    assert two["numa"]["one_socket"]["bw_gb_s"] == pytest.approx(hw.cpu_mem_bw / 2e9)
    assert two["numa"]["replicated"]["copies"] == 2 and two["numa"]["numa_tp"]["copies"] == 1
    assert "interleaved 281.1" in format_show([two])
    (one,) = show(ONE_SOCKET)
    assert "numa" not in one
