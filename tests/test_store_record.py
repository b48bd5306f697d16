"""The typed record of a stored session (chatrun.store.record): the one place that reads a
snapshot's keys and spells the id formats; sessions stored before it (by chatrun 0.1's
SQLite and Redis stores) load unchanged; a load and a commit are one JSON pass each; the
server's buffer is a SessionStore, the built-in stores are DurableStores."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chatrun
from chat_support import call
from chatrun.errors import ChatrunError
from chatrun.messages import (
    AssistantMessage,
    Attachment,
    SummaryMessage,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    message_from_dict,
    messages_to_json,
)
from chatrun.models.scripted import ScriptedModel
from chatrun.store import DurableStore, EncodedStore, HistoryStore, SessionStore
from chatrun.store import record as record_module
from chatrun.store.aio import LocalAsyncStore
from chatrun.store.buffer import TurnBuffer
from chatrun.store.memory import InMemoryStore
from chatrun.store.record import (
    Commit,
    SessionRecord,
    encode_messages,
    forked_snapshot,
    memory_id,
    messages_json,
    renamed_id,
    route_of_memory,
    scope_id,
    to_json,
    window_size,
)
from chatrun.store.sqlite import SQLiteStore
from chatrun.store.versions import CREATE
from server_support import write_travel

MEMORY = [UserMessage("fly me to Dublin"), AssistantMessage("When?")]


@pytest.fixture
def travel(tmp_path):
    return chatrun.load_bot(write_travel(tmp_path))


def stored_by_0_1(travel) -> tuple[dict, dict[str, str]]:
    """A snapshot and memory texts exactly as chatrun 0.1's server stored them: the engine's
    snapshot, an owner in its meta, and the server's `committed` added last."""
    session = travel.session(model=ScriptedModel([call("book_flight"), {"text": "ok"}]), meta={"owner": "ana"},
                             store=InMemoryStore(), session_id="old")
    session.chat("fly")
    snapshot = session.snapshot() | {"committed": {"turn": 1, "input": "fly", "requestId": "r-1", "at": 1.5}}
    del snapshot["bot_version"]  # recorded since bot versions (issue 23)
    texts = {mid: messages_to_json(list(messages)) for mid, messages in session.memories().items()}
    return snapshot, texts


def test_the_id_formats_are_the_engines(travel):
    s = travel.session(model=ScriptedModel([call("book_flight"), {"text": "ok"}]), session_id="s9")
    s.chat("fly")
    root, nested = s.scopes
    assert (root.id, nested.id) == (scope_id("s9", 1), scope_id("s9", 2))
    assert root.memory_id("main_menu") == memory_id(root.id, "main_menu") == "s9.1#main_menu"
    assert route_of_memory("s9.1#flight") == "flight"
    assert renamed_id("s9.1#flight", "s9", "t2") == "t2.1#flight" and renamed_id("s90.1#x", "s9", "t2") == "s90.1#x"
    record = SessionRecord.decode("s9", json.dumps(s.snapshot()), "1.x")
    assert record.memory_ids == [mid for scope in s.scopes for mid in scope.memory_ids()]


def test_a_record_reads_bot_owner_committed_and_memory_ids(travel):
    snapshot, texts = stored_by_0_1(travel)
    record = SessionRecord.decode("old", json.dumps(snapshot), "3.abcd")
    assert (record.bot, record.owner, record.version, record.bot_version) == ("travel", "ana", "3.abcd", None)
    versioned = SessionRecord.decode("old", json.dumps(snapshot | {"bot_version": "0123abcd4567"}), "3.abcd")
    assert versioned.bot_version == "0123abcd4567"
    assert record.committed == {"turn": 1, "input": "fly", "requestId": "r-1", "at": 1.5}
    assert sorted(record.memory_ids) == sorted(texts)


