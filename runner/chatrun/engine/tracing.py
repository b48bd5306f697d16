"""OpenTelemetry spans of a turn, following the GenAI semantic conventions (v1.37, still
marked development), when `opentelemetry-api` is installed (`pip install 'chatrun[otel]'`).

    invoke_agent {bot}       one turn       gen_ai.conversation.id = session.id = the session id
      chat {model}           a model call   gen_ai.request.model, gen_ai.usage.*, finish reasons
      execute_tool {tool}    a tool call    gen_ai.tool.name, gen_ai.tool.call.id ({tool}: `(unknown)`
                                            for a name the route does not offer; gen_ai.tool.name
                                            keeps the name the model sent)

plus chatrun's own attributes (`chatrun.route`, `chatrun.stack`, `chatrun.turn`, `chatrun.action`).
The agent span is INTERNAL (the agent runs in this process), the model calls CLIENT. Message
content is recorded only when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT is true: the
model calls' messages on `chat`, the user's input and the reply on `invoke_agent` (the
conventions' `parts` format). Inside `own_trace()` (each WebSocket turn) a turn starts a trace
of its own, linked to the span current there (the connection's). The deprecated `gen_ai.system` is emitted beside `gen_ai.provider.name` for backends
that still read it, unless OTEL_SEMCONV_STABILITY_OPT_IN holds `gen_ai_latest_experimental`.
Without the package every call here is a no-op costing one function call.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

try:
    from opentelemetry import trace as _trace
except ImportError:  # the optional extra is not installed: no spans, no cost
    _trace = None  # type: ignore[assignment]  # mypy types the name as the module; None says "off"

from chatrun.version import VERSION

# What a span keeps of an exception's text, set by the turn span for every span inside it: the bot's
# `storage` guardrails (a handler's error may quote a card number the history holds redacted).
_KEPT: contextvars.ContextVar[Callable[[str], str] | None] = contextvars.ContextVar("chatrun_span_kept",
                                                                                   default=None)

SEMCONV_VERSION = "1.37.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"


def _tracer() -> Any:
    return _trace.get_tracer("chatrun", VERSION, schema_url=SCHEMA_URL)


def capture_content() -> bool:
    return os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").lower() in ("1", "true")


def _latest_only() -> bool:
    return "gen_ai_latest_experimental" in os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "")


_LINK_KEY = "chatrun.trace.link"  # the context key own_trace() leaves the linked span's context under


@contextlib.contextmanager
def own_trace() -> Iterator[None]:
    """Spans started inside begin a trace of their own, linked to the span current here (a
    WebSocket connection's, which would otherwise hold every turn of the connection)."""
    if _trace is None or not _trace.get_current_span().get_span_context().is_valid:
        yield
        return
    from opentelemetry import context

    linked = _trace.get_current_span().get_span_context()
    token = context.attach(context.set_value(_LINK_KEY, linked, context.Context()))  # no current span
    try:
        yield
    finally:
        context.detach(token)


OFF = contextlib.nullcontext(None)  # the "span" of a block while nothing records spans (reusable)


def recording() -> bool:
    """Whether spans would be recorded: OpenTelemetry is installed and a tracer provider is set.
    Until one is, the API's proxy provider makes spans that record nothing and keep the current
    span's context as it is: skipping them changes nothing but the cost of every turn."""
    return _trace is not None and not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)


def span(name: str, attributes: dict[str, Any], client: bool = True,
         kept: Callable[[str], str] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A span around a block (None inside when tracing is off): CLIENT (a call out) or INTERNAL.
    An exception ends it with status ERROR, `error.type` and its text as `kept` (given to this
    span or the one around it) leaves it, then goes on."""
    return _span(name, attributes, client, kept) if recording() else OFF


@contextlib.contextmanager
def _span(name: str, attributes: dict[str, Any], client: bool, kept: Callable[[str], str] | None) -> Iterator[Any]:
    from opentelemetry import context

    token = _KEPT.set(kept) if kept is not None else None
    linked = context.get_value(_LINK_KEY)
    root = isinstance(linked, _trace.SpanContext) and not _trace.get_current_span().get_span_context().is_valid
    links = [_trace.Link(linked)] if root and isinstance(linked, _trace.SpanContext) else None
    with _tracer().start_as_current_span(name, kind=_trace.SpanKind.CLIENT if client else _trace.SpanKind.INTERNAL,
                                         attributes=_clean(attributes), links=links,
                                         record_exception=False, set_status_on_exception=False) as current:
        try:
            yield current
        except BaseException as exc:
            redact = _KEPT.get()
            current.set_attribute("error.type", type(exc).__name__)
            # Redacted before it is cut: a card number cut in two is no longer found.
            current.set_status(_trace.Status(_trace.StatusCode.ERROR,
                                             (redact(str(exc)) if redact is not None else str(exc))[:500]))
            raise
        finally:
            if token is not None:
                _KEPT.reset(token)


def turn_span(bot: str, session_id: str, turn: int, route: str, stack: list[str], owner: str | None,
              bot_version: str | None = None, kept: Callable[[str], str] | None = None) -> Any:
    if not recording():
        return OFF
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": bot,
        "gen_ai.agent.version": bot_version,  # the content version of the bot (docs/versions.md)
        "gen_ai.conversation.id": session_id,
        "session.id": session_id,
        "chatrun.turn": turn,
        "chatrun.route": route,
        "chatrun.stack": stack,
    }
    if owner:
        attributes["user.id"] = owner
    return span(f"invoke_agent {bot}", attributes, client=False, kept=kept)


def record_turn(current: Any, user_input: Any, replies: list[Any]) -> None:
    """The user's input and the reply (the turn's Message and Object events) on the agent span,
    when content capture is on, in the GenAI conventions' `parts` format."""
    if current is None or not capture_content():
        return
    said = user_input if isinstance(user_input, str) else json.dumps(user_input, ensure_ascii=False)
    current.set_attribute("gen_ai.input.messages", json.dumps(
        [{"role": "user", "parts": [{"type": "text", "content": said}]}], ensure_ascii=False))
    parts = [{"type": "text", "content": r} if isinstance(r, str) else {"type": "text", "content": json.dumps(
        r, ensure_ascii=False)} for r in replies]
    current.set_attribute("gen_ai.output.messages", json.dumps(
        [{"role": "assistant", "parts": parts, "finish_reason": "stop"}], ensure_ascii=False))


