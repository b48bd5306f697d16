"""Bound arguments (`bind:` of a tool): filled in by the bot from the principal, the state and
the session, never offered to the model and never taken from it. Against a real HTTP API on
loopback (what is sent is what the API receives) and through the loader's diagnostics."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

import chatrun
from chatrun.messages import ToolResultMessage
from orders_api import LoopbackApi


class TicketsApi(LoopbackApi):
    """GET /tickets?reporter=EMAIL answers the reporter's tickets; every request is kept."""

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        query = parse_qs(parts.query)
        self.requests.append({"path": parts.path, "query": query})
        reporter = (query.get("reporter") or [""])[0]
        self.reply(h, 200, {"tickets": [{"id": f"T-{reporter}", "reporter": reporter}]})


@pytest.fixture
def api(monkeypatch):
    with TicketsApi() as server:
        monkeypatch.setenv("TICKETS_URL", server.url)
        yield server


BOT = """
name: desk
model: {provider: scripted, name: m}
env:
  TICKETS_URL: {description: The tickets API}
state: {team: null}
routes:
  main: {default: true, system: "Help {{ principal.name if principal else 'someone' }}.", tools: [my_tickets]}
tools:
  my_tickets:
    description: List the user's tickets
    parameters:
      type: object
      properties:
        reporter: {type: string, format: email}
        status: {type: string, enum: [open, closed]}
        team: {type: string}
      required: [reporter]
    bind:
      reporter: "{{ principal.email }}"
      team: "{{ state.team }}"
    http:
      url: "{{ env.TICKETS_URL }}/tickets"
      query: {reporter: "{{ args.reporter }}", status: "{{ args.status or 'open' }}", team: "{{ args.team or '-' }}"}
"""

ANA = {"name": "ana", "roles": ["customer"], "email": "ana@example.com"}


def call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def run(write_bot, calls: list[dict], principal: dict | None = ANA, state: dict | None = None):
    model = chatrun.ScriptedModel([*calls, {"text": "ok"}])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model, principal=principal, state=state)
    events = [e for e in session.chat("my tickets?") if e.type != "Stream"]
    return session, events, model


def tool_results(session: chatrun.Session) -> list[str]:
    return [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]


def test_the_model_is_not_offered_bound_arguments(api, write_bot):
    _, _, model = run(write_bot, [call("my_tickets")])
    [spec] = model.requests[0].tools
    assert spec["function"]["parameters"] == {"type": "object", "properties": {"status": {"type": "string", "enum": [
        "open", "closed"]}}, "required": []}


def test_the_bound_value_is_sent_from_the_principal(api, write_bot):
    session, _, _ = run(write_bot, [call("my_tickets", status="closed")])
    assert api.requests == [{"path": "/tickets", "query": {"reporter": ["ana@example.com"], "status": ["closed"],
                                                          "team": ["-"]}}]
    assert json.loads(tool_results(session)[0])["json"]["tickets"][0]["reporter"] == "ana@example.com"


def test_a_model_that_sends_a_bound_argument_is_ignored_and_told(api, write_bot):
    session, events, _ = run(write_bot, [call("my_tickets", reporter="bob@example.com", team="red")])
    assert [r["query"]["reporter"] for r in api.requests] == [["ana@example.com"]]
    assert api.requests[0]["query"]["team"] == ["-"]  # bound to state.team (none): left out, not the model's
    [reply] = tool_results(session)
    assert "bob@example.com" not in reply
    assert reply.endswith("Note: `reporter`, `team` are set by the bot, not by you; the value you sent was "
                          "ignored. Do not send it.")
    assert any(e.type == "Console" and "the model sent reporter, team" in e.data for e in events)


def test_bound_values_come_from_state_and_keep_their_place(api, write_bot):
    run(write_bot, [call("my_tickets")], state={"team": "blue"})
    assert api.requests[0]["query"]["team"] == ["blue"]


def test_a_required_bound_argument_that_renders_to_nothing_fails_the_call_naming_it(api, write_bot):
    session, events, _ = run(write_bot, [call("my_tickets", reporter="bob@example.com")], principal=None)
    assert api.requests == []  # nothing sent: no empty reporter, and never the model's
    [reply] = tool_results(session)
    assert reply == ("Error: my_tickets cannot run: its argument `reporter` is set by the bot and has no value "
                     "here. Nothing was sent.")
    [error] = [e for e in events if e.type == "Error"]
    assert error.data == "my_tickets could not run: the bot has no value for its argument `reporter` (no one is " \
                         "signed in)"
    detail = error.meta["detail"]  # the author's: where, which template
    assert "bot.yaml:" in detail and "tool my_tickets: its bound argument `reporter` rendered to nothing (from " \
           "'{{ principal.email }}'); the call was not made" in detail
    assert session.turn_count == 1  # the turn goes on: the model reads why


def test_an_empty_claim_is_nothing_too(api, write_bot):
    session, _, _ = run(write_bot, [call("my_tickets")], principal={**ANA, "email": "  "})
    assert api.requests == [] and "cannot run" in tool_results(session)[0]


