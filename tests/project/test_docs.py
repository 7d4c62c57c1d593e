"""The documentation stays true to the command lines, and the repository stands on its own.

- Every command shown in a shell block (```sh) of ``README.md``, ``docs/tutorial.md`` and ``docs/architecture.md``
  parses with the real argument parsers: ``python -m sim|traces|validate ...`` lines (also ``.venv/bin/python -m``)
  must name sub-commands and flags that exist (``--set`` paths must be config fields, ``--policies`` entries
  registered policies and predictors); ``python SCRIPT`` and ``bash SCRIPT`` must name files of the repository,
  ``make TARGET`` a rule of the Makefile; bundled paths (``configs/...``, ``traces/data/...``, ``docs/...``) named
  by any command must exist. Nothing is run.
- No file of the repository points at ``../shared`` (a folder beside the steering checkout that a user's clone
  does not have), except the tests that read real data from it and skip without it, and the README's one sentence
  saying so; no file points at an absolute path of the machine it was written on (``/work/...``, ``/root/...``,
  ``/home/NAME/...``), but the recorded measurements of ``docs/validation/`` quoting their machine's paths and the
  tests that use such paths as data.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import ROOT

DOCS = ("README.md", "docs/tutorial.md", "docs/architecture.md")
SHELL_BLOCKS = ("sh", "bash", "shell", "console")
PYTHONS = ("python", "python3", ".venv/bin/python")
#: argument prefixes that name files shipped in the repository (checked to exist unless they hold a placeholder)
BUNDLED = ("configs/", "traces/data/", "benchmarks/", "validate/", "docs/")
PLACEHOLDER = re.compile(r"[A-Z]{3,}|[*?]")  # NAME, FILE, COMMIT, or a glob


# ------------------------------------------------------------------------------------------------ extraction
def shell_blocks(text: str):
    """(line number, line) of every line inside a shell code block; backslash continuations joined."""
    out, in_block, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = line.strip()
        if fence.startswith("```"):
            if in_block:
                in_block = False
            else:
                in_block = fence[3:].strip().lower() in SHELL_BLOCKS
            continue
        if not in_block:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def split_commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line: comments dropped, split at ``&&``, ``||``, ``;``, ``|``; leading
    ``VAR=value`` assignments dropped; the ``[ ]`` of optional arguments (``[--json]``) stripped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, current = [], []
    for token in lexer:
        if token and set(token) <= set("&|;()<>"):
            if current:
                commands.append(current)
            current = []
            continue
        current.append(token)
    if current:
        commands.append(current)
    out = []
    for tokens in commands:
        while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
            tokens = tokens[1:]
        tokens = [t.strip("[]") for t in tokens]
        tokens = [t for t in tokens if t]
        if tokens and tokens[0] not in (".", "source"):
            out.append(tokens)
    return out


def doc_commands(relpath: str) -> list[tuple[str, str, list[str]]]:
    """(where, line, tokens) of every command in the shell blocks of a document."""
    text = (ROOT / relpath).read_text(encoding="utf-8")
    out = []
    for number, line in shell_blocks(text):
        for tokens in split_commands(line):
            out.append((f"{relpath}:{number}", line.strip(), tokens))
    return out


# ------------------------------------------------------------------------------------------------- checking
@functools.cache
def parser(package: str):
    if package == "sim":
        from sim.cli import build_parser
    elif package == "traces":
        from traces.cli import build_parser
    else:
        from validate.cli import build_parser
    return build_parser()


def _subparsers(p):
    import argparse

    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return None


def _check_help(p, args: list[str]) -> str | None:
    """``... --help``: the sub-commands before it exist, and so do the flags."""
    for tok in args[: args.index("--help") if "--help" in args else args.index("-h")]:
        if tok.startswith("-"):
            if tok.split("=", 1)[0] not in p._option_string_actions:
                return f"unknown option {tok}"
            continue
        choices = _subparsers(p)
        if choices is not None:
            if tok not in choices:
                return f"unknown command {tok!r} (known: {', '.join(choices)})"
            p = choices[tok]
    return None


def _check_sim_values(ns) -> str | None:
    """What argparse leaves unchecked in a ``sim`` command: ``--set`` paths and ``--policies`` names."""
    from moebase.errors import ConfigError
    from sim.config.run_config import apply_override

    for text in getattr(ns, "set", None) or []:
        try:
            apply_override({}, text)
        except ConfigError as exc:
            return f"--set {text}: {exc}"
    if getattr(ns, "policies", None):
        from sim.compare import parse_entries

        try:
            parse_entries(ns.policies)
        except ConfigError as exc:
            return str(exc)
    return None


def _bundled(tokens: list[str]) -> str | None:
    for tok in tokens:
        value = tok.split("=", 1)[1] if tok.startswith("--") and "=" in tok else tok
        if value.startswith(BUNDLED) and not PLACEHOLDER.search(value) and not (ROOT / value).exists():
            return f"{value}: no such file in the repository"
    return None


def problem(tokens: list[str]) -> str | None:
    """Why a documented command would not run as written (None: it parses), or None for commands not checked."""
    if not tokens:
        return None
    if tokens[0] in PYTHONS and len(tokens) >= 3 and tokens[1] == "-m" and tokens[2] in ("sim", "traces", "validate"):
        package, args = tokens[2], tokens[3:]
        p = parser(package)
        if "--help" in args or "-h" in args:
            return _check_help(p, args)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                ns = p.parse_args(args)
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "argparse refused it"
        if package == "sim":
            bad = _check_sim_values(ns)
            if bad:
                return bad
        return _bundled(args)
    if tokens[0] in PYTHONS and len(tokens) >= 2 and tokens[1].endswith(".py"):
        if not (ROOT / tokens[1]).is_file():
            return f"{tokens[1]}: no such script in the repository"
        return _bundled(tokens[2:])
    if tokens[0] == "bash" and len(tokens) >= 2:
        if not (ROOT / tokens[1]).is_file():
            return f"{tokens[1]}: no such script in the repository"
        return None
    if tokens[0] == "make":
        rules = re.findall(r"^([A-Za-z0-9_.-]+)\s*:", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
        unknown = [t for t in tokens[1:] if "=" not in t and not t.startswith("-") and t not in rules]
        return f"make: no rule for {', '.join(unknown)}" if unknown else None
    return _bundled(tokens[1:])


def all_commands():
    out = []
    for relpath in DOCS:
        if (ROOT / relpath).exists():
            out += doc_commands(relpath)
    return out


COMMANDS = all_commands()


@pytest.mark.parametrize("where,line,tokens", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_documented_command_parses(where, line, tokens):
    bad = problem(tokens)
    assert bad is None, f"{where}: `{line}` does not run as documented: {bad}"


@pytest.mark.parametrize("relpath", DOCS)
def test_documents_show_commands(relpath):
    """Each document exists and its shell blocks hold the three command lines (extraction finds them)."""
    assert (ROOT / relpath).exists(), f"{relpath} is missing"
    found = {tuple(t[:3]) for _, _, t in doc_commands(relpath) if len(t) >= 3}
    packages = {t[2] for t in found if t[0] in PYTHONS and t[1] == "-m"}
    assert {"sim", "traces", "validate"} <= packages, f"{relpath}: commands found for {sorted(packages)} only"


@pytest.mark.parametrize(
    "line",
    [
        "python -m sim run configs/switch_xxl.yaml --no-such-flag",
        "python -m sim runn configs/switch_xxl.yaml",
        "python -m sim compare configs/switch_xxl.yaml --policies lru,no-such-policy",
        "python -m sim compare configs/switch_xxl.yaml --policies lru@no-such-predictor",
        "python -m sim run configs/switch_xxl.yaml --set workload.no_such_field=1",
        "python -m sim run configs/no_such_config.yaml",
        "python -m sim sweep configs/sweeps/ci.yaml --executor slurm",
        "python -m traces stats he.npz --no-such-flag",
        "python -m traces no-such-command x",
        "python -m validate cpu --quick",  # --out is required
        "python -m validate no-such-command --help",
        ".venv/bin/python -m validate compare DIR --max-median-error ten",
        ".venv/bin/python benchmarks/no_such_bench.py",
        "bash validate/no_such_script.sh",
        "make no-such-target",
        "cp docs/validation/no-such-folder/gpu-check.tar.gz runs/h200/",
    ],
)
def test_checker_rejects_bad_commands(line):
    """The check can fail: each of these is caught."""
    commands = split_commands(line)
    assert len(commands) == 1
    assert problem(commands[0]) is not None, line


def test_extraction():
    text = "\n".join(
        [
            "```sh",
            ". .venv/bin/activate",
            "python -m sim run configs/switch_xxl.yaml --json   # a comment --no-such-flag",
            "python -m validate cpu --out runs/v && python -m validate compare runs/v",
            "python -m traces stats he.npz [--json]",
            'LIMIT_S=150 EXTRA="--suite cpu" bash validate/run_gpu_check.sh --pack OUT',
            "python -m traces synth --experts 8 \\",
            "    --out s.npz",
            "```",
            "python -m sim run --not-in-a-block",
        ]
    )
    cmds = [t for _, line in shell_blocks(text) for t in split_commands(line)]
    assert cmds == [
        ["python", "-m", "sim", "run", "configs/switch_xxl.yaml", "--json"],
        ["python", "-m", "validate", "cpu", "--out", "runs/v"],
        ["python", "-m", "validate", "compare", "runs/v"],
        ["python", "-m", "traces", "stats", "he.npz", "--json"],
        ["bash", "validate/run_gpu_check.sh", "--pack", "OUT"],
        ["python", "-m", "traces", "synth", "--experts", "8", "--out", "s.npz"],
    ]
    assert all(problem(c) is None for c in cmds)


# -------------------------------------------------------------------------------------- outside the repository
OUTSIDE = "../shared"


def repository_files() -> list[str]:
    """Tracked files and new ones not ignored (``git ls-files``), or a walk when git is not at hand."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        return sorted({p for p in out.decode().split("\0") if p})
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".hypothesis", "build"}
        files = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in skip and not d.endswith(".egg-info")]
            files += [str((Path(dirpath) / f).relative_to(ROOT)) for f in filenames]
        return sorted(files)


