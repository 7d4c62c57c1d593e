"""`transition`: a layer-to-layer transition table learned from a training trace, or from the evaluated trace's
other requests (two-fold cross-fitting), never from the routing of the request it predicts.

``T_l[a, b]`` counts the tokens of the training trace (with ``train: other-requests``, of the requests of the other
fold, below) routed to expert ``a`` in layer ``l`` and to ``b`` in the next layer of the same phase (every pair of a
token's top-k in the two layers counts once). To predict layer ``l+1`` at layer ``l``'s gate: every token of the
iteration (its trace rows) scores the experts by the sum of the ``T_l`` rows of its layer-``l`` experts; its ``top``
best (default: the model's top-k) are its guess, and the prediction is the union over the iteration's tokens. Ties
go to the expert selected more often in layer ``l+1`` of the training trace, then to the lower id; experts with no
evidence at all (score 0 and never selected in ``l+1`` in training) are never guessed, so a token whose experts the
training trace never saw in layer ``l`` falls back to the training trace's most popular experts of ``l+1``. A token
with no routing in ``l`` adds nothing.

It reads only the routing of the current iteration's layer ``l`` (known once its gate ran), never ``truth``.

Params: ``train`` and ``top``. ``train`` is either

- ``other-requests`` (the default): two-fold cross-fitting on the evaluated trace, which needs no other file. Its
  requests fall in two folds by index (even requests in one, odd in the other); a token is scored with the tables
  (and the tie-breaking popularity) counted on the fold its request is NOT in, so no token's guess ever uses its
  own request's routing. Each fold must hold routed tokens (so the trace at least two requests). The tables are
  counts, so the two folds cost two tables per pair of layers instead of one. The guesses may use other
  requests' routing from later in the trace: the tables stand for a predictor trained offline on a workload of
  the same kind, as with a training file; or
- the path of a training trace (same model shape: layers, experts, top-k; it must not be the evaluated trace: a
  file with the same routing and request boundaries is refused).

It is the predictor of the bundled run configs of models without a pre-gate (``predictor: {name: transition,
params: {}}``), so that none of them defaults to the oracle.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from moebase.checks import show
from moebase.errors import ConfigError, TraceError
from moebase.files import resolve_path
from sim.config.params import MAX_EXPERTS, RunFacts, between, training_trace
from sim.core.workload import phase_layers
from sim.predictors.base import PREDICTORS, Predictor
from traces.format import Trace
from traces.io import load_trace


def same_trace(a: Trace, b: Trace) -> bool:
    """The same routing and request boundaries (the same file, or a copy of it)."""
    return a is b or (
        a.experts.shape == b.experts.shape
        and np.array_equal(a.request_offsets, b.request_offsets)
        and np.array_equal(a.experts, b.experts)
    )


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def load_training_trace(value, where: str, evaluated: Trace | None, evaluated_path=None) -> Trace:
    """Load the training trace a ``train`` param names; ConfigError (naming ``where``) when it is missing, cannot
    be read, has another model shape than ``evaluated``, or is the evaluated trace itself: the same file as
    ``evaluated_path`` when that is known, or any file with the same routing and request boundaries."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(
            where, "missing: give the path of a training trace of the same model (not the evaluated trace)"
        )
    if not isinstance(value, str):
        raise ConfigError(where, f"must be a path to a trace file, got {value!r}")
    path = resolve_path(value, where, "trace file")
    try:
        train = load_trace(path)
    except TraceError as exc:
        raise ConfigError(where, str(exc)) from None
    if evaluated is not None:
        mine = (train.num_layers, train.num_experts, train.top_k)
        theirs = (evaluated.num_layers, evaluated.num_experts, evaluated.top_k)
        if mine != theirs:
            raise ConfigError(
                where,
                f"training trace {path} has {mine[0]} layers x {mine[1]} experts, top-{mine[2]}; "
                f"the evaluated trace {theirs[0]} x {theirs[1]}, top-{theirs[2]}",
            )
        if same_trace(train, evaluated) or (evaluated_path is not None and _same_file(path, evaluated_path)):
            raise ConfigError(
                where,
                f"training trace {path} is the evaluated trace: it must differ (a predictor "
                f"learned from the routing it predicts would see the future)",
            )
    return train