def test_a_fork_renames_the_scopes_and_notes_its_origin(travel):
    snapshot, _ = stored_by_0_1(travel)
    forked = forked_snapshot(snapshot, "old", "new", 1)
    assert forked["id"] == "new" and [s["id"] for s in forked["scopes"]] == ["new.1", "new.2"]
    # What it carries over of the original's usage: billed there, not again in the fork (`chatrun report`).
    carried = {"input_tokens": 42, "output_tokens": 15}
    assert snapshot["usage"]["input_tokens"] == 42 and snapshot["usage"]["output_tokens"] == 15
    assert forked["meta"] == {"owner": "ana", "forked_from": {"session": "old", "turn": 1, "keys": "old",
                                                             "usage": carried}}
    assert snapshot["id"] == "old" and snapshot["scopes"][0]["id"] == "old.1"  # a copy
    # A fork of the fork notes its own origin, and keys its calls as the first original's.
    again = forked_snapshot(forked, "new", "newer", 1)["meta"]["forked_from"]
    assert again == {"session": "new", "turn": 1, "keys": "old", "usage": carried}


def test_a_sqlite_file_written_by_0_1_loads(travel, tmp_path):
    snapshot, texts = stored_by_0_1(travel)
    path = tmp_path / "old.db"
    SQLiteStore(path).close()  # the tables (0.1's columns, plus the pending index's)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO sessions (session_id, snapshot, updated_at, version) VALUES (?, ?, ?, ?)", ("old", json.dumps(snapshot, ensure_ascii=False), 1.0, ""))
    conn.executemany("INSERT INTO memories VALUES (?, ?)", list(texts.items()))
    conn.execute("PRAGMA user_version=1")  # as 0.1 left it: the upgrade fills the newer indexes
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    record = asyncio.run(LocalAsyncStore(store).load_session("old"))
    assert record is not None and record.version == "0.schema1" and record.owner == "ana"
    assert record.memories == {mid: chatrun.messages.messages_from_json(t) for mid, t in texts.items()}
    assert record.sizes == {mid: len(t) for mid, t in texts.items()}
    assert store.count_owned("ana") == 1 and store.count_owned("bob") == 0
    session = travel.session(store=TurnBuffer("old", record), session_id="old", model=ScriptedModel([]))
    assert session.turn_count == 1 and session.stack == ["main_menu", "flight"]
    store.close()


def test_a_redis_session_written_by_0_1_loads(travel, redis_server):
    from chatrun.store.redis import RedisStore

    snapshot, texts = stored_by_0_1(travel)

    async def go():
        store = RedisStore(redis_server.url())
        fields = {"v": "3.abcd", "snap": json.dumps(snapshot, ensure_ascii=False), "owner": "ana"}
        await store.client.hset(store._key("s", "old"), mapping=fields | {f"m:{m}": t for m, t in texts.items()})
        record = await store.load_session("old")
        await store.close()
        return record

    record = asyncio.run(go())
    assert record.version == "3.abcd" and record.owner == "ana" and record.committed["requestId"] == "r-1"
    assert set(record.memories) == set(texts) and record.sizes == {mid: len(t) for mid, t in texts.items()}


def count_json(monkeypatch) -> dict[str, int]:
    """Count the JSON encodes (json.dumps or an encoder's own) and json.loads calls of a
    session's snapshot (a dict or text with "scopes")."""
    counts = {"dumps": 0, "loads": 0}
    encode, loads = json.JSONEncoder.encode, json.loads

    def counting_encode(self, value):
        if isinstance(value, dict) and "scopes" in value:
            counts["dumps"] += 1
        return encode(self, value)

    def counting_loads(text, *args, **kwargs):
        if isinstance(text, str) and '"scopes"' in text:
            counts["loads"] += 1
        return loads(text, *args, **kwargs)

    stored = record_module._stored_json

    def counting_stored(value):  # to_json's own encoder (one made once, not JSONEncoder.encode)
        if isinstance(value, dict) and "scopes" in value:
            counts["dumps"] += 1
        return stored(value)

    monkeypatch.setattr(json.JSONEncoder, "encode", counting_encode)
    monkeypatch.setattr(record_module, "_stored_json", counting_stored)
    monkeypatch.setattr(json, "loads", counting_loads)
    return counts


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_load_and_a_commit_are_one_json_pass_each(travel, tmp_path, monkeypatch, kind):
    sync = InMemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "c.db")
    store = LocalAsyncStore(sync)
    first = TurnBuffer("s1", track_committed=True)
    travel.session(store=first, session_id="s1", model=ScriptedModel([]))
    commit = first.take()
    commit.expected = CREATE
    version = asyncio.run(store.commit_turn(commit, None))
    counts = count_json(monkeypatch)
    record = asyncio.run(store.load_session("s1"))
    buffer = TurnBuffer("s1", record, track_committed=True)
    session = travel.session(store=buffer, session_id="s1", model=ScriptedModel([{"text": "hello"}]))
    assert counts == {"dumps": 0, "loads": 1}  # the load: one decode, the Session keeps it
    session.chat("hi")
    commit = buffer.take()
    commit.expected = version
    asyncio.run(store.commit_turn(commit, None))
    assert counts == {"dumps": 1, "loads": 1}  # the commit: one encode, written as it is
    assert sync.load_session("s1")["committed"]["input"] == "hi"
    sync.close()


