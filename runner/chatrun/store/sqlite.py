"""`SQLiteStore`: memories, session snapshots and history in one SQLite file (stdlib sqlite3).

Tables: memories(memory_id, messages JSON), sessions(session_id, snapshot JSON, updated_at,
version, due: its earliest pending item's due time, pending: how many items wait; both indexed), history(session_id, seq, entry JSON), requests(session_id, request_id, outcome JSON,
seq), records(key, record JSON), outbox(id, state, due, entry JSON: backend events to deliver, written
in the commit of their turn). A commit (`commit_turn`, `write_commit`) is one transaction and checks the session's
version (fencing); the file uses WAL so readers never wait for the writer. One connection
behind a lock: the server calls the store from a worker thread. Messages are stored with
`Message.to_dict` and read back with
`message_from_dict`, a lossless round trip.

One server process per file: `SQLiteStore(path, exclusive=True)` (what `chatrun serve` opens)
holds an advisory lock on "<path>.lock" for its lifetime and refuses to open a file another
server holds, naming it. Other writers (the REPL, scripts) may still open the file: their
commits bump the version, so a server's stale cached copy is reloaded, never written over.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chatrun.errors import ChatrunError
from chatrun.messages import Message, message_from_dict
from chatrun.store import user_records
from chatrun.store.record import (
    DEAD,
    EMPTY_MEMORY_SIZE,
    OWNER_JSON_PATH,
    PENDING,
    TALLY_OWNER,
    Commit,
    JSONObject,
    OutboxEntry,
    PendingSession,
    SessionRecord,
    WaitingEntry,
    from_json,
    messages_json,
    pending_session,
    requeued,
    swapped_texts,
    tallies_from_json,
    tallies_json,
    tallies_of,
    to_json,
    unclaimed,
    waiting_entry,
)
from chatrun.store.versions import KEEP_OUTCOMES, check_version, next_version

SCHEMA_VERSION = 5
LEGACY_VERSION = "0.schema1"  # the version of a session saved before sessions had versions

# An outbox entry's route ("<bot>/<sink>", chatrun.store.record.route_of), computed from its JSON
# and indexed: a worker claims only the routes it serves; files written before need no migration.
_ROUTE = "(json_extract(entry, '$.body.bot') || '/' || json_extract(entry, '$.sink'))"
_DUE_ON_ROUTES = f"{_ROUTE} IN (SELECT value FROM json_each(?)) AND state = ? AND due <= ?"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    memory_id TEXT PRIMARY KEY,
    messages  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    snapshot   TEXT NOT NULL,
    updated_at REAL NOT NULL,
    version    TEXT NOT NULL DEFAULT '',
    due        REAL,              -- the earliest due time of its pending items (epoch seconds), or NULL
    pending    INTEGER NOT NULL DEFAULT 0  -- how many pending items it holds
);
CREATE TABLE IF NOT EXISTS requests (
    session_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    outcome    TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    PRIMARY KEY (session_id, request_id)
);
CREATE TABLE IF NOT EXISTS history (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    entry      TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS records (
    key     TEXT PRIMARY KEY,
    record  TEXT NOT NULL,
    session TEXT  -- set: the record is deleted with that session
);
CREATE TABLE IF NOT EXISTS outbox (
    id    TEXT PRIMARY KEY,  -- the idempotency key
    state TEXT NOT NULL,     -- pending | dead
    due   REAL NOT NULL,     -- when a worker may claim it (its next try, or its claim's end)
    entry TEXT NOT NULL      -- OutboxEntry JSON
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (state, due);
"""

