"""Rows files (sim/fit_system.py) as untrusted input: every numeric cell takes only plain ASCII numbers, a header
names each column once, no text cell carries a control character, llama.cpp's n-cpu-moe is at most the model's MoE
layers, the file is read only as far as its bound, and nothing printed from the rows reaches a terminal raw. Every
refusal is a ConfigError: one printable line naming the file, the row and the column."""

from __future__ import annotations

import dataclasses
import math
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import traces.io
from moebase.errors import CONFIG_FIELD_CHARS, CONFIG_PROBLEM_CHARS, ConfigError
from moebase.model import load_model
from sim.config.placement import Placement, apply_placement
from sim.fit_system import (
    COLUMNS,
    MAX_FILE_BYTES,
    MAX_INT,
    MAX_TOK_S,
    NAME_COLUMNS,
    TEXT_COLUMNS,
    SystemFit,
    format_fits,
    format_table,
    read_rows,
    run_config,
)
from sim.policies import POLICIES
from tests.support.messages import checked_message
from tests.support.rows import row, write_rows

MAX_LINE = CONFIG_FIELD_CHARS + 2 + CONFIG_PROBLEM_CHARS  # "FIELD: problem"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
INT_COLUMNS = {"batch": 1, "prompt_tokens": 0, "decode_tokens": 1, "gpu_experts_per_layer": 0}  # -> minimum
NUMBER_COLUMNS = (*INT_COLUMNS, "measured_tok_s")
#: Characters a cell may not hold inside its text: controls, format characters (bidi overrides), line and
#: paragraph separators, odd spaces.
UNPRINTABLE = st.characters(categories=("Cc", "Cf", "Zl", "Zp", "Zs"), exclude_characters=" ")
NO_SURROGATES = st.characters(exclude_categories=("Cs",))

NUMBER_TEXT = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "NaN", "-nan", "inf", "+inf", "-Infinity", "1e999", "1_000", "0x10", "1e", ".", "+"]),
    st.integers(33, 6000).map(lambda n: "9" * n),  # past the bound, and past the interpreter's int() digit limit
    st.text(st.characters(categories=("Nd",)), min_size=1, max_size=4),  # digits of any script
    st.text(st.sampled_from("0123456789+-.eE_ \u0663\uff13\u00b2"), min_size=1, max_size=8),
    st.text(NO_SURROGATES, max_size=8),
)


def _refused(path, **cells) -> str:
    """The message of read_rows refusing a file whose second row has these cells, checked to be one line."""
    with pytest.raises(ConfigError) as exc:
        read_rows(write_rows(path, [row("ok"), row("bad", **cells)]))
    msg = checked_message(exc.value, MAX_LINE)
    assert str(path) in msg and "row 3" in msg
    return msg


# --------------------------------------------------------------------------------------------- numbers
@SETTINGS
@given(col=st.sampled_from(NUMBER_COLUMNS), text=NUMBER_TEXT)
def test_a_numeric_cell_is_read_only_from_plain_ascii_numbers(tmp_path, col, text):
    """Whatever text a numeric cell holds, the row is read with the number that text means in plain ASCII, or
    refused on one line naming the column; never a traceback, never a non-ASCII digit, NaN or infinity read."""
    path = write_rows(tmp_path / "rows.csv", [row("a", **{col: text})])
    try:
        (r,) = read_rows(path)
    except ConfigError as exc:
        assert col in checked_message(exc, MAX_LINE)
        return
    value, given_text = getattr(r, col), text.strip()
    if given_text == "":
        assert value is None or col == "batch"
        return
    assert given_text.isascii() and re.fullmatch(r"[0-9+\-.eE]+", given_text), given_text
    assert math.isfinite(value) and value == float(given_text)
    if col in INT_COLUMNS:
        assert isinstance(value, int) and INT_COLUMNS[col] <= value <= MAX_INT
    else:
        assert 0 < value <= MAX_TOK_S


