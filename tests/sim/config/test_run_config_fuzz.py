"""Fuzzing the run-config loader: a mutated config either loads (and its resolved form loads back to the same
config) or fails with ONE bounded line naming the field or file (a ConfigError, an InputError: exit status 2 on
the command line), never another exception, a hang or a huge allocation.

Mutations start from one small valid config (a tiny inline model and a bundled-size trace made here): a hostile
value (wrong type, bool for int, huge or negative number, NaN, long or odd string, null, deep or aliased nesting,
a device or FIFO path) at a random path, known or unknown, removed keys, other policies and predictors with their
params, training and profiling traces good and bad (no routed tokens, another model, the evaluated trace); the YAML
text with byte edits, a key given twice, deep nesting, aliases; and ``--set`` overrides. A config that loads builds
its policy and predictor without any error (every wrong value is refused at load, not when the run starts).
Examples are derandomized (the same ones on every run); CONFIG_FUZZ_EXAMPLES=3000 explores more locally.
"""

from __future__ import annotations

import copy
import datetime
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moebase.errors import CONFIG_FIELD_CHARS, CONFIG_PROBLEM_CHARS, ConfigError, InputError
from sim.config.run_config import SCHEMA, apply_override, config_from_dict, load_run_config
from sim.core.workload import build_iterations
from sim.decisions.build import build_decisions
from sim.policies import POLICIES
from sim.predictors import PREDICTORS
from tests.support.messages import checked_message
from tests.support.paths import ROOT
from tests.support.traces import TINY_MODEL, make_trace, random_trace
from traces.io import load_trace, save_trace

MAX_LINE = CONFIG_FIELD_CHARS + 2 + CONFIG_PROBLEM_CHARS  # "FIELD: problem"
EXAMPLES = int(os.environ.get("CONFIG_FUZZ_EXAMPLES", 200))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


def _nested(depth: int) -> list:
    x: list = []
    for _ in range(depth):
        x = [x]
    return x


def _aliased(levels: int) -> list:
    """Ten copies of ten copies of ... one list: small in memory, 10**levels values once expanded."""
    x: list = [1] * 10
    for _ in range(levels):
        x = [x] * 10
    return x


HUGE = [
    10**30,
    -(10**30),
    2**31,
    2**32,
    2**63,
    10**400,
    1e300,
    -1e300,
    5e-324,
    float("nan"),
    float("inf"),
    -float("inf"),
]
ODD_TEXT = [
    "",
    " ",
    "x" * 100_000,
    "\x00",
    "a\nb\rc",
    "\x1b[31mred",
    "é" * 10,
    "/dev/zero",
    "/dev/null",
    "/",
    "~nosuchuser/x.npz",
    "../" * 50 + "etc/passwd",
    "a" * 5000 + ".yaml",
    "traces/data/mixtral_8x7b.npz",
    "configs/switch_xxl.yaml",
    "h200",
    "switch-xxl-128",
    "trace",
    "static",
    "all",
    "none",
    "true",
]
SHAPES = [
    _nested(40),
    _nested(120),
    _aliased(6),
    [[]],
    {},
    {"": None},
    {"base": "h200"},
    [list(range(8))] * 2,
    datetime.date(2020, 1, 1),
    b"\x00\xff",
]  # (deeper ones: test_deep_and_aliased_values_from_code)
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 300),
    st.integers(),
    st.sampled_from(HUGE),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(ODD_TEXT),
    st.sampled_from(SHAPES),
    st.lists(st.integers(-2, 9), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(-2, 9) | st.none() | st.text(max_size=4), max_size=3),
    st.lists(st.lists(st.integers(-1, 9), max_size=8), max_size=3),
)


