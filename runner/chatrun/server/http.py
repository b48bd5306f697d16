"""The HTTP API: sessions as resources, a turn as a POST (JSON or Server-Sent Events).

    GET    /health                                    liveness (200 unless draining), with the store's state and each bot's knowledge index
    GET    /ready                                     readiness (503 while the store does not answer or draining)
    GET    /bots                                      the bots served
    GET    /bots/{bot}                                one bot, with its route graph
    POST   /bots/{bot}/sessions                       {"id"?, "route"?, "state"?} -> the new session
    GET    /bots/{bot}/sessions/{id}                  route, stack, scopes, visible state, history, usage, ended
    DELETE /bots/{bot}/sessions/{id}
    POST   /bots/{bot}/sessions/{id}/messages         {"userMessage": "...", ...} -> events
           (Accept: text/event-stream or ?stream=true: the events as they happen)
    POST   /bots/{bot}/sessions/{id}/attachments      {"media_type", "data" (base64), "name"?} -> its reference,
           sent in a message: {"userMessage": "...", "attachments": [reference]}
    GET    /bots/{bot}/sessions/{id}/attachments/{ref} the bytes of an upload (the page shows sent images)
    GET    /bots/{bot}/sessions/{id}/inspect          what the page's inspector shows
"""


import base64
import functools
import json
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute

from chatrun import events as ev
from chatrun.definition.config import JSON_TYPES, initial_state_problem
from chatrun.definition.templates import display_text
from chatrun.engine.session import Session
from chatrun.engine.waiting import held_by_another
from chatrun.knowledge import knowledge_state
from chatrun.server import wire
from chatrun.server.audience import (
    OPERATOR_ROLE,
    history_for,
    inspector_audiences,
    resource_audiences,
)
from chatrun.server.auth import Principal, template_principal
from chatrun.server.guard import body_type
from chatrun.server.inspect import graph_data, inspect_data, session_data
from chatrun.server.plumbing import (
    Caller,
    DetachedTurn,
    Emit,
    NotAnObject,
    QuickJSONResponse,
    Registry,
    authenticate,
    base64_size,
    header,
    limits_of,
    read_json_object,
    read_limited,
    registry_of,
    served_directly,
    wanted_locale,
)
from chatrun.server.sessions import EXISTING, NEW, OWNER_ONLY, STORE_OK, Reach, SessionRegistry
from chatrun.server.turn_run import TurnRun, request_asks
from chatrun.server.versions import VERSION_HEADER

log = logging.getLogger("chatrun.server")


def make_router(registry: SessionRegistry, limits: wire.ServerLimits) -> APIRouter:
    """The HTTP API's routes: the module's endpoints, with the OpenAPI text of this app (the
    state keys of the bots it serves, its userMessage limit)."""
    router = APIRouter(responses=ERROR_RESPONSES)
    # A turn first (server/app.py puts it first of all): a request is matched against each route in
    # turn until one fits (~4 us each), and no other route's path can be a turn's.
    router.add_api_route(
        "/bots/{bot}/sessions/{session_id}/messages", send_message, methods=["POST"], tags=["sessions"],
        route_class_override=SendMessageRoute, responses=_turn_response(), openapi_extra=_body({"userMessage": {"type": "string", "maxLength": limits.max_message_chars}},
                            {"userMessage": "I want to fly to Dublin"}))
    router.add_api_route("/health", health, methods=["GET"], tags=["server"])
    router.add_api_route("/ready", ready, methods=["GET"], tags=["server"])
    router.add_api_route("/bots", list_bots, methods=["GET"], tags=["bots"], name="bots")
    router.add_api_route("/bots/{bot}", read_bot, methods=["GET"], tags=["bots"], name="bot")
    router.add_api_route(
        "/bots/{bot}/sessions", create_session, methods=["POST"], status_code=201, tags=["sessions"],
        responses=_session_response(201), openapi_extra=_body(
            {"id": SESSION_ID_SCHEMA, "route": {"type": "string"}, "state": _state_schema(registry)},
            {"route": "main_menu"}))
    router.add_api_route("/bots/{bot}/sessions/{session_id}", read_session, methods=["GET"], tags=["sessions"],
                         responses=_session_response(200, history=True))
    router.add_api_route("/bots/{bot}/sessions/{session_id}/inspect", inspect_session, methods=["GET"],
                         tags=["sessions"], name="inspect")
    router.add_api_route("/bots/{bot}/sessions/{session_id}", delete_session, methods=["DELETE"], status_code=204,
                         tags=["sessions"])
    router.add_api_route("/bots/{bot}/sessions/{session_id}/attachments", upload_attachment, methods=["POST"],
                         status_code=201, tags=["sessions"], openapi_extra=UPLOAD_BODY)
    router.add_api_route("/bots/{bot}/sessions/{session_id}/attachments/{ref}", read_attachment, methods=["GET"],
                         tags=["sessions"], response_class=Response)
    router.add_api_route(
        "/bots/{bot}/sessions/{session_id}/feedback", give_feedback, methods=["POST"], status_code=201,
        tags=["sessions"], openapi_extra=_body(
            {"turn": {"type": "integer", "minimum": 1}, "rating": {"enum": list(wire.RATINGS)},
             "comment": {"type": "string", "maxLength": wire.MAX_COMMENT}},
            {"turn": 2, "rating": "down", "comment": "It booked the wrong day"}, required=("turn", "rating"),
            closed=True))
    return router


