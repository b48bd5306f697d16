"""How `chatrun serve` listens: uvicorn with the timeouts and caps a hostile client needs.

uvicorn offers the connection cap (`limit_concurrency`) but checks it only once a request's
headers are complete, so connections that never finish their headers (slowloris) would each
hold a file descriptor until the process has none left and new clients get no answer at all.
HeaderTimeoutProtocol counts connections as they are accepted: one over the cap is answered
503 at once (the same JSON error body as every other refusal) and closed, so its descriptor is
free again; `fd_headroom` checks at start-up that the cap fits under the fd limit. uvicorn
offers the keep-alive timeout; it has no timeout on a request's headers, so a client dripping them one byte at a
time would hold its connection for ever. HeaderTimeoutProtocol adds one: a connection whose
request headers are not complete within `header_timeout` seconds of its first byte (or of the
connection) is answered 408 and closed; one whose line and headers pass `max_header_bytes` is
answered 431 and closed (httptools keeps them whatever their size). (Body timeouts are the
EdgeGuard's.) uvicorn reads
a WebSocket message up to twice chatrun's frame limit (`ws_read_bound`), not 16 MiB. A WebSocket
whose client stopped reading is aborted once its handler ends, rather than waiting for ever
to flush, and a closed one is freed at once (its parser closed). Access logs never show a `token=` query value.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from chatrun.server.guard import error_body, is_openai_path, send_error


@dataclass(frozen=True)
class ListenOptions:
    header_timeout: float = 10.0  # seconds to send a request's headers
    keep_alive_timeout: int = 5  # seconds an idle HTTP connection stays open
    max_connections: int = 1000  # beyond it new requests get 503 (keep under the fd limit)
    ws_ping_interval: float = 20.0  # WebSocket pings; a peer that does not answer in time is closed
    max_header_bytes: int = 64 * 1024  # a request's line and headers; beyond it 431 (httptools keeps any size)
    log_format: str = "text"  # "json": uvicorn's own records (access log included) as JSON lines too


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout = ListenOptions.header_timeout
    max_header_bytes = ListenOptions.max_header_bytes

    # One timer a connection, not one a request: a request's start sets its deadline and the
    # headers' end clears it, and the timer, when it fires, answers 408 only if the deadline it
    # finds has passed, else waits for it. Scheduling and cancelling a timer for every request
    # of a keep-alive connection cost ~16,000 instructions a request (issue 39).

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_deadline: float | None = None
        self._header_bytes = 0  # of the request whose headers are being read (data_received)
        cap = self.limit_concurrency
        if cap is not None and len(self.connections) > cap:  # this one included: over the cap at accept
            self.logger.warning("Exceeded connection limit (serve --max-connections %d): refused at accept.", cap)
            transport.write(OVER_THE_CAP_RESPONSE)
            transport.close()
            return
        self._start_header_clock()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_deadline is None:  # a keep-alive connection's next request starts
            self._start_header_clock()

    def data_received(self, data: bytes) -> None:
        # httptools keeps a request's line and headers whatever their size, until they end: 20 MB
        # of one header, sent within the header timeout, was held and then served. Counted here
        # by the bytes that came while they were being read (a chunk that ends them, a body's
        # with them, is not counted), refused 431 once over `max_header_bytes`.
        super().data_received(data)
        if self._header_deadline is None or self.transport.is_closing():
            self._header_bytes = 0
            return
        self._header_bytes += len(data)
        if self._header_bytes > self.max_header_bytes:
            self._header_deadline = None
            self._refuse(b"431 Request Header Fields Too Large", 431, "TooLarge",
                         f"the request's line and headers are over the limit of {self.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        self._header_deadline = None
        cap = self.limit_concurrency
        if cap is None or (len(self.connections) < cap and len(self.tasks) < cap):
            super().on_headers_complete()
            return
        # Over the cap: uvicorn would answer with its own plain-text app; hand it ours instead
        # (it runs the request's cycle with whichever app it holds, synchronously chosen here).
        self.logger.warning("Exceeded concurrency limit.")
        app, self.app, self.limit_concurrency = self.app, _over_the_cap, None
        try:
            super().on_headers_complete()
        finally:
            self.app, self.limit_concurrency = app, cap

    def connection_lost(self, exc: Exception | None) -> None:
        self._header_deadline = None
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._header_deadline = None  # idle between requests: the keep-alive timeout's job

    def _start_header_clock(self) -> None:
        self._header_deadline = self.loop.time() + self.header_timeout
        if self._header_timer is None:
            self._header_timer = self.loop.call_at(self._header_deadline, self._header_clock_rings)

    def _header_clock_rings(self) -> None:
        self._header_timer = None
        deadline = self._header_deadline
        if deadline is None:  # no request is reading its headers: the next one starts the clock again
            return
        if self.loop.time() < deadline:  # a later request's: wait for it
            self._header_timer = self.loop.call_at(deadline, self._header_clock_rings)
            return
        self._headers_too_slow()

    def send_400_response(self, msg: str) -> None:
        # httptools could not parse the request (its line, a header, Content-Length, a chunk):
        # uvicorn's own answer is text/plain; every other refusal is the JSON error body.
        self._refuse(b"400 Bad Request", 400, "BadRequest", "the request is not valid HTTP/1.1 (its request line, "
                     "a header, its Content-Length or its chunked body)")

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing():
            return
        self._refuse(b"408 Request Timeout", 408, "RequestTimeout", "the request headers did not arrive in time")

    def _refuse(self, status_line: bytes, status: int, reason: str, message: str) -> None:
        """Answer before the app is reached, and close: the JSON error body, in OpenAI's shape on
        /v1 paths (the request line, when it came, names the path)."""
        body = error_body(status, reason, message, openai=is_openai_path(getattr(self, "url", b"")))
        self.transport.write(
            b"HTTP/1.1 " + status_line + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        self.transport.close()


OVER_THE_CAP_MESSAGE = "the server is serving as many connections as it may (serve --max-connections); try again shortly"
OVER_THE_CAP_BODY = error_body(503, "Unavailable", OVER_THE_CAP_MESSAGE)
OVER_THE_CAP_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(OVER_THE_CAP_BODY)).encode()),
                        (b"connection", b"close"), (b"retry-after", b"1")]
# The same answer, written before the request is read (a connection refused at accept).
OVER_THE_CAP_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\n"
                         + b"".join(name + b": " + value + b"\r\n" for name, value in OVER_THE_CAP_HEADERS)
                         + b"\r\n" + OVER_THE_CAP_BODY)
# File descriptors a server needs besides its clients' connections: the listening socket, the
# store's connections, the models' and tools' HTTP connections, MCP servers, log files.
FD_RESERVE = 64


async def _over_the_cap(scope: Any, receive: Any, send: Any) -> None:
    if is_openai_path(scope["path"]):  # /v1's clients read OpenAI's error shape (a refusal at accept has no path)
        await send_error(send, 503, "Unavailable", OVER_THE_CAP_MESSAGE, [(b"retry-after", b"1")], openai=True)
        return
    await send({"type": "http.response.start", "status": 503, "headers": OVER_THE_CAP_HEADERS})
    await send({"type": "http.response.body", "body": OVER_THE_CAP_BODY, "more_body": False})


def fd_headroom(max_connections: int) -> str | None:
    """Make room for `max_connections` client connections under the process's file-descriptor
    limit (raising the soft limit up to the hard one when needed); a warning when there is not
    enough, else None. Past the limit new connections cannot even be accepted: they get no answer."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    return (f"--max-connections {max_connections} does not fit under the open-file limit ({soft}; "
            f"{FD_RESERVE} are kept for the store, models and tools): past it new clients get no answer. "
            f"Lower --max-connections to {max(1, soft - FD_RESERVE)} or raise the limit (ulimit -n)")


