"""What a /v1 request's resent conversation is read as (issue 39): the usual messages read in one
pass over the list give what reading them one by one gives, and the conversation's keys are
the SHA-256 of the same JSON text as before (keys are stored: another replica, an older version,
must find them)."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from chatrun.server.openai_sessions import (
    Identity,
    TurnIndex,
    _key_after,
    _pairs_json,
    _running_hash,
)
from chatrun.server.openai_turn import OpenAIError, _exchange_of, conversation_of

_MESSAGES = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yes", "refusal": None},
             {"role": "user", "content": "x", "type": "message"}, {"role": "user", "content": "x", "type": None},
             {"role": "assistant", "content": "ünï \"[q]\" \\ \u2028 \x00"}, {"role": "system", "content": "brief"},
             {"role": "developer", "content": "x"}, {"role": "tool", "content": "x"}, {"role": "user", "content": None},
             {"role": "user", "content": [{"type": "text", "text": "parts"}]}, {"role": "user", "content": 7},
             {"role": ["user"], "content": "x"}, {"role": "user", "content": "x", "type": ["m"]},
             {"role": "user", "content": "x", "type": "function_call"}, {"content": "no role"}, "a bare string", 5]


def read(messages, reader):
    try:
        return reader(messages)
    except OpenAIError as exc:
        return ("refused", exc.status, exc.code, exc.message)


def one_by_one(messages):
    """conversation_of as it read every list before (each message with its checks)."""
    exchange = _exchange_of(messages, "messages")
    if not exchange or exchange[-1][0] != "user":
        raise OpenAIError(400, "the last message of messages must be the user's (the turn to run)",
                          code="invalid_messages")
    return exchange[:-1], exchange[-1][1]


def test_a_list_of_usual_messages_reads_as_each_message_read_by_itself():
    rng = random.Random(39)
    for _ in range(4000):
        messages = [rng.choice(_MESSAGES) for _ in range(rng.randint(1, 6))]
        assert read(messages, lambda m: conversation_of(m, "messages")) == read(messages, one_by_one), messages


def old_running_hash(bot, owner, namespace, exchange):
    text = json.dumps([bot, owner or "", namespace, exchange], ensure_ascii=False, separators=(",", ":"))[:-2]
    return hashlib.sha256(text.encode())


_TEXTS = ["", "hi", "ünï", "\"[q]\"", "\\", "\u2028\x00\x1f", "😀", "</script>", "a\nb\tc"]


@pytest.mark.parametrize("seed", range(5))
def test_the_keys_are_the_hashes_of_the_same_json_text_as_before(seed):
    rng = random.Random(seed)
    for _ in range(300):
        exchange = [(rng.choice(["user", "assistant"]), rng.choice(_TEXTS) + rng.choice(_TEXTS))
                    for _ in range(rng.randint(0, 5))]
        bot, owner, namespace = rng.choice(["echo", "bö"]), rng.choice([None, "ana"]), rng.choice(["", "user:ü"])
        assert _pairs_json(exchange) == json.dumps(exchange, ensure_ascii=False, separators=(",", ":"))[1:-1]
        assert _running_hash(bot, owner, namespace, exchange).hexdigest() == \
            old_running_hash(bot, owner, namespace, exchange).hexdigest()
        more = [("user", rng.choice(_TEXTS)), ("assistant", rng.choice(_TEXTS))]
        whole = json.dumps([bot, owner or "", namespace, exchange + more], ensure_ascii=False, separators=(",", ":"))
        expected = "openai:prefix:" + hashlib.sha256(whole.encode()).hexdigest()
        assert _key_after(_running_hash(bot, owner, namespace, exchange), bool(exchange), more) == expected
        assert Identity(bot, exchange, namespace=namespace).prefix_key(owner, more) == expected
        assert TurnIndex.prefix_key(bot, owner, namespace, exchange + more) == expected


def test_pairs_of_another_shape_take_the_encoder():
    odd = [("system", "x"), ("user", 3)]
    assert _pairs_json(odd) == json.dumps(odd, ensure_ascii=False, separators=(",", ":"))[1:-1]


@pytest.mark.parametrize("seed", range(200))
def test_a_requests_headers_read_once_are_what_request_headers_get_finds(seed):
    # A /v1 request's headers are read in one pass (openai_api.Heard; issue 39): for any header
    # list (names repeated, absent, asked in another case, latin-1 values), the same value as
    # starlette's request.headers.get, the first of a name.
    from starlette.requests import Request

    from chatrun.server.openai_api import IDEMPOTENCY_HEADER, RETRY_HEADER, SESSION_HEADER, Heard
    from chatrun.server.versions import VERSION_HEADER

    rng = random.Random(seed)
    names = [SESSION_HEADER, VERSION_HEADER.lower(), IDEMPOTENCY_HEADER, RETRY_HEADER, "accept-language", "x-chat-id"]
    raw = [(rng.choice(names).encode(), rng.choice([b"", b" 1 ", b"abc", "\u00e9t\u00e9".encode("latin-1")]))
           for _ in range(rng.randrange(6))]
    request = Request({"type": "http", "headers": raw})
    heard = Heard(request)
    for name in [*names, VERSION_HEADER, "X-Chatrun-Session", "absent"]:
        assert heard.get(name) == request.headers.get(name)
