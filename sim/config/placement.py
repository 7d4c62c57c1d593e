"""Where a serving system keeps the routed experts, by layer: ``system.placement``, one mapping in the system profile
(or a run config's ``system:`` mapping, or ``--set system.placement.KEY=VALUE``).

Today it holds llama.cpp's ``--n-cpu-moe N`` as ``placement: {n_cpu_moe: N}``: the routed experts of the first N MoE
layers stay in host memory and are computed there, every expert of the other layers is on the GPU, and nothing is
copied at run time. From that one field the run follows:

- the policy's layer placement: a policy that places whole layers on the host declares the parameter that takes N
  (``host_layers_param``: ``cpu_layers`` of ``ktransformers``), which is set to N; a cache policy is refused, since
  llama.cpp runs none (``gpu-only``, the ceiling with every expert on the GPU, ignores the placement);
- the GPU's experts: one shared cache (``cache.organization: shared``) of exactly the GPU layers' experts
  (``cache.shared_slots`` = experts per layer x the cached MoE layers from N on), no per-layer slots
  (``hpc_slots: 0``, ``mpc_slots: 0``) and one working buffer unless ``cache.lpc_buffers`` says otherwise; the memory
  check then counts them beside the dense weights and the KV cache.

A cache size or ``cpu_layers`` given as well must equal what follows (so a resolved config loads back); another
value is refused naming its key. N counts MoE layers, as ``cpu_layers`` does (llama.cpp counts blocks, dense ones
included: for a model whose first blocks are dense, such as DeepSeek-V3's 3, N blocks are N - 3 MoE layers).

``placement: {experts_on_gpu_layers: "A-B[,C-D]"}`` is llama.cpp's ``-ot`` tensor overrides by layer range (e.g.
``-ot "blk.(1[0-9]|2[0-9]).ffn_.*_exps=CPU"`` keeps layers 10-29 on the host, which is ``"0-9,30-47"`` here): every
routed expert of the named MoE layers (0-based, ranges inclusive, in increasing order, not overlapping) is on the
GPU, the experts of every other MoE layer stay on the host. It sets the policy's ``gpu_layers_param``
(``gpu_layers`` of ``ktransformers``) to the canonical text of the ranges and sizes the shared cache from the GPU
layers, as ``n_cpu_moe`` does; the two keys are one field, so giving both is refused. Layer ids count MoE layers, as
``n_cpu_moe`` does: for a model whose first D blocks are dense, llama.cpp's block B is MoE layer B - D.

Each key is a field of :class:`Placement`, checked on its own, and :func:`host_layers` turns the placement into the
set of MoE layers whose experts stay on the host.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from moebase.checks import check_keys, check_mapping, integer, show
from moebase.errors import ConfigError
from moebase.fields import keys_of, read_settings, setting, to_plain

#: The most MoE layers a placement may name (the trace format's bound on layers).
MAX_PLACED_LAYERS = 4096
#: The cache keys a placement sets, and the value each takes (shared_slots: computed).
PLACED_CACHE = {"hpc_slots": 0, "mpc_slots": 0, "organization": "shared"}
#: Layer ranges as text: ``A`` or ``A-B``, joined by commas (spaces around them allowed).
RANGES_PATTERN = r"\s*[0-9]{1,4}(\s*-\s*[0-9]{1,4})?(\s*,\s*[0-9]{1,4}(\s*-\s*[0-9]{1,4})?)*\s*"
RANGES_WORDS = 'layer ranges "A-B[,C-D]" (0-based MoE layers, inclusive, increasing, not overlapping)'


def parse_ranges(value, where: str) -> tuple[int, ...]:
    """The layers of ``"A-B[,C-D]"`` (a single layer ``A`` is ``A-A``), in order; ConfigError naming ``where`` for
    text that is not ranges, a range that runs backwards, or ranges out of order or overlapping."""
    if not isinstance(value, str) or re.fullmatch(RANGES_PATTERN, value) is None:
        raise ConfigError(where, f'must be {RANGES_WORDS}, e.g. "0-9,20-29", got {show(value)}')
    layers: list[int] = []
    for part in value.split(","):
        a, _, b = part.partition("-")
        lo, hi = int(a), int(b or a)
        if hi < lo:
            raise ConfigError(where, f"has the range {lo}-{hi}, which runs backwards (give {hi}-{lo})")
        if layers and lo <= layers[-1]:
            raise ConfigError(
                where, f"has {part.strip()} after layer {layers[-1]}: ranges must increase and not overlap"
            )
        if hi >= MAX_PLACED_LAYERS:
            raise ConfigError(where, f"names layer {hi}, beyond the {MAX_PLACED_LAYERS} layers a trace may have")
        layers.extend(range(lo, hi + 1))
    return tuple(layers)


def ranges_text(layers) -> str:
    """The canonical text of a set of layers: ``"0-9,20-29"`` (a lone layer as ``"5-5"``)."""
    out: list[str] = []
    ids = sorted(set(layers))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def _ranges(value, where: str) -> str | None:
    """``experts_on_gpu_layers``: null, or layer ranges (kept in canonical text); a whole number is the one layer
    (``--set ...experts_on_gpu_layers=3`` reads 3 as a number)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        value = str(value)
    return None if value is None else ranges_text(parse_ranges(value, where))


