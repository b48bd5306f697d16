"""Access control: tokens -> principals with roles, session ownership, route roles enforced."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

import chatrun
from chatrun.errors import ChatrunError
from chatrun.server.auth import Auth
from server_support import app_for_testclient, call, until_done, write_travel

AUTH = """
tokens:
  ana-token-123: {principal: ana, roles: [staff]}
  bob-token-456: {principal: bob}
"""
ANA = {"Authorization": "Bearer ana-token-123"}
BOB = {"Authorization": "Bearer bob-token-456"}


@pytest.fixture
def client(fake, tmp_path):
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path))], "memory://", auth=str(auth))
    with TestClient(app) as c:
        yield c


def test_http_requests_need_a_valid_token(client):
    assert client.get("/health").status_code == 200  # for load balancers
    r = client.get("/bots")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "token" in r.json()["message"]
    assert client.get("/bots", headers={"Authorization": "Bearer wrong-token"}).status_code == 401
    assert client.get("/bots", headers=ANA).status_code == 200
    assert client.get("/bots", headers={"X-API-Key": "bob-token-456"}).status_code == 200
    assert client.get("/bots?token=bob-token-456").status_code == 200


def test_websocket_without_a_valid_token_is_closed_with_4401_and_a_reason(client):
    for url in ("/_chat/routes", "/_chat/routes?token=nope"):
        with client.websocket_connect(url) as ws, pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 4401 and "unauthorized" in closed.value.reason
    with client.websocket_connect("/_chat/routes?token=bob-token-456") as ws:
        ws.send_json({"type": "Connect", "extensions": True, "chatId": "b1"})
        assert until_done(ws)[-1]["type"] == "Completed"


def test_a_session_belongs_to_its_principal(client, fake):
    with client.websocket_connect("/_chat/routes", headers=ANA) as ws:
        ws.send_json({"type": "Connect", "extensions": True, "chatId": "mine"})
        until_done(ws)
    assert client.get("/bots/travel/sessions/mine", headers=ANA).status_code == 200
    # Another principal's session answers exactly like an unknown id: no existence oracle.
    r = client.get("/bots/travel/sessions/mine", headers=BOB)
    unknown = client.get("/bots/travel/sessions/nobody-has-this", headers=BOB)
    assert r.status_code == unknown.status_code == 404 and r.json()["error"] == "SessionNotActive"
    assert r.json()["message"].replace("mine", "X") == unknown.json()["message"].replace("nobody-has-this", "X")
    assert client.post("/bots/travel/sessions/mine/messages", json={"userMessage": "hi"}, headers=BOB).status_code == 404
    assert client.delete("/bots/travel/sessions/mine", headers=BOB).status_code == 404
    with client.websocket_connect("/_chat/routes", headers=BOB) as ws:
        ws.send_json({"type": "Connect", "extensions": True, "chatId": "mine", "resume": True})
        error, failed = until_done(ws)
        assert failed["data"] == "SessionNotActive" and "no session 'mine'" in error["data"]
        ws.send_json({"type": "Connect", "extensions": True, "chatId": "mine"})
        assert until_done(ws)[-1]["data"] == "SessionExists"
    assert fake.requests == []


def test_another_principals_session_under_another_bots_path_answers_as_an_unknown_id(fake, tmp_path):
    # The bot check came before the owner check: "session mine belongs to bot 'travel', not 'other'"
    # told Bob that Ana's session exists, and on which bot (HTTP, /v1's session header alike).
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    travel = chatrun.load_bot(write_travel(tmp_path))
    other = tmp_path / "other.yaml"
    other.write_text((tmp_path / "travel.yaml").read_text().replace("name: travel", "name: other"))
    app = app_for_testclient([travel, chatrun.load_bot(other)], "memory://", auth=str(auth))
    with TestClient(app) as client:
        assert client.post("/bots/travel/sessions", json={"id": "mine"}, headers=ANA).status_code == 201
        unknown = client.get("/bots/other/sessions/nobody-has-this", headers=BOB).json()
        for r in (client.get("/bots/other/sessions/mine", headers=BOB),
                  client.post("/bots/other/sessions/mine/messages", json={"userMessage": "hi"}, headers=BOB)):
            assert r.status_code == 404, r.text
            assert r.json()["message"].replace("mine", "X") == unknown["message"].replace("nobody-has-this", "X")
        v1 = client.post("/v1/chat/completions", headers={**BOB, "X-Chatrun-Session": "mine"},
                         json={"model": "other", "messages": [{"role": "user", "content": "hi"}]})
        assert v1.status_code == 404 and "travel" not in v1.json()["error"]["message"], v1.text
        # its owner is still told where it belongs
        assert "belongs to bot 'travel'" in client.get("/bots/other/sessions/mine", headers=ANA).json()["message"]
    assert fake.requests == []


def test_a_route_with_roles_cannot_be_entered_without_one(client, fake):
    # Bob has no role: connecting on the lounge fails; a tool pushing it fails for the model.
    with client.websocket_connect("/_chat/routes", headers=BOB) as ws:
        ws.send_json({"type": "Connect", "extensions": True, "chatId": "b", "route": "lounge"})
        error, failed = until_done(ws)
        assert failed["data"] == "Forbidden" and "staff" in error["data"]
        ws.send_json({"type": "Connect", "extensions": True, "chatId": "b"})
        until_done(ws)
        fake.queue(call("vip_lounge"), {"text": "Sorry, the lounge is for staff."})
        ws.send_json({"type": "ChatRouteMessage", "chatId": "b", "data": {"userMessage": "lounge please"}})
        frames = until_done(ws)
    kinds = [f["type"] for f in frames]
    assert "Error" in kinds and "RouteChanged" not in kinds and kinds[-1] == "Completed"
    assert "lounge" in next(f["data"] for f in frames if f["type"] == "Error")
    tool_result = fake.requests[-1]["messages"][-1]
    assert tool_result["role"] == "tool" and "not allowed" in tool_result["content"] and "lounge" in tool_result["content"]
    assert client.get("/bots/travel/sessions/b", headers=BOB).json()["stack"] == ["main_menu"]
    # Ana is staff: she gets in.
    fake.queue(call("vip_lounge"), {"text": "Welcome to the lounge."})
    with client.websocket_connect("/_chat/routes", headers=ANA) as ws:
        ws.send_json({"type": "Connect", "extensions": True, "chatId": "a"})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "a", "data": {"userMessage": "lounge please"}})
        frames = until_done(ws)
    assert frames[0]["data"] == {"route": "lounge", "stack": ["main_menu", "lounge"]}


def test_auth_file_errors_name_the_problem(tmp_path, monkeypatch):
    bad = tmp_path / "auth.yaml"
    bad.write_text("tokens: {short: {principal: x}}")
    with pytest.raises(ChatrunError, match="at least 8 characters"):
        Auth.load(bad)
    bad.write_text("users: []")
    with pytest.raises(ChatrunError, match="needs a `tokens:` mapping"):
        Auth.load(bad)
    with pytest.raises(ChatrunError, match="cannot read the auth file"):
        Auth.load(tmp_path / "missing.yaml")
    bad.write_text("tokens: [\n")  # one line `file:line:col: ...`, not PyYAML's several
    with pytest.raises(ChatrunError, match=r"^\S+auth.yaml:2:1: the auth file is not valid: YAML syntax error: [^\n]*$"):
        Auth.load(bad)
    bad.write_text("tokens:\n  secret-token-1: {principal: a}\n  secret-token-1: {principal: b}\n")  # was: b silently
    with pytest.raises(ChatrunError, match=r"auth.yaml:3:3: the auth file is not valid: a token is given twice") as got:
        Auth.load(bad)
    assert "secret-token" not in str(got.value)
    bad.write_bytes(b"tokens: {\xff: 1}\n")  # was: UnicodeDecodeError, a traceback from `chatrun serve --auth`
    with pytest.raises(ChatrunError, match=r"auth.yaml:1: the auth file is not UTF-8 text \(byte 0xff\)"):
        Auth.load(bad)
    good = tmp_path / "good.yaml"
    good.write_text(AUTH)
    monkeypatch.setenv("CHATRUN_AUTH_FILE", str(good))
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path / "b"))], "memory://")
    assert app.state.auth.authenticate("bob-token-456").name == "bob"


@pytest.mark.slow
def test_another_principals_busy_session_answers_as_an_unknown_id_not_as_busy(fake, tmp_path):
    """The session's gate came before its owner check: while Ana's turn ran, Bob's request with
    `ifBusy: reject` on her session's id got 429 "running a turn" where an unknown id gets 404,
    telling him that the session exists and that she is using it right now."""
    import asyncio
    import threading

    import httpx

    from chatrun.server import create_app
    from server_support import ThreadServer

    running = threading.Event()
    release = threading.Event()

    def responder(body):
        running.set()
        release.wait(30)
        return {"text": "Done."}

    fake.responder = responder
    app = create_app([chatrun.load_bot(write_travel(tmp_path))], "memory://", auth=Auth.from_mapping(
        {"tokens": {"ana-token-123": "ana", "bob-token-456": "bob"}}))
    with ThreadServer(app) as server:

        async def run() -> tuple[httpx.Response, httpx.Response, httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                assert (await http.post("/bots/travel/sessions", json={"id": "mine"}, headers=ANA)).status_code == 201
                turn = asyncio.ensure_future(http.post("/bots/travel/sessions/mine/messages",
                                                       json={"userMessage": "hi"}, headers=ANA))
                await asyncio.to_thread(running.wait, 30)
                try:
                    bobs = await http.post("/bots/travel/sessions/mine/messages?ifBusy=reject",
                                           json={"userMessage": "hi"}, headers=BOB)
                    unknown = await http.post("/bots/travel/sessions/nobody-has-this/messages?ifBusy=reject",
                                              json={"userMessage": "hi"}, headers=BOB)
                    # Nor does Bob queue behind her turn (up to --queue-timeout) to learn the same
                    # from how long his 404 took: he gets it while her turn still runs.
                    queued = await asyncio.wait_for(http.get("/bots/travel/sessions/mine", headers=BOB), 20)
                    assert queued.status_code == 404 and not release.is_set(), queued.text
                    anas = await http.post("/bots/travel/sessions/mine/messages?ifBusy=reject",
                                           json={"userMessage": "again"}, headers=ANA)
                finally:
                    release.set()
                return bobs, unknown, anas, await turn

        bobs, unknown, anas, turn = asyncio.run(run())
    assert bobs.status_code == unknown.status_code == 404, bobs.text
    assert bobs.json()["message"].replace("mine", "X") == unknown.json()["message"].replace("nobody-has-this", "X")
    assert anas.status_code == 429 and "running a turn" in anas.json()["message"]  # its owner is told
    assert turn.status_code == 200 and len(fake.requests) == 1
