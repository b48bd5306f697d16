"""The session registry of `chatrun serve`: the live cache bounded by bytes and idle time,
per-principal session limits, the if-busy policy, versions (a writer outside the server is
never written over), exactly-once retries over HTTP, and SQLite I/O off the event loop.
Real app, real uvicorn, real SQLite, the fake OpenAI server."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.messages import UserMessage
from chatrun.server.sessions import SessionSettings
from chatrun.store.sqlite import SQLiteStore
from server_support import ThreadServer, write_travel
from server_support import app_for_testclient as create_app

AUTH = """
tokens:
  ana-token: {principal: ana}
"""


@pytest.fixture
def travel(tmp_path):
    return chatrun.load_bot(write_travel(tmp_path / "bots"))


def test_the_live_cache_is_bounded_by_bytes(fake, travel, tmp_path):
    fake.responder = lambda body: {"text": "x" * 20_000}  # each turn adds ~20 KB to a memory
    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}", sessions=SessionSettings(cache_bytes=100_000))
    with TestClient(app) as c:
        for i in range(8):
            c.post("/bots/travel/sessions", json={"id": f"s{i}"})
            assert c.post(f"/bots/travel/sessions/s{i}/messages", json={"userMessage": "hi"}).json()["ok"]
        health = c.get("/health").json()
        assert health["cache_bytes"] <= 100_000 and 1 <= health["live_sessions"] < 8
        # Evicted sessions come back from the store whole.
        again = c.post("/bots/travel/sessions/s0/messages", json={"userMessage": "again"}).json()
        assert again["turn"] == 2
        assert [m["role"] for m in fake.requests[-1]["messages"]] == ["system", "user", "assistant", "user"]


def test_the_byte_bound_counts_what_short_sessions_really_cost(fake, travel, tmp_path):
    """A short conversation's JSON is a few hundred bytes, its live objects some 5 KB of a real
    server's RSS (bench/bench_memory_bound.py, "small"): the cache counts the estimate
    (session_cache.live_size), not the JSON, so --cache-mb bounds the RSS."""
    fake.responder = lambda body: {"text": "ok"}
    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}", sessions=SessionSettings(cache_bytes=30_000))
    with TestClient(app) as c:
        for i in range(10):
            c.post("/bots/travel/sessions", json={"id": f"s{i}"})
            assert c.post(f"/bots/travel/sessions/s{i}/messages", json={"userMessage": "hi"}).json()["ok"]
        health = c.get("/health").json()
        assert health["cache_bytes"] <= 30_000 and health["live_sessions"] <= 30_000 // 3_000
        assert health["cache_bytes"] >= health["live_sessions"] * 3_000


def test_idle_sessions_leave_the_cache(fake, travel, tmp_path):
    fake.responder = lambda body: {"text": "ok"}
    app = create_app([travel], "memory://", sessions=SessionSettings(cache_idle=0.2))
    with TestClient(app) as c:  # the app's lifespan runs the sweeper
        c.post("/bots/travel/sessions", json={"id": "idle"})
        c.post("/bots/travel/sessions/idle/messages", json={"userMessage": "hi"})
        deadline = time.monotonic() + 10
        while c.get("/health").json()["live_sessions"]:
            assert time.monotonic() < deadline, "an idle session stayed cached"
            time.sleep(0.05)
        assert c.get("/bots/travel/sessions/idle").json()["turn"] == 1  # still in the store


def test_a_principal_may_own_at_most_the_configured_number_of_sessions(fake, travel, tmp_path):
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}", auth=str(auth),
                     sessions=SessionSettings(max_sessions_per_principal=2))
    ana = {"Authorization": "Bearer ana-token"}
    with TestClient(app) as c:
        assert [c.post("/bots/travel/sessions", json={"id": f"a{i}"}, headers=ana).status_code for i in range(2)] == [201, 201]
        third = c.post("/bots/travel/sessions", json={"id": "a2"}, headers=ana)
        assert third.status_code == 429 and "ana already has 2 sessions (limit 2, --max-sessions-per-principal)" in third.json()["message"]
        assert c.delete("/bots/travel/sessions/a0", headers=ana).status_code == 204
        assert c.post("/bots/travel/sessions", json={"id": "a2"}, headers=ana).status_code == 201


def test_a_v1_request_refused_before_its_turn_leaves_no_session_to_count(fake, travel, tmp_path):
    # The new conversation's session was created before its file was refused (attachment_refused):
    # each such request left an empty session that counted against the limit, locking ana out.
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}", auth=str(auth),
                     sessions=SessionSettings(max_sessions_per_principal=1))
    ana = {"Authorization": "Bearer ana-token"}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    refused = {"model": "travel", "messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]}
    fake.queue({"text": "Hello."})
    with TestClient(app) as c:
        for session_header in ({}, {"X-Chatrun-Session": "named"}):
            answer = c.post("/v1/chat/completions", json=refused, headers=ana | session_header)
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "attachment_refused", answer.text
        assert c.get("/bots/travel/sessions/named", headers=ana).status_code == 404
        hello = {"model": "travel", "messages": [{"role": "user", "content": "hi"}]}
        answer = c.post("/v1/chat/completions", json=hello, headers=ana)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "Hello."


def test_a_v1_fork_is_a_session_the_principal_limit_counts(fake, travel, tmp_path):
    # An edited message forks the conversation into a new session, which was written to the store
    # without the limit's check: ana, at her one session, made as many more as she edited messages.
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}", auth=str(auth),
                     sessions=SessionSettings(max_sessions_per_principal=1))
    ana = {"Authorization": "Bearer ana-token"}
    fake.responder = lambda body: {"text": "Hello."}
    said = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "Hello."}]
    with TestClient(app) as c:
        answers = [c.post("/v1/chat/completions", json={"model": "travel", "messages": messages}, headers=ana)
                   for messages in (said[:1], [*said, {"role": "user", "content": "two"}],
                                    [*said, {"role": "user", "content": "two, edited"}])]
    assert [a.status_code for a in answers] == [200, 200, 429], answers[-1].text
    assert answers[1].json()["chatrun"]["how"] == "continued"
    error = answers[-1].json()["error"]
    assert error["code"] == "too_many_requests"
    assert "ana already has 1 sessions (limit 1, --max-sessions-per-principal); delete one first" in error["message"]
    assert SQLiteStore(tmp_path / "c.db").count_owned("ana") == 1


def test_if_busy_reject_fails_at_once_while_queue_waits(fake, travel, tmp_path):
    fake.responder = lambda body: {"text": "slow", "delay": 0.8}
    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}")
    with ThreadServer(app) as server:
        async def run() -> tuple[list[httpx.Response], httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                await http.post("/bots/travel/sessions", json={"id": "b"})
                first = asyncio.ensure_future(http.post("/bots/travel/sessions/b/messages", json={"userMessage": "1"}))
                while not fake.requests:
                    await asyncio.sleep(0.01)
                rejected = await http.post("/bots/travel/sessions/b/messages?ifBusy=reject", json={"userMessage": "2"})
                queued = await http.post("/bots/travel/sessions/b/messages", json={"userMessage": "3"})
                return [await first, queued], rejected

        (first, queued), rejected = asyncio.run(run())
        assert rejected.status_code == 429 and "running a turn" in rejected.json()["message"]
        assert (first.json()["turn"], queued.json()["turn"]) == (1, 2)


def test_a_writer_outside_the_server_is_never_written_over(fake, travel, tmp_path):
    """The REPL (or a script) commits to the SQLite file the server serves: the server's live
    copy is then stale, and it reloads instead of writing its old copy over the new turn."""
    fake.responder = lambda body: {"text": f"{len(body['messages'])} messages"}
    db = tmp_path / "c.db"
    app = create_app([travel], f"sqlite:///{db}")
    with TestClient(app) as c:
        c.post("/bots/travel/sessions", json={"id": "w"})
        c.post("/bots/travel/sessions/w/messages", json={"userMessage": "from the server"})
        outside = SQLiteStore(db)  # another writer, as `chatrun repl --store` would be
        session = travel.session(store=outside, session_id="w")
        session.chat("from outside")
        outside.close()
        reply = c.post("/bots/travel/sessions/w/messages", json={"userMessage": "server again"}).json()
        assert reply["turn"] == 3
        history = c.get("/bots/travel/sessions/w").json()["history"]
        assert [h["input"] for h in history] == ["from the server", "from outside", "server again"]
        assert reply["events"][0]["data"] == "6 messages"  # system + 2 turns of 2 + the new message


def test_a_retried_idempotency_key_replays_the_committed_turn(fake, travel, tmp_path):
    fake.responder = lambda body: {"text": "answered"}
    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}")
    with TestClient(app) as c:
        c.post("/bots/travel/sessions", json={"id": "i"})
        key = {"Idempotency-Key": "k-1"}
        first = c.post("/bots/travel/sessions/i/messages", json={"userMessage": "hi"}, headers=key)
        again = c.post("/bots/travel/sessions/i/messages", json={"userMessage": "hi"}, headers=key)
        assert first.json()["replayed"] is False and again.json()["replayed"] is True
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["events"] == first.json()["events"] and again.json()["turn"] == 1
        assert len(fake.requests) == 1
        session = c.get("/bots/travel/sessions/i").json()
        assert session["turn"] == 1 and session["lastTurn"]["requestId"] == "k-1"
        # A failed turn records no outcome: retrying the same key runs it again.
        fake.responder = None
        fake.queue({"status": 500})
        failed = c.post("/bots/travel/sessions/i/messages", json={"userMessage": "x"}, headers={"Idempotency-Key": "k-2"})
        assert failed.json()["ok"] is False
        fake.queue({"text": "now it works"})
        retried = c.post("/bots/travel/sessions/i/messages", json={"userMessage": "x"}, headers={"Idempotency-Key": "k-2"})
        assert retried.json()["ok"] and retried.json()["replayed"] is False and retried.json()["turn"] == 2
        too_long = c.post("/bots/travel/sessions/i/messages", json={"userMessage": "x"}, headers={"Idempotency-Key": "k" * 201})
        assert too_long.status_code == 400 and "1 to 200 characters, not 201" in too_long.json()["message"]


def test_an_idempotency_key_sent_again_with_another_message_is_a_422(fake, travel, tmp_path):
    # It replayed the first message's answer: a client that reused a key by mistake got the answer
    # to another question. The IETF draft and Stripe answer 422; the same message still replays.
    fake.responder = lambda body: {"text": "answered"}
    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}")
    with TestClient(app) as c:
        c.post("/bots/travel/sessions", json={"id": "r"})
        key = {"Idempotency-Key": "k-1"}
        first = c.post("/bots/travel/sessions/r/messages", json={"userMessage": "hi"}, headers=key)
        assert first.status_code == 200 and first.json()["replayed"] is False
        for stream in ("false", "true"):
            other = c.post(f"/bots/travel/sessions/r/messages?stream={stream}", json={"userMessage": "bye"}, headers=key)
            assert other.status_code == 422, other.text
            assert other.json()["error"] == "IdempotencyKeyReused" and "'k-1'" in other.json()["message"]
        again = c.post("/bots/travel/sessions/r/messages", json={"userMessage": "hi"}, headers=key)
        assert again.json()["replayed"] is True and again.json()["events"] == first.json()["events"]
        assert len(fake.requests) == 1 and c.get("/bots/travel/sessions/r").json()["turn"] == 1


@pytest.mark.parametrize("extensions", [True, False])
def test_a_websocket_request_id_sent_again_with_another_message_is_refused(fake, travel, tmp_path, extensions):
    # A string requestId is the WebSocket's idempotency key; sent again with another message it
    # replayed the first message's answer (a client numbering its requests per connection, "1",
    # "2", ..., got old answers after a reconnect). Now refused as the HTTP API's Idempotency-Key is.
    from server_support import until_done

    fake.responder = lambda body: {"text": "answered"}
    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}")
    with TestClient(app) as c, c.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": "w", "extensions": extensions})
        until_done(ws)
        frame = {"type": "ChatRouteMessage", "chatId": "w", "requestId": "1", "data": {"userMessage": "hi"}}
        ws.send_json(frame)
        first = until_done(ws)
        assert first[-1]["type"] == "Completed"
        ws.send_json(frame | {"data": {"userMessage": "bye"}})
        refused = until_done(ws)
        assert refused[-1]["type"] == "Failed" and all(f["requestId"] == "1" for f in refused), refused
        assert refused[-1]["data"] == "IdempotencyKeyReused", refused
        if extensions:  # the Error says why, naming the key
            assert [f["type"] for f in refused] == ["Error", "Failed"] and "'1'" in refused[0]["data"], refused
        ws.send_json(frame)  # the same message again is a retry: replayed
        assert [f["type"] for f in until_done(ws)] == [f["type"] for f in first if f["type"] != "Stream"]
        assert len(fake.requests) == 1


def test_a_slow_sqlite_write_does_not_freeze_the_event_loop(fake, travel, tmp_path):
    """Another process holds the SQLite write lock for a while: the turn waiting to commit waits
    in the store's worker thread, and the server keeps answering everyone else meanwhile."""
    fake.responder = lambda body: {"text": "ok"}
    db = tmp_path / "c.db"
    app = create_app([travel], f"sqlite:///{db}")
    with ThreadServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        http.post("/bots/travel/sessions", json={"id": "slow"})
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # the write lock, as another writer would hold it
        turn = threading.Thread(target=lambda: http.post("/bots/travel/sessions/slow/messages", json={"userMessage": "hi"}))
        turn.start()
        while not fake.requests:
            time.sleep(0.01)
        time.sleep(0.3)  # the turn is now waiting for the lock in the worker thread
        with httpx.Client(base_url=server.url, timeout=5) as second:  # a frozen loop: ReadTimeout
            assert second.get("/health").status_code == 200
        other.execute("COMMIT")
        other.close()
        turn.join(30)
        assert http.get("/bots/travel/sessions/slow").json()["turn"] == 1


