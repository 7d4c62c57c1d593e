"""A system profile's named fields (sim/config/system.py) are checked when the profile loads, whether or not the
run overrides them: an unknown name in any of them is one line naming the field and the profile's file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import CONFIG_FIELD_CHARS, CONFIG_PROBLEM_CHARS, ConfigError
from sim.config.run_config import load_run_config
from sim.config.system import COPY_STREAMS, DEQUANT_MODES, format_bits, load_system
from sim.predictors import PREDICTORS
from tests.support.messages import checked_message

MAX_LINE = CONFIG_FIELD_CHARS + 2 + CONFIG_PROBLEM_CHARS
#: Field -> whether a name is one the field knows.
KNOWN = {
    "copy_stream": lambda n: n in COPY_STREAMS,
    "dequant": lambda n: n in DEQUANT_MODES,
    "expert_format": lambda n: format_bits(n) is not None,
    "dense_format": lambda n: format_bits(n) is not None,
    "predictor": lambda n: n in PREDICTORS.names(),
    "predictor.name": lambda n: n in PREDICTORS.names(),
}
NAMES = st.one_of(
    st.text(st.characters(categories=("L", "N", "P", "S", "Zs")), min_size=1, max_size=20),
    st.sampled_from([n + "x" for n in PREDICTORS.names()] + ["serial ", "Table", "noisy\u200b", "int9"]),
)


def _profile(field: str, name: str) -> dict:
    if field == "predictor.name":
        return {"base": "ideal", "predictor": {"name": name, "params": {}}}
    return {"base": "ideal", field: name}


@settings(max_examples=40, deadline=None)
@given(field=st.sampled_from(sorted(KNOWN)), name=NAMES, own_predictor=st.booleans())
def test_an_unknown_name_in_a_system_profile_is_refused_naming_the_field_and_file(field, name, own_predictor):
    """Any name a system profile's named field does not know is refused on one line naming ``system.FIELD`` and
    the profile's file, when the profile loads alone and when a run config uses it and names its own predictor."""
    if KNOWN[field](name):
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mine.yaml"
        path.write_text(yaml.safe_dump(_profile(field, name)))
        with pytest.raises(ConfigError) as exc:
            load_system(str(path))
        msg = checked_message(exc.value, MAX_LINE)
        assert msg.startswith(f"system.{field.split('.')[0]}") and str(path) in msg
        sets = [f"system={path}", "workload.requests=1"] + (["predictor.name=none"] if own_predictor else [])
        with pytest.raises(ConfigError) as exc:
            load_run_config("configs/mixtral.yaml", sets)
        assert checked_message(exc.value, MAX_LINE) == msg


def test_a_profile_s_predictor_params_are_checked_even_when_the_run_names_its_own(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: ideal\npredictor: {name: noisy, params: {recall: 7}}\n")
    with pytest.raises(ConfigError, match=r"system.predictor.params.recall: must be .* \(in .*mine.yaml\)"):
        load_run_config("configs/mixtral.yaml", [f"system={path}", "predictor.name=none"])
    assert load_system("mixtral-offloading").predictor == {"name": "noisy", "params": {"recall": 0.8, "precision": 0.8}}
