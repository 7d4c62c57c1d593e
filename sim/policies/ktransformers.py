"""`ktransformers` (Chen et al., "KTransformers: Unleashing the Full Potential of CPU/GPU Hybrid Inference for MoE
Models", SOSP 2025): the model's dense part (attention, shared experts, the gate) on the GPU, the routed experts on
the host CPU (its AMX kernels), except a static set of hot experts placed on the GPU; no expert weights cross the
link at run time, only the activations of the host experts, each way.

The rule here:

- The dense part is already the engine's GPU work for every policy.
- **Placement**: each cached layer's ``hpc_slots + mpc_slots`` hottest experts (``cache.hot_profile``) are pinned
  on the GPU for the run (all as HPC). Guess: KTransformers places GPU experts by a user's placement rules (and
  its expert-deferral / hot-expert options); the hot profile at equal slots per layer is our stand-in.
  ``params.placement: global`` pins instead the most popular experts of the whole model in the same room
  (``sim.policies.fiddler.global_placement``; always so in a shared cache). ``params.cpu_layers: N`` (N >= 0) is
  llama.cpp's ``--n-cpu-moe N``: the experts of the first N MoE layers stay on the host, every expert of the other
  layers is on the GPU (placement that differs by layer); the GPU room (``(hpc_slots + mpc_slots) x cached
  layers``, or ``cache.shared_slots``) must hold them, so that the config's memory check counts them. N counts MoE
  layers: llama.cpp counts blocks, dense ones included (DeepSeek-V3's first 3 blocks are dense: N blocks are
  N - 3 MoE layers). -1 (default): off. ``params.gpu_layers: "A-B[,C-D]"`` is llama.cpp's ``-ot`` by layer range
  (``system.placement.experts_on_gpu_layers``): every expert of the named MoE layers on the GPU, the others' on the
  host (null, the default: off; not with ``cpu_layers``).
- **Run time**: every other active expert is computed on the host (source ``cpu``); nothing is copied, promoted or
  prefetched. Uncached layers compute all their routed experts on the host.
- Expert deferral (a system's ``deferral``) is the engine's (``HostStream.run_deferring``, sim/timing/engine.py);
  CUDA-graph capture of the GPU side is how the GPU's work is priced anyway (no per-kernel launch cost).
"""

from __future__ import annotations

from moebase.checks import show
from moebase.errors import ConfigError
from sim.config.params import MAX_EXPERTS, between, matching, one_of
from sim.config.placement import RANGES_PATTERN, RANGES_WORDS, on_host, parse_ranges
from sim.core.cache import CPU, HPC
from sim.policies.base import POLICIES, LayerPlan, PolicyContext
from sim.policies.fiddler import PLACEMENTS, Placed


def check_cpu_layers(n: int, layers: int, model: str, where: str) -> None:
    """``cpu_layers: N`` keeps N MoE layers' experts on the host: at most the ``layers`` of ``model`` (its name, for
    the message)."""
    if n > layers:
        raise ConfigError(where, f"is {n}, more than the {layers} MoE layers of {model}")


def room_words(n, need: int, room: int) -> str:
    """Why ``cpu_layers: n`` (or ``gpu_layers: "A-B"``) does not fit the cache's room, and the one key that makes
    it fit."""
    key = "experts_on_gpu_layers" if isinstance(n, str) else "n_cpu_moe"
    shown = f'"{n}"' if isinstance(n, str) else n
    return (
        f"{shown} leaves {need} experts on the GPU, but the cache holds {room} ((hpc_slots + mpc_slots) x cached "
        f"layers, or cache.shared_slots): set system.placement.{key}: {shown} instead, which sizes the cache "
        f"(sim/config/placement.py), or cache.organization: shared with cache.shared_slots: {need}"
    )


