"""Fuzzing the sweep-file loader: a sweep file with random keys, values and types (written as YAML, or as YAML text
with byte edits) either loads, with a bounded number of points, a plain name and plain file names for everything
the sweep writes, or fails with ONE bounded line naming the sweep file (a ConfigError: exit status 2 on the command
line); never another exception, a hang or a huge allocation.

Examples are derandomized (the same ones on every run); SWEEP_FUZZ_EXAMPLES=2000 explores more locally.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError, InputError
from tests.support.paths import ROOT

BASE = str(ROOT / "configs" / "switch_xxl.yaml")
MAX_LINE = 200 + 2 + 500  # "FIELD: problem", each part bounded (moebase.errors)
EXAMPLES = int(os.environ.get("SWEEP_FUZZ_EXAMPLES", 80))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

FIELDS = [
    "policy.name",
    "workload.batch_size",
    "cache.hpc_slots",
    "cache.mpc_slots",
    "predictor.name",
    "workload.requests",
    "workload.max_decode_tokens",
    "cache.organization",
    "policy.params.threshold",
    "policy",
    "cache",
    "workload.batching",
]
GOOD = {
    "policy.name": [
        "lru",
        "lfu",
        "on-demand",
        "diffmoe",
        "belady",
        "gpu-only",
    ],  # a few valid names: the loader is fuzzed
    "workload.batch_size": [1, 2, 4],
    "cache.hpc_slots": [0, 1, 2],
    "cache.mpc_slots": [2, 4, 6],
    "predictor.name": ["none", "oracle"],
    "workload.requests": [2, 4],
    "workload.max_decode_tokens": [2, 3],
    "cache.organization": ["per-layer", "shared"],
    "policy.params.threshold": [0.5, 1.0],
    "workload.batching": ["static", "continuous"],
}

odd_text = st.one_of(
    st.text(max_size=30),
    st.text(max_size=2000),
    st.sampled_from(
        ["", "..", "../../x", "/etc/passwd", "a/b", "\x00", "x\ny", "é", "-", ".hidden", "1e999", "null", "~"]
    ),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.integers(), st.floats(allow_nan=True), odd_text)
anything = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
field_name = st.one_of(st.sampled_from(FIELDS), st.sampled_from(FIELDS), st.sampled_from(FIELDS), odd_text)


@st.composite
def axis_values(draw, field):
    """Mostly values the field takes, sometimes anything (or not a list at all)."""
    if field in GOOD and _often(draw, 6):
        return draw(st.lists(st.sampled_from(GOOD[field]), min_size=1, max_size=3, unique=True))
    return draw(st.one_of(st.lists(anything, max_size=4), anything))


@st.composite
def axes(draw, max_axes=3):
    fields = draw(st.lists(field_name, min_size=1, max_size=max_axes, unique=True))
    return {f: draw(axis_values(f)) for f in fields}


@st.composite
def zip_groups(draw):
    def group():
        length = draw(st.integers(1, 3))
        fields = draw(st.lists(st.sampled_from(list(GOOD)), min_size=1, max_size=2, unique=True))
        return {f: [draw(st.sampled_from(GOOD[f])) for _ in range(length)] for f in fields}

    kind = draw(st.integers(0, 3))
    if kind == 0:
        return group()
    if kind == 1:
        return [group() for _ in range(draw(st.integers(0, 2)))]
    return draw(axes(2)) if kind == 2 else draw(anything)


def _often(draw, odds: int) -> bool:
    """True about odds - 1 times in odds (and when hypothesis simplifies an example)."""
    return draw(st.sampled_from([True] * (odds - 1) + [False]))


def _mostly(draw, good, bad, odds: int = 4):
    """A value of ``good`` (odds - 1 times in odds), else of ``bad``."""
    return draw(good if _often(draw, odds) else bad)


@st.composite
def sweep_specs(draw):
    """A sweep file's mapping: mostly well-formed parts (so that many load and their points resolve), each part
    sometimes replaced by anything, and sometimes an unknown key."""
    spec = {}
    if _often(draw, 20):
        spec["base"] = _mostly(draw, st.just(BASE), st.one_of(anything, odd_text), 8)
    if draw(st.booleans()):
        spec["name"] = _mostly(
            draw, st.from_regex(r"\A[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}\Z"), st.one_of(odd_text, anything)
        )
    if draw(st.booleans()):
        spec["set"] = _mostly(
            draw,
            st.just({"workload.requests": 2, "workload.max_decode_tokens": 2}),
            st.one_of(st.dictionaries(field_name, anything, max_size=3), anything),
        )
    if _often(draw, 5):
        spec["grid"] = _mostly(draw, axes(), anything, 6)
    if draw(st.booleans()):
        spec["zip"] = draw(zip_groups())
    if draw(st.booleans()):
        spec["checks"] = _mostly(
            draw,
            st.lists(st.sampled_from(["gpu_only_ceiling", "belady_bound", "lru_monotone_in_cache"]), max_size=3),
            anything,
        )
    if draw(st.booleans()):
        spec["plots"] = _mostly(draw, st.lists(st.sampled_from(FIELDS + ["cache_slots"]), max_size=2), anything)
    if not _often(draw, 10):
        spec.update(
            draw(st.dictionaries(st.one_of(st.text(max_size=12), st.integers()), anything, min_size=1, max_size=1))
        )
    return spec


def _check_outcome(path: Path) -> None:
    """Load ``path``: a refusal is one bounded line naming the file; an accepted sweep is bounded and safe."""
    from sim.sweep.checks import CHECKS
    from sim.sweep.cli import default_out
    from sim.sweep.report import report_files
    from sim.sweep.spec import MAX_POINTS, is_safe_name, load_sweep

    try:
        sweep = load_sweep(path)
    except ConfigError as exc:
        text = str(exc)
        assert "\n" not in text and len(text) <= MAX_LINE and str(path) in text, text
        return
    except InputError as exc:  # a trace or profile a point names: still one bounded line
        assert "\n" not in str(exc) and len(str(exc)) <= MAX_LINE, str(exc)
        return
    assert 1 <= len(sweep.points) <= MAX_POINTS
    assert is_safe_name(sweep.name)
    out = (Path("/r") / default_out(sweep.name)).resolve()
    assert out.parent == Path("/r/runs")
    assert len(set(sweep.axes)) == len(sweep.axes) and set(sweep.checks) <= set(CHECKS)
    ids = [p.id for p in sweep.points]
    assert len(set(ids)) == len(ids) and all(is_safe_name(i) for i in ids)
    assert all(is_safe_name(f) for f in report_files(sweep))
    for p in sweep.points:
        json.dumps(p.fields)  # rows store the fields: plain data only


@FUZZ
@given(spec=sweep_specs())
def test_a_random_sweep_file_loads_bounded_and_safe_or_is_one_line(tmp_path_factory, spec):
    folder = tmp_path_factory.mktemp("sweep")
    path = folder / "fuzz.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=False))
    _check_outcome(path)


VALID = f"""base: {BASE}
name: fuzz
set: {{workload.requests: 2, workload.max_decode_tokens: 2}}
grid:
  policy.name: [lru, on-demand]
zip:
  cache.hpc_slots: [0, 1]
  cache.mpc_slots: [2, 4]
checks: [lru_monotone_in_cache]
plots: [cache_slots]
"""


@FUZZ
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, len(VALID)),
            st.sampled_from(
                [
                    "",
                    ":",
                    "\n",
                    " ",
                    "[",
                    "]",
                    "{",
                    "}",
                    ",",
                    "-",
                    "/..",
                    "'",
                    '"',
                    "*",
                    "&a ",
                    "!!python/object ",
                    "\x00",
                    "9" * 30,
                    "\t",
                    "#",
                    "?",
                    "é",
                    "x" * 200,
                ]
            ),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_a_sweep_file_with_byte_edits_loads_or_is_one_line(tmp_path_factory, edits):
    text = VALID
    for at, piece in edits:
        at = min(at, len(text))
        text = text[:at] + piece + text[at + (1 if piece == "" else 0) :]
    folder = tmp_path_factory.mktemp("edit")
    path = folder / "edit.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    _check_outcome(path)
