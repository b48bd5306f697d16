"""Declarative HTTP tools against a real HTTP server on loopback, and handlers that never block:
requests as the API sees them, results as the action sees them, retries, failures told to the
model, secrets redacted, the environment allow-list checked at load and at run time."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

import chatrun
from chatrun.messages import ToolResultMessage
from orders_api import LoopbackApi

TOKEN = "s3cret-token-value"


class OrdersApi(LoopbackApi):
    """A small orders API: GET /orders/{id}, POST /orders, /flaky (503 twice, then 200),
    /slow (answers after a second), /echo-token (echoes the Authorization header)."""

    def __init__(self) -> None:
        super().__init__()
        self.flaky_left = 2

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        length = int(h.headers.get("content-length") or 0)
        body = h.rfile.read(length).decode() if length else ""
        self.requests.append({"method": h.command, "path": parts.path, "query": parse_qs(parts.query),
                              "headers": dict(h.headers), "body": body})
        if parts.path == "/orders/A1":
            self.reply(h, 200, {"id": "A1", "status": "shipped", "eta": "2026-12-01"})
        elif parts.path.startswith("/orders/"):
            self.reply(h, 404, {"error": "no such order"})
        elif parts.path == "/orders" and h.command == "POST":
            self.reply(h, 201, {"created": json.loads(body)})
        elif parts.path == "/flaky":
            if self.flaky_left:
                self.flaky_left -= 1
                self.reply(h, 503, {"error": "busy"})
            else:
                self.reply(h, 200, {"ok": "finally"})
        elif parts.path == "/slow":
            time.sleep(1.0)
            self.reply(h, 200, {"late": True})
        elif parts.path == "/echo-token":
            self.reply(h, 200, {"you_sent": h.headers.get("authorization")})
        elif parts.path == "/echo-basic":  # an API that says which credentials it took the token for
            token = (h.headers.get("authorization") or "").removeprefix("Bearer ")
            basic = base64.b64encode(f"svc:{token}".encode()).decode()
            self.reply(h, 401, {"error": f"refused Authorization: Basic {basic}",
                                "urlsafe": base64.urlsafe_b64encode(f"x{token}?>".encode()).decode()})
        else:
            self.reply(h, 500, {"error": "boom"})



@pytest.fixture
def api(monkeypatch):
    with OrdersApi() as server:
        monkeypatch.setenv("ORDERS_API_URL", server.url)
        monkeypatch.setenv("ORDERS_API_TOKEN", TOKEN)
        yield server


BOT = """
name: orders
model: {provider: scripted, name: gpt-4o-mini}
env:
  ORDERS_API_URL: {description: Where the orders API lives}
  ORDERS_API_TOKEN: {secret: true}
state: {last_status: null}
routes:
  main:
    default: true
    system: You track orders.
    tools: [order_status, create_order, flaky, slow, echo_token, broken]
tools:
  order_status:
    description: Look an order up
    parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id]}
    http:
      url: "{{ env.ORDERS_API_URL }}/orders/{{ args.order_id | urlsegment }}"
      headers: {Authorization: "Bearer {{ env.ORDERS_API_TOKEN }}"}
      query: {verbose: "yes", user: "{{ state.last_status or 'none' }}"}
      accept: [404]
    action:
      set: {state.last_status: "{{ result.json.status if result.ok else none }}"}
      reply: "{{ result.json.status if result.ok else 'There is no order ' ~ args.order_id }}"
  create_order:
    description: Create an order
    parameters: {type: object, properties: {item: {type: string}, qty: {type: integer}}}
    http:
      method: POST
      url: "{{ env.ORDERS_API_URL }}/orders"
      json: {item: "{{ args.item }}", qty: "{{ args.qty }}", note: "from {{ route }}"}
  flaky:
    description: Flaky endpoint
    http: {url: "{{ env.ORDERS_API_URL }}/flaky", retries: 3}
  slow:
    description: Slow endpoint
    timeout: 0.3
    http: {url: "{{ env.ORDERS_API_URL }}/slow", retries: 0}
  echo_token:
    description: Echo the token
    http:
      url: "{{ env.ORDERS_API_URL }}/echo-token"
      headers: {Authorization: "Bearer {{ env.ORDERS_API_TOKEN }}"}
  broken:
    description: Always fails
    http: {url: "{{ env.ORDERS_API_URL }}/broken", retries: 1}
