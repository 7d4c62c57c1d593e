"""Bundled parts a machine is composed from: GPUs (``configs/parts/gpus/NAME.yaml``), host CPUs
(``configs/parts/cpus/NAME.yaml``), and the platform tables beside them: PCIe generations (``links.yaml``), host
memory types (``memory.yaml``) and host expert kernels by instruction set (``host_kernels.yaml``).

Every figure in these files is a mapping ``{value: V, source: S}`` or ``{value: V, assumption: A}`` (an optional
``note`` says more): ``source`` names where the value was read (a key of the file's ``documents``, which gives the
document's name and address, or a document named in words), ``assumption`` says why a value no vendor states was
chosen. A figure without either, an unknown figure or a missing one is refused on loading, naming the file and the
figure. The figures each kind holds, their units and bounds are declared in :data:`GPU_FIGURES`,
:data:`CPU_FIGURES` and the ``*_FIGURES`` tables below (``docs/hardware.md`` lists them with where each is used).

A part that is not bundled is refused with the closest names (``difflib``), never replaced by another one:
:func:`gpu_part` and :func:`cpu_part` raise ConfigError naming the field.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moebase.checks import check_mapping, join, kind_of, real, show
from moebase.errors import ConfigError
from moebase.files import CONFIG_DIR, file_status, read_structured_file

PARTS_DIR = CONFIG_DIR / "parts"
#: A part's name: lowercase letters, digits, ``.`` and ``-`` (the file's stem), at most 64 characters.
PART_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")
MAX_TEXT_CHARS = 1000  # a source, assumption, note or document
FIGURE_KEYS = ("value", "source", "assumption", "note")
#: A source this short is a key of the file's ``documents`` (a document named in words is longer).
DOCUMENT_KEY = re.compile(r"[a-z0-9_]{1,12}")
#: The kinds of part and their folders under ``configs/parts/``.
KINDS = {"gpu": "gpus", "cpu": "cpus"}
GPU_CATEGORIES = ("consumer", "laptop", "workstation", "datacenter")
CPU_CATEGORIES = ("desktop", "laptop", "workstation", "server")


@dataclass(frozen=True)
class FigureSpec:
    """What one figure of a part file holds: its type (``number``, ``integer`` or ``text``), unit, bounds and
    meaning (shown by ``sim hardware show`` and in ``docs/hardware.md``)."""

    type: str
    unit: str
    low: float
    high: float
    meaning: str
    optional: bool = False


def _n(unit: str, low: float, high: float, meaning: str, optional: bool = False) -> FigureSpec:
    return FigureSpec("number", unit, low, high, meaning, optional)


def _i(unit: str, low: int, high: int, meaning: str, optional: bool = False) -> FigureSpec:
    return FigureSpec("integer", unit, low, high, meaning, optional)


def _t(meaning: str, optional: bool = False) -> FigureSpec:
    return FigureSpec("text", "", 0, 0, meaning, optional)


GPU_FIGURES: dict[str, FigureSpec] = {
    "architecture": _t("the GPU's architecture and die"),
    "memory_gb": _n("GB", 0.5, 1e4, "GPU memory capacity (GB = 1e9 bytes as vendors state it)"),
    "memory_bw_gb_s": _n("GB/s", 1, 1e5, "GPU memory bandwidth, peak"),
    "tensor_tflops": _n(
        "TFLOP/s",
        0.1,
        1e5,
        "peak dense 16-bit tensor rate with fp32 accumulation (bf16; fp16 on GPUs without bf16), without sparsity",
    ),
    "fp32_tflops": _n("TFLOP/s", 0.1, 1e5, "peak fp32 rate of the shader cores (no tensor cores)"),
    "pcie_gen": _i("", 3, 6, "the card's PCIe generation"),
    "pcie_lanes": _i("lanes", 1, 16, "the card's PCIe lanes"),
    "tensor_efficiency": _n("", 0.01, 1, "share of tensor_tflops large GEMMs reach"),
    "fp32_efficiency": _n("", 0.01, 1, "share of fp32_tflops large fp32 GEMMs reach"),
    "launch_overhead_us": _n("us", 0, 1000, "GPU time per kernel launch"),
    "reserved_gb": _n("GB", 0, 100, "GPU memory the runtime, workspaces and display take"),
}
CPU_FIGURES: dict[str, FigureSpec] = {
    "architecture": _t("the CPU's core architecture"),
    "cores": _i("cores", 1, 1024, "physical cores per socket"),
    "base_clock_ghz": _n("GHz", 0.1, 10, "base clock"),
    "boost_clock_ghz": _n("GHz", 0.1, 10, "highest boost clock"),
    "vector_clock_ghz": _n("GHz", 0.1, 10, "all-core clock while every core runs the expert kernels"),
    "max_sockets": _i("sockets", 1, 8, "sockets a machine may have"),
    "memory_channels": _i("channels", 1, 32, "memory channels per socket"),
    "ddr4_speed_mts": _n("MT/s", 100, 20000, "rated DDR4 speed, one DIMM per channel", optional=True),
    "ddr5_speed_mts": _n("MT/s", 100, 20000, "rated DDR5 speed, one DIMM per channel", optional=True),
    "max_memory_gb": _n("GB", 1, 1e6, "largest memory per socket"),
    "pcie_gen": _i("", 3, 6, "the CPU's PCIe generation"),
    "isa": _t("the instruction set its expert kernels use: a key of configs/parts/host_kernels.yaml"),
    "memory_efficiency": _n("", 0.01, 1, "share of the peak memory bandwidth the expert kernels reach"),
    "core_bw_gb_s": _n(
        "GB/s",
        0.1,
        1000,
        "memory bandwidth one core's thread reaches alone (host bandwidth grows with threads up to the channels')",
        optional=True,
    ),
}
LINK_FIGURES: dict[str, FigureSpec] = {
    "lane_gb_s": _n("GB/s", 0.01, 1000, "raw rate of one lane, per direction, after line encoding"),
    "usable_x16_gb_s": _n("GB/s", 0.01, 1e4, "rate pinned host-to-device copies reach on 16 lanes"),
}
LINK_PLATFORM_FIGURES: dict[str, FigureSpec] = {
    "latency_us": _n("us", 0, 1e6, "fixed cost of one copy (driver call, DMA set-up)"),
}
MEMORY_TYPE_FIGURES: dict[str, FigureSpec] = {
    "channel_bytes": _i("bytes", 1, 64, "bytes one channel moves per transfer"),
}
MEMORY_PLATFORM_FIGURES: dict[str, FigureSpec] = {
    "reserved_gb": _n("GB", 0, 1e4, "host memory the system, drivers and the serving process keep for themselves"),
    "remote_bw_fraction": _n(
        "", 0.01, 1, "share of its local memory bandwidth a socket reaches reading another socket's memory"
    ),
}
ISA_FIGURES: dict[str, FigureSpec] = {
    "bf16_flops_per_cycle": _i("FLOP/cycle", 1, 100_000, "per core, for 16-bit weights"),
    "int8_ops_per_cycle": _i("op/cycle", 1, 100_000, "per core, for 8-bit weights (a multiply-add is 2)"),
    "int4_ops_per_cycle": _i("op/cycle", 1, 100_000, "per core, for 4-bit weights"),
    "usable_fraction": _n("", 0.001, 1, "share of the peak the expert kernels sustain"),
    "kernel_isas": _t("the instruction-set classes it runs, of avx2, avx512, amx (a kernel family needs one)"),
}
KERNEL_PLATFORM_FIGURES: dict[str, FigureSpec] = {
    "call_overhead_us": _n("us", 0, 1e6, "host cost of one expert call (thread-pool dispatch and join)"),
    "cross_socket_sync_us": _n(
        "us", 0, 1e6, "added to each host call whose threads span sockets (a barrier across the socket link)"
    ),
}


@dataclass(frozen=True)
class Figure:
    """One figure: its value and where it comes from (``source`` with documents expanded, or ``assumption``)."""

    value: Any
    source: str | None
    assumption: str | None
    note: str | None = None

    @property
    def origin(self) -> str:
        """``source: ...`` or ``assumption: ...``, for display."""
        return f"source: {self.source}" if self.source is not None else f"assumption: {self.assumption}"


@dataclass(frozen=True)
class Part:
    """A bundled part: its kind (``gpu`` or ``cpu``), name, vendor's model name, category and figures."""

    kind: str
    name: str
    model: str
    category: str
    figures: dict  # figure key -> Figure
    file: str = ""

    def value(self, key: str) -> Any:
        """A figure's value (None when an optional figure is absent)."""
        figure = self.figures.get(key)
        return None if figure is None else figure.value