#: Trace files a mutation may name by these tokens (made by the ``traces`` fixture): a good training trace of the
#: tiny model, one with no routed tokens, one of another model shape, a copy of the evaluated trace.
TRACE_TOKENS = ("@train", "@unrouted", "@wide", "@copy", "@evaluated")


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict:
    """The evaluated trace of ``base`` and the trace files of TRACE_TOKENS."""
    d = tmp_path_factory.mktemp("fuzztraces")
    rng = np.random.default_rng(0)
    out = {"@evaluated": save_trace(random_trace(rng, tokens=60, layers=2, experts=8, k=2, requests=3), d / "tiny.npz")}
    out["@train"] = save_trace(random_trace(rng, tokens=50, layers=2, experts=8, k=2, requests=2), d / "train.npz")
    out["@unrouted"] = save_trace(
        make_trace(np.full((20, 2, 2), -1, dtype=np.int16), [8, 12], num_experts=8), d / "unrouted.npz"
    )
    out["@wide"] = save_trace(random_trace(rng, tokens=30, layers=2, experts=16, k=2, requests=2), d / "wide.npz")
    out["@copy"] = d / "copy.npz"
    out["@copy"].write_bytes(out["@evaluated"].read_bytes())
    return {k: str(v) for k, v in out.items()}


def with_traces(value, traces: dict):
    """``value`` with a TRACE_TOKENS string replaced by its file's path."""
    return traces.get(value, value) if isinstance(value, str) else value


@pytest.fixture(scope="module")
def base(traces) -> dict:
    """A small valid config: the tiny model inline (2 MoE layers of 8 experts) and a trace of it made here."""
    path = traces["@evaluated"]
    cfg = {
        "model": {**TINY_MODEL, "name": "test-model"},
        "hardware": "h200",
        "workload": {
            "trace": str(path),
            "batch_size": 2,
            "batching": "static",
            "max_decode_tokens": 4,
            "prefill": True,
            "requests": None,
        },
        "cache": {
            "hpc_slots": 1,
            "mpc_slots": 2,
            "lpc_buffers": 3,
            "prefetch_reserve": 1,
            "layers": "all",
            "hot_profile": "trace",
        },
        "policy": {"name": "diffmoe", "params": {"threshold": 1.0}},
        "predictor": {"name": "noisy", "params": {"recall": 0.5}},
        "seed": 0,
    }
    config_from_dict(cfg)  # valid as it is
    return cfg


def outcome(fn) -> str | None:
    """None when ``fn()`` succeeds; the message when it raises InputError (checked: one printable line of at most
    MAX_LINE characters). Any other exception fails the test."""
    try:
        fn()
    except InputError as exc:
        return checked_message(exc, MAX_LINE)
    return None


def check_loads(d: dict) -> None:
    """Loading either fails cleanly, or succeeds: then its resolved form loads back to the same config, and its
    policy and predictor are built (for its trace) without any error at all: every wrong value is refused when
    the config loads, none when the run starts."""
    box = {}
    if outcome(lambda: box.setdefault("cfg", config_from_dict(d))) is None:
        cfg = box["cfg"]
        again = config_from_dict(cfg.resolved)
        assert again.resolved == cfg.resolved
        _build(cfg)


def _build(cfg) -> None:
    trace = load_trace(cfg.workload.trace)
    w = cfg.workload
    iterations, _ = build_iterations(trace, w.batch_size, w.batching, w.max_decode_tokens, w.prefill, w.requests)
    build_decisions(cfg, trace, iterations)


# --------------------------------------------------------------------------------------------- paths
def schema_paths(schema=SCHEMA, prefix=()) -> list[tuple[str, ...]]:
    """Every key path the --set schema knows (FREE subtrees as their root)."""
    out = []
    for key, sub in schema.items():
        out.append(prefix + (key,))
        if isinstance(sub, dict):
            out += schema_paths(sub, prefix + (key,))
    return out


PATHS = schema_paths()
PARAM_PATHS = sorted(
    {
        (section, "params", p)
        for section, reg in (("policy", POLICIES), ("predictor", PREDICTORS))
        for n in reg.names()
        for p in reg.get(n).PARAMS
    }
)
UNKNOWN = [
    ("colour",),
    ("workload", "speed"),
    ("cache", "split", "x"),
    ("policy", "params", "bogus"),
    ("hardware", "tables", "foo"),
    ("model", "experts"),
    ("model", "base"),
    ("hardware", "base"),
]


