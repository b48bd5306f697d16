"""Issue 33, finding 9 (costs that grow with the data): GET /pending is paged and filtered from
an index, the pending gauges read tallies, the per-principal quota and `chatrun versions list`
read counts kept by the commits. Every store (memory, a real SQLite file, a real redis-server)
keeps them true across commits, resolutions and deletes; counting wrappers show that no read
of every session is left on these paths (the old code read them all)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.server.sweeper import pending_counts
from chatrun.store import open_store
from chatrun.store.aio import LocalAsyncStore, open_async_store
from chatrun.store.record import (
    TALLY_OWNER,
    TALLY_PENDING,
    TALLY_VERSION,
    Commit,
    decode_cursor,
    encode_cursor,
    epoch_of,
    recent_key,
    tally_name,
    waiting_key,
)
from chatrun.store.redis import RedisStore
from chatrun.store.sqlite import SQLiteStore
from chatrun.store.versions import CREATE
from server_support import app_for_testclient, write_travel

T = [f"2020-01-01T00:00:0{i}+00:00" for i in range(10)]


def item(pid, kind="approval", created=T[0], by=("supervisor",)):
    return {"id": pid, "kind": kind, "created": created, "due": None, "route": "main", "scope_id": "s.1",
            "ask": f"decide {pid}", "by": list(by), "token": "secret-" + pid}


def snap(bot="refunds", *items, owner=None, version="v1", taken_over=None):
    out = {"bot": bot, "bot_version": version, "turn": 1, "scopes": [], "meta": {"owner": owner} if owner else {},
           "pending": list(items)}
    return out | ({"taken_over": taken_over} if taken_over else {})


@pytest.fixture
def loop():
    made = asyncio.new_event_loop()
    yield made
    made.close()


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.subprocess),
                        pytest.param("postgres", marks=pytest.mark.subprocess)])
def store(request, tmp_path, loop):
    if request.param == "redis":
        made = RedisStore(request.getfixturevalue("redis_server").url())
    elif request.param == "postgres":
        made = open_async_store(request.getfixturevalue("postgres_server").url())
    else:
        made = LocalAsyncStore(open_store(None if request.param == "memory" else f"sqlite:///{tmp_path}/s.db"))
    made.loop = loop  # every call of the test runs on this loop (a Redis client keeps to one)
    yield made
    loop.run_until_complete(made.close())


class Writer:
    """Commits to an AsyncStore as the server does (fenced by the version each returned)."""

    def __init__(self, store, loop=None):
        self.store, self.versions = store, {}
        self.loop = loop or store.loop

    def __call__(self, session_id, snapshot):
        commit = Commit.encode(session_id, snapshot, {}, [])
        commit.expected = self.versions.get(session_id, CREATE)
        self.versions[session_id] = self.run(self.store.commit_turn(commit, None))

    def delete(self, session_id):
        self.run(self.store.delete_session(session_id, [], None))
        self.versions.pop(session_id)

    def run(self, work):
        return self.loop.run_until_complete(work)


def pages(store, key, limit, until=None):
    """Every page of an index, following the cursor as GET /pending's `next` does."""
    out, after = [], None
    loop = store.loop
    while True:
        page = loop.run_until_complete(store.waiting_page(key, after, until, limit + 1))
        out.append([e.session_id for e in page[:limit]])
        if len(page) <= limit:
            return out
        page = page[:limit]
        after = decode_cursor(encode_cursor(page[-1].positions[key], page[-1].session_id))


def test_every_store_pages_and_filters_its_waiting_sessions_in_waiting_order(store):
    write = Writer(store)
    write("a", snap("refunds", item("p1", created=T[3])))
    write("b", snap("refunds", item("p1", "question", created=T[1], by=("backend",)),
                    item("p2", created=T[5], by=("supervisor", "finance"))))
    write("c", snap("kyc", item("p1", "question", created=T[2], by=("backend",))))
    write("d", snap("refunds"))  # waits for nothing
    write("e", snap("kyc", taken_over={"by": "olga", "since": T[4]}))
    write("f", snap("refunds", item("p1", created=T[3])))  # the same time as a: ordered by id
    assert pages(store, waiting_key(), 2) == [["b", "c"], ["a", "f"], ["e"]]
    assert pages(store, waiting_key(), 5) == [["b", "c", "a", "f", "e"]]
    assert pages(store, waiting_key(bot="refunds"), 10) == [["b", "a", "f"]]
    assert pages(store, waiting_key(kind="approval"), 10) == [["a", "f", "b"]]  # b by its approval (T5)
    assert pages(store, waiting_key(kind="takeover"), 10) == [["e"]]
    assert pages(store, waiting_key(role="finance"), 10) == [["b"]]
    assert pages(store, waiting_key("kyc", "question", "backend"), 10) == [["c"]]
    assert pages(store, waiting_key(kind="approval"), 10, until=epoch_of(T[3])) == [["a", "f"]]
    entry = write.run(store.waiting_page(waiting_key(), None, None, 1))[0]
    assert entry.shown().to_dict()["items"][0]["id"] == "p1" and "token" not in entry.items[0]  # no secret copied
    assert [i["id"] for i in entry.shown("approval").items] == ["p2"]


