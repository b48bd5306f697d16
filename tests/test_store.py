"""Stores: the in-memory store and the SQLite store behave the same (ChatMemoryStore and
SessionStore); the SQLite store also survives a reopen, is one transaction per turn and
takes concurrent writers."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from chatrun.errors import ChatrunError
from chatrun.messages import (
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    messages_from_json,
    messages_to_json,
)
from chatrun.store import ChatMemoryStore, RecordClaims, RecordStore, SessionStore, open_store
from chatrun.store.memory import InMemoryStore
from chatrun.store.sqlite import SCHEMA_VERSION, SQLiteStore

ALL_KINDS = [
    SystemMessage("Tu es un agent de voyage. Réponds en français 🙂"),
    UserMessage("I want to fly to Dublin\nin July"),
    AssistantMessage(None, (ToolCall("call_1", "set_destination", '{"destination": "Dublin"}'), ToolCall("call_2", "cancel"))),
    ToolResultMessage("call_1", "set_destination", "Destination set"),
    ToolResultMessage("call_2", "cancel", ""),
    AssistantMessage("Done. Anything else?"),
    AssistantMessage(""),
    UserMessage(""),
]


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    if request.param == "memory":
        s = InMemoryStore()
    else:
        s = SQLiteStore(tmp_path / "chatrun.db")
    yield s
    s.close()


def test_both_protocols(store):
    assert isinstance(store, ChatMemoryStore)
    assert isinstance(store, SessionStore)


def test_records_are_saved_replaced_and_refused_when_not_json(store):
    assert isinstance(store, RecordStore)
    assert store.get_record("openai:response:r1") is None
    store.put_record("openai:response:r1", {"session": "s1", "turn": 2})
    store.put_record("openai:response:r2", {"session": "s2", "turn": 1})
    store.put_record("openai:response:r1", {"session": "s1", "turn": 3})
    assert store.get_record("openai:response:r1") == {"session": "s1", "turn": 3}
    assert store.get_record("openai:response:r2") == {"session": "s2", "turn": 1}
    with pytest.raises(ChatrunError, match="record bad"):
        store.put_record("bad", {"x": {1, 2}})
    assert store.get_record("bad") is None


def test_a_claim_saves_a_record_only_where_there_is_none(store):
    assert isinstance(store, RecordClaims)
    assert store.claim_record("openai:request:k", {"running": True}) is True
    assert store.claim_record("openai:request:k", {"running": "again"}) is False
    assert store.get_record("openai:request:k") == {"running": True}
    store.put_record("openai:request:k", {"answer": 1})  # settled: still no claim
    assert store.claim_record("openai:request:k", {"running": True}) is False
    store.delete_record("openai:request:k")  # released: the next attempt claims it
    assert store.claim_record("openai:request:k", {"running": 2}) is True
    assert store.get_record("openai:request:k") == {"running": 2}


def test_a_sessions_records_go_with_it_unless_since_saved_for_another(store):
    store.commit_turn("s1", {"turn": 1}, {}, [])
    store.commit_turn("s2", {"turn": 1}, {}, [])
    store.put_record("a", {"v": 1}, "s1")
    store.put_record("shared", {"v": 1}, "s1")
    store.put_record("shared", {"v": 2}, "s2")  # the same key, since saved for s2: it is s2's now
    store.put_record("free", {"v": 1})
    store.put_record("gone", {"v": 1}, "s2")
    store.delete_record("gone")
    store.delete_record("never-there")
    store.delete_session("s1", [])
    assert [store.get_record(k) for k in ("a", "shared", "free", "gone")] == [None, {"v": 2}, {"v": 1}, None]
    store.delete_session("s2", [])
    assert [store.get_record(k) for k in ("shared", "free")] == [None, {"v": 1}]


def test_messages_round_trip_losslessly(store):
    store.update_messages("s1#main", ALL_KINDS)
    got = store.get_messages("s1#main")
    assert got == ALL_KINDS
    assert [type(m) for m in got] == [type(m) for m in ALL_KINDS]
    assert messages_from_json(messages_to_json(got)) == ALL_KINDS


def test_unknown_memory_is_empty_update_replaces_delete_forgets(store):
    assert store.get_messages("nobody") == []
    store.update_messages("m", [UserMessage("one")])
    store.update_messages("m", [UserMessage("two")])
    assert store.get_messages("m") == [UserMessage("two")]
    store.delete_messages("m")
    assert store.get_messages("m") == []
    store.delete_messages("m")  # deleting twice is fine


def test_update_with_something_that_is_not_a_message_is_refused(store):
    store.update_messages("m", [UserMessage("kept")])
    with pytest.raises(ChatrunError, match="memory m: item 1"):
        store.update_messages("m", [UserMessage("ok"), {"role": "user", "content": "a dict"}])
    assert store.get_messages("m") == [UserMessage("kept")]


def test_commit_turn_saves_snapshot_memories_and_history(store):
    assert store.load_session("s1") is None
    assert store.load_history("s1") == []
    store.update_messages("s1#gone", [UserMessage("bye")])
    snap = {"id": "s1", "turn": 1, "scopes": [{"id": "s1", "route": "main", "local": {"x": [1, 2]}}]}
    store.commit_turn(
        "s1", snap,
        {"s1#main": [UserMessage("hi"), AssistantMessage("hello")], "s1#gone": None},
        [{"turn": 1, "input": "hi", "ok": True}],
    )
    assert store.load_session("s1") == snap
    assert store.get_messages("s1#main") == [UserMessage("hi"), AssistantMessage("hello")]
    assert store.get_messages("s1#gone") == []
    store.commit_turn("s1", snap | {"turn": 2}, {}, [{"turn": 2, "input": "more"}, {"turn": 2, "note": "b"}])
    assert store.load_session("s1")["turn"] == 2
    assert store.load_history("s1") == [
        {"turn": 1, "input": "hi", "ok": True},
        {"turn": 2, "input": "more"},
        {"turn": 2, "note": "b"},
    ]
    assert store.list_sessions() == ["s1"]


def test_loaded_values_are_copies(store):
    store.commit_turn("s1", {"state": {"a": 1}}, {}, [{"turn": 1}])
    store.load_session("s1")["state"]["a"] = 99
    store.load_history("s1")[0]["turn"] = 99
    assert store.load_session("s1") == {"state": {"a": 1}}
    assert store.load_history("s1") == [{"turn": 1}]


def test_a_callers_later_changes_to_what_it_committed_never_leak_in(store):
    snapshot, entry = {"state": {"a": 1}}, {"turn": 1, "events": [1]}
    store.commit_turn("s1", snapshot, {}, [entry])
    snapshot["state"]["a"] = 99
    entry["events"].append(2)
    assert store.load_session("s1") == {"state": {"a": 1}}
    assert store.load_history("s1") == [{"turn": 1, "events": [1]}]


def test_commit_turn_with_an_invalid_message_lands_nothing(store):
    store.commit_turn("s1", {"turn": 1}, {"s1#a": [UserMessage("a1")], "s1#b": [UserMessage("b1")]}, [{"turn": 1}])
    with pytest.raises(ChatrunError, match="memory s1#b: item 1 is a str"):
        store.commit_turn(
            "s1", {"turn": 2},
            {"s1#a": [UserMessage("a2")], "s1#b": [UserMessage("b2"), "not a message"], "s1#c": None},
            [{"turn": 2}],
        )
    assert store.load_session("s1") == {"turn": 1}
    assert store.get_messages("s1#a") == [UserMessage("a1")]
    assert store.get_messages("s1#b") == [UserMessage("b1")]
    assert store.load_history("s1") == [{"turn": 1}]


def test_commit_turn_with_a_non_json_snapshot_or_entry_lands_nothing(store):
    store.commit_turn("s1", {"turn": 1}, {}, [{"turn": 1}])
    with pytest.raises(ChatrunError, match="session s1: its snapshot"):
        store.commit_turn("s1", {"turn": 2, "bad": {1, 2}}, {"s1#a": [UserMessage("x")]}, [{"turn": 2}])
    with pytest.raises(ChatrunError, match="session s1: history entry 1"):
        store.commit_turn("s1", {"turn": 2}, {"s1#a": [UserMessage("x")]}, [{"turn": 2}, {"at": object()}])
    assert store.load_session("s1") == {"turn": 1}
    assert store.get_messages("s1#a") == []
    assert store.load_history("s1") == [{"turn": 1}]


def test_delete_session_forgets_it_and_the_given_memories_only(store):
    for sid in ("s1", "s2"):
        store.commit_turn(sid, {"id": sid}, {f"{sid}#main": [UserMessage(sid)], f"{sid}#x": [UserMessage("x")]}, [{"t": 1}])
    store.delete_session("s1", ["s1#main", "s1#x"])
    assert store.load_session("s1") is None
    assert store.load_history("s1") == []
    assert store.get_messages("s1#main") == [] and store.get_messages("s1#x") == []
    assert store.load_session("s2") == {"id": "s2"}
    assert store.get_messages("s2#main") == [UserMessage("s2")]
    assert store.load_history("s2") == [{"t": 1}]
    assert store.list_sessions() == ["s2"]


def test_list_sessions_oldest_first(store):
    for sid in ("b", "a", "c"):
        store.commit_turn(sid, {}, {}, [])
    store.commit_turn("b", {"again": True}, {}, [])
    assert store.list_sessions() == ["b", "a", "c"]


def test_concurrent_commit_turns_from_threads(store):
    errors: list[BaseException] = []
    threads_n, turns_n = 8, 25

    def worker(t: int) -> None:
        try:
            for i in range(turns_n):
                # Every thread writes its own session and, concurrently, one shared session.
                store.commit_turn(f"own{t}", {"turn": i}, {f"own{t}#main": [UserMessage(f"{t}:{i}")]}, [{"i": i}])
                store.commit_turn("shared", {"last": t}, {}, [{"t": t, "i": i}])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    shared = store.load_history("shared")
    assert len(shared) == threads_n * turns_n
    for t in range(threads_n):  # each thread's entries, in its own order
        assert [e["i"] for e in shared if e["t"] == t] == list(range(turns_n))
        assert store.load_history(f"own{t}") == [{"i": i} for i in range(turns_n)]
        assert store.get_messages(f"own{t}#main") == [UserMessage(f"{t}:{turns_n - 1}")]


# -- SQLite only -----------------------------------------------------------------------------


def test_sqlite_persists_across_reopen(tmp_path):
    path = tmp_path / "deep" / "er" / "chatrun.db"
    path.parent.mkdir(parents=True)  # the folder must exist (tests/test_store_urls.py)
    with SQLiteStore(path) as s:
        s.commit_turn("s1", {"turn": 1}, {"s1#main": ALL_KINDS}, [{"turn": 1, "input": "héllo"}])
        s.update_messages("loose", [UserMessage("x")])
    with SQLiteStore(path) as s:
        assert s.load_session("s1") == {"turn": 1}
        assert s.get_messages("s1#main") == ALL_KINDS
        assert s.load_history("s1") == [{"turn": 1, "input": "héllo"}]
        assert s.get_messages("loose") == [UserMessage("x")]
        s.commit_turn("s1", {"turn": 2}, {}, [{"turn": 2}])
        assert [e["turn"] for e in s.load_history("s1")] == [1, 2]


def test_sqlite_records_persist_across_reopen(tmp_path):
    with SQLiteStore(tmp_path / "c.db") as store:
        store.put_record("k", {"v": 1})
    with SQLiteStore(tmp_path / "c.db") as store:
        assert store.get_record("k") == {"v": 1}


def test_sqlite_uses_wal_and_the_documented_tables(tmp_path):
    path = tmp_path / "c.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"memories", "sessions", "history", "records"} <= tables
    conn.close()


def test_sqlite_failure_inside_the_transaction_rolls_everything_back(tmp_path):
    s = SQLiteStore(tmp_path / "c.db")
    s.commit_turn("s1", {"turn": 1}, {}, [{"turn": 1}])
    # A memory id SQLite cannot bind fails after the snapshot row was already written.
    with pytest.raises(ChatrunError, match="save a turn of session s1"):
        s.commit_turn("s1", {"turn": 2}, {("not", "bindable"): [UserMessage("x")]}, [{"turn": 2}])  # type: ignore[dict-item]  # the wrong key on purpose
    assert s.load_session("s1") == {"turn": 1}
    assert s.load_history("s1") == [{"turn": 1}]
    s.commit_turn("s1", {"turn": 2}, {}, [{"turn": 2}])  # the store is still usable
    assert s.load_session("s1") == {"turn": 2}
    s.close()


def test_sqlite_is_shared_by_two_connections(tmp_path):
    path = tmp_path / "c.db"
    a, b = SQLiteStore(path), SQLiteStore(path)
    a.commit_turn("s1", {"by": "a"}, {"s1#main": [UserMessage("from a")]}, [{"n": 1}])
    assert b.load_session("s1") == {"by": "a"}
    b.commit_turn("s1", {"by": "b"}, {}, [{"n": 2}])
    assert [e["n"] for e in a.load_history("s1")] == [1, 2]
    a.close()
    b.close()


def test_sqlite_cannot_open_a_folder(tmp_path):
    with pytest.raises(ChatrunError, match=f"cannot open the SQLite store {tmp_path}"):
        SQLiteStore(tmp_path)


def test_sqlite_cannot_open_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("these are not the tables you are looking for\n" * 100)
    with pytest.raises(ChatrunError, match="notes.txt"):
        SQLiteStore(path)


def test_sqlite_cannot_create_its_folder(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ChatrunError, match="cannot open the SQLite store"):
        SQLiteStore(blocker / "sub" / "c.db")


def test_open_store_urls(tmp_path):
    assert isinstance(open_store(None), InMemoryStore)
    assert isinstance(open_store("memory://"), InMemoryStore)
    s = open_store(f"sqlite:///{tmp_path}/x.db")
    assert isinstance(s, SQLiteStore) and (tmp_path / "x.db").exists()
    s.close()
    with pytest.raises(ChatrunError, match="unknown store URL"):
        open_store("mongodb://localhost")
    with pytest.raises(ChatrunError, match="asynchronous"):
        open_store("redis://localhost")


_SCHEMA_1 = """
CREATE TABLE memories (memory_id TEXT PRIMARY KEY, messages TEXT NOT NULL);
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, snapshot TEXT NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE history (session_id TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL,
                      PRIMARY KEY (session_id, seq));
