"""A key for every tool call (issue 32, item 2): a handler reads `ctx.idempotency_key`; an `http:`
or `openapi:` tool sends it as `Idempotency-Key` (by default on every method but GET; renamed or
off per tool). The key is the same when the same call runs again — its turn failed and is run
again, a decision is retried — and another for any other call. Against a real HTTP API on
loopback; the kill -9 across two replicas is tests/test_idempotency_replicas.py."""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import chatrun
from chatrun import Approve
from chatrun.definition.loader import check_bot
from chatrun.models.scripted import ScriptedModel
from chatrun.transcripts.run import run_transcript
from orders_api import LoopbackApi

REPO = Path(__file__).resolve().parents[1]
KEY = re.compile(r"^[0-9a-f]{32}$")

PAY_BOT = """
name: pay
model: {provider: scripted, name: gpt-4o-mini}
routes:
  main: {default: true, system: Pay., tools: [pay, refund]}
tools:
  pay:
    parameters: {type: object, properties: {amount: {type: integer}}, required: [amount]}
    handler: payments:pay
  refund:
    parameters: {type: object, properties: {amount: {type: integer}}, required: [amount]}
    handler: payments:pay
    approval: {by: [supervisor]}
"""
PAYMENTS = """
def pay(ctx):
    ctx.emit("Key", ctx.idempotency_key)
    return "paid"
"""
BOB = {"name": "bob", "roles": ["supervisor"]}


def pay(amount: int) -> dict:
    return {"tool_calls": [{"name": "pay", "arguments": {"amount": amount}}]}


def keys(events: list[chatrun.Event]) -> list[str]:
    return [e.data for e in events if e.type == "Key"]


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(PAY_BOT, extra={"payments.py": PAYMENTS}))


def test_a_handler_gets_the_same_key_when_its_failed_turn_runs_again(bot):
    model = ScriptedModel([pay(10), {"error": "the model is down"}])
    session = bot.session(model=model, session_id="s1")
    failed = session.chat("pay 10")
    assert [e.type for e in failed][-1] == "Error" and session.turn_count == 0  # rolled back
    model.add(pay(10), "Paid.")
    again = session.chat("pay 10")
    assert session.turn_count == 1
    assert keys(again) == keys(failed) and KEY.match(keys(failed)[0])
    model.add(pay(10), "Paid.")  # the next turn's call is another call, even with the same arguments
    assert keys(session.chat("pay 10 more")) != keys(again)


def test_each_call_of_a_turn_has_its_own_key_and_each_session_its_own(bot):
    def two_calls(session_id: str) -> list[str]:
        model = ScriptedModel([{"tool_calls": [{"name": "pay", "arguments": {"amount": 10}},
                                               {"name": "pay", "arguments": {"amount": 10}},
                                               {"name": "pay", "arguments": {"amount": 20}}]}, "Paid."])
        return keys(bot.session(model=model, session_id=session_id).chat("pay"))

    first = two_calls("s1")
    assert len(set(first)) == 3  # the same call twice in one answer: two calls, two keys
    assert set(two_calls("s2")).isdisjoint(first)  # another session
    assert set(two_calls("s1")).isdisjoint(first)  # s1's next turn


def test_an_approved_call_gets_the_same_key_when_its_decision_is_retried(bot):
    model = ScriptedModel([{"tool_calls": [{"name": "refund", "arguments": {"amount": 80}}]}])
    session = bot.session(model=model, session_id="s1", principal={"name": "ana", "roles": []})
    session.chat("refund 80")
    [item] = session.pending
    session.principal, session.roles = BOB, {"supervisor"}
    model.add({"error": "the model is down"})  # after the tool ran: the decision's turn rolls back
    failed = session.chat(Approve(item.id))
    assert [e.type for e in failed][-1] == "Error" and [i.id for i in session.pending] == [item.id]
    model.add("Refunded.")
    retried = session.chat(Approve(item.id))
    assert session.pending == []
    assert keys(retried) == keys(failed) and KEY.match(keys(failed)[0])