def read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def sentences(text: str) -> list[str]:
    flat = re.sub(r"\s+", " ", text)
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", flat)


def outside_mentions(relpath: str, text: str) -> list[str]:
    """Sentences of ``text`` that point at ``../shared`` and are not allowed to."""
    bad = [s for s in sentences(text) if OUTSIDE in s]
    if relpath == "README.md":
        allowed = [s for s in bad if re.search(r"\btests?\b", s, re.I) and "skip" in s]
        if len(allowed) == 1:  # the one sentence about the optional real-trace tests
            bad.remove(allowed[0])
    return bad


def test_nothing_points_outside_the_repository():
    files = repository_files()
    assert "README.md" in files and "sim/timing/engine.py" in files
    offenders = []
    for relpath in files:
        if relpath.startswith("tests/"):
            continue
        text = read_text(ROOT / relpath)
        if text is None or OUTSIDE not in text:
            continue
        for s in outside_mentions(relpath, text):
            at = s.index(OUTSIDE)
            offenders.append(f"{relpath}: ...{s[max(0, at - 80) : at + 60]}...")
    assert not offenders, "files that point outside the repository:\n" + "\n".join(offenders)


#: A path into the machine a file was written on, which a clone elsewhere does not have.
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|root|home/[a-z_][\w-]*)/[\w./-]*")
#: How a test module reaches the folder beside the repository: ``ROOT.parent / "shared"``, or the helper of
#: tests/support/paths.py (``../shared`` in prose or in an assertion about text reads nothing).
REACHES_SHARED = re.compile(r"parents?(?:\[\d\])?\s*/\s*\"shared\"|\bSHARED_TRACES\b")
#: Recorded measurements (archives unpacked in docs/validation/NAME/): their files and notes quote the measuring
#: machine's paths as data.
RECORDED = re.compile(r"docs/validation/[^/]+/")


