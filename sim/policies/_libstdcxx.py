"""``std::sort`` exactly as GCC's libstdc++ implements it (introsort), for policies that must reproduce a C++
artifact's order among equal keys.

``std::sort`` is not stable, so where a C++ program sorts by a key with ties, the order it leaves among equal
elements is a property of the library, not of the program. libstdc++ (GCC 4.9 to 14 alike; the Diff-MoE
artifact's container ships GCC 9) sorts a range of more than 16 elements by quicksort with a median-of-three
pivot (moved to the front), an unguarded Hoare partition, a heapsort fallback once the recursion is 2 floor(log2 n)
deep, and one final insertion sort; a range of at most 16 elements gets only that insertion sort, which is
stable. :func:`cxx_sort` transliterates ``std::__sort`` and its helpers from ``bits/stl_algo.h`` and
``bits/stl_heap.h``, moving elements as they do; ``tests/sim/policies/test_diffmoe_artifact.py`` checks it against the
machine's ``g++`` when there is one.
"""

from __future__ import annotations

from collections.abc import Callable, MutableSequence

_THRESHOLD = 16  # libstdc++'s _S_threshold


def cxx_sort(a: MutableSequence, comp: Callable[[object, object], bool]) -> None:
    """Sort ``a`` in place as ``std::sort(a.begin(), a.end(), comp)`` does; ``comp(x, y)`` is true when ``x``
    goes strictly before ``y`` (a strict weak order, as C++ requires)."""
    n = len(a)
    if n < 2:
        return
    _introsort_loop(a, 0, n, 2 * (n.bit_length() - 1), comp)
    _final_insertion_sort(a, 0, n, comp)


def sort_by_key_descending(a: MutableSequence, key) -> None:
    """``std::sort(a, [](x, y) { return key[x] > key[y]; })``: the comparator fetcher.cc uses. At most 16
    elements, or no equal keys: the same as Python's stable sort (fast path)."""
    n = len(a)
    if n < 2:
        return
    if n <= _THRESHOLD or len({key[x] for x in a}) == n:
        # stable, highest first: Python's sort is stable under reverse=True too (equal keys keep their order)
        a[:] = sorted(a, key=key.__getitem__, reverse=True)
        return
    cxx_sort(a, lambda x, y: key[x] > key[y])


# ------------------------------------------------------------------------------------- bits/stl_algo.h
def _introsort_loop(a, first: int, last: int, depth_limit: int, comp) -> None:
    while last - first > _THRESHOLD:
        if depth_limit == 0:
            _partial_sort(a, first, last, last, comp)
            return
        depth_limit -= 1
        cut = _unguarded_partition_pivot(a, first, last, comp)
        _introsort_loop(a, cut, last, depth_limit, comp)
        last = cut


def _unguarded_partition_pivot(a, first: int, last: int, comp) -> int:
    mid = first + (last - first) // 2
    _move_median_to_first(a, first, first + 1, mid, last - 1, comp)
    return _unguarded_partition(a, first + 1, last, first, comp)


def _move_median_to_first(a, result: int, x: int, y: int, z: int, comp) -> None:
    if comp(a[x], a[y]):
        if comp(a[y], a[z]):
            pick = y
        elif comp(a[x], a[z]):
            pick = z
        else:
            pick = x
    elif comp(a[x], a[z]):
        pick = x
    elif comp(a[y], a[z]):
        pick = z
    else:
        pick = y
    a[result], a[pick] = a[pick], a[result]


def _unguarded_partition(a, first: int, last: int, pivot: int, comp) -> int:
    while True:
        while comp(a[first], a[pivot]):
            first += 1
        last -= 1
        while comp(a[pivot], a[last]):
            last -= 1
        if not first < last:
            return first
        a[first], a[last] = a[last], a[first]
        first += 1


def _final_insertion_sort(a, first: int, last: int, comp) -> None:
    if last - first > _THRESHOLD:
        _insertion_sort(a, first, first + _THRESHOLD, comp)
        for i in range(first + _THRESHOLD, last):  # __unguarded_insertion_sort
            _unguarded_linear_insert(a, i, comp)
    else:
        _insertion_sort(a, first, last, comp)


def _insertion_sort(a, first: int, last: int, comp) -> None:
    if first == last:
        return
    for i in range(first + 1, last):
        if comp(a[i], a[first]):
            val = a[i]
            a[first + 1 : i + 1] = a[first:i]  # move_backward
            a[first] = val
        else:
            _unguarded_linear_insert(a, i, comp)


def _unguarded_linear_insert(a, last: int, comp) -> None:
    val = a[last]
    nxt = last - 1
    while comp(val, a[nxt]):
        a[last] = a[nxt]
        last = nxt
        nxt -= 1
    a[last] = val


def _partial_sort(a, first: int, middle: int, last: int, comp) -> None:
    # __heap_select
    _make_heap(a, first, middle, comp)
    for i in range(middle, last):
        if comp(a[i], a[first]):
            _pop_heap(a, first, middle, i, comp)
    # __sort_heap
    while middle - first > 1:
        middle -= 1
        _pop_heap(a, first, middle, middle, comp)


# ------------------------------------------------------------------------------------- bits/stl_heap.h
def _make_heap(a, first: int, last: int, comp) -> None:
    length = last - first
    if length < 2:
        return
    parent = (length - 2) // 2
    while True:
        _adjust_heap(a, first, parent, length, a[first + parent], comp)
        if parent == 0:
            return
        parent -= 1


def _pop_heap(a, first: int, last: int, result: int, comp) -> None:
    value = a[result]
    a[result] = a[first]
    _adjust_heap(a, first, 0, last - first, value, comp)


def _adjust_heap(a, first: int, hole: int, length: int, value, comp) -> None:
    top = hole
    second = hole
    while second < (length - 1) // 2:
        second = 2 * (second + 1)
        if comp(a[first + second], a[first + second - 1]):
            second -= 1
        a[first + hole] = a[first + second]
        hole = second
    if (length & 1) == 0 and second == (length - 2) // 2:
        second = 2 * (second + 1)
        a[first + hole] = a[first + second - 1]
        hole = second - 1
    # __push_heap
    parent = (hole - 1) // 2
    while hole > top and comp(a[first + parent], value):
        a[first + hole] = a[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    a[first + hole] = value


__all__ = ["cxx_sort", "sort_by_key_descending"]
