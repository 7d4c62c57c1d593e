"""What a run's system asks of its host, decided when the config loads: the host's sockets and CPU part, the copies
of each expert it holds, whether the system prices the host by its behaviour (:mod:`sim.costs.host_costs`), and
which kernel family and instruction-set class compute its experts. A kernel family or instruction set the host
lacks is refused here, with one line naming ``system.host_kernel`` or ``system.host_isa``."""

from __future__ import annotations

from dataclasses import dataclass

from moebase.errors import ConfigError
from sim.config.hardware import HardwareSpec
from sim.config.host_kernels import KernelFamily, check_cpu_isa, choose_isa, cpu_isa_classes, kernel_for, load_family
from sim.config.parts import Part, cpu_part, load_table
from sim.config.system import SystemSpec


def host_sockets(hw: HardwareSpec) -> int:
    """The host's sockets: ``hardware.host.sockets`` of a machine that names its parts, else 1."""
    return hw.host.sockets if hw.host is not None else 1


def host_copies(system: SystemSpec, hw: HardwareSpec) -> int:
    """How many copies of each expert the host holds: one per socket under ``numa: replicated``, else one."""
    return host_sockets(hw) if system.numa == "replicated" else 1


def host_cpu(hw: HardwareSpec) -> Part | None:
    """The CPU part the machine's host names (None: a bundled profile without parts)."""
    return None if hw.host is None else cpu_part(hw.host.cpu, "hardware.host.cpu")


def uses_host_model(system: SystemSpec, hw: HardwareSpec) -> bool:
    """Whether the system sets anything :mod:`sim.costs.host_costs` prices (else the host is priced by the
    hardware's ``cpu_*`` figures)."""
    if system.numa is not None or system.host_kernel is not None or system.host_isa is not None:
        return True
    if system.host_threads is None:
        return False
    cpu = host_cpu(hw)
    return cpu is not None and cpu.value("core_bw_gb_s") is not None


@dataclass(frozen=True)
class KernelChoice:
    """The host's instruction-set classes and, with ``system.host_kernel``, the family and the class it computes
    with (None without a family: the hardware's rates hold)."""

    cpu_classes: tuple[str, ...]
    family: KernelFamily | None = None
    isa: str | None = None


def choose_kernels(system: SystemSpec, hw: HardwareSpec, fmt: str) -> KernelChoice:
    """The kernels of a system that sets ``host_kernel`` or ``host_isa``, for experts of format class ``fmt``;
    ConfigError when the host names no CPU part, lacks the instruction set, or the family has no kernel for it."""
    cpu = host_cpu(hw)
    if cpu is None:
        field = "system.host_kernel" if system.host_kernel is not None else "system.host_isa"
        raise ConfigError(
            field,
            f"needs a machine whose host names its CPU part (hardware.host.cpu), to know its instruction sets; "
            f"{hw.name} names none",
        )
    entry = load_table("host_kernels").entry(cpu.value("isa"), f"{cpu.file}: figures.isa", "instruction set")
    classes = cpu_isa_classes(entry, f"{cpu.file}: figures.isa")
    if system.host_kernel is None:  # host_isa alone: checked against the CPU; the hardware's rates hold
        check_cpu_isa(str(system.host_isa), classes, cpu.name)
        return KernelChoice(classes)
    family = load_family(system.host_kernel)
    isa = choose_isa(family, classes, cpu.name, system.host_isa)
    kernel_for(family, isa, fmt, classes)  # refused now, not at the first expert
    return KernelChoice(classes, family, isa)