@dataclass(frozen=True)
class Table:
    """A platform table (``links.yaml``, ``memory.yaml``, ``host_kernels.yaml``): entries by key (a PCIe
    generation, a memory type, an instruction set), each a mapping of figures, and figures of the platform."""

    name: str
    entries: dict  # entry key -> {figure key: Figure}
    figures: dict  # figure key -> Figure
    descriptions: dict  # entry key -> text
    file: str = ""

    def entry(self, key: Any, where: str, what: str) -> dict:
        """The figures of one entry; ConfigError naming ``where`` when there is none."""
        if key not in self.entries:
            known = ", ".join(str(k) for k in self.entries)
            raise ConfigError(where, f"unknown {what} {show(key)} (known: {known}; see {self.file})")
        return self.entries[key]


# --------------------------------------------------------------------------------------------- names
def part_names(kind: str, folder: Path = PARTS_DIR) -> list[str]:
    """The bundled parts of ``kind`` ("gpu" or "cpu"), sorted."""
    d = folder / KINDS[kind]
    return list(_listed(str(d), _stamp(d)))


@functools.lru_cache(maxsize=16)
def _listed(folder: str, stamp: tuple[int, int]) -> tuple[str, ...]:
    """The YAML files' stems in ``folder`` (cached by the folder's modification: adding a part changes it)."""
    d = Path(folder)
    return tuple(sorted(p.stem for p in d.glob("*.yaml"))) if d.is_dir() else ()