def machine_paths(relpath: str, text: str) -> list[str]:
    """Absolute paths of a machine in ``text`` that a file of the repository may not hold (tests may use them as
    data: what a path points at is never read there; recorded measurements quote their machine's)."""
    if relpath.startswith("tests/") or RECORDED.match(relpath):
        return []
    return MACHINE_PATH.findall(text)


def reaches_shared_without_skipping(relpath: str, text: str) -> bool:
    """A test module (or test helper) that reads from the folder beside the repository without skipping when it is
    absent (pytest.skip with a reason, a skipif, or an importorskip)."""
    if not relpath.startswith("tests/") or relpath in ("tests/project/test_docs.py", "tests/support/paths.py"):
        return False  # this check, and where the folder is named
    if not REACHES_SHARED.search(text):
        return False
    return not re.search(r"pytest\.skip\(|skipif\(|importorskip\(", text)


def test_nothing_points_at_the_machine_it_was_written_on():
    offenders = []
    for relpath in repository_files():
        text = read_text(ROOT / relpath)
        if text is None:
            continue
        offenders += [f"{relpath}: {p}" for p in machine_paths(relpath, text)]
        if reaches_shared_without_skipping(relpath, text):
            offenders.append(f"{relpath}: reads the folder beside the repository (../shared) without skipping")
        elif not relpath.startswith("tests/") and REACHES_SHARED.search(text):
            offenders.append(f"{relpath}: reads the folder beside the repository (../shared)")
    assert not offenders, "files that point outside the repository:\n" + "\n".join(offenders)


