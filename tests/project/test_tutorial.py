"""docs/tutorial.md tells the truth: its commands run, and what it says about their output is what they print and
write today.

Each step's commands are taken as the tutorial shows them (the test fails if the text no longer holds them), run
with ``runs/`` moved into a temporary folder, and every output block and every figure the prose quotes is
checked against that run (or, for the CPU validation of step 6, against the committed measurement it cites and
the text's own table: measuring takes 70-90 s and gives figures that differ per machine). About 20 s of CPU in all
(30-50 s of wall time on a busy 2-core VM).
"""

from __future__ import annotations

import csv
import json
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.support.paths import ROOT

TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text()
CALIBRATION = "docs/validation/cpu-vm-2026-11-30-f/calibration.yaml"  # committed from the VM kind of step 6
STEP7_ARCHIVE = "docs/validation/h200-2026-11-30-s3-xxl/gpu-check.tar.gz"


# ------------------------------------------------------------------------------------------------ the text
def section(title_start: str) -> str:
    """The text of the tutorial's section whose ``## `` heading starts with ``title_start`` (up to the next)."""
    parts = re.split(r"^## ", TUTORIAL, flags=re.M)
    found = [p for p in parts if p.startswith(title_start)]
    assert len(found) == 1, f"the tutorial has no single section '## {title_start}'"
    return found[0]


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of ``text``, in order."""
    return [(m.group(1).strip(), m.group(2)) for m in re.finditer(r"^ *```(\w*)\n(.*?)^ *```", text, re.M | re.S)]


def output_after(text: str, command: str) -> list[str]:
    """The lines of the first plain (output) block after the shell block holding ``command``."""
    seen = False
    for lang, body in blocks(text):
        if lang == "sh" and command in body:
            seen = True
        elif seen and lang == "":
            return body.splitlines()
    raise AssertionError(f"no output block after {command!r}")


def prose(text: str) -> str:
    """``text`` without its fenced blocks, lines joined (a phrase may wrap)."""
    return " ".join(re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S).split())


# ------------------------------------------------------------------------------------------------ the runs
@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The folder that stands for ``runs/``."""
    return tmp_path_factory.mktemp("tutorial")


_CACHE: dict = {}


