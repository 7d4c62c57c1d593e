"""`lookahead` restated plainly: LRU that sees ``horizon`` iterations ahead."""

from __future__ import annotations

from tests.reference.belady import NEVER


def plain_lookahead(steps, cap, horizon):
    """One layer's steps (sorted active experts per iteration) under the rule, restated with lists: hits become
    most recent (ascending), then each newcomer (ascending) evicts, among held experts not active now, the one with
    the furthest next use seen within ``horizon`` steps (unseen: furthest; ties: least recent), unless its own seen
    next use is further still. Returns the hits and the cache (least recent first) after each step."""

    def next_use(e, t):
        for u in range(t + 1, min(t + horizon, len(steps) - 1) + 1):
            if e in steps[u]:
                return u
        return NEVER

    cache, hits, after = [], 0, []
    for t, act in enumerate(steps):
        hits += sum(1 for e in act if e in cache)
        for e in act:
            if e in cache:
                cache.remove(e)
                cache.append(e)
        for e in act:
            if e in cache:
                continue
            if len(cache) < cap:
                cache.append(e)
                continue
            held = [v for v in cache if v not in act]
            if not held:
                continue
            far = max(next_use(v, t) for v in held)
            victim = next(v for v in held if next_use(v, t) == far)  # the least recent of the furthest
            if next_use(e, t) > far:
                continue
            cache.remove(victim)
            cache.append(e)
        after.append(list(cache))
    return hits, after
