"""What an engine records per iteration, shared by the simulator and the validator's executor (no SimPy here, so
that a measuring machine needs only torch and the decision code)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IterationRecord:
    index: int
    batch: int
    kind: str
    requests: int
    tokens: int
    decode_tokens: int
    start_s: float
    end_s: float
    stall_s: float
    hits_hpc: int
    hits_mpc: int
    hits_lpc: int
    misses: int
    copies: int
    prefetches: int
    unused_prefetches: int
    promotions: int = 0  # experts moved into the MPC
    evictions: int = 0  # experts they displaced
    cpu_experts: int = 0  # expert computations on the host CPU (source "cpu")
    cpu_s: float = 0.0  # the host CPU's time computing them
    cpu_wait_s: float = 0.0  # the compute stream waiting for them (apart from stall_s)

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s
