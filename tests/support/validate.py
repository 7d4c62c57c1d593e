"""The validator's tiny model: its profile, a skewed trace of it, run configs over it, and a fake copy backend."""

from __future__ import annotations

import time

import numpy as np
import yaml

from sim.config.run_config import config_from_dict
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from tests.support.traces import TINY_MODEL, random_trace
from traces.format import ModelInfo, Trace, TraceMeta
from traces.io import save_trace
from validate.backends import Landed

TINY = {
    **TINY_MODEL,
    "d_model": 64,
    "d_ff": 128,
    "num_experts": 16,
    "decoder_blocks": 3,
    "decoder_moe_layers": 3,
    "head_dim": 16,
    "vocab_size": 300,
}


def tiny_files(tmp_path_factory, seed: int):
    """A tiny model profile and a skewed random trace of it from ``seed`` (so that caches hit and predictions
    miss): the profile's path, the trace's path and the trace."""
    d = tmp_path_factory.mktemp("tiny")
    (d / "tiny-moe.yaml").write_text(yaml.safe_dump(TINY))
    rng = np.random.default_rng(seed)
    t = random_trace(rng, tokens=160, layers=3, experts=16, k=2, requests=4)
    skewed = np.where(rng.random(t.experts.shape[:2])[:, :, None] < 0.5, t.experts % 4 * 2 + [0, 1], t.experts)
    meta = TraceMeta(**{**t.meta.__dict__, "model": ModelInfo("tiny-moe", 16, 2, t.meta.model.layers)})
    trace = Trace(skewed.astype(np.int16), t.request_offsets, t.prefill_lengths, meta)
    return d / "tiny-moe.yaml", save_trace(trace, d / "tiny.npz"), trace


def tiny_config(tiny, policy, predictor="none", batch=4, hpc=1, mpc=3, lpc=4, **policy_params):
    """A run config over the ``tiny`` fixture's model and trace (a few decode tokens per request)."""
    model, path, _ = tiny
    return config_from_dict(
        {
            "model": str(model),
            "hardware": "h200",
            "workload": {"trace": str(path), "batch_size": batch, "max_decode_tokens": 6, "requests": batch},
            "cache": {"hpc_slots": hpc, "mpc_slots": mpc, "lpc_buffers": lpc, "layers": "all"},
            "policy": {"name": policy, "params": policy_params},
            "predictor": {
                "name": predictor,
                "params": {"recall": 0.7, "precision": 0.6} if predictor == "noisy" else {},
            },
        },
        "test",
        POLICIES.names(),
        PREDICTORS.names(),
    )


class FakeBackend:
    """Copies take ``delay`` seconds; records the order copies start in and the buffers in use."""

    name = "fake"

    def __init__(self, delay=0.002):
        self.delay = delay
        self.order = []

    def copy_in(self, dst, src, after=None):
        self.order.append(src)
        t0 = time.perf_counter()
        time.sleep(self.delay)
        return Landed(t0, time.perf_counter())

    def elapsed(self, a, b):
        return b - a


def with_hardware(cfg, **fields):
    """``cfg`` again with its hardware the h200 profile changed by ``fields``."""
    return config_from_dict(
        {**raw_config(cfg), "hardware": {"base": "h200", **fields}}, "t", POLICIES.names(), PREDICTORS.names()
    )


def raw_config(cfg):
    """``cfg``'s resolved form, less the derived hot profile, to build a changed config from."""
    r = dict(cfg.resolved)
    r["cache"] = {k: v for k, v in r["cache"].items() if k != "hot_profile"}
    return r


def tiny_suite(tiny, points, decode_tokens: int = 3):
    """A CPU measurement suite over the tiny model and trace (``tiny``: the fixture's paths) of ``points`` (name,
    policy, predictor, batch, hpc slots, mpc slots), 4 working buffers, ``decode_tokens`` decode steps each."""
    from validate.suites import Suite

    model, trace, _ = tiny
    return Suite(
        "cpu",
        str(model),
        str(trace),
        decode_tokens=decode_tokens,
        quick_decode_tokens=decode_tokens,
        lpc_buffers=4,
        points=tuple(points),
        quick=(),
    )
