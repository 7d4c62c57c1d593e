"""Every import format holds the names it writes into a trace's metadata (``--model``, ``--source-model``,
``--dataset``) to the model-name rule before it reads anything (``traces.run_setup.run_import``)."""

from __future__ import annotations

import contextlib
import io
import re

from hypothesis import given
from hypothesis import strategies as st

from tests.support.cli import traces_main as main
from tests.support.fuzz import fuzz_settings
from traces.cli import build_parser

#: the arguments each format needs besides its file, --model and --out
NEEDS = {"vllm": ["--num-experts", "8"], "ft-log": ["--batch", "1", "--num-experts", "8"]}
PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9][A-Za-z0-9._+-]*)?")


def _formats_with(flag: str) -> list[str]:
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    fmt = next(a for a in sub.choices["import"]._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(n for n, p in fmt.choices.items() if any(flag in a.option_strings for a in p._actions))


NAMES = st.text(alphabet=st.sampled_from(list("ab-./_ +x\x1b\n\t\u00e9")), min_size=1, max_size=20)


@fuzz_settings(60)
@given(
    fmt=st.sampled_from(sorted({*_formats_with("--dataset"), *_formats_with("--source-model")})),
    flag=st.sampled_from(["--dataset", "--source-model"]),
    name=NAMES,
)
def test_a_name_for_the_metadata_is_refused_before_any_input_unless_plain(tmp_path_factory, fmt, flag, name):
    if fmt not in _formats_with(flag):
        return
    missing = tmp_path_factory.mktemp("in") / "missing-input"
    args = ["import", fmt, str(missing), "--model", "toy", *NEEDS.get(fmt, []), f"{flag}={name}", "--out", "o.npz"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    line = err.getvalue().strip()
    assert code == 2 and len(line.splitlines()) == 1, line
    plain = bool(PLAIN.fullmatch(name)) and ".." not in name and len(name) <= 128
    assert line.startswith(f"error: {flag}:") != plain, line  # refused naming the flag, or on to the input
    assert "missing-input" in line or not plain, line
