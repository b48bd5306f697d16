"""Issue 22 end to end through the server, in process: the real openai client against the fake
OpenAI server, a real local HTTP receiver the refund tool calls, a real SQLite store. A user
approves their own refund over the extended WebSocket (Decide) and over the Quarkus dialect
(the next message answers); /v1 shows the approval as text and takes "approve"; a backend
answers a question with its item token; an operator takes over, speaks and releases; the
metrics count the decisions by outcome and the oldest item's age; the real openai SDK on the
Responses API reads an approval as the reply's text and answers it with the next input."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.store.sqlite import SQLiteStore
from server_support import app_for_testclient, until_done
from webhook_support import OPENAI_MODEL, Receiver

AUTH = """
tokens:
  ana-token-123: {principal: ana}
  olga-token-12: {principal: olga, roles: [operators]}
"""
ANA, OLGA = {"Authorization": "Bearer ana-token-123"}, {"Authorization": "Bearer olga-token-12"}

BOT = f"""\
name: desk
model: {{{OPENAI_MODEL}}}
env:
  REFUND_URL: {{}}
state: {{kyc: null}}
routes:
  main: {{default: true, system: Help., tools: [refund, submit_documents, human]}}
tools:
  refund:
    description: Refund an order
    parameters: {{type: object, properties: {{order: {{type: string}}, amount: {{type: number}}}}, required: [order, amount]}}
    http: {{method: POST, url: "{{{{ env.REFUND_URL }}}}/refunds", json: {{order: "{{{{ args.order }}}}"}}}}
    approval: {{ask: "Refund {{{{ args.amount }}}} EUR on {{{{ args.order }}}}?"}}
  submit_documents:
    description: Send the documents for checking
    parameters: {{type: object, properties: {{}}}}
    action:
      ask:
        from: backend
        text: Check the customer's documents.
        tell: We are checking your documents.
        schema: {{type: object, properties: {{verdict: {{enum: [approved, rejected]}}}}, required: [verdict]}}
        into: state.kyc
  human:
    description: Hand over to a person
    parameters: {{type: object, properties: {{}}}}
    action:
      operator: {{role: operators, text: Connecting you with a colleague.}}