"""


def call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def run(write_bot, calls: list[dict]) -> tuple[chatrun.Session, list[chatrun.Event], chatrun.ScriptedModel]:
    model = chatrun.ScriptedModel([*calls, {"text": "ok"}])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model)
    events = [e for e in session.chat("go") if e.type != "Stream"]
    return session, events, model


def tool_results(session: chatrun.Session) -> list[str]:
    return [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]


def test_a_get_reaches_the_api_rendered_and_its_json_is_the_result(api, write_bot):
    session, events, _ = run(write_bot, [call("order_status", order_id="A1")])
    assert tool_results(session) == ["shipped"]
    assert session.state["last_status"] == "shipped"
    sent = api.requests[0]
    assert (sent["method"], sent["path"]) == ("GET", "/orders/A1")
    assert sent["query"] == {"verbose": ["yes"], "user": ["none"]}
    assert sent["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert [e.type for e in events] == ["Message"]


def test_arguments_are_escaped_in_the_path_and_an_accepted_404_is_a_result(api, write_bot):
    session, _, _ = run(write_bot, [call("order_status", order_id="../x y")])
    assert api.requests[0]["path"] == "/orders/..%2Fx%20y"
    assert tool_results(session) == ["There is no order ../x y"]
    assert session.state["last_status"] is None


SEGMENT_BOT = """
name: segments
model: {provider: scripted, name: gpt-4o-mini}
env:
  ORDERS_API_URL: {description: Where the orders API lives}
routes:
  main: {default: true, system: You track orders., tools: [order_items]}
tools:
  order_items:
    description: The items of an order
    parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id]}
    http:
      url: "{{ env.ORDERS_API_URL }}/orders/{{ args.order_id | urlsegment }}/items"
      accept: [404]
      retries: 0
"""


def run_segment_bot(write_bot, order_id: str) -> chatrun.Session:
    model = chatrun.ScriptedModel([call("order_items", order_id=order_id), {"text": "ok"}])
    session = chatrun.load_bot(write_bot(SEGMENT_BOT)).session(model=model)
    list(session.chat("go"))
    return session


# `..` and `.` alone are dot segments: httpx (and servers) remove them with the segment before,
# so `/orders/../items` was sent as `/items` (issue 33, finding 5).
@pytest.mark.parametrize("value", ["..", ".", "...", "../admin", "..%2F", "%2E%2E", "a/../b", "..\\admin", "?x#y",
                                   " .. ", "é/.."])
def test_a_urlsegment_value_is_exactly_one_segment_of_the_path_the_api_receives(api, write_bot, value):
    run_segment_bot(write_bot, value)
    [sent] = api.requests
    parts = sent["path"].split("/")
    assert parts[:2] == ["", "orders"] and parts[3:] == ["items"], sent["path"]
    assert unquote(parts[2]) == value  # the API decodes the one segment back to the value


def test_an_empty_urlsegment_value_is_refused_to_the_model_and_nothing_is_sent(api, write_bot):
    session = run_segment_bot(write_bot, "")
    assert api.requests == []  # not `/orders//items`, which is another address
    [reply] = tool_results(session)
    assert reply == ("Error: order_items was not sent: `order_id` went into its URL path empty (an empty path "
                     "segment would send the request to another address). Call order_items again with a value "
                     "for `order_id`, or ask the user for it.")
    assert session.history[-1]["ok"]  # a refusal the model reads, not a failed turn


def test_urlsegment_outside_a_tool_fails_the_template_on_an_empty_value_and_encodes_dot_segments():
    from chatrun.definition.templates import EmptySegment, render

    assert render("{{ a | urlsegment }}/{{ b | urlsegment }}/{{ c | urlsegment }}",
                  {"a": "..", "b": ".", "c": "a b/.."}) == "%2E%2E/%2E/a%20b%2F.."
    with pytest.raises(EmptySegment):
        render("/orders/{{ a | urlsegment }}", {"a": ""})


def test_the_validator_warns_of_any_argument_reaching_the_path_unescaped(write_bot):
    from chatrun.definition.loader import check_bot

    path = write_bot("""
        name: w
        routes:
          main: {default: true, system: Hi., tools: [t]}
        tools:
          t:
            description: t
            parameters: {type: object, properties: {p: {type: string}}}
            http: {url: "http://127.0.0.1/{{ args['p'] }}/{{ state.args }}"}
    """)
    _config, diagnostics = check_bot(path)
    warned = [d.message for d in diagnostics if "into the URL path unescaped" in d.message]
    assert warned == ["`http.url` of tool `t` puts `{{ args['p'] }}` into the URL path unescaped; use "
                      "`| urlsegment` so a value like `..` or `../admin` stays one path segment"]


def test_a_json_body_keeps_its_types(api, write_bot):
    session, _, _ = run(write_bot, [call("create_order", item="tea", qty=3)])
    assert json.loads(api.requests[0]["body"]) == {"item": "tea", "qty": 3, "note": "from main"}
    result = json.loads(tool_results(session)[0])  # no reply template: the result as JSON
    assert result["status"] == 201 and result["json"] == {"created": {"item": "tea", "qty": 3, "note": "from main"}}


def test_503_is_retried_until_it_succeeds(api, write_bot):
    session, _, _ = run(write_bot, [call("flaky")])
    assert len(api.requests) == 3
    assert json.loads(tool_results(session)[0])["json"] == {"ok": "finally"}


def test_a_failure_is_a_short_reason_for_the_model_and_the_turn_goes_on(api, write_bot):
    session, events, _ = run(write_bot, [call("broken")])
    assert len(api.requests) == 2  # one retry of the 500
    [reply] = tool_results(session)
    assert reply.startswith("Error: broken failed: HTTP 500")
    assert "after 2 attempts" in reply and "/broken" in reply
    assert [e.type for e in events] == ["Message"] and session.history[-1]["ok"]


def test_a_timeout_is_a_failure_the_model_reads(api, write_bot):
    session, _, _ = run(write_bot, [call("slow")])
    [reply] = tool_results(session)
    assert reply.startswith("Error: slow failed: no answer within 0.3 s")


def test_secrets_are_redacted_from_results(api, write_bot):
    session, _, _ = run(write_bot, [call("echo_token")])
    [reply] = tool_results(session)
    assert TOKEN not in reply and "Bearer [redacted]" in reply
    assert TOKEN not in json.dumps(session.history) and TOKEN not in str(session.memories())


def test_a_secret_the_api_echoes_base64_encoded_is_redacted_from_the_result(api, write_bot):
    """An API that answers with the token inside a Basic credential (`svc:TOKEN`, base64) or
    encoded URL-safe: the result, the memory and the history kept it, since only the token as
    written and URL-escaped was redacted."""
    bot = BOT.replace("tools: [order_status,", "tools: [echo_basic, order_status,") + """
  echo_basic:
    description: Who am I
    http:
      url: "{{ env.ORDERS_API_URL }}/echo-basic"
      headers: {Authorization: "Bearer {{ env.ORDERS_API_TOKEN }}"}
      accept: [401]
