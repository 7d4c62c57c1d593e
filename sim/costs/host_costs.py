"""The host CPU computing routed experts, as it behaves: sockets and NUMA placement, the threads given to the kernels,
the kernel family's rates by instruction set and weight format, and what one call costs. :class:`CostModel
<sim.costs.costs.CostModel>` asks :class:`HostCosts` for a host expert's time when the system sets any of
``numa``, ``host_kernel``, ``host_isa``, or sets ``host_threads`` on a CPU part that states ``core_bw_gb_s``;
otherwise it prices the host exactly as before (the hardware's ``cpu_*`` figures, in proportion to threads).

**Sockets and NUMA** (the system's ``numa``; ``S`` sockets from ``hardware.host.sockets``, each with ``b`` =
``cpu_mem_bw_gb_s`` / S of the hardware's usable bandwidth, which counts every socket in full; ``r`` =
``remote_bw_fraction`` of ``configs/parts/memory.yaml``, the share of its local bandwidth a socket reaches reading
another socket's memory):

- null (the default): ``cpu_mem_bw_gb_s`` as the profile states it, every socket's cores (today's rule);
- ``one_socket``: threads and pages bound to one NUMA node: ``b``, one socket's cores;
- ``interleaved``: pages spread over every socket's memory, threads on all sockets, so (S-1)/S of each socket's
  reads are remote: ``S b / (1/S + (S-1)/(S r))`` (``1.22 b`` for two sockets at r = 0.44);
- ``replicated``: every expert copied into each socket's memory, each socket reading its own copy: ``S b``; the
  host holds S copies of each expert (``sim/config/host_memory.py`` counts them);
- ``numa_tp``: kTransformers' NUMA-aware tensor parallelism (SOSP'25): each socket owns a slice of every expert in
  its own memory: ``S b``, one copy of each expert.

Each host call whose threads span sockets (``interleaved``, ``replicated``, ``numa_tp`` on S > 1) pays
``cross_socket_sync_us`` (``configs/parts/host_kernels.yaml``) beside its ``call_us``.

**Threads** (``host_threads``, llama.cpp's ``-t``, kTransformers' ``cpu_infer``; null: every core of the sockets
used): ``t`` = min(threads, cores). Bandwidth: min(B, t x ``core_bw_gb_s``) where the CPU part states one thread's
bandwidth (it grows with threads until the memory channels are full), else B x t / cores. Compute: t cores' worth.

**Kernels** (``host_kernel``: a family of ``configs/kernels/``, :mod:`sim.config.host_kernels`): the CPU part's
instruction sets choose the family's class (``host_isa`` forces one); the experts' format class picks its
``ops_per_cycle`` (compute = t x ``vector_clock_ghz`` x it) and ``bw_fraction`` (times the system's
``host_bw_fraction``). Without a family the hardware's ``cpu_bf16_tflops`` / ``cpu_int8_tops`` / ``cpu_int4_tops``
hold, in proportion to the sockets and threads used.

**Batches** (more than one token per expert): an expert's time is its call cost plus the larger of its weight bytes
(and activations) over the bandwidth and ``tokens x 2 x expert_params`` over the compute rate: it costs the same per
call until ``tokens`` reaches :meth:`HostCosts.crossover_tokens`, then grows with the tokens. A family's class with
``min_tokens`` (AMX) computes only experts with that many tokens; fewer take the class below (AVX-512). A family
whose ``calls`` is ``layer`` pays its call cost once per MoE layer (:attr:`HostCosts.layer_s`, the engine adds it to
the layer's host work), not once per expert: a batch that touches more experts per layer then adds only their bytes.
"""

from __future__ import annotations

from moebase.model import ModelSpec
from sim.config.hardware import HardwareSpec, cpu_format_rate
from sim.config.host_choice import choose_kernels, host_cpu, host_sockets
from sim.config.host_kernels import KernelFamily, format_class, path_for
from sim.config.parts import load_table
from sim.config.system import NUMA_MODES, SystemSpec

#: Modes whose threads span sockets (a call pays the cross-socket barrier on a host of several sockets).
SPANNING = ("interleaved", "replicated", "numa_tp")


def numa_bandwidth(total: float, sockets: int, mode: str | None, remote: float) -> float:
    """Bytes/s the host's kernels reach under NUMA ``mode`` on ``sockets`` sockets whose usable bandwidth is ``total``
    in all (each socket ``total / sockets``), a remote read reaching ``remote`` of a local one's rate."""
    if mode is None:
        return total
    s = max(int(sockets), 1)
    b = total / s
    if mode == "one_socket" or s == 1:
        return b
    if mode == "interleaved":
        return s * b / (1.0 / s + (s - 1) / (s * remote))
    if mode in ("replicated", "numa_tp"):
        return s * b
    raise ValueError(f"unknown NUMA mode {mode!r}")


