"""Humans in the loop over HTTP: a session's pending items, decisions and answers, an
operator's takeover, and the operators' list of waiting sessions (docs/protocol.md, "Pending
items"; docs/operators.md).

    GET  /bots/{bot}/sessions/{id}/pending             {"pending": [item, ...], "taken_over": ...}
    POST /bots/{bot}/sessions/{id}/pending/{item}      {"decision": "approve"|"reject", "args"?, "reason"?}
                                                       or {"answer": value}       -> the turn, as POST .../messages
    POST /bots/{bot}/sessions/{id}/takeover            {"note"?, "force"?}        -> the turn
    POST /bots/{bot}/sessions/{id}/operator/messages   {"text"}                   -> the turn
    POST /bots/{bot}/sessions/{id}/release             {"route"?}                 -> the turn
    GET  /pending/stream?bot=&kind=&limit=&order=      server-sent events: `inbox`, the first page, when it changes
    GET  /bots/{bot}/sessions/{id}/canned              the bot's `canned:` replies in the session's locale
    POST /bots/{bot}/sessions/{id}/typing              {"typing": bool, "as"?: "operator"} (kept 6 s)
    GET  /bots/{bot}/sessions/{id}/typing              {"operator": name or null, "user": bool}
    GET  /pending?bot=&kind=&role=&older_than=&limit=&cursor=&order=
                                                       the waiting sessions, longest waiting first (or
                                                       order=recent: newest activity first), a page at a
                                                       time (role `operators`): {"sessions", "next": the
                                                       cursor of the next page, or null}

A decision is a turn (`session.stream(Approve(...))`), so it is fenced, committed and replayed
by `Idempotency-Key` exactly like a user's message. Who may reach a session that is not theirs
for this is session_open.Reach's rule; who may decide what is the engine's (DecisionRefused:
403; NotPending: 409; InvalidDecision: 422, turn_run maps them). A backend that has no
principal answers a question with `Authorization: Bearer <the item's token>`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from chatrun.definition.templates import CATALOGS_KEY, render
from chatrun.engine.pending import (
    KINDS,
    TAKEOVER,
    Answer,
    Approve,
    OperatorSay,
    PendingItem,
    Reject,
    Release,
    TakeOver,
    parse_time,
)
from chatrun.engine.waiting import handover_roles
from chatrun.server import wire
from chatrun.server.audience import OPERATOR_ROLE
from chatrun.server.auth import Principal
from chatrun.server.http import ERROR_RESPONSES, _body, turn_reply
from chatrun.server.inspect import pending_data
from chatrun.server.plumbing import Caller, CallerOrToken, Registry, limits_of, read_json_object
from chatrun.server.sessions import EXISTING, Reach
from chatrun.store.record import (
    CURSOR_PATTERN,
    PendingSession,
    decode_cursor,
    encode_cursor,
    recent_key,
    waiting_key,
)

PAGE_SIZE = 100  # GET /pending's sessions per page unless `limit` says
MAX_PAGE = 1000

IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", description="a retry with the same key replays the committed decision")]

_ITEM = {"type": "object", "description": "a pending item (docs/protocol.md, \"Pending items\")",
         "required": ["id", "kind", "created", "due", "route", "ask", "by"],
         "properties": {"id": {"type": "string"}, "kind": {"enum": list(KINDS)}, "created": {"type": "string"},
                        "due": {"type": ["string", "null"]}, "route": {"type": "string"},
                        "scope_id": {"type": "string"}, "tool": {"type": ["string", "null"]},
                        "call_id": {"type": ["string", "null"]}, "args": {"type": ["object", "null"]},
                        "ask": {"type": "string"}, "by": {"type": "array", "items": {"type": "string"}},
                        "tell": {"type": "string", "description": "what the user reads while others decide"},
                        "edit": {"type": "array", "items": {"type": "string"}},
                        "schema": {"type": ["object", "null"]}, "choices": {"type": ["array", "null"]},
                        "requested_by": {"type": ["object", "null"]},
                        "held": {"type": "object", "description": "decided during a takeover, applied on release: "
                                 "{kind, by, at}"}}}
_TAKEN_OVER = {"type": ["object", "null"], "properties": {"by": {}, "since": {"type": "string"}}}
_LAST = {"type": ["object", "null"], "description": "the session's last turn: {at (epoch seconds), from "
         "(user, operator or decision), text (the message, or the decision's kind); an operator's message also "
         "has by (the operator's name, null when no one signed in: compare it with `you`)}"}
_TEXT = {"type": "string", "minLength": 1}  # _text_field
_REASON = {"type": "string", "description": "why: the history and the model's conditions see it"}
_FORCE = {"type": "boolean", "default": False,
          "description": "take the conversation from the operator who holds it (announced to the user: the "
                         "holder leaves, you join); without it a held conversation is refused 409 HeldByAnother"}
_DECISION_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"oneOf": [
        {"type": "object", "required": ["decision"], "additionalProperties": False,
         "properties": {"decision": {"const": "approve"}, "reason": _REASON,
                        "args": {"type": "object", "description": "edited arguments (the approval's `edit:`)"}}},
        {"type": "object", "required": ["decision"], "additionalProperties": False,
         "properties": {"decision": {"const": "reject"}, "reason": _REASON}},
        {"type": "object", "required": ["answer"], "additionalProperties": False,
         "properties": {"answer": {"description": "the answer to a question (validated against its schema)"}}}]},
    "example": {"decision": "approve", "args": {"amount": 40}, "reason": "checked the order"}}}}}


def make_pending_router() -> APIRouter:
    """The routes of the module's text, with their bodies in the OpenAPI text."""
    router = APIRouter(responses=ERROR_RESPONSES, tags=["pending"])
    session = "/bots/{bot}/sessions/{session_id}"
    router.add_api_route(f"{session}/pending", list_session_pending, methods=["GET"],
                         responses=_json(200, "the session's open items", {
                             "pending": {"type": "array", "items": _ITEM}, "taken_over": _TAKEN_OVER}))
    router.add_api_route(f"{session}/pending/{{item}}", decide, methods=["POST"], openapi_extra=_DECISION_BODY)
    router.add_api_route(f"{session}/takeover", take_over, methods=["POST"],
                         openapi_extra=_body({"note": _TEXT, "force": _FORCE}, {"note": "customer asked for a human"}))
    router.add_api_route(f"{session}/operator/messages", operator_says, methods=["POST"],
                         openapi_extra=_required_body({"text": _TEXT}, {"text": "Hello, this is Olga from support."}))
    router.add_api_route(f"{session}/release", release, methods=["POST"],
                         openapi_extra=_body({"route": _TEXT}, {"route": "menu"}))
    router.add_api_route(f"{session}/canned", canned_replies, methods=["GET"],
                         responses=_json(200, "the bot's canned replies in the session's locale", {
                             "canned": {"type": "array", "items": {"type": "object", "properties": {
                                 "name": {"type": "string"}, "text": {"type": "string"}}}}}))
    router.add_api_route(f"{session}/typing", set_typing, methods=["POST"],
                         openapi_extra=_body({"typing": {"type": "boolean"}, "as": {"enum": ["user", "operator"]}},
                                             {"typing": True}, required=("typing",), closed=True))
    router.add_api_route(f"{session}/typing", read_typing, methods=["GET"],
                         responses=_json(200, "who is typing: the operator (their name) and the user", {
                             "operator": {"type": ["string", "null"]}, "user": {"type": "boolean"}}))
    router.add_api_route("/pending/stream", pending_stream, methods=["GET"],
                         response_class=StreamingResponse, responses={200: {
                             "description": "Server-sent events: `inbox` with the first page (as GET /pending "
                                            "with the same query) whenever it changes",
                             "content": {"text/event-stream": {}}}})
    router.add_api_route("/pending", list_all_pending, methods=["GET"],
                         responses=_json(200, "the waiting sessions, longest waiting first, one page", {
                             "sessions": {"type": "array", "items": {"type": "object", "properties": {
                                 "session": {"type": "string"}, "bot": {"type": "string"},
                                 "owner": {"type": ["string", "null"]}, "items": {"type": "array", "items": _ITEM},
                                 "taken_over": _TAKEN_OVER, "last": _LAST}}},
                             "next": {"type": ["string", "null"],
                                      "description": "pass as `cursor` for the next page (null: the last page)"},
                             "you": {"type": ["string", "null"], "description": "the caller's name (null: no one "
                                     "signed in), so a page tells its own messages (`last.by`) from others'"}}))
    return router