def run(command: str, runs: Path, extra: str = "") -> str:
    """Run one tutorial command (it must be in the tutorial as written), ``runs/`` moved to ``runs``; its stdout
    and stderr, with the folder written back as ``runs/`` (once per command and module)."""
    assert command in TUTORIAL, f"the tutorial no longer shows: {command}"
    key = (command, extra, str(runs))
    if key not in _CACHE:
        line = command.replace("runs/", f"{runs}/") + (" " + extra if extra else "")
        args = shlex.split(line)
        assert args[:2] in (["python", "-m"], ["python", "-c"]), command
        res = subprocess.run([sys.executable, *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{command}\n{res.stdout}\n{res.stderr}"
        _CACHE[key] = (res.stdout + res.stderr).replace(f"{runs}/", "runs/")
    return _CACHE[key]


def shown_lines_match(shown: list[str], actual: str, skip=()) -> None:
    """Every line the tutorial shows is a line of the output ("..." stands for lines left out, a line ending in
    " ..." for its own tail); lines starting with a ``skip`` word are not compared (wall times)."""
    lines = actual.splitlines()
    for line in shown:
        if line.strip() == "..." or line.strip().startswith(skip or ("\0",)):
            continue
        if line.endswith(" ..."):
            assert any(a.startswith(line[:-4]) for a in lines), f"no output line starts with: {line[:-4]}"
        else:
            assert line in lines, f"not in the output: {line}\n---\n{actual}"


def figures(text: str, pattern: str) -> list[str]:
    return re.findall(pattern, text)


# ------------------------------------------------------------------------------------------------ step 1
STATS = "python -m traces stats traces/data/switch_base_128_real_b8.npz"


def test_step1_trace_stats(runs):
    text = section("1. ")
    out = run(STATS, runs)
    shown_lines_match(output_after(text, STATS), out)
    words = prose(text)
    for x in figures(words, r"\b0\.\d{3}\b"):  # every three-decimal figure the prose quotes is printed
        assert x in out, x
    tokens, decode, requests = map(int, re.search(r"(\d+) tokens \((\d+) decode\) in (\d+) requests", out).groups())
    batch = 8  # the file's batch (b8)
    assert f"It holds {requests} requests in {requests // batch} static batches of {batch}" in words
    assert f"{(tokens - decode) // requests} prompt tokens" in words
    assert f"{decode // requests} generated tokens" in words
    rows = [r.split() for r in out.splitlines() if re.match(r"\s+\d+ (encoder|decoder) ", r)]
    for role in ("encoder", "decoder"):
        assert f"the {sum(r[1] == role for r in rows)} {role} MoE layers" in words
    skews = [float(r[2]) for r in rows if r[1] == "decoder"]
    assert f"skew {min(skews):.2f}-{max(skews):.2f}" in words
    skew = float(re.search(r"top 10% share\) (0\.\d+)", out).group(1))
    assert f"take {round(100 * skew)}% of the selections" in words


# ------------------------------------------------------------------------------------------------ step 2
RUN = "python -m sim run configs/switch_base_real.yaml --out runs/tutorial-diffmoe"
HOT = "python -m sim run configs/switch_base_real.yaml --set policy.params.fill=hot --out runs/tutorial-diffmoe-hot"


def _summary(runs: Path, name: str) -> dict:
    return json.loads((runs / name / "summary.json").read_text())


def test_step2_run_summary(runs):
    text = section("2. ")
    out = run(RUN, runs)
    shown = output_after(text, RUN)
    shown_lines_match(shown, out, skip=("simulator",))
    events = re.search(r"simulator +([\d,]+) events", "\n".join(shown)).group(1)
    assert f"simulator         {events} events" in out
    s = _summary(runs, "tutorial-diffmoe")
    words = prose(text)
    from sim.config.run_config import load_run_config

    cfg = load_run_config(ROOT / "configs/switch_base_real.yaml")
    assert f"{cfg.model.expert_bytes / 1e6:.1f} MB per expert" in words
    it = pd.read_csv(runs / "tutorial-diffmoe" / "iterations.csv")
    assert f"over the {int((it['kind'] == 'decode').sum()):,} decode iterations" in words
    assert f"The {int((it['kind'] == 'prefill').sum())} prefills" in words
    assert f"The link is busy {round(100 * s['link_busy_frac'])}% of the time" in words
    assert f"computes {round(100 * s['compute_busy_frac'])}% of the time" in words
    assert f"stalls for {s['stall_ms'] / 1e3:.1f} s of the {s['sim_time_s']:.1f} s" in words
    assert "runs/tutorial-diffmoe/ (config.resolved.yaml, summary.json, iterations.csv)" in out
    for name in ("config.resolved.yaml", "summary.json", "iterations.csv"):
        assert (runs / "tutorial-diffmoe" / name).is_file() and f"`{name}`" in text
    run(HOT, runs)
    hot = _summary(runs, "tutorial-diffmoe-hot")
    assert (
        f"Throughput rises to {hot['throughput_tok_s']:,.1f} tokens/s, with an HPC hit rate of "
        f"{hot['hit_rate']['hpc']:.3f} instead of {s['hit_rate']['hpc']:.3f}"
    ) in words


# ------------------------------------------------------------------------------------------------ step 3
COMPARE = (
    "python -m sim compare configs/switch_base_real.yaml --policies on-demand,pregated@oracle,lru,diffmoe,"
    "moe-infinity@moe-infinity,belady --out runs/tutorial-compare"
)


def md_table(lines) -> list[dict]:
    """The rows of the markdown table in ``lines`` as {header: cell}."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
    head = rows[0]
    return [dict(zip(head, r)) for r in rows[2:]]


def test_step3_compare(runs):
    text = section("3. ")
    run(COMPARE, runs)
    for name in ("compare.md", "compare.csv"):
        assert (runs / "tutorial-compare" / name).is_file() and f"`{name}`" in text
    actual = md_table((runs / "tutorial-compare" / "compare.md").read_text().splitlines())
    shown = md_table(output_after(text, COMPARE))
    assert [r["policy"] for r in shown] == [r["policy"] for r in actual]
    for want, got in zip(shown, actual):
        assert set(want) <= set(got), f"columns the output no longer has: {set(want) - set(got)}"
        assert want == {k: got[k] for k in want}, want["policy"]
    by = {r["policy"]: r for r in csv.DictReader((runs / "tutorial-compare" / "compare.csv").open())}
    words = prose(text)
    pre = by["pregated"]
    assert (
        f"{round(100 * float(pre['prefetch_hit_rate']))}% of Pre-gated's expert accesses are prefetched, yet "
        f"it gains only {round(100 * (float(pre['ratio_vs_baseline']) - 1))}%"
    ) in words
    from sim.config.run_config import load_run_config

    cfg = load_run_config(ROOT / "configs/switch_base_real.yaml")
    assert f"the same {cfg.cache.hpc_slots + cfg.cache.mpc_slots} slots per layer" in words
    assert "lru and moe-infinity** come within 0.01 of the bound" in words
    assert max(float(by[p]["gap_to_belady"]) for p in ("lru", "moe-infinity")) < 0.0105
    d = by["diffmoe"]
    assert f"trails the bound by {float(d['gap_to_belady']):.2f} in cache hits" in words
    assert f"Its {float(d['ratio_vs_baseline']):.2f}x over on-demand" in words
    paper = (ROOT / "docs" / "paper_reproduction.md").read_text()
    assert "2.74x" in paper and "2.67" in paper and "2.83" in paper
    md_lines = (runs / "tutorial-compare" / "compare.md").read_text().splitlines()
    notes = [line for line in output_after(text, COMPARE) if line and not line.startswith("|")]
    assert len(notes) == 2 and all(line in md_lines for line in notes)  # the lines under the table, as printed
    lru = by["lru"]
    assert f"lru's {float(lru['hit_rate']):.3f} may exceed the bound's {float(lru['belady_cache_hit_rate']):.3f}" in (
        words
    )
    assert float(lru["hit_rate"]) > float(lru["belady_cache_hit_rate"]) >= float(lru["cache_hit_rate"])
    assert f"lru's {float(lru['iteration_ms_mean']):.4g} ms per iteration" in words
    assert by["on-demand"]["uses_predictor"] == "False" and "`on-demand` shows `-`" in words


# ------------------------------------------------------------------------------------------------ step 4
TIMELINE = (
    "python -m sim run configs/switch_base_real.yaml --set workload.requests=8 --timeline --out runs/tutorial-timeline"
)


def _events(runs: Path):
    run(TIMELINE, runs)
    path = runs / "tutorial-timeline" / "timeline.json"
    data = json.loads(path.read_text())["traceEvents"]
    return path, data, sorted((e for e in data if e.get("ph") == "X"), key=lambda e: e["ts"])


def test_step4_timeline(runs):
    text = section("4. ")
    words = prose(text)
    path, data, events = _events(runs)
    assert f"keeps the file small ({path.stat().st_size / 1e6:.0f} MB)" in words
    tracks = sorted(e["args"]["name"] for e in data if e.get("name") == "thread_name")
    assert tracks == ["compute stream", "copy stream"] and "has two tracks" in words
    names = {e["name"] for e in events}
    for quoted in re.findall(r"`((?:L\d+ (?:dense|E\d+ \w+))|lm head)`", text):
        assert quoted in names, quoted
    it = pd.read_csv(runs / "tutorial-timeline" / "iterations.csv")
    start = float(it[it["kind"] == "decode"]["start_ms"].iloc[0])
    assert f"Zoom into the first decode iteration, at {start:.1f} ms" in words
    after = [e for e in events if e["ts"] >= start * 1e3 - 1e-3]
    end = float(it[it["kind"] == "decode"]["end_ms"].iloc[0])
    first = [e["name"].split() for e in after if e["ts"] < end * 1e3 and re.fullmatch(r"L\d+ E\d+ \w+", e["name"])]
    assert "0-5 are the encoder and 6-11 the decoder" in words
    per_layer = {int(n[0][1:]): {x[1] for x in first if x[0] == n[0]} for n in first}
    assert sorted(per_layer) == list(range(6, 12)) and {len(v) for v in per_layer.values()} <= {1, 2}
    assert "each decoder layer needs one or two experts, and none is cached yet" in words
    assert not [n for n in first if n[2] in ("hpc", "mpc")]  # every expert of the first step comes by a copy
    dense = next(e for e in after if e["name"] == "L6 dense")
    demand = next(e for e in after if e["name"].startswith("L6 E") and e["name"].endswith("demand"))
    expert = demand["name"].split()[1]
    copied = next(e for e in after if e["name"] == f"L6 {expert} copied")
    prefetch = next(e for e in after if e["name"].startswith("L7 E") and e["name"].endswith("prefetch"))
    dense7 = next(e for e in after if e["name"] == "L7 dense")
    assert f"At {demand['ts'] / 1e3:.2f} ms, `L6 dense` ({dense['dur']:.0f} µs) has finished" in words
    assert demand["ts"] >= dense["ts"] + dense["dur"] - 1e-3
    assert f"`L6 {expert} demand` starts on the copy stream. It takes {demand['dur']:.0f} µs" in words
    assert f"it computes for {copied['dur']:.0f} µs (`L6 {expert} copied`)" in words
    assert copied["ts"] == pytest.approx(demand["ts"] + demand["dur"], abs=1e-3)
    assert prefetch["ts"] == pytest.approx(copied["ts"], abs=1e-3)
    assert f"At the same moment `{prefetch['name']}` starts" in words
    stall = prefetch["ts"] + prefetch["dur"] - (dense7["ts"] + dense7["dur"])
    m = re.search(r"every layer stalls for about (\d+) µs", words)
    assert m and abs(int(m.group(1)) - stall) <= 10, stall
    s = _summary(runs, "tutorial-timeline")
    assert f"the link is busy {round(100 * s['link_busy_frac'])}% of the time in step 2" in words
    # step 3's prose quotes the same copy and dense times
    assert (
        f"takes about {demand['dur'] / 1e3:.2f} ms to copy, and a layer's dense work takes about "
        f"{dense['dur'] / 1e3:.1f} ms" in prose(section("3. "))
    )


# ------------------------------------------------------------------------------------------------ step 5
SWEEP = "python -m sim sweep configs/sweeps/ci.yaml --out runs/tutorial-sweep"


def test_step5_sweep(runs):
    text = section("5. ")
    words = prose(text)
    out = run(SWEEP, runs)
    shown = output_after(text, SWEEP)
    normal = [re.sub(r"on \d+ worker\(s\)", "on N worker(s)", x) for x in (out.splitlines() + ["\0"])]
    for line in shown:
        assert re.sub(r"on \d+ worker\(s\)", "on N worker(s)", line) in normal, line
    spec = yaml.safe_load((ROOT / "configs/sweeps/ci.yaml").read_text())
    assert (
        f"with {spec['set']['workload.requests']} requests and {spec['set']['workload.max_decode_tokens']} "
        f"decode tokens each"
    ) in words
    grid, zipped = spec["grid"], spec["zip"]
    batches = " and ".join(map(str, grid["workload.batch_size"]))
    assert f"It crosses {len(grid['policy.name'])} policies with batch {batches}" in words
    pairs = ", ".join(f"({h}, {m})" for h, m in zip(zipped["cache.hpc_slots"], zipped["cache.mpc_slots"]))
    assert f"(HPC, MPC) = {pairs}" in words
    report = (runs / "tutorial-sweep" / "report.md").read_text()
    for check in spec["checks"]:
        state = "not applicable (gpu-only does not fit" if check == "gpu_only_ceiling" else "passed"
        assert f"`{check}`: {state}" in report and f"`{check}`" in words
    df = pd.read_parquet(runs / "tutorial-sweep" / "results.parquet")
    misfit = df[df["status"] == "does not fit"]
    assert set(misfit["policy.name"]) == {"gpu-only"} and len(misfit) == 6 and misfit["throughput_tok_s"].isna().all()
    said = {b: misfit[misfit["workload.batch_size"] == b]["error"].iloc[0].split("): ")[0] + ")" for b in (1, 8)}
    assert f"Their rows say `{said[1]}` ({said[8].split('(')[1].split(' >')[0]} at batch 8" in words
    described = dict(re.findall(r"^- `([\w.]+\.png)`: (.*)$", report, re.M))
    assert set(described) == {
        "throughput_vs_cache_slots.png",
        "throughput_vs_workload_batch_size.png",
        "hit_rate_per_tier.png",
    }
    bullets = {m.group(1): m.group(2) for m in re.finditer(r"\*\*`([\w.]+\.png)`\*\*: (.*?)(?= - \*\*`|$)", words)}
    for png in ("throughput_vs_cache_slots.png", "throughput_vs_workload_batch_size.png"):
        *_, title, scale = described[png].split("; ")
        assert f"on a {scale.replace(' scale', '')} scale" in bullets[png], png
        assert f"`{title}`" in bullets[png], png
    title = described["hit_rate_per_tier.png"].split("; ")[-1]
    assert f"`{title}`" in bullets["hit_rate_per_tier.png"]
    batch = int(re.search(r"; batch (\d+);", described["throughput_vs_cache_slots.png"]).group(1))
    at = df[(df["workload.batch_size"] == batch) & (df["status"] == "ok")]
    belady = at[at["policy.name"] == "belady"].sort_values("cache_slots")
    best = belady["throughput_tok_s"].max()
    first = belady[belady["throughput_tok_s"] >= best * (1 - 1e-9)]
    assert (first["hit_rate"] == 1).all()  # where it levels off, every expert it needs is cached
    slots = first["cache_slots"].iloc[0]
    assert f"belady levels off at {slots:g} slots" in bullets["throughput_vs_cache_slots.png"]
    assert "gpu-only has no line (it does not fit)" in words and "gpu-only" not in set(at["policy.name"])
    assert at.groupby("policy.name")["throughput_tok_s"].nunique()["on-demand"] == 1
    pivot = next(line for _, body in blocks(text) for line in body.splitlines() if line.startswith("python -c"))
    table = run(pivot, runs)
    assert all(p in table for p in grid["policy.name"] if p != "gpu-only") and "gpu-only" not in table


# ------------------------------------------------------------------------------------------------ step 6
def test_step6_text_agrees_with_itself_and_the_committed_measurement():
    """Not run (70-90 s, machine-dependent figures): the quoted run's lines agree with its table and its median,
    the configurations and counts are the suite's, and the figures cited from a committed folder are its."""
    from validate.cli import build_parser
    from validate.suites import SUITES

    text = section("6. ")
    words = prose(text)
    suite = SUITES["cpu"]
    assert (
        f"`--quick` measures {len(suite.quick)} configurations of the CPU suite for {suite.quick_decode_tokens} "
        f"decode steps each, in {build_parser().parse_args(['cpu', '--out', 'x']).rounds} "
        "interleaved rounds"
    ) in words
    assert (
        f"measures all {len(suite.points)} configurations of the suite (the host-CPU and quantized ones "
        f"included) for {suite.decode_tokens} decode steps each"
    ) in words
    table_block = next(body for lang, body in blocks(text) if body.startswith("| config |"))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table_block.splitlines()[1:]]
    assert [r[0] for r in rows] == list(suite.quick)
    log = next(body for lang, body in blocks(text) if "median |error|" in body)
    for m in re.finditer(r"\[\d+/\d+\] ([\w-]+): real ([\d.]+) ms, sim ([\d.]+) ms \(([+-][\d.]+)%\)", log):
        row = next(r for r in rows if r[0] == m.group(1))
        assert (row[1], row[2], row[3]) == (m.group(2), m.group(3), m.group(4) + "%")
    med = re.search(r"mean latency ([\d.]+)%, p50 ([\d.]+)%, throughput ([\d.]+)% over (\d+)", log)
    assert int(med.group(4)) == len(rows)
    for column, quoted in ((3, med.group(1)), (6, med.group(2)), (9, med.group(3))):
        assert statistics.median(abs(float(r[column].rstrip("%"))) for r in rows) == pytest.approx(
            float(quoted), abs=0.051
        )
    committed = {
        r["config"]: r for r in csv.DictReader((ROOT / "docs/validation/cpu-vm-2026-11-30-f/compare.csv").open())
    }["on-demand-b4"]
    assert (
        f"`real_copy_ms` / `sim_copy_ms`: {float(committed['real_copy_ms']):.2f} / "
        f"{float(committed['sim_copy_ms']):.2f} ms for on-demand-b4"
    ) in words
    assert (
        f"({float(committed['real_host_busy_ms']):.1f} of {float(committed['real_mean_ms']):.1f} ms for "
        f"on-demand-b4 in that run)"
    ) in words
    readme = (ROOT / "docs/validation/README.md").read_text()
    full = [float(m) for m in re.findall(r"^\| `cpu-vm-[\w-]+/` \|[^|]*\| 8 \(3 rounds\) \| ([\d.]+)%", readme, re.M)]
    assert full and f"a median of {min(full)}-{max(full)}%" in words


# ------------------------------------------------------------------------------------------------ step 7
def test_step7_h200_archive(runs):
    text = section("7. ")
    words = prose(text)
    copy = next(body for lang, body in blocks(text) if lang == "sh" and "mkdir -p runs/h200" in body)
    assert copy.splitlines()[0] == f"mkdir -p runs/h200 && cp {STEP7_ARCHIVE} runs/h200/"
    (runs / "h200").mkdir(exist_ok=True)
    (runs / "h200" / "gpu-check.tar.gz").write_bytes((ROOT / STEP7_ARCHIVE).read_bytes())
    compare = "python -m validate compare runs/h200/gpu-check.tar.gz"
    out = run(compare, runs)
    shown_lines_match(output_after(text, compare), out)
    rows = list(csv.DictReader((runs / "h200" / "gpu-check" / "compare" / "compare.csv").open()))
    errors = [abs(float(r["err_mean_pct"])) for r in rows]
    assert f"The median error is {statistics.median(errors):.1f}%" in words
    worst = max(rows, key=lambda r: abs(float(r["err_mean_pct"])))
    assert worst["policy"] == "moe-infinity" and "The largest is moe-infinity's" in words
    assert f"its decisions took {float(worst['real_decide_ms']):.1f} ms per iteration" in words
    manifest = json.loads((runs / "h200" / "gpu-check" / "manifest.json").read_text())
    assert "H200" in json.dumps(manifest.get("device")) and "Switch-XXL bf16 experts on an H200" in words


# ------------------------------------------------------------------------------------------------ step 8
HOST = (
    "python -m sim compare configs/gpt_oss_20b.yaml --policies lru,fiddler,ktransformers,hybrid-cache "
    "--set workload.requests=8 --set workload.max_decode_tokens=64 --set predictor=none"
)


def _host_rows(runs: Path, hardware: str) -> dict:
    command = HOST + ("" if hardware == "h200" else f" --set hardware={hardware}")
    run(command, runs, extra=f"--out {runs}/host-{hardware}")
    return {r["policy"]: r for r in csv.DictReader((runs / f"host-{hardware}" / "compare.csv").open())}


def test_step8_host_cpu(runs):
    words = prose(section("8. "))
    server, desktop = _host_rows(runs, "h200"), _host_rows(runs, "rtx4090")
    assert "cpu_expert_frac" in next(iter(server.values()))
    tok = {p: float(r["throughput_tok_s"]) for p, r in server.items()}
    ratio = tok["fiddler"] / tok["lru"]
    assert tok["ktransformers"] == pytest.approx(tok["fiddler"], rel=0.01)
    assert f"about {ratio:.1f}x faster than LRU ({tok['fiddler']:.0f} against {tok['lru']:.0f} tokens/s" in words
    from sim.config.run_config import load_run_config
    from sim.costs.costs import CostModel

    cfg = load_run_config(ROOT / "configs/gpt_oss_20b.yaml")
    assert f"at batch {cfg.workload.batch_size})" in words
    nbytes = cfg.model.expert_bytes
    read_us = nbytes / cfg.hardware.cpu_mem_bw * 1e6
    copy_us = CostModel(cfg.model, cfg.hardware, cfg.system).copy_s(nbytes) * 1e6
    m = re.search(r"expert's (\d+) MB from DDR5 in about (\d+) us; the copy takes about (\d+) us", words)
    assert m and int(m.group(1)) == round(nbytes / 1e6)
    assert abs(read_us - int(m.group(2))) <= 0.1 * int(m.group(2)), read_us
    assert abs(copy_us - int(m.group(3))) <= 0.1 * int(m.group(3)), copy_us
    d = {p: float(r["throughput_tok_s"]) for p, r in desktop.items()}
    assert f"the gain falls to {d['fiddler'] / d['lru']:.1f}x" in words
    assert max(d, key=d.get) == "hybrid-cache" and f"does best ({d['hybrid-cache']:.1f} tokens/s)" in words


# ------------------------------------------------------------------------------------------------ step 9
ADVISE = (
    "python -m sim advise configs/switch_base_real.yaml --set hardware=rtx4090 --requests 8 --quick "
    "--json runs/tutorial-advice.json"
)


def test_step9_advise(runs):
    text = section("9. ")
    out = run(ADVISE, runs)
    shown_lines_match(output_after(text, ADVISE), out)
    doc = json.loads((runs / "tutorial-advice.json").read_text())
    best, given = doc["best"], doc["config_tok_s"]
    words = prose(text)
    assert f"the same {best['tok_s']:,.1f} tokens/s" in words and f"{best['tok_s'] / given:.2f}x" in words
    assert [c["settings"]["policy.name"] for c in doc["left_out"]] == ["gpu-only"]
    from sim.config.run_config import load_run_config

    cfg = load_run_config(ROOT / "configs/switch_base_real.yaml", ["hardware=rtx4090"])
    m, c, slots = cfg.model, cfg.cache, best["settings"]["cache.hpc_slots"] + best["settings"]["cache.mpc_slots"]
    assert f"all {m.moe_layers * m.num_experts * m.expert_bytes / 1e9:.0f} GB of its fp32 experts" in words
    assert f"({m.moe_layers} layers of {slots} slots instead of {m.decoder_moe_layers} of " in words
    assert f"instead of {m.decoder_moe_layers} of {c.hpc_slots + c.mpc_slots})" in words
    reproduce = next(x for x in out.splitlines() if x.startswith("reproduce: "))[len("reproduce: ") :]
    res = subprocess.run(
        [sys.executable, *shlex.split(reproduce)[1:], "--json", "--out", str(runs / "tutorial-advised")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["throughput_tok_s"] == best["tok_s"]


# ------------------------------------------------------------------------------------------------ step 10
SERVE = (
    "python -m sim run configs/gpt_oss_20b.yaml --set workload.batching=continuous --set workload.batch_size=16 "
    "--set workload.max_decode_tokens=64 --set workload.requests=40 --set 'workload.arrivals={process: poisson, "
    "rate_per_s: 2}' --set 'workload.slo={ttft_s: 10, tpot_s: 0.15}' --timeline --out runs/tutorial-serving"
)


def _serving_study():
    """benchmarks/serving_capacity.py as a module (its commands and policies)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("serving_capacity", ROOT / "benchmarks" / "serving_capacity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step10_serving(runs):
    text = section("10. ")
    words = prose(text)
    out = run(SERVE, runs)
    shown_lines_match(output_after(text, SERVE), out)
    folder = runs / "tutorial-serving"
    rows = list(csv.DictReader((folder / "requests.csv").open()))
    assert len(rows) == 40 and all(r["prompt_tokens"] == "0" for r in rows)  # decode rows only, as the text says
    events = json.loads((folder / "timeline.json").read_text())["traceEvents"]
    lanes = {e["tid"] for e in events if e.get("pid") == 2 and e["ph"] == "X"}
    assert len(lanes) == 40 and {e["name"] for e in events if e.get("pid") == 2 and e["ph"] == "X"} <= {
        "queued",
        "decode",
    }
    s = _summary(runs, "tutorial-serving")
    busy = f"the link is busy {100 * s['link_busy_frac']:.1f}% of the time and the GPU computes"
    assert busy in words and f"computes {100 * s['compute_busy_frac']:.1f}% of it" in words


def test_step10_capacity_figures_are_the_committed_searches():
    """The searches take minutes: the text's commands are those benchmarks/serving_capacity.py ran into
    docs/serving/, and every figure the text quotes is in their JSON."""
    text = section("10. ")
    words = prose(text)
    study = _serving_study()
    docs = {}
    for name in study.POLICIES:
        shown = "python -m sim " + " ".join(study.command(name, Path("runs")))
        shown = shown.replace(f"runs/{name}.json", f"runs/capacity-{name}.json")
        assert shown in text, shown
        docs[name] = json.loads((ROOT / "docs" / "serving" / f"{name}.json").read_text())
        doc = docs[name]
        assert doc["check"]["holds"] and doc["bounded"] and not doc["above_saturation"], name
        assert f"{name} {doc['max_rate_per_s']:.2f} requests/s" in words, name
    d, lru, gpu = docs["diffmoe"], docs["lru"], docs["gpu-only"]
    assert f"{gpu['max_rate_per_s'] / d['max_rate_per_s']:.0f}x" in words
    assert f"{100 * (d['max_rate_per_s'] / lru['max_rate_per_s'] - 1):.1f}% more" in words
    at = {name: study.at_capacity(doc) for name, doc in docs.items()}
    assert f"link busy {100 * at['diffmoe']['link_busy_frac']:.1f}%" in words
    assert f"compute busy {100 * at['diffmoe']['compute_busy_frac']:.1f}%" in words
    assert f"compute busy {100 * at['gpu-only']['compute_busy_frac']:.1f}%" in words
    assert (ROOT / "docs" / "serving" / "compare.png").exists()


# ------------------------------------------------------------------------------------------------ where next
CALIBRATED = (
    "python -m sim run configs/switch_base_real.yaml --set hardware=runs/tutorial-val/calibration.yaml "
    "--out runs/tutorial-calibrated"
)


def test_where_next_calibrated_run(runs):
    """Step 6's calibration is not measured here: the committed one from the same VM kind stands in, as the
    text says."""
    words = prose(section("Where next"))
    assert CALIBRATED in TUTORIAL
    line = CALIBRATED.replace("runs/tutorial-val/calibration.yaml", CALIBRATION).replace("runs/", f"{runs}/")
    res = subprocess.run(
        [sys.executable, *shlex.split(line)[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    header = res.stdout.splitlines()[0]
    assert f"| hardware {CALIBRATION}, based on h200 |" in header
    assert "`hardware runs/tutorial-val/calibration.yaml, based on h200`" in words
    assert f"`--set hardware={CALIBRATION}`" in words
    s = _summary(runs, "tutorial-calibrated")
    assert (
        f"compute busy {100 * s['compute_busy_frac']:.1f}%, link busy {100 * s['link_busy_frac']:.1f}% and "
        f"{s['throughput_tok_s']:.1f} tokens/s"
    ) in words
