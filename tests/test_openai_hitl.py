"""Issue 34, findings 1 and 2: /v1 keeps one conversation through decisions and takeovers. The
real `openai` SDK (over the app's test transport) talks to bots/refunds and bots/handover as the
repository ships them, their model the fake OpenAI server, on a real SQLite store. A supervisor
approves over HTTP; an operator takes over, speaks and releases over HTTP; the user's next /v1
request — history resent, previous_response_id, a front end's chat-id header, X-Chatrun-Session,
streamed or not — continues the same session and its response starts with what was said since."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.server.openai_api import OpenAIOptions
from chatrun.server.openai_turn import WAITING_FOR_OPERATOR
from server_support import app_for_testclient

BOTS = Path(__file__).resolve().parent.parent / "bots"
AUTH = """
tokens:
  ana-token-123: {principal: ana}
  sam-token-123: {principal: sam, roles: [supervisor]}
  olga-token-12: {principal: olga, roles: [operators]}
  max-token-123: {principal: max, roles: [operators]}
"""
SAM, OLGA = {"Authorization": "Bearer sam-token-123"}, {"Authorization": "Bearer olga-token-12"}
MAX = {"Authorization": "Bearer max-token-123"}
CHAT_HEADER = "X-OpenWebUI-Chat-Id"


def responder(body: dict[str, Any]) -> dict[str, Any]:
    """refund ORDER AMOUNT calls `refund`, human calls `human` (topic billing); a tool's result
    is read back; anything else is answered with what the bot's context (the system message after
    the memory, docs/models.md "Stable prompts") says was refunded."""
    messages = body["messages"]
    context = str(messages[-1]["content"]) if messages[-1]["role"] == "system" else ""
    messages = messages[:-1] if context else messages
    if messages[-1]["role"] == "tool":
        result = str(messages[-1]["content"])
        return {"text": f"Done: {result}" if "Refunded" in result else f"Tool said: {result}"}
    user = str(next(m["content"] for m in reversed(messages) if m["role"] == "user"))
    words = user.split()
    if words and words[0] == "refund":
        return {"tool_calls": [{"name": "refund", "arguments": {"order": words[1], "amount": float(words[2])}}]}
    if words and words[0] == "human":
        return {"tool_calls": [{"name": "human", "arguments": {"topic": "billing"}}]}
    refunded = context.split("Refunded so far in this conversation: ")[1].split(" EUR")[0] \
        if "Refunded so far" in context else "-"
    return {"text": f"You said {user}; refunded so far: {refunded} EUR."}


@pytest.fixture
def client(fake, tmp_path):
    fake.responder = responder
    (tmp_path / "auth.yaml").write_text(AUTH)
    bots = [chatrun.load_bot(BOTS / "refunds" / "bot.yaml"), chatrun.load_bot(BOTS / "handover" / "bot.yaml")]
    app = app_for_testclient(bots, f"sqlite:///{tmp_path / 's.db'}", auth=str(tmp_path / "auth.yaml"),
                             openai=OpenAIOptions(session_headers=(CHAT_HEADER,)))
    with TestClient(app) as c:
        yield c


def sdk(client, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="ana-token-123", http_client=client,
                         default_headers=headers, max_retries=0)


def chat(ai: openai.OpenAI, model: str, messages: list[dict], stream: bool = False) -> tuple[str, dict]:
    """(the reply's text, its `chatrun` field), streamed or not, events asked for."""
    extra = {"extra_body": {"chatrun": {"events": True}}}
    if not stream:
        done = ai.chat.completions.create(model=model, messages=messages, **extra)
        return done.choices[0].message.content or "", done.model_extra["chatrun"]
    chunks = list(ai.chat.completions.create(model=model, messages=messages, stream=True, **extra))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, next(c.model_extra["chatrun"] for c in chunks if c.model_extra.get("chatrun"))


def approve(client, session: str) -> dict:
    decided = client.post(f"/bots/refunds/sessions/{session}/pending/p1", json={"decision": "approve"}, headers=SAM)
    assert decided.status_code == 200, decided.text
    said = [e["data"] for e in decided.json()["events"] if e["type"] == "Message"]
    assert said == ["Done: Refunded 80.0 EUR on order A1001."]
    return decided.json()


def state_of(client, session: str) -> dict:
    return client.get(f"/bots/refunds/sessions/{session}", headers={"Authorization": "Bearer ana-token-123"}).json()["state"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("mode", ["history", "chat-id header", "x-chatrun-session"])
def test_after_an_approval_over_http_the_next_message_continues_and_carries_the_bots_reply(client, mode, stream):
    headers = {CHAT_HEADER: "chat-1"} if mode == "chat-id header" else \
        {"X-Chatrun-Session": "own-1"} if mode == "x-chatrun-session" else {}
    ai = sdk(client, **headers)
    messages = [{"role": "user", "content": "refund A1001 80"}]
    asked, first = chat(ai, "refunds", messages, stream)
    assert asked and [p["id"] for p in first["pending"]] == ["p1"]  # its wording: the user-facing text's
    session = first["session"]
    approve(client, session)
    assert state_of(client, session)["refunded"] == 80

    messages += [{"role": "assistant", "content": asked}, {"role": "user", "content": "any news?"}]
    text, news = chat(ai, "refunds", messages, stream)
    assert (news["session"], news["how"], news["turn"]) == (session, "continued", 3)
    assert "pending" not in news
    # The bot's reply after the decision comes first, then the answer to this message (the
    # model's prompt saw the refund): the same conversation, not a fork with refunded 0.
    assert text == "Done: Refunded 80.0 EUR on order A1001.\n\nYou said any news?; refunded so far: 80.0 EUR."
    resolved = [e for e in news["events"] if e["type"] == "Resolved"]
    assert [(e["data"]["outcome"], e["data"]["by"], e["turn"]) for e in resolved] == [("approved", "sam", 2)]
    assert state_of(client, session)["refunded"] == 80

    # Said once: the exchange after it continues as usual, with nothing from before again.
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "thanks"}]
    again, after = chat(ai, "refunds", messages, stream)
    assert (after["session"], after["how"]) == (session, "continued")
    assert again == "You said thanks; refunded so far: 80.0 EUR." and after["events"] == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_after_an_approval_previous_response_id_continues_and_carries_the_bots_reply(client, stream):
    ai = sdk(client)
    first = ai.responses.create(model="refunds", input="refund A1001 80")
    session = first.to_dict()["chatrun"]["session"]
    approve(client, session)
    if stream:
        events = list(ai.responses.create(model="refunds", input="any news?", previous_response_id=first.id,
                                          stream=True))
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        news = next(e.response for e in events if e.type == "response.completed")
        assert deltas == news.output_text
    else:
        news = ai.responses.create(model="refunds", input="any news?", previous_response_id=first.id)
    info = news.to_dict()["chatrun"]
    assert (info["session"], info["how"]) == (session, "continued")
    assert news.output_text == "Done: Refunded 80.0 EUR on order A1001.\n\nYou said any news?; refunded so far: 80.0 EUR."


