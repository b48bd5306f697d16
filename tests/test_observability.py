"""What an operator sees of a running `chatrun serve`: /metrics scraped over HTTP from a real
server and parsed with prometheus-client's own parser (counts move by exactly what real turns
did), the per-turn log line, and the caller's trace context continued into the turn's spans
(HTTP, WebSocket handshake, /v1) and on into an MCP server built with the SDK."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

import chatrun
from chatrun.messages import ToolResultMessage
from chatrun.server import create_app
from redis_support import answers_health
from server_support import ThreadServer, call, free_port, write_travel

prom_parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is not installed "
                                  "(pip install 'chatrun[metrics]')")

REPO = Path(__file__).resolve().parents[1]
USAGE = {"prompt_tokens": 100, "completion_tokens": 10}


def metrics(server: ThreadServer, **headers: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics: (name, labels) -> value."""
    response = httpx.get(f"{server.url}/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in prom_parser.text_string_to_metric_families(response.text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when there is none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def travel_server(fake, tmp_path):
    app = create_app([write_travel(tmp_path / "bot")], "memory://")
    with ThreadServer(app) as server:
        yield server


def new_session(server: ThreadServer, session_id: str) -> None:
    response = httpx.post(f"{server.url}/bots/travel/sessions", json={"id": session_id}, timeout=30)
    assert response.status_code == 201, response.text


def say(server: ThreadServer, session_id: str, text: str, **headers: str) -> dict:
    response = httpx.post(f"{server.url}/bots/travel/sessions/{session_id}/messages",
                          json={"userMessage": text}, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_metrics_count_what_real_turns_did(travel_server, fake):
    server = travel_server
    new_session(server, "m1")
    before = metrics(server)
    fake.queue(call("remember_name", name="Ana") | {"usage": USAGE},
               {"chunks": ["Hello ", "Ana"], "usage": {"prompt_tokens": 120, "completion_tokens": 5,
                                                       "prompt_tokens_details": {"cached_tokens": 96}}})
    assert say(server, "m1", "I am Ana")["ok"] is True
    fake.queue({"status": 500, "body": "down"})  # the travel bot retries nothing: the turn fails
    assert say(server, "m1", "hello?")["ok"] is False
    fake.queue(call("remember_name") | {"usage": USAGE}, {"text": "What is your name?", "usage": USAGE})
    assert say(server, "m1", "remember me")["ok"] is True  # no name: the tool refuses, the turn goes on
    after = metrics(server)

    turns = "chatrun_turns_total"
    assert delta(before, after, turns, bot="travel", route="main_menu", outcome="ok") == 2
    assert delta(before, after, turns, bot="travel", route="main_menu", outcome="failed") == 1
    assert delta(before, after, "chatrun_turn_duration_seconds_count", bot="travel", outcome="ok") == 2
    assert delta(before, after, "chatrun_turn_duration_seconds_sum", bot="travel") > 0
    assert delta(before, after, "chatrun_tool_calls_total", bot="travel", tool="remember_name") == 2
    assert delta(before, after, "chatrun_tool_failures_total", bot="travel", tool="remember_name") == 1
    model = {"bot": "travel", "gen_ai_request_model": "gpt-4o-mini", "gen_ai_provider_name": "openai"}
    # Five model calls, the failed one among them (with its error type: an HTTP 500 is an endpoint
    # that cannot answer now, ModelUnavailable, which a `model.fallback:` would answer).
    assert delta(before, after, "gen_ai_client_operation_duration_seconds_count", **model) == 5
    assert delta(before, after, "gen_ai_client_operation_duration_seconds_count", **model, error_type="") == 4
    assert delta(before, after, "gen_ai_client_operation_duration_seconds_count", **model,
                 error_type="ModelUnavailable") == 1
    tokens = "gen_ai_client_token_usage"
    assert delta(before, after, f"{tokens}_sum", **model, gen_ai_token_type="input") == 100 + 120 + 100 + 100
    assert delta(before, after, f"{tokens}_sum", **model, gen_ai_token_type="output") == 10 + 5 + 10 + 10
    assert delta(before, after, f"{tokens}_count", **model, gen_ai_token_type="input") == 4
    # What the provider's prompt cache served, as it reported it (issue 38)
    assert delta(before, after, "chatrun_model_cached_input_tokens_total", **model) == 96
    # The spec's bucket boundaries: 120 input tokens fall in le=256, not le=64.
    assert delta(before, after, f"{tokens}_bucket", **model, gen_ai_token_type="input", le="64.0") == 0
    assert delta(before, after, f"{tokens}_bucket", **model, gen_ai_token_type="input", le="256.0") == 4
    bounds = sorted(float(dict(ls)["le"]) for (n, ls), _ in after.items()
                    if n == f"{tokens}_bucket" and ("gen_ai_token_type", "input") in ls)
    assert bounds == [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
                      67108864, float("inf")]
    # Streamed answers with text: time to their first chunk (a tool call streams no text).
    assert delta(before, after, "chatrun_model_time_to_first_chunk_seconds_count", **model) == 2
    assert value(after, "chatrun_live_sessions") == 1
    assert value(after, "chatrun_session_wait_seconds_count", bot="travel") >= 3


def test_cost_is_counted_in_the_units_of_prices(fake, tmp_path):
    path = write_travel(tmp_path / "bot")
    path.write_text(path.read_text() + "prices:\n  gpt-4o-mini: {input: 1.0, output: 2.0}\n")
    with ThreadServer(create_app([path], "memory://")) as server:
        new_session(server, "c1")
        before = metrics(server)
        fake.queue({"text": "Hi", "usage": {"prompt_tokens": 1000, "completion_tokens": 500}})
        say(server, "c1", "hi")
        after = metrics(server)
    assert delta(before, after, "chatrun_cost_total", bot="travel", gen_ai_request_model="gpt-4o-mini") == \
        pytest.approx((1000 * 1.0 + 500 * 2.0) / 1e6)


def test_two_apps_in_one_process_count_their_own_turns(fake, tmp_path):
    path = write_travel(tmp_path / "bot")
    with ThreadServer(create_app([path], "memory://")) as one, ThreadServer(create_app([path], "memory://")) as two:
        new_session(one, "a")
        fake.queue({"text": "Hi"})
        say(one, "a", "hi")
        assert value(metrics(one), "chatrun_turns_total") == 1
        assert value(metrics(two), "chatrun_turns_total") == 0


def test_websocket_connections_and_requests_waiting_for_a_session(travel_server, fake):
    import websockets

    server = travel_server

    async def scenario() -> None:
        async with websockets.connect(f"{server.ws_url}/_chat/routes") as ws:
            assert value(metrics(server), "chatrun_websocket_connections") == 1
            await ws.send(json.dumps({"type": "Connect", "chatId": "w1", "requestId": 1}))
            assert json.loads(await ws.recv())["type"] == "Completed"
        # The handler ends a moment after the client closed.
        for _ in range(200):
            if value(metrics(server), "chatrun_websocket_connections") == 0:
                break
            await asyncio.sleep(0.05)
        assert value(metrics(server), "chatrun_websocket_connections") == 0

    asyncio.run(scenario())
    before = metrics(server)
    new_session(server, "busy")
    fake.queue({"text": "slow", "delay": 3}, {"text": "quick"})
    first = threading.Thread(target=say, args=(server, "busy", "one"))
    first.start()
    _until(lambda: value(metrics(server), "chatrun_session_requests_active") == 1)
    second = threading.Thread(target=say, args=(server, "busy", "two"))
    second.start()
    _until(lambda: value(metrics(server), "chatrun_session_requests_waiting") == 1)
    first.join(60)
    second.join(60)
    after = metrics(server)
    assert value(after, "chatrun_session_requests_waiting") == 0
    assert delta(before, after, "chatrun_session_wait_seconds_count", bot="travel") == 3  # create + 2 turns
    # The second request waited for the rest of the first one's slow turn.
    assert delta(before, after, "chatrun_session_wait_seconds_sum", bot="travel") > 0.05


def _until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def test_metrics_are_protected_when_auth_is_on(fake, tmp_path):
    from chatrun.server.auth import Auth

    auth = Auth.from_mapping({"tokens": {"s3cret-ops": {"principal": "ops"}}})
    with ThreadServer(create_app([write_travel(tmp_path / "bot")], "memory://", auth=auth)) as server:
        refused = httpx.get(f"{server.url}/metrics", timeout=30)
        assert refused.status_code == 401 and refused.json()["error"] == "Unauthorized"
        assert "chatrun_turns" in httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer s3cret-ops"},
                                            timeout=30).text


def test_without_prometheus_client_metrics_say_what_to_install(fake, tmp_path, monkeypatch):
    import chatrun.server.metrics as server_metrics

    monkeypatch.setattr(server_metrics, "_prom", None)  # as if the extra were not installed
    app = create_app([write_travel(tmp_path / "bot")], "memory://")
    assert app.state.metrics is None and app.state.registry.metrics is None
    with ThreadServer(app) as server:
        new_session(server, "n1")
        fake.queue({"text": "Hi"})
        assert say(server, "n1", "hi")["ok"] is True  # turns run, unmeasured
        answer = httpx.get(f"{server.url}/metrics", timeout=30)
    assert answer.status_code == 501
    assert answer.json() == {"error": "NotImplemented",
                             "message": "/metrics needs prometheus-client: pip install 'chatrun[metrics]'"}


# -- the turn log ------------------------------------------------------------------------------


def turn_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "chatrun.turns"]