def closest_text(value: Any, names: list[str], see: str) -> str:
    """``closest: a, b, c; N in all: see FOLDER``, the closest of ``names`` to ``value`` by difflib (or the first
    few, when none is close)."""
    close: list[str] = []
    if isinstance(value, str) and value.strip():
        v = value.strip().lower()[:64]
        starting = [n for n in names if n.startswith(v)]  # "h200" -> h200-nvl-141gb, h200-sxm-141gb
        close = list(dict.fromkeys(starting + difflib.get_close_matches(v, names, n=3, cutoff=0.5)))[:3]
    lead = "closest" if close else "e.g."
    return f"{lead}: {', '.join(close or names[:3]) or 'none'}; {len(names)} in all: see {see}"


def _check_name(name: Any, kind: str, where: str, folder: Path) -> str:
    names = part_names(kind, folder)
    see = f"configs/parts/{KINDS[kind]}/"
    if not isinstance(name, str) or not PART_NAME.fullmatch(name) or name not in names:  # never a path: names only
        what = "unknown" if isinstance(name, str) else "must be a part name, got"
        shown = show(name)
        raise ConfigError(where, f"{what} {kind.upper()} part {shown} ({closest_text(name, names, see)})")
    return name


# --------------------------------------------------------------------------------------------- loading
def gpu_part(name: Any, where: str = "hardware.gpu", folder: Path = PARTS_DIR) -> Part:
    """The bundled GPU ``name``; ConfigError naming ``where`` with the closest names when there is none."""
    return _part("gpu", _check_name(name, "gpu", where, folder), folder)


