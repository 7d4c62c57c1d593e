"""The bundled parts (configs/parts/): every part loads, every figure names a source or an assumption (checked on the
files as written, and by the loader, which refuses a figure without one), the parts issue 32 asks for are there,
and a part that is not bundled is refused with the closest names, never replaced by another."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.config.parts import (
    CPU_FIGURES,
    GPU_FIGURES,
    PARTS_DIR,
    cpu_part,
    every_part,
    gpu_part,
    load_table,
    part_names,
)
from tests.support.fuzz import fuzz_settings, names_near_the_rule

FILES = sorted(PARTS_DIR.rglob("*.yaml"))
#: A source given as a short key must be a key of the file's documents (a typo would leave the figure unsourced).
DOCUMENT_KEY = re.compile(r"[a-z0-9_]{1,12}")

#: The parts issue 32 names: consumer GPUs from the RTX 2080 to the 5090, workstation and datacenter GPUs, desktop,
#: workstation and server CPUs.
REQUIRED_GPUS = (
    "rtx2080-8gb",
    "rtx3090-24gb",
    "rtx3090ti-24gb",
    "rtx4080-16gb",
    "rtx4090-24gb",
    "rtx4090-48gb",
    "rtx5090-32gb",
    "rtx-a6000-48gb",
    "rtx-pro-6000-96gb",
    "t4-16gb",
    "l4-24gb",
    "l40s-48gb",
    "a100-40gb",
    "a100-pcie-80gb",
    "a100-sxm4-80gb",
    "h100-pcie-80gb",
    "h100-sxm-80gb",
    "h200-sxm-141gb",
)
REQUIRED_CPUS = (
    "ryzen9-7950x",
    "ryzen9-9950x",
    "core-i9-14900kf",
    "core-i9-10900x",
    "threadripper-pro-7965wx",
    "threadripper-pro-7975wx",
    "epyc-9274f",
    "epyc-9355",
    "epyc-9654",
    "xeon-6454s",
    "xeon-8452y",
    "xeon-8488c",
)


def figures_in(value, path=()):
    """(path, mapping) of every figure (a mapping holding ``value``) in a parsed part file."""
    if isinstance(value, dict):
        if "value" in value:
            yield path, value
            return
        for k, v in value.items():
            yield from figures_in(v, (*path, str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from figures_in(v, (*path, str(i)))


def bare_numbers(value, path=()):
    """Numbers outside a figure's ``value`` (keys of a table's entries, such as PCIe generations, aside)."""
    if isinstance(value, dict):
        if "value" in value:
            return
        for k, v in value.items():
            yield from bare_numbers(v, (*path, str(k)))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PARTS_DIR)))
def test_every_figure_names_a_source_or_an_assumption(path):
    data = yaml.safe_load(path.read_text())
    documents = data.get("documents") or {}
    figures = list(figures_in({k: v for k, v in data.items() if k != "documents"}))
    assert figures, path
    for where, fig in figures:
        has_source, has_assumption = bool(fig.get("source")), bool(fig.get("assumption"))
        assert has_source != has_assumption, f"{path.name}: {'.'.join(where)} needs a source or an assumption"
        text = fig.get("source") or fig.get("assumption")
        assert isinstance(text, str), (path.name, where)
        if has_source and DOCUMENT_KEY.fullmatch(text):
            assert text in documents, f"{path.name}: {'.'.join(where)} cites {text!r}, not a key of documents"
            text = documents[text]
        assert len(text.split()) >= 3, f"{path.name}: {'.'.join(where)}: {text!r} names no document or reason"
    assert not list(bare_numbers(data.get("figures", {}))), f"{path.name}: a number outside a figure"


def test_every_bundled_part_loads_with_every_figure_it_declares():
    parts = every_part()
    assert {p.name for p in parts if p.kind == "gpu"} == set(part_names("gpu"))
    for part in parts:
        specs = GPU_FIGURES if part.kind == "gpu" else CPU_FIGURES
        assert {k for k, s in specs.items() if not s.optional} <= set(part.figures), part.name
        for key, figure in part.figures.items():
            assert (figure.source is None) != (figure.assumption is None), (part.name, key)
            assert figure.origin.startswith(("source: ", "assumption: "))


def test_the_parts_issue_32_names_are_bundled():
    assert set(REQUIRED_GPUS) <= set(part_names("gpu"))
    assert set(REQUIRED_CPUS) <= set(part_names("cpu"))


def test_each_cpu_names_an_instruction_set_and_each_part_a_pcie_generation_of_the_tables():
    kernels, links = load_table("host_kernels"), load_table("links")
    for part in every_part():
        assert part.value("pcie_gen") in links.entries, part.name
        if part.kind == "cpu":
            assert part.value("isa") in kernels.entries, part.name
            assert part.value("boost_clock_ghz") >= part.value("base_clock_ghz"), part.name
    for table in ("links", "memory", "host_kernels"):
        t = load_table(table)
        for entry in t.entries.values():
            assert all((f.source is None) != (f.assumption is None) for f in entry.values())


def _copy_parts(tmp_path):
    folder = tmp_path / "parts"
    shutil.copytree(PARTS_DIR, folder)
    return folder


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda f: f.pop("source"), "needs exactly one of source"),
        (lambda f: f.update(assumption="why"), "needs exactly one of source"),
        (lambda f: f.update(value="a lot"), "must be a number"),
        (lambda f: f.update(value=1e9), "must be a number in"),
        (lambda f: f.update(origin="x"), "unknown key"),
        (lambda f: f.update(source="sepc"), "not a key of the file's documents"),
    ],
)
def test_a_figure_without_a_source_or_of_the_wrong_kind_is_refused_naming_the_file_and_figure(
    tmp_path, change, problem
):
    folder = _copy_parts(tmp_path)
    path = folder / "gpus" / "rtx4090-24gb.yaml"
    data = yaml.safe_load(path.read_text())
    change(data["figures"]["memory_bw_gb_s"])
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=problem) as exc:
        gpu_part("rtx4090-24gb", "hardware.gpu", folder)
    assert "rtx4090-24gb.yaml" in str(exc.value) and "memory_bw_gb_s" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_missing_figure_is_refused(tmp_path):
    folder = _copy_parts(tmp_path)
    path = folder / "cpus" / "epyc-9654.yaml"
    data = yaml.safe_load(path.read_text())
    del data["figures"]["memory_channels"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"figures\.memory_channels: missing"):
        cpu_part("epyc-9654", "hardware.host.cpu", folder)


@pytest.mark.parametrize(
    "kind, name, closest",
    [
        ("gpu", "rtx4090", "rtx4090-24gb"),
        ("gpu", "rtx-4090-24gb", "rtx4090-24gb"),
        ("gpu", "h200", "h200-sxm-141gb"),
        ("cpu", "epyc-9754", "epyc-9755"),
        ("cpu", "xeon-6454", "xeon-6454s"),
        ("cpu", "ryzen-7950x", "ryzen9-7950x"),
    ],
)
def test_an_unknown_part_is_refused_with_the_closest_names(kind, name, closest):
    load = gpu_part if kind == "gpu" else cpu_part
    with pytest.raises(ConfigError, match=f"unknown {kind.upper()} part") as exc:
        load(name)
    msg = str(exc.value)
    assert "closest: " in msg and closest in msg.split("closest: ")[1].split(";")[0]


@fuzz_settings(200)
@given(name=st.one_of(names_near_the_rule(["/", "..", "\n", "\x1b[2J", " ", "\x00", ".yaml"]), st.integers()))
def test_a_name_that_is_no_bundled_part_is_refused_never_replaced(name):
    for kind, load in (("gpu", gpu_part), ("cpu", cpu_part)):
        if name in part_names(kind):
            assert load(name).name == name
            continue
        with pytest.raises(ConfigError) as exc:
            load(name)
        msg = str(exc.value)
        assert "\n" not in msg and "\x1b" not in msg and len(msg) < 800
        assert msg.startswith(("hardware.gpu: ", "hardware.host.cpu: ")) and "in all: see configs/parts/" in msg


@fuzz_settings(100)
@given(name=st.sampled_from(sorted(set(part_names("gpu")) | set(part_names("cpu")))), cut=st.integers(0, 40))
def test_a_near_miss_of_a_part_lists_it_among_the_closest(name, cut):
    near = name[: cut % len(name)] + name[cut % len(name) + 1 :]  # one character dropped
    kind = "gpu" if name in part_names("gpu") else "cpu"
    if near in part_names(kind):
        return
    with pytest.raises(ConfigError) as exc:
        (gpu_part if kind == "gpu" else cpu_part)(near)
    assert name in str(exc.value).split("closest: ")[-1]
