"""`LocalAsyncStore`: an in-process SessionStore behind the server's asynchronous interface.

InMemoryStore is called inline (dict operations), any other store (SQLite, a user's own) in
one worker thread, so a slow disk or a lock held by another process never freezes the event
loop. Leases are no-ops: one process serves these stores and the server's per-session
asyncio lock orders its turns.

The built-in stores are `EncodedStore`s: a load is one `read_session` (one decode of each
JSON text) and a commit one `write_commit` of the `Commit` the server's buffer encoded. A
user's store gets SessionStore's dict methods (decoding and encoding once more on the way).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Collection, Coroutine
from typing import Any, Protocol, TypeVar, runtime_checkable

from chatrun.store import (
    DurableStore,
    EncodedStore,
    FlatIndex,
    HistoryStore,
    OutboxStore,
    PendingIndex,
    RecordClaims,
    RecordStore,
    RecordSwaps,
    RetentionIndex,
    SessionStore,
    user_records,
)
from chatrun.store.lease import Lease
from chatrun.store.memory import InMemoryStore, Records
from chatrun.store.record import (
    Commit,
    JSONObject,
    OutboxEntry,
    PendingSession,
    SessionRecord,
    WaitingEntry,
    due_epoch,
    from_json,
    messages_json,
    pending_session,
    swapped_texts,
    tallies_of,
    to_json,
    waiting_entry,
)

T = TypeVar("T")


@runtime_checkable
class _CountsOwners(Protocol):
    def count_owned(self, owner: str) -> int: ...


@runtime_checkable
class _Closes(Protocol):
    def close(self) -> None: ...


class LocalAsyncStore:
    """An in-process SessionStore behind the async interface (see the module's text)."""

    distributed = False

    def __init__(self, store: SessionStore, url: str = "memory://"):
        self.sync = store
        self.url = url
        self.blob_area = getattr(store, "blob_area", None)  # a store's own blob area (store/blobs.py blobs_of)
        self._encoded: EncodedStore | None = store if isinstance(store, EncodedStore) else None
        threaded = not isinstance(store, InMemoryStore)
        # Whether what is written survives this process (kill -9): not an in-memory store's, so
        # nothing is written only for a later process to read (store/billing.py's records).
        self.outlives_process = threaded
        self._executor = StoreThread("chatrun-store") if threaded else None
        # A store without records (a user's own SessionStore) gets them in this process only.
        self.records: RecordStore | None = store if isinstance(store, RecordStore) else None
        # Whether a record put is kept as its JSON text at once (the caller may change the object
        # after): this process's records are; a user's RecordStore may keep the object itself.
        self.records_as_text = self.records is None or getattr(store, "records_as_text", False) is True
        # What the wrapped store can do, found once: a runtime Protocol's isinstance walks its
        # members (about 0.1 ms), and these are asked on every turn.
        self._history = store if isinstance(store, HistoryStore) else None
        self._durable = store if isinstance(store, DurableStore) else None
        self._owners = store if isinstance(store, _CountsOwners) else None
        self._claims = self.records if isinstance(self.records, RecordClaims) else None
        self._swaps = self.records if isinstance(self.records, RecordSwaps) else None
        self._pending = store if isinstance(store, PendingIndex) else None
        self._flat = store if isinstance(store, FlatIndex) else None
        self._retention = store if isinstance(store, RetentionIndex) else None
        self._outbox = store if isinstance(store, OutboxStore) else None
        self._closes = store if isinstance(store, _Closes) else None
        self._process_records = Records()
        self._claiming = asyncio.Lock()  # a claim in a RecordStore without claim_record: this process only

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        if self._executor is None:
            return fn(*args)
        return await self._executor.run(fn, args)

    async def acquire(self, session_id: str, wait: float, reject: bool = False,
                      stop: Callable[[], bool] | None = None) -> Lease:
        return Lease(session_id, None, await self.version(session_id))

    async def release(self, lease: Lease) -> None:
        return None

    async def sweep_leases(self) -> int:
        """Nothing to do: an in-process store keeps no leases."""
        return 0

    async def version(self, session_id: str) -> str | None:
        return await self._call(self.sync.version, session_id)

    async def load_session(self, session_id: str) -> SessionRecord | None:
        if self._encoded is not None:
            return await self._call(self._encoded.read_session, session_id)
        return await self._call(self._read_from_dicts, session_id)

    def _read_from_dicts(self, session_id: str) -> SessionRecord | None:
        """A user's SessionStore: its snapshot is encoded again to be measured and kept as text."""
        found = self.sync.load_versioned(session_id)
        if found is None:
            return None
        snapshot, version = found
        record = SessionRecord.of(session_id, snapshot, version, to_json(f"session {session_id}", snapshot))
        record.memories = {mid: self.sync.get_messages(mid) for mid in record.memory_ids}
        record.sizes = {mid: len(messages_json(mid, m)) for mid, m in record.memories.items()}
        return record

    async def commit_turn(self, commit: Commit, lease: Lease | None) -> str:
        if self._encoded is not None:
            return await self._call(self._encoded.write_commit, commit)
        return await self._call(self._commit_as_dicts, commit)

    def _commit_as_dicts(self, commit: Commit) -> str:
        if commit.quota_owner is not None and self._owners is not None:  # a user's store: read, then written
            commit.check_quota(self._owners.count_owned(commit.quota_owner))
        outcome = None if commit.outcome is None else (commit.outcome[0], from_json(commit.outcome[1]))
        version = self.sync.commit_turn(
            commit.session_id, from_json(commit.snapshot_json), commit.memories,
            [from_json(e) for e in commit.history_json], commit.expected, outcome,
        )
        if commit.remembered or commit.charges:  # a user's own store cannot write them in its commit: right after it
            self._remember_after(commit)
        return version

    def _remember_after(self, commit: Commit) -> None:
        now = time.time()
        if self.records is not None:
            user_records.write_through(self.records, commit.user_writes(), now)
            return
        self._process_records.remember(commit.user_writes(), now)  # a store without records: this process's

    async def load_history(self, session_id: str) -> list[JSONObject]:
        """The stored history; [] from a store that keeps none (not a HistoryStore)."""
        if self._history is None:
            return []
        return await self._call(self._history.load_history, session_id)

    async def get_outcome(self, session_id: str, request_id: str) -> JSONObject | None:
        """The recorded outcome; None from a store that records none (not a DurableStore)."""
        if self._durable is None:
            return None
        return await self._call(self._durable.get_outcome, session_id, request_id)

    async def request_ids(self, session_id: str) -> list[str]:
        """The ids of the requests whose outcomes the session keeps; [] from a user's store,
        which cannot list them (store/replays.py)."""
        listing = getattr(self.sync, "request_ids", None)
        return await self._call(listing, session_id) if listing is not None else []

    async def delete_session(self, session_id: str, memory_ids: list[str], lease: Lease | None) -> None:
        await self._call(self.sync.delete_session, session_id, memory_ids)
        self._process_records.delete_session(session_id)

    async def count_owned(self, owner: str) -> int:
        if self._owners is None:
            return 0
        return await self._call(self._owners.count_owned, owner)

    async def list_sessions(self) -> list[str]:
        return await self._call(self.sync.list_sessions)

    async def get_record(self, key: str) -> JSONObject | None:
        if self.records is None:
            return self._process_records.get(key)
        return await self._call(self.records.get_record, key)

    async def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None:
        if self.records is None:
            self._process_records.put(key, to_json(f"record {key}", record), session)
            return
        await self._call(self.records.put_record, key, record, session)

    async def put_record_text(self, key: str, text: str, session: str | None = None) -> bool:
        """put_record of a record given as its JSON text (the caller's, trusted to be an object),
        when the store takes one (its own `put_record_text`, or this process's records); False
        when it does not (then put_record). In one call (in_one_call) on the in-memory store,
        which runs no thread: its list of kept turns is not decoded and encoded again."""
        if self.records is None:
            self._process_records.put(key, text, session)
            return True
        put_text = getattr(self.records, "put_record_text", None)
        if put_text is None:
            return False
        await self._call(put_text, key, text, session)
        return True

    async def claim_record(self, key: str, record: JSONObject) -> bool:
        if self.records is None:
            return self._process_records.claim(key, to_json(f"record {key}", record))
        if self._claims is not None:
            return await self._call(self._claims.claim_record, key, record)
        async with self._claiming:  # a user's RecordStore: get then put, atomic in this process only
            if await self.get_record(key) is not None:
                return False
            await self.put_record(key, record)
            return True

    async def swap_record(self, key: str, expected: JSONObject, record: JSONObject | None) -> bool:
        if self.records is None:
            return self._process_records.swap(key, *swapped_texts(key, expected, record))
        if self._swaps is not None:
            return await self._call(self._swaps.swap_record, key, expected, record)
        async with self._claiming:  # a user's RecordStore: read, compare, write, atomic in this process only
            if await self.get_record(key) != expected:
                return False
            if record is None:
                await self.delete_record(key)
            else:
                await self.put_record(key, record)
            return True

    async def delete_record(self, key: str) -> None:
        if self.records is None:
            self._process_records.delete(key)
            return
        await self._call(self.records.delete_record, key)

    async def in_one_call(self, work: Callable[[RecordOps], Coroutine[Any, Any, T]]) -> T:
        """Run `work`'s record reads and writes (get_record, put_record, delete_record; version) in one
        call of the store's thread instead of one call each: each call is a thread hop of
        ~40 us of CPU, and the OpenAI API's index writes several records a turn. `work` is a
        coroutine that awaits nothing else, so it runs to its end in that thread. A store without
        a thread (memory://) is given its records' calls the same way, here: through this
        store's methods and their `_call` each was two coroutine frames more (the /v1 index
        makes ~9 a turn, ~0.04 M instructions; issue 39)."""
        if self.records is None:
            return await work(self)
        records = _SyncRecords(self.records, self.sync)
        if self._executor is None:
            return await work(records)
        return await self._call(_run_to_end, work(records))

    async def record_keys(self, prefix: str) -> list[str]:
        if self.records is None:
            return self._process_records.keys(prefix)
        listing = getattr(self.records, "record_keys", None)  # a user's RecordStore may not list
        return await self._call(listing, prefix) if listing is not None else []

    # -- pending items: a user's own store is scanned (every session loaded: fine for a few) --------

    async def list_due(self, now: float) -> list[str]:
        if self._pending is not None:
            return await self._call(self._pending.list_due, now)
        due = [(at, r.session_id) for r in await self._scan() if (at := due_epoch(r.pending)) is not None and at <= now]
        return [sid for _, sid in sorted(due)]

    async def list_pending(self, bot: str | None = None, kind: str | None = None) -> list[PendingSession]:
        if self._pending is not None:
            return await self._call(self._pending.list_pending, bot, kind)
        found = (pending_session(r, bot, kind) for r in await self._scan())
        return [entry for entry in found if entry is not None]

    async def waiting_page(self, key: str, after: tuple[float, str] | None, until: float | None,
                           limit: int) -> list[WaitingEntry]:
        if self._flat is not None:
            return await self._call(self._flat.waiting_page, key, after, until, limit)
        entries = [e for r in await self._scan() if (e := waiting_entry(r.session_id, r.snapshot)) is not None]
        placed = sorted(((e.positions[key], e.session_id), e) for e in entries if key in e.positions)
        return [e for place, e in placed if (after is None or place > after) and (until is None or place[0] <= until)][
            :limit]

    async def read_tallies(self, family: str, names: list[str] | None = None) -> dict[str, int]:
        if self._flat is not None:
            return await self._call(self._flat.read_tallies, family, names)
        counts: dict[str, int] = {}
        for record in await self._scan():
            for f, name, n in tallies_of(record.snapshot):
                if f == family and (names is None or name in names):
                    counts[name] = counts.get(name, 0) + n
        return counts
    # -- retention: a user's own store finds nothing idle (it keeps no write times) -------------

    async def list_idle(self, bot: str, before: float, limit: int) -> list[str]:
        if self._retention is not None:
            return await self._call(self._retention.list_idle, bot, before, limit)
        return []

    async def sessions_of(self, owner: str) -> list[str]:
        if self._retention is not None:
            return await self._call(self._retention.sessions_of, owner)
        return [r.session_id for r in await self._scan() if r.owner == owner]

    async def _scan(self) -> list[SessionRecord]:
        records = [await self.load_session(sid) for sid in await self.list_sessions()]
        return [r for r in records if r is not None]

    # -- the outbox: a store without one (a user's own SessionStore) has none to claim ------------

    @property
    def has_outbox(self) -> bool:
        return self._outbox is not None

    async def claim_outbox(self, now: float, lease: float, limit: int, routes: Collection[str]) -> list[OutboxEntry]:
        if self._outbox is None:
            return []
        return await self._call(self._outbox.claim_outbox, now, lease, limit, routes)

    async def settle_outbox(self, entry: OutboxEntry, delivered: bool) -> bool:
        if self._outbox is None:
            return False
        return await self._call(self._outbox.settle_outbox, entry, delivered)

    async def list_outbox(self, state: str | None = None, limit: int = 100) -> list[OutboxEntry]:
        if self._outbox is None:
            return []
        return await self._call(self._outbox.list_outbox, state, limit)

    async def delete_outbox(self, entry_ids: Collection[str]) -> int:
        delete = getattr(self.sync, "delete_outbox", None)  # the built-in stores' (RetentionIndex)
        return 0 if delete is None else await self._call(delete, entry_ids)

    async def requeue_outbox(self, entry_id: str, now: float) -> bool:
        if self._outbox is None:
            return False
        return await self._call(self._outbox.requeue_outbox, entry_id, now)

    async def scrub(self) -> None:
        """The store's `scrub` (SQLite: write over what was deleted), where it has one (aio.scrub)."""
        scrub = getattr(self.sync, "scrub", None)
        if scrub is not None:
            await self._call(scrub)

    async def close(self) -> None:
        if self._closes is not None:  # SessionStore does not require close()
            await self._call(self._closes.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)


class StoreThread:
    """One thread that runs a store's calls in the order they come, each answered on its caller's
    event loop. What `loop.run_in_executor(ThreadPoolExecutor(1), ...)` did, without the executor's
    future chained to an asyncio one (a lock, a work item, two futures and their callbacks a call):
    two calls a turn, ~0.1 M instructions of a served turn (bench/README.md). A call whose caller
    was cancelled before the thread reached it is skipped, as the executor skipped it. A daemon:
    `close()` queues the end after every call before it, and an unclosed store does not hold
    the process at exit."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], args: tuple[object, ...]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, future, fn, args))
        return future

    def shutdown(self, wait: bool = False) -> None:
        """The thread ends once the calls queued before this have run."""
        self._queue.put(None)
        if wait:
            self._thread.join()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, future, fn, args = item
            if future.cancelled():
                continue
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # the caller's to handle, on its loop
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the caller's loop closed meanwhile: nobody waits for the answer
                pass


def _settle(future: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class RecordOps(Protocol):
    """The record operations `LocalAsyncStore.in_one_call` gives its work, and a session's version."""

    async def version(self, session_id: str) -> str | None: ...

    async def get_record(self, key: str) -> JSONObject | None: ...

    async def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None: ...

    async def delete_record(self, key: str) -> None: ...


class _SyncRecords:
    """A RecordStore's calls as coroutines that never suspend (in_one_call's thread)."""

    def __init__(self, records: RecordStore, sessions: SessionStore):
        self.records, self.sessions = records, sessions

    async def version(self, session_id: str) -> str | None:
        return self.sessions.version(session_id)

    async def get_record(self, key: str) -> JSONObject | None:
        return self.records.get_record(key)

    async def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None:
        self.records.put_record(key, record, session)

    async def delete_record(self, key: str) -> None:
        self.records.delete_record(key)

    async def put_record_text(self, key: str, text: str, session: str | None = None) -> bool:
        """put_record of a record given as its JSON text (the caller's, trusted to be an object),
        when the store takes one (its own `put_record_text`); False when it does not (then put_record)."""
        put_text = getattr(self.records, "put_record_text", None)
        if put_text is None:
            return False
        put_text(key, text, session)
        return True


def _run_to_end(work: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (it awaits only _SyncRecords' calls)."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    work.close()
    raise RuntimeError("a record batch awaited something besides its records")
