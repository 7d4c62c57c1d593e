"""One simulator run from a validated RunConfig: trace -> workload -> engine (asking policy and predictor) ->
summary. The same assembly (``build_decisions``) gives the validator its policy and predictor."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from importlib import metadata

from sim.config.run_config import RunConfig
from sim.core.experts_per_token import keep_top_experts
from sim.core.serving import ServingBatches, serving_batches
from sim.core.workload import Iteration, WorkloadInfo, build_iterations
from sim.costs.phase_costs import phase_costs_for
from sim.decisions.build import build_decisions, cached_layers, hot_ranking  # noqa: F401 (re-exported)
from sim.decisions.protocol import DecisionProtocol
from sim.policies import Policy
from sim.predictors.base import PredictionScore
from sim.request_results import request_summary
from sim.results import summarize
from sim.timing.engine import EngineResult, Simulation
from traces.format import Trace
from traces.io import file_sha256, load_trace


@dataclass
class RunOutput:
    summary: dict
    engine: EngineResult
    workload: WorkloadInfo
    resolved: dict
    policy: Policy


def versions() -> dict:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("moe-offload-sim", "simpy", "numpy", "pyyaml", "pandas"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def simulate(
    cfg: RunConfig,
    timeline: bool = False,
    progress=None,
    trace: Trace | None = None,
    check_invariants: bool = False,
    record_decisions: bool = False,
    bound: bool = False,
) -> RunOutput:
    """Run the simulator for one config; returns the summary and everything behind it (``record_decisions``: the
    engine keeps every step's decisions, ``engine.decisions``; ``bound``: the summary also holds
    ``throughput_bound_tok_s``, the most tokens/s the cost model allows the run, ``sim/timing/bound.py``)."""
    trace = trace if trace is not None else load_trace(cfg.workload.trace)
    trace = keep_top_experts(trace, cfg.system.experts_per_token)  # the trace as is unless the system reduces top-k
    w = cfg.workload
    batches = None
    if w.arrivals is not None:  # requests arriving in time: iterations made as the engine runs (no future to read)
        batches = serving_batches(cfg, trace)
        iterations: list[Iteration] | ServingBatches = batches
        policy, predictor = build_decisions(cfg, trace, None)
    else:
        iterations, info = build_iterations(
            trace,
            w.batch_size,
            w.batching,
            w.max_decode_tokens,
            w.prefill,
            w.requests,
            w.context_tokens,
            cfg.system.ubatch,
        )
        policy, predictor = build_decisions(cfg, trace, iterations)
    costs = policy.ctx.cost_model(cfg.policy.name)  # the run's, built once by build_decisions
    engine = Simulation
    if bound:
        from sim.timing.bound import BoundedSimulation

        engine = BoundedSimulation
    score = PredictionScore(len(trace.meta.model.layers))
    protocol = DecisionProtocol(trace, policy, predictor, score, record_decisions)
    sim = engine(
        trace,
        iterations,
        protocol,
        costs,
        cfg.cache.lpc_buffers,
        cfg.cache.prefetch_reserve,
        timeline=timeline,
        progress=progress,
        check_invariants=check_invariants,
        phase=phase_costs_for(costs, w.context_tokens),
    )
    res = sim.run()
    if batches is not None:
        info = batches.info()
    labels = {
        "policy": cfg.policy.name,
        "predictor": cfg.predictor.name,
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "hardware_source": cfg.hardware.source,
        "batch_size": w.batch_size,
        "batching": w.batching,
        "seed": cfg.seed,
    }
    summary = summarize(res, policy.cache.counters, info, labels)
    if res.requests is not None:
        summary.update(request_summary(res.requests, w.slo, res.sim_time_s))
    if bound:
        least = getattr(sim, "bound_s", 0.0)
        summary["throughput_bound_tok_s"] = float(info.decode_tokens / least) if least > 0 else None
    resolved = dict(cfg.resolved)
    if "system" not in resolved:  # the default system, left out of the config's id: shown after the hardware
        shown = {}
        for k, v in resolved.items():
            shown[k] = v
            if k == "hardware":
                shown["system"] = cfg.system.to_dict()
        resolved = shown
    resolved["provenance"] = {"versions": versions(), "trace_sha256": file_sha256(cfg.workload.trace)}
    return RunOutput(summary, res, info, resolved, policy)


__all__ = ["RunOutput", "build_decisions", "cached_layers", "hot_ranking", "simulate"]
