"""Issue 38: ONE store conformance suite. Every durable store (a real SQLite file, a real
redis-server, a real PostgreSQL) keeps the same contract, through the server's interface
(chatrun.store.aio.AsyncStore): fenced commits that land whole or not at all, history and
recorded outcomes, records and claims, the pending index, the outbox with its claims, files,
bot versions (records listed by prefix), retention's indexes, deletes that forget everything,
and, for the stores replicas share, leases (FIFO queue, reject, expiry, renewal).

The same contract, store by store, is also run by tests/test_flat_costs.py (the operators'
index and tallies) and tests/test_retention.py (retention and erasure), parametrized over the
same stores (tests/store_params.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from chatrun.errors import ChatrunError
from chatrun.messages import AssistantMessage, UserMessage
from chatrun.store.aio import LeaseSettings, open_async_store
from chatrun.store.blobs import blobs_of
from chatrun.store.record import DEAD, Commit, epoch_of
from chatrun.store.versions import CREATE, LeaseLost, SessionBusy, StaleVersion
from store_params import DISTRIBUTED, STORES, store_url

T0, T1, T2 = "2030-01-01T00:00:00+00:00", "2030-01-01T00:30:00+00:00", "2030-01-02T00:00:00+00:00"


@pytest.fixture(params=STORES)
def url(request, tmp_path):
    return store_url(request, tmp_path)


@pytest.fixture(params=DISTRIBUTED)
def shared_url(request, tmp_path):
    return store_url(request, tmp_path)


def run(work):
    return asyncio.run(work)


def commit_of(session_id, snapshot, memories=None, history=None, expected=CREATE, outcome=None):
    commit = Commit.encode(session_id, snapshot, memories or {}, history or [])
    commit.expected = expected
    if outcome is not None:
        commit.outcome = (outcome[0], json.dumps(outcome[1], ensure_ascii=False))
    return commit


def test_a_commit_lands_whole_and_only_from_the_version_it_started_from(url):
    async def go():
        store = open_async_store(url)
        lease = await store.acquire("s", wait=5)
        v1 = await store.commit_turn(commit_of("s", {"turn": 0}), lease)
        with pytest.raises(StaleVersion, match="already exists"):
            await store.commit_turn(commit_of("s", {"turn": 0}), lease)
        memories = {"s.1#main": [UserMessage("hi"), AssistantMessage("yo")]}
        v2 = await store.commit_turn(commit_of("s", {"turn": 1}, memories, [{"turn": 1, "ok": True}], v1), lease)
        assert v1.startswith("1.") and v2.startswith("2.") and await store.version("s") == v2
        # A turn that started from v1 (another replica's stale copy) is refused, and nothing of it lands.
        with pytest.raises(StaleVersion, match=f"at version {v2}, not {v1}"):
            await store.commit_turn(commit_of("s", {"turn": 9}, {"s.1#main": None}, [{"turn": 9}], v1), lease)
        loaded = await store.load_session("s")
        assert loaded.version == v2 and loaded.snapshot == {"turn": 1}
        assert await store.load_history("s") == [{"turn": 1, "ok": True}]
        await store.release(lease)
        with pytest.raises(StaleVersion, match="deleted meanwhile"):
            await store.commit_turn(commit_of("gone", {"turn": 1}, expected=v2), None)
        await store.close()

    run(go())


def test_memories_named_by_the_snapshot_round_trip_and_a_none_deletes_one(url):
    async def go():
        store = open_async_store(url)
        snapshot = {"turn": 1, "scopes": [{"id": "s.1", "memory_routes": ["main", "side"]}]}
        said = [UserMessage("héllo ✓"), AssistantMessage("yo")]
        v = await store.commit_turn(commit_of("s", snapshot, {"s.1#main": said, "s.1#side": said[:1]}), None)
        loaded = await store.load_session("s")
        assert loaded.memories == {"s.1#main": said, "s.1#side": said[:1]}
        await store.commit_turn(commit_of("s", snapshot, {"s.1#side": None}, expected=v), None)
        memories = (await store.load_session("s")).memories  # a deleted memory reads as empty (Redis: absent)
        assert memories["s.1#main"] == said and memories.get("s.1#side", []) == []
        await store.close()

    run(go())


def test_history_appends_and_outcomes_are_recorded_with_the_commit_and_delete_forgets_everything(url):
    async def go():
        store = open_async_store(url)
        v = await store.commit_turn(commit_of("s", {"turn": 0, "meta": {"owner": "ana"}}, history=[{"turn": 0}]),
                                    None)
        entry = {"turn": 1, "ok": True, "events": [{"type": "Message", "data": "hi", "turn": 1}]}
        await store.commit_turn(commit_of("s", {"turn": 1, "meta": {"owner": "ana"}}, history=[entry], expected=v,
                                          outcome=("r-1", entry | {"requestId": "r-1"})), None)
        assert [e["turn"] for e in await store.load_history("s")] == [0, 1]
        assert (await store.get_outcome("s", "r-1"))["events"][0]["data"] == "hi"
        assert await store.get_outcome("s", "r-2") is None
        assert await store.count_owned("ana") == 1 and await store.list_sessions() == ["s"]
        assert await store.sessions_of("ana") == ["s"]
        await store.delete_session("s", [], None)
        assert await store.load_session("s") is None and await store.load_history("s") == []
        assert await store.get_outcome("s", "r-1") is None and await store.count_owned("ana") == 0
        assert await store.list_sessions() == [] and await store.sessions_of("ana") == []
        await store.close()

    run(go())


def test_sessions_are_listed_oldest_first(url):
    async def go():
        store = open_async_store(url)
        for sid in ("c", "a", "b"):
            await store.commit_turn(commit_of(sid, {"turn": 0}), None)
        assert await store.list_sessions() == ["c", "a", "b"]
        await store.close()

    run(go())


def test_records_are_saved_replaced_claimed_once_and_listed_by_prefix(url):
    async def go():
        one, two = open_async_store(url), open_async_store(url)
        assert await one.get_record("openai:x") is None
        await one.put_record("openai:x", {"session": "s1", "turn": 1})
        await two.put_record("openai:y", {"v": "é"})
        assert await two.get_record("openai:x") == {"session": "s1", "turn": 1}
        await one.put_record("openai:x", {"turn": 2})
        assert await two.get_record("openai:x") == {"turn": 2}
        won = await asyncio.gather(one.claim_record("idem:k", {"by": 1}), two.claim_record("idem:k", {"by": 2}))
        assert sorted(won) == [False, True]
        assert await one.get_record("idem:k") == {"by": 1 if won[0] else 2}
        await two.delete_record("idem:k")
        assert await two.claim_record("idem:k", {"by": 2}) is True
        # Bot versions are records listed by prefix (chatrun.server.versions): a range, in key order.
        for key in ("version:shop:b", "version:shop:a", "version:shopx:a", "version:shoq"):
            await one.put_record(key, {"k": key})
        assert await two.record_keys("version:shop:") == ["version:shop:a", "version:shop:b"]
        with pytest.raises(ChatrunError):
            await one.put_record("bad", {"x": object()})
        await one.close()
        await two.close()

    run(go())


def test_a_sessions_records_go_with_it_unless_since_saved_for_another(url):
    async def go():
        store = open_async_store(url)
        for sid in ("r1", "r2"):
            await store.commit_turn(commit_of(sid, {"turn": 0}), None)
        await store.put_record("a", {"v": 1}, "r1")
        await store.put_record("shared", {"v": 1}, "r1")
        await store.put_record("shared", {"v": 2}, "r2")  # since saved for r2: r2's now
        await store.put_record("free", {"v": 1})
        await store.delete_session("r1", [], None)
        assert [await store.get_record(k) for k in ("a", "shared", "free")] == [None, {"v": 2}, {"v": 1}]
        await store.delete_session("r2", [], None)
        assert [await store.get_record(k) for k in ("shared", "free")] == [None, {"v": 1}]
        await store.close()

    run(go())


def test_the_v1_indexs_list_given_as_its_text_is_saved_as_put_record_saves_it(url):
    # The /v1 index writes its list of kept turns from its entries' texts where the store takes a
    # record's text (put_record_text; issue 39): read back as the record, gone with its session.
    from chatrun.server.openai_sessions import _Kept, _put_kept

    async def go():
        store = open_async_store(url)
        await store.commit_turn(commit_of("r1", {"turn": 0}), None)
        listed = {"turns": [[1, ["openai:prefix:é"]], [2, []]], "states": [[1, None], [2, 1]]}

        async def work(records):
            await _put_kept(records, "openai:turns:r1", _Kept.read(listed), "r1")

        in_one_call = getattr(store, "in_one_call", None)
        await (in_one_call(work) if in_one_call is not None else work(store))
        assert await store.get_record("openai:turns:r1") == listed
        await store.delete_session("r1", [], None)
        assert await store.get_record("openai:turns:r1") is None
        await store.close()

    run(go())


def item(pid, kind="approval", due=None):
    return {"id": pid, "kind": kind, "created": T0, "due": due, "route": "main", "scope_id": "s.1",
            "ask": f"decide {pid}", "by": ["supervisor"]}


def snap(bot, *items):
    return {"bot": bot, "turn": 1, "scopes": [], "meta": {}, "pending": list(items)}


def test_pending_items_are_indexed_by_due_time_and_kind_and_leave_with_their_decision(url):
    async def go():
        store = open_async_store(url)
        v = await store.commit_turn(commit_of("s1", snap("refunds", item("p1", due=T1))), None)
        await store.commit_turn(commit_of("s2", snap("refunds", item("p1", "question", due=T0),
                                                     item("p2", "takeover"))), None)
        await store.commit_turn(commit_of("s3", snap("onboarding", item("p1", "question"))), None)
        await store.commit_turn(commit_of("s4", snap("refunds")), None)
        assert await store.list_due(epoch_of(T0) - 1) == []
        assert await store.list_due(epoch_of(T2)) == ["s2", "s1"]  # earliest first
        listed = {p.session_id: [i["id"] for i in p.items] for p in await store.list_pending()}
        assert listed == {"s1": ["p1"], "s2": ["p1", "p2"], "s3": ["p1"]}
        assert [p.session_id for p in await store.list_pending(bot="onboarding")] == ["s3"]
        questions = await store.list_pending(kind="question")
        assert sorted((p.session_id, p.bot) for p in questions) == [("s2", "refunds"), ("s3", "onboarding")]
        await store.commit_turn(commit_of("s1", snap("refunds"), expected=v), None)  # decided
        await store.delete_session("s2", [], None)
        assert await store.list_due(epoch_of(T2)) == []
        assert [p.session_id for p in await store.list_pending()] == ["s3"]
        await store.close()

    run(go())


B_CRM = ["b/crm"]  # the route (bot b, sink crm) of the entries below


def test_the_outbox_keeps_committed_turns_events_and_hands_each_entry_to_one_claim(url):
    async def go():
        store = open_async_store(url)
        body = {"id": "evt_1", "type": "T", "data": 1, "turn": 1, "session": "s", "bot": "b", "created": 100.0}
        ok = {"turn": 1, "ok": True, "outbox": [{"sink": "crm", "body": body}]}
        failed = {"turn": 2, "ok": False, "outbox": [{"sink": "crm", "body": body | {"id": "evt_2"}}]}
        other = {"turn": 3, "ok": True, "outbox": [{"sink": "erp", "body": body | {"id": "evt_3"}}]}
        await store.commit_turn(commit_of("s", {"id": "s"}, history=[ok, failed, other]), None)
        assert [e.id for e in await store.list_outbox()] == ["evt_1", "evt_3"]
        first = await store.claim_outbox(now=200.0, lease=30, limit=10, routes=B_CRM)
        assert [e.id for e in first] == ["evt_1"]
        assert await store.claim_outbox(now=210.0, lease=30, limit=10, routes=B_CRM) == []
        second = await store.claim_outbox(now=231.0, lease=30, limit=10, routes=B_CRM)  # the claim ran out
        assert [e.id for e in second] == ["evt_1"] and second[0].claim != first[0].claim
        assert await store.settle_outbox(first[0], delivered=True) is False  # the old claim settles nothing
        second[0].attempts, second[0].state, second[0].error = 1, DEAD, "answered 500"
        assert await store.settle_outbox(second[0], delivered=False) is True
        assert await store.claim_outbox(now=1e12, lease=30, limit=10, routes=B_CRM) == []  # dead: never claimed
        assert [e.error for e in await store.list_outbox(DEAD)] == ["answered 500"]
        assert await store.requeue_outbox("evt_1", now=300.0) and not await store.requeue_outbox("evt_1", now=300.0)
        third = await store.claim_outbox(now=300.0, lease=30, limit=10, routes=B_CRM)
        assert third[0].attempts == 0 and await store.settle_outbox(third[0], delivered=True)
        assert [e.id for e in await store.list_outbox()] == ["evt_3"]
        assert await store.delete_outbox(["evt_3", "nothing"]) == 1 and await store.list_outbox() == []
        await store.close()

    run(go())


def test_two_workers_claiming_at_once_never_take_one_entry_twice(url):
    async def go():
        one, two = open_async_store(url), open_async_store(url)
        events = [{"sink": "crm", "body": {"id": f"e{i}", "type": "T", "data": i, "turn": 1, "session": "s",
                                           "bot": "b", "created": 1.0}} for i in range(20)]
        await one.commit_turn(commit_of("s", {"id": "s"}, history=[{"turn": 1, "ok": True, "outbox": events}]), None)
        claims = await asyncio.gather(*[(one if i % 2 else two).claim_outbox(10.0, 30, 3, B_CRM) for i in range(10)])
        ids = [e.id for claim in claims for e in claim]
        assert sorted(ids) == sorted(f"e{i}" for i in range(20)) and len(ids) == len(set(ids))
        await one.close()
        await two.close()

    run(go())


def test_files_are_kept_once_per_session_capped_and_deleted_with_it(url):
    async def go():
        store = open_async_store(url + ("&" if "?" in url else "?") + "max_blob_files=2")
        blobs = blobs_of(store)
        await store.commit_turn(commit_of("s", {"turn": 0}), None)
        photo = blobs.put("s", b"\x89PNG" + bytes(range(256)), "image/png", "a.png")
        again = blobs.put("s", b"\x89PNG" + bytes(range(256)), "image/png", "b.png")
        assert photo.ref == again.ref and blobs.refs("s") == [photo.ref]
        assert blobs.read("s", photo.ref) == b"\x89PNG" + bytes(range(256)) and blobs.read("t", photo.ref) is None
        blobs.put("s", b"second", "text/plain")
        with pytest.raises(ChatrunError, match="max_blob_files"):
            blobs.put("s", b"third", "text/plain")
        await store.delete_session("s", [], None)
        blobs.delete_session("s")  # as retention and DELETE do (Redis and Postgres drop them in the delete too)
        assert blobs.refs("s") == [] and blobs.read("s", photo.ref) is None
        await store.close()

    run(go())


def test_idle_sessions_are_found_by_bot_longest_idle_first(url):
    async def go():
        store = open_async_store(url)
        for sid, bot, at in (("a", "shop", 300.0), ("b", "shop", 100.0), ("c", "crm", 50.0), ("d", "shop", 900.0)):
            store_of(store).clock = lambda at=at: at
            await store.commit_turn(commit_of(sid, {"bot": bot, "turn": 0}), None)
        assert await store.list_idle("shop", before=500.0, limit=10) == ["b", "a"]
        assert await store.list_idle("shop", before=500.0, limit=1) == ["b"]
        assert await store.list_idle("crm", before=500.0, limit=10) == ["c"]
        await store.close()

    run(go())


def store_of(store):
    """The object whose clock dates commits (a local store's wrapped store, else the store)."""
    return getattr(store, "sync", store)


# -- leases: the stores replicas share ------------------------------------------------------------

def test_a_commit_without_the_lease_is_refused(shared_url):
    async def go():
        store = open_async_store(shared_url, LeaseSettings(ttl=2.0))
        first = await store.acquire("s", wait=5)
        first.renewer.cancel()  # a replica that stopped renewing (paused, partitioned)
        version = await store.commit_turn(commit_of("s", {"turn": 0}), first)
        await asyncio.sleep(3.0)  # the lease expired...
        second = await store.acquire("s", wait=5)  # ...and another request took it
        with pytest.raises(LeaseLost, match="expired"):
            await store.commit_turn(commit_of("s", {"turn": 1}, expected=version), first)
        assert (await store.load_session("s")).snapshot == {"turn": 0}
        await store.commit_turn(commit_of("s", {"turn": 1}, expected=version), second)
        await store.release(second)
        await store.close()

    run(go())


def test_a_held_lease_is_renewed_past_its_ttl(shared_url):
    async def go():
        store = open_async_store(shared_url, LeaseSettings(ttl=2.0))  # renewed every 2/3 s
        lease = await store.acquire("s", wait=5)
        await asyncio.sleep(6.5)  # over three TTLs: kept alive by renewal
        assert not lease.lost
        with pytest.raises(SessionBusy):
            await store.acquire("s", wait=0.1)
        await store.commit_turn(commit_of("s", {"turn": 0}), lease)
        await store.release(lease)
        await store.close()

    run(go())


def test_waiters_get_the_lease_in_arrival_order_and_reject_fails_at_once(shared_url):
    async def go():
        stores = [open_async_store(shared_url) for _ in range(3)]  # three replicas
        order: list[int] = []
        holder = await stores[0].acquire("s", wait=5)

        async def wait_turn(i: int) -> None:
            lease = await stores[i % 3].acquire("s", wait=20)
            order.append(i)
            await asyncio.sleep(0.02)
            await stores[i % 3].release(lease)

        tasks = []
        for i in range(6):
            tasks.append(asyncio.ensure_future(wait_turn(i)))
            while not await _queued(stores[0], i + 1):  # arrived: it is in the queue
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


async def _queued(store, n: int) -> bool:
    """At least `n` requests wait in session s's queue (read as each store keeps it)."""
    if hasattr(store, "client"):  # Redis
        return await store.client.zcard(store._key("q", "s")) >= n
    row = await store._one("count", "SELECT count(*) FROM lease_queue WHERE session_id = 's'")
    return row[0] >= n


def test_a_waiter_that_gives_up_leaves_the_queue(shared_url):
    async def go():
        store = open_async_store(shared_url)
        holder = await store.acquire("s", wait=5)
        with pytest.raises(SessionBusy, match="stayed busy"):
            await store.acquire("s", wait=0.2)
        await store.release(holder)
        lease = await store.acquire("s", wait=0.5)  # not stuck behind the one that left
        await store.release(lease)
        await store.close()

    run(go())
