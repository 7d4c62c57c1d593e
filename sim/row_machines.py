"""The machine a measured row ran on, from the row's words: its GPU, its host CPU (with sockets and memory) and its
link, as the published rows (``benchmarks/published/rows.csv``) and a user's measured rows state them.

:func:`machine_of` returns a hardware reference a run config takes:

1. **A bundled machine of the same parts**: a profile of ``configs/hardware/`` that names the row's GPU part, CPU part
   and socket count (and agrees with the memory's channels, type and speed and the link where the row states them)
   is used as it is, with the figures it measured or fitted (``rtx4090d-24gb`` with ``2x Xeon Gold 6454S`` ->
   ``rtx4090d-2x6454s``; with the row's installed memory, ``rtx4090d-2x6454s+1024gb``).
2. **Else a machine composed from parts** (``sim/config/machine.py``), named by its parts
   (``rtx4090-24gb+2x-epyc-9654+12xddr5-4800+gen4``): the row's GPU, CPU, sockets (1 unless stated), memory and link,
   the parts' defaults for what the row does not state.
3. **A host the row does not name** (``server (unspecified)``, ``48-core Skylake``; the v2 columns' ``unspecified-*``,
   ``skylake-48c``, ``cascadelake-32c``): the bundled machine named after the GPU (``t4-16gb``; ``rtx4090-24gb`` ->
   ``rtx4090``), whose host its file states as an assumption.

A GPU or CPU that has no bundled part is refused with the closest names (ConfigError), never replaced by another:
a row of an RTX 4090 and an EPYC host runs on that EPYC, not on the ``rtx4090`` profile's Ryzen.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from moebase.checks import show
from moebase.errors import ConfigError
from moebase.files import CONFIG_DIR
from moebase.profiles import available
from sim.config.machine import MEMORY_TOKEN, resolve
from sim.config.parts import closest_text, part_names

#: How a host names its CPU in words -> the part's name (the model number lowercased).
CPU_WORDS = (
    (re.compile(r"\bepyc[\s-]+(\w+)"), "epyc-{0}"),
    (re.compile(r"\bxeon(?:\s*\(r\))?[\s-]+(?:platinum|gold|silver|bronze)?[\s-]*(\w+)"), "xeon-{0}"),
    (re.compile(r"\bthreadripper[\s-]+pro[\s-]+(\w+)"), "threadripper-pro-{0}"),
    (re.compile(r"\bthreadripper[\s-]+(\w+)"), "threadripper-{0}"),
    (re.compile(r"\bryzen[\s-]*([3579])[\s-]+(\w+)"), "ryzen{0}-{1}"),
    (re.compile(r"\bcore(?:\s*\(tm\))?[\s-]+(i[3579])[\s-]+(\w+)"), "core-{0}-{1}"),
)
SOCKETS = re.compile(r"(?:^|[\s(,])([1-8])\s*x\s*(?:amd|intel(?:\s*\(r\))?)?\s*$")
CHANNELS = re.compile(r"(\d{1,2})\s*(?:x\s*|channels?\s+(?:of\s+)?)(ddr[45])(?:-(\d{3,5}))?")
MEMORY_WORDS = re.compile(r"\b(ddr[45])(?:-(\d{3,5}))?")
LINK = re.compile(r"gen\s*([3-6])(?:\s*x\s*(\d{1,2}))?")
#: v2 ``cpu`` values that state only the kind of host, not its CPU.
UNNAMED_HOSTS = re.compile(r"unspecified(-[a-z-]+)?|[a-z]+-\d+c")


def _cpu_match(text: str) -> tuple[str, int] | None:
    """The CPU part the words name and where the naming starts."""
    for pattern, form in CPU_WORDS:
        m = pattern.search(text)
        if m:
            return form.format(*m.groups()), m.start()
    return None


def cpu_in_words(host: str) -> str | None:
    """The CPU part a host's words name (``2x Intel Xeon Gold 6454S, ...`` -> ``xeon-6454s``), None when they name
    no CPU model."""
    found = _cpu_match(host.lower())
    return None if found is None else found[0]


def host_of_words(host: str) -> tuple[str | None, int | None, str | None]:
    """(CPU part, sockets, memory per socket as ``[Nx]TYPE[-SPEED]``) that a host's words state (None where not);
    the sockets are the count just before the CPU's name (``2x AMD EPYC 9654``; none: not stated)."""
    text = host.lower()
    found = _cpu_match(text)
    cpu = None if found is None else found[0]
    sockets = None if found is None else SOCKETS.search(text[: found[1]])
    memory = None
    if m := CHANNELS.search(text):
        memory = f"{m.group(1)}x{m.group(2)}" + (f"-{m.group(3)}" if m.group(3) else "")
    elif m := MEMORY_WORDS.search(text):
        memory = m.group(1) + (f"-{m.group(2)}" if m.group(2) else "")
    return cpu, int(sockets.group(1)) if sockets else None, memory