"""


def responder(body: dict[str, Any]) -> dict[str, Any]:
    if body["messages"][-1]["role"] == "tool":
        return {"text": "Done."}
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    words = str(user).split()
    if words[0] == "refund":
        return {"tool_calls": [{"name": "refund", "arguments": {"order": words[1], "amount": float(words[2])}}]}
    if words[0] == "documents":
        return {"tool_calls": [{"name": "submit_documents", "arguments": {}}]}
    if words[0] == "human":
        return {"tool_calls": [{"name": "human", "arguments": {}}]}
    return {"text": f"You said {user}."}


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture
def served(fake, tmp_path, receiver, monkeypatch):
    monkeypatch.setenv("REFUND_URL", receiver.url)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "auth.yaml").write_text(AUTH)
    db = tmp_path / "s.db"
    app = app_for_testclient([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{db}",
                             auth=str(tmp_path / "auth.yaml"))
    with TestClient(app) as client:
        yield client, db


def test_an_extended_chat_decides_with_a_decide_frame_and_a_retry_is_replayed(served, receiver):
    client, _ = served
    with client.websocket_connect("/_chat/routes", headers=ANA) as ws:
        ws.send_json({"type": "Connect", "chatId": "w1", "extensions": True})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "w1", "data": {"userMessage": "refund A7 20"}})
        asked = until_done(ws)
        pending = [f["data"] for f in asked if f["type"] == "Pending"]
        assert [(p["id"], p["ask"], p["by"]) for p in pending] == [("p1", "Refund 20.0 EUR on A7?", ["user"])]
        assert receiver.seen() == []
        decide = {"type": "Decide", "chatId": "w1", "item": "p1", "decision": "approve", "requestId": "d-1"}
        ws.send_json(decide)
        decided = until_done(ws)
        assert [f["data"]["outcome"] for f in decided if f["type"] == "Resolved"] == ["approved"]
        assert decided[-1]["type"] == "Completed" and len(receiver.seen()) == 1
        ws.send_json(decide)  # the same requestId: the recorded turn again, the tool not again
        again = until_done(ws)
        assert [f["type"] for f in again] == [f["type"] for f in decided] and len(receiver.seen()) == 1
        ws.send_json(dict(decide, requestId="d-2"))
        late = until_done(ws)
        assert [f["data"] for f in late if f["type"] == "Failed"] == ["NotPending"]
        assert "not pending" in [f["data"] for f in late if f["type"] == "Error"][0]


def test_a_quarkus_chat_is_asked_in_a_message_and_its_next_message_answers(served, receiver):
    client, _ = served
    with client.websocket_connect("/_chat/routes", headers=ANA) as ws:
        ws.send_json({"type": "Connect", "chatId": "q1"})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "q1", "data": {"userMessage": "refund B2 15"}})
        asked = until_done(ws)
        assert {f["type"] for f in asked} <= {"Message", "Completed"}, asked  # no chatrun-only frames
        assert "Refund 15.0 EUR on B2?\n\nReply with one of: Yes, No." in [f["data"] for f in asked]
        ws.send_json({"type": "ChatRouteMessage", "chatId": "q1", "data": {"userMessage": "approve"}})
        answered = until_done(ws)
        assert {f["type"] for f in answered} <= {"Message", "Completed"}, answered
        assert answered[-2]["data"] == "Done." and len(receiver.seen()) == 1


def test_an_openai_client_reads_the_approval_as_text_and_answers_with_its_next_message(served, receiver):
    client, _ = served
    first = client.post("/v1/chat/completions", headers=dict(ANA, **{"X-Chatrun-Session": "o1"}),
                        json={"model": "desk", "messages": [{"role": "user", "content": "refund C3 9"}]}).json()
    text = first["choices"][0]["message"]["content"]
    assert text.endswith("Refund 9.0 EUR on C3?\n\nReply with one of: Yes, No.")
    assert [p["id"] for p in first["chatrun"]["pending"]] == ["p1"]
    second = client.post("/v1/chat/completions", headers=dict(ANA, **{"X-Chatrun-Session": "o1"}),
                         json={"model": "desk", "messages": [{"role": "user", "content": "refund C3 9"},
                                                             {"role": "assistant", "content": text},
                                                             {"role": "user", "content": "approve"}]}).json()
    assert second["choices"][0]["message"]["content"].endswith("Done.")
    assert "pending" not in second["chatrun"] and len(receiver.seen()) == 1


def test_a_backend_answers_with_the_item_token_and_an_operator_takes_over_and_releases(served):
    client, db = served
    assert client.post("/bots/desk/sessions", json={"id": "b1"}, headers=ANA).status_code == 201
    reply = client.post("/bots/desk/sessions/b1/messages", json={"userMessage": "documents"}, headers=ANA).json()
    assert "We are checking your documents." in [e["data"] for e in reply["events"] if e["type"] == "Message"] + [
        e["data"].get("ask") for e in reply["events"] if e["type"] == "Pending"]
    with SQLiteStore(db) as store:  # the token went to the backend audience only: read it where it is kept
        token = store.read_session("b1").pending[0]["token"]
    assert token and token not in str(reply)
    backend = {"Authorization": f"Bearer {token}", "Idempotency-Key": "kyc-b1"}
    bad = client.post("/bots/desk/sessions/b1/pending/p1", json={"answer": {"verdict": "maybe"}}, headers=backend)
    assert bad.status_code == 422 and bad.json()["error"] == "InvalidDecision"
    ok = client.post("/bots/desk/sessions/b1/pending/p1", json={"answer": {"verdict": "approved"}}, headers=backend)
    assert ok.status_code == 200, ok.text
    assert [e["data"]["outcome"] for e in ok.json()["events"] if e["type"] == "Resolved"] == ["answered"]
    assert client.get("/bots/desk/sessions/b1", headers=ANA).json()["state"]["kyc"] == {"verdict": "approved"}
    # The token reaches nothing once its item is answered.
    assert client.get("/bots/desk/sessions/b1/pending", headers={"Authorization": f"Bearer {token}"}).status_code == 404

    client.post("/bots/desk/sessions/b1/messages", json={"userMessage": "human"}, headers=ANA)
    listed = client.get("/pending?kind=takeover", headers=OLGA).json()["sessions"]
    assert [s["session"] for s in listed] == ["b1"]
    sweeper = client.app.state.registry.sweeper
    sweeper._measured = 0.0  # it measured at startup; it does every 30 s: now
    client.portal.call(sweeper.measure)  # the sweeper's gauges, read from the store
    gauges = client.get("/metrics", headers=OLGA).text
    assert 'chatrun_pending_items{bot="desk",kind="takeover"} 1.0' in gauges
    taken = client.post("/bots/desk/sessions/b1/takeover", json={}, headers=OLGA)
    assert taken.status_code == 200, taken.text
    said = client.post("/bots/desk/sessions/b1/operator/messages", json={"text": "Hi, Olga here."}, headers=OLGA).json()
    assert [(e["data"], e["meta"].get("from")) for e in said["events"] if e["type"] == "Message"] == [
        ("Hi, Olga here.", "operator")]
    quiet = client.post("/bots/desk/sessions/b1/messages", json={"userMessage": "thanks"}, headers=ANA).json()
    assert [e for e in quiet["events"] if e["type"] == "Message"] == []  # the bot stays silent
    released = client.post("/bots/desk/sessions/b1/release", json={}, headers=OLGA)
    assert released.status_code == 200, released.text
    assert client.get("/bots/desk/sessions/b1/pending", headers=ANA).json() == {"pending": [], "taken_over": None}
    sweeper._measured = 0.0
    client.portal.call(sweeper.measure)
    metrics = client.get("/metrics", headers=OLGA).text
    assert 'chatrun_pending_items{bot="desk",kind="takeover"} 0.0' in metrics
    assert 'chatrun_pending_decisions_total{bot="desk",kind="question",outcome="answered"} 1.0' in metrics
    assert 'chatrun_pending_decision_seconds_count{bot="desk",kind="question"} 1.0' in metrics


def test_a_pause_and_its_decision_are_span_events(served, spans):
    client, _ = served
    assert client.post("/bots/desk/sessions", json={"id": "t1"}, headers=ANA).status_code == 201
    client.post("/bots/desk/sessions/t1/messages", json={"userMessage": "refund D4 5"}, headers=ANA)
    client.post("/bots/desk/sessions/t1/pending/p1", json={"decision": "reject", "reason": "no"}, headers=ANA)
    noted = [(e.name, dict(e.attributes)) for s in spans.get_finished_spans() for e in s.events
             if e.name.startswith("chatrun.")]
    assert [(n, a["chatrun.pending.id"], a["chatrun.pending.kind"]) for n, a in noted] == [
        ("chatrun.pending", "p1", "approval"), ("chatrun.resolved", "p1", "approval")]
    assert noted[0][1]["chatrun.pending.tool"] == "refund" and noted[1][1]["chatrun.pending.outcome"] == "rejected"


def test_a_responses_client_reads_the_approval_as_text_and_its_next_input_answers(served, receiver):
    """The real openai SDK on the Responses API (over the app's test transport): the reply's text
    asks, the next input (chained by previous_response_id) answers."""
    import openai

    client, _ = served
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="ana-token-123", http_client=client,
                        default_headers={"X-Chatrun-Session": "r1"}, max_retries=0)
    first = sdk.responses.create(model="desk", input="refund E5 12")
    assert first.output_text.endswith("Refund 12.0 EUR on E5?\n\nReply with one of: Yes, No.")
    assert [p["id"] for p in first.to_dict()["chatrun"]["pending"]] == ["p1"] and receiver.seen() == []
    second = sdk.responses.create(model="desk", input="approve", previous_response_id=first.id)
    assert second.output_text.endswith("Done.") and "pending" not in second.to_dict()["chatrun"]
    assert len(receiver.seen()) == 1
    # Another approval, answered with a list of input items, refused: the tool never runs.
    # Streamed: the deltas and the completed response both carry the question.
    events = list(sdk.responses.create(model="desk", input="refund E6 30", previous_response_id=second.id,
                                       stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    third = next(e.response for e in events if e.type == "response.completed")
    assert third.output_text.endswith("Refund 30.0 EUR on E6?\n\nReply with one of: Yes, No.") and deltas == third.output_text
    fourth = sdk.responses.create(model="desk", previous_response_id=third.id, input=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "reject"}]}])
    assert fourth.output_text.endswith("Done.") and len(receiver.seen()) == 1
    history = client.get("/bots/desk/sessions/r1", headers=ANA).json()["history"]
    outcomes = [e["data"]["outcome"] for h in history for e in h.get("events", []) if e["type"] == "Resolved"]
    assert outcomes == ["approved", "rejected"]


def _sample(metrics: str, name: str, labels: str) -> float:
    """One sample of the /metrics text (0.0 when the series is absent)."""
    prefix = f"{name}{{{labels}}} "
    lines = [line for line in metrics.splitlines() if line.startswith(prefix)]
    return float(lines[0][len(prefix):]) if lines else 0.0


def test_the_oldest_pending_age_and_decisions_by_each_outcome_are_measured(served, receiver):
    from chatrun.engine.pending import parse_time

    client, _ = served
    created = {}
    for session, text in (("m1", "refund F1 5"), ("m2", "refund F2 6")):
        assert client.post("/bots/desk/sessions", json={"id": session}, headers=ANA).status_code == 201
        client.post(f"/bots/desk/sessions/{session}/messages", json={"userMessage": text}, headers=ANA)
        (item,) = client.get(f"/bots/desk/sessions/{session}/pending", headers=ANA).json()["pending"]
        created[session] = parse_time(item["created"]).timestamp()
    sweeper = client.app.state.registry.sweeper
    sweeper.clock = lambda: created["m1"] + 90.0  # the sweeper's clock: 90 s after the older item
    sweeper._measured = 0.0
    client.portal.call(sweeper.measure)
    metrics = client.get("/metrics", headers=OLGA).text
    labels = 'bot="desk",kind="approval"'
    assert _sample(metrics, "chatrun_pending_items", labels) == 2.0
    assert _sample(metrics, "chatrun_pending_oldest_age_seconds", labels) == pytest.approx(90.0, abs=0.01)

    approved = client.post("/bots/desk/sessions/m1/pending/p1", json={"decision": "approve"}, headers=ANA)
    rejected = client.post("/bots/desk/sessions/m2/pending/p1", json={"decision": "reject", "reason": "no"},
                           headers=ANA)
    assert approved.status_code == rejected.status_code == 200 and len(receiver.seen()) == 1
    sweeper.clock = lambda: created["m1"] + 200.0
    sweeper._measured = 0.0
    client.portal.call(sweeper.measure)
    metrics = client.get("/metrics", headers=OLGA).text
    assert _sample(metrics, "chatrun_pending_items", labels) == 0.0
    assert _sample(metrics, "chatrun_pending_oldest_age_seconds", labels) == 0.0  # nothing waits: no age
    for outcome in ("approved", "rejected"):
        assert _sample(metrics, "chatrun_pending_decisions_total", f'{labels},outcome="{outcome}"') == 1.0
    assert _sample(metrics, "chatrun_pending_decisions_total", f'{labels},outcome="edited"') == 0.0
    assert _sample(metrics, "chatrun_pending_decision_seconds_count", labels) == 2.0


def test_a_backends_answer_reaches_the_openai_users_next_response_in_the_same_session(served):
    """Issue 34: a question a backend answers over HTTP is a turn of its own; the /v1 user's next
    request (history resent) continues the session, and the answer's events come first."""
    client, db = served
    ask = {"model": "desk", "messages": [{"role": "user", "content": "documents"}], "chatrun": {"events": True}}
    first = client.post("/v1/chat/completions", headers=ANA, json=ask).json()
    session, text = first["chatrun"]["session"], first["choices"][0]["message"]["content"]
    with SQLiteStore(db) as store:
        token = store.read_session(session).pending[0]["token"]
    answered = client.post(f"/bots/desk/sessions/{session}/pending/p1", json={"answer": {"verdict": "approved"}},
                           headers={"Authorization": f"Bearer {token}"})
    assert answered.status_code == 200, answered.text
    ask["messages"] += [{"role": "assistant", "content": text}, {"role": "user", "content": "and now?"}]
    news = client.post("/v1/chat/completions", headers=ANA, json=ask).json()
    assert (news["chatrun"]["session"], news["chatrun"]["how"]) == (session, "continued")
    assert [(e["type"], e["data"]["outcome"]) for e in news["chatrun"]["events"] if e["type"] == "Resolved"] == [
        ("Resolved", "answered")]
    assert news["choices"][0]["message"]["content"].endswith("You said and now?.")
    assert client.get(f"/bots/desk/sessions/{session}", headers=ANA).json()["state"]["kyc"] == {"verdict": "approved"}
