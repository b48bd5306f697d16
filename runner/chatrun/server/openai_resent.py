"""A Chat Completions body's resent conversation, read once by this process (issue 39).

An OpenAI client resends the whole conversation with every request, so each request's body
starts with the bytes of the one before it up to its last message. Reading those messages again
(the JSON decode, the depth, surrogate and schema checks, the messages' reading and the SHA-256
of the conversation's key) cost ~1 M instructions of a 40-turn request, growing with the
conversation. This process keeps, for the body it read last in each conversation, what reading
that prefix gave — not its text: its length, a BLAKE2b digest of its bytes, the top-level fields
before "messages" (scalars only), the number of its messages, and the conversation's running key
hash (openai_sessions.Identity) for the request's bot, owner and namespace (`Known`).

A later body whose first bytes have that digest is in the same state there as the decoder was
(JSON is read left to right), so only what follows is read: its new messages and the fields
after them, checked as the whole body would be — the prefix passed every check, and each
check is one of its parts (the depth of each value, each string's surrogates, the schema's
plain test of each message and field, each message usual). Anything else — another encoding
of the same messages, an edit, a field the schema's validator must judge, any error — is read
the full way, which gives every error as before (`ResentBodies.read` returns None). The earlier
messages themselves are decoded again only if the turn needs them (a new session seeded with
them: `ResentExchange`).

The index is per owner, bounded (ENTRIES, oldest first out), and holds no text a client sent
but short scalar fields such as the model's name (HEAD_CHARACTERS: a body with more before its
messages is not kept, so an entry stays ~0.5 KB whatever a client sends).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from chatrun.messages import lone_surrogate_at
from chatrun.server import openai_schema, wire
from chatrun.server.openai_sessions import Exchange, extended
from chatrun.server.openai_turn import USUAL_ROLES, conversation_of

ENTRIES = 4096  # prefixes kept (each ~0.5 KB: no text of the conversation)
HEAD_CHARACTERS = 256  # the most characters of text the fields before "messages" may hold to be kept
_TAIL = 48  # bytes before a prefix's end whose hash keys it, with its length and owner
_TRIES = 32  # braces looked at from a body's end for the start of the message after a known prefix
_GAP = 64  # bytes at most between a message's "}" and the next one's "{" (a comma, indentation)
_WS = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]  # the decoder's own whitespace
_SCALARS = (str, int, float, bool, type(None))


class _Unusual(Exception):  # noqa: N818 - not an error: read the full way
    """Not a body this reading follows: read it the full way."""


@dataclass(frozen=True)
class Known:
    """What reading a body up to the end of its last message gave (see the module's text)."""

    size: int  # bytes of the prefix
    digest: bytes  # BLAKE2b-256 of them
    head: tuple[tuple[str, Any], ...]  # the top-level fields before "messages", in order (scalars)
    count: int  # its messages (all usual: one pair each)
    who: tuple[str, str | None, str]  # the bot, owner and namespace `running` is of
    running: Any  # the running hash (openai_sessions._running_hash) of all its messages' pairs


class ResentExchange(Sequence[tuple[str, str]]):
    """The earlier exchange of a body read from a known prefix: its length is known, its pairs
    are decoded from the body the full way when first needed (a new session's seed)."""

    def __init__(self, raw: bytes | bytearray, length: int):
        self._raw, self._length = raw, length
        self._pairs: Exchange | None = None

    def _loaded(self) -> Exchange:
        if self._pairs is None:
            body = wire.load_json(self._raw, "body")
            self._pairs = conversation_of(body["messages"], "messages")[0]
        return self._pairs

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[tuple[str, str]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self._loaded()[index]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._loaded())


@dataclass
class Resent:
    """A body read from a known prefix: its fields (`body`, whose "messages" are the new ones
    only), the turn's text and earlier exchange, and what learning its own prefix takes."""

    body: dict[str, Any]
    text: str
    earlier: ResentExchange
    known: Known
    new_pairs: Exchange  # the earlier exchange's pairs after the known prefix's
    hashed: Any  # BLAKE2b of the body's bytes up to the known prefix's end
    end: int  # bytes up to the end of this body's last message

    def running(self, who: tuple[str, str | None, str]) -> Any:
        """The running hash of `earlier` for this bot, owner and namespace (None: another's)."""
        if who != self.known.who:
            return None
        return extended(self.known.running, True, self.new_pairs)  # a known prefix holds a message


class Noted:
    """A decoder for wire.load_json that decodes as json.loads does and notes, for a top-level
    object with one "messages" array of objects, the fields before it and where its last message
    ends (None when the body is another: then it is simply decoded)."""

    def __init__(self) -> None:
        self.head: list[tuple[str, Any]] | None = None
        self.end = -1  # characters up to the end of the last message
        self.text = ""

    def __call__(self, raw: str | bytes | bytearray, encoding: str | None) -> Any:
        if isinstance(raw, str) or encoding != "utf-8":
            return wire.decode_json(raw, encoding)
        text = raw.decode("utf-8", "surrogatepass")
        try:
            body, self.head, self.end = _read_whole(text)
        except Exception:  # noqa: BLE001 - any doubt: the decoder says what (the same error)
            self.head = None
            return wire.decode_json(text)
        self.text = text
        return body


def _read_whole(text: str) -> tuple[dict[str, Any], list[tuple[str, Any]], int]:
    """json.loads(text) of a top-level object, read member by member with the decoder's own
    scanner (the same values, in the same order): (the body, its fields before "messages", the
    index after the last message: its array's last "}" before the closing "]", when its last
    element is an object, which reads as one only if it ends with its "}")."""
    i = _WS(text, 0).end()
    if text[i:i + 1] != "{":
        raise _Unusual
    body: dict[str, Any] = {}
    head: list[tuple[str, Any]] = []
    end, first, seen = -1, True, False
    while True:
        i, key, at = _member(text, i + 1 if first else i, first)
        if key is None:
            break
        first = False
        value, i = wire.SCAN_ONCE(text, at)
        body[key] = value
        if key != "messages" and not seen:
            head.append((key, value))
        elif key == "messages":
            if seen or type(value) is not list or not value or type(value[-1]) is not dict:
                raise _Unusual
            seen, end = True, text.rindex("}", at, i) + 1
    if end < 0 or _WS(text, i).end() != len(text):
        raise _Unusual
    return body, head, end


def _member(text: str, i: int, first: bool) -> tuple[int, str | None, int]:
    """At `i` (after "{" when `first`, else after a member's value): (the index after the
    object when it ends here, None, 0), or (i, the next member's key, where its value starts)."""
    i = _WS(text, i).end()
    sign = text[i:i + 1]
    if sign == "}":
        return i + 1, None, 0
    if not first:
        if sign != ",":
            raise _Unusual
        i = _WS(text, i + 1).end()
    if text[i:i + 1] != '"':
        raise _Unusual
    key, i = wire.SCAN_ONCE(text, i)
    i = _WS(text, i).end()
    if text[i:i + 1] != ":":
        raise _Unusual
    return i, key, _WS(text, i + 1).end()


def _elements(text: str, i: int, items: list[Any]) -> tuple[int, int]:
    """An array's further elements from `i` (just after an element) to its closing bracket:
    (the index after it, the index after its last element, -1 for none further)."""
    last = -1
    while True:
        i = _WS(text, i).end()
        sign = text[i:i + 1]
        if sign == "]":
            return i + 1, last
        if sign != ",":
            raise _Unusual
        value, i = wire.SCAN_ONCE(text, _WS(text, i + 1).end())
        if type(value) is not dict:
            raise _Unusual  # a message that is not an object: no prefix to know
        items.append(value)
        last = i


def _tail_hash(raw: bytes | bytearray, end: int) -> int:
    """The last bytes of a prefix, as the key of its entry: their hash, not the bytes, which
    end the conversation's last message (the index keeps no text a client sent). A collision
    only costs a digest that does not match."""
    return hash(bytes(raw[max(0, end - _TAIL):end]))


class ResentBodies:
    """The prefixes this process read, by owner, length and last bytes (see the module's text)."""

    def __init__(self, entries: int = ENTRIES):
        self._known: dict[tuple[str | None, int, int], Known] = {}
        self._entries = entries

    def read(self, raw: bytes | bytearray, owner: str | None) -> Resent | None:
        """The body read from a known prefix of it, or None: read it the full way."""
        found = self._find(raw, owner) if self._known else None
        if found is None:
            return None
        known, hashed = found
        try:
            resent = _rest(raw, known, hashed)
        except Exception:  # noqa: BLE001 - any doubt, any error: the full way says what
            return None
        return resent

    def _find(self, raw: bytes | bytearray, owner: str | None) -> tuple[Known, Any] | None:
        """The known prefix this body starts with: it ends with an object's "}" followed by a
        comma and another object's "{" (with whitespace between: `_GAP` bytes at most), looked
        for from the body's end, `_TRIES` braces at most (braces in texts are tried too)."""
        at = len(raw)
        for _ in range(_TRIES):
            at = raw.rfind(b"{", 0, at)
            if at <= 0:
                return None
            end = raw.rfind(b"}", max(0, at - _GAP), at) + 1
            if end <= 0 or raw[end:at].strip(b" \t\n\r") != b",":
                continue
            known = self._known.get((owner, end, _tail_hash(raw, end)))
            if known is None:
                continue
            hashed = hashlib.blake2b(memoryview(raw)[:end], digest_size=32)
            return (known, hashed) if hashed.digest() == known.digest else None
        return None

    def learn(self, raw: bytes | bytearray, start: int, hashed: Any, end: int, head: Sequence[tuple[str, Any]],
              count: int, who: tuple[str, str | None, str], running: Any) -> None:
        """Keep what reading `raw` up to `end` (bytes) gave: `hashed` is BLAKE2b of its first
        `start` bytes (None: of none), `running` the hash of its `count` messages' pairs for `who`."""
        if not all(type(value) in _SCALARS for _, value in head):
            return  # a field whose value a request could change in place: not shared
        if sum(len(value) for _, value in head if type(value) is str) > HEAD_CHARACTERS:
            return  # a long text before the messages (a body may hold megabytes): the index stays small
        hashed = hashed.copy() if hashed is not None else hashlib.blake2b(digest_size=32)
        hashed.update(memoryview(raw)[start:end])
        key = (who[1], end, _tail_hash(raw, end))
        self._known[key] = Known(end, hashed.digest(), tuple(head), count, who, running)
        if len(self._known) > self._entries:
            del self._known[next(iter(self._known))]


def _nests_deeper(tail: bytes, body: dict[str, Any]) -> bool:
    """wire.nests_deeper(body) of a body read from a known prefix: its fields before the messages
    are scalars (ResentBodies.learn), so every container below the body and its list of messages
    opens with a bracket of `tail` (strings' brackets counted too); with few of them, as a usual
    turn's two new messages have, it cannot nest too deep, and is not walked (issue 39)."""
    return tail.count(b"{") + tail.count(b"[") + 2 > wire.MAX_JSON_DEPTH and wire.nests_deeper(body)


def plain_exchange(messages: list[Any]) -> Exchange | None:
    """`usual_exchange(messages)` when `openai_schema.all_plain(messages)` too, else None, in one
    loop: a resent body's new messages are a few (a usual turn's two), for which the C-level
    passes of those two each cost more than this loop (~0.04 M instructions; issue 39). Each
    message a dict whose role is the user's or the assistant's, whose content is a str and whose
    "type", if any, is "message" (str values: the schema's plain test; those roles and that type:
    the usual message's)."""
    exchange: Exchange = []
    for message in messages:
        if type(message) is not dict:
            return None
        role, content = message.get("role"), message.get("content")
        if type(role) is not str or role not in USUAL_ROLES or type(content) is not str:
            return None
        if "type" in message and (type(message["type"]) is not str or message["type"] != "message"):
            return None
        exchange.append((role, content.strip()))
    return exchange or None


def _rest(raw: bytes | bytearray, known: Known, hashed: Any) -> Resent | None:
    """The body read on from the end of the known prefix; None when it is not as usual."""
    tail = bytes(raw[known.size:])
    text = tail.decode("utf-8", "surrogatepass")
    new: list[Any] = []
    i, last = _elements(text, 0, new)
    body = dict(known.head)
    body["messages"] = new
    while True:
        i, key, at = _member(text, i, False)
        if key is None:
            break
        if key == "messages":
            raise _Unusual  # a second list of messages: the body's is that one
        body[key], i = wire.SCAN_ONCE(text, at)
    if last < 0 or _WS(text, i).end() != len(text):
        raise _Unusual
    # The whole body's checks, of what is new (see the module's text): the prefix passed them.
    if _nests_deeper(tail, body) or (wire.may_hold_surrogate(tail) and lone_surrogate_at(body) is not None):
        return None
    exchange = plain_exchange(new)
    if exchange is None or exchange[-1][0] != "user":
        return None
    if openai_schema.problem(openai_schema.CHAT_COMPLETIONS, body, judged="messages") is not None:
        return None  # (the validator judges each plain message alike: the new ones judged, the body is)
    end = known.size + (last if tail.isascii() else len(text[:last].encode("utf-8", "surrogatepass")))
    return Resent(body, exchange[-1][1], ResentExchange(raw, known.count + len(exchange) - 1), known,
                  exchange[:-1], hashed, end)