def set_path(d: dict, path: tuple, value) -> None:
    node = d
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {"base": child} if key in ("model", "hardware") and isinstance(child, str) else {}
            node[key] = child
        node = child
    node[path[-1]] = value


def del_path(d: dict, path: tuple) -> None:
    node = d
    for key in path[:-1]:
        node = node.get(key)
        if not isinstance(node, dict):
            return
    node.pop(path[-1], None)


MUTATION = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(PATHS + PARAM_PATHS + UNKNOWN), HOSTILE),
    st.tuples(st.just("del"), st.sampled_from(PATHS + PARAM_PATHS), st.none()),
    st.tuples(st.just("set"), st.just(("policy", "name")), st.sampled_from(POLICIES.names())),
    st.tuples(st.just("set"), st.just(("predictor", "name")), st.sampled_from(PREDICTORS.names())),
    st.tuples(st.just("set"), st.just(("policy",)), st.sampled_from(POLICIES.names())),  # its params reset
    st.tuples(st.just("set"), st.just(("predictor",)), st.sampled_from(PREDICTORS.names())),
    st.tuples(
        st.just("set"),
        st.sampled_from(PARAM_PATHS),
        st.integers(-2, 10**6)
        | st.floats(-1, 3)
        | st.sampled_from(["mix", "own", "expert0", "legacy", "float32", "in_cache", None, True]),
    ),
    st.tuples(
        st.just("set"),
        st.sampled_from(
            [p for p in PARAM_PATHS if p[-1] == "train"] + [("cache", "hot_profile"), ("workload", "trace")]
        ),
        st.sampled_from(TRACE_TOKENS),
    ),
)


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_mappings_load_or_fail_on_one_line(base, traces, mutations):
    d = copy.deepcopy(base)
    for kind, path, value in mutations:
        if kind == "set":
            set_path(d, path, with_traces(value, traces))
        else:
            del_path(d, path)
    check_loads(d)


@pytest.mark.parametrize(
    "section,name",
    [
        (s, n)
        for s, reg in (("policy", POLICIES), ("predictor", PREDICTORS))
        for n in reg.names()
        if any(r.training for r in reg.get(n).PARAM_RULES.values())
    ],
)
@pytest.mark.parametrize(
    "token,problem",
    [
        ("@unrouted", "has no routed tokens"),
        ("@wide", "is of model"),
        ("@copy", "is the evaluated trace"),
        ("@evaluated", "is the evaluated"),
    ],
)
def test_bad_training_traces_are_refused_when_the_config_loads(base, traces, section, name, token, problem):
    d = copy.deepcopy(base)
    d[section] = {"name": name, "params": {"train": traces[token]}}
    with pytest.raises(ConfigError) as exc:
        config_from_dict(d)
    msg = checked_message(exc.value, MAX_LINE)
    assert msg.startswith(f"{section}.params.train: ") and problem in msg
    d[section]["params"]["train"] = traces["@train"]
    check_loads(d)


@FUZZ
@given(
    section=st.sampled_from(["model", "hardware", "workload", "cache", "policy", "predictor", "seed"]), value=HOSTILE
)
def test_a_hostile_section_fails_on_one_line(base, section, value):
    d = copy.deepcopy(base)
    d[section] = value
    check_loads(d)


# --------------------------------------------------------------------------------------------- YAML text
def _text(base: dict) -> str:
    return yaml.safe_dump(base, sort_keys=False)


@FUZZ
@given(data=st.data())
def test_byte_edits_of_the_yaml_text(base, tmp_path, data):
    raw = bytearray(_text(base).encode())
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(raw) - 1))
        how = data.draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        byte = data.draw(st.integers(0, 255))
        if how == "flip":
            raw[at] = byte
        elif how == "insert":
            raw[at:at] = bytes([byte]) * data.draw(st.integers(1, 3))
        elif how == "delete":
            del raw[at : at + data.draw(st.integers(1, 8))]
        else:
            del raw[at:]
        if not raw:
            raw = bytearray(b"{}")
    path = tmp_path / "c.yaml"
    path.write_bytes(bytes(raw))
    outcome(lambda: load_run_config(path))