@POLICIES.register("ktransformers")
class KTransformers(Placed):
    PARAMS = {"placement": "per-layer", "cpu_layers": -1, "gpu_layers": None}
    #: the param a system's placement by layer (``system.placement.n_cpu_moe``, sim/config/placement.py) sets
    host_layers_param = "cpu_layers"
    #: the param ``system.placement.experts_on_gpu_layers`` sets (the ranges' text)
    gpu_layers_param = "gpu_layers"
    PARAM_RULES = {
        "placement": one_of(*PLACEMENTS),
        "cpu_layers": between(-1, MAX_EXPERTS, kind=int),
        "gpu_layers": matching(RANGES_PATTERN, RANGES_WORDS),
    }

    @classmethod
    def validate_params(cls, params: dict, where: str) -> None:
        """``gpu_layers`` is layer ranges, and not given with ``cpu_layers`` (both place experts by layer)."""
        if params.get("gpu_layers") is None:
            return
        parse_ranges(params["gpu_layers"], f"{where}.gpu_layers")
        if params.get("cpu_layers", -1) >= 0:
            raise ConfigError(
                f"{where}.gpu_layers", f"and cpu_layers ({params['cpu_layers']}) both place experts by layer: give one"
            )

    @staticmethod
    def on_gpu(params: dict, layer: int) -> bool:
        """Whether every expert of MoE ``layer`` is on the GPU under the layer params (``cpu_layers`` or
        ``gpu_layers``; one of them set)."""
        ranges = params.get("gpu_layers")
        gpu = None if ranges is None else set(parse_ranges(ranges, "policy.params.gpu_layers"))
        return not on_host(layer, params["cpu_layers"], gpu)

    @staticmethod
    def by_layer(params: dict) -> bool:
        return params.get("cpu_layers", -1) >= 0 or params.get("gpu_layers") is not None

    @classmethod
    def check_for_run(cls, params: dict, where: str, run) -> None:
        """``cpu_layers`` counts MoE layers: at most the run's model's."""
        super().check_for_run(params, where, run)
        n, model = params.get("cpu_layers", -1), run.model
        check_cpu_layers(n, model.moe_layers, show(model.name), f"{where}.cpu_layers")
        gpu = params.get("gpu_layers")
        if gpu is not None:
            layers = parse_ranges(gpu, f"{where}.gpu_layers")
            if layers and layers[-1] >= model.moe_layers:
                raise ConfigError(
                    f"{where}.gpu_layers", f"names layer {layers[-1]}, beyond the {model.moe_layers} MoE layers"
                )

    @classmethod
    def check_with_cache(cls, params: dict, where: str, run, cache) -> None:
        """``cpu_layers: N`` keeps every expert of the cached layers from N on on the GPU: the room must hold them
        (refused when the config loads, as the placement would refuse it when the run starts)."""
        if not cls.by_layer(params):
            return
        roles = [x.role for x in run.trace.meta.model.layers]
        cached = [i for i, r in enumerate(roles) if cache.layers in ("all", r)]
        need = run.model.num_experts * sum(1 for layer in cached if cls.on_gpu(params, layer))
        room = cache.total_slots(len(cached))
        if need > room:
            key = "gpu_layers" if params.get("gpu_layers") is not None else "cpu_layers"
            raise ConfigError(f"{where}.{key}", room_words(params[key], need, room))

    def is_global(self, ctx: PolicyContext) -> bool:
        return self.by_layer(self.params) or super().is_global(ctx)

    def placement(self):
        params = self.params
        if not self.by_layer(params):
            return super().placement()
        ctx = self.ctx
        key = "gpu_layers" if params.get("gpu_layers") is not None else "cpu_layers"
        n = params[key]
        if key == "cpu_layers":
            check_cpu_layers(n, ctx.num_layers, "the run's model", "policy.params.cpu_layers")
        on_gpu = {layer for layer in ctx.cached_layers if self.on_gpu(params, layer)}
        placed = {
            layer: (list(ctx.hot_ranking[layer]) if layer in on_gpu else []) for layer in sorted(ctx.cached_layers)
        }
        need, room = sum(len(v) for v in placed.values()), ctx.shared_total()
        if need > room:
            raise ConfigError(f"policy.params.{key}", room_words(n, need, room))
        return placed

    def configure(self) -> None:
        self.pin_placed()

    def plan_prefetch(self, iteration, layer, predicted):
        return []

    def plan_layer(self, iteration: int, layer: int, active) -> LayerPlan:
        cache = self.cache
        hpc = cache.hpc[layer]
        sources, resident, cpu = {}, [], []
        for e in active:
            if e in hpc:
                sources[e] = HPC
                resident.append(e)
            else:
                sources[e] = CPU
                cpu.append(e)
        return LayerPlan(sources, {}, [], resident, [], cpu)
