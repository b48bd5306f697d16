"""The request plumbing every wire protocol shares: who is calling, the JSON body, a turn
detached from the client that asked for it.

    async def endpoint(request: Request, who: Caller, registry: Registry) -> ...

`authenticate` is the one place a token is checked. It takes Starlette's HTTPConnection, the
common base of Request and WebSocket, so it serves as a FastAPI dependency of an HTTP route
(`Caller`) and is called as it is by the WebSocket endpoint, which must accept the socket
before it can refuse it. It raises `Unauthorized`; each protocol words the refusal its own
way (the HTTP API's JSON error, OpenAI's error object, a WebSocket close code).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Annotated, Any, ClassVar

from fastapi import Depends, Request
from starlette.datastructures import State
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from chatrun.engine.bot import Bot
from chatrun.server import wire
from chatrun.server.auth import TOKEN_HEADERS, TOKEN_QUERY, Auth, Principal, token_from
from chatrun.server.guard import EdgePolicy, Refused, read_body
from chatrun.server.sessions import SessionRegistry
from chatrun.server.widget_identity import IdentityRefused, is_widget_token, widget_principal

# -- who is calling --------------------------------------------------------------------------


class Unauthorized(wire.RequestFailed):
    """Auth is on and the request carries no valid token. Worded here for the HTTP API."""

    def __init__(self) -> None:
        super().__init__(
            wire.UNAUTHORIZED, "unauthorized: send a valid token (Authorization: Bearer <token>, X-API-Key or ?token=)"
        )


class WidgetRefused(Unauthorized):
    """A widget token the bot does not accept (server/widget_identity.py): the message says why."""

    def __init__(self, message: str) -> None:
        wire.RequestFailed.__init__(self, wire.UNAUTHORIZED, f"unauthorized: {message}")


class ServerState(State):
    """The app's `state` (what the endpoints reach through request.app.state), its values kept as
    plain attributes too: starlette's State answers every read through `__getattr__`, after the
    ordinary lookup failed (~6,000 instructions a read, and a turn reads five: issue 39). Written
    and deleted as State is, by attribute or by key, the two kept the same
    (tests/test_http_turn_route.py)."""

    def __init__(self, **values: Any) -> None:
        super().__init__()
        for key, value in values.items():
            setattr(self, key, value)

    def __setattr__(self, key: str, value: Any) -> None:
        self._state[key] = value
        object.__setattr__(self, key, value)

    def __delattr__(self, key: str) -> None:
        del self._state[key]
        object.__delattr__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self.__setattr__(key, value)

    def __delitem__(self, key: str) -> None:
        self.__delattr__(key)


def served_directly(handler: Callable[[Request], Awaitable[Response]]) -> ASGIApp:
    """A route's ASGI app answering with `handler(request)`, without FastAPI's request wrapping
    (two exit stacks for dependencies with `yield`, its parameter solving, an exception handler of
    its own): for the turn routes (http.py SendMessageRoute, openai_api.py ChatCompletionsRoute),
    whose handlers read their parameters themselves (issue 39)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await handler(Request(scope, receive, send))
        await response(scope, receive, send)

    return app


def authenticate(connection: HTTPConnection) -> Principal | None:
    """The principal of a request or WebSocket; None when auth is off (every caller is anonymous).
    A widget's token (a signed identity or an anonymous visitor) is checked first, against the
    `widget:` of the bot the path names, auth on or off. Raises Unauthorized when auth is on
    and the token is missing or unknown, WidgetRefused for a widget token the bot refuses."""
    if connection.app.state.auth is None and not carries_token(connection):
        return None  # auth off and no token: anonymous, with nothing to read (no widget token either)
    token = token_from(connection.headers, connection.query_params)
    if is_widget_token(token):
        return _widget_caller(connection, str(token))
    auth: Auth | None = connection.app.state.auth
    if auth is None:
        return None
    found = auth.authenticate(token)
    if found is None:
        raise Unauthorized()
    return found


def carries_token(connection: HTTPConnection) -> bool:
    """Whether a request has any of the places a token is carried (auth.py's token_from)."""
    for key, _ in connection.scope["headers"]:
        if key in _TOKEN_HEADERS:
            return True
    return bool(connection.scope.get("query_string")) and TOKEN_QUERY in connection.query_params


