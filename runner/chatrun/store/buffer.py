"""`TurnBuffer`: the store a live Session sees inside the server.

The engine calls its store synchronously (`load_session`, `get_messages`, `commit_turn`), and
the server must never block its event loop on store I/O. So the server loads a session's
record (`chatrun.store.record.SessionRecord`: snapshot and memories) asynchronously first,
hands the Session this buffer, and after the turn writes what the buffer collected to the real
store itself (asynchronously, fenced by version and lease: see chatrun.store.aio). Reads come
from what was loaded plus what was committed since; a commit is checked and encoded here at
once, the one JSON pass of a commit (a value JSON cannot hold fails the turn inside the
engine, as with any store), and waits in `pending` (a `Commit`) until the server writes it.

The buffer is a SessionStore, not a DurableStore: a session's history and request outcomes
are the server's store's to answer (the server reads them asynchronously itself). It stamps the running request's id on the history entries, and keeps the
snapshot's `committed` (the last committed turn; with track_committed) up to date, so the commit it hands the
server is final: nothing is decoded or encoded again on the way to the store.
"""

from __future__ import annotations

import json

from chatrun.errors import ChatrunError
from chatrun.messages import Message
from chatrun.store import RecordStore
from chatrun.store.record import (
    Commit,
    Committed,
    JSONObject,
    PackedCommitted,
    SessionRecord,
    committed_turn,
    from_json,
    pack_committed,
    unpack_committed,
    window_size,
)


