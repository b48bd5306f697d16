"""What is the Redis store's own, against a real redis-server: its URLs and password, a turn
when Redis goes away, a session's records tracked in Redis's own keys. The contract it shares
with SQLite and PostgreSQL (fenced commits, leases: FIFO queue, reject, expiry, renewal; outcomes,
records, claims, deletes): tests/test_store_conformance.py. In-process, asyncio."""

from __future__ import annotations

import asyncio
import json

import pytest

from chatrun.store.buffer import TurnBuffer
from chatrun.store.redis import RedisStore, redis_url_parts
from chatrun.store.versions import CREATE


def run(coro):
    return asyncio.run(coro)


def pending(session_id: str, snapshot: dict, memories=None, history=None, request_id=None):
    buffer = TurnBuffer(session_id)
    buffer.request_id = request_id
    buffer.commit_turn(session_id, snapshot, memories or {}, history or [])
    return buffer.take()


async def commit(store, session_id, pending_commit, expected, lease, outcome=None):
    """RedisStore.commit_turn with the expected version and outcome of the server's commit."""
    assert pending_commit.session_id == session_id
    pending_commit.expected = expected
    if outcome is not None:
        pending_commit.outcome = (outcome[0], json.dumps(outcome[1], ensure_ascii=False))
    return await store.commit_turn(pending_commit, lease)


@pytest.fixture
def url(redis_server):
    return redis_server.url()


def test_redis_urls_keep_their_password_out_of_messages():
    assert redis_url_parts("redis://:pw@h:1/2?prefix=x:") == ("redis://:pw@h:1/2", "x:")
    store = RedisStore("redis://:secret@127.0.0.1:1/0")
    assert "secret" not in store.url


def test_serve_says_when_redis_cannot_be_reached(tmp_path):
    from click.testing import CliRunner

    from chatrun.cli import main
    from redis_support import free_port
    from server_support import write_travel

    bot = str(write_travel(tmp_path))
    result = CliRunner().invoke(main, ["serve", bot, "--store", f"redis://127.0.0.1:{free_port()}/0"])
    assert result.exit_code != 0 and "cannot reach Redis" in result.output and "Traceback" not in result.output


def test_a_turn_fails_cleanly_when_redis_goes_away(redis_server, tmp_path, fake):
    from fastapi.testclient import TestClient

    import chatrun
    from redis_support import RedisServer
    from server_support import app_for_testclient as create_app
    from server_support import write_travel

    own = RedisServer().start()  # a Redis of its own, to stop
    fake.responder = lambda body: {"text": "ok"}
    app = create_app([chatrun.load_bot(write_travel(tmp_path))], own.url())
    with TestClient(app) as c:
        assert c.post("/bots/travel/sessions", json={"id": "g"}).status_code == 201
        own.stop()
        r = c.post("/bots/travel/sessions/g/messages", json={"userMessage": "hi"})
        assert r.status_code == 500 and r.json()["error"] == "ServerError" and "store failed" in r.json()["message"]
        assert c.get("/health").status_code == 200  # the server itself stays up


@pytest.mark.subprocess  # its own redis-server
def test_the_password_comes_from_the_url_or_the_environment(monkeypatch):
    from chatrun.errors import ChatrunError
    from chatrun.store.redis import check_reachable
    from redis_support import RedisServer

    locked = RedisServer("--requirepass", "s3cret").start()
    try:
        check_reachable(f"redis://:s3cret@127.0.0.1:{locked.port}/0")
        monkeypatch.setenv("CHATRUN_REDIS_PASSWORD", "s3cret")
        check_reachable(f"redis://127.0.0.1:{locked.port}/0")
        monkeypatch.setenv("CHATRUN_REDIS_PASSWORD", "wrong")
        with pytest.raises(ChatrunError, match="cannot reach Redis") as caught:
            check_reachable(f"redis://127.0.0.1:{locked.port}/0")
        assert "wrong" not in str(caught.value)
        with pytest.raises(ChatrunError) as caught:
            check_reachable(f"redis://:bad-pass@127.0.0.1:{locked.port}/0")
        assert "bad-pass" not in str(caught.value) and "***" in str(caught.value)
    finally:
        locked.stop()


def test_a_sessions_records_go_with_it_unless_since_saved_for_another(url):
    async def scenario():
        store = RedisStore(url)
        try:
            for sid in ("r1", "r2"):
                await commit(store, sid, pending(sid, {"turn": 0}), CREATE, None)
            await store.put_record("a", {"v": 1}, "r1")
            await store.put_record("shared", {"v": 1}, "r1")
            await store.put_record("shared", {"v": 2}, "r2")  # since saved for r2: r2's now
            await store.put_record("free", {"v": 1})
            await store.put_record("gone", {"v": 1}, "r2")
            await store.delete_record("gone")
            await store.delete_session("r1", [], None)
            got = [await store.get_record(k) for k in ("a", "shared", "free", "gone")]
            assert got == [None, {"v": 2}, {"v": 1}, None]
            await store.delete_session("r2", [], None)
            assert [await store.get_record(k) for k in ("shared", "free")] == [None, {"v": 1}]
            assert await store.client.hgetall(f"{store.prefix}rs") == {}
        finally:
            await store.close()

    run(scenario())


def test_a_dead_replicas_lease_on_redis_goes_by_itself(url):
    """On Redis the lease a replica killed (-9) held (its own, chatrun/replica/<id>: server/liveness.py)
    is a key with its TTL: it goes by itself, nothing for a sweeper to delete (PostgreSQL's rows
    are swept: tests/test_store_postgres.py)."""
    from chatrun.server.liveness import REPLICA_LEASE

    async def scenario():
        store = RedisStore(url)
        try:
            lease = await store.acquire(REPLICA_LEASE + "dead0123", wait=5)
            lease.renewer.cancel()  # killed: never renewed, never released
            left = await store.client.pttl(store._key("l", REPLICA_LEASE + "dead0123"))
            assert 0 < left <= store.settings.ttl * 1000
            assert await store.sweep_leases() == 0
        finally:
            await store.close()

    asyncio.run(scenario())
