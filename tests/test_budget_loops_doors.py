"""The session's and the user's budgets when the unruly model calls a tool for ever, on the doors
where a conversation is made of separate requests: the HTTP API, `/v1` Chat Completions (the
history resent, the session header) and Responses (`previous_response_id`). Real parts: the app
on a real SQLite file, the real `openai` client against the fake OpenAI server, each model call
reporting its usage. A loop ends at the budget, before the call that would pass it; the turn is
rolled back and the user is told; what it used is counted, so the conversation's next message
is refused before any model call — and a front end that sends the failed message again, or
regenerates, does not start a fresh count. And on the doors of one connection: the WebSocket in
chatrun's dialect (as an app and as the chat page open it) and in Quarkus's, and AG-UI. The
phone is tests/test_phone_doors.py; the webhook channels tests/test_channel_conformance.py."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.definition.page_texts import BUILTIN
from chatrun.server.auth import Auth
from server_support import app_for_testclient, until_done

BOT = """\
name: counter
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
state: {count: 0}
limits: {max_model_calls: 40, LIMITS}
routes:
  main: {default: true, system: You count., tools: [bump]}
tools:
  bump:
    description: Count one more
    action: {set: {state.count: "{{ state.count + 1 }}"}, reply: "Counted {{ state.count }}."}
