"""The validator's half of host-CPU experts: experts computed on the host CPU for real (Fiddler / kTransformers style).

The executor computes the experts a plan puts on the host (source ``"cpu"``) on a host thread pool beside the
device's own experts, with the simulator's decisions; ``validate microbench`` measures the host's expert time
(``tables.cpu_expert``); the suites carry hybrid configurations. Test-only policies (registered here, removed after)
put non-resident experts on the host, so that the path is tested before the simulator's hybrid policies exist.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from sim.config.run_config import config_from_dict
from sim.core.cache import HPC, LPC
from sim.decisions.replay import replay
from sim.policies import POLICIES
from sim.policies.base import LayerPlan, Policy
from sim.predictors import PREDICTORS
from sim.run import build_decisions
from tests.support.paths import ROOT
from tests.support.traces import TINY_MODEL
from tests.support.validate import TINY, tiny_files, tiny_suite
from validate.backends import CpuBackend, default_host_threads
from validate.executor import CPU, HOST_PHASES, Executor, cpu_experts_of
from validate.kernels import HostExperts, expert_forward, expert_views, fill_random, torch_dtype
from validate.suites import HYBRID_POLICIES, SUITES

torch = pytest.importorskip("torch")


class _HostMisses(Policy):
    """Test only: the HPC pinned with the hottest experts, no MPC; an active expert neither pinned nor prefetched is
    computed on the host CPU (``ODD_ONLY``: only the odd ones, the even ones copied as misses)."""

    ODD_ONLY = False
    origin = "baseline"  # declared by every registered policy (sim compare)

    def mpc_capacity(self, ctx):
        return 0

    def configure(self):
        self.pin_hot_experts()

    def plan_layer(self, iteration, layer, active):
        cache = self.cache
        hpc, lpc = cache.hpc[layer], cache.lpc_of[layer]
        prefetched = len(lpc)
        sources, resident, copied = {}, [], []  # the decision protocol counts the accesses from the sources
        for e in active:
            if e in hpc:
                sources[e] = HPC
                resident.append(e)
            elif e in lpc:
                sources[e] = LPC
                copied.append((e, LPC))
            elif self.ODD_ONLY and e % 2 == 0:
                cache.add_lpc(layer, e)
                sources[e] = "miss"
                copied.append((e, "miss"))
            else:
                sources[e] = CPU
        used = sum(1 for e in active if sources[e] == LPC)
        unused = sorted(e for e in lpc if e not in sources) if prefetched > used else []
        plan = LayerPlan(sources, {}, unused, resident, copied)
        if hasattr(plan, "cpu"):  # the split lists, host experts included (the simulator's LayerPlan.cpu)
            plan.cpu = [e for e in active if sources[e] == CPU]
        return plan


@pytest.fixture(scope="module")
def host_policies():
    """``test-cpu-misses`` and ``test-cpu-odd`` registered for this module only (the registry has no unregister:
    the names are removed from it after)."""
    names = {
        "test-cpu-misses": type("HostMisses", (_HostMisses,), {}),
        "test-cpu-odd": type("HostOdd", (_HostMisses,), {"ODD_ONLY": True}),
    }
    for name, cls in names.items():
        POLICIES.register(name)(cls)
    try:
        yield list(names)
    finally:
        for name in names:
            POLICIES._items.pop(name, None)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_files(tmp_path_factory, 5)


def _config(tiny, policy, predictor="none", batch=4, hpc=2, mpc=0, lpc=4):
    model, path, _ = tiny
    return config_from_dict(
        {
            "model": str(model),
            "hardware": "h200",
            "workload": {"trace": str(path), "batch_size": batch, "max_decode_tokens": 5, "requests": batch},
            "cache": {"hpc_slots": hpc, "mpc_slots": mpc, "lpc_buffers": lpc, "layers": "all"},
            "policy": {"name": policy, "params": {}},
            "predictor": {
                "name": predictor,
                "params": {"recall": 0.7, "precision": 0.6} if predictor == "noisy" else {},
            },
        },
        "test",
        POLICIES.names(),
        PREDICTORS.names(),
    )


def _count_cpu(decisions) -> int:
    return sum(1 for d in decisions for _, src in d.sources if src == CPU)


# ------------------------------------------------------------------------------------------------ the host pool
@pytest.mark.parametrize("gated,threads", [(False, 1), (False, 3), (True, 2)])
def test_the_host_pool_computes_what_expert_forward_computes(gated, threads):
    from moebase.model import load_model

    model = load_model({**TINY, "expert_matrices": 3 if gated else 2}, "m")
    dtype = torch_dtype(torch, model)
    bufs = [torch.empty(model.expert_bytes, dtype=torch.uint8) for _ in range(2)]
    for b in bufs:
        fill_random(torch, b, model, dtype)
    views = [expert_views(b, model, dtype) for b in bufs]
    x = torch.randn(7, model.d_model, dtype=dtype)
    out = torch.zeros(2 * 7, model.d_model, dtype=dtype)
    pool = HostExperts(torch, model, threads)
    try:
        assert len(pool.blocks) == min(threads, model.d_ff // 32)
        job = pool.run([(views[0], x[:3], out[:3]), (views[1], x, out[3:10])])
        job.wait()
        assert job.busy_s > 0
    finally:
        pool.close()
    torch.testing.assert_close(out[:3], expert_forward(torch, views[0], x[:3], gated), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out[3:10], expert_forward(torch, views[1], x, gated), rtol=1e-4, atol=1e-5)
    assert not out[10:].any()  # nothing written beyond the experts' rows


def test_the_host_pool_raises_what_a_worker_raised_and_restores_torch_threads():
    from moebase.model import load_model

    model = load_model(TINY, "m")
    before = torch.get_num_threads()
    pool = HostExperts(torch, model, 2, intra_op=1)
    try:
        assert torch.get_num_threads() == 1
        bad = [torch.zeros(3, 3)] * 2  # wrong shapes
        job = pool.run([(bad, torch.zeros(2, model.d_model), torch.zeros(2, model.d_model))])
        with pytest.raises(RuntimeError):
            job.wait()
    finally:
        pool.close()
    assert torch.get_num_threads() == before


def test_default_host_threads_leave_the_compute_and_copy_threads_their_cores(monkeypatch):
    import validate.backends as backends

    class Be:
        def __init__(self, name, threads=1):
            self.name, self.threads = name, threads

    monkeypatch.setattr(backends, "host_cores", lambda: 16)
    assert default_host_threads(Be("cpu")) == 14 and default_host_threads(Be("cpu", 2)) == 6
    assert default_host_threads(Be("cuda")) == 14 and default_host_threads(Be("cpu", 64)) == 1


# ---------------------------------------------------------------------------------------------- the executor
@pytest.mark.parametrize(
    "policy,predictor", [("test-cpu-misses", "none"), ("test-cpu-odd", "noisy"), ("test-cpu-misses", "oracle")]
)
def test_the_executor_computes_host_experts_with_the_simulators_decisions(tiny, host_policies, policy, predictor):
    cfg = _config(tiny, policy, predictor)
    trace = tiny[2]
    ex = Executor(cfg, trace, CpuBackend(torch), host_pool_bytes=6 * 2**16, warmup=1, host_threads=2)
    res = ex.run()
    policy_obj, predictor_obj = build_decisions(cfg, trace, ex.iterations)
    expected = replay(trace, ex.iterations, policy_obj, predictor_obj)
    assert res.decisions == expected  # the very decisions, host sources included
    assert sum(res.cpu_experts) == _count_cpu(expected) > 0
    assert len(res.cpu_experts) == len(res.iterations) == len(res.cpu_busy_s) == len(res.cpu_stall_s)
    assert res.active_experts == sum(len(d.active) for d in expected)
    for r, n, busy, wait in zip(res.iterations, res.cpu_experts, res.cpu_busy_s, res.cpu_wait_s):
        assert r.latency_s > 0
        assert (busy > 0) == (n > 0) and wait >= 0
        assert r.copies >= r.misses  # host experts are not copied
    # no host expert was copied: the copies are the misses and the prefetches
    assert res.copies == sum(r.misses for r in res.iterations) + res.prefetch_copies
    assert set(HOST_PHASES) == set(res.host_phases) and res.host_phases["cpu_issue"] > 0
    assert res.host_threads == 2 and any("host CPU" in n for n in res.notes)


def test_a_policy_without_host_experts_starts_no_host_pool(tiny):
    res = Executor(_config(tiny, "lru", hpc=1, mpc=3), tiny[2], CpuBackend(torch), host_pool_bytes=1 << 20).run()
    assert res.host_threads == 0 and sum(res.cpu_experts) == 0 and res.host_phases["cpu_wait"] == 0


def test_cpu_experts_of_reads_the_steps_list_or_the_plans_sources():
    class Step:
        __slots__ = ("active", "plan")

    step = Step()
    step.active = [1, 3, 5]
    step.plan = LayerPlan({1: CPU, 3: HPC, 5: CPU})
    assert cpu_experts_of(step) == [1, 5]

    class WithCpu:
        cpu = (5,)

    assert cpu_experts_of(WithCpu()) == [5]


def test_the_simulator_agrees_where_it_has_host_experts(tiny, host_policies):
    """Once the simulator computes experts on the host (``sim.core.cache.CPU``), its engine makes the executor's
    decisions for a hybrid policy too."""
    import sim.core.cache

    if not hasattr(sim.core.cache, "CPU"):
        pytest.skip("the simulator has no host experts yet (sim.core.cache.CPU)")
    from sim.run import simulate

    cfg = _config(tiny, "test-cpu-odd", "noisy")
    res = Executor(cfg, tiny[2], CpuBackend(torch), host_pool_bytes=1 << 20, host_threads=1).run()
    out = simulate(cfg, trace=tiny[2], record_decisions=True)
    assert out.engine.decisions == res.decisions


# ------------------------------------------------------------------------------- the microbenchmark and suites
def test_microbench_measures_the_host_expert_table(tmp_path):
    from moebase.model import load_model
    from sim.config.hardware import load_hardware
    from sim.costs.costs import CostModel

    model_path = tmp_path / "tiny-moe.yaml"
    model_path.write_text(yaml.safe_dump(TINY_MODEL))
    out = tmp_path / "cal.yaml"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "validate",
            "microbench",
            "--model",
            str(model_path),
            "--out",
            str(out),
            "--quick",
            "--repeat",
            "2",
            "--host-threads",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    raw = yaml.safe_load(out.read_text())
    hw = load_hardware(str(out))
    points = hw.tables.cpu_expert
    assert [int(t) for t, _ in points] == [1, 4, 16, 64] and all(s > 0 for _, s in points)
    assert raw["cpu_cores"] == 1 and hw.cpu_cores == 1  # the table is for the pool's threads
    assert "cpu_expert" in res.stdout
    costs = CostModel(load_model(str(model_path)), hw)
    assert costs.cpu_expert_s(int(points[1][0])) == pytest.approx(points[1][1])


def test_the_suites_carry_hybrid_configurations_that_skip_when_unregistered():
    for suite in SUITES.values():
        hybrid = [p for p in suite.points if p[1] in HYBRID_POLICIES]
        assert len(hybrid) >= 2 and not set(p[0] for p in hybrid) & set(suite.quick)
    from validate.measure import runnable

    configs = SUITES["cpu"].configs()
    kept, skipped = runnable(configs, ["on-demand", "lru"])
    assert {n for n, _ in kept} | {n for n, _ in skipped} == {n for n, _ in configs}
    assert all(d["policy"]["name"] in ("on-demand", "lru") for _, d in kept)
    assert {d["policy"]["name"] for _, d in skipped} >= set(HYBRID_POLICIES)


def test_validate_cpu_measures_hybrid_configurations_and_compare_reports_them(tiny, tmp_path, monkeypatch):
    """The simulator's hybrid policies measured and compared in process, on the tiny model (once registered)."""
    missing = [p for p in HYBRID_POLICIES if p not in POLICIES]
    if missing:
        pytest.skip(f"hybrid policies not registered yet: {', '.join(missing)}")
    import validate.measure as measure_mod
    from validate.compare import compare

    points = tuple((f"{p}-b4-c4", p, "none", 4, 2, 2) for p in HYBRID_POLICIES)
    monkeypatch.setattr(
        measure_mod,
        "SUITES",
        {"cpu": tiny_suite(tiny, points)},
    )
    out = measure_mod.measure("cpu", tmp_path / "m", "cpu", repeat=2, rounds=1, host_threads=1, log=lambda m: None)
    rows, _ = compare(out, log=lambda m: None)
    assert [r["config"] for r in rows] == [p[0] for p in points]
    assert all(r["decisions_identical"] for r in rows)
    assert all(r["real_cpu_experts"] == r["sim_cpu_experts"] for r in rows)
    assert any(r["cpu_expert_frac"] > 0 for r in rows)
    for r in rows:
        if r["real_cpu_experts"]:
            assert r["real_cpu_busy_ms"] > 0 and r["sim_cpu_busy_ms"] > 0 and r["sim_cpu_wait_ms"] >= 0


