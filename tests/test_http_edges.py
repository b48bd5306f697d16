"""The HTTP tool's edges (issue 24), against a real API on loopback, asserting what it received:
a header whose template gives nothing is left out; an empty secret is an error at load (or a
refusal naming it at run time, nothing sent); a body path that names nothing is an error."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest

import chatrun
from chatrun.definition.loader import check_bot
from chatrun.messages import ToolResultMessage
from orders_api import LoopbackApi

BOT = """
name: edges
model: {provider: scripted, name: gpt-4o-mini}
env:
  API_URL: {}
  API_TOKEN: {secret: true}
  API_TENANT: {default: ""}
state: {tenant: null, trace: null}
routes:
  main:
    default: true
    system: You call the API.
    tools: [fetch, create]
tools:
  fetch:
    description: Fetch
    http:
      url: "{{ env.API_URL }}/things"
      query: {tenant: "{{ state.tenant }}", trace: "{{ state.trace or '' }}"}
      headers:
        Authorization: "Bearer {{ env.API_TOKEN }}"
        X-Tenant: "{{ state.tenant }}"
        X-Trace: "{{ state.trace or '' }}"
        X-Kind: "{{ 'fetch' }}"
  create:
    description: Create
    parameters: {type: object, properties: {name: {type: string}}}
    http:
      method: POST
      url: "{{ env.API_URL }}/things"
      headers: {Authorization: "Bearer {{ env.API_TOKEN }}"}
      json: {name: "{{ args.name }}", tenant: "{{ state.tenant }}"}
"""


class EchoApi(LoopbackApi):
    def handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length") or 0)
        body = h.rfile.read(length).decode() if length else ""
        self.requests.append({"method": h.command, "path": h.path, "headers": dict(h.headers), "body": body})
        self.reply(h, 200, {"ok": True})


@pytest.fixture
def api(monkeypatch):
    with EchoApi() as server:
        monkeypatch.setenv("API_URL", server.url)
        monkeypatch.setenv("API_TOKEN", "t0ken")
        yield server


def call_tool(write_bot, tool: str, state: dict | None = None, **arguments: object) -> tuple[list[str], chatrun.Session]:
    model = chatrun.ScriptedModel([{"tool_calls": [{"name": tool, "arguments": arguments}]}, {"text": "ok"}])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model, state=state)
    events = list(session.chat("go"))
    assert events[-1].type != "Error", events[-1].meta
    return [m.content for m in session.memory() if isinstance(m, ToolResultMessage)], session


def test_a_header_whose_template_gives_nothing_is_left_out(api, write_bot):
    call_tool(write_bot, "fetch")
    headers = {k.lower(): v for k, v in api.requests[0]["headers"].items()}
    assert headers["authorization"] == "Bearer t0ken" and headers["x-kind"] == "fetch"
    assert "x-tenant" not in headers  # none: not the text "None"
    assert "x-trace" not in headers  # empty: not an empty header
    assert api.requests[0]["path"] == "/things?trace="  # a query parameter of none is left out, an empty one sent


def test_a_header_with_a_value_is_sent(api, write_bot):
    call_tool(write_bot, "fetch", state={"tenant": "acme", "trace": "abc"})
    headers = {k.lower(): v for k, v in api.requests[0]["headers"].items()}
    assert (headers["x-tenant"], headers["x-trace"]) == ("acme", "abc")
    assert api.requests[0]["path"] == "/things?tenant=acme&trace=abc"


def test_an_empty_secret_is_an_error_at_load_naming_it(api, write_bot, monkeypatch):
    monkeypatch.setenv("API_TOKEN", "")
    path = write_bot(BOT)
    with pytest.raises(chatrun.BotError) as caught:
        chatrun.load_bot(path)
    found = [(d.line, d.message) for d in caught.value.diagnostics]
    assert (21, "`http.headers.Authorization` of tool `fetch` reads `env.API_TOKEN`, which is set but empty; a "
                "secret cannot be empty (the request would go out without it); set it to its value") in found
    assert any(line == 31 and "`env.API_TOKEN`" in message for line, message in found)


def test_a_header_variable_whose_default_is_empty_is_an_error_at_load(api, write_bot):
    bot = BOT.replace('X-Kind: "{{ \'fetch\' }}"', 'X-Kind: "{{ env.API_TENANT }}"')
    _config, found = check_bot(write_bot(bot))
    assert [(d.line, d.severity, d.message) for d in found] == [
        (24, "error", "`http.headers.X-Kind` of tool `fetch` reads `env.API_TENANT`, which is given "
                      "`default: \"\"` but empty; a header's value cannot be empty (the request would go out without "
                      "it); set it to its value")]


def test_a_secret_emptied_after_load_is_refused_naming_it_and_nothing_is_sent(api, write_bot, monkeypatch):
    bot = chatrun.load_bot(write_bot(BOT))
    monkeypatch.setenv("API_TOKEN", "")
    model = chatrun.ScriptedModel([{"tool_calls": [{"name": "fetch", "arguments": {}}]}, {"text": "ok"}])
    session = bot.session(model=model)
    list(session.chat("go"))
    results = [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]
    assert results == ["Error: fetch was not sent: the environment variable API_TOKEN is empty (a secret cannot be "
                       "empty (the request would go out without it); set it to its value). Tell the user it did "
                       "not work this time."]
    assert api.requests == []
    assert "LocalProtocolError" not in results[0]


def test_a_body_path_that_names_nothing_is_an_error(write_bot, monkeypatch):
    monkeypatch.setenv("API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("API_TOKEN", "t")
    bot = BOT.replace('json: {name: "{{ args.name }}", tenant: "{{ state.tenant }}"}',
                      'json: {name: "{{ args.nmae }}", tenant: "{{ state.tennant }}"}')
    _config, found = check_bot(write_bot(bot))
    assert [(d.line, d.severity, d.message) for d in found] == [
        (32, "error", "`http.json.name` of tool `create` reads `args.nmae`, but the tool's `parameters` declare no "
                      "property `nmae`; did you mean `name`?"),
        (32, "error", "`http.json.tenant` of tool `create` reads `state.tennant`, but `state.tennant` is not declared "
                      "in the top-level `state:`; did you mean `tenant`?"),
    ]
    # outside a body (the URL, a header) it stays a warning
    _config, found = check_bot(write_bot(BOT.replace('X-Tenant: "{{ state.tenant }}"', 'X-Tenant: "{{ state.tennant }}"')))
    assert [d.severity for d in found] == ["warning"]


def test_a_body_is_sent_as_rendered(api, write_bot):
    call_tool(write_bot, "create", state={"tenant": "acme"}, name="kettle")
    assert json.loads(api.requests[0]["body"]) == {"name": "kettle", "tenant": "acme"}


def test_an_empty_secret_in_an_openapi_tools_headers_is_reported_where_it_is_written(monkeypatch):
    from pathlib import Path

    monkeypatch.setenv("ORDERS_API_TOKEN", "")
    orders = Path(__file__).resolve().parents[1] / "bots" / "orders"
    _config, found = check_bot(orders)
    errors = [(Path(d.file).name, d.line, d.message) for d in found if d.severity == "error"]
    assert ("bot.yaml", 57, "`openapi.headers.Authorization` of tool `cancel_order` reads `env.ORDERS_API_TOKEN`, "
                            "which is set but empty; a secret cannot be empty (the request would go out without it); "
                            "set it to its value") in errors
    assert any("`http.headers.Authorization` of tool `get_order`" in message for _, _, message in errors)
