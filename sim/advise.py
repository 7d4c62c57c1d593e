"""`python -m sim advise CONFIG [--set ...] [--json OUT]`: the best setting of the knobs a user controls on the
config's machine, found by simulating candidates, and the command that reproduces its figure.

The knobs (everything else, the model, the hardware, the serving system, the trace, stays as the config and its
``--set`` give it):

- **policy and predictor**: the policies the config's serving system runs (:data:`SYSTEM_POLICIES`: llama.cpp and
  kTransformers place experts, Fiddler computes on the host, mixtral-offloading caches with LRU, DeepSpeed copies
  on demand, as each profile in ``configs/systems/`` says), or for the ``ideal`` system (or one of the user's own)
  every registered policy but the offline bounds (``origin: bound``: they read the future); ``--policies``
  chooses others (``all`` includes the bounds). Each runs with the config's predictor, its own declared one
  (:attr:`Policy.default_predictor`, the oracle only where the config names the oracle) and ``none``; a policy
  that never reads the predictor's guesses (``Policy.reads_predictions``) runs once.
- **cache tiers**, within the GPU's memory beside the dense weights, the KV cache of the batch and the reserve: the
  config's tier shape scaled to the most expert slots that fit, then, for the best ``TOP`` policies, steps while
  one is faster: other shares of the HPC, half and twice the working buffers, the other cache organization
  (shared / per layer), every MoE layer cached (:func:`geometry_stage`).
- **host layers** (llama.cpp's ``--n-cpu-moe``: ``system.placement.n_cpu_moe``, or the ``cpu_layers`` of
  ``ktransformers`` where the config sets it): a coarse grid of layer counts, then finer steps around the best
  (:func:`host_layer_stage`), each with exactly the GPU room its other layers need.
- **batch size**, only with ``--batch-sizes``: the whole search at each.

A candidate is a set of ``--set`` overrides applied after the config's own and the command line's; it is loaded
and simulated exactly as ``sim run`` loads and simulates (:func:`sim.config.run_config.load_run_config`,
:func:`sim.run.simulate`), so ``python -m sim run CONFIG --set ...`` with the printed settings gives the same
tokens/s. A candidate that does not fit in the GPU's memory, or that the config refuses for another reason, is left
out of the ranking and counted (the config's own setting too). Same inputs, same result: the search and the
simulator are deterministic. ``--max-candidates`` bounds the simulated runs; ``--quick`` runs fewer.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from moebase.errors import ConfigError
from moebase.outputs import check_not_input
from sim.config.memory import DoesNotFit
from sim.config.run_config import (
    MAX_BATCH,
    MAX_BUFFERS,
    RunConfig,
    cached_layer_count,
    dense_bytes_of,
    load_run_config,
    read_trace_summary,
)
from sim.config.units import GB
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from traces.io import atomic_write_bytes, check_output_file, load_trace

#: The policies a named serving system runs (``configs/systems/NAME.yaml``, each profile's "Policy:" line);
#: any other system (``ideal``, a user's own profile) may run every deployable policy.
SYSTEM_POLICIES = {
    "llama-cpp": ("ktransformers",),  # --n-cpu-moe N: system.placement.n_cpu_moe (HOST_LAYER_SYSTEMS)
    "ik-llama-cpp": ("ktransformers",),  # the same placement by layer
    "ktransformers": ("ktransformers",),
    "ktransformers-v0.2": ("ktransformers",),
    "ktransformers-v0.3": ("ktransformers",),
    "ktransformers-sosp25": ("ktransformers",),
    "kt-kernel": ("ktransformers",),
    "fiddler": ("fiddler",),
    "mixtral-offloading": ("lru", "on-demand"),
    "deepspeed": ("on-demand",),
}
#: Systems that place experts by whole layers (llama.cpp's --n-cpu-moe): the host-layer search, through
#: ``system.placement.n_cpu_moe``.
HOST_LAYER_SYSTEMS = ("llama-cpp", "ik-llama-cpp")
#: The placement by layer ranges (llama.cpp's -ot), cleared when the search sets n_cpu_moe (one field).
RANGES_KEY = "system.placement.experts_on_gpu_layers"
PLACEMENT_KEY = "system.placement.n_cpu_moe"
TOP = 3  # policies whose cache tiers are searched (1 with --quick)
HPC_SHARES = (0.0, 0.25, 0.5)  # shares of a layer's slots tried for the HPC
COARSE = 5  # host-layer counts of the coarse grid
REFINE_POINTS = 4  # per side and round
REFINE_ROUNDS = 3
MAX_CANDIDATES = 5_000
DEFAULT_MAX_CANDIDATES = 150
MAX_BATCH_SIZES = 16
SHOWN = 15  # rows of the printed table


# ------------------------------------------------------------------------------------------------ knobs
@dataclass(frozen=True)
class Geometry:
    """The cache tiers of a candidate, as the config's ``cache`` fields."""

    hpc: int
    mpc: int
    lpc: int
    organization: str
    shared: int | None
    layers: str


