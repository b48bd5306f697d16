"""What a held session writes to the store: its request's commit and its deletion, fenced.

The engine runs against a TurnBuffer (no I/O); after the turn its commit (a
`chatrun.store.record.Commit`, with what its turns remembered of their user: written in the
same atomic write, store/user_memory.py) is written here, fenced by the version the turn started from
and by the lease: a refused commit is reported as Failed(Conflict) and the live copy
dropped, so the next request reloads the session as stored, never writes over it. A commit
whose fate is unknown (the store failed) drops the live copy too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from chatrun.engine import guardrails
from chatrun.errors import SessionQuota
from chatrun.server import wire
from chatrun.server.session_cache import Hold, SessionCache, Slot
from chatrun.store.aio import AsyncStore, Lease, scrub
from chatrun.store.record import Commit
from chatrun.store.versions import CREATE, StaleVersion

log = logging.getLogger("chatrun.server")


class SessionWrites:
    def __init__(self, store: AsyncStore, cache: SessionCache):
        self.store = store
        self.cache = cache
        self.on_outbox: Callable[[], None] = lambda: None  # a commit queued backend events (the worker's nudge)
        self._committed: asyncio.Event | None = None  # see `committed`

    @property
    def committed(self) -> asyncio.Event:
        """Set (and replaced) at every commit of this replica: the operators' inbox stream
        (pending_api.pending_stream) looks again at once instead of at its next tick. Made when
        asked for: a commit nobody waits for makes and sets none."""
        if self._committed is None:
            self._committed = asyncio.Event()
        return self._committed

    async def commit(self, slot: Slot, session_id: str, lease: Lease, quota: int = 0) -> Commit | None:
        """Write what the request's turns committed to the slot's buffer, if anything: the commit
        written. `quota`: a new session's owner's limit (Commit.quota), which the store checks."""
        assert slot.buffer is not None
        commit = slot.buffer.take()
        if commit is None:
            return None
        expected = commit.expected = slot.version if slot.version is not None else CREATE
        commit.quota = quota
        try:
            version = await self.store.commit_turn(commit, lease)
        except SessionQuota as exc:
            self.cache.drop(slot)
            raise quota_refused(exc) from None
        except StaleVersion as exc:
            self.cache.drop(slot)
            if expected == CREATE:
                raise exists(session_id) from None
            what = f"turn {commit.turn}" if commit.turn is not None else "the change"
            raise wire.RequestFailed(
                wire.CONFLICT,
                f"{what} of session {session_id} was not committed: {exc}. The session was reloaded "
                "as stored; send the message again.",
            ) from None
        except Exception as exc:  # the store failed: whether the commit landed is unknown
            reason = store_error(slot, exc)
            self.cache.drop(slot)
            log.warning("commit of session %s failed: %s", session_id, reason)
            raise wire.RequestFailed(
                wire.SERVER_ERROR,
                f"session {session_id}: the turn could not be saved ({type(exc).__name__}: {reason}); "
                "retry with the same request id: a turn that was saved is not run again",
            ) from None
        slot.version, slot.committed = version, commit.committed
        done, self._committed = self._committed, None
        if done is not None:
            done.set()
        if commit.outbox:
            self.on_outbox()
        return commit

    async def delete(self, hold: Hold, session_id: str, memory_ids: list[str]) -> None:
        """Delete the stored session (its history, outcomes, records and these memories)."""
        try:
            await self.store.delete_session(session_id, memory_ids, hold.lease)
        except StaleVersion as exc:
            self.cache.drop(hold.slot)
            raise wire.RequestFailed(wire.CONFLICT, f"session {session_id} was not deleted: {exc}") from None
        await scrub(self.store)  # gone from the store's files too
        if hold.slot.session is not None:
            hold.slot.session.close()
        self.cache.drop(hold.slot)


def store_error(slot: Slot, exc: Exception) -> str:
    """A store's error text as the session's `storage` guardrails keep it (engine/guardrails.py
    `kept_text`): PostgreSQL's `DETAIL: Failing row contains (...)` quotes the values written
    (Redis's errors arrive without them: store/redis_errors.py)."""
    session = slot.session
    text = str(exc)
    return text if session is None else guardrails.kept_text(session.bot.config, [session.route], text)


def exists(session_id: str) -> wire.RequestFailed:
    return wire.RequestFailed(
        wire.SESSION_EXISTS,
        f"session {session_id!r} already exists; to continue it send Connect with \"resume\": true",
    )


class QuotaRefused(wire.RequestFailed):
    """A new session the store refused at its owner's --max-sessions-per-principal (HTTP 429,
    `limit` the limit). Unlike a busy session's 429, another try of the same request is refused
    again: a channel answers its platform and tells its user instead (channels/door.py)."""

    def __init__(self, exc: SessionQuota):
        super().__init__(wire.TOO_MANY_REQUESTS, str(exc))
        self.limit = exc.limit


def quota_refused(exc: SessionQuota) -> QuotaRefused:
    """What a new session the store refused at its owner's limit answers (HTTP 429): the one
    answer of every door that makes a session (a create, a /v1 conversation or fork, a channel's)."""
    return QuotaRefused(exc)
