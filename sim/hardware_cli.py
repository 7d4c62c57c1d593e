"""`python -m sim hardware list [--json]` and `python -m sim hardware show NAME [--json]`: the bundled machines
(``configs/hardware/``) and parts (``configs/parts/gpus/``, ``configs/parts/cpus/``) a run config's ``hardware`` can
name, and every figure of one of them with its unit and where it comes from.

``show`` takes a bundled machine, a GPU or CPU part, a machine named by its parts (``rtx4090-24gb+2x-epyc-9654``) or
a hardware file's path. For a machine it prints its parts and each figure of the :class:`HardwareSpec` with its
origin: derived from the parts (and how), set by the profile (with what the parts would give), or the default; for a
part, each figure with its source or the assumption behind it. A name that is none of these exits 2 with the
closest names (``difflib``), never another machine's figures. The fields: ``docs/hardware.md``.
"""

from __future__ import annotations

import json
from typing import Any

from moebase.errors import ConfigError
from moebase.profiles import available, is_path, load_profile
from sim.config.hardware import HARDWARE_KEYS, load_hardware
from sim.config.machine import derived_figures, is_parts_name, merge_hardware, parse_parts_name, resolve
from sim.config.parts import CPU_FIGURES, GPU_FIGURES, Part, closest_text, cpu_part, gpu_part, part_names

#: The unit of a hardware file key, by how the key ends (docs/hardware.md has each key's).
UNITS = (
    ("_gb_s", "GB/s"),
    ("_gb", "GB"),
    ("_tflops", "TFLOP/s"),
    ("_tops", "TOP/s"),
    ("_us", "us"),
    ("_slowdown", "x"),
    ("cpu_cores", "cores"),
)
#: The figures ``show`` lists for a machine, in the hardware file's order (not the composition nor the tables).
FIGURE_KEYS = tuple(
    k for k in HARDWARE_KEYS if k not in ("base", "name", "source", "tables", "gpu", "gpu_count", "host", "link")
)
SEE = "python -m sim hardware list"


def unit_of(key: str) -> str:
    return next((unit for end, unit in UNITS if key.endswith(end)), "")


# --------------------------------------------------------------------------------------------- list
def machine_row(name: str) -> dict:
    """One bundled machine: its name, parts (None where it names none) and a few figures."""
    hw = load_hardware(name)
    host = hw.host
    memory = None if host is None else host.memory
    return {
        "name": name,
        "gpu": hw.gpu,
        "host": None if host is None else f"{host.sockets}x {host.cpu}",
        "memory": None if memory is None else f"{memory.channels}x {memory.type}-{memory.speed_mts:g}",
        "link": None if hw.link is None else f"gen{hw.link.pcie_gen} x{hw.link.lanes}",
        "gpu_memory_gb": hw.gpu_memory_bytes / 1e9,
        "pcie_bw_gb_s": hw.pcie_bw / 1e9,
        "cpu_mem_bw_gb_s": hw.cpu_mem_bw / 1e9,
    }


def part_row(part: Part) -> dict:
    """One part: its name, model, category and every figure's value."""
    return {
        "name": part.name,
        "model": part.model,
        "category": part.category,
        **{k: f.value for k, f in part.figures.items()},
    }