def test_measure_records_host_experts_and_skips_unregistered_policies(tiny, host_policies, tmp_path, monkeypatch):
    """``validate cpu`` in process, over a tiny suite: a hybrid configuration's summary counts its host experts
    and their time; a configuration whose policy is not registered is skipped with a message."""
    import json

    import validate.measure as measure_mod

    suite = tiny_suite(
        tiny, (("hyb-b4-c2", "test-cpu-odd", "none", 4, 2, 0), ("later-b4", "no-such-policy-yet", "none", 4, 0, 0))
    )
    monkeypatch.setattr(measure_mod, "SUITES", {"cpu": suite})
    said = []
    out = measure_mod.measure("cpu", tmp_path / "m", "cpu", repeat=2, rounds=1, host_threads=1, log=said.append)
    assert any("skipped later-b4" in line and "no-such-policy-yet" in line for line in said)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["configs"] == ["hyb-b4-c2"] and manifest["skipped"] == ["later-b4"]
    assert manifest["host_threads"] == 1
    s = json.loads((out / "runs" / "hyb-b4-c2" / "summary.json").read_text())
    assert s["cpu_experts"] == sum(s["cpu_experts_per_iteration"]) > 0
    assert 0 < s["cpu_expert_frac"] < 1 and s["cpu_busy_ms"] > 0 and s["cpu_stall_ms"] >= 0
    assert s["host_threads"] == 1 and "cpu_wait" in s["host_phase_ms"]
    # its decisions were made with the calibration as it stood then, kept beside it for compare
    from sim.config.hardware import load_hardware

    assert load_hardware(str(out / "runs" / "hyb-b4-c2" / "hardware.yaml")).tables.model == "tiny-moe"
    cal = yaml.safe_load((out / "calibration.yaml").read_text())
    assert cal["cpu_cores"] == 1 and cal["tables"]["cpu_expert"] and cal["activation_latency_us"] >= 0
    with pytest.raises(Exception, match="no configuration left"):
        measure_mod.measure("cpu", tmp_path / "n", "cpu", only=["later-b4"], log=said.append)


