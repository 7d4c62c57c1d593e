"""The decision objects a run config names, set up for a trace: the policy (with its tier sizes, cached layers and
hot-expert ranking) and the predictor. Plain Python shared by the simulator and the validator's executor."""

from __future__ import annotations

from pathlib import Path

from moebase.errors import ConfigError
from sim.config.run_config import RunConfig
from sim.costs.costs import CostModel
from sim.policies import POLICIES, Policy, PolicyContext
from sim.policies.base import hot_ranking_from_counts, selection_counts
from sim.predictors import PREDICTORS, Predictor, PredictorContext
from traces.format import Trace
from traces.io import load_trace


def cached_layers(trace: Trace, which: str) -> frozenset[int]:
    """MoE layers whose experts are cached (the others fetch on demand): all, decoder or encoder ones."""
    roles = [x.role for x in trace.meta.model.layers]
    if which == "all":
        return frozenset(range(len(roles)))
    return frozenset(i for i, r in enumerate(roles) if r == which)


def hot_ranking(cfg: RunConfig, trace: Trace) -> tuple[tuple[int, ...], ...]:
    """Per layer, experts from hottest to coldest, from ``cache.hot_profile``: ``trace`` (the run's own trace),
    a path to a profiling trace of the same model, or explicit per-layer lists (missing experts appended by id)."""
    profile = getattr(cfg.cache, "hot_profile", "trace")
    n_layers, n_exp = trace.num_layers, trace.num_experts
    if profile is None or profile == "trace":
        return hot_ranking_from_counts(selection_counts(trace.experts, n_exp))
    if isinstance(profile, (str, Path)):
        prof = load_trace(profile)
        if prof.num_layers != n_layers or prof.num_experts != n_exp:
            raise ConfigError(
                "cache.hot_profile",
                f"profiling trace {profile} has {prof.num_layers} layers x "
                f"{prof.num_experts} experts, the run's trace {n_layers} x {n_exp}",
            )
        return hot_ranking_from_counts(selection_counts(prof.experts, n_exp))
    if not isinstance(profile, (list, tuple)) or len(profile) != n_layers:
        raise ConfigError("cache.hot_profile", f"must be 'trace', a trace path, or {n_layers} per-layer lists")
    out = []
    for i, row in enumerate(profile):
        if (
            not isinstance(row, (list, tuple))
            or any(not isinstance(e, int) or not 0 <= e < n_exp for e in row)
            or len(set(row)) != len(row)
        ):
            raise ConfigError(f"cache.hot_profile[{i}]", f"must list distinct expert ids in 0..{n_exp - 1}")
        out.append(tuple(row) + tuple(e for e in range(n_exp) if e not in set(row)))
    return tuple(out)


def build_decisions(cfg: RunConfig, trace: Trace, iterations=None) -> tuple[Policy, Predictor]:
    """The policy and predictor a run config names, set up for ``trace`` (and the workload's ``iterations``,
    which offline policies read): plain Python, shared by engines."""
    roles = tuple(x.role for x in trace.meta.model.layers)
    # what offline parts may read: the whole workload, and the evaluated trace's path (a part trained on another
    # trace refuses that very file); the run's cost model (plain Python), which hybrid CPU/GPU policies weigh a copy
    # against computing an expert on the host with
    costs = CostModel(cfg.model, cfg.hardware, cfg.system)
    ctx = PolicyContext(
        num_layers=trace.num_layers,
        num_experts=trace.num_experts,
        layer_roles=roles,
        cached_layers=cached_layers(trace, cfg.cache.layers),
        hpc_slots=cfg.cache.hpc_slots,
        mpc_slots=cfg.cache.mpc_slots,
        hot_ranking=hot_ranking(cfg, trace),
        seed=cfg.seed,
        organization=getattr(cfg.cache, "organization", "per-layer"),
        shared_slots=getattr(cfg.cache, "shared_slots", None),
        trace=trace,
        iterations=iterations,
        trace_path=cfg.workload.trace,
        costs=costs,
    )
    try:
        policy = POLICIES.get(cfg.policy.name)(cfg.policy.params, ctx)
        predictor = PREDICTORS.get(cfg.predictor.name)(
            cfg.predictor.params,
            PredictorContext(trace.num_layers, trace.num_experts, cfg.seed, trace=trace, trace_path=cfg.workload.trace),
        )
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    return policy, predictor
