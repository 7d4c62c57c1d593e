"""Serving-system profiles: what the software running the model costs, beside the model (``configs/models/``) and the
silicon (``configs/hardware/``). A profile is ``configs/systems/NAME.yaml``, a path to one, or an inline mapping
that may name a ``base`` profile; a run config chooses it with ``system: NAME`` (default ``ideal``: every software
cost zero, every choice the one the simulator made before profiles existed, so results are unchanged).

A profile holds (file keys; times in microseconds, converted to seconds in :class:`SystemSpec`):

- fixed costs: ``layer_overhead_us`` per MoE layer (framework time on the host, serial with the compute stream),
  ``expert_call_us`` per expert computed on the GPU, ``copy_overhead_us`` per expert copy (on the link);
- the copy path: ``copy_stream`` (``overlapped``, or ``serial``: copies and compute share one stream and never
  overlap), ``pageable_copies`` (host memory not pinned: copies run at ``pageable_fraction`` of the link's
  bandwidth), ``writeback_evicted`` (an evicted expert is written back device->host over the link first);
- weight formats: ``expert_format`` and ``dense_format`` (names in :data:`FORMATS`, bits per weight with their
  group scales), overriding the model's ``expert_bits`` and the dense weights' ``dtype_bytes`` for the bytes that
  are copied and read; ``dequant``: the GPU's de-quantization of a quantized expert before its compute (``none``:
  fused into the kernel; ``roofline``: the quantized bytes read plus the 16-bit weights written at HBM bandwidth;
  ``table``: measured, the system's ``tables.dequant`` as [bytes of the quantized expert, seconds] points, else
  the calibration's ``dequant_int4`` / ``dequant_int8`` for the experts' width, refused at load when neither
  exists; ``measured``: the calibration's table where one was measured, else the roofline: what the validator's
  configurations use, written before their calibration exists);
- host expert kernels (Fiddler, kTransformers): ``host_threads`` (cores used; null = the hardware's ``cpu_cores``),
  ``host_bw_fraction`` (share of the hardware's ``cpu_mem_bw_gb_s`` the kernels reach), ``host_compute_fraction``
  (share of the host's compute rate they reach: what prices prompt batches, many tokens per expert),
  ``host_call_us`` (per host expert call; null = the hardware's ``cpu_expert_overhead_us``);
- host as it behaves (:mod:`sim.costs.host_costs`; each null by default, which prices the host as before):
  ``numa`` (``one_socket`` | ``interleaved`` | ``replicated`` | ``numa_tp``: how experts are placed across the
  host's sockets and the bandwidth that gives), ``host_kernel`` (a kernel family of ``configs/kernels/``: its
  rates by instruction set and weight format, and whether it calls once per layer or per expert), ``host_isa``
  (``avx2`` | ``avx512`` | ``amx``: the class the family computes with; null: the widest the CPU and the family
  share); ``host_threads`` is the kernels' threads (llama.cpp ``-t``, kTransformers ``cpu_infer``);
- ``placement``: where the routed experts live by layer (:mod:`sim.config.placement`): ``{n_cpu_moe: N}`` is
  llama.cpp's ``--n-cpu-moe N``, ``{experts_on_gpu_layers: "A-B[,C-D]"}`` its ``-ot`` by layer range, from which the
  policy's layer parameter and the GPU's shared cache follow;
- ``experts_per_token``: fewer routed experts per token than the model's top-k (each token keeps its N
  highest-ranked, :mod:`sim.core.experts_per_token`); null: the model's; ``deferral``: kTransformers' expert
  deferral, each token's D lowest-ranked host experts computed beside the next layer (sim/timing/engine.py);
- switches (:mod:`sim.config.switches`): ``rtr`` and ``fmoe``, ik_llama.cpp's ``-rtr`` and ``-fmoe``, each setting
  what it implies (``host_kernel``, ``host_call_us``) when the profile loads;
- both phases (:mod:`sim.costs.phase_costs`, docs/phases.md; each default changes nothing): ``prefill_upload``
  (llama.cpp's op offload: a micro-batch of at least ``upload_min_batch`` tokens, scaled by num_experts / top_k
  with ``upload_moe_scaled`` as ik_llama.cpp does, copies the layer's host-held experts to the GPU, only the used
  ones with ``upload_used_only``, and computes them there), ``ubatch`` (llama.cpp ``-ub``: a prefill runs in passes
  of at most this many tokens) and ``kv_on_host`` (llama.cpp ``-nkvo``: attention over the context on the host);
- host issue costs a calibration measured (``layer_roundtrip_us``, ``copy_issue_us``, ``expert_issue_us``,
  ``hit_issue_us``): null (the default) takes the hardware profile's value, so calibration files keep working.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from moebase.checks import check_keys, check_mapping, check_str, integer, known_text, number, one_of, show, text
from moebase.errors import ConfigError
from moebase.fields import keys_of, read_settings, required_keys, setting, to_plain, to_si
from moebase.profiles import load_profile
from sim.config.placement import Placement, placement_from
from sim.config.registries import PREDICTORS
from sim.config.switches import apply_switches

COPY_STREAMS = ("overlapped", "serial")
#: How a system places the host's experts across sockets (null: every socket's bandwidth in full, as profiles state
#: it); sim/costs/host_costs.py prices each.
NUMA_MODES = ("one_socket", "interleaved", "replicated", "numa_tp")
DEQUANT_MODES = ("none", "roofline", "table", "measured")
DEFAULT_SYSTEM = "ideal"
#: Bits of the 16-bit weights a de-quantization kernel writes, per weight.
DEQUANT_OUT_BITS = 16.0

#: Weight formats -> bits per weight, group scales and zeros included.
#:
#: - ``hqq-2bit``: mixtral-offloading's expert config, HQQ ``nbits=2, group_size=16, quant_zero=True,
#:   quant_scale=True``: 2 bits, then an 8-bit zero and an 8-bit scale per group of 16 (16/16 = 1 bit), themselves
#:   quantized per 128 groups with a 16-bit scale and zero (32 / (128 x 16) = 0.016): 3.016. The config is recalled
#:   from the project's demo notebook (assumption: not re-read here).
#: - ``hqq-3bit``, ``hqq-4bit``: HQQ's default ``group_size=64`` with a 16-bit scale and zero per group: 3 + 32/64 =
#:   3.5 and 4 + 32/64 = 4.5 (assumption: no meta-quantization).
#: - ``gptq-4bit``, ``awq-4bit``: group 128, a 16-bit scale and a 4-bit packed zero per group: 4 + 20/128 = 4.156
#:   (AutoGPTQ / AutoAWQ layouts; the zero is 4-bit packed).
#: - ``mxfp4``: OCP MX spec, 4-bit E2M1 elements with one 8-bit shared scale per 32: 4 + 8/32 = 4.25.
#: - ``q4_k_m``: llama.cpp's Q4_K_M mixes Q4_K (4.5 bpw) and Q6_K (6.5625 bpw) tensors; llama.cpp reports about 4.85
#:   bpw for a whole model (assumption: the mix of a 7B-class model).
#: - ``q8_0``: llama.cpp, 8-bit values with a 16-bit scale per 32: 8 + 16/32 = 8.5.
#: - ``q2_k`` ... ``q6_k``, ``q4_0``, ``q5_0``: llama.cpp's block layouts (the k-quants description, ggml PR 1684:
#:   super-blocks of 256 with 6- or 8-bit sub-block scales: Q2_K 2.5625, Q3_K 3.4375, Q4_K 4.5, Q5_K 5.5, Q6_K
#:   6.5625 bpw; Q4_0 and Q5_0: a 16-bit scale per 32, 4 + 0.5 and 5 + 0.5).
#: - ``int8``: per-channel scales (negligible): 8. ``fp8``: 8. ``bf16``/``fp16``: 16. ``fp32``: 32.
#:
#: Names of the same families at other widths are read by :func:`format_bits` (``int4``, ``hqq-3bit``,
#: ``gptq-3bit``, ``4.5bpw``).
FORMATS: dict[str, float] = {
    "q2_k": 2.5625,
    "q3_k": 3.4375,
    "q4_k": 4.5,
    "q5_k": 5.5,
    "q6_k": 6.5625,
    "q4_0": 4.0 + 16.0 / 32,
    "q5_0": 5.0 + 16.0 / 32,
    "hqq-2bit": 2.0 + 16.0 / 16 + 32.0 / (128 * 16),
    "hqq-3bit": 3.0 + 32.0 / 64,
    "hqq-4bit": 4.0 + 32.0 / 64,
    "gptq-4bit": 4.0 + 20.0 / 128,
    "awq-4bit": 4.0 + 20.0 / 128,
    "mxfp4": 4.0 + 8.0 / 32,
    "q4_k_m": 4.85,
    "q8_0": 8.0 + 16.0 / 32,
    "int8": 8.0,
    "fp8": 8.0,
    "bf16": 16.0,
    "fp16": 16.0,
    "fp32": 32.0,
}


def _time() -> Any:
    """A time in microseconds: 0 to 1e9."""
    return number(0.0, 1e9, strict=False)


def _optional_time(value: Any, where: str) -> float | None:
    return None if value is None else _time()(value, where)


_FAMILIES = (  # (pattern, bits per weight from N, the widths the family has)
    (re.compile(r"int([1-8])"), lambda n: float(n)),  # per-channel scales: negligible
    (re.compile(r"hqq-([1-8])bit"), lambda n: n + 32.0 / 64),  # HQQ's default group 64 (assumption)
    (re.compile(r"(?:gptq|awq)-([2-8])bit"), lambda n: n + 20.0 / 128),  # group 128, 16-bit scale, packed zero
)
_BPW = re.compile(r"([0-9]{1,2}(?:\.[0-9]{1,4})?)bpw")


def format_bits(name: str) -> float | None:
    """Bits per weight (scales included) of a weight format: a name of :data:`FORMATS`, a family at another width
    (``int4``, ``hqq-3bit``, ``gptq-8bit``), or a width given outright (``4.5bpw``, 1 to 32); None if unknown."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower()
    if key in FORMATS:
        return FORMATS[key]
    for pattern, bits in _FAMILIES:
        m = pattern.fullmatch(key)
        if m:
            return bits(int(m.group(1)))
    m = _BPW.fullmatch(key)
    if m and 1.0 <= float(m.group(1)) <= 32.0:
        return float(m.group(1))
    return None