SNIPPETS = [
    "seed: 1\nseed: 2\n",  # a key twice
    "workload: {batch_size: 1, batch_size: 2}\n",
    "x: " + "[" * 5000 + "]" * 5000 + "\n",  # deep flow nesting
    "".join("  " * i + "k:\n" for i in range(200)),  # deep block nesting
    "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n",  # an alias bomb
    "seed: " + "9" * 5000 + "\n",  # over Python's int-string limit
    "seed: 2020-13-01\n",  # no such date
    "seed: !!python/object:os.system {}\n",  # not for a safe loader
    "seed: !!binary 'not base64!'\n",
    "seed: !!float nope\n",
    "? [a, b]\n: 1\n",  # an unhashable key
    "base: &x {seed: 1}\nmerged: {<<: *x, seed: 2}\n",  # a merge key may be overridden
    "\ufeffseed: 1\n",
    "seed: \x07\n",
    "%YAML 1.1\n---\nseed: 1\n---\nseed: 2\n",  # two documents
    "model: *undefined\n",
]


@FUZZ
@given(snippet=st.sampled_from(SNIPPETS), where=st.sampled_from(["end", "start", "policy.params", "replace"]))
def test_hostile_yaml_text(base, tmp_path, snippet, where):
    text = _text(base)
    if where == "end":
        text += "\n" + snippet
    elif where == "start":
        text = snippet + text
    elif where == "replace":
        text = snippet
    else:
        text = text.replace(
            "  params:\n    threshold: 1.0\n",
            "  params:\n" + "".join("    " + line + "\n" for line in snippet.splitlines()),
            1,
        )
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    msg = outcome(lambda: load_run_config(path))
    if "seed: 1\nseed: 2" in snippet and where != "replace":
        assert msg is not None and "duplicate key 'seed'" in msg


# --------------------------------------------------------------------------------------------- --set
SET_VALUES = st.one_of(
    st.text(max_size=16),
    st.sampled_from(ODD_TEXT[:12]),
    st.sampled_from(
        [
            "null",
            "~",
            "[1",
            "{a: 1, a: 2}",
            "[" * 3000,
            "9" * 5000,
            "1.0e+400",
            ".nan",
            "-.inf",
            "!!binary zz",
            "*x",
            "&a [*a]",
            "{base: h200}",
            "[[0, 1], [2, 3]]",
            "2020-13-01",
            "0x10",
            "0o17",
            "1_000",
            "yes",
            "'quoted'",
            '"esc\\x00"',
        ]
    ),
)
SET_KEYS = st.one_of(
    st.sampled_from([".".join(p) for p in PATHS + PARAM_PATHS + UNKNOWN]),
    st.text(alphabet="ab.=_ ", max_size=12),
    st.sampled_from(["", "=", "...", "a" * 300, ".".join(["policy", "params"] + ["x"] * 40)]),
)


@FUZZ
@given(sets=st.lists(st.tuples(SET_KEYS, SET_VALUES), min_size=1, max_size=3))
def test_set_overrides_load_or_fail_on_one_line(base, tmp_path, sets):
    path = tmp_path / "c.yaml"
    path.write_text(_text(base))
    outcome(lambda: load_run_config(path, [f"{k}={v}" for k, v in sets]))