def said(snapshot, at, given):
    """A snapshot whose last committed turn was `given` at epoch `at` (as the server stores it)."""
    return snapshot | {"committed": {"turn": 1, "input": given, "requestId": None, "at": at}}


def test_every_store_pages_its_waiting_sessions_newest_activity_first_with_the_last_message(store):
    write = Writer(store)
    write("a", said(snap("refunds", item("p1", created=T[1])), 30.0, "Where is my refund?"))
    write("b", said(snap("refunds", item("p1", "question", created=T[2], by=("backend",))), 50.0,
                    {"userMessage": "hello", "attachments": []}))
    write("c", said(snap("kyc", taken_over={"by": {"name": "olga"}, "since": T[4]}), 40.0,
                    {"decision": {"kind": "operator_say", "text": "Olga here"}}))
    write("d", snap("refunds", item("p1", created=T[0])))  # no committed turn yet: not in the inbox's order
    assert pages(store, recent_key(), 2) == [["b", "c"], ["a"]]
    assert pages(store, recent_key("refunds"), 10) == [["b", "a"]]
    assert pages(store, recent_key(kind="takeover"), 10) == [["c"]]
    assert pages(store, recent_key("refunds", "approval"), 10) == [["a"]]
    write("a", said(snap("refunds", item("p1", created=T[1])), 60.0, "Hello??"))  # a new message: on top
    assert pages(store, recent_key(), 10) == [["a", "b", "c"]]
    shown = {e.session_id: e.shown().to_dict()["last"] for e in write.run(store.waiting_page(recent_key(), None, None, 9))}
    assert shown == {"a": {"at": 60.0, "from": "user", "text": "Hello??"},
                     "b": {"at": 50.0, "from": "user", "text": "hello"},
                     "c": {"at": 40.0, "from": "operator", "text": "Olga here", "by": "olga"}}  # who spoke: the holder


def test_the_index_and_the_tallies_stay_true_when_items_are_resolved_and_sessions_deleted(store):
    write = Writer(store)
    write("a", snap("refunds", item("p1"), item("p2", "question"), owner="ana", version="v1"))
    write("b", snap("refunds", item("p1", created=T[2]), owner="ana", version="v1"))
    write("c", snap("refunds", owner="bob", version="v2"))
    tallies = write.run(store.read_tallies(TALLY_PENDING))
    assert tallies == {tally_name("refunds", "approval"): 2, tally_name("refunds", "question"): 1}
    write("a", snap("refunds", item("p2", "question"), owner="ana", version="v2"))  # p1 decided; moved to v2
    assert pages(store, waiting_key(kind="approval"), 10) == [["b"]]
    assert write.run(store.read_tallies(TALLY_VERSION)) == {tally_name("refunds", "v1"): 1,
                                                            tally_name("refunds", "v2"): 2}
    write("a", snap("refunds", owner="ana", version="v2"))  # expired: nothing waits
    write.delete("b")
    assert pages(store, waiting_key(), 10) == [[]]
    assert write.run(store.read_tallies(TALLY_PENDING)) == {}
    assert write.run(store.read_tallies(TALLY_VERSION)) == {tally_name("refunds", "v2"): 2}
    assert write.run(store.count_owned("ana")) == 1 and write.run(store.count_owned("bob")) == 1
    write.delete("a")
    write.delete("c")
    assert write.run(store.count_owned("ana")) == 0 and write.run(store.read_tallies(TALLY_OWNER)) == {}
    write("a", snap("refunds", owner="ana"))  # an id used again counts afresh
    assert write.run(store.count_owned("ana")) == 1


def test_the_gauges_read_the_tallies_and_the_oldest_of_each_kind(store):
    write = Writer(store)
    write("a", snap("refunds", item("p1", created=T[1]), item("p2", created=T[3])))
    write("b", snap("kyc", item("p1", "question", created=T[2])))
    now = epoch_of(T[9])
    assert write.run(pending_counts(store, now)) == {("refunds", "approval"): (2, 8.0), ("kyc", "question"): (1, 7.0)}


class Counting:
    """An AsyncStore that counts the reads of whole sessions and of the session list."""

    def __init__(self, inner):
        self.inner, self.reads = inner, 0

    def __getattr__(self, name):
        found = getattr(self.inner, name)
        if name in ("load_session", "list_sessions", "list_pending"):
            async def counted(*args, **kwargs):
                self.reads += 1
                return await found(*args, **kwargs)
            return counted
        return found


