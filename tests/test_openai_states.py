"""The /v1 index's turn states as deltas (server/openai_sessions.py): a memory written as what
it dropped and added since the state before, and read back whole through its chain."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatrun.messages import AssistantMessage, SummaryMessage, UserMessage
from chatrun.server.openai_sessions import TurnIndex, _memory_delta
from chatrun.store.local import LocalAsyncStore
from chatrun.store.memory import InMemoryStore
from chatrun.store.record import Commit
from chatrun.store.sqlite import SQLiteStore
from chatrun.store.versions import CREATE


def test_a_window_that_grew_or_slid_is_written_as_what_it_dropped_and_added():
    a, b, c, d, e = UserMessage("a"), AssistantMessage("b"), UserMessage("c"), AssistantMessage("d"), UserMessage("e")
    assert _memory_delta((a, b, c), (a, b, c, d, e)) == {"drop": 0, "add": [d.to_dict(), e.to_dict()]}
    assert _memory_delta((a, b, c), (b, c, d)) == {"drop": 1, "add": [d.to_dict()]}
    assert _memory_delta((), (a,)) == {"drop": 0, "add": [a.to_dict()]}
    assert _memory_delta((a, b), (a, b)) == {"drop": 0, "add": []}


def test_a_memory_rewritten_or_new_is_written_whole():
    a, b, c = UserMessage("a"), AssistantMessage("b"), UserMessage("c")
    summary = SummaryMessage("a and b")
    assert _memory_delta((a, b, c), (summary, c, UserMessage("d"))) == [
        summary.to_dict(), c.to_dict(), UserMessage("d").to_dict()]
    assert _memory_delta((a, b), (UserMessage("a"), b, c)) == [m.to_dict() for m in (UserMessage("a"), b, c)]
    assert _memory_delta((a, b), (c,)) == [c.to_dict()]  # its last message is gone: nothing to build on
    assert _memory_delta(None, (a,)) == [a.to_dict()]


class Records:
    def __init__(self, records):
        self.records = records

    async def get_record(self, key):
        return self.records.get(key)


def test_a_state_is_read_back_whole_through_its_chain_and_not_when_a_link_is_gone():
    def m(text):
        return UserMessage(text).to_dict()

    records = {
        "openai:state:s:1": {"snapshot": {"turn": 1}, "memories": {"s.1#main": [m("a"), m("b")]}},
        "openai:state:s:2": {"snapshot": {"turn": 2}, "parent": 1,
                             "memories": {"s.1#main": {"drop": 1, "add": [m("c")]}, "s.2#other": [m("x")]}},
        "openai:state:s:4": {"snapshot": {"turn": 4}, "parent": 2,
                             "memories": {"s.1#main": {"drop": 0, "add": [m("d")]}}},
        "openai:state:s:5": {"snapshot": {"turn": 5}, "parent": 3, "memories": {}},
    }
    index = TurnIndex.__new__(TurnIndex)
    index.records = Records(records)
    state = asyncio.run(index.state_at("s", "openai:state:s:4"))
    assert state == {"snapshot": {"turn": 4}, "memories": {"s.1#main": [m("b"), m("c"), m("d")]}}
    assert asyncio.run(index.state_at("s", "openai:state:s:2"))["memories"] == {
        "s.1#main": [m("b"), m("c")], "s.2#other": [m("x")]}
    assert asyncio.run(index.state_at("s", "openai:state:s:5")) is None  # turn 3's state is gone


class _LiveSession:
    """What _state_after reads of a session: its snapshot, copied or its own."""

    def __init__(self):
        self.live = {"turn": 1, "state": {"city": "Dublin"}}

    def snapshot(self):
        return copy.deepcopy(self.live)

    def snapshot_to_encode(self):
        return self.live


class _UsersSessions:
    """A user's SessionStore that keeps no records (the index's records live in the process)."""

    def version(self, session_id):
        return None

    def delete_session(self, session_id, memory_ids):
        pass


class _UsersRecords(InMemoryStore):
    """A user's store whose put_record may keep the object itself (no records_as_text)."""

    records_as_text = False