# -- the endpoints (no docstrings: FastAPI would put them in the OpenAPI text) ----------------------


async def health(registry: Registry) -> Any:
    # Liveness: 200 while the process serves, also while the store does not answer (restarting
    # the replica would not bring the store back): then `status` is "degraded" and `store`
    # says why. 503 while draining (SIGTERM): a load balancer stops sending it new requests.
    body = await _health_body(registry)
    return JSONResponse(body, status_code=503) if registry.draining else body


async def ready(registry: Registry) -> Any:
    # Readiness: 503 unless this replica can serve turns now (store answering, not draining).
    body = await _health_body(registry)
    return body if body["status"] == "ok" else JSONResponse(body, status_code=503)


# Which process answered (host:pid): behind a load balancer, the replica a probe or a person reached.
REPLICA = f"{socket.gethostname()}:{os.getpid()}"


async def _health_body(registry: Registry) -> dict[str, Any]:
    """/health's and /ready's answer, within STORE_PROBE_TIMEOUT whatever the store does."""
    store = await registry.store_state()
    status = "draining" if registry.draining else "ok" if store == STORE_OK else "degraded"
    body = {"status": status, "replica": REPLICA, "bots": list(registry.bots), "live_sessions": registry.live_count(),
            "cache_bytes": registry.cache_bytes(), "in_progress": registry.in_progress, "store": store}
    pool_use = getattr(registry.store, "pool_use", None)
    if pool_use is not None:  # Redis, Postgres: how full its connection pool is (docs/deploy.md, sizing)
        in_use, size = pool_use()
        body["store_pool"] = {"in_use": in_use, "max_connections": size}
    knowledge = {name: state for name, bot in registry.bots.items()
                 if (state := knowledge_state(bot.config)) is not None}
    if knowledge:  # a bot whose index cannot be read fails its knowledge turns: the operator sees why here
        body["knowledge"] = knowledge
    return body


async def list_bots(request: Request, who: Caller, registry: Registry) -> list[dict[str, Any]]:
    wanted = wanted_locale(request)
    return [_bot_summary(b, _negotiated(b, wanted)) for b in registry.bots.values()]


async def read_bot(bot: str, request: Request, who: Caller, registry: Registry) -> dict[str, Any]:
    """The bot, its route graph and versions; its description and route titles in the locale
    asked for (`?locale=`, else Accept-Language; docs/i18n.md), as the page shows them before
    its session exists."""
    found = registry.bot(bot)
    locale = _negotiated(found, wanted_locale(request))
    versions = [v.to_dict() for v in registry.shelf.bots[found.name].versions]
    return _bot_summary(found, locale) | {"graph": graph_data(found, locale), "versions": versions, "locale": locale}


def _negotiated(bot: Any, wanted: str | None) -> str | None:
    """The bot's locale that best matches `wanted`; None for a bot without `locales:`."""
    catalogs = bot.config.catalogs
    return catalogs.negotiate(wanted) if catalogs is not None else None


