"""Wrong values refused when a run config loads, by class:

- every param of every registered policy and predictor declares what it accepts (a range, words, a file, a type),
  every param a part reads is declared, and any value drawn for any param either is refused when the config loads
  (a ConfigError naming ``policy.params.X`` / ``predictor.params.X``) or runs a tiny workload to the end;
- every training trace (any param whose rule is a training trace) is refused at load when it has nothing to learn,
  is of another model, or is the evaluated trace;
- the KV cache of the workload's longest contexts (prompt rows or ``request_info.prompt_len``) beside the dense
  weights must fit the GPU, for every policy, else a one-line refusal with the numbers;
- requests with nothing to run cost no work per request when the workload is built;
- an "unknown X" error stays one line of at most 400 characters whatever the user wrote.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError, InputError
from moebase.model import load_model
from moebase.registry import Registry
from sim.config.hardware import load_hardware
from sim.config.params import Parametrised, Rule, between, one_of
from sim.config.run_config import config_from_dict, load_run_config, read_trace_summary
from sim.core.workload import build_iterations, prompt_context
from sim.policies import POLICIES, Policy
from sim.predictors import PREDICTORS, Predictor
from sim.run import simulate
from tests.support.messages import checked_message
from tests.support.paths import ROOT
from tests.support.traces import TINY_MODEL, make_trace, random_trace
from traces.format import MAX_CONTEXT, MAX_REQUESTS
from traces.io import load_trace, save_trace

MAX_MESSAGE = 400
REGISTRIES = (("policy", POLICIES), ("predictor", PREDICTORS))


def fuzz(examples: int) -> settings:
    """Derandomized hypothesis settings (the same examples on every run) with ``examples`` examples."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


# --------------------------------------------------------------------------------------------- the tiny run
def _trace_of(experts, lengths, prefill, name="test-model", num_experts=8, roles=None, request_info=None):
    trace = make_trace(experts, lengths, prefill, num_experts=num_experts, roles=roles)
    model = dataclasses.replace(trace.meta.model, name=name)
    meta = dataclasses.replace(trace.meta, model=model, request_info=request_info)
    return type(trace)(trace.experts, trace.request_offsets, trace.prefill_lengths, meta)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny model's evaluated trace, a training trace of it, and training traces that must be refused."""
    d = tmp_path_factory.mktemp("safety")
    rng = np.random.default_rng(0)
    evaluated = random_trace(rng, tokens=60, layers=2, experts=8, k=2, requests=3)
    train = random_trace(np.random.default_rng(1), tokens=80, layers=2, experts=8, k=2, requests=4)
    out = {"evaluated": save_trace(evaluated, d / "evaluated.npz"), "train": save_trace(train, d / "train.npz")}
    out["copy"] = d / "copy.npz"
    shutil.copyfile(out["evaluated"], out["copy"])
    none = np.full((30, 2, 2), -1, dtype=np.int16)
    out["all -1"] = save_trace(_trace_of(none, [10, 20], [5, 5]), d / "unrouted.npz")
    out["no tokens"] = save_trace(_trace_of(np.zeros((0, 2, 2), np.int16), [0], [0]), d / "empty.npz")
    wide = random_trace(rng, tokens=40, layers=2, experts=16, k=2, requests=2)
    out["16 experts"] = save_trace(wide, d / "wide.npz")
    top1 = random_trace(rng, tokens=40, layers=2, experts=8, k=1, requests=2)
    out["top-1"] = save_trace(top1, d / "top1.npz")
    deep = random_trace(rng, tokens=40, layers=3, experts=8, k=2, requests=2)
    out["3 layers"] = save_trace(deep, d / "deep.npz")
    out["other name"] = save_trace(
        _trace_of(train.experts, train.request_lengths, train.prefill_lengths, name="another-model"), d / "named.npz"
    )
    return out


def base_config(files, policy="lru", predictor="none", **params) -> dict:
    return {
        "model": {**TINY_MODEL, "name": "test-model"},
        "hardware": "h200",
        "workload": {"trace": str(files["evaluated"]), "batch_size": 2, "max_decode_tokens": 4},
        "cache": {"hpc_slots": 1, "mpc_slots": 2, "lpc_buffers": 3},
        "policy": {"name": policy, "params": params.get("policy_params", {})},
        "predictor": {"name": predictor, "params": params.get("predictor_params", {})},
        "seed": 0,
    }