def test_a_state_takes_the_sessions_own_snapshot_only_when_the_store_keeps_records_as_text(tmp_path):
    session = _LiveSession()
    for store, uncopied in [(LocalAsyncStore(InMemoryStore()), True),
                            (LocalAsyncStore(SQLiteStore(str(tmp_path / "s.db"))), True),
                            (LocalAsyncStore(_UsersRecords()), False)]:
        index = TurnIndex(SimpleNamespace(store=store))
        state, _ = index._state_after(session, 1, {})
        assert (state["snapshot"] is session.live) is uncopied
        assert state["snapshot"] == session.live


class _TextlessRecords(InMemoryStore):
    """A user's store that keeps records as text but takes none given as text."""

    put_record_text = None


def test_a_state_given_its_snapshots_text_makes_no_snapshot_for_a_store_of_texts(tmp_path):
    # The commit's text of the snapshot is the state's (TurnRun.committed_snapshot): a store that
    # keeps records as text is written that text, and the snapshot's dicts are not made for it
    # (issue 39); a store that may keep the object gets its copy as before, and one that keeps
    # text but takes none given as text gets that text decoded. The stored record is the same.
    import json

    from chatrun.server.openai_sessions import _remember
    from chatrun.store.record import to_json

    class Unread(_LiveSession):
        def snapshot_to_encode(self):
            raise AssertionError("the snapshot was made for a state given its text")

    snapshot_json = to_json("snapshot", {"turn": 1, "state": {"city": "Dublin"}, "updated": 1.5})
    class ObjectsKept(_UsersRecords):  # may keep the object, takes no text
        put_record_text = None

    for store, made in [(LocalAsyncStore(InMemoryStore()), False), (LocalAsyncStore(SQLiteStore(str(tmp_path / "s.db"))), False),
                        (LocalAsyncStore(_UsersRecords()), True), (LocalAsyncStore(_TextlessRecords()), False),
                        (LocalAsyncStore(ObjectsKept()), True)]:
        index = TurnIndex(SimpleNamespace(store=store))
        state, _ = index._state_after(Unread(), 1, {}, snapshot_json)
        assert (state["snapshot"] is not None) is made
        record = {"session": "s", "turn": 1, "state": TurnIndex.state_key("s", 1)}
        asyncio.run(store.in_one_call(lambda records, state=state, record=record: _remember(
            "s", 1, state, record, [], None, None, records, snapshot_json=snapshot_json)))
        stored = asyncio.run(store.get_record(TurnIndex.state_key("s", 1)))
        expected = Unread().snapshot() if isinstance(store.sync, ObjectsKept) else json.loads(snapshot_json)
        assert stored == {"snapshot": expected, "memories": {}}
        asyncio.run(store.close())


def test_the_in_memory_stores_batch_of_records_makes_its_calls_directly_as_the_stores_own(monkeypatch):
    # memory:// runs the /v1 index's batch of record calls (in_one_call) on its records directly,
    # not through LocalAsyncStore's methods and their _call (issue 39): the same reads and
    # writes as those methods make, a version read, and a record kept as text.
    from chatrun.server.openai_sessions import _put_text

    async def work(records):
        await records.put_record("openai:request:a", {"running": True, "at": 1.5})
        assert await _put_text(records, "openai:prefix:b", '{"session": "s", "turn": 1}', "s")
        seen = [await records.get_record("openai:request:a"), await records.get_record("openai:prefix:b"),
                await records.version("s") is not None, await records.version("t")]
        await records.delete_record("openai:request:a")
        return seen + [await records.get_record("openai:request:a")]

    direct = LocalAsyncStore(InMemoryStore())
    asyncio.run(direct.commit_turn(Commit.encode("s", {"turn": 0}, {}, [], expected=CREATE), None))
    expected = asyncio.run(work(direct))
    batched = LocalAsyncStore(InMemoryStore())
    asyncio.run(batched.commit_turn(Commit.encode("s", {"turn": 0}, {}, [], expected=CREATE), None))

    def no_call(*args):
        raise AssertionError("a record call of the batch went through LocalAsyncStore._call")

    monkeypatch.setattr(batched, "_call", no_call)
    assert asyncio.run(batched.in_one_call(work)) == expected
    assert expected == [{"running": True, "at": 1.5}, {"session": "s", "turn": 1}, True, None, None]
    assert batched.sync._records._texts == direct.sync._records._texts


