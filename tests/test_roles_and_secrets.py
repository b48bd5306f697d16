"""Issue 33, findings 2 and 3, through the HTTP API of a real app (the real openai client against
the fake OpenAI server, a real SQLite file, a real webhook receiver as the backend's sink):

- role names are no powers: `user` and `backend` are the engine's own audiences, refused in an
  --auth file (`chatrun serve` does not start) and never matched from a principal's roles
  (a program may build an Auth without the file's check), so a principal with the role `user`
  decides no one else's approval and one with `backend` answers no backend question without
  its item's token;
- a backend item's token leaves the server only to the item's sinks: never in the inspector,
  the session resource, the pending lists, the outbox listing, a replayed request, the stored
  history and outcomes, or a log line.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
from typing import Any

import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.definition.loader import check_bot
from chatrun.engine.pending import PendingItem
from chatrun.errors import ChatrunError
from chatrun.server.auth import Auth, Principal
from chatrun.store.sqlite import SQLiteStore
from server_support import REPO, app_for_testclient
from test_pending_flows import BOT as DESK_BOT
from test_pending_flows import responder
from webhook_support import SECRET, Receiver

ANA, OLGA = {"Authorization": "Bearer ana-token-123"}, {"Authorization": "Bearer olga-token-12"}
EVE, OSCAR = {"Authorization": "Bearer eve-token-123"}, {"Authorization": "Bearer oscar-token-1"}
BOB, BETTY = {"Authorization": "Bearer bob-token-123"}, {"Authorization": "Bearer betty-token-1"}

# The desk bot of test_pending_flows (a refund the user confirms, a question `from: backend`, a
# takeover), with a sink that takes every backend event: the backend's copy of Pending, with its token.
BOT = DESK_BOT.replace("state: {kyc: null}\n", """\
state: {kyc: null}
sinks:
  kyc:
    webhook: {url: "{{ env.HOOK_URL }}/hooks", secret: HOOK_SECRET}
""").replace("  REFUND_URL: {}\n", "  REFUND_URL: {}\n  HOOK_URL: {}\n  HOOK_SECRET: {secret: true}\n")


def principals_with_engine_roles() -> Auth:
    """What the --auth file now refuses, built as a program could (no file, no check): the
    engine itself must still never read `user` or `backend` from a principal's roles."""
    return Auth({
        "ana-token-123": Principal("ana"),
        "olga-token-12": Principal("olga", frozenset({"operators", "outbox"})),
        "eve-token-123": Principal("eve", frozenset({"user"})),
        "oscar-token-1": Principal("oscar", frozenset({"user", "operators"})),
        "bob-token-123": Principal("bob", frozenset({"backend"})),
        "betty-token-1": Principal("betty", frozenset({"backend", "operators"})),
    }, "<program>")


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture
def served(fake, tmp_path, receiver, monkeypatch):
    monkeypatch.setenv("REFUND_URL", receiver.url)
    monkeypatch.setenv("HOOK_URL", receiver.url)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT)
    db = tmp_path / "s.db"
    app = app_for_testclient([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{db}",
                             auth=principals_with_engine_roles())
    with TestClient(app) as client:
        yield client, db


def say(client: TestClient, session: str, text: str, **headers: str) -> dict[str, Any]:
    if client.get(f"/bots/desk/sessions/{session}", headers=ANA).status_code == 404:
        assert client.post("/bots/desk/sessions", json={"id": session}, headers=ANA).status_code == 201
    reply = client.post(f"/bots/desk/sessions/{session}/messages", json={"userMessage": text},
                        headers={**ANA, **headers})
    assert reply.status_code == 200, reply.text
    return reply.json()


# -- finding 2: role names are no powers ---------------------------------------------------------------


@pytest.mark.parametrize("role", ["user", "backend"])
def test_an_auth_file_granting_an_engine_audience_is_refused_with_what_to_give_instead(tmp_path, role):
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"tokens:\n  ana-token-123: {{principal: ana}}\n  eve-token-123: {{principal: eve, "
                    f"roles: [staff, {role}]}}\n")
    with pytest.raises(ChatrunError) as refused:
        Auth.load(auth)
    message = str(refused.value)
    assert message.startswith(f"{auth}: tokens.eve-…: principal 'eve' has the role `{role}`, which no token may grant")
    assert "ana-token-123" not in message and "eve-token-123" not in message  # the file's secrets stay in it
    instead = "a role of your own (e.g. `approvers`) named in the tool's `approval: by:`" if role == "user" else \
        "a backend answers with `Authorization: Bearer <the item token>` and needs no entry here"
    assert instead in message and f"Remove `{role}` from its roles." in message


