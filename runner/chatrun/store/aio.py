"""The store as the server uses it: asynchronous, versioned (fencing) and leased.

    store = open_async_store("redis://127.0.0.1:6379/0")   # or memory://, sqlite:///x.db
    lease = await store.acquire("s1", wait=60)              # one turn at a time per session
    loaded = await store.load("s1", memory_ids)             # snapshot, version, memories
    version = await store.commit("s1", pending, expected=loaded.version, lease=lease)
    await store.release(lease)

`LocalAsyncStore` wraps the in-process stores: InMemoryStore inline (dict operations), the
SQLite store in one worker thread (so a slow disk or a lock held by another process never
freezes the event loop). Their leases are no-ops: one process serves them and the server's
per-session asyncio lock orders its turns. `RedisStore` (chatrun.store.redis) has real
leases, shared by every replica.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from chatrun.messages import Message
from chatrun.store import RecordStore, SessionStore, open_store
from chatrun.store.buffer import PendingCommit
from chatrun.store.memory import InMemoryStore, Records, to_json

MemoryIds = Callable[[dict], list[str]]  # the memory ids a snapshot's scopes hold


@dataclass
class Loaded:
    snapshot: dict
    version: str
    memories: dict[str, list[Message]]
    sizes: dict[str, int]  # memory id -> its JSON size in bytes (for the cache's byte bound)


@dataclass
class Lease:
    """The right to run one request on a session. `version`: the stored version when it was
    granted (None: no such session). `lost`: it expired before the request ended."""

    session_id: str
    token: str | None
    version: str | None
    lost: bool = False
    renewer: asyncio.Task | None = None


@dataclass(frozen=True)
class LeaseSettings:
    ttl: float = 10.0  # seconds a lease lives without renewal (renewed every ttl/3 while held)
    wait: float = 60.0  # seconds a request waits in the session's queue before TooManyRequests
    poll: float = 0.02  # longest pause between two looks at the queue while waiting


class AsyncStore(Protocol):
    url: str
    distributed: bool  # several processes share it (leases are real)

    async def acquire(self, session_id: str, wait: float, reject: bool = False,
                      stop: Callable[[], bool] | None = None) -> Lease:
        """Wait in the session's FIFO queue, up to `wait` seconds, for its lease. reject: fail
        at once when busy. Raises SessionBusy (busy, or waited too long)."""
        ...

    async def release(self, lease: Lease) -> None: ...

    async def version(self, session_id: str) -> str | None: ...

    async def load(self, session_id: str, memory_ids: MemoryIds) -> Loaded | None: ...

    async def commit(self, session_id: str, pending: PendingCommit, expected: str,
                     lease: Lease | None, outcome: tuple[str, dict] | None = None) -> str:
        """Write a pending commit if the stored version is `expected` (versions.CREATE for a
        new session) and the lease is still held; else StaleVersion / LeaseLost, nothing written."""
        ...

    async def history(self, session_id: str) -> list[dict]: ...

    async def outcome(self, session_id: str, request_id: str) -> dict | None: ...

    async def delete(self, session_id: str, memory_ids: list[str], lease: Lease | None) -> None: ...

    async def count_owned(self, owner: str) -> int: ...

    async def get_record(self, key: str) -> dict | None:
        """The record saved under `key` (chatrun.store.RecordStore, asynchronously), or None."""
        ...

    async def put_record(self, key: str, record: dict, session: str | None = None) -> None:
        """Save `record` (JSON-able) under `key`, replacing any record there; one saved for a
        `session` is deleted with it."""
        ...

    async def delete_record(self, key: str) -> None: ...

    async def close(self) -> None: ...


class LocalAsyncStore:
    """An in-process SessionStore behind the async interface (see the module's text)."""

    distributed = False

    def __init__(self, store: SessionStore, url: str = "memory://"):
        self.sync = store
        self.url = url
        threaded = not isinstance(store, InMemoryStore)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="chatrun-store") if threaded else None
        # A store without records (a user's own SessionStore) gets them in this process only.
        self.records: RecordStore | None = store if isinstance(store, RecordStore) else None
        self._process_records = Records()

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._executor is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    async def acquire(self, session_id: str, wait: float, reject: bool = False,
                      stop: Callable[[], bool] | None = None) -> Lease:
        return Lease(session_id, None, await self.version(session_id))

    async def release(self, lease: Lease) -> None:
        return None

    async def version(self, session_id: str) -> str | None:
        return await self._call(self.sync.version, session_id)

    async def load(self, session_id: str, memory_ids: MemoryIds) -> Loaded | None:
        from chatrun.store.memory import messages_json

        def read() -> Loaded | None:
            found = self.sync.load_versioned(session_id)
            if found is None:
                return None
            snapshot, version = found
            memories = {mid: self.sync.get_messages(mid) for mid in memory_ids(snapshot)}
            sizes = {mid: len(messages_json(mid, m)) for mid, m in memories.items()}
            return Loaded(snapshot, version, memories, sizes)

        return await self._call(read)

    async def commit(self, session_id: str, pending: PendingCommit, expected: str,
                     lease: Lease | None, outcome: tuple[str, dict] | None = None) -> str:
        return await self._call(
            self.sync.commit_turn, session_id, pending.snapshot, pending.memories, pending.history, expected, outcome
        )

    async def history(self, session_id: str) -> list[dict]:
        return await self._call(self.sync.load_history, session_id)

    async def outcome(self, session_id: str, request_id: str) -> dict | None:
        return await self._call(self.sync.get_outcome, session_id, request_id)

    async def delete(self, session_id: str, memory_ids: list[str], lease: Lease | None) -> None:
        await self._call(self.sync.delete_session, session_id, memory_ids)
        self._process_records.delete_session(session_id)

    async def count_owned(self, owner: str) -> int:
        counter = getattr(self.sync, "count_owned", None)
        return 0 if counter is None else await self._call(counter, owner)

    async def get_record(self, key: str) -> dict | None:
        if self.records is None:
            return self._process_records.get(key)
        return await self._call(self.records.get_record, key)

    async def put_record(self, key: str, record: dict, session: str | None = None) -> None:
        if self.records is None:
            self._process_records.put(key, to_json(f"record {key}", record), session)
            return
        await self._call(self.records.put_record, key, record, session)

    async def delete_record(self, key: str) -> None:
        if self.records is None:
            self._process_records.delete(key)
            return
        await self._call(self.records.delete_record, key)

    async def close(self) -> None:
        closer = getattr(self.sync, "close", None)  # SessionStore does not require close()
        if closer is not None:
            await self._call(closer)
        if self._executor is not None:
            self._executor.shutdown(wait=False)


def open_async_store(url: str | None, lease: LeaseSettings = LeaseSettings(),  # noqa: B008 - frozen
                     exclusive: bool = False) -> AsyncStore:
    """The server's store for a URL: memory://, sqlite:///path.db, redis://host:port/db, rediss://.
    exclusive: this process is the only server of a SQLite file (refuse a second one)."""
    if url and url.startswith(("redis://", "rediss://")):
        from chatrun.store.redis import RedisStore

        return RedisStore(url, lease)
    return LocalAsyncStore(open_store(url, exclusive=exclusive), url or "memory://")


def as_async_store(store: SessionStore | AsyncStore) -> AsyncStore:
    """An AsyncStore for either kind of store object (a SessionStore gets wrapped)."""
    if hasattr(store, "acquire"):
        return store  # type: ignore[return-value]
    return LocalAsyncStore(store, getattr(store, "path", "memory://"))  # type: ignore[arg-type]
