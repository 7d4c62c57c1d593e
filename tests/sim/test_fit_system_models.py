"""`sim fit-system` for a user's own figures: any model profile (a bundled name, or `--model` with a name or a
profile's path for rows that leave it blank; `--trace` for a model without a bundled trace), its `--help` lists
every column with what it holds, and the measured figure's column is `measured_tok_s` (`published_tok_s`, the
published rows' name, read as its alias)."""

from __future__ import annotations

import contextlib
import io

import pytest
import yaml

from moebase.errors import ConfigError
from sim.cli import build_parser, main
from sim.fit_system import COLUMN_ALIASES, COLUMN_HELP, COLUMNS, TRACES, read_rows
from tests.support.rows import row, write_rows

#: A llama.cpp row of Qwen3.5-35B-A3B on the RTX 4090 (blank cells: the flags'); figures made up, not measured.
QWEN35 = dict(system="llama.cpp", variant="n-cpu-moe=30", model="qwen3.5-35b-a3b", fmt=("q4_k_m", "q4_k_m"))


def _fit(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["fit-system", *args])
    return code, out.getvalue(), err.getvalue()


def test_help_lists_every_column_with_its_meaning_and_the_alias():
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices and "fit-system" in a.choices)
    text = sub.choices["fit-system"].format_help()
    assert set(COLUMN_HELP) == set(COLUMNS)
    for column in COLUMNS:
        assert any(line.split()[:1] == [column] and COLUMN_HELP[column][:30] in line for line in text.splitlines()), (
            column
        )
    for alias, column in COLUMN_ALIASES.items():
        assert alias in COLUMN_HELP[column] and alias in text
    assert "measured_tok_s" in COLUMNS and "published_tok_s" not in COLUMNS


def test_the_old_column_name_reads_as_the_new_one_and_both_at_once_are_refused(tmp_path):
    rows = [row("a"), row("b", role="predict", published="3.5")]
    new = read_rows(write_rows(tmp_path / "new.csv", rows))
    renamed = [{("published_tok_s" if k == "measured_tok_s" else k): v for k, v in r.items()} for r in rows]
    old_columns = [("published_tok_s" if c == "measured_tok_s" else c) for c in COLUMNS]
    old = read_rows(write_rows(tmp_path / "old.csv", renamed, old_columns))
    assert [(r.row, r.measured_tok_s, r.published_tok_s) for r in old] == [("a", 2.0, 2.0), ("b", 3.5, 3.5)]
    assert [r.measured_tok_s for r in new] == [r.measured_tok_s for r in old]
    with pytest.raises(ConfigError, match="names the column 'measured_tok_s .as measured_tok_s and published_tok_s"):
        read_rows(
            write_rows(
                tmp_path / "both.csv", [dict(r, published_tok_s="1") for r in rows], [*COLUMNS, "published_tok_s"]
            )
        )
    with pytest.raises(ConfigError, match="published_tok_s is blank but the row is a fit row"):
        read_rows(write_rows(tmp_path / "blank.csv", [dict(renamed[0], published_tok_s="")], old_columns))


def test_a_bundled_profile_without_a_published_row_is_fitted(tmp_path):
    """qwen3.5-35b-a3b, once refused ("model must be one of ..."): fitted on a llama.cpp row, the profile written
    loads, and its row is matched."""
    assert "qwen3.5-35b-a3b" in TRACES
    rows = write_rows(tmp_path / "mine.csv", [row("q", published="30", decode_tokens="8", **QWEN35)])
    out = tmp_path / "mine.yaml"
    code, printed, err = _fit(
        "--measured", str(rows), "--system", "llama.cpp", "--hardware", "rtx4090", "--out", str(out)
    )
    assert code == 0, err
    assert "| measured tok/s |" in printed and "| q | fitted | llama.cpp | rtx4090 | 30 | 30 |" in printed
    profile = yaml.safe_load(out.read_text())
    assert profile["base"] == "llama-cpp" and 0.01 <= profile["host_bw_fraction"] <= 1.0


def test_a_blank_model_takes_the_model_flag_a_profile_path_too(tmp_path):
    mine = tmp_path / "my-qwen.yaml"
    mine.write_text("base: qwen3.5-35b-a3b\n")
    cells = dict(QWEN35, model="")
    path = write_rows(tmp_path / "mine.csv", [row("q", published="30", decode_tokens="8", **cells)])
    with pytest.raises(ConfigError, match=r"row 2 \(q\): model is blank and no --model is given"):
        read_rows(path, "rtx4090")
    (r,) = read_rows(path, "rtx4090", default_model=str(mine))
    assert r.model == str(mine)
    code, printed, err = _fit(
        "--measured", str(path), "--system", "llama.cpp", "--hardware", "rtx4090", "--model", str(mine),
        "--out", str(tmp_path / "out.yaml"),
    )  # fmt: skip
    assert code == 0, err


def test_a_model_without_a_bundled_trace_needs_one_and_is_fitted_with_it(tmp_path):
    from tests.support.cli import traces_main

    path = write_rows(
        tmp_path / "olmoe.csv",
        [row("o", system="ktransformers", variant="", model="olmoe-1b-7b", fmt=("int8", "bf16"), decode_tokens="4")],
    )
    code, _, err = _fit(
        "--measured", str(path), "--system", "ktransformers", "--hardware", "rtx4090", "--out", "x.yaml"
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "model olmoe-1b-7b has no bundled trace" in err and "--trace" in err
    trace, other = tmp_path / "olmoe.npz", tmp_path / "other.npz"
    with contextlib.redirect_stdout(io.StringIO()):
        synth = ["synth", "--requests", "2", "--decode-len", "4,8", "--prompt-len", "1,2"]
        assert traces_main([*synth, "--model", "olmoe-1b-7b", "--experts", "64", "--top-k", "8", "--layers", "16",
                            "--out", str(trace)]) == 0  # fmt: skip
        assert traces_main([*synth, "--experts", "8", "--top-k", "2", "--layers", "2", "--out", str(other)]) == 0
    args = ["--measured", str(path), "--system", "ktransformers", "--hardware", "rtx4090"]
    code, _, err = _fit(*args, "--trace", str(trace), "--out", str(tmp_path / "kt.yaml"))
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "kt.yaml").read_text())["base"] == "ktransformers"
    code, _, err = _fit(*args, "--trace", str(other), "--out", str(tmp_path / "no.yaml"))
    assert code == 2 and err.startswith("error: --trace:") and "olmoe-1b-7b" in err, err