class AbortingWebSocketProtocol(WebSocketsSansIOProtocol):
    async def run_asgi(self) -> None:
        await super().run_asgi()
        if not self.writable.is_set():
            self.transport.abort()  # the peer does not read: do not wait for ever to flush

    def send_receive_event_to_app(self) -> None:
        # A text frame that is not UTF-8 breaks the protocol: uvicorn closes it 1007, as RFC 6455
        # says, but logs the client's bytes as a server ERROR with a traceback (a log any client
        # could fill). Closed the same way here, with a warning.
        if self.curr_msg_data_type == "text" and not self.close_sent:
            data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
            if not data.isascii():  # ASCII is UTF-8: the usual frame is checked no further
                try:
                    data.decode()
                except UnicodeDecodeError:
                    self.frames = []
                    self.logger.warning("WebSocket text frame that is not UTF-8: connection closed (1007)")
                    self.conn.send_close(1007)
                    self.handle_parser_exception()
                    return
        super().send_receive_event_to_app()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        # websockets' parser is a generator that waits for the end of the stream, which uvicorn
        # never passes on once the socket is gone; its frame refers back to the connection, so the
        # connection (and its permessage-deflate contexts: ~50 KB of zlib memory the cyclic
        # collector neither sees nor counts) lived on as garbage until a rare full collection
        # (tune_gc): ~20 MB of a server's RSS after a few hundred conversations. Closing it frees
        # the connection as soon as its last reference goes.
        self.conn.parser.close()


