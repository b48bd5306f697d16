"""Issue 22, the stores' side: a session's pending items (the snapshot's "pending") are read by
store/record.py only, and indexed by every store with the commit that changes them: the
earliest due time (`list_due`, what the sweeper polls) and which sessions wait
(`list_pending`, the operators' list). Real SQLite files and a real redis-server."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from chatrun.store import PendingIndex, open_store
from chatrun.store.aio import LocalAsyncStore
from chatrun.store.buffer import TurnBuffer
from chatrun.store.record import Commit, SessionRecord, epoch_of, forked_snapshot
from chatrun.store.redis import RedisStore
from chatrun.store.sqlite import SCHEMA_VERSION, SQLiteStore
from chatrun.store.versions import CREATE

T0 = "2030-01-01T00:00:00+00:00"
T1 = "2030-01-01T00:30:00+00:00"
T2 = "2030-01-02T00:00:00+00:00"


def item(pid, kind="approval", due=None, **extra):
    return {"id": pid, "kind": kind, "created": T0, "due": due, "route": "main", "scope_id": "s.1",
            "ask": f"decide {pid}", "by": ["supervisor"]} | extra


def snap(bot="refunds", *items, owner=None):
    return {"bot": bot, "turn": 1, "scopes": [], "meta": {"owner": owner} if owner else {},
            "pending": list(items)}


def test_the_record_reads_the_pending_items_their_earliest_due_time_and_kinds():
    record = SessionRecord.of("s", snap("b", item("p1", due=T2), item("p2", "question", due=T1),
                                        item("p3", "takeover")), "1.x", "{}")
    assert [i["id"] for i in record.pending] == ["p1", "p2", "p3"]
    assert record.due == T1 and record.pending_kinds == ["approval", "question", "takeover"]
    assert SessionRecord.of("s", {"bot": "b"}, "1.x", "{}").due is None
    commit = Commit.encode("s", snap("b", item("p1", due=T2), item("p2", due="2030-01-01T00:30:00")), {}, [])
    assert commit.due == epoch_of(T1) and commit.pending_count == 2  # no zone: UTC
    assert Commit.encode("s", snap("b"), {}, []).due is None


def test_an_unreadable_due_time_counts_as_due_now_so_a_timeout_is_never_lost():
    commit = Commit.encode("s", snap("b", item("p1", due="next tuesday")), {}, [])
    assert commit.due == 0.0


def test_a_later_commit_of_the_same_request_decides_the_index():
    first = Commit.encode("s", snap("b", item("p1", due=T1)), {}, [])
    first.merge(Commit.encode("s", snap("b"), {}, []))
    assert first.due is None and first.pending_count == 0


def test_a_fork_does_not_copy_the_decisions_its_original_waits_for():
    forked = forked_snapshot({"id": "a", "scopes": [], "pending": [item("p1")]}, "a", "b", 1)
    assert "pending" not in forked


def exercise(store):
    """What every store must do, through its synchronous interface."""
    assert isinstance(store, PendingIndex)
    v = store.commit_turn("s1", snap("refunds", item("p1", due=T1)), {}, [], CREATE)
    store.commit_turn("s2", snap("refunds", item("p1", "question", due=T0), item("p2", "takeover")), {}, [], CREATE)
    store.commit_turn("s3", snap("onboarding", item("p1", "question")), {}, [], CREATE)
    store.commit_turn("s4", snap("refunds"), {}, [], CREATE)
    assert store.list_due(epoch_of(T0) - 1) == []
    assert store.list_due(epoch_of(T2)) == ["s2", "s1"]  # earliest first
    assert store.list_due(epoch_of(T0)) == ["s2"]
    listed = {p.session_id: [i["id"] for i in p.items] for p in store.list_pending()}
    assert listed == {"s1": ["p1"], "s2": ["p1", "p2"], "s3": ["p1"]}
    assert [p.session_id for p in store.list_pending(bot="onboarding")] == ["s3"]
    questions = store.list_pending(kind="question")
    assert sorted((p.session_id, p.bot) for p in questions) == [("s2", "refunds"), ("s3", "onboarding")]
    assert [i["kind"] for p in questions for i in p.items] == ["question", "question"]
    # The decision's commit takes s1 out of both indexes; a deleted session leaves them too.
    store.commit_turn("s1", snap("refunds"), {}, [], v)
    store.delete_session("s2", [])
    assert store.list_due(epoch_of(T2)) == []
    assert [p.session_id for p in store.list_pending()] == ["s3"]


def test_the_in_memory_store_indexes_pending_items():
    exercise(open_store("memory://"))


def test_the_sqlite_store_indexes_pending_items_and_keeps_them_across_a_reopen(tmp_path):
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        exercise(store)
        store.commit_turn("s5", snap("refunds", item("p1", due=T1)), {}, [], CREATE)
    with SQLiteStore(path) as store:
        assert store.list_due(epoch_of(T2)) == ["s5"]
        assert [p.session_id for p in store.list_pending(bot="refunds")] == ["s5"]
        plan = " ".join(str(r) for r in store._conn.execute(
            "EXPLAIN QUERY PLAN SELECT session_id FROM sessions WHERE due IS NOT NULL AND due <= 1 ORDER BY due"))
        assert "sessions_due" in plan  # the sweeper's poll is an index range, not a scan


def test_a_schema_3_sqlite_file_is_upgraded_and_its_sessions_wait_for_nothing(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, snapshot TEXT NOT NULL, "
                       "updated_at REAL NOT NULL, version TEXT NOT NULL DEFAULT '');"
                       "INSERT INTO sessions VALUES ('old', '{\"bot\": \"b\"}', 0, '3.abc');"
                       "PRAGMA user_version=3;")
    conn.close()
    with SQLiteStore(path) as store:
        assert store.list_due(epoch_of(T2)) == [] and store.list_pending() == []
        store.commit_turn("old", snap("b", item("p1", due=T0)), {}, [], "3.abc")
        assert store.list_due(epoch_of(T2)) == ["old"]
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


class Plain:
    """A user's own SessionStore without the index: the server scans it."""

    def __init__(self):
        self.inner = open_store("memory://")

    def __getattr__(self, name):
        if name in ("list_due", "list_pending", "read_session", "write_commit"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_a_store_without_the_index_is_scanned():
    plain = Plain()
    store = LocalAsyncStore(plain)  # type: ignore[arg-type]
    assert not isinstance(plain, PendingIndex)
    plain.commit_turn("a", snap("b", item("p1", due=T1)), {}, [], CREATE)
    plain.commit_turn("z", snap("b"), {}, [], CREATE)
    assert asyncio.run(store.list_due(epoch_of(T2))) == ["a"]
    assert [p.session_id for p in asyncio.run(store.list_pending())] == ["a"]


def redis_commit(session_id, snapshot, expected):
    buffer = TurnBuffer(session_id)
    buffer.commit_turn(session_id, snapshot, {}, [])
    commit = buffer.take()
    commit.expected = expected
    return commit


def test_the_redis_store_updates_its_due_index_in_the_commit_script_and_drops_it_with_the_session(redis_server):
    async def go():
        store = RedisStore(redis_server.url())
        try:
            v = await store.commit_turn(redis_commit("s1", snap("refunds", item("p1", due=T1)), CREATE), None)
            await store.commit_turn(redis_commit("s2", snap("refunds", item("p1", "question", due=T0),
                                                             item("p2", "takeover")), CREATE), None)
            await store.commit_turn(redis_commit("s3", snap("kyc", item("p1", "question")), CREATE), None)
            assert await store.list_due(epoch_of(T2)) == ["s2", "s1"]
            assert await store.list_due(epoch_of(T0)) == ["s2"]
            listed = {p.session_id: [i["id"] for i in p.items] for p in await store.list_pending()}
            assert listed == {"s1": ["p1"], "s2": ["p1", "p2"], "s3": ["p1"]}
            assert [p.session_id for p in await store.list_pending(bot="kyc")] == ["s3"]
            assert [p.session_id for p in await store.list_pending(kind="takeover")] == ["s2"]
            await store.commit_turn(redis_commit("s1", snap("refunds"), v), None)
            await store.delete_session("s2", [], None)
            assert await store.list_due(epoch_of(T2)) == []
            assert [p.session_id for p in await store.list_pending()] == ["s3"]
            # A refused (stale) commit changes no index either.
            with pytest.raises(Exception, match="version"):
                await store.commit_turn(redis_commit("s1", snap("refunds", item("p9", due=T0)), v), None)
            assert await store.list_due(epoch_of(T2)) == []
        finally:
            await store.close()

    asyncio.run(go())


def test_a_conversation_an_operator_holds_is_listed_for_operators_until_released():
    store = open_store("memory://")
    v = store.commit_turn("t", {"bot": "b", "scopes": [], "taken_over": {"by": "olga", "since": T0}}, {}, [], CREATE)
    listed = store.list_pending(kind="takeover")
    assert [(p.session_id, p.items, p.taken_over) for p in listed] == [("t", [], {"by": "olga", "since": T0})]
    assert store.list_pending(kind="approval") == []
    store.commit_turn("t", {"bot": "b", "scopes": []}, {}, [], v)
    assert store.list_pending() == []
