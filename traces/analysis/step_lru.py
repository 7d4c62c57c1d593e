"""Step-wise LRU: the hit rate of the simulator's ``lru`` policy at batch 1, computed for a whole trace at once.

A *step* is one token's routing in one MoE layer (tokens in file order; a row where the layer routes nothing is
no step of that layer). Each layer has its own cache of C slots, kept across requests. Within a step the
layer's experts are used together, as ``sim/policies/lru.py`` does it: the step's experts already cached are
*hits* and become the most recent (in ascending id order); then each *miss* enters in ascending id order,
evicting the least recent cached expert that the step does not use; a miss finding every slot held by an
expert of the step is not cached (this only happens when the step uses more than C experts). The hit rate is
hits over accesses, an access being one expert of one step.

How it is computed without replaying every step (a replay is in the tests):

- Recency order after a step: the experts the step did not use keep their order, below the step's hits
  (ascending id), below the step's misses that entered (ascending id). The cache is always the C most recent
  experts of that order.
- So expert x used at step s, last used at step p, hits exactly when it entered the cache at p and
  ``D + T < C``: D counts the distinct other experts used in the steps strictly between p and s (all more
  recent than x; if one of them failed to enter, that step alone used more than C experts, so D >= C and x
  misses anyway), and T counts the experts of step p not used since ("ties") that entered at p and rank above
  x in step p's order (a miss above a hit; within hits or within misses, the larger id).
- D and the ties do not depend on C and are computed once, vectorised. T depends on whether step p's experts
  hit, which depends on earlier steps: accesses decided by D alone are settled at once; the others ("open")
  are resolved by fixed-point iteration that recomputes only the accesses whose step p changed. Outcomes
  depend only on earlier steps, so the iteration ends, with the outcome of the replay.
- Below k slots that iteration would crawl along one long chain (every step depends on the one before), so
  when every step uses at least C experts the cache is followed instead as a chain of states: after a step it
  holds C of that step's experts, one of comb(k, C) subsets; each step's map between subsets is tabulated and
  the chain is run in blocks (:func:`chain_tables`, :func:`run_chain`).

A step's slots are handled as bits of one integer (its hits, its valid slots, an access's ties), so top-k is
limited to 64.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

MAX_TOP_K = 64
_TABLE_CELLS = 1 << 20  # cells of one [steps, experts] last-use table chunk
_ONE = np.uint64(1)
_MAX_CHAIN_STATES = 256


@dataclass(frozen=True)
class StepReuse:
    """The capacity-independent reuse facts of a sequence of n steps of k slots (slots sorted by expert id).

    Per access (flattened: index ``step * k + slot``). Sequences of several layers may be laid end to end
    (previous-use indices shifted); no step then refers to another layer's.
    """

    k: int
    valid_bits: np.ndarray  # uint64 [n]: bit i set when slot i of the step holds an expert
    prev: np.ndarray  # int64 [n * k]: access index of the expert's previous use, -1 if none (or empty slot)
    dist: np.ndarray  # int32 [n * k]: D, distinct other experts used in the steps strictly between
    ties: np.ndarray  # uint64 [n * k]: bit i set when slot i of the previous step holds another expert
    #                         that is not used again before this access

    @property
    def num_steps(self) -> int:
        return int(self.valid_bits.shape[0])

    @cached_property
    def accesses_per_step(self) -> np.ndarray:
        return np.bitwise_count(self.valid_bits).astype(np.int64)

    @cached_property
    def settled_hit_from(self) -> np.ndarray:
        """int64 [n * k]: the least C from which the access surely hits (D plus all its ties below C, and its
        previous step no larger than C, so that all of it entered); a huge number for a first use."""
        p = np.maximum(self.prev // self.k, 0)
        bound = np.maximum(self.dist + np.bitwise_count(self.ties).astype(np.int64) + 1, self.accesses_per_step[p])
        return np.where(self.prev >= 0, bound, np.iinfo(np.int64).max)


def layer_steps(experts: np.ndarray, num_experts: int) -> np.ndarray:
    """One layer's steps from its expert ids [tokens, k]: the rows that route anything, ids sorted ascending,
    empty slots (-1) replaced by ``num_experts`` (so moved to the end). int16, like the trace."""
    rows = experts[(experts >= 0).any(1)]
    return np.sort(np.where(rows < 0, num_experts, rows).astype(np.int16), axis=1)


def step_reuse(steps: np.ndarray, num_experts: int) -> StepReuse:
    """D, previous uses and ties of one layer's steps [n, k] (from :func:`layer_steps`)."""
    n, k = steps.shape
    if k > MAX_TOP_K:
        raise ValueError(f"step-wise LRU handles top-k up to {MAX_TOP_K}, got {k}")
    valid = steps < num_experts
    prev = _previous_use(steps, num_experts)
    pstep = np.where(prev >= 0, prev // k, -1)
    dist = _distinct_between(steps, pstep, num_experts).ravel()
    # step of each access's next use (huge if none): a tie of access (s, j) is a slot i of step p whose next
    # use is at s or later
    nxt = np.full(n * k, np.iinfo(np.int64).max, dtype=np.int64)
    has = prev >= 0
    nxt[prev[has]] = np.flatnonzero(has) // k
    p0 = np.maximum(pstep, 0)
    now = np.arange(n * k) // k
    own = prev % k
    ties = np.zeros(n * k, dtype=np.uint64)
    for i in range(k):
        tie = valid.ravel()[p0 * k + i] & (nxt[p0 * k + i] >= now) & (own != i) & has
        ties |= tie.astype(np.uint64) << np.uint64(i)
    bits = (valid.astype(np.uint64) << np.arange(k, dtype=np.uint64)[None, :]).sum(1, dtype=np.uint64)
    return StepReuse(k, bits, prev, dist, ties)


def _previous_use(steps: np.ndarray, e: int) -> np.ndarray:
    """Access index of each access's previous use of the same expert (-1 for a first use or an empty slot)."""
    flat = steps.ravel()
    order = np.argsort(flat, kind="stable")  # by expert, then by time (a radix sort for int16)
    same = (flat[order[1:]] == flat[order[:-1]]) & (flat[order[1:]] < e)
    prev = np.full(flat.size, -1, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    return prev


def _distinct_between(steps: np.ndarray, pstep: np.ndarray, e: int) -> np.ndarray:
    """D [n, k]: experts whose last use before the access's step is after its previous step ``pstep``.

    Vectorised over chunks of a [steps, experts] table of each expert's last-use step, as of the step before.
    """
    n, k = steps.shape
    pstep = pstep.reshape(n, k).astype(np.int32)
    out = np.zeros((n, k), dtype=np.int32)
    carry = np.full(e + 1, -1, dtype=np.int32)
    chunk = max(16, _TABLE_CELLS // ((e + 1) * k))
    for s in range(0, n, chunk):
        a = steps[s : s + chunk]
        b = a.shape[0]
        table = np.full((b + 1, e + 1), -1, dtype=np.int32)
        table[0] = carry
        table[np.arange(1, b + 1)[:, None], a] = np.arange(s, s + b, dtype=np.int32)[:, None]
        np.maximum.accumulate(table, axis=0, out=table)
        carry = table[-1]
        before = table[:-1, :e]  # row r: last uses as of step s + r - 1
        out[s : s + b] = np.count_nonzero(before[:, None, :] > pstep[s : s + b, :, None], axis=2)
    return out


def hit_bits(r: StepReuse, capacity: int) -> np.ndarray:
    """uint64 [n]: per step, bit i set when slot i's expert hits in a C-slot step-wise LRU (C = ``capacity``)."""
    c = int(capacity)
    if c < 1:
        raise ValueError(f"capacity must be >= 1, got {c}")
    k = r.k
    hit = r.settled_hit_from <= c  # the rest miss, except the open ones
    open_ = np.flatnonzero((r.prev >= 0) & (r.dist < c) & ~hit)
    code = _pack(hit.reshape(-1, k))
    if open_.size:
        _resolve(r, c, hit, code, open_)
    return code


def _pack(flags: np.ndarray) -> np.ndarray:
    """uint64 [m]: the rows of a bool array [m, k] as bits (column j -> bit j)."""
    out = np.zeros(flags.shape[0], dtype=np.uint64)
    for j in range(flags.shape[1]):
        out |= flags[:, j].astype(np.uint64) << np.uint64(j)
    return out


def _resolve(r: StepReuse, c: int, hit: np.ndarray, code: np.ndarray, open_: np.ndarray) -> None:
    """Settle the open accesses in ``hit`` (flat bool) and ``code`` (its bits per step) by fixed-point
    iteration: evaluate each from its previous step's outcomes, then re-evaluate only those whose previous step
    changed, until nothing changes."""
    k = r.k
    by_access = hit.reshape(-1, k)
    prev = r.prev[open_]
    pstep, own = prev // k, prev % k
    own_bit = _ONE << own.astype(np.uint64)  # its slot in the previous step
    above_own = _bits_above(k)[own]
    dist, ties = r.dist[open_], r.ties[open_]
    by_step = np.argsort(pstep, kind="stable")
    sorted_steps = pstep[by_step]
    # first guess: every tie entered, ranked by id only
    hit[open_] = dist + np.bitwise_count(ties & above_own) < c
    code[:] = _pack(by_access)
    todo = np.arange(open_.size)
    while todo.size:
        hp, vp = code[pstep[todo]], r.valid_bits[pstep[todo]]
        miss = vp & ~hp
        entered = hp | _lowest_bits(miss, c - np.bitwise_count(hp).astype(np.int64), min(k, c))
        ob = own_bit[todo]
        x_missed = (miss & ob) != 0
        above = np.where(x_missed, miss & above_own[todo], miss | above_own[todo])
        t = np.bitwise_count(ties[todo] & entered & above)
        new = ((entered & ob) != 0) & (dist[todo] + t < c)
        changed = todo[new != hit[open_[todo]]]
        if changed.size == 0:
            break
        hit[open_[changed]] = ~hit[open_[changed]]
        steps = np.unique(open_[changed] // k)
        code[steps] = _pack(by_access[steps])
        todo = _dependents(steps, sorted_steps, by_step)


def _bits_above(k: int) -> np.ndarray:
    """uint64 [k]: for slot j, the bits of slots j+1..k-1."""
    full = (1 << k) - 1
    return np.array([full & ~((1 << (j + 1)) - 1) for j in range(k)], dtype=np.uint64)


def _lowest_bits(bits: np.ndarray, count: np.ndarray, most: int) -> np.ndarray:
    """The lowest ``count`` set bits of each of ``bits`` (``count`` <= ``most``; fewer if fewer are set)."""
    out = np.zeros_like(bits)
    rest = bits.copy()
    for t in range(most):
        low = rest & (~rest + _ONE)
        out |= np.where(count > t, low, np.uint64(0))
        rest ^= low
    return out


def _dependents(steps: np.ndarray, sorted_steps: np.ndarray, by_step: np.ndarray) -> np.ndarray:
    """Positions (ascending) of the open accesses whose previous step is one of ``steps`` (sorted, unique)."""
    lo = np.searchsorted(sorted_steps, steps, side="left")
    count = np.searchsorted(sorted_steps, steps, side="right") - lo
    total = int(count.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.repeat(lo - np.concatenate([[0], np.cumsum(count)[:-1]]), count)
    return np.sort(by_step[first + np.arange(total)])


def chain_applies(r: StepReuse, capacity: int) -> bool:
    """Whether :func:`chain_tables` describes capacity C: C below k, every step using at least C experts (so the
    cache after a step is C of that step's experts), and few enough C-subsets of k slots to enumerate."""
    c = int(capacity)
    return (
        c < r.k and math.comb(r.k, c) <= _MAX_CHAIN_STATES and (r.num_steps == 0 or int(r.accesses_per_step.min()) >= c)
    )


def chain_tables(r: StepReuse, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """The cache as a chain of states, for a capacity where :func:`chain_applies`.

    When C is below every step's size, the cache after a step is C of that step's experts: a C-subset of its k
    slots, one of comb(k, C) states. Returns (next_state [n, S]: the state after step s from each state after
    step s - 1, hits [n, S]: step s's hits from each). A layer's first step ignores the state before it.
    """
    c, k, n = int(capacity), r.k, r.num_steps
    masks = np.array(
        sorted(sum(1 << i for i in combo) for combo in itertools.combinations(range(k), c)), dtype=np.uint64
    )
    prev = r.prev.reshape(n, k)
    linked = (prev >= 0) & (prev // k == np.arange(n)[:, None] - 1)  # the expert was in the step before
    own = (prev % k).astype(np.uint64)
    valid = r.valid_bits.astype(np.uint64)
    next_state = np.empty((n, masks.size), dtype=np.int32)
    hits = np.empty((n, masks.size), dtype=np.int8)
    for q, mask in enumerate(masks):
        hit = np.zeros(n, dtype=np.uint64)
        for j in range(k):  # slot j of step s hits when its expert sat in a cached slot of step s - 1
            hit |= (((mask >> own[:, j]) & _ONE) & linked[:, j]) << np.uint64(j)
        count = np.bitwise_count(hit)
        after = hit | _lowest_bits(valid & ~hit, c - count.astype(np.int64), c)
        next_state[:, q] = np.searchsorted(masks, after)
        hits[:, q] = count
    return next_state, hits


def run_chain(next_state: np.ndarray) -> np.ndarray:
    """int32 [n]: the state before each step (state before step 0: 0) of the chain ``next_state`` [n, S].

    Blocks of about sqrt(n) steps are composed into one map each (vectorised across blocks), the state is
    threaded through the block maps, and then through each block's steps: O(n S) work in O(sqrt(n)) steps.
    """
    n, states = next_state.shape
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    b = max(1, math.isqrt(n))
    blocks = -(-n // b)
    table = np.empty((blocks * b, states), dtype=np.int32)
    table[:n] = next_state
    table[n:] = np.arange(states, dtype=np.int32)  # identity maps pad the last block
    table = table.reshape(blocks, b, states)
    composed = table[:, 0, :].copy()
    for j in range(1, b):
        composed = np.take_along_axis(table[:, j, :], composed, axis=1)
    start = np.empty(blocks, dtype=np.int32)
    state = 0
    for i in range(blocks):
        start[i] = state
        state = int(composed[i, state])
    before = np.empty((blocks, b), dtype=np.int32)
    cur = start
    rows = np.arange(blocks)
    for j in range(b):
        before[:, j] = cur
        cur = table[rows, j, cur]
    return before.reshape(-1)[:n]


def layer_hits(experts: np.ndarray, num_experts: int, capacities) -> tuple[np.ndarray, np.ndarray]:
    """Step-wise LRU of every layer of an expert array [tokens, layers, k]: (hits [layers, capacities], accesses
    [layers]). Capacities below k use the chain of :func:`chain_tables` where it applies (all layers together),
    the fixed-point iteration of :func:`hit_bits` otherwise (layer by layer)."""
    n_layers = experts.shape[1]
    capacities = [int(c) for c in capacities]
    out = np.zeros((n_layers, len(capacities)), dtype=np.int64)
    accesses = np.zeros(n_layers, dtype=np.int64)
    chains: dict[int, list] = {j: [] for j in range(len(capacities))}
    for layer in range(n_layers):
        r = step_reuse(layer_steps(experts[:, layer, :], num_experts), num_experts)
        accesses[layer] = int(r.accesses_per_step.sum())
        for j, cap in enumerate(capacities):
            if chain_applies(r, cap):
                chains[j].append((layer, *chain_tables(r, cap)))
            else:
                out[layer, j] = int(np.bitwise_count(hit_bits(r, cap)).sum())
    for j, parts in chains.items():
        if not parts:
            continue
        next_state = np.concatenate([p[1] for p in parts])
        hits = np.concatenate([p[2] for p in parts])
        before = run_chain(next_state)
        per_step = hits[np.arange(before.size), before].astype(np.int64)
        bounds = np.cumsum([0] + [p[1].shape[0] for p in parts])
        cum = np.concatenate([[0], np.cumsum(per_step)])
        for (layer, _, _), lo, hi in zip(parts, bounds[:-1], bounds[1:]):
            out[layer, j] = int(cum[hi] - cum[lo])
    return out, accesses