_TOKEN_HEADERS = tuple(name.encode("latin-1") for name in TOKEN_HEADERS)


def header(connection: HTTPConnection, name: bytes) -> str | None:
    """`connection.headers.get(name)` (`name` in lower case): the first header of that name,
    read from the scope's own list without building starlette's Headers (a turn asks for three
    headers, two of them absent: Headers.get raises and catches a KeyError for each; issue 39).
    tests/test_http_turn_route.py holds it to Headers.get."""
    for key, value in connection.scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _widget_caller(connection: HTTPConnection, token: str) -> Principal:
    bot_name = str(connection.path_params.get("bot") or "")
    bot = connection.app.state.registry.bots.get(bot_name) if bot_name else None
    try:
        if bot is None:
            raise IdentityRefused("a widget token is good only on its bot's own paths (/bots/BOT/...)")
        found = widget_principal(bot_name, bot.config.widget, token)
    except IdentityRefused as exc:
        logging.getLogger("chatrun.widget").info("chatrun: widget token refused on %s: %s", connection.url.path, exc)
        raise WidgetRefused(str(exc)) from None
    auth: Auth | None = connection.app.state.auth
    # The roles the auth file's `principals:` gives this name (`widget:ID`), as to a channel's user.
    return auth.principal(found.name, found.claims) if auth is not None else found


async def _caller(connection: HTTPConnection) -> Principal | None:
    # The dependencies are coroutines because FastAPI runs a plain function in a worker thread:
    # two thread hops a request, ~0.1 ms of CPU, for work that never blocks (an HMAC compare).
    return authenticate(connection)


Caller = Annotated[Principal | None, Depends(_caller)]


def caller_or_item_token(connection: HTTPConnection) -> tuple[Principal | None, str | None]:
    """The caller's principal and the token it sent. A backend answering a pending question
    sends the item's token instead of a principal's: with auth on, a token that names no
    principal passes here as (None, token), and reaches only a session with an open item of
    that token (session_open.Reach); without any token it is Unauthorized as usual."""
    token = token_from(connection.headers, connection.query_params)
    try:
        return authenticate(connection), token
    except Unauthorized:
        if token is None:
            raise
        return None, token


async def _caller_or_item_token(connection: HTTPConnection) -> tuple[Principal | None, str | None]:
    return caller_or_item_token(connection)


CallerOrToken = Annotated[tuple[Principal | None, str | None], Depends(_caller_or_item_token)]


def wanted_locale(connection: HTTPConnection) -> str | None:
    """The language a browser or client asks for: `?locale=`, else its Accept-Language."""
    return connection.query_params.get("locale") or connection.headers.get("accept-language")


def registry_of(connection: HTTPConnection) -> SessionRegistry:
    registry: SessionRegistry = connection.app.state.registry
    return registry


async def _registry(connection: HTTPConnection) -> SessionRegistry:
    return registry_of(connection)


Registry = Annotated[SessionRegistry, Depends(_registry)]


def limits_of(connection: HTTPConnection) -> wire.ServerLimits:
    limits: wire.ServerLimits = connection.app.state.limits
    return limits


# -- the body ----------------------------------------------------------------------------------


class NotAnObject(wire.RequestFailed):
    """A body that is JSON but not an object. Worded here for the HTTP API."""

    def __init__(self, body: Any):
        super().__init__(wire.BAD_REQUEST, f"body must be a JSON object, not {type(body).__name__}")


async def read_json_object(request: Request, *, blank_is_empty: bool = False,
                           limit: int | None = None) -> dict[str, Any]:
    """The request's body as a JSON object. The handlers read it themselves (rather than
    declaring a pydantic body) to give their own clear errors, in the order the API documents:
    RequestFailed TooLarge over the limit of a frame, BadRequest for what wire.load_json
    refuses, NotAnObject for JSON of another type. `blank_is_empty`: no body means {}; `limit`:
    another limit than a frame's (a body with files, which the edge left unread)."""
    limit = limit if limit is not None else limits_of(request).max_frame_bytes
    raw = await read_limited(request, limit, lambda: f"body over the limit of {limit} bytes")
    if blank_is_empty and not raw.strip():
        return {}
    body = wire.load_json(raw, "body")
    del raw  # a body with files: its text goes before its values are decoded
    if not isinstance(body, dict):
        raise NotAnObject(body)
    return body


