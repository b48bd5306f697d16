"""Issue 24: at-least-once delivery of backend events across crashes, with real `chatrun serve`
processes (tests/redis_support.py `Replica`), a real Redis, the fake OpenAI server and a real
webhook receiver. The receiver holds the first delivery so that `kill -9` lands after the turn
was committed and while a replica holds the entry's claim; another process must then take the
entry over (once the claim runs out) and deliver it once, with its idempotency key."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from chatrun.store.record import DEAD, PENDING, Commit
from chatrun.store.redis import RedisStore
from chatrun.store.versions import CREATE
from redis_support import Replica
from server_support import wait_until
from store_params import store_url
from webhook_support import OPENAI_MODEL, SECRET, Receiver, survey_bot, survey_responder

LEASE = "2"  # CHATRUN_OUTBOX_LEASE: a claim lasts this + the webhook's timeout (3 s) = 5 s


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture
def bot(tmp_path, fake, receiver, monkeypatch):
    monkeypatch.setenv("HOOK_URL", receiver.url)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("CHATRUN_OUTBOX_LEASE", LEASE)
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    fake.responder = survey_responder
    path = tmp_path / "bot.yaml"
    path.write_text(survey_bot(OPENAI_MODEL, "attempts: 50, backoff: 0.2, max_backoff: 1", timeout=3))
    return str(path)



def run_turn(replica: Replica, session: str, text: str) -> dict:
    httpx.post(f"{replica.url}/bots/survey/sessions", json={"id": session}, timeout=60)
    return httpx.post(f"{replica.url}/bots/survey/sessions/{session}/messages", json={"userMessage": text},
                      timeout=60).json()


def outbox_empty(replica: Replica) -> bool:
    return httpx.get(f"{replica.url}/outbox", timeout=30).json()["entries"] == []


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_kill_9_after_the_commit_and_the_event_still_arrives_once(kind, bot, fake, receiver, tmp_path, request):
    store = store_url(request, tmp_path, kind)
    receiver.status, receiver.hold = 503, 30  # the first delivery hangs: its replica dies holding the claim
    first = Replica(bot, store, fake.base_url).start()
    second = None
    try:
        assert run_turn(first, "k1", "2")["ok"] is True  # committed
        wait_until(lambda: receiver.arrivals >= 1, what="the first replica's delivery attempt")
        if kind == "redis":  # a second replica, up while the first still lives and holds the claim
            second = Replica(bot, store, fake.base_url).start()
        first.kill()  # kill -9 between the commit and a delivery that succeeded
        receiver.status, receiver.hold = 200, 0
        if second is None:  # SQLite: one server per file; a restart takes the entry over
            second = Replica(bot, store, fake.base_url).start()
        accepted = wait_until(receiver.accepted, what="the delivery after the kill")
        wait_until(lambda: outbox_empty(second), what="the outbox emptied")
    finally:
        for r in (first, second):
            if r is not None:
                r.kill()
    assert len(accepted) == 1 and len(receiver.accepted()) == 1
    delivered = accepted[0]
    assert delivered.body["data"] == 2 and delivered.signed_with(SECRET)
    # The attempt that hung in the dead replica's hands (on a slow machine it may have timed out
    # and tried again before the kill), and the one that got through.
    assert receiver.arrivals >= 2
    # Every attempt (the one that hung in the dead replica's hands too) carried the same key.
    assert {d.headers["idempotency-key"] for d in receiver.seen()} == {delivered.body["id"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.subprocess
def test_a_receiver_down_for_30_s_gets_the_events_afterwards_with_backoff(tmp_path, fake, monkeypatch):
    port = free_port()  # nothing listens there for 30 s: every attempt is refused
    monkeypatch.setenv("HOOK_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    fake.responder = survey_responder
    path = tmp_path / "bot.yaml"
    path.write_text(survey_bot(OPENAI_MODEL, "attempts: 100, backoff: 1, max_backoff: 8"))
    server = Replica(str(path), f"sqlite:///{tmp_path / 'd.db'}", fake.base_url).start()
    try:
        for n in (1, 2):
            assert run_turn(server, f"d{n}", str(n))["ok"] is True
        down_until = time.monotonic() + 30
        wait_until(lambda: time.monotonic() >= down_until, timeout=60, what="30 s down")
        pending = httpx.get(f"{server.url}/outbox", params={"state": PENDING}, timeout=30).json()["entries"]
        assert len(pending) == 2 and all("cannot connect" in e["error"] for e in pending)
        with Receiver(port=port) as receiver:
            accepted = wait_until(lambda: len(receiver.accepted()) >= 2 and receiver.accepted(), timeout=60,
                                  what="the deliveries once the receiver is up")
            wait_until(lambda: outbox_empty(server), what="the outbox emptied")
    finally:
        server.kill()
    assert sorted(d.body["data"] for d in accepted) == [1, 2] and len(receiver.accepted()) == 2
    # Backoff (1 s doubling up to 8 s, jittered), not a retry every poll: over 30 s a handful of tries.
    tries = [int(d.headers["chatrun-attempt"]) for d in accepted]
    assert all(4 <= t <= 15 for t in tries), tries


def test_the_redis_store_keeps_the_outbox_with_the_commit_and_one_claim_at_a_time(redis_server):
    async def go():
        store = RedisStore(redis_server.url())
        body = {"id": "evt_1", "type": "T", "data": [], "turn": 1, "session": "s", "bot": "b", "created": 100.0}
        history = [{"turn": 1, "ok": True, "outbox": [{"sink": "crm", "body": body}]},
                   {"turn": 2, "ok": False, "outbox": [{"sink": "crm", "body": body | {"id": "evt_2"}}]}]
        commit = Commit.encode("s", {"id": "s"}, {}, history, expected=CREATE)
        await store.commit_turn(commit, None)
        assert [e.id for e in await store.list_outbox()] == ["evt_1"]
        first = await store.claim_outbox(200.0, 30, 10, ["b/crm"])
        assert [e.body for e in first] == [body] and await store.claim_outbox(210.0, 30, 10, ["b/crm"]) == []
        second = await store.claim_outbox(231.0, 30, 10, ["b/crm"])
        assert [e.id for e in second] == ["evt_1"] and second[0].claim != first[0].claim
        assert await store.settle_outbox(first[0], True) is False
        second[0].attempts, second[0].state, second[0].error = 1, DEAD, "answered 500"
        assert await store.settle_outbox(second[0], False) is True
        assert await store.claim_outbox(1e12, 30, 10, ["b/crm"]) == []
        assert [e.error for e in await store.list_outbox(DEAD)] == ["answered 500"]
        assert await store.list_outbox(PENDING) == []
        assert await store.requeue_outbox("evt_1", 300.0) and not await store.requeue_outbox("evt_1", 300.0)
        third = await store.claim_outbox(300.0, 30, 10, ["b/crm"])
        assert third[0].attempts == 0 and await store.settle_outbox(third[0], True)
        assert await store.list_outbox() == []
        stale = Commit.encode("s", {"id": "s"}, {}, history[:1], expected="0.stale")
        with pytest.raises(Exception, match="stale|expected|version"):
            await store.commit_turn(stale, None)
        assert await store.list_outbox() == []  # a commit that did not land queued nothing
        await store.close()

    asyncio.run(go())


@pytest.mark.subprocess
def test_the_repl_shows_a_backend_event_dimmed_and_sends_nothing(tmp_path, receiver):
    import os
    import subprocess
    import sys

    from redis_support import REPO

    path = tmp_path / "bot.yaml"
    path.write_text(survey_bot("provider: scripted"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(PYTHONPATH=str(REPO / "runner"), HOOK_URL=receiver.url, HOOK_SECRET=SECRET)
    out = subprocess.run([sys.executable, "-m", "chatrun", "repl", str(path), "--play-model"],
                         input='my score is 3\n/call score {"n": 3}\n/say Thanks.\n', capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "[backend] Detractor 3 (for crm; the REPL sends nothing, `chatrun serve` delivers)" in out.stdout
    assert "[Thanks] 3" in out.stdout  # a user event, shown as before
    assert receiver.seen() == []
