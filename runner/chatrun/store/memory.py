"""`InMemoryStore`: the default store, in process. A ChatMemoryStore and a SessionStore.

Snapshots and history entries are kept as JSON text, so what a caller later does to its
dicts never leaks into the store, and exactly what the SQLite store would refuse (values
JSON cannot hold) is refused here too. Messages are immutable and kept as they are.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from chatrun.errors import ChatrunError
from chatrun.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    SystemMessage,
    ToolResultMessage,
    UserMessage,
)
from chatrun.store.versions import KEEP_OUTCOMES, check_version, next_version

_KINDS = (SystemMessage, UserMessage, AssistantMessage, ToolResultMessage, SummaryMessage)


def check_messages(memory_id: str, messages: Any) -> list[Message]:
    """The messages as a list, or ChatrunError naming the memory and the bad item."""
    try:
        items = list(messages)
    except TypeError:
        raise ChatrunError(f"memory {memory_id}: expected a list of messages, got {type(messages).__name__}") from None
    for i, m in enumerate(items):
        if not isinstance(m, _KINDS):
            raise ChatrunError(f"memory {memory_id}: item {i} is a {type(m).__name__}, not a chat message")
    return items


def messages_json(memory_id: str, messages: Any) -> str:
    items = check_messages(memory_id, messages)
    return json.dumps([m.to_dict() for m in items], ensure_ascii=False)


def to_json(what: str, value: Any) -> str:
    """`value` as JSON text, or ChatrunError saying what could not be saved and why."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ChatrunError(f"cannot save {what}: it holds a value JSON cannot represent ({exc})") from None


class Records:
    """Records (RecordStore) as JSON text by key, each deleted with the session it was last
    saved for. Not locked: its owner locks."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self._session_of: dict[str, str] = {}
        self._keys_of: dict[str, set[str]] = {}

    def get(self, key: str) -> dict | None:
        text = self._texts.get(key)
        return None if text is None else json.loads(text)

    def put(self, key: str, text: str, session: str | None) -> None:
        self.delete(key)
        self._texts[key] = text
        if session is not None:
            self._session_of[key] = session
            self._keys_of.setdefault(session, set()).add(key)

    def delete(self, key: str) -> None:
        self._texts.pop(key, None)
        session = self._session_of.pop(key, None)
        if session is not None:
            self._keys_of[session].discard(key)

    def delete_session(self, session: str) -> None:
        for key in self._keys_of.pop(session, set()):
            self._texts.pop(key, None)
            self._session_of.pop(key, None)


class InMemoryStore:
    """Memories, session snapshots and history in dicts, behind a lock (the server uses threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memories: dict[str, tuple[Message, ...]] = {}
        self._sessions: dict[str, str] = {}
        self._versions: dict[str, str] = {}
        self._history: dict[str, list[str]] = {}
        self._records = Records()
        self._outcomes: dict[str, dict[str, str]] = {}  # session -> request id -> entry JSON

    # -- ChatMemoryStore ----------------------------------------------------------------------

    def get_messages(self, memory_id: str) -> list[Message]:
        with self._lock:
            return list(self._memories.get(memory_id, ()))

    def update_messages(self, memory_id: str, messages: list[Message]) -> None:
        items = tuple(check_messages(memory_id, messages))
        with self._lock:
            self._memories[memory_id] = items

    def delete_messages(self, memory_id: str) -> None:
        with self._lock:
            self._memories.pop(memory_id, None)

    # -- SessionStore -------------------------------------------------------------------------

    def load_session(self, session_id: str) -> dict | None:
        with self._lock:
            text = self._sessions.get(session_id)
        return None if text is None else json.loads(text)

    def load_versioned(self, session_id: str) -> tuple[dict, str] | None:
        """The snapshot and its version, or None for an unknown session."""
        with self._lock:
            text, version = self._sessions.get(session_id), self._versions.get(session_id)
        return None if text is None or version is None else (json.loads(text), version)

    def version(self, session_id: str) -> str | None:
        with self._lock:
            return self._versions.get(session_id)

    def count_owned(self, owner: str) -> int:
        """How many sessions `owner` (the snapshot's meta.owner) has."""
        with self._lock:
            texts = list(self._sessions.values())
        return sum(1 for t in texts if (json.loads(t).get("meta") or {}).get("owner") == owner)

    def get_outcome(self, session_id: str, request_id: str) -> dict | None:
        with self._lock:
            text = self._outcomes.get(session_id, {}).get(request_id)
        return None if text is None else json.loads(text)

    def commit_turn(
        self,
        session_id: str,
        snapshot: dict,
        memories: dict[str, list[Message] | None],
        history: list[dict],
        expected_version: str | None = None,
        outcome: tuple[str, dict] | None = None,
    ) -> str:
        """See SessionStore.commit_turn; returns the session's new version."""
        # Everything is checked and encoded before anything is applied: all or nothing.
        snap = to_json(f"session {session_id}: its snapshot", snapshot)
        mems = {mid: None if msgs is None else tuple(check_messages(mid, msgs)) for mid, msgs in memories.items()}
        entries = [to_json(f"session {session_id}: history entry {i}", e) for i, e in enumerate(history)]
        recorded = None if outcome is None else (outcome[0], to_json(f"session {session_id}: outcome", outcome[1]))
        with self._lock:
            current = self._versions.get(session_id)
            check_version(session_id, expected_version, current)
            version = self._versions[session_id] = next_version(current)
            self._sessions[session_id] = snap
            for mid, msgs in mems.items():
                if msgs is None:
                    self._memories.pop(mid, None)
                else:
                    self._memories[mid] = msgs
            self._history.setdefault(session_id, []).extend(entries)
            if recorded is not None:
                outcomes = self._outcomes.setdefault(session_id, {})
                outcomes[recorded[0]] = recorded[1]
                while len(outcomes) > KEEP_OUTCOMES:  # dicts keep insertion order: drop the oldest
                    del outcomes[next(iter(outcomes))]
        return version

    def load_history(self, session_id: str) -> list[dict]:
        with self._lock:
            entries = list(self._history.get(session_id, ()))
        return [json.loads(e) for e in entries]

    def delete_session(self, session_id: str, memory_ids: list[str]) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)
            self._versions.pop(session_id, None)
            self._history.pop(session_id, None)
            self._outcomes.pop(session_id, None)
            self._records.delete_session(session_id)
            for mid in memory_ids:
                self._memories.pop(mid, None)

    def list_sessions(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    # -- RecordStore ---------------------------------------------------------------------------

    def get_record(self, key: str) -> dict | None:
        with self._lock:
            return self._records.get(key)

    def put_record(self, key: str, record: dict, session: str | None = None) -> None:
        text = to_json(f"record {key}", record)
        with self._lock:
            self._records.put(key, text, session)

    def delete_record(self, key: str) -> None:
        with self._lock:
            self._records.delete(key)

    def close(self) -> None:
        """Nothing to release; here so every store can be closed the same way."""