def required_params(cls, files) -> dict:
    """What a part needs to run at all (a required training trace)."""
    return {k: str(files["train"]) for k, rule in cls.PARAM_RULES.items() if rule.required and rule.training}


# --------------------------------------------------------------------------------------------- params declared
def params_read(cls) -> set[str]:
    """The param names a part's classes read by a literal key: ``self.params["x"]``, ``p["x"]`` where ``p`` was
    assigned ``self.params``, ``params["x"]`` (the argument of the class methods), and ``.get("x")`` of those."""
    keys: set[str] = set()
    for klass in cls.__mro__:
        if not issubclass(klass, Parametrised) or klass in (Parametrised, Policy, Predictor):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        aliases = {"params"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "params":
                aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}

        def is_params(n, aliases=aliases) -> bool:
            return (isinstance(n, ast.Attribute) and n.attr == "params") or (
                isinstance(n, ast.Name) and n.id in aliases
            )

        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and is_params(node.value) and isinstance(node.slice, ast.Constant):
                keys.add(node.slice.value)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and is_params(node.func.value)
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                keys.add(node.args[0].value)
    return {k for k in keys if isinstance(k, str)}


PARTS = [(section, name) for section, reg in REGISTRIES for name in reg.names()]


@pytest.mark.parametrize("section,name", PARTS)
def test_every_param_a_part_reads_is_declared_with_a_rule(section, name):
    cls = dict(REGISTRIES)[section].get(name)
    assert cls.declaration_problems() == []
    assert params_read(cls) <= set(cls.PARAMS), sorted(params_read(cls) - set(cls.PARAMS))


def test_the_scan_sees_the_params_a_part_reads():
    assert {"half_life", "horizon", "warm_start", "max_prefetch"} <= params_read(POLICIES.get("hybrid-cache"))
    assert {"pin_hot", "train", "train_batch"} <= params_read(POLICIES.get("learned-rf"))

    class Sloppy(Policy):
        PARAMS = {"a": 1}
        PARAM_RULES = {"a": between(0, 3)}

        def configure(self):
            p = self.params
            self.x = p["a"] + self.params.get("b", 0) + p["c"]

    assert params_read(Sloppy) - set(Sloppy.PARAMS) == {"b", "c"}


@pytest.mark.parametrize(
    "params,rules,problem",
    [
        ({"n": 1}, {}, "without a declared range"),
        ({"n": 1}, {"n": between(0, None, kind=int)}, "without a declared range"),
        ({"x": 0.5}, {"x": between(None, 1.0)}, "without a declared range"),
        ({"s": "a"}, {}, "without declared choices"),
        ({"t": None}, {}, "has no type"),
        ({"l": [1]}, {}, "params are numbers, strings or true/false"),
        ({"n": 5}, {"n": between(0, 3)}, "its own rule refuses"),
        ({"s": "c"}, {"s": one_of("a", "b")}, "its own rule refuses"),
        ({}, {"ghost": between(0, 1)}, "not in PARAMS"),
    ],
)
def test_a_part_with_an_undeclared_param_cannot_register(params, rules, problem):
    registry = Registry("policy")
    cls = type("Undeclared", (Policy,), {"PARAMS": params, "PARAM_RULES": rules})
    with pytest.raises(TypeError, match=problem):
        registry.register("undeclared")(cls)
    assert "undeclared" not in registry
    ok = type("Declared", (Policy,), {"PARAMS": {"flag": True, "n": 1}, "PARAM_RULES": {"n": between(0, 3)}})
    registry.register("declared")(ok)


def _values_for(rule: Rule | None, files) -> st.SearchStrategy:
    """Values a config could give a param: in and out of range, of every type, odd strings, files good and bad."""
    paths = [str(files[k]) for k in files] + ["/dev/null", "/nowhere/x.npz", str(ROOT / "configs")]
    words = list(rule.choices) if rule is not None and rule.choices else []
    return st.one_of(
        st.integers(-3, 40),
        st.sampled_from([-1, 0, 1, 2**15, 2**15 + 1, 2**31 - 1, 2**31, 10**30]),
        st.floats(-2.0, 40.0),
        st.sampled_from(
            [0.0, -0.0, 1e-300, 5e-324, 0.5, 1.0, 1e6, 1e6 + 1, 1e300, float("nan"), float("inf"), -float("inf")]
        ),
        st.booleans(),
        st.none(),
        st.text(max_size=6),
        st.sampled_from(paths),
        st.sampled_from(words or ["x"]),
        st.lists(st.integers(0, 3), max_size=2),
    )


