"""Per-iteration accounting shared by the simulator's engine (``sim/timing/engine.py``) and the validator's executor
(``validate/executor.py``): an iteration's hits, misses, copies, promotions and evictions are the differences of
the run's counters between its start and its end, and its record (:class:`sim.core.records.IterationRecord`) is built
the same way by both. No SimPy here, so that a measuring machine needs only torch and the decision code.
"""

from __future__ import annotations

from sim.core.cache import HPC, LPC, MPC
from sim.core.records import IterationRecord

# an iteration's counts in IterationRecord's order after stall_s: hits per tier (HPC, MPC, LPC), misses, copies,
# prefetches, unused prefetches, promotions, evictions
Counts = tuple[int, int, int, int, int, int, int, int, int]

__all__ = ["IterationTally", "iteration_record"]


class IterationTally:
    """The counts of the iteration under way: the policy's cache counters (``counters``: ``hits`` per tier,
    ``misses``, ``promotions``, ``evictions``) and the copy engine's ``copies``, as they were at :meth:`begin`."""

    __slots__ = ("counters", "copier", "before")

    def __init__(self, counters, copier):
        """``copier``: what counts the copies that landed (``copier.copies``): the simulator's copy engine or the
        executor's copy thread."""
        self.counters, self.copier = counters, copier
        self.before: tuple[dict, int, int, int, int] | None = None  # the counters at begin()

    def begin(self) -> None:
        """An iteration starts: remember the counters."""
        c = self.counters
        self.before = (dict(c.hits), c.misses, self.copier.copies, c.promotions, c.evictions)

    def counts(self, prefetches: int, unused: int) -> Counts:
        """The iteration's counts since :meth:`begin`, in :class:`IterationRecord`'s order after ``stall_s``: hits
        per tier (HPC, MPC, LPC), misses, copies, ``prefetches`` (issued), ``unused`` (prefetches), promotions,
        evictions."""
        assert self.before is not None, "begin() comes first"
        c, (hits0, misses0, copies0, promotions0, evictions0) = self.counters, self.before
        hits = c.hits
        return (
            hits[HPC] - hits0[HPC],
            hits[MPC] - hits0[MPC],
            hits[LPC] - hits0[LPC],
            c.misses - misses0,
            self.copier.copies - copies0,
            prefetches,
            unused,
            c.promotions - promotions0,
            c.evictions - evictions0,
        )


def iteration_record(
    it,
    tokens: int,
    start_s: float,
    end_s: float,
    stall_s: float,
    counts: Counts,
    cpu_experts: int = 0,
    cpu_s: float = 0.0,
    cpu_wait_s: float = 0.0,
) -> IterationRecord:
    """The record of iteration ``it`` (a :class:`sim.core.workload.Iteration`): its ``tokens``, its start and end and
    the
    compute stream's stall on copies (seconds), ``counts`` (:meth:`IterationTally.counts`) and its experts on the
    host CPU (how many, the host's seconds on them, the compute stream's wait for them)."""
    return IterationRecord(
        it.index,
        it.batch,
        it.kind,
        it.requests,
        tokens,
        it.decode_tokens,
        start_s,
        end_s,
        stall_s,
        *counts,
        cpu_experts,
        cpu_s,
        cpu_wait_s,
    )