def test_the_gauges_the_quota_and_versions_read_no_session(loop):
    inner = LocalAsyncStore(open_store(None))
    write = Writer(inner, loop)
    for n in range(50):
        write(f"s{n}", snap("refunds", item("p1"), owner="ana"))
    store = Counting(inner)
    assert write.run(pending_counts(store, time.time()))[("refunds", "approval")][0] == 50
    assert write.run(store.count_owned("ana")) == 50
    assert write.run(store.read_tallies(TALLY_VERSION, [tally_name("refunds", "v1")])) == {
        tally_name("refunds", "v1"): 50}
    assert store.reads == 0


def test_a_sqlite_quota_is_a_tally_not_a_scan_and_an_old_file_is_counted_when_upgraded(tmp_path):
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        store.commit_turn("a", snap(owner="ana"), {}, [], CREATE)
    raw = sqlite3.connect(path)  # a row no commit wrote: the tally does not see it (a scan would)
    raw.execute("INSERT INTO sessions (session_id, snapshot, updated_at, version) VALUES ('x', ?, 0, '1.a')",
                (json.dumps(snap("refunds", item("p1"), owner="ana")),))
    raw.commit()
    with SQLiteStore(path) as store:
        assert store.count_owned("ana") == 1
    raw.execute("PRAGMA user_version=4")  # as chatrun before issue 33 left it: the upgrade counts every session
    raw.commit()
    raw.close()
    with SQLiteStore(path) as store:
        assert store.count_owned("ana") == 2
        assert [e.session_id for e in store.waiting_page(waiting_key(), None, None, 10)] == ["x"]
        assert store.read_tallies(TALLY_PENDING) == {tally_name("refunds", "approval"): 1}


def test_a_redis_store_written_before_the_index_is_indexed_at_the_first_read(redis_server):
    url = redis_server.url()

    async def go():
        store = RedisStore(url)
        try:
            commit = Commit.encode("old", snap("refunds", item("p1"), owner="ana"), {}, [])
            commit.expected = CREATE
            await store.commit_turn(commit, None)
            await store.put_record("bot-version:refunds:v1", {"label": "1"})
            # As an older chatrun left it: no tallies, no waiting entry, no records' index.
            prefix = store.prefix
            await store.client.hdel(f"{prefix}s:old", "tl")
            await store.client.delete(f"{prefix}w:old", f"{prefix}t:owner", f"{prefix}t:pending",
                                      f"{prefix}t:version", f"{prefix}recs", f"{prefix}flat",
                                      *[k async for k in store.client.scan_iter(match=f"{prefix}wi:*")])
        finally:
            await store.close()
        fresh = RedisStore(url)
        try:
            assert [e.session_id for e in await fresh.waiting_page(waiting_key(), None, None, 10)] == ["old"]
            assert await fresh.read_tallies(TALLY_VERSION) == {tally_name("refunds", "v1"): 1}
            assert await fresh.record_keys("bot-version:") == ["bot-version:refunds:v1"]
            again = RedisStore(url)  # a second reader finds it marked: counts are not doubled
            assert await again.read_tallies(TALLY_PENDING) == {tally_name("refunds", "approval"): 1}
            await again.close()
        finally:
            await fresh.close()

    asyncio.run(go())


# -- GET /pending over HTTP ---------------------------------------------------------------------

AUTH = "tokens:\n  olga-token-12: {principal: olga, roles: [operators]}\n"
OLGA = {"Authorization": "Bearer olga-token-12"}


def test_get_pending_is_paged_with_a_cursor_and_reads_no_session(fake, tmp_path):
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    db = tmp_path / "s.db"
    with SQLiteStore(db) as direct:
        for n in range(7):
            direct.commit_turn(f"s{n}", snap("travel", item("p1", created=T[n])), {}, [], CREATE)
        direct.commit_turn("idle", snap("travel"), {}, [], CREATE)
    app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path))], f"sqlite:///{db}", auth=str(auth))
    with TestClient(app) as client:
        registry = app.state.registry
        counting = registry.store = Counting(registry.store)
        seen, cursor = [], None
        while True:
            body = client.get("/pending", params={"limit": 3} | ({"cursor": cursor} if cursor else {}),
                              headers=OLGA).json()
            seen.append([s["session"] for s in body["sessions"]])
            cursor = body["next"]
            if cursor is None:
                break
        assert seen == [["s0", "s1", "s2"], ["s3", "s4", "s5"], ["s6"]]
        assert all("token" not in i for s in client.get("/pending", headers=OLGA).json()["sessions"]
                   for i in s["items"])
        assert client.get("/pending?limit=2&older_than=0", headers=OLGA).json()["next"] is not None
        bad = client.get("/pending?cursor=nonsense", headers=OLGA)
        assert bad.status_code == 400 and "cursor" in bad.json()["message"]
        assert client.get("/pending?limit=0", headers=OLGA).status_code in (400, 422)
        assert counting.reads == 0  # the old list read every waiting session's snapshot
