"""The /v1 index's turn states as deltas (server/openai_sessions.py): a memory written as what
it dropped and added since the state before, and read back whole through its chain."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace

from chatrun.messages import AssistantMessage, SummaryMessage, UserMessage
from chatrun.server.openai_sessions import TurnIndex, _memory_delta
from chatrun.store.local import LocalAsyncStore
from chatrun.store.memory import InMemoryStore
from chatrun.store.sqlite import SQLiteStore


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
