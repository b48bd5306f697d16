"""The store as the server uses it: asynchronous, versioned (fencing) and leased.

    store = open_async_store("redis://127.0.0.1:6379/0")    # or memory://, sqlite:///x.db
    lease = await store.acquire("s1", wait=60)               # one turn at a time per session
    record = await store.load_session("s1")                  # SessionRecord: snapshot, version, memories
    version = await store.commit_turn(commit, lease=lease)   # a Commit, fenced by commit.expected
    await store.release(lease)

The operations are SessionStore's, by the same names (load_session, commit_turn,
load_history, get_outcome, delete_session, version, list_sessions), taking and returning the
typed values of `chatrun.store.record`, plus leases. `LocalAsyncStore` (chatrun.store.local)
wraps the in-process stores; `RedisStore` (chatrun.store.redis) has real leases, shared by
every replica.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

from chatrun.store import POSTGRES_SCHEMES, SessionStore, open_store
from chatrun.store.lease import Lease, LeaseSettings
from chatrun.store.local import LocalAsyncStore
from chatrun.store.record import (
    Commit,
    JSONObject,
    OutboxEntry,
    PendingSession,
    SessionRecord,
    WaitingEntry,
)

__all__ = ["AsyncStore", "Lease", "LeaseSettings", "LocalAsyncStore", "as_async_store", "open_async_store"]


class AsyncStore(Protocol):
    url: str
    distributed: bool  # several processes share it (leases are real)

    async def acquire(self, session_id: str, wait: float, reject: bool = False,
                      stop: Callable[[], bool] | None = None) -> Lease:
        """Wait in the session's FIFO queue, up to `wait` seconds, for its lease. reject: fail
        at once when busy. Raises SessionBusy (busy, or waited too long)."""
        ...

    async def release(self, lease: Lease) -> None: ...

    async def sweep_leases(self) -> int:
        """Delete what expired leases left in the store (a dead process's: server/sweeper.py asks
        every RETAIN_EVERY seconds); how many were deleted (0 where they expire by themselves)."""
        ...

    async def version(self, session_id: str) -> str | None: ...

    async def load_session(self, session_id: str) -> SessionRecord | None:
        """The stored session with the memories its snapshot names, or None."""
        ...

    async def commit_turn(self, commit: Commit, lease: Lease | None) -> str:
        """Write a commit if the stored version is `commit.expected` (versions.CREATE for a new
        session) and the lease is still held; else StaleVersion / LeaseLost, nothing written.
        Returns the session's new version."""
        ...

    async def load_history(self, session_id: str) -> list[JSONObject]: ...

    async def get_outcome(self, session_id: str, request_id: str) -> JSONObject | None: ...

    async def request_ids(self, session_id: str) -> list[str]:
        """The ids of the requests whose outcomes the session keeps (at most KEEP_OUTCOMES): what
        store/replays.py marks before the session is deleted."""
        ...

    async def delete_session(self, session_id: str, memory_ids: list[str], lease: Lease | None) -> None: ...

    async def count_owned(self, owner: str) -> int: ...

    async def list_sessions(self) -> list[str]: ...

    async def get_record(self, key: str) -> JSONObject | None:
        """The record saved under `key` (chatrun.store.RecordStore, asynchronously), or None."""
        ...

    async def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None:
        """Save `record` (JSON-able) under `key`, replacing any record there; one saved for a
        `session` is deleted with it."""
        ...

    async def claim_record(self, key: str, record: JSONObject) -> bool:
        """Save `record` under `key` only if none is there (chatrun.store.RecordClaims): True if
        saved. Atomic across replicas when the store is shared."""
        ...

    async def swap_record(self, key: str, expected: JSONObject, record: JSONObject | None) -> bool:
        """Save `record` under `key` (delete the record there when None) only if the record there
        is `expected` (chatrun.store.RecordSwaps): True if done. Atomic across replicas when the
        store is shared."""
        ...

    async def delete_record(self, key: str) -> None: ...

    async def record_keys(self, prefix: str) -> list[str]:
        """The keys of the records whose key starts with `prefix`, sorted (the versions kept in
        the store: chatrun.server.versions); [] from a user's RecordStore that cannot list."""
        ...

    # Pending items (chatrun.store.PendingIndex, asynchronously): the sweeper and the operators' list.
    async def list_due(self, now: float) -> list[str]: ...

    async def list_pending(self, bot: str | None = None, kind: str | None = None) -> list[PendingSession]: ...

    # Flat reads (chatrun.store.FlatIndex, asynchronously): GET /pending's pages, the tallies.
    async def waiting_page(self, key: str, after: tuple[float, str] | None, until: float | None,
                           limit: int) -> list[WaitingEntry]: ...

    async def read_tallies(self, family: str, names: list[str] | None = None) -> dict[str, int]: ...

    # The outbox (chatrun.store.OutboxStore, asynchronously): backend events of committed turns.
    @property
    def has_outbox(self) -> bool:
        """False: a user's own store keeps none (a bot with sinks cannot be served on it)."""
        ...

    async def claim_outbox(self, now: float, lease: float, limit: int,
                           routes: Collection[str]) -> list[OutboxEntry]: ...

    async def settle_outbox(self, entry: OutboxEntry, delivered: bool) -> bool: ...

    async def list_outbox(self, state: str | None = None, limit: int = 100) -> list[OutboxEntry]: ...

    async def requeue_outbox(self, entry_id: str, now: float) -> bool: ...

    async def delete_outbox(self, entry_ids: Collection[str]) -> int: ...

    # Retention and erasure (chatrun.store.RetentionIndex, asynchronously; chatrun.store.retention).
    async def list_idle(self, bot: str, before: float, limit: int) -> list[str]: ...

    async def sessions_of(self, owner: str) -> list[str]: ...

    async def close(self) -> None: ...


