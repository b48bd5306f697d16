"""The frames of the `/_chat/routes` WebSocket protocol (Quarkus Chat Scopes compatible).

Client -> server:
    {"type": "Connect", "chatId": C, "route": R?}            chatrun extensions: "extensions",
                                                              "resume", "bot", "locale"
    {"type": "ChatRouteMessage", "chatId": C, "scopeId": S, "data": {"userMessage": "...", ...}}
    {"type": "Disconnect", "chatId": C}                       chatrun extension: "keep"
    {"type": "Decide", "chatId": C, "item": P, "decision": "approve"|"reject", "args"?, "reason"?}
    {"type": "Answer", "chatId": C, "item": P, "answer": V}   chatrun extensions: humans in the loop
    {"type": "ModelAnswer", "chatId": C, "ask": A, "text"|"tool"+"arguments"}   chatrun extension:
                                                              the author plays the model (play_model.py)
Any client frame may carry "requestId" (extension); the server echoes it on every frame
it sends for that request.

Server -> client:
    {"chatId": C, "type": T, "data": D}   T: Message, Object, Thinking, Console, Error, Stream,
                                          RouteChanged (extension) or a bot's custom type
    {"chatId": C, "type": "Completed", "data": <current scope id>}
    {"chatId": C, "type": "Failed", "data": <reason>}

By default a chat speaks the Quarkus dialect: it gets exactly the frames a Quarkus server
sends for the same flow. A Connect with "extensions": true asks for chatrun's extra frames for
that chat (RouteChanged, the full Message after Stream chunks, Error details, a Completed for
Disconnect). `Dialect` below is the whole difference; docs/protocol.md has the table.

The JSON Schema of every frame is schemas/wire.schema.json; docs/protocol.md explains it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from chatrun.definition.page_texts import BUILTIN as PAGE_TEXTS
from chatrun.engine.pending import reply_hint
from chatrun.engine.stream_chunks import READER, STREAM_EVERY_LIMITS, Pace
from chatrun.errors import DecisionRefused, HeldByAnother, InvalidDecision, NotPending

# The server's request errors, used as wire.RequestFailed and wire.FrameError (re-exported).
from chatrun.errors import FrameError as FrameError
from chatrun.errors import RequestFailed as RequestFailed
from chatrun.messages import lone_surrogate_at

CONNECT = "Connect"
CHAT_ROUTE_MESSAGE = "ChatRouteMessage"
DISCONNECT = "Disconnect"
DECIDE = "Decide"  # chatrun extension: {"item", "decision": "approve"|"reject", "args"?, "reason"?}
ANSWER = "Answer"  # chatrun extension: {"item", "answer"}
CANCEL = "Cancel"  # chatrun extension (extended dialect): stop the chat's running turn
FEEDBACK = "Feedback"  # chatrun extension: {"turn", "rating": "up"|"down", "comment"?}
MODEL_ANSWER = "ModelAnswer"  # chatrun extension: {"ask", "text"} or {"ask", "tool", "arguments"}
CLIENT_TYPES = (CONNECT, CHAT_ROUTE_MESSAGE, DISCONNECT, DECIDE, ANSWER, CANCEL, FEEDBACK, MODEL_ANSWER)
TURN_TYPES = (CHAT_ROUTE_MESSAGE, DECIDE, ANSWER)  # the requests that run a turn (what Cancel stops)

COMPLETED = "Completed"
FAILED = "Failed"
ERROR = "Error"

# Failed reasons. RouteNotFound, SessionNotActive and ServerError are the Quarkus cases (a
# Quarkus-dialect client gets Quarkus' spelling, see Dialect.reason); the others are chatrun's.
ROUTE_NOT_FOUND = "RouteNotFound"
SESSION_NOT_ACTIVE = "SessionNotActive"
SERVER_ERROR = "ServerError"
BAD_REQUEST = "BadRequest"
FORBIDDEN = "Forbidden"
TOO_LARGE = "TooLarge"
UNSUPPORTED_MEDIA_TYPE = "UnsupportedMediaType"  # an upload of a kind its route does not take
REQUEST_TIMEOUT = "RequestTimeout"  # a body that did not arrive in time
TOO_MANY_REQUESTS = "TooManyRequests"
SESSION_EXISTS = "SessionExists"
SCOPE_NOT_ACTIVE = "ScopeNotActive"
BOT_NOT_FOUND = "BotNotFound"
UNAUTHORIZED = "Unauthorized"
CANCELLED = "Cancelled"  # the turn was stopped by a Cancel frame: rolled back (docs/protocol.md, "Stop")
CONFLICT = "Conflict"  # the turn was not committed: the session changed meanwhile (fencing)
UNAVAILABLE = "Unavailable"  # the server is shutting down: send again (another replica serves it)
NOT_FOUND = "NotFound"  # no such thing (an outbox entry)
DECISION_REFUSED = "DecisionRefused"  # a decision on a pending item by someone who may not make it
NOT_PENDING = "NotPending"  # a decision on an item that is not pending (unknown, or resolved already)
HELD_BY_ANOTHER = "HeldByAnother"  # a takeover, operator message or release while another operator holds it
INVALID_DECISION = "InvalidDecision"  # edited arguments or an answer that do not validate (item stays pending)
KEY_REUSED = "IdempotencyKeyReused"  # an Idempotency-Key of a committed request sent with another request
EMPTY_MESSAGE = "EmptyMessage"  # a userMessage with no text and no attachment: no turn runs (says_nothing)

# HTTP status for each reason, so the REST API and the WebSocket fail the same way.
HTTP_STATUS = {
    NOT_FOUND: 404,
    ROUTE_NOT_FOUND: 404,
    SESSION_NOT_ACTIVE: 404,
    BOT_NOT_FOUND: 404,
    SERVER_ERROR: 500,
    BAD_REQUEST: 400,
    FORBIDDEN: 403,
    TOO_LARGE: 413,
    UNSUPPORTED_MEDIA_TYPE: 415,
    REQUEST_TIMEOUT: 408,
    TOO_MANY_REQUESTS: 429,
    SESSION_EXISTS: 409,
    SCOPE_NOT_ACTIVE: 409,
    UNAUTHORIZED: 401,
    CONFLICT: 409,
    UNAVAILABLE: 503,
    DECISION_REFUSED: 403,
    NOT_PENDING: 409,
    HELD_BY_ANOTHER: 409,
    INVALID_DECISION: 422,
    KEY_REUSED: 422,
    EMPTY_MESSAGE: 422,
}


RETRY_AFTER_S = 1  # what a 503 asks a client to wait before it sends the request again


def status_headers(status: int) -> dict[str, str] | None:
    """The headers a refusal's HTTP status carries, on every HTTP door (the HTTP API, /v1): a
    401's challenge; a 503's Retry-After (the server drains, or lacks the bot version a session
    runs on: the request sent again is served, by this replica later or by another)."""
    if status == 401:
        return {"WWW-Authenticate": "Bearer"}
    if status == 503:
        return {"Retry-After": str(RETRY_AFTER_S)}
    return None


def says_nothing(text: Any, attachments: Any) -> bool:
    """Whether a user message says nothing: no text (null, empty or only whitespace) and no
    attachment. The one rule of every door (HTTP, WebSocket, /v1, channels): such a message runs
    no turn, since the model would be asked to answer nothing (docs/protocol.md). A message
    with a file and no text still runs."""
    return not attachments and (text is None or (isinstance(text, str) and not text.strip()))


def nothing_said(field: str) -> str:
    """The refusal's text for a message that says nothing (says_nothing), naming its field."""
    return f"{field} is empty (no text and no attachment): send the user's text; no turn ran"


