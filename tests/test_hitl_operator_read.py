"""What the operator page reads (in process, the real openai client against the fake): a
principal with the role `operators` reads the resource and the inspector data of another
principal's session while it waits for someone, and after; never a session that waits for
nobody; a decider without the role `operators` never reads it. The page itself is served."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import chatrun
from hitl_support import SHOP, responder
from server_support import app_for_testclient

ANA = {"Authorization": "Bearer ana-token-123"}
SAM = {"Authorization": "Bearer sam-token-123"}  # operators, supervisor
AUTH = """
tokens:
  ana-token-123: {principal: ana}
  sam-token-123: {principal: sam, roles: [supervisor, operators]}
  sue-token-123: {principal: sue, roles: [supervisor]}
"""
SUE = {"Authorization": "Bearer sue-token-123"}


@pytest.fixture
def client(fake, tmp_path):
    fake.responder = responder
    (tmp_path / "auth.yaml").write_text(AUTH)
    app = app_for_testclient([chatrun.load_bot(SHOP / "shop.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             auth=str(tmp_path / "auth.yaml"))
    with TestClient(app) as c:
        yield c


def post(client, path, body, who):
    reply = client.post(path, json=body, headers=who)
    assert reply.status_code in (200, 201), reply.text
    return reply.json()


def test_an_operator_reads_a_waiting_session_and_its_inspector(client):
    post(client, "/bots/shop/sessions", {"id": "w1"}, ANA)
    post(client, "/bots/shop/sessions", {"id": "quiet"}, ANA)
    post(client, "/bots/shop/sessions/quiet/messages", {"userMessage": "hello"}, ANA)
    # Waiting for nobody: not the operator's to read (404, as for an unknown session).
    assert client.get("/bots/shop/sessions/quiet", headers=SAM).status_code == 404
    assert client.get("/bots/shop/sessions/quiet/inspect", headers=SAM).status_code == 404

    post(client, "/bots/shop/sessions/w1/messages", {"userMessage": "refund A7 80"}, ANA)
    read = client.get("/bots/shop/sessions/w1", headers=SAM)
    assert read.status_code == 200, read.text
    data = read.json()
    assert [i["id"] for i in data["pending"]] == ["p1"] and data["history"][0]["input"] == "refund A7 80"
    inspect = client.get("/bots/shop/sessions/w1/inspect", headers=SAM).json()
    assert any(c["function"]["name"] == "refund" for m in inspect["memory"]["messages"] for c in m.get("tool_calls") or ())
    # A supervisor decides the item but does not read the conversation.
    assert client.get("/bots/shop/sessions/w1", headers=SUE).status_code == 404
    assert client.get("/bots/shop/sessions/w1/inspect", headers=SUE).status_code == 404
    # Nor does an operator write in it as the user.
    assert client.post("/bots/shop/sessions/w1/messages", json={"userMessage": "hi"}, headers=SAM).status_code == 404

    post(client, "/bots/shop/sessions/w1/pending/p1", {"decision": "approve", "args": {"amount": 40}}, SUE)
    after = client.get("/bots/shop/sessions/w1", headers=SAM).json()  # resolved: still readable
    assert after["pending"] == [] and after["history"][-1]["input"]["decision"]["kind"] == "approve"


def test_the_operator_page_is_served(client):
    page = client.get("/operator")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for asset in ("/_chat/static/operator.js", "/_chat/static/pending.js"):
        assert asset in page.text and client.get(asset).status_code == 200