# -- the endpoints (no docstrings: FastAPI would put them in the OpenAPI text) -----------------------


async def list_session_pending(bot: str, session_id: str, caller: CallerOrToken, registry: Registry) -> Any:
    who, token = caller
    async with registry.session(bot, session_id, who, EXISTING, reach=Reach(pending=True, token=token)) as session:
        return pending_data(session)


async def decide(bot: str, session_id: str, item: str, request: Request, caller: CallerOrToken, registry: Registry,
                 idempotency_key: IdempotencyKey = None) -> JSONResponse:
    who, token = caller
    # The bearer token is an item's only when it names no principal: a principal's own token
    # proves who they are, never that they are the backend (engine/waiting.py check_decision).
    decision = decision_of(item, await read_json_object(request), token if who is None else None, limits_of(request))
    async with registry.session(bot, session_id, who, EXISTING, reach=Reach(pending=True, token=token)) as session:
        return await turn_reply(registry, session, decision, idempotency_key)


async def take_over(bot: str, session_id: str, request: Request, who: Caller, registry: Registry,
                    idempotency_key: IdempotencyKey = None) -> JSONResponse:
    body = await read_json_object(request, blank_is_empty=True)
    note = _text_field(body, "note", required=False)
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise wire.RequestFailed(wire.BAD_REQUEST, "force must be true or false (true: take the conversation "
                                 "from the operator who holds it)")
    return await _operator_turn(registry, bot, session_id, who, TakeOver(note, force), idempotency_key)


