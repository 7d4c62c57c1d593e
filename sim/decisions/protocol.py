"""The decision protocol: the one piece of plain Python that asks a policy and a predictor for every decision, in
one order, for every engine. The SimPy engine (``sim/timing/engine.py``) times each step, the validator's executor
(``validate/executor.py``) runs it with torch, and :func:`sim.decisions.replay.replay` records it without time.

Per iteration (:meth:`DecisionProtocol.steps`): ``start_batch`` when a static batch begins, ``start_iteration``
on the policy and the predictor, then per MoE layer of the iteration's phase, a :class:`LayerStep` is handed to
the engine, which

1. does the layer's work up to its gate (dense work; the routing reaching the host), in its own time;
2. asks for the layer's decisions (:meth:`DecisionProtocol.decide`): the predictor guesses the next layer's
   experts and the policy picks the prefetches (``plan_prefetch``), then plans the layer (``plan_layer``):
   where each active expert comes from, what it promotes, which prefetches went unused;
3. does the layer's expert work;
4. asks for the next step, and the layer finishes (``finish_layer``).

A :class:`LayerStep` carries what an engine acts on, already sorted the way every engine acts on it: the unused
prefetches to drop, the experts served from the HPC/MPC (``resident``), the experts that come through copies in
active order (``copied``: each with its source, ``LPC`` for a prefetch now needed and ``MISS`` for a new copy),
the experts computed on the host CPU in active order (``cpu``: source ``CPU``; empty for a policy that
never computes on the host), and the prefetches for the next layer. :func:`cpu_tokens` gives the tokens whose
activations cross to the host for a layer's host experts (every engine uses it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.core.cache import CPU, HPC, LPC, MISS, MPC
from sim.core.workload import Iteration, active_sets, phase_layers
from sim.policies.base import Policy
from sim.predictors.base import PredictionScore, Predictor
from traces.format import Trace

__all__ = ["DecisionProtocol", "LayerDecision", "LayerStep", "cpu_tokens", "CPU", "HPC", "LPC", "MISS", "MPC"]

_NO_GUESS: frozenset[int] = frozenset()


@dataclass(frozen=True)
class LayerDecision:
    """One step's decisions as plain data (what the identical-decisions check compares)."""

    iteration: int
    layer: int
    active: tuple[int, ...]
    sources: tuple[tuple[int, str], ...]  # (expert, tier or "miss") in active order
    promote: tuple[tuple[int, int | None], ...]  # (expert, victim)
    prefetched: tuple[int, ...]  # experts of the NEXT layer copied ahead at this gate
    unused_prefetch: tuple[int, ...]


class LayerStep:
    """One MoE layer of one iteration, decided: what the engine does for it."""

    __slots__ = (
        "iteration",
        "layer",
        "next_layer",
        "active",
        "counts",
        "active_set",
        "next_set",
        "plan",
        "resident",
        "copied",
        "cpu",
        "prefetch",
    )

    def __init__(self, iteration, layer, next_layer, active, counts, active_set=None, next_set=None):
        self.iteration = iteration  # the Iteration
        self.layer = layer
        self.next_layer = next_layer  # None at the phase's last layer
        self.active = active  # sorted active experts
        self.counts = counts  # expert -> tokens routed to it
        # with a predictor: the active experts as a set, and the next layer's (what a perfect predictor would say;
        # None at the phase's last layer), each built once (the one the guess of a layer is scored against is the
        # one its predictor reads at that layer's gate)
        self.active_set: frozenset[int] | None = active_set
        self.next_set: frozenset[int] | None = next_set
        # decided (DecisionProtocol.decide):
        self.plan: Any = None  # the policy's LayerPlan (sources, promote, unused_prefetch)
        self.resident: Sequence[int] = ()  # active experts served from the HPC/MPC, in active order
        self.copied: Sequence[tuple[int, str]] = ()  # (expert, LPC | MISS) of the copied ones, in active order
        self.cpu: Sequence[int] = ()  # active experts computed on the host CPU (source CPU), in active order
        self.prefetch: Sequence[int] = ()  # experts of next_layer to copy ahead, in the policy's order

    @property
    def unused(self):
        """Experts prefetched for this layer that it did not use: their copies are dropped."""
        return self.plan.unused_prefetch

    def decision(self) -> LayerDecision:
        plan, active = self.plan, self.active
        return LayerDecision(
            self.iteration.index,
            self.layer,
            active,
            tuple((e, plan.sources[e]) for e in active),
            tuple(plan.promote.items()),
            tuple(self.prefetch),
            tuple(plan.unused_prefetch),
        )


def cpu_tokens(trace: Trace, iteration: Iteration, layer: int, experts) -> int:
    """The tokens of ``iteration`` routed to at least one of ``experts`` (the layer's host experts) at ``layer``:
    their activations cross the link to the host, and the host experts' outputs cross back (one copy each way)."""
    if not experts:
        return 0
    rows = iteration.rows
    if rows.size == 1:
        return 1
    ids = trace.experts[rows, layer]  # [tokens, k], -1 for no expert
    return int(np.isin(ids, np.fromiter(experts, dtype=ids.dtype)).any(axis=1).sum())