# Schema 5 (issue 33, flat costs): the operators' index and the tallies (chatrun.store.record),
# so that GET /pending, the gauges, the quota and `versions list` never read every session.
_FLAT_SCHEMA = """
CREATE TABLE IF NOT EXISTS waiting (
    session_id TEXT PRIMARY KEY,
    entry      TEXT NOT NULL      -- WaitingEntry JSON
);
CREATE TABLE IF NOT EXISTS waiting_index (
    key        TEXT NOT NULL,     -- record.waiting_key / age_key
    position   REAL NOT NULL,     -- the session's place in it (epoch seconds)
    session_id TEXT NOT NULL,
    PRIMARY KEY (key, position, session_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS waiting_index_session ON waiting_index (session_id);
CREATE TABLE IF NOT EXISTS tallies (
    family TEXT NOT NULL,         -- owner | version | pending
    name   TEXT NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (family, name)
) WITHOUT ROWID;
"""


class SQLiteStore:
    """A ChatMemoryStore and SessionStore in the SQLite file `path` (created if missing; its
    folder must exist)."""

    records_as_text = True  # put_record keeps the record's JSON text, not the object (TurnIndex relies on it)

    commits_user_memory = True  # a commit writes what its turns remembered (store/user_memory.py)

    def __init__(self, path: str | Path, exclusive: bool = False):
        self.path = str(path)
        self._lock = threading.RLock()
        self._owner_lock: int | None = None
        self.clock: Callable[[], float] = time.time  # what a commit's `updated_at` is (tests pin it)
        memory_db = self.path == ":memory:"
        try:
            folder = Path(self.path).expanduser().absolute().parent
            if not memory_db and not folder.is_dir():
                # Never create folders silently: `sqlite:///tmp/x.db` is ./tmp/x.db, which is
                # rarely what was meant (sqlite:////tmp/x.db is /tmp/x.db).
                raise ChatrunError(
                    f"cannot open the SQLite store {self.path}: the folder {folder} does not exist; "
                    "create it, or fix the URL (sqlite:///rel/path.db is relative to the current "
                    "folder, sqlite:////abs/path.db absolute)"
                )
            if not memory_db and exclusive:
                self._owner_lock = _lock_for_server(Path(self.path).expanduser())
            # Autocommit mode: transactions are explicit (BEGIN IMMEDIATE in _transaction).
            self._conn = sqlite3.connect(
                self.path if memory_db else str(Path(self.path).expanduser()),
                timeout=30,
                isolation_level=None,
                check_same_thread=False,
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; a crash loses at most the last commit
            # A deleted row's bytes are written over in the file, not left in the page it freed:
            # SQLite's own default is off (some builds turn it on), and an erasure must leave no copy.
            self._conn.execute("PRAGMA secure_delete=ON")
            self._conn.executescript(_SCHEMA)
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ChatrunError(
                    f"store {self.path}: written by a newer chatrun (schema {version}, this one knows "
                    f"{SCHEMA_VERSION}); upgrade chatrun or use another file"
                )
            if version < SCHEMA_VERSION:
                columns = {r[1] for r in self._conn.execute("PRAGMA table_info(sessions)")}
                if "version" not in columns:  # a schema-1 file: its sessions get versions from now on
                    self._conn.execute("ALTER TABLE sessions ADD COLUMN version TEXT NOT NULL DEFAULT ''")
                columns = {r[1] for r in self._conn.execute("PRAGMA table_info(records)")}
                if "session" not in columns:  # a schema-2 file: its records stay until deleted by key
                    self._conn.execute("ALTER TABLE records ADD COLUMN session TEXT")
                columns = {r[1] for r in self._conn.execute("PRAGMA table_info(sessions)")}
                if "due" not in columns:  # a schema-3 file: no session of it can have pending items
                    self._conn.execute("ALTER TABLE sessions ADD COLUMN due REAL")
                    self._conn.execute("ALTER TABLE sessions ADD COLUMN pending INTEGER NOT NULL DEFAULT 0")
                self._migrate_to_flat(self._conn)
                self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._conn.execute("CREATE INDEX IF NOT EXISTS records_by_session ON records (session)")
            # Retention: the sessions idle longest first (updated_at: every file has it since schema 1).
            self._conn.execute("CREATE INDEX IF NOT EXISTS sessions_updated ON sessions (updated_at)")
            self._conn.execute("CREATE INDEX IF NOT EXISTS sessions_due ON sessions (due) WHERE due IS NOT NULL")
            self._conn.execute("CREATE INDEX IF NOT EXISTS sessions_pending ON sessions (pending) WHERE pending > 0")
            self._conn.execute(f"CREATE INDEX IF NOT EXISTS outbox_route ON outbox ({_ROUTE}, state, due)")
        except ChatrunError:
            self._release_owner_lock()
            raise
        except (sqlite3.Error, OSError) as exc:
            self._release_owner_lock()
            raise ChatrunError(
                f"cannot open the SQLite store {self.path}: {exc}. Check that the path is a file "
                "(not a folder), that its folder is writable, and that it is a SQLite database."
            ) from None

    def _migrate_to_flat(self, conn: sqlite3.Connection) -> None:
        """Schema 4 -> 5: the operators' index and the tallies, filled from the stored sessions
        (the one time every session is read for them)."""
        conn.executescript(_FLAT_SCHEMA)
        if "tallies" not in {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}:
            conn.execute("ALTER TABLE sessions ADD COLUMN tallies TEXT NOT NULL DEFAULT '[]'")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in ("waiting", "waiting_index", "tallies"):  # counted afresh, whatever a file holds
                conn.execute(f"DELETE FROM {table}")  # noqa: S608 - the table names above
            for session_id, text in conn.execute("SELECT session_id, snapshot FROM sessions").fetchall():
                snapshot = from_json(text)
                _replace_waiting(conn, session_id, waiting_entry(session_id, snapshot))
                tallies = tallies_of(snapshot)
                _move_tallies(conn, [], tallies)
                conn.execute("UPDATE sessions SET tallies = ? WHERE session_id = ?", (tallies_json(tallies), session_id))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _locked(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise ChatrunError(f"store {self.path}: could not {what}: {exc}") from None

    @contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._locked(what) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:  # SQLite may already have rolled back on its own
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def scrub(self) -> None:
        """After an erasure or a retention pass: move the write-ahead log into the file and empty
        it, so the deleted rows' bytes (written over in the file, secure_delete) are in neither.
        Once per erasure, retention pass or deleted session, never per row: it writes the whole
        log (about 0.15 ms of CPU more a deleted session, measured). A process reading the file
        at that instant keeps its part of the log until the next scrub or checkpoint."""
        with self._locked("write over what was deleted") as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self._release_owner_lock()

    def _release_owner_lock(self) -> None:
        if self._owner_lock is not None:
            os.close(self._owner_lock)  # closing the descriptor drops the lock
            self._owner_lock = None

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ChatMemoryStore --------------------------------------------------------------------

    def get_messages(self, memory_id: str) -> list[Message]:
        with self._locked(f"read memory {memory_id}") as conn:
            row = conn.execute("SELECT messages FROM memories WHERE memory_id = ?", (memory_id,)).fetchone()
        return [] if row is None else self._messages(memory_id, row[0])

    def _messages(self, memory_id: str, text: str) -> list[Message]:
        try:
            return [message_from_dict(d) for d in json.loads(text)]
        except (ValueError, KeyError, TypeError) as exc:
            raise ChatrunError(f"store {self.path}: memory {memory_id} is corrupt ({exc})") from None

    def update_messages(self, memory_id: str, messages: list[Message]) -> None:
        text = messages_json(memory_id, messages)
        with self._locked(f"save memory {memory_id}") as conn:
            conn.execute(_UPSERT_MEMORY, (memory_id, text))

    def delete_messages(self, memory_id: str) -> None:
        with self._locked(f"delete memory {memory_id}") as conn:
            conn.execute("DELETE FROM memories WHERE memory_id = ?", (memory_id,))

    # -- SessionStore -----------------------------------------------------------------------

    def load_session(self, session_id: str) -> JSONObject | None:
        with self._locked(f"read session {session_id}") as conn:
            row = conn.execute("SELECT snapshot FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        return None if row is None else from_json(row[0])

    def load_versioned(self, session_id: str) -> tuple[JSONObject, str] | None:
        """The snapshot and its version, or None for an unknown session."""
        with self._locked(f"read session {session_id}") as conn:
            row = conn.execute(
                "SELECT snapshot, version FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
        return None if row is None else (from_json(row[0]), row[1] or LEGACY_VERSION)

    def read_session(self, session_id: str) -> SessionRecord | None:
        """The session's record with its memories (EncodedStore), read in one transaction: one
        decode of each JSON text."""
        with self._locked(f"read session {session_id}") as conn:
            row = conn.execute(
                "SELECT snapshot, version FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is None:
                return None
            record = SessionRecord.decode(session_id, row[0], row[1] or LEGACY_VERSION)
            texts: dict[str, str] = {}
            for mid in record.memory_ids:
                found = conn.execute("SELECT messages FROM memories WHERE memory_id = ?", (mid,)).fetchone()
                if found is not None:
                    texts[mid] = found[0]
        record.memories = {mid: self._messages(mid, texts[mid]) if mid in texts else [] for mid in record.memory_ids}
        record.sizes = {mid: len(texts[mid]) if mid in texts else EMPTY_MEMORY_SIZE for mid in record.memory_ids}
        return record

    def version(self, session_id: str) -> str | None:
        with self._locked(f"read session {session_id}") as conn:
            row = conn.execute("SELECT version FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        return None if row is None else row[0] or LEGACY_VERSION

    def count_owned(self, owner: str) -> int:
        """How many sessions `owner` (the snapshot's owner, chatrun.store.record) has: its tally."""
        return self.read_tallies(TALLY_OWNER, [owner]).get(owner, 0)

    def get_outcome(self, session_id: str, request_id: str) -> JSONObject | None:
        with self._locked(f"read request {request_id} of session {session_id}") as conn:
            row = conn.execute(
                "SELECT outcome FROM requests WHERE session_id = ? AND request_id = ?", (session_id, request_id)
            ).fetchone()
        return None if row is None else from_json(row[0])

    def request_ids(self, session_id: str) -> list[str]:
        """The ids of the requests whose outcomes the session keeps (store/replays.py)."""
        with self._locked(f"read the request ids of session {session_id}") as conn:
            rows = conn.execute("SELECT request_id FROM requests WHERE session_id = ?", (session_id,)).fetchall()
        return [row[0] for row in rows]

    def commit_turn(
        self,
        session_id: str,
        snapshot: JSONObject,
        memories: dict[str, list[Message] | None],
        history: list[JSONObject],
        expected_version: str | None = None,
        outcome: tuple[str, JSONObject] | None = None,
    ) -> str:
        """See SessionStore.commit_turn; returns the session's new version."""
        # Encode everything first: a bad value fails before the transaction begins.
        return self.write_commit(Commit.encode(session_id, snapshot, memories, history, expected_version, outcome))

    def write_commit(self, commit: Commit) -> str:
        """An encoded commit (EncodedStore), in one transaction fenced by the session's version."""
        session_id = commit.session_id
        with self._transaction(f"save a turn of session {session_id}") as conn:
            row = conn.execute("SELECT version, tallies, pending FROM sessions WHERE session_id = ?",
                               (session_id,)).fetchone()
            current = None if row is None else row[0] or LEGACY_VERSION
            check_version(session_id, commit.expected, current)
            if commit.quota_owner is not None:  # in the write transaction (BEGIN IMMEDIATE): no other writer between
                owned = conn.execute("SELECT n FROM tallies WHERE family = ? AND name = ?",
                                     (TALLY_OWNER, commit.quota_owner)).fetchone()
                commit.check_quota(0 if owned is None else int(owned[0]))
            old_tallies, old_pending = (None, 0) if row is None else (row[1], row[2])
            version = next_version(current)
            conn.execute(
                "INSERT INTO sessions (session_id, snapshot, updated_at, version, due, pending) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET snapshot = excluded.snapshot, "
                "updated_at = excluded.updated_at, version = excluded.version, due = excluded.due, "
                "pending = excluded.pending",
                (session_id, commit.snapshot_json, self.clock(), version, commit.due, commit.pending_count),
            )
            self._index_commit(conn, commit, old_tallies, old_pending)
            for mid, text in commit.memories_json.items():
                if text is None:
                    conn.execute("DELETE FROM memories WHERE memory_id = ?", (mid,))
                else:
                    conn.execute(_UPSERT_MEMORY, (mid, text))
            if commit.history_json:
                self._append_history(conn, session_id, commit.history_json)
            if commit.outcome is not None:
                self._record_outcome(conn, session_id, *commit.outcome)
            conn.executemany("INSERT INTO outbox (id, state, due, entry) VALUES (?, ?, ?, ?)",
                             [(e.id, e.state, e.due, e.to_json()) for e in commit.outbox])
            self._remember(conn, commit)
        return version

    def _remember(self, conn: sqlite3.Connection, commit: Commit) -> None:
        """What the commit's turns remembered of their user and used of their budget, in the
        commit's transaction."""
        now = self.clock()
        for item in commit.user_writes():
            key = user_records.key_of(item)
            row = conn.execute("SELECT record FROM records WHERE key = ?", (key,)).fetchone()
            record = user_records.written(None if row is None else from_json(row[0]), item, now)
            if record is None:
                conn.execute("DELETE FROM records WHERE key = ?", (key,))
            else:
                conn.execute("INSERT INTO records (key, record, session) VALUES (?, ?, NULL) ON CONFLICT(key) "
                             "DO UPDATE SET record = excluded.record, session = NULL",
                             (key, to_json(f"record {key}", record)))

    @staticmethod
    def _append_history(conn: sqlite3.Connection, session_id: str, entries: list[str]) -> None:
        last = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM history WHERE session_id = ?", (session_id,)
        ).fetchone()[0]
        conn.executemany(
            "INSERT INTO history (session_id, seq, entry) VALUES (?, ?, ?)",
            [(session_id, last + 1 + i, e) for i, e in enumerate(entries)],
        )

    @staticmethod
    def _record_outcome(conn: sqlite3.Connection, session_id: str, request_id: str, text: str) -> None:
        seq = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM requests WHERE session_id = ?", (session_id,)
        ).fetchone()[0] + 1
        conn.execute(
            "INSERT OR REPLACE INTO requests (session_id, request_id, outcome, seq) VALUES (?, ?, ?, ?)",
            (session_id, request_id, text, seq),
        )
        conn.execute("DELETE FROM requests WHERE session_id = ? AND seq <= ?", (session_id, seq - KEEP_OUTCOMES))

    def load_history(self, session_id: str) -> list[JSONObject]:
        with self._locked(f"read the history of session {session_id}") as conn:
            rows = conn.execute(
                "SELECT entry FROM history WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
        return [from_json(r[0]) for r in rows]

    def delete_session(self, session_id: str, memory_ids: list[str]) -> None:
        with self._transaction(f"delete session {session_id}") as conn:
            self._unindex_session(conn, session_id)
            conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM history WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM requests WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM records WHERE session = ?", (session_id,))
            conn.executemany("DELETE FROM memories WHERE memory_id = ?", [(m,) for m in memory_ids])

    def report_rows(self, session_paths: tuple[str, ...], history_paths: tuple[str, ...]
                    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """What `chatrun report` reads (store/record.py REPORT_*_PATHS): each session's id and
        values at `session_paths`, and each history entry's session id and values at
        `history_paths`, both in session order (entries in turn order): two scans, JSON read in
        SQLite, not one query per session."""
        def picks(column: str, paths: tuple[str, ...]) -> str:
            return ", ".join(f"json_extract({column}, ?)" for _ in paths)

        with self._locked("read sessions for a report") as conn:
            sessions = conn.execute(f"SELECT session_id, {picks('snapshot', session_paths)} FROM sessions "
                                    "ORDER BY session_id", session_paths).fetchall()
            history = conn.execute(f"SELECT session_id, {picks('entry', history_paths)} FROM history "
                                   "ORDER BY session_id, seq", history_paths).fetchall()
        return sessions, history

    def list_sessions(self) -> list[str]:
        """Session ids, oldest session first."""
        with self._locked("list sessions") as conn:
            return [r[0] for r in conn.execute("SELECT session_id FROM sessions ORDER BY rowid")]

    # -- retention (see InMemoryStore) ------------------------------------------------------------

    def list_idle(self, bot: str, before: float, limit: int) -> list[str]:
        with self._locked("list idle sessions") as conn:
            rows = conn.execute("SELECT session_id FROM sessions WHERE updated_at < ? AND json_extract(snapshot, '$.bot') = ? "
                                "ORDER BY updated_at LIMIT ?", (before, bot, limit)).fetchall()
        return [r[0] for r in rows]

    def sessions_of(self, owner: str) -> list[str]:
        with self._locked(f"list the sessions of {owner}") as conn:
            rows = conn.execute("SELECT session_id FROM sessions WHERE json_extract(snapshot, ?) = ? ORDER BY rowid",
                                (OWNER_JSON_PATH, owner)).fetchall()
        return [r[0] for r in rows]

    # -- PendingIndex: sessions waiting for a party (see InMemoryStore) ---------------------------

    def list_due(self, now: float) -> list[str]:
        with self._locked("list the sessions with items due") as conn:
            rows = conn.execute("SELECT session_id FROM sessions WHERE due IS NOT NULL AND due <= ? ORDER BY due",
                                (now,)).fetchall()
        return [r[0] for r in rows]

    def list_pending(self, bot: str | None = None, kind: str | None = None) -> list[PendingSession]:
        with self._locked("list the sessions with pending items") as conn:
            rows = conn.execute("SELECT session_id, snapshot, version FROM sessions WHERE pending > 0 "
                                "ORDER BY rowid").fetchall()
        found = (pending_session(SessionRecord.decode(sid, text, version or LEGACY_VERSION), bot, kind)
                 for sid, text, version in rows)
        return [entry for entry in found if entry is not None]

    # -- the operators' index and the tallies (flat costs: see InMemoryStore) ---------------------

    def _index_commit(self, conn: sqlite3.Connection, commit: Commit, old_tallies: str | None,
                      old_pending: int) -> None:
        """Keep the index and the tallies true after a commit; a commit that changes neither
        (most: nothing waits before or after, same owner and version) touches neither."""
        if old_pending or commit.waiting is not None:
            _replace_waiting(conn, commit.session_id, commit.waiting)
        new_tallies = tallies_json(commit.tallies)
        if new_tallies != old_tallies:
            _move_tallies(conn, tallies_from_json(old_tallies), commit.tallies)
            conn.execute("UPDATE sessions SET tallies = ? WHERE session_id = ?", (new_tallies, commit.session_id))

    @staticmethod
    def _unindex_session(conn: sqlite3.Connection, session_id: str) -> None:
        """A deleted session leaves the index and its tallies."""
        row = conn.execute("SELECT tallies FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        _replace_waiting(conn, session_id, None)
        if row is not None:
            _move_tallies(conn, tallies_from_json(row[0]), [])

    def waiting_page(self, key: str, after: tuple[float, str] | None, until: float | None,
                     limit: int) -> list[WaitingEntry]:
        start = after or (float("-inf"), "")
        with self._locked("list the waiting sessions") as conn:
            rows = conn.execute(
                "SELECT w.entry FROM waiting_index i JOIN waiting w ON w.session_id = i.session_id "
                "WHERE i.key = ? AND (i.position, i.session_id) > (?, ?) AND i.position <= ? "
                "ORDER BY i.position, i.session_id LIMIT ?",
                (key, start[0], start[1], float("inf") if until is None else until, limit)).fetchall()
        return [WaitingEntry.from_json(r[0]) for r in rows]

    def read_tallies(self, family: str, names: list[str] | None = None) -> dict[str, int]:
        with self._locked(f"read the {family} tallies") as conn:
            if names is None:
                rows = conn.execute("SELECT name, n FROM tallies WHERE family = ?", (family,)).fetchall()
            else:
                rows = [r for name in names for r in conn.execute(
                    "SELECT name, n FROM tallies WHERE family = ? AND name = ?", (family, name))]
        return {name: int(n) for name, n in rows}

    # -- OutboxStore (see InMemoryStore for what each does) ---------------------------------------

    def claim_outbox(self, now: float, lease: float, limit: int, routes: Collection[str]) -> list[OutboxEntry]:
        served = json.dumps(sorted(routes))
        with self._locked("look at the outbox") as conn:  # most looks find nothing: no write lock for them
            if conn.execute(f"SELECT 1 FROM outbox WHERE {_DUE_ON_ROUTES} LIMIT 1",
                            (served, PENDING, now)).fetchone() is None:
                return []
        with self._transaction("claim outbox entries") as conn:
            rows = conn.execute(f"SELECT entry FROM outbox WHERE {_DUE_ON_ROUTES} ORDER BY rowid LIMIT ?",
                                (served, PENDING, now, limit)).fetchall()
            claimed = []
            for (text,) in rows:
                entry = OutboxEntry.from_json(text)
                entry.claim, entry.claimed_until = secrets.token_hex(8), now + lease
                self._save_entry(conn, entry)
                claimed.append(entry)
        return claimed

    def settle_outbox(self, entry: OutboxEntry, delivered: bool) -> bool:
        with self._transaction(f"settle outbox entry {entry.id}") as conn:
            row = conn.execute("SELECT entry FROM outbox WHERE id = ?", (entry.id,)).fetchone()
            if row is None or OutboxEntry.from_json(row[0]).claim != entry.claim:
                return False
            if delivered:
                conn.execute("DELETE FROM outbox WHERE id = ?", (entry.id,))
            else:
                self._save_entry(conn, unclaimed(entry))
        return True

    def list_outbox(self, state: str | None = None, limit: int = 100) -> list[OutboxEntry]:
        with self._locked("list the outbox") as conn:
            rows = conn.execute("SELECT entry FROM outbox WHERE ? IS NULL OR state = ? ORDER BY rowid LIMIT ?",
                                (state, state, limit)).fetchall()
        return [OutboxEntry.from_json(r[0]) for r in rows]

    def delete_outbox(self, entry_ids: Collection[str]) -> int:
        with self._transaction("delete outbox entries") as conn:
            return sum(conn.execute("DELETE FROM outbox WHERE id = ?", (i,)).rowcount for i in entry_ids)

    def requeue_outbox(self, entry_id: str, now: float) -> bool:
        with self._transaction(f"retry outbox entry {entry_id}") as conn:
            row = conn.execute("SELECT entry FROM outbox WHERE id = ? AND state = ?", (entry_id, DEAD)).fetchone()
            if row is None:
                return False
            self._save_entry(conn, requeued(OutboxEntry.from_json(row[0]), now))
        return True

    @staticmethod
    def _save_entry(conn: sqlite3.Connection, entry: OutboxEntry) -> None:
        conn.execute("UPDATE outbox SET state = ?, due = ?, entry = ? WHERE id = ?",
                     (entry.state, entry.due, entry.to_json(), entry.id))

    # -- RecordStore ------------------------------------------------------------------------

    def get_record(self, key: str) -> JSONObject | None:
        with self._locked(f"read record {key}") as conn:
            row = conn.execute("SELECT record FROM records WHERE key = ?", (key,)).fetchone()
        return None if row is None else from_json(row[0])

    def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None:
        self.put_record_text(key, to_json(f"record {key}", record), session)

    def put_record_text(self, key: str, text: str, session: str | None = None) -> None:
        """put_record of a record given as its JSON text (an object's: the caller's word for it),
        for a caller that has it already (the /v1 index's list of kept turns, written every turn)."""
        with self._locked(f"save record {key}") as conn:
            conn.execute(
                "INSERT INTO records (key, record, session) VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                "record = excluded.record, session = excluded.session",
                (key, text, session),
            )

    def claim_record(self, key: str, record: JSONObject) -> bool:
        text = to_json(f"record {key}", record)
        with self._locked(f"claim record {key}") as conn:
            cursor = conn.execute("INSERT OR IGNORE INTO records (key, record) VALUES (?, ?)", (key, text))
        return cursor.rowcount == 1

    def swap_record(self, key: str, expected: JSONObject, record: JSONObject | None) -> bool:
        """Compare-and-swap (RecordSwaps): one statement, atomic for every process sharing the file."""
        old, text = swapped_texts(key, expected, record)
        with self._locked(f"replace record {key}") as conn:
            if text is None:
                cursor = conn.execute("DELETE FROM records WHERE key = ? AND record = ?", (key, old))
            else:
                cursor = conn.execute("UPDATE records SET record = ? WHERE key = ? AND record = ?", (text, key, old))
        return cursor.rowcount == 1

    def delete_record(self, key: str) -> None:
        with self._locked(f"delete record {key}") as conn:
            conn.execute("DELETE FROM records WHERE key = ?", (key,))

    def record_keys(self, prefix: str) -> list[str]:
        with self._locked(f"list records {prefix}*") as conn:
            # A range of the primary key (not a scan of every record: the OpenAI API keeps one per turn).
            rows = conn.execute("SELECT key FROM records WHERE key >= ? AND key < ? ORDER BY key",
                                (prefix, prefix + "\U0010ffff")).fetchall()
        return [row[0] for row in rows]


def _replace_waiting(conn: sqlite3.Connection, session_id: str, waiting: WaitingEntry | None) -> None:
    """The session's entry in the operators' index is `waiting` (None: it waits for nothing)."""
    conn.execute("DELETE FROM waiting WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM waiting_index WHERE session_id = ?", (session_id,))
    if waiting is not None:
        conn.execute("INSERT INTO waiting (session_id, entry) VALUES (?, ?)", (session_id, waiting.to_json()))
        conn.executemany("INSERT INTO waiting_index (key, position, session_id) VALUES (?, ?, ?)",
                         [(key, at, session_id) for key, at in waiting.positions.items()])


def _move_tallies(conn: sqlite3.Connection, old: list[tuple[str, str, int]], new: list[tuple[str, str, int]]) -> None:
    """A session no longer counts for `old` but for `new` (chatrun.store.record.tallies_of)."""
    for family, name, n in [(f, m, -c) for f, m, c in old] + list(new):
        conn.execute("INSERT INTO tallies (family, name, n) VALUES (?, ?, ?) ON CONFLICT(family, name) "
                     "DO UPDATE SET n = n + excluded.n", (family, name, n))
        if n < 0:
            conn.execute("DELETE FROM tallies WHERE family = ? AND name = ? AND n <= 0", (family, name))


def _lock_for_server(db: Path) -> int:
    """Hold "<db>.lock" for this process. A POSIX record lock: it belongs to the process (a
    restart inside one process reopens freely) and the kernel drops it when the process dies."""
    import errno
    import fcntl

    lock_path = db.with_name(db.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            os.close(fd)
            raise
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise ChatrunError(
            f"store {db}: already served by {holder}. A SQLite store serves one `chatrun serve` "
            "process; stop the other one, use another file, or run several replicas on a Redis or "
            "PostgreSQL store (--store redis://HOST:PORT/0 or postgresql://USER@HOST/DB, see docs/deploy.md)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"chatrun serve (pid {os.getpid()})".encode(), 0)  # named in the other's error
    return fd


_UPSERT_MEMORY = (
    "INSERT INTO memories (memory_id, messages) VALUES (?, ?) "
    "ON CONFLICT(memory_id) DO UPDATE SET messages = excluded.messages"
)