async def operator_says(bot: str, session_id: str, request: Request, who: Caller, registry: Registry,
                        idempotency_key: IdempotencyKey = None) -> JSONResponse:
    text = _text_field(await read_json_object(request), "text", required=True)
    assert text is not None
    checked_words(limits_of(request), text, "text")
    return await _operator_turn(registry, bot, session_id, who, OperatorSay(text), idempotency_key)


async def release(bot: str, session_id: str, request: Request, who: Caller, registry: Registry,
                  idempotency_key: IdempotencyKey = None) -> JSONResponse:
    route = _text_field(await read_json_object(request, blank_is_empty=True), "route", required=False)
    return await _operator_turn(registry, bot, session_id, who, Release(route), idempotency_key)


async def list_all_pending(
    who: Caller, registry: Registry,
    bot: Annotated[str | None, Query(description="only this bot's sessions")] = None,
    kind: Annotated[Literal["approval", "question", "takeover"] | None, Query(description="only items of this kind")] = None,
    role: Annotated[str | None, Query(description="only items this role may decide (named in their `by`)")] = None,
    older_than: Annotated[float | None, Query(ge=0, description="only items waiting longer than this (seconds)")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="sessions per page at most")] = PAGE_SIZE,
    cursor: Annotated[str | None, Query(description="the `next` of the page before", pattern=CURSOR_PATTERN)] = None,
    order: Annotated[Literal["waiting", "recent"], Query(
        description="`waiting`: longest waiting first; `recent`: newest activity first (the inbox)")] = "waiting",
) -> Any:
    require_operator(who, "GET /pending")
    if order == "recent" and (role is not None or older_than is not None):
        raise wire.RequestFailed(wire.BAD_REQUEST, "order=recent lists by bot and kind only: leave out role and "
                                 "older_than, or use order=waiting (longest waiting first)")
    if bot is not None:
        registry.bot(bot)  # an unknown bot is a 404 naming the served ones, not an empty list
    try:
        after = None if cursor is None else decode_cursor(cursor)
    except ValueError as exc:
        raise wire.RequestFailed(wire.BAD_REQUEST, f"cursor: {exc}; start again without it") from None
    now = time.time()
    key = recent_key(bot, kind) if order == "recent" else waiting_key(bot, kind, role)
    until = None if older_than is None else now - older_than
    page = await registry.store.waiting_page(key, after, until, limit + 1)
    more = len(page) > limit
    page = page[:limit]
    shown = [s for s in (_filtered(e.shown(kind), role, older_than, now) for e in page) if s is not None]
    last = page[-1] if more else None
    return {"sessions": shown, "next": None if last is None else encode_cursor(last.positions[key], last.session_id),
            "you": who.name if who is not None else None}


