"""`chatrun serve`: the /_chat/routes WebSocket (Quarkus Chat Scopes frames) and the HTTP API,
through the real app, the real engine, the real openai client and the fake OpenAI server."""

from __future__ import annotations

import json
import textwrap

import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.server import ServerLimits
from server_support import app_for_testclient, call, check_frame, types, until_done, write_travel


@pytest.fixture
def travel(tmp_path):
    return chatrun.load_bot(write_travel(tmp_path / "bots"))


@pytest.fixture
def client(fake, travel, tmp_path):
    app = app_for_testclient([travel], f"sqlite:///{tmp_path / 'chat.db'}")
    with TestClient(app) as c:
        yield c


def connect(ws, chat_id="c1", **extra):
    """Connect as an extension-aware client (chatrun's own); test_quarkus_dialect.py covers the default."""
    ws.send_json({"type": "Connect", "chatId": chat_id, "extensions": True, **extra})
    return until_done(ws)


def say(ws, text, chat_id="c1", scope_id=None, **extra):
    frame = {"type": "ChatRouteMessage", "chatId": chat_id, "data": {"userMessage": text}, **extra}
    if scope_id:
        frame["scopeId"] = scope_id
    ws.send_json(frame)
    return until_done(ws)


# -- the WebSocket protocol ----------------------------------------------------------------


def test_connect_is_answered_with_the_root_scope_and_a_turn_streams_then_completes(client, fake):
    fake.queue({"chunks": ["Hel", "lo ", "there"]})
    with client.websocket_connect("/_chat/routes") as ws:
        [done] = connect(ws)
        assert done == {"chatId": "c1", "type": "Completed", "data": "c1.1"}
        frames = say(ws, "hi", scope_id=done["data"], requestId=7)
    assert types(frames) == ["Stream", "Message", "Completed"]
    assert "".join(f["data"] for f in frames if f["type"] == "Stream") == "Hello there"
    assert frames[-2]["data"] == "Hello there"
    assert frames[-1]["data"] == "c1.1"
    assert all(f["requestId"] == 7 and f["chatId"] == "c1" for f in frames)
    assert fake.requests[0]["messages"][-1] == {"role": "user", "content": "hi"}


def test_a_full_booking_pushes_a_scope_and_pops_back(client, fake):
    fake.queue(
        call("book_flight"),
        call("set_destination", destination="Dublin"),
        {"text": "When do you leave?"},
        call("set_departure", date="2026-07-01"),
        call("book"),
    )
    with client.websocket_connect("/_chat/routes") as ws:
        root = connect(ws)[-1]["data"]
        first = say(ws, "I want to fly to Dublin", scope_id=root)
        assert types(first) == ["RouteChanged", "Thinking", "Stream", "Message", "Completed"]
        assert first[0]["data"] == {"route": "flight", "stack": ["main_menu", "flight"]}
        assert first[1]["data"] == "Destination set to Dublin"
        flight_scope = first[-1]["data"]
        assert flight_scope != root and flight_scope.startswith("c1.")
        second = say(ws, "July 1st", scope_id=flight_scope)
    assert [f["type"] for f in second] == ["Thinking", "Message", "RouteChanged", "Completed"]
    assert second[1]["data"] == "Your flight to Dublin on 2026-07-01 is booked."
    assert second[2]["data"] == {"route": "main_menu", "stack": ["main_menu"]}
    assert second[-1]["data"] == root
    # The flight route's prompt saw the reservation being built.
    assert '"destination": "Dublin"' in fake.requests[2]["messages"][0]["content"]