def test_one_log_line_per_turn_without_content(travel_server, fake, caplog):
    caplog.set_level(logging.INFO, logger="chatrun.turns")
    new_session(travel_server, "l1")
    fake.queue(call("book_flight") | {"usage": USAGE}, {"text": "Where to?", "usage": USAGE})
    say(travel_server, "l1", "my secret plan: fly", **{"Idempotency-Key": "req-1"})
    say(travel_server, "l1", "my secret plan: fly", **{"Idempotency-Key": "req-1"})  # a retry: replayed
    fake.queue({"status": 500, "body": "down"})
    say(travel_server, "l1", "and back?")
    first, replay, failed = turn_lines(caplog)
    fields = first.chatrun
    assert fields["session"] == "l1" and fields["bot"] == "travel" and fields["turn"] == 1
    assert fields["route"] == "main_menu" and fields["route_after"] == "flight" and fields["outcome"] == "ok"
    assert fields["input_tokens"] == 200 and fields["output_tokens"] == 20 and fields["calls"] == 2
    assert fields["request_id"] == "req-1" and fields["duration_ms"] > 0
    assert first.getMessage().startswith("turn session=l1 bot=travel turn=1 route=main_menu->flight outcome=ok ")
    assert "secret" not in first.getMessage() + json.dumps(fields) and "Where to" not in json.dumps(fields)
    assert replay.chatrun["outcome"] == "replayed" and replay.chatrun["turn"] == 1
    assert failed.chatrun["outcome"] == "failed" and failed.chatrun["route_after"] == "flight"
    assert "request_id" not in failed.chatrun


