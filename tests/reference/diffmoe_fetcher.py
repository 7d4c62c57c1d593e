"""``FetcherCC``: a statement-by-statement transliteration of the Diff-MoE artifact's cache code
(``ceciliawinter/Diff-MoE``: ``src/fastertransformer/utils/fetcher.cc``, ``FetcherContext::fetch``, cache policy 0,
and the cache set-up of ``models/t5/T5Decoding.cc``), the reference the `diffmoe` policy is checked against."""

from __future__ import annotations

from fractions import Fraction

import numpy as np


class FetcherCC:
    """The artifact's cache state for one forward call (one static batch), per decoder MoE layer: the priority of
    every expert (``expert_priority``) and the ``cache_size`` ids of ``expert_in_cache``, whose first
    ``fix_cache_size`` entries are the HPC. ``fetch`` is the ``use_cache`` part of ``FetcherContext::fetch`` with
    ``cache_policy == 0``, statement by statement.

    ``arithmetic``: "exact" keeps priorities as Fractions (the rule as written: 1.8 - 0.4 - 0.4 == 1.0);
    "float32" as the artifact's ``float`` does. ``literal_in_cache``: the artifact's cached-or-not test as written
    (``std::find(cache row, layer * 128 + i)``), else the intended ``std::find(cache row, i)``."""

    def __init__(
        self,
        top_k_experts,
        cache_size,
        fix_cache_size,
        num_experts,
        max_val=2.0,
        threshold=1.0,
        dec_in_cache=0.4,
        dec_out_cache=0.2,
        arithmetic="exact",
        literal_in_cache=False,
    ):
        self.f32 = arithmetic == "float32"
        num = (lambda x: np.float32(x)) if self.f32 else (lambda x: Fraction(str(x)))
        self.max_val, self.threshold = num(max_val), num(threshold)
        self.dec_in_cache, self.dec_out_cache = num(dec_in_cache), num(dec_out_cache)
        self.cache_size, self.fix_cache_size, self.num_experts = cache_size, fix_cache_size, num_experts
        self.literal_in_cache = literal_in_cache
        # T5Decoding.cc "init cache": priorities 0, the initial experts at max_val, the cache rows = the lists
        self.expert_priority = [[num(0.0)] * num_experts for _ in top_k_experts]
        for layer, row in enumerate(top_k_experts):
            for rank in range(cache_size):
                self.expert_priority[layer][row[rank]] = self.max_val
        self.expert_in_cache = [list(row[:cache_size]) for row in top_k_experts]

    def fetch(self, layer, expert_using):
        """One call for cache layer ``layer`` with the layer's distinct experts in ascending order (``std::unique``
        over the sorted ``permuted_experts_``). Returns (hits, [(promoted, evicted expert or None)]): an evicted
        expert that still fills another slot (or the HPC) is no eviction (None)."""
        prio, row = self.expert_priority[layer], self.expert_in_cache[layer]
        cache_size, fix = self.cache_size, self.fix_cache_size
        expert_using = list(expert_using)
        # the first loop: an expert found in the layer's cache row is a hit (copied device-to-device)
        hits = [e for e in expert_using if e in row]
        # "deal cache": +1 per active expert, capped at max_val
        for e in expert_using:
            if self.f32:
                prio[e] = np.float32(float(prio[e]) + 1.0)  # float += double literal: done in double, stored float
            else:
                prio[e] += 1
            if prio[e] > self.max_val:
                prio[e] = self.max_val
        # decay of every inactive expert
        for i in range(self.num_experts):
            expert_index = layer * 128 + i if self.literal_in_cache else i
            is_in_using = i in expert_using
            in_cache_flag = expert_index in row
            if not is_in_using and in_cache_flag:
                prio[i] -= self.dec_in_cache
            elif not is_in_using and not in_cache_flag:
                prio[i] -= self.dec_out_cache
        # std::sort of (expert, index) pairs by priority, descending; and of the MPC part of the row. libstdc++
        # sorts at most 16 elements by insertion sort, which is stable: Python's stable sort is then the same.
        assert len(expert_using) <= 16 and cache_size - fix <= 16, "restatement limited to std::sort's stable size"
        pairs = sorted([(e, idx) for idx, e in enumerate(expert_using)], key=lambda p: prio[p[0]], reverse=True)
        expert_using = [e for e, _ in pairs]
        row[fix:] = sorted(row[fix:], key=lambda e: prio[e], reverse=True)
        promoted = []
        i = j = 0
        while i < cache_size - fix and j < len(expert_using):  # for (i = 0, j = 0; ...; i++, j++)
            if prio[row[cache_size - i - 1]] >= self.threshold:
                break
            if prio[expert_using[j]] < self.threshold:
                break
            if expert_using[j] in row:  # already_in_cache: i--; continue
                i -= 1
            else:
                old = row[cache_size - i - 1]
                row[cache_size - i - 1] = expert_using[j]
                promoted.append((expert_using[j], None if old in row else old))
            i += 1
            j += 1
        return hits, promoted

    def mpc(self, layer):
        row = self.expert_in_cache[layer]
        return sorted(set(row[self.fix_cache_size :]) - set(row[: self.fix_cache_size]))
