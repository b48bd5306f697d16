"""Where conversations live between turns: memory stores and session stores.

`ChatMemoryStore` is LangChain4j's ChatMemoryStore in Python. `SessionStore` adds
what a chatrun session needs to survive a restart: a snapshot of its scopes and
state, and its never-evicted history. Every store implements both.

`SessionStore` is what a live Session needs of its store; `DurableStore` adds what a store
that keeps sessions for a server must also do (record request outcomes for exactly-once
retries): the built-in stores are both, a server's `TurnBuffer` is a SessionStore only. The
built-in stores also read and write the typed record of a session (`chatrun.store.record`:
`SessionRecord`, `Commit`) directly, the server's one-JSON-pass path (`EncodedStore`).

`open_store(url)`: "memory://" (the default: in process), "sqlite:///path/to.db".
The server talks to stores through `chatrun.store.aio` (async, versioned, leased): the
SQLite store from a worker thread, Redis ("redis://host:port/db", `chatrun.store.redis`) and
PostgreSQL ("postgresql://user@host:port/db", `chatrun.store.postgres`) natively.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Protocol, runtime_checkable

from chatrun.messages import Message
from chatrun.store.record import (
    Commit,
    JSONObject,
    OutboxEntry,
    PendingSession,
    SessionRecord,
    WaitingEntry,
)


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
    """What a live Session needs of its store (chatrun.Session), and what every store offers.
    The server's per-request TurnBuffer is one; the history and outcomes it cannot know without
    I/O are DurableStore's."""

    def load_session(self, session_id: str) -> JSONObject | None:
        """The snapshot saved by the last `commit_turn`, or None for an unknown session."""
        ...

    def commit_turn(
        self,
        session_id: str,
        snapshot: JSONObject,
        memories: dict[str, list[Message] | None],
        history: list[JSONObject],
        expected_version: str | None = None,
        outcome: tuple[str, JSONObject] | None = None,
    ) -> str:
        """Atomically: replace the session's snapshot, replace each memory in `memories`
        (delete it where the value is None), append `history` entries, record `outcome`
        (request id, entry) for exactly-once retries, and return the session's new version.
        With `expected_version` (a version, or versions.CREATE for a new session) the commit
        lands only if the stored version is that one, else StaleVersion and nothing lands."""
        ...

    def load_versioned(self, session_id: str) -> tuple[JSONObject, str] | None:
        """The snapshot and its version, or None."""
        ...

    def version(self, session_id: str) -> str | None:
        ...

    def delete_session(self, session_id: str, memory_ids: list[str]) -> None:
        """Forget the session, its history and the given memories."""
        ...

    def list_sessions(self) -> list[str]:
        ...


@runtime_checkable
class HistoryStore(Protocol):
    """A store that keeps sessions' histories (every turn tried), not only their state."""

    def load_history(self, session_id: str) -> list[JSONObject]:
        """Every history entry of the session, oldest first."""
        ...


@runtime_checkable
class DurableStore(SessionStore, HistoryStore, Protocol):
    """A SessionStore sessions are kept in: it also answers for their history and for the
    outcomes it recorded (`commit_turn(..., outcome=...)`), so a retried request is replayed,
    not run again. InMemoryStore and SQLiteStore are; so is every store written against the
    SessionStore of chatrun 0.1 (which named load_history and get_outcome itself): nothing a
    store implements was removed."""

    def get_outcome(self, session_id: str, request_id: str) -> JSONObject | None:
        """The history entry recorded for a committed request, or None."""
        ...


@runtime_checkable
class EncodedStore(DurableStore, Protocol):
    """A DurableStore that reads and writes `chatrun.store.record`'s typed values directly:
    the server's path, one JSON pass per load and per commit (LocalAsyncStore uses it when
    the store has it, and SessionStore's dict methods otherwise)."""

    def read_session(self, session_id: str) -> SessionRecord | None:
        """The stored session with the memories its snapshot names, or None."""
        ...

    def write_commit(self, commit: Commit) -> str:
        """commit_turn, already encoded: returns the session's new version."""
        ...


