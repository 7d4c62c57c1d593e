"""Per-layer LRU, restated plainly with a list (least recent first)."""

from __future__ import annotations


def plain_lru(steps, cap):
    """A plain re-statement of per-layer LRU on one layer's steps ``(step, active experts)``: hits are the step's
    experts already cached; hits become most recent; then the misses enter in id order, each evicting the least
    recent expert the step does not use. Returns the hits."""
    cache, hits = [], 0  # least recent first
    for _, act in steps:
        hits += sum(1 for e in act if e in cache)
        for e in sorted(act):
            if e in cache:
                cache.remove(e)
                cache.append(e)
        for e in sorted(act):
            if e in cache:
                continue
            if len(cache) >= cap:
                victims = [v for v in cache if v not in act]
                if not victims:
                    continue
                cache.remove(victims[0])
            cache.append(e)
    return hits


def plain_lru_hits(trace, capacity):
    """Per layer, one token at a time, through the plain LRU re-statement."""
    return sum(
        plain_lru(
            [(t, sorted({int(x) for x in trace.experts[t, layer] if x >= 0})) for t in range(trace.num_tokens)],
            capacity,
        )
        for layer in range(trace.num_layers)
    )
