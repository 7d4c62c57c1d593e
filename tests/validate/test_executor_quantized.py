"""Quantized experts in the validator: weight-only int8 and packed int4 experts held at the simulator's bytes
(``model.expert_bytes``), de-quantized on the device before their GEMMs; ``validate microbench`` times the
de-quantization per format (``dequant_int8``, ``dequant_int4``); the suites' quantized configurations measure in
CPU mode and the simulator makes the executor's decisions on them."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from moebase.errors import ConfigError
from moebase.model import load_model
from sim.config.hardware import load_hardware
from sim.config.run_config import config_from_dict
from sim.decisions.replay import replay
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from sim.run import build_decisions
from tests.support.validate import TINY, tiny_files
from validate.backends import CpuBackend
from validate.executor import Executor
from validate.kernels import (
    INT4_ZERO,
    ExpertStore,
    HostExperts,
    QuantLayout,
    _dequant_part,
    check_runnable,
    expert_format,
    expert_forward,
    expert_shapes,
)
from validate.microbench import Timer, measure_dequant, write_calibration
from validate.suites import QUANTIZED_BITS, SUITES

torch = pytest.importorskip("torch")


def _model(bits, **more):
    return load_model({**TINY, "dtype_bytes": 2, "expert_bits": bits, **more}, "model")


def _dense(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(r, c, generator=g) * 0.02 for r, c in expert_shapes(model)]


# ------------------------------------------------------------------------------------------------ the formats
@pytest.mark.parametrize(
    "bits,fmt", [(None, None), (16, None), (8, "int8"), (8.5, "int8"), (4, "int4"), (4.25, "int4"), (4.5, "int4")]
)
def test_expert_bits_pick_the_format(bits, fmt):
    model = _model(bits)
    assert expert_format(model) == fmt
    check_runnable(model, "model")


@pytest.mark.parametrize("bits", [3, 4.6, 6, 9, 12, 32])
def test_other_widths_are_refused_naming_expert_bits(bits):
    with pytest.raises(ConfigError) as err:
        check_runnable(_model(bits), "model")
    assert err.value.field == "model.expert_bits" and "\n" not in str(err.value)


@pytest.mark.parametrize("bits", [8, 8.5, 4, 4.25, 4.5])
def test_round_trip_error_is_within_the_formats_bound(bits):
    """quantize -> pack -> de-quantize: every weight within half a step of its scale (fp16 scales: + a rounding)."""
    model = _model(bits, d_model=128, d_ff=256)
    layout = QuantLayout(model)
    flat = torch.empty(model.expert_bytes, dtype=torch.uint8)
    dense = _dense(model)
    layout.quantize_into(torch, flat, dense)
    qe = layout.views(torch, flat)
    for (q, s), w in zip(qe.parts, dense):
        back = _dequant_part(torch, layout.format, layout.group, q, s, torch.empty(w.shape, dtype=torch.float32))
        step = s.float()
        if layout.format == "int4":
            step = step.repeat_interleave(layout.group, dim=0)  # [in, out]
            assert q.dtype == torch.uint8 and q.shape == (w.shape[0] // 2, w.shape[1])
        else:
            assert q.dtype == torch.int8 and q.shape == w.shape
        err = (back - w).abs()
        assert bool((err <= step / 2 * (1 + 1e-3) + 1e-7).all()), float((err - step / 2).max())
        levels = 7 if layout.format == "int4" else 127
        assert float(err.max()) <= float(w.abs().max()) / levels / 2 * 1.01


@pytest.mark.parametrize("bits,group,inline", [(4.25, 64, True), (4.5, 32, True), (4, 128, False), (4.125, 128, True)])
def test_packed_int4_bytes_are_two_weights_per_byte_plus_group_scales(bits, group, inline):
    model = _model(bits, d_model=256, d_ff=512)
    layout = QuantLayout(model)
    params = model.expert_params
    assert layout.group == group and layout.q_bytes == params // 2
    assert layout.s_bytes == params // group * 2  # one fp16 scale per group
    assert layout.nbytes == model.expert_bytes == math.ceil(params * bits / 8)
    assert layout.scales_inline is inline
    if inline:
        assert layout.payload_bytes <= model.expert_bytes
    if bits == 4.25:  # gpt-oss's bytes, filled exactly
        assert layout.payload_bytes == model.expert_bytes and layout.bits_per_weight == 4.25


def test_int8_at_8_bits_holds_the_weights_in_the_bytes_and_keeps_the_scales_resident():
    model = _model(8)
    layout = QuantLayout(model)
    assert layout.q_bytes == model.expert_bytes == model.expert_params and not layout.scales_inline
    layout8 = QuantLayout(_model(8.5))
    assert layout8.scales_inline and layout8.payload_bytes == model.expert_params + layout.s_bytes


def test_nibbles_pack_even_rows_low_and_odd_rows_high():
    model = _model(4.5, d_model=64, d_ff=64, expert_matrices=2)
    layout = QuantLayout(model)
    flat = torch.empty(model.expert_bytes, dtype=torch.uint8)
    w = torch.zeros(64, 64)
    w[0, 0], w[1, 0], w[2, 0], w[3, 0] = 1.0, -1.0, 0.5, -8 / 7  # one group's max 8/7: scale 8/49
    layout.quantize_into(torch, flat, [w, torch.zeros(64, 64)])
    q, s = layout.views(torch, flat).parts[0]
    scale = float(s[0, 0])
    lo, hi = int(q[0, 0]) & 15, int(q[0, 0]) >> 4
    assert lo - INT4_ZERO == round(1.0 / scale) and hi - INT4_ZERO == round(-1.0 / scale)
    assert int(q[0, 1]) == INT4_ZERO | INT4_ZERO << 4  # zero weights: the zero point


# ------------------------------------------------------------------------------------------------ the executor
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_files(tmp_path_factory, 7)


def _config(tiny, bits, policy="lru", predictor="none", hpc=1, mpc=3):
    _, path, _ = tiny
    return config_from_dict(
        {
            "model": {**TINY, "dtype_bytes": 2, "expert_bits": bits},
            "hardware": "h200",
            "workload": {"trace": str(path), "batch_size": 4, "max_decode_tokens": 4, "requests": 4},
            "cache": {"hpc_slots": hpc, "mpc_slots": mpc, "lpc_buffers": 4, "layers": "all"},
            "policy": {"name": policy, "params": {}},
            "predictor": {"name": predictor, "params": {}},
        },
        "test",
        POLICIES.names(),
        PREDICTORS.names(),
    )


@pytest.mark.parametrize("bits,tol", [(8, 0.03), (4.25, 0.2)])
def test_the_executor_holds_quantized_experts_at_the_simulators_bytes_and_computes_the_reference(tiny, bits, tol):
    cfg = _config(tiny, bits, "diffmoe", "oracle")
    trace = tiny[2]
    ex = Executor(cfg, trace, CpuBackend(torch), warmup=1)
    res = ex.run()
    m = cfg.model
    policy, predictor = build_decisions(cfg, trace, ex.iterations)
    assert res.decisions == replay(trace, ex.iterations, policy, predictor)  # the simulator's decisions
    assert res.copies > 0 and any("de-quantized" in n for n in res.notes)
    for buf in ex.host + ex.slots + ex.work + ex.arena:
        assert buf.numel() == m.expert_bytes < m.expert_params * 2
    # what the executor computes from a quantized working buffer, against the bf16 expert it was quantized from
    dense = [w.to(torch.bfloat16) for w in _dense(m, 1)]
    ex.store.layout.quantize_into(torch, ex.work[0], dense)
    x = torch.randn(5, m.d_model, dtype=torch.bfloat16)
    got = expert_forward(torch, ex.store.weights(ex.work_views[0]), x, False).float()
    want = expert_forward(torch, dense, x, False).float()
    assert float((got - want).norm() / want.norm()) < tol


def test_host_experts_dequantize_their_blocks_to_what_the_device_computes():
    model = _model(4.5, expert_matrices=3, d_ff=256)
    store = ExpertStore(torch, model, "cpu")
    flat = torch.empty(model.expert_bytes, dtype=torch.uint8)
    store.fill(flat)
    x = torch.randn(3, model.d_model, dtype=torch.bfloat16)
    want = expert_forward(torch, store.weights(store.handle(flat)), x, True).float()
    host = HostExperts(torch, model, 3)
    try:
        assert all(a % store.layout.group == 0 for a, _ in host.blocks) and len(host.blocks) > 1
        y = torch.empty_like(x)
        host.run([(store.handle(flat), x, y)]).wait()
    finally:
        host.close()
    assert torch.allclose(y.float(), want, rtol=2e-2, atol=2e-3)


# ------------------------------------------------------------------------------------------------ microbench
def test_the_dequant_tables_cover_both_formats_at_growing_sizes_and_keep_the_profile_loadable(tmp_path):
    model = _model(4.25)
    be = CpuBackend(torch)
    tables = measure_dequant(be, Timer(be, 2), model, quick=True)
    assert set(tables) == {"int8", "int4"}
    for _fmt, points in tables.items():
        assert len(points) == 3 and all(s > 0 for _, s in points)
        assert [b for b, _ in points] == sorted({b for b, _ in points})
    assert model.expert_bytes in [b for b, _ in tables["int4"]]  # the model's own width for its format
    assert _model(8).expert_bytes in [b for b, _ in tables["int8"]]
    cal = {
        "base": "h200",
        "source": "test",
        "tables": {
            "model": model.name,
            "copy": [[1, 1e-6], [2, 2e-6]],
            **{f"dequant_{f}": p for f, p in tables.items()},
        },
    }
    path = write_calibration(tmp_path / "cal.yaml", cal)
    hw = load_hardware(str(path))  # the simulator reads it as it is
    written = yaml.safe_load(path.read_text())["tables"]
    for key, bits in (("dequant_int8", 8), ("dequant_int4", 4.25)):
        assert written[key] == cal["tables"][key]
        assert [list(p) for p in hw.tables.dequant_for(bits)] == [[float(x) for x in p] for p in cal["tables"][key]]


def test_a_table_system_prices_each_expert_with_the_calibrations_dequant_table_for_its_width(tmp_path):
    """The simulator side of the quantized configurations: ``dequant: measured`` takes the calibration's measured
    table for the experts' width (int4 up to 4.5 bits, int8 up to 8.5); without one, the roofline."""
    from sim.config.system import load_system
    from sim.costs.costs import CostModel

    table = {"int8": [[1, 1e-3], [1e12, 2.0]], "int4": [[1, 5e-3], [1e12, 7.0]]}
    cal = {
        "base": "h200",
        "source": "test",
        "tables": {"model": _model(8).name, **{f"dequant_{f}": p for f, p in table.items()}},
    }
    hw = load_hardware(str(write_calibration(tmp_path / "cal.yaml", cal)))
    system = load_system({"base": "ideal", "dequant": "measured"})
    roofline = load_system({"base": "ideal", "dequant": "roofline"})
    for bits, fmt in ((8, "int8"), (4.25, "int4")):
        model = _model(bits)
        (x0, y0), (x1, y1) = table[fmt]
        want = y0 + (model.expert_bytes - x0) * (y1 - y0) / (x1 - x0)
        assert CostModel(model, hw, system).dequant_s == pytest.approx(want, rel=1e-9)
        plain = load_hardware("h200")
        assert CostModel(model, plain, system).dequant_s == CostModel(model, plain, roofline).dequant_s > 0


