"""Diff-MoE's rules as this simulator first read them, before following the artifact (kept as the ``LEGACY``
params of the `diffmoe` policy; docs/diffmoe_artifact.md says what changed), written out directly. The artifact's
own cache code is restated in ``tests/reference/diffmoe_fetcher.py``."""

from __future__ import annotations

from sim.core.cache import HPC, MISS, MPC

#: The earlier rules of this simulator's ``diffmoe``, before the artifact's (scores floored at 0, victims weakest
#: first among the MPC experts not active now with ties longest-held first, Python floats): kept as params. The
#: default is the artifact's rules, checked hit for hit against fetcher.cc in
#: tests/sim/policies/test_diffmoe_artifact.py.
LEGACY = {"floor": True, "victim_order": "legacy", "arithmetic": "float64"}


def plain_diffmoe(trace, hpc, mpc, ranking, max_val=2.0, dec_in=0.4, dec_out=0.2, threshold=1.0):
    """Diff-MoE's rules as this simulator first read them (see ``LEGACY``), written out directly, for a
    decode-only trace at batch 1 (one static batch).
    Returns per (token, layer): ({expert: source}, sorted MPC contents after the step)."""
    steps = []
    state = {}
    for layer in range(trace.num_layers):
        hot = list(ranking[layer])
        score = {e: 0.0 for e in range(trace.num_experts)}
        for e in hot[: hpc + mpc]:
            score[e] = max_val
        state[layer] = (set(hot[:hpc]), list(hot[hpc : hpc + mpc]), score)
    for t in range(trace.num_tokens):
        for layer in range(trace.num_layers):
            hpc_set, mpc_list, score = state[layer]
            active = sorted({int(x) for x in trace.experts[t, layer] if x >= 0})
            src = {e: (HPC if e in hpc_set else MPC if e in mpc_list else MISS) for e in active}
            for e in active:
                score[e] = min(score[e] + 1, max_val)
            for e in score:
                if e not in active:
                    cached = e in hpc_set or e in mpc_list
                    score[e] = max(score[e] - (dec_in if cached else dec_out), 0.0)
            cands = sorted(active, key=lambda e: (-score[e], e))
            slots = sorted([e for e in mpc_list if e not in active], key=lambda e: score[e])
            i = 0
            for c in cands:
                if i >= len(slots) or score[slots[i]] >= threshold or score[c] < threshold:
                    break
                if c in hpc_set or c in mpc_list:
                    continue
                mpc_list.remove(slots[i])  # ``mpc_list`` is in order of entry: ties among victims go to the
                mpc_list.append(c)  # longest held
                i += 1
            steps.append((src, sorted(mpc_list)))
    return steps