def test_the_report_has_a_section_for_hybrid_configurations():
    from validate.compare import COLUMNS, markdown

    def row(name, frac, err):
        r = dict.fromkeys(COLUMNS, 0.0)
        r.update(
            config=name,
            real_mean_ms=10.0,
            sim_mean_ms=10.0 * (1 + err / 100),
            err_mean_pct=err,
            real_p50_ms=10.0,
            sim_p50_ms=10.0,
            real_tok_s=1.0,
            sim_tok_s=1.0,
            cpu_expert_frac=frac,
            real_cpu_experts=int(100 * frac),
            sim_cpu_experts=int(100 * frac),
            real_cpu_busy_ms=None,
            sim_cpu_busy_ms=2.0,
            real_cpu_wait_ms=1.5,
            sim_cpu_wait_ms=1.25,
            decisions_identical=True,
        )
        return r

    md = markdown(
        [row("lru-b8-c6", 0.0, 5.0), row("fiddler-b8-c6", 0.4, -10.0), row("ktransformers-b16-c13", 0.2, 20.0)],
        {"suite": "cpu"},
    )
    assert "Median absolute error over 3 configurations" in md
    hybrid = md.split("## Experts on the host CPU", 1)[1]
    assert "fiddler-b8-c6 | 40.0% | 40 / 40 | - / 2.00 | 1.50 / 1.25 |" in hybrid and "lru-b8-c6" not in hybrid
    assert "Median absolute error over 2 hybrid configuration(s): mean latency 15.0%" in hybrid
    assert "## Experts on the host CPU" not in markdown([row("lru-b8-c6", 0.0, 5.0)], {"suite": "cpu"})


