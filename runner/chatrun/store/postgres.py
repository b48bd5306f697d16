"""`PostgresStore`: sessions, memories, history, the outbox, leases and files in PostgreSQL,
shared by every replica (issue 38).

    --store postgresql://USER[:PASSWORD]@HOST:PORT/DB[?max_connections=20&max_blob_bytes=...]
            (postgres:// too; every libpq parameter works: sslmode=require, ...)

The password comes from the URL, else from libpq's own places ($PGPASSWORD, ~/.pgpass). The
tables and their migrations: store/postgres_schema.py (applied by the first replica that
connects, recorded in `chatrun_migrations`).

The same contract as the SQLite and Redis stores (tests/test_store_conformance.py runs one
suite against all three): a commit is one transaction that takes the session's advisory lock,
checks that the caller still holds the lease and that the session is at the version the turn
started from, then writes snapshot, memories, history, outcome, outbox entries, the pending
index and the tallies, or nothing. Leases are rows with an expiry by the database's clock,
renewed every ttl/3 while a request runs; waiters queue in arrival order and poll, as on Redis
(a waiter that stops polling, its replica dead, is dropped). A replica that dies mid-turn
stops renewing; its lease expires and its uncommitted turn never lands. Outbox claims use
`FOR UPDATE SKIP LOCKED`: two workers never claim one entry.

Every connection comes from one asyncio pool (psycopg_pool), checked before use: after a
PostgreSQL restart the stale connections are replaced, not handed to a request. The check asks
the server (an empty query) only when the connection may be stale: its socket has something to
read while idle (a restart's closing) or it was idle STALE_CHECK_IDLE seconds or more
(`_check_if_stale`); a served turn's store calls, moments apart, send no empty query.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import select
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from chatrun.errors import ChatrunError
from chatrun.messages import Attachment, message_from_dict
from chatrun.store import user_records
from chatrun.store.billing import key_of as usage_key
from chatrun.store.blobs import (
    BLOB_PARAMETERS,
    DEFAULT_MAX_FOLDER_BLOB_BYTES,
    BlobQuota,
    blob_quota,
    blob_ref,
)
from chatrun.store.lease import Lease, LeaseSettings
from chatrun.store.postgres_schema import (
    MIGRATION_LOCK,
    MIGRATIONS,
    MIGRATIONS_TABLE,
    SCHEMA_VERSION,
)
from chatrun.store.record import (
    DEAD,
    EMPTY_MEMORY_SIZE,
    PENDING,
    TALLY_OWNER,
    Commit,
    JSONObject,
    OutboxEntry,
    PendingSession,
    SessionRecord,
    WaitingEntry,
    from_json,
    pending_session,
    requeued,
    swapped_texts,
    tallies_from_json,
    tallies_json,
    to_json,
    unclaimed,
)
from chatrun.store.urls import shown_url
from chatrun.store.versions import (
    CREATE,
    KEEP_OUTCOMES,
    LeaseLost,
    SessionBusy,
    StaleVersion,
    next_version,
)

log = logging.getLogger("chatrun.store")

WAITER_TTL_MS = 3000  # a waiter that has not polled for this long is dropped from the queue (as on Redis)
POOL_PARAMETERS = ("max_connections",)
CHATRUN_PARAMETERS = (*POOL_PARAMETERS, *BLOB_PARAMETERS)  # a URL's parameters that are chatrun's, not libpq's
DEFAULT_MAX_CONNECTIONS = 20
LEASE_CHANNEL = "chatrun_lease"  # NOTIFY channel: a session's lease was released (payload: the session id)
LISTENING_POLL = 0.25  # longest pause between two looks at the queue while NOTIFY wakes the waiters
_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::float8"
STALE_CHECK_IDLE = 5.0  # s: a pooled connection given back longer ago is checked with a query before use
_RETURNED: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()  # connection -> given back at
_HOLDS = f"SELECT 1 FROM leases WHERE session_id = %s AND token = %s AND expires > {_NOW_MS}"  # a row: still held


def postgres_url_parts(url: str) -> tuple[str, int]:
    """(the conninfo for libpq, the pool's size): chatrun's own parameters taken out."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    given = dict(query)
    size = given.get("max_connections", str(DEFAULT_MAX_CONNECTIONS))
    if not size.isdigit() or int(size) < 1:
        raise ChatrunError(f"store {shown_url(url)}: max_connections must be a positive number, not {size!r}")
    rest = urlencode([(k, v) for k, v in query if k not in CHATRUN_PARAMETERS])
    return urlunsplit(parts._replace(query=rest)), int(size)


def _import_psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401 - checked here, used by the store
    except ModuleNotFoundError:
        return None
    return psycopg


class PostgresStore:
    """See the module's text. One asyncio connection pool; every method is a coroutine."""

    records_as_text = True  # put_record keeps the record's JSON text, not the object (TurnIndex relies on it)

    distributed = True
    has_outbox = True

    def __init__(self, url: str, settings: LeaseSettings = LeaseSettings()):  # noqa: B008 - frozen
        self.url = shown_url(url)
        if _import_psycopg() is None:
            raise ChatrunError(f"store {self.url}: the Postgres store needs psycopg 3; "
                               "install it with: pip install 'chatrun[postgres]'")
        self.conninfo, self.max_connections = postgres_url_parts(url)
        self.settings = settings
        self.clock: Callable[[], float] = time.time  # what a commit's time is (tests pin it)
        self.blob_area = PostgresBlobs(self.conninfo, blob_quota(url, DEFAULT_MAX_FOLDER_BLOB_BYTES, self.url),
                                       self.url)
        self._pool: Any = None
        self._opening: asyncio.Lock | None = None
        self._wakers: dict[str, _Waker] = {}  # session -> what wakes its waiters here when it is released
        self._listener: asyncio.Task[None] | None = None
        self._listening = False  # the LISTEN connection is up: waiters may poll less often

    # -- plumbing ---------------------------------------------------------------------------

    async def _ready_pool(self) -> Any:
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                import psycopg
                from psycopg_pool import AsyncConnectionPool

                try:  # one connection first: an unreachable server fails at once, not after the pool's wait
                    async with await psycopg.AsyncConnection.connect(self.conninfo, connect_timeout=5) as conn:
                        await migrate(conn, self.url)
                except psycopg.Error as exc:
                    raise ChatrunError(f"store {self.url}: cannot reach PostgreSQL: {str(exc).strip()}") from None
                pool = AsyncConnectionPool(self.conninfo, min_size=1, max_size=self.max_connections, open=False,
                                           check=_check_if_stale, reset=_note_returned, timeout=30,
                                           configure=_autocommit, kwargs={"connect_timeout": 5})
                await pool.open(wait=False)
                self._pool = pool
        return self._pool

    @contextlib.asynccontextmanager
    async def _conn(self, what: str) -> AsyncIterator[Any]:
        """A connection of the pool (autocommit: one statement is its own transaction, sent in one
        round trip, where BEGIN, the statement and COMMIT took three)."""
        import psycopg

        pool = await self._ready_pool()
        try:
            async with pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            raise ChatrunError(f"store {self.url}: could not {what}: {exc}") from None

    @contextlib.asynccontextmanager
    async def _tx(self, what: str) -> AsyncIterator[Any]:
        """A connection inside one transaction (committed at the end, rolled back on an error)."""
        async with self._conn(what) as conn, conn.transaction():
            yield conn

    @contextlib.asynccontextmanager
    async def _pipelined_tx(self, what: str) -> AsyncIterator[tuple[Any, Any]]:
        """A connection inside one transaction, its statements pipelined: BEGIN goes with the first
        batch, COMMIT with the last; `pipe.sync()` sends a batch and reads its results. On an error
        the connection's context (the pool's) rolls the transaction back. (psycopg's transaction()
        in a pipeline syncs at its start and its end: two round trips more.)"""
        async with self._conn(what) as conn, conn.pipeline() as pipe:
            await conn.execute("BEGIN")
            yield conn, pipe
            await conn.execute("COMMIT")

    async def _one(self, what: str, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> Any:
        """One statement's first row: atomic as any statement is, without a transaction around it."""
        async with self._conn(what) as conn:
            return await (await conn.execute(sql, params)).fetchone()

    async def _all(self, what: str, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[Any]:
        async with self._conn(what) as conn:
            return list(await (await conn.execute(sql, params)).fetchall())

    async def ping(self) -> None:
        """Raises ChatrunError unless PostgreSQL answers: the first time, by connecting and
        migrating; then on a connection of its own, outside the pool, so a busy pool never reads
        as a stalled server and a refused connection answers at once (the caller bounds the wait)."""
        import psycopg

        if self._pool is None:
            await self._ready_pool()
            return
        try:
            async with await psycopg.AsyncConnection.connect(self.conninfo, connect_timeout=5) as conn:
                await conn.execute("SELECT 1")
        except psycopg.Error as exc:
            raise ChatrunError(f"store {self.url}: cannot reach PostgreSQL: {str(exc).strip()}") from None

    def pool_use(self) -> tuple[int, int]:
        """(connections in use, the pool's size): /health shows them, for sizing."""
        if self._pool is None:
            return 0, self.max_connections
        stats = self._pool.get_stats()
        return stats.get("pool_size", 0) - stats.get("pool_available", 0), self.max_connections

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(BaseException):
                await self._listener
            self._listener = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        self.blob_area.close()

    # -- leases -----------------------------------------------------------------------------

    async def acquire(self, session_id: str, wait: float, reject: bool = False,
                      stop: Callable[[], bool] | None = None) -> Lease:
        token = secrets.token_hex(12)
        deadline = time.monotonic() + wait
        pause = 0.002
        try:
            while True:
                granted, detail, usage = await self._try_acquire(session_id, token, reject)
                if granted:
                    lease = Lease(session_id, token, detail or None, usage_read=True, usage_record=usage)
                    lease.renewer = asyncio.ensure_future(self._keep(lease))
                    return lease
                if detail == "-1":
                    raise SessionBusy(f"session {session_id} is running a turn (if busy: reject)")
                if stop is not None and stop():
                    raise SessionBusy(f"session {session_id}: the server is shutting down")
                if time.monotonic() >= deadline:
                    raise SessionBusy(f"session {session_id} stayed busy for {wait:g} s (queue position "
                                      f"{int(detail) + 1}); try again later")
                await self._wait_for_release(session_id, min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, LISTENING_POLL if self._listening else self.settings.poll)
        except BaseException:
            with contextlib.suppress(Exception):  # stop waiting: leave the queue at once
                await asyncio.shield(self._leave(session_id, token))
            raise

    async def _try_acquire(self, session_id: str, token: str, reject: bool) -> tuple[bool, str, str | None]:
        """One look at the session's lease and queue (postgres_schema's chatrun_acquire), and once
        granted its usage record (store/billing.py), read after the grant: both statements in one
        round trip (a pipeline). (granted, version, the record's text or None) or (False, queue
        rank, None), (False, "-1", None) busy with `reject`."""
        async with self._conn(f"take the lease on session {session_id}") as conn:
            async with conn.pipeline():  # in one implicit transaction: the read sees the grant
                acquired = await conn.execute("SELECT chatrun_acquire(%s, %s, %s, %s, %s)",
                                              (session_id, token, self.settings.ttl * 1000, WAITER_TTL_MS, reject))
                # Only if the lease is now this token's (the function's write, in this transaction).
                recorded = await conn.execute("SELECT r.record FROM records r WHERE r.key = %s AND EXISTS "
                                              "(SELECT 1 FROM leases l WHERE l.session_id = %s AND l.token = %s)",
                                              (usage_key(session_id), session_id, token))
            granted, detail = (await acquired.fetchone())[0]
            row = await recorded.fetchone()
        return granted == "1", str(detail), None if row is None else row[0]

    async def _wait_for_release(self, session_id: str, pause: float) -> None:
        """Sleep `pause` seconds, or less: until a release of the session's lease is announced
        (NOTIFY chatrun_lease, by any replica). Without the LISTEN connection, a plain sleep."""
        self._start_listening()
        waker = self._wakers.get(session_id)  # shared by this process's waiters on the session
        if waker is None:
            waker = self._wakers[session_id] = _Waker()
        waker.waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waker.released.wait(), pause)
        finally:
            waker.waiting -= 1
            if not waker.waiting and self._wakers.get(session_id) is waker:
                del self._wakers[session_id]

    def _start_listening(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        """LISTEN on a connection of its own; each notification wakes the session's waiters at
        once. A lost connection is reopened (waiters poll meanwhile: nothing waits for it)."""
        import psycopg

        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                                 connect_timeout=5) as conn:
                    await conn.execute(f"LISTEN {LEASE_CHANNEL}")
                    self._listening = True
                    async for note in conn.notifies():
                        waker = self._wakers.pop(note.payload, None)  # the next wait makes a new one
                        if waker is not None:
                            waker.released.set()
            except psycopg.Error as exc:
                log.info("store %s: listening for lease releases stopped (%s); polling meanwhile", self.url, exc)
            finally:
                self._listening = False
            await asyncio.sleep(1.0)

    async def _leave(self, session_id: str, token: str) -> None:
        await self._one(f"leave the queue of session {session_id}",
                        "DELETE FROM lease_queue WHERE session_id = %s AND token = %s RETURNING 1", (session_id, token))

    async def _keep(self, lease: Lease) -> None:
        """Renew the lease every ttl/3 until released; mark it lost if it slipped away."""
        while True:
            await asyncio.sleep(self.settings.ttl / 3)
            try:
                row = await self._one(
                    f"renew the lease on session {lease.session_id}",
                    f"UPDATE leases SET expires = {_NOW_MS} + %s WHERE session_id = %s AND token = %s "
                    f"AND expires > {_NOW_MS} RETURNING 1", (self.settings.ttl * 1000, lease.session_id, lease.token))
            except Exception as exc:  # PostgreSQL unreachable: try again; the commit's check decides
                log.warning("could not renew the lease on session %s: %s", lease.session_id, exc)
                continue
            if row is None:
                lease.lost = True
                log.warning("lost the lease on session %s", lease.session_id)
                return

    async def release(self, lease: Lease) -> None:
        if lease.renewer is not None:
            lease.renewer.cancel()
        if lease.token is not None:
            # Wake the session's waiters on every replica (NOTIFY: delivered when the deletion commits).
            await self._one(f"release the lease on session {lease.session_id}",
                            "WITH gone AS (DELETE FROM leases WHERE session_id = %s AND token = %s RETURNING 1) "
                            "SELECT pg_notify(%s, %s)", (lease.session_id, lease.token, LEASE_CHANNEL, lease.session_id))

    async def sweep_leases(self) -> int:
        """Delete the lease rows that ran out and the queue rows of waiters that stopped polling:
        what a process that died left (a replica's own lease, chatrun/replica/<id>, else stays
        until someone asks for it again; server/liveness.py). An expired lease is held by nobody
        (a renewal and a commit need it unexpired), so deleting it changes no one's hold; a lease
        taken again meanwhile is no longer expired, and stays. How many rows went."""
        row = await self._one("sweep the expired leases",
                              f"WITH gone AS (DELETE FROM leases WHERE expires < {_NOW_MS} RETURNING 1), "
                              f"dropped AS (DELETE FROM lease_queue WHERE alive < {_NOW_MS} RETURNING 1) "
                              "SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM dropped)")
        return int(row[0])

    @staticmethod
    async def _holds(conn: Any, lease: Lease | None) -> bool:
        if lease is None or not lease.token:
            return True
        return await (await conn.execute(_HOLDS, (lease.session_id, lease.token))).fetchone() is not None

    # -- sessions ---------------------------------------------------------------------------

    async def version(self, session_id: str) -> str | None:
        row = await self._one(f"read session {session_id}", "SELECT version FROM sessions WHERE session_id = %s",
                              (session_id,))
        return None if row is None else str(row[0])

    async def load_session(self, session_id: str) -> SessionRecord | None:
        """The session's record with its memories, read in one transaction."""
        async with self._tx(f"read session {session_id}") as conn:
            row = await (await conn.execute("SELECT snapshot, version FROM sessions WHERE session_id = %s",
                                            (session_id,))).fetchone()
            if row is None:
                return None
            record = SessionRecord.decode(session_id, row[0], row[1])
            found = await (await conn.execute("SELECT memory_id, messages FROM memories WHERE memory_id = ANY(%s)",
                                              (record.memory_ids,))).fetchall()
        texts = dict(found)
        try:
            record.memories = {mid: [message_from_dict(d) for d in json.loads(texts[mid])] if mid in texts else []
                               for mid in record.memory_ids}
        except (ValueError, KeyError, TypeError) as exc:
            raise ChatrunError(f"store {self.url}: session {session_id} is corrupt ({exc})") from None
        record.sizes = {mid: len(texts[mid]) if mid in texts else EMPTY_MEMORY_SIZE for mid in record.memory_ids}
        return record

    async def commit_turn(self, commit: Commit, lease: Lease | None) -> str:
        session_id, expected = commit.session_id, commit.expected
        if expected is None:  # every write is fenced; an unchecked one has no meaning here
            raise ChatrunError(f"store {self.url}: session {session_id}: a commit names the version it expects")
        if lease is not None and lease.lost:
            raise LeaseLost(session_id)
        # Two round trips: what the checks need, read under the locks (one pipeline), then the
        # writes and COMMIT (another); BEGIN goes with the first. A refused check rolls back.
        async with self._pipelined_tx(f"save a turn of session {session_id}") as (conn, pipe):
            read = await _read_for_commit(conn, commit, lease)
            await pipe.sync()
            row = await read.checked(session_id, expected)
            version = next_version(None if row is None else str(row[0]))
            await _remember(conn, commit, await read.user_records(), self.clock())
            await conn.execute(
                "INSERT INTO sessions (session_id, snapshot, version, updated_at, bot, owner, due, pending) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (session_id) DO UPDATE SET "
                "snapshot = excluded.snapshot, version = excluded.version, updated_at = excluded.updated_at, "
                "bot = excluded.bot, owner = excluded.owner, due = excluded.due, pending = excluded.pending",
                (session_id, commit.snapshot_json, version, self.clock(), commit.bot or "", commit.owner,
                 commit.due, commit.pending_count))
            await _index_commit(conn, commit, None if row is None else row[1], 0 if row is None else row[2])
            await _write_turn(conn, commit)
        return version

    async def load_history(self, session_id: str) -> list[JSONObject]:
        rows = await self._all(f"read the history of session {session_id}",
                               "SELECT entry FROM history WHERE session_id = %s ORDER BY seq", (session_id,))
        return [from_json(r[0]) for r in rows]

    async def get_outcome(self, session_id: str, request_id: str) -> JSONObject | None:
        row = await self._one(f"read request {request_id} of session {session_id}",
                              "SELECT outcome FROM requests WHERE session_id = %s AND request_id = %s",
                              (session_id, request_id))
        return None if row is None else from_json(row[0])

    async def request_ids(self, session_id: str) -> list[str]:
        """The ids of the requests whose outcomes the session keeps (store/replays.py)."""
        rows = await self._all(f"read the request ids of session {session_id}",
                               "SELECT request_id FROM requests WHERE session_id = %s", (session_id,))
        return [str(r[0]) for r in rows]

    async def delete_session(self, session_id: str, memory_ids: list[str], lease: Lease | None) -> None:
        async with self._tx(f"delete session {session_id}") as conn:
            await _lock_session(conn, session_id)
            if not await self._holds(conn, lease):
                raise LeaseLost(session_id)
            row = await (await conn.execute("SELECT tallies FROM sessions WHERE session_id = %s",
                                            (session_id,))).fetchone()
            await _replace_waiting(conn, session_id, None)
            if row is not None:
                await _move_tallies(conn, tallies_from_json(row[0]), [])
            # (the lease stays: the deleting request holds it until it releases it)
            for table in ("sessions", "history", "requests", "blobs", "lease_queue"):
                await conn.execute(f"DELETE FROM {table} WHERE session_id = %s", (session_id,))  # noqa: S608
            await conn.execute("DELETE FROM records WHERE session = %s", (session_id,))
            await conn.execute("DELETE FROM memories WHERE memory_id = ANY(%s)", (memory_ids,))

    async def count_owned(self, owner: str) -> int:
        return (await self.read_tallies(TALLY_OWNER, [owner])).get(owner, 0)

    async def list_sessions(self) -> list[str]:
        return [r[0] for r in await self._all("list sessions", "SELECT session_id FROM sessions ORDER BY seq")]

    # -- retention --------------------------------------------------------------------------

    async def list_idle(self, bot: str, before: float, limit: int) -> list[str]:
        rows = await self._all("list idle sessions", "SELECT session_id FROM sessions WHERE bot = %s AND "
                               "updated_at < %s ORDER BY updated_at LIMIT %s", (bot, before, limit))
        return [r[0] for r in rows]

    async def sessions_of(self, owner: str) -> list[str]:
        rows = await self._all(f"list the sessions of {owner}",
                               "SELECT session_id FROM sessions WHERE owner = %s ORDER BY session_id", (owner,))
        return [r[0] for r in rows]

    # -- records ----------------------------------------------------------------------------

    async def get_record(self, key: str) -> JSONObject | None:
        row = await self._one(f"read record {key}", "SELECT record FROM records WHERE key = %s", (key,))
        return None if row is None else from_json(row[0])

    async def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None:
        await self.put_record_text(key, to_json(f"record {key}", record), session)

    async def put_record_text(self, key: str, text: str, session: str | None = None) -> bool:
        """put_record of a record given as its JSON text (an object's: the caller's word for it);
        True: saved (the /v1 index's list of kept turns, written every turn, has its text)."""
        await self._one(f"save record {key}", "INSERT INTO records (key, record, session) VALUES (%s, %s, %s) "
                        "ON CONFLICT (key) DO UPDATE SET record = excluded.record, session = excluded.session "
                        "RETURNING 1", (key, text, session))
        return True

    async def claim_record(self, key: str, record: JSONObject) -> bool:
        """put-if-absent: atomic across every replica (the primary key decides)."""
        text = to_json(f"record {key}", record)
        row = await self._one(f"claim record {key}", "INSERT INTO records (key, record) VALUES (%s, %s) "
                              "ON CONFLICT (key) DO NOTHING RETURNING 1", (key, text))
        return row is not None

    async def swap_record(self, key: str, expected: JSONObject, record: JSONObject | None) -> bool:
        """Compare-and-swap (chatrun.store.RecordSwaps): one statement; of two at once the second
        waits for the first's row lock, then finds the record changed (READ COMMITTED re-reads it)."""
        old, text = swapped_texts(key, expected, record)
        if text is None:
            row = await self._one(f"delete record {key}", "DELETE FROM records WHERE key = %s AND record = %s "
                                  "RETURNING 1", (key, old))
        else:
            row = await self._one(f"replace record {key}", "UPDATE records SET record = %s WHERE key = %s "
                                  "AND record = %s RETURNING 1", (text, key, old))
        return row is not None

    async def delete_record(self, key: str) -> None:
        await self._one(f"delete record {key}", "DELETE FROM records WHERE key = %s RETURNING 1", (key,))

    async def record_keys(self, prefix: str) -> list[str]:
        rows = await self._all(f"list records {prefix}*", "SELECT key FROM records WHERE key >= %s AND key < %s "
                               "ORDER BY key", (prefix, prefix + "\U0010ffff"))
        return [r[0] for r in rows]

    # -- pending items and the operators' index -----------------------------------------------

    async def list_due(self, now: float) -> list[str]:
        rows = await self._all("list the sessions with items due", "SELECT session_id FROM sessions "
                               "WHERE due IS NOT NULL AND due <= %s ORDER BY due", (now,))
        return [r[0] for r in rows]

    async def list_pending(self, bot: str | None = None, kind: str | None = None) -> list[PendingSession]:
        rows = await self._all("list the sessions with pending items", "SELECT session_id, snapshot, version "
                               "FROM sessions WHERE pending > 0 ORDER BY seq")
        found = (pending_session(SessionRecord.decode(sid, text, version), bot, kind) for sid, text, version in rows)
        return [entry for entry in found if entry is not None]

    async def waiting_page(self, key: str, after: tuple[float, str] | None, until: float | None,
                           limit: int) -> list[WaitingEntry]:
        start = after or (float("-inf"), "")
        rows = await self._all(
            "list the waiting sessions",
            "SELECT w.entry FROM waiting_index i JOIN waiting w ON w.session_id = i.session_id "
            "WHERE i.key = %s AND (i.position, i.session_id) > (%s, %s) AND i.position <= %s "
            "ORDER BY i.position, i.session_id LIMIT %s",
            (key, start[0], start[1], float("inf") if until is None else until, limit))
        return [WaitingEntry.from_json(r[0]) for r in rows]

    async def read_tallies(self, family: str, names: list[str] | None = None) -> dict[str, int]:
        if names is None:
            rows = await self._all(f"read the {family} tallies", "SELECT name, n FROM tallies WHERE family = %s",
                                   (family,))
        else:
            rows = await self._all(f"read the {family} tallies", "SELECT name, n FROM tallies WHERE family = %s "
                                   "AND name = ANY(%s)", (family, names))
        return {name: int(n) for name, n in rows}

    # -- the outbox ---------------------------------------------------------------------------

    async def claim_outbox(self, now: float, lease: float, limit: int, routes: Collection[str]) -> list[OutboxEntry]:
        async with self._tx("claim outbox entries") as conn:
            rows = await (await conn.execute(
                "SELECT entry FROM outbox WHERE route = ANY(%s) AND state = %s AND due <= %s ORDER BY seq "
                "LIMIT %s FOR UPDATE SKIP LOCKED", (sorted(routes), PENDING, now, limit))).fetchall()
            claimed = []
            for (text,) in rows:
                entry = OutboxEntry.from_json(text)
                entry.claim, entry.claimed_until = secrets.token_hex(8), now + lease
                await _save_entry(conn, entry)
                claimed.append(entry)
        return claimed

    async def settle_outbox(self, entry: OutboxEntry, delivered: bool) -> bool:
        async with self._tx(f"settle outbox entry {entry.id}") as conn:
            row = await (await conn.execute("SELECT claim FROM outbox WHERE id = %s FOR UPDATE",
                                            (entry.id,))).fetchone()
            if row is None or row[0] != entry.claim:
                return False
            if delivered:
                await conn.execute("DELETE FROM outbox WHERE id = %s", (entry.id,))
            else:
                await _save_entry(conn, unclaimed(entry))
        return True

    async def list_outbox(self, state: str | None = None, limit: int = 100) -> list[OutboxEntry]:
        rows = await self._all("list the outbox", "SELECT entry FROM outbox WHERE %s::text IS NULL OR state = %s "
                               "ORDER BY seq LIMIT %s", (state, state, limit))
        return [OutboxEntry.from_json(r[0]) for r in rows]

    async def requeue_outbox(self, entry_id: str, now: float) -> bool:
        async with self._tx(f"retry outbox entry {entry_id}") as conn:
            row = await (await conn.execute("SELECT entry FROM outbox WHERE id = %s AND state = %s FOR UPDATE",
                                            (entry_id, DEAD))).fetchone()
            if row is None:
                return False
            await _save_entry(conn, requeued(OutboxEntry.from_json(row[0]), now))
        return True

    async def delete_outbox(self, entry_ids: Collection[str]) -> int:
        rows = await self._all("delete outbox entries", "DELETE FROM outbox WHERE id = ANY(%s) RETURNING 1",
                               (list(entry_ids),))
        return len(rows)


class _Waker:
    """The waiters of one session in this process, and the event a release sets."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.waiting = 0


# -- a commit's writes (inside its transaction) -------------------------------------------------

async def _lock_session(conn: Any, session_id: str) -> None:
    """Commits and deletes of one session, one at a time (until the transaction ends)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('session:' || %s, 0))", (session_id,))


class _CommitRead:
    """The cursors of a commit's first round trip (_read_for_commit), read once it is synced."""

    def __init__(self, commit: Commit, held: Any, session: Any, owned: Any, records: dict[str, Any]):
        self.commit, self.held, self.session, self.owned, self.records = commit, held, session, owned, records

    async def checked(self, session_id: str, expected: str) -> Any:
        """The session's row (version, tallies, pending) or None, once the lease, the version and
        the quota are found as the commit needs them (LeaseLost, StaleVersion, SessionQuota)."""
        if self.held is not None and await self.held.fetchone() is None:
            raise LeaseLost(session_id)
        row = await self.session.fetchone()
        current = None if row is None else str(row[0])
        if (expected == CREATE and current is not None) or (expected != CREATE and current != expected):
            raise StaleVersion(session_id, expected, current)
        if self.owned is not None:
            self.commit.check_quota(int((await self.owned.fetchone())[0]))
        return row

    async def user_records(self) -> dict[str, JSONObject | None]:
        found = {key: await cursor.fetchone() for key, cursor in self.records.items()}
        return {key: None if row is None else from_json(row[0]) for key, row in found.items()}


async def _read_for_commit(conn: Any, commit: Commit, lease: Lease | None) -> _CommitRead:
    """Queue (a pipeline) what a commit reads before it writes, in the order its locks are taken:
    the session's lock, the lease, the session's row, the owner's tally (Commit.quota), then each
    user record it changes, locked (an advisory lock for a record not there yet, FOR UPDATE for
    the row an erasure deletes; always in the same order: memory, then budget). The user record
    is the user's, not the session's: two sessions of one user commit at once."""
    await _lock_session(conn, commit.session_id)
    held = None
    if lease is not None and lease.token:
        held = await conn.execute(_HOLDS, (lease.session_id, lease.token))
    session = await conn.execute("SELECT version, tallies, pending FROM sessions WHERE session_id = %s",
                                 (commit.session_id,))
    owned = None if commit.quota_owner is None else await conn.execute(_LOCK_OWNED, (TALLY_OWNER, commit.quota_owner))
    records: dict[str, Any] = {}
    for key in dict.fromkeys(user_records.key_of(item) for item in commit.user_writes()):
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('record:' || %s, 0))", (key,))
        records[key] = await conn.execute("SELECT record FROM records WHERE key = %s FOR UPDATE", (key,))
    return _CommitRead(commit, held, session, owned, records)


