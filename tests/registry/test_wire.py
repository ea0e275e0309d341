import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.wire import NotFramed, frame, unframe


@given(st.integers(0, 2**32 - 1), st.binary(max_size=64))
def test_a_framed_value_unframes_to_its_id_and_payload(schema_id, payload):
    got_id, got = unframe(frame(schema_id, payload))
    assert (got_id, bytes(got)) == (schema_id, payload)


@pytest.mark.parametrize("value", [b"", b"\x00\x00\x00\x01", b"\x01\x00\x00\x00\x01abc", b"{json}"])
def test_values_without_the_framing_are_refused(value):
    with pytest.raises(NotFramed):
        unframe(value)
