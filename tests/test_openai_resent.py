"""A Chat Completions body read from where the conversation this process read before ends
(server/openai_resent.py, issue 39) reads exactly as the whole body read afresh: the same
fields, conversation, keys and attempt, or the same error in OpenAI's shape, on random
conversations resent in random encodings, with edits and broken or unusual new parts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

import chatrun
from chatrun.server import create_app
from chatrun.server.auth import Principal
from chatrun.server.openai_api import _chat_completion
from chatrun.server.openai_resent import HEAD_CHARACTERS, Noted, ResentBodies, ResentExchange
from chatrun.server.openai_turn import OpenAIError, Reply
from chatrun.server.wire import RequestFailed, load_json
from server_support import write_travel

_TEXTS = ["hi", "ünï", '"[q]"', "\\", "\\\"", "{", "}", '{"', '"}, {"role": "user", "content": "x"}', "\u2028\x00",
          "😀", "a\nb\tc", "", "  padded  ", "]}", "message number 7"]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    bot = chatrun.load_bot(write_travel(tmp_path_factory.mktemp("bots")))
    return create_app([bot], "memory://").state.openai


def request_of(api, raw: bytes, headers: dict[str, str] | None = None) -> Request:
    sent = []

    async def receive():
        if sent:
            return {"type": "http.disconnect"}
        sent.append(1)
        return {"type": "http.request", "body": raw, "more_body": False}

    app = type("App", (), {"state": type("State", (), {"edge": None})()})()
    heads = [(b"content-length", str(len(raw)).encode())] + [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": heads, "app": app},
                   receive)


def outcome(api, raw: bytes, who, headers=None):
    """What reading the request gave: its fields and completion, or its error."""
    return read(api, raw, who, headers)[0]


def from_known(api, raw: bytes, who, headers=None) -> bool:
    """Whether the request was read from a known prefix: its earlier conversation is then the
    resent body's, decoded only when needed (ResentExchange), not the list a whole reading makes."""
    return read(api, raw, who, headers)[1]


def read(api, raw: bytes, who, headers=None):
    """(outcome, whether the body was read from a known prefix)."""
    try:
        body, completion = asyncio.run(_chat_completion(api, request_of(api, raw, headers), who))
    except OpenAIError as exc:
        return ("refused", exc.status, exc.code, exc.message), False
    return _outcome_of(body, completion, who), type(completion.ident.earlier) is ResentExchange


def _outcome_of(body, completion, who):
    owner = who.name if who is not None else None
    ident = completion.ident
    reply = Reply(parts=["the answer"])
    return ({k: v for k, v in body.items() if k != "messages"}, completion.text, len(ident.earlier),
            bool(ident.earlier), ident.prefix_key(owner), completion.attempt, completion.keys_after(reply),
            completion.as_json, completion.want_events, completion.include_usage, completion.uploads,
            ident.namespace, ident.route, list(ident.earlier))


def encode(body, style) -> bytes:
    text = json.dumps(body, ensure_ascii=style["ascii"], separators=style["separators"], indent=style["indent"])
    return text.encode("utf-8", "surrogatepass")


def style_of(rng):
    return {"ascii": rng.random() < 0.5, "indent": rng.choice([None, None, None, 1]),
            "separators": rng.choice([None, (",", ":"), (", ", ": ")]), "model_first": rng.random() < 0.7,
            "extra": rng.choice([{}, {}, {"stream": False}, {"user": "u1"}, {"temperature": 0.5, "n": 1}])}


def body_of(messages, style, model="travel"):
    extra = style["extra"]
    return {"model": model, **extra, "messages": messages} if style["model_first"] \
        else {"messages": messages, "model": model, **extra}