@runtime_checkable
class RecordStore(Protocol):
    """Small JSON records by key, for indexes kept beside the sessions (the OpenAI-compatible
    API maps response ids and conversation prefixes to committed turns with them)."""

    def get_record(self, key: str) -> JSONObject | None:
        """The record saved under `key`, or None."""
        ...

    def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None:
        """Save `record` (JSON-able) under `key`, replacing any record there. A record saved
        for a `session` is deleted with that session (delete_session)."""
        ...

    def delete_record(self, key: str) -> None:
        """Delete the record under `key` (nothing when there is none)."""
        ...


@runtime_checkable
class RecordClaims(Protocol):
    """A RecordStore that saves a record only where there is none, atomically across every
    process that shares the store: the OpenAI API claims an Idempotency-Key with it, so that
    two first attempts at the same instant run one turn. The built-in stores are; with any
    other RecordStore the claim is atomic within one process only."""

    def claim_record(self, key: str, record: JSONObject) -> bool:
        """Save `record` under `key` if no record is there (True), else change nothing (False)."""
        ...


@runtime_checkable
class RecordSwaps(Protocol):
    """A RecordStore that replaces a record only while it is the one the caller read, atomically
    across every process that shares the store (compare-and-swap): the OpenAI API takes over a
    dead attempt's claim with it, so that of two retries taking over the same claim one runs and
    the other waits for its outcome, and an attempt releases its own claim only. The built-in
    stores are; with any other RecordStore the swap is atomic within one process only."""

    def swap_record(self, key: str, expected: JSONObject, record: JSONObject | None) -> bool:
        """Save `record` under `key` (delete the record there when None) if the record there is
        `expected` (the same JSON text as this store writes it) (True), else change nothing (False)."""
        ...


@runtime_checkable
class OutboxStore(Protocol):
    """A store that keeps an outbox: the backend events of committed turns, written by
    `commit_turn` with the turn (from its history entry's "outbox"), waiting for delivery.
    Workers claim due entries for `lease` seconds (a claim not settled in time comes due
    again: another worker takes over), try them, and settle them under their claim."""

    def claim_outbox(self, now: float, lease: float, limit: int, routes: Collection[str]) -> list[OutboxEntry]:
        """Up to `limit` pending entries due by `now` whose route (OutboxEntry.route: bot and
        sink) is one of `routes`, oldest first, each claimed (a fresh `claim` token) until
        now + lease. Entries of other routes are left for a worker that serves them."""
        ...

    def settle_outbox(self, entry: OutboxEntry, delivered: bool) -> bool:
        """Delete a delivered entry, or save the entry's new bookkeeping (attempts, next_at,
        state, error) unclaimed; only while `entry.claim` is still its claim (else False)."""
        ...

    def list_outbox(self, state: str | None = None, limit: int = 100) -> list[OutboxEntry]:
        """Entries oldest first: every one, or those in `state` ("pending", "dead")."""
        ...

    def requeue_outbox(self, entry_id: str, now: float) -> bool:
        """A dead letter pending again, due now, its tries counted afresh (False: no such dead letter)."""
        ...


@runtime_checkable
class PendingIndex(Protocol):
    """A store that indexes its sessions' pending items (approvals, questions, takeovers: the
    snapshot's "pending", read by `chatrun.store.record`), updated by the commit that changes
    them and dropped with the session. The built-in stores are; for any other store the server
    scans (`list_sessions` and a load of each)."""

    def list_due(self, now: float) -> list[str]:
        """The ids of the sessions with a pending item due by `now` (epoch seconds), earliest first."""
        ...

    def list_pending(self, bot: str | None = None, kind: str | None = None) -> list[PendingSession]:
        """The sessions with open pending items (only the items of `kind`; only sessions of
        `bot`). Reads the snapshots of the sessions that wait, never all sessions."""
        ...


