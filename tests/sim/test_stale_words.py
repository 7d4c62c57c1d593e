"""Words the simulator prints about what it read stay true (sim/listing.py, sim/results.py): `sim policies` shows every
description whole (wrapped, never cut, no "None" standing for a missing value), and a hardware file is said to be "based
on" a profile only when it names one as its base, never "based on" its own name."""

from __future__ import annotations

import pytest

from sim import listing
from sim.results import _own_name_and_base, hardware_words


def _description_blocks(text: str, section: str, indent: int) -> dict[str, str]:
    """name -> its description, its wrapped lines joined, from one section of the terminal listing."""
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"{section} ("))
    out: dict[str, list[str]] = {}
    name = ""
    for line in lines[start + 2 :]:
        if not line.startswith("  "):
            break
        if line.startswith("   "):
            assert line[:indent].strip() == "", line  # a next line stands under the description
            out[name].append(line[indent:])
            continue
        name = line.split()[0]
        out[name] = [line[indent:]]
    return {k: " ".join(v) for k, v in out.items()}


def test_sim_policies_shows_every_description_whole():
    policies, predictors = listing.policy_rows(), listing.predictor_rows()
    text = listing.format_listing(policies, predictors)
    w = max([len("policy")] + [len(p["name"]) for p in policies + predictors]) + 2
    shown = {
        **_description_blocks(text, "policies", 2 + w + 11 + 14),
        **{f"predictor {k}": v for k, v in _description_blocks(text, "predictors", 2 + w).items()},
    }
    rows = {p["name"]: p["description"] for p in policies}
    rows.update({f"predictor {p['name']}": p["description"] for p in predictors})
    assert shown == rows  # whole: the wrapped lines give back the first sentence, no "..." cut
    for line in text.splitlines():
        if line.startswith("   "):
            assert len(line.rstrip()) <= 2 + w + 11 + 14 + listing.DESCRIPTION_CHARS or " " not in line.strip(), line
    for name, description in rows.items():
        assert "None" not in description.split(), (name, description)  # a missing value printed as a word
        assert description.endswith((".", ")")), (name, description)


@pytest.fixture
def profiles(tmp_path):
    own = tmp_path / "mine.yaml"  # a whole profile of its own, named in it
    own.write_text("name: my-4090\ngpu_memory_gb: 24\n")
    both = tmp_path / "tuned.yaml"  # a base, and a name of its own
    both.write_text("base: rtx4090\nname: my-4090\npcie_bw_gb_s: 20\n")
    based = tmp_path / "calib.yaml"  # a base and no name: the base's
    based.write_text("base: rtx4090\npcie_bw_gb_s: 20\n")
    _own_name_and_base.cache_clear()
    return own, both, based


def test_a_hardware_file_is_based_on_its_base_never_on_its_own_name(profiles):
    own, both, based = profiles
    assert hardware_words({"hardware": "my-4090", "hardware_source": str(own)}) == f"{own} (my-4090)"
    assert (
        hardware_words({"hardware": "my-4090", "hardware_source": str(both)}) == f"{both} (my-4090, based on rtx4090)"
    )
    assert hardware_words({"hardware": "rtx4090", "hardware_source": str(based)}) == f"{based}, based on rtx4090"
    modified = {"hardware": "rtx4090", "hardware_source": f"{based} (modified inline)"}
    assert hardware_words(modified) == f"{based}, based on rtx4090, modified inline"
    gone = {"hardware": "h200", "hardware_source": str(own.with_name("gone.yaml"))}
    assert hardware_words(gone) == f"{own.with_name('gone.yaml')}, based on h200"  # unreadable now: as before


def test_a_run_with_a_hardware_file_of_its_own_name_says_so(tmp_path, profiles):
    import contextlib
    import io

    from sim.cli import main

    _, both, _ = profiles
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(["run", "configs/qwen3_30b_a3b_rtx4090.yaml", "--set", f"hardware={both}",
                     "--set", "workload.requests=1", "--out", str(tmp_path / "run")])  # fmt: skip
    assert code == 0
    header = out.getvalue().splitlines()[0]
    assert f"| hardware {both} (my-4090, based on rtx4090) |" in header and "based on my-4090" not in header
