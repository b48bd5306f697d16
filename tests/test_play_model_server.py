"""Playing the model over the WebSocket (issue 35, "the page with no model"): with no model key
configured, a turn frame with "playModel" makes each model call a ModelRequest frame, and the
client's ModelAnswer (text, or a tool call) is what the model answered; the turn goes on through
the real engine (tools, actions, commit). Only the author may play; Cancel stops a waiting turn;
nobody answering in time fails the turn with a clear message. Real server app (Starlette's
TestClient over the ASGI WebSocket), real engine, real store; no model endpoint at all."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import chatrun
from server_support import app_for_testclient, check_frame, until_done, write_travel

AUTH = """
tokens:
  ana-token: {principal: ana, roles: [authors]}
  bob-token: {principal: bob}
"""


@pytest.fixture
def no_model(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHATRUN_MODEL_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def client(no_model, tmp_path):
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path))], "memory://")
    with TestClient(app) as c:
        yield c


def connect(ws, chat: str = "c1") -> None:
    ws.send_json({"type": "Connect", "chatId": chat, "extensions": True})
    assert until_done(ws)[-1]["type"] == "Completed"


def next_frame(ws) -> dict:
    return check_frame(ws.receive_json())


def model_request(ws) -> dict:
    """Frames up to the next ModelRequest (its data)."""
    while True:
        frame = next_frame(ws)
        if str(frame.get("requestId")).startswith("a-"):  # an earlier ModelAnswer's own Completed
            assert frame["type"] == "Completed", frame
            continue
        assert frame["type"] not in ("Completed", "Failed"), frame
        if frame["type"] == "ModelRequest":
            return frame


def finish(ws, request_id: str) -> list[dict]:
    """Frames up to the end (Completed or Failed) of request `request_id`."""
    frames = []
    while not frames or frames[-1]["type"] not in ("Completed", "Failed") or frames[-1].get("requestId") != request_id:
        frames.append(next_frame(ws))
    return frames


def answer(ws, ask: str, **fields) -> None:
    ws.send_json({"type": "ModelAnswer", "chatId": "c1", "requestId": f"a-{ask}", "ask": ask, **fields})


def test_the_author_answers_as_the_model_with_text_and_it_is_the_bots_reply(client):
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m1", "playModel": "auto",
                      "data": {"userMessage": "hello"}})
        asked = model_request(ws)
        data = asked["data"]
        assert asked["requestId"] == "m1" and data["route"] == "main_menu"
        assert data["system"].startswith("You are a travel agent")
        assert data["messages"][-1] == {"role": "user", "content": "hello"}
        assert {t["name"] for t in data["tools"]} == {"book_flight", "vip_lounge", "remember_name"}
        assert "OPENAI_API_KEY" in data["why"]  # why the page is asked: no model can be reached
        answer(ws, data["ask"], text="Hello! Where to?")
        frames = finish(ws, "m1")
        ends = {f["requestId"]: f["type"] for f in frames if f["type"] in ("Completed", "Failed")}
        assert ends == {"a-" + data["ask"]: "Completed", "m1": "Completed"}
        messages = [f["data"] for f in frames if f["type"] == "Message"]
        assert messages == ["Hello! Where to?"]
    history = client.get("/bots/travel/sessions/c1").json()["history"]
    assert history[0]["ok"] is True and history[0]["model"] == [{"text": "Hello! Where to?"}]


def test_a_tool_call_answer_runs_the_tool_and_the_model_is_asked_again(client):
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m1", "playModel": "auto",
                      "data": {"userMessage": "I am Olga"}})
        first = model_request(ws)["data"]
        answer(ws, first["ask"], tool="remember_name", arguments={"name": "Olga"})
        # The model is asked again, reading the tool's result ("Noted", the action's reply).
        again = model_request(ws)["data"]
        assert again["messages"][-1]["role"] == "tool" and again["messages"][-1]["content"] == "Noted"
        assert again["system"] == "You are a travel agent. Help Olga."  # the tool's effect, as the model sees it
        answer(ws, again["ask"], text="Nice to meet you, Olga.")
        frames = finish(ws, "m1")
        assert frames[-1]["type"] == "Completed"
        assert [f["data"] for f in frames if f["type"] == "Message"] == ["Nice to meet you, Olga."]
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m2", "playModel": "auto",
                      "data": {"userMessage": "book a flight"}})
        second = model_request(ws)["data"]
        answer(ws, second["ask"], tool="book_flight")
        # book_flight pushes the flight route and runs it: the model is asked there, with its tools.
        third = model_request(ws)["data"]
        assert third["route"] == "flight"
        assert {t["name"] for t in third["tools"]} == {"set_destination", "set_departure", "book", "cancel"}
        answer(ws, third["ask"], text="Where do you fly to?")
        assert finish(ws, "m2")[-1]["type"] == "Completed"
    session = client.get("/bots/travel/sessions/c1").json()
    assert session["route"] == "flight" and session["state"]["traveller_name"] == "Olga"


def test_without_play_model_the_turn_fails_as_before(client):
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m1", "data": {"userMessage": "hi"}})
        frames = until_done(ws)
        assert frames[-1] == {"chatId": "c1", "type": "Failed", "data": "ServerError", "requestId": "m1"}
        assert not any(f["type"] == "ModelRequest" for f in frames)


def test_cancel_stops_a_turn_waiting_for_the_author(client):
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m1", "playModel": "always",
                      "data": {"userMessage": "hello"}})
        ask = model_request(ws)["data"]["ask"]
        ws.send_json({"type": "Cancel", "chatId": "c1", "requestId": "x"})
        frames = finish(ws, "m1")
        ends = {f["requestId"]: (f["type"], f["data"]) for f in frames if f["type"] in ("Completed", "Failed")}
        assert ends == {"x": ("Completed", None), "m1": ("Failed", "Cancelled")}
        answer(ws, ask, text="too late")  # the call is no longer waiting
        late = until_done(ws)
        assert late[-1]["type"] == "Failed" and late[-1]["data"] == "NotPending"
        assert f"no model call '{ask}' waits" in late[0]["data"]


def test_a_bad_answer_is_refused_and_the_call_still_waits(client):
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m1", "playModel": "auto",
                      "data": {"userMessage": "hello"}})
        ask = model_request(ws)["data"]["ask"]
        answer(ws, ask, tool="remember_name", arguments="[1]")
        refused = until_done(ws)
        assert refused[-1]["data"] == "BadRequest" and "arguments must be a JSON object" in refused[0]["data"]
        answer(ws, ask, text="Hi")
        frames = finish(ws, "m1")
        assert [f["data"] for f in frames if f["type"] == "Message"] == ["Hi"]


def test_nobody_answering_in_time_fails_the_turn_clearly(no_model, tmp_path):
    from chatrun.server.wire import ServerLimits

    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path))], "memory://",
                             limits=ServerLimits(model_answer_timeout=0.2))
    with TestClient(app) as client:
        play_until_timeout(client)
        [entry] = client.get("/bots/travel/sessions/c1").json()["history"]
        assert entry["ok"] is False and "nobody answered as the model" in entry["error"]


def play_until_timeout(client) -> None:
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m1", "playModel": "auto",
                      "data": {"userMessage": "hello"}})
        model_request(ws)
        frames = finish(ws, "m1")
        assert frames[-1]["data"] == "ServerError"
        errors = [f["data"] for f in frames if f["type"] == "Error"]
        assert any("nobody answered as the model within 0.2 seconds" in e for e in errors), errors


def test_only_an_author_plays_the_model_when_auth_is_on(no_model, tmp_path):
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path))], "memory://", auth=str(auth))
    with TestClient(app) as client:
        with client.websocket_connect("/_chat/routes?token=bob-token") as ws:
            connect(ws)
            ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m1", "playModel": "always",
                          "data": {"userMessage": "hello"}})
            refused = until_done(ws)
            assert refused[-1]["data"] == "Forbidden"
            assert "principal bob needs the role `authors`" in refused[0]["data"]
            # "auto" is what every author page sends: from bob it is ignored, his turn runs as anyone's
            # (here no model can be reached, so it fails as it would without playModel), nobody is asked.
            ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m2", "playModel": "auto",
                          "data": {"userMessage": "hello"}})
            plain = until_done(ws)
            assert not [f for f in plain if f["type"] == "ModelRequest"]
            assert any(f["type"] == "Error" and "cannot answer right now" in str(f["data"]) for f in plain)
        with client.websocket_connect("/_chat/routes?token=ana-token") as ws:
            connect(ws, "c2")
            ws.send_json({"type": "ChatRouteMessage", "chatId": "c2", "requestId": "m1", "playModel": "auto",
                          "data": {"userMessage": "hello"}})
            ask = model_request(ws)["data"]["ask"]
            ws.send_json({"type": "ModelAnswer", "chatId": "c2", "ask": ask, "text": "Hi Ana"})
            frames = finish(ws, "m1")
            assert [f["data"] for f in frames if f["type"] == "Message"] == ["Hi Ana"]


def test_a_quarkus_dialect_chat_cannot_ask_to_play(client):
    with client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": "q1"})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "q1", "playModel": "auto", "data": {"userMessage": "x"}})
        assert until_done(ws)[-1]["data"] == "BadRequest"


def test_always_asks_the_author_even_with_a_model_configured(monkeypatch, tmp_path):
    # A configured model that is never called: an endpoint nobody listens on.
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path))], "memory://")
    with TestClient(app) as client, client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "requestId": "m1", "playModel": "always",
                      "data": {"userMessage": "hello"}})
        data = model_request(ws)["data"]
        assert "why" not in data  # a model could answer: the author chose to
        answer(ws, data["ask"], text="I am the model today.")
        frames = finish(ws, "m1")
        assert frames[-1]["type"] == "Completed"
        assert [f["data"] for f in frames if f["type"] == "Message"] == ["I am the model today."]