def test_the_log_carries_content_only_when_asked_and_never_a_token(fake, tmp_path, caplog):
    from chatrun.server.listen import RedactTokens
    from chatrun.server.turnlog import JsonFormatter

    caplog.set_level(logging.INFO, logger="chatrun.turns")
    with ThreadServer(create_app([write_travel(tmp_path / "bot")], "memory://", log_content=True)) as server:
        new_session(server, "l2")
        fake.queue({"text": "See https://x.test/?token=abc123"})
        say(server, "l2", "open https://y.test/?token=zzz999&a=1")
    [record] = turn_lines(caplog)
    line = json.loads(JsonFormatter().format(record))
    assert line["event"] == "turn" and line["logger"] == "chatrun.turns" and line["level"] == "INFO"
    assert line["input"] == "open https://y.test/?token=***&a=1" and line["reply"] == "See https://x.test/?token=***"
    assert any(isinstance(f, RedactTokens) for f in logging.getLogger("chatrun.turns").filters)


@pytest.mark.subprocess
def test_serve_writes_json_turn_lines(fake, tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    proc = subprocess.Popen([sys.executable, "-m", "chatrun", "serve", str(write_travel(tmp_path / "bot")),
                             "--port", str(port), "--store", "memory://", "--log-format", "json"],
                            cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    access: list[str] = []  # uvicorn's access log goes to stdout
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    threading.Thread(target=lambda: access.extend(proc.stdout), daemon=True).start()
    try:
        base = f"http://127.0.0.1:{port}"
        _until(lambda: answers_health(base, proc.pid) or proc.poll() is not None, timeout=60)
        httpx.post(f"{base}/bots/travel/sessions", json={"id": "j1"}, timeout=30)
        fake.queue({"text": "Hi"})
        httpx.post(f"{base}/bots/travel/sessions/j1/messages", json={"userMessage": "hello"}, timeout=60)
        _until(lambda: any('"chatrun.turns"' in line for line in lines), timeout=30)
        _until(lambda: any("/messages" in line for line in access), timeout=30)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    turn = json.loads(next(line for line in lines if '"chatrun.turns"' in line))
    assert turn["outcome"] == "ok" and turn["session"] == "j1" and turn["bot"] == "travel"
    assert "input" not in turn and "hello" not in json.dumps(turn)
    requests = [json.loads(line) for line in access]
    [message] = [r for r in requests if r["path"] == "/bots/travel/sessions/j1/messages"]
    assert message["event"] == "request" and message["method"] == "POST" and message["status"] == 200


# -- trace context -----------------------------------------------------------------------------

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def agent_spans(exporter, session_id: str) -> list:
    return [s for s in exporter.get_finished_spans()
            if s.name.startswith("invoke_agent") and s.attributes.get("session.id") == session_id]


def assert_continued(span, exporter) -> None:
    """The span is in the caller's trace, below the caller's span: its child, or (FastAPI's own
    telemetry, when a tracer provider is set) below FastAPI's HTTP/WebSocket server span (and
    its route's operation span), which is the caller's span's child."""
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    parent = span.parent
    assert parent is not None
    while not parent.is_remote:
        between = _finished(exporter, parent.span_id)
        assert between.instrumentation_scope.name == "fastapi", between.name
        parent = between.parent
    assert f"{parent.span_id:016x}" == PARENT_ID


def _finished(exporter, span_id: int):
    """A span, once it has ended (a server span ends just after its response was sent)."""
    deadline = time.monotonic() + 30
    while True:
        found = [s for s in exporter.get_finished_spans() if s.context.span_id == span_id]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"span {span_id:016x} never ended"
        time.sleep(0.05)


def test_an_http_turn_continues_the_callers_trace(travel_server, fake, spans):
    new_session(travel_server, "t1")
    fake.queue({"text": "Hi"})
    say(travel_server, "t1", "hi", traceparent=TRACEPARENT)
    [agent] = agent_spans(spans, "t1")
    assert_continued(agent, spans)
    fake.queue({"text": "Hi again"})
    say(travel_server, "t1", "hi")  # no traceparent: a trace of its own
    second = agent_spans(spans, "t1")[1]
    assert f"{second.context.trace_id:032x}" != TRACE_ID


def test_the_middleware_alone_continues_the_trace_when_no_server_span_does(spans):
    """Without FastAPI's own telemetry (older FastAPI, or turned off) the TraceContext middleware
    still makes spans started while serving a request children of the caller's span."""
    from opentelemetry import trace as otel_trace

    from chatrun.server.tracecontext import TraceContext

    seen = []

    async def app(scope, receive, send) -> None:
        with otel_trace.get_tracer("t").start_as_current_span("inside") as inside:
            seen.append(inside)

    headers = [(b"traceparent", TRACEPARENT.encode()), (b"host", b"x")]
    asyncio.run(TraceContext(app)({"type": "http", "headers": headers}, None, None))
    asyncio.run(TraceContext(app)({"type": "websocket", "headers": headers}, None, None))
    asyncio.run(TraceContext(app)({"type": "http", "headers": []}, None, None))
    continued, handshake, alone = seen
    for span in (continued, handshake):
        assert f"{span.context.trace_id:032x}" == TRACE_ID and f"{span.parent.span_id:016x}" == PARENT_ID
    assert alone.parent is None


def test_a_streamed_http_turn_continues_the_callers_trace(travel_server, fake, spans):
    new_session(travel_server, "t2")
    fake.queue({"chunks": ["H", "i"]})
    with httpx.stream("POST", f"{travel_server.url}/bots/travel/sessions/t2/messages?stream=true",
                      json={"userMessage": "hi"}, headers={"traceparent": TRACEPARENT}, timeout=60) as response:
        assert "Completed" in response.read().decode()
    [agent] = agent_spans(spans, "t2")
    assert_continued(agent, spans)


def test_each_websocket_turn_is_a_trace_of_its_own_linked_to_the_connection(travel_server, fake, spans):
    import websockets

    fake.queue({"text": "Hi"}, {"text": "Hi again"})

    async def talk() -> None:
        async with websockets.connect(f"{travel_server.ws_url}/_chat/routes",
                                      additional_headers={"traceparent": TRACEPARENT}) as ws:
            await ws.send(json.dumps({"type": "Connect", "chatId": "t3", "requestId": 1}))
            await _until_done(ws)
            for n, text in ((2, "hi"), (3, "again")):
                await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "t3", "requestId": n,
                                          "data": {"userMessage": text}}))
                await _until_done(ws)

    asyncio.run(talk())
    agents = agent_spans(spans, "t3")
    assert len(agents) == 2
    # Not every turn of the connection in one trace: each its own, linked to the connection's
    # span (the handshake's: the caller's trace, through FastAPI's WebSocket span when it has one).
    assert len({a.context.trace_id for a in agents}) == 2
    for agent in agents:
        assert agent.parent is None and f"{agent.context.trace_id:032x}" != TRACE_ID
        [link] = agent.links
        assert f"{link.context.trace_id:032x}" == TRACE_ID
        chats = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")
                 and s.parent is not None and s.parent.span_id == agent.context.span_id]
        assert len(chats) == 1 and chats[0].context.trace_id == agent.context.trace_id


