"""`diffmoe` exactly as the Diff-MoE artifact runs it: the policy, driven through the engine's protocol
(``sim.decisions.replay.replay``), against ``FetcherCC``, a plain transliteration of the artifact's cache code
(``ceciliawinter/Diff-MoE``: ``src/fastertransformer/utils/fetcher.cc``, ``FetcherContext::fetch``, cache policy
0, and the cache set-up of ``models/t5/T5Decoding.cc``), hit for hit and promotion for promotion, on generated
skewed traces and on the authors' own Switch routing logs (skipped when ../shared is absent). Also: the rules
that differ from this simulator's earlier ones (floor, victim order, float drift), the artifact's start with
no hot-expert list (every slot holds expert 0), bad params, and the libstdc++ ``std::sort`` port against g++."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from sim.core.cache import HPC, MISS, MPC
from sim.core.workload import build_iterations
from sim.decisions.replay import replay
from sim.policies import POLICIES
from sim.policies._libstdcxx import cxx_sort, sort_by_key_descending
from sim.predictors import PREDICTORS, PredictorContext
from tests.reference.diffmoe_fetcher import FetcherCC
from tests.support.paths import ROOT
from tests.support.policies import policy_context
from tests.support.traces import make_trace
from traces.format import LayerInfo, ModelInfo, Provenance, Trace, TraceMeta
from traces.synthetic.generator import SynthKnobs, generate

SWITCH_LOGS = ROOT.parent / "shared" / "traces" / "switch-base-pregated-logs"


# ----------------------------------------------------------------------------------------------------- drivers


def policy_ctx(trace, hpc, mpc, ranking=None):
    """The policy's context with the artifact's cached layers: the decoder MoE layers only."""
    roles = tuple(x.role for x in trace.meta.model.layers)
    cached = [i for i, r in enumerate(roles) if r == "decoder"]
    return policy_context(trace, None, hpc, mpc, ranking=ranking, cached=cached)


def run_policy(trace, its, hpc, mpc, params=None, ranking=None):
    """The policy through the engine's protocol: per cached (iteration, layer) its cache hits, its promotions
    and its MPC after the step."""
    ctx = policy_ctx(trace, hpc, mpc, ranking)
    policy = POLICIES.get("diffmoe")(params, ctx)
    snaps = []
    pred = PREDICTORS.get("none")(None, PredictorContext(trace.num_layers, trace.num_experts, 0))
    decisions = replay(
        trace, its, policy, pred, after_step=lambda p: (p.cache.check(), snaps.append([sorted(m) for m in p.cache.mpc]))
    )
    out = []
    for d, snap in zip(decisions, snaps):
        if d.layer in ctx.cached_layers:
            hits = tuple(e for e, s in d.sources if s in (HPC, MPC))
            out.append((d.iteration, d.layer, hits, d.promote, tuple(snap[d.layer])))
    return out, policy


def run_fetcher(trace, its, hpc, mpc, params=None, ranking=None):
    """The same workload through ``FetcherCC``, reset at every static batch as each forward call does (decoder-only
    traces: every iteration runs every layer)."""
    p = {
        "max_val": 2.0,
        "threshold": 1.0,
        "dec_in_cache": 0.4,
        "dec_out_cache": 0.2,
        "arithmetic": "exact",
        "fill": "hot",
        "in_cache_check": "intended",
        **(params or {}),
    }
    ctx = policy_ctx(trace, hpc, mpc, ranking)
    layers = sorted(ctx.cached_layers)
    if p["fill"] == "expert0":
        lists = [[0] * (hpc + mpc) for _ in layers]  # eval_cache.py: no cache_init_experts -> all zeros
    else:
        lists = [list(ctx.hot_ranking[layer][: hpc + mpc]) for layer in layers]
    fetcher, out = None, []
    for it in its:
        if it.new_batch:
            fetcher = FetcherCC(
                lists,
                hpc + mpc,
                hpc,
                trace.num_experts,
                p["max_val"],
                p["threshold"],
                p["dec_in_cache"],
                p["dec_out_cache"],
                p["arithmetic"],
                p["in_cache_check"] == "artifact",
            )
        for pos, layer in enumerate(layers):
            ids = trace.experts[it.rows, layer, :].ravel()
            using = sorted({int(x) for x in ids if x >= 0})
            hits, promoted = fetcher.fetch(pos, using)
            out.append((it.index, layer, tuple(hits), tuple(promoted), tuple(fetcher.mpc(pos))))
    return out


def skewed_trace(seed, layers=3, experts=16, k=2, requests=4, skew=1.2, stickiness=0.5):
    """A generated decode-only trace with concentrated, sticky routing (as real routing is)."""
    knobs = SynthKnobs(
        num_experts=experts,
        top_k=k,
        decoder_layers=layers,
        requests=requests,
        prompt_len=(0, 0),
        decode_len=(30, 90),
        skew=skew,
        stickiness=stickiness,
        correlation=0.3,
    )
    return generate(knobs, seed)


def read_switch_log(path: Path, num_experts: int) -> Trace:
    """A decode-only trace from one of the authors' batch-1 logs: per run, 6 encoder lines (skipped), then 256
    decode steps of 6 lines (decoder MoE layers 0..5), one expert id each; each run is one request."""
    lines = [ln.split()[1:] for ln in path.read_text().splitlines() if ln.strip()]
    per_run = 6 + 256 * 6
    assert len(lines) % per_run == 0, f"{path}: {len(lines)} lines is not a whole number of runs"
    runs = []
    for r in range(len(lines) // per_run):
        dec = lines[r * per_run + 6 : (r + 1) * per_run]
        assert all(len(x) == 1 for x in dec), f"{path}: a decode line of run {r} has more than one token"
        runs.append(np.array([int(x[0]) for x in dec], dtype=np.int16).reshape(256, 6))
    experts = np.concatenate(runs)[:, :, None]
    meta = TraceMeta(
        ModelInfo(
            f"switch-base-{num_experts}", num_experts, 1, tuple(LayerInfo(2 * i + 1, "decoder") for i in range(6))
        ),
        Provenance("imported", "tests", f"google/switch-base-{num_experts}", path.name, "2024-12-10"),
        seed=None,
    )
    offsets = np.arange(len(runs) + 1, dtype=np.int64) * 256
    return Trace(experts, offsets, np.zeros(len(runs), dtype=np.int64), meta)


def workload(trace, batch=1):
    its, _ = build_iterations(trace, batch, "static", None, True, None)
    return its


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == w, f"(iteration, layer) {g[:2]}: policy {g[2:]} != fetcher.cc {w[2:]}"


# ------------------------------------------------------------------------------------- the policy == fetcher.cc


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    hpc=st.integers(0, 3),
    mpc=st.integers(0, 6),
    k=st.integers(1, 3),
    batch=st.integers(1, 4),
    experts=st.sampled_from([8, 16, 32]),
    fill=st.sampled_from(["hot", "expert0"]),
    arithmetic=st.sampled_from(["exact", "float32"]),
    check=st.sampled_from(["intended", "artifact"]),
    dec=st.sampled_from([(0.4, 0.2), (0.2, 0.4), (0.5, 0.5)]),
    thr=st.sampled_from([(2.0, 1.0), (3.0, 2.0)]),
)
def test_policy_equals_fetcher_cc_on_generated_skewed_traces(
    seed, hpc, mpc, k, batch, experts, fill, arithmetic, check, dec, thr
):
    mpc = min(mpc, experts - hpc)  # sim.decisions.build.build_decisions refuses more slots than experts
    trace = skewed_trace(seed, experts=experts, k=k)
    its = workload(trace, batch)
    params = {
        "fill": fill,
        "arithmetic": arithmetic,
        "in_cache_check": check,
        "dec_in_cache": dec[0],
        "dec_out_cache": dec[1],
        "max_val": thr[0],
        "threshold": thr[1],
    }
    got, _ = run_policy(trace, its, hpc, mpc, params)
    assert_same(got, run_fetcher(trace, its, hpc, mpc, params))


@pytest.mark.parametrize("fill", ["hot", "expert0"])
def test_policy_equals_fetcher_cc_with_default_params(fill):
    trace = skewed_trace(7, layers=4, experts=32, k=2, requests=8)
    its = workload(trace, 2)
    got, policy = run_policy(trace, its, 2, 4, {"fill": fill})
    assert_same(got, run_fetcher(trace, its, 2, 4, {"fill": fill}))
    c = policy.cache.counters
    assert c.promotions > 0 and c.hits[MPC] > 0 and c.evictions > 0  # the comparison exercised every rule


@pytest.mark.parametrize("fill", ["hot", "expert0"])
def test_the_engine_runs_the_artifacts_decisions(tmp_path, fill):
    """`sim run`'s engine asks the same policy: its hit and promotion counts are fetcher.cc's."""
    from sim.run import simulate
    from tests.support.engine import config_for
    from traces.io import save_trace

    trace = skewed_trace(3, layers=3, experts=16, k=2, requests=6)
    path = save_trace(trace, tmp_path / "t.npz")
    cfg = config_for(path, trace, "diffmoe", "none", batch=2, hpc=1, mpc=3, policy_params={"fill": fill})
    s = simulate(cfg, trace=trace, check_invariants=True).summary
    want = run_fetcher(trace, workload(trace, 2), 1, 3, {"fill": fill})
    assert s["hits"]["hpc"] + s["hits"]["mpc"] == sum(len(w[2]) for w in want)
    assert s["promotions"] == sum(len(w[3]) for w in want) > 0


@pytest.fixture(scope="module")
def switch_b1():
    path = SWITCH_LOGS / "experts_e128_Pre-gated_b1.txt"
    if not path.is_file():
        pytest.skip(f"the authors' Switch routing logs are not here ({path}): ../shared is absent in this checkout")
    return read_switch_log(path, 128)


@pytest.mark.parametrize("fill", ["expert0", "hot"])
@pytest.mark.parametrize("slots", [(3, 1), (6, 2), (13, 4)])  # (HPC+MPC, HPC) as in the paper's grid
def test_policy_equals_fetcher_cc_on_the_real_switch_trace(switch_b1, slots, fill):
    """google/switch-base-128 routing logged by the artifact's own build, batch 1, 5 runs of 256 decode steps (each
    run one forward call, so the cache restarts): every hit and every promotion agree."""
    total, hpc = slots
    its = workload(switch_b1, 1)
    got, policy = run_policy(switch_b1, its, hpc, total - hpc, {"fill": fill})
    assert_same(got, run_fetcher(switch_b1, its, hpc, total - hpc, {"fill": fill}))
    if fill == "expert0":  # a start from the run's own hot list at 13 slots leaves nothing to promote
        assert policy.cache.counters.promotions > 0


def test_float32_drift_changes_decisions_on_the_real_switch_trace(switch_b1):
    """The artifact's float scores drift (a score that should be 1.0 ends up just below): both arithmetics agree
    with fetcher.cc run the same way, and they disagree with each other somewhere on the real trace."""
    its = workload(switch_b1, 1)
    runs = {}
    for arith in ("exact", "float32"):
        got, _ = run_policy(switch_b1, its, 2, 4, {"fill": "expert0", "arithmetic": arith})
        assert_same(got, run_fetcher(switch_b1, its, 2, 4, {"fill": "expert0", "arithmetic": arith}))
        runs[arith] = got
    assert runs["exact"] != runs["float32"]


# ------------------------------------------------------------------------------------------ the rules, by hand


def one_layer(steps, experts=6):
    """A decode-only one-layer trace, one request, top-k = the widest step (padded with -1)."""
    k = max(len(s) for s in steps)
    return make_trace([[sorted(s) + [-1] * (k - len(s))] for s in steps], num_experts=experts)


def decisions_of(trace, hpc, mpc, params, ranking):
    pol = POLICIES.get("diffmoe")(params, policy_ctx(trace, hpc, mpc, ranking))
    pred = PREDICTORS.get("none")(None, PredictorContext(trace.num_layers, trace.num_experts, 0))
    return replay(trace, workload(trace), pol, pred), pol


RANK = [tuple(range(6))]


def test_no_floor_an_idle_experts_first_activation_does_not_reach_the_threshold():
    """HPC = {1}, MPC = [0]. Expert 1 runs 5 steps: 0 decays in the cache (2.0 - 5 x 0.4 = 0.0) and 2 idles out
    of it (0 - 5 x 0.2 = -1.0). Then 2 is active: the artifact's -1.0 + 1 = 0.0 is below the threshold, the
    floored 0 + 1 = 1.0 is not, and takes the slot at once; the artifact admits 2 one step later."""
    trace = one_layer([[1], [1], [1], [1], [1], [2], [2]])
    ranking = [(1, 0, 2, 3, 4, 5)]
    dn, pn = decisions_of(trace, 1, 1, None, ranking)
    df, _ = decisions_of(trace, 1, 1, {"floor": True, "victim_order": "legacy"}, ranking)
    assert pn.cache.hpc[0] == frozenset({1})
    assert dn[5].promote == () and dict(df[5].promote) == {2: 0}
    assert dn[6].sources == ((2, MISS),) and dict(dn[6].promote) == {2: 0}
    assert df[6].sources == ((2, MPC),)


def test_exact_threshold_without_float_drift():
    """1.8 - 0.4 - 0.4 is 1.0: a slot at that score is not below the threshold (exact) and is kept; Python
    floats make it 0.9999999999999999 (this simulator's earlier arithmetic) and evict it. (The artifact's float32
    happens to land on 1.0 here.)"""
    # MPC = [0]. t0: 1 -> 1.0. t1: 2 active, 1 -> 0.8. t2: 1 -> 1.8, slot 0 at 0.8: 1 is promoted.
    # t3, t4: 4 active (-0.6 + 1 = 0.4, then 1.4); 1 is cached and idle: 1.8 - 0.4 - 0.4.
    # t4: 1.0 >= 1 keeps 1; a drifted score below 1 lets 4 (1.4) in. t5: 1 again, a hit only if it was kept.
    trace = one_layer([[1], [2], [1], [4], [4], [1]])
    out = {}
    for arith in ("exact", "float64", "float32"):
        d, _ = decisions_of(trace, 0, 1, {"arithmetic": arith}, RANK)
        assert dict(d[2].promote) == {1: 0}
        out[arith] = (dict(d[4].promote), d[5].sources)
    assert out["exact"] == ({}, ((1, MPC),)) == out["float32"]
    assert out["float64"] == ({4: 1}, ((1, MISS),))


def test_float32_drift_of_the_artifact():
    """With both decays 0.2, an idle cached expert goes 2.0 - 5 x 0.2: 1.0 exactly, 0.9999998 in float32 (the
    artifact's float): the artifact evicts it, the exact rule keeps it."""
    # MPC = [0]. t0-t1: 3 active (1.0, 2.0) while slot 0 is >= 1. t2-t3: 4 active (-0.4 + 1 = 0.6, 1.6): slot 0
    # is at 1.4, 1.2. t4: 4 active (2.0); slot 0 at 1.0 (exact) or 0.9999998 (float32). t5: 0 again.
    trace = one_layer([[3], [3], [4], [4], [4], [0]])
    params = {"dec_in_cache": 0.2, "dec_out_cache": 0.2}
    de, _ = decisions_of(trace, 0, 1, params, RANK)
    df, _ = decisions_of(trace, 0, 1, {**params, "arithmetic": "float32"}, RANK)
    assert all(d.promote == () for d in de) and de[5].sources == ((0, MPC),)
    assert [dict(d.promote) for d in df] == [{}, {}, {}, {}, {4: 0}, {}] and df[5].sources == ((0, MISS),)


def test_victim_order_among_equal_scores():
    """Two MPC experts at equal scores: the artifact evicts the one latest in its (stably re-sorted) slot array;
    the legacy rule the one held longest."""
    # MPC = [0, 1] (hot order), both decay alike: 2.0 -> 1.6 -> 1.2 -> 0.8. Expert 2 active 3 times: 1, 2, 2.
    trace = one_layer([[2], [2], [2]])
    da, _ = decisions_of(trace, 0, 2, None, RANK)
    dl, _ = decisions_of(trace, 0, 2, {"victim_order": "legacy"}, RANK)
    assert dict(da[2].promote) == {2: 1} and dict(dl[2].promote) == {2: 0}


def test_the_artifact_may_evict_an_expert_active_now():
    """Victims are slots below the threshold, active or not: an expert back after a long idle (its score still
    below 1) loses its slot to a stronger newcomer of the same step; the legacy rule never evicts one in use."""
    # MPC = [0]. t0-t1: 3 active (1.0, 2.0) while slot 0 is >= 1 (1.6, 1.2); then 3 idles (1.8 ... 1.2).
    # t2-t5: one fresh expert each (scores 0.6, 0.4, 0.2, 0.0: never promoted). Slot 0 is at 2.0 - 6 x 0.4.
    # t6: 0 and 3 active: 0 -> -0.4 + 1 = 0.6 (a hit, but weak), 3 -> 2.0: 3 takes 0's slot.
    trace = one_layer([[3], [3], [4], [5], [1], [2], [0, 3]])
    da, pa = decisions_of(trace, 0, 1, None, RANK)
    dl, _ = decisions_of(trace, 0, 1, {"victim_order": "legacy"}, RANK)
    assert all(d.promote == () for d in da[:6])
    assert dict(da[6].sources) == {0: MPC, 3: MISS} == dict(dl[6].sources)
    assert dict(da[6].promote) == {3: 0} and dict(dl[6].promote) == {}
    assert list(pa.cache.mpc[0]) == [3]


def test_expert0_fill_is_the_artifacts_start_without_a_hot_list():
    trace = one_layer([[1], [0]])
    ctx = policy_ctx(trace, 2, 3, RANK)
    pol = POLICIES.get("diffmoe")({"fill": "expert0"}, ctx)
    pol.start_batch()
    assert pol.cache.hpc[0] == frozenset({0}) and list(pol.cache.mpc[0]) == []  # 0 is in the HPC already
    assert pol.slots[0] == [0, 0, 0]
    assert pol.scores[0].tolist() == [2.0, 0, 0, 0, 0, 0]
    d, _ = decisions_of(trace, 0, 2, {"fill": "expert0"}, RANK)
    assert d[1].sources == ((0, MPC),)  # without an HPC, expert 0 fills both MPC slots


# ------------------------------------------------------------------------------------------------------ params


@pytest.mark.parametrize(
    "params, field",
    [
        ({"victim_order": "random"}, "policy.params.victim_order"),
        ({"arithmetic": "float16"}, "policy.params.arithmetic"),
        ({"fill": "cold"}, "policy.params.fill"),
        ({"in_cache_check": "maybe"}, "policy.params.in_cache_check"),
        ({"threshold": -1}, "policy.params.threshold"),
        ({"dec_in_cache": 0.1234567}, "policy.params.dec_in_cache"),  # exact arithmetic: at most 6 decimals
        ({"fill": "expert0", "victim_order": "legacy"}, "policy.params.fill"),
        ({"floor": "yes"}, "policy.params.floor"),
    ],
)
def test_bad_params_name_the_field(params, field):
    trace = one_layer([[1]])
    with pytest.raises(ConfigError, match="^" + field.replace(".", r"\.") + ":"):
        POLICIES.get("diffmoe")(params, policy_ctx(trace, 1, 2, RANK))


def test_seven_decimals_are_fine_in_float32():
    trace = one_layer([[1]])
    POLICIES.get("diffmoe")({"dec_in_cache": 0.1234567, "arithmetic": "float32"}, policy_ctx(trace, 1, 2, RANK))


def test_a_bad_param_exits_2_from_the_cli(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim",
            "run",
            "configs/switch_xxl.yaml",
            "--set",
            "policy.params.victim_order=lifo",
            "--set",
            "workload.requests=1",
            "--set",
            "workload.max_decode_tokens=2",
            "--out",
            str(tmp_path / "o"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.strip().splitlines() if x]
    assert len(lines) == 1 and "policy.params.victim_order" in lines[0] and "lifo" in lines[0]


# ------------------------------------------------------------------------------------- std::sort, as libstdc++


def test_sort_by_key_descending_is_stable_up_to_16_elements():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(0, 16)
        key = [rng.randint(0, 3) for _ in range(40)]
        a = rng.sample(range(40), n)
        b = list(a)
        cxx_sort(b, lambda x, y: key[x] > key[y])  # noqa: B023
        c = list(a)
        sort_by_key_descending(c, key)
        assert b == c == sorted(a, key=lambda x: -key[x])


@pytest.fixture(scope="module")
def gxx_sort(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ on this machine: the libstdc++ std::sort port is checked where there is one")
    d = tmp_path_factory.mktemp("cxx")
    src = d / "s.cc"
    src.write_text(
        "#include <algorithm>\n#include <cstdio>\n#include <vector>\n"
        'int main(){int n,m;while(scanf("%d %d",&m,&n)==2){std::vector<int> key(n),ids(n);'
        'for(int i=0;i<n;i++){scanf("%d",&key[i]);ids[i]=i;}'
        "auto c=[&](const int&a,const int&b){return key[a]>key[b];};"
        "if(m)std::partial_sort(ids.begin(),ids.end(),ids.end(),c);else std::sort(ids.begin(),ids.end(),c);"
        'for(int i=0;i<n;i++)printf("%d ",ids[i]);printf("\\n");}}\n'
    )
    exe = d / "s"
    subprocess.run([gxx, "-O2", "-o", str(exe), str(src)], check=True, timeout=120)

    def run(cases):
        text = "".join(f"{m} {len(c)} " + " ".join(map(str, c)) + "\n" for m, c in cases)
        out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True).stdout
        return [[int(x) for x in line.split()] for line in out.splitlines()]

    return run


def test_cxx_sort_equals_gxx_std_sort(gxx_sort):
    """Random keys with many ties, 0 to 300 elements (introsort, its final insertion sort, and heapsort)."""
    from sim.policies._libstdcxx import _partial_sort

    rng = random.Random(1)
    cases = []
    for _ in range(1500):
        n = rng.choice([0, 1, 2, 7, 16, 17, 18, 25, 40, 64, 128, 300])
        cases.append((rng.random() < 0.2, [rng.randrange(rng.choice([1, 2, 3, 8, 1000])) for _ in range(n)]))
    cases += [(0, list(range(200))), (0, list(range(200))[::-1]), (0, [i % 3 for i in range(200)])]
    for (heap, keys), want in zip(cases, gxx_sort(cases)):
        ids = list(range(len(keys)))
        if heap:
            _partial_sort(ids, 0, len(ids), len(ids), lambda x, y: keys[x] > keys[y])  # noqa: B023
        else:
            cxx_sort(ids, lambda x, y: keys[x] > keys[y])  # noqa: B023
        assert ids == want, keys
        if not heap:
            ids2 = list(range(len(keys)))
            sort_by_key_descending(ids2, keys)
            assert ids2 == want
