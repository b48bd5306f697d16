"""Retention and erasure: what is past a bot's `retention:`, and everything of one principal.

One place for the rules, two callers: the server's sweeper (server/sweeper.py, which deletes
through the registry, so a session in use is held and its live copy dropped) and `chatrun
purge` (cli/purge.py, straight on a store URL). Both delete a session with the store's one
`delete_session` (its history, outcomes, records, memories, pending items and index entries
go with it) and its files with the blob area's `delete_session`.

    idle sessions   `retention.idle_sessions`: unwritten (no turn, decision or timeout) that long
    dead letters    `retention.dead_letters`: that long after they died
    a principal     every session it owns, with the above; its dead letters; its pending
                    backend events when its bot says `erased_outbox: drop` (else they go out,
                    and are deleted when delivered, as every delivered entry is); the facts its
                    bots kept of it (`user_memory:`)
    user memory     `retention.user_memory`: a remembered fact not written again that long
                    (store/user_memory.py; reading leaves it out already)
    replay marks    what a deleted session leaves so its deliveries are not run again if
                    replayed (store/replays.py): deleted once past their window
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from chatrun.definition.config import DROP, Retention
from chatrun.store import replays, user_budget, user_memory
from chatrun.store.aio import scrub
from chatrun.store.record import DEAD, OutboxEntry

if TYPE_CHECKING:
    from chatrun.store.aio import AsyncStore, Lease
    from chatrun.store.blobs import BlobArea

EVERY = 10**9  # list_outbox's limit when every entry is looked at
# Deletes one stored session (its id, its bot), answering how many files went with it.
DeleteSession = Callable[[str, "str | None"], Awaitable[int]]
RetentionOf = Callable[["str | None"], Retention]  # a bot's name -> its retention


@dataclass
class Counts:
    """What a pass deleted (or, in a dry run, would delete)."""

    sessions: int = 0
    files: int = 0
    dead_letters: int = 0
    outbox: int = 0  # pending backend events dropped undelivered (erasure with `erased_outbox: drop`)
    user_memory: int = 0  # facts bots kept of the principal (`user_memory:`; store/user_memory.py)
    busy: list[str] = field(default_factory=list)  # sessions running a turn now: left for the next pass

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def shown(self) -> str:
        parts = [_plural(self.sessions, "session"), _plural(self.files, "file"),
                 _plural(self.dead_letters, "dead letter"), _plural(self.outbox, "undelivered event")]
        if self.user_memory:  # most bots keep no user memory: their lines stay as they were
            parts.append(_plural(self.user_memory, "remembered fact"))
        return ", ".join(parts) + (f" ({len(self.busy)} busy, left for later)" if self.busy else "")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


async def idle_sessions(store: AsyncStore, bot: str, retention: Retention, now: float, limit: int) -> list[str]:
    """The sessions of `bot` idle past its retention at `now`, longest idle first."""
    if retention.idle_sessions is None:
        return []
    return await store.list_idle(bot, now - retention.idle_sessions, limit)


async def old_dead_letters(store: AsyncStore, bot: str, retention: Retention, now: float) -> list[str]:
    """The ids of `bot`'s dead letters that died longer ago than its retention (a dead
    letter's `next_at` is when it died: server/outbox.py)."""
    if retention.dead_letters is None:
        return []
    cutoff = now - retention.dead_letters
    return [e.id for e in await store.list_outbox(DEAD, EVERY) if e.body.get("bot") == bot and e.next_at < cutoff]


async def delete_stored(store: AsyncStore, blobs: BlobArea | None, session_id: str, lease: Lease | None = None) -> int:
    """Delete one stored session and its files; how many files it held. Its recent request ids
    are left behind as marks first (store/replays.py), so a delivery replayed after the
    deletion is refused, not run again."""
    record = await store.load_session(session_id)
    await replays.keep_session(store, session_id, record, time.time())
    files = len(blobs.refs(session_id)) if blobs is not None else 0
    await store.delete_session(session_id, record.memory_ids if record is not None else [], lease)
    if blobs is not None:
        blobs.delete_session(session_id)
    return files


async def count_files(blobs: BlobArea | None, session_ids: list[str]) -> int:
    return sum(len(blobs.refs(sid)) for sid in session_ids) if blobs is not None else 0


async def purge(store: AsyncStore, bots: dict[str, Retention], now: float, delete: DeleteSession,
                blobs: BlobArea | None, dry_run: bool = False, limit: int = EVERY) -> Counts:
    """Delete what is past each bot's retention (`bots`: name -> retention), up to `limit`
    idle sessions per bot; with `dry_run`, only count it."""
    counts = Counts()
    for bot, retention in bots.items():
        idle = await idle_sessions(store, bot, retention, now, limit)
        await _delete_sessions(idle, bot, delete, blobs, dry_run, counts)
        dead = await old_dead_letters(store, bot, retention, now)
        counts.dead_letters += len(dead) if dry_run else await store.delete_outbox(dead)
        counts.user_memory += await user_memory.aexpire(store, bot, retention.user_memory, now, dry_run)
    if not dry_run:
        await replays.prune(store, now, replays.part_of(now))  # deleted sessions' marks, past their window
    if not dry_run and (counts.sessions or counts.dead_letters or counts.user_memory):  # most passes delete nothing
        await scrub(store)
    return counts


async def erase_principal(store: AsyncStore, principal: str, retention_of: RetentionOf, delete: DeleteSession,
                          blobs: BlobArea | None, dry_run: bool = False) -> Counts:
    """Delete everything of `principal`: its sessions (history, files, records, pending items),
    its dead letters, its undelivered events where its bot drops them (`erased_outbox`), what
    every bot kept of it (`user_memory:`, which outlives the sessions that wrote it) and what it
    spent of every bot's user budget (`limits.max_user_*`: its count starts again at zero)."""
    counts = Counts()
    sessions = await store.sessions_of(principal)
    bots = {sid: record.bot if (record := await store.load_session(sid)) is not None else None for sid in sessions}
    counts.user_memory = await user_memory.aerase_everywhere(store, principal, dry_run)
    await user_budget.aerase_everywhere(store, principal, dry_run)  # what they spent: it names them
    # The outbox first: an event whose session is gone can no longer be told apart by its owner.
    owned = set(sessions)
    erased = [e for e in await store.list_outbox(None, EVERY) if e.session_id in owned and _erased(e, retention_of)]
    if not dry_run:
        await store.delete_outbox([e.id for e in erased])
    counts.dead_letters = sum(e.state == DEAD for e in erased)
    counts.outbox = len(erased) - counts.dead_letters
    for sid in sessions:
        await _delete_sessions([sid], bots[sid], delete, blobs, dry_run, counts)
    if not dry_run:
        await scrub(store)  # gone from the store's files too, not only from its rows
    return counts


def _erased(entry: OutboxEntry, retention_of: RetentionOf) -> bool:
    """Whether erasure deletes an outbox entry: a dead letter always, a pending one if its bot drops them."""
    return entry.state == DEAD or retention_of(str(entry.body.get("bot"))).erased_outbox == DROP


async def _delete_sessions(session_ids: list[str], bot: str | None, delete: DeleteSession, blobs: BlobArea | None,
                           dry_run: bool, counts: Counts) -> None:
    if dry_run:
        counts.sessions += len(session_ids)
        counts.files += await count_files(blobs, session_ids)
        return
    for sid in session_ids:
        try:
            counts.files += await delete(sid, bot)
        except SessionBusyNow:
            counts.busy.append(sid)
            continue
        counts.sessions += 1


class SessionBusyNow(Exception):
    """A DeleteSession found the session running a turn: it is left for the next pass."""
