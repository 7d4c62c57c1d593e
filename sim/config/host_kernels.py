"""Host expert kernel families: the software that computes routed experts on the host CPU (llama.cpp's ggml-cpu
kernels, ik_llama.cpp's, kTransformers' llamafile (v0.2) and AMX (v0.3, kt-kernel) kernels), one file each in
``configs/kernels/NAME.yaml``, named by a system profile's ``host_kernel``.

A family gives, for each instruction-set class it has kernels for (:data:`ISA_CLASSES`: ``avx2``, ``avx512``,
``amx``) and each weight-format class (:data:`FORMAT_CLASSES`: ``bf16``, ``int8``, ``int4``, ``q4_k`` (llama.cpp's
k-quants), ``iq`` (the i-quants), ``fp8``), two software constants:

- ``FORMAT_ops_per_cycle``: the multiply-add work (a multiply-add is 2 ops) one core sustains per cycle over
  weights of that format, de-quantization included (the host's compute rate is threads x the CPU's
  ``vector_clock_ghz`` x this);
- ``FORMAT_bw_fraction``: the share of the host's usable memory bandwidth the kernel reaches when it only streams
  weights (a decode step).

A class may also give ``min_tokens``: the tokens one expert must have for that path to be taken (AMX tiles hold 16
rows: kTransformers takes its AMX path for prefill and its AVX-512 path for a few tokens); below it the family's
next class down computes. At family level: ``calls`` (``layer``: one call computes all of a MoE layer's host experts,
as ggml's ``MUL_MAT_ID`` and kTransformers' MoE operator do; ``expert``: one call per expert, as a Python loop over
experts does) and ``call_us`` (the fixed cost of one call: waking the thread pool, splitting the work, joining).

Every figure is ``{value, source}`` or ``{value, assumption}`` as in the parts files (:mod:`sim.config.parts`).

Which classes a CPU has: its part's ``isa`` (``configs/parts/cpus/``) is an entry of ``configs/parts/host_kernels.yaml``
whose ``kernel_isas`` lists the classes it runs (``amx avx512 avx2`` on Sapphire Rapids). A family none of whose
classes the CPU has, a ``host_isa`` the CPU or the family lacks, or a format the family has no kernel for, is refused
with one line naming the field (:func:`choose_isa`, :func:`kernel_for`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moebase.checks import check_mapping, kind_of, known_text, show
from moebase.errors import ConfigError
from moebase.files import CONFIG_DIR, read_structured_file
from sim.config.parts import Figure, FigureSpec, _documents, _figures, _only, _stamp, _text

KERNELS_DIR = CONFIG_DIR / "kernels"
#: Instruction-set classes, narrowest first.
ISA_CLASSES = ("avx2", "avx512", "amx")
#: Weight-format classes a family gives figures for.
FORMAT_CLASSES = ("bf16", "int8", "int4", "q4_k", "iq", "fp8")
CALLS = ("layer", "expert")


def _class_specs() -> dict[str, FigureSpec]:
    specs: dict[str, FigureSpec] = {
        "min_tokens": FigureSpec(
            "integer", "tokens", 1, 100_000, "tokens per expert from which this path is taken", True
        )
    }
    for f in FORMAT_CLASSES:
        specs[f"{f}_ops_per_cycle"] = FigureSpec(
            "number", "op/cycle", 0.01, 100_000, f"per core per cycle over {f} weights (a multiply-add is 2)", True
        )
        specs[f"{f}_bw_fraction"] = FigureSpec(
            "number", "", 0.01, 1.0, f"share of the host's usable bandwidth a decode over {f} weights reaches", True
        )
    return specs


CLASS_FIGURES = _class_specs()
FAMILY_FIGURES: dict[str, FigureSpec] = {
    "call_us": FigureSpec("number", "us", 0, 1e6, "fixed cost of one host call (thread-pool wake, split, join)"),
}


@dataclass(frozen=True)
class KernelFamily:
    """One family: how it calls (per layer or per expert), a call's cost, and per ISA class its figures."""

    name: str
    description: str
    calls: str
    figures: dict  # family figures: key -> Figure
    classes: dict  # ISA class -> {figure key: Figure}
    file: str

    @property
    def call_us(self) -> float:
        return float(self.figures["call_us"].value)

    def has(self, isa: str, fmt: str) -> bool:
        return isa in self.classes and f"{fmt}_ops_per_cycle" in self.classes[isa]

    def ops_per_cycle(self, isa: str, fmt: str) -> float:
        return float(self.classes[isa][f"{fmt}_ops_per_cycle"].value)

    def bw_fraction(self, isa: str, fmt: str) -> float:
        figure = self.classes[isa].get(f"{fmt}_bw_fraction")
        return 1.0 if figure is None else float(figure.value)

    def min_tokens(self, isa: str) -> int:
        figure = self.classes[isa].get("min_tokens")
        return 1 if figure is None else int(figure.value)