STREAM_TICK = 2.0  # seconds: how often the stream looks at the store with no commit here (other replicas')
STREAM_GAP = 0.5  # seconds at least between two pages sent (a burst of commits sends one)
STREAM_PING = 15.0  # seconds: a comment line keeps proxies from closing a quiet stream


async def pending_stream(
    request: Request, who: Caller, registry: Registry,
    bot: Annotated[str | None, Query(description="only this bot's sessions")] = None,
    kind: Annotated[Literal["approval", "question", "takeover"] | None, Query(description="only items of this kind")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="sessions in the page sent")] = 50,
    order: Annotated[Literal["waiting", "recent"], Query(description="as GET /pending's")] = "recent",
) -> StreamingResponse:
    require_operator(who, "GET /pending/stream")
    if bot is not None:
        registry.bot(bot)

    async def first_page() -> str:
        page = await list_all_pending(who, registry, bot=bot, kind=kind, limit=limit, order=order)
        return json.dumps(page, ensure_ascii=False, separators=(",", ":"))

    async def events() -> AsyncIterator[str]:
        sent, quiet = None, 0.0
        while not registry.gate.draining and not await request.is_disconnected():  # a drain ends it: the page reconnects
            page = await first_page()
            if page != sent:  # an unchanged page is not sent again: the operator's screen stays still
                sent, quiet = page, 0.0
                yield f"event: inbox\ndata: {page}\n\n"
            elif quiet >= STREAM_PING:
                quiet = 0.0
                yield ": ping\n\n"
            await asyncio.sleep(STREAM_GAP)
            waited = time.monotonic()
            try:  # a commit on this replica wakes the stream at once; other replicas' within a tick
                await asyncio.wait_for(registry.writes.committed.wait(), STREAM_TICK - STREAM_GAP)
            except TimeoutError:
                pass
            quiet += STREAM_GAP + time.monotonic() - waited

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def canned_replies(bot: str, session_id: str, who: Caller, registry: Registry) -> Any:
    async with registry.session(bot, session_id, who, EXISTING, reach=Reach(pending=True, takeover=True)) as session:
        require_operator(who, "the canned replies", operator_roles(session))
        config = session.bot.config
        return {"canned": [{"name": name, "text": canned_text(text, config.catalogs, session.locale)}
                           for name, text in config.canned.items()]}