def test_malformed_frames_get_error_and_failed_and_the_connection_stays_usable(client, fake):
    bad = [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"type": "Hello", "chatId": "c1"}), "unknown frame type 'Hello'"),
        (json.dumps({"type": "Connect"}), "needs a chatId"),
        (json.dumps({"type": "Connect", "chatId": ".."}), "not '.' or '..'"),
        (json.dumps({"type": "Connect", "chatId": "c1", "route": 5}), "route must be a string"),
        (json.dumps({"type": "ChatRouteMessage", "chatId": "c1", "data": "hi"}), "data must be a JSON object"),
        (json.dumps({"type": "ChatRouteMessage", "chatId": "c1", "data": {"userMessage": 3}}), "userMessage must be a string"),
        ("[" * 5000 + "]" * 5000, "nested too deeply"),
        ('{"type": "ChatRouteMessage", "chatId": "c1", "data": {"v": ' + "[" * 100 + "]" * 100 + "}}", "nested deeper than 64"),
        ('{"type": "ChatRouteMessage", "chatId": "c1", "data": {"v": NaN}}', "NaN is not a JSON number"),
        (json.dumps({"type": "Connect", "chatId": "c1", "resume": "false"}), "Connect.resume must be true or false"),
        (json.dumps({"type": "Disconnect", "chatId": "c1", "keep": 1}), "Disconnect.keep must be true or false"),
        (json.dumps({"type": "Connect", "chatId": "c1", "requestId": {"x": 1}}), "requestId must be a string or an integer"),
    ]
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws, "c0")  # an extension-aware connection: malformed frames get an Error saying why
        for text, expected in bad:
            ws.send_text(text)
            error, failed = until_done(ws)
            assert error["type"] == "Error" and expected in error["data"], (text, error)
            assert failed["type"] == "Failed" and failed["data"] == "BadRequest"
        ws.send_bytes(b"\x00\x01")
        assert [f["data"] for f in until_done(ws)][-1] == "BadRequest"
        fake.queue({"text": "still here"})
        assert connect(ws)[-1]["type"] == "Completed"
        assert say(ws, "hello")[-2]["data"] == "still here"


def test_requests_that_cannot_be_served_fail_with_the_quarkus_reasons(client, fake):
    with client.websocket_connect("/_chat/routes") as ws:
        assert say(ws, "hi", chat_id="nobody")[-1] == {"chatId": "nobody", "type": "Failed", "data": "SessionNotActive"}
        error, failed = connect(ws, "c2", route="nowhere")
        assert failed["data"] == "RouteNotFound" and "nowhere" in error["data"] and "main_menu" in error["data"]
        assert connect(ws, "c3", resume=True)[-1]["data"] == "SessionNotActive"
        assert connect(ws, "c4", bot="other")[-1]["data"] == "BotNotFound"
        connect(ws, "c5")
        assert connect(ws, "c5")[-1]["data"] == "SessionExists"
        # A failed Connect leaves nothing behind: the chat is not usable.
        assert say(ws, "hi", chat_id="c2")[-1]["data"] == "SessionNotActive"
        fake.queue({"text": "ok"})
        assert say(ws, "hi", chat_id="c5", scope_id="c5.99")[-1]["data"] == "ScopeNotActive"


def test_connect_on_a_named_route(client, fake):
    fake.queue({"text": "Where to?"})
    with client.websocket_connect("/_chat/routes") as ws:
        assert connect(ws, route="flight")[-1]["data"] == "c1.1"
        say(ws, "hello")
    assert fake.requests[0]["messages"][0]["content"].startswith("Reservation so far")


def test_several_chats_share_one_connection(client, fake):
    fake.responder = lambda body: {"text": "echo " + body["messages"][-1]["content"]}
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws, "a")
        connect(ws, "b")
        assert say(ws, "one", chat_id="a")[-2] == {"chatId": "a", "type": "Message", "data": "echo one"}
        assert say(ws, "two", chat_id="b")[-2] == {"chatId": "b", "type": "Message", "data": "echo two"}
    a = client.get("/bots/travel/sessions/a").json()
    assert [h["input"] for h in a["history"]] == ["one"]


def test_closing_the_socket_keeps_the_session_and_resume_continues_it(client, fake):
    fake.queue(call("book_flight"), {"text": "Where to?"})
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        scope = say(ws, "I want a flight")[-1]["data"]
    with client.websocket_connect("/_chat/routes") as ws:
        frames = connect(ws, resume=True)
        assert [f["type"] for f in frames] == ["RouteChanged", "Completed"]
        data = frames[0]["data"]
        last = data.pop("lastTurn")  # the last committed turn, so a client knows what was taken
        assert data == {"route": "flight", "stack": ["main_menu", "flight"]}
        assert {k: last[k] for k in ("turn", "input", "requestId")} == {"turn": 1, "input": "I want a flight", "requestId": None}
        assert frames[-1]["data"] == scope
        fake.queue({"text": "Noted"})
        assert say(ws, "Dublin", scope_id=scope)[-2]["data"] == "Noted"
    # The flight memory kept the first turn.
    assert [m["role"] for m in fake.requests[-1]["messages"]] == ["system", "user", "assistant", "user"]