def family_names(folder: Path = KERNELS_DIR) -> list[str]:
    """The bundled kernel families, sorted."""
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def load_family(name: Any, where: str = "system.host_kernel", folder: Path = KERNELS_DIR) -> KernelFamily:
    """The bundled family ``name``; ConfigError naming ``where`` (with the known names) when there is none."""
    names = family_names(folder)
    if not isinstance(name, str) or name not in names:
        raise ConfigError(
            where, f"unknown host kernel family {show(name)} ({known_text(name, names, 'configs/kernels/')})"
        )
    path = folder / f"{name}.yaml"
    return _cached_family(str(path), _stamp(path))


@functools.lru_cache(maxsize=32)
def _cached_family(path_text: str, stamp: tuple[int, int]) -> KernelFamily:
    path = Path(path_text)
    shown = f"configs/kernels/{path.name}"
    d = read_structured_file(path, shown, name_file=False)
    if not isinstance(d, dict):
        raise ConfigError(shown, f"must hold a mapping, got {kind_of(d)}")
    d = check_mapping(d, shown)
    _only(d, shown, ("description", "documents", "calls", "figures", "isas"))
    documents = _documents(d.get("documents"), shown)
    description = _text(d.get("description"), f"{shown}: description")
    calls = d.get("calls")
    if calls not in CALLS:
        raise ConfigError(f"{shown}: calls", f"must be one of {', '.join(CALLS)}, got {show(calls)}")
    figures = _figures(d.get("figures"), f"{shown}: figures", FAMILY_FIGURES, documents)
    raw = check_mapping(d.get("isas"), f"{shown}: isas")
    if not raw:
        raise ConfigError(f"{shown}: isas", "must name at least one instruction-set class")
    classes: dict[str, dict[str, Figure]] = {}
    for isa, value in raw.items():
        if isa not in ISA_CLASSES:
            raise ConfigError(f"{shown}: isas.{str(isa)[:60]}", f"unknown class (known: {', '.join(ISA_CLASSES)})")
        classes[isa] = _figures(value, f"{shown}: isas.{isa}", CLASS_FIGURES, documents)
        if not any(k.endswith("_ops_per_cycle") for k in classes[isa]):
            raise ConfigError(f"{shown}: isas.{isa}", "gives no FORMAT_ops_per_cycle")
    return KernelFamily(path.stem, description, calls, figures, classes, shown)


# --------------------------------------------------------------------------------------------- formats
_KQUANT = re.compile(r"q[2-8]_k(?:_[a-z0-9]+)?")


def format_class(name: str | None, bits: float) -> str:
    """The class of a weight format (:data:`FORMAT_CLASSES`): by its name where it says (``iq4_xs`` -> iq, ``q4_k_m``
    -> q4_k, ``fp8`` -> fp8, ``q8_0``/``int8`` -> int8, ``bf16``/``fp16``/``fp32`` -> bf16), else by its width (at
    most 5 bits per weight -> int4, at most 9 -> int8, wider -> bf16)."""
    n = (name or "").strip().lower()
    if n in ("bf16", "fp16", "fp32"):
        return "bf16"
    if n.startswith("fp8"):
        return "fp8"
    if n.startswith("iq"):
        return "iq"
    if _KQUANT.fullmatch(n):
        return "q4_k"
    if n in ("int8", "q8_0"):
        return "int8"
    if bits <= 5.0:
        return "int4"
    if bits <= 9.0:
        return "int8"
    return "bf16"