def broken(rng, raw: bytes, messages, style) -> bytes:
    """A body whose new part is wrong or unusual in one of the ways a client's may be."""
    kind = rng.randrange(16)
    if kind == 0:
        return raw + b" x"  # extra data
    if kind == 1:
        return raw.replace(b"}]", b"},]", 1) if b"}]" in raw else raw[:-1]
    if kind == 2:
        return encode(body_of(messages[:-1] + [{"role": "user", "content": "x", "deep": [[[[0]]]] * 1 + _deep(70)}],
                              style), style)
    if kind == 3:
        return encode(body_of(messages[:-1] + [{"role": "user", "content": "lone \ud800"}], style), style)
    if kind == 4:
        return encode(body_of(messages + [{"role": "assistant", "content": "last"}], style), style)
    if kind == 5:
        return encode(body_of(messages[:-1] + [{"role": "user", "content": [{"type": "text", "text": "parts"}]}],
                              style), style)
    if kind == 6:
        return raw[:-1] + b', "messages": [{"role": "user", "content": "other"}]}'
    if kind == 7:
        return raw[:-1] + b', "temperature": NaN}'
    if kind == 8:
        return encode(body_of(messages, style, model="nobody"), style)
    if kind == 9:
        return encode(body_of(messages, style) | {"response_format": {"type": "json_object"}}, style)
    if kind == 10:
        return raw.replace(b"number", b"numb\xffer") if b"number" in raw else raw + b"\xff"
    if kind == 11:
        return encode(body_of(messages[:-1] + [{"role": "system", "content": "brief"}, messages[-1]], style), style)
    if kind == 12:
        return encode(body_of(messages[:-1] + [{"role": "user", "content": "x" * 20000}], style), style)
    if kind == 13:
        return encode(body_of(messages, style) | {"stream": "yes"}, style)  # the schema's validator refuses
    if kind == 14:
        return encode(body_of(messages, style) | {"response_format": {"type": "bogus"}}, style)
    return encode(body_of(messages, style) | {"user": "someone else"}, style)


def _deep(levels):
    value = 0
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("seed", range(8))
def test_a_resent_conversation_reads_as_the_whole_body_read_afresh(api, seed):
    rng = random.Random(seed)
    api = dataclasses.replace(api, resent=ResentBodies())
    hits = reads = 0
    for _conversation in range(4):
        style, messages = style_of(rng), []
        who = rng.choice([None, Principal("ann"), Principal("bob")])
        for turn in range(12):
            if messages:
                messages.append({"role": "assistant", "content": rng.choice(_TEXTS) + f" answer {turn}",
                                 **rng.choice([{}, {"refusal": None, "annotations": []}])})
            messages.append({"role": "user", "content": rng.choice(_TEXTS) + f" message number {turn}"})
            if rng.random() < 0.1:
                style = style_of(rng)  # another encoding of the same messages: read whole
            if rng.random() < 0.1 and len(messages) > 2:
                messages[rng.randrange(len(messages) - 1)]["content"] += " (edited)"
            raw = encode(body_of(messages, style), style)
            if rng.random() < 0.25:
                raw = broken(rng, raw, messages, style)
            afresh = outcome(dataclasses.replace(api, resent=ResentBodies()), raw, who)
            got, known = read(api, raw, who)
            assert got == afresh, (seed, turn, raw[-300:])
            hits += known
            reads += 1
    assert hits > reads // 3  # the known prefixes were read from, not only the whole bodies


def test_another_caller_sending_the_same_bytes_reads_them_whole(api):
    api = dataclasses.replace(api, resent=ResentBodies())
    messages = [{"role": "user", "content": "hi"}]
    outcome(api, json.dumps({"model": "travel", "messages": messages}).encode(), Principal("ann"))
    messages += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    raw = json.dumps({"model": "travel", "messages": messages}).encode()
    assert not from_known(api, raw, Principal("bob"))
    assert from_known(api, raw, Principal("ann"))


def test_a_namespace_of_another_front_end_chat_reads_the_body_whole(api):
    """The running hash is of the bot, owner and namespace: a request of another namespace
    (here another `user`) with the same messages is read whole, and keyed as its own."""
    api = dataclasses.replace(api, resent=ResentBodies())
    first = [{"role": "user", "content": "hi"}]
    outcome(api, json.dumps({"model": "travel", "messages": first, "user": "a"}).encode(), None)
    later = first + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    raw = json.dumps({"model": "travel", "messages": later, "user": "b"}).encode()
    got, known = read(api, raw, None)
    assert got == outcome(dataclasses.replace(api, resent=ResentBodies()), raw, None)
    assert not known


def test_the_noting_decoder_decodes_as_json_loads(api):
    rng = random.Random(7)
    pieces = [b"{", b"}", b"[", b"]", b'"messages"', b'"model"', b":", b",", b" ", b"\n", b'"x"', b"1", b"NaN",
              b'{"role": "user", "content": "a"}', b"null", b"\\", b'"\\u00e9"', b"\xc3\xa9", b"\xff"]
    for _ in range(3000):
        raw = b'{"model": "m", "messages": [' + b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        raw += rng.choice([b"]}", b"}", b"", b"] }  ", b'], "n": 1}'])
        assert decoded(raw, Noted()) == decoded(raw, None), raw


def decoded(raw, decode):
    try:
        return load_json(raw, "body", decode)
    except RequestFailed as exc:
        return ("refused", exc.reason, exc.message)