def _format(value: Any, where: str) -> str | None:
    """A weight format's name (see :func:`format_bits`), or null (the model's own)."""
    if value is None:
        return None
    if format_bits(value) is None:
        raise ConfigError(
            where,
            f"must be a weight format (e.g. {', '.join(list(FORMATS)[:8])}, int4, hqq-3bit, "
            f"4.5bpw; {len(FORMATS)} named in sim/config/system.py) or null, got {show(value)}",
        )
    return value.strip().lower()


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(where, f"must be true or false, got {show(value)}")
    return value


def _fraction(value: Any, where: str) -> float:
    """A share in (0, 1]."""
    return number(0.0, 1.0, strict=True)(value, where)


def _dequant_table(value: Any, where: str):
    if value is None:
        return None
    from sim.config.hardware import _points  # the same checks as a calibration table's points

    return _points(value, where, 2, "")


@dataclass(frozen=True)
class SystemTables:
    """Measured tables of a serving system (optional)."""

    dequant: tuple | None = setting(None, _dequant_table, constructor_default=True)  # (quantized bytes, seconds)

    def to_dict(self) -> dict:
        return {"dequant": None if self.dequant is None else [list(p) for p in self.dequant]}


def _tables(value: Any, where: str) -> SystemTables | None:
    if value is None:
        return None
    d = check_mapping(value, where)
    check_keys(d, where, (), keys_of(SystemTables))
    t = SystemTables(**read_settings(SystemTables, d, where))
    return None if t.dequant is None else t


