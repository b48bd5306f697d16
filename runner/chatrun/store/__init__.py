"""Where conversations live between turns: memory stores and session stores.

`ChatMemoryStore` is LangChain4j's ChatMemoryStore in Python. `SessionStore` adds
what a chatrun session needs to survive a restart: a snapshot of its scopes and
state, and its never-evicted history. Every store implements both.

`open_store(url)`: "memory://" (the default: in process), "sqlite:///path/to.db".
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from chatrun.messages import Message


@runtime_checkable
class ChatMemoryStore(Protocol):
    def get_messages(self, memory_id: str) -> list[Message]:
        """All messages stored for `memory_id` ([] when none)."""
        ...

    def update_messages(self, memory_id: str, messages: list[Message]) -> None:
        """Replace the messages stored for `memory_id`."""
        ...

    def delete_messages(self, memory_id: str) -> None:
        """Forget `memory_id`."""
        ...


@runtime_checkable
class SessionStore(ChatMemoryStore, Protocol):
    def load_session(self, session_id: str) -> dict | None:
        """The snapshot saved by the last `commit_turn`, or None for an unknown session."""
        ...

    def commit_turn(
        self,
        session_id: str,
        snapshot: dict,
        memories: dict[str, list[Message] | None],
        history: list[dict],
    ) -> None:
        """Atomically: replace the session's snapshot, replace each memory in `memories`
        (delete it where the value is None), and append `history` entries."""
        ...

    def load_history(self, session_id: str) -> list[dict]:
        """Every history entry of the session, oldest first."""
        ...

    def delete_session(self, session_id: str, memory_ids: list[str]) -> None:
        """Forget the session, its history and the given memories."""
        ...

    def list_sessions(self) -> list[str]:
        ...


@runtime_checkable
class RecordStore(Protocol):
    """Small JSON records by key, for indexes kept beside the sessions (the OpenAI-compatible
    API maps response ids and conversation prefixes to committed turns with them)."""

    def get_record(self, key: str) -> dict | None:
        """The record saved under `key`, or None."""
        ...

    def put_record(self, key: str, record: dict) -> None:
        """Save `record` (JSON-able) under `key`, replacing any record there."""
        ...


def open_store(url: str | None) -> SessionStore:
    """A store from a URL: None or "memory://" (in process), "sqlite:///path/to.db"."""
    from chatrun.errors import ChatrunError

    if not url or url == "memory://":
        from chatrun.store.memory import InMemoryStore

        return InMemoryStore()
    if url.startswith("sqlite:///"):
        from chatrun.store.sqlite import SQLiteStore

        return SQLiteStore(url[len("sqlite:///"):])
    raise ChatrunError(f"unknown store URL {url!r}; use memory:// or sqlite:///path/to.db")
