"""The WebSocket frames' JSON, encoded and decoded with codecs made once (issue 39): the same
text as the json module's encoder, the same values and refusals as json.loads."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatrun.server import wire

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=20)), st.text(min_size=1, max_size=12), JSON_VALUES,
       st.one_of(st.none(), st.integers(), st.text(max_size=10)))
def test_a_server_frame_is_the_text_the_json_module_writes(chat_id, kind, data, request_id):
    frame = {"chatId": chat_id, "type": kind, "data": data}
    if request_id is not None:
        frame["requestId"] = request_id
    assert wire.server_frame(chat_id, kind, data, request_id) == json.JSONEncoder(ensure_ascii=False).encode(frame)


@settings(max_examples=60, deadline=None)
@given(JSON_VALUES.filter(lambda v: "\\ud8" not in json.dumps(v).lower()), st.sampled_from(["str", "utf-8", "utf-16"]))
def test_client_json_reads_as_json_loads_reads_it(value, form):
    text = json.dumps(value, ensure_ascii=False)
    given_text = text if form == "str" else text.encode(form)
    try:
        expected = json.loads(given_text)
    except (ValueError, RecursionError):
        return  # a refusal: the cases below
    assert wire.load_json(given_text, "frame") == expected


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', "\ufeff{}", "{", b"\xff\xfe{\x00", "[1,]"])
def test_client_json_that_json_loads_refuses_is_a_bad_request(text):
    with pytest.raises(wire.RequestFailed) as caught:
        wire.load_json(text, "frame")
    assert caught.value.reason == wire.BAD_REQUEST and "not valid JSON" in caught.value.message


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=6) | st.sampled_from([b"", b"{", b"{}", b"\xef\xbb\xbf{}", b"\xff\xfe{\x00}\x00", b"\xfe\xff\x00{",
                                                 b"{\x00}\x00", b"\x00{\x00}", b"{\x00\x00\x00", b"\x00\x00\x00{", b"\x7f\x01"]))
def test_a_body_s_encoding_is_the_one_json_detect_encoding_says(data):
    # _encoding_of answers the usual UTF-8 without json.detect_encoding's tests: the same answer for any bytes.
    assert wire._encoding_of(data) == json.detect_encoding(data)
    assert wire._encoding_of(bytearray(data)) == json.detect_encoding(data)


@pytest.mark.parametrize("form", ["str", "utf-8", "utf-16", "utf-32"])
@pytest.mark.parametrize("depth, refused", [(wire.MAX_JSON_DEPTH, False), (wire.MAX_JSON_DEPTH + 1, True)])
@pytest.mark.parametrize("decoy", ["", "{[{["])
def test_nesting_is_refused_past_the_limit_however_the_brackets_are_counted(form, depth, refused, decoy):
    # The depth walk is skipped only for text with at most MAX_JSON_DEPTH brackets: strings' brackets
    # (the decoy) count too, never fewer than the containers, in every encoding a body may come in.
    text = '"x"'
    for level in range(depth):
        text = f"[{text}]" if level % 2 else f'{{"k{level}": {text}, "s": "{decoy}"}}'
    given_text = text if form == "str" else text.encode(form)
    assert json.loads(given_text)  # valid JSON, nested `depth` levels
    if refused:
        with pytest.raises(wire.RequestFailed) as caught:
            wire.load_json(given_text, "body")
        assert "nested deeper" in caught.value.message
    else:
        assert wire.load_json(given_text, "body") == json.loads(given_text)


@pytest.mark.parametrize("body", [b'{"userMessage": "\\ud800"}', b'{"userMessage": "\\uDBFF x"}',
                                  '{"userMessage": "a\ud800b"}'.encode("utf-8", "surrogatepass")])
def test_a_body_s_lone_surrogate_is_refused_escaped_or_raw(body):
    with pytest.raises(wire.RequestFailed) as caught:
        wire.load_json(bytearray(body), "body")
    assert "surrogate" in caught.value.message


# Strings that look like JSON's structure: brackets, quotes, backslashes and escapes of them.
_TRICKY_TEXT = st.text(alphabet=st.sampled_from(list('[]{}"\\\\/nu"é x')), max_size=8)
_NESTED = st.recursive(
    st.none() | st.booleans() | st.integers() | _TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY_TEXT, inner, max_size=3),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_NESTED, st.integers(min_value=0, max_value=12), st.booleans(), st.sampled_from(["str", "bytes", "bytearray"]),
       st.sampled_from([None, 1]))
def test_the_depth_read_from_the_text_is_the_depth_of_the_values(value, limit, ascii_only, form, indent):
    # wire.load_json reads a UTF-8 text's depth from the text (issue 39): the same verdict as the walk.
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    given_text = text if form == "str" else text.encode() if form == "bytes" else bytearray(text.encode())
    assert wire._text_deeper_than(given_text, limit) == wire._deeper_than(value, limit)


def test_a_text_deeper_than_the_limit_is_refused_and_one_at_it_read():
    at_limit = "[" * wire.MAX_JSON_DEPTH + '"]\\\\\\"["' + "]" * wire.MAX_JSON_DEPTH
    assert wire.load_json(at_limit.encode(), "body") is not None
    assert wire.load_json('{"a": "' + "[" * 100 + '"}', "body") == {"a": "[" * 100}
    with pytest.raises(wire.RequestFailed, match="nested deeper than 64"):
        wire.load_json(("[" * 65 + "]" * 65).encode(), "body")
    with pytest.raises(wire.RequestFailed, match="nested deeper than 64"):  # UTF-16: the values are walked
        wire.load_json(("[" * 65 + "]" * 65).encode("utf-16"), "body")
    large = ("[" * 65 + '"' + "x" * wire._TEXT_DEPTH_MAX + '"' + "]" * 65).encode()
    assert len(large) > wire._TEXT_DEPTH_MAX  # a large body (a file's base64): its few values are walked
    with pytest.raises(wire.RequestFailed, match="nested deeper than 64"):
        wire.load_json(large, "body")
