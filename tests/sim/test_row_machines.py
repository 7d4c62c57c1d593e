"""The machine a measured row ran on (sim/row_machines.py): the bundled profile of the same parts, else one
composed from the row's parts, never another machine's host; a part that is not bundled is refused with the closest
names."""

from __future__ import annotations

import csv

import pytest

from moebase.errors import ConfigError
from moebase.profiles import available
from sim.config.hardware import load_hardware
from sim.row_machines import host_of_words, machine_of
from tests.support.paths import ROOT

#: Each published row's machine, as its v2 columns (gpu, cpu, sockets, memory, memory_gb, pcie) map it: the bundled
#: profile of the same parts (with the row's installed memory), else one composed from the parts, else (a host the
#: row does not name) the GPU's own machine.
PUBLISHED = {
    "a100-sxm4-80gb": "a100-sxm4-80gb",
    "rtx3080-mobile-16gb": "rtx3080-mobile-16gb",
    "rtx3060-12gb": "rtx3060-12gb",
    "t4-16gb": "t4-16gb",
    "fiddler-quadro-rtx6000": "quadro-rtx6000-24gb",
    "fiddler-l4": "l4-24gb",
    "kt-v0.2-4090d-1x6454s": "rtx4090d-1x6454s+1024gb",
    "kt-v0.2-4090d-2x6454s": "rtx4090d-2x6454s+1024gb",
    "kt-v0.2.1-4090-2x6454s": "rtx4090-2x6454s+1024gb",
    "kt-sosp": "rtx4080-16gb+2x-xeon-8452y+ddr5+1024gb+gen4",
    "ik": "rtx4080-16gb+1x-ryzen9-7950x+2xddr5+gen4",
}


def test_the_published_rows_run_on_the_profiles_of_their_parts():
    with open(ROOT / "benchmarks" / "published" / "rows.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 33
    for r in rows:
        want = next(v for k, v in PUBLISHED.items() if k in r["row"])
        sockets = int(r["sockets"]) if r["sockets"] else None
        memory_gb = float(r["memory_gb"]) if r["memory_gb"] else None
        got = machine_of(r["gpu"], r["cpu"] or None, sockets, r["memory"] or None, memory_gb, r["pcie"])
        assert got == want, r["row"]


@pytest.mark.parametrize(
    "host, words",
    [
        ("2x AMD EPYC 9654, 12 channels DDR5-4800 each", ("epyc-9654", 2, "12xddr5-4800")),
        ("1x Xeon Gold 6454S, 8 channels DDR5-4800", ("xeon-6454s", 1, "8xddr5-4800")),
        ("2x Intel(R) Xeon(R) Platinum 8452Y", ("xeon-8452y", 2, None)),
        ("Ryzen 9 7950X, 2x DDR5-6000", ("ryzen9-7950x", None, "2xddr5-6000")),
        ("AMD Ryzen Threadripper PRO 7965WX, DDR5-5200", ("threadripper-pro-7965wx", None, "ddr5-5200")),
        ("Intel Core i9-14900KF", ("core-i9-14900kf", None, None)),
        ("48-core Skylake (sockets and channels unspecified)", (None, None, None)),
        ("server (unspecified)", (None, None, None)),
    ],
)
def test_a_hosts_words_give_its_cpu_sockets_and_memory(host, words):
    assert host_of_words(host) == words


def test_a_row_whose_parts_no_profile_has_runs_on_a_machine_of_its_own_parts():
    name = machine_of("rtx4090-24gb", "epyc-9654", 2, "12xddr5-4800", 768, "gen4")
    assert name == "rtx4090-24gb+2x-epyc-9654+12xddr5-4800+768gb+gen4"
    hw = load_hardware(name)
    assert hw.host.cpu == "epyc-9654" and hw.cpu_cores == 192 and hw.host.memory.capacity_gb == 768
    assert hw.cpu_mem_bw > 10 * load_hardware("rtx4090").cpu_mem_bw  # not the rtx4090 profile's Ryzen
    # the v2 columns' names: an unnamed host takes the GPU's own machine, a named one its parts
    assert machine_of("t4-16gb", "unspecified-cloud-vm") == "t4-16gb"
    assert machine_of("quadro-rtx6000-24gb", "skylake-48c") == "quadro-rtx6000-24gb"
    assert machine_of("rtx4080-16gb", "ryzen9-7950x", 1, "2xDDR5", None, "gen4") == (
        "rtx4080-16gb+1x-ryzen9-7950x+2xddr5+gen4"
    )
    assert machine_of("rtx4090d-24gb", "xeon-6454s", 2, None, None, "gen4") == "rtx4090d-2x6454s"
    # the installed memory a row states rides on the bundled machine, whose figures stay its own
    stated = machine_of("rtx4090d-24gb", "xeon-6454s", 2, "8xDDR5-4800", 1024, "gen4")
    assert stated == "rtx4090d-2x6454s+1024gb"
    hw, profile = load_hardware(stated), load_hardware("rtx4090d-2x6454s")
    assert hw.host.memory.capacity_gb == 1024 and hw.cpu_mem_bw == profile.cpu_mem_bw and hw.flops == profile.flops


@pytest.mark.parametrize(
    "args, problem",
    [
        (("rtx4090-24gb", "epyc-9754", 2), "cpu 'epyc-9754' has no part in configs/parts/cpus/ (closest: epyc-9755"),
        (("rtx4091-24gb", "epyc-9654", 2), "gpu 'rtx4091-24gb' has no part in configs/parts/gpus/ (closest: rtx4"),
        (("rtx9090", None), "has no bundled machine of its own"),
        (("rtx4090-24gb", "ryzen9-7950x", 2), "sockets: is 2, but ryzen9-7950x takes at most 1"),
        (("rtx4090-24gb", "epyc-9654", 1, "12xDDR9"), "is not [CHANNELSx]TYPE[-SPEED]"),
    ],
)
def test_a_part_that_is_not_there_is_refused_never_substituted(args, problem):
    with pytest.raises(ConfigError) as exc:
        machine_of(*args, where="row 3")
    assert str(exc.value).startswith("row 3") and problem in str(exc.value), str(exc.value)


def test_no_two_bundled_machines_have_the_same_parts():
    seen = {}
    for name in available("hardware"):
        hw = load_hardware(name)
        if hw.gpu is None or hw.host is None:
            continue
        key = (hw.gpu, hw.host.cpu, hw.host.sockets, hw.host.memory, hw.link)
        assert key not in seen, f"{name} and {seen.get(key)} have the same parts"
        seen[key] = name
