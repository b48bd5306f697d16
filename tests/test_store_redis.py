"""The Redis store against a real redis-server: atomic fenced commits, leases (FIFO queue,
reject, expiry, renewal), recorded outcomes, deletes. In-process, asyncio."""

from __future__ import annotations

import asyncio
import json

import pytest

from chatrun.messages import AssistantMessage, UserMessage
from chatrun.store.aio import LeaseSettings
from chatrun.store.buffer import TurnBuffer
from chatrun.store.redis import RedisStore, redis_url_parts
from chatrun.store.versions import CREATE, LeaseLost, SessionBusy, StaleVersion


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


def test_a_commit_lands_whole_and_only_from_the_version_it_started_from(url):
    async def go():
        store = RedisStore(url)
        lease = await store.acquire("s", wait=5)
        v1 = await commit(store, "s", pending("s", {"turn": 0}), CREATE, lease)
        with pytest.raises(StaleVersion, match="already exists"):
            await commit(store, "s", pending("s", {"turn": 0}), CREATE, lease)
        v2 = await commit(store, "s", pending("s", {"turn": 1}, {"s.1#main": [UserMessage("hi"), AssistantMessage("yo")]},
                                            [{"turn": 1, "ok": True}]), v1, lease)
        assert v1.startswith("1.") and v2.startswith("2.")
        # A turn that started from v1 (another replica's stale copy) is refused, and nothing of it lands.
        with pytest.raises(StaleVersion, match=f"at version {v2}, not {v1}"):
            await commit(store, "s", pending("s", {"turn": 9}, {"s.1#main": None}, [{"turn": 9}]), v1, lease)
        loaded = await store.load_session("s")
        assert loaded.version == v2 and loaded.snapshot == {"turn": 1}
        assert loaded.memories == {"s.1#main": [UserMessage("hi"), AssistantMessage("yo")]}
        assert await store.load_history("s") == [{"turn": 1, "ok": True}]
        await store.release(lease)
        await store.close()

    run(go())


def test_a_commit_without_the_lease_is_refused(url):
    async def go():
        # TTLs of seconds, not fractions: the first commit must land within the TTL even when a
        # busy machine delays this process.
        store = RedisStore(url, LeaseSettings(ttl=2.0))
        first = await store.acquire("s", wait=5)
        first.renewer.cancel()  # a replica that stopped renewing (paused, partitioned)
        version = await commit(store, "s", pending("s", {"turn": 0}), CREATE, first)
        await asyncio.sleep(3.0)  # the lease expired...
        second = await store.acquire("s", wait=5)  # ...and another request took it
        with pytest.raises(LeaseLost, match="expired"):
            await commit(store, "s", pending("s", {"turn": 1}), version, first)
        assert (await store.load_session("s")).snapshot == {"turn": 0}
        await commit(store, "s", pending("s", {"turn": 1}), version, second)
        await store.release(second)
        await store.close()

    run(go())


def test_a_held_lease_is_renewed_past_its_ttl(url):
    async def go():
        store = RedisStore(url, LeaseSettings(ttl=2.0))  # renewed every 2/3 s: a stall under 1.3 s is harmless
        lease = await store.acquire("s", wait=5)
        await asyncio.sleep(6.5)  # over three TTLs: kept alive by renewal
        assert not lease.lost
        with pytest.raises(SessionBusy):
            await store.acquire("s", wait=0.1)
        await commit(store, "s", pending("s", {"turn": 0}), CREATE, lease)
        await store.release(lease)
        await store.close()

    run(go())


def test_waiters_get_the_lease_in_arrival_order_and_reject_fails_at_once(url):
    async def go():
        stores = [RedisStore(url) for _ in range(3)]  # three replicas
        order: list[int] = []
        holder = await stores[0].acquire("s", wait=5)

        async def wait_turn(i: int) -> None:
            lease = await stores[i % 3].acquire("s", wait=10)
            order.append(i)
            await asyncio.sleep(0.02)
            await stores[i % 3].release(lease)

        tasks = []
        queue = stores[0]._key("q", "s")
        for i in range(6):
            tasks.append(asyncio.ensure_future(wait_turn(i)))
            while await stores[0].client.zcard(queue) < i + 1:  # arrived: it is in the queue
                await asyncio.sleep(0.005)
        with pytest.raises(SessionBusy, match="reject"):
            await stores[1].acquire("s", wait=10, reject=True)
        await stores[0].release(holder)
        await asyncio.gather(*tasks)
        assert order == list(range(6))
        lease = await stores[2].acquire("s", wait=1, reject=True)  # free now: reject does not fail
        await stores[2].release(lease)
        for s in stores:
            await s.close()

    run(go())


def test_a_waiter_that_gives_up_leaves_the_queue(url):
    async def go():
        store = RedisStore(url)
        holder = await store.acquire("s", wait=5)
        with pytest.raises(SessionBusy, match="stayed busy"):
            await store.acquire("s", wait=0.2)
        await store.release(holder)
        lease = await store.acquire("s", wait=0.5)  # not stuck behind the one that left
        await store.release(lease)
        await store.close()

    run(go())


def test_outcomes_are_recorded_with_the_commit_and_delete_forgets_everything(url):
    async def go():
        store = RedisStore(url)
        lease = await store.acquire("s", wait=5)
        v = await commit(store, "s", pending("s", {"turn": 0, "meta": {"owner": "ana"}}), CREATE, lease)
        entry = {"turn": 1, "ok": True, "events": [{"type": "Message", "data": "hi", "turn": 1}]}
        await commit(store, "s", pending("s", {"turn": 1}, history=[entry], request_id="r-1"), v, lease,
                           ("r-1", entry | {"requestId": "r-1"}))
        assert (await store.get_outcome("s", "r-1"))["events"][0]["data"] == "hi"
        assert await store.get_outcome("s", "r-2") is None
        assert await store.count_owned("ana") == 1 and await store.list_sessions() == ["s"]
        await store.delete_session("s", [], lease)
        assert await store.load_session("s") is None and await store.load_history("s") == []
        assert await store.get_outcome("s", "r-1") is None and await store.count_owned("ana") == 0
        await store.release(lease)
        await store.close()

    run(go())


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


def test_records_are_kept_in_redis_for_every_replica(url):
    async def scenario():
        one, two = RedisStore(url), RedisStore(url)
        try:
            assert await one.get_record("openai:x") is None
            await one.put_record("openai:x", {"session": "s1", "turn": 1})
            await two.put_record("openai:y", {"v": "é"})
            assert await two.get_record("openai:x") == {"session": "s1", "turn": 1}
            assert await one.get_record("openai:y") == {"v": "é"}
            await one.put_record("openai:x", {"turn": 2})
            assert await two.get_record("openai:x") == {"turn": 2}
        finally:
            await one.close()
            await two.close()

    run(scenario())


def test_of_two_replicas_claiming_one_key_at_once_one_gets_it(url):
    async def scenario():
        one, two = RedisStore(url), RedisStore(url)
        try:
            won = await asyncio.gather(one.claim_record("openai:k", {"by": 1}), two.claim_record("openai:k", {"by": 2}))
            assert sorted(won) == [False, True]
            assert await one.get_record("openai:k") == {"by": 1 if won[0] else 2}
            await two.delete_record("openai:k")
            assert await two.claim_record("openai:k", {"by": 2}) is True
        finally:
            await one.close()
            await two.close()

    run(scenario())


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
