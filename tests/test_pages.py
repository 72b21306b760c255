"""How serve's pages lay out what they show (engine/web/pages.py), checked without a browser."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from engine.web.pages import _arguments

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text()
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)
)


@given(st.dictionaries(st.text(), VALUES, max_size=6))
def test_arguments_are_laid_out_as_json_indented_by_two(arguments):
    """The fast layout of a flat object is the text ``indent=2`` gives; any other value is laid out by it."""
    text = json.dumps(arguments)
    assert _arguments(text) == json.dumps(arguments, indent=2, ensure_ascii=False)


def test_arguments_that_are_not_json_are_shown_as_they_came():
    assert _arguments('{"filePath": "a.py"') == '{"filePath": "a.py"'
    assert _arguments(None) == "None"
