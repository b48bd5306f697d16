"""OpenTelemetry spans of a travel-bot booking, recorded by the SDK's in-memory exporter:
names, parents and the GenAI semantic-convention attributes; the trace context reaches an
HTTP tool's API as a W3C traceparent header."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import chatrun

trace = pytest.importorskip("opentelemetry.trace", reason="opentelemetry is not installed (pip install 'chatrun[otel]')")

REPO = Path(__file__).resolve().parents[1]


def call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10}}


def test_a_booking_turn_is_one_agent_span_with_chat_and_tool_children(fake, spans, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    fake.queue(call("book_flight"), call("set_destination", destination="Dublin"),
               {"text": "When do you leave?", "usage": {"prompt_tokens": 120, "completion_tokens": 5}})
    session = chatrun.load_bot(REPO / "bots" / "travel").session(state={"traveller_name": "Ana"})
    session.chat("Fly me to Dublin")
    finished = spans.get_finished_spans()
    by_name: dict[str, list] = {}
    for s in finished:
        by_name.setdefault(s.name, []).append(s)
    [agent] = by_name["invoke_agent travel"]
    assert agent.parent is None and agent.kind == trace.SpanKind.INTERNAL
    # The user's input and the reply, in the conventions' parts format (content capture is on).
    assert json.loads(agent.attributes["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Fly me to Dublin"}]}]
    assert json.loads(agent.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "When do you leave?"}], "finish_reason": "stop"}]
    assert agent.attributes["gen_ai.conversation.id"] == session.id == agent.attributes["session.id"]
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["chatrun.route"] == "main_menu" and agent.attributes["chatrun.turn"] == 1
    chats = by_name["chat gpt-4o-mini"]
    assert len(chats) == 3 and all(c.parent.span_id == agent.context.span_id for c in chats)
    first = chats[0].attributes
    assert first["gen_ai.provider.name"] == "openai" and first["gen_ai.request.model"] == "gpt-4o-mini"
    assert first["gen_ai.usage.input_tokens"] == 100 and first["gen_ai.usage.output_tokens"] == 10
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert "Fly me to Dublin" in first["gen_ai.input.messages"]  # content, because it was asked for
    assert [c.attributes["chatrun.route"] for c in chats] == ["main_menu", "flight", "flight"]
    [push] = by_name["execute_tool book_flight"]
    assert push.attributes["gen_ai.tool.name"] == "book_flight"
    assert push.attributes["chatrun.action"] == "push flight execute immediate"
    assert push.parent.span_id == agent.context.span_id
    assert by_name["execute_tool set_destination"][0].attributes["gen_ai.tool.call.id"]


def test_no_message_content_unless_asked(fake, spans, monkeypatch):
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    fake.queue({"text": "Hi"})
    chatrun.load_bot(REPO / "bots" / "hello").session().chat("secret stuff")
    [chat] = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    assert "gen_ai.input.messages" not in chat.attributes and chat.kind == trace.SpanKind.CLIENT
    [agent] = [s for s in spans.get_finished_spans() if s.name.startswith("invoke_agent ")]
    assert "gen_ai.input.messages" not in agent.attributes and "gen_ai.output.messages" not in agent.attributes
    assert chat.attributes["chatrun.usage.estimated"] is False or "gen_ai.usage.input_tokens" in chat.attributes


def test_a_failed_turn_ends_its_span_with_an_error(fake, spans):
    fake.queue({"status": 500, "body": "down"}, {"status": 500, "body": "down"}, {"status": 500, "body": "down"},
               {"status": 500, "body": "down"})
    session = chatrun.load_bot(REPO / "bots" / "hello").session()
    session.chat("hi")
    [agent] = [s for s in spans.get_finished_spans() if s.name == "invoke_agent hello"]
    assert agent.status.status_code == trace.StatusCode.ERROR
    assert agent.attributes["error.type"] == "ModelUnavailable"  # a ModelError: the endpoint could not answer


def test_an_http_tool_carries_the_trace_context_to_the_api(spans, write_bot, monkeypatch):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.headers.get("traceparent"))
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("API", f"http://127.0.0.1:{server.server_port}")
    bot = chatrun.load_bot(write_bot("""
        name: traced
        model: {provider: scripted, name: m}
        env: {API: null}
        routes: {main: {default: true, system: Hi., tools: [ping]}}
        tools:
          ping: {description: ping, http: {url: "{{ env.API }}/ping"}}
        """))
    session = bot.session(model=chatrun.ScriptedModel([{"tool_calls": [{"name": "ping", "arguments": {}}]},
                                                       {"text": "ok"}]))
    session.chat("ping it")
    server.shutdown()
    [header] = seen
    [tool_span] = [s for s in spans.get_finished_spans() if s.name == "execute_tool ping"]
    assert header.startswith(f"00-{tool_span.context.trace_id:032x}-{tool_span.context.span_id:016x}-")


def test_a_tool_that_refuses_marks_its_span_as_an_error(spans, write_bot):
    bot = chatrun.load_bot(write_bot("""
        name: refusing
        model: {provider: scripted, name: m}
        routes: {main: {default: true, system: Hi., tools: [named]}}
        tools:
          named:
            description: needs a name
            parameters: {type: object, properties: {name: {type: string}}, required: [name]}
        """))
    session = bot.session(model=chatrun.ScriptedModel([{"tool_calls": [{"name": "named", "arguments": {}}]},
                                                       {"tool_calls": [{"name": "named", "arguments": {"name": "x"}}]},
                                                       {"text": "ok"}]))
    session.chat("go")
    refused, done = [s for s in spans.get_finished_spans() if s.name == "execute_tool named"]
    assert refused.status.status_code == trace.StatusCode.ERROR and refused.attributes["error.type"] == "tool_error"
    assert done.status.status_code == trace.StatusCode.UNSET and "error.type" not in done.attributes


def test_a_tool_name_the_model_invents_names_no_span(fake, spans):
    """A misbehaving model calls tools that do not exist, each under a new name: the spans are
    `execute_tool (unknown)`, as the metrics count them (one rule, engine/call.py `tool_label`),
    and each keeps the name the model sent in `gen_ai.tool.name` (before: a span name per name)."""
    invented = [f"tool_{n}_{'x' * n}" for n in range(3)]
    fake.queue(*(call(name) for name in invented), {"text": "Sorry."})
    chatrun.load_bot(REPO / "bots" / "hello").session().chat("hi")
    tools = [s for s in spans.get_finished_spans() if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert [s.name for s in tools] == ["execute_tool (unknown)"] * 3
    assert [s.attributes["gen_ai.tool.name"] for s in tools] == invented
    assert all(s.status.status_code == trace.StatusCode.ERROR for s in tools)  # the model was told: no such tool
