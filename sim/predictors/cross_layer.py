"""`cross-layer`: the next layer's experts predicted from the current layer's routing of the same tokens, with the
conditional frequencies of a training trace, keeping only confident guesses (a wrong prefetch costs a transfer).

From the training trace (``train``: same model; never the evaluated trace: a file with the same routing and request
boundaries, or the evaluated file itself, is refused), per pair of consecutive layers of a phase (``l``, ``l+1``):
``N_l[a]`` tokens routed to ``a`` in ``l`` and ``T_l[a, b]`` of them routed to ``b`` in ``l+1``. At the gate of ``l``
(its routing of the iteration's tokens is then known), each token with experts ``S`` in ``l`` gives expert ``b`` of
``l+1`` the probability ``p_b = mean over a in S of (T_l[a, b] + prior_b) / (N_l[a] + 1)``, where ``prior_b`` is
``b``'s share of ``l+1``'s selections in training (times top-k, so that a token's probabilities sum to top-k; an
expert never seen in ``l`` in training falls back to the prior). Over the iteration's tokens, ``b`` is used with
probability ``1 - prod(1 - p_b)``; the prediction is every ``b`` with that probability at least ``threshold``
(default 0.5).

Without ``train`` it predicts nothing (it learns nothing from the evaluated workload). It reads only the routing of
the current iteration's layer ``l`` (known once its gate ran), never ``truth``.
"""

from __future__ import annotations

import numpy as np

from sim.config.params import between, training_trace
from sim.predictors.base import PREDICTORS
from sim.predictors.transition import LayerPairPredictor, load_training_trace, transition_table


@PREDICTORS.register("cross-layer")
class CrossLayerPredictor(LayerPairPredictor):
    PARAMS = {"train": None, "threshold": 0.5}
    PARAM_RULES = {"train": training_trace(), "threshold": between(0.0, 1.0, above=True)}

    def configure(self) -> None:
        self.trace = self.ctx.workload_trace(f"predictor {self.name!r}")
        self.threshold = float(self.params["threshold"])
        self.train = None
        if self.params["train"] is not None:
            self.train = load_training_trace(
                self.params["train"], "predictor.params.train", self.trace, self.ctx.trace_path
            )
        self.start_tables()

    def probabilities(self, src: int, dst: int) -> np.ndarray:
        """[experts of src + 1, experts of dst]: P(dst expert | src expert); the last row is the prior (used for
        an id of -1 or an unseen expert)."""
        key = (src, dst)
        if key not in self.tables:
            train = self.train
            assert train is not None, "predict asks only with a training trace"
            e, k = self.ctx.num_experts, train.top_k
            ex = train.experts
            both = (ex[:, src, :] >= 0).any(1) & (ex[:, dst, :] >= 0).any(1)
            sub = ex[both]
            table = transition_table(sub, src, dst, e).astype(np.float64)
            ids = sub[:, src, :].ravel()
            n_src = np.bincount(ids[ids >= 0].astype(np.int64), minlength=e).astype(np.float64)
            ids = sub[:, dst, :].ravel()
            pop = np.bincount(ids[ids >= 0].astype(np.int64), minlength=e).astype(np.float64)
            prior = k * pop / pop.sum() if pop.sum() else np.zeros(e)
            probs = (table + prior[None, :]) / (n_src[:, None] + 1.0)
            self.tables[key] = np.minimum(np.vstack([probs, prior[None, :]]), 1.0)
        return self.tables[key]

    def predict(self, iteration, layer, truth, current):
        if self.train is None or self.rows is None or self.rows.size == 0:
            return frozenset()
        assert self.kind is not None, "start_iteration comes first"
        src = self.previous[self.kind][layer]
        if src is None:
            return frozenset()
        ids = self.trace.experts[self.rows, src, :].astype(np.int64)  # the gate of src has run
        ids = ids[(ids >= 0).any(axis=1)]
        if ids.size == 0:
            return frozenset()
        probs = self.probabilities(src, layer)
        e = self.ctx.num_experts
        idx = np.where(ids >= 0, ids, e)  # -1: the prior row
        p_tok = probs[idx].mean(axis=1)  # [tokens, experts]
        p_any = 1.0 - np.prod(1.0 - np.minimum(p_tok, 1.0), axis=0)
        return frozenset(int(x) for x in np.flatnonzero(p_any >= self.threshold))