"""
    model = chatrun.ScriptedModel([call("echo_basic"), {"text": "ok"}])
    session = chatrun.load_bot(write_bot(bot)).session(model=model)
    session.chat("go")
    [reply] = tool_results(session)
    assert "refused Authorization: Basic [redacted]" in reply and '"urlsafe": "[redacted]"' in reply
    kept = reply + json.dumps(session.history) + str(session.memories())
    for encoded in (base64.b64encode(f"svc:{TOKEN}".encode()).decode(), base64.urlsafe_b64encode(f"x{TOKEN}?>".encode())
                    .decode()):
        assert encoded[8:20] not in kept


def test_an_unset_variable_fails_the_turn_naming_it(api, write_bot, monkeypatch):
    monkeypatch.delenv("ORDERS_API_URL")
    session, events, _ = run(write_bot, [call("flaky")])
    assert events[-1].type == "Error"
    assert "environment variable ORDERS_API_URL is not set" in events[-1].meta["detail"]  # the author's detail
    assert session.turn_count == 0  # rolled back


def test_validation_of_env(write_bot, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    path = write_bot("""
        name: e
        env: {NOT_SET_ANYWHERE: null, WITH_DEFAULT: {default: x}}
        routes:
          main: {default: true, system: "Hi {{ env.WITH_DEFAULT }}", tools: [t, u]}
        tools:
          t:
            description: t
            parameters: {type: object, properties: {p: {type: string}}}
            http: {url: "http://127.0.0.1/{{ env.UNDECLARED }}/{{ args.p }}"}
          u:
            description: u
            handler: nowhere:f
            http: {url: "http://127.0.0.1/", json: {a: 1}, form: {b: "2"}}
    """)
    from chatrun.definition.loader import check_bot

    _config, diagnostics = check_bot(path)
    messages = [(d.severity, d.message) for d in diagnostics]
    assert ("warning", "environment variable `NOT_SET_ANYWHERE` is declared under `env:` but not set "
            "(and has no `default`); a tool that reads it will fail its turn") in messages
    assert any(s == "error" and "`env` can only be read in a tool's `http:` section" in m for s, m in messages)
    assert any(s == "error" and "reads `env.UNDECLARED`, but the bot does not declare it" in m for s, m in messages)
    assert any(s == "error" and "tool `u` has `handler` and `http`; give one" in m for s, m in messages)
    assert any(s == "error" and "has both `json` and `form`" in m for s, m in messages)
    assert ("warning", "`http.url` of tool `t` puts `{{ args.p }}` into the URL path unescaped; use "
            "`| urlsegment` so a value like `..` or `../admin` stays one path segment") in messages


# -- handlers ------------------------------------------------------------------------


HANDLERS = """
import time