def listing() -> dict:
    return {
        "machines": [machine_row(n) for n in available("hardware")],
        "gpus": [part_row(gpu_part(n)) for n in part_names("gpu")],
        "cpus": [part_row(cpu_part(n)) for n in part_names("cpu")],
    }


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(head)]
    out = ["  " + "".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    out += ["  " + "".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return out


def format_listing(d: dict) -> str:
    lines = [f"machines ({len(d['machines'])}): hardware: NAME in a run config (configs/hardware/)"]
    lines += _table(
        ["name", "GPU", "host", "memory per socket", "link", "GPU GB", "link GB/s", "host GB/s"],
        [
            [
                m["name"],
                m["gpu"] or "-",
                m["host"] or "-",
                m["memory"] or "-",
                m["link"] or "-",
                f"{m['gpu_memory_gb']:g}",
                f"{m['pcie_bw_gb_s']:g}",
                f"{m['cpu_mem_bw_gb_s']:g}",
            ]
            for m in d["machines"]
        ],
    )
    lines += ["", f"GPU parts ({len(d['gpus'])}): hardware.gpu (configs/parts/gpus/)"]
    lines += _table(
        ["name", "model", "memory GB", "GB/s", "16-bit TFLOP/s", "PCIe"],
        [
            [
                g["name"],
                g["model"],
                f"{g['memory_gb']:g}",
                f"{g['memory_bw_gb_s']:g}",
                f"{g['tensor_tflops']:g}",
                f"gen{g['pcie_gen']} x{g['pcie_lanes']}",
            ]
            for g in d["gpus"]
        ],
    )
    lines += ["", f"CPU parts ({len(d['cpus'])}): hardware.host.cpu (configs/parts/cpus/)"]
    lines += _table(
        ["name", "model", "cores", "memory per socket", "sockets", "kernels"],
        [
            [
                c["name"],
                c["model"],
                str(c["cores"]),
                f"{c['memory_channels']}x " + "/".join(_memory_speeds(c)),
                f"<={c['max_sockets']}",
                c["isa"],
            ]
            for c in d["cpus"]
        ],
    )
    lines += [
        "",
        "A machine from parts: hardware: {gpu: GPU, host: {cpu: CPU, sockets: N}, link: {pcie_gen: G}}, or the one "
        "string GPU+Nx-CPU+genG;",
        "python -m sim hardware show NAME lists every figure and where it comes from (docs/hardware.md).",
    ]
    return "\n".join(lines)


def _memory_speeds(c: dict) -> list[str]:
    return [f"{t}-{c[f'{t}_speed_mts']:g}" for t in ("ddr5", "ddr4") if c.get(f"{t}_speed_mts") is not None]


# --------------------------------------------------------------------------------------------- show
def _raw_machine(ref: Any) -> dict:
    """The hardware mapping as written (base merged, before its parts fill anything in)."""
    if is_parts_name(ref):
        return parse_parts_name(ref, "NAME")
    d, _ = load_profile(ref, "NAME", "hardware", HARDWARE_KEYS, merge=merge_hardware)
    return d


def show_machine(ref: str) -> dict:
    """A machine's parts and every figure with its value, unit and origin."""
    hw = load_hardware(ref, "NAME")
    raw = _raw_machine(ref)
    comp = resolve(raw, "NAME")
    derived = {} if comp is None else derived_figures(comp)
    plain = hw.to_dict()
    figures = []
    for key in FIGURE_KEYS:
        value = plain[key]
        if key in raw and raw[key] is not None:
            origin = "set by the profile"
            if key in derived and derived[key][0] != value:
                origin += f" (its parts give {derived[key][0]:g})"
        elif key in derived:
            origin = f"from its parts: {derived[key][1]}"
        else:
            origin = "the default (sim/config/hardware.py)"
        figures.append({"key": key, "value": value, "unit": unit_of(key), "origin": origin})
    out = {
        "kind": "machine",
        "name": hw.name,
        "source": hw.source,
        "parts": {k: plain[k] for k in ("gpu", "gpu_count", "host", "link") if k in plain},
        "tables": hw.tables is not None,
        "figures": figures,
    }
    if hw.host is not None and hw.host.sockets > 1:
        out["numa"] = numa_figures(hw)
    return out


def numa_figures(hw: Any) -> dict:
    """A multi-socket host's bandwidth (GB/s) under each NUMA mode a system may choose (``system.numa``; null: the
    profile's figure) and the copies of each expert it keeps (sim/costs/host_costs.py)."""
    from sim.config.parts import load_table
    from sim.config.system import NUMA_MODES
    from sim.costs.host_costs import numa_bandwidth

    remote = float(load_table("memory").figures["remote_bw_fraction"].value)
    s = hw.host.sockets
    return {
        "null" if mode is None else mode: {
            "bw_gb_s": numa_bandwidth(hw.cpu_mem_bw, s, mode, remote) / 1e9,
            "copies": s if mode == "replicated" else 1,
        }
        for mode in (None, *NUMA_MODES)
    }


def show_part(part: Part) -> dict:
    specs = GPU_FIGURES if part.kind == "gpu" else CPU_FIGURES
    return {
        "kind": part.kind,
        "name": part.name,
        "model": part.model,
        "category": part.category,
        "file": part.file,
        "figures": [
            {
                "key": k,
                "value": f.value,
                "unit": specs[k].unit,
                "meaning": specs[k].meaning,
                "source": f.source,
                "assumption": f.assumption,
                "note": f.note,
            }
            for k, f in part.figures.items()
        ],
    }


def show(name: str) -> list[dict]:
    """Everything ``name`` stands for: a machine (bundled, a path, or named by its parts) and/or a GPU or CPU part.
    ConfigError with the closest names when it is none."""
    name = name.strip()
    if is_path(name) or is_parts_name(name):
        return [show_machine(name)]
    found = []
    if name in available("hardware"):
        found.append(show_machine(name))
    if name in part_names("gpu"):
        found.append(show_part(gpu_part(name)))
    if name in part_names("cpu"):
        found.append(show_part(cpu_part(name)))
    if not found:
        names = sorted(set(available("hardware")) | set(part_names("gpu")) | set(part_names("cpu")))
        raise ConfigError("NAME", f"unknown machine or part {name[:60]!r} ({closest_text(name, names, SEE)})")
    return found


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def format_show(items: list[dict]) -> str:
    blocks = []
    for item in items:
        if item["kind"] == "machine":
            lines = [f"machine {item['name']} ({item['source']})"]
            parts = item["parts"]
            if parts:
                for key, value in parts.items():
                    lines.append(f"  {key}: {json.dumps(value) if isinstance(value, dict) else value}")
            else:
                lines.append("  names no parts: every figure is its file's")
            if item["tables"]:
                lines.append("  tables: measured (a calibration's; they replace the roofline)")
            lines += _table(
                ["figure", "value", "unit", "origin"],
                [[f["key"], _value(f["value"]), f["unit"] or "-", f["origin"]] for f in item["figures"]],
            )
            if "numa" in item:
                shown = ", ".join(
                    f"{m} {v['bw_gb_s']:.4g}" + (f" ({v['copies']} copies)" if v["copies"] > 1 else "")
                    for m, v in item["numa"].items()
                )
                lines.append(f"  host GB/s by a system's numa (docs/hardware.md): {shown}")
        else:
            kind = "GPU" if item["kind"] == "gpu" else "CPU"
            lines = [f"{kind} part {item['name']}: {item['model']} ({item['category']}; {item['file']})"]
            for f in item["figures"]:
                unit = f" {f['unit']}" if f["unit"] else ""
                origin = f"source: {f['source']}" if f["source"] is not None else f"assumption: {f['assumption']}"
                note = f" [{f['note']}]" if f["note"] else ""
                lines.append(f"  {f['key']} = {_value(f['value'])}{unit}: {f['meaning']}")
                lines.append(f"      {origin}{note}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


# --------------------------------------------------------------------------------------------- command
def cmd_hardware(args) -> int:
    if args.action == "list":
        if args.name is not None:
            raise ConfigError("NAME", "hardware list takes no name (hardware show NAME)")
        d = listing()
        print(json.dumps(d, indent=1) if args.json else format_listing(d))
        return 0
    if args.name is None:
        raise ConfigError("NAME", f"missing: hardware show NAME (a machine or part of {SEE})")
    items = show(args.name)
    print(json.dumps(items, indent=1) if args.json else format_show(items))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "hardware",
        help="list the bundled machines and parts, or show one's figures and their sources",
        description="List the bundled machines (configs/hardware/) and parts (configs/parts/gpus/, cpus/) a run "
        "config's hardware can name, or show every figure of one, with its unit and where it comes from "
        "(a source, an assumption, derived from parts, the default). Fields: docs/hardware.md.",
    )
    p.add_argument("action", choices=("list", "show"), help="list: every machine and part; show NAME: one of them")
    p.add_argument(
        "name",
        nargs="?",
        help="for show: a bundled machine, a GPU or CPU part, a machine named by its parts "
        "(GPU+Nx-CPU+genG) or a hardware file's path",
    )
    p.add_argument("--json", action="store_true", help="print the listing or the figures as JSON")
    p.set_defaults(func=cmd_hardware)


__all__ = ["cmd_hardware", "format_listing", "format_show", "listing", "register", "show", "unit_of"]