def _host_kernel(value: Any, where: str) -> str | None:
    """A kernel family of ``configs/kernels/`` (checked by loading it), or null."""
    if value is None:
        return None
    from sim.config.host_kernels import load_family

    return load_family(value, where).name


def _host_isa(value: Any, where: str) -> str | None:
    from sim.config.host_kernels import ISA_CLASSES

    return None if value is None else one_of(*ISA_CLASSES)(value, where)


def _predictor(value: Any, where: str) -> dict | None:
    """A predictor as a run config names one: a name, or ``{name, params}``, a registered predictor and its params
    (checked when the profile loads, whether or not a run names its own predictor); None for none."""
    if value is None:
        return None
    if isinstance(value, str):
        value = {"name": value}
    d = check_mapping(value, where)
    check_keys(d, where, ("name",), ("name", "params"))
    name = check_str(d["name"], f"{where}.name")
    params = d.get("params")
    if params is not None:
        check_mapping(params, f"{where}.params")
    _check_predictor(name, dict(params or {}), where)
    return {"name": name, "params": dict(params or {})}


def _check_predictor(name: str, params: dict, where: str) -> None:
    """``name`` is a registered predictor and ``params`` are its."""
    known = PREDICTORS.names()
    if name not in known:
        raise ConfigError(
            f"{where}.name", f"unknown predictor {show(name)} ({known_text(name, known, PREDICTORS.folder)})"
        )
    PREDICTORS.get(name).check_params(copy.deepcopy(params), f"{where}.params")