async def read_limited(request: Request, limit: int, over: Callable[[], str]) -> bytearray:
    """The request's body, read as it arrives and refused as soon as it passes `limit` bytes
    (TooLarge, with the message `over()` gives) or the edge's body timeout (RequestTimeout):
    never more than the limit is held. Checked from Content-Length first."""
    length = header(request, b"content-length") or ""
    if length.isdigit() and int(length) > limit:
        raise wire.RequestFailed(wire.TOO_LARGE, f"body of {length} bytes: {over()}")
    edge = getattr(request.app.state, "edge", None)
    timeout = edge.body_timeout if edge is not None else EdgePolicy.body_timeout
    try:
        body, left = await read_body(request.receive, limit, timeout, over)
    except Refused as exc:
        raise wire.RequestFailed(exc.reason, exc.message) from None
    if left is not None:
        raise wire.RequestFailed(wire.BAD_REQUEST, "the client left before its body arrived")
    return body


def file_body_limit(limits: wire.ServerLimits, bots: Iterable[Bot]) -> int:
    """The limit of a `/v1` body, which may carry files: a frame's, plus room for the most
    files (as base64) a route of these bots takes in one message (its `attachments:`). The
    bot is named inside the body, so before it is read only the largest of them is known; an
    upload's limit is its own route's (http.py `upload_attachment`)."""
    files = [route.attachments.max_bytes * route.attachments.max_count
             for bot in bots for route in bot.config.routes.values() if route.attachments is not None]
    return limits.max_frame_bytes + base64_size(max(files, default=0))


def base64_size(size: int) -> int:
    """The length of `size` bytes as base64."""
    return (size + 2) // 3 * 4


# -- a turn detached from its client --------------------------------------------------------------

Emit = Callable[[Any], None]
END = object()  # the turn's task is done: nothing more will come
KEEPALIVE = object()  # `keepalive` seconds passed with nothing to send


class DetachedTurn:
    """A turn run in its own task, so that it ends as the engine ends it (rolled back, its
    record written) whatever happens to the request. What it emits is queued for the request
    that started it. A streaming reader that stops before the end (its client closed the
    stream: Stop) cancels the turn (`items`); a reader of the whole reply at once never does."""

    # asyncio keeps only weak references to tasks: these keep running turns alive until they end.
    _running: ClassVar[set[asyncio.Task[Any]]] = set()

    def __init__(self, run: Callable[[Emit], Awaitable[Any]]):
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.task: asyncio.Task[Any] = asyncio.ensure_future(run(self._queue.put_nowait))
        self._running.add(self.task)
        self.task.add_done_callback(self._running.discard)
        self.task.add_done_callback(lambda _task: self._queue.put_nowait(END))

    async def next(self) -> Any:
        """The next item the turn emitted, or END."""
        return await self._queue.get()

    async def items(self, keepalive: float | None = None) -> AsyncIterator[Any]:
        """What the turn emits until it ends, with KEEPALIVE after every `keepalive` seconds of
        silence. Left before the end (the client closed the stream), the turn is cancelled: the
        engine rolls it back and records it as stopped (docs/protocol.md, "Stop")."""
        ended = False
        try:
            while True:
                try:
                    item = await asyncio.wait_for(self._queue.get(), keepalive)
                except TimeoutError:
                    yield KEEPALIVE
                    continue
                if item is END:
                    ended = True
                    return
                yield item
        finally:
            if not ended and not self.task.done():
                self.task.cancel()


# Starlette's JSONResponse.render, its encoder made once: json.dumps given options builds an encoder
# (and its C encoder) every call. The same bytes (tests/test_http_turn_lean.py).
_response_json = wire.encoder_made_once(
    json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")))


class QuickJSONResponse(JSONResponse):
    """A JSON response rendered as JSONResponse renders it, for bodies built here (plain JSON, no
    circular references): an HTTP turn's reply, a /v1 answer."""

    def render(self, content: Any) -> bytes:
        return _response_json(content).encode("utf-8")