@dataclass(frozen=True)
class Placement:
    """Where the routed experts live, by layer (file keys)."""

    # llama.cpp's --n-cpu-moe N: the experts of the first N MoE layers on the host, the others on the GPU
    n_cpu_moe: int | None = setting(None, integer(0, MAX_PLACED_LAYERS, allow_none=True), constructor_default=True)
    # llama.cpp's -ot by layer range: every routed expert of these MoE layers on the GPU, the others' on the host
    experts_on_gpu_layers: str | None = setting(None, _ranges, constructor_default=True)

    def to_dict(self) -> dict:
        d = to_plain(self)
        if d["experts_on_gpu_layers"] is None:  # left out, so that an n_cpu_moe placement reads as before
            d.pop("experts_on_gpu_layers")
        return d

    @property
    def is_set(self) -> bool:
        return self.n_cpu_moe is not None or self.experts_on_gpu_layers is not None

    @property
    def gpu_layers(self) -> tuple[int, ...] | None:
        """The MoE layers named by ``experts_on_gpu_layers`` (None when it is not given)."""
        if self.experts_on_gpu_layers is None:
            return None
        return parse_ranges(self.experts_on_gpu_layers, "system.placement.experts_on_gpu_layers")

    @property
    def key(self) -> str:
        """The file key that places the experts."""
        return "n_cpu_moe" if self.n_cpu_moe is not None else "experts_on_gpu_layers"

    @property
    def value(self):
        return self.n_cpu_moe if self.n_cpu_moe is not None else self.experts_on_gpu_layers


def placement_from(value: Any, where: str) -> Placement | None:
    """``system.placement``: null (none), or a mapping of :class:`Placement`'s keys."""
    if value is None:
        return None
    d = check_mapping(value, where)
    check_keys(d, where, (), keys_of(Placement), see="sim/config/placement.py")
    p = Placement(**read_settings(Placement, d, where))
    if p.n_cpu_moe is not None and p.experts_on_gpu_layers is not None:
        raise ConfigError(
            f"{where}.experts_on_gpu_layers",
            f"and n_cpu_moe ({p.n_cpu_moe}) both place the experts by layer: give one of them",
        )
    return p if p.is_set else None


def on_host(layer: int, n_cpu_moe: int | None, gpu_layers: Collection[int] | None) -> bool:
    """Whether MoE ``layer``'s routed experts stay on the host: the layers ``gpu_layers`` does not name when it is
    given (llama.cpp's ``-ot`` by layer range), else the first ``n_cpu_moe`` (``--n-cpu-moe``; None: none). The one
    rule the placement, the host memory check and the layer-placing policies read."""
    if gpu_layers is not None:
        return layer not in gpu_layers
    return layer < (n_cpu_moe or 0)


def host_layers(placement: Placement, moe_layers: int) -> list[int]:
    """The MoE layers whose routed experts stay on the host."""
    gpu = None if placement.gpu_layers is None else set(placement.gpu_layers)
    return [layer for layer in range(moe_layers) if on_host(layer, placement.n_cpu_moe, gpu)]