def test_disconnect_ends_the_session_unless_keep(client, fake):
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws, "gone")
        connect(ws, "kept")
        ws.send_json({"type": "Disconnect", "chatId": "gone"})
        assert until_done(ws) == [{"chatId": "gone", "type": "Completed", "data": None}]
        ws.send_json({"type": "Disconnect", "chatId": "kept", "keep": True})
        assert until_done(ws)[-1]["type"] == "Completed"
        assert say(ws, "hi", chat_id="kept")[-1]["data"] == "SessionNotActive"  # detached from this socket
    assert client.get("/bots/travel/sessions/gone").status_code == 404
    assert client.get("/bots/travel/sessions/kept").status_code == 200


def test_a_failed_turn_sends_error_then_failed_server_error_and_changes_nothing(client, fake):
    fake.queue(call("book_flight"), {"status": 400, "body": {"error": {"message": "bad request"}}})
    with client.websocket_connect("/_chat/routes") as ws:
        root = connect(ws)[-1]["data"]
        frames = say(ws, "fly")
        assert [f["type"] for f in frames][-2:] == ["Error", "Failed"]
        assert frames[-1]["data"] == "ServerError"  # as Quarkus ends a failing route: the promise rejects
        assert frames[-2]["data"] == chatrun.events.MODEL_FAILED_TEXT  # no endpoint, no status for users
        session = client.get("/bots/travel/sessions/c1").json()
        assert "the model failed" in session["history"][-1]["error"]  # the author's detail
        assert session["stack"] == ["main_menu"] and session["turn"] == 0  # the push was rolled back
        assert session["history"][-1]["ok"] is False
        fake.queue({"text": "back at the menu"})
        assert say(ws, "hi", scope_id=root)[-1] == {"chatId": "c1", "type": "Completed", "data": root}


def test_every_frame_of_a_turn_matches_the_published_schema(client, fake):
    fake.queue(call("remember_name", name="Ana"), {"text": "Hi Ana"})
    with client.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        frames = say(ws, "I'm Ana")  # until_done checks each frame against the schema
    assert frames[-2]["data"] == "Hi Ana"
    for client_frame in (
        {"type": "Connect", "chatId": "x", "route": "flight", "resume": True, "bot": "travel", "requestId": 1},
        {"type": "ChatRouteMessage", "chatId": "x", "scopeId": "x.1", "data": {"userMessage": "hi", "extra": 1}},
        {"type": "Disconnect", "chatId": "x", "keep": True},
    ):
        check_frame(client_frame)


def test_per_bot_websocket_paths(fake, tmp_path):
    hello = tmp_path / "hello.yaml"
    hello.write_text("name: hello\nroutes:\n  start: {default: true, system: Say hello.}\n")
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path)), chatrun.load_bot(hello)], "memory://")
    fake.responder = lambda body: {"text": body["messages"][0]["content"]}
    with TestClient(app) as c:
        with c.websocket_connect("/bots/hello/_chat/routes") as ws:
            connect(ws)
            assert say(ws, "hi")[-2]["data"] == "Say hello."
        with c.websocket_connect("/_chat/routes") as ws:
            connect(ws, "t", bot="hello")
            assert say(ws, "hi", chat_id="t")[-2]["data"] == "Say hello."
            connect(ws, "u")
            assert say(ws, "hi", chat_id="u")[-2]["data"].startswith("You are a travel agent")
        assert c.get("/bots/hello/sessions/c1").json()["route"] == "start"
        assert c.get("/bots").json()[1]["name"] == "hello"


# -- limits ----------------------------------------------------------------------------------