def chat_span(provider: str, model: str, route: str, temperature: float | None,
              kept: Callable[[str], str] | None = None) -> Any:
    """A model call's span; `kept`: what its failure's text is redacted by, where no span around
    it says (a call after the turn's span ended: the user's summary at the conversation's end)."""
    if not recording():
        return OFF
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "gen_ai.request.temperature": temperature,
        "chatrun.route": route,
    }
    if not _latest_only():
        attributes["gen_ai.system"] = provider
    return span(f"chat {model}", attributes, kept=kept)


def tool_span(tool: str, call_id: str, action: str, sent: str | None = None) -> Any:
    """The span of one tool call, named by `tool` (a bounded name: engine/call.py `tool_label`);
    `gen_ai.tool.name` is the name the model `sent` (the tool's, when not given)."""
    return span(f"execute_tool {tool}", {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool if sent is None else sent,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function",
        "chatrun.action": action,
    }, client=False)


def tool_failed(current: Any) -> None:
    """The tool did not do its work (refused, failed, unknown); the model was told, the turn goes on."""
    if current is not None:
        current.set_attribute("error.type", "tool_error")
        current.set_status(_trace.Status(_trace.StatusCode.ERROR))


def delivery_failed(current: Any, error: str) -> None:
    """A backend event's delivery attempt failed (chatrun serve's outbox worker retries it)."""
    if current is not None:
        current.set_attribute("error.type", "delivery_failed")
        current.set_status(_trace.Status(_trace.StatusCode.ERROR, error[:500]))


def pending_noted(kind: str, data: dict[str, Any]) -> None:
    """A span event on the current span (the turn's, or the tool call's that paused) when an
    item opens (`chatrun.pending`) or is resolved (`chatrun.resolved`): its id, kind, outcome."""
    if _trace is None:
        return
    current = _trace.get_current_span()
    if current.is_recording():
        current.add_event(f"chatrun.{kind}", _clean({
            "chatrun.pending.id": data.get("id"), "chatrun.pending.kind": data.get("kind"),
            "chatrun.pending.outcome": data.get("outcome"), "chatrun.pending.tool": data.get("tool"),
            "chatrun.pending.due": data.get("due")}))


def model_fallback(from_model: str, to_model: str, reason: str) -> None:
    """A span event on the current span (the model call's) when the call moves to the next model
    of `model.fallback:` (`chatrun.model.fallback`: from, to, reason)."""
    if _trace is None:
        return
    current = _trace.get_current_span()
    if current.is_recording():
        current.add_event("chatrun.model.fallback", {"chatrun.model.fallback.from": from_model,
                                                     "chatrun.model.fallback.to": to_model,
                                                     "chatrun.model.fallback.reason": reason})


def record_answered_by(current: Any, model: str, primary: str) -> None:
    """The model call was answered by a fallback: `gen_ai.request.model` says whom the last
    request went to, `chatrun.model.fallback.from` the route's own model."""
    if current is not None and model != primary:
        current.set_attributes({"gen_ai.request.model": model, "chatrun.model.fallback.from": primary})


def record_answer(current: Any, usage: dict[str, Any], finish_reason: str | None,
                  sent: list[dict[str, Any]] | None = None, answer: dict[str, Any] | None = None) -> None:
    if current is None:
        return
    current.set_attributes(_clean({
        "gen_ai.usage.input_tokens": usage.get("input_tokens"),
        "gen_ai.usage.output_tokens": usage.get("output_tokens"),
        "gen_ai.response.finish_reasons": [finish_reason] if finish_reason else None,
        "chatrun.usage.estimated": usage.get("estimated"),
        "chatrun.usage.cost": usage.get("cost"),
    }))
    if sent is not None and capture_content():
        current.set_attribute("gen_ai.input.messages", json.dumps(sent, ensure_ascii=False))
        current.set_attribute("gen_ai.output.messages", json.dumps([answer], ensure_ascii=False))


def inject(headers: dict[str, str]) -> None:
    """Add the current trace context (W3C `traceparent`) to an outgoing request's headers."""
    if _trace is not None:
        from opentelemetry import propagate

        propagate.inject(headers)


def enabled() -> bool:
    return _trace is not None


@contextlib.contextmanager
def continued_from(headers: dict[str, str]) -> Iterator[None]:
    """Inside this block, spans started (and tasks created) continue the trace whose context
    `headers` carry (W3C `traceparent`/`tracestate`), unless a span is already current (an
    instrumented server framework started one: it extracted the same context already)."""
    if _trace is None or "traceparent" not in headers or _trace.get_current_span().get_span_context().is_valid:
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        context.detach(token)


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None}
