"""A profile file whose ``base`` is wrong is named in the error (the field alone would not say which file)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moebase.errors import ConfigError
from moebase.profiles import load_profile


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["models", "hardware", "systems"]),
    base=st.text(alphabet="abcxyz-_", min_size=1, max_size=12).map(lambda s: f"no-such-{s}"),
    nested=st.booleans(),
)
def test_an_unknown_base_in_a_profile_file_names_the_file(tmp_path_factory, kind, base, nested):
    folder = tmp_path_factory.mktemp("profiles")
    inner = folder / "inner.yaml"
    inner.write_text(f"base: {base}\n")
    outer = folder / "outer.yaml"
    outer.write_text(f"base: {inner}\n")
    given_file = outer if nested else inner
    with pytest.raises(ConfigError) as info:
        load_profile(str(given_file), "profile", kind)
    message = str(info.value)
    assert base in message and str(inner.name) in message and "\n" not in message