def test_machine_path_check_can_fail():
    assert machine_paths("docs/x.md", "measured in /work/main/runs/val") == ["/work/main/runs/val"]
    assert machine_paths("sim/x.py", "# see /root/notes/issue.txt") == ["/root/notes/issue.txt"]
    assert machine_paths("README.md", "copy `~/.ray/auth_token`; outputs under runs/x/work/") == []
    assert machine_paths("tests/sim/test_x.py", 'Path("/home/me/project/x.npz")') == []
    assert machine_paths("docs/validation/h200-x/run.log", "cd /work/main/.clean") == []
    reads = 'DATA = ROOT.parent / "shared" / "traces"\n\ndef test_x():\n    load(DATA)\n'
    assert reaches_shared_without_skipping("tests/sim/test_x.py", reads)
    assert not reaches_shared_without_skipping("tests/sim/test_x.py", reads + '    pytest.skip("absent")\n')
    assert not reaches_shared_without_skipping("sim/x.py", reads)


#: A citation of the design brief the project was built from, which is not in the repository: its sections
#: ("DESIGN 2.5", "DESIGN section 6") or its file. The facts it gave are restated in docs/ and cited there.
CITES_THE_BRIEF = re.compile(r"\bDESIGN(?: section)? \d|DESIGN\.md|design brief|\bthe brief\b", re.I)


def brief_citations(text: str) -> list[str]:
    return [m.group(0) for m in CITES_THE_BRIEF.finditer(text)]


def test_no_file_cites_the_design_brief():
    offenders = []
    for relpath in repository_files():
        if relpath == "tests/project/test_docs.py":
            continue
        text = read_text(ROOT / relpath)
        for line_no, line in enumerate((text or "").splitlines(), 1):
            if brief_citations(line):
                offenders.append(f"{relpath}:{line_no}: {line.strip()[:120]}")
    assert not offenders, "files that cite the design brief (cite docs/ instead):\n" + "\n".join(offenders)


def test_brief_check_can_fail():
    assert brief_citations("pinned copies reach ~25 GB/s (DESIGN 2.5)") != []
    assert brief_citations("see DESIGN section 6") != []
    assert brief_citations("beyond the brief's summary") != [] and brief_citations("the design brief says") != []
    assert brief_citations("pinned copies reach ~25 GB/s (docs/architecture.md 5.1); a brief look") == []


def test_outside_check_can_fail():
    readme = (
        "Tests that use the real routing read `../shared/traces/` and skip with a reason when it is absent "
        "(a fresh clone has no `../shared`). Nothing downloads."
    )
    assert outside_mentions("README.md", readme) == []
    assert outside_mentions("README.md", readme + " Design: `../shared/DESIGN.md`.") != []
    assert outside_mentions("docs/architecture.md", readme) != []
    assert outside_mentions("sim/__init__.py", '"""A simulator (see ../shared/DESIGN.md)."""') != []


#: ``tests/...`` paths in backquotes, e.g. ```tests/sim/policies/test_policies.py```.
TEST_PATH = re.compile(r"`(tests/[\w/.-]*)`")


def missing_test_paths(text: str) -> list[str]:
    """The test files and folders ``text`` names that do not exist (``test_x.py`` is the README's placeholder)."""
    return [p for p in TEST_PATH.findall(text) if Path(p).stem != "test_x" and not (ROOT / p).exists()]


def test_every_test_path_the_documents_name_exists():
    """Tests move with the code they test: a document naming a test file names where it is now."""
    names = ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md")))]
    missing = [f"{n}: {p}" for n in names for p in missing_test_paths((ROOT / n).read_text(encoding="utf-8"))]
    assert not missing, "documents name test paths that do not exist:\n" + "\n".join(missing)


def test_missing_test_paths_can_fail():
    assert missing_test_paths("see `tests/test_engine.py` and `tests/reference/`") == ["tests/test_engine.py"]
    assert missing_test_paths("a test of `sim/core/x.py` is `tests/sim/core/test_x.py`") == []