@pytest.mark.subprocess
def test_chatrun_serve_does_not_start_with_an_auth_file_granting_user(tmp_path):
    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens:\n  eve-token-123: {principal: eve, roles: [user]}\n")
    out = subprocess.run([sys.executable, "-m", "chatrun", "serve", str(REPO / "bots" / "hello"), "--store",
                          "memory://", "--port", "0", "--auth", str(auth)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO / "runner")})
    assert out.returncode == 1, out.stderr
    assert f"{auth}: tokens.eve-…: principal 'eve' has the role `user`, which no token may grant" in out.stderr
    assert "serving" not in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_a_principal_with_the_role_user_decides_no_one_elses_confirmation(served, receiver):
    client, _ = served
    for session in ("c1", "c2"):
        asked = say(client, session, "refund A7 20")
        assert [(e["data"]["id"], e["data"]["by"]) for e in asked["events"] if e["type"] == "Pending"] == \
            [("p1", ["user"])]
    # eve's role `user` reaches no one's session; oscar reaches it as an operator, and is refused there.
    hidden = client.post("/bots/desk/sessions/c1/pending/p1", json={"decision": "approve"}, headers=EVE)
    assert hidden.status_code == 404 and "no session 'c1'" in hidden.json()["message"]
    refused = client.post("/bots/desk/sessions/c1/pending/p1", json={"decision": "approve"}, headers=OSCAR)
    assert refused.status_code == 403 and refused.json()["error"] == "DecisionRefused", refused.text
    assert "the caller has operators" in refused.json()["message"]
    assert receiver.seen() == []  # the refund did not run
    # The session's own user still confirms their own call (confirm: decided by the user alone).
    mine = client.post("/bots/desk/sessions/c1/pending/p1", json={"decision": "approve"}, headers=ANA)
    assert mine.status_code == 200 and mine.json()["ok"] is True, mine.text
    assert [d.body for d in receiver.seen() if d.body.get("order")] == [{"order": "A7"}]
    assert client.post("/bots/desk/sessions/c2/pending/p1", json={"decision": "reject"},
                       headers=OSCAR).status_code == 403


