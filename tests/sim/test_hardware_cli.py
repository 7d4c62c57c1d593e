"""`python -m sim hardware list|show NAME` (sim/hardware_cli.py): every bundled machine and part listed, one's figures
with their units and origins, an unknown name refused with the closest names (exit 2, one line); and
docs/hardware.md names every field of a hardware file and every figure of a part."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
from hypothesis import given

from moebase.fields import keys_of
from moebase.profiles import available
from sim.cli import main
from sim.config.hardware import HARDWARE_KEYS
from sim.config.machine import HostMemory, HostParts, LinkParts
from sim.config.parts import (
    CPU_FIGURES,
    GPU_FIGURES,
    ISA_FIGURES,
    KERNEL_PLATFORM_FIGURES,
    LINK_FIGURES,
    LINK_PLATFORM_FIGURES,
    MEMORY_PLATFORM_FIGURES,
    MEMORY_TYPE_FIGURES,
    part_names,
)
from tests.support.fuzz import fuzz_settings, names_near_the_rule
from tests.support.paths import ROOT


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["hardware", *args])
        except SystemExit as exc:  # argparse's own refusals (a name that reads as an option: "-A")
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_list_names_every_machine_and_part():
    code, out, err = run("list")
    assert code == 0 and not err
    names = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.split()}
    assert set(available("hardware")) | set(part_names("gpu")) | set(part_names("cpu")) <= names
    assert "rtx4090              rtx4090-24gb         1x ryzen9-7950x" in out
    code, out, _ = run("list", "--json")
    d = json.loads(out)
    assert code == 0 and {m["name"] for m in d["machines"]} == set(available("hardware"))
    assert {g["name"] for g in d["gpus"]} == set(part_names("gpu"))
    assert all(c["isa"] for c in d["cpus"])


def test_show_a_machine_gives_each_figure_its_origin():
    code, out, _ = run("show", "rtx4090")
    assert code == 0
    assert "gpu: rtx4090-24gb" in out and '"cpu": "ryzen9-7950x"' in out
    assert re.search(r"flops_tflops\s+130\s+TFLOP/s\s+set by the profile \(its parts give 132.16\)", out)
    assert re.search(r"d2d_bw_gb_s\s+504\s+GB/s\s+the default", out)
    code, out, _ = run("show", "rtx4090-24gb+2x-epyc-9654+gen4", "--json")
    (item,) = json.loads(out)
    by = {f["key"]: f for f in item["figures"]}
    assert code == 0 and item["kind"] == "machine" and by["cpu_cores"]["value"] == 192
    assert by["cpu_mem_bw_gb_s"]["origin"].startswith("from its parts: 2 socket(s) x 12 channels x 4800 MT/s")
    assert {f["key"] for f in item["figures"]} | {
        "name",
        "source",
        "tables",
        "base",
        "gpu",
        "gpu_count",
        "host",
        "link",
    } == set(HARDWARE_KEYS)


def test_show_a_part_gives_each_figure_its_source_or_assumption():
    code, out, _ = run("show", "epyc-9654")
    assert code == 0 and out.startswith("CPU part epyc-9654: AMD EPYC 9654 (server;")
    assert "  cores = 96 cores: physical cores per socket\n      source: AMD EPYC 9654 product page" in out
    assert "memory_efficiency = 0.75: " in out and "assumption: ~75%" in out
    code, out, _ = run("show", "a100-sxm4-80gb", "--json")
    kinds = [i["kind"] for i in json.loads(out)]
    assert code == 0 and kinds == ["machine", "gpu"]  # a machine and a part of that name: both shown


@pytest.mark.parametrize(
    "args, problem",
    [
        (("show", "rtx4091"), "unknown machine or part 'rtx4091' (closest: rtx4090"),
        (("show", "epyc-9754"), "(closest: epyc-9755"),
        (("show", "\x1b[2Jx"), "unknown machine or part"),
        (("show",), "missing: hardware show NAME"),
        (("list", "h200"), "hardware list takes no name"),
        (("show", "rtx4090-24gb+2x-epyc-9999"), "unknown CPU part 'epyc-9999'"),
        (("show", "no/such.yaml"), "no such hardware file"),
    ],
)
def test_a_bad_name_exits_2_with_one_line(args, problem):
    code, out, err = run(*args)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert problem in err and "\x1b" not in err


def test_docs_name_every_field_and_figure():
    doc = (ROOT / "docs" / "hardware.md").read_text()
    keys = [k for k in HARDWARE_KEYS]
    keys += [f"host.{k}" for k in keys_of(HostParts) if k != "memory"]
    keys += [f"host.memory.{k}" for k in keys_of(HostMemory)] + [f"link.{k}" for k in keys_of(LinkParts)]
    for table in (
        GPU_FIGURES,
        CPU_FIGURES,
        LINK_FIGURES,
        LINK_PLATFORM_FIGURES,
        MEMORY_TYPE_FIGURES,
        MEMORY_PLATFORM_FIGURES,
        ISA_FIGURES,
        KERNEL_PLATFORM_FIGURES,
    ):
        keys += list(table)
    missing = [k for k in keys if f"`{k}`" not in doc]
    assert not missing, f"docs/hardware.md does not name {missing}"


@fuzz_settings(80)
@given(name=names_near_the_rule(["/", "+", "..", "\n", "\x1b[2J", " ", ".yaml", "\x00"]))
def test_any_name_shows_a_machine_or_part_or_exits_2_on_one_line(name):
    known = set(available("hardware")) | set(part_names("gpu")) | set(part_names("cpu"))
    code, out, err = run("show", name)
    if name.strip() in known:
        assert code == 0 and out
        return
    assert code == 2 and not out and len(err.strip().splitlines()) == 1 and "\x1b" not in err
