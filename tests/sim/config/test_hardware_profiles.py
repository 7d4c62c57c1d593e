"""Every hardware profile under configs/hardware/ loads, and every figure in it is sourced or labelled an assumption
in a comment beside it or just above it, so that a reader can tell a measured or published figure from a guess.

The rule, fitted to the profiles as they are: a numeric ``key: value`` line is covered by its own inline comment, or
else by the comments it shares a short group with (full comment lines, or inline comments on field lines, at most
three lines above it with only field lines between); the covering text must name a source (datasheet, whitepaper,
paper, vendor, a section of docs/, another profile or document) or say "assumption". ``KNOWN_GAPS`` lists the older
profiles' figures whose comments explain them without either (reported, not edited here); no other figure may lack
one. The group reach lets a bare line lean on a neighbour's comment, as some older profiles' ``cpu_cores`` lines do;
the profiles of the machines in published results (``RESULT_MACHINES``) keep the stricter form, a comment of each
figure's own."""

from __future__ import annotations

import re

import pytest
import yaml

from moebase.profiles import available
from sim.config.hardware import load_hardware
from tests.support.paths import ROOT

HARDWARE = ROOT / "configs" / "hardware"
FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):\s*([^#\s][^#]*?)\s*(?:#\s*(.*))?$")
REACH = 3  # field lines a comment block covers below it
SOURCE_OR_ASSUMPTION = re.compile(
    r"assum|datasheet|whitepaper|architecture\.md \d|paper|spec|measured|SOSP|guide|study|teardown|brief|product page|"
    r"announcement|tutorial|\.md\b|\.yaml\b|#\d+|Intel|AMD|NVIDIA|kTransformers",
    re.I,
)
#: Figures of the older profiles whose comments explain them but name no source and say no "assumption" (file, key).
KNOWN_GAPS = {
    ("a100-pcie.yaml", "launch_overhead_us"),
    ("a100-pcie.yaml", "reserved_gb"),
    ("gh200.yaml", "pcie_latency_us"),
    ("gh200.yaml", "launch_overhead_us"),
    ("gh200.yaml", "reserved_gb"),
    ("h100-pcie.yaml", "launch_overhead_us"),
    ("h100-pcie.yaml", "reserved_gb"),
    ("h200.yaml", "pcie_latency_us"),
    ("h200.yaml", "launch_overhead_us"),
    ("h200.yaml", "reserved_gb"),
    ("rtx4090.yaml", "launch_overhead_us"),
}
#: The profiles of the machines in the published results (``published/rows.csv``'s systems run on them).
RESULT_MACHINES = (
    "a100-sxm4-80gb",
    "rtx3080-mobile-16gb",
    "rtx3060-12gb",
    "t4-16gb",
    "quadro-rtx6000-24gb",
    "l4-24gb",
    "rtx4090d-1x6454s",
    "rtx4090d-2x6454s",
    "rtx4090-1x6454s",
    "rtx4090-2x6454s",
    "l40s-2x9654",
)
FILES = sorted(HARDWARE.glob("*.yaml"))


def _is_number(text: str) -> bool:
    value = yaml.safe_load(text)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numeric_fields(lines: list[str]) -> list[tuple[int, str]]:
    """(line index, key) of every top-level ``key: number`` line."""
    out = []
    for i, line in enumerate(lines):
        m = FIELD.match(line)
        if m and _is_number(m.group(2)):
            out.append((i, m.group(1)))
    return out


def covering_comment(lines: list[str], i: int) -> str | None:
    """The comment text that covers the field on line ``i`` (see the module's rule), or None."""
    own = FIELD.match(lines[i]).group(3)
    if own:
        return own
    texts, j = [], i - 1
    while j >= 0 and i - j <= REACH and FIELD.match(lines[j]):
        if FIELD.match(lines[j]).group(3):
            texts.append(FIELD.match(lines[j]).group(3))
        j -= 1
    if j >= 0 and i - j <= REACH and lines[j].lstrip().startswith("#"):
        block = []
        while j >= 0 and lines[j].lstrip().startswith("#"):
            block.append(lines[j].lstrip("# ").strip())
            j -= 1
        texts.append(" ".join(reversed(block)))
    return " ".join(texts) or None


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_profile_loads_under_its_file_name(path):
    h = load_hardware(path.stem)
    assert h.name == path.stem and h.source == f"configs/hardware/{path.name}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_figure_is_sourced_or_an_assumption(path):
    lines = path.read_text().splitlines()
    fields = numeric_fields(lines)
    data = yaml.safe_load(path.read_text())
    # the line parser sees every numeric figure the YAML holds (none hides in a form it does not read)
    assert {k for _, k in fields} == {
        k for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    uncovered = [lines[i] for i, _ in fields if covering_comment(lines, i) is None]
    assert not uncovered, f"{path.name}: figures without a comment beside or just above them: {uncovered}"
    unsourced = {(path.name, k) for i, k in fields if not SOURCE_OR_ASSUMPTION.search(covering_comment(lines, i))}
    assert unsourced <= KNOWN_GAPS, f"neither sourced nor labelled an assumption: {sorted(unsourced - KNOWN_GAPS)}"


@pytest.mark.parametrize("name", RESULT_MACHINES)
def test_the_result_machines_comment_every_figure_on_its_own(name):
    """The stricter form these profiles keep: each figure has its own inline comment or a comment block directly
    above it (no figure leans on a neighbour's comment), which names a source or says "assumption"."""
    lines = (HARDWARE / f"{name}.yaml").read_text().splitlines()
    for i, key in numeric_fields(lines):
        assert FIELD.match(lines[i]).group(3) or lines[i - 1].lstrip().startswith("#"), (name, key)
        assert SOURCE_OR_ASSUMPTION.search(covering_comment(lines, i)), (name, key)


def test_the_rule_catches_a_bare_figure():
    lines = [
        "# Datasheet capacity.",
        "gpu_memory_gb: 24",
        "hbm_bw_gb_s: 300",
        "flops_tflops: 97",
        "flops_fp32_tflops: 27",
        "pcie_bw_gb_s: 12  # a figure",
        "name: x",
    ]
    assert [k for _, k in numeric_fields(lines)] == [
        "gpu_memory_gb",
        "hbm_bw_gb_s",
        "flops_tflops",
        "flops_fp32_tflops",
        "pcie_bw_gb_s",
    ]
    assert covering_comment(lines, 1) == covering_comment(lines, 3) == "Datasheet capacity."
    assert covering_comment(lines, 4) is None  # four lines below the comment: out of reach
    assert covering_comment(lines, 5) == "a figure" and not SOURCE_OR_ASSUMPTION.search("a figure")


def test_the_result_machines_have_profiles():
    assert set(RESULT_MACHINES) <= set(available("hardware"))
    gen3 = {"rtx3060-12gb", "t4-16gb", "quadro-rtx6000-24gb", "l4-24gb"}
    for name in RESULT_MACHINES:
        assert load_hardware(name).pcie_bw == (12e9 if name in gen3 else 25e9)
    d, r = load_hardware("rtx4090d-1x6454s"), load_hardware("rtx4090-1x6454s")
    assert d.flops < r.flops and d.flops_fp32 < r.flops_fp32  # fewer SMs (114 of 128)
    assert (d.hbm_bw, d.gpu_memory_bytes) == (r.hbm_bw, r.gpu_memory_bytes)
    for gpu in ("rtx4090", "rtx4090d"):
        one, two = load_hardware(f"{gpu}-1x6454s"), load_hardware(f"{gpu}-2x6454s")
        assert two.cpu_cores == 2 * one.cpu_cores == 64
        assert two.cpu_bf16_flops == 2 * one.cpu_bf16_flops and two.cpu_mem_bw == pytest.approx(
            2 * one.cpu_mem_bw, rel=0.01
        )
        assert (two.flops, two.hbm_bw) == (one.flops, one.hbm_bw)