class HostCosts:
    """One routed expert's time on the host for one model, machine and system (see the module's docstring)."""

    def __init__(self, model: ModelSpec, hw: HardwareSpec, system: SystemSpec):
        self.model, self.hw, self.system = model, hw, system
        sy = system
        self.sockets = host_sockets(hw)
        self.used_sockets = 1 if sy.numa == "one_socket" else self.sockets
        self.cores = hw.cpu_cores * self.used_sockets / self.sockets  # cores of the sockets used
        remote = float(load_table("memory").figures["remote_bw_fraction"].value)
        self.numa_bw = numa_bandwidth(hw.cpu_mem_bw, self.sockets, sy.numa, remote)
        cpu = host_cpu(hw)
        self.cpu = cpu
        core_bw = None if cpu is None else cpu.value("core_bw_gb_s")
        self.core_bw = None if core_bw is None else float(core_bw) * 1e9
        bits = model.expert_bits_per_weight
        self.format = format_class(sy.expert_format, bits)
        self.family: KernelFamily | None = None
        self.isa: str | None = None
        if sy.host_kernel is not None or sy.host_isa is not None:
            choice = choose_kernels(sy, hw, self.format)
            self.cpu_classes, self.family, self.isa = choice.cpu_classes, choice.family, choice.isa
        kernels = load_table("host_kernels")
        if sy.host_call_s is not None:
            call = sy.host_call_s
        elif self.family is not None:
            call = self.family.call_us / 1e6
        else:
            call = hw.cpu_expert_overhead_s
        if sy.numa in SPANNING and self.sockets > 1:
            call += float(kernels.figures["cross_socket_sync_us"].value) / 1e6
        per_layer = self.family is not None and self.family.calls == "layer"
        self.layer_s = call if per_layer else 0.0  # once per MoE layer with host experts
        self.call_s = 0.0 if per_layer else call  # once per host expert
        self._hw_rate = cpu_format_rate(hw, bits)[1]

    # ------------------------------------------------------------------ rates
    def threads(self, cores: int | None = None) -> float:
        """Threads the kernels run: ``cores`` (a caller's), else the system's ``host_threads``, at most the cores of
        the sockets used (null: all of them)."""
        t = cores if cores is not None else self.system.host_threads
        if t is None:
            return self.cores
        if int(t) < 1:
            raise ValueError(f"cores must be >= 1, got {t!r}")
        return min(float(t), self.cores)

    def bandwidth(self, threads: float, isa: str | None = None) -> float:
        """Bytes/s of weights the kernels stream with ``threads`` threads (the class ``isa``'s share for the
        experts' format)."""
        if self.core_bw is not None:
            bw = min(self.numa_bw, threads * self.core_bw)
        else:
            bw = self.numa_bw * threads / self.cores
        bw *= self.system.host_bw_fraction
        if self.family is not None and isa is not None:
            bw *= self.family.bw_fraction(isa, self.format)
        return bw

    def compute_rate(self, threads: float, isa: str | None = None) -> float:
        """Multiply-add ops/s (a multiply-add is 2) the kernels sustain with ``threads`` threads on class ``isa``,
        times the system's ``host_compute_fraction``."""
        if self.family is not None and isa is not None and self.cpu is not None:
            clock = float(self.cpu.value("vector_clock_ghz")) * 1e9
            rate = threads * clock * self.family.ops_per_cycle(isa, self.format)
        else:
            rate = self._hw_rate * self.used_sockets / self.sockets * threads / self.cores
        return rate if self.system.host_compute_fraction == 1.0 else rate * self.system.host_compute_fraction

    def path(self, tokens: int) -> str | None:
        """The instruction-set class an expert of ``tokens`` tokens computes on (None without a family)."""
        if self.family is None or self.isa is None:
            return None
        return path_for(self.family, self.isa, self.format, tokens, self.cpu_classes)

    # ------------------------------------------------------------------ times
    def expert_s(self, tokens: int, cores: int | None = None) -> float:
        """One routed expert over ``tokens`` tokens (0 for none): its call cost (none when the family calls once per
        layer) plus the larger of its weight bytes and activations over :meth:`bandwidth` and its FLOPs over
        :meth:`compute_rate`."""
        n = int(tokens)
        if n <= 0:
            return 0.0
        m = self.model
        t = self.threads(cores)
        isa = self.path(n)
        activations = 2 * n * m.d_model * m.dtype_bytes
        return self.call_s + max(
            n * m.expert_flops_per_token / self.compute_rate(t, isa),
            (m.expert_bytes + activations) / self.bandwidth(t, isa),
        )

    def crossover_tokens(self, cores: int | None = None) -> float:
        """Tokens per expert from which its compute outlasts its weight stream (the host stops being
        bandwidth-bound): weight bytes x compute rate / (bandwidth x FLOPs per token), on the path of many tokens."""
        m = self.model
        t = self.threads(cores)
        isa = self.path(1 << 20)
        return m.expert_bytes * self.compute_rate(t, isa) / (self.bandwidth(t, isa) * m.expert_flops_per_token)


__all__ = [
    "NUMA_MODES",
    "SPANNING",
    "HostCosts",
    "numa_bandwidth",
]