PARAMS = [(section, name, key) for section, name in PARTS for key in dict(REGISTRIES)[section].get(name).PARAMS]


@fuzz(int(os.environ.get("PARAM_FUZZ_EXAMPLES", 250)))
@given(data=st.data())
def test_any_param_value_is_refused_at_load_or_runs(files, data):
    section, name, _ = data.draw(st.sampled_from(PARAMS))
    cls = dict(REGISTRIES)[section].get(name)
    params = required_params(cls, files)
    for key in data.draw(st.lists(st.sampled_from(sorted(cls.PARAMS)), min_size=1, max_size=2, unique=True)):
        params[key] = data.draw(_values_for(cls.PARAM_RULES.get(key), files), label=key)
    kw = {f"{section}_params": params}
    d = base_config(files, **({"policy": name} if section == "policy" else {"predictor": name}), **kw)
    try:
        cfg = config_from_dict(d)
    except ConfigError as exc:
        assert checked_message(exc, MAX_MESSAGE).startswith(f"{section}.params"), str(exc)
        return
    simulate(cfg)  # whatever the load let through runs to the end: no ConfigError, no other exception


def edge_values(default, rule: Rule | None) -> list:
    """The values at and beyond the edges of what a param accepts, and of every other type."""
    rule = rule or Rule()
    out = [None, True, False, -1, 0, 1, 0.5, float("nan"), float("inf"), -float("inf"), 10**30, "", "x" * 5000, [1]]
    for end in (rule.minimum, rule.maximum):
        if end is None:
            continue
        step = 1 if isinstance(default, int) and not isinstance(default, bool) else 1e-9
        out += [end, end - step, end + step, end * 2]
        if isinstance(end, float):
            out += [end + 5e-324, end + 1e-300, float(np.nextafter(end, np.inf))]
    out += list(rule.choices or [])
    return out


@pytest.mark.parametrize("section,name,key", PARAMS, ids=lambda x: str(x))
def test_every_param_at_its_edges_is_refused_at_load_or_runs(files, section, name, key):
    cls = dict(REGISTRIES)[section].get(name)
    values = edge_values(cls.PARAMS[key], cls.PARAM_RULES.get(key))
    if cls.PARAM_RULES.get(key) is not None and cls.PARAM_RULES[key].file:
        values += [str(f) for f in files.values()]
    for value in values:
        params = {**required_params(cls, files), key: value}
        d = base_config(
            files, **({"policy": name} if section == "policy" else {"predictor": name}), **{f"{section}_params": params}
        )
        try:
            cfg = config_from_dict(d)
        except ConfigError as exc:
            assert checked_message(exc, MAX_MESSAGE).startswith(f"{section}.params"), str(exc)
            continue
        simulate(cfg)


@pytest.mark.parametrize(
    "section,name,key,value",
    [
        ("policy", "hybrid-cache", "max_prefetch", -1),
        ("policy", "hybrid-cache", "half_life", 0),
        ("policy", "hybrid-cache", "half_life", -2.5),
        ("policy", "hybrid-cache", "horizon", -1),
        ("policy", "lookahead", "horizon", -1),
        ("predictor", "transition", "top", 9),  # more than the tiny model's 8 experts
        ("predictor", "moe-infinity", "budget", 0),
    ],
)
def test_out_of_range_params_name_their_field_at_load(files, section, name, key, value):
    cls = dict(REGISTRIES)[section].get(name)
    params = {**required_params(cls, files), key: value}
    d = base_config(
        files, **({"policy": name} if section == "policy" else {"predictor": name}), **{f"{section}_params": params}
    )
    with pytest.raises(ConfigError) as exc:
        config_from_dict(d)
    assert checked_message(exc.value, MAX_MESSAGE).startswith(f"{section}.params.{key}: ")


# --------------------------------------------------------------------------------------------- training traces
TRAINED = [
    (section, name, key)
    for section, name in PARTS
    for key, rule in dict(REGISTRIES)[section].get(name).PARAM_RULES.items()
    if rule.training
]


