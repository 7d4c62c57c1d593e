"""Model and hardware profiles: what a model's weights look like, and how fast a machine moves and computes them.

This module gathers, for compatibility, names that live in modules with one job each: :mod:`sim.checks` (field
checks), :mod:`sim.files` (reading user files), :mod:`sim.profiles` (profile references and ``base``),
:mod:`sim.model_spec`, :mod:`sim.hardware_spec`, :mod:`sim.units`. New code may import from those directly.

Profiles live in YAML files, ``configs/models/NAME.yaml`` and ``configs/hardware/NAME.yaml`` of the project root,
and are loaded by name, by path, or from an inline mapping (in a run config). Any profile mapping may name a
``base`` profile (a name or a path) whose fields it inherits and overrides, e.g.
``hardware: {base: h200, pcie_bw_gb_s: 25}``.

Model files use the :class:`ModelSpec` field names (sizes in elements, ``dtype_bytes`` per element).

Hardware files use readable units, converted to SI in :class:`HardwareSpec` (GB = 1e9 bytes)::

    name: h200                  # optional: the file's stem
    gpu_memory_gb: 141          # -> gpu_memory_bytes
    hbm_bw_gb_s: 4800           # -> hbm_bw (bytes/s)
    flops_tflops: 790           # -> flops (FLOP/s at 16-bit)
    flops_fp32_tflops: 60       # -> flops_fp32 (used when the model's dtype_bytes is 4)
    pcie_bw_gb_s: 52            # -> pcie_bw: host -> device, pinned
    pcie_latency_us: 10         # -> pcie_latency_s: fixed cost per copy
    d2d_bw_gb_s: 2400           # optional (default hbm_bw_gb_s / 2: a copy reads and writes) -> d2d_bw
    launch_overhead_us: 3       # -> launch_overhead_s: per kernel
    handoff_us: 0               # optional: host threads' wake-up time between a landed copy and its compute,
                                #   and between asking an idle link for a copy and its start
    copy_gap_us: 0              # optional: the link idles this long between a copy landing and the start of the
                                #   next one already queued (the copy thread's wake-up, under load)
    layer_roundtrip_us: 0       # optional: per MoE layer, the gate's choice is brought to the host (a device ->
                                #   host sync) before any copy or expert of the layer is issued
    copy_issue_us: 0            # optional: host time to issue one copy (the compute thread waits that long)
    expert_issue_us: 0          # optional: host time to issue one copied expert's compute (taking the landed copy,
                                #   ordering, launching, releasing its buffer); an expert takes at least this long
    hit_issue_us: 0             # optional: host time to issue one cached expert's compute
    compute_slowdown: 1.0       # optional: expert compute runs this many times longer while a copy crosses the link
    dense_slowdown: 1.0         # optional: the same for dense work and the LM head (default: compute_slowdown)
    copy_slowdown: 1.0          # optional: a copy runs this many times longer while compute runs (both measured
                                #   by validate microbench: copies and compute share memory bandwidth)
    reserved_gb: 4              # -> reserved_bytes: runtime, activations, fragmentation
    tables:                     # optional, measured (a calibration file from validate/ writes these); SI units
      model: switch-xxl-128     #   the model the expert/dense tables were measured for
      copy: [[bytes, seconds], ...]            # host -> device
      d2d: [[bytes, seconds], ...]             # device -> device
      expert: [[tokens, seconds], ...]         # one expert of `model` on that many tokens
      dense: [[tokens, context, seconds], ...] # dense work per MoE layer; a full grid over (tokens, context)
      lm_head: [[tokens, seconds], ...]        # the LM head of `model` over that many tokens

A calibration file is the same schema, in YAML or JSON, usually ``{"base": "h200", "tables": {...}}`` plus any
fitted scalar (e.g. ``pcie_bw_gb_s``).
"""

from __future__ import annotations

from sim.checks import check_bool, check_choice, check_int, check_keys, check_mapping, check_number, check_str
from sim.files import CONFIG_DIR, PROJECT_ROOT, read_structured_file, resolve_path
from sim.hardware_spec import (
    HARDWARE_FIELDS,
    HARDWARE_KEYS,
    HOST_COST_FIELDS,
    TABLE_KEYS,
    CalibrationTables,
    HardwareSpec,
    hardware_from_dict,
    load_hardware,
    tables_from_dict,
)
from sim.model_spec import MODEL_FIELDS, MODEL_KEYS, ROLES, ModelSpec, load_model, model_from_dict
from sim.profiles import PROFILE_SUFFIXES, available
from sim.units import GB

__all__ = [
    "CONFIG_DIR",
    "GB",
    "HARDWARE_FIELDS",
    "HARDWARE_KEYS",
    "HOST_COST_FIELDS",
    "MODEL_FIELDS",
    "MODEL_KEYS",
    "PROFILE_SUFFIXES",
    "PROJECT_ROOT",
    "ROLES",
    "TABLE_KEYS",
    "CalibrationTables",
    "HardwareSpec",
    "ModelSpec",
    "available",
    "check_bool",
    "check_choice",
    "check_int",
    "check_keys",
    "check_mapping",
    "check_number",
    "check_str",
    "hardware_from_dict",
    "load_hardware",
    "load_model",
    "model_from_dict",
    "read_structured_file",
    "resolve_path",
    "tables_from_dict",
]
