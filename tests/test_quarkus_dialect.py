"""What a Quarkus client sees: a Connect without `"extensions": true` gets exactly the frames a
Quarkus Chat Scopes server sends for the same flow (docs/protocol.md, "Two dialects").
test_server.py covers the extension-aware side; test_quarkus_client.py the real Quarkus client."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

import chatrun
from server_support import app_for_testclient, call, check_frame, types, until_done, write_travel

EXTRA_TOOLS = """
  shout:
    description: Emit an application error event
    action: {emit: {Error: "the bot says no"}, immediate: true}
  leave:
    description: Pop (refused on the root scope)
    action: {pop: true}
"""


@pytest.fixture
def client(fake, tmp_path):
    path = write_travel(tmp_path / "bots")
    text = path.read_text().replace(
        "tools: [book_flight, vip_lounge, remember_name]", "tools: [book_flight, vip_lounge, remember_name, shout, leave]"
    )
    path.write_text(text + EXTRA_TOOLS)
    app = app_for_testclient([chatrun.load_bot(path)], f"sqlite:///{tmp_path / 'chat.db'}")
    with TestClient(app) as c:
        yield c


def connect(ws, chat_id="q1", **extra):
    ws.send_json({"type": "Connect", "chatId": chat_id, **extra})
    return until_done(ws)


def say(ws, text, chat_id="q1", scope_id=None):
    ws.send_json({"type": "ChatRouteMessage", "chatId": chat_id, "scopeId": scope_id, "data": {"userMessage": text}})
    return until_done(ws)


def test_a_streamed_reply_is_one_message_as_from_a_quarkus_string_route(client, fake):
    fake.queue({"chunks": ["Hel", "lo"]})
    with client.websocket_connect("/_chat/routes") as ws:
        assert connect(ws) == [{"chatId": "q1", "type": "Completed", "data": "q1.1"}]
        frames = say(ws, "hi", scope_id="q1.1")
    assert frames == [
        {"chatId": "q1", "type": "Message", "data": "Hello"},
        {"chatId": "q1", "type": "Completed", "data": "q1.1"},
    ]
    assert fake.requests[-1]["stream"] is True  # the model still streams (for the other clients)


def test_a_stream_to_quarkus_route_sends_stream_chunks_and_no_message(fake, tmp_path):
    path = write_travel(tmp_path / "bots")
    path.write_text(path.read_text().replace("  main_menu:\n", "  main_menu:\n    stream_to_quarkus: true\n", 1))
    fake.queue({"chunks": ["Hel", "lo"]})
    app = app_for_testclient([chatrun.load_bot(path)], f"sqlite:///{tmp_path / 'chat.db'}")
    with TestClient(app) as c, c.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        frames = say(ws, "hi", scope_id="q1.1")
    assert frames == [
        {"chatId": "q1", "type": "Stream", "data": "Hel"},
        {"chatId": "q1", "type": "Stream", "data": "lo"},
        {"chatId": "q1", "type": "Completed", "data": "q1.1"},
    ]


def test_push_and_pop_send_no_route_changed(client, fake):
    fake.queue(
        call("book_flight"), call("set_destination", destination="Dublin"), {"text": "When?"},
        call("set_departure", date="2026-07-01"), call("book"),
    )
    with client.websocket_connect("/_chat/routes") as ws:
        root = connect(ws)[-1]["data"]
        first = say(ws, "fly", scope_id=root)
        second = say(ws, "July 1st", scope_id=first[-1]["data"])
    assert [f["type"] for f in first] == ["Thinking", "Message", "Completed"]
    assert first[-1]["data"] != root
    assert [f["type"] for f in second] == ["Thinking", "Message", "Completed"]  # an action's message: no stream
    assert second[-1]["data"] == root


def test_failures_use_quarkus_reasons_and_send_no_error_frame(client, fake):
    with client.websocket_connect("/_chat/routes") as ws:
        assert connect(ws, "bad", route="nowhere") == [{"chatId": "bad", "type": "Failed", "data": "Route not found"}]
        connect(ws)
        fake.queue({"text": "ok"})
        stale = say(ws, "hi", scope_id="q1.99")
        assert stale == [{"chatId": "q1", "type": "Failed", "data": "SessionNotActive"}]
        assert say(ws, "hi", chat_id="stranger") == [{"chatId": "stranger", "type": "Failed", "data": "SessionNotActive"}]
        ws.send_text("not json")
        assert until_done(ws) == [{"chatId": None, "type": "Failed", "data": "BadRequest"}]
        ws.send_text(json.dumps({"type": "Hello", "chatId": "q1"}))
        assert until_done(ws) == [{"chatId": "q1", "type": "Failed", "data": "BadRequest"}]


def test_a_failed_turn_ends_with_failed_server_error_and_is_rolled_back(client, fake):
    fake.queue(call("book_flight"), {"status": 400, "body": {"error": {"message": "boom"}}})
    with client.websocket_connect("/_chat/routes") as ws:
        root = connect(ws)[-1]["data"]
        assert say(ws, "fly", scope_id=root) == [{"chatId": "q1", "type": "Failed", "data": "ServerError"}]
    session = client.get("/bots/travel/sessions/q1").json()
    assert session["stack"] == ["main_menu"] and session["turn"] == 0
    assert "boom" in session["history"][-1]["error"]  # the reason is kept for the author


def test_disconnect_gets_no_frame(client, fake):
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        ws.send_json({"type": "Disconnect", "chatId": "q1"})
        ws.send_json({"type": "Disconnect", "chatId": "never-connected"})
        # The next frame on the socket is the answer to the next request.
        assert connect(ws, "q2") == [{"chatId": "q2", "type": "Completed", "data": "q2.1"}]
    assert client.get("/bots/travel/sessions/q1").status_code == 404


def test_chatruns_own_errors_stay_out_but_the_bots_error_events_go_out(client, fake):
    fake.queue(call("leave"), {"text": "I cannot leave the menu."}, call("shout"))
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        refused = say(ws, "leave")
        shouted = say(ws, "shout")
    # The refused root pop is told to the model only; its reply is the one Message.
    assert types(refused) == ["Message", "Completed"]
    assert shouted[:-1] == [{"chatId": "q1", "type": "Error", "data": "the bot says no"}]


def test_resume_without_extensions_is_answered_with_completed_only(client, fake):
    fake.queue(call("book_flight"), {"text": "Where to?"})
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        scope = say(ws, "fly")[-1]["data"]
    with client.websocket_connect("/_chat/routes") as ws:
        assert connect(ws, resume=True) == [{"chatId": "q1", "type": "Completed", "data": scope}]


def test_a_chat_that_asks_for_extensions_gets_them_beside_a_quarkus_chat(client, fake):
    fake.responder = lambda body: {"text": "echo"}
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws, "quarkus")
        connect(ws, "chatrun", extensions=True)
        assert types(say(ws, "a", chat_id="quarkus")) == ["Message", "Completed"]
        assert types(say(ws, "b", chat_id="chatrun")) == ["Stream", "Message", "Completed"]
        ws.send_json({"type": "Disconnect", "chatId": "chatrun"})
        assert until_done(ws) == [{"chatId": "chatrun", "type": "Completed", "data": None}]
    check_frame({"type": "Connect", "chatId": "x", "extensions": True})


def test_a_malformed_connect_that_asks_for_extensions_is_told_why(client, fake):
    # As a connection's first frame it was answered in the Quarkus dialect: a bare
    # Failed("BadRequest"), no word of which field was wrong, though the frame asked for extensions.
    with client.websocket_connect("/_chat/routes") as ws:
        assert connect(ws, "e1", extensions=True, locale=5) == [
            {"chatId": "e1", "type": "Error", "data": "Connect.locale must be a string (a locale such as de or pt-BR) or absent"},
            {"chatId": "e1", "type": "Failed", "data": "BadRequest"}]
    with client.websocket_connect("/_chat/routes") as ws:  # a Quarkus client's is answered as Quarkus would
        assert connect(ws, "q2", route=5) == [{"chatId": "q2", "type": "Failed", "data": "BadRequest"}]
    assert fake.requests == []