@SETTINGS
@given(col=st.sampled_from(NUMBER_COLUMNS), value=st.integers(1, 10**6), sign=st.sampled_from(["", "+"]))
def test_a_plain_ascii_number_in_range_is_read_as_written(tmp_path, col, value, sign):
    path = write_rows(tmp_path / "rows.csv", [row("a", **{col: f"{sign}{value}"})])
    assert getattr(read_rows(path)[0], col) == value


# --------------------------------------------------------------------------------------------- header
@SETTINGS
@given(
    order=st.permutations(COLUMNS),
    extra=st.lists(st.text("abcxyz_", min_size=1, max_size=6).filter(lambda c: c not in COLUMNS), unique=True),
    data=st.data(),
)
def test_a_header_naming_a_column_twice_is_refused_naming_it(tmp_path, order, extra, data):
    """Any header (the columns in any order, other columns beside them) that repeats a column is refused, the
    column named; once each, the rows read are the same whatever the order."""
    header = list(order) + extra
    rows = [row("a"), row("b", role="predict")]
    once = read_rows(write_rows(tmp_path / "once.csv", rows, header))
    plain = read_rows(write_rows(tmp_path / "plain.csv", rows))
    assert [dataclasses.replace(r, file="") for r in once] == [dataclasses.replace(r, file="") for r in plain]
    twice = data.draw(st.sampled_from(header))
    at = data.draw(st.integers(0, len(header)))
    path = tmp_path / "twice.csv"
    path.write_text(",".join(header[:at] + [twice] + header[at:]) + "\n" + ",".join(["x"] * (len(header) + 1)) + "\n")
    with pytest.raises(ConfigError) as exc:
        read_rows(path)
    msg = checked_message(exc.value, MAX_LINE)
    assert f"names the column {twice!r} twice" in msg and str(path) in msg


# --------------------------------------------------------------------------------------------- text
@SETTINGS
@given(col=st.sampled_from(sorted(set(NAME_COLUMNS) | set(TEXT_COLUMNS))), bad=UNPRINTABLE, data=st.data())
def test_a_control_character_in_any_text_cell_is_refused_naming_the_column(tmp_path, col, bad, data):
    """An escape, a line break, a tab, a bidi override or an odd space inside any text cell is refused on one
    printable line naming the column (never echoed raw)."""
    good = row("bad")[col] or "x"
    at = data.draw(st.integers(1, len(good)))  # inside the text: what the cell's stripping cannot remove
    text = good[:at] + bad + "x" + good[at:]
    msg = _refused(tmp_path / "rows.csv", **{col: text})
    assert (("row (the id)" if col == "row" else col) in msg) and bad not in msg


@SETTINGS
@given(col=st.sampled_from(NAME_COLUMNS), text=st.text(NO_SURROGATES, min_size=1, max_size=12))
def test_a_name_cell_is_a_plain_ascii_name_or_refused(tmp_path, col, text):
    """Any text in a name column (row id, system, variant, model, formats, role) is read only when it is a plain
    name: ASCII letters, digits and ._+=- (no path separator, space or control character)."""
    path = write_rows(tmp_path / "rows.csv", [row("a", **{col: text})])
    try:
        read_rows(path)
    except ConfigError as exc:
        checked_message(exc, MAX_LINE)
        return
    assert text.strip() == "" or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+=-]*", text.strip())


def test_cells_are_bounded_in_length(tmp_path):
    for col, limit in TEXT_COLUMNS.items():
        assert "longer than" in _refused(tmp_path / f"{col}.csv", **{col: "a" * (limit + 1)})
    assert "plain name" in _refused(tmp_path / "name.csv", variant="a" * 101)


