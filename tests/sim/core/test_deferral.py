"""Expert deferral's rule (sim/core/deferral.py): a host expert is deferred exactly when no token of the layer ranks
it among its top k - D; D = 0 defers nothing."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.core.deferral import deferred_experts
from tests.support.fuzz import fuzz_settings
from tests.support.traces import make_trace


@fuzz_settings(60)
@given(seed=st.integers(0, 10_000), tokens=st.integers(1, 12), k=st.integers(1, 4), d=st.integers(0, 5))
def test_deferred_are_the_host_experts_no_token_protects(seed, tokens, k, d):
    rng = np.random.default_rng(seed)
    e = np.argsort(rng.random((tokens, 1, 8)), axis=2)[:, :, :k].astype(np.int16)
    trace = make_trace(e, [tokens], [0], num_experts=8)
    host = tuple(int(x) for x in rng.choice(8, size=4, replace=False))
    got = deferred_experts(trace, np.arange(tokens), 0, host, d)
    assert got <= set(host)
    for x in host:  # deferred exactly when every token that routes to it ranks it at k - D or lower
        ranks = [list(row).index(x) for row in e[:, 0].tolist() if x in row]
        assert (x in got) == all(r >= k - d for r in ranks)
    if d == 0:
        assert not got & {int(x) for x in e[:, 0].ravel()}