def test_every_trace_param_is_checked_as_a_training_trace():
    assert len(TRAINED) >= 5  # next-use-odds, learned-rf, cross-layer, transition, moe-infinity
    for section, name in PARTS:
        for key, rule in dict(REGISTRIES)[section].get(name).PARAM_RULES.items():
            assert rule.file != "trace file" or rule.training, (section, name, key)


BAD_TRAINING = [
    ("all -1", "has no routed tokens"),
    ("no tokens", "has no routed tokens"),
    ("16 experts", "is of model"),
    ("top-1", "is of model"),
    ("3 layers", "is of model"),
    ("other name", "is of model"),
    ("evaluated", "is the evaluated trace"),
    ("copy", "is the evaluated trace"),
]


@pytest.mark.parametrize("section,name,key", TRAINED)
def test_training_traces_with_nothing_to_learn_or_of_another_model_are_refused_at_load(files, section, name, key):
    def config(path):
        params = {key: str(path)}
        return base_config(
            files, **({"policy": name} if section == "policy" else {"predictor": name}), **{f"{section}_params": params}
        )

    for bad, problem in BAD_TRAINING:
        with pytest.raises(ConfigError) as exc:
            config_from_dict(config(files[bad]))
        msg = checked_message(exc.value, MAX_MESSAGE)
        assert msg.startswith(f"{section}.params.{key}: ") and problem in msg, (bad, msg)
    simulate(config_from_dict(config(files["train"])))  # a good one loads and runs


def test_a_training_trace_of_another_model_says_both(files):
    d = base_config(files, "next-use-odds", policy_params={"train": str(files["16 experts"])})
    with pytest.raises(ConfigError) as exc:
        config_from_dict(d)
    msg = checked_message(exc.value, MAX_MESSAGE)
    assert "16 experts" in msg and "the run's is 'test-model' (8 experts" in msg


def test_a_profiling_trace_with_nothing_to_rank_is_refused_at_load(files):
    for bad, problem in (("all -1", "no routed tokens"), ("16 experts", "16 experts")):
        d = base_config(files)
        d["cache"]["hot_profile"] = str(files[bad])
        with pytest.raises(ConfigError) as exc:
            config_from_dict(d)
        assert checked_message(exc.value, MAX_MESSAGE).startswith("cache.hot_profile: ") and problem in str(exc.value)


# --------------------------------------------------------------------------------------------- KV cache
#: A model whose tokens hold a lot of KV cache (512 KiB each), so that short traces can overflow the GPU.
BIG_KV = {**TINY_MODEL, "name": "test-model", "n_heads": 64, "n_kv_heads": 64, "head_dim": 1024, "dtype_bytes": 2}


def _kv_trace(tmp_path, prompt_rows, decode, claimed):
    """Two requests: one with ``prompt_rows`` routed prompt tokens, one decode-only claiming ``claimed`` prompt
    tokens in request_info.prompt_len; each with ``decode`` generated tokens."""
    lengths = [prompt_rows + decode, decode]
    rng = np.random.default_rng(0)
    experts = np.argsort(rng.random((sum(lengths), 2, 8)), axis=2)[:, :, :2].astype(np.int16)
    info = {"prompt_len": [None, claimed]}
    return save_trace(_trace_of(experts, lengths, [prompt_rows, 0], request_info=info), tmp_path / "kv.npz")


@fuzz(40)
@given(
    prompt_rows=st.integers(1, 40),
    decode=st.integers(1, 6),
    claimed=st.integers(0, MAX_CONTEXT),
    batch=st.integers(1, 512),
    cap=st.none() | st.integers(0, 3),
    policy=st.sampled_from(["lru", "gpu-only"]),
)
def test_the_kv_cache_of_the_longest_contexts_must_fit(tmp_path, prompt_rows, decode, claimed, batch, cap, policy):
    path = _kv_trace(tmp_path, prompt_rows, decode, claimed)
    d = {
        "model": BIG_KV,
        "hardware": "h200",
        "workload": {"trace": str(path), "batch_size": batch, "max_decode_tokens": cap},
        "cache": {"hpc_slots": 1, "mpc_slots": 2, "lpc_buffers": 3},
        "policy": policy,
    }
    model, hw = load_model(BIG_KV), load_hardware("h200")
    kept = decode if cap is None else min(decode, cap)
    tokens = max(prompt_rows, claimed) + kept
    kv = batch * tokens * model.kv_bytes_per_token
    alone = kv + model.dense_bytes + hw.reserved_bytes
    every = model.num_experts * model.moe_layers * model.expert_bytes  # gpu-only keeps them all
    tiers = every if policy == "gpu-only" else (2 * (1 + 2) + 3) * model.expert_bytes
    try:
        config_from_dict(d)
    except ConfigError as exc:
        msg = checked_message(exc, MAX_MESSAGE)
        field = "policy.name: " if policy == "gpu-only" and alone <= hw.gpu_memory_bytes else "cache: "
        assert msg.startswith(field) and alone + tiers > hw.gpu_memory_bytes, msg
        if alone > hw.gpu_memory_bytes:
            assert "KV cache alone does not fit" in msg and f"batch {batch} x {tokens} tokens" in msg
            assert f"{kv / 1e9:.1f} GB" in msg and msg.endswith("or the trace's prompt lengths)")
        return
    assert alone + tiers <= hw.gpu_memory_bytes