def test_a_user_turn_since_still_forks_a_regenerated_answer(client):
    """Only others' turns are skipped: when the user's own conversation moved on (a regenerate
    after the decision and a later message), the older history forks as before."""
    ai = sdk(client)
    messages = [{"role": "user", "content": "refund A1001 80"}]
    asked, first = chat(ai, "refunds", messages)
    approve(client, first["session"])
    messages += [{"role": "assistant", "content": asked}, {"role": "user", "content": "any news?"}]
    _, news = chat(ai, "refunds", messages)
    assert news["how"] == "continued"
    regenerated, fork = chat(ai, "refunds", messages)
    assert fork["how"] == "forked" and fork["forked_from"] == first["session"]
    assert regenerated == "You said any news?; refunded so far: 0 EUR."  # the fork starts right after turn 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_takeover_over_v1_the_operator_reads_the_user_and_the_user_reads_the_operator(client, stream):
    ai = sdk(client)
    messages = [{"role": "user", "content": "human"}]
    connecting, first = chat(ai, "handover", messages, stream)
    session = first["session"]
    assert connecting.startswith("Connecting you with a colleague from billing")
    # Nobody took it yet: the user's message goes to the operators, and the user is told so.
    messages += [{"role": "assistant", "content": connecting}, {"role": "user", "content": "hello?"}]
    waiting, info = chat(ai, "handover", messages, stream)
    assert (info["session"], info["how"], waiting) == (session, "continued", WAITING_FOR_OPERATOR)

    base = f"/bots/handover/sessions/{session}"
    assert client.post(f"{base}/takeover", json={}, headers=OLGA).status_code == 200
    said = client.post(f"{base}/operator/messages", json={"text": "Hi, Olga here. How can I help?"}, headers=OLGA)
    assert said.status_code == 200, said.text
    messages += [{"role": "assistant", "content": waiting}, {"role": "user", "content": "my bill is wrong"}]
    text, info = chat(ai, "handover", messages, stream)
    assert (info["session"], info["how"]) == (session, "continued")
    # Who joined and the operator's words first; the bot said nothing, so the user is told where the message went.
    assert text == ("olga joined the conversation\n\nHi, Olga here. How can I help?\n\n"
                    "Your message was passed on to olga; their answer will appear here.")
    operator_said = [e for e in info["events"] if e["type"] == "Resolved"]
    assert [e["data"]["outcome"] for e in operator_said] == ["taken"]

    # The operator reads the user's /v1 messages, as from the WebSocket: UserMessage events.
    history = client.get(base, headers=OLGA).json()["history"]
    heard = [e["data"]["text"] for h in history for e in h["events"] if e["type"] == "UserMessage"]
    assert heard == ["hello?", "my bill is wrong"]

    client.post(f"{base}/operator/messages", json={"text": "Fixed: 10 EUR credited."}, headers=OLGA)
    released = client.post(f"{base}/release", json={}, headers=OLGA)
    assert released.status_code == 200, released.text
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "great, thanks"}]
    back, info = chat(ai, "handover", messages, stream)
    assert (info["session"], info["how"], info["route"]) == (session, "continued", "billing")
    assert back.startswith("Fixed: 10 EUR credited.\n\n")
    assert back.endswith("You said great, thanks; refunded so far: - EUR.")  # the bot again, on billing
    assert [e["data"]["outcome"] for e in info["events"] if e["type"] == "Resolved"] == ["released"]