class TurnBuffer:
    """A SessionStore over one session's loaded record; commits wait in `pending`."""

    # The server loads its sessions' user memory itself, asynchronously; what a turn remembered
    # rides in its Commit, and the server's store writes it with the commit (store/user_memory.py).
    defers_user_memory = True
    commits_user_memory = True
    # No __dict__: one per cached session (issue 26).
    __slots__ = ("session_id", "records", "track_committed", "lean", "_snapshot_json", "_snapshot_size",
                 "_snapshot_values", "_unclaimed",
                 "_memories", "_committed", "pending", "request_id", "request_asks")

    def __init__(self, session_id: str, record: SessionRecord | None = None, records: RecordStore | None = None,
                 track_committed: bool = False, lean: bool = False):
        self.session_id = session_id
        self.records = records  # the real store's records, when it keeps them in this process
        # The server's buffers write the last committed turn into the snapshot (record.with_committed).
        self.track_committed = track_committed
        # A lean buffer serves one live Session, which holds the decoded state: once that Session
        # has its snapshot the buffer keeps only its size, not a second copy as JSON text (a
        # big-state session kept its state twice; issue 33). It is not read back again.
        self.lean = lean
        self._snapshot_json = None if record is None else record.snapshot_json
        self._snapshot_size = self._snapshot_values = 0
        if record is not None:
            self._measure(record.snapshot_json)
        # The record's decoded snapshot, handed to the first load_session (the Session restored
        # from it) instead of decoding the text a second time.
        self._unclaimed: JSONObject | None = None if record is None else record.snapshot
        # Each memory's (id, messages, JSON size), in one tuple: a dict by id was 184 B of every idle
        # session, a second dict of the sizes 184 more (issue 39); a session holds a few memories.
        self._memories: tuple[tuple[str, tuple[Message, ...], int], ...] = () if record is None else tuple(
            (mid, tuple(m), record.sizes.get(mid, 0)) for mid, m in record.memories.items())
        self._committed: PackedCommitted | Committed | None = None if record is None else pack_committed(record.committed)
        self.pending: Commit | None = None
        self.request_id: str | None = None  # stamped on the history entries of the running request
        self.request_asks: str | None = None  # what it asks (a hash), kept in its outcome only (server/turn_run.py)

    @property
    def committed(self) -> Committed | None:
        """The last committed turn (kept packed: a live session keeps its buffer)."""
        return unpack_committed(self._committed)

    @committed.setter
    def committed(self, committed: Committed | None) -> None:
        self._committed = pack_committed(committed)

    @property
    def size(self) -> int:
        """Roughly what the session costs in memory, in bytes (its JSON size)."""
        return self._snapshot_size + self.memory_size

    @property
    def snapshot_size(self) -> int:
        """The JSON size of the session's snapshot (its state, scopes, routes), in bytes."""
        return self._snapshot_size

    @property
    def snapshot_values(self) -> int:
        """About how many JSON values (objects, arrays, members, items) the snapshot holds: each
        is a Python object or a dict slot when decoded, whatever its JSON size."""
        return self._snapshot_values

    def _measure(self, snapshot_json: str) -> None:
        self._snapshot_size = len(snapshot_json)
        # Commas inside strings count too: an overcount, never an undercount.
        self._snapshot_values = snapshot_json.count(",") + snapshot_json.count("{") + snapshot_json.count("[")

    @property
    def memory_size(self) -> int:
        """The JSON size of the messages of its memories, in bytes."""
        return sum(size for _, _, size in self._memories)

    @property
    def message_count(self) -> int:
        """The messages of the session's memories this buffer holds."""
        return sum(len(messages) for _, messages, _ in self._memories)

    def take(self) -> Commit | None:
        pending, self.pending = self.pending, None
        return pending

    # -- ChatMemoryStore ----------------------------------------------------------------------

    def get_messages(self, memory_id: str) -> list[Message]:
        return next((list(messages) for mid, messages, _ in self._memories if mid == memory_id), [])

    def update_messages(self, memory_id: str, messages: list[Message]) -> None:
        self.commit_turn(self.session_id, self.load_session(self.session_id) or {}, {memory_id: messages}, [])

    def delete_messages(self, memory_id: str) -> None:
        self.commit_turn(self.session_id, self.load_session(self.session_id) or {}, {memory_id: None}, [])

    # -- SessionStore -------------------------------------------------------------------------

    def load_session(self, session_id: str) -> JSONObject | None:
        self._check(session_id)
        if self._unclaimed is not None:
            snapshot, self._unclaimed = self._unclaimed, None
            if self.lean:
                self._snapshot_json = None
            return snapshot
        if self._snapshot_json is None and self._snapshot_size and self.lean:
            raise ChatrunError(f"session {session_id}: its live session holds its snapshot; a lean TurnBuffer "
                               "keeps none to load it again (open the session from the store)")
        return None if self._snapshot_json is None else from_json(self._snapshot_json)

    def commit_turn(
        self,
        session_id: str,
        snapshot: JSONObject,
        memories: dict[str, list[Message] | None],
        history: list[JSONObject],
        expected_version: str | None = None,
        outcome: tuple[str, JSONObject] | None = None,
    ) -> str:
        """Encode the commit now (the engine's dicts live on) and keep it for the server, which
        fences it itself: `expected_version` and `outcome` are the server's to set, not the engine's."""
        self._check(session_id)
        stamp = {"requestId": self.request_id} if self.request_id is not None else {}
        entries = [e | stamp for e in history]
        turn_at = next((i for i in range(len(entries) - 1, -1, -1) if "turn" in entries[i]), None)
        committed = self.committed
        if self.track_committed and turn_at is not None and entries[turn_at].get("ok"):
            committed = committed_turn(entries[turn_at], self.request_id)
        commit = Commit.encode(session_id, snapshot, memories, entries, committed=committed)
        commit.committed = committed
        if turn_at is not None:
            commit.turn = entries[turn_at]["turn"]
        answer = _answer_at(entries, turn_at)
        if self.request_id is not None and answer is not None:
            commit.outcome = (self.request_id, _with_asks(commit.history_json[answer], self.request_asks))
        self._keep(commit)
        return "pending"

    def _keep(self, commit: Commit) -> None:
        """Make a checked commit what this buffer reads back, and add it to the pending one."""
        if self.pending is None:
            self.pending = commit
        else:
            self.pending.merge(commit)
        self._snapshot_json, self._unclaimed, self.committed = commit.snapshot_json, None, commit.committed
        self._measure(commit.snapshot_json)
        if self.lean:  # the session committing it holds it; the pending commit keeps the text until written
            self._snapshot_json = None
        if commit.memories:
            changed = commit.memories
            kept = [entry for entry in self._memories if entry[0] not in changed]
            self._memories = (*kept, *((mid, tuple(msgs), self._size_of(commit, mid, msgs))
                                       for mid, msgs in changed.items() if msgs is not None))

    def _size_of(self, commit: Commit, memory_id: str, messages: list[Message]) -> int:
        """A changed memory's JSON size, from what it held before when it can be (record.window_size:
        the in-memory store never encodes the window, so encoding it here only to measure it was
        a steady turn's largest JSON), else from its JSON; the pending commit carries it to the store."""
        size = commit.memory_size(memory_id)
        if size is None:
            before = next((entry for entry in self._memories if entry[0] == memory_id), None)
            size = None if before is None else window_size(before[1], before[2], messages)
            if size is None:
                size = len(commit.memories_json.get(memory_id) or "")
            elif self.pending is not None:  # the commit this one was folded into, or itself
                self.pending.sizes[memory_id] = size
        return size

    def load_versioned(self, session_id: str) -> tuple[JSONObject, str] | None:
        snapshot = self.load_session(session_id)
        return None if snapshot is None else (snapshot, self.version(session_id) or "")

    def version(self, session_id: str) -> str | None:
        """Not a store version: the registry keeps the real one (its slot) and checks it."""
        self._check(session_id)
        return None if not self._snapshot_size else "live"

    def delete_session(self, session_id: str, memory_ids: list[str]) -> None:
        """The server deletes the stored session itself; here only the loaded copy goes."""
        self._check(session_id)
        self._snapshot_json = self._unclaimed = None
        self._snapshot_size = self._snapshot_values = 0
        self._memories = ()
        self.pending = None

    def list_sessions(self) -> list[str]:
        return [self.session_id] if self._snapshot_size else []

    # -- RecordStore: records are not the session's, so they go straight to the real store ------

    def get_record(self, key: str) -> JSONObject | None:
        return self._record_store(key).get_record(key)

    def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None:
        self._record_store(key).put_record(key, record, session)

    def delete_record(self, key: str) -> None:
        self._record_store(key).delete_record(key)

    def _record_store(self, key: str) -> RecordStore:
        if self.records is None:
            raise ChatrunError(
                f"session {self.session_id}: record {key}: this store keeps records only through the "
                "server's asynchronous interface (SessionRegistry.store.get_record/put_record)"
            )
        return self.records

    def close(self) -> None:
        """Nothing to release."""

    def _check(self, session_id: str) -> None:
        if session_id != self.session_id:
            raise ChatrunError(f"the buffer of session {self.session_id} was asked for session {session_id}")


def _answer_at(entries: list[JSONObject], turn_at: int | None) -> int | None:
    """The entry that answers the running request, kept as its outcome (a retry replays it): its
    turn's when the turn committed (none when it failed); with no turn, a notice that answered
    it instead (a channel's message refused before any turn: server/turn_run.py's `notice`)."""
    if turn_at is not None:
        return turn_at if entries[turn_at].get("ok") else None
    return next((i for i in range(len(entries) - 1, -1, -1) if "notice" in entries[i]), None)


def _with_asks(entry_json: str, asks: str | None) -> str:
    """A committed request's outcome: its history entry's JSON text, with what the request asked
    (`asks`) when the server keeps it, so a key sent again with another request is refused.
    The history keeps the entry without it."""
    if asks is None:
        return entry_json
    return entry_json[:-1] + ',"asks":' + json.dumps(asks) + "}"  # the entry is a non-empty object