def test_a_claimed_prompt_that_cannot_fit_exits_2_on_one_line(tmp_path):
    path = _kv_trace(tmp_path, 4, 2, MAX_CONTEXT)  # 2 M tokens x 512 KiB: 1.1 TB on a 141 GB GPU
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": BIG_KV,
                "hardware": "h200",
                "workload": {"trace": str(path)},
                "cache": {"hpc_slots": 1, "mpc_slots": 2, "lpc_buffers": 3},
                "policy": "lru",
            }
        )
    )
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "sim", "run", str(cfg), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cache: the KV cache alone does not fit"), done.stderr
    assert len(lines[0]) <= len("error: ") + MAX_MESSAGE and f"x {MAX_CONTEXT + 2} tokens" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    "claimed,batch,fits", [(1000, 1, True), (200_000, 1, True), (200_000, 2, False), (MAX_CONTEXT, 1, False)]
)
def test_claimed_prompts_count_in_the_kv_cache(tmp_path, claimed, batch, fits):
    """200,000 claimed tokens x 512 KiB is 105 GB: one request fits on a 141 GB GPU, two do not."""
    d = {
        "model": BIG_KV,
        "hardware": "h200",
        "workload": {"trace": str(_kv_trace(tmp_path, 4, 2, claimed)), "batch_size": batch},
        "cache": {"hpc_slots": 1, "mpc_slots": 2, "lpc_buffers": 3},
        "policy": "lru",
    }
    for policy in ("lru", "gpu-only"):
        d["policy"] = policy
        if fits:
            config_from_dict(d)
        else:
            with pytest.raises(ConfigError, match=r"^cache: the KV cache alone does not fit"):
                config_from_dict(d)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_bundled_config_fits_with_its_policy_and_its_ceiling_exactly_when_every_expert_fits(path):
    """Every bundled config loads with its own policy. Its gpu-only ceiling (which ``sim compare --policies all``
    runs) loads exactly when the dense weights, every expert, the KV cache and the reserved memory fit the GPU;
    otherwise it is refused naming policy.name (and compare shows it as "does not fit")."""
    from sim.config.memory import DoesNotFit
    from sim.config.run_config import dense_bytes_of

    own = load_run_config(path)
    m, hw = own.model, own.hardware
    tokens = read_trace_summary(own.workload.trace).max_request_tokens(own.workload.max_decode_tokens)
    need = (
        dense_bytes_of(m, own.system)
        + m.num_experts * m.moe_layers * m.expert_bytes
        + own.workload.batch_size * tokens * m.kv_bytes_per_token
        + hw.reserved_bytes
    )
    if need <= hw.gpu_memory_bytes:
        load_run_config(path, ["policy=gpu-only"])
        return
    with pytest.raises(DoesNotFit, match=r"^policy\.name: gpu-only keeps every expert on the GPU") as exc:
        load_run_config(path, ["policy=gpu-only"])
    assert exc.value.need_bytes == need


def test_the_workload_attends_over_the_prompt_the_memory_check_counts(tmp_path):
    path = _kv_trace(tmp_path, 4, 2, 1000)
    trace = load_trace(path)
    assert prompt_context(trace).tolist() == [4, 1000]


