"""`noisy`: an oracle degraded to a chosen set recall and precision.

Each true expert is kept with probability ``recall``; then false positives, drawn uniformly from the experts not
active in the layer, are added so that the expected share of true experts in the prediction is ``precision``
(kept/precision - kept of them, rounded stochastically). With recall 1 and precision 1 it equals ``oracle``.
"""

from __future__ import annotations

import numpy as np

from moebase.errors import ConfigError
from sim.config.params import between
from sim.predictors.base import PREDICTORS, Predictor


@PREDICTORS.register("noisy")
class NoisyPredictor(Predictor):
    PARAMS = {"recall": 0.9, "precision": 0.9}
    PARAM_RULES = {"recall": between(0.0, 1.0), "precision": between(0.0, 1.0, above=True)}

    def configure(self) -> None:
        for name in ("recall", "precision"):
            v = self.params[name]
            if not 0.0 <= v <= 1.0 or (name == "precision" and v == 0.0):
                bounds = "(0, 1]" if name == "precision" else "[0, 1]"
                raise ConfigError(f"predictor.params.{name}: must lie in {bounds}, got {v}")

    def predict(self, iteration, layer, truth, current):
        truth_sorted = sorted(truth)
        keep = self.rng.random(len(truth_sorted)) < self.params["recall"]
        kept = [e for e, k in zip(truth_sorted, keep) if k]
        p = self.params["precision"]
        want = len(kept) * (1.0 - p) / p  # infinite for a precision below ~1e-308
        others = np.setdiff1d(np.arange(self.ctx.num_experts), truth_sorted, assume_unique=True)
        n_fp = 0
        if want > 0:
            drawn = want + self.rng.random()
            n_fp = others.size if drawn >= others.size else int(np.floor(drawn))
        fp = self.rng.choice(others, size=n_fp, replace=False).tolist() if n_fp else []
        return frozenset(kept) | frozenset(int(x) for x in fp)
