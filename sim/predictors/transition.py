"""`transition`: a layer-to-layer transition table learned from a training trace (not the evaluated one).

``T_l[a, b]`` counts the tokens of the training trace routed to expert ``a`` in layer ``l`` and to ``b`` in the
next layer of the same phase (every pair of a token's top-k in the two layers counts once). To predict layer
``l+1`` at layer ``l``'s gate: every token of the iteration (its trace rows) scores the experts by the sum of the
``T_l`` rows of its layer-``l`` experts; its ``top`` best (default: the model's top-k) are its guess, and the
prediction is the union over the iteration's tokens. Ties go to the expert selected more often in layer ``l+1``
of the training trace, then to the lower id; experts with no evidence at all (score 0 and never selected in
``l+1`` in training) are never guessed, so a token whose experts the training trace never saw in layer ``l``
falls back to the training trace's most popular experts of ``l+1``. A token with no routing in ``l`` adds
nothing.

It reads only the routing of the current iteration's layer ``l`` (known once its gate ran), never ``truth``.

Params: ``train``, the path of the training trace (required; same model shape: layers, experts, top-k; it must
not be the evaluated trace: a file with the same routing and request boundaries is refused), and ``top``.
"""

from __future__ import annotations

import os

import numpy as np

from sim.errors import ConfigError
from sim.checks import show
from sim.params import MAX_EXPERTS, RunFacts, between, training_trace
from sim.predictors.base import PREDICTORS, Predictor
from sim.files import resolve_path
from sim.workload import phase_layers
from traces.errors import TraceError
from traces.format import Trace
from traces.io import load_trace


def workload_trace(predictor: Predictor) -> Trace:
    """The evaluated trace (``ctx.extra["trace"]``), which a realistic predictor reads up to the current gate."""
    trace = predictor.ctx.extra.get("trace")
    if trace is None:
        raise ValueError(f"predictor {predictor.name!r} needs the workload's trace in its context "
                         f"(PredictorContext.extra['trace'])")
    return trace


def same_trace(a: Trace, b: Trace) -> bool:
    """The same routing and request boundaries (the same file, or a copy of it)."""
    return a is b or (a.experts.shape == b.experts.shape and np.array_equal(a.request_offsets, b.request_offsets)
                      and np.array_equal(a.experts, b.experts))


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
        raise ConfigError(where, "missing: give the path of a training trace of the same model (not the "
                                 "evaluated trace)")
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
            raise ConfigError(where, f"training trace {path} has {mine[0]} layers x {mine[1]} experts, top-{mine[2]}; "
                                     f"the evaluated trace {theirs[0]} x {theirs[1]}, top-{theirs[2]}")
        if same_trace(train, evaluated) or (evaluated_path is not None and _same_file(path, evaluated_path)):
            raise ConfigError(where, f"training trace {path} is the evaluated trace: it must differ (a predictor "
                                     f"learned from the routing it predicts would see the future)")
    return train


def transition_table(experts: np.ndarray, src: int, dst: int, num_experts: int) -> np.ndarray:
    """[experts, experts]: tokens routed to ``a`` in layer ``src`` and ``b`` in layer ``dst`` (every pair of a
    token's top-k counts once); ``experts`` is a trace's [tokens, layers, k] array."""
    a = experts[:, src, :].astype(np.int64)
    b = experts[:, dst, :].astype(np.int64)
    codes = (a[:, :, None] * num_experts + b[:, None, :])
    valid = (a[:, :, None] >= 0) & (b[:, None, :] >= 0)
    return np.bincount(codes[valid], minlength=num_experts * num_experts).reshape(num_experts, num_experts)


class LayerPairPredictor(Predictor):
    """A predictor from tables per pair of layers (source, destination) learned on a training trace, reading the
    current iteration's tokens (``rows``) and phase (``kind``)."""

    def start_tables(self) -> None:
        """The workload's layers per phase, no table yet, no iteration yet (the end of ``configure``)."""
        self.phase_layers = phase_layers(self.trace)
        self.tables: dict[tuple[int, int], np.ndarray] = {}
        self.rows = None
        self.kind = None

    def start_iteration(self, iteration) -> None:
        self.rows = iteration.rows
        self.kind = iteration.kind


@PREDICTORS.register("transition")
class TransitionPredictor(LayerPairPredictor):
    PARAMS = {"train": None, "top": None}
    PARAM_RULES = {"train": training_trace(required=True, hint="give the path of a training trace of the same "
                                                                "model (not the evaluated trace)"),
                   "top": between(1, MAX_EXPERTS, kind=int)}  # at most the model's experts: check_for_run

    @classmethod
    def check_for_run(cls, params: dict, where: str, run: RunFacts) -> None:
        """``top`` at most the run's experts per layer, beside the training trace's checks."""
        super().check_for_run(params, where, run)
        top = params.get("top")
        if top is not None and top > run.model.num_experts:
            raise ConfigError(f"{where}.top", f"must be at most the {run.model.num_experts} experts of a layer of "
                                              f"{show(run.model.name)} (or null: the model's top-k), got {top}")

    def configure(self) -> None:
        self.trace = workload_trace(self)
        top = self.params["top"]
        if top is None:
            top = self.trace.top_k
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= self.ctx.num_experts:
            raise ConfigError("predictor.params.top", f"must be an integer in 1..{self.ctx.num_experts} or null "
                                                      f"(the model's top-k), got {top!r}")
        self.top = top
        self.train = load_training_trace(self.params["train"], "predictor.params.train", self.trace,
                                         self.ctx.extra.get("trace_path"))
        self.start_tables()

    def ranking_keys(self, src: int, dst: int) -> np.ndarray:
        """[experts (of src), experts (of dst)] float: T plus a tie-breaker below 1 from dst's popularity."""
        key = (src, dst)
        if key not in self.tables:
            e = self.ctx.num_experts
            table = transition_table(self.train.experts, src, dst, e).astype(np.float64)
            ids = self.train.experts[:, dst, :].ravel()
            popular = np.bincount(ids[ids >= 0].astype(np.int64), minlength=e).astype(np.float64)
            self.tables[key] = (table, 0.5 * popular / (popular.max() + 1.0))
        return self.tables[key]

    def predict(self, iteration, layer, truth, current):
        layers = self.phase_layers[self.kind]
        pos = layers.index(layer)
        if pos == 0 or self.rows is None or self.rows.size == 0:
            return frozenset()
        src = layers[pos - 1]
        table, tie = self.ranking_keys(src, layer)
        ids = self.trace.experts[self.rows, src, :].astype(np.int64)  # routing of the layer whose gate ran
        ids = ids[(ids >= 0).any(axis=1)]
        if ids.size == 0:
            return frozenset()
        if ids.shape[0] > 1:  # tokens with the same experts guess the same: score each combination once
            ids = np.sort(ids, axis=1)
            if (self.ctx.num_experts + 1) ** ids.shape[1] < 2 ** 62:  # one int64 code per combination: faster
                code = np.zeros(ids.shape[0], dtype=np.int64)
                for j in range(ids.shape[1]):
                    code = code * (self.ctx.num_experts + 1) + ids[:, j] + 1
                ids = ids[np.unique(code, return_index=True)[1]]
            else:
                ids = np.unique(ids, axis=0)
        score = np.where(ids[:, :, None] >= 0, table[np.maximum(ids, 0)], 0.0).sum(axis=1) + tie  # [tokens, E]
        order = np.argsort(-score, axis=1, kind="stable")[:, : self.top]
        keep = np.take_along_axis(score, order, axis=1) > 0
        return frozenset(int(x) for x in np.unique(order[keep]))