@dataclass(frozen=True)
class Knobs:
    """What a candidate sets; None keeps the config's (its policy's params too)."""

    policy: str | None = None
    predictor: str | None = None
    params: tuple[tuple[str, Any], ...] = ()  # policy params the search sets (cpu_layers)
    geometry: Geometry | None = None
    batch: int | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # other --set pairs (system.placement.n_cpu_moe)


@dataclass
class Root:
    """The config as the user gave it (with ``--set``): what every candidate's settings change."""

    config: str
    sets: list[str]
    cfg: RunConfig
    force_cache: bool = False  # every cache key in each candidate's settings (the config sizes its tiers from memory)
    force_policy: bool = False  # policy.name and policy.params in each (the config as given does not fit)


def settings_of(knobs: Knobs, root: Root) -> dict[str, Any]:
    """The ``--set`` keys and values of a candidate, applied after the root's."""
    cfg, out = root.cfg, dict[str, Any]()
    if knobs.batch is not None:
        out["workload.batch_size"] = knobs.batch
    if knobs.policy is not None and (root.force_policy or knobs.policy != cfg.policy.name):
        out["policy.name"] = knobs.policy
        out["policy.params"] = dict(knobs.params)
    else:
        out.update({f"policy.params.{k}": v for k, v in knobs.params})
    if knobs.predictor is not None and knobs.predictor != cfg.predictor.name:
        out["predictor.name"] = knobs.predictor
        out["predictor.params"] = {}
    if knobs.geometry is not None:
        out.update(cache_settings(root, knobs.geometry))
    out.update(knobs.extra)
    return out


def cache_settings(root: Root, g: Geometry) -> dict[str, Any]:
    """The cache keys that give ``g``: those that differ from the config's, or all of them (``force_cache``)."""
    c, force = root.cfg.cache, root.force_cache
    out: dict[str, Any] = dict(NULL_SPLIT) if force else {}
    reserve = min(c.prefetch_reserve, g.lpc - 1)
    pairs = [
        ("layers", g.layers, c.layers),
        ("hpc_slots", g.hpc, c.hpc_slots),
        ("mpc_slots", g.mpc, c.mpc_slots),
        ("lpc_buffers", g.lpc, c.lpc_buffers),
        ("prefetch_reserve", reserve, c.prefetch_reserve),
        ("organization", g.organization, c.organization),
        ("shared_slots", g.shared, c.shared_slots),
    ]
    out.update({f"cache.{k}": v for k, v, given in pairs if force or v != given})
    return out