async def _remember(conn: Any, commit: Commit, found: dict[str, JSONObject | None], now: float) -> None:
    """What the commit's turns remembered of their user and used of their budget, written after
    `found` (each record as read, locked, by _read_for_commit): each item in turn, one write a record."""
    records = dict(found)
    for item in commit.user_writes():
        key = user_records.key_of(item)
        records[key] = user_records.written(records[key], item, now)
    for key, record in records.items():
        if record is None:
            await conn.execute("DELETE FROM records WHERE key = %s", (key,))
        else:
            await conn.execute("INSERT INTO records (key, record, session) VALUES (%s, %s, NULL) ON CONFLICT (key) "
                               "DO UPDATE SET record = excluded.record, session = NULL",
                               (key, to_json(f"record {key}", record)))


async def _write_turn(conn: Any, commit: Commit) -> None:
    """The memories, history, outcome and outbox entries of a commit."""
    session_id = commit.session_id
    for mid, text in commit.memories_json.items():
        if text is None:
            await conn.execute("DELETE FROM memories WHERE memory_id = %s", (mid,))
        else:
            await conn.execute("INSERT INTO memories (memory_id, messages) VALUES (%s, %s) ON CONFLICT (memory_id) "
                               "DO UPDATE SET messages = excluded.messages", (mid, text))
    if commit.history_json:  # numbered after the last entry, in the statement (no round trip to read it)
        await conn.execute(
            "INSERT INTO history (session_id, seq, entry) SELECT %s, COALESCE((SELECT MAX(seq) FROM history "
            "WHERE session_id = %s), 0) + t.i, t.entry FROM unnest(%s::int[], %s::text[]) AS t(i, entry)",
            (session_id, session_id, list(range(1, len(commit.history_json) + 1)), commit.history_json))
    if commit.outcome is not None:
        request_id, text = commit.outcome
        await conn.execute("INSERT INTO requests (session_id, request_id, outcome, seq) VALUES (%s, %s, %s, "
                           "COALESCE((SELECT MAX(seq) FROM requests WHERE session_id = %s), 0) + 1) "
                           "ON CONFLICT (session_id, request_id) DO UPDATE SET outcome = excluded.outcome, "
                           "seq = excluded.seq", (session_id, request_id, text, session_id))
        await conn.execute("DELETE FROM requests WHERE session_id = %s AND seq <= "
                           "(SELECT MAX(seq) FROM requests WHERE session_id = %s) - %s",
                           (session_id, session_id, KEEP_OUTCOMES))
    if commit.outbox:
        async with conn.cursor() as cur:
            await cur.executemany("INSERT INTO outbox (id, route, state, due, entry) VALUES (%s, %s, %s, %s, %s)",
                                  [(e.id, e.route, e.state, e.due, e.to_json()) for e in commit.outbox])


