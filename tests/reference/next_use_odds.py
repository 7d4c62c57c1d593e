"""Our policy `next-use-odds` restated plainly with lists and floats (cold start), independently of its module."""

from __future__ import annotations

import math

from sim.core.cache import MISS, MPC


def plain_next_use_odds(steps, cap, weights):
    """The rule with plain lists and floats, cold start: per step, ({expert: MPC | MISS}, sorted cache after)."""
    decays = (0.5, 0.9, 0.98)
    last, uses, ema, cache, out = {}, {}, {}, [], []
    for t, act in enumerate(steps, start=1):
        src = {e: (MPC if e in cache else MISS) for e in act}
        for e in list(ema):
            ema[e] = [v * d for v, d in zip(ema[e], decays)]
        for e in act:
            ema[e] = [v + (1 - d) for v, d in zip(ema.get(e, [0.0, 0.0, 0.0]), decays)]
            last[e] = t
            uses[e] = uses.get(e, 0) + 1

        def score(v, t=t):
            age = min(t - last[v], 1024)
            x = (
                [1.0, math.log2(1 + age), float(age == 0), float(age == 1)]
                + [math.sqrt(u) for u in ema[v]]
                + [math.sqrt(uses[v] / t)]
            )
            return sum(a * b for a, b in zip(x, weights))

        for e in sorted((e for e in act if src[e] == MISS), key=lambda x: (-score(x), x)):
            if len(cache) < cap:
                cache.append(e)
                continue
            free = [v for v in cache if v not in act]
            if not free:
                continue
            victim = min(free, key=lambda v: (score(v), last[v], -v))
            if score(e) > score(victim):  # strictly better, else bypass
                cache.remove(victim)
                cache.append(e)
        out.append((src, sorted(cache)))
    return out