SHORTER = "send a shorter one"  # what to do about a text over --max-message-chars (message_too_long)


@dataclass(frozen=True)
class ServerLimits:
    """Guards on what one client may send. Each breach gets its own clear error."""

    max_frame_bytes: int = 64 * 1024  # one WebSocket frame / HTTP body
    max_message_chars: int = 8000  # the userMessage of one request
    max_in_flight: int = 8  # requests of one WebSocket connection being served at once
    max_chats_per_connection: int = 64  # chatIds attached to one WebSocket connection
    send_timeout: float = 20.0  # seconds a client may take to read a frame (see outbound.py)
    max_outbound_bytes: int = 1024 * 1024  # replies waiting to be sent on one connection
    model_answer_timeout: float = 900.0  # seconds the author playing the model may take (play_model.py)

    def message_too_long(self, text: str, field: str = "userMessage") -> str | None:
        """Why a user message is refused for its length, naming the limit and what to do, or None
        (one rule for every transport); `field` names where the door's request carries it."""
        if len(text) > self.max_message_chars:
            return (f"{field} of {len(text)} characters is over the limit of {self.max_message_chars} "
                    f"(--max-message-chars): {SHORTER}")
        return None


@dataclass
class ClientFrame:
    type: str
    chat_id: str
    route: str | None = None
    scope_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    request_id: Any = None
    resume: bool = False
    keep: bool = False
    bot: str | None = None
    extensions: bool = False
    locale: str | None = None  # Connect's `locale` (docs/i18n.md)
    if_busy: str | None = None  # chatrun extension "ifBusy": "queue" | "reject"
    item: str | None = None  # Decide / Answer: the pending item's id
    play_model: str | None = None  # a turn frame's "playModel": "auto" | "always" (server/play_model.py)
    stream_every: float | Pace | None = None  # a turn frame's "streamEvery": seconds, or READER (engine/stream_chunks.py)