class EchoApi(LoopbackApi):
    """Records each request's method, path and headers; answers 503 to the first POST of /flaky."""

    def __init__(self) -> None:
        super().__init__()
        self.flaky_left = 1
        handler = self.server.RequestHandlerClass
        handler.do_PUT = handler.do_DELETE = handler.do_POST  # type: ignore[attr-defined]

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        h.rfile.read(int(h.headers.get("content-length") or 0))
        path = urlsplit(h.path).path
        self.requests.append({"method": h.command, "path": path, "headers": {k.lower(): v for k, v in h.headers.items()}})
        if path == "/flaky" and self.flaky_left:
            self.flaky_left -= 1
            self.reply(h, 503, {"error": "busy"})
        else:
            self.reply(h, 200, {"ok": True})


@pytest.fixture
def api(monkeypatch):
    with EchoApi() as server:
        monkeypatch.setenv("API_URL", server.url)
        yield server


HTTP_BOT = """
name: api
model: {provider: scripted, name: gpt-4o-mini}
env:
  API_URL: {}
routes:
  main: {default: true, system: Call., tools: [create, read, read_keyed, quiet, renamed, flaky, own]}
tools:
  create:
    http: {method: POST, url: "{{ env.API_URL }}/create", json: {a: 1}}
  read:
    http: {url: "{{ env.API_URL }}/read"}
  read_keyed:
    http: {url: "{{ env.API_URL }}/read", idempotency_key: true}
  quiet:
    http: {method: DELETE, url: "{{ env.API_URL }}/quiet", idempotency_key: false}
  renamed:
    http: {method: PUT, url: "{{ env.API_URL }}/renamed", idempotency_key: {header: X-Request-Id}}
  flaky:
    http: {method: POST, url: "{{ env.API_URL }}/flaky"}
  own:
    http: {method: POST, url: "{{ env.API_URL }}/own", headers: {Idempotency-Key: "mine-{{ session_id }}"}}
"""


def call_each(write_bot, *names: str) -> None:
    """The model calls each tool once, in one answer (the API records what it received)."""
    model = ScriptedModel([{"tool_calls": [{"name": n, "arguments": {}} for n in names]}, "Done."])
    session = chatrun.load_bot(write_bot(HTTP_BOT)).session(model=model, session_id="s1")
    events = session.chat("go")
    assert not [e for e in events if e.type == "Error"], events


def test_http_tools_send_the_key_by_default_on_every_method_but_get(api, write_bot):
    call_each(write_bot, "create", "read", "read_keyed", "quiet", "renamed")
    create, read, read_keyed, quiet, renamed = [r["headers"] for r in api.requests]
    assert KEY.match(create["idempotency-key"])
    assert "idempotency-key" not in read  # a read needs none ...
    assert KEY.match(read_keyed["idempotency-key"])  # ... unless the tool asks for it (`true`)
    assert "idempotency-key" not in quiet  # `idempotency_key: false`
    assert "idempotency-key" not in renamed and KEY.match(renamed["x-request-id"])
    assert len({create["idempotency-key"], read_keyed["idempotency-key"], renamed["x-request-id"]}) == 3


def test_a_retried_attempt_sends_the_same_key_and_the_authors_own_header_wins(api, write_bot):
    call_each(write_bot, "flaky", "own")
    flaky = [r["headers"] for r in api.requests if r["path"] == "/flaky"]
    assert len(flaky) == 2 and flaky[0]["idempotency-key"] == flaky[1]["idempotency-key"]  # 503, then 200
    assert [r["headers"]["idempotency-key"] for r in api.requests if r["path"] == "/own"] == ["mine-s1"]


