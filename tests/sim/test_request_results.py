"""Per-request figures (sim/request_results.py) by their definitions, on requests written by hand: TTFT = first
token - arrival, TPOT = (finish - first token) / (output tokens - 1), E2E = finish - arrival; the SLO's attainment
and goodput; requests.csv's columns; the header's lines; and a run with arrivals writing requests.csv."""

from __future__ import annotations

import csv
import io
import json

import pytest

from sim.cli import main
from sim.config.serving import SloConfig
from sim.core.serving import RequestRecord
from sim.request_results import REQUEST_COLUMNS, request_summary, requests_csv, serving_lines, stats_s


def _rec(i, arrival, first, finish, out, prompt=4):
    return RequestRecord(i, i, arrival, prompt, out, arrival, first, first, finish)


RECS = [
    _rec(0, 0.0, 0.5, 2.5, 5),  # ttft 0.5, tpot 0.5, e2e 2.5
    _rec(1, 1.0, 1.2, 1.2, 1),  # ttft 0.2, no tpot, e2e 0.2
    _rec(2, 2.0, 4.0, 5.0, 3),  # ttft 2.0, tpot 0.5, e2e 3.0
    _rec(3, 3.0, 3.1, 3.1, 0, prompt=0),  # nothing to generate: no figure
]


def test_the_figures_follow_their_definitions():
    s = request_summary(RECS, None, 10.0)
    assert s["ttft_s"] == stats_s([0.5, 0.2, 2.0])
    assert s["tpot_s"]["mean"] == pytest.approx(0.5) and s["tpot_s"]["p99"] == pytest.approx(0.5)
    assert s["e2e_s"]["p50"] == pytest.approx(2.5)
    assert s["e2e_s"]["p90"] == pytest.approx(2.5 + 0.8 * 0.5)  # numpy's linear percentile of 0.2, 2.5, 3.0
    assert s["throughput_req_s"] == pytest.approx(0.4)
    assert "slo_attainment" not in s
    assert stats_s([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


@pytest.mark.parametrize(
    ("ttft", "tpot", "met"),
    [(1.0, None, 2), (1.0, 0.4, 1), (None, 0.5, 3), (0.1, None, 0), (3.0, 0.5, 3)],
)
def test_attainment_counts_the_requests_meeting_every_bound_given(ttft, tpot, met):
    s = request_summary(RECS, SloConfig(ttft, tpot), 10.0)
    assert s["slo_attainment"] == pytest.approx(met / 3)  # of the 3 requests with output tokens
    assert s["goodput_req_s"] == pytest.approx(met / 10.0)
    assert s["slo"] == {"ttft_s": ttft, "tpot_s": tpot}


def test_requests_csv_has_the_columns_and_every_request():
    rows = list(csv.DictReader(io.StringIO(requests_csv(RECS).decode())))
    assert list(rows[0]) == REQUEST_COLUMNS
    assert REQUEST_COLUMNS[:6] == [
        "request",
        "arrival_s",
        "first_token_s",
        "finish_s",
        "prompt_tokens",
        "output_tokens",
    ]
    assert [int(r["request"]) for r in rows] == [0, 1, 2, 3]
    assert float(rows[2]["first_token_s"]) == 4.0 and rows[2]["output_tokens"] == "3"


def test_the_header_lines():
    s = {"requests_served": 4, **request_summary(RECS, SloConfig(1.0, 0.4), 10.0)}
    text = "\n".join(serving_lines(s))
    assert "TTFT" in text and "TPOT" in text and "E2E" in text
    assert "ttft <= 1,000.0 ms, tpot <= 400.0 ms: attainment 0.333" in text
    assert serving_lines({"throughput_tok_s": 1.0}) == []


def test_a_run_with_arrivals_writes_requests_csv_and_prints_the_figures(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "configs/gpt_oss_20b.yaml",
            "--set",
            "workload.batching=continuous",
            "--set",
            "workload.batch_size=4",
            "--set",
            "workload.requests=6",
            "--set",
            "workload.max_decode_tokens=3",
            "--set",
            "workload.arrivals={process: poisson, rate_per_s: 20}",
            "--set",
            "workload.slo={ttft_s: 0.5}",
            "--set",
            "predictor.name=none",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "TTFT" in printed and "SLO" in printed and "requests.csv" in printed
    rows = list(csv.DictReader((out / "requests.csv").open()))
    summary = json.loads((out / "summary.json").read_text())
    assert len(rows) == 6 == summary["requests_served"]
    assert summary["ttft_s"]["mean"] == pytest.approx(
        sum(float(r["first_token_s"]) - float(r["arrival_s"]) for r in rows) / 6, abs=1e-8
    )
    # without arrivals: no requests.csv, no serving figures
    plain = tmp_path / "plain"
    assert main(["run", "configs/gpt_oss_20b.yaml", "--set", "workload.requests=1", "--out", str(plain)]) == 0
    assert not (plain / "requests.csv").exists()
    assert "ttft_s" not in json.loads((plain / "summary.json").read_text())