async def scrub(store: AsyncStore) -> None:
    """After deleting what must be forgotten (an erasure, a retention pass, a deleted session): have
    the store write over the deleted bytes it still keeps in its files (SQLite: its write-ahead log;
    SQLiteStore.scrub). A store without `scrub` keeps them until its own rewrite (Redis's AOF,
    PostgreSQL's VACUUM; docs/deploy.md, "Erasing a person's data")."""
    do = getattr(store, "scrub", None)
    if do is not None:
        await do()


def open_async_store(url: str | None, lease: LeaseSettings = LeaseSettings(),  # noqa: B008 - frozen
                     exclusive: bool = False, must_exist: bool = False) -> AsyncStore:
    """The server's store for a URL: memory://, sqlite:///path.db, redis://host:port/db, rediss://,
    postgresql://user@host:port/db.
    exclusive: this process is the only server of a SQLite file (refuse a second one).
    must_exist: refuse a SQLite file that is not there (a read-only command; see open_store)."""
    if url and url.startswith(("redis://", "rediss://")):
        from chatrun.store.redis import RedisStore

        return RedisStore(url, lease)
    if url and url.startswith(POSTGRES_SCHEMES):
        from chatrun.store.postgres import PostgresStore

        return PostgresStore(url, lease)
    return LocalAsyncStore(open_store(url, exclusive=exclusive, must_exist=must_exist), url or "memory://")


async def open_existing_store(url: str) -> AsyncStore:
    """The store of a command that reads what a server stored (`chatrun record`, `diff
    --store`, `versions`): a SQLite file that is not there, or a Redis or PostgreSQL nobody answers at, is a
    ChatrunError naming the URL before any command is sent, never an empty store created nor
    a client library's traceback."""
    store = open_async_store(url, must_exist=True)
    ping = getattr(store, "ping", None)
    if ping is not None:
        try:
            await ping()
        except BaseException:
            await store.close()
            raise
    return store


def as_async_store(store: SessionStore | AsyncStore) -> AsyncStore:
    """An AsyncStore for either kind of store object (a SessionStore gets wrapped)."""
    if isinstance(store, SessionStore):
        return LocalAsyncStore(store, getattr(store, "path", "memory://"))
    return store