async def _index_commit(conn: Any, commit: Commit, old_tallies: str | None, old_pending: int) -> None:
    """Keep the operators' index and the tallies true after a commit (see SQLiteStore)."""
    if old_pending or commit.waiting is not None:
        await _replace_waiting(conn, commit.session_id, commit.waiting)
    new_tallies = tallies_json(commit.tallies)
    if new_tallies != old_tallies:
        await _move_tallies(conn, tallies_from_json(old_tallies), commit.tallies)
        await conn.execute("UPDATE sessions SET tallies = %s WHERE session_id = %s", (new_tallies, commit.session_id))


async def _replace_waiting(conn: Any, session_id: str, waiting: WaitingEntry | None) -> None:
    await conn.execute("DELETE FROM waiting WHERE session_id = %s", (session_id,))
    await conn.execute("DELETE FROM waiting_index WHERE session_id = %s", (session_id,))
    if waiting is not None:
        await conn.execute("INSERT INTO waiting (session_id, entry) VALUES (%s, %s)", (session_id, waiting.to_json()))
        async with conn.cursor() as cur:
            await cur.executemany("INSERT INTO waiting_index (key, position, session_id) VALUES (%s, %s, %s)",
                                  [(key, at, session_id) for key, at in waiting.positions.items()])


# How many sessions the owner has, its tally row locked until the transaction ends: one
# statement, so two replicas creating the owner's sessions at once count one after the other (the
# second waits for the first's commit and reads its count). A new owner's row is made with 0; a
# refused commit rolls it back. Owner rows sort first of the tallies (_move_tallies' order): no deadlock.
_LOCK_OWNED = ("INSERT INTO tallies (family, name, n) VALUES (%s, %s, 0) ON CONFLICT (family, name) "
               "DO UPDATE SET n = tallies.n RETURNING n")


