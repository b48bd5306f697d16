"""The /v1 request check: what clients resend with every request (the whole conversation) is
not re-walked by the schema validator message by message, and the answers are unchanged."""

from __future__ import annotations

import random

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from chatrun.server.openai_schema import (
    CHAT_COMPLETIONS,
    RESPONSES,
    _all_plain,
    plain_message,
    problem,
    surely_valid,
    without_plain_history,
)


def full_check(schema, body):
    """What problem() answered before: the whole body through the validator."""
    error = best_match(Draft202012Validator(schema).iter_errors(body))
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    return f"{where or 'the body'}: {error.message}"


def history(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)]


def test_a_long_plain_history_is_checked_as_one_message():
    body = {"model": "travel", "messages": history(200)}
    assert without_plain_history(CHAT_COMPLETIONS, body)["messages"] == [body["messages"][0]]
    assert problem(CHAT_COMPLETIONS, body) is None
    # Only what could be wrong is kept for the validator: here the one message with parts.
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    body = {"model": "travel", "messages": [*history(50), parts]}
    assert without_plain_history(CHAT_COMPLETIONS, body)["messages"] == [parts]
    responses = {"model": "travel", "input": ["hi", *history(30)]}
    assert without_plain_history(RESPONSES, responses)["input"] == ["hi"]


BAD_BODIES = [
    (CHAT_COMPLETIONS, {"model": "travel", "messages": [*history(40), {"role": "user", "content": 7}]}),
    (CHAT_COMPLETIONS, {"model": "travel", "messages": [*history(9), {"content": "no role"}, *history(3)]}),
    (CHAT_COMPLETIONS, {"model": "travel", "messages": [*history(5), {"role": 1, "content": "x"}]}),
    (CHAT_COMPLETIONS, {"model": "travel", "messages": [*history(5), "a bare string"]}),
    (CHAT_COMPLETIONS, {"model": "travel", "messages": [*history(5), {"role": "user", "content": [{"text": "x"}]}]}),
    (CHAT_COMPLETIONS, {"model": "travel", "messages": [*history(5), {"role": "user", "type": 3}]}),
    (CHAT_COMPLETIONS, {"model": "travel", "messages": []}),
    (CHAT_COMPLETIONS, {"model": "", "messages": history(20)}),
    (CHAT_COMPLETIONS, {"model": "travel", "messages": history(20), "response_format": "json"}),
    (CHAT_COMPLETIONS, {"messages": history(20)}),
    (CHAT_COMPLETIONS, ["not", "an", "object"]),
    (RESPONSES, {"model": "travel", "input": [*history(12), {"role": "user", "content": 7}]}),
    (RESPONSES, {"model": "travel", "input": [*history(12), 5]}),
    (RESPONSES, {"model": "travel", "input": ""}),
]
GOOD_BODIES = [
    (CHAT_COMPLETIONS, {"model": "travel", "messages": history(1)}),
    (CHAT_COMPLETIONS, {"model": "travel", "messages": [*history(30), {"role": "user", "content": None}]}),
    (CHAT_COMPLETIONS, {"model": "t", "messages": [*history(3), {"role": "user", "content": ["a", {"type": "text"}]}],
                        "stream": True, "user": "ana"}),
    (RESPONSES, {"model": "travel", "input": "hi"}),
    (RESPONSES, {"model": "travel", "input": ["hi", *history(8), {"type": "message", "role": "user", "content": "x"}]}),
]


@pytest.mark.parametrize(("schema", "body"), BAD_BODIES + GOOD_BODIES)
def test_the_answer_and_the_place_named_are_those_of_the_whole_body(schema, body):
    expected = full_check(schema, body)
    found = problem(schema, body)
    assert (found and found.message) == expected
    assert (expected is None) == ((schema, body) in GOOD_BODIES)


# Values for the fields the quick judgement knows, and some it leaves to the validator.
_VALUES = [None, "", "x", True, False, 0, 1.5, [], {}, ["hi"], history(3), [*history(2), {"role": "user", "content": 7}],
           [*history(2), "bare"], [{"content": "no role"}], {"id": "c"}, {"type": "json_object"}]
_FIELDS = ["model", "messages", "input", "stream", "user", "safety_identifier", "previous_response_id",
           "conversation", "response_format", "stream_options", "chatrun", "temperature"]


def test_a_body_judged_surely_valid_is_one_the_validator_accepts():
    """The quick judgement (no validator) never accepts what the schema refuses: random bodies."""
    rng = random.Random(39)
    judged = 0
    for _ in range(4000):
        body = {name: rng.choice(_VALUES) for name in ["model", "messages", "input", *rng.sample(_FIELDS, rng.randint(0, 4))]}
        for schema in (CHAT_COMPLETIONS, RESPONSES):
            if surely_valid(schema, body):
                judged += 1
                assert full_check(schema, body) is None, body
    assert judged > 20  # the judgement was put to the test
    # What the SDKs send each turn is judged without the validator.
    assert surely_valid(CHAT_COMPLETIONS, {"model": "echo", "messages": [*history(79), {"role": "assistant",
                        "content": "x", "refusal": None, "annotations": []}], "stream": False})
    assert surely_valid(RESPONSES, {"model": "echo", "input": "hi", "previous_response_id": "resp_1"})


# Message-like items: the usual ones and each way one can be unusual (an unhashable value included).
_ITEMS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes", "refusal": None, "annotations": []},
          {"role": "user", "content": None}, {"role": "user"}, {"content": "no role"}, {"role": 1, "content": "x"},
          {"role": ["user"], "content": "x"}, {"role": "user", "content": ["a"]}, {"role": "user", "content": 7},
          {"role": "user", "content": "x", "type": "message"}, {"role": "user", "content": "x", "type": None},
          {"role": "user", "content": "x", "type": {}}, {"role": "system", "content": "be brief"}, "bare", 5, None, []]


def test_the_quick_judgement_of_a_list_of_messages_is_the_one_by_one_judgement():
    rng = random.Random(3939)
    for _ in range(3000):
        items = [rng.choice(_ITEMS) for _ in range(rng.randint(1, 6))]
        for strings in (False, True):
            assert _all_plain(items, strings) == all(plain_message(item, strings) for item in items), items