def _old_list_after(listed, turn, keys, parent):
    """The list of kept turns as main ba5cef0 wrote it (its _remember), for the comparison below."""
    from chatrun.server.openai_sessions import KEEP_TURNS
    from chatrun.server.openai_sessions import _walked_chains as _chains_of  # main's walk
    turns = [entry for entry in listed["turns"] if entry[0] != turn] + [[turn, keys]]
    states = listed.get("states", [[entry[0], None] for entry in listed["turns"]])
    states = [entry for entry in states if entry[0] != turn] + [[turn, parent]]
    needed = _chains_of([entry[0] for entry in turns[-KEEP_TURNS:]], dict(states))
    return {"turns": turns[-KEEP_TURNS:], "states": [entry for entry in states if entry[0] in needed]}


def test_the_list_of_kept_turns_is_stored_as_the_same_text_whether_known_or_read_back(tmp_path):
    # The list is written from its entries' texts (issue 39): the stored text is to_json's of the
    # record main wrote, so an older replica reads it, and a list it wrote is read and extended.
    from chatrun.server.openai_sessions import _remember
    from chatrun.store.record import to_json

    sqlite = SQLiteStore(str(tmp_path / "s.db"))
    store = LocalAsyncStore(sqlite)
    sqlite.put_record(TurnIndex.turns_key("s"), {"turns": [[1, ["openai:prefix:one"]]]}, "s")  # before "states"
    expected = {"turns": [[1, ["openai:prefix:one"]]]}
    listed = None
    for turn in range(2, 45):
        keys = [f"openai:prefix:{turn}", "openai:response:ü"] if turn % 3 else [f"openai:prefix:{turn}"]
        parent = None if turn % 8 == 0 else turn - 1
        state = {"snapshot": {}, "memories": {}} | ({"parent": parent} if parent is not None else {})
        record = {"session": "s", "turn": turn, "state": TurnIndex.state_key("s", turn)}
        known = listed if turn % 5 else None  # now and then read back, as after a reload
        listed = asyncio.run(store.in_one_call(
            lambda records, known=known, keys=keys, state=state, record=record, turn=turn:
            _remember("s", turn, state, record, keys, None, known, records)))
        expected = _old_list_after(expected, turn, keys, parent)
        assert sqlite.get_record(TurnIndex.turns_key("s")) == expected == listed.record()
        with sqlite._locked("read") as conn:
            stored = conn.execute("SELECT record FROM records WHERE key = ?", (TurnIndex.turns_key("s"),)).fetchone()[0]
        assert stored == to_json("list", expected)
    asyncio.run(store.close())