def cpu_part(name: Any, where: str = "hardware.host.cpu", folder: Path = PARTS_DIR) -> Part:
    """The bundled host CPU ``name``; ConfigError naming ``where`` with the closest names when there is none."""
    return _part("cpu", _check_name(name, "cpu", where, folder), folder)


def _part(kind: str, name: str, folder: Path) -> Part:
    path = folder / KINDS[kind] / f"{name}.yaml"
    return _cached_part(kind, str(path), _stamp(path))


def _stamp(path: Path) -> tuple[int, int]:
    st = file_status(path)
    return (0, 0) if st is None else (st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _cached_part(kind: str, path_text: str, stamp: tuple[int, int]) -> Part:
    """A part file read and checked (cached by path and modification: sweeps compose thousands of machines)."""
    path = Path(path_text)
    shown = _shown(path)
    d = read_structured_file(path, shown, name_file=False)
    if not isinstance(d, dict):
        raise ConfigError(shown, f"must hold a mapping, got {kind_of(d)}")
    d = check_mapping(d, shown)
    _only(d, shown, ("model", "category", "documents", "figures"))
    documents = _documents(d.get("documents"), shown)
    inner = f"{shown}:"
    categories = GPU_CATEGORIES if kind == "gpu" else CPU_CATEGORIES
    model = _text(d.get("model"), f"{inner} model")
    category = d.get("category")
    if category not in categories:
        raise ConfigError(f"{inner} category", f"must be one of {', '.join(categories)}, got {show(category)}")
    specs = GPU_FIGURES if kind == "gpu" else CPU_FIGURES
    figures = _figures(d.get("figures"), f"{inner} figures", specs, documents)
    if kind == "cpu" and not any(k in figures for k in ("ddr4_speed_mts", "ddr5_speed_mts")):
        raise ConfigError(f"{inner} figures", "gives no memory speed: ddr4_speed_mts or ddr5_speed_mts")
    return Part(kind, path.stem, model, category, figures, shown)


def load_table(name: str, folder: Path = PARTS_DIR) -> Table:
    """One platform table: ``links`` (PCIe generations), ``memory`` (memory types) or ``host_kernels``
    (instruction sets), checked."""
    path = folder / f"{name}.yaml"
    return _cached_table(name, str(path), _stamp(path))


_TABLES = {
    "links": ("generations", LINK_FIGURES, LINK_PLATFORM_FIGURES),
    "memory": ("types", MEMORY_TYPE_FIGURES, MEMORY_PLATFORM_FIGURES),
    "host_kernels": ("isas", ISA_FIGURES, KERNEL_PLATFORM_FIGURES),
}


@functools.lru_cache(maxsize=16)
def _cached_table(name: str, path_text: str, stamp: tuple[int, int]) -> Table:
    path = Path(path_text)
    shown = _shown(path)
    entries_key, entry_specs, platform_specs = _TABLES[name]
    d = read_structured_file(path, shown, name_file=False)
    if not isinstance(d, dict):
        raise ConfigError(shown, f"must hold a mapping, got {kind_of(d)}")
    d = check_mapping(d, shown)
    _only(d, shown, ("documents", entries_key, "figures"))
    documents = _documents(d.get("documents"), shown)
    raw = d.get(entries_key)
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{shown}: {entries_key}", f"must be a mapping of entries, got {show(raw)}")
    entries, descriptions = {}, {}
    for key, value in raw.items():
        where = f"{shown}: {entries_key}.{key}"
        value = dict(check_mapping(value, where))
        descriptions[key] = _text(value.pop("description", str(key)), join(where, "description"))
        entries[key] = _figures(value, where, entry_specs, documents)
    figures = _figures(d.get("figures"), f"{shown}: figures", platform_specs, documents)
    return Table(name, entries, figures, descriptions, shown)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(CONFIG_DIR.parent))
    except (ValueError, OSError):
        return str(path)