async def set_typing(bot: str, session_id: str, request: Request, who: Caller, registry: Registry) -> Any:
    body = await read_json_object(request)
    on = body.get("typing")
    if not isinstance(on, bool) or set(body) - {"typing", "as"}:
        raise wire.RequestFailed(wire.BAD_REQUEST, 'send {"typing": true} while typing (again every few seconds), '
                                 '{"typing": false} when done; an operator adds "as": "operator"')
    party = body.get("as", "user")
    if party not in ("user", "operator"):
        raise wire.RequestFailed(wire.BAD_REQUEST, 'as must be "user" or "operator"')
    reach = Reach(pending=True, takeover=True) if party == "operator" else Reach()
    # Queued like any request to the session: a read by the other party holds it only briefly.
    async with registry.session(bot, session_id, who, EXISTING, reach=reach) as session:
        if party == "operator":
            require_operator(who, "typing as the operator", operator_roles(session))
        key = typing_key(session.bot.name, session_id, party)
        if on:
            name = who.name if who is not None else None
            await registry.store.put_record(key, {"name": name, "at": time.time()}, session=session_id)
        else:
            await registry.store.delete_record(key)
    return {"typing": on}


async def read_typing(bot: str, session_id: str, who: Caller, registry: Registry) -> Any:
    async with registry.session(bot, session_id, who, EXISTING, reach=Reach(pending=True, takeover=True)) as session:
        name = session.bot.name
        now = time.time()
        operator = await registry.store.get_record(typing_key(name, session_id, "operator"))
        user = await registry.store.get_record(typing_key(name, session_id, "user"))

    def fresh(found: dict[str, Any] | None) -> bool:
        return found is not None and now - float(found.get("at", 0)) < TYPING_LASTS

    return {"operator": (operator or {}).get("name") or "operator" if fresh(operator) else None, "user": fresh(user)}


TYPING_LASTS = 6.0  # seconds a typing ping counts (the pages send one every 3 s while someone types)


def typing_key(bot: str, session_id: str, party: str) -> str:
    return f"typing {party} {bot}/{session_id}"


def canned_text(source: str, catalogs: Any, locale: str | None) -> str:
    """A canned reply as the operator sends it: its template rendered in the session's locale
    (it sees `t()` and `locale`; definition/checks.py checked it at load)."""
    if "{" not in source:
        return source
    return render(source, {"locale": locale or (catalogs.default if catalogs is not None else "en"),
                           CATALOGS_KEY: catalogs})


# -- the parts ---------------------------------------------------------------------------------------


DECISION_FIELDS = frozenset({"decision", "args", "reason", "answer"})


def decision_of(item: str, body: dict[str, Any], token: str | None,
                limits: wire.ServerLimits) -> Approve | Reject | Answer:
    """The engine input a decision body asks for; RequestFailed(BadRequest) naming the field,
    TooLarge for an answer or a reason over --max-message-chars (checked_words)."""
    unknown = sorted(set(body) - DECISION_FIELDS)
    if unknown:  # a misspelt `reason` or `args` would be dropped and the item decided without it
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(DECISION_FIELDS), n=1)
        raise wire.RequestFailed(wire.BAD_REQUEST, f"unknown field {unknown[0]!r}"
                                 + (f"; did you mean {close[0]!r}?" if close else "")
                                 + ' (a decision is {"decision", "args"?, "reason"?}, an answer {"answer"})')
    if "answer" in body:
        if "decision" in body:
            raise wire.RequestFailed(wire.BAD_REQUEST, "send either decision or answer, not both")
        if set(body) != {"answer"}:
            raise wire.RequestFailed(wire.BAD_REQUEST, "an answer is {\"answer\": VALUE} alone: "
                                     f"{', '.join(sorted(set(body) - {'answer'}))} go with a decision")
        return Answer(item, checked_words(limits, body["answer"], "answer"), token)
    decision, args, reason = body.get("decision"), body.get("args"), body.get("reason")
    if decision not in ("approve", "reject"):
        raise wire.RequestFailed(wire.BAD_REQUEST, 'decision must be "approve" or "reject" (or send "answer")')
    if args is not None and not isinstance(args, dict):
        raise wire.RequestFailed(wire.BAD_REQUEST, "args must be a JSON object (the edited arguments)")
    if reason is not None and not isinstance(reason, str):
        raise wire.RequestFailed(wire.BAD_REQUEST, "reason must be a string")
    checked_words(limits, reason, "reason")
    if decision == "reject":
        if args is not None:
            raise wire.RequestFailed(wire.BAD_REQUEST, "a rejection takes no args")
        return Reject(item, reason)
    return Approve(item, args, reason)