def apply_placement(d: dict, placement: Placement | None, model, policy_class) -> None:
    """Fill the raw run config ``d`` (in place) with what ``placement`` implies: the policy's layer parameter and the
    cache's tiers. ``model``: the run's :class:`~moebase.model.ModelSpec` (its encoder MoE layers first, as in a
    trace); ``policy_class``: the class the config's policy names (None when it names none a registry knows: its own
    check reports that). ConfigError naming the key that disagrees."""
    if placement is None or not placement.is_set:
        return
    n = placement.n_cpu_moe
    where = f"system.placement.{placement.key}"
    if n is not None and n > model.moe_layers:
        raise ConfigError(where, f"is {n}, more than the {model.moe_layers} MoE layers of {show(model.name)}")
    gpu = placement.gpu_layers
    if gpu and gpu[-1] >= model.moe_layers:
        raise ConfigError(
            where,
            f"names layer {gpu[-1]}, but {show(model.name)} has {model.moe_layers} MoE layers "
            f"(0-{model.moe_layers - 1})",
        )
    if policy_class is None or getattr(policy_class, "all_resident", False):
        return  # an unknown policy is refused by its own check; gpu-only (the ceiling) keeps every expert anyway
    if gpu is not None:
        _set_policy(d, placement.experts_on_gpu_layers, policy_class, where, "gpu_layers_param")
    else:
        _set_policy(d, n, policy_class, where)
    roles = ["encoder"] * model.encoder_moe_layers + ["decoder"] * model.decoder_moe_layers
    _set_cache(d, placement, model, roles, where)


def _set_policy(d: dict, n, policy_class, where: str, declared: str = "host_layers_param") -> None:
    """Set the policy's parameter ``declared`` names (``host_layers_param``: N host layers; ``gpu_layers_param``:
    the ranges of GPU layers) to ``n``."""
    param = getattr(policy_class, declared, None)
    name = getattr(policy_class, "name", "?")
    if param is None:
        raise ConfigError(
            where,
            f"places experts by layer as llama.cpp does, which runs no cache policy; policy {show(name)} does "
            f"not (give policy.name: ktransformers, or {where}: null to run a cache policy)",
        )
    policy = d["policy"]
    policy = {"name": policy} if isinstance(policy, str) else dict(check_mapping(policy, "policy"))
    params = dict(check_mapping(policy.get("params") or {}, "policy.params"))
    given = params.get(param)
    if given is not None and given != -1 and given != n and not (isinstance(n, str) and _same_ranges(given, n)):
        raise ConfigError(
            f"policy.params.{param}",
            f"is {show(given)}, but {where} is {n}: give one of them (the placement sets it)",
        )
    params[param] = n
    policy["params"] = params
    d["policy"] = policy


def _same_ranges(given, text: str) -> bool:
    """Whether ``given`` is layer-range text naming the same layers as ``text``."""
    try:
        return parse_ranges(given, "") == parse_ranges(text, "")
    except ConfigError:
        return False


def _set_cache(d: dict, placement: Placement, model, layer_roles: list[str], where: str) -> None:
    cache = d.get("cache")
    cache = {} if cache is None else dict(check_mapping(cache, "cache"))
    layers = cache.get("layers", "all")
    cached = [i for i, role in enumerate(layer_roles) if layers in ("all", role)]
    on_host = set(host_layers(placement, len(layer_roles)))
    derived: dict[str, Any] = {
        **PLACED_CACHE,
        "shared_slots": model.num_experts * sum(1 for layer in cached if layer not in on_host),
    }
    n = placement.value
    for key in ("gpu_memory_gb", "split"):
        if cache.get(key) is not None:
            raise ConfigError(
                f"cache.{key}",
                f"{where} ({n}) places the GPU's experts itself ({derived['shared_slots']} in a shared cache): "
                f"leave cache.{key} out",
            )
    for key, value in derived.items():
        if cache.get(key) is not None and cache[key] != value:
            raise ConfigError(
                f"cache.{key}",
                f"is {show(cache[key])}, but {where} ({n}) places {derived['shared_slots']} experts on the GPU, "
                f"in one shared cache ({key}: {show(value)}): leave cache.{key} out, or --set cache=null",
            )
    cache.update(derived)
    cache.setdefault("lpc_buffers", 1)
    if cache["lpc_buffers"] is None:
        cache["lpc_buffers"] = 1
    d["cache"] = cache


def policy_class(value: Any, registry) -> Any:
    """The class a raw ``policy`` value (a name or ``{name, params}``) names in ``registry``; None when it names
    none (the policy's own check reports that)."""
    name = value.get("name") if isinstance(value, dict) else value
    return registry.get(name) if isinstance(name, str) and name in registry.names() else None


__all__ = [
    "MAX_PLACED_LAYERS",
    "Placement",
    "apply_placement",
    "host_layers",
    "parse_ranges",
    "placement_from",
    "policy_class",
    "ranges_text",
]
