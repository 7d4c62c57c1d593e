"""The command-line contract shared by every command (``traces.cli.run_main``): what a command prints cannot drive
the terminal. Data reaches the terminal in file names, request and row names, model and tool names; every control
character a terminal acts on is printed escaped (``\\x1b``), while text, tabs and line breaks pass as they are."""

from __future__ import annotations

import contextlib
import io

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.cli import traces_main as main
from tests.support.traces import make_trace
from traces.cli import EscapingWriter
from traces.io import save_trace

CONTROLS = [chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if chr(c) not in "\t\n\r"]


@given(st.text(alphabet=st.sampled_from([*CONTROLS, "a", "é", "\t", "\n", "\r", "[", "0", "m"]), max_size=60))
def test_every_control_character_is_escaped_and_the_rest_passes(text):
    buf = io.StringIO()
    assert EscapingWriter(buf).write(text) == len(text)
    shown = buf.getvalue()
    assert not any(c in shown for c in CONTROLS)
    assert shown.count("\\x") + shown.count("\\u") >= sum(c in CONTROLS for c in text)  # each shown, escaped
    rest = iter(shown)
    assert all(c in rest for c in text if c not in CONTROLS)  # the other characters, in their order
    assert [c for c in shown if c in "\t\n\r"] == [c for c in text if c in "\t\n\r"]  # layout kept


@settings(max_examples=20, deadline=None)
@given(name=st.text(alphabet=st.sampled_from([*CONTROLS, "t", "-", "x"]), min_size=1, max_size=12))
def test_a_file_name_with_control_characters_is_printed_escaped(tmp_path_factory, name):
    name = name.replace("\x00", "0")  # a file name cannot hold NUL
    path = tmp_path_factory.mktemp("names") / f"{name}.npz"
    save_trace(make_trace([[0], [1], [2]]), path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["validate", str(path)])
    assert code == 0, err.getvalue()
    printed = out.getvalue()
    assert "ok:" in printed and not any(c in printed for c in CONTROLS)