# --------------------------------------------------------------------------------------------- the CPU's classes
def cpu_isa_classes(isa_entry: dict, where: str) -> tuple[str, ...]:
    """The classes a CPU's ISA entry (of ``configs/parts/host_kernels.yaml``) runs, from its ``kernel_isas``."""
    words = str(isa_entry["kernel_isas"].value).split()
    bad = [w for w in words if w not in ISA_CLASSES]
    if bad or not words:
        raise ConfigError(where, f"kernel_isas must list classes of {', '.join(ISA_CLASSES)}, got {show(words)}")
    return tuple(c for c in ISA_CLASSES if c in words)


def check_cpu_isa(wanted: str, cpu_classes: tuple[str, ...], cpu_name: str) -> None:
    """ConfigError naming ``system.host_isa`` when the host's CPU lacks the instruction set ``wanted``."""
    if wanted not in cpu_classes:
        raise ConfigError(
            "system.host_isa",
            f"{wanted} is not an instruction set of the host's CPU {cpu_name} (it has {' '.join(cpu_classes)}: "
            f"configs/parts/cpus/{cpu_name}.yaml figures.isa)",
        )


def choose_isa(family: KernelFamily, cpu_classes: tuple[str, ...], cpu_name: str, wanted: str | None) -> str:
    """The ISA class the family computes with on this CPU: ``wanted`` (the system's ``host_isa``) when given, else
    the widest class both have. ConfigError naming ``system.host_isa`` or ``system.host_kernel`` when there is none."""
    if wanted is not None:
        check_cpu_isa(wanted, cpu_classes, cpu_name)
        if wanted not in family.classes:
            raise ConfigError(
                "system.host_isa",
                f"kernel family {family.name} has no {wanted} kernels (it has {' '.join(family.classes)}: "
                f"{family.file})",
            )
        return wanted
    shared = [c for c in ISA_CLASSES if c in cpu_classes and c in family.classes]
    if not shared:
        raise ConfigError(
            "system.host_kernel",
            f"kernel family {family.name} needs {' or '.join(family.classes)}, which the host's CPU {cpu_name} lacks "
            f"(it has {' '.join(cpu_classes)}: configs/parts/cpus/{cpu_name}.yaml figures.isa)",
        )
    return shared[-1]


def kernel_for(family: KernelFamily, isa: str, fmt: str, cpu_classes: tuple[str, ...]) -> str:
    """``isa`` itself when the family has a kernel for ``fmt`` there, else the widest class below it that the CPU
    and the family have with one; ConfigError naming ``system.expert_format`` when none has."""
    below = [c for c in ISA_CLASSES[: ISA_CLASSES.index(isa) + 1] if c in cpu_classes]
    for c in reversed(below):
        if family.has(c, fmt):
            return c
    raise ConfigError(
        "system.expert_format",
        f"kernel family {family.name} has no {fmt}-class kernel on {isa} or below ({family.file}); "
        f"give another expert_format or host_kernel",
    )


def path_for(family: KernelFamily, isa: str, fmt: str, tokens: int, cpu_classes: tuple[str, ...]) -> str:
    """The class that computes an expert of ``tokens`` tokens: ``isa``'s kernel unless the tokens are below its
    ``min_tokens``, then the widest class below it whose kernel takes them."""
    start = kernel_for(family, isa, fmt, cpu_classes)
    below = [c for c in ISA_CLASSES[: ISA_CLASSES.index(start) + 1] if c in cpu_classes and family.has(c, fmt)]
    for c in reversed(below):
        if tokens >= family.min_tokens(c):
            return c
    return below[0]


__all__ = [
    "CALLS",
    "CLASS_FIGURES",
    "FAMILY_FIGURES",
    "FORMAT_CLASSES",
    "ISA_CLASSES",
    "KERNELS_DIR",
    "KernelFamily",
    "check_cpu_isa",
    "choose_isa",
    "cpu_isa_classes",
    "family_names",
    "format_class",
    "kernel_for",
    "load_family",
    "path_for",
]