def test_a_notice_is_its_requests_outcome_even_folded_into_the_sessions_first_commit(travel, tmp_path):
    """A notice that answers a request (a channel's message refused before any turn) is kept as
    that request's outcome, in its own commit: so also when the buffer folds it into a commit
    waiting before it (a new session's first snapshot), and the store writes both at once."""
    sync = SQLiteStore(tmp_path / "n.db")
    store = LocalAsyncStore(sync)
    buffer = TurnBuffer("s1", track_committed=True)
    session = travel.session(store=buffer, session_id="s1", model=ScriptedModel([]))  # its first snapshot waits
    buffer.request_id = "telegram:7"
    session.notice("Sorry, your message is too long.", "over the limit")
    commit = buffer.take()
    commit.expected = CREATE
    asyncio.run(store.commit_turn(commit, None))
    outcome = asyncio.run(store.get_outcome("s1", "telegram:7"))
    assert outcome is not None and outcome["notice"]["why"] == "over the limit" and "turn" not in outcome
    assert [e["requestId"] for e in sync.load_history("s1")] == ["telegram:7"]
    sync.close()


def test_the_buffer_is_a_session_store_and_the_stores_are_durable(tmp_path):
    buffer = TurnBuffer("s1")
    assert isinstance(buffer, SessionStore) and not isinstance(buffer, DurableStore)
    assert not hasattr(buffer, "get_outcome") and not hasattr(buffer, "load_history")  # nothing it cannot honour
    assert not isinstance(buffer, HistoryStore)
    for store in (InMemoryStore(), SQLiteStore(tmp_path / "d.db")):
        assert isinstance(store, EncodedStore) and isinstance(store, DurableStore)
        store.close()


def test_a_commit_refuses_what_json_cannot_hold_before_any_store_sees_it():
    with pytest.raises(chatrun.ChatrunError, match="s1: its snapshot"):
        Commit.encode("s1", {"x": {1, 2}}, {}, [])
    with pytest.raises(chatrun.ChatrunError, match="item 0"):
        Commit.encode("s1", {}, {"m": ["not a message"]}, [])  # type: ignore[list-item]


def test_a_session_on_a_store_without_history_says_so(travel):
    session = travel.session(store=TurnBuffer("s1"), session_id="s1", model=ScriptedModel([]))
    with pytest.raises(chatrun.SessionError, match="its store \\(TurnBuffer\\) keeps no history"):
        _ = session.history
    assert travel.session(store=InMemoryStore(), model=ScriptedModel([])).history == []


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_records_in_one_call_are_read_and_written_in_one_thread_call(tmp_path, monkeypatch, kind):
    """The /v1 index's writes of a turn (server/openai_sessions.py) go to a local store's thread
    once; what they wrote is read back by the ordinary calls."""
    sync = SQLiteStore(tmp_path / "r.db") if kind == "sqlite" else InMemoryStore()
    store = LocalAsyncStore(sync)
    calls = []
    original = store._call

    async def counted(fn, *args):
        calls.append(fn)
        return await original(fn, *args)

    monkeypatch.setattr(store, "_call", counted)

    async def work(records):
        await records.put_record("a", {"n": 1}, "s1")
        await records.put_record("b", {"n": 2})
        seen = await records.get_record("a")
        await records.delete_record("b")
        return seen

    assert asyncio.run(store.in_one_call(work)) == {"n": 1}
    if kind == "sqlite":  # four operations, one call of the store's thread (memory:// has no thread)
        assert len(calls) == 1
    assert asyncio.run(store.get_record("a")) == {"n": 1} and asyncio.run(store.get_record("b")) is None

    async def strays():  # work that awaits anything else is refused, not run half in the thread
        await asyncio.sleep(0)

    if kind == "sqlite":
        with pytest.raises(RuntimeError, match="awaited something besides its records"):
            asyncio.run(store.in_one_call(lambda records: strays()))


