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

The mapping is meant to grow (llama.cpp's ``-ot`` tensor overrides by layer range, say): each key is a field of
:class:`Placement`, checked on its own, and :func:`host_layers` turns the placement into the set of MoE layers whose
experts stay on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.config.checks import check_keys, check_mapping, integer, show
from sim.config.fields import keys_of, read_settings, setting, to_plain
from sim.errors import ConfigError

#: The most MoE layers a placement may name (the trace format's bound on layers).
MAX_PLACED_LAYERS = 4096
#: The cache keys a placement sets, and the value each takes (shared_slots: computed).
PLACED_CACHE = {"hpc_slots": 0, "mpc_slots": 0, "organization": "shared"}


@dataclass(frozen=True)
class Placement:
    """Where the routed experts live, by layer (file keys)."""

    # llama.cpp's --n-cpu-moe N: the experts of the first N MoE layers on the host, the others on the GPU
    n_cpu_moe: int | None = setting(None, integer(0, MAX_PLACED_LAYERS, allow_none=True), constructor_default=True)

    def to_dict(self) -> dict:
        return to_plain(self)

    @property
    def is_set(self) -> bool:
        return self.n_cpu_moe is not None


def placement_from(value: Any, where: str) -> Placement | None:
    """``system.placement``: null (none), or a mapping of :class:`Placement`'s keys."""
    if value is None:
        return None
    d = check_mapping(value, where)
    check_keys(d, where, (), keys_of(Placement), see="sim/config/placement.py")
    p = Placement(**read_settings(Placement, d, where))
    return p if p.is_set else None


def host_layers(placement: Placement, moe_layers: int) -> range:
    """The MoE layers whose routed experts stay on the host."""
    return range(min(placement.n_cpu_moe or 0, moe_layers))


def apply_placement(d: dict, placement: Placement | None, model, policy_class) -> None:
    """Fill the raw run config ``d`` (in place) with what ``placement`` implies: the policy's layer parameter and the
    cache's tiers. ``model``: the run's :class:`~sim.config.model.ModelSpec` (its encoder MoE layers first, as in a
    trace); ``policy_class``: the class the config's policy names (None when it names none a registry knows: its own
    check reports that). ConfigError naming the key that disagrees."""
    if placement is None or not placement.is_set:
        return
    n = placement.n_cpu_moe
    where = "system.placement.n_cpu_moe"
    if n is not None and n > model.moe_layers:
        raise ConfigError(where, f"is {n}, more than the {model.moe_layers} MoE layers of {show(model.name)}")
    if policy_class is None or getattr(policy_class, "all_resident", False):
        return  # an unknown policy is refused by its own check; gpu-only (the ceiling) keeps every expert anyway
    _set_policy(d, n, policy_class, where)
    roles = ["encoder"] * model.encoder_moe_layers + ["decoder"] * model.decoder_moe_layers
    _set_cache(d, placement, model, roles, where)


def _set_policy(d: dict, n: int | None, policy_class, where: str) -> None:
    param = getattr(policy_class, "host_layers_param", None)
    name = getattr(policy_class, "name", "?")
    if param is None:
        raise ConfigError(
            where,
            f"places experts by layer as llama.cpp does, which runs no cache policy; policy {show(name)} does "
            "not (give policy.name: ktransformers, or system.placement.n_cpu_moe: null to run a cache policy)",
        )
    policy = d["policy"]
    policy = {"name": policy} if isinstance(policy, str) else dict(check_mapping(policy, "policy"))
    params = dict(check_mapping(policy.get("params") or {}, "policy.params"))
    given = params.get(param)
    if given is not None and given != -1 and given != n:
        raise ConfigError(
            f"policy.params.{param}",
            f"is {show(given)}, but {where} is {n}: give one of them (the placement sets it)",
        )
    params[param] = n
    policy["params"] = params
    d["policy"] = policy


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
    n = placement.n_cpu_moe
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


__all__ = ["MAX_PLACED_LAYERS", "Placement", "apply_placement", "host_layers", "placement_from", "policy_class"]