async def _move_tallies(conn: Any, old: list[tuple[str, str, int]], new: list[tuple[str, str, int]]) -> None:
    """A session no longer counts for `old` but for `new`. The changes are netted and applied in
    one order (family, name), so two commits moving the same tallies never deadlock."""
    change: dict[tuple[str, str], int] = {}
    for family, name, n in [(f, m, -c) for f, m, c in old] + list(new):
        change[(family, name)] = change.get((family, name), 0) + n
    for (family, name), n in sorted(change.items()):
        if n == 0:
            continue
        await conn.execute("INSERT INTO tallies (family, name, n) VALUES (%s, %s, %s) ON CONFLICT (family, name) "
                           "DO UPDATE SET n = tallies.n + excluded.n", (family, name, n))
        if n < 0:
            await conn.execute("DELETE FROM tallies WHERE family = %s AND name = %s AND n <= 0", (family, name))


async def _save_entry(conn: Any, entry: OutboxEntry) -> None:
    await conn.execute("UPDATE outbox SET state = %s, due = %s, claim = %s, entry = %s WHERE id = %s",
                       (entry.state, entry.due, entry.claim, entry.to_json(), entry.id))


async def _autocommit(conn: Any) -> None:
    """The pool's connections run each statement as its own transaction; `_tx` opens one for more."""
    await conn.set_autocommit(True)