class DecisionProtocol:
    """Drives one policy and one predictor through a workload's iterations.

    ``score``: a :class:`PredictionScore` to add each guess to (the simulator reports prediction accuracy);
    ``record``: keep every step's :class:`LayerDecision` in ``decisions``; ``after_step(policy)``: called after each
    layer finishes (tests check the tiers there)."""

    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        predictor: Predictor,
        score: PredictionScore | None = None,
        record: bool = False,
        after_step=None,
    ):
        self.trace, self.policy, self.predictor = trace, policy, predictor
        self.score = score
        self.decisions: list[LayerDecision] | None = [] if record else None
        self.after_step = after_step
        self.phase_layers = phase_layers(trace)
        # ``plan_prefetch`` is asked at every gate but the phase's last, unless its answer is known: the base rule
        # (``Policy.plan_prefetch``) prefetches only guessed experts, so without a predictor it prefetches nothing
        self._asks_prefetch = (
            predictor.predicts or getattr(policy.plan_prefetch, "__func__", None) is not Policy.plan_prefetch
        )
        self._gives_counts = bool(getattr(policy, "wants_counts", False))
        self._predicts = self._asks_prefetch and predictor.predicts  # the predictor is asked at every gate
        # what ``decide`` counts the accesses into, and reads the tiers from (the cache's lists, kept for the run)
        cache = policy.cache
        self._counters, self._hpc, self._lpc_of = cache.counters, cache.hpc, cache.lpc_of
        self._hits = cache.counters.hits
        # bound once: the plan (the admission driver's, unless the policy plans its layers itself) and the layer's
        # end (the cache's, unless the policy ends its layers itself)
        own_plan = getattr(policy.plan_layer, "__func__", None) is not Policy.plan_layer
        self._plan_layer = policy.plan_layer if own_plan else policy.driver.plan
        own_finish = getattr(policy.finish_layer, "__func__", None) is not Policy.finish_layer
        self._finish_cache = None if own_finish else cache.finish_layer

    # What an engine reads of the policy, through the protocol (an engine talks to nothing else of the decisions)
    @property
    def hit_d2d(self) -> bool:
        """Whether a hit in the HPC or MPC is copied device-to-device into the working arena before it computes."""
        return bool(self.policy.hit_d2d)

    @property
    def promotion_is_free(self) -> bool:
        """Whether a promotion into the MPC costs no device-to-device copy (the policy copies into its slots)."""
        return bool(self.policy.promotion_is_free)

    @property
    def counters(self):
        """The cache's access counters (hits per tier, misses, evictions, promotions) the run reports."""
        return self._counters

    def check_tiers(self) -> None:
        """The policy's cache's full invariant check (tests run it after every layer)."""
        self.policy.cache.check()

    def steps(self, it: Iteration) -> Iterator[LayerStep]:
        """The iteration's layer steps, in order; a step not decided by its engine is decided when the next step
        is asked for, and then its layer finishes."""
        policy, predictor, after = self.policy, self.predictor, self.after_step
        if it.new_batch:
            policy.start_batch()
        policy.start_iteration(it)
        predictor.start_iteration(it)
        layers = self.phase_layers[it.kind]
        actives = active_sets(self.trace, it.rows, layers)
        index, finish, decide = it.index, policy.finish_layer, self.decide
        finish_cache = self._finish_cache
        nexts = layers[1:] + [None]
        sets: list = [frozenset(a) for a, _ in actives] if self._predicts else [None] * len(actives)
        for layer, (active, counts), nxt, active_set, next_set in zip(layers, actives, nexts, sets, sets[1:] + [None]):
            step = LayerStep(it, layer, nxt, active, counts, active_set, next_set)
            yield step
            if step.plan is None:
                decide(step)
            if finish_cache is not None:  # what Policy.finish_layer calls, without its frame
                finish_cache(layer)
            else:
                finish(index, layer)
            if after is not None:
                after(policy)

    def decide(self, step: LayerStep) -> LayerStep:
        """The layer's decisions, taken at its gate: the next layer's prefetches, then the layer's plan."""
        layer, index = step.layer, step.iteration.index
        if self._asks_prefetch and step.next_layer is not None:
            guess = _NO_GUESS
            predictor, nxt = self.predictor, step.next_layer
            if predictor.predicts:
                truth = step.next_set
                assert truth is not None and step.active_set is not None, "a predicting protocol builds the sets"
                guess = predictor.predict(index, nxt, truth, step.active_set)
                if self.score is not None:
                    self.score.add(nxt, guess, truth)
            step.prefetch = self.policy.plan_prefetch(index, nxt, guess)
        if self._gives_counts:
            self.policy.layer_counts = step.counts
        had_prefetch = bool(self._lpc_of[layer])  # else no active expert can come from a prefetch (LPC)
        plan = step.plan = self._plan_layer(index, layer, step.active)
        resident, copied, cpu = plan.split(step.active)
        step.resident, step.copied = resident, copied
        if cpu:
            step.cpu = cpu
        # the step's accesses, counted from the plan's sources (policies count nothing): a resident expert is an
        # HPC hit when it is in the layer's HPC, else an MPC hit; a copied one an LPC hit (a used prefetch) or a miss
        hits = self._hits
        if resident:
            hpc = self._hpc[layer]
            n_hpc = len(hpc.intersection(resident)) if hpc else 0
            if n_hpc:
                hits[HPC] += n_hpc
            hits[MPC] += len(resident) - n_hpc
        if copied:
            n_lpc = plan.prefetch_hits  # as classify counted them, or counted here
            if n_lpc is None:
                n_lpc = sum(1 for _, src in copied if src == LPC) if had_prefetch else 0
            if n_lpc:
                hits[LPC] += n_lpc
            self._counters.misses += len(copied) - n_lpc
        if cpu:
            self._counters.cpu += len(cpu)
        if self.decisions is not None:
            self.decisions.append(step.decision())
        return step

    def run(self, iterations: list[Iteration]) -> None:
        """Every step of every iteration, without time (``record`` keeps them)."""
        for it in iterations:
            for _ in self.steps(it):
                pass
