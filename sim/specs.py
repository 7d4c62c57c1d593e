"""Model and hardware profiles: what a model's weights look like, and how fast a machine moves and computes them.

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

import json
import math
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from sim.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = PROJECT_ROOT / "configs"
PROFILE_SUFFIXES = (".yaml", ".yml", ".json")
ROLES = ("encoder", "decoder")
GB = 1e9


# --------------------------------------------------------------------------------------------- field checks
# Shared by sim.config: each takes the value and the dotted field name, returns the clean value or raises.

def check_mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(where, f"must be a mapping, got {_show(value)}")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise ConfigError(where, f"keys must be strings, got {bad[0]!r}")
    return value


def check_keys(d: dict, where: str, required=(), optional=(), suffix: str = "") -> None:
    """Unknown keys first (the likelier typo), then missing ones."""
    known = list(required) + [k for k in optional if k not in required]
    for k in d:
        if k not in known:
            raise ConfigError(_join(where, k), f"unknown key (known: {', '.join(known)}){suffix}")
    for k in required:
        if k not in d:
            raise ConfigError(_join(where, k), f"missing{suffix}")


def check_int(value: Any, where: str, minimum: int | None = None, maximum: int | None = None,
              allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum):
        return int(value)
    if minimum is not None and maximum is not None:
        want = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
        want = f"an integer >= {minimum}"
    else:
        want = "an integer"
    if allow_none:
        want += " or null"
    raise ConfigError(where, f"must be {want}, got {_show(value)}")


def check_number(value: Any, where: str, minimum: float = 0.0, strict: bool = True,
                 maximum: float | None = None) -> float:
    """A finite real number > minimum (strict) or >= minimum."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > minimum if strict else value >= minimum) and (maximum is None or value <= maximum):
        return float(value)
    rel = ">" if strict else ">="
    want = f"a number {rel} {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
    raise ConfigError(where, f"must be {want}, got {_show(value)}")


def check_str(value: Any, where: str, allow_none: bool = False) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, f"must be a non-empty string, got {_show(value)}")
    return value


def check_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(where, f"must be true or false, got {_show(value)}")
    return value


