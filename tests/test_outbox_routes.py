"""Issue 33, finding 4: an outbox worker claims only the entries of the routes (a bot's name and
a sink's name) it serves; the others stay pending, unclaimed, for a replica that serves them,
and are reported once long overdue, never made dead letters. The store's claim filter on every
store (memory, SQLite, real Redis, including entries an older chatrun queued in Redis's one
queue), and the worker in process. The mixed fleet of `chatrun serve` replicas is in
test_outbox_fleet.py."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

import chatrun
from chatrun.server.metrics import ServerMetrics
from chatrun.server.outbox import OutboxSettings, OutboxWorker
from chatrun.server.sessions import SessionRegistry
from chatrun.store import open_store
from chatrun.store.aio import AsyncStore, as_async_store
from chatrun.store.record import DEAD, PENDING, Commit, OutboxEntry, WaitingEntry
from chatrun.store.redis import RedisStore
from chatrun.store.versions import CREATE
from webhook_support import OPENAI_MODEL, SECRET, Receiver, survey_bot


def queued(items: list[tuple[str, str, str]], created: float = 100.0) -> Commit:
    """A committed turn of session s queuing one entry per (id, bot, sink)."""
    outbox = [{"sink": sink, "body": {"id": eid, "type": "T", "data": 1, "turn": 1, "session": "s", "bot": bot,
                                      "created": created}} for eid, bot, sink in items]
    return Commit.encode("s", {"id": "s"}, {}, [{"turn": 1, "ok": True, "outbox": outbox}], expected=CREATE)


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.subprocess)])
def make_store(request, tmp_path):
    """Opens the store (inside the test's event loop: a Redis client belongs to its loop)."""
    def make() -> AsyncStore:
        if request.param == "redis":
            return RedisStore(request.getfixturevalue("redis_server").url())
        return as_async_store(open_store("memory://" if request.param == "memory" else
                                         f"sqlite:///{tmp_path / 'o.db'}"))
    return make


def ids(entries: list[OutboxEntry]) -> set[str]:
    return {e.id for e in entries}


def test_a_claim_takes_only_the_entries_of_the_routes_it_names_and_leaves_the_others_unclaimed(make_store):
    async def go():
        store = make_store()
        await store.commit_turn(queued([("evt_a", "a", "crm"), ("evt_b", "b", "crm"), ("evt_audit", "a", "audit")]),
                                None)
        assert ids(await store.claim_outbox(200.0, 30, 10, ["a/crm"])) == {"evt_a"}
        assert await store.claim_outbox(201.0, 30, 10, ["a/crm", "c/crm"]) == []  # nothing else of its routes
        assert await store.claim_outbox(201.0, 30, 10, []) == []  # a replica with no sink claims nothing
        pending = await store.list_outbox(PENDING)
        assert ids(pending) == {"evt_a", "evt_b", "evt_audit"} and await store.list_outbox(DEAD) == []
        # The others were never claimed (no claim, no lease): due for their own workers at once.
        assert ids(await store.claim_outbox(201.0, 30, 10, ["b/crm", "a/audit"])) == {"evt_b", "evt_audit"}
        await store.close()

    asyncio.run(go())


def test_many_due_entries_of_another_route_never_starve_a_worker(make_store):
    async def go():
        store = make_store()
        await store.commit_turn(queued([(f"evt_{i}", "other", "crm") for i in range(50)], created=50.0), None)
        mine = queued([("evt_mine", "a", "crm")])
        mine.expected = (await store.version("s")) or ""
        await store.commit_turn(mine, None)
        assert ids(await store.claim_outbox(200.0, 30, 10, ["a/crm"])) == {"evt_mine"}
        assert len(await store.claim_outbox(200.0, 30, 10, ["other/crm"])) == 10  # the batch still holds
        await store.close()

    asyncio.run(go())


@pytest.mark.subprocess
def test_entries_an_older_chatrun_queued_in_the_one_redis_queue_go_to_their_routes(redis_server):
    """chatrun before issue 33 queued every entry in `<prefix>obq`: a rolling upgrade leaves
    some there (and old replicas still write there): the next claim moves them to their routes."""
    async def go():
        store = RedisStore(redis_server.url())
        for eid, bot in (("evt_old_a", "a"), ("evt_old_b", "b")):
            body = {"id": eid, "type": "T", "data": 1, "turn": 1, "session": "s", "bot": bot, "created": 100.0}
            entry = OutboxEntry(eid, "s", "crm", body, 100.0, next_at=100.0)
            await store.client.hset(f"{store.prefix}ob", eid, entry.to_json())
            await store.client.zadd(f"{store.prefix}obq", {eid: entry.due})
        assert ids(await store.list_outbox(PENDING)) == {"evt_old_a", "evt_old_b"}
        assert ids(await store.claim_outbox(200.0, 30, 10, ["a/crm"])) == {"evt_old_a"}
        assert await store.client.exists(f"{store.prefix}obq") == 0
        assert ids(await store.list_outbox(PENDING)) == {"evt_old_a", "evt_old_b"}
        [b] = await store.claim_outbox(200.0, 30, 10, ["b/crm"])
        b.attempts, b.state, b.error = 1, DEAD, "answered 500"
        assert await store.settle_outbox(b, delivered=False)
        assert await store.requeue_outbox("evt_old_b", 300.0)  # back in its route's queue
        assert ids(await store.claim_outbox(300.0, 30, 10, ["b/crm"])) == {"evt_old_b"}
        await store.close()

    asyncio.run(go())


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def test_a_worker_delivers_its_routes_and_leaves_the_others_pending_reported_once_overdue(
        tmp_path, receiver, monkeypatch, caplog):
    monkeypatch.setenv("HOOK_URL", receiver.url)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    (tmp_path / "bot.yaml").write_text(survey_bot(OPENAI_MODEL))
    bot = chatrun.load_bot(tmp_path / "bot.yaml")
    registry = SessionRegistry({"survey": bot}, open_store("memory://"))
    registry.metrics = ServerMetrics.create(registry)
    worker = OutboxWorker(registry, OutboxSettings(unserved_after=600))
    now = time.time()

    async def go():
        assert set(worker.served()) == {"survey/crm"}
        await registry.store.commit_turn(queued([("evt_other", "other", "crm"), ("evt_audit", "survey", "audit")],
                                                created=now - 3600), None)
        fresh = queued([("evt_crm", "survey", "crm"), ("evt_new", "other", "crm")], created=now)
        fresh.expected = (await registry.store.version("s")) or ""
        await registry.store.commit_turn(fresh, None)
        assert await worker.run_once() == 1
        await worker.measure()
        pending = await registry.store.list_outbox(PENDING)
        unserved = worker.report_unserved(pending, time.time())
        await worker.aclose()
        return pending, unserved

    with caplog.at_level(logging.WARNING, logger="chatrun.outbox"):
        pending, unserved = asyncio.run(go())
    assert [d.body["id"] for d in receiver.accepted()] == ["evt_crm"]
    assert ids(pending) == {"evt_other", "evt_audit", "evt_new"}
    assert all(e.attempts == 0 and e.error is None for e in pending)  # never tried, never a dead letter
    assert {route: ids(entries) for route, entries in unserved.items()} == {
        "other/crm": {"evt_other"}, "survey/audit": {"evt_audit"}}  # evt_new is not overdue yet
    warnings = [r.getMessage() for r in caplog.records if "no replica serves them" in r.getMessage()]
    assert len(warnings) == 2  # one per route: measure() warned, the second look within WARN_EVERY did not
    assert any("sink audit of bot survey have waited up to 36" in w and "serves survey/crm" in w for w in warnings)
    assert registry.metrics is not None
    text = registry.metrics.render().decode()
    assert 'chatrun_outbox_unserved_entries{bot="other",sink="crm"} 1.0' in text
    assert 'chatrun_outbox_unserved_entries{bot="survey",sink="audit"} 1.0' in text


@pytest.mark.subprocess
def test_an_entry_a_newer_chatrun_wrote_with_fields_this_one_lacks_is_claimed_listed_and_settled(redis_server):
    """A rolling deploy: a newer replica's outbox entries (and operators' index entries) may carry
    fields this chatrun does not know. They are left out; before, `cls(**json)` raised TypeError
    in the claim, after the claim script had taken the batch, so this replica delivered nothing."""
    async def go():
        store = RedisStore(redis_server.url())
        await store.commit_turn(queued([("evt_new", "a", "crm"), ("evt_mine", "a", "crm")]), None)
        text = await store.client.hget(f"{store.prefix}ob", "evt_new")
        await store.client.hset(f"{store.prefix}ob", "evt_new", json.dumps({**json.loads(text), "priority": 3}))
        assert ids(await store.list_outbox(PENDING)) == {"evt_new", "evt_mine"}
        claimed = await store.claim_outbox(200.0, 30, 10, ["a/crm"])
        assert ids(claimed) == {"evt_new", "evt_mine"}
        assert all([await store.settle_outbox(e, delivered=True) for e in claimed])
        assert await store.list_outbox() == []
        await store.close()

    asyncio.run(go())
    waiting = WaitingEntry("s", "a", None, [], None, {}, None)
    newer = json.dumps({**json.loads(waiting.to_json()), "priority": 3})
    assert WaitingEntry.from_json(newer) == waiting