def test_the_in_memory_store_keeps_the_list_of_kept_turns_as_its_text_without_decoding_it(monkeypatch):
    # memory:// (no store thread: the index's work runs on LocalAsyncStore itself) takes the list's
    # text as SQLite does (put_record_text): decoding its entries and encoding the list again cost
    # ~0.3 M instructions of a late /v1 turn (issue 39). The same text as to_json of the record.
    from chatrun.server.openai_sessions import _Kept, _remember
    from chatrun.store.record import to_json

    def not_decoded(self):
        raise AssertionError("the list was decoded to be encoded again")

    monkeypatch.setattr(_Kept, "record", not_decoded)
    for store in (LocalAsyncStore(InMemoryStore()), LocalAsyncStore(_UsersSessions())):
        listed, expected = None, {"turns": []}
        for turn in range(1, 36):
            keys = [f"openai:prefix:{turn}", "openai:response:ü"]
            state = {"snapshot": {}, "memories": {}, "parent": turn - 1} if turn % 8 != 1 else {"snapshot": {}, "memories": {}}
            record = {"session": "s", "turn": turn, "state": TurnIndex.state_key("s", turn)}
            listed = asyncio.run(store.in_one_call(
                lambda records, listed=listed, keys=keys, state=state, record=record, turn=turn:
                _remember("s", turn, state, record, keys, None, listed, records)))
            expected = _old_list_after(expected, turn, keys, state.get("parent"))
            assert asyncio.run(store.get_record(TurnIndex.turns_key("s"))) == expected
            assert _stored_text(store, TurnIndex.turns_key("s")) == to_json("list", expected)
        asyncio.run(store.delete_session("s", [], None))
        assert asyncio.run(store.get_record(TurnIndex.turns_key("s"))) is None


def _stored_text(store, key):
    records = store._process_records if store.records is None else store.sync._records
    return records._texts[key]


ECHO = """
name: echo
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
memory: {type: message_window, max_messages: 6}
routes:
  main:
    default: true
    system: Repeat what the user says.
"""


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_turns_state_holds_the_snapshot_its_commit_encoded_the_same_text(fake, tmp_path, monkeypatch, store):
    # The state's record takes the snapshot's text from the turn's commit (TurnRun.committed_snapshot)
    # instead of encoding the snapshot again (issue 39): the same text as to_json of the session's
    # snapshot right after the turn (its "updated" the commit's moment, as the session is stored, not
    # a moment later), and the same record as to_json of the state, as before; a window
    # that slides (deltas), a full state every CHAIN turns, and a fork (a regenerated answer).
    import json

    from fastapi.testclient import TestClient

    import chatrun
    from chatrun.store.record import to_json
    from server_support import app_for_testclient

    fake.responder = lambda body: {"text": "echo: " + str(body["messages"][-1]["content"])}
    (tmp_path / "echo.yaml").write_text(ECHO)
    url = "memory://" if store == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    app = app_for_testclient([chatrun.load_bot(tmp_path / "echo.yaml")], url)
    given, raw = [], TurnIndex.remember

    async def remember(self, session, who, keys, outcome=None, snapshot_json=None, more=None):
        live = dict(session.snapshot_to_encode())  # the snapshot as main encoded it here, but for
        live["updated"] = json.loads(snapshot_json)["updated"]  # its moment: the commit's, as stored
        given.append((session.id, session.turn_count, snapshot_json, to_json("snapshot", live)))
        return await raw(self, session, who, keys, outcome, snapshot_json, more)

    monkeypatch.setattr(TurnIndex, "remember", remember)
    with TestClient(app) as client:
        index = app.state.openai.index
        history: list[dict] = []
        for n in range(12):
            if n == 10:  # regenerate the answer to the 9th message: a fork
                history = history[:-3]
            history.append({"role": "user", "content": f"message {n} ü"})
            answer = client.post("/v1/chat/completions", json={"model": "echo", "messages": history})
            assert answer.status_code == 200, answer.text
            history.append(answer.json()["choices"][0]["message"])
            session_id, turn, snapshot_json, encoded = given[-1]
            assert snapshot_json == encoded
            stored = asyncio.run(index.records.get_record(TurnIndex.state_key(session_id, turn)))
            assert _stored_state_text(index.records, TurnIndex.state_key(session_id, turn)) == to_json("state", stored)
            assert to_json("snapshot", stored["snapshot"]) == encoded
            session = asyncio.run(index.registry.store.load_session(session_id)).snapshot
            assert stored["snapshot"] == {k: v for k, v in session.items() if k != "committed"}  # as stored
    assert len({sid for sid, *_ in given}) == 2  # the fork's