def test_host_workers_wait_for_the_inputs_copy_to_the_host(tiny, host_policies):
    """As on a GPU, where the device -> host copy of the inputs is asynchronous: every worker waits for its marker
    before it computes."""
    import threading
    import time

    class Async(CpuBackend):
        def __init__(self, torch):
            super().__init__(torch)
            self.waits, self.lock = 0, threading.Lock()

        def to_host_async(self, dst, src):
            dst.copy_(src)
            return time.perf_counter() + 2e-4  # the copy "lands" a little later

        def wait_host(self, marker):
            if marker is None:
                return
            with self.lock:
                self.waits += 1
            while time.perf_counter() < marker:
                time.sleep(5e-5)

    be = Async(torch)
    res = Executor(_config(tiny, "test-cpu-misses"), tiny[2], be, host_pool_bytes=1 << 20, host_threads=2).run()
    assert sum(res.cpu_experts) > 0 and be.waits > 0


def test_compare_simulates_a_cost_weighing_policy_on_the_calibration_it_decided_with(tiny, tmp_path, monkeypatch):
    """fiddler weighs the host against a copy with the calibration as it stood when it ran; a final calibration
    that would make it decide otherwise is not used for it (runs/NAME/hardware.yaml is)."""
    if "fiddler" not in POLICIES:
        pytest.skip("fiddler is not registered yet")
    import validate.measure as measure_mod
    from validate.compare import compare

    monkeypatch.setattr(
        measure_mod,
        "SUITES",
        {"cpu": tiny_suite(tiny, (("fiddler-b4-c4", "fiddler", "none", 4, 2, 2),))},
    )
    out = measure_mod.measure("cpu", tmp_path / "m", "cpu", repeat=2, rounds=1, host_threads=1, log=lambda m: None)
    s = __import__("json").loads((out / "runs" / "fiddler-b4-c4" / "summary.json").read_text())
    cal = yaml.safe_load((out / "calibration.yaml").read_text())
    # the host a thousand times slower, or a thousand times faster: the other choice from the one made
    factor = 1e3 if s["cpu_experts"] else 1e-3
    cal["tables"]["cpu_expert"] = [[t, v * factor] for t, v in cal["tables"]["cpu_expert"]]
    cal["activation_latency_us"] = cal["activation_latency_us"] * factor if factor > 1 else 0.0
    (out / "calibration.yaml").write_text(yaml.safe_dump(cal))
    rows, _ = compare(out, log=lambda m: None)
    assert rows[0]["decisions_identical"] and rows[0]["sim_hardware"] == "runs/fiddler-b4-c4/hardware.yaml"