def test_validate_warns_when_a_header_of_the_tool_takes_the_keys_place(write_bot):
    path = write_bot(HTTP_BOT)
    _, diagnostics = check_bot(path)
    [warning] = [d for d in diagnostics if "idempotency" in d.message]
    assert warning.severity == "warning" and "`http.headers.Idempotency-Key` of tool `own`" in warning.message
    assert "idempotency_key: false" in warning.message
    assert path.read_text().splitlines()[warning.line - 1].strip().startswith("http: {method: POST, url: \"{{ env.API_URL }}/own\"")


def test_a_wrong_idempotency_key_setting_is_an_error_at_its_line(write_bot):
    text = HTTP_BOT.replace("idempotency_key: {header: X-Request-Id}", "idempotency_key: {name: X-Request-Id}")
    path = write_bot(text)
    _, diagnostics = check_bot(path)
    errors = [d for d in diagnostics if d.severity == "error"]
    assert errors and "idempotency_key" in errors[0].path, errors
    assert "idempotency_key: {name: X-Request-Id}" in path.read_text().splitlines()[errors[0].line - 1]


def test_an_openapi_operation_that_changes_something_sends_the_key_and_can_turn_it_off(write_bot, api):
    spec = {"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "servers": [{"url": api.url}],
            "paths": {"/things": {"post": {"operationId": "addThing", "responses": {"201": {"description": "ok"}}},
                                  "get": {"operationId": "listThings", "responses": {"200": {"description": "ok"}}}}}}
    bot = """
name: things
model: {provider: scripted, name: gpt-4o-mini}
routes:
  main: {default: true, system: Things., tools: [add, add_quiet, list]}
tools:
  add: {openapi: {spec: api.json, operation: addThing}}
  add_quiet: {openapi: {spec: api.json, operation: addThing, idempotency_key: false}}
  list: {openapi: {spec: api.json, operation: listThings}}
"""
    path = write_bot(bot, extra={"api.json": json.dumps(spec)})
    model = ScriptedModel([{"tool_calls": [{"name": n, "arguments": {}} for n in ("add", "add_quiet", "list")]},
                           "Done."])
    chatrun.load_bot(path).session(model=model).chat("go")
    assert [(r["method"], "idempotency-key" in r["headers"]) for r in api.requests] == [
        ("POST", True), ("POST", False), ("GET", False)]


CANCEL = """
turns:
  - user: Cancel C3003, it is too slow.
    model:
      - tool_calls: [{{name: cancel_order, arguments: {{orderId: C3003, notify: true, body: {{reason: too slow}}}}}}]
  - user: "yes"   # cancel_order's `confirm:`: the request goes out on the customer's own yes
    model:
      - text: Cancelled.
    mocks:
      - tool: cancel_order
        request: {{headers: {{Idempotency-Key: {key}}}}}
        result: {{status: 200, ok: true, json: {{id: C3003, status: cancelled}}}}
    expect:
      events: [{{Resolved: {{id: p1, kind: approval, outcome: approved, by: null, args: {{orderId: C3003, notify: true, body: {{reason: too slow}}}}}}}}, {{Message: Cancelled.}}]
"""


def test_a_transcript_mock_checks_the_key_and_a_replay_sends_the_same_one(tmp_path):
    def run(key: str) -> chatrun.transcripts.run.TranscriptResult:
        path = tmp_path / "t.yaml"
        path.write_text(f"bot: {REPO / 'bots' / 'orders'}\n" + CANCEL.format(key=key))
        return run_transcript(str(path))

    assert run('{regex: "^[0-9a-f]{32}$"}').passed
    wrong = run("not-the-key")
    assert not wrong.passed
    sent = re.search(r'header Idempotency-Key: expected "not-the-key", it would send "([0-9a-f]{32})"',
                     wrong.report())
    assert sent is not None, wrong.report()
    assert run(sent.group(1)).passed  # every run of a transcript (session `transcript`) sends the same key
    assert not run("null").passed  # `null`: the request must not carry it
