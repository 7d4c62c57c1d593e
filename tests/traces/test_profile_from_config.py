"""A model profile derived from an untrusted config.json (`--hf-config`, `traces record`): every size field, at the
top level or in a nested config, is null or an integer within its bound, checked before anything is derived, listed
or built; a quantization bit width is a number of bits 1..32; whatever the config holds, the result is a profile
within the bounds or one InputError line naming the field."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traces.profile_from_config as pfc
from moebase.errors import InputError
from tests.support.cli import run_traces
from tests.support.messages import checked_message
from traces.record.tiny_models import tiny_config

HYP = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
BASES = {arch: tiny_config(arch).to_dict() for arch in ("mixtral", "qwen2-moe", "deepseek-v3", "switch")}
FIELDS = sorted(pfc.SIZE_LIMITS)

#: Values of every kind a JSON config can hold where a size belongs, the bounds' edges among them.
VALUES = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([4095, 4096, 4097, 32767, 32768, (1 << 20) + 1, (1 << 24) + 1, 1 << 40, 1 << 62]),
    st.integers(0, 1 << 41),
    st.booleans(),
    st.sampled_from(["32", "", "1e9", None]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def in_bounds(value, field) -> bool:
    return value is None or (type(value) is int and 0 <= value <= pfc.SIZE_LIMITS[field])


@pytest.fixture
def watched_builders(monkeypatch):
    """The functions that list or count blocks, wrapped to fail the test when asked for more than MAX_BLOCKS."""
    for name in ("_moe_blocks", "_switch_sparse"):
        real = getattr(pfc, name)

        def guarded(r, *args, _real=real):
            blocks = args[-1]
            assert blocks <= pfc.MAX_BLOCKS, f"asked to list {blocks} blocks"
            return _real(r, *args)

        monkeypatch.setattr(pfc, name, guarded)


def profile_within_bounds(profile) -> None:
    f = profile.fields
    assert f["decoder_blocks"] + f["encoder_blocks"] <= 2 * pfc.MAX_BLOCKS
    assert f["num_experts"] <= pfc.MAX_EXPERTS and 1 <= f["top_k"] <= f["num_experts"]
    assert max(f["d_model"], f["d_ff"], f["head_dim"], f["dense_d_ff"]) <= pfc.MAX_WIDTH
    assert f["vocab_size"] <= pfc.MAX_VOCAB and f["n_heads"] <= pfc.MAX_HEADS
    bits = f.get("expert_bits")
    assert bits is None or 1 <= bits <= pfc.MAX_BITS


@HYP
@given(
    arch=st.sampled_from(sorted(BASES)),
    field=st.sampled_from(FIELDS),
    value=VALUES,
    nested=st.booleans(),
)
def test_any_size_field_gives_a_bounded_profile_or_one_line_naming_it(watched_builders, arch, field, value, nested):
    config = dict(BASES[arch])
    if nested:
        config["text_config"] = {**BASES[arch], field: value}
    else:
        config[field] = value
    try:
        profile = pfc.derive_profile(config, "toy", "config.json")
    except InputError as exc:
        msg = checked_message(exc, 600)
        assert msg.startswith("config.json: "), msg
        if not in_bounds(value, field):
            assert f"'{'text_config.' if nested else ''}{field}'" in msg, msg
        return
    assert in_bounds(value, field), (field, value)
    profile_within_bounds(profile)


@HYP
@given(blocks=st.integers(1, 4096), experts=st.integers(1, 32767), nested=st.booleans())
def test_routed_experts_over_all_blocks_are_bounded(blocks, experts, nested):
    config = {**BASES["mixtral"], "num_hidden_layers": blocks, "num_local_experts": experts}
    config = {**BASES["mixtral"], "text_config": config} if nested else config
    try:
        pfc.check_sizes(config, "config.json")
    except InputError as exc:
        msg = checked_message(exc, 600)
        assert blocks * experts > pfc.MAX_ROUTED_EXPERTS and "routed experts" in msg, msg
        return
    assert blocks * experts <= pfc.MAX_ROUTED_EXPERTS


@HYP
@given(
    bits=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([1e-300, 0, 1, 4, 4.25, 8, 32, 33, -4, True, "4", [4]]),
        st.integers(-100, 100),
    ),
    method=st.sampled_from(["gptq", "awq", "mxfp4", "fp8", "bitsandbytes"]),
)
def test_a_quantization_bit_width_is_a_number_of_bits(bits, method):
    """quantization_config.bits must be a number 1..32 (1e-300 would make 1-byte experts), whatever the method."""
    config = {**BASES["mixtral"], "quantization_config": {"quant_method": method, "bits": bits}}
    sane = type(bits) in (int, float) and not math.isnan(bits) and 1 <= bits <= pfc.MAX_BITS
    try:
        profile = pfc.derive_profile(config, "toy", "config.json")
    except InputError as exc:
        msg = checked_message(exc, 600)
        assert not sane and "'quantization_config.bits'" in msg and "1..32" in msg, msg
        return
    assert sane, bits
    want = {"mxfp4": 4.25, "fp8": 8.0}.get(method, float(bits))
    assert profile.fields["expert_bits"] == want


@pytest.mark.parametrize("key", ["num_hidden_layers", "num_local_experts", "hidden_size", "vocab_size"])
def test_a_huge_size_is_refused_at_once_naming_the_field(key):
    """The defect: 2^40 blocks were listed (a hang) before anything was bounded."""
    with pytest.raises(InputError, match=key):
        pfc.derive_profile({**BASES["mixtral"], key: 1 << 40}, "toy", "config.json")


@pytest.mark.parametrize(
    "fmt, extra",
    [
        ("expert-arrays", []),
        ("kt-parquet", []),
        ("vllm", ["--num-experts", "8"]),
        ("ft-log", ["--batch", "1"]),
        ("mixtral-jsonl", []),
    ],
)
@pytest.mark.parametrize(
    "change, field",
    [
        ({"num_hidden_layers": 1 << 40}, "num_hidden_layers"),
        ({"text_config": {"num_local_experts": "8"}}, "text_config.num_local_experts"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 1e-300}}, "quantization_config.bits"),
    ],
)
def test_every_import_refuses_a_hf_config_out_of_bounds_before_reading_its_input(tmp_path, fmt, extra, change, field):
    """--hf-config is derived before an import reads anything: the missing input is never reached."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**BASES["mixtral"], "torch_dtype": "bfloat16", **change}))
    out = tmp_path / "t.npz"
    code, _, err, _ = run_traces(
        "import", fmt, tmp_path / "missing.input", "--model", "toy-moe", *extra, "--out", out, "--hf-config", config
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"'{field}'" in lines[0] and "missing.input" not in lines[0], err
    assert not out.exists()
