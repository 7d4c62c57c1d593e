"""Published caching policies (`least-stale`, `reuse-distance`, `learned-rf`, `arc`, `s3fifo`), each restated
plainly with lists on one layer's steps (a step: the sorted experts it uses), independently of the policies' code.
Each returns per step ({expert: MPC | MISS}, the sorted cache after)."""

from __future__ import annotations

import math
from collections import defaultdict

from sim.core.cache import MISS, MPC


def plain_scored(steps, cap, remember, victim_key):
    """A per-layer cache of ``cap`` slots over one layer's steps: ``remember(t, act)`` records the step's uses;
    then the misses enter in id order, each evicting the cached expert not used now with the largest
    ``victim_key(t, v)`` (none admitted once every slot is in use now). Returns per step ({expert: MPC | MISS},
    sorted cache after)."""
    cache, out = [], []
    for t, act in enumerate(steps, start=1):
        src = {e: (MPC if e in cache else MISS) for e in act}
        remember(t, act)
        for e in act:
            if src[e] == MPC:
                continue
            if len(cache) >= cap:
                free = [v for v in cache if v not in act]
                if not free:
                    break
                v = max(free, key=lambda v: victim_key(t, v))
                cache.remove(v)
            cache.append(e)
        out.append((src, sorted(cache)))
    return out


def plain_least_stale(steps, cap):
    last, est = {}, {}

    def remember(t, act):
        for e in act:
            if e in last:
                gap = t - last[e]
                est[e] = gap if e not in est else 0.75 * est[e] + 0.25 * gap
            last[e] = t

    return plain_scored(steps, cap, remember, lambda t, v: (last[v] + max(est.get(v, 0), 1), last[v], v))


def plain_reuse_distance(steps, cap, window=8):
    last, own, pool = {}, defaultdict(list), []

    def remember(t, act):
        for e in act:
            if e in last:
                own[e] = (own[e] + [t - last[e]])[-window:]
                pool[:] = (pool + [t - last[e]])[-4 * window :]
            last[e] = t

    def predicted(t, v):
        age = t - last[v]
        past = own[v] or pool
        longer = [x - age for x in past if x > age]
        return sum(longer) / len(longer) if longer else age

    return plain_scored(steps, cap, remember, lambda t, v: (predicted(t, v), -last[v], -v))


def plain_learned_rf(steps, cap, w):
    last, uses = {}, defaultdict(int)

    def remember(t, act):
        for e in act:
            uses[e] += 1
            last[e] = t

    def score(t, v):
        return w[0] + w[1] * math.log2(1 + t - last[v]) + w[2] * math.log2(uses[v] / t)

    return plain_scored(steps, cap, remember, lambda t, v: (score(t, v), -last[v], -v))


def plain_arc(steps, c):
    """ARC (Megiddo and Modha 2003, Fig. 4) over sets: hits first (to T2's end), then misses in id order; the
    evicted expert is the oldest one not used now of the list REPLACE picks (else of the other list); no admission
    and no change at all once every slot is in use now."""
    t1, t2, b1, b2 = [], [], [], []  # oldest first
    p = 0.0
    out = []
    for act in steps:
        src = {e: (MPC if e in t1 or e in t2 else MISS) for e in act}
        for e in act:
            if src[e] == MPC:
                (t1 if e in t1 else t2).remove(e)
                t2.append(e)

        def replace(in_b2):
            f1, f2 = [v for v in t1 if v not in act], [v for v in t2 if v not in act]  # noqa: B023
            if (t1 and (len(t1) > p or (in_b2 and len(t1) == p)) and f1) or not f2:  # noqa: B023
                t1.remove(f1[0])
                b1.append(f1[0])
            else:
                t2.remove(f2[0])
                b2.append(f2[0])

        for x in act:
            if src[x] == MPC:
                continue
            full = len(t1) + len(t2) >= c
            if full and all(v in act for v in t1 + t2):
                continue
            if x in b1:
                p = min(c, p + max(len(b2) / len(b1), 1))
                b1.remove(x)
                if full:
                    replace(False)
                t2.append(x)
            elif x in b2:
                p = max(0, p - max(len(b1) / len(b2), 1))
                b2.remove(x)
                if full:
                    replace(True)
                t2.append(x)
            else:
                if len(t1) + len(b1) == c:
                    if len(t1) < c:
                        b1.pop(0)
                        if full:
                            replace(False)
                    else:
                        t1.remove([v for v in t1 if v not in act][0])
                elif len(t1) + len(t2) + len(b1) + len(b2) >= c:
                    if len(t1) + len(t2) + len(b1) + len(b2) == 2 * c:
                        b2.pop(0)
                    if full:
                        replace(False)
                t1.append(x)
        out.append((src, sorted(t1 + t2)))
    return out


def plain_s3fifo(steps, c, threshold=2):
    """S3-FIFO as libCacheSim's S3FIFOv0 (S 10% of c, at least 1; M the rest; G 90% of c, floored), over sets:
    hits counted first (capped at 3), then misses in id order; queue walks skip the experts used now."""
    small = max(1, int(0.1 * c))
    main, ghost_size = c - small, int(0.9 * c)
    s, m, g, freq = [], [], [], {}
    out = []
    for act in steps:
        src = {e: (MPC if e in s or e in m else MISS) for e in act}
        for e in act:
            if src[e] == MPC:
                freq[e] = min(3, freq[e] + 1)
        for x in act:
            if src[x] == MPC:
                continue
            from_ghost = x in g
            if from_ghost:
                g.remove(x)
            if len(s) + len(m) >= c:
                evicted = None
                while evicted is None:
                    s_free = [v for v in s if v not in act]
                    m_free = [v for v in m if v not in act]
                    if not s_free and not m_free:
                        break
                    if m_free and (len(m) > main or not s_free):
                        while evicted is None:
                            v = [y for y in m if y not in act][0]
                            m.remove(v)
                            if freq[v] > 0:
                                m.append(v)
                                freq[v] -= 1
                            else:
                                evicted = v
                    else:
                        for v in s_free:
                            s.remove(v)
                            if freq[v] >= threshold:
                                m.append(v)
                                freq[v] = 0
                            else:
                                evicted = v
                                if ghost_size:
                                    g.append(v)
                                    del g[:-ghost_size]
                                break
                if evicted is None:
                    continue
                del freq[evicted]
            (m if from_ghost else s).append(x)
            freq[x] = 0
        out.append((src, sorted(s + m)))
    return out


PLAIN = {
    "least-stale": plain_least_stale,
    "reuse-distance": plain_reuse_distance,
    "arc": plain_arc,
    "s3fifo": plain_s3fifo,
    "learned-rf": lambda steps, cap: plain_learned_rf(steps, cap, (0.0, 1.0, -1.0)),
}
