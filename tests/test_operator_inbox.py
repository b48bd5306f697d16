"""Issue 35, the operator inbox over HTTP: the inbox's order (newest activity first, with each
session's last turn), canned replies in the session's locale, typing both ways, and the user
told "NAME joined / left the conversation" in their language. A real server app (TestClient),
a real SQLite store, the bakery bot with its German catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import chatrun
from server_support import app_for_testclient

BAKERY = Path(__file__).resolve().parents[1] / "bots" / "bakery"
AUTH = """
tokens:
  ana-token-123: {principal: ana}
  ben-token-123: {principal: ben}
  olga-token-12: {principal: olga, roles: [operators]}
"""
ANA, BEN, OLGA = ({"Authorization": f"Bearer {t}"} for t in ("ana-token-123", "ben-token-123", "olga-token-12"))
SESSION = "/bots/bakery/sessions/"


@pytest.fixture
def client(fake, tmp_path):
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    app = app_for_testclient([chatrun.load_bot(BAKERY)], f"sqlite:///{tmp_path}/s.db", auth=str(auth))
    with TestClient(app) as made:
        yield made


def messages(reply):
    return [e["data"] for e in reply.json()["events"] if e["type"] == "Message"]


def test_the_user_reads_who_joined_and_left_in_their_language(client):
    assert client.post("/bots/bakery/sessions", json={"id": "de1"}, headers=ANA | {"Accept-Language": "de"}).status_code == 201
    taken = client.post(SESSION + "de1/takeover", json={}, headers=OLGA)
    assert "olga ist dem Gespräch beigetreten" in messages(taken)
    left = client.post(SESSION + "de1/release", json={}, headers=OLGA)
    assert "olga hat das Gespräch verlassen" in messages(left)
    history = client.get(SESSION + "de1", headers=ANA).json()["history"]
    notices = [e["meta"] for h in history for e in h["events"] if e["type"] == "Message" and e.get("meta")]
    assert [n["notice"] for n in notices] == ["operator_joined", "operator_left"]


def test_canned_replies_come_in_the_sessions_locale_and_only_to_operators(client):
    client.post("/bots/bakery/sessions", json={"id": "de1"}, headers=ANA | {"Accept-Language": "de"})
    client.post("/bots/bakery/sessions", json={"id": "en1"}, headers=BEN | {"Accept-Language": "en"})
    german = client.get(SESSION + "de1/canned", headers=OLGA).json()["canned"]
    assert german[0] == {"name": "greeting", "text": "Guten Tag, hier ist der Bäcker. Wie kann ich helfen?"}
    english = client.get(SESSION + "en1/canned", headers=OLGA).json()["canned"]
    assert [c["text"] for c in english] == ["Hello, this is the baker. How can I help?", "Every loaf is baked this morning."]
    refused = client.get(SESSION + "de1/canned", headers=ANA)
    assert refused.status_code == 403 and "operators" in refused.json()["message"]


def test_typing_is_seen_both_ways_and_only_by_the_parties(client):
    client.post("/bots/bakery/sessions", json={"id": "s1"}, headers=ANA)
    client.post(SESSION + "s1/takeover", json={}, headers=OLGA)
    assert client.get(SESSION + "s1/typing", headers=ANA).json() == {"operator": None, "user": False}
    assert client.post(SESSION + "s1/typing", json={"typing": True, "as": "operator"}, headers=OLGA).status_code == 200
    assert client.get(SESSION + "s1/typing", headers=ANA).json()["operator"] == "olga"
    assert client.post(SESSION + "s1/typing", json={"typing": True}, headers=ANA).status_code == 200
    assert client.get(SESSION + "s1/typing", headers=OLGA).json() == {"operator": "olga", "user": True}
    client.post(SESSION + "s1/typing", json={"typing": False, "as": "operator"}, headers=OLGA)
    assert client.get(SESSION + "s1/typing", headers=ANA).json() == {"operator": None, "user": True}
    assert client.get(SESSION + "s1/typing", headers=BEN).status_code == 404  # another user learns nothing
    assert client.post(SESSION + "s1/typing", json={"typing": True, "as": "operator"}, headers=ANA).status_code == 403
    bad = client.post(SESSION + "s1/typing", json={"typing": "yes"}, headers=ANA)
    assert bad.status_code == 400 and '{"typing": true}' in bad.json()["message"]


def test_the_inbox_lists_newest_activity_first_with_the_customer_and_the_last_message(client):
    for sid, who in (("a", ANA), ("b", BEN)):
        client.post("/bots/bakery/sessions", json={"id": sid}, headers=who)
        client.post(SESSION + sid + "/takeover", json={}, headers=OLGA)
    client.post(SESSION + "a/messages", json={"userMessage": "Are the rolls fresh?"}, headers=ANA)  # a waits on top
    inbox = client.get("/pending?order=recent&limit=1", headers=OLGA).json()
    first = inbox["sessions"][0]
    assert (first["session"], first["owner"], first["last"]["from"], first["last"]["text"]) == \
        ("a", "ana", "user", "Are the rolls fresh?")
    second = client.get("/pending", params={"order": "recent", "cursor": inbox["next"]}, headers=OLGA).json()
    assert [s["session"] for s in second["sessions"]] == ["b"] and second["next"] is None
    assert second["sessions"][0]["last"]["from"] == "decision"  # b's last turn: the takeover
    client.post(SESSION + "b/operator/messages", json={"text": "Hello Ben"}, headers=OLGA)
    top = client.get("/pending?order=recent&kind=takeover", headers=OLGA).json()["sessions"][0]
    assert (top["session"], top["last"]["from"], top["last"]["text"]) == ("b", "operator", "Hello Ben")
    mixed = client.get("/pending?order=recent&role=baker", headers=OLGA)
    assert mixed.status_code == 400 and "order=waiting" in mixed.json()["message"]


def test_an_operator_with_no_name_is_told_in_the_users_language_and_kept_as_operator_in_the_data(fake, tmp_path):
    """A server without --auth: whoever takes over has no name. The German user reads "Ein
    Mitarbeiter ist dem Gespräch beigetreten", not "operator ist ..."; the events' data keeps
    the stable `name: operator` programs compare (definition/page_texts.py UNNAMED_OPERATOR)."""
    app = app_for_testclient([chatrun.load_bot(BAKERY)], f"sqlite:///{tmp_path}/s.db")
    with TestClient(app) as client:
        client.post("/bots/bakery/sessions", json={"id": "de1"}, headers={"Accept-Language": "de"})
        taken = client.post(SESSION + "de1/takeover", json={})
        assert messages(taken) == ["Ein Mitarbeiter ist dem Gespräch beigetreten"]
        left = client.post(SESSION + "de1/release", json={})
        assert messages(left) == ["Der Mitarbeiter hat das Gespräch verlassen"]
        history = client.get(SESSION + "de1").json()["history"]
    notices = [e["meta"] for h in history for e in h["events"] if e["type"] == "Message" and e.get("meta")]
    assert [(n["notice"], n["name"]) for n in notices] == [("operator_joined", "operator"), ("operator_left", "operator")]