def _stored_state_text(store, key):
    if store.records is not None and isinstance(store.sync, InMemoryStore):
        return store.sync._records._texts[key]
    with store.sync._locked("read") as conn:
        return conn.execute("SELECT record FROM records WHERE key = ?", (key,)).fetchone()[0]


_KEYS = st.lists(st.text() | st.none() | st.integers(), max_size=3)


@given(st.lists(st.integers() | st.booleans() | st.none() | _KEYS | st.text(), min_size=1, max_size=3))
@settings(max_examples=300, deadline=None)
def test_an_entry_of_the_list_of_kept_turns_is_written_as_to_json_writes_it(entry):
    # A turn's [turn, [keys]] and a state's [turn, parent] are written without the encoder (issue
    # 39): the same text as to_json's, for any entry (the stored list's layout does not change).
    from chatrun.server.openai_sessions import _entry_text
    from chatrun.store.record import to_json

    assert _entry_text(entry) == to_json("entry", entry)


@given(st.dictionaries(st.integers(1, 60), st.none() | st.integers(0, 61), max_size=50), st.lists(st.integers(1, 62)))
@settings(max_examples=500, deadline=None)
def test_the_states_kept_turns_need_are_their_chains_as_walked(parents, turns):
    # _chains_of looks at each state once, latest first (a parent is an earlier turn); a list
    # whose parents are not earlier turns is walked chain by chain, as before (issue 39).
    from chatrun.server.openai_sessions import _chains_of, _walked_chains

    assert _chains_of(turns, parents) == _walked_chains(turns, parents)


_STEP = st.tuples(st.sampled_from(["next", "next", "next", "gap", "again", "back"]),
                  st.sampled_from(["delta", "delta", "delta", "full", "other", "none_first"]),
                  st.integers(1, 2), st.integers(0, 9))


@given(st.lists(_STEP, min_size=1, max_size=90))
@settings(max_examples=300, deadline=None)
def test_a_turn_appended_to_a_linear_list_is_kept_as_the_whole_reckoning_keeps_it(steps):
    # The usual next turn is appended in a few steps (_appended), the list's chains not looked at
    # again (issue 39): the same list, text, dropped turns and unneeded states as _kept_rebuilt's
    # for any sequence of turns (turns skipped, recorded again, earlier; states full, deltas of
    # the last, of another), the list carried from turn to turn as a live session's is.
    from chatrun.server.openai_sessions import _Kept, _kept_after, _kept_rebuilt
    from chatrun.store.record import to_json

    kept, last = _Kept([], []), 0
    for how, state, n_keys, pick in steps:
        turn = {"next": last + 1, "gap": last + 2 + pick, "again": max(1, last - pick % 3), "back": max(1, pick)}[how]
        numbers = [entry[0] for entry in kept.states]
        parent = {"delta": numbers[-1] if numbers else None, "full": None,
                  "other": numbers[pick % len(numbers)] if numbers else pick,
                  "none_first": None if pick % 2 else (numbers[-1] if numbers else None)}[state]
        keys = [f"openai:prefix:{turn}:{i}" for i in range(n_keys)]
        if pick == 0:
            kept.text()  # the joined texts made, as a write makes them
        expected = _kept_rebuilt(kept, turn, keys, parent)
        got = _kept_after(kept, turn, keys, parent)
        assert got[0].record() == expected[0].record()
        assert got[0].text() == expected[0].text() == to_json("list", expected[0].record())
        assert got[1:] == expected[1:]
        assert got[0].linear == expected[0].linear
        kept, last = got[0], max(last, turn)


