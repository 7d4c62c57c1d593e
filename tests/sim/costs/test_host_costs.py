"""Host costs in the simulator (a layer's routing round trip, issuing copies and experts): off by default, they
move time and never decisions, and each adds no more than its count times its cost."""

from __future__ import annotations

import pytest

from sim.run import simulate
from tests.support.validate import tiny_config, with_hardware


def _run(cfg, trace):
    r = simulate(cfg, trace=trace, check_invariants=True)
    return r, r.summary["sim_time_s"], [(x.hits_hpc, x.hits_mpc, x.misses, x.copies) for x in r.engine.iterations]


def _layer_steps(result) -> int:
    return sum(1 for _ in result.engine.iterations) * 3  # the tiny trace: 3 MoE layers, every one run per step


def test_the_round_trip_delays_every_layer_of_on_demand_by_exactly_itself(tiny):
    base = tiny_config(tiny, "on-demand", batch=8)
    r0, t0, d0 = _run(base, tiny[2])
    r1, t1, d1 = _run(with_hardware(base, layer_roundtrip_us=30), tiny[2])
    # nothing of a layer is issued before its round trip, and on-demand keeps nothing across layers
    assert t1 == pytest.approx(t0 + 30e-6 * _layer_steps(r1), rel=1e-9)
    assert d0 == d1


@pytest.mark.parametrize("policy,predictor", [("lru", "oracle"), ("diffmoe", "oracle"), ("pregated", "oracle")])
def test_issue_costs_add_at_most_their_count_and_change_no_decision(tiny, policy, predictor):
    base = tiny_config(tiny, policy, predictor, batch=8)
    r0, t0, d0 = _run(base, tiny[2])
    slow = with_hardware(base, copy_issue_us=5, expert_issue_us=40, hit_issue_us=20)
    r1, t1, d1 = _run(slow, tiny[2])
    assert d0 == d1
    copies = r1.summary["copies"]
    accesses = sum(x.hits_hpc + x.hits_mpc + x.hits_lpc + x.misses for x in r1.engine.iterations)
    assert t0 < t1 <= t0 + 5e-6 * copies + 40e-6 * accesses + 20e-6 * accesses + 1e-12


def test_an_expert_issue_below_the_expert_compute_changes_nothing(tiny):
    base = tiny_config(tiny, "on-demand", batch=8)
    _, t0, _ = _run(base, tiny[2])
    _, t1, _ = _run(with_hardware(base, expert_issue_us=1e-6, hit_issue_us=1e-6), tiny[2])
    assert t1 == pytest.approx(t0, rel=1e-12)


def test_a_negative_host_cost_is_refused_naming_the_field(tiny):
    from moebase.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        with_hardware(tiny_config(tiny, "lru"), layer_roundtrip_us=-1)
    assert "layer_roundtrip_us" in str(exc.value)