def parse_frame(text: str | bytes | None, limits: ServerLimits) -> ClientFrame:
    """A client frame, checked. Raises FrameError saying what is wrong (with the chatId and
    requestId when they could be read, so the client can match the failure)."""
    fields = _FrameFields(_frame_object(text, limits))
    kind = fields.raw.get("type")
    if kind not in CLIENT_TYPES:
        raise fields.fail(f"unknown frame type {kind!r}; expected one of {', '.join(CLIENT_TYPES)}")
    chat_id = fields.raw.get("chatId")
    problem = chat_id_problem(chat_id)
    if problem:
        raise fields.fail(f"{kind} needs a chatId: {problem}")
    assert isinstance(chat_id, str)  # chat_id_problem checked it; this tells the type checker
    frame = ClientFrame(kind, chat_id, request_id=fields.request_id)
    if kind in TURN_TYPES:
        try:
            frame.play_model = _play_mode_of(fields.raw, kind)
            frame.stream_every = _stream_every_of(fields.raw, kind)
        except RequestFailed as exc:
            raise fields.fail(exc.message, exc.reason) from None
    if kind == CONNECT:
        _read_connect(frame, fields)
    elif kind == CHAT_ROUTE_MESSAGE:
        _read_chat_route_message(frame, fields, limits)
    elif kind in (DECIDE, ANSWER):
        _read_decision(frame, fields)
    elif kind == FEEDBACK:
        try:
            frame.data = feedback_of(fields.raw, "Feedback")
        except RequestFailed as exc:
            raise fields.fail(exc.message, exc.reason) from None
    elif kind == MODEL_ANSWER:
        try:
            frame.data = _model_answer_of(fields.raw)
        except RequestFailed as exc:
            raise fields.fail(exc.message, exc.reason) from None
    elif kind == CANCEL:
        pass
    else:
        frame.keep = fields.flag(kind, "keep")
    return frame


def _frame_object(text: str | bytes | None, limits: ServerLimits) -> dict[str, Any]:
    """The frame's JSON object: text within the size limit, valid JSON, an object."""
    if text is None or isinstance(text, bytes | bytearray):
        raise FrameError(BAD_REQUEST, "frames are JSON text, not binary")
    size = len(text) if text.isascii() else len(text.encode())  # isascii reads a flag; encode copies
    if size > limits.max_frame_bytes:
        raise FrameError(TOO_LARGE, f"frame of {size} bytes is over the limit of {limits.max_frame_bytes} bytes")
    try:
        raw = load_json(text, "frame")
    except RequestFailed as exc:
        raise FrameError(exc.reason, exc.message) from None
    if not isinstance(raw, dict):
        raise FrameError(BAD_REQUEST, f"a frame is a JSON object, not {type(raw).__name__}")
    return raw


class _FrameFields:
    """A frame's fields, read one by one; a failure carries the frame's chatId and requestId
    when they are usable, so the client can match it."""

    def __init__(self, raw: dict[str, Any]):
        self.raw = raw
        chat_id, request_id = raw.get("chatId"), raw.get("requestId")
        self.safe_chat = chat_id if isinstance(chat_id, str) else None
        if request_id is not None and (isinstance(request_id, bool) or not isinstance(request_id, str | int)):
            raise FrameError(BAD_REQUEST, "requestId must be a string or an integer", self.safe_chat)
        self.request_id = request_id

    def fail(self, message: str, reason: str = BAD_REQUEST) -> FrameError:
        asks = self.raw.get("type") == CONNECT and self.raw.get("extensions") is True
        return FrameError(reason, message, self.safe_chat, self.request_id, extensions=asks)

    def flag(self, kind: str, name: str) -> bool:
        value = self.raw.get(name, False)
        if not isinstance(value, bool):
            raise self.fail(f"{kind}.{name} must be true or false, not {json.dumps(value)}")
        return value


def _read_connect(frame: ClientFrame, fields: _FrameFields) -> None:
    route, bot = fields.raw.get("route"), fields.raw.get("bot")
    if route is not None and not isinstance(route, str):
        raise fields.fail("Connect.route must be a string (a route name) or absent")
    if bot is not None and not isinstance(bot, str):
        raise fields.fail("Connect.bot must be a string (a bot name) or absent")
    frame.route = route or None
    frame.bot = bot
    locale = fields.raw.get("locale")
    if locale is not None and not isinstance(locale, str):
        raise fields.fail("Connect.locale must be a string (a locale such as de or pt-BR) or absent")
    frame.locale = locale or None
    frame.resume = fields.flag(CONNECT, "resume")
    frame.extensions = fields.flag(CONNECT, "extensions")