def test_a_memory_is_written_as_json_of_its_messages_dicts_for_every_kind():
    # The commit writes plain text messages from their text (store/record.py encode_messages);
    # the stored JSON must be what json.dumps of the messages' dicts writes, byte for byte.
    texts = ["", "plain", 'a "quoted" \\ back\\slash', "line\nbreak\ttab\x00\x1f\x7f", "café ☕ 日本",
             "\ud800 lone surrogate", "\U0001f600 astral", "</script>"]
    photo = Attachment("sha256-abc", "image/png", "photo.png", 3)
    messages = [SystemMessage("be brief"), SummaryMessage("they asked about Dublin"),
                AssistantMessage(None), AssistantMessage("", tool_calls=(ToolCall("c1", "book", '{"to": "Dublin"}'),)),
                ToolResultMessage("c1", "book", '{"ok": true}'), UserMessage("see this", (photo,)), UserMessage("", (photo,))]
    messages += [kind(text) for text in texts for kind in (UserMessage, AssistantMessage, SystemMessage)]
    assert encode_messages(messages) == json.dumps([m.to_dict() for m in messages], ensure_ascii=False)
    assert messages_json("s.1#main", messages) == messages_to_json(messages)
    assert encode_messages([]) == "[]"
    assert [m.to_dict() for m in messages] == json.loads(encode_messages(messages))


def _window_pool():
    photo = Attachment("sha256-abc", "image/png", "photo.png", 3)
    return [UserMessage("hi"), AssistantMessage("hello"), UserMessage("café ☕ \"q\"\n"), AssistantMessage(None),
            AssistantMessage("", tool_calls=(ToolCall("c1", "book", '{"to": "Dublin"}'),)),
            ToolResultMessage("c1", "book", '{"ok": true}'), UserMessage("see", (photo,)), SummaryMessage("so far"),
            UserMessage("\ud800 lone"), AssistantMessage("\U0001f600")]


@settings(max_examples=300, deadline=None)
@given(old=st.lists(st.integers(0, 9), max_size=12), system=st.booleans(), dropped=st.integers(0, 12),
       added=st.lists(st.integers(0, 9), max_size=4), other=st.booleans())
