"""What the fuzz tests of untrusted input share: their hypothesis settings (repeatable, no example database, fixtures
allowed) and names on both sides of the model-name rule."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: The characters a model, checkpoint or data set name may hold (besides one "/" after an organisation).
PLAIN_NAME_CHARS = string.ascii_letters + string.digits + "._+-"


def fuzz_settings(max_examples: int) -> settings:
    """Derandomized settings (the same examples every run, so CI is repeatable) for tests that build files."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def names_near_the_rule(bad_parts: list[str]) -> st.SearchStrategy[str]:
    """Plain names, and plain names with one of ``bad_parts`` (a line break, an escape, a path part...) inside."""
    return st.one_of(
        st.text(PLAIN_NAME_CHARS, min_size=1, max_size=20),
        st.builds(
            lambda a, bad, b: a + bad + b,
            st.text(PLAIN_NAME_CHARS, max_size=5),
            st.sampled_from(bad_parts),
            st.text(max_size=5),
        ),
    )