def test_a_bound_value_that_misses_the_schema_is_the_bots_problem(api, write_bot):
    session, events, _ = run(write_bot, [call("my_tickets")], principal={**ANA, "email": "not-an-email"})
    assert api.requests == []
    assert tool_results(session) == ["Error: my_tickets cannot run: an argument the bot sets is invalid. "
                                     "Nothing was sent."]
    assert any(e.type == "Error" and "reporter: 'not-an-email' is not a 'email'" in e.meta["detail"] for e in events)


def test_templates_see_the_principal_and_the_session_id(write_bot):
    path = write_bot("""
        name: t
        model: {provider: scripted, name: m}
        routes:
          main: {default: true, system: "Hi.", tools: [who]}
        tools:
          who:
            description: who
            parameters: {type: object, properties: {me: {type: string}, session: {type: string}}}
            bind: {me: "{{ principal.name }}/{{ principal.roles | join(',') }}", session: "{{ session_id }}"}
            action: {reply: "{{ args.me }} in {{ args.session }}"}
        """)
    model = chatrun.ScriptedModel([call("who"), {"text": "ok"}])
    session = chatrun.load_bot(path).session(model=model, principal={"name": "ana", "roles": ["b", "a"]})
    session.chat("who am I?")
    assert tool_results(session) == [f"ana/a,b in {session.id}"]
    assert session.roles == {"a", "b"}  # the principal's roles, when none are given


def test_validation_of_bind(write_bot):
    path = write_bot("""
        name: v
        routes:
          main: {default: true, system: "Hi.", tools: [t]}
        tools:
          t:
            description: t
            parameters: {type: object, properties: {email: {type: string}}}
            bind:
              emial: "{{ principal.email }}"
              email: "{{ principal.email }} {{ stat.x }}"
        """)
    with pytest.raises(chatrun.BotError) as info:
        chatrun.load_bot(path)
    messages = [d.format() for d in info.value.diagnostics]
    assert f"{path}:10:7: error: tool `t` binds `emial`, but its `parameters` declare no property `emial`; did you " \
           "mean `email`? (a bound argument is declared in `parameters` like any other; the model is not offered " \
           "it)" in messages
    assert any(m.startswith(f"{path}:11:") and "`bind email` of tool `t` uses unknown template variable `stat`" in m
               for m in messages), messages


def test_an_openapi_tool_binds_only_what_its_operation_takes(write_bot):
    spec = (Path(__file__).resolve().parents[1] / "bots" / "helpdesk" / "helpdesk.openapi.yaml").read_text()
    path = write_bot("""
        name: o
        routes:
          main: {default: true, system: "Hi.", tools: [mine]}
        tools:
          mine:
            openapi: {spec: api.yaml, operation: listTickets}
            bind: {reportr: "{{ principal.email }}"}
        """, extra={"api.yaml": spec})
    with pytest.raises(chatrun.BotError) as info:
        chatrun.load_bot(path)
    assert [d.format() for d in info.value.diagnostics] == [
        f"{path}:8:12: error: tool `mine` binds `reportr`, but its OpenAPI operation takes no argument `reportr`; "
        "did you mean `reporter`? (it takes: reporter, status)"]


def test_the_auth_file_gives_principals_claims():
    from chatrun.server.auth import Auth

    auth = Auth.from_mapping({"tokens": {"tok-ana-0123456": {"principal": "ana", "roles": ["staff"],
                                                             "claims": {"email": "ana@example.com", "id": 7}}}})
    principal = auth.authenticate("tok-ana-0123456")
    assert principal is not None
    assert principal.as_template() == {"name": "ana", "roles": ["staff"], "email": "ana@example.com", "id": 7}
    for claims, problem in (({"name": "x"}, "claim 'name': a claim is named by text other than name and roles"),
                            ({"email": ["a", "b"]}, "claim `email` must be text, a number or a boolean"),
                            ("ana@example.com", "claims is a mapping")):
        with pytest.raises(chatrun.ChatrunError, match=problem):
            Auth.from_mapping({"tokens": {"tok-ana-0123456": {"principal": "ana", "claims": claims}}})


def test_an_invalid_bound_values_detail_passes_the_storage_guards(api, write_bot):
    """The Error's `meta.detail` quotes the bound value the schema refused: on a bot whose
    `storage` guards redact cards and emails it held them as rendered (the history alone was redacted)."""
    guarded = BOT.replace("state: {team: null}", "state: {team: null}\nguardrails:\n"
                          "  - {pii: [card, email], stages: [storage], outcome: redact}")
    model = chatrun.ScriptedModel([call("my_tickets"), {"text": "ok"}])
    team = ["ana@example.com", "4111 1111 1111 1111"]  # not a string: the schema refuses it
    session = chatrun.load_bot(write_bot(guarded)).session(model=model, principal=ANA, state={"team": team})
    [error] = [e for e in session.chat("my tickets?") if e.type == "Error"]
    assert api.requests == []
    detail = error.meta["detail"]
    assert "a bound argument is invalid" in detail and "[email]" in detail and "[card]" in detail
    assert "4111" not in detail and "ana@example.com" not in detail
