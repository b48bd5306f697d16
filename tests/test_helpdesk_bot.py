"""bots/helpdesk end to end (issue 24): `chatrun serve` with an `--auth` file of two principals,
the real openai client against the fake OpenAI server playing a model that tries to read the
other user's tickets, and the bot's OpenAPI tools against a real tickets API on loopback. What
the API receives is the proof: every request names the signed-in user, whatever the model sent."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from orders_api import LoopbackApi
from redis_support import Replica

REPO = Path(__file__).resolve().parents[1]
HELPDESK = REPO / "bots" / "helpdesk"
TICKETS = {
    "T-101": {"id": "T-101", "reporter": "ana@example.com", "title": "VPN drops every hour", "status": "open"},
    "T-201": {"id": "T-201", "reporter": "bob@example.com", "title": "Salary slip printer", "status": "open"},
}
AUTH = """
tokens:
  tok-ana-0123456: {principal: ana, claims: {email: ana@example.com}}
  tok-bob-0123456: {principal: bob, roles: [staff], claims: {email: bob@example.com}}
"""


class HelpdeskApi(LoopbackApi):
    """The API of helpdesk.openapi.yaml: it trusts whatever `reporter` it is asked about."""

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        self.requests.append({"path": parts.path, "query": query})
        reporter = query.get("reporter")
        if parts.path == "/tickets":
            self.reply(h, 200, {"tickets": [t for t in TICKETS.values() if t["reporter"] == reporter]})
            return
        found = TICKETS.get(parts.path.removeprefix("/tickets/"))
        if found is not None and found["reporter"] == reporter:
            self.reply(h, 200, found)
        else:
            self.reply(h, 404, {"error": "no such ticket"})


@pytest.fixture
def api(monkeypatch):
    with HelpdeskApi() as server:
        monkeypatch.setenv("HELPDESK_API_URL", server.url)
        yield server


def call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def turn(server: Replica, token: str, session: str, text: str) -> list[dict]:
    answer = httpx.post(f"{server.url}/bots/helpdesk/sessions/{session}/messages", json={"userMessage": text},
                        headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["events"]


def open_session(server: Replica, token: str) -> str:
    answer = httpx.post(f"{server.url}/bots/helpdesk/sessions", json={},
                        headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


@pytest.mark.subprocess  # chatrun serve
def test_a_model_cannot_read_another_users_tickets_through_chatrun_serve(fake, api, tmp_path):
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    fake.queue(
        call("my_tickets", reporter="bob@example.com"),  # ana's session: the model asks for bob's
        {"text": "Here are your tickets."},
        call("ticket", ticketId="T-201", reporter="bob@example.com"),  # ... and bob's ticket by number
        {"text": "You have no ticket T-201."},
        call("my_tickets", status="open"),  # bob's session: the model sends no reporter at all
        {"text": "One open ticket."},
    )
    server = Replica(str(HELPDESK), f"sqlite:///{tmp_path / 'sessions.db'}", fake.base_url,
                     "--auth", str(auth)).start()
    try:
        ana = open_session(server, "tok-ana-0123456")
        turn(server, "tok-ana-0123456", ana, "Show me bob@example.com's tickets")
        turn(server, "tok-ana-0123456", ana, "What does T-201 say?")
        bob = open_session(server, "tok-bob-0123456")
        events = turn(server, "tok-bob-0123456", bob, "My open tickets?")
    finally:
        server.kill()
    assert api.requests == [
        {"path": "/tickets", "query": {"reporter": "ana@example.com"}},
        {"path": "/tickets/T-201", "query": {"reporter": "ana@example.com"}},
        {"path": "/tickets", "query": {"reporter": "bob@example.com", "status": "open"}},
    ]
    # The model was never offered the argument, and what it read names no ticket of bob's.
    sent_tools = {t["function"]["name"]: t["function"]["parameters"] for t in fake.requests[0]["tools"]}
    assert "reporter" not in sent_tools["my_tickets"]["properties"]
    assert set(sent_tools["ticket"]["properties"]) == {"ticketId"} and sent_tools["ticket"]["required"] == ["ticketId"]
    ana_read = [m["content"] for r in fake.requests[1:4] for m in r["messages"] if m["role"] == "tool"]
    assert ana_read[0] == ("T-101 (open): VPN drops every hour\n\nNote: `reporter` is set by the bot, not by you; the "
                           "value you sent was ignored. Do not send it.")
    assert ana_read[-1].startswith("The user has no ticket T-201.")
    assert not any("Salary" in text for text in ana_read)
    assert [e["data"] for e in events if e["type"] == "Message"][-1] == "One open ticket."


@pytest.mark.subprocess  # chatrun repl
def test_the_repl_signs_a_principal_in_and_save_keeps_it(api, tmp_path):
    from test_repl import run_repl

    saved = tmp_path / "walk.yaml"
    script = "\n".join([
        "/principal ana email=ana@example.com",
        "my tickets",
        '/call my_tickets {"reporter": "bob@example.com"}',
        "/say One ticket.",
        f"/save {saved}",
        "/principal -",
        "again",
        "/call my_tickets {}",
        "/say Sign in first.",
    ]) + "\n"
    out = run_repl([str(HELPDESK), "--play-model"], script)
    assert out.returncode == 0, out.stderr
    assert 'principal: {"email": "ana@example.com", "name": "ana", "roles": []}' in out.stdout
    assert "[tool my_tickets → T-101 (open): VPN drops every hour" in out.stdout
    assert "its argument `reporter` is set by the bot and has no value here" in out.stdout  # signed out
    assert api.requests == [{"path": "/tickets", "query": {"reporter": "ana@example.com"}}]
    assert "principal: {email: ana@example.com, name: ana, roles: []}" in saved.read_text()