@dataclass(frozen=True)
class SystemSpec:
    """The software's costs and choices, in SI units (seconds)."""

    name: str = setting("inline", text(), constructor_default=True)
    # fixed host/framework time per MoE layer, serial with the compute stream (nothing of the layer runs meanwhile)
    layer_overhead_s: float = setting(0.0, _time(), key="layer_overhead_us", divisor=1e6, constructor_default=True)
    # fixed time added to each expert computed on the GPU (kernel dispatch of the framework)
    expert_call_s: float = setting(0.0, _time(), key="expert_call_us", divisor=1e6, constructor_default=True)
    # fixed time added to each expert copy issued, on the link (the copy path's own bookkeeping)
    copy_overhead_s: float = setting(0.0, _time(), key="copy_overhead_us", divisor=1e6, constructor_default=True)
    # overlapped: copies run beside compute; serial: one stream, a copy and compute never overlap
    copy_stream: str = setting("overlapped", one_of(*COPY_STREAMS), constructor_default=True)
    # host memory not pinned: expert copies run at pageable_fraction of the link's bandwidth
    pageable_copies: bool = setting(False, _bool, constructor_default=True)
    # the share of the pinned bandwidth a pageable copy reaches (assumption: 0.5, a staging copy through a pinned
    # bounce buffer doubles the bytes the host moves)
    pageable_fraction: float = setting(0.5, _fraction, constructor_default=True)
    # an evicted expert is written back device->host over the link before the copy that replaces it
    writeback_evicted: bool = setting(False, _bool, constructor_default=True)
    # routed experts' weight format (FORMATS); null: the model's expert_bits
    expert_format: str | None = setting(None, _format, constructor_default=True)
    # dense weights' format (FORMATS); null: the model's dtype_bytes
    dense_format: str | None = setting(None, _format, constructor_default=True)
    # de-quantization of a quantized expert on the GPU before it computes: none | roofline | table
    dequant: str = setting("none", one_of(*DEQUANT_MODES), constructor_default=True)
    # host expert kernels: cores used (null: all the hardware's cpu_cores)
    host_threads: int | None = setting(None, integer(1, 100_000, allow_none=True), constructor_default=True)
    # host expert kernels: share of the hardware's cpu_mem_bw_gb_s they reach
    host_bw_fraction: float = setting(1.0, _fraction, constructor_default=True)
    # host expert kernels: share of the host's compute rate they reach (the kernel family's ops per cycle, else the
    # hardware's cpu_* rates), which prices many tokens per expert (prompt batches); 1.0: the rate as stated
    host_compute_fraction: float = setting(1.0, _fraction, constructor_default=True)
    # host expert kernels: fixed cost per call (null: the kernel family's call_us, else the hardware's
    # cpu_expert_overhead_us); a call is one expert, or one MoE layer's experts for a family whose calls are per layer
    host_call_s: float | None = setting(None, _optional_time, key="host_call_us", divisor=1e6, constructor_default=True)
    # how the experts are placed across the host's sockets (NUMA_MODES; null: every socket in full, as before)
    numa: str | None = setting(
        None, lambda v, w: None if v is None else one_of(*NUMA_MODES)(v, w), constructor_default=True
    )
    # the host expert kernels' family (configs/kernels/NAME.yaml; null: the hardware's cpu_* rates)
    host_kernel: str | None = setting(None, lambda v, w: _host_kernel(v, w), constructor_default=True)
    # the instruction-set class the family computes with (avx2 | avx512 | amx; null: the widest the CPU has)
    host_isa: str | None = setting(None, lambda v, w: _host_isa(v, w), constructor_default=True)
    # host issue costs (null: the hardware profile's value, as calibrated)
    layer_roundtrip_s: float | None = setting(
        None, _optional_time, key="layer_roundtrip_us", divisor=1e6, constructor_default=True
    )
    copy_issue_s: float | None = setting(
        None, _optional_time, key="copy_issue_us", divisor=1e6, constructor_default=True
    )
    expert_issue_s: float | None = setting(
        None, _optional_time, key="expert_issue_us", divisor=1e6, constructor_default=True
    )
    hit_issue_s: float | None = setting(None, _optional_time, key="hit_issue_us", divisor=1e6, constructor_default=True)
    tables: SystemTables | None = setting(None, _tables, nested=SystemTables, constructor_default=True)
    # the system's own expert predictor ({name, params}, as a run config's ``predictor``): what a run of this
    # system predicts with when its config names none (null: the simulator's default)
    predictor: dict | None = setting(None, lambda v, where: _predictor(v, where), constructor_default=True)
    # where the routed experts live by layer (sim/config/placement.py): {n_cpu_moe: N} is llama.cpp's --n-cpu-moe N,
    # from which the policy's cpu_layers and the GPU's shared cache follow; null: the cache config decides
    placement: Placement | None = setting(None, placement_from, nested=Placement, constructor_default=True)
    # both phases (sim/costs/phase_costs.py; docs/phases.md). Each default changes nothing.
    # prompt processing of host-held experts: at or above upload_min_batch tokens in a micro-batch the layer's host
    # experts' weights are copied to the GPU and computed there (llama.cpp's op offload; off: always on the host)
    prefill_upload: bool = setting(False, _bool, constructor_default=True)
    # the offload threshold in tokens of a micro-batch (llama.cpp ggml-cuda offload_op: min_batch_size = 32)
    upload_min_batch: int = setting(32, integer(1, 1 << 24), constructor_default=True)
    # ik_llama.cpp (PR 520): the threshold for an MoE op is upload_min_batch x num_experts / top_k
    upload_moe_scaled: bool = setting(False, _bool, constructor_default=True)
    # only the experts the micro-batch uses cross the link (llama.cpp PR 15346, ik_llama.cpp PR 698); false: the
    # layer's whole host-held expert tensor does (llama.cpp before August 2025)
    upload_used_only: bool = setting(True, _bool, constructor_default=True)
    # the micro-batch (llama.cpp -ub, default 512): a prefill is run in passes of at most this many tokens;
    # null: one pass per prefill iteration (as before)
    ubatch: int | None = setting(None, integer(1, 1 << 24, allow_none=True), constructor_default=True)
    # the KV cache in host memory (llama.cpp -nkvo): attention over the context is computed by the host CPU
    kv_on_host: bool = setting(False, _bool, constructor_default=True)
    # fewer routed experts per token than the model's top-k (llama.cpp --override-kv ARCH.expert_used_count=int:N):
    # each token keeps the N highest-ranked of its routed experts per layer (sim/core/experts_per_token.py);
    # null: the model's top-k
    experts_per_token: int | None = setting(None, integer(1, 1 << 15, allow_none=True), constructor_default=True)
    # kTransformers' expert deferral (SOSP'25; SGLang --kt-max-deferred-experts-per-token): of each token's routed
    # experts computed on the host, its `deferral` lowest-ranked run after the layer, beside the next layer's GPU
    # work, and the GPU waits for the others only (sim/timing/engine.py HostStream); 0: none
    deferral: int = setting(0, integer(0, 1 << 15), constructor_default=True)
    # ik_llama.cpp's switches (sim/config/switches.py: each sets what it implies when the profile loads; null: as
    # the profile is): -rtr, run-time repacking of the host's rows (false: row-major rates, host_kernel llama-cpp);
    # -fmoe, the fused MoE op (false: five host ops per MoE layer instead of two, host_call_us = call_us x 5/2)
    rtr: bool | None = setting(None, lambda v, w: None if v is None else _bool(v, w), constructor_default=True)
    fmoe: bool | None = setting(None, lambda v, w: None if v is None else _bool(v, w), constructor_default=True)
    source: str = setting("inline", text(max_chars=4096), constructor_default=True)

    @property
    def phases_set(self) -> bool:
        """Whether any setting of the two phases differs from its default (then
        :class:`~sim.costs.phase_costs.PhaseCosts` prices the layers)."""
        return any(getattr(self, f) != getattr(IDEAL, f) for f in PHASE_FIELDS)

    @property
    def expert_bits(self) -> float | None:
        """Bits per expert weight of ``expert_format`` (None: the model's)."""
        return None if self.expert_format is None else format_bits(self.expert_format)

    @property
    def dense_bits(self) -> float | None:
        """Bits per dense weight of ``dense_format`` (None: the model's ``dtype_bytes``)."""
        return None if self.dense_format is None else format_bits(self.dense_format)

    @property
    def serial(self) -> bool:
        return self.copy_stream == "serial"

    def to_dict(self) -> dict:
        """The profile in the system-file schema (microseconds); loads back with :func:`load_system`."""
        d = to_plain(self)
        for key in ("placement", "numa", "host_kernel", "host_isa", "experts_per_token", "rtr", "fmoe"):
            if d[key] is None:  # left out, so that a profile without one reads (and hashes) as before
                d.pop(key)
        if d["deferral"] == 0:
            d.pop("deferral")
        if d["host_compute_fraction"] == 1.0:  # left out at its default, so that a profile hashes as before
            d.pop("host_compute_fraction")
        for key in PHASE_FIELDS:  # the same for the phases' settings at their defaults
            if d[key] == getattr(IDEAL, key):
                d.pop(key)
        return {
            **{k: v for k, v in d.items() if k not in ("tables", "source")},
            "tables": d["tables"],
            "source": d["source"],
        }