def _only(d: dict, where: str, keys: tuple[str, ...]) -> None:
    for k in d:
        if k not in keys:
            raise ConfigError(f"{where}: {str(k)[:60]}", f"unknown key (known: {', '.join(keys)})")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT_CHARS or "\n" in value.strip():
        raise ConfigError(where, f"must be one line of text (at most {MAX_TEXT_CHARS} characters), got {show(value)}")
    return value.strip()


def _documents(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    d = check_mapping(value, f"{where}: documents")
    return {k: _text(v, f"{where}: documents.{k}") for k, v in d.items()}


def _figures(value: Any, where: str, specs: dict[str, FigureSpec], documents: dict[str, str]) -> dict[str, Figure]:
    """The figures of one mapping: each declared one (unless optional) present, none undeclared, each with a value
    of its type within its bounds and a source (a document key, or a document named in words) or an assumption."""
    value = {} if value is None and not any(not s.optional for s in specs.values()) else value
    d = check_mapping(value, where)
    for k in d:
        if k not in specs:
            raise ConfigError(join(where, str(k)[:60]), f"unknown figure (known: {', '.join(specs)})")
    out = {}
    for key, spec in specs.items():
        if key not in d:
            if spec.optional:
                continue
            raise ConfigError(join(where, key), "missing")
        out[key] = _figure(d[key], join(where, key), spec, documents)
    return out


def _figure(value: Any, where: str, spec: FigureSpec, documents: dict[str, str]) -> Figure:
    if not isinstance(value, dict) or "value" not in value:
        raise ConfigError(where, f"must be {{value: V, source: S}} or {{value: V, assumption: A}}, got {show(value)}")
    for k in value:
        if k not in FIGURE_KEYS:
            raise ConfigError(join(where, str(k)[:60]), f"unknown key (known: {', '.join(FIGURE_KEYS)})")
    has_source, has_assumption = value.get("source") is not None, value.get("assumption") is not None
    if has_source == has_assumption:
        raise ConfigError(where, "needs exactly one of source (where the value was read) or assumption (why chosen)")
    v = _value(value["value"], join(where, "value"), spec)
    source = None
    if has_source:
        given = _text(value["source"], join(where, "source"))
        if DOCUMENT_KEY.fullmatch(given) and given not in documents:
            raise ConfigError(join(where, "source"), f"cites {show(given)}, not a key of the file's documents")
        source = documents.get(given, given)
    assumption = _text(value["assumption"], join(where, "assumption")) if has_assumption else None
    note = _text(value["note"], join(where, "note")) if value.get("note") is not None else None
    return Figure(v, source, assumption, note)


def _value(value: Any, where: str, spec: FigureSpec) -> Any:
    if spec.type == "text":
        return _text(value, where)
    v = real(value)
    if v is None or not spec.low <= v <= spec.high or (spec.type == "integer" and not isinstance(value, int)):
        kind = "an integer" if spec.type == "integer" else "a number"
        raise ConfigError(where, f"must be {kind} in [{spec.low:g}, {spec.high:g}], got {show(value)}")
    return int(value) if spec.type == "integer" else v


def every_part(folder: Path = PARTS_DIR) -> list[Part]:
    """Every bundled part, GPUs then CPUs (each loaded and checked)."""
    return [gpu_part(n, "gpu", folder) for n in part_names("gpu", folder)] + [
        cpu_part(n, "cpu", folder) for n in part_names("cpu", folder)
    ]


__all__ = [
    "CPU_FIGURES",
    "GPU_FIGURES",
    "ISA_FIGURES",
    "KERNEL_PLATFORM_FIGURES",
    "KINDS",
    "LINK_FIGURES",
    "LINK_PLATFORM_FIGURES",
    "MEMORY_PLATFORM_FIGURES",
    "MEMORY_TYPE_FIGURES",
    "PARTS_DIR",
    "Figure",
    "FigureSpec",
    "Part",
    "Table",
    "closest_text",
    "cpu_part",
    "every_part",
    "gpu_part",
    "load_table",
    "part_names",
]
