"""The server's edge: checks every request passes before the app sees it (an ASGI middleware).

- Host: only the names the server is known by (DNS rebinding: a page on a foreign name that
  resolves to 127.0.0.1 must not reach a local server). 400 BadHost / WebSocket refused (403).
- Origin: a browser's WebSocket or write request (POST, DELETE...) from another site is
  refused unless its origin is allowed (same-origin by default). 403 Forbidden / 403. A page of
  an allowed origin (`--allow-origin`) gets what a browser needs to call the HTTP API (CORS):
  its preflight (OPTIONS) answered 204, and every answer, refusals included, readable by it.
- Content-Type: a POST with a body must be JSON (a form or text/plain POST is what a foreign
  page can send without asking); an upload may also be the file itself, in its own type, but
  never one of the types a foreign page can send (SIMPLE_TYPES); a channel's webhook
  (/channels/...) may be a form, which its platform signs. 415 UnsupportedMediaType.
- Body: at most `max_body_bytes`, checked from Content-Length first and then while reading,
  never read whole first (413 TooLarge); all of it within `body_timeout` seconds (408). The
  bodies that carry files (uploads and `/v1` turns) are not read here: their limits are their
  route's `attachments:`, which only the endpoint knows (the session's current route, the bot
  a `/v1` body names), so the endpoint reads them itself with `read_body`, under the same rules.

Every refusal is the JSON the API documents: {"error": REASON, "message": TEXT}.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# What a page of an allowed origin may send and read (CORS): the API's methods, any header it
# asks for (a token, Idempotency-Key, X-Chatrun-Session...), and the answers' own headers.
CORS_METHODS = b"GET, POST, DELETE"
CORS_EXPOSED = b"Retry-After, Content-Disposition, Allow"
CORS_MAX_AGE = b"600"
MAX_HOSTS_KEPT = 64  # allowed Host headers remembered (EdgeGuard.check_host)


@dataclass(frozen=True)
class EdgePolicy:
    """allowed_hosts: host names (no port) a request's Host may carry; ("*",) allows any.
    allowed_origins: origins (scheme://host[:port]) allowed besides the server's own; ("*",) any."""

    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = 64 * 1024
    body_timeout: float = 30.0


# The bodies that may carry files (base64 in JSON): an upload, and an OpenAI turn's content parts.
FILE_PATHS = ("/v1/chat/completions", "/v1/responses")


# What a page of another site can POST without asking first (no CORS preflight): never a body type.
SIMPLE_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")


def carries_files(path: str) -> bool:
    return path in FILE_PATHS or is_upload(path)


def is_upload(path: str) -> bool:
    return path.endswith("/attachments")


class Refused(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class EdgeGuard:
    def __init__(self, app: ASGIApp, policy: EdgePolicy):
        self.app = app
        self.policy = policy
        self.any_host = "*" in policy.allowed_hosts
        self.hosts = {h.lower().strip("[]") for h in policy.allowed_hosts}
        self.any_origin = "*" in policy.allowed_origins
        self.origins = {o.lower().rstrip("/") for o in policy.allowed_origins}
        # Host headers found allowed (a few: the names the server is known by, with their ports),
        # so that a request does not parse its Host again (urlsplit: ~5,000 instructions).
        self._allowed_hosts: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        origin = headers.get("origin")
        if scope["type"] == "http" and origin is not None and self.cross_origin(origin, headers):
            if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                await _preflight(send, origin, headers)  # (the Host check is for what answers data)
                return
            send = _readable_by(origin, send)
        try:
            self.check_host(headers)
            if scope["type"] == "websocket" or scope["method"] not in SAFE_METHODS:
                self.check_origin(headers)
            if scope["type"] == "http":
                receive = await self.read_body(scope, headers, receive)
        except Refused as exc:
            if scope["type"] == "websocket":
                # Refused before the handshake: the client sees HTTP 403 (browsers show no reason).
                await send({"type": "websocket.close", "code": 1008, "reason": exc.message[:120]})
            else:
                await send_error(send, exc.status, exc.reason, exc.message, openai=is_openai_path(scope["path"]))
            return
        await self.app(scope, receive, send)

    def check_host(self, headers: dict[str, str]) -> None:
        if self.any_host:
            return
        host = headers.get("host", "")
        if host in self._allowed_hosts:
            return
        name = urlsplit(f"//{host}").hostname or ""
        if name in self.hosts:
            if len(self._allowed_hosts) < MAX_HOSTS_KEPT:
                self._allowed_hosts.add(host)
            return
        raise Refused(
            400,
            "BadHost",
            f"Host {host!r} is not a name this server answers to (allowed: {', '.join(sorted(self.hosts))}); "
            "start it with --allow-host NAME",
        )

    def check_origin(self, headers: dict[str, str]) -> None:
        origin = headers.get("origin")
        if origin is None or self.any_origin:
            return  # not a browser, or every origin allowed
        if origin.lower().rstrip("/") in self.origins:
            return
        if urlsplit(origin.lower()).netloc == headers.get("host", "").lower():
            return  # same origin: the server's own page
        raise Refused(
            403, "Forbidden", f"Origin {origin!r} is not allowed; start the server with --allow-origin {origin}"
        )

    def cross_origin(self, origin: str, headers: dict[str, str]) -> bool:
        """Whether `origin` is another site's that --allow-origin allows (the server's own page
        needs no CORS)."""
        own = origin.lower().rstrip("/")
        return (self.any_origin or own in self.origins) and urlsplit(own).netloc != headers.get("host", "").lower()

    async def read_body(self, scope: Scope, headers: dict[str, str], receive: Receive) -> Receive:
        """Read the body under the size and time limits; hand the app a receive replaying it.
        A body that carries files goes to its endpoint unread (its limits are its route's)."""
        limit = self.policy.max_body_bytes
        length = headers.get("content-length")
        files = carries_files(scope["path"])
        if not files and length is not None and length.isdigit() and int(length) > limit:
            raise Refused(413, "TooLarge", f"body of {length} bytes is over the limit of {limit} bytes")
        has_body = (length not in (None, "0")) or "transfer-encoding" in headers
        if has_body and scope["method"] not in SAFE_METHODS:
            self.check_body_type(scope["path"], headers)
        if files:
            return receive
        body, left = await read_body(receive, limit, self.policy.body_timeout,
                                     lambda: f"body over the limit of {limit} bytes")
        return _replay(b"" if left else bytes(body), receive, left)

    @staticmethod
    def check_body_type(path: str, headers: dict[str, str]) -> None:
        kind = body_type(headers)
        if kind == "application/json" or kind.endswith("+json"):
            return
        if is_upload(path) and kind and kind not in SIMPLE_TYPES:
            return  # the file itself (docs/protocol.md, "Attachments")
        if path.startswith("/channels/") and kind == "application/x-www-form-urlencoded":
            return  # a platform's delivery (Slack's interactivity), trusted by its signature alone

        raise Refused(
            415, "UnsupportedMediaType", f"the body must be JSON (Content-Type: application/json), not {kind or 'untyped'}"
        )


async def _preflight(send: Send, origin: str, headers: dict[str, str]) -> None:
    """A browser asking whether a page of an allowed origin may send its request: yes."""
    asked = headers.get("access-control-request-headers", "").encode("latin-1")
    await send({"type": "http.response.start", "status": 204, "headers": [
        *_cors_headers(origin), (b"access-control-allow-methods", CORS_METHODS),
        *([(b"access-control-allow-headers", asked)] if asked else []), (b"access-control-max-age", CORS_MAX_AGE)]})
    await send({"type": "http.response.body", "body": b""})


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


def _readable_by(origin: str, send: Send) -> Send:
    """`send`, its answer's start carrying the headers that let a page of `origin` read it."""
    added = [*_cors_headers(origin), (b"access-control-expose-headers", CORS_EXPOSED)]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            kept = [(k, v) for k, v in message.get("headers", [])
                    if k.lower() != b"access-control-allow-origin" and (k.lower(), v) != (b"vary", b"Origin")]
            message = {**message, "headers": [*kept, *added]}
        await send(message)

    return sending


def body_type(headers: Any) -> str:
    """The media type of a request's body (lower case, no parameters; "" when untyped)."""
    return str(headers.get("content-type", "")).split(";")[0].strip().lower()


async def read_body(receive: Receive, limit: int, timeout: float,
                    over: Callable[[], str]) -> tuple[bytearray, Message | None]:
    """A request's body, read chunk by chunk and refused as soon as it passes `limit` bytes
    (Refused 413 with the message `over()` gives: nothing past the limit is kept) or takes
    longer than `timeout` seconds (408); and the message that ended it early when the client
    left (None when it came whole). The one place a body is read under limits. From the edge's
    Replay, its message is taken as it is, without a timer (it is there: nothing waits)."""
    body = bytearray()
    deadline = time.monotonic() + timeout
    first = receive.take() if isinstance(receive, Replay) else None
    while True:
        if first is not None:
            message, first = first, None
        else:
            try:
                message = await _within(receive, deadline)
            except TimeoutError:
                raise Refused(408, "RequestTimeout", f"the body did not arrive within {timeout:g} s") from None
        if message["type"] != "http.request":  # the client left
            return body, message
        chunk = message.get("body", b"")
        if len(body) + len(chunk) > limit:
            raise Refused(413, "TooLarge", over())
        body += chunk
        if not message.get("more_body", False):
            return body, None


async def _within(receive: Receive, deadline: float) -> Message:
    """receive()'s message, TimeoutError if it has not come by `deadline` (time.monotonic()).
    asyncio.timeout, not wait_for: on Python 3.11 wait_for runs receive() in a task of its own,
    one per request; and the timer only once receive() waits: a message that is there (a small
    body comes with its headers) is taken without one, as a timer costs a request some 36,000
    instructions (scheduled, cancelled, popped) and could not fire while nothing waits
    (bench/README.md, "The HTTP turn, third pass")."""
    step = receive()
    if asyncio.iscoroutine(step):
        try:
            waits_on = step.send(None)
        except StopIteration as done:  # it came at once
            message: Message = done.value
            return message
        step = _Resumed(step, waits_on)
    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
        return await step


class _Resumed:
    """Awaiting the rest of a coroutine whose first step ran and waits on `waits_on`: what
    `await` of the coroutine itself would have done from there (PEP 380's delegation)."""

    __slots__ = ("_coro", "_waits_on")

    def __init__(self, coro: Any, waits_on: Any):
        self._coro, self._waits_on = coro, waits_on

    def __await__(self) -> Any:
        coro, value = self._coro, self._waits_on
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation (the timer's, or the request's) goes in
                try:
                    value = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as done:
                    return done.value


def _replay(body: bytes, receive: Receive, first: Message | None = None) -> Receive:
    return Replay(first or {"type": "http.request", "body": body, "more_body": False}, receive)


class Replay:
    """The receive the app gets from the edge: the body the edge read (or the message that ended
    it early) at once, then the client's own (only http.disconnect can come: StreamingResponse
    listens). `read_body` takes the first without awaiting it (`take`)."""

    __slots__ = ("_pending", "_receive")

    def __init__(self, first: Message, receive: Receive):
        self._pending: Message | None = first
        self._receive = receive

    async def __call__(self) -> Message:
        pending, self._pending = self._pending, None
        if pending is not None:
            return pending
        return await self._receive()

    def take(self) -> Message | None:
        """The message a call would return at once, taken (None: a call would ask the client)."""
        pending, self._pending = self._pending, None
        return pending


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def openai_code(reason: str) -> str:
    """A reason in /v1's spelling of codes, snake_case like its own (`model_not_found`): TooLarge: too_large."""
    return "".join("_" + c.lower() if c.isupper() else c for c in reason).lstrip("_")


def error_body(status: int, reason: str, message: str, openai: bool = False) -> bytes:
    """A refusal's JSON body: the HTTP API's `{"error", "message"}`, or `openai`: OpenAI's shape."""
    if not openai:
        return json.dumps({"error": reason, "message": message}).encode()
    kind = "permission_error" if status == 403 else "server_error" if status >= 500 else "invalid_request_error"
    return json.dumps({"error": {"message": message, "type": kind, "code": openai_code(reason), "param": None}}).encode()


def is_openai_path(path: str | bytes) -> bool:
    """A path of the OpenAI-compatible API (/v1/...), whose refusals are in OpenAI's shape."""
    if isinstance(path, bytes):
        return path.startswith(b"/v1/")
    return path.startswith("/v1/")


async def send_error(send: Send, status: int, reason: str, message: str, headers: list[tuple[bytes, bytes]] | None = None,
                     openai: bool = False) -> None:
    """A refusal as JSON; `openai`: in the OpenAI API's error shape, for /v1's clients (their SDKs read it)."""
    body = error_body(status, reason, message, openai)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