@runtime_checkable
class FlatIndex(Protocol):
    """A store whose reads for operators cost the same however many sessions it keeps (issue 33):
    an index of its waiting sessions (`chatrun.store.record.WaitingEntry`, one per session with
    pending items or a takeover, placed in each index `waiting_key(bot, kind, role)` and
    `age_key(bot, kind)` it belongs to) and tallies (sessions per owner and per bot version,
    open items per bot and kind), both kept by the commit that changes them and dropped with the
    session. The built-in stores are; for any other store the server scans."""

    def waiting_page(self, key: str, after: tuple[float, str] | None, until: float | None,
                     limit: int) -> list[WaitingEntry]:
        """Up to `limit` entries of index `key` in order (position, then session id): after
        the (position, session) `after`, at positions up to `until` (None: any)."""
        ...

    def read_tallies(self, family: str, names: list[str] | None = None) -> dict[str, int]:
        """The counts of one family (record.TALLY_*) by name: of `names`, or every name (for the
        small families: versions, pending kinds)."""
        ...


@runtime_checkable
class RetentionIndex(Protocol):
    """A store that knows when each session was last written and who owns it: retention and
    erasure (chatrun.store.retention) find what to delete with it. The built-in stores are; a
    user's own store is kept as it is (nothing idle is found; a principal's sessions are scanned)."""

    def list_idle(self, bot: str, before: float, limit: int) -> list[str]:
        """Up to `limit` sessions of `bot` last committed before `before` (epoch seconds), longest idle first."""
        ...

    def sessions_of(self, owner: str) -> list[str]:
        """The ids of the sessions `owner` owns."""
        ...

    # An OutboxStore that is one also deletes outbox entries (dead letters past retention, an
    # erased principal's): `delete_outbox(entry_ids) -> int`, how many there were.


POSTGRES_SCHEMES = ("postgresql://", "postgres://")  # the Postgres store's URLs (chatrun.store.postgres)
SHARED_SCHEMES = ("redis://", "rediss://", *POSTGRES_SCHEMES)  # stores several replicas share


def open_store(url: str | None, exclusive: bool = False, must_exist: bool = False) -> EncodedStore:
    """A store from a URL: None or "memory://" (in process), "sqlite:///path/to.db".
    exclusive: this process is the file's only server (see SQLiteStore). must_exist: a
    command that only reads (`chatrun record`, `chatrun diff --store`) refuses a SQLite file
    that is not there, instead of creating an empty store and finding nothing in it."""
    from chatrun.errors import ChatrunError
    from chatrun.store.blobs import local_store_url
    from chatrun.store.urls import shown_url

    if not url or (url.startswith("memory://") and local_store_url(url) == "memory://"):  # a query: the blob area's
        from chatrun.store.memory import InMemoryStore

        return InMemoryStore()
    if url.startswith("sqlite:///"):
        from chatrun.store.sqlite import SQLiteStore

        path = local_store_url(url)[len("sqlite:///"):]
        if must_exist and path != ":memory:":
            _sqlite_file_exists(path)
        return SQLiteStore(path, exclusive=exclusive)
    if url.startswith(("redis://", "rediss://", *POSTGRES_SCHEMES)):
        kind = "Redis" if url.startswith("redis") else "Postgres"
        raise ChatrunError(
            f"store {shown_url(url)}: a {kind} store is asynchronous; open it with chatrun.store.aio.open_async_store"
        )
    raise ChatrunError(
        f"unknown store URL {shown_url(url)!r}; use memory://, sqlite:///path/to.db, redis://host:port/db or "
        "postgresql://user@host:port/db"
    )


def _sqlite_file_exists(path: str) -> None:
    """ChatrunError unless the SQLite store's file is there (a relative path is also shown
    resolved: `sqlite:///tmp/x.db` is ./tmp/x.db)."""
    from chatrun.errors import ChatrunError

    file = Path(path).expanduser()
    if not file.is_file():
        resolved = "" if file.is_absolute() else f" ({file.absolute()})"
        raise ChatrunError(f"no store at {path}{resolved}")