async def create_session(bot: str, request: Request, who: Caller, registry: Registry) -> dict[str, Any]:
    data = await read_json_object(request, blank_is_empty=True)
    session_id = data["id"] if "id" in data else secrets.token_hex(8)
    route, state = data.get("route"), data.get("state")
    problem = wire.chat_id_problem(session_id)
    if problem:
        raise wire.RequestFailed(wire.BAD_REQUEST, f"id must be {problem}")
    if route is not None and not isinstance(route, str):
        raise wire.RequestFailed(wire.BAD_REQUEST, "route must be a string (a route name)")
    if state is not None and not isinstance(state, dict):
        raise wire.RequestFailed(wire.BAD_REQUEST, "state must be a JSON object")
    if state:
        check_initial_state(state, registry.bot(bot).config.state)
    version = request.headers.get(VERSION_HEADER)  # a tester's pick (docs/versions.md, "Canaries")
    locale = wanted_locale(request)  # the session's locale, as GET /bots/{bot} reads it (docs/i18n.md)
    async with registry.session(bot, session_id, who, NEW, route=route, state=state, version=version,
                                locale=locale) as session:
        return session_data(session, who.roles if who is not None else ())


async def read_session(bot: str, session_id: str, who: Caller, registry: Registry) -> dict[str, Any]:
    async with registry.session(bot, session_id, who, EXISTING, reach=_operators_read(who)) as session:
        history = history_for(await registry.history(session), resource_audiences(who))
        # the user reads what they are told of an item others decide; its deciders read its question
        roles = who.roles if who is not None else ()
        # the operator console offers no action the server would refuse (409 HeldByAnother)
        held = held_by_another(session.taken_over, template_principal(who))
        return session_data(session, roles) | {"history": history, "lastTurn": registry.last_committed(session),
                                               "heldByAnother": held}


async def inspect_session(bot: str, session_id: str, who: Caller, registry: Registry) -> dict[str, Any]:
    async with registry.session(bot, session_id, who, EXISTING, reach=_operators_read(who)) as session:
        return inspect_data(session, history_for(await registry.history(session), inspector_audiences(who)))


def _operators_read(who: Principal | None) -> Reach:
    """An operator reads a session that waits for someone (the operator page opens it with its
    history and inspector); everyone else reads only their own."""
    return Reach(pending=True) if who is not None and OPERATOR_ROLE in who.roles else OWNER_ONLY


async def upload_attachment(bot: str, session_id: str, request: Request, who: Caller,
                            registry: Registry) -> dict[str, Any]:
    # The session's current route decides before a byte of the body is read: no `attachments:`
    # (400), a kind it does not take when the body is the file itself (415), a Content-Length over
    # its max_bytes (413); then the body is read under that limit, never whole first (plumbing).
    # The route is read again when the file is kept: it may have changed meanwhile.
    file_type = body_type(request.headers)
    as_file = file_type != "application/json" and not file_type.endswith("+json")
    async with registry.session(bot, session_id, who, EXISTING) as session:
        policy, route = session.attachment_policy(), session.route  # AttachmentRefused: 400 (the registry)
    if as_file and not policy.accepts(file_type):
        raise wire.RequestFailed(wire.UNSUPPORTED_MEDIA_TYPE, f"session {session_id}: route {route} takes "
                                 f"{', '.join(policy.kinds)} (attachments.kinds), not {file_type}")
    too_large = f"route {route} takes files of at most {policy.max_bytes} bytes (attachments.max_bytes)"
    if as_file:
        data = bytes(await read_limited(request, policy.max_bytes, lambda: too_large))
        media_type, name = file_type, request.query_params.get("name", "")
    else:
        media_type, name, data = await _json_upload(request, base64_size(policy.max_bytes), too_large)
    if len(data) > policy.max_bytes:
        raise wire.RequestFailed(wire.TOO_LARGE, f"a file of {len(data)} bytes: {too_large}")
    async with registry.session(bot, session_id, who, EXISTING) as session:
        return session.attach(data, media_type, name).to_dict()  # AttachmentRefused: 400 (the registry)


async def _json_upload(request: Request, max_base64: int, too_large: str) -> tuple[str, str, bytes]:
    """(media type, name, bytes) of an upload sent as JSON with base64: its body may be the
    route's largest file as base64, with a frame's room for the rest of the object."""
    raw = await read_limited(request, limits_of(request).max_frame_bytes + max_base64, lambda: too_large)
    body = wire.load_json(raw, "body")
    del raw  # one copy of a large file's text at a time
    if not isinstance(body, dict):
        raise NotAnObject(body)
    media_type, name, data = body.get("media_type"), body.get("name", ""), body.pop("data", None)
    if not isinstance(media_type, str) or not isinstance(name, str) or not isinstance(data, str):
        raise wire.RequestFailed(wire.BAD_REQUEST, "an upload is {\"media_type\": string, \"data\": base64, \"name\"?: string}")
    if len(data) > max_base64:  # the limit is the file's, not the name's
        raise wire.RequestFailed(wire.TOO_LARGE, too_large)
    try:
        encoded = data.encode("ascii")
        del data  # one copy of a large file's text at a time
        return media_type.lower(), name, base64.b64decode(encoded, validate=True)
    except ValueError:
        raise wire.RequestFailed(wire.BAD_REQUEST, "data must be base64") from None


