"""A replica that lacks the version a session runs on (it serves only the new one): it answers
that session as a replica holding the version does, never as a session that does not exist.
Two apps on one SQLite file (one serving versions 1 and 2, one serving version 2 only), the
fake OpenAI server."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import chatrun
from server_support import app_for_testclient as create_app
from server_support import until_done
from test_versions_pending import ANA, AUTH, SUE, V1, V2, responder
from versions_support import write_versions

BUNDLE_KEY = "a-bundle-key-the-replicas-share-0123"  # both apps: what one publishes, the other loads
V2_PINNED = V2.replace("on_change: restart_scope", "on_change: pin")  # the pending tests' version 2, pinned


@pytest.fixture
def layout(tmp_path: Path, fake, monkeypatch) -> tuple[Path, str, str]:
    """(the bot's folder with versions 1 and 2, the store, the auth file)."""
    fake.responder = responder
    monkeypatch.setenv("CHATRUN_BUNDLE_KEY", BUNDLE_KEY)
    root = write_versions(tmp_path / "refunds", {"1": V1, "2": V2_PINNED})
    (tmp_path / "auth.yaml").write_text(AUTH)
    return root, f"sqlite:///{tmp_path / 's.db'}", str(tmp_path / "auth.yaml")


def test_a_decider_of_the_sessions_version_is_answered_alike_by_a_replica_that_lacks_it(layout):
    """Sue (a supervisor: version 1's approvals name her role, version 2 names none) decided p1 on
    the replica serving both versions; her decision sent again reaches the replica serving version
    2 only. It answered 404, as for a session she could never reach, because it checked who
    reaches the session against the versions it held, before it loaded the session's own."""
    root, store, auth = layout
    decide = {"decision": "approve"}
    with TestClient(create_app(str(root), store, auth=auth)) as both:
        started = both.post("/bots/refunds/sessions", json={"id": "s"}, headers={**ANA, "Chatrun-Bot-Version": "1"})
        assert started.status_code == 201, started.text
        asked = both.post("/bots/refunds/sessions/s/messages", json={"userMessage": "refund A7"}, headers=ANA).json()
        assert [e["data"]["id"] for e in asked["events"] if e["type"] == "Pending"] == ["p1"]
        assert both.post("/bots/refunds/sessions/s/pending/p1", json=decide, headers=SUE).status_code == 200
        late = both.post("/bots/refunds/sessions/s/pending/p1", json=decide, headers=SUE)
    assert late.status_code == 409 and late.json()["error"] == "NotPending", late.text
    with TestClient(create_app(str(root / "versions" / "2"), store, auth=auth)) as new_only:
        again = new_only.post("/bots/refunds/sessions/s/pending/p1", json=decide, headers=SUE)
        assert (again.status_code, again.json()) == (late.status_code, late.json())
        # she reaches the items, not the session (the owner's alone), on every replica
        assert new_only.get("/bots/refunds/sessions/s", headers=SUE).status_code == 404
        v1 = chatrun.load_bot(root / "versions" / "1").config.content_version
        assert new_only.get("/bots/refunds/sessions/s", headers=ANA).json()["botVersion"] == v1  # still pinned


def test_a_pinned_session_whose_version_a_replica_cannot_load_is_unavailable_on_every_door(layout, monkeypatch):
    """The replica serving version 2 only has no bundle key: it may not load version 1 from the
    store, and the session, pinned, cannot move. Every door answers that this replica cannot serve
    it now, naming the version, so that the request is sent again (to a replica that can): a 503
    with Retry-After, a Failed("Unavailable") on the WebSocket — never "no such session"."""
    root, store, auth = layout
    with TestClient(create_app(str(root), store, auth=auth)) as both:
        started = both.post("/bots/refunds/sessions", json={"id": "s"}, headers={**ANA, "Chatrun-Bot-Version": "1"})
        v1 = started.json()["botVersion"]
    monkeypatch.delenv("CHATRUN_BUNDLE_KEY")
    with TestClient(create_app(str(root / "versions" / "2"), store, auth=auth)) as new_only:
        for refused in (new_only.post("/bots/refunds/sessions/s/messages", json={"userMessage": "hi"}, headers=ANA),
                        new_only.get("/bots/refunds/sessions/s", headers=ANA)):
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
            assert refused.json()["error"] == "Unavailable" and f"version {v1} is not loaded" in refused.json()["message"]
        for extensions in (True, False):  # chatrun's dialect says why; Quarkus's has only the Failed frame
            with new_only.websocket_connect("/_chat/routes", headers=ANA) as ws:
                ws.send_json({"type": "Connect", "chatId": "s", "resume": True, "extensions": extensions})
                frames = until_done(ws)
            assert frames[-1] == {"chatId": "s", "type": "Failed", "data": "Unavailable"}
            assert [f["type"] for f in frames[:-1]] == (["Error"] if extensions else [])
            assert all(f"version {v1} is not loaded" in f["data"] for f in frames[:-1])
        chat = {"model": "refunds", "messages": [{"role": "user", "content": "hi"}]}
        for refused in (new_only.post("/v1/chat/completions", json=chat, headers={**ANA, "X-Chatrun-Session": "s"}),
                        new_only.post("/v1/responses", json={"model": "refunds", "input": "hi", "conversation": "s"},
                                      headers=ANA)):
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
            error = refused.json()["error"]
            assert error["code"] == "unavailable" and f"version {v1} is not loaded" in error["message"]
    with TestClient(create_app(str(root), store, auth=auth)) as again:  # not gone: a replica serving version 1 answers
        assert again.get("/bots/refunds/sessions/s", headers=ANA).json()["botVersion"] == v1