class RedactTokens(logging.Filter):
    """Replace the value of any `token=` query parameter in a log record with `***`."""

    PATTERN = re.compile(r"([?&]token=)[^&\s\"']*", re.IGNORECASE)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(self._redact(a) for a in record.args)
        if isinstance(record.msg, str) and "token=" in record.msg.lower():
            record.msg = self.PATTERN.sub(r"\1***", record.msg)
        fields = getattr(record, "chatrun", None)  # a turn line's fields, which the JSON format writes
        if isinstance(fields, dict):
            record.chatrun = {k: self._redact(v) for k, v in fields.items()}
        return True

    def _redact(self, value: Any) -> Any:
        return self.PATTERN.sub(r"\1***", value) if isinstance(value, str) and "token=" in value.lower() else value


class QuietScrapes(logging.Filter):
    """Drop the access-log line of a `GET /metrics` (a scraper's every 15 s would drown the log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) >= 3 and args[1] == "GET"
                    and isinstance(args[2], str) and args[2].split("?", 1)[0] == "/metrics")


def redact_tokens_in_logs() -> None:
    """Install RedactTokens on uvicorn's loggers and the turn log (idempotent)."""
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn", "chatrun.turns"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in logger.filters):
            logger.addFilter(RedactTokens())
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QuietScrapes) for f in access.filters):
        access.addFilter(QuietScrapes())


def uvicorn_config(app: Any, host: str, port: int, options: ListenOptions = ListenOptions(), **extra: Any) -> Any:  # noqa: B008
    """The uvicorn.Config `chatrun serve` runs (tests use it too)."""
    import uvicorn

    protocol = type("HeaderTimeout", (HeaderTimeoutProtocol,), {"header_timeout": options.header_timeout,
                                                               "max_header_bytes": options.max_header_bytes})
    if options.log_format == "json":
        extra.setdefault("log_config", json_log_config())
    bound = ws_read_bound(app)
    if bound is not None:
        extra.setdefault("ws_max_size", bound)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        ws=AbortingWebSocketProtocol,
        timeout_keep_alive=options.keep_alive_timeout,
        limit_concurrency=options.max_connections,
        ws_ping_interval=options.ws_ping_interval,
        ws_ping_timeout=options.ws_ping_interval,
        **extra,
    )
    redact_tokens_in_logs()
    return config


# What uvicorn reads of one WebSocket message before chatrun sees it, as a multiple of chatrun's
# frame limit (ServerLimits.max_frame_bytes): uvicorn's own bound is 16 MiB, each read whole
# before chatrun refused it. A frame a little over the limit still gets its TooLarge and the
# connection stays usable; one over this bound is closed 1009 (message too big) as it arrives.
WS_READ_FACTOR = 2


def ws_read_bound(app: Any) -> int | None:
    """uvicorn's `ws_max_size` for `app` (chatrun's app keeps its ServerLimits in app.state);
    None (uvicorn's default) for an app without them."""
    limits = getattr(getattr(app, "state", None), "limits", None)
    frame = getattr(limits, "max_frame_bytes", None)
    return frame * WS_READ_FACTOR if isinstance(frame, int) else None


def json_log_config() -> dict[str, Any]:
    """uvicorn's logging configuration with its formatters replaced by chatrun's JSON lines."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    for name in config["formatters"]:
        config["formatters"][name] = {"()": "chatrun.server.turnlog.JsonFormatter"}
    return config