async def read_attachment(bot: str, session_id: str, ref: str, who: Caller, registry: Registry) -> Response:
    # Only the session's owner reads its files. The media type is the reference's, which the
    # client holds, not the server: the bytes go as an opaque download (no sniffing, no inline
    # rendering), and the page gives them their type itself.
    async with registry.session(bot, session_id, who, EXISTING) as session:
        data = registry.blobs.read(session.id, ref) if registry.blobs is not None else None
    if data is None:
        raise wire.RequestFailed(wire.NOT_FOUND, f"session {session_id} has no upload {ref!r}")
    return Response(data, media_type="application/octet-stream", headers={
        "X-Content-Type-Options": "nosniff", "Content-Disposition": "attachment",
        "Cache-Control": "private, max-age=3600"})


async def give_feedback(bot: str, session_id: str, request: Request, who: Caller, registry: Registry) -> Any:
    feedback = wire.feedback_of(await read_json_object(request), "the feedback body")
    return await registry.rate(bot, session_id, who, feedback)


async def delete_session(bot: str, session_id: str, who: Caller, registry: Registry) -> Response:
    await registry.delete(bot, session_id, who)
    return Response(status_code=204)


async def send_message(
    bot: str,
    session_id: str,
    request: Request,
    who: Caller,
    registry: Registry,
    stream: Annotated[bool, Query(description="answer with Server-Sent Events as the turn runs")] = False,
    if_busy: Annotated[str | None, Query(alias="ifBusy", description="queue (wait) or reject when the session is running a turn")] = None,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", description="a retry with the same key replays the committed turn instead of running it again")] = None,
) -> Any:
    turn = TurnRequest(bot, session_id, who, await _message_body(request), if_busy, idempotency_key)
    if stream or "text/event-stream" in (header(request, b"accept") or ""):
        # Fail before the stream starts when the session is unknown or not the caller's, or the
        # Idempotency-Key is a committed request's and this request asks something else (422).
        async with turn.session(registry) as session:
            if idempotency_key is not None:
                await _keyed_turn(registry, session, turn).is_replay()
        return StreamingResponse(
            _sse(registry, turn), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _reply(registry, turn)


class SendMessageRoute(APIRoute):
    """The turn's route: documented by `send_message`'s signature (the OpenAPI text is FastAPI's,
    unchanged), served by `send_message_direct`, which reads those parameters from the request
    itself. FastAPI's handler (its parameter solving validated 5 parameters and ran 2 dependencies
    a turn) cost about 0.5 M instructions of a late turn, a fifth of what it costs beyond floor_eb
    (bench/README.md, "The HTTP turn's layers"). `get_route_handler` answers for FastAPI's other
    uses of the route's handler; `app` serves it without FastAPI's request wrapping."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Without FastAPI's request wrapping (two exit stacks for dependencies with `yield`, and an
        # exception handler of its own): its errors reach the app's ExceptionMiddleware, whose
        # handlers are the same (server/app.py ERROR_HANDLERS).
        self.app = served_directly(send_message_direct)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return send_message_direct


async def send_message_direct(request: Request) -> Response:
    """`send_message`, its parameters read as FastAPI read them, and refused in its order: the
    caller (401) before the query's `stream` (400), both before the endpoint reads the body."""
    who = authenticate(request)
    query = request.query_params if request.scope.get("query_string") else None
    stream = _query_bool(query, "stream") if query is not None else False
    path = request.path_params
    response: Response = await send_message(path["bot"], path["session_id"], request, who, registry_of(request),
                                            stream, query.get("ifBusy") if query is not None else None,
                                            header(request, b"idempotency-key"))
    return response


# What a query's boolean may say: pydantic's words (FastAPI validated `stream` with pydantic), any case.
_QUERY_BOOLS = {"1": True, "on": True, "t": True, "true": True, "y": True, "yes": True,
                "0": False, "off": False, "f": False, "false": False, "n": False, "no": False}


def _query_bool(query: Mapping[str, str], name: str) -> bool:
    """The query's boolean `name` (absent: False); BadRequest worded as FastAPI's validation was."""
    value = query.get(name)
    if value is None:
        return False
    found = _QUERY_BOOLS.get(value.lower())
    if found is None:
        raise wire.RequestFailed(wire.BAD_REQUEST, f"query.{name}: Input should be a valid boolean, unable to interpret input")
    return found


# -- a turn ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnRequest:
    """A POST .../messages: the session, the caller, the body and how to queue or replay."""

    bot: str
    session_id: str
    who: Principal | None
    data: dict[str, Any]
    if_busy: str | None
    idempotency_key: str | None

    def session(self, registry: SessionRegistry) -> AbstractAsyncContextManager[Session]:
        return registry.session(self.bot, self.session_id, self.who, EXISTING, if_busy=self.if_busy)


async def _message_body(request: Request) -> dict[str, Any]:
    data = await read_json_object(request, blank_is_empty=True)
    message = data.get("userMessage")
    if message is not None and not isinstance(message, str):
        raise wire.RequestFailed(wire.BAD_REQUEST, "userMessage must be a string")
    too_long = limits_of(request).message_too_long(message) if isinstance(message, str) else None
    if too_long:
        raise wire.RequestFailed(wire.TOO_LARGE, too_long)
    if "userMessage" in data and wire.says_nothing(message, data.get("attachments")):
        raise wire.RequestFailed(wire.EMPTY_MESSAGE, wire.nothing_said("userMessage"))
    return data


def _keyed_turn(registry: SessionRegistry, session: Session, turn: TurnRequest) -> TurnRun:
    """The streamed turn of a POST .../messages, with what it asks when it has an Idempotency-Key."""
    message, key = wire.turn_input(turn.data), turn.idempotency_key
    return registry.turn(session, message, key, asks=None if key is None else request_asks(message))


async def _reply(registry: SessionRegistry, turn: TurnRequest) -> JSONResponse:
    """The turn's events and outcome as one JSON reply."""
    async with turn.session(registry) as session:
        return await turn_reply(registry, session, wire.turn_input(turn.data), turn.idempotency_key)


async def turn_reply(registry: SessionRegistry, session: Session, message: Any, key: str | None) -> JSONResponse:
    """One turn of a held session (a message, or a decision: server/pending_api.py) as one
    JSON reply: its events, whether it succeeded, where the conversation is, and whether it
    was a replay of the Idempotency-Key's committed turn."""
    run = registry.turn(session, message, key, whole=True, asks=None if key is None else request_asks(message))
    events = await run.events()
    body = {
        "events": [e.to_dict() for e in events if e.type != ev.STREAM],
        # Committed or rolled back, as the history says: an Error event the turn went on after
        # (a refused tool call) does not make a committed turn fail.
        "ok": bool(run.entry.get("ok")),
        "scopeId": session.scope_id,
        "route": session.route,
        "stack": session.stack,
        "turn": run.turn,
        "replayed": run.replayed,
    }
    if run.entry.get("usage"):  # the turn's model calls: absent when it made none
        body["usage"] = run.entry["usage"]
    return QuickJSONResponse(body, headers={"Idempotent-Replayed": "true"} if run.replayed else None)


async def _sse(registry: SessionRegistry, turn: TurnRequest) -> AsyncIterator[str]:
    """The turn's events as Server-Sent Events. The turn is detached: a client that
    disconnects does not cancel it; it completes and is stored, as on the WebSocket."""
    async for frame in DetachedTurn(functools.partial(_sse_turn, registry, turn)).items():
        yield frame


async def _sse_turn(registry: SessionRegistry, turn: TurnRequest, emit: Emit) -> None:
    try:
        async with turn.session(registry) as session:
            run = _keyed_turn(registry, session, turn)
            async for event in run:
                emit(_sse_frame(event.type, event.to_dict()))
            done = {"type": wire.COMPLETED, "data": session.scope_id, "route": session.route, "stack": session.stack}
            if run.entry.get("usage"):
                done["usage"] = run.entry["usage"]
            emit(_sse_frame(wire.COMPLETED, done))
    except wire.RequestFailed as exc:
        emit(_sse_frame(wire.ERROR, {"type": wire.ERROR, "data": exc.message}))
        emit(_sse_frame(wire.FAILED, {"type": wire.FAILED, "data": exc.reason}))
    except Exception as exc:
        log.exception("SSE turn of session %s failed", turn.session_id)
        emit(_sse_frame(wire.ERROR, {"type": wire.ERROR, "data": f"internal server error: {exc}"}))
        emit(_sse_frame(wire.FAILED, {"type": wire.FAILED, "data": wire.SERVER_ERROR}))


def _sse_frame(kind: str, payload: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(payload, default=str, ensure_ascii=False)}\n\n"


def _bot_summary(bot: Any, locale: str | None = None) -> dict[str, Any]:
    config = bot.config
    return {
        "name": bot.name,
        "description": display_text(config.description, config.catalogs, locale),
        "default_route": config.default_route,
        "routes": list(config.routes),
        "version": config.version,  # the human `version:`, when the bot has one
        "content_version": config.content_version,  # the hash of its files (docs/versions.md)
        "on_change": config.on_change,
        # What the page calls the bot (the widget's title, else its name), and whether it keeps
        # anything of its users across conversations (`user_memory:`: the page's memory control).
        "title": config.widget.title if config.widget is not None and config.widget.title else bot.name,
        "user_memory": config.user_memory is not None,
    }


def check_initial_state(state: dict[str, Any], declared: dict[str, Any]) -> None:
    """RequestFailed(BadRequest) for a state the bot does not accept (config.initial_state_problem)."""
    problem = initial_state_problem(state, declared)
    if problem is not None:
        raise wire.RequestFailed(wire.BAD_REQUEST, problem[1])


# wire.chat_id_problem as a schema: 1-128 characters, not all blank, no slash, not '.' or '..'.
SESSION_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": wire.MAX_CHAT_ID,
                     "pattern": "^(?!\\.\\.?$)[^/]*[^/\\s][^/]*$"}