def _read_chat_route_message(frame: ClientFrame, fields: _FrameFields, limits: ServerLimits) -> None:
    data = fields.raw.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise fields.fail("ChatRouteMessage.data must be a JSON object, e.g. {\"userMessage\": \"hi\"}")
    message = data.get("userMessage")
    if message is not None and not isinstance(message, str):
        raise fields.fail("ChatRouteMessage.data.userMessage must be a string")
    too_long = limits.message_too_long(message) if isinstance(message, str) else None
    if too_long:
        raise fields.fail(too_long, TOO_LARGE)
    if "userMessage" in data and says_nothing(message, data.get("attachments")):
        raise fields.fail(nothing_said("ChatRouteMessage.data.userMessage"), EMPTY_MESSAGE)
    scope_id = fields.raw.get("scopeId")
    if scope_id is not None and not isinstance(scope_id, str):
        raise fields.fail("ChatRouteMessage.scopeId must be a string (the data of the last Completed)")
    if_busy = fields.raw.get("ifBusy")
    if if_busy is not None and if_busy not in ("queue", "reject"):
        raise fields.fail(f"ChatRouteMessage.ifBusy must be \"queue\" or \"reject\", not {json.dumps(if_busy)}")
    frame.data = data
    frame.scope_id = scope_id
    frame.if_busy = if_busy


DECISION_ERRORS = (DecisionRefused, NotPending, InvalidDecision, HeldByAnother)


def decision_failed(exc: DecisionRefused | NotPending | InvalidDecision | HeldByAnother) -> RequestFailed:
    """The request failure of a decision the engine refused before its turn ran (nothing
    committed): the same reason on every transport (HTTP 403, 409, 422)."""
    reason = {DecisionRefused: DECISION_REFUSED, NotPending: NOT_PENDING,
              HeldByAnother: HELD_BY_ANOTHER}.get(type(exc), INVALID_DECISION)
    return RequestFailed(reason, str(exc))


def _read_decision(frame: ClientFrame, fields: _FrameFields) -> None:
    """Decide and Answer: the item's id, and the body POST .../pending/{item} takes (its
    fields are checked where that body is, server/pending_api.decision_of)."""
    item = fields.raw.get("item")
    if not isinstance(item, str) or not item:
        raise fields.fail(f"{frame.type} needs an item: the id of a pending item (e.g. \"p1\")")
    if frame.type == ANSWER and "answer" not in fields.raw:
        raise fields.fail("Answer needs an answer (any JSON value the item's schema accepts)")
    names = ("answer",) if frame.type == ANSWER else ("decision", "args", "reason")
    unknown = sorted(set(fields.raw) - {"type", "chatId", "requestId", "playModel", "streamEvery", "item", *names})
    if unknown:  # a misspelt `reason` would be dropped and the item decided without it
        raise fields.fail(f"{frame.type} has no field {unknown[0]!r}; it takes item, {', '.join(names)}")
    frame.data = {name: fields.raw[name] for name in names if name in fields.raw}
    frame.item = item


PLAY_MODES = ("auto", "always")  # a turn frame's playModel (server/play_model.py)


def _model_answer_of(raw: dict[str, Any]) -> dict[str, Any]:
    """A ModelAnswer frame's fields, checked: `ask` (the ModelRequest's), and `text` or `tool`
    with `arguments` (a JSON object). RequestFailed(BadRequest) saying what is wrong."""
    unknown = sorted(set(raw) - {"type", "chatId", "requestId", "ask", "text", "tool", "arguments"})
    if unknown:
        raise RequestFailed(BAD_REQUEST, f"ModelAnswer has no field {unknown[0]!r}; it takes ask, "
                                                   "text, or tool and arguments")
    ask, text, tool, arguments = raw.get("ask"), raw.get("text"), raw.get("tool"), raw.get("arguments", {})
    if not isinstance(ask, str) or not ask:
        raise RequestFailed(BAD_REQUEST, "ModelAnswer needs ask: the id of the ModelRequest it answers")
    if (text is None) == (tool is None):
        raise RequestFailed(BAD_REQUEST, 'ModelAnswer takes either text (the model\'s reply) or tool '
                                                   '(a tool\'s name, with arguments: {"key": "value"})')
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise RequestFailed(BAD_REQUEST, "ModelAnswer.text must be the model's reply: non-empty text")
    if tool is not None and (not isinstance(tool, str) or not tool):
        raise RequestFailed(BAD_REQUEST, "ModelAnswer.tool must be the name of a tool the request offered")
    if not isinstance(arguments, dict):
        raise RequestFailed(BAD_REQUEST, 'ModelAnswer.arguments must be a JSON object, e.g. {"seat": "12A"}')
    out: dict[str, Any] = {"ask": ask}
    if tool is not None:
        out.update(tool=tool, arguments=arguments)
    else:
        out["text"] = text
    return out


def _play_mode_of(raw: dict[str, Any], kind: str) -> str | None:
    """A turn frame's `playModel`: "auto", "always" or absent."""
    mode = raw.get("playModel")
    if mode is not None and mode not in PLAY_MODES:
        raise RequestFailed(BAD_REQUEST, f'{kind}.playModel must be "auto" or "always", not {json.dumps(mode)}')
    return mode


