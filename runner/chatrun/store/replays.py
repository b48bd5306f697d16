"""What refuses a replayed delivery or call once the records that dedupe it are gone
(docs/channels.md, "Replays"; docs/deploy.md, "Erasing a person's data").

A session's recorded outcomes are what answers a delivery the platform sends again (its
request id is the delivery's id: server/turn_run.py). An erasure or a retention pass deletes
them with the session, and a captured delivery replayed after that would run its turn again.
So, before a session written within WINDOW is deleted (`keep_session`, from
store/retention.py's `delete_stored`), each of its kept request ids is left behind as a
*mark*: a record `replay:<SHA-256 of the request id>` holding only `until`, when it goes
(tied to no session, so the deletion leaves it). No text, no user id: only the hash. The
channels' door refuses a delivery whose id is marked (`seen`); a Twilio call's first webhook
claims its CallSid the same way (`claim`). The retention pass deletes the marks past their
`until` (`prune`), a 256th of them each pass (`part_of`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chatrun.store.aio import AsyncStore
    from chatrun.store.record import SessionRecord

PREFIX = "replay:"
# How long a delivery can be replayed: a channel refuses a message whose own signed timestamp
# is older (server/channels/base.py: MAX_DELIVERY_AGE is this), and an erased session's marks
# stand this long. 24 h is WhatsApp's customer-service window: a reply to an older message
# cannot go out as text anyway.
WINDOW = 24 * 3600
# How long a Twilio call's claim on its CallSid stands (a voice webhook has no signed time: a
# captured one could be replayed at any moment). Past it, a webhook replayed for a call that
# never reached its first prompt (no session) would get a relay token again.
CALL_CLAIM_AGE = 30 * 24 * 3600


# A platform that numbers its deliveries to a bot in increasing order and signs no time
# (Telegram's update_id): the numbers seen, by bucket of SEQUENCE_BUCKET seconds, make a floor
# that refuses a number first seen WINDOW ago forever (`out_of_sequence`), when the marks of an
# erasure are gone. Telegram retries an update for 24 h at most; it picks the next update_id at
# random after a week without updates (so the record of a bot quiet for SEQUENCE_QUIET starts anew).
SEQUENCE_PREFIX = "sequence:"
SEQUENCE_BUCKET = 600
SEQUENCE_QUIET = 6 * 24 * 3600


def key_of(request_id: str) -> str:
    return PREFIX + hashlib.sha256(request_id.encode()).hexdigest()


async def seen(store: AsyncStore, request_id: str, now: float) -> bool:
    """Whether `request_id` is marked (its session was deleted, or its call claimed) and the mark stands."""
    found = await store.get_record(key_of(request_id))
    return found is not None and float(found.get("until") or 0) > now


async def claim(store: AsyncStore, request_id: str, until: float) -> bool:
    """Mark `request_id` until `until` if no mark is there: True for the first claim only
    (atomic across replicas on a shared store: claim_record)."""
    return await store.claim_record(key_of(request_id), {"until": until})


async def keep(store: AsyncStore, request_ids: Iterable[str], until: float) -> int:
    """Mark each request id until `until`; how many."""
    marked = 0
    for request_id in request_ids:
        await store.put_record(key_of(request_id), {"until": until})
        marked += 1
    return marked


async def keep_session(store: AsyncStore, session_id: str, record: SessionRecord | None, now: float) -> int:
    """Before a session is deleted: mark its kept request ids for WINDOW, if it was written
    within WINDOW (an older one's deliveries are all older than that, and refused as such)."""
    if record is None or _written_at(record) < now - WINDOW:
        return 0
    return await keep(store, await store.request_ids(session_id), now + WINDOW)


def _written_at(record: SessionRecord) -> float:
    """When the session last committed a turn (one without: never judged old, to be safe)."""
    at = record.committed.get("at") if isinstance(record.committed, dict) else None
    return float(at) if isinstance(at, int | float) else float("inf")


def part_of(now: float) -> str:
    """The part of the marks a retention pass at `now` looks at: those whose hash starts with
    the two hex digits of the minute, one of 256 (a phone's claims stand 30 days: reading every
    mark each minute would read them all 43,200 times). So a mark is deleted at most 256
    minutes after its `until`; `seen` goes by `until` itself."""
    return f"{int(now // 60) % 256:02x}"


async def prune(store: AsyncStore, now: float, part: str = "") -> int:
    """Delete the marks past their `until` (of those whose hash starts with `part`); how many."""
    pruned = 0
    for key in await store.record_keys(PREFIX + part):
        found = await store.get_record(key)
        if found is not None and float(found.get("until") or 0) <= now:
            await store.delete_record(key)
            pruned += 1
    return pruned


async def out_of_sequence(store: AsyncStore, scope: str, number: int, now: float) -> bool:
    """Whether delivery `number` of `scope` (a bot on a platform that numbers its deliveries in
    increasing order) is at or below the scope's floor: the highest number seen in a bucket that
    began WINDOW ago or more. Such a number was first delivered over WINDOW - SEQUENCE_BUCKET ago
    (the platform's own retries are over), and its erasure's marks may be gone: refused forever.
    Otherwise the number is noted in the current bucket. (Read then written, not atomic: two
    replicas noting numbers at once may lose one, which lowers the floor, never raises it.)"""
    key = SEQUENCE_PREFIX + scope
    found = await store.get_record(key) or {}
    if now - float(found.get("last") or 0) >= SEQUENCE_QUIET:
        found = {}
    seen = [[float(at), int(high)] for at, high in found.get("seen") or ()]
    floor = max([int(found.get("floor", -1)), *(high for at, high in seen if at + WINDOW <= now)])
    if number <= floor:
        return True
    seen = [entry for entry in seen if entry[0] + WINDOW > now]
    start = now - now % SEQUENCE_BUCKET
    if seen and seen[-1][0] == start:
        seen[-1][1] = max(seen[-1][1], number)
    else:
        seen.append([start, number])
    await store.put_record(key, {"floor": floor, "seen": seen, "last": now})
    return False
