"""untrusted_json.loads: JSON from the model or an agent, every failure a ValueError."""

from __future__ import annotations

import pytest

from cadence.agents import untrusted_json


def test_within_bounds_is_json():
    assert untrusted_json.loads("[" * 64 + "]" * 64) == untrusted_json.loads("[" * 64 + "]" * 64)
    assert untrusted_json.loads(b'{"a": [1, {"b": "[[[[ ]"}]}') == {"a": [1, {"b": "[[[[ ]"}]}
    assert untrusted_json.loads('["' + '\\"' * 10_000 + '"]') == ['"' * 10_000]


@pytest.mark.parametrize(("text", "says"), [
    ("[" * 65 + "]" * 65, "nested deeper than 64"),
    ('{"a": ' * 900 + "1" + "}" * 900, "nested deeper than 64"),  # parses, then refused
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 64"),  # RecursionError in the parser
    ("[" * 100_000, "nested deeper than 64"),  # not even balanced
    ('{"t": NaN}', "NaN is not JSON"),
    ("[Infinity]", "Infinity is not JSON"),
    (b"\xff[]", "not UTF-8"),
    ("{oops", "Expecting property name"),
])
def test_out_of_bounds_is_a_value_error(text, says):
    with pytest.raises(ValueError, match=says):
        untrusted_json.loads(text)


def test_a_size_bound():
    with pytest.raises(ValueError, match="over the 10 allowed"):
        untrusted_json.loads("[" + "1," * 10 + "1]", max_chars=10)