def _stream_every_of(raw: dict[str, Any], kind: str) -> float | Pace | None:
    """A turn frame's `streamEvery`: milliseconds between Stream events, 50 to 1000, "reader" (the
    pace of a page a person reads: READER), or absent."""
    every = raw.get("streamEvery")
    if every is None:
        return None
    if every == "reader":
        return READER
    low, high = (round(limit * 1000) for limit in STREAM_EVERY_LIMITS)
    if isinstance(every, bool) or not isinstance(every, int | float) or not low <= every <= high:
        raise RequestFailed(BAD_REQUEST, f"{kind}.streamEvery must be milliseconds between Stream events, "
                                         f'{low} to {high}, or "reader", not {json.dumps(every)}')
    return every / 1000


MAX_COMMENT = 2000  # characters of a feedback comment
RATINGS = ("up", "down")


def feedback_of(raw: dict[str, Any], what: str) -> dict[str, Any]:
    """A Feedback frame's or POST .../feedback body's fields, checked: `turn` (the rated bot
    turn's number), `rating` ("up" or "down"), optional `comment` (text). RequestFailed(BadRequest)."""
    unknown = sorted(set(raw) - {"type", "chatId", "requestId", "turn", "rating", "comment"})
    if unknown:
        raise RequestFailed(BAD_REQUEST, f"{what} has no field {unknown[0]!r}; it takes turn, rating, comment")
    turn, rating, comment = raw.get("turn"), raw.get("rating"), raw.get("comment")
    if isinstance(turn, float) and turn.is_integer():  # JSON's 3.0 is the integer 3 (as JSON Schema reads it)
        turn = int(turn)
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
        raise RequestFailed(BAD_REQUEST, f"{what}.turn must be the number of the rated turn (1 or more), "
                                         f"not {json.dumps(turn)}")
    if rating not in RATINGS:
        raise RequestFailed(BAD_REQUEST, f"{what}.rating must be \"up\" or \"down\", not {json.dumps(rating)}")
    if comment is not None and not isinstance(comment, str):
        raise RequestFailed(BAD_REQUEST, f"{what}.comment must be text or absent")
    if comment is not None and len(comment) > MAX_COMMENT:
        raise RequestFailed(TOO_LARGE, f"{what}.comment has {len(comment)} characters; at most {MAX_COMMENT}")
    return {"turn": turn, "rating": rating, **({"comment": comment} if comment else {})}


MAX_CHAT_ID = 128


# The sessions of channels' conversations (server/channels): `ch-` and 32 hex digits, a digest
# of the bot, the kind and the platform's conversation, which anyone can compute (a WhatsApp
# user's is their phone number's). Only a channel starts one: another door that took such an id
# first would make that conversation's every message answer 404, dropped unanswered.
CHANNEL_SESSION_PREFIX = "ch-"
_CHANNEL_SESSION_ID = re.compile(r"ch-[0-9a-f]{32}")


def channel_session_id(digest: str) -> str:
    """A channel conversation's session id, from a hex digest (its first 32 digits)."""
    return CHANNEL_SESSION_PREFIX + digest[:32]


def refuse_reserved_id(session_id: str) -> None:
    """BadRequest when a client would start a session under a channel's id (whether or not it
    exists: the refusal tells nothing of a conversation)."""
    if _CHANNEL_SESSION_ID.fullmatch(session_id):
        raise RequestFailed(BAD_REQUEST, f"session id {session_id!r} is reserved: ids of the form ch- and 32 hex "
                            "digits are the sessions of channels' conversations (docs/channels.md); "
                            "start yours under another id")


def chat_id_problem(value: Any) -> str | None:
    """What is wrong with a chatId / session id, or None. The same rule for WebSocket and HTTP,
    so every session can be reached by both (ids appear in URL paths: no slash)."""
    if not isinstance(value, str) or not value.strip():
        return "a non-empty string"
    if len(value) > MAX_CHAT_ID:
        return f"at most {MAX_CHAT_ID} characters, not {len(value)}"
    if "/" in value:
        return "no '/' (ids appear in URL paths)"
    if value in (".", ".."):
        # a path segment of its own: URL normalization would read it as this or the parent path
        return "not '.' or '..' (ids appear in URL paths)"
    return None


MAX_JSON_DEPTH = 64