def check_choice(value: Any, where: str, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(where, f"must be one of {', '.join(choices)}, got {_show(value)}")
    return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _show(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        text = repr(value)
        return text if len(text) <= 60 else f"a {type(value).__name__}"
    return repr(value)


def resolve_path(value: str | os.PathLike, where: str, what: str = "file") -> Path:
    """A user-given path: as given if absolute, else the current folder first, then the project root."""
    p = Path(value).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, PROJECT_ROOT / p]
    for c in candidates:
        if c.exists():
            if c.is_dir():
                raise ConfigError(where, f"{str(value)!r} is a folder, not a {what}")
            return c
    folders = [] if p.is_absolute() else list(dict.fromkeys(str(x) for x in (Path.cwd(), PROJECT_ROOT)))
    looked = f" (looked in {' and '.join(folders)})" if folders else ""
    raise ConfigError(where, f"no such {what} {str(value)!r}{looked}")


def read_structured_file(path: Path, where: str, name_file: bool = True) -> Any:
    """YAML (or JSON for ``.json``) content of ``path``; errors name ``where`` (and the file, unless ``name_file``
    is false because ``where`` is the file), on one line."""
    it = f"{path} is" if name_file else "is"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, f"cannot read{' ' + str(path) if name_file else ''} ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(where, f"{it} not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(where, f"{it} not valid YAML ({line}{problem})") from None


# --------------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class ModelSpec:
    """The shapes of an MoE model's weights. Sizes in elements; ``dtype_bytes`` per element.

    ``expert_bits`` (optional) is the routed experts' storage width in bits per weight, scales included, for
    checkpoints whose experts are quantized while the dense weights are not (e.g. gpt-oss: MXFP4 experts, 4 bits
    per weight plus one 8-bit scale per 32 weights = 4.25). It sets :attr:`expert_bytes` (what a copy moves and a
    slot holds); dense weights, shared experts, KV cache and activations keep ``dtype_bytes``. Default (None):
    ``8 * dtype_bytes``."""

    name: str
    d_model: int
    d_ff: int                 # expert FFN width
    expert_matrices: int      # 2 (ReLU/GELU: wi, wo) or 3 (gated: w1, w3, w2)
    num_experts: int          # routed experts per MoE layer
    top_k: int
    encoder_blocks: int       # transformer blocks in the encoder (0 for decoder-only)
    decoder_blocks: int       # transformer blocks in the decoder
    encoder_moe_layers: int   # MoE layers among them (the trace's encoder layers)
    decoder_moe_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    dense_d_ff: int           # FFN width of non-MoE blocks (0 when every block is MoE)
    dense_ffn_matrices: int   # 2 or 3
    shared_expert_d_ff: int   # total width of always-on shared experts in each MoE layer (0 if none)
    dtype_bytes: int          # 2 for bf16, 4 for fp32
    vocab_size: int
    expert_bits: float | None = None  # routed experts' bits per weight (scales included); None = 8 * dtype_bytes

    # -- per expert
    @property
    def expert_params(self) -> int:
        return self.expert_matrices * self.d_model * self.d_ff

    @property
    def expert_bits_per_weight(self) -> float:
        """The routed experts' storage width in bits per weight (``expert_bits``, or ``8 * dtype_bytes``)."""
        return 8.0 * self.dtype_bytes if self.expert_bits is None else float(self.expert_bits)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert's weights: ``ceil(expert_params * expert_bits / 8)``, with ``expert_bits``
        taken as the decimal it is written as (4.4 is 22/5, not its binary neighbour)."""
        if self.expert_bits is None:
            return self.expert_params * self.dtype_bytes
        return math.ceil(self.expert_params * Fraction(repr(float(self.expert_bits))) / 8)

    @property
    def expert_flops_per_token(self) -> int:
        return 2 * self.expert_params

    # -- layers
    @property
    def moe_layers(self) -> int:
        return self.encoder_moe_layers + self.decoder_moe_layers

    @property
    def is_encoder_decoder(self) -> bool:
        return self.encoder_blocks > 0

    def blocks(self, role: str) -> int:
        """Transformer blocks of the ``role`` stack."""
        return self.encoder_blocks if _role(role) == "encoder" else self.decoder_blocks

    def moe_layers_of(self, role: str) -> int:
        """MoE layers of the ``role`` stack."""
        return self.encoder_moe_layers if _role(role) == "encoder" else self.decoder_moe_layers

    # -- attention
    @property
    def attention_params_per_block(self) -> int:
        """Self-attention weights of one block: q and o (d_model x n_heads*head_dim), k and v (x n_kv_heads*head_dim).
        See :meth:`attention_params` for decoder blocks of an encoder-decoder model (with cross-attention)."""
        return 2 * self.d_model * self.head_dim * (self.n_heads + self.n_kv_heads)

    def attention_params(self, role: str) -> int:
        """Attention weights of one block of ``role``: doubled for decoder blocks of an encoder-decoder model,
        which have cross-attention beside self-attention."""
        double = _role(role) == "decoder" and self.is_encoder_decoder
        return self.attention_params_per_block * (2 if double else 1)

    @property
    def kv_bytes_per_block_token(self) -> int:
        """KV-cache bytes of one token in one decoder block (its K and V)."""
        return 2 * self.n_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token over all decoder blocks. In an encoder-decoder model a prompt token holds
        the cross-attention K/V of every decoder block and a generated token the self-attention K/V, so
        ``(prompt + generated tokens) * kv_bytes_per_token`` is a request's cache either way."""
        return self.decoder_blocks * self.kv_bytes_per_block_token

    # -- resident (non-expert) weights
    @property
    def dense_ffn_params(self) -> int:
        """Weights of one non-MoE FFN block."""
        return self.dense_ffn_matrices * self.d_model * self.dense_d_ff

    @property
    def shared_expert_params(self) -> int:
        """Weights of the always-on shared experts of one MoE layer (same matrix count as the routed experts)."""
        return self.expert_matrices * self.d_model * self.shared_expert_d_ff

    @property
    def gate_params(self) -> int:
        return self.d_model * self.num_experts

    @property
    def dense_params(self) -> int:
        """Every weight that stays on the GPU: embedding and LM head (counted untied), attention of every block,
        the FFN of every non-MoE block, shared experts and gates of every MoE layer. Norms and biases ignored."""
        attention = (self.encoder_blocks * self.attention_params("encoder")
                     + self.decoder_blocks * self.attention_params("decoder"))
        dense_ffn_blocks = (self.encoder_blocks - self.encoder_moe_layers) + (self.decoder_blocks - self.decoder_moe_layers)
        return (2 * self.vocab_size * self.d_model + attention + dense_ffn_blocks * self.dense_ffn_params
                + self.moe_layers * (self.shared_expert_params + self.gate_params))

    @property
    def dense_bytes(self) -> int:
        return self.dense_params * self.dtype_bytes

    @property
    def total_params(self) -> int:
        return self.dense_params + self.moe_layers * self.num_experts * self.expert_params

    def to_dict(self) -> dict:
        """The profile as a plain mapping (the model-file schema; loads back with :func:`load_model`).
        ``expert_bits`` appears only when set."""
        return {f: getattr(self, f) for f in MODEL_FIELDS if f != "expert_bits" or self.expert_bits is not None}


MODEL_FIELDS = tuple(ModelSpec.__dataclass_fields__)
_MODEL_REQUIRED = ("name", "d_model", "d_ff", "expert_matrices", "num_experts", "top_k", "decoder_blocks",
                   "decoder_moe_layers", "n_heads", "dtype_bytes", "vocab_size")
MODEL_KEYS = MODEL_FIELDS + ("base",)


def _role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def model_from_dict(d: Any, where: str = "model", suffix: str = "") -> ModelSpec:
    """Validate a model mapping (no ``base``) into a :class:`ModelSpec`. ``suffix`` ends every message
    (e.g. `` (in configs/models/x.yaml)``)."""
    d = check_mapping(d, where)
    check_keys(d, where, _MODEL_REQUIRED, MODEL_FIELDS, suffix)

    def f(key):
        return _join(where, key)

    def integer(key, minimum=1, maximum=None, default=None):
        value = d.get(key, default)
        try:
            return check_int(value, f(key), minimum, maximum)
        except ConfigError as exc:
            raise ConfigError(exc.field, exc.problem + suffix) from None

    def fail(key, problem):
        raise ConfigError(f(key), problem + suffix)

    name = d["name"]
    if not isinstance(name, str) or not name.strip():
        fail("name", f"must be a non-empty string, got {_show(name)}")
    d_model = integer("d_model")
    n_heads = integer("n_heads")
    if "head_dim" not in d and d_model % n_heads:
        fail("head_dim", f"missing, and d_model {d_model} is not a multiple of n_heads {n_heads}")
    expert_matrices = integer("expert_matrices", 2, 3)
    spec = ModelSpec(
        name=name, d_model=d_model, d_ff=integer("d_ff"), expert_matrices=expert_matrices,
        num_experts=integer("num_experts"), top_k=integer("top_k"),
        encoder_blocks=integer("encoder_blocks", 0, default=0), decoder_blocks=integer("decoder_blocks"),
        encoder_moe_layers=integer("encoder_moe_layers", 0, default=0),
        decoder_moe_layers=integer("decoder_moe_layers", 0),
        n_heads=n_heads, n_kv_heads=integer("n_kv_heads", default=n_heads),
        head_dim=integer("head_dim", default=d_model // n_heads),
        dense_d_ff=integer("dense_d_ff", 0, default=0),
        dense_ffn_matrices=integer("dense_ffn_matrices", 2, 3, default=expert_matrices),
        shared_expert_d_ff=integer("shared_expert_d_ff", 0, default=0),
        dtype_bytes=integer("dtype_bytes", 1, 8), vocab_size=integer("vocab_size"),
        expert_bits=_expert_bits(d.get("expert_bits"), f("expert_bits"), suffix))
    if spec.dtype_bytes not in (1, 2, 4, 8):
        fail("dtype_bytes", f"must be 1, 2, 4 or 8, got {spec.dtype_bytes}")
    if spec.top_k > spec.num_experts:
        fail("top_k", f"({spec.top_k}) exceeds num_experts ({spec.num_experts})")
    if spec.n_kv_heads > spec.n_heads:
        fail("n_kv_heads", f"({spec.n_kv_heads}) exceeds n_heads ({spec.n_heads})")
    for role in ROLES:
        if spec.moe_layers_of(role) > spec.blocks(role):
            fail(f"{role}_moe_layers", f"({spec.moe_layers_of(role)}) exceeds {role}_blocks ({spec.blocks(role)})")
        if spec.moe_layers_of(role) == 0 and spec.blocks(role) > 0:
            fail(f"{role}_moe_layers", f"must be >= 1 when {role}_blocks is {spec.blocks(role)}: every stack "
                                       "needs an MoE layer to carry its dense work")
        if spec.blocks(role) > spec.moe_layers_of(role) and spec.dense_d_ff == 0:
            fail("dense_d_ff", f"must be >= 1: the {role} has {spec.blocks(role) - spec.moe_layers_of(role)} "
                               "non-MoE blocks")
    return spec


def _expert_bits(value: Any, where: str, suffix: str) -> float | None:
    """``expert_bits``: None (absent: 8 * dtype_bytes), or a number of bits per weight in (0, 64]."""
    if value is None:
        return None
    try:
        return check_number(value, where, 0.0, strict=True, maximum=64.0)
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.problem + " (bits per expert weight, scales included)" + suffix) from None


def load_model(spec_or_name: Any, where: str = "model") -> ModelSpec:
    """A model profile from a name (``configs/models/NAME.yaml``), a path to a YAML/JSON file, an inline mapping
    (optionally with ``base``), or a :class:`ModelSpec` (returned as is)."""
    if isinstance(spec_or_name, ModelSpec):
        return spec_or_name
    d, source = _load_profile(spec_or_name, where, "models", MODEL_KEYS)
    suffix = "" if source == "inline" else f" (in {source})"
    return model_from_dict(d, where, suffix)


# --------------------------------------------------------------------------------------------- hardware
Points2 = tuple[tuple[float, float], ...]
Points3 = tuple[tuple[float, float, float], ...]


@dataclass(frozen=True)
class CalibrationTables:
    """Measured tables that override the roofline (all optional; each a list of points sorted by its inputs)."""

    copy: Points2 | None = None    # (bytes, seconds) host->device
    d2d: Points2 | None = None     # (bytes, seconds) device->device
    expert: Points2 | None = None  # (tokens routed to one expert, seconds) for THIS model's expert shape
    dense: Points3 | None = None   # (batch tokens, context length, seconds) dense work per MoE layer
    lm_head: Points2 | None = None  # (tokens, seconds) the LM head of THIS model
    model: str | None = None       # the model the expert/dense/lm_head tables were measured for

    def to_dict(self) -> dict:
        """The tables in the hardware-file schema (lists of lists, SI units)."""
        def pts(v):
            return None if v is None else [list(p) for p in v]
        return {"model": self.model, "copy": pts(self.copy), "d2d": pts(self.d2d), "expert": pts(self.expert),
                "dense": pts(self.dense), "lm_head": pts(self.lm_head)}


@dataclass(frozen=True)
class HardwareSpec:
    """A GPU and its host link, in SI units."""

    name: str
    gpu_memory_bytes: int
    hbm_bw: float             # bytes/s
    flops: float              # dense 16-bit FLOP/s
    flops_fp32: float         # used when the model's dtype_bytes == 4
    pcie_bw: float            # host->device bytes/s, pinned
    pcie_latency_s: float     # fixed cost per copy
    d2d_bw: float             # device->device copy bytes/s (default hbm_bw / 2: read + write)
    launch_overhead_s: float  # per kernel
    reserved_bytes: int       # runtime, activations, fragmentation: not available to weights/KV/tiers
    tables: CalibrationTables | None
    source: str               # the file it came from, or "inline"
    compute_slowdown: float = 1.0  # expert compute stretch while the link is busy (shared memory bandwidth), >= 1
    dense_slowdown: float = 1.0    # dense work and LM head stretch while the link is busy, >= 1
    copy_slowdown: float = 1.0     # copy stretch while compute runs, >= 1
    handoff_s: float = 0.0         # host wake-up between a copy and the compute that waits for it (and back)
    copy_gap_s: float = 0.0        # link idle between a landed copy and the next queued one's start
    layer_roundtrip_s: float = 0.0 # per MoE layer: the gate's choice to the host before the layer's copies/experts
    copy_issue_s: float = 0.0      # host time per copy issued
    expert_issue_s: float = 0.0    # host time per copied expert's compute issued (a floor on its duration)
    hit_issue_s: float = 0.0       # host time per cached expert's compute issued

    def rate(self, dtype_bytes: int) -> float:
        """Dense FLOP/s for weights of ``dtype_bytes`` per element."""
        return self.flops_fp32 if dtype_bytes >= 4 else self.flops

    def to_dict(self) -> dict:
        """The profile in the hardware-file schema (readable units); loads back with :func:`load_hardware`."""
        return {
            "name": self.name, "gpu_memory_gb": self.gpu_memory_bytes / GB, "hbm_bw_gb_s": self.hbm_bw / GB,
            "flops_tflops": self.flops / 1e12, "flops_fp32_tflops": self.flops_fp32 / 1e12,
            "pcie_bw_gb_s": self.pcie_bw / GB, "pcie_latency_us": self.pcie_latency_s * 1e6,
            "d2d_bw_gb_s": self.d2d_bw / GB, "launch_overhead_us": self.launch_overhead_s * 1e6,
            "reserved_gb": self.reserved_bytes / GB,
            "compute_slowdown": self.compute_slowdown, "dense_slowdown": self.dense_slowdown,
            "copy_slowdown": self.copy_slowdown,
            "handoff_us": self.handoff_s * 1e6, "copy_gap_us": self.copy_gap_s * 1e6,
            "layer_roundtrip_us": self.layer_roundtrip_s * 1e6, "copy_issue_us": self.copy_issue_s * 1e6,
            "expert_issue_us": self.expert_issue_s * 1e6, "hit_issue_us": self.hit_issue_s * 1e6,
            "tables": None if self.tables is None else self.tables.to_dict(),
            "source": self.source,
        }


HOST_COST_FIELDS = ("layer_roundtrip_us", "copy_issue_us", "expert_issue_us", "hit_issue_us")
_HW_REQUIRED = ("gpu_memory_gb", "hbm_bw_gb_s", "flops_tflops", "flops_fp32_tflops", "pcie_bw_gb_s",
                "pcie_latency_us", "launch_overhead_us", "reserved_gb")
HARDWARE_FIELDS = ("name",) + _HW_REQUIRED + ("d2d_bw_gb_s", "compute_slowdown", "dense_slowdown", "copy_slowdown",
                                              "handoff_us", "copy_gap_us") + HOST_COST_FIELDS + ("tables", "source")
HARDWARE_KEYS = HARDWARE_FIELDS + ("base",)
TABLE_KEYS = ("model", "copy", "d2d", "expert", "dense", "lm_head")


def hardware_from_dict(d: Any, where: str = "hardware", suffix: str = "", source: str = "inline") -> HardwareSpec:
    """Validate a hardware mapping (no ``base``) into a :class:`HardwareSpec`."""
    d = check_mapping(d, where)
    check_keys(d, where, _HW_REQUIRED, HARDWARE_FIELDS, suffix)

    def num(key, strict=True, default=None):
        try:
            return check_number(d.get(key, default), _join(where, key), 0.0, strict)
        except ConfigError as exc:
            raise ConfigError(exc.field, exc.problem + suffix) from None

    name = d.get("name", "inline")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(_join(where, "name"), f"must be a non-empty string, got {_show(name)}{suffix}")
    src = d.get("source", source)
    if not isinstance(src, str) or not src:
        raise ConfigError(_join(where, "source"), f"must be a non-empty string, got {_show(src)}{suffix}")
    hbm = num("hbm_bw_gb_s")
    d2d = num("d2d_bw_gb_s") if d.get("d2d_bw_gb_s") is not None else hbm / 2
    memory = num("gpu_memory_gb")
    reserved = num("reserved_gb", strict=False)
    if reserved >= memory:
        raise ConfigError(_join(where, "reserved_gb"), f"({reserved:g}) must be below gpu_memory_gb ({memory:g}){suffix}")
    return HardwareSpec(
        name=name, gpu_memory_bytes=int(round(memory * GB)), hbm_bw=hbm * GB, flops=num("flops_tflops") * 1e12,
        flops_fp32=num("flops_fp32_tflops") * 1e12, pcie_bw=num("pcie_bw_gb_s") * GB,
        pcie_latency_s=num("pcie_latency_us", strict=False) / 1e6, d2d_bw=d2d * GB,
        launch_overhead_s=num("launch_overhead_us", strict=False) / 1e6,
        reserved_bytes=int(round(reserved * GB)),
        compute_slowdown=_slowdown(d, "compute_slowdown", where, suffix),
        dense_slowdown=_slowdown(d, "dense_slowdown" if "dense_slowdown" in d else "compute_slowdown", where,
                                 suffix),
        copy_slowdown=_slowdown(d, "copy_slowdown", where, suffix),
        handoff_s=num("handoff_us", strict=False, default=0.0) / 1e6,
        copy_gap_s=num("copy_gap_us", strict=False, default=0.0) / 1e6,
        layer_roundtrip_s=num("layer_roundtrip_us", strict=False, default=0.0) / 1e6,
        copy_issue_s=num("copy_issue_us", strict=False, default=0.0) / 1e6,
        expert_issue_s=num("expert_issue_us", strict=False, default=0.0) / 1e6,
        hit_issue_s=num("hit_issue_us", strict=False, default=0.0) / 1e6,
        tables=tables_from_dict(d.get("tables"), _join(where, "tables"), suffix), source=src)


def _slowdown(d: dict, key: str, where: str, suffix: str) -> float:
    value = d.get(key, 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1.0:
        raise ConfigError(_join(where, key), f"must be a number >= 1 (1 = no interference), got {_show(value)}{suffix}")
    return float(value)


def tables_from_dict(d: Any, where: str = "hardware.tables", suffix: str = "") -> CalibrationTables | None:
    if d is None:
        return None
    d = check_mapping(d, where)
    check_keys(d, where, (), TABLE_KEYS, suffix)
    model = d.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ConfigError(_join(where, "model"), f"must be a model name or null, got {_show(model)}{suffix}")
    out = {k: _points(d.get(k), _join(where, k), 2, suffix) for k in ("copy", "d2d", "expert", "lm_head")}
    out["dense"] = _points(d.get("dense"), _join(where, "dense"), 3, suffix)
    if (out["expert"] or out["dense"] or out["lm_head"]) and model is None:
        raise ConfigError(_join(where, "model"), f"missing: expert, dense and lm_head tables hold for one model's "
                                                 f"shapes{suffix}")
    if all(v is None for v in out.values()):
        return None if model is None else CalibrationTables(model=model)
    return CalibrationTables(model=model, **out)


def _points(value: Any, where: str, arity: int, suffix: str):
    """A list of [x, y] (or [tokens, context, y]) points: finite, inputs >= 0, outputs >= 0, sorted, no repeats."""
    if value is None:
        return None
    what = "[x, seconds]" if arity == 2 else "[tokens, context, seconds]"
    if not isinstance(value, (list, tuple)):
        raise ConfigError(where, f"must be a list of {what} points, got {_show(value)}{suffix}")
    pts = []
    for i, p in enumerate(value):
        good = (isinstance(p, (list, tuple)) and len(p) == arity
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                        for x in p))
        if not good:
            raise ConfigError(f"{where}[{i}]", f"must be {what} with finite numbers >= 0, got {_show(p)}{suffix}")
        pts.append(tuple(float(x) for x in p))
    pts.sort()
    keys = [p[:-1] for p in pts]
    for a, b in zip(keys, keys[1:]):
        if a == b:
            raise ConfigError(where, f"repeats the point at {list(a)}{suffix}")
    if arity == 2:
        if len(pts) < 2:
            raise ConfigError(where, f"needs at least 2 points, got {len(pts)}{suffix}")
    else:
        if not pts:
            raise ConfigError(where, f"needs at least 1 point{suffix}")
        ts = sorted({p[0] for p in pts})
        cs = sorted({p[1] for p in pts})
        have = set(keys)
        for t in ts:
            for c in cs:
                if (t, c) not in have:
                    raise ConfigError(where, f"points must form a full grid over (tokens, context): "
                                             f"missing [{t:g}, {c:g}]{suffix}")
    return tuple(pts)


def load_hardware(spec_or_name: Any, where: str = "hardware") -> HardwareSpec:
    """A hardware profile from a name (``configs/hardware/NAME.yaml``), a path to a YAML/JSON profile or calibration
    file, an inline mapping (optionally with ``base``), or a :class:`HardwareSpec` (returned as is)."""
    if isinstance(spec_or_name, HardwareSpec):
        return spec_or_name
    d, source = _load_profile(spec_or_name, where, "hardware", HARDWARE_KEYS)
    suffix = "" if source == "inline" else f" (in {source})"
    return hardware_from_dict(d, where, suffix, source)


def available(kind: str) -> list[str]:
    """Names of the bundled profiles of ``kind`` ("models" or "hardware")."""
    folder = CONFIG_DIR / kind
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


# --------------------------------------------------------------------------------------------- profile files
def _is_path(text: str) -> bool:
    return text.lower().endswith(PROFILE_SUFFIXES) or "/" in text or os.sep in text


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def _load_profile(value: Any, where: str, kind: str, keys, depth: int = 0) -> tuple[dict, str]:
    """The mapping a profile reference stands for, with ``base`` references merged in, and its source."""
    if depth > 8:
        raise ConfigError(_join(where, "base"), "nests more than 8 levels (a cycle?)")
    singular = "model" if kind == "models" else kind
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(where, f"must be a {singular} name, a path or a mapping, got ''")
        if _is_path(value):
            path = resolve_path(value, where, f"{singular} file")
        else:
            path = CONFIG_DIR / kind / f"{value}.yaml"
            if not path.is_file():
                names = available(kind)
                raise ConfigError(where, f"unknown {singular} {value!r} (known: {', '.join(names) or 'none'}; "
                                         "or give a path to a .yaml/.json file)")
        source = _display(path)
        d = read_structured_file(path, where)
        if not isinstance(d, dict):
            raise ConfigError(where, f"{source} must hold a mapping, got {_show(d)}")
        d = dict(d)
        if "base" not in d:
            d.setdefault("name", path.stem)  # with a base, the base's name (a calibration of h200 is still h200)
    elif isinstance(value, dict):
        d, source = dict(check_mapping(value, where)), "inline"
    else:
        raise ConfigError(where, f"must be a {singular} name, a path or a mapping, got {_show(value)}")
    if "base" in d:
        base = d.pop("base")
        if not isinstance(base, str):
            raise ConfigError(_join(where, "base"), f"must be a {singular} name or path, got {_show(base)}")
        merged, base_source = _load_profile(base, _join(where, "base"), kind, keys, depth + 1)
        if source == "inline" and kind == "hardware" and "source" not in d:
            d["source"] = f"{base_source} (modified inline)" if len(d) > ("name" in d) else base_source
        merged.update(d)
        if source != "inline" and kind == "hardware":
            merged["source"] = source
        d = merged
    elif source != "inline" and kind == "hardware":
        d.setdefault("source", source)
    return d, source