#: ``train``'s word for two-fold cross-fitting on the evaluated trace's other requests.
OTHER_REQUESTS = "other-requests"
#: The folds of cross-fitting: request ``r`` is in fold ``r % FOLDS``.
FOLDS = 2
#: Trace rows whose guesses are scored together (``TransitionPredictor.learn_blocks``).
BLOCK = 128
#: At most this many scores (set x expert in the source layer's top-k x expert) gathered in one numpy call.
SCORE_CELLS = 1 << 21


def request_folds(trace: Trace) -> np.ndarray:
    """int8 [tokens]: each trace row's fold, its request's index modulo ``FOLDS`` (even requests 0, odd 1)."""
    counts = np.diff(np.asarray(trace.request_offsets, dtype=np.int64))
    # numpy's stubs type np.diff of an untyped array as timedelta64; here it is int64 counts
    return np.repeat(np.arange(counts.size) % FOLDS, counts).astype(np.int8)  # type: ignore[arg-type]


def other_fold_routing(trace: Trace, where: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """(each row's fold, per fold ``g`` the routing [tokens, layers, k] of the rows NOT in ``g``): what the tokens of
    fold ``g`` are scored with. ConfigError naming ``where`` when a fold has no routed token."""
    folds = request_folds(trace)
    routed = (trace.experts >= 0).reshape(trace.experts.shape[0], -1).any(axis=1)
    for g in range(FOLDS):
        if not routed[folds == g].any():  # type: ignore[index]  # numpy's stubs: .any(axis=1) may be a scalar
            which = "even" if g == 0 else "odd"
            raise ConfigError(
                where,
                f"{OTHER_REQUESTS}: the trace's {which}-numbered requests have no routed token "
                f"({trace.num_requests} requests): nothing to learn for the other fold",
            )
    return folds, [trace.experts[folds != g] for g in range(FOLDS)]


def transition_table(experts: np.ndarray, src: int, dst: int, num_experts: int) -> np.ndarray:
    """[experts, experts]: tokens routed to ``a`` in layer ``src`` and ``b`` in layer ``dst`` (every pair of a
    token's top-k counts once); ``experts`` is a trace's [tokens, layers, k] array."""
    a = experts[:, src, :].astype(np.int64)
    b = experts[:, dst, :].astype(np.int64)
    codes = a[:, :, None] * num_experts + b[:, None, :]
    valid = (a[:, :, None] >= 0) & (b[:, None, :] >= 0)
    return np.bincount(codes[valid], minlength=num_experts * num_experts).reshape(num_experts, num_experts)


class LayerPairPredictor(Predictor):
    """A predictor from tables per pair of layers (source, destination) learned on a training trace, reading the
    current iteration's tokens (``rows``) and phase (``kind``)."""

    trace: Trace  # the workload's routing (configure)

    def start_tables(self) -> None:
        """The workload's layers per phase, no table yet, no iteration yet (the end of ``configure``)."""
        self.phase_layers = phase_layers(self.trace)
        #: per phase, each layer's previous one (None for the first): the layer whose gate has run
        self.previous = {kind: dict(zip(layers, [None, *layers[:-1]])) for kind, layers in self.phase_layers.items()}
        self.tables: dict[tuple[int, ...], Any] = {}  # each predictor keys and fills its own
        self.rows = None
        self.kind: str | None = None

    def start_iteration(self, iteration) -> None:
        self.rows = iteration.rows
        self.kind = iteration.kind


@PREDICTORS.register("transition")
class TransitionPredictor(LayerPairPredictor):
    PARAMS = {"train": OTHER_REQUESTS, "top": None}
    train: Trace | None  # the training trace (None: other-requests)
    group: np.ndarray | None  # each row's fold (other-requests), else None
    PARAM_RULES = {
        "train": training_trace(words=(OTHER_REQUESTS,)),
        "top": between(1, MAX_EXPERTS, kind=int),
    }  # at most the model's experts: check_for_run

    @classmethod
    def check_for_run(cls, params: dict, where: str, run: RunFacts) -> None:
        """``top`` at most the run's experts per layer, and ``other-requests`` on a trace of two requests or more,
        beside the training trace's checks."""
        super().check_for_run(params, where, run)
        if params.get("train") == OTHER_REQUESTS and run.trace.num_requests < FOLDS:
            raise ConfigError(
                f"{where}.train",
                f"{OTHER_REQUESTS} needs a trace of at least {FOLDS} requests (one "
                f"to learn from, another to predict), the workload's has "
                f"{run.trace.num_requests}",
            )
        top = params.get("top")
        if top is not None and top > run.model.num_experts:
            raise ConfigError(
                f"{where}.top",
                f"must be at most the {run.model.num_experts} experts of a layer of "
                f"{show(run.model.name)} (or null: the model's top-k), got {top}",
            )

    def configure(self) -> None:
        self.trace = self.ctx.workload_trace(f"predictor {self.name!r}")
        top = self.params["top"]
        if top is None:
            top = self.trace.top_k
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= self.ctx.num_experts:
            raise ConfigError(
                "predictor.params.top",
                f"must be an integer in 1..{self.ctx.num_experts} or null (the model's top-k), got {top!r}",
            )
        self.top = top
        where = "predictor.params.train"
        if self.params["train"] == OTHER_REQUESTS:
            # sources[g]: the routing the tokens of fold g learn from (the other fold's); group: each row's fold
            self.train = None
            self.group, self.sources = other_fold_routing(self.trace, where)
        else:
            self.train = load_training_trace(self.params["train"], where, self.trace, self.ctx.trace_path)
            self.group, self.sources = None, [self.train.experts]
        self.start_tables()
        #: (src, dst, source) -> a set of experts in src (sorted tuple; a one-token step's active set also as that
        #: frozenset) -> its guess of dst
        self.guesses: dict[tuple[int, int, int], dict[tuple[int, ...] | frozenset[int], frozenset[int]]] = {}
        #: (src, dst, source) -> the blocks of rows whose sets are in ``guesses``
        self.blocks_done: dict[tuple[int, int, int], set[int]] = {}
        self.top_k_in = self.trace.top_k  # a token's experts per layer
        #: (phase, source) -> the layer predicted -> ``guesses[(src, layer, source)]``, src the layer before it in
        #: the phase: what a one-token iteration of that phase and fold reads first (``predict``)
        self.one_token_guesses: dict[tuple[str, int], dict[int, dict]] = {}
        #: (src, dst) -> every (previous layer, layer) pair of its phase, learned together (``learn_blocks``)
        self.pair_groups: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        for kind, layers in self.phase_layers.items():
            pairs = tuple((self.previous[kind][d], d) for d in layers[1:])
            for pair in pairs:
                self.pair_groups.setdefault(pair, pairs)  # type: ignore[arg-type]
        #: the guesses made, by their experts best first (``best``)
        self.made: dict[tuple[int, ...], frozenset[int]] = {}
        #: (pairs, source) -> their tables stacked (``pair_tables``)
        self.stacked: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def ranking_keys(self, src: int, dst: int, source: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """([experts (of src), experts (of dst)] T, [experts of dst] a tie-breaker below 1 from dst's popularity),
        counted on ``self.sources[source]``."""
        key = (src, dst, source)
        if key not in self.tables:
            e, experts = self.ctx.num_experts, self.sources[source]
            table = transition_table(experts, src, dst, e).astype(np.float64)
            ids = experts[:, dst, :].ravel()
            popular = np.bincount(ids[ids >= 0].astype(np.int64), minlength=e).astype(np.float64)
            self.tables[key] = (table, 0.5 * popular / (popular.max() + 1.0))
        return self.tables[key]

    def start_iteration(self, iteration) -> None:
        super().start_iteration(iteration)
        rows = iteration.rows
        #: the fold of a one-token iteration's token (other-requests), else None
        self.fold = int(self.group[rows[0]]) if self.group is not None and rows.size == 1 else None
        #: a one-token iteration's guesses by the layer predicted (``one_token_guesses``), else None
        self.one_memo = None
        if rows.size == 1:
            source = self.fold if self.fold is not None else 0
            self.one_memo = self.one_token_guesses.setdefault((iteration.kind, source), {})

    def predict(self, iteration, layer, truth, current):
        memo = self.one_memo
        if memo is not None:  # one token: its guess as :meth:`guess` kept it, under ``current`` (a frozenset)
            known = memo.get(layer)
            if known is not None:
                guess = known.get(current)
                if guess is not None:
                    return guess
        assert self.kind is not None, "start_iteration comes first"
        src = self.previous[self.kind][layer]
        rows = self.rows
        if src is None or rows is None or rows.size == 0:
            return frozenset()
        if self.group is None or self.fold is not None:
            source = self.fold if self.fold is not None else 0
            guess = self.guess(rows, src, layer, source, current)
            if memo is not None:  # the guesses of (src, layer, source), for the next one-token iterations
                memo[layer] = self.guesses[(src, layer, source)]
            return guess
        groups = self.group[rows]
        if (groups == groups[0]).all():
            return self.guess(rows, src, layer, int(groups[0]))
        out: frozenset[int] = frozenset()
        for g in np.unique(groups):  # each fold's tokens with the tables of the other fold
            out |= self.guess(rows[groups == g], src, layer, int(g))
        return out

    def guess(self, rows: np.ndarray, src: int, dst: int, source: int, current=None) -> frozenset[int]:
        """The union of the ``top`` best experts of ``dst`` over ``rows`` (trace rows), each scored from its
        routing in ``src`` with the tables of ``self.sources[source]``. A token's guess depends only on its set of
        experts in ``src`` (a sorted tuple), so each set is scored once per (src, dst, source) and remembered in
        ``self.guesses``; the sets of a whole block of rows are scored at once (:meth:`learn_blocks`).
        ``current``: src's active experts, the one token's set when it has top-k distinct experts there."""
        key = (src, dst, source)
        known = self.guesses.get(key)
        if known is None:
            known = self.guesses[key] = {}
        if rows.size == 1:  # one token: one set (``current`` itself when it has top-k distinct experts in src)
            whole = current is not None and len(current) == self.top_k_in
            if whole:  # the guess of that set, also kept under the frozenset itself (no tuple ever equals it)
                guess = known.get(current)
                if guess is not None:
                    return guess
                combo = tuple(sorted(current))
            else:
                combo = tuple(sorted(self.trace.experts[rows[0], src, :].tolist()))
            guess = known.get(combo)
            if guess is None:
                self.learn_blocks(rows, src, dst, source)
                guess = known[combo]
            if whole:
                known[current] = guess
            return guess
        combos = {tuple(sorted(r)) for r in self.trace.experts[rows, src, :].tolist()}
        if any(c not in known for c in combos):
            self.learn_blocks(rows, src, dst, source)
        return frozenset().union(*(known[c] for c in combos))

    def learn_blocks(self, rows: np.ndarray, src: int, dst: int, source: int) -> None:
        """Score the sets of experts of every row (of fold ``source``) in the blocks of ``BLOCK`` rows that hold
        ``rows``, not yet scored for (src, dst, source), for every pair of layers of the phase of (src, dst) at
        once (``pair_groups``): numpy's per-call cost outweighs one set's work, nearby rows are asked for next, and
        every layer of an iteration is predicted from the same rows. A row's guess depends on its own routing in
        the source layer alone (known at that layer's gate), so scoring it early changes no guess (the per-pair
        scoring it restates: ``tests/sim/predictors/test_transition_blocks.py``)."""
        pairs = self.pair_groups.get((src, dst), ((src, dst),))
        done = self.blocks_done.setdefault((src, dst, source), set())
        blocks = [b for b in dict.fromkeys((rows // BLOCK).tolist()) if b not in done]
        for s, d in pairs:
            self.blocks_done.setdefault((s, d, source), set()).update(blocks)
        n = self.trace.experts.shape[0]
        near = np.concatenate([np.arange(b * BLOCK, min((b + 1) * BLOCK, n)) for b in blocks])
        if self.group is not None:
            near = near[self.group[near] == source]
        # per pair, the rows' sorted sets of experts in its source layer: [pairs, rows, k]
        sets = np.sort(self.trace.experts[near][:, [s for s, _ in pairs], :], axis=2).transpose(1, 0, 2).tolist()
        routed: list[tuple[int, ...]] = []  # the sets to score, of every pair
        owner: list[int] = []  # each one's pair (its index in ``pairs``)
        for i, (s, d) in enumerate(pairs):
            known = self.guesses.setdefault((s, d, source), {})
            for c in dict.fromkeys(map(tuple, sets[i])):
                if c not in known:
                    if c[-1] < 0:  # sorted: no routing in the source layer
                        known[c] = frozenset()
                    else:
                        routed.append(c)
                        owner.append(i)
        if not routed:
            return
        tables, ties = self.pair_tables(pairs, source)
        width = self.trace.experts.shape[2] * self.ctx.num_experts
        step = max(1, SCORE_CELLS // width)
        for lo in range(0, len(routed), step):  # at most SCORE_CELLS scores at once
            ids = np.asarray(routed[lo : lo + step], dtype=np.int64)
            which = np.asarray(owner[lo : lo + step], dtype=np.int64)
            gathered = tables[which[:, None], np.maximum(ids, 0)]  # [sets, k, E]: each set's rows of its T
            score = np.where(ids[:, :, None] >= 0, gathered, 0.0).sum(axis=1) + ties[which]  # [sets, E]
            for c, i, guess in zip(routed[lo : lo + step], owner[lo : lo + step], self.best(score)):
                self.guesses[(pairs[i][0], pairs[i][1], source)][c] = guess

    def pair_tables(self, pairs: tuple[tuple[int, int], ...], source: int) -> tuple[np.ndarray, np.ndarray]:
        """([pairs, E, E], [pairs, E]): :meth:`ranking_keys` of each pair of ``pairs``, stacked."""
        key = (pairs, source)
        if key not in self.stacked:
            keys = [self.ranking_keys(s, d, source) for s, d in pairs]
            tables, ties = self.stacked[key] = (np.stack([t for t, _ in keys]), np.stack([tie for _, tie in keys]))
            for i, (s, d) in enumerate(pairs):  # each pair's tables: views of the stack (no second copy kept)
                self.tables[(s, d, source)] = (tables[i], ties[i])
        return self.stacked[key]

    def best(self, score: np.ndarray) -> list[frozenset[int]]:
        """Per row of ``score`` [sets, experts], the ``top`` experts of highest score (ties to the lower id), those
        above 0."""
        order = np.argsort(-score, axis=1, kind="stable")[:, : self.top].tolist()  # stable: ties in id order
        # highest first, so those above 0 are the first ones: as many as the row has, at most ``top``
        kept = np.minimum((score > 0).sum(axis=1), self.top).tolist()
        # one frozenset per guess (a few thousand guesses over tens of thousands of sets: fewer objects kept for
        # the garbage collector to walk), built from the same experts in the same order as without it
        made = self.made
        out = []
        for ids, n in zip(order, kept):
            ranked = tuple(ids[:n])
            guess = made.get(ranked)
            if guess is None:
                guess = made[ranked] = frozenset(ranked)
            out.append(guess)
        return out