# ------------------------------------------------------------------------------------------------ the suites
def test_the_suites_carry_an_int8_and_an_int4_configuration_of_their_model():
    for suite in SUITES.values():
        quantized = [p for p in suite.points if len(p) > 6]
        assert [p[6]["expert_bits"] for p in quantized] == list(QUANTIZED_BITS.values())
        assert not {p[0] for p in quantized} & set(suite.quick)
        for _name, raw in suite.configs(only=[p[0] for p in quantized]):
            model = load_model(raw["model"], "model")
            assert model.name == load_model(suite.model, "model").name and expert_format(model) in ("int8", "int4")


def test_validate_cpu_measures_the_quantized_configurations_and_the_simulator_decides_alike(tmp_path):
    from validate.compare import compare
    from validate.measure import measure

    names = [p[0] for p in SUITES["cpu"].points if len(p) > 6]
    out = measure("cpu", tmp_path / "q", "cpu", quick=True, only=names, repeat=1, rounds=1, log=lambda m: None)
    passes = json.loads((out / "calibration-passes.json").read_text())
    assert all(p["tables"]["dequant_int8"] and p["tables"]["dequant_int4"] for p in passes)
    for name in names:
        s = json.loads((out / "runs" / name / "summary.json").read_text())
        assert s["copies"] > 0 and any("de-quantized" in n for n in s["notes"])
    rows, _ = compare(out, log=lambda m: None)
    assert [r["config"] for r in rows] == names and all(r["decisions_identical"] for r in rows)


def test_the_executor_refuses_a_width_it_cannot_hold_naming_expert_bits(tiny):
    with pytest.raises(ConfigError, match=r"^model\.expert_bits: .*6 bits"):
        Executor(_config(tiny, 6), tiny[2], CpuBackend(torch))


def test_a_hybrid_policy_computes_quantized_experts_on_the_host_with_the_simulators_decisions(tiny):
    if "ktransformers" not in POLICIES:
        pytest.skip("ktransformers is not registered yet")
    cfg = _config(tiny, 4.25, "ktransformers", hpc=2, mpc=0)
    ex = Executor(cfg, tiny[2], CpuBackend(torch), host_threads=2)
    res = ex.run()
    policy, predictor = build_decisions(cfg, tiny[2], ex.iterations)
    assert res.decisions == replay(tiny[2], ex.iterations, policy, predictor)
    assert sum(res.cpu_experts) > 0 and all(b > 0 for b, n in zip(res.cpu_busy_s, res.cpu_experts) if n)
