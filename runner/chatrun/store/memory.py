"""`InMemoryStore`: the default store, in process. A ChatMemoryStore and a SessionStore.

Snapshots and history entries are kept as JSON text, so what a caller later does to its
dicts never leaks into the store, and exactly what the SQLite store would refuse (values
JSON cannot hold) is refused here too. Messages are immutable and kept as they are.
"""

from __future__ import annotations

import bisect
import secrets
import threading
import time
from collections.abc import Callable, Collection

from chatrun.messages import Message
from chatrun.store import user_records
from chatrun.store.record import (
    DEAD,
    PENDING,
    TALLY_OWNER,
    Charge,
    Commit,
    JSONObject,
    OutboxEntry,
    PendingSession,
    Remembered,
    SessionRecord,
    WaitingEntry,
    check_messages,
    from_json,
    messages_json,
    pending_session,
    requeued,
    swapped_texts,
    to_json,
    unclaimed,
)
from chatrun.store.versions import KEEP_OUTCOMES, check_version, next_version


class Records:
    """Records (RecordStore) as JSON text by key, each deleted with the session it was last
    saved for. Not locked: its owner locks."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self._session_of: dict[str, str] = {}
        self._keys_of: dict[str, set[str]] = {}

    def get(self, key: str) -> JSONObject | None:
        text = self._texts.get(key)
        return None if text is None else from_json(text)

    def put(self, key: str, text: str, session: str | None) -> None:
        self.delete(key)
        self._texts[key] = text
        if session is not None:
            self._session_of[key] = session
            self._keys_of.setdefault(session, set()).add(key)

    def claim(self, key: str, text: str) -> bool:
        """Save `text` under `key` unless a record is there (put-if-absent)."""
        if key in self._texts:
            return False
        self._texts[key] = text
        return True

    def swap(self, key: str, expected: str, text: str | None) -> bool:
        """Save `text` under `key` (delete when None) if `expected` is the text there (compare-and-swap)."""
        if self._texts.get(key) != expected:
            return False
        if text is None:
            self.delete(key)
        else:
            self._texts[key] = text  # still deleted with the session it was saved for
        return True

    def keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self._texts if k.startswith(prefix))

    def delete(self, key: str) -> None:
        self._texts.pop(key, None)
        session = self._session_of.pop(key, None)
        if session is not None:
            self._keys_of[session].discard(key)

    def remember(self, writes: Collection[Remembered | Charge], now: float) -> None:
        """Write what committed turns remembered of their users and used of their budgets
        (user_records.written's rule)."""
        for item in writes:
            key = user_records.key_of(item)
            record = user_records.written(self.get(key), item, now)
            if record is None:
                self.delete(key)
            else:
                self.put(key, to_json(f"record {key}", record), None)

    def delete_session(self, session: str) -> None:
        for key in self._keys_of.pop(session, set()):
            self._texts.pop(key, None)
            self._session_of.pop(key, None)


class FlatIndexes:
    """The operators' index of waiting sessions and the tallies (chatrun.store.record), in
    dicts: a page or a count costs the same however many sessions are stored. Not locked: its
    owner locks."""

    def __init__(self) -> None:
        self._waiting: dict[str, WaitingEntry] = {}
        self._index: dict[str, list[tuple[float, str]]] = {}  # key -> (position, session), sorted
        self._tallies: dict[str, dict[str, int]] = {}  # family -> name -> count
        self._counted: dict[str, list[tuple[str, str, int]]] = {}  # session -> what it counts for

    def commit(self, commit: Commit) -> None:
        session_id = commit.session_id
        if commit.waiting is not None or session_id in self._waiting:
            self._replace_waiting(session_id, commit.waiting)
        if self._counted.get(session_id, []) != commit.tallies:
            self._move_tallies(session_id, commit.tallies)

    def drop(self, session_id: str) -> None:
        self._replace_waiting(session_id, None)
        self._move_tallies(session_id, [])

    def _replace_waiting(self, session_id: str, waiting: WaitingEntry | None) -> None:
        old = self._waiting.pop(session_id, None)
        for key, at in (old.positions.items() if old is not None else ()):
            entries = self._index[key]
            del entries[bisect.bisect_left(entries, (at, session_id))]
            if not entries:
                del self._index[key]
        if waiting is not None:
            self._waiting[session_id] = waiting
            for key, at in waiting.positions.items():
                bisect.insort(self._index.setdefault(key, []), (at, session_id))

    def _move_tallies(self, session_id: str, new: list[tuple[str, str, int]]) -> None:
        old = self._counted.pop(session_id, [])
        for family, name, n in [(f, m, -c) for f, m, c in old] + new:
            counts = self._tallies.setdefault(family, {})
            counts[name] = counts.get(name, 0) + n
            if counts[name] <= 0:
                del counts[name]
        if new:
            self._counted[session_id] = list(new)

    def page(self, key: str, after: tuple[float, str] | None, until: float | None, limit: int) -> list[WaitingEntry]:
        entries = self._index.get(key, [])
        start = 0 if after is None else bisect.bisect_right(entries, after)
        out = []
        for at, session_id in entries[start:start + limit]:
            if until is not None and at > until:
                break
            out.append(self._waiting[session_id])
        return out

    def tallies(self, family: str, names: list[str] | None) -> dict[str, int]:
        counts = self._tallies.get(family, {})
        if names is None:
            return dict(counts)
        return {name: counts[name] for name in names if name in counts}


class InMemoryStore:
    """Memories, session snapshots and history in dicts, behind a lock (the server uses threads)."""

    records_as_text = True  # put_record keeps the record's JSON text, not the object (TurnIndex relies on it)

    commits_user_memory = True  # a commit writes what its turns remembered (store/user_memory.py)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memories: dict[str, tuple[Message, ...]] = {}
        self._memory_sizes: dict[str, int] = {}  # JSON size of the memories a commit wrote
        self._sessions: dict[str, str] = {}
        self._versions: dict[str, str] = {}
        self._history: dict[str, list[str]] = {}
        self._records = Records()
        self._outcomes: dict[str, dict[str, str]] = {}  # session -> request id -> entry JSON
        self._outbox: dict[str, str] = {}  # entry id -> OutboxEntry JSON, oldest first
        self._due: dict[str, float] = {}  # session -> its earliest pending item's due time (epoch seconds)
        self._with_pending: set[str] = set()  # sessions with open pending items
        self._owners: dict[str, str | None] = {}  # session -> its owner (erasure: sessions_of)
        self._flat = FlatIndexes()  # GET /pending's index, the tallies (quota, versions, gauges)
        self._written: dict[str, tuple[str | None, float]] = {}  # session -> (its bot, its last commit): retention
        self.clock: Callable[[], float] = time.time  # what a commit's time is (tests pin it)

    # -- ChatMemoryStore ----------------------------------------------------------------------

    def get_messages(self, memory_id: str) -> list[Message]:
        with self._lock:
            return list(self._memories.get(memory_id, ()))

    def update_messages(self, memory_id: str, messages: list[Message]) -> None:
        items = tuple(check_messages(memory_id, messages))
        with self._lock:
            self._memories[memory_id] = items
            self._memory_sizes.pop(memory_id, None)  # measured when next read for a session

    def delete_messages(self, memory_id: str) -> None:
        with self._lock:
            self._memories.pop(memory_id, None)
            self._memory_sizes.pop(memory_id, None)

    # -- SessionStore -------------------------------------------------------------------------

    def load_session(self, session_id: str) -> JSONObject | None:
        with self._lock:
            text = self._sessions.get(session_id)
        return None if text is None else from_json(text)

    def load_versioned(self, session_id: str) -> tuple[JSONObject, str] | None:
        """The snapshot and its version, or None for an unknown session."""
        with self._lock:
            text, version = self._sessions.get(session_id), self._versions.get(session_id)
        return None if text is None or version is None else (from_json(text), version)

    def read_session(self, session_id: str) -> SessionRecord | None:
        """The session's record with its memories (EncodedStore): one decode of its snapshot."""
        with self._lock:
            text, version = self._sessions.get(session_id), self._versions.get(session_id)
            if text is None or version is None:
                return None
            record = SessionRecord.decode(session_id, text, version)
            stored = {mid: self._memories.get(mid, ()) for mid in record.memory_ids}
            known = {mid: self._memory_sizes.get(mid) for mid in record.memory_ids}
        record.memories = {mid: list(m) for mid, m in stored.items()}
        record.sizes = {mid: size if size is not None else _size_of(mid, stored[mid]) for mid, size in known.items()}
        return record

    def version(self, session_id: str) -> str | None:
        with self._lock:
            return self._versions.get(session_id)

    def count_owned(self, owner: str) -> int:
        """How many sessions `owner` (the snapshot's owner, chatrun.store.record) has: its tally."""
        return self.read_tallies(TALLY_OWNER, [owner]).get(owner, 0)

    def get_outcome(self, session_id: str, request_id: str) -> JSONObject | None:
        with self._lock:
            text = self._outcomes.get(session_id, {}).get(request_id)
        return None if text is None else from_json(text)

    def request_ids(self, session_id: str) -> list[str]:
        """The ids of the requests whose outcomes the session keeps (store/replays.py)."""
        with self._lock:
            return list(self._outcomes.get(session_id, {}))

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
        # Everything is checked and encoded before anything is applied: all or nothing.
        return self.write_commit(Commit.encode(session_id, snapshot, memories, history, expected_version, outcome))

    def write_commit(self, commit: Commit) -> str:
        """An encoded commit (EncodedStore): applied whole, or StaleVersion and nothing."""
        session_id = commit.session_id
        mems = {mid: None if m is None else tuple(m) for mid, m in commit.memories.items()}
        with self._lock:
            current = self._versions.get(session_id)
            check_version(session_id, commit.expected, current)
            if commit.quota_owner is not None:  # checked and counted under the one lock
                commit.check_quota(self._flat.tallies(TALLY_OWNER, [commit.quota_owner]).get(commit.quota_owner, 0))
            version = self._versions[session_id] = next_version(current)
            self._sessions[session_id] = commit.snapshot_json
            self._owners[session_id] = commit.owner
            self._written[session_id] = (commit.bot, self.clock())
            self._index_pending(session_id, commit)
            self._flat.commit(commit)
            for mid, msgs in mems.items():
                size = commit.memory_size(mid)
                if msgs is None or size is None:  # unknown: measured when next read for a session
                    self._memory_sizes.pop(mid, None)
                else:
                    self._memory_sizes[mid] = size
                if msgs is None:
                    self._memories.pop(mid, None)
                else:
                    self._memories[mid] = msgs
            self._history.setdefault(session_id, []).extend(commit.history_json)
            for item in commit.outbox:
                self._outbox[item.id] = item.to_json()
            self._remember(commit)
            if commit.outcome is not None:
                outcomes = self._outcomes.setdefault(session_id, {})
                outcomes[commit.outcome[0]] = commit.outcome[1]
                while len(outcomes) > KEEP_OUTCOMES:  # dicts keep insertion order: drop the oldest
                    del outcomes[next(iter(outcomes))]
        return version

    def _remember(self, commit: Commit) -> None:
        """What the commit's turns remembered of their user and used of their budget, under the commit's lock."""
        self._records.remember(commit.user_writes(), self.clock())

    def load_history(self, session_id: str) -> list[JSONObject]:
        with self._lock:
            entries = list(self._history.get(session_id, ()))
        return [from_json(e) for e in entries]

    def delete_session(self, session_id: str, memory_ids: list[str]) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)
            self._versions.pop(session_id, None)
            self._history.pop(session_id, None)
            self._outcomes.pop(session_id, None)
            self._due.pop(session_id, None)
            self._with_pending.discard(session_id)
            self._flat.drop(session_id)
            self._written.pop(session_id, None)
            self._owners.pop(session_id, None)
            self._records.delete_session(session_id)
            for mid in memory_ids:
                self._memories.pop(mid, None)
                self._memory_sizes.pop(mid, None)

    def list_sessions(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    # -- retention (chatrun.store.RetentionIndex) -------------------------------------------------

    def list_idle(self, bot: str, before: float, limit: int) -> list[str]:
        """The sessions of `bot` last committed before `before` (epoch seconds), longest idle first."""
        with self._lock:
            idle = sorted((at, sid) for sid, (of, at) in self._written.items() if of == bot and at < before)
        return [sid for _, sid in idle[:limit]]

    def sessions_of(self, owner: str) -> list[str]:
        """The sessions `owner` owns (the snapshot's owner)."""
        with self._lock:
            return [sid for sid, o in self._owners.items() if o == owner]

    # -- PendingIndex: sessions waiting for a party ----------------------------------------------

    def _index_pending(self, session_id: str, commit: Commit) -> None:
        if commit.due is None:
            self._due.pop(session_id, None)
        else:
            self._due[session_id] = commit.due
        if commit.pending_count:
            self._with_pending.add(session_id)
        else:
            self._with_pending.discard(session_id)

    def list_due(self, now: float) -> list[str]:
        """The sessions with a pending item due by `now` (epoch seconds), earliest first."""
        with self._lock:
            due = sorted((at, sid) for sid, at in self._due.items() if at <= now)
        return [sid for _, sid in due]

    def list_pending(self, bot: str | None = None, kind: str | None = None) -> list[PendingSession]:
        """The sessions with open pending items (of `kind`, on `bot`), oldest session first: reads
        the snapshots of the sessions that have pending items only."""
        with self._lock:
            stored = [(sid, text, self._versions[sid]) for sid, text in self._sessions.items()
                      if sid in self._with_pending]
        found = (pending_session(SessionRecord.decode(*s), bot, kind) for s in stored)
        return [entry for entry in found if entry is not None]

    def waiting_page(self, key: str, after: tuple[float, str] | None, until: float | None,
                     limit: int) -> list[WaitingEntry]:
        """Up to `limit` waiting sessions of the index `key` (record.waiting_key), in its order
        (position, then session id): those after `after`, at positions up to `until`."""
        with self._lock:
            return self._flat.page(key, after, until, limit)

    def read_tallies(self, family: str, names: list[str] | None = None) -> dict[str, int]:
        """The counts of a tally family (record.TALLY_*): of `names`, or all (small families only)."""
        with self._lock:
            return self._flat.tallies(family, names)

    # -- RecordStore ---------------------------------------------------------------------------

    def get_record(self, key: str) -> JSONObject | None:
        with self._lock:
            return self._records.get(key)

    def put_record(self, key: str, record: JSONObject, session: str | None = None) -> None:
        text = to_json(f"record {key}", record)
        with self._lock:
            self._records.put(key, text, session)

    def put_record_text(self, key: str, text: str, session: str | None = None) -> None:
        """put_record of a record given as its JSON text (the caller's, trusted to be an object):
        the /v1 index writes its list of kept turns from its entries' texts (issue 39)."""
        with self._lock:
            self._records.put(key, text, session)

    def claim_record(self, key: str, record: JSONObject) -> bool:
        text = to_json(f"record {key}", record)
        with self._lock:
            return self._records.claim(key, text)

    def swap_record(self, key: str, expected: JSONObject, record: JSONObject | None) -> bool:
        old, text = swapped_texts(key, expected, record)
        with self._lock:
            return self._records.swap(key, old, text)

    def delete_record(self, key: str) -> None:
        with self._lock:
            self._records.delete(key)

    def record_keys(self, prefix: str) -> list[str]:
        with self._lock:
            return self._records.keys(prefix)

    # -- OutboxStore --------------------------------------------------------------------------

    def claim_outbox(self, now: float, lease: float, limit: int, routes: Collection[str]) -> list[OutboxEntry]:
        """Up to `limit` pending entries of `routes` due by `now`, oldest first, claimed until now + lease."""
        claimed: list[OutboxEntry] = []
        with self._lock:
            for text in list(self._outbox.values()):
                entry = OutboxEntry.from_json(text)
                if entry.state != PENDING or entry.due > now or entry.route not in routes:
                    continue
                entry.claim, entry.claimed_until = secrets.token_hex(8), now + lease
                self._outbox[entry.id] = entry.to_json()
                claimed.append(entry)
                if len(claimed) >= limit:
                    break
        return claimed

    def settle_outbox(self, entry: OutboxEntry, delivered: bool) -> bool:
        """After an attempt under `entry.claim`: delete the delivered entry, else save its new
        bookkeeping, unclaimed. False (nothing written) when the claim was lost meanwhile."""
        with self._lock:
            text = self._outbox.get(entry.id)
            if text is None or OutboxEntry.from_json(text).claim != entry.claim:
                return False
            if delivered:
                del self._outbox[entry.id]
            else:
                self._outbox[entry.id] = unclaimed(entry).to_json()
        return True

    def list_outbox(self, state: str | None = None, limit: int = 100) -> list[OutboxEntry]:
        with self._lock:
            entries = [OutboxEntry.from_json(t) for t in self._outbox.values()]
        return [e for e in entries if state is None or e.state == state][:limit]

    def delete_outbox(self, entry_ids: Collection[str]) -> int:
        """Delete these entries (pending or dead); how many there were."""
        with self._lock:
            return sum(self._outbox.pop(i, None) is not None for i in entry_ids)

    def requeue_outbox(self, entry_id: str, now: float) -> bool:
        """A dead letter back in the queue, due now, with its tries counted afresh."""
        with self._lock:
            text = self._outbox.get(entry_id)
            if text is None or (entry := OutboxEntry.from_json(text)).state != DEAD:
                return False
            self._outbox[entry_id] = requeued(entry, now).to_json()
        return True

    def close(self) -> None:
        """Nothing to release; here so every store can be closed the same way."""


def _size_of(memory_id: str, messages: tuple[Message, ...]) -> int:
    """The JSON size of a memory whose text was never made (update_messages, or none stored)."""
    return len(messages_json(memory_id, messages))