"""


@pytest.mark.parametrize("with_records", [False, True], ids=["schema1", "schema1-with-records"])
def test_a_schema_1_file_migrates_in_place_keeping_sessions_and_records(tmp_path, with_records):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_1 + ("CREATE TABLE records (key TEXT PRIMARY KEY, record TEXT NOT NULL);"
                                    if with_records else ""))
    conn.execute("INSERT INTO sessions VALUES ('s1', '{\"turn\": 1}', 0)")
    conn.execute("INSERT INTO history VALUES ('s1', 1, '{\"turn\": 1}')")
    if with_records:
        conn.execute("INSERT INTO records VALUES ('k', '{\"v\": 1}')")
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    with SQLiteStore(path) as store:
        snapshot, version = store.load_versioned("s1")
        assert snapshot == {"turn": 1}
        new = store.commit_turn("s1", {"turn": 2}, {}, [{"turn": 2}], expected_version=version)
        assert store.version("s1") == new != version
        assert [e["turn"] for e in store.load_history("s1")] == [1, 2]
        assert store.get_record("k") == ({"v": 1} if with_records else None)
        store.put_record("k2", {"v": 2}, "s1")
    with SQLiteStore(path) as store:
        assert store.get_record("k2") == {"v": 2}
        assert store.load_session("s1") == {"turn": 2}
        store.delete_session("s1", [])
        assert store.get_record("k2") is None
        assert store.get_record("k") == ({"v": 1} if with_records else None)  # a record of no session stays
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_the_servers_turn_buffer_passes_records_to_its_store_and_says_when_it_has_none():
    from chatrun.store.buffer import TurnBuffer

    real = InMemoryStore()
    buffer = TurnBuffer("s1", records=real)
    assert isinstance(buffer, RecordStore) and isinstance(buffer, SessionStore)
    buffer.put_record("k", {"v": 1})
    assert real.get_record("k") == {"v": 1} and buffer.get_record("k") == {"v": 1}
    assert buffer.pending is None  # a record is not part of the session's commit
    with pytest.raises(ChatrunError, match="s1: record k"):
        TurnBuffer("s1").get_record("k")