def test_stores_count_sessions_per_owner(tmp_path):
    from chatrun.store.memory import InMemoryStore

    for store in (InMemoryStore(), SQLiteStore(tmp_path / "o.db")):
        store.commit_turn("a", {"meta": {"owner": "ana"}}, {"a.1#m": [UserMessage("x")]}, [])
        store.commit_turn("b", {"meta": {"owner": "ana"}}, {}, [])
        store.commit_turn("c", {"meta": {}}, {}, [])
        assert store.count_owned("ana") == 2 and store.count_owned("bob") == 0
        store.close()


def test_a_websocket_retry_is_replayed_even_when_its_turn_ended_the_scope_it_named(fake, travel, tmp_path):
    from server_support import call, until_done

    app = create_app([travel], f"sqlite:///{tmp_path / 'c.db'}")
    fake.queue(call("book_flight"), {"text": "Where to?"}, call("cancel"), {"text": "Back at the menu"})
    with TestClient(app) as c, c.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": "p", "extensions": True})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "p", "data": {"userMessage": "a flight"}})
        flight = until_done(ws)[-1]["data"]  # the pushed flight scope
        frame = {"type": "ChatRouteMessage", "chatId": "p", "scopeId": flight, "requestId": "cancel-1",
                 "data": {"userMessage": "never mind"}}
        ws.send_json(frame)
        first = until_done(ws)
        assert first[-1]["type"] == "Completed" and first[-1]["data"] != flight  # the turn popped the scope
        calls = len(fake.requests)
        ws.send_json(frame)  # the same request again, naming the scope that is gone now
        again = until_done(ws)
        assert [(f["type"], f["data"]) for f in again] == [(f["type"], f["data"]) for f in first if f["type"] != "Stream"]
        assert len(fake.requests) == calls
        ws.send_json(frame | {"requestId": "cancel-2"})  # a new request naming it: ScopeNotActive
        assert until_done(ws)[-1]["data"] == "ScopeNotActive"
