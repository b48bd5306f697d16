"""Only the approver decides, on every door a user can send a decision through (the mission's
"consent for the user" failure): a refund waits for a supervisor; the unruly model consents in its
own arguments, and the user then tries to decide it themselves — a `Decide` frame on the
extended WebSocket, an AG-UI `resume` of that item (approved, and cancelled), the HTTP decision
endpoint. Each is refused, nothing is refunded and the item still waits for the supervisor,
whose approval refunds once. Real parts: the app on a real SQLite file, the fake OpenAI server
answering as the unruly model, the protocols' own frames. The channels are in
tests/test_channel_conformance.py; `/v1` (a user's yes is queued) in tests/test_openai_hitl.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.server.auth import Auth
from server_support import app_for_testclient, until_done

BOT = """\
name: desk
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
state: {refunded: 0}
routes:
  main: {default: true, system: You refund., tools: [refund]}
tools:
  refund:
    effect: once
    description: Refund an amount
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    approval:
      by: [supervisor]
      ask: {text: "Refund {{ args.amount }} EUR?", tell: "Your refund waits for a supervisor."}
    action: {set: {state.refunded: "{{ state.refunded + args.amount }}"}, reply: "Refunded {{ args.amount }}."}
"""
AUTH = Auth.from_mapping({"tokens": {"token-ana-123": {"principal": "ana"},
                                     "token-sam-123": {"principal": "sam", "roles": ["supervisor"]}}})
ANA, SAM = {"Authorization": "Bearer token-ana-123"}, {"Authorization": "Bearer token-sam-123"}


@pytest.fixture
def client(fake, write_bot, tmp_path):
    app = app_for_testclient([chatrun.load_bot(write_bot(BOT))], f"sqlite:///{tmp_path / 's.db'}", auth=AUTH)
    with TestClient(app) as c:
        yield c


def ask_for_a_refund(client: TestClient, fake, session: str) -> None:
    """The model consents itself; the user is told the refund waits for a supervisor."""
    fake.queue({"unruly": "self_confirm", "call": {"name": "refund", "arguments": {"amount": 80}}})
    assert client.post("/bots/desk/sessions", json={"id": session}, headers=ANA).status_code == 201
    body = client.post(f"/bots/desk/sessions/{session}/messages", json={"userMessage": "refund 80"},
                       headers=ANA).json()
    told = [e["data"]["ask"] for e in body["events"] if e["type"] == "Pending"]  # the user's: the tell
    assert told == ["Your refund waits for a supervisor."] and body["ok"], body


def still_waiting_and_nothing_refunded(client: TestClient, session: str) -> None:
    state = client.get(f"/bots/desk/sessions/{session}", headers=ANA).json()
    assert state["state"]["refunded"] == 0 and [p["id"] for p in state["pending"]] == ["p1"], state


def the_supervisor_approves_once(client: TestClient, fake, session: str) -> None:
    fake.queue({"unruly": ["repeat_call", "self_confirm"]}, {"text": "Refunded."})
    decided = client.post(f"/bots/desk/sessions/{session}/pending/p1", json={"decision": "approve"}, headers=SAM)
    assert decided.status_code == 200, decided.text
    assert client.get(f"/bots/desk/sessions/{session}", headers=ANA).json()["state"]["refunded"] == 80


def test_a_decide_frame_from_the_user_is_refused(client, fake):
    ask_for_a_refund(client, fake, "ws-1")
    with client.websocket_connect("/_chat/routes", headers=ANA) as ws:
        ws.send_json({"type": "Connect", "chatId": "ws-1", "extensions": True, "resume": True})
        until_done(ws)
        ws.send_json({"type": "Decide", "chatId": "ws-1", "item": "p1", "decision": "approve"})
        frames = until_done(ws)
    assert frames[-1]["type"] == "Failed" and not any(f["type"] == "Resolved" for f in frames), frames
    still_waiting_and_nothing_refunded(client, "ws-1")
    the_supervisor_approves_once(client, fake, "ws-1")


def agui_resume(client: TestClient, thread: str, status: str) -> list[dict[str, Any]]:
    body = {"threadId": thread, "runId": f"run-{status}", "state": {}, "tools": [], "context": [],
            "forwardedProps": {}, "messages": [],
            "resume": [{"interruptId": "p1", "status": status, "payload": {"decision": "approve"}}]}
    answer = client.post("/agui/desk", json=body, headers=ANA)
    if answer.status_code != 200:
        return [{"type": "HTTP", "status": answer.status_code, "body": answer.json()}]
    return [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]


def test_an_agui_resume_of_the_supervisors_item_is_refused_approved_or_cancelled(client, fake):
    fake.queue({"unruly": "self_confirm", "call": {"name": "refund", "arguments": {"amount": 80}}})
    first = client.post("/agui/desk", headers=ANA, json={
        "threadId": "agui-1", "runId": "run-1", "state": {}, "tools": [], "context": [], "forwardedProps": {},
        "messages": [{"id": "u1", "role": "user", "content": "refund 80"}]})
    assert first.status_code == 200, first.text
    assert "Your refund waits for a supervisor." in first.text and '"interrupt"' not in first.text
    session = "agui-1"
    for status in ("resolved", "cancelled"):
        frames = agui_resume(client, session, status)
        assert frames[-1]["type"] in ("RUN_ERROR", "HTTP"), frames
    still_waiting_and_nothing_refunded(client, session)
    the_supervisor_approves_once(client, fake, session)


def test_the_users_own_decision_over_http_is_refused(client, fake):
    ask_for_a_refund(client, fake, "h-1")
    for decision in ("approve", "reject"):
        refused = client.post("/bots/desk/sessions/h-1/pending/p1", json={"decision": decision}, headers=ANA)
        assert refused.status_code in (403, 404), refused.text
    still_waiting_and_nothing_refunded(client, "h-1")
    the_supervisor_approves_once(client, fake, "h-1")