def _state_schema(registry: SessionRegistry) -> dict[str, Any]:
    """The initial state the served bots accept (check_initial_state): their declared keys."""
    properties: dict[str, Any] = {}
    for bot in registry.bots.values():
        for key, default in bot.config.state.items():
            kind = None if default is None else JSON_TYPES.get(type(default))
            if key in properties and properties[key].get("type") != kind:
                properties[key] = {}  # two bots disagree: any type here, the bot's check decides
            else:
                properties[key] = {"type": kind} if kind else {}
    return {"type": "object", "properties": properties, "additionalProperties": False}


_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
}
_ERRORS = {
    400: "BadRequest (bad JSON, bad field, lone surrogate) or BadHost",
    401: "Unauthorized: no valid token (auth on)",
    403: "Forbidden: a route the principal's roles do not allow, or a foreign Origin; DecisionRefused: "
         "a decision by a principal without the item's role (or its own call, when self-approval is off)",
    404: "NotFound, BotNotFound, SessionNotActive (also another principal's session), RouteNotFound",
    405: "MethodNotAllowed (with an Allow header)",
    408: "RequestTimeout: the body did not arrive in time",
    409: "SessionExists, ScopeNotActive, Conflict, NotPending (the item was resolved already, or never was), or "
         "HeldByAnother (another operator holds the conversation)",
    413: "TooLarge: body or userMessage over the limit",
    415: "UnsupportedMediaType: a body that is not application/json",
    422: "InvalidDecision: edited arguments or an answer that do not match the declared schema (the item stays pending), "
         "or an operator's message to a phone call's session (the caller cannot receive it); "
         "IdempotencyKeyReused: the Idempotency-Key of a committed request, sent with another request; "
         "EmptyMessage: a userMessage with no text (null, empty or only whitespace) and no attachment",
    429: "TooManyRequests",
    500: "ServerError",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
    for status, text in _ERRORS.items()
}