def slow(ctx):
    ctx.emit("Thinking", "working in a thread")
    time.sleep(float(ctx.args.get("seconds", 1)))
    ctx.state["done"] = True
    return "slept"

async def quick(ctx):
    return "quick"
"""

HANDLER_BOT = """
name: handlers
model: {provider: scripted, name: gpt-4o-mini}
state: {done: false}
routes:
  main: {default: true, system: Hi., tools: [slow, quick, too_slow]}
tools:
  slow:
    description: slow
    parameters: {type: object, properties: {seconds: {type: number}}}
    handler: handlers:slow
  too_slow:
    description: too slow
    timeout: 0.2
    parameters: {type: object, properties: {seconds: {type: number}}}
    handler: handlers:slow
  quick:
    description: quick
    handler: handlers:quick
"""


def test_a_sync_handler_runs_in_a_thread_and_its_events_arrive(write_bot):
    path = write_bot(HANDLER_BOT, extra={"handlers.py": HANDLERS})
    session = chatrun.load_bot(path).session(model=chatrun.ScriptedModel([call("slow", seconds=0.01), {"text": "ok"}]))
    events = [e for e in session.chat("go") if e.type != "Stream"]
    assert [(e.type, e.data) for e in events] == [("Thinking", "working in a thread"), ("Message", "ok")]
    assert session.state["done"] is True


def test_a_handler_past_its_timeout_fails_the_turn_and_changes_nothing(write_bot):
    path = write_bot(HANDLER_BOT, extra={"handlers.py": HANDLERS})
    session = chatrun.load_bot(path).session(model=chatrun.ScriptedModel([call("too_slow", seconds=1.0)]))
    events = session.chat("go")
    assert events[-1].type == "Error" and "did not finish within 0.2 s" in events[-1].meta["detail"]
    time.sleep(1.0)  # the thread finishes in the background; its writes go nowhere
    assert session.state["done"] is False and session.turn_count == 0


def test_a_slow_sync_handler_does_not_hold_up_another_session(write_bot):
    """Two sessions on one event loop (as under `chatrun serve`): one handler sleeps 1.5 s in
    its thread while the other session's turn runs to the end."""
    bot = chatrun.load_bot(write_bot(HANDLER_BOT, extra={"handlers.py": HANDLERS}))

    async def both() -> tuple[float, float]:
        slow = bot.session(model=chatrun.ScriptedModel([call("slow", seconds=1.5), {"text": "done"}]))
        quick = bot.session(model=chatrun.ScriptedModel([call("quick"), {"text": "hi"}]))
        start = time.perf_counter()
        slow_turn = asyncio.create_task(slow.achat("go"))  # runs first: its handler starts sleeping
        await quick.achat("hi")
        quick_took = time.perf_counter() - start
        await slow_turn
        return quick_took, time.perf_counter() - start

    quick_took, total = asyncio.run(both())
    assert total >= 1.5
    assert quick_took < 0.75  # not 1.5 s: the loop was free while the sync handler slept