def test_limits_on_frame_size_message_length_and_requests_in_flight(fake, travel):
    limits = ServerLimits(max_frame_bytes=2000, max_message_chars=100, max_in_flight=1)
    app = app_for_testclient([travel], "memory://", limits=limits)
    with TestClient(app) as c, c.websocket_connect("/_chat/routes") as ws:
        connect(ws)
        ws.send_text(json.dumps({"type": "ChatRouteMessage", "chatId": "c1", "data": {"userMessage": "x" * 3000}}))
        error, failed = until_done(ws)
        assert failed["data"] == "TooLarge" and "limit of 2000 bytes" in error["data"]
        error, failed = say(ws, "y" * 101)
        assert failed["data"] == "TooLarge" and "101 characters" in error["data"] and "100" in error["data"]
        fake.queue({"text": "slow", "delay": 0.5})
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "data": {"userMessage": "a"}, "requestId": 1})
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "data": {"userMessage": "b"}, "requestId": 2})
        frames = []
        while len([f for f in frames if f["type"] in ("Completed", "Failed")]) < 2:
            frames.append(check_frame(ws.receive_json()))
        second = [f for f in frames if f.get("requestId") == 2]
        assert [f["type"] for f in second] == ["Error", "Failed"] and second[-1]["data"] == "TooManyRequests"
        assert "in flight" in second[0]["data"]
        assert [f["type"] for f in frames if f.get("requestId") == 1][-1] == "Completed"
        r = c.post("/bots/travel/sessions/c1/messages", json={"userMessage": "z" * 101})
        assert r.status_code == 413 and r.json()["error"] == "TooLarge"
    limits = ServerLimits(max_chats_per_connection=2)
    with TestClient(app_for_testclient([travel], "memory://", limits=limits)) as c, c.websocket_connect("/_chat/routes") as ws:
        connect(ws, "a")
        connect(ws, "b")
        error, failed = connect(ws, "c")
        assert failed["data"] == "TooManyRequests" and "2 chats" in error["data"]
        ws.send_json({"type": "Disconnect", "chatId": "a"})
        until_done(ws)
        assert connect(ws, "c")[-1]["type"] == "Completed"


# -- HTTP --------------------------------------------------------------------------------------


def test_http_session_lifecycle(client, fake):
    assert client.get("/health").json()["status"] == "ok"
    created = client.post("/bots/travel/sessions", json={"id": "h1", "state": {"traveller_name": "Ana"}})
    assert created.status_code == 201
    assert created.json()["route"] == "main_menu" and created.json()["scopeId"] == "h1.1"
    assert client.post("/bots/travel/sessions", json={"id": "h1"}).status_code == 409
    fake.queue(call("book_flight"), {"text": "Where to, Ana?"})
    reply = client.post("/bots/travel/sessions/h1/messages", json={"userMessage": "a flight please"}).json()
    assert reply["ok"] is True and reply["stack"] == ["main_menu", "flight"] and reply["turn"] == 1
    assert [e["type"] for e in reply["events"]] == ["RouteChanged", "Message"]
    read = client.get("/bots/travel/sessions/h1").json()
    assert read["route"] == "flight" and read["state"]["traveller_name"] == "Ana"
    assert read["visible"]["scope"] == {"reservation": {"departure": None, "destination": None}}
    assert [h["input"] for h in read["history"]] == ["a flight please"]
    assert client.delete("/bots/travel/sessions/h1").status_code == 204
    assert client.get("/bots/travel/sessions/h1").status_code == 404
    assert client.post("/bots/travel/sessions/h1/messages", json={"userMessage": "x"}).status_code == 404