def test_a_principal_with_the_role_backend_answers_no_backend_question_without_its_token(served, receiver):
    client, db = served
    say(client, "k1", "documents")
    answer = {"answer": {"verdict": "approved"}}
    hidden = client.post("/bots/desk/sessions/k1/pending/p1", json=answer, headers=BOB)
    assert hidden.status_code == 404  # `backend` among bob's roles reaches nothing
    refused = client.post("/bots/desk/sessions/k1/pending/p1", json=answer, headers=BETTY)
    assert refused.status_code == 403 and refused.json()["error"] == "DecisionRefused", refused.text
    assert "a question for a backend is answered with its token" in refused.json()["message"]
    with SQLiteStore(db) as store:
        stored = store.read_session("k1")
        assert stored.snapshot["state"]["kyc"] is None and len(stored.pending) == 1
    # The backend that holds the token (its sink received it) answers.
    token = backend_token(receiver)
    ok = client.post("/bots/desk/sessions/k1/pending/p1", json=answer, headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200 and ok.json()["ok"] is True, ok.text


def test_a_bot_that_waits_for_user_or_backend_as_a_role_is_warned_where(write_bot):
    path = write_bot("""\
        name: r
        routes:
          main: {default: true, system: Hi., tools: [pay, human], roles: [staff, user]}
        tools:
          pay:
            parameters: {type: object, properties: {}}
            approval: {by: [supervisor, backend]}
            action: {reply: paid}
          human:
            parameters: {type: object, properties: {}}
            action: {operator: {role: backend}}
        """)
    _config, found = check_bot(path)
    warned = {(d.line, d.message.split(":")[0]) for d in found if "no principal holds the role" in d.message}
    assert warned == {(3, "route `main` needs the role `user`"),
                      (7, "`approval.by` of tool `pay` names `backend`, but an approval has no item token a backend "
                          "could answer with"),
                      (11, "the `operator` action of tool `human` waits for the role `backend`")}
    assert all(d.severity == "warning" for d in found if "no principal holds the role" in d.message)


# -- finding 3: the backend's token reaches its sink only -------------------------------------------------


def backend_token(receiver: Receiver) -> str:
    """The token as the backend gets it: in the Pending event its sink receives."""
    delivered = receiver.wait_for(lambda seen: any(d.body.get("type") == "Pending" for d in seen),
                                  what="the backend's Pending")
    pending = next(d for d in delivered if d.body.get("type") == "Pending")
    assert pending.signed_with(SECRET) and pending.body["data"]["by"] == ["backend"]
    return str(pending.body["data"]["token"])


def test_the_backend_token_goes_to_the_sink_and_nowhere_else(served, receiver, caplog):
    caplog.set_level(logging.DEBUG)
    client, db = served
    first = say(client, "b1", "documents", **{"Idempotency-Key": "docs-b1"})
    token = backend_token(receiver)
    with SQLiteStore(db) as store:
        assert store.read_session("b1").pending[0]["token"] == token  # kept, to check the answer
    replay = client.post("/bots/desk/sessions/b1/messages", json={"userMessage": "documents"},
                         headers={**ANA, "Idempotency-Key": "docs-b1"})
    assert replay.json()["replayed"] is True
    views = {
        "the reply": str(first),
        "the replayed reply": replay.text,
        "the inspector": client.get("/bots/desk/sessions/b1/inspect", headers=OLGA).text,
        "the owner's inspector": client.get("/bots/desk/sessions/b1/inspect", headers=ANA).text,
        "the session resource": client.get("/bots/desk/sessions/b1", headers=ANA).text,
        "the session's pending items": client.get("/bots/desk/sessions/b1/pending", headers=OLGA).text,
        "the operators' list": client.get("/pending", headers=OLGA).text,
        "the outbox": client.get("/outbox", headers=OLGA).text,
    }
    assert '"kind":"question"' in views["the inspector"] and '"audience":"backend"' in views["the inspector"]
    assert [name for name, body in views.items() if token in body] == []
    assert token not in caplog.text
    # In the store: the snapshot (to check the answer) and the sink's delivery, nothing else.
    with sqlite3.connect(db) as raw:
        tables = [t for (t,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        holding = {t for t in tables if token in str(raw.execute(f"SELECT * FROM {t}").fetchall())}  # noqa: S608
    assert holding <= {"sessions", "outbox"} and "sessions" in holding


def test_a_history_stored_with_a_token_before_is_shown_without_it(served):
    """Histories written by an older chatrun kept the backend's copy of Pending, token and all."""
    client, db = served
    say(client, "old", "hello")
    item = PendingItem("p1", "question", "2030-01-01T00:00:00+00:00", None, "main", "old.1", by=["backend"],
                       ask="Checking.", token="old-secret-token-1")
    event = {"type": "Pending", "data": {**item.public(), "token": item.token}, "turn": 2, "audience": "backend"}
    with SQLiteStore(db) as store:
        record = store.read_session("old")
        entry = {"turn": 2, "ok": True, "input": {"user": "documents"}, "events": [event]}
        waiting = dict(record.snapshot, pending=[item.to_dict()], pending_next=2)  # so operators reach it
        store.commit_turn("old", waiting, {}, [entry], record.version)
    inspected = client.get("/bots/desk/sessions/old/inspect", headers=OLGA)
    assert '"audience":"backend"' in inspected.text and "old-secret-token-1" not in inspected.text
