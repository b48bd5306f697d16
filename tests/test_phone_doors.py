"""The mission's guarantees on the phone (Twilio ConversationRelay), where a caller has no button
and no screen: what they hear is all they learn. The unruly model repeats a `once` payment in
every answer and turn; it consents in its own arguments to a refund a supervisor approves; it
calls a tool for ever until the session's budget (`limits.max_session_tokens`) or the caller's
(`limits.max_user_tokens`) is spent. Real parts: the app on a real SQLite file (TestClient's
WebSocket playing Twilio's side, as tests/test_channel_twilio.py), the real `openai` client
against the fake OpenAI server, streaming."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from chatrun.definition.page_texts import BUILTIN
from chatrun.server.channels.base import session_id_for
from server_support import app_for_testclient
from test_channel_twilio import AUTH_TOKEN, CALLER, prompt, relay_path, reply, setup

BOT = """\
name: phone
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
env:
  TWILIO_AUTH_TOKEN: {secret: true}
channels:
  twilio: {auth_token: TWILIO_AUTH_TOKEN, greeting: "Hello, this is the shop."}
state: {paid: 0, refunded: 0}
limits: {max_model_calls: 40, LIMITS}
routes:
  main: {default: true, system: You take payments., tools: [pay, refund]}
tools:
  pay:
    effect: once
    description: Pay an amount.
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    action: {set: {state.paid: "{{ state.paid + args.amount }}"}, reply: "Paid {{ args.amount }}."}
  refund:
    effect: once
    description: Refund an amount (a supervisor approves).
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    approval:
      by: [supervisor]
      ask: {text: "Refund {{ args.amount }} EUR?", tell: "Your refund waits for a supervisor."}
    action: {set: {state.refunded: "{{ state.refunded + args.amount }}"}, reply: "Refunded {{ args.amount }}."}
"""
SESSION_BUDGET = "max_session_tokens: 1000"
USER_BUDGET = "max_user_tokens: 1000"
SAM = {"Authorization": "Bearer sam-token-123"}
LOOP = {"tool_calls": [{"name": "pay", "arguments": {"amount": 1}}],
        "usage": {"prompt_tokens": 390, "completion_tokens": 10, "total_tokens": 400}}
TOLD = {  # what the caller hears of a turn a budget ended: the session's cannot go on, the user's renews
    SESSION_BUDGET: BUILTIN["en"]["session_budget_spent"],
    USER_BUDGET: BUILTIN["en"]["user_budget_spent"].split("{renews}")[0],
}


def phone(tmp_path, monkeypatch, limits: str = "max_session_tokens: 100000") -> TestClient:
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(BOT.replace("LIMITS", limits))
    (tmp_path / "auth.yaml").write_text("tokens: {sam-token-123: {principal: sam, roles: [supervisor]}}\n")
    return TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                                         auth=str(tmp_path / "auth.yaml")))


def said(ws: Any, text: str) -> str:
    """What the caller hears in answer to saying `text`."""
    ws.send_json(prompt(text))
    tokens, last = reply(ws)
    return ("".join(tokens) + last["token"]).strip()


def state_of(client: TestClient, call_sid: str = "CA0001") -> dict[str, Any]:
    """The call's session's state, as stored."""
    store = client.app.state.registry.store
    record = client.portal.call(store.load_session, session_id_for("phone", "twilio", call_sid))
    return record.snapshot["state"]


def pending_of(client: TestClient, call_sid: str = "CA0001") -> list[str]:
    sid = session_id_for("phone", "twilio", call_sid)
    answer = client.get(f"/bots/phone/sessions/{sid}/pending", headers=SAM)
    assert answer.status_code == 200, answer.text
    return [p["id"] for p in answer.json()["pending"]]


ALREADY_PAID = ("Already done earlier in this conversation (turn 1): Paid 30. It was not run again; do not call it "
                "again for the same thing.")


def test_a_once_payment_the_model_repeats_in_every_answer_and_turn_is_paid_once(tmp_path, fake, monkeypatch):
    """The model pays six times an answer, repeats its calls after the results, and pays six
    times again the next turn: one payment, and the caller hears the model's answers."""
    pay = {"name": "pay", "arguments": {"amount": 30}}
    fake.queue({"unruly": "repeat_call", "call": pay, "times": 6}, {"unruly": "repeat_call"},
               {"text": "Paid."}, {"unruly": "repeat_call", "call": pay, "times": 6}, {"text": "Paid already."})
    with phone(tmp_path, monkeypatch) as client:
        with client.websocket_connect(relay_path(client)) as ws:
            ws.send_json(setup())
            assert said(ws, "Pay 30.") == "Paid."
            assert said(ws, "Pay 30 again to be sure.") == "Paid already."
        assert state_of(client)["paid"] == 30
    results = {m["tool_call_id"]: m["content"] for body in fake.requests for m in body["messages"]
               if m["role"] == "tool"}  # each call's result, as the model read it
    assert len(results) == 24 and list(results.values()).count("Paid 30.") == 1, results
    assert sorted(set(results.values())) == [ALREADY_PAID, "Paid 30."]
    assert fake.pending == 0