def test_a_usual_conversations_turns_are_appended_without_looking_at_every_chain(monkeypatch):
    # What the cut keeps (issue 39): a live session's usual turns (each state a delta of the last,
    # full every CHAIN) go through _appended once its list is known; the first after a read is
    # reckoned whole. The list is main's, text for text (_old_list_after).
    from chatrun.server import openai_sessions
    from chatrun.server.openai_sessions import CHAIN, _Kept, _kept_after
    from chatrun.store.record import to_json

    rebuilt = []
    whole = openai_sessions._kept_rebuilt
    monkeypatch.setattr(openai_sessions, "_kept_rebuilt", lambda *args: rebuilt.append(args[1]) or whole(*args))
    kept, expected = _Kept.read(None), {"turns": []}
    for turn in range(1, 60):
        parent = None if turn % (CHAIN + 1) == 1 else turn - 1
        keys = [f"openai:prefix:{turn}"]
        kept, _, _ = _kept_after(kept, turn, keys, parent)
        expected = _old_list_after(expected, turn, keys, parent)
        assert kept.record() == expected
        assert kept.text() == to_json("list", expected)
    assert rebuilt == [1]


def test_a_states_text_is_to_json_of_its_record_for_every_kind_of_message():
    # A state's memories are written as a commit writes them (encode_messages; issue 39): the
    # same text as to_json of the record main wrote, full or as a delta, for every kind of message.
    from chatrun.messages import Attachment, SystemMessage, ToolCall, ToolResultMessage
    from chatrun.server.openai_sessions import _memory_change, _state_record, _state_text
    from chatrun.store.record import to_json

    photo = Attachment("sha256-abc", "image/png", "photo.png", 3)
    window = (SystemMessage("be brief"), SummaryMessage("they asked about Dublin"), AssistantMessage(None),
              AssistantMessage("", tool_calls=(ToolCall("c1", "book", '{"to": "Dublin"}'),)),
              ToolResultMessage("c1", "book", '{"ok": true}'), UserMessage("see this", (photo,)),
              UserMessage('a "quoted" \\ café ☕ \u2028 \x00'), AssistantMessage("\U0001f600 </script>"))
    later = (*window[2:], UserMessage("next"), AssistantMessage("reply"))
    snapshot = {"turn": 3, "state": {"city": "Dún Laoghaire"}, "updated": 1.25}
    for memories in ({"s.1#main": _memory_change(None, window), 's.2#ü "': _memory_change(window, later)},
                     {"s.1#main": _memory_change(window, window), "s.3#x": _memory_change((), later)}, {}):
        for state in ({"snapshot": snapshot, "memories": memories},
                      {"snapshot": snapshot, "parent": 2, "memories": memories}):
            record = _state_record(state)
            assert _state_text(state, None) == to_json("state", record)
            assert _state_text(state, to_json("snapshot", snapshot)) == to_json("state", record)
    assert _state_record({"snapshot": {}, "memories": {"m": _memory_change(window, later)}})["memories"] == {
        "m": {"drop": 2, "add": [UserMessage("next").to_dict(), AssistantMessage("reply").to_dict()]}}


@given(st.dictionaries(st.text(), st.text() | st.integers() | st.floats() | st.booleans() | st.none() | st.lists(st.none()),
                       max_size=6))
@settings(max_examples=300, deadline=None)
def test_a_flat_record_of_the_index_is_written_as_to_json_writes_it(record):
    # A turn's key's record and a claim are written member by member (issue 39): the same text as
    # to_json's (the stored layout), or the same refusal (a NaN).
    from chatrun.errors import ChatrunError
    from chatrun.server.openai_sessions import _flat_text
    from chatrun.store.record import to_json

    def written(encode):
        try:
            return encode(record)
        except ChatrunError:
            return ChatrunError

    assert written(_flat_text) == written(lambda value: to_json("record", value))


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                    max_leaves=12))
@settings(max_examples=300, deadline=None)
def test_the_keys_json_text_is_json_dumps_text(value):
    # A request's key hashes this text (stored keys: another replica must find them); its encoder
    # is made once (issue 39), the text json.dumps's.
    import json

    from chatrun.server.openai_sessions import _JSON

    assert _JSON(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