def load_json(text: str | bytes | bytearray, what: str,
              decode: Callable[[str | bytes | bytearray, str | None], Any] | None = None) -> Any:
    """Client JSON, or RequestFailed(BadRequest) saying what is wrong: not JSON, NaN or
    Infinity (which no store can keep), or nested deeper than MAX_JSON_DEPTH. `decode`: one
    that decodes as `json.loads` does, the same value or the same error, and notes more
    (server/openai_resent.py: where a body's messages end)."""
    encoding = None if isinstance(text, str) else _encoding_of(text)
    try:
        value = (decode or _decode)(text, encoding)
    except json.JSONDecodeError as exc:
        raise RequestFailed(BAD_REQUEST, f"{what} is not valid JSON: {exc.msg} at character {exc.pos}") from None
    except (ValueError, RecursionError) as exc:
        reason = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise RequestFailed(BAD_REQUEST, f"{what} is not valid JSON: {reason}") from None
    if _may_nest_deeper(text, MAX_JSON_DEPTH) and _nests_deeper(text, encoding, value, MAX_JSON_DEPTH):
        raise RequestFailed(BAD_REQUEST, f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
    where = lone_surrogate_at(value) if _may_hold_surrogate(text, encoding) else None
    if where is not None:
        raise RequestFailed(
            BAD_REQUEST, f"{what} is not valid text: {where or 'it'} holds a lone UTF-16 surrogate (\\ud800-\\udfff)"
        )
    return value


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# json.loads given an option builds a decoder (and its scanner) on every call: one, made once.
_DECODER = json.JSONDecoder(parse_constant=_no_constants)
# Its scanner: one JSON value at an index of a str, (value, the index after it), as the decoder reads
# each value of a text (StopIteration or JSONDecodeError where there is none).
SCAN_ONCE: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]


def nests_deeper(value: Any) -> bool:
    """Whether a decoded JSON value nests deeper than MAX_JSON_DEPTH (load_json's check)."""
    return _deeper_than(value, MAX_JSON_DEPTH)


def decode_json(text: str | bytes | bytearray, encoding: str | None = None) -> Any:
    """What load_json decodes with: json.loads(text) refusing NaN and Infinity."""
    return _decode(text, encoding)


def _decode(text: str | bytes | bytearray, encoding: str | None = None) -> Any:
    """json.loads(text, parse_constant=_no_constants), step for step, with the decoder made once
    (`encoding`: the bytes' own, as _encoding_of says)."""
    if isinstance(text, str):
        if text.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    else:
        text = text.decode(encoding or _encoding_of(text), "surrogatepass")
    return _DECODER.decode(text)


def _encoding_of(data: bytes | bytearray) -> str:
    """json.detect_encoding(data), its usual answer without its Python-level tests: bytes whose
    first is ASCII and not NUL and whose second is not NUL start no BOM and no UTF-16 or UTF-32
    text, so they are UTF-8 (tests/test_wire_codec.py holds it to json.detect_encoding)."""
    if len(data) >= 2 and 0 < data[0] < 0x80 and data[1]:
        return "utf-8"
    return json.detect_encoding(data)


# The surrogate check screens the text first (C speed), and the depth check walks containers
# only, level by level: walking every value of a 40-turn /v1 request twice in Python cost
# 0.13 ms, growing with the conversation.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # maybe \uD800-\uDFFF (or an escaped backslash)
# In UTF-8 bytes: an escape of one, or a surrogate's own bytes (json.loads decodes them with surrogatepass).
# Two searches, not one alternation: each starts from a literal the engine finds fast, where an
# alternation tries both at every byte (9 KB of a /v1 request: 51 against 3.4 µs).
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
_UTF8_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


def _may_hold_surrogate(text: str | bytes | bytearray, encoding: str | None = None) -> bool:
    """False when no string json.loads makes of `text` can hold a lone surrogate: the text has
    none itself and no escape of one (True only means: walk the values to find out). Bytes are
    screened as they are, not decoded first: a body with files is large (`encoding`: theirs,
    as _encoding_of says)."""
    if isinstance(text, str):
        if _SURROGATE_ESCAPE.search(text) is not None:
            return True
        if text.isascii():  # no surrogate in it (one would not be ASCII): no copy to encode
            return False
        try:
            text.encode()
        except UnicodeEncodeError:
            return True
        return False
    if (encoding or _encoding_of(text)) != "utf-8":
        return True  # UTF-16 or UTF-32: walked
    if _SURROGATE_ESCAPE_BYTES.search(text) is not None:
        return True
    return b"\xed" in text and _UTF8_SURROGATE.search(text) is not None


def may_hold_surrogate(text: str | bytes | bytearray) -> bool:
    """load_json's screen: False when no string decoded from `text` can hold a lone surrogate."""
    return _may_hold_surrogate(text)


def _may_nest_deeper(text: str | bytes | bytearray, limit: int) -> bool:
    """False when the JSON of `text` cannot nest containers deeper than `limit` levels: each
    container opens with a bracket of its own, so text with at most `limit` of them (counted in
    C, strings' brackets too) cannot; a request's body of a few keys has none to walk."""
    if isinstance(text, str):
        return text.count("{") + text.count("[") > limit
    return text.count(b"{") + text.count(b"[") > limit