# --------------------------------------------------------------------------------------------- workload cost
def plain_iterations(trace, batch_size, batching, max_decode_tokens, prefill, requests):
    """The workload's iterations by the plain rule, request by request (what build_iterations must equal):
    (kind, batch, rows, requests, context, new batch) per iteration."""
    start = trace.request_offsets[:-1]
    prompt = trace.prefill_lengths
    decode = trace.request_lengths - prompt
    if max_decode_tokens is not None:
        decode = np.minimum(decode, max_decode_tokens)
    n = trace.num_requests
    served = requests if requests is not None else n
    if batching == "static":
        served = -(-max(served, 1) // batch_size) * batch_size
    elif requests is None:
        served = max(served, batch_size)
    order = [i % n for i in range(served)]
    attended = prompt_context(trace)
    its = []

    def prefill_it(reqs, batch, size, new):
        rows = [x for r in reqs for x in range(start[r], start[r] + prompt[r])]
        if not prefill or not rows:
            return False
        its.append(
            ("prefill", batch, rows, size, float(np.mean([(prompt[r] + 1) / 2 for r in reqs if prompt[r]])), new)
        )
        return True

    def decode_it(reqs, steps, batch, new):
        its.append(
            (
                "decode",
                batch,
                [dstart + s for dstart, s in ((start[r] + prompt[r], s) for r, s in zip(reqs, steps))],
                len(reqs),
                float(np.mean([attended[r] + s + 1 for r, s in zip(reqs, steps)])),
                new,
            )
        )

    if batching == "static":
        for b in range(served // batch_size):
            reqs = order[b * batch_size : (b + 1) * batch_size]
            new = not prefill_it(reqs, b, len(reqs), True)
            for s in range(max((decode[r] for r in reqs), default=0)):
                live = [r for r in reqs if decode[r] > s]
                decode_it(live, [s] * len(live), b, new)
                new = False
    else:
        waiting, running, first = list(order), [], True
        while waiting or running:
            joining = []
            while waiting and len(running) + len(joining) < batch_size:
                joining.append(waiting.pop(0))
            if joining:
                if prefill_it(joining, 0, len(running) + len(joining), first):
                    first = False
                running += [[r, 0] for r in joining if decode[r] > 0]
            if not running:
                continue
            decode_it([r for r, _ in running], [s for _, s in running], 0, first)
            first = False
            for item in running:
                item[1] += 1
            running = [item for item in running if item[1] < decode[item[0]]]
    return its


@fuzz(150)
@given(
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    data=st.data(),
    batch=st.integers(1, 5),
    batching=st.sampled_from(["static", "continuous"]),
    cap=st.none() | st.integers(0, 4),
    prefill=st.booleans(),
    requests=st.none() | st.integers(1, 30),
)
def test_the_workload_equals_the_plain_rule_with_empty_requests(lengths, data, batch, batching, cap, prefill, requests):
    prefills = [data.draw(st.integers(0, n)) for n in lengths]
    experts = np.zeros((sum(lengths), 2, 1), dtype=np.int16)
    trace = make_trace(experts, lengths, prefills, num_experts=4)
    its, info = build_iterations(trace, batch, batching, cap, prefill, requests)
    got = [(it.kind, it.batch, it.rows.tolist(), it.requests, it.context, it.new_batch) for it in its]
    assert got == plain_iterations(trace, batch, batching, cap, prefill, requests)
    assert [it.index for it in its] == list(range(len(its))) and info.iterations == len(its)


@pytest.mark.parametrize("batching,batch", [("static", 1), ("static", 7), ("continuous", 1), ("continuous", 4)])
def test_empty_requests_cost_no_work_each(batching, batch):
    """A trace of the most requests a trace may hold, all but two empty: building its workload takes calls in
    proportion to its tokens, not its requests."""
    lengths = np.zeros(MAX_REQUESTS, dtype=np.int64)
    prefill = np.zeros(MAX_REQUESTS, dtype=np.int64)
    lengths[[-2, -1]], prefill[[-2, -1]] = 10, 4  # (the first ones are served again to fill a static batch)
    rng = np.random.default_rng(0)
    experts = np.argsort(rng.random((20, 2, 8)), axis=2)[:, :, :2].astype(np.int16)
    trace = make_trace(experts, lengths, prefill, num_experts=8)
    calls = [0]

    def count(frame, event, arg):
        calls[0] += 1

    t0 = time.perf_counter()
    sys.setprofile(count)
    try:
        its, info = build_iterations(trace, batch, batching)
    finally:
        sys.setprofile(None)
    assert time.perf_counter() - t0 < 20
    assert calls[0] < 20_000, calls[0]
    assert info.decode_tokens == 12 and info.prefill_tokens == 8 and info.requests_served >= MAX_REQUESTS


# --------------------------------------------------------------------------------------------- bounded messages
LONG = "q" * 4990 + "hardware"


def _set(d: dict, path: tuple, value) -> dict:
    d = copy.deepcopy(d)
    node = d
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return d


@pytest.mark.parametrize("length", [250, 5000])
@pytest.mark.parametrize(
    "where",
    [
        ("policy", "name"),
        ("predictor", "name"),
        ("model",),
        ("hardware",),
        ("workload", "batching"),
        ("cache", "layers"),
        ("cache", "organization"),
        ("policy", "params", "*"),
        ("predictor", "params", "*"),
        ("*",),
        ("workload", "*"),
        ("cache", "*"),
        ("policy", "*"),
        ("hardware", "*"),
        ("model", "*"),
        ("hardware", "tables", "*"),
        ("lfu counts",),
    ],
    ids=lambda w: ".".join(w) if isinstance(w, tuple) else str(w),
)
def test_unknown_names_and_keys_stay_on_one_short_line(files, where, length):
    value = LONG[-length:]
    d = base_config(files, "diffmoe", "noisy")
    d["hardware"] = {"base": "h200"}
    if where == ("lfu counts",):
        d = _set(d, ("policy",), {"name": "lfu", "params": {"counts": value}})
    elif where[-1] == "*":
        node = d
        for key in where[:-1]:
            node = node.setdefault(key, {})
        node[value] = 1
    else:
        d = _set(d, where, value)
    with pytest.raises(ConfigError) as exc:
        config_from_dict(d)
    checked_message(exc.value, MAX_MESSAGE)


@pytest.mark.parametrize("length", [250, 5000])
def test_unknown_set_paths_and_registry_names_stay_short(files, tmp_path, length):
    value = LONG[-length:]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base_config(files)))
    for text in (f"hardware.{value}=1", f"{value}=1", f"model.{value}=1", f"cache.split.{value}=1"):
        with pytest.raises(ConfigError) as exc:
            load_run_config(path, [text])
        checked_message(exc.value, MAX_MESSAGE)
    for registry in (POLICIES, PREDICTORS):
        with pytest.raises(KeyError) as exc:
            registry.get(value)
        checked_message(exc.value, MAX_MESSAGE)