#: The settings of the two phases (prompt processing and decode at a depth), each a no-op at its default.
PHASE_FIELDS = ("prefill_upload", "upload_min_batch", "upload_moe_scaled", "upload_used_only", "ubatch", "kv_on_host")
SYSTEM_FIELDS = keys_of(SystemSpec)
SYSTEM_KEYS = SYSTEM_FIELDS + ("base",)
#: The host issue costs a system may set instead of its hardware profile (file keys).
HOST_ISSUE_FIELDS = ("layer_roundtrip_us", "copy_issue_us", "expert_issue_us", "hit_issue_us")


def system_from_dict(d: Any, where: str = "system", suffix: str = "", source: str = "inline") -> SystemSpec:
    """Validate a system mapping (no ``base``) into a :class:`SystemSpec`."""
    d = check_mapping(d, where)
    check_keys(d, where, required_keys(SystemSpec), SYSTEM_FIELDS, suffix, see="sim/config/system.py")
    values = read_settings(SystemSpec, d, where, suffix, defaults={"source": source})
    values = apply_switches(values, where)
    return SystemSpec(**to_si(SystemSpec, values))


def load_system(spec_or_name: Any = DEFAULT_SYSTEM, where: str = "system") -> SystemSpec:
    """A system profile from a name (``configs/systems/NAME.yaml``), a path, an inline mapping (optionally with
    ``base``), None (the default, ``ideal``) or a :class:`SystemSpec` (returned as is)."""
    if isinstance(spec_or_name, SystemSpec):
        return spec_or_name
    if spec_or_name is None:  # built in, equal to configs/systems/ideal.yaml: a config shipped without the
        return IDEAL  # project's configs/ (a sweep point on a Ray node) still loads
    try:
        d, source = load_profile(spec_or_name, where, "systems", SYSTEM_KEYS)
    except ConfigError as exc:  # the profile loader names the kind by its folder
        raise ConfigError(exc.field, exc.problem.replace("systems ", "system ")) from None
    suffix = "" if source == "inline" else f" (in {source})"
    d.setdefault("source", source)
    return system_from_dict(d, where, suffix, source)