# The depth check reads the text the value was decoded from, in C: the walk of the values below
# costs as much as the decode itself for a /v1 request resending 80 messages (~0.4 M instructions,
# each value visited by Python code; issue 39). Valid JSON (the text decoded) nests its brackets
# properly outside its strings, so the containers' depth is the brackets' once strings are gone.
_STRUCTURE = b'"[]{}'
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(_STRUCTURE)))
_OPEN_CLOSE = bytes.maketrans(b"[]{}", b"()()")


# Above this many characters the values are walked: a large body is large for its strings (files
# as base64), which the walk passes over and the text's reading would copy and scan byte by byte.
_TEXT_DEPTH_MAX = 1 << 16


def _nests_deeper(text: str | bytes | bytearray, encoding: str | None, value: Any, limit: int) -> bool:
    """Whether the JSON `value`, decoded from `text` (bytes in `encoding`), nests deeper than
    `limit`: read from the text (`_text_deeper_than`) when it is a str or UTF-8 of at most
    _TEXT_DEPTH_MAX characters, where an ASCII byte is that character; else its values walked
    (UTF-16 and UTF-32 texts are rare; a large body is large for its strings)."""
    if len(text) <= _TEXT_DEPTH_MAX and (encoding is None or encoding == "utf-8"):
        return _text_deeper_than(text, limit)
    return _deeper_than(value, limit)


def _text_deeper_than(text: str | bytes | bytearray, limit: int) -> bool:
    """`_deeper_than(json.loads(text), limit)`, read from `text`, which must be valid JSON: its
    strings taken out (escaped backslashes, then escaped quotes, then every byte but quotes and
    brackets; what lies between two quotes), each bracket one parenthesis, then one level of
    innermost "()" pairs removed per pass: the text is empty after `depth` passes."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if b"\\" in data:  # (one byte: found by memchr) escapes, whose quotes end no string
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = data.translate(None, _NOT_STRUCTURE)
    # Two quotes side by side part nothing: an empty string, or two strings with no bracket between.
    skeleton = skeleton.replace(b'""', b"")
    if b'"' in skeleton:  # strings holding brackets: keep what lies outside them
        skeleton = b"".join(skeleton.split(b'"')[::2])
    skeleton = skeleton.translate(_OPEN_CLOSE)
    for _ in range(limit):
        if not skeleton:
            return False
        skeleton = skeleton.replace(b"()", b"")
    return bool(skeleton)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON `value` nests containers deeper than `limit` levels (the top one is level 1)."""
    level = [value] if type(value) is dict or type(value) is list else []
    for _ in range(limit):
        inner: list[Any] = []
        for item in level:
            inner += [v for v in (item.values() if type(item) is dict else item) if type(v) is dict or type(v) is list]
        if not inner:
            return False
        level = inner
    return bool(level)


# -- dialects: what a Quarkus client sees, and what an extension-aware client sees ---------------

QUARKUS_REASONS = {ROUTE_NOT_FOUND: "Route not found", SCOPE_NOT_ACTIVE: SESSION_NOT_ACTIVE}
STREAM = "Stream"
MESSAGE = "Message"
ROUTE_CHANGED = "RouteChanged"
PENDING = "Pending"  # events.PENDING
RESOLVED = "Resolved"  # events.RESOLVED
CHOICES = "Choices"  # events.CHOICES


def written_out(item: Any) -> str:
    """A pending item as text, for a client without buttons (the Quarkus dialect, /v1): what
    the user is told (the user's Pending carries their text in `ask`, engine/pending.py
    `for_user`), and when they answer it, how (its `reply`: "Reply approve or reject.", or the
    choices' labels, in their locale). The user's next message is the answer (docs/format.md,
    "Messages while something is pending")."""
    if not isinstance(item, dict):
        return str(item)
    text = str(item.get("ask") or "")
    if "user" not in (item.get("by") or ()):
        return text
    # A Pending stored before chatrun wrote `reply` into the user's copy gets the English hint.
    hint = item["reply"] if "reply" in item else reply_hint(item, PAGE_TEXTS["en"])
    return f"{text}\n\n{hint}" if hint else text


@dataclass(frozen=True)
class Dialect:
    """The frames one chat is sent. `extensions=False` (the default, the Quarkus dialect): only
    what a Quarkus server sends for the same flow, with its Failed spellings. `True` (asked for
    in Connect): chatrun's extra frames too. Requests themselves are served the same way."""

    extensions: bool

    def reason(self, reason: str) -> str:
        """The Failed data for a reason: Quarkus' spelling where Quarkus has the case."""
        return reason if self.extensions else QUARKUS_REASONS.get(reason, reason)

    def failure(self, reason: str, message: str) -> list[tuple[str, Any]]:
        """The frames of a request that cannot be served: one Failed, after an Error saying why
        (an extension: the Quarkus runtime never sends Error, and a Quarkus page with no
        errorHandler breaks on frame types it has no handler for)."""
        failed = (FAILED, self.reason(reason))
        return [(ERROR, message), failed] if self.extensions else [failed]

    @property
    def answers_disconnect(self) -> bool:
        """Quarkus sends no frame for a Disconnect; the extension answers Completed(null)."""
        return self.extensions

    @property
    def tells_resumed_route(self) -> bool:
        """A resume is answered with RouteChanged (an extension) before its Completed."""
        return self.extensions

    def turn(self) -> TurnFrames:
        return TurnFrames(self)