async def _until_done(ws) -> None:
    while json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] not in ("Completed", "Failed"):
        pass


def test_openai_compatible_requests_continue_the_callers_trace(travel_server, fake, spans):
    fake.queue({"text": "Hi"})
    response = httpx.post(f"{travel_server.url}/v1/chat/completions", headers={"traceparent": TRACEPARENT},
                          json={"model": "travel", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    assert response.status_code == 200, response.text
    [agent] = [s for s in spans.get_finished_spans() if s.name == "invoke_agent travel"]
    assert_continued(agent, spans)


MCP_SERVER = '''
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("traced")


@server.tool()
def whoami(ctx: Context) -> dict:
    """The request's _meta, as received."""
    meta = ctx.request_context.meta or {}
    return {"traceparent": meta.get("traceparent")}


server.run("stdio")
'''


@pytest.mark.subprocess  # a stdio MCP server
def test_an_mcp_tool_call_carries_the_execute_tool_trace_context(spans, write_bot, tmp_path):
    pytest.importorskip("mcp")
    (tmp_path / "traced_server.py").write_text(textwrap.dedent(MCP_SERVER))
    bot = chatrun.load_bot(write_bot(f"""
        name: traced
        model: {{provider: scripted, name: m}}
        mcp_servers:
          traced: {{command: [python, {tmp_path / 'traced_server.py'}]}}
        routes:
          main: {{default: true, system: Hi., mcp: [traced]}}
        """))

    async def talk() -> chatrun.Session:
        session = bot.session(model=chatrun.ScriptedModel([{"tool_calls": [{"name": "whoami", "arguments": {}}]},
                                                           {"text": "ok"}]))
        await session.achat("who am I?")
        await bot.tools.aclose()
        return session

    session = asyncio.run(talk())
    [result] = [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]
    traceparent = json.loads(result)["traceparent"]
    _, trace_id, parent_id, _ = traceparent.split("-")
    finished = {f"{s.context.span_id:016x}": s for s in spans.get_finished_spans()}
    [tool_span] = [s for s in finished.values() if s.name == "execute_tool whoami"]
    assert trace_id == f"{tool_span.context.trace_id:032x}"
    # The SDK's own client span (`MCP send tools/call whoami`) sits between: its parent is execute_tool.
    sent = finished[parent_id]
    assert sent.name.startswith("MCP send tools/call") and sent.parent.span_id == tool_span.context.span_id


def test_a_message_to_an_ended_conversation_counts_as_refused(fake, write_bot):
    path = write_bot("""
        name: bye
        model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
        routes: {main: {default: true, system: Hi., tools: [goodbye]}}
        tools:
          goodbye: {description: End the conversation, action: {end: true}}
        """)
    with ThreadServer(create_app([path], "memory://")) as server:
        assert httpx.post(f"{server.url}/bots/bye/sessions", json={"id": "e1"}, timeout=30).status_code == 201
        fake.queue(call("goodbye"))
        url = f"{server.url}/bots/bye/sessions/e1/messages"
        assert httpx.post(url, json={"userMessage": "bye"}, timeout=60).json()["ok"] is True
        refused = httpx.post(url, json={"userMessage": "still there?"}, timeout=60)
        assert refused.status_code >= 400
        after = metrics(server)
    assert value(after, "chatrun_turns_total", bot="bye", outcome="ok") == 1
    assert value(after, "chatrun_turns_total", bot="bye", outcome="refused") == 1
    assert value(after, "chatrun_tool_calls_total", bot="bye", tool="goodbye") == 1
    assert value(after, "chatrun_tool_failures_total", bot="bye") == 0


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_metrics_have_the_process_collectors_no_created_series_and_no_access_log_line(fake, tmp_path):
    from chatrun.server.listen import ListenOptions

    app = create_app([write_travel(tmp_path / "bot")], "memory://")
    access, seen = logging.getLogger("uvicorn.access"), _Lines()  # uvicorn's access log does not propagate
    with ThreadServer(app, listen=ListenOptions(), log_level="info") as server:  # as `chatrun serve` runs
        new_session(server, "p1")
        fake.queue({"text": "Hi"})
        say(server, "p1", "hi")
        access.addHandler(seen)
        try:
            samples = metrics(server)
            assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        finally:
            access.removeHandler(seen)
    logged = seen.lines
    names = {name for name, _labels in samples}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info",
            "python_gc_collections_total"} <= names
    assert value(samples, "chatrun_turns_total", outcome="ok") == 1
    assert not [name for name in names if name.endswith("_created")]
    assert any("/health" in line for line in logged)  # the access log is on...
    assert not any("/metrics" in line for line in logged)  # ...but a scrape writes no line