# --------------------------------------------------------------------------------------------- named classes
@pytest.mark.parametrize(
    "sets,field",
    [
        (["workload.max_decode_tokens=" + str(10**30)], "workload.max_decode_tokens"),
        (["workload.requests=" + str(10**30)], "workload.requests"),
        (["hardware.gpu_memory_gb=1.0e+300"], "hardware.gpu_memory_gb"),
        (["hardware.pcie_bw_gb_s=" + str(10**400)], "hardware.pcie_bw_gb_s"),
        (["policy=moe-infinity", "policy.params.capacity=" + str(10**30)], "policy.params.capacity"),
        (["policy=lru", "policy.params.pin_hot=null"], "policy.params.pin_hot"),
        (["policy.params.threshold=null"], "policy.params.threshold"),
        (["policy.params.bogus=1"], "policy.params.bogus"),
        (["policy.params.max_val=1.0e+300"], "policy.params.max_val"),
        (["predictor.params.recall=" + str(10**400)], "predictor.params.recall"),
        (["predictor=transition", "predictor.params.train=null"], "predictor.params.train"),
        (["predictor=transition", "predictor.params.train=/dev/zero"], "predictor.params.train"),
        (["policy.params.x=" + "[" * 5000 + "]" * 5000], "policy.params.x"),
        (["seed=" + "9" * 5000], "seed"),
        (["seed=" + str(2**40)], "seed"),
        (["model.name=" + "x" * 5_000_000], "model.name"),
        (["cache={hpc_slots: 1, hpc_slots: 2}"], "cache"),
        (["workload.trace=/dev/zero"], "workload.trace"),
        (["model=/dev/zero"], "model"),
        (["cache.hot_profile=/dev/null"], "cache.hot_profile"),
        (["cache.hot_profile=[[99]]"], "cache.hot_profile"),
    ],
)
def test_known_failure_classes_name_their_field(base, tmp_path, sets, field):
    path = tmp_path / "c.yaml"
    path.write_text(_text(base))
    with pytest.raises(ConfigError) as exc:
        load_run_config(path, sets)
    msg = checked_message(exc.value, MAX_LINE)
    assert msg.startswith(field + ":"), msg[:300]


def test_params_are_checked_and_filled_when_the_config_loads(base):
    cfg = config_from_dict(base)
    assert cfg.policy.params == {**POLICIES.get("diffmoe").PARAMS, "threshold": 1.0}
    assert cfg.predictor.params == {"recall": 0.5, "precision": 0.9}
    assert cfg.resolved["predictor"]["params"] == cfg.predictor.params
    d = copy.deepcopy(base)
    apply_override(d, "policy.params.threshold=2")
    assert config_from_dict(d).policy.params["threshold"] == 2.0


@pytest.mark.parametrize("value", [_nested(5000), _aliased(8)], ids=["deep", "aliased"])
def test_deep_and_aliased_values_from_code(base, value):
    for section in ("policy", "hardware"):
        d = copy.deepcopy(base)
        d[section] = {"name": "lru", "params": {"x": value}} if section == "policy" else {"base": "h200", "x": value}
        with pytest.raises(ConfigError) as exc:
            config_from_dict(d)
        assert checked_message(exc.value, MAX_LINE).startswith(f"{section}: ")


def test_an_echoed_value_is_cut(base):
    d = copy.deepcopy(base)
    d["workload"]["batching"] = "y" * 5_000_000
    with pytest.raises(ConfigError) as exc:
        config_from_dict(d)
    assert str(exc.value).startswith("workload.batching: ") and len(str(exc.value)) < 200


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_files_that_are_not_regular_are_refused(base, tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        with pytest.raises(ConfigError) as exc:
            load_run_config(path)
        assert "not a regular file" in str(exc.value)
    d = copy.deepcopy(base)
    d["workload"]["trace"] = str(fifo)
    with pytest.raises(ConfigError, match=r"^workload\.trace: .*not a regular file"):
        config_from_dict(d)


# --------------------------------------------------------------------------------------------- the command line
def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sim", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_python_m_sim_run_exits_2_with_one_line(base, tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text(_text(base) + "seed: 3\n")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    good = tmp_path / "good.yaml"
    good.write_text(_text(base))
    out = tmp_path / "out"
    for argv, field in (
        ([str(dup)], str(dup)),
        ([str(fifo)], str(fifo)),
        ([str(good), "--set", "policy.params.bogus=1"], "policy.params.bogus"),
    ):
        done = _cli("run", *argv, "--out", str(out))
        assert done.returncode == 2, done.stderr[-2000:]
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), done.stderr[-2000:]
        assert len(lines[0]) <= len("error: ") + MAX_LINE
        assert not out.exists()  # nothing ran