class TurnFrames:
    """Which events of one turn a chat is sent, in order. The Quarkus dialect drops
    RouteChanged and chatrun's own Error events (a failed turn's reason, a refused action: the
    Quarkus runtime never sends Error; a bot's emitted Error is an application event and goes
    out). A streamed reply reaches it as a Quarkus route's would: one Message (a route returning
    String), or, from a route with `stream_to_quarkus: true` (Multi<String>), its Stream chunks
    and, instead of the full Message that follows them, what the Message adds to them as a last
    chunk (a guarded reply released a sentence at a time streams only its checked sentences:
    the rest, and a guardrail's message, are only in the Message)."""

    def __init__(self, dialect: Dialect):
        self.dialect = dialect
        self._after_multi = False
        self._streamed = ""  # the text of the Multi chunks just sent

    def out(self, event: Any) -> tuple[str, Any] | None:
        """The frame (type, data) a chat is sent for an event, or None. The Quarkus dialect
        gets a Pending as the Message a Quarkus route would send to ask (`written_out`) and
        no Resolved: the user's next message answers."""
        after_multi, streamed = self._after_multi, self._streamed
        self._after_multi = event.type == STREAM and bool(getattr(event, "multi", False))
        self._streamed = streamed + str(event.data) if self._after_multi else ""
        if self.dialect.extensions:
            return event.type, event.data
        if not self.keep(event):
            return None
        if event.type == PENDING:
            return MESSAGE, written_out(event.data)
        if event.type == MESSAGE and after_multi:  # the Multi's end: what the Message adds, as a last chunk
            text = str(event.data)
            rest = text[len(streamed):] if text.startswith(streamed) else ""
            return (STREAM, rest) if rest else None
        return event.type, event.data

    def keep(self, event: Any) -> bool:
        """Whether the Quarkus dialect sends anything for an event."""
        if event.type in (ROUTE_CHANGED, RESOLVED):
            return False
        # chatrun's own Error, and the Yes/No of a confirmation, which its Pending's Message writes out
        if event.type in (ERROR, CHOICES) and getattr(event, "runtime", False):
            return False
        if event.type == STREAM:
            return bool(getattr(event, "multi", False))
        return True


QUARKUS_DIALECT = Dialect(extensions=False)
EXTENDED_DIALECT = Dialect(extensions=True)


def dialect(extensions: bool) -> Dialect:
    return EXTENDED_DIALECT if extensions else QUARKUS_DIALECT


def server_frame(chat_id: str | None, kind: str, data: Any, request_id: Any = None,
                 ran: list[str] | None = None) -> str:
    """A frame's JSON. `ran` (the extended dialect's Failed of a turn that failed after tools with
    an outside effect ran): their names, so a client does not offer the message to send again."""
    out: dict[str, Any] = {"chatId": chat_id, "type": kind, "data": data}
    if request_id is not None:
        out["requestId"] = request_id
    if ran:
        out["ran"] = ran
    return _encode_frame(out)  # event data is plain JSON already (events.plain)


def encoder_made_once(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """`encoder.encode`, the same text and refusals, without what it builds anew on every call (a
    closure and the C encoder: ~2/3 of a small frame's encoding, a few frames and a reply a turn):
    the C encoder made once. No circular-reference check: what it encodes is plain JSON built here
    (a frame's data: events.plain; a reply's body). Without the C accelerator, `encoder.encode`."""
    if c_make_encoder is None or encoder.indent is not None:  # pragma: no cover - CPython has it
        return encoder.encode
    basestring = encode_basestring_ascii if encoder.ensure_ascii else encode_basestring
    chunks = c_make_encoder(None, encoder.default, basestring, None, encoder.key_separator,
                            encoder.item_separator, encoder.sort_keys, encoder.skipkeys, encoder.allow_nan)

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


_encode_frame = encoder_made_once(json.JSONEncoder(ensure_ascii=False))


def turn_input(data: dict[str, Any]) -> str | dict[str, Any] | None:
    """What a request hands the engine: the bare text when only userMessage came (so the
    history reads as text), else the whole mapping (a route's `user:` template reads it)."""
    if not data:
        return None
    if set(data) == {"userMessage"}:
        text: str = data["userMessage"]
        return text
    return data