def test_a_long_list_of_known_names_shows_the_closest():
    d = {"model": {**TINY_MODEL, "name": "test-model"}, "hardware": {"base": "h200", "pcie_bw_gbs": 25}}
    with pytest.raises(ConfigError) as exc:
        load_hardware(d["hardware"], "hardware")
    msg = checked_message(exc.value, MAX_MESSAGE)
    assert msg.startswith("hardware.pcie_bw_gbs: unknown key (closest: pcie_bw_gb_s")
    assert " in all: see sim/config/hardware.py)" in msg
    with pytest.raises(ConfigError) as exc:
        load_model("switch-xxxl")
    assert "switch-xxl-128" in checked_message(exc.value, MAX_MESSAGE)


@pytest.mark.parametrize(
    "argv,field",
    [
        (["--set", "hardware." + LONG + "=1"], "hardware.qqq"),
        (["--set", "policy.name=" + LONG[-250:]], "policy.name"),
        (["--set", "hardware=" + LONG], "hardware"),
        (["--set", "policy=hybrid-cache", "--set", "policy.params.half_life=0"], "policy.params.half_life: "),
        (["--set", "policy=hybrid-cache", "--set", "policy.params.max_prefetch=-1"], "policy.params.max_prefetch: "),
    ],
)
def test_the_command_line_prints_one_short_line(files, tmp_path, argv, field):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(base_config(files)))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "sim", "run", str(cfg), "--out", str(out), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), done.stderr[-2000:]
    assert len(lines[0]) <= len("error: ") + MAX_MESSAGE
    assert not out.exists()


def test_input_errors_are_the_only_errors_of_a_bad_config(files):
    """A sanity check of the helpers above: a good config loads and runs."""
    cfg = config_from_dict(base_config(files, "hybrid-cache", policy_params={"max_prefetch": 2}))
    assert simulate(cfg).summary["throughput_tok_s"] > 0
    assert issubclass(ConfigError, InputError)
