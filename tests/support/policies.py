"""Driving policies and predictors without the engine, as ``sim.run.build_decisions`` sets them up: a policy's
context, the replay with a cache check after every step, the steps each layer sees, and hand-made traces."""

from __future__ import annotations

from sim.core.cache import HPC, MPC
from sim.core.workload import active_sets, build_iterations, phase_layers
from sim.decisions.replay import replay
from sim.policies import POLICIES, PolicyContext
from sim.policies.base import hot_ranking_from_counts, selection_counts
from sim.predictors import PREDICTORS, PredictorContext

#: Hypothesis settings (``settings`` keyword arguments) for the slower plain-restatement comparisons: no
#: deadline, the same examples every run.
BOUNDED = dict(deadline=None, derandomize=True, database=None)

#: Params of the `noisy` predictor wherever a test does not choose its own.
NOISY = {"recall": 0.7, "precision": 0.6}

#: A hand-made one-layer, top-2 trace of 14 tokens over 6 experts.
ONE_LAYER_HAND_MADE = [
    [[0, 1]],
    [[2, 3]],
    [[2, 4]],
    [[2, 4]],
    [[5, 1]],
    [[3, 4]],
    [[3, 4]],
    [[0, 5]],
    [[5, 3]],
    [[1, 2]],
    [[4, 5]],
    [[4, 5]],
    [[4, 0]],
    [[3, 2]],
]

#: A hand-made decode-only trace: 2 layers, top-2, 8 experts, 3 requests.
TWO_LAYER_HAND_MADE = [
    [[0, 1], [2, 3]],
    [[0, 2], [2, 4]],
    [[1, 0], [3, 2]],
    [[5, 6], [2, 5]],
    [[0, 1], [1, 4]],
    [[7, 0], [2, 3]],
    [[1, 5], [6, 7]],
    [[0, 1], [2, 3]],
    [[2, 6], [4, 2]],
    [[0, 5], [3, 1]],
    [[1, 0], [2, 0]],
    [[6, 5], [5, 2]],
    [[0, 3], [2, 3]],
    [[1, 0], [7, 6]],
    [[4, 5], [2, 3]],
]


def policy_context(
    trace,
    its=None,
    hpc=0,
    mpc=2,
    *,
    ranking=None,
    cached=None,
    extra=None,
    organization="per-layer",
    shared_slots=None,
) -> PolicyContext:
    """The context ``sim.run.build_decisions`` gives a policy: the trace's shape, every layer cached unless
    ``cached`` says which, the hot ranking of the whole trace unless ``ranking`` is given, the trace and the
    workload ``its`` (when given); ``extra``: other context fields by name (``trace_path``, ``costs``)."""
    ranking = ranking or hot_ranking_from_counts(selection_counts(trace.experts, trace.num_experts))
    return PolicyContext(
        trace.num_layers,
        trace.num_experts,
        tuple(x.role for x in trace.meta.model.layers),
        frozenset(range(trace.num_layers)) if cached is None else frozenset(cached),
        hpc,
        mpc,
        tuple(tuple(r) for r in ranking),
        0,
        organization=organization,
        shared_slots=shared_slots,
        **{"trace": trace, "iterations": its, **(extra or {})},
    )


def policy_for(name, trace, its=None, hpc=0, mpc=2, params=None, **context):
    """The registered policy ``name`` with ``params``, set up on ``policy_context(trace, its, hpc, mpc, ...)``."""
    return POLICIES.get(name)(params, policy_context(trace, its, hpc, mpc, **context))


def predictor_for(name, trace, params=None, seed=0):
    """The registered predictor ``name`` set up as sim.run does: the evaluated trace in its context."""
    return PREDICTORS.get(name)(params, PredictorContext(trace.num_layers, trace.num_experts, seed, trace=trace))


def run_decisions(trace, policy, predictor="none", batch=1, check=True, pred_params=None):
    """Replay ``trace`` in static batches of ``batch`` through ``policy``; the cache is checked after each step."""
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    pred = predictor_for(predictor, trace, pred_params)
    return replay(trace, its, policy, pred, after_step=(lambda p: p.cache.check()) if check else None)


def layer_mpcs(cache):
    """Every layer's sorted MPC."""
    return [sorted(m) for m in cache.mpc]


def replay_snapshots(trace, its, policy, pred, snapshot=layer_mpcs):
    """Replay ``policy`` with ``pred``, checking the cache after every decision; returns the decisions and, per
    decision, ``snapshot(cache)`` after the step."""
    snaps = []

    def after(p):
        p.cache.check()
        snaps.append(snapshot(p.cache))

    return replay(trace, its, policy, pred, after_step=after), snaps


def drive(trace, its, policy, predictor="none", seed=0, snapshot=layer_mpcs, predictor_params=None):
    """Replay with the predictor ``predictor`` (``NOISY`` params for `noisy` unless given); returns the decisions
    and, per decision, ``snapshot(cache)`` after the step (every layer's sorted MPC by default)."""
    if predictor_params is None and predictor == "noisy":
        predictor_params = NOISY
    return replay_snapshots(trace, its, policy, predictor_for(predictor, trace, predictor_params, seed), snapshot)


def steps_of(trace, its):
    """Per layer, the sorted active experts of each step of a workload (every layer runs in every iteration of a
    decoder-only trace)."""
    out = {layer: [] for layer in range(trace.num_layers)}
    for it in its:
        for layer in out:
            ids = trace.experts[it.rows, layer, :].ravel()
            out[layer].append(sorted({int(x) for x in ids if x >= 0}))
    return out


def indexed_steps_of(trace, its):
    """Per layer, the (iteration, sorted active experts) steps of a workload."""
    return {layer: [(it.index, act) for it, act in zip(its, s)] for layer, s in steps_of(trace, its).items()}


def cache_hits(policy):
    """The hits a policy's cache served from the HPC and the MPC."""
    h = policy.cache.counters.hits
    return h[HPC] + h[MPC]


def ask_predictor(trace, iterations, pred, wrong_truth=False, stop=None):
    """Ask ``pred`` what the engine asks, in the engine's order: [(iteration, layer, guess, truth)].
    ``wrong_truth`` passes the complement of the true set as ``truth``; ``stop`` = (iteration, layer) ends the run
    after that prediction."""
    out = []
    layers_of = phase_layers(trace)
    everything = frozenset(range(trace.num_experts))
    for it in iterations:
        pred.start_iteration(it)
        layers = layers_of[it.kind]
        actives = active_sets(trace, it.rows, layers)
        for pos in range(len(layers) - 1):
            truth = frozenset(actives[pos + 1][0])
            given_truth = everything - truth if wrong_truth else truth
            guess = pred.predict(it.index, layers[pos + 1], given_truth, frozenset(actives[pos][0]))
            out.append((it.index, layers[pos + 1], guess, truth))
            if stop == (it.index, layers[pos + 1]):
                return out
    return out
