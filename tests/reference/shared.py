"""The per-layer policies' rules restated for one cache shared by all layers, over the run's layer steps
((layer, sorted active experts)) and (layer, expert) pairs; a victim's layer distance counts the layers until its
layer runs again. Each returns per step ({expert: MPC | MISS}, the sorted cache after)."""

from __future__ import annotations

import math
from collections import defaultdict

from sim.core.cache import MISS, MPC
from tests.reference.published import plain_arc, plain_s3fifo


def until(layer, now, n):
    return (layer - now - 1) % n + 1


def distance(k, layer, now, n):
    return (k - 1.0) * n + until(layer, now, n)


def plain_scored(seq, n, cap, remember, victim_key, order=None):
    """A cache of ``cap`` (layer, expert) pairs over the run's layer steps: ``remember(layer, act)`` records the
    step; then the newcomers (in ``order(layer, newcomers)``, default id order) enter, each evicting the pair not
    in use now with the largest ``(victim_key(layer, l, v), l, v)`` (none admitted once every slot is in use now).
    Returns per step ({expert: MPC | MISS}, sorted cache after)."""
    cache, out = set(), []
    for layer, act in seq:
        src = {e: (MPC if (layer, e) in cache else MISS) for e in act}
        remember(layer, act)
        new = [e for e in act if src[e] == MISS]
        for e in order(layer, new) if order else new:
            if len(cache) >= cap:
                free = [(lv, v) for lv, v in cache if not (lv == layer and v in act)]
                if not free:
                    break
                cache.remove(max(free, key=lambda p: (victim_key(layer, *p), *p)))
            cache.add((layer, e))
        out.append((src, sorted(cache)))
    return out


def plain_lru(seq, n, cap):
    order, out = [], []
    for layer, act in seq:
        src = {e: (MPC if (layer, e) in order else MISS) for e in act}
        for e in act:
            if src[e] == MPC:
                order.remove((layer, e))
                order.append((layer, e))
        for e in act:
            if src[e] == MPC:
                continue
            if len(order) >= cap:
                free = [p for p in order if not (p[0] == layer and p[1] in act)]
                if not free:
                    break
                order.remove(free[0])
            order.append((layer, e))
        out.append((src, sorted(order)))
    return out


def plain_lfu(seq, n, cap):
    freq, last, clock = defaultdict(int), {}, [0]

    def remember(layer, act):
        clock[0] += 1
        for e in act:
            freq[(layer, e)] += 1
            last[(layer, e)] = clock[0]

    return plain_scored(
        seq,
        n,
        cap,
        remember,
        lambda now, lay, v: (-freq[(lay, v)], -last[(lay, v)], -v),
        order=lambda layer, new: sorted(new, key=lambda e: -freq[(layer, e)]),
    )


def plain_least_stale(seq, n, cap):
    step, last, est = defaultdict(int), {}, {}

    def remember(layer, act):
        step[layer] += 1
        for e in act:
            if (layer, e) in last:
                gap = step[layer] - last[(layer, e)]
                est[(layer, e)] = gap if (layer, e) not in est else 0.75 * est[(layer, e)] + 0.25 * gap
            last[(layer, e)] = step[layer]

    def key(now, lay, v):
        lv = last[(lay, v)]
        return distance(lv + max(est.get((lay, v), 0.0), 1.0) - step[lay], lay, now, n), lv, v

    return plain_scored(seq, n, cap, remember, key)


def plain_reuse_distance(seq, n, cap, window=8):
    step, last, own, pool = defaultdict(int), {}, defaultdict(list), defaultdict(list)

    def remember(layer, act):
        step[layer] += 1
        for e in act:
            if (layer, e) in last:
                gap = step[layer] - last[(layer, e)]
                own[(layer, e)] = (own[(layer, e)] + [gap])[-window:]
                pool[layer] = (pool[layer] + [gap])[-4 * window :]
            last[(layer, e)] = step[layer]

    def key(now, lay, v):
        age = step[lay] - last[(lay, v)]
        past = own[(lay, v)] or pool[lay]
        longer = [x - age for x in past if x > age]
        pred = sum(longer) / len(longer) if longer else float(age)
        return distance(pred, lay, now, n), -last[(lay, v)], -v

    return plain_scored(seq, n, cap, remember, key)


def plain_learned_rf(seq, n, cap):
    step, last, uses = defaultdict(int), {}, defaultdict(int)

    def remember(layer, act):
        step[layer] += 1
        for e in act:
            uses[(layer, e)] += 1
            last[(layer, e)] = step[layer]

    def key(now, lay, v):
        t = step[lay]
        score = 0.0 + 1.0 * math.log2(1 + t - last[(lay, v)]) + -1.0 * math.log2(uses[(lay, v)] / t)
        return distance(2.0**score, lay, now, n), -last[(lay, v)], -v

    return plain_scored(seq, n, cap, remember, key)


def flat(plain):
    """A per-item restatement (ARC, S3-FIFO over sets of items) run over (layer, expert) pairs."""

    def run(seq, n, cap):
        steps = [[(layer, e) for e in act] for layer, act in seq]
        return [({e: s for (_, e), s in src.items()}, after) for src, after in plain(steps, cap)]

    return run


PLAIN = {
    "lru": plain_lru,
    "lfu": plain_lfu,
    "least-stale": plain_least_stale,
    "reuse-distance": plain_reuse_distance,
    "learned-rf": plain_learned_rf,
    "arc": flat(plain_arc),
    "s3fifo": flat(plain_s3fifo),
}