def _session_response(status: int, history: bool = False) -> dict[int | str, dict[str, Any]]:
    """The session resource (inspect.session_data), documented in the OpenAPI text so that
    clients (and schemathesis) can rely on its keys; `usage` is the wire schema's Usage."""
    from chatrun.definition.schemas import load_schema

    strings = {"type": "array", "items": {"type": "string"}}
    properties: dict[str, Any] = {
        "id": {"type": "string"}, "bot": {"type": "string"}, "turn": {"type": "integer", "minimum": 0},
        "route": {"type": "string"}, "stack": strings, "scopeId": {"type": "string"},
        "state": {"type": "object"}, "visible": {"type": "object"}, "scopes": {"type": "array", "items": {"type": "object"}},
        "usage": _plain_schema(load_schema("wire.schema.json")["$defs"]["Usage"]),
        "ended": {"type": ["object", "null"], "properties": {"route": {"type": "string"}, "tool": {"type": "string"}}},
        "pending": {"type": "array", "items": {"type": "object"}},  # pending_api's items (docs/protocol.md)
        "taken_over": {"type": ["object", "null"]},
    }
    if history:
        properties |= {"history": {"type": "array", "items": {"type": "object"}},
                       "lastTurn": {"type": ["object", "null"]},
                       # the operator who holds it when not the caller (their takeover, message
                       # and release are refused: 409 HeldByAnother), else null
                       "heldByAnother": {"type": ["string", "null"]}}
    schema = {"type": "object", "required": list(properties), "properties": properties, "additionalProperties": True}
    return {status: {"description": "the session", "content": {"application/json": {"schema": schema}}}}