def test_a_windows_size_from_the_one_before_is_its_encoded_length(old, system, dropped, added, other):
    # The buffer measures a changed window from the one it replaces (record.window_size): when it
    # answers, the answer is the length of the window's JSON, whatever was evicted and appended.
    pool = _window_pool()
    before = ([SystemMessage("be brief")] if system else []) + [pool[i] for i in old]
    head = 1 if system else 0
    after = before[:head] + before[head + dropped:] + [pool[i] for i in added]
    if other and after:  # an equal message that is not the same object: measured, or refused, never wrong
        after[len(after) // 2] = message_from_dict(after[len(after) // 2].to_dict())
    size = window_size(tuple(before), len(encode_messages(before)), after)
    assert size is None or size == len(encode_messages(after))
    if not other and before and after and dropped <= 8:  # the turn's usual shape is measured
        assert size == len(encode_messages(after))


def test_a_windows_size_is_not_guessed_from_an_unknown_size():
    window = [UserMessage("hi"), AssistantMessage("hello")]
    assert window_size(tuple(window), 0, [*window, UserMessage("more")]) is None
    assert window_size((), 2, window) is None


def test_the_buffer_hands_the_in_memory_store_its_windows_size_without_encoding_it():
    store = InMemoryStore()
    buffer = TurnBuffer("s", lean=True)
    first = [SystemMessage("be brief"), UserMessage("hi"), AssistantMessage("hello")]
    buffer.commit_turn("s", {"bot": "b"}, {"s.1#main": first}, [])
    store.write_commit(buffer.pending)
    buffer.pending = None
    second = [*first, UserMessage("more"), AssistantMessage("sure")]
    buffer.commit_turn("s", {"bot": "b"}, {"s.1#main": second}, [])
    assert buffer.pending.encoded_memories is None  # measured, not encoded
    assert buffer.memory_size == len(encode_messages(second))
    store.write_commit(buffer.pending)
    assert store.read_session("s").sizes == {}  # no scopes in this snapshot: nothing read back
    assert store._memory_sizes["s.1#main"] == len(encode_messages(second))


def test_a_commit_refuses_a_memory_item_that_is_not_a_message_naming_it():
    class NotQuite(UserMessage):  # a subclass is a message still
        pass

    assert Commit.encode("s", {}, {"s.1#main": [*MEMORY, NotQuite("hi")]}, []).memories["s.1#main"][-1] == NotQuite("hi")
    with pytest.raises(ChatrunError, match=r"memory s.1#main: item 1 is a dict, not a chat message"):
        Commit.encode("s", {}, {"s.1#main": [MEMORY[0], {"role": "user", "content": "hi"}]}, [])


def test_a_stored_value_is_json_dumps_text_and_its_refusals_are_json_dumps_refusals():
    # store/record.py to_json keeps one C encoder per thread (issue 39): the same text as
    # json.dumps(ensure_ascii=False, allow_nan=False), the same refusals, and an encode that failed
    # half-way (its containers marked) spoils no later one, in this thread or another.
    import threading

    shared = {"k": [1, 2.5, -0.0, 10**30, None, True, "é \u2028 \ud800 \"q\""]}
    values = ["text", 1, 1.25, None, [], {}, shared, [shared, shared], {1: "a", None: "b", 2.5: "c", False: "d"}]
    for value in values:
        assert to_json("v", value) == json.dumps(value, ensure_ascii=False, allow_nan=False)
    circular: dict = {}
    circular["me"] = circular
    for bad in (float("nan"), {"a": float("inf")}, [shared, {"x": object()}], {(1,): 2}, circular):
        with pytest.raises((TypeError, ValueError)) as expected:
            json.dumps(bad, ensure_ascii=False, allow_nan=False)
        with pytest.raises(ChatrunError, match="cannot save v: it holds a value JSON cannot represent") as got:
            to_json("v", bad)
        assert str(expected.value) in str(got.value)
        assert to_json("v", [shared, shared]) == json.dumps([shared, shared], ensure_ascii=False)
    half = [shared, {"x": object()}]
    with pytest.raises(ChatrunError):
        to_json("v", half)
    half[1]["x"] = "plain now"  # the same containers again: not left marked as being encoded
    assert to_json("v", half) == json.dumps(half, ensure_ascii=False)
    texts: list[str] = []
    thread = threading.Thread(target=lambda: texts.append(to_json("v", [shared, circular["me"] is circular])))
    thread.start()
    thread.join()
    assert texts == [json.dumps([shared, True], ensure_ascii=False)]


def test_a_commit_encodes_the_snapshot_once_with_its_committed_turn_the_same_text():
    # Commit.encode(committed=...) appends the committed turn to the engine's snapshot's text (issue
    # 39: the /v1 index's state record takes the engine's part as it is): the same text as to_json of
    # with_committed(...), and the engine's part the same as to_json of the snapshot.
    from chatrun.store.record import Commit, to_json, with_committed

    committed = {"turn": 3, "input": {"text": 'ü "x" \\ \u2028'}, "requestId": None, "at": "2030-01-01T00:00:00+00:00"}
    for snapshot in ({}, {"turn": 3, "scopes": [], "state": {"k": "é"}}, {"turn": 1, "committed": {"turn": 0}},
                     {"nested": {"committed": 1}, "updated": 1.5}):
        for last in (committed, None):
            commit = Commit.encode("s1", snapshot, {}, [], committed=last)
            assert commit.snapshot_json == to_json("x", with_committed(snapshot, last))
            engine = commit.engine_snapshot_json()
            assert engine is None if (last is not None and (not snapshot or "committed" in snapshot)) else \
                engine == to_json("x", snapshot)
            later = Commit.encode("s1", snapshot | {"turn": 9}, {}, [], committed=last)
            commit.merge(later)
            assert commit.engine_snapshot_json() == later.engine_snapshot_json()
