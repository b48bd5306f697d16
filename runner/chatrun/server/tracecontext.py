"""Trace context continued from the caller: an ASGI middleware that makes each HTTP request
(the HTTP API, /v1, SSE) and each WebSocket connection (its handshake's headers) run in the
trace its W3C `traceparent` header names, so the `invoke_agent` span of every turn it runs
is a child of the caller's span. A no-op without opentelemetry-api."""

from __future__ import annotations

from typing import Any

from chatrun.engine import tracing

CARRIED = (b"traceparent", b"tracestate", b"baggage")


class TraceContext:
    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not tracing.enabled() or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        carried = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope.get("headers", ()) if name in CARRIED}
        if "traceparent" not in carried:  # no trace to continue (continued_from would do nothing)
            await self.app(scope, receive, send)
            return
        with tracing.continued_from(carried):
            await self.app(scope, receive, send)
