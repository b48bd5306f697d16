"""The durable record of a running attempt's model usage (docs/observability.md, "What a killed server's attempt used").

A provider bills a model call as soon as it answers; a server killed before the turn commits
would lose that usage (the turn's usage reaches the store only with its commit). So a server's
session writes, after each model call of a turn, one record `usage:<session>` naming the
attempt (a random id per turn tried), its turn, the bot version that ran it and what its calls used so far (the `usage`
dict of a history entry, `by_call` included), plus `earlier`: the attempts an earlier record
named that no commit counted yet. The record is replaced at each call (one write a call, none
at the commit) and deleted with its session.

The session's snapshot says which attempt its usage counts last (`billed`, engine/conversation.py):
a record naming another attempt is of attempts that never committed (`unfinished`). The next
attempt of the session reads the record before its first model call (on Redis and PostgreSQL
the store read it with the request's lease, in the round trip that granted it: `Lease.usage_record`;
a live copy in the one process of SQLite reads it once), counts those attempts in
the session's budgets, and its commit (or its failed record) counts them once, each as a failed
attempt of the history (`unfinished: true`); `chatrun report` counts a record nobody took up yet.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from chatrun.store.record import from_json

if TYPE_CHECKING:
    from chatrun.store.aio import AsyncStore

log = logging.getLogger("chatrun.store")

PREFIX = "usage:"
# What the history says of an attempt found this way: its calls were paid for, nothing was kept.
UNFINISHED_ERROR = "the attempt stopped before it committed (its process ended); its model calls were paid for"


def key_of(session_id: str) -> str:
    return PREFIX + session_id


def unfinished(record: Any, billed: str | None) -> list[dict[str, Any]]:
    """The attempts `record` holds that a session whose usage counts up to attempt `billed`
    does not count (oldest first: {attempt, turn, at, usage}); [] when the record's own attempt
    is `billed` (it committed, and counted those before it) or there is no record."""
    if not isinstance(record, dict) or record.get("attempt") in (None, billed):
        return []
    earlier = [e for e in record.get("earlier") or () if isinstance(e, dict)]
    last = {k: record.get(k) for k in ("attempt", "turn", "at", "usage")}
    return [*earlier, {**last, "version": record["version"]} if record.get("version") else last]


def failed_entry(attempt: dict[str, Any]) -> dict[str, Any]:
    """An unfinished attempt as the history records it: a failed attempt of its turn."""
    return {"turn": attempt.get("turn"), "at": attempt.get("at"), "ok": False, "error": UNFINISHED_ERROR,
            "unfinished": True, "attempt": attempt.get("attempt"), "usage": attempt.get("usage") or {},
            **({"version": attempt["version"]} if attempt.get("version") else {})}


class RecordJournal:
    """A session's usage records in an async store's records (the server's sessions write here)."""

    __slots__ = ("store", "local")

    def __init__(self, store: AsyncStore):
        self.store = store
        # One process serves the store (SQLite, memory://): a live session that read its record
        # once knows every later one, its own process writing them (engine/turn.py `open_attempt`).
        self.local = not store.distributed

    async def read(self, session_id: str, known: tuple[str | None] | None = None) -> dict[str, Any] | None:
        """The session's usage record, or None (also when the store cannot be read: logged): the
        one the store read with the request's lease when it did (`known`: a 1-tuple of its JSON
        text, None inside for no record; Redis, PostgreSQL: no round trip of its own), else read now."""
        try:
            if known is not None:
                return None if known[0] is None else from_json(known[0])
            return await self.store.get_record(key_of(session_id))
        except Exception as exc:  # the turn goes on; its commit still counts its own calls
            log.warning("session %s: the record of earlier attempts' usage could not be read: %s", session_id, exc)
            return None

    async def write(self, session_id: str, record: dict[str, Any]) -> bool:
        """Replace the session's usage record (deleted with the session): True when written. A
        store that cannot be written is logged: the turn goes on, and its commit counts its calls
        if it lands."""
        try:
            await self.store.put_record(key_of(session_id), record, session_id)
        except Exception as exc:
            log.warning("session %s: a model call's usage could not be recorded: %s", session_id, exc)
            return False
        return True
