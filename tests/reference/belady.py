"""Belady's MIN restated plainly on one layer's steps (``(new batch?, active experts)``): keep the experts used
soonest."""

from __future__ import annotations


def plain_min(steps, cap, warm=True, evict_active=True):
    """MIN with bypass on one layer's steps, written out with lists: after each step the cache holds the ``cap``
    experts of (cache + step) used soonest (never-used ones are not admitted). ``warm``: at each batch start the
    cache is refilled with the ``cap`` experts used soonest. ``evict_active=False`` is the textbook rule that never
    evicts an expert the step uses (kept for the counterexample below)."""
    cache, hits = [], 0
    n_exp = 1 + max((e for _, a in steps for e in a), default=0)
    for t, (new_batch, act) in enumerate(steps):
        if warm and new_batch:
            ranked = sorted(range(n_exp), key=lambda e: (first_use(steps, t, e), e))
            cache = [e for e in ranked if first_use(steps, t, e) != NEVER][:cap]
        hits += sum(1 for e in act if e in cache)
        forced = [e for e in cache if e in act] if not evict_active else []
        pool = [e for e in cache if e not in forced] + [e for e in act if e not in cache]
        pool.sort(key=lambda e: (next_use(steps, t, e), e not in cache, e))
        keep = forced + [e for e in pool if next_use(steps, t, e) != NEVER or e in cache][: cap - len(forced)]
        cache = keep
    return hits


#: The next use of an expert never used again.
NEVER = float("inf")


def next_use(steps, t, e):
    for s in range(t + 1, len(steps)):
        if e in steps[s][1]:
            return s
    return NEVER


def first_use(steps, t, e):
    return next_use(steps, t - 1, e)