def checked_words(limits: wire.ServerLimits, value: Any, field: str) -> Any:
    """`value`, a person's words the model reads (a question's answer, a decision's reason, an
    operator's line), held to --max-message-chars as a user's message is on every door: a
    string by its characters, any other answer by its compact JSON. RequestFailed(TooLarge)
    naming `field` and the limit; None passes."""
    if value is None:
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    too_long = limits.message_too_long(text, field)
    if too_long:
        raise wire.RequestFailed(wire.TOO_LARGE, f"{too_long} (nothing was decided or said)")
    return value


def operator_roles(session: Any) -> set[str]:
    """The roles besides `operators` that may act as a session's operator — take it over, read
    the canned replies, type as the operator (docs/operators.md): those its takeover items name,
    else (nobody handed it over) those the bot's `operator:` actions name."""
    return _takeover_item_roles(session) or set(handover_roles(session.bot.config))


def _takeover_item_roles(session: Any) -> set[str]:
    return {r for item in session.pending if item.kind == TAKEOVER for r in item.by}


def require_operator(who: Principal | None, what: str, item_roles: set[str] | None = None) -> None:
    """Forbidden unless the caller is an operator (or holds one of `item_roles`); auth off: anyone."""
    if who is None:
        return
    allowed = {OPERATOR_ROLE} | (item_roles or set())
    if not allowed & set(who.roles):
        raise wire.RequestFailed(wire.FORBIDDEN, f"{what} needs the role {' or '.join(sorted(allowed))}; "
                                                 f"{who.name} has {', '.join(sorted(who.roles)) or 'no roles'}")


async def _operator_turn(registry: Any, bot: str, session_id: str, who: Principal | None, message: Any,
                         key: str | None) -> JSONResponse:
    """A takeover, an operator's message or a release: the caller must be an operator, or hold
    the role a takeover item of the session names (an `operator: role:` action)."""
    reach = Reach(pending=True, takeover=isinstance(message, TakeOver))
    async with registry.session(bot, session_id, who, EXISTING, reach=reach) as session:
        roles = operator_roles(session) if isinstance(message, TakeOver) else _takeover_item_roles(session)
        require_operator(who, f"{type(message).__name__} on session {session_id}", roles)
        return await turn_reply(registry, session, message, key)


def _text_field(body: dict[str, Any], name: str, required: bool) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise wire.RequestFailed(wire.BAD_REQUEST, f"{name} must be a non-empty string")
    return value


def _filtered(found: PendingSession, role: str | None, older_than: float | None, now: float) -> dict[str, Any] | None:
    """A waiting session as GET /pending shows it: its items as a Pending event shows them (no
    token), only those `role` may decide and those older than `older_than` seconds."""
    items = [PendingItem.from_dict(i) for i in found.items]
    if role is not None:
        items = [i for i in items if role in i.by]
    if older_than is not None:
        items = [i for i in items if now - parse_time(i.created).timestamp() >= older_than]
    if not items and (found.taken_over is None or role is not None or older_than is not None):
        return None
    return found.to_dict() | {"items": [i.public() for i in items]}


def _required_body(properties: dict[str, Any], example: dict[str, Any]) -> dict[str, Any]:
    """_body whose every property is required (so the body is too)."""
    extra = _body(properties, example)
    extra["requestBody"]["required"] = True
    extra["requestBody"]["content"]["application/json"]["schema"]["required"] = list(properties)
    return extra


def _json(status: int, description: str, properties: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    schema = {"type": "object", "required": list(properties), "properties": properties}
    return {status: {"description": description, "content": {"application/json": {"schema": schema}}}}