def test_a_forced_takeover_reaches_the_v1_user_as_a_leaving_then_a_joining(client):
    ai = sdk(client)
    messages = [{"role": "user", "content": "human"}]
    connecting, first = chat(ai, "handover", messages)
    base = f"/bots/handover/sessions/{first['session']}"
    assert client.post(f"{base}/takeover", json={}, headers=OLGA).status_code == 200
    forced = client.post(f"{base}/takeover", json={"force": True}, headers=MAX)  # olga went home holding it
    assert forced.status_code == 200, forced.text
    assert client.post(f"{base}/operator/messages", json={"text": "Max here."}, headers=MAX).status_code == 200
    messages += [{"role": "assistant", "content": connecting}, {"role": "user", "content": "hello?"}]
    text, info = chat(ai, "handover", messages)
    assert info["session"] == first["session"]
    assert text.startswith("olga joined the conversation\n\nolga left the conversation\n\n"
                           "max joined the conversation\n\nMax here.\n\n"), text


def test_what_the_user_has_not_seen_is_the_others_turns_after_their_last_turn():
    """The rule behind `X-Chatrun-Session`: others' turns after the last /v1 turn and after any
    user turn since (a message on the WebSocket showed the user what came before it); a failed
    attempt changed nothing. With the history, a user's turn since means a fork (None)."""
    from chatrun.server.openai_sessions import others_turns_since, trailing_others_turns

    def entry(turn: int, given: Any, ok: bool = True) -> dict:
        return {"turn": turn, "input": given, "ok": ok}

    decision = {"decision": {"kind": "approve", "item": "p1"}}
    history = [entry(1, "hi"), entry(2, decision), entry(3, "on the websocket"), entry(4, decision),
               entry(5, {"userMessage": "failed"}, ok=False), entry(5, {"decision": {"kind": "release"}})]
    assert [e["turn"] for e in trailing_others_turns(history, 1)] == [4, 5]
    assert [e["turn"] for e in trailing_others_turns(history, 3)] == [4, 5]
    assert trailing_others_turns(history, 5) == []
    assert others_turns_since(history, 1) is None  # turn 3 was a user's
    assert [e["turn"] for e in others_turns_since(history, 3) or []] == [4, 5]


def test_a_message_while_a_supervisor_decides_is_answered_with_what_the_user_was_told_and_never_lost(client, fake):
    ai = sdk(client)
    messages = [{"role": "user", "content": "refund A1001 80"}]
    told, first = chat(ai, "refunds", messages)
    messages += [{"role": "assistant", "content": told}, {"role": "user", "content": "it is urgent"}]
    asked = len(fake.requests)
    waiting, info = chat(ai, "refunds", messages)
    assert (info["session"], info["how"]) == (first["session"], "continued")
    assert waiting == f"Still waiting: {told}" and len(fake.requests) == asked  # no model call
    decided = client.post(f"/bots/refunds/sessions/{first['session']}/pending/p1", json={"decision": "approve"},
                          headers=SAM)
    assert decided.status_code == 200, decided.text
    # The model reads the queued message right after the call's result (the context follows).
    result, queued = [m for m in fake.requests[-1]["messages"] if m["role"] != "system"][-2:]
    assert result["role"] == "tool" and queued == {"role": "user", "content": "it is urgent"}