def _turn_response() -> dict[int | str, dict[str, Any]]:
    """The reply of POST .../messages (see _reply), documented so that clients can rely on its keys."""
    from chatrun.definition.schemas import load_schema

    event = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}},
             "additionalProperties": True}
    properties: dict[str, Any] = {
        "events": {"type": "array", "items": event, "description": "the turn's events (no Stream chunks)"},
        "ok": {"type": "boolean", "description": "true when the turn committed (its changes are stored, even if it "
               "sent an Error event and went on); false when it failed and nothing of it was kept"},
        "scopeId": {"type": "string"}, "route": {"type": "string"},
        "stack": {"type": "array", "items": {"type": "string"}},
        "turn": {"type": "integer", "minimum": 0}, "replayed": {"type": "boolean"},
        "usage": _plain_schema(load_schema("wire.schema.json")["$defs"]["Usage"]),
    }
    schema = {"type": "object", "required": [k for k in properties if k != "usage"], "properties": properties,
              "additionalProperties": True}
    streamed = {"type": "string", "description": "with ?stream=true or Accept: text/event-stream: Server-Sent Events"}
    return {200: {"description": "the turn, once committed or rolled back",
                  "content": {"application/json": {"schema": schema}, "text/event-stream": {"schema": streamed}}}}


def _plain_schema(node: Any) -> Any:
    """A schema without the editor-only markdownDescription (an OpenAPI document has no use for it)."""
    if isinstance(node, dict):
        return {k: _plain_schema(v) for k, v in node.items() if k != "markdownDescription"}
    if isinstance(node, list):
        return [_plain_schema(v) for v in node]
    return node


def failure_response(exc: wire.RequestFailed) -> JSONResponse:
    status = wire.HTTP_STATUS.get(exc.reason, 400)
    return JSONResponse({"error": exc.reason, "message": exc.message}, status_code=status,
                        headers=wire.status_headers(status))


# An upload (docs/protocol.md, "Attachments"): the file as base64 in JSON, like every body, or
# the file itself in its own Content-Type (not listed: any media type the route takes).
UPLOAD_BODY = {"requestBody": {"required": True, "description": (
    "The file as base64 in JSON, or the file itself with its media type as Content-Type and ?name= its name; "
    "checked against the session's route (attachments:) before the body is read"), "content": {"application/json": {
    "schema": {"type": "object", "required": ["media_type", "data"], "additionalProperties": False, "properties": {
        "media_type": {"type": "string", "pattern": "^[a-z0-9.+-]+/[a-z0-9.+-]+$"},
        "name": {"type": "string"},
        "data": {"type": "string", "pattern": "^([A-Za-z0-9+/]{4})*$", "description": "the file, base64"}}},
    "example": {"media_type": "image/png", "name": "parcel.png", "data": "iVBORw0K"}}}}}


def _body(properties: dict[str, Any], example: dict[str, Any], required: tuple[str, ...] = (),
          closed: bool = False) -> dict[str, Any]:
    """OpenAPI text for a JSON body the handler parses itself (to give its own clear errors);
    `closed`: the handler refuses fields it does not name."""
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": not closed}
    body: dict[str, Any] = {"content": {"application/json": {"schema": schema, "example": example}}}
    if required:  # fields it must have: then the body itself is required too
        schema["required"] = list(required)
        body["required"] = True
    return {"requestBody": body}
