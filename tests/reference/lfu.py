"""LFU restated plainly on one layer's steps: the plain-cache kinds (perfect and in-cache counts, no pinned experts)
and the baseline with a pinned HPC."""

from __future__ import annotations

from sim.core.cache import HPC, MISS, MPC


def plain_lfu(steps, cap, in_cache):
    """LFU on one layer's steps, no pinned experts. perfect: a count per expert since the start; in-cache: a
    cached expert's uses since it entered (1 on entry), forgotten when it leaves or is not admitted. Newcomers
    enter most frequent first (ties: lower id), each evicting the least frequent (ties: least recent, lower id)
    cached expert the step does not use. Returns per step ({expert: MPC | MISS}, sorted cache after)."""
    count, last, cache, out = {}, {}, [], []
    for t, (_, act) in enumerate(steps):
        src = {e: MPC if e in cache else MISS for e in act}
        for e in act:
            count[e] = 1 if (in_cache and src[e] == MISS) else count.get(e, 0) + 1
            last[e] = t
        new = sorted((e for e in act if src[e] == MISS), key=lambda e: (-count[e], e))
        for n, e in enumerate(new):
            if len(cache) >= cap:
                victims = [v for v in cache if v not in act]
                if not victims:
                    if in_cache:
                        for rest in new[n:]:
                            count[rest] = 0
                    break
                v = min(victims, key=lambda v: (count[v], last[v], v))
                cache.remove(v)
                if in_cache:
                    count[v] = 0
            cache.append(e)
        out.append((src, sorted(cache)))
    return out


def plain_lfu_pinned(steps, hpc_set, cap):
    """LFU on one layer's steps, with a pinned HPC. Returns per step ({expert: HPC|MPC|MISS}, sorted MPC after)."""
    freq, last, cache, out = {}, {}, [], []
    for t, (_, act) in enumerate(steps):
        out_src = {e: HPC if e in hpc_set else MPC if e in cache else MISS for e in act}
        for e in act:
            freq[e] = freq.get(e, 0) + 1
            last[e] = t
        if cap:
            newcomers = sorted((e for e in act if out_src[e] == MISS), key=lambda e: (-freq[e], e))
            for e in newcomers:
                if len(cache) >= cap:
                    victims = [v for v in cache if v not in act]
                    if not victims:
                        break
                    cache.remove(min(victims, key=lambda v: (freq[v], last[v], v)))
                cache.append(e)
        out.append((out_src, sorted(cache)))
    return out