def test_the_index_of_known_prefixes_is_bounded(api):
    api = dataclasses.replace(api, resent=ResentBodies(entries=3))
    for n in range(10):
        outcome(api, json.dumps({"model": "travel", "messages": [{"role": "user", "content": f"hi {n}"}]}).encode(),
                None)
    assert len(api.resent._known) == 3


def test_a_long_text_before_the_messages_is_not_kept(api):
    """An entry holds the fields before "messages": a client sending a long one (a body may
    hold megabytes) leaves the index as small as ever, and its next request is read whole."""
    api = dataclasses.replace(api, resent=ResentBodies())
    first = [{"role": "user", "content": "hi"}]
    room = HEAD_CHARACTERS - len("travel")  # the model's name is a text before the messages too
    for user in ("u" * room, "u" * (room + 1)):
        outcome(api, json.dumps({"model": "travel", "user": user, "messages": first}).encode(), None)
        later = first + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
        raw = json.dumps({"model": "travel", "user": user, "messages": later}).encode()
        got, known = read(api, raw, None)
        assert got == outcome(dataclasses.replace(api, resent=ResentBodies()), raw, None)
        assert known == (len(user) <= room)
    assert all(sum(len(v) for _, v in k.head if isinstance(v, str)) <= HEAD_CHARACTERS
               for k in api.resent._known.values())


def test_the_index_keeps_no_text_of_the_conversation(api):
    """An entry is keyed by the hash of its prefix's last bytes, not by the bytes, which end the
    conversation's last message: nothing a user or the bot said is held by the index."""
    api = dataclasses.replace(api, resent=ResentBodies())
    messages = [{"role": "user", "content": "my card is 4111 wombat"}]
    outcome(api, json.dumps({"model": "travel", "messages": messages}).encode(), None)
    messages += [{"role": "assistant", "content": "noted, kangaroo"}, {"role": "user", "content": "and quokka"}]
    assert from_known(api, json.dumps({"model": "travel", "messages": messages}).encode(), None)  # the first kept
    kept = repr(list(api.resent._known.items()))
    assert not any(word in kept for word in ("wombat", "4111", "kangaroo", "quokka"))


_VALUES = st.sampled_from([None, "user", "assistant", "system", "message", "", " hi ", 3, True, [], {}, ["user"]])
_MESSAGE = st.one_of(
    st.dictionaries(st.sampled_from(["role", "content", "type", "refusal", "annotations", "name"]), _VALUES, max_size=5),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text(max_size=5)},
                          optional={"type": _VALUES, "refusal": _VALUES}),
    _VALUES)


@given(st.lists(_MESSAGE, max_size=4))
@settings(max_examples=1000, deadline=None)
def test_a_resent_bodys_new_messages_read_in_one_loop_as_by_the_schema_and_the_usual_reading(messages):
    # A resent body's few new messages are judged plain (the schema's test) and read as usual in
    # one loop (issue 39): the same exchange, or None, as the two C-level readings give.
    from chatrun.server.openai_resent import plain_exchange
    from chatrun.server.openai_schema import CHAT_COMPLETIONS, all_plain, surely_valid
    from chatrun.server.openai_turn import usual_exchange

    expected = usual_exchange(messages) if all_plain(messages) else None
    assert plain_exchange(messages) == (expected or None)
    if expected:  # the schema's plain test of the body, its messages judged already
        for body in ({"model": "m", "messages": messages}, {"model": "", "messages": messages},
                     {"model": "m", "messages": messages, "stream": 1}, {"messages": messages}):
            assert surely_valid(CHAT_COMPLETIONS, body, judged="messages") == surely_valid(CHAT_COMPLETIONS, body)


@given(st.lists(st.tuples(st.integers(0, 70), st.sampled_from(["", "[", "{[", "x"])), min_size=1, max_size=3),
       st.integers(0, 66))
@settings(max_examples=300, deadline=None)
def test_a_resent_bodys_depth_is_judged_from_its_new_bytes_as_the_walk_judges_it(new, after):
    # A resent body's new part with few brackets is not walked for its depth (issue 39): the same
    # verdict as wire.nests_deeper's walk of the body, near the limit and past it, with brackets
    # in strings too.
    from chatrun.server.openai_resent import _nests_deeper
    from chatrun.server.wire import nests_deeper

    first = {"role": "user", "content": "hi"}
    messages = [{"role": "user", "content": text, "deep": _deep(levels)} for levels, text in new]
    body = {"model": "m", "messages": messages, "extra": _deep(after)}
    prefix = json.dumps({"model": "m", "messages": [first]})[:-2]
    full = json.dumps({"model": "m", "messages": [first, *messages], "extra": _deep(after)})
    assert full.startswith(prefix)
    assert _nests_deeper(full[len(prefix):].encode(), body) == nests_deeper(body)