# --------------------------------------------------------------------------------------------- n-cpu-moe
@SETTINGS
@given(
    model=st.sampled_from(["deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b"]),
    over=st.one_of(st.integers(1, 10**6).map(str), st.integers(40, 5000).map(lambda n: "9" * n)),
)
def test_n_cpu_moe_beyond_the_model_s_moe_layers_is_refused(tmp_path, model, over):
    """A llama.cpp row's n-cpu-moe=N above the model's MoE layers (any number of digits) is refused on one line;
    at most the layers, the run config keeps the experts of N layers on the host."""
    layers = load_model(model).moe_layers
    n = str(layers + int(over)) if len(over) < 10 else over
    cells = dict(system="llama.cpp", model=model, gpu="rtx4090-24gb", host="2x Xeon Gold 6454S", fmt=("q4_k_m",) * 2)
    msg = _refused(tmp_path / "over.csv", variant=f"n-cpu-moe={n}", **cells)
    assert "variant" in msg
    k = len(over) % (layers + 1)
    (ok,) = read_rows(write_rows(tmp_path / "ok.csv", [row("a", variant=f"n-cpu-moe={k}", **cells)]))
    cfg = run_config(ok, {})
    assert cfg["system"]["placement"] == {"n_cpu_moe": k}  # the one field; what the loader derives from it:
    apply_placement(cfg, Placement(k), load_model(model), POLICIES.get(cfg["policy"]["name"]))
    assert cfg["policy"]["params"] == {"cpu_layers": k}
    assert cfg["cache"]["shared_slots"] == (layers - k) * load_model(model).num_experts


# --------------------------------------------------------------------------------------------- the file
def test_a_rows_file_is_read_only_up_to_its_bound(tmp_path, monkeypatch):
    """A file past MAX_FILE_BYTES is refused after reading at most the bound + 1 bytes (a huge sparse file is
    never read whole)."""
    reads = []
    real = traces.io.open_regular_file

    class Counted:
        """The opened file, its reads' sizes noted."""

        def __init__(self, path, what="file"):
            self.f = real(path, what)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            reads.append(n)
            return self.f.read(n)

    monkeypatch.setattr(traces.io, "open_regular_file", Counted)
    path = tmp_path / "big.csv"
    with path.open("wb") as f:
        f.truncate(MAX_FILE_BYTES * 8)
    with pytest.raises(ConfigError, match="larger than"):
        read_rows(path)
    assert reads and all(0 <= n <= MAX_FILE_BYTES + 1 for n in reads)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_a_device_is_refused_without_reading(tmp_path):
    fifo = tmp_path / "rows.csv"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        read_rows(fifo)
    with pytest.raises(ConfigError, match="device"):
        read_rows("/dev/zero")


# --------------------------------------------------------------------------------------------- printing
TEXT = st.text(NO_SURROGATES, max_size=30)


@SETTINGS
@given(
    cells=st.lists(st.tuples(TEXT, TEXT, TEXT, st.one_of(st.none(), TEXT)), min_size=1, max_size=5),
    ids=st.lists(TEXT, min_size=1, max_size=30),
)
def test_what_is_printed_from_the_rows_has_no_control_character(cells, ids):
    """Whatever text a result holds (ids, system, hardware, problem), format_table prints one line per row with
    its seven cells and no control character but the line breaks between lines; format_fits likewise."""
    results = [
        {
            "row": rid,
            "role": "predict",
            "system": system,
            "hardware": hw,
            "published_tok_s": 1.0,
            "predicted_tok_s": None if problem else 2.0,
            "error": None,
            "problem": problem,
        }
        for rid, system, hw, problem in cells
    ]
    table = format_table(results)
    assert all(c.isprintable() or c == "\n" for c in table)
    lines = table.split("\n")
    problems = sum(1 for r in results if r["problem"])
    assert len(lines) == 2 + len(results) + (2 + problems if problems else 0)
    for line in lines[2 : 2 + len(results)]:
        assert len(re.split(r"(?<!\\)\|", line)) == 9, line  # 7 cells between 8 pipes: no cell adds one
    fit = SystemFit("fiddler", "host_bw_fraction", 0.5, {ids[0]: 0.5}, tuple(ids), {ids[0]: tuple(ids)})
    text = format_fits({"fiddler": fit})
    assert all(c.isprintable() or c == "\n" for c in text) and len(text.split("\n")) == 2
