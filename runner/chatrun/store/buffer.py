"""`TurnBuffer`: the store a live Session sees inside the server.

The engine calls its store synchronously (`load_session`, `get_messages`, `commit_turn`), and
the server must never block its event loop on store I/O. So the server loads a session's
snapshot and memories asynchronously first, hands the Session this buffer, and after the turn
writes what the buffer collected to the real store itself (asynchronously, fenced by version
and lease: see chatrun.store.aio). Reads come from what was loaded plus what was committed
since; a commit is checked and copied here at once (a value JSON cannot hold fails the turn
inside the engine, as with any store) and waits in `pending` until the server writes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from chatrun.errors import ChatrunError
from chatrun.messages import Message
from chatrun.store import RecordStore
from chatrun.store.memory import check_messages, messages_json, to_json


@dataclass
class PendingCommit:
    """What the turns of one request committed, merged: the last snapshot, every changed
    memory (None: deleted) as messages and as JSON text, the history entries in order."""

    snapshot: dict
    memories: dict[str, list[Message] | None] = field(default_factory=dict)
    memories_json: dict[str, str | None] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)


class TurnBuffer:
    """A SessionStore over one session's loaded data; commits wait in `pending`."""

    def __init__(self, session_id: str, snapshot: dict | None = None,
                 memories: dict[str, list[Message]] | None = None, sizes: dict[str, int] | None = None,
                 records: RecordStore | None = None):
        self.session_id = session_id
        self.records = records  # the real store's records, when it keeps them in this process
        self._snapshot_json = None if snapshot is None else to_json(f"session {session_id}", snapshot)
        self._memories: dict[str, tuple[Message, ...]] = {k: tuple(v) for k, v in (memories or {}).items()}
        self._sizes: dict[str, int] = dict(sizes or {})
        self.history: list[dict] | None = None  # the stored history, when the server loaded it
        self.pending: PendingCommit | None = None
        self.request_id: str | None = None  # stamped on the history entries of the running request

    @property
    def size(self) -> int:
        """Roughly what the session costs in memory, in bytes (its JSON size)."""
        return len(self._snapshot_json or "") + sum(self._sizes.values())

    def take(self) -> PendingCommit | None:
        pending, self.pending = self.pending, None
        return pending

    # -- ChatMemoryStore ----------------------------------------------------------------------

    def get_messages(self, memory_id: str) -> list[Message]:
        return list(self._memories.get(memory_id, ()))

    def update_messages(self, memory_id: str, messages: list[Message]) -> None:
        self.commit_turn(self.session_id, self.load_session(self.session_id) or {}, {memory_id: messages}, [])

    def delete_messages(self, memory_id: str) -> None:
        self.commit_turn(self.session_id, self.load_session(self.session_id) or {}, {memory_id: None}, [])

    # -- SessionStore -------------------------------------------------------------------------

    def load_session(self, session_id: str) -> dict | None:
        self._check(session_id)
        return None if self._snapshot_json is None else json.loads(self._snapshot_json)

    def commit_turn(
        self,
        session_id: str,
        snapshot: dict,
        memories: dict[str, list[Message] | None],
        history: list[dict],
        expected_version: str | None = None,
        outcome: tuple[str, dict] | None = None,
    ) -> str:
        self._check(session_id)
        # Checked and copied now, all before anything is kept: the engine's dicts live on.
        snap_json = to_json(f"session {session_id}: its snapshot", snapshot)
        mems = {mid: None if m is None else check_messages(mid, m) for mid, m in memories.items()}
        texts = {mid: None if m is None else messages_json(mid, m) for mid, m in mems.items()}
        stamp = {"requestId": self.request_id} if self.request_id is not None else {}
        entries = [json.loads(to_json(f"session {session_id}: history entry {i}", e | stamp))
                   for i, e in enumerate(history)]
        if self.pending is None:
            self.pending = PendingCommit(json.loads(snap_json))
        pending = self.pending
        pending.snapshot = json.loads(snap_json)
        pending.memories.update(mems)
        pending.memories_json.update(texts)
        pending.history.extend(entries)
        self._snapshot_json = snap_json
        for mid, msgs in mems.items():
            if msgs is None:
                self._memories.pop(mid, None)
                self._sizes.pop(mid, None)
            else:
                self._memories[mid] = tuple(msgs)
                self._sizes[mid] = len(texts[mid] or "")
        if self.history is not None:
            self.history.extend(entries)
        return "pending"

    def load_versioned(self, session_id: str) -> tuple[dict, str] | None:
        snapshot = self.load_session(session_id)
        return None if snapshot is None else (snapshot, self.version(session_id) or "")

    def version(self, session_id: str) -> str | None:
        """Not a store version: the registry keeps the real one (its slot) and checks it."""
        self._check(session_id)
        return None if self._snapshot_json is None else "live"

    def get_outcome(self, session_id: str, request_id: str) -> dict | None:
        self._check(session_id)
        raise ChatrunError(f"session {session_id}: request outcomes are read from the server's store, not its buffer")

    def load_history(self, session_id: str) -> list[dict]:
        self._check(session_id)
        if self.history is None:
            raise ChatrunError(f"session {session_id}: its history was not loaded for this request")
        return [dict(e) for e in self.history]

    def delete_session(self, session_id: str, memory_ids: list[str]) -> None:
        """The server deletes the stored session itself; here only the loaded copy goes."""
        self._check(session_id)
        self._snapshot_json = None
        self._memories.clear()
        self._sizes.clear()
        self.pending = None

    def list_sessions(self) -> list[str]:
        return [self.session_id] if self._snapshot_json is not None else []

    # -- RecordStore: records are not the session's, so they go straight to the real store ------

    def get_record(self, key: str) -> dict | None:
        return self._record_store(key).get_record(key)

    def put_record(self, key: str, record: dict, session: str | None = None) -> None:
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