def is_ideal(system: SystemSpec) -> bool:
    """Whether ``system`` changes nothing (every cost zero, every choice the default)."""
    return all(
        getattr(system, f) == getattr(IDEAL, f)
        for f in (
            "layer_overhead_s",
            "expert_call_s",
            "copy_overhead_s",
            "copy_stream",
            "pageable_copies",
            "writeback_evicted",
            "expert_format",
            "dense_format",
            "dequant",
            "host_threads",
            "host_bw_fraction",
            "host_compute_fraction",
            "host_call_s",
            "numa",
            "host_kernel",
            "host_isa",
            "layer_roundtrip_s",
            "copy_issue_s",
            "expert_issue_s",
            "hit_issue_s",
            "placement",
            "experts_per_token",
            "deferral",
            "rtr",
            "fmoe",
            *PHASE_FIELDS,
        )
    )


IDEAL = SystemSpec(name=DEFAULT_SYSTEM)

__all__ = [
    "format_bits",
    "COPY_STREAMS",
    "DEFAULT_SYSTEM",
    "DEQUANT_MODES",
    "DEQUANT_OUT_BITS",
    "FORMATS",
    "HOST_ISSUE_FIELDS",
    "IDEAL",
    "NUMA_MODES",
    "PHASE_FIELDS",
    "SYSTEM_FIELDS",
    "SYSTEM_KEYS",
    "SystemSpec",
    "SystemTables",
    "is_ideal",
    "load_system",
    "system_from_dict",
]