async def _note_returned(conn: Any) -> None:
    """The pool's reset: when the connection was last given back (what _check_if_stale reads)."""
    _RETURNED[conn] = time.monotonic()


async def _check_if_stale(conn: Any) -> None:
    """The pool's check before it hands a connection out: an empty query (a round trip) only
    for a connection that may be stale. A PostgreSQL restart or a killed server closes every
    connection, and the closing reaches the client's socket: it has something to read while
    idle (the server's "terminating connection" or the end of the stream), seen without asking
    the server; nothing to read and given back under STALE_CHECK_IDLE seconds ago, it is used as
    it is. One idle longer (the server's host may have gone without a word) is asked."""
    from psycopg_pool import AsyncConnectionPool

    returned = _RETURNED.get(conn)
    if returned is None or time.monotonic() - returned >= STALE_CHECK_IDLE or _has_input(conn):
        await AsyncConnectionPool.check_connection(conn)


def _has_input(conn: Any) -> bool:
    """Whether an idle connection's socket has something to read (or is closed): True when it
    cannot be told (no poll on this system; a closed connection)."""
    if conn.closed or not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))


async def migrate(conn: Any, shown: str) -> None:
    """Bring the database's schema to SCHEMA_VERSION (store/postgres_schema.py), one migration
    per transaction, under an advisory lock (replicas starting at once wait for the first)."""
    await conn.set_autocommit(True)
    try:
        await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        try:
            await conn.execute(MIGRATIONS_TABLE)
            row = await (await conn.execute("SELECT COALESCE(MAX(version), 0) FROM chatrun_migrations")).fetchone()
            applied = int(row[0])
            if applied > SCHEMA_VERSION:
                raise ChatrunError(f"store {shown}: written by a newer chatrun (schema {applied}, this one knows "
                                   f"{SCHEMA_VERSION}); upgrade chatrun or use another database")
            for version, name, sql in MIGRATIONS:
                if version <= applied:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute("INSERT INTO chatrun_migrations (version, name) VALUES (%s, %s)",
                                       (version, name))
                log.info("store %s: applied migration %d (%s)", shown, version, name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    finally:
        await conn.set_autocommit(False)


class PostgresBlobs:
    """The blob area of a Postgres store: table `blobs` (session, SHA-256 reference, bytes), once per
    content per session, deleted with its session in the store's delete transaction. The caps
    (`max_blob_bytes`, default 256 MiB, `max_blob_files`, default 100, in the URL) are checked
    in the transaction that adds a file, under the session's lock: two replicas adding files at
    once cannot pass them together. Synchronous (the engine reads files in a synchronous step),
    on one connection of its own behind a lock."""

    def __init__(self, conninfo: str, quota: BlobQuota, shown: str):
        self.conninfo, self.quota, self.shown = conninfo, quota, shown
        self._lock = threading.Lock()
        self._conn: Any = None

    @property
    def max_bytes(self) -> int:
        return self.quota.max_bytes

    @contextlib.contextmanager
    def _tx(self, what: str) -> Iterator[Any]:
        import psycopg

        with self._lock:
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = psycopg.connect(self.conninfo, connect_timeout=5)
                with self._conn.transaction():
                    yield self._conn
            except psycopg.Error as exc:
                raise ChatrunError(f"store {self.shown}: could not {what}: {exc}") from None

    def put(self, session_id: str, data: bytes, media_type: str, name: str = "") -> Attachment:
        ref = blob_ref(data)
        with self._tx(f"save a file of session {session_id}") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('blobs:' || %s, 0))", (session_id,))
            if conn.execute("SELECT 1 FROM blobs WHERE session_id = %s AND ref = %s", (session_id, ref)).fetchone():
                return Attachment(ref, media_type, name, len(data))
            files, total = conn.execute("SELECT count(*), COALESCE(sum(length(data)), 0) FROM blobs "
                                        "WHERE session_id = %s", (session_id,)).fetchone()
            files, total = int(files) + 1, int(total) + len(data)
            if files > self.quota.max_files or total > self.quota.max_bytes:
                self.quota.check(session_id, files, total)
            conn.execute("INSERT INTO blobs (session_id, ref, data) VALUES (%s, %s, %s)", (session_id, ref, data))
        return Attachment(ref, media_type, name, len(data))

    def read(self, session_id: str, ref: str) -> bytes | None:
        with self._tx(f"read a file of session {session_id}") as conn:
            row = conn.execute("SELECT data FROM blobs WHERE session_id = %s AND ref = %s", (session_id, ref)).fetchone()
        return None if row is None else bytes(row[0])

    def refs(self, session_id: str) -> list[str]:
        with self._tx(f"list the files of session {session_id}") as conn:
            rows = conn.execute("SELECT ref FROM blobs WHERE session_id = %s ORDER BY ref", (session_id,)).fetchall()
        return [r[0] for r in rows]

    def delete_session(self, session_id: str) -> None:
        with self._tx(f"delete the files of session {session_id}") as conn:
            conn.execute("DELETE FROM blobs WHERE session_id = %s", (session_id,))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def check_reachable(url: str) -> None:
    """Connect once (and migrate) on a loop of its own, so a command line can say "cannot reach
    PostgreSQL" before it starts serving. Raises ChatrunError."""

    async def ping() -> None:
        store = PostgresStore(url)
        try:
            await store.ping()
        finally:
            await store.close()

    asyncio.run(ping())