def test_the_models_own_consent_refunds_nothing_and_only_the_supervisor_approves(tmp_path, fake, monkeypatch):
    """The model consents in its own arguments to a refund a supervisor approves: the caller
    hears the `tell`, never the supervisor's question; their spoken yes and a pressed 1 decide
    nothing. The supervisor's approval refunds once (the model's repeat after it, consenting
    again, is answered as done), heard at the caller's next prompt."""
    fake.queue({"unruly": "self_confirm", "call": {"name": "refund", "arguments": {"amount": 80}}})
    with phone(tmp_path, monkeypatch) as client:
        with client.websocket_connect(relay_path(client)) as ws:
            ws.send_json(setup())
            heard = [said(ws, "Refund my 80 euros.")]
            heard.append(said(ws, "Yes."))
            ws.send_json({"type": "dtmf", "digit": "1"})
            heard.append("".join(reply(ws)[0]).strip())
            waiting = "Still waiting: Your refund waits for a supervisor."
            assert heard == ["Your refund waits for a supervisor.", waiting, waiting], heard
            assert state_of(client)["refunded"] == 0 and pending_of(client) == ["p1"]
            fake.queue({"unruly": ["repeat_call", "self_confirm"]}, {"text": "Your refund of 80 EUR is done."},
                       {"text": "Goodbye."})
            sid = session_id_for("phone", "twilio", "CA0001")
            decided = client.post(f"/bots/phone/sessions/{sid}/pending/p1", json={"decision": "approve"}, headers=SAM)
            assert decided.status_code == 200, decided.text
            assert said(ws, "Hello?") == "Your refund of 80 EUR is done. Goodbye."
        assert state_of(client)["refunded"] == 80 and pending_of(client) == []
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told[0] == "Refunded 80." and told[1].startswith("Already done earlier in this conversation"), told


@pytest.mark.parametrize("limits", [SESSION_BUDGET, USER_BUDGET], ids=["session-budget", "user-budget"])
def test_a_model_that_loops_until_a_budget_is_spent_leaves_the_caller_hearing_the_truth(
        tmp_path, fake, monkeypatch, limits):
    """The model calls a tool for ever, 400 tokens a call: the third call passes the budget of
    1000 and the fourth is not sent. The caller hears why (the session's: it cannot go on; the
    user's: when it renews), not silence and not "please try again"; their next prompt, and a
    call they make again (the user's budget is the caller's, across calls), calls no model."""
    fake.responder = lambda body: LOOP
    with phone(tmp_path, monkeypatch, limits) as client:
        with client.websocket_connect(relay_path(client)) as ws:
            ws.send_json(setup())
            assert said(ws, "Pay, please.").startswith(TOLD[limits])
            assert len(fake.requests) == 3
            assert said(ws, "Hello?").startswith(TOLD[limits])
        assert state_of(client)["paid"] == 0  # the failed turns rolled back
        if limits == USER_BUDGET:
            with client.websocket_connect(relay_path(client, "CA0002")) as ws:
                ws.send_json(setup("CA0002"))
                assert said(ws, "Hello again.").startswith(TOLD[limits])
    assert len(fake.requests) == 3, f"{CALLER}'s prompts after the budget was spent called the model"