"""
SESSION_BUDGET = "max_session_tokens: 1000"
USER_BUDGET = "max_user_tokens: 1000"
AUTH = Auth.from_mapping({"tokens": {"token-ana-123": {"principal": "ana"}}})
LOOP = {"tool_calls": [{"name": "bump", "arguments": {}}],
        "usage": {"prompt_tokens": 390, "completion_tokens": 10, "total_tokens": 400}}
BUDGET = SESSION_BUDGET  # the one the test runs with (the fixture `client` sets it)
HELLO = {"text": "Hello.", "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}


def model(body: dict[str, Any]) -> dict[str, Any]:
    """"loop" makes the model call bump for ever (400 tokens a call); anything else is a greeting."""
    said = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return LOOP if "loop" in str(said) else HELLO


@pytest.fixture(params=[SESSION_BUDGET, USER_BUDGET], ids=["session-budget", "user-budget"])
def client(request, fake, write_bot, tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "BUDGET", request.param)
    fake.responder = model
    bot = chatrun.load_bot(write_bot(BOT.replace("LIMITS", request.param)))
    app = app_for_testclient([bot], f"sqlite:///{tmp_path / 's.db'}", auth=AUTH)
    with TestClient(app) as c:
        yield c


def sdk(client: TestClient, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="token-ana-123", http_client=client,
                         default_headers=headers, max_retries=0)


def loop_calls(fake) -> int:
    return sum(1 for body in fake.requests if "loop" in str(body["messages"]))


TOLD = {  # what the user reads of a turn a budget ended: the session's cannot go on, the user's renews
    SESSION_BUDGET: BUILTIN["en"]["session_budget_spent"],
    USER_BUDGET: BUILTIN["en"]["user_budget_spent"].split("{renews}")[0],
}


def failed_with_budget(call) -> None:
    """The request ends with a turn_failed whose message tells the user of the budget."""
    with pytest.raises(openai.InternalServerError) as failed:
        call()
    body = failed.value.body if isinstance(failed.value.body, dict) else {}
    assert body.get("code") == "turn_failed", body
    assert str(body.get("message")).startswith(TOLD[BUDGET]), body


def test_v1_history_resent_a_loop_ends_at_the_budget_and_sending_it_again_or_moving_on_calls_no_model(client, fake):
    ai = sdk(client)
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    answer = ai.chat.completions.create(model="counter", messages=messages)
    session = answer.model_extra["chatrun"]["session"]
    messages += [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "loop please"}]
    failed_with_budget(lambda: ai.chat.completions.create(model="counter", messages=messages))
    assert loop_calls(fake) == 3  # 400 tokens a call: the third passes the budget of 1000, the fourth is not sent
    asked = len(fake.requests)
    failed_with_budget(lambda: ai.chat.completions.create(model="counter", messages=messages))  # sent again
    regenerated = [*messages[:2], {"role": "user", "content": "hi again"}]  # the earlier message edited
    failed_with_budget(lambda: ai.chat.completions.create(model="counter", messages=regenerated))
    assert len(fake.requests) == asked, "a request after the budget was spent called the model"
    state = client.get(f"/bots/counter/sessions/{session}", headers={"Authorization": "Bearer token-ana-123"})
    assert state.json()["state"]["count"] == 0  # the failed turn rolled back


def test_v1_session_header_a_loop_ends_at_the_budget_and_the_next_message_calls_no_model(client, fake):
    ai = sdk(client, **{"X-Chatrun-Session": "own-1"})
    failed_with_budget(lambda: ai.chat.completions.create(model="counter", messages=[{"role": "user",
                                                                                    "content": "loop"}]))
    assert loop_calls(fake) == 3
    asked = len(fake.requests)
    failed_with_budget(lambda: ai.chat.completions.create(model="counter", messages=[{"role": "user",
                                                                                    "content": "hi"}]))
    assert len(fake.requests) == asked


def test_v1_previous_response_id_a_loop_ends_at_the_budget_and_the_next_message_calls_no_model(client, fake):
    ai = sdk(client)
    first = ai.responses.create(model="counter", input="hi")
    failed_with_budget(lambda: ai.responses.create(model="counter", input="loop", previous_response_id=first.id))
    assert loop_calls(fake) == 3
    asked = len(fake.requests)
    failed_with_budget(lambda: ai.responses.create(model="counter", input="loop", previous_response_id=first.id))
    failed_with_budget(lambda: ai.responses.create(model="counter", input="hi", previous_response_id=first.id))
    assert len(fake.requests) == asked


def test_http_a_loop_ends_at_the_budget_and_the_next_message_calls_no_model(client, fake):
    ana = {"Authorization": "Bearer token-ana-123"}
    assert client.post("/bots/counter/sessions", json={"id": "s1"}, headers=ana).status_code == 201
    for text in ("loop", "hi"):
        body = client.post("/bots/counter/sessions/s1/messages", json={"userMessage": text}, headers=ana).json()
        assert not body["ok"] and [e["type"] for e in body["events"]][-1] == "Error", body
        assert "past limits.max_" in body["events"][-1]["meta"]["detail"]
        assert body["events"][-1]["data"].startswith(TOLD[BUDGET])
    assert loop_calls(fake) == 3 and len(fake.requests) == loop_calls(fake)
    assert client.get("/bots/counter/sessions/s1", headers=ana).json()["state"]["count"] == 0


# -- the doors of one connection: the WebSocket (chatrun's dialect, the page's, Quarkus's) and AG-UI --

def ws_turn(ws, chat: str, text: str) -> list[dict[str, Any]]:
    ws.send_json({"type": "ChatRouteMessage", "chatId": chat, "data": {"userMessage": text}})
    return until_done(ws)


@pytest.mark.parametrize("path", ["/_chat/routes", "/bots/counter/_chat/routes?token=token-ana-123"],
                         ids=["websocket", "page"])
def test_websocket_a_loop_ends_at_the_budget_and_the_user_reads_why_then_the_next_message_calls_no_model(
        client, fake, path):
    """chatrun's dialect, as an app and as the chat page (app.js: the bot's path, the token in the
    query) open it: the loop's turn ends with an `Error` frame the user reads, the budget's text
    (not "try again"), then `Failed`; so does the next message, which calls no model."""
    headers = {} if "token=" in path else {"Authorization": "Bearer token-ana-123"}
    with client.websocket_connect(path, headers=headers) as ws:
        ws.send_json({"type": "Connect", "chatId": "ws-1", "extensions": True})
        until_done(ws)
        for text in ("loop", "hi"):
            frames = ws_turn(ws, "ws-1", text)
            errors = [f["data"] for f in frames if f["type"] == "Error"]
            assert frames[-1]["type"] == "Failed" and len(errors) == 1, frames
            assert errors[0].startswith(TOLD[BUDGET]), errors
    assert loop_calls(fake) == 3 and len(fake.requests) == 3


def test_quarkus_websocket_a_loop_ends_at_the_budget_and_the_history_says_why(client, fake):
    """The Quarkus dialect: a failed turn is `Failed("ServerError")` and nothing else (its client
    reads only the reason, docs/protocol.md); the text a page reads is the history's, the
    budget's; the next message fails too and calls no model."""
    with client.websocket_connect("/_chat/routes", headers={"Authorization": "Bearer token-ana-123"}) as ws:
        ws.send_json({"type": "Connect", "chatId": "q-1"})
        until_done(ws)
        for text in ("loop", "hi"):
            frames = ws_turn(ws, "q-1", text)
            assert [(f["type"], f["data"]) for f in frames if f["type"] in ("Failed", "Error")] == \
                [("Failed", "ServerError")], frames
    assert loop_calls(fake) == 3 and len(fake.requests) == 3
    history = client.get("/bots/counter/sessions/q-1", headers={"Authorization": "Bearer token-ana-123"})
    assert history.status_code == 200, history.text
    last = history.json()["history"][-1]
    assert last["ok"] is False, last
    assert [e["data"] for e in last["events"] if e["type"] == "Error"][0].startswith(TOLD[BUDGET]), last


def agui_run(client: TestClient, run: str, text: str) -> list[dict[str, Any]]:
    body = {"threadId": "agui-1", "runId": run, "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": [{"id": f"u-{run}", "role": "user", "content": text}]}
    answer = client.post("/agui/counter", json=body, headers={"Authorization": "Bearer token-ana-123",
                                                              "Accept": "text/event-stream"})
    assert answer.status_code == 200, answer.text
    return [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]


def test_agui_a_loop_ends_at_the_budget_and_the_user_reads_why_then_the_next_run_calls_no_model(client, fake):
    for run, text in (("r1", "loop"), ("r2", "hi")):
        frames = agui_run(client, run, text)
        errors = [f["message"] for f in frames if f["type"] == "RUN_ERROR"]
        assert len(errors) == 1 and errors[0].startswith(TOLD[BUDGET]), frames
    assert loop_calls(fake) == 3 and len(fake.requests) == 3