def machine_of(
    gpu: str,
    cpu: str | None = None,
    sockets: int | None = None,
    memory: str | None = None,
    memory_gb: float | None = None,
    pcie: str | None = None,
    where: str = "row",
) -> str:
    """The hardware reference (a bundled profile's name, or a machine named by its parts) of a row's GPU, CPU part
    (None or an unnamed host: the GPU's own machine), sockets, memory per socket (``[Nx]TYPE[-SPEED]``), installed
    memory in GB and link (``gen4``, ``gen4x16``). ConfigError naming ``where`` when a part is not bundled."""
    gpu_name = gpu.strip().lower()
    if cpu is None or not cpu.strip() or UNNAMED_HOSTS.fullmatch(cpu.strip().lower()):
        return _own_machine(gpu_name, where)
    gpu_name = _known(gpu_name, "gpu", where)
    cpu_name = _known(cpu.strip().lower(), "cpu", where)
    parts = [gpu_name, f"{sockets or 1}x-{cpu_name}"]
    if memory:
        m = MEMORY_TOKEN.fullmatch(memory.strip().lower().replace(" ", ""))
        if not m:
            raise ConfigError(where, f"memory {show(memory)} is not [CHANNELSx]TYPE[-SPEED], e.g. 12xDDR5-4800")
        parts.append(m.group(0))
    if memory_gb is not None:
        parts.append(f"{memory_gb:g}gb")
    link = LINK.search((pcie or "").lower())
    if link:
        parts.append(f"gen{link.group(1)}" + (f"x{link.group(2)}" if link.group(2) else ""))
    name = "+".join(parts)
    bundled = _bundled_match(name, where)
    if bundled is None:
        return name
    return bundled if memory_gb is None else f"{bundled}+{memory_gb:g}gb"  # its figures, the row's installed memory


def _known(name: str, kind: str, where: str) -> str:
    names = part_names(kind)
    if name not in names:
        folder = "gpus" if kind == "gpu" else "cpus"
        raise ConfigError(
            where,
            f"{kind} {show(name)} has no part in configs/parts/{folder}/ "
            f"({closest_text(name, names, f'configs/parts/{folder}/')}): add its part, never another's",
        )
    return name


def _own_machine(gpu: str, where: str) -> str:
    """The bundled machine named after the GPU (with or without its memory size), whose host is an assumption."""
    stem = re.sub(r"-[0-9]+gb$", "", gpu)
    for name in (gpu, stem):
        if name in available("hardware"):
            return name
    raise ConfigError(
        where,
        f"the host is not named and GPU {show(gpu)} has no bundled machine of its own in configs/hardware/ to assume "
        f"one: name the host's CPU ({closest_text('', part_names('cpu'), 'configs/parts/cpus/')})",
    )


def _bundled_match(parts_name: str, where: str) -> str | None:
    """The bundled profile whose parts are the machine's: the same GPU, CPU and sockets, and the same memory and
    link where the row states them (compared resolved, defaults filled)."""
    from sim.config.machine import parse_parts_name

    given = parse_parts_name(parts_name, where)
    want = resolve(given, where)
    assert want is not None and want.host is not None and want.link is not None
    stated_memory = bool(given["host"].get("memory"))
    stated_link = "link" in given
    for name, comp in _bundled_parts():
        if comp.gpu is None or comp.host is None or comp.link is None or want.gpu is None:
            continue
        if (comp.gpu.name, comp.host.cpu, comp.host.sockets) != (want.gpu.name, want.host.cpu, want.host.sockets):
            continue
        mem, have = want.host.memory, comp.host.memory
        if stated_memory and mem is not None and have is not None:
            given_mem = {k: v for k, v in given["host"]["memory"].items() if k in ("channels", "type", "speed_mts")}
            if any(v is not None and getattr(have, k) != getattr(mem, k) for k, v in given_mem.items()):
                continue
        if stated_link and comp.link.pcie_gen != want.link.pcie_gen:
            continue
        return name
    return None


@functools.lru_cache(maxsize=4)
def _bundled_parts_at(folder: str, stamp: tuple[str, ...]) -> tuple:
    from sim.config.hardware import load_hardware
    from sim.config.machine import Composition
    from sim.config.parts import cpu_part, gpu_part

    out = []
    for name in available("hardware"):
        hw = load_hardware(name)
        if hw.gpu is None:
            continue
        comp = Composition(
            gpu_part(hw.gpu),
            hw.gpu_count or 1,
            None if hw.host is None else cpu_part(hw.host.cpu),
            hw.host,
            hw.link,
        )
        out.append((name, comp))
    return tuple(out)


def _bundled_parts() -> tuple:
    """(name, composition) of every bundled profile that names its parts, sorted by name."""
    folder = CONFIG_DIR / "hardware"
    stamp = tuple(f"{p.name}:{p.stat().st_mtime_ns}" for p in sorted(Path(folder).glob("*.yaml")))
    return _bundled_parts_at(str(folder), stamp)


__all__ = ["cpu_in_words", "host_of_words", "machine_of"]
