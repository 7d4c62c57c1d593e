"""A serving system's switches (``system.rtr``, ``system.fmoe``): llama.cpp/ik_llama.cpp command-line switches, each
turned into the settings it changes when the profile loads, so that the cost model prices their effect. null (the
default) leaves the profile as it is.

- ``rtr`` (ik_llama.cpp ``-rtr``/``--run-time-repack``, ikawrakow/ik_llama.cpp PR 147): at load, every CPU-side
  tensor whose type has a row-interleaved variant is repacked to it (``Q8_0`` -> ``Q8_0_R4``, ``IQ4_XS`` -> its
  ``_R4``/``_R8``, ...), so that one kernel call reads 4 or 8 rows at once. The ``ik-llama-cpp`` kernel family
  (configs/kernels/ik-llama-cpp.yaml) states the rates of those repacked kernels; **false** computes the host's
  experts at row-major rates, taken as mainline llama.cpp's (``host_kernel: llama-cpp``). Evidence: the row-interleave
  PRs measure the gain on a Ryzen 9 7950X (Zen 4, 16 threads) for prompt processing, 1.50x (Q4_0_R4, PR 119), 1.53x
  (Q8_0_R4, PR 120), 1.52x (IQ3_S_R4, PR 162), and for token generation at 8 threads 1.01-1.05x (PR 156, 162: decode
  is bound by memory bandwidth, which repacking does not change). **true** keeps the profile's family. The switch
  acts only on a profile whose ``host_kernel`` is ``ik-llama-cpp`` (mainline llama.cpp repacks some types itself
  unless ``--no-repack``, PR 14990; that is its family's own figure), elsewhere it is refused naming the field.
- ``fmoe`` (ik_llama.cpp ``-fmoe``/``--fused-moe``, PR 229): an MoE layer's ``up``, ``gate`` and activation (and on
  CUDA the product ``par``) run as one op instead of ``up``, ``gate``, ``act``, ``par``, ``down``: five ops, each
  followed by a thread barrier and each ``mul_mat_id`` searching the active experts again, become two (the fused op
  and ``down``). In the simulator a host call is the fixed cost of a MoE layer's host work
  (``KernelFamily.call_us``: "two thread-pool joins per MoE layer" in the ik family, which assumes fused); **false**
  prices five: the host's per-layer call is ``call_us`` x 5 / 2 (``host_call_us``, unless the profile sets it).
  **true** keeps the family's figure.

A resolved profile keeps the switch beside the settings it set (both load back to the same profile: a switch sets
its field only to what it implies, so applying it twice is applying it once).
"""

from __future__ import annotations

from typing import Any

from moebase.errors import ConfigError

#: The ops of an MoE layer without ``-fmoe`` (up, gate, act, par, down) and with it (fused up+gate+act(+par), down).
FMOE_OPS = (5, 2)
#: The kernel family ``rtr`` switches: its rates are those of repacked rows.
REPACKED_FAMILY = "ik-llama-cpp"
#: The family of row-major rows that ``rtr: false`` computes with.
ROW_MAJOR_FAMILY = "llama-cpp"
SWITCHES = ("rtr", "fmoe")


def apply_switches(values: dict[str, Any], where: str) -> dict[str, Any]:
    """The system's settings (by field name, in file units, checked) with its switches' effects laid over them."""
    out = dict(values)
    rtr, fmoe = out.get("rtr"), out.get("fmoe")
    family = out.get("host_kernel")
    if rtr is not None:
        if family not in (REPACKED_FAMILY, ROW_MAJOR_FAMILY) or (rtr and family != REPACKED_FAMILY):
            raise ConfigError(
                f"{where}.rtr",
                f"switches ik_llama.cpp's repacked kernels (host_kernel: {REPACKED_FAMILY}), but host_kernel is "
                f"{family!r}: give host_kernel: {REPACKED_FAMILY}, or rtr: null",
            )
        if not rtr:
            out["host_kernel"] = ROW_MAJOR_FAMILY
    if fmoe is False and out.get("host_call_s") is None:  # by field name, in the file's microseconds
        if family is None:
            raise ConfigError(f"{where}.fmoe", "prices the host's MoE ops by its kernel family: give host_kernel")
        from sim.config.host_kernels import load_family

        unfused, fused = FMOE_OPS
        out["host_call_s"] = load_family(family, f"{where}.host_kernel").call_us * unfused / fused
    return out


__all__ = ["FMOE_OPS", "SWITCHES", "apply_switches"]