def test_http_errors_are_json_that_say_what_is_wrong(client):
    r = client.post("/bots/travel/sessions", content=b"{oops", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["message"]
    for body, expected in [(b'{"id": "n1", "state": {"x": NaN}}', "NaN is not a JSON number"),
                           (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
                           (b'{"state": {"a": ' + b"[" * 300 + b"]" * 300 + b"}}", "nested deeper than 64")]:
        r = client.post("/bots/travel/sessions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and expected in r.json()["message"], r.text
    assert client.get("/bots/travel/sessions/n1").status_code == 404  # nothing was created
    r = client.post("/bots/travel/sessions", json={"route": "nowhere"})
    assert r.status_code == 404 and r.json()["error"] == "RouteNotFound"
    assert client.get("/bots/nope").status_code == 404
    r = client.get("/no/such/path")
    assert r.status_code == 404 and r.json()["error"] == "NotFound"
    r = client.post("/bots/travel/sessions/x/messages?stream=maybe", json={"userMessage": "hi"})
    assert r.status_code == 400 and r.json()["error"] == "BadRequest" and "stream" in r.json()["message"]
    for bad_id, expected in [(0, "non-empty string"), ("a/b", "no '/'"), ("x" * 200, "at most 128"),
                             (".", "not '.' or '..'"), ("..", "not '.' or '..'")]:
        r = client.post("/bots/travel/sessions", json={"id": bad_id})
        assert r.status_code == 400 and expected in r.json()["message"], r.text
    assert client.get("/docs").status_code == 200
    assert "/bots/{bot}/sessions/{session_id}/messages" in client.get("/openapi.json").json()["paths"]


def test_http_server_sent_events(client, fake):
    client.post("/bots/travel/sessions", json={"id": "s1"})
    fake.queue({"chunks": ["Bon", "jour"]})
    with client.stream("POST", "/bots/travel/sessions/s1/messages?stream=true", json={"userMessage": "hi"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = r.read().decode()
    events = [block.split("\n") for block in body.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in events]
    assert names == ["Stream", "Stream", "Message", "Completed"]
    assert json.loads(events[-1][1].removeprefix("data: "))["data"] == "s1.1"
    r = client.post("/bots/travel/sessions/nope/messages", json={"userMessage": "hi"}, headers={"accept": "text/event-stream"})
    assert r.status_code == 404


def test_inspector_shows_graph_scopes_and_the_memory_as_the_model_sees_it(client, fake):
    fake.queue(call("book_flight"), call("set_destination", destination="Oslo"), {"text": "When?"})
    client.post("/bots/travel/sessions", json={"id": "i1"})
    client.post("/bots/travel/sessions/i1/messages", json={"userMessage": "Oslo please"})
    data = client.get("/bots/travel/sessions/i1/inspect").json()
    assert data["stack"] == ["main_menu", "flight"] and data["scopeId"] == "i1.2"
    edges = {(e["from"], e["to"], e["kind"]) for e in data["graph"]["edges"]}
    assert ("main_menu", "flight", "push") in edges and ("flight", None, "pop") in edges
    assert [n["name"] for n in data["graph"]["nodes"] if n["roles"]] == ["lounge"]
    assert [s["route"] for s in data["scopes"]] == ["main_menu", "flight"]
    assert data["scopes"][1]["visible"]["reservation"]["destination"] == "Oslo"
    memory = data["memory"]
    assert memory["id"] == "i1.2#flight"
    # Exactly what the model was sent on its last call, plus its answer.
    assert memory["messages"][:-1] == fake.requests[-1]["messages"]
    assert memory["messages"][-1] == {"role": "assistant", "content": "When?"}
    assert [t["function"]["name"] for t in memory["tools"]] == ["set_destination", "set_departure", "book", "cancel"]


def test_the_inspect_endpoint_counts_each_messages_tokens(client, fake):
    """The inspector's data (not the page drawing it): one token count per message, as the
    session's counter counts it, their total, the window's maximum and the counter's name."""
    from chatrun.memory.tokens import estimate_counter, tiktoken_counter
    from chatrun.messages import SystemMessage, UserMessage

    fake.queue({"text": "Hello Ana."}, {"text": "Where to?"})
    client.post("/bots/travel/sessions", json={"id": "t1"})
    client.post("/bots/travel/sessions/t1/messages", json={"userMessage": "hi"})
    client.post("/bots/travel/sessions/t1/messages", json={"userMessage": "I would like to travel somewhere warm " * 8})
    memory = client.get("/bots/travel/sessions/t1/inspect").json()["memory"]
    tokens = memory["tokens"]
    assert [m["role"] for m in memory["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert len(tokens["messages"]) == 5 and tokens["total"] == sum(tokens["messages"])
    assert tokens["max_tokens"] is None  # main_menu keeps a message window: no token limit
    label = tokens["counter"]
    count = estimate_counter if label == "estimate" else tiktoken_counter(label.removesuffix(" (exact)"))
    kinds = {"system": SystemMessage, "user": UserMessage}
    for message, counted in zip(memory["messages"], tokens["messages"], strict=True):
        if message["role"] in kinds:
            assert counted == count(kinds[message["role"]](message["content"])), message
    short, long = tokens["messages"][1], tokens["messages"][3]
    assert long > 8 * short > 0


def test_the_page_and_the_javascript_client_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and 'data-bot="travel"' in page.text
    assert "/_chat/javascript/chatscopes.js" in page.text
    js = client.get("/_chat/javascript/chatscopes.js")
    assert js.status_code == 200 and "class ChatScopesClient" in js.text
    assert js.headers["content-type"].startswith("text/javascript")
    assert client.get("/bots/travel/").status_code == 200
    assert client.get("/bots/nope/").status_code == 404
    assert client.get("/_chat/static/app.js").status_code == 200


# -- the command -------------------------------------------------------------------------------


def test_serve_command_reports_bad_bots_and_auth_files_without_a_traceback(tmp_path):
    from click.testing import CliRunner

    from chatrun.cli import main

    runner = CliRunner()
    result = runner.invoke(main, ["serve", "--help"])
    assert result.exit_code == 0 and "--store" in result.output and "--auth" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nroutes: {}\n")
    result = runner.invoke(main, ["serve", str(bad)])
    assert result.exit_code == 1 and f"{bad}:1:1: error" in result.output and "invalid bot" in result.output
    assert "Traceback" not in result.output
    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens: {}\n")
    result = runner.invoke(main, ["serve", str(write_travel(tmp_path)), "--auth", str(auth), "--store", "memory://"])
    assert result.exit_code != 0 and "tokens:" in result.output and "Traceback" not in result.output


def test_sessions_evicted_from_the_live_cache_come_back_from_the_store(fake, travel, tmp_path):
    app = app_for_testclient([travel], f"sqlite:///{tmp_path / 'c.db'}", cache_size=1)
    fake.responder = lambda body: {"text": f"{len(body['messages'])} messages"}
    with TestClient(app) as c, c.websocket_connect("/_chat/routes") as ws:
        for chat in ("a", "b", "c"):
            connect(ws, chat)
        for _round in range(2):
            for chat in ("a", "b", "c"):
                say(ws, "hi", chat_id=chat)
        assert c.get("/health").json()["live_sessions"] <= 1
        # Each session's second turn saw its first: system + 2 messages + the new one.
        assert say(ws, "again", chat_id="a")[-2]["data"] == "6 messages"


def test_a_message_to_an_ended_conversation_fails_with_session_not_active(tmp_path, fake):
    """An `end` action ends the conversation: later messages fail cleanly, on both transports."""
    bot_file = tmp_path / "bot.yaml"
    bot_file.write_text(textwrap.dedent("""
        name: ender
        model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
        routes: {main: {default: true, system: Hi., tools: [bye]}}
        tools:
          bye: {description: End the chat, action: {end: true, message: Goodbye!}}
        """))
    fake.queue(call("bye"))
    app = app_for_testclient([chatrun.load_bot(bot_file)], "memory://")
    with TestClient(app) as client, client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": "e1", "extensions": True})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "e1", "data": {"userMessage": "bye"}})
        frames = until_done(ws)
        assert "ConversationEnded" in types(frames) and frames[-1]["type"] == "Completed"
        ws.send_json({"type": "ChatRouteMessage", "chatId": "e1", "data": {"userMessage": "still there?"}})
        frames = until_done(ws)
        assert frames[-1] == {"chatId": "e1", "type": "Failed", "data": "SessionNotActive"}
        assert "has ended" in frames[-2]["data"]
        reply = client.post("/bots/ender/sessions/e1/messages", json={"userMessage": "hello?"})
        assert reply.json()["error"] == "SessionNotActive"
        assert len(fake.requests) == 1  # no model call for the refused messages


POP_AT_ROOT = """
name: popper
routes:
  main:
    default: true
    system: Help.
    tools: [back]
tools:
  back:
    description: Go back
    action: {pop: true}
"""


def test_a_committed_turn_that_went_on_after_an_error_event_replies_ok_and_matches_its_schema(fake, write_bot):
    """A refused tool call (popping the root scope) sends an Error event, the model goes on and the
    turn commits: the reply's `ok` says committed, and /openapi.json documents the reply."""
    from jsonschema import Draft202012Validator

    with TestClient(app_for_testclient([chatrun.load_bot(write_bot(POP_AT_ROOT))], "memory://")) as c:
        c.post("/bots/popper/sessions", json={"id": "p1"})
        fake.queue(call("back"), {"text": "There is nothing to go back to."})
        reply = c.post("/bots/popper/sessions/p1/messages", json={"userMessage": "back"}).json()
        history = c.get("/bots/popper/sessions/p1").json()["history"]
        spec = c.get("/openapi.json").json()
    assert [e["type"] for e in reply["events"]] == ["Error", "Message"]
    assert history[-1]["ok"] is True and reply["ok"] is True and reply["turn"] == 1
    schema = spec["paths"]["/bots/{bot}/sessions/{session_id}/messages"]["post"]["responses"]["200"]["content"][
        "application/json"]["schema"]
    assert {"ok", "events", "turn", "replayed"} <= set(schema["required"])
    assert not list(Draft202012Validator(schema).iter_errors(reply))
    assert list(Draft202012Validator(schema).iter_errors({**reply, "ok": "yes"}))


def test_a_turn_with_no_message_lets_the_bot_speak_first_over_http_and_the_websocket(fake, write_bot):
    """docs/format.md, "A bot that speaks first": an empty input runs a turn whose model reads only
    its system prompt; the opening line is in the memory the user's first message follows."""
    bot = chatrun.load_bot(write_bot(POP_AT_ROOT))
    with TestClient(app_for_testclient([bot], "memory://")) as c:
        c.post("/bots/popper/sessions", json={"id": "g1"})
        fake.queue({"text": "Hello! How can I help?"}, {"text": "Sure."})
        opening = c.post("/bots/popper/sessions/g1/messages", json={}).json()
        c.post("/bots/popper/sessions/g1/messages", json={"userMessage": "help me"})
        fake.queue({"text": "Welcome back."})
        with c.websocket_connect("/_chat/routes") as ws:
            connect(ws, "g2")
            ws.send_json({"type": "ChatRouteMessage", "chatId": "g2", "data": {}})
            frames = until_done(ws)
    assert opening["ok"] is True and opening["turn"] == 1
    assert [(e["type"], e["data"]) for e in opening["events"]] == [("Message", "Hello! How can I help?")]
    assert [m["role"] for m in fake.requests[0]["messages"]] == ["system"]
    assert [m["role"] for m in fake.requests[1]["messages"]] == ["system", "assistant", "user"]
    assert [m["role"] for m in fake.requests[2]["messages"]] == ["system"]
    assert [f["data"] for f in frames if f["type"] == "Message"] == ["Welcome back."]


def test_a_turns_tool_calls_are_kept_in_its_history_entry_for_operators_views_only(fake, write_bot):
    with TestClient(app_for_testclient([chatrun.load_bot(write_bot(POP_AT_ROOT))], "memory://")) as c:
        c.post("/bots/popper/sessions", json={"id": "k1"})
        fake.queue(call("back"), {"text": "There is nothing to go back to."})
        c.post("/bots/popper/sessions/k1/messages", json={"userMessage": "back"})
        resource = c.get("/bots/popper/sessions/k1").json()
        inspected = c.get("/bots/popper/sessions/k1/inspect").json()
    [made] = inspected["last_turn"]["calls"]  # auth off: the author's own server shows them
    assert made["tool"] == "back" and made["route"] == "main" and made["args"] == {}
    assert "tried to pop the root scope" in made["error"] and "result" not in made
    assert "calls" not in resource["history"][0]  # the user's view of the history


def test_a_rating_or_a_notice_is_no_turn_to_the_session_readers(fake, write_bot):
    """A user's rating and a notice (Session.notice: a channel's user told something with no
    turn) are history entries without `turn`: the inspector's last turn and its usage list skip
    them (they showed the rating as the last turn, a `turn: null` row in the usage, and a session
    with only a notice as having run one); the session's resource lists the notice, no turn."""
    from chatrun.server.sessions import OPEN

    with TestClient(app_for_testclient([chatrun.load_bot(write_bot(POP_AT_ROOT))], "memory://")) as c:
        c.post("/bots/popper/sessions", json={"id": "k1"})
        fake.queue({"text": "Hello."})
        assert c.post("/bots/popper/sessions/k1/messages", json={"userMessage": "hi"}).status_code == 200
        assert c.post("/bots/popper/sessions/k1/feedback", json={"turn": 1, "rating": "up"}).status_code == 201
        inspected = c.get("/bots/popper/sessions/k1/inspect").json()
        registry = c.app.state.registry

        async def only_a_notice() -> None:
            async with registry.session("popper", "k2", None, OPEN) as session:
                await registry.turn(session, "x" * 9000, "d1").notice("Sorry, your message is too long.", "over the limit")

        c.portal.call(only_a_notice)
        resource = c.get("/bots/popper/sessions/k2")
        alone = c.get("/bots/popper/sessions/k2/inspect").json()
    assert inspected["last_turn"]["turn"] == 1 and inspected["last_turn"]["input"] == "hi"
    assert [u["turn"] for u in inspected["turns_usage"]] == [1]
    assert resource.status_code == 200, resource.text
    assert resource.json()["turn"] == 0 and resource.json()["lastTurn"] is None
    assert [e["notice"]["text"] for e in resource.json()["history"]] == ["Sorry, your message is too long."]
    assert alone["last_turn"] is None and alone["turns_usage"] == []