def set_text(key: str, value: Any) -> str:
    """``KEY=VALUE`` as ``--set`` reads it (the value in YAML flow style, as a sweep's overrides)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip()
    return f"{key}={text.removesuffix('...').strip()}"


def set_texts(settings: dict[str, Any]) -> list[str]:
    return [set_text(k, v) for k, v in settings.items()]


# ------------------------------------------------------------------------------------------------ memory
def room_experts(cfg: RunConfig) -> int:
    """Experts (at the run's expert bytes) the GPU holds beside the dense weights, the batch's KV cache and the
    reserve: the room the tiers share (the same sum as the config's memory check)."""
    m, hw, w = cfg.model, cfg.hardware, cfg.workload
    tokens = read_trace_summary(w.trace).max_request_tokens(w.max_decode_tokens)
    fixed = dense_bytes_of(m, cfg.system) + w.batch_size * tokens * m.kv_bytes_per_token + hw.reserved_bytes
    return max(math.floor((hw.gpu_memory_bytes - fixed) / m.expert_bytes), -1)


def largest(cfg: RunConfig, room: int, hpc_share: float, lpc: int, organization: str, layers: str):
    """The tiers of the most expert slots that fit in ``room`` experts with ``lpc`` working buffers (None when even
    the buffers do not fit), the HPC taking ``hpc_share`` of a layer's slots."""
    m = cfg.model
    n = cached_layer_count(m, layers)
    free = room - lpc
    if free < 0 or n == 0:
        return None
    if organization == "shared":
        c = cfg.cache
        return Geometry(c.hpc_slots, c.mpc_slots, lpc, "shared", min(m.num_experts * n, free), layers)
    slots = min(m.num_experts, free // n)
    hpc = round(hpc_share * slots)
    return Geometry(hpc, slots - hpc, lpc, "per-layer", None, layers)


def hpc_share(cfg: RunConfig) -> float:
    c = cfg.cache
    total = c.hpc_slots + c.mpc_slots
    return c.hpc_slots / total if total else 0.0


# ------------------------------------------------------------------------------------------------ candidates
@dataclass
class Candidate:
    knobs: Knobs
    settings: dict[str, Any]
    tok_s: float | None = None
    reason: str | None = None  # why it was left out
    cfg: RunConfig | None = None
    fits: bool = True  # False: left out because it does not fit in the GPU's memory


def _memory(exc: ConfigError) -> bool:
    """Whether a refusal is about GPU memory: the config's memory check (the tiers, every expert of an all-resident
    policy, the KV cache), or the room that host layers leave."""
    return isinstance(exc, DoesNotFit) or exc.field.endswith("cpu_layers")


@dataclass
class Search:
    """Runs candidates (each once: two settings that load to the same config run once), within a budget."""

    root: Root
    budget: int
    progress: Callable[[str], None] | None = None
    ran: list[Candidate] = field(default_factory=list)
    left_out: list[Candidate] = field(default_factory=list)
    stopped: bool = False
    _seen: dict[str, Candidate] = field(default_factory=dict)
    _traces: dict[str, Any] = field(default_factory=dict)

    def run(self, knobs: Knobs) -> Candidate | None:
        """The candidate of ``knobs``, simulated (or left out, with its reason); None when the budget is spent."""
        settings = settings_of(knobs, self.root)
        key = json.dumps(settings, sort_keys=True)
        if key in self._seen:
            return self._seen[key]
        cand = Candidate(knobs, settings)
        self._seen[key] = cand
        try:
            cfg = load_run_config(
                self.root.config, self.root.sets + set_texts(settings), POLICIES.names(), PREDICTORS.names()
            )
        except ConfigError as exc:
            return self._leave_out(cand, str(exc), fits=not _memory(exc))
        same = json.dumps(cfg.resolved, sort_keys=True, default=str)
        if same in self._seen:  # other settings, the same run
            self._seen[key] = self._seen[same]
            return self._seen[same]
        if len(self.ran) >= self.budget:
            self.stopped = True
            del self._seen[key]
            return None
        self._seen[same] = cand
        return self._simulate(cand, cfg)

    def trace(self, cfg: RunConfig):
        """The config's trace, read once."""
        path = str(cfg.workload.trace)
        if path not in self._traces:
            self._traces[path] = load_trace(path)
        return self._traces[path]

    def _leave_out(self, cand: Candidate, reason: str, fits: bool = True) -> Candidate:
        cand.reason, cand.fits = reason, fits
        self.left_out.append(cand)
        return cand

    def _simulate(self, cand: Candidate, cfg: RunConfig) -> Candidate:
        from sim.run import simulate

        try:
            summary = simulate(cfg, trace=self.trace(cfg)).summary
        except ConfigError as exc:  # refused when the run starts (a placement that needs more room)
            return self._leave_out(cand, str(exc), fits=not _memory(exc))
        cand.cfg, cand.tok_s = cfg, float(summary["throughput_tok_s"])
        self.ran.append(cand)
        if self.progress:
            self.progress(f"[{len(self.ran)}] {describe(cand)}: {cand.tok_s:,.1f} tokens/s")
        return cand


def reads(c: Candidate) -> bool:
    """Whether the candidate's policy reads its predictor's guesses (``Policy.reads_predictions``)."""
    assert c.cfg is not None
    cls = POLICIES.get(c.cfg.policy.name)
    return bool(getattr(cls, "reads_predictions", lambda params: True)(c.cfg.policy.params))


def ok(c: Candidate | None) -> bool:
    return c is not None and c.tok_s is not None


# ------------------------------------------------------------------------------------------------ stages
@dataclass
class Plan:
    """What to search: the (policy, predictor or None for the options) entries, batch sizes, host layers."""

    entries: list[tuple[str, str | None]]
    batches: list[int | None]
    host_layers: str | None  # the policy whose host layers are searched
    quick: bool


def predictor_options(policy: str, cfg: RunConfig, quick: bool) -> list[str]:
    """The config's predictor, the policy's own (not the oracle unless the config names it) and none."""
    config = cfg.predictor.name
    if quick:
        return [config]
    own = getattr(POLICIES.get(policy), "default_predictor", None)
    out = [config]
    if own is not None and (own != "oracle" or config == "oracle"):
        out.append(own)
    out.append("none")
    return list(dict.fromkeys(out))


def policy_stage(search: Search, plan: Plan, base: RunConfig, batch: int | None) -> list[Candidate]:
    """Each policy with each predictor option, at the config's tier shape scaled to the largest that fits."""
    found: list[Candidate] = []
    for policy, fixed in plan.entries:
        shape = shape_of(base)
        if shape.organization == "shared" and not POLICIES.get(policy).supports_shared:
            shape = replace(shape, organization="per-layer")
        g = None if placed(base) else shape.geometry(base)
        options = [fixed] if fixed else predictor_options(policy, base, plan.quick)
        for predictor in options:
            c = search.run(Knobs(policy, predictor, geometry=g, batch=batch))
            if c is None:
                return found
            if c.tok_s is None:
                if not c.fits:
                    break  # it does not fit: with no predictor either
                continue
            found.append(c)
            if not reads(c):
                break  # it never reads the predictor's guesses: another predictor changes nothing
    return found


@dataclass(frozen=True)
class Shape:
    """Tiers as a shape: the HPC's share of a layer's slots, the working buffers, the organization and the cached
    layers; its geometry is the largest that fits (:func:`largest`)."""

    share: float
    lpc: int
    organization: str
    layers: str

    def geometry(self, cfg: RunConfig) -> Geometry | None:
        return largest(cfg, room_experts(cfg), self.share, self.lpc, self.organization, self.layers)


def shape_of(cfg: RunConfig) -> Shape:
    c = cfg.cache
    return Shape(hpc_share(cfg), c.lpc_buffers, c.organization, c.layers)


def shape_steps(shape: Shape, policy: str) -> list[Shape]:
    """One step of the tier search from ``shape``: other HPC shares, or half and twice the buffers, or the other
    organization (where the policy manages a shared cache), or every MoE layer cached."""
    return [
        *(replace(shape, share=x) for x in HPC_SHARES if shape.organization == "per-layer"),
        *(replace(shape, lpc=x) for x in (max(1, shape.lpc // 2), min(2 * shape.lpc, MAX_BUFFERS))),
        *([replace(shape, organization="shared")] if POLICIES.get(policy).supports_shared else []),
        replace(shape, organization="per-layer"),
        replace(shape, layers="all"),
    ]


def geometry_stage(search: Search, base: RunConfig, start: Candidate) -> None:
    """From ``start``'s tiers, coordinate steps (:func:`shape_steps`) while one is faster, each shape the largest
    that fits."""
    assert start.cfg is not None
    policy = start.cfg.policy.name
    if POLICIES.get(policy).all_resident or placed(base):
        return
    best, shape = start, replace(shape_of(base), organization=start.cfg.cache.organization)
    tried = {shape}
    while True:
        step: dict[Shape, Candidate] = {}
        for s in shape_steps(shape, policy):
            if s in tried:
                continue
            tried.add(s)
            g = s.geometry(base)
            if g is None:
                continue
            c = search.run(replace(best.knobs, geometry=g))
            if c is None:
                return
            if ok(c):
                step[s] = c
        faster = [(s, c) for s, c in step.items() if (c.tok_s or 0.0) > (best.tok_s or 0.0)]
        if not faster:
            return
        shape, best = max(faster, key=lambda sc: sc[1].tok_s or 0.0)


def host_layer_stage(search: Search, base: RunConfig, policy: str, batch: int | None) -> None:
    """N MoE layers' experts on the host, every expert of the others on the GPU in exactly that room: a coarse grid
    of N, then finer steps around the best N (:func:`refine`). For a system that places experts by layer
    (llama.cpp) N is ``system.placement.n_cpu_moe``, else ``policy``'s own parameter (``host_layers_param``:
    ktransformers' ``cpu_layers``); the room is one shared cache of the GPU layers' experts."""
    from sim.run import cached_layers

    m = base.model
    cached = cached_layers(search.trace(base), base.cache.layers)
    param = POLICIES.get(policy).host_layers_param

    def knobs(n: int) -> Knobs:
        if placed(base):  # the policy and the tiers follow from the system's placement
            placement = base.system.placement
            ranges = placement is not None and placement.experts_on_gpu_layers is not None  # -ot ranges give way
            return Knobs(batch=batch, extra=(((RANGES_KEY, None),) if ranges else ()) + ((PLACEMENT_KEY, n),))
        if by_layer(base):  # the placement sets the tiers: the config's go (but its cached layers)
            layers = () if base.cache.layers == "all" else (("cache.layers", base.cache.layers),)
            return Knobs(policy, None, (), None, batch, extra=(("cache", None), *layers, (PLACEMENT_KEY, n)))
        room = m.num_experts * sum(1 for layer in cached if layer >= n)
        g = Geometry(0, 0, 1, "shared", room, base.cache.layers)
        return Knobs(policy, None, ((param, n),), g, batch)

    refine(lambda n: search.run(knobs(n)), 0, m.moe_layers, lambda: search.stopped)


def by_layer(cfg: RunConfig) -> bool:
    """Whether the system places experts by whole layers (llama.cpp): its placement is the knob, not a policy."""
    return placed(cfg) or cfg.system.name in HOST_LAYER_SYSTEMS


def placed(cfg: RunConfig) -> bool:
    """Whether the system places experts by layer (``system.placement``): the policy and tiers follow from it."""
    placement = getattr(cfg.system, "placement", None)
    return placement is not None and bool(getattr(placement, "is_set", True))


def refine(evaluate: Callable[[int], Candidate | None], lo: int, hi: int, stop: Callable[[], bool]) -> None:
    """Evaluate integers in [lo, hi]: ``COARSE`` evenly spaced, then rounds of up to ``REFINE_POINTS`` evenly spaced
    between the best one and each evaluated neighbour, until no integer is left there or ``REFINE_ROUNDS``."""
    done: dict[int, Candidate | None] = {}

    def visit(points) -> None:
        for n in sorted(set(points) - set(done)):
            if stop():
                return
            done[n] = evaluate(n)

    visit(_spaced(lo, hi, COARSE))
    for _ in range(REFINE_ROUNDS):
        ranked = [n for n in sorted(done) if ok(done[n])]
        if not ranked or stop():
            return
        best = max(ranked, key=lambda n: done[n].tok_s or 0.0)  # type: ignore[union-attr]
        below = max((n for n in done if n < best), default=lo)
        above = min((n for n in done if n > best), default=hi)
        inner = _spaced(below, best, REFINE_POINTS + 2)[1:-1] + _spaced(best, above, REFINE_POINTS + 2)[1:-1]
        if not set(inner) - set(done):
            return
        visit(inner)


def _spaced(lo: int, hi: int, k: int) -> list[int]:
    """Up to ``k`` integers evenly spaced from ``lo`` to ``hi``, both included."""
    if hi <= lo:
        return [lo]
    return sorted({lo + round(i * (hi - lo) / (k - 1)) for i in range(k)})


def search_all(search: Search, plan: Plan) -> None:
    """Every stage at each batch size."""
    root = search.root
    search.run(Knobs())  # the config as given: what the others are measured against
    for batch in plan.batches:
        base = root.cfg
        if batch is not None:  # the config at that batch size, then the search there
            base = replace(base, workload=replace(base.workload, batch_size=batch))
            if search.run(Knobs(batch=batch)) is None:
                return
        if not by_layer(base):  # llama.cpp runs no cache policy: its one knob is the host layers
            found = policy_stage(search, plan, base, batch)
            if search.stopped:
                return
            for start in _top(found, 1 if plan.quick else TOP):
                geometry_stage(search, base, start)
                if search.stopped:
                    return
        if plan.host_layers is not None:
            host_layer_stage(search, base, plan.host_layers, batch)
            if search.stopped:
                return


def _top(found: list[Candidate], k: int) -> Iterator[Candidate]:
    """The best candidate of each of the ``k`` best (policy, predictor) pairs."""
    seen: set[tuple[str, str]] = set()
    for c in sorted(found, key=lambda c: -(c.tok_s or 0.0)):
        assert c.cfg is not None
        pair = (c.cfg.policy.name, c.cfg.predictor.name)
        if pair in seen:
            continue
        seen.add(pair)
        yield c
        if len(seen) == k:
            return


# ------------------------------------------------------------------------------------------------ the plan
def default_entries(cfg: RunConfig) -> list[tuple[str, str | None]]:
    """The system's policies (:data:`SYSTEM_POLICIES`), else every policy but the offline bounds."""
    from sim.compare import all_entries

    if cfg.system.name in SYSTEM_POLICIES:
        return [(p, None) for p in SYSTEM_POLICIES[cfg.system.name]]
    return [(p, None) for p, _ in all_entries() if getattr(POLICIES.get(p), "origin", None) != "bound"]


def host_layer_policy(cfg: RunConfig, entries: list[tuple[str, str | None]]) -> str | None:
    """The policy whose host layers are searched (one that declares ``host_layers_param``: ktransformers), for
    llama.cpp or a config that sets that parameter itself; None: no host-layer search."""
    able = [p for p, _ in entries if getattr(POLICIES.get(p), "host_layers_param", None)]
    if not able:
        return None
    param = getattr(POLICIES.get(cfg.policy.name), "host_layers_param", None)
    own = cfg.policy.params.get(param, -1) if param else -1
    if cfg.system.name in HOST_LAYER_SYSTEMS or placed(cfg) or (isinstance(own, int) and own >= 0):
        return cfg.policy.name if cfg.policy.name in able else able[0]
    return None


def parse_batch_sizes(text: str | None) -> list[int | None]:
    """``1,4,8`` -> [1, 4, 8] (each 1..MAX_BATCH, distinct, at most MAX_BATCH_SIZES); None -> [None]."""
    if text is None:
        return [None]
    items = [x.strip() for x in str(text).split(",")]
    out: list[int | None] = []
    for item in items:
        if not item.isdigit() or not 1 <= int(item) <= MAX_BATCH:
            raise ConfigError("--batch-sizes", f"{item[:40]!r} is not a batch size (an integer 1..{MAX_BATCH})")
        if int(item) in out:
            raise ConfigError("--batch-sizes", f"{item} is listed twice")
        out.append(int(item))
    if len(out) > MAX_BATCH_SIZES:
        raise ConfigError("--batch-sizes", f"{len(out)} batch sizes, more than {MAX_BATCH_SIZES}")
    return out


NULL_SPLIT = {"cache.gpu_memory_gb": None, "cache.split": None}
#: Tiers that fit wherever the KV cache does: what the search starts from when the config as given does not fit.
LEAST: dict[str, Any] = {
    "policy.name": "on-demand",
    "policy.params": {},
    **NULL_SPLIT,
    "cache.hpc_slots": 0,
    "cache.mpc_slots": 0,
    "cache.lpc_buffers": 1,
    "cache.prefetch_reserve": 0,
    "cache.organization": "per-layer",
    "cache.shared_slots": None,
}


def load_root(config: str, sets: list[str]) -> Root:
    """The config with ``--set``. When its tiers (or its policy's) do not fit, the search starts from the least
    (:data:`LEAST`) and every candidate names its policy and tiers in full (``force_policy``, ``force_cache``); a
    config that sizes its tiers from memory (``gpu_memory_gb`` and ``split``) has them replaced by slot counts
    (``force_cache``). Any other problem, or a KV cache that does not fit alone, is the config's error."""
    names = POLICIES.names(), PREDICTORS.names()
    try:
        cfg = load_run_config(config, sets, *names)
    except ConfigError as exc:
        if not _memory(exc):
            raise
        try:
            least = load_run_config(config, sets + set_texts(LEAST), *names)
        except ConfigError:
            raise exc from None
        return Root(config, sets, least, force_cache=True, force_policy=True)
    try:
        same = load_run_config(config, sets + set_texts(NULL_SPLIT), *names).resolved == cfg.resolved
    except ConfigError:
        same = False
    return Root(config, sets, cfg, force_cache=not same)


# ------------------------------------------------------------------------------------------------ output
def describe(c: Candidate) -> str:
    """A candidate in words: policy, predictor, tiers, host layers, batch."""
    cfg = c.cfg
    if cfg is None:
        return ", ".join(set_texts(c.settings)) or "the config as given"
    policy = f"{cfg.policy.name} (predictor {cfg.predictor.name})" if reads(c) else cfg.policy.name
    words = [policy, cache_words(cfg)]
    n = cfg.policy.params.get("cpu_layers", -1) if isinstance(cfg.policy.params, dict) else -1
    if isinstance(n, int) and n >= 0:
        words.append(f"the experts of the first {n} of {cfg.model.moe_layers} MoE layers on the host")
    if "workload.batch_size" in c.settings:
        words.append(f"batch {cfg.workload.batch_size}")
    return ", ".join(words)


def cache_words(cfg: RunConfig) -> str:
    c, m = cfg.cache, cfg.model
    if POLICIES.get(cfg.policy.name).all_resident:
        return "every expert on the GPU"
    n = cached_layer_count(m, c.layers)
    gb = (c.total_slots(n) + c.lpc_buffers) * m.expert_bytes / GB
    tiers = (
        f"{c.total_slots(n):,} slots shared by {n} layers"
        if c.organization == "shared"
        else f"HPC {c.hpc_slots} + MPC {c.mpc_slots} x {n} layers"
    )
    buffers = f"{c.lpc_buffers} buffer{'s' if c.lpc_buffers != 1 else ''}"
    return f"{tiers} + {buffers} ({gb:.3g} GB)"


def ranked(search: Search) -> list[Candidate]:
    """The simulated candidates, fastest first (ties: in the order they ran)."""
    return sorted(search.ran, key=lambda c: -(c.tok_s or 0.0))


def command(root: Root, settings: dict[str, Any]) -> str:
    """The ``sim run`` line that reproduces a candidate."""
    words = ["python", "-m", "sim", "run", root.config]
    for text in root.sets + set_texts(settings):
        words += ["--set", text]
    return " ".join(shlex.quote(w) for w in words)


def report(search: Search, given: Candidate | None) -> dict:
    """The JSON document: best, candidates (fastest first), left out, the reproducing command."""
    rows = ranked(search)
    best = rows[0]
    return {
        "config": search.root.config,
        "set": search.root.sets,
        "searched": len(search.ran),
        "stopped_at_max_candidates": search.stopped,
        "config_tok_s": given.tok_s if given is not None else None,
        "best": {"settings": best.settings, "tok_s": best.tok_s, "command": command(search.root, best.settings)},
        "candidates": [{"settings": c.settings, "tok_s": c.tok_s, "what": describe(c)} for c in rows],
        "left_out": [{"settings": c.settings, "reason": c.reason} for c in search.left_out],
    }


def table(search: Search, given: Candidate | None) -> str:
    """The best candidate of each policy and predictor (and host layers, batch size), fastest first."""
    rows, seen = [], set()
    for c in ranked(search):
        key = _family(c)
        if key not in seen:
            seen.add(key)
            rows.append(c)
    ref = given.tok_s if given is not None and given.tok_s else None
    lines = ["| rank | tokens/s | x config | setting |", "|---|---|---|---|"]
    shown = rows[:SHOWN] + ([given] if given in rows[SHOWN:] else [])
    for c in shown:
        ratio = "-" if ref is None else f"{(c.tok_s or 0.0) / ref:.2f}"
        what = "the config as given" if not c.settings else describe(c)
        lines.append(f"| {rows.index(c) + 1} | {c.tok_s:,.1f} | {ratio} | {what} |")
    more = len(search.ran) - len(shown)
    if more:
        lines.append(f"(the fastest of each policy and predictor; {more} more candidates in the JSON, --json OUT)")
    return "\n".join(lines)


def _family(c: Candidate) -> tuple:
    """What a table row stands for: the config as given, or a policy, predictor, host layers and batch size."""
    if not c.settings or c.cfg is None:
        return ("given",)
    params = c.cfg.policy.params
    return (c.cfg.policy.name, c.cfg.predictor.name, params.get("cpu_layers"), c.settings.get("workload.batch_size"))


def summary_text(search: Search, given: Candidate | None) -> str:
    from sim.results import hardware_words

    cfg, root = search.root.cfg, search.root
    best = ranked(search)[0]
    hw = hardware_words({"hardware": cfg.hardware.name, "hardware_source": cfg.hardware.source})
    fits = sum(1 for c in search.left_out if not c.fits)
    head = [
        f"advise: {cfg.model.name} on {hw}, system {cfg.system.name}, trace {Path(cfg.workload.trace).name}",
        f"simulated {len(search.ran)} candidates"
        + (" (stopped at --max-candidates)" if search.stopped else "")
        + f"; left out {len(search.left_out)} ({fits} do not fit in the GPU's memory, "
        f"{len(search.left_out) - fits} refused otherwise)",
    ]
    if given is not None and given.tok_s is None:
        head.append(f"the config as given: {given.reason}")
    head.append(f"best: {describe(best)}: {best.tok_s:,.1f} tokens/s")
    return "\n".join([*head, "", table(search, given), "", f"reproduce: {command(root, best.settings)}"])


# ------------------------------------------------------------------------------------------------ command line
def _progress() -> Callable[[str], None] | None:
    if not sys.stderr.isatty():
        return None
    return lambda text: print(f"  {text}", file=sys.stderr, flush=True)


def register(sub) -> None:
    p = sub.add_parser(
        "advise",
        help="search the policy, cache tiers, host layers (and batch size) for the best tokens/s that fits",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1] if __doc__ else None,
    )
    p.add_argument("config", help="run config (YAML): its model, hardware, system and workload stay fixed")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a config field (repeatable)")
    p.add_argument("--json", metavar="OUT", help="write the best setting and every candidate to this JSON file")
    p.add_argument(
        "--policies",
        help="comma-separated policies (POLICY@PREDICTOR fixes the predictor; 'all' includes the offline bounds); "
        "default: the system's policies, or every policy but the bounds",
    )
    p.add_argument("--batch-sizes", metavar="B,B,...", help="also search these batch sizes (e.g. 1,4,8)")
    p.add_argument("--requests", type=int, metavar="N", help="serve N requests (workload.requests=N; shorter runs)")
    p.add_argument("--quick", action="store_true", help="the config's predictor only, and tiers of the best policy")
    p.add_argument(
        "--max-candidates",
        type=int,
        default=DEFAULT_MAX_CANDIDATES,
        metavar="N",
        help=f"simulate at most N candidates (default {DEFAULT_MAX_CANDIDATES})",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from sim.compare import parse_entries

    if not 1 <= args.max_candidates <= MAX_CANDIDATES:
        raise ConfigError("--max-candidates", f"must be 1..{MAX_CANDIDATES}, got {args.max_candidates}")
    if args.requests is not None and not 1 <= args.requests <= 1 << 20:
        raise ConfigError("--requests", f"must be 1..{1 << 20}, got {args.requests}")
    batches = parse_batch_sizes(args.batch_sizes)
    entries = parse_entries(args.policies) if args.policies else None
    if args.json is not None:
        check_output_file(args.json, "advice (--json)")
        check_not_input(Path(args.json), [args.config], flag="--json")
    sets = list(args.set or []) + ([] if args.requests is None else [set_text("workload.requests", args.requests)])
    root = load_root(args.config, sets)
    entries = entries or default_entries(root.cfg)
    plan = Plan(entries, batches, host_layer_policy(root.cfg, entries), args.quick)
    search = Search(root, args.max_candidates, _progress())
    search_all(search, plan)
    if not search.ran:
        first = search.left_out[0].reason if search.left_out else "nothing to search"
        raise ConfigError("advise", f"no candidate could run; the first: {first}")
    given = next((c for c in search.ran + search.left_out if not c.settings), None)
    doc = report(search, given)
    if args.json is not None:
        atomic_write_bytes(args.json, (json.dumps(doc, indent=1) + "\n").encode())
    print(summary_text(search, given))
    if args.json is not None:
        print(f"written: {args.json}")
    return 0