@pytest.mark.slow
def test_under_chatrun_serve_a_3_s_sync_handler_does_not_delay_another_session(fake, write_bot):
    """The figure the issue asks for, on a real server: one session's handler sleeps 3 s in
    its worker thread; another session's turn over HTTP meanwhile takes what it takes alone."""
    import httpx

    from chatrun.server import create_app
    from server_support import ThreadServer

    path = write_bot(HANDLER_BOT.replace("provider: scripted", "provider: openai"),
                     extra={"handlers.py": HANDLERS})
    fake.responder = lambda body: (call("slow", seconds=3) if "sleep" in str(body["messages"][-1]) and
                                   body["messages"][-1]["role"] == "user" else {"text": "ok"})
    app = create_app([chatrun.load_bot(path)], "memory://")
    with ThreadServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for sid in ("sleeper", "other"):
            assert http.post("/bots/handlers/sessions", json={"id": sid}).status_code == 201
        alone = []
        for _ in range(3):
            start = time.perf_counter()
            http.post("/bots/handlers/sessions/other/messages", json={"userMessage": "hi"})
            alone.append(time.perf_counter() - start)

        def sleeper() -> None:
            with httpx.Client(base_url=server.url, timeout=30) as other_http:
                other_http.post("/bots/handlers/sessions/sleeper/messages", json={"userMessage": "please sleep"})

        thread = threading.Thread(target=sleeper)
        thread.start()
        time.sleep(0.5)  # the handler is sleeping now
        start = time.perf_counter()
        reply = http.post("/bots/handlers/sessions/other/messages", json={"userMessage": "hi"})
        during = time.perf_counter() - start
        thread.join()
    assert reply.status_code == 200
    assert any("slept" in str(r["messages"]) for r in fake.requests)  # the sleeper's turn went on after
    # Not 2.5 s (what was left of the sleep): within a generous margin of the turn alone.
    assert during < min(alone) + 0.5, (during, alone)


# -- tools from an OpenAPI document ---------------------------------------------------------


OPENAPI_DOC = """
openapi: 3.0.3
info: {title: Pets, version: "1"}
servers: [{url: "http://127.0.0.1:9/api"}]
paths:
  /pets/{petId}:
    parameters:
      - {name: petId, in: path, required: true, schema: {type: integer}}
    get:
      operationId: getPet
      summary: Get a pet
      parameters:
        - {name: fields, in: query, schema: {type: string, nullable: true}}
        - {name: X-Trace, in: header, schema: {type: string}}
      responses: {"200": {description: ok}, "404": {description: gone}}
"""


def test_an_openapi_operation_becomes_a_tool(write_bot):
    from chatrun.definition.loader import load_config

    path = write_bot("""
        name: pets
        routes:
          main: {default: true, system: Pets., tools: [get_pet]}
        tools:
          get_pet:
            openapi: {spec: pets.yaml, operation: getPet}
        """, extra={"pets.yaml": OPENAPI_DOC})
    config, _ = load_config(path)
    tool = config.tools["get_pet"]
    assert tool.description == "Get a pet"
    assert tool.parameters == {"type": "object", "required": ["petId"], "properties": {
        "petId": {"type": "integer"}, "fields": {"type": ["string", "null"]}}}  # headers are not the model's
    assert tool.kinds["http"].method == "GET" and tool.kinds["http"].accept == [404]
    assert tool.kinds["http"].url == "http://127.0.0.1:9/api/pets/{{ args.petId | urlsegment }}"
    assert tool.kinds["http"].args_in_query == ["fields"]


def test_openapi_mistakes_are_diagnostics_at_the_tool(write_bot):
    from chatrun.definition.loader import check_bot

    path = write_bot("""
        name: pets
        routes:
          main: {default: true, system: Pets., tools: [a, b, c, d]}
        tools:
          a: {openapi: {spec: pets.yaml, operation: getPett}}
          b: {openapi: {spec: missing.yaml, operation: getPet}}
          c: {openapi: {spec: ../outside.yaml, operation: getPet}}
          d:
            openapi: {spec: pets.yaml, operation: getPet}
            parameters: {type: object}
        """, extra={"pets.yaml": OPENAPI_DOC})
    _config, diagnostics = check_bot(path)
    errors = {d.path.split(".")[1]: (d.line, d.message) for d in diagnostics if d.severity == "error"}
    assert errors["a"][1] == ("tool `a`: the OpenAPI document pets.yaml has no operation `getPett`; "
                              "did you mean `getPet`? (operationIds: getPet)")
    assert errors["b"][1].startswith("tool `b`: cannot read the OpenAPI document")
    assert "is outside the bot directory" in errors["c"][1]
    assert errors["d"][1] == ("tool `d` takes its HTTP call and parameters from its OpenAPI operation; "
                              "remove `parameters:` and `http:` (declared once)")
    assert errors["a"][0] == 6
