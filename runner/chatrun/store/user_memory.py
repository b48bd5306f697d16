"""User memory (issue 37): the facts a bot keeps of one principal across conversations.

One record per bot and principal in the store's records (RecordStore: memory, SQLite, Redis,
PostgreSQL alike), under `user-memory/<bot>/<principal>`:

    {"bot": "concierge", "principal": "ana", "facts": {"seat": {"value": "window", "at": 1764967000.0}}}

It belongs to no session (deleting a session leaves it): it goes when the principal erases it
(`DELETE /bots/{bot}/user-memory`), when the principal's data is erased (store/retention.py
`erase_principal`), and fact by fact when a fact is older than the bot's `retention.user_memory`
(the sweeper and `chatrun purge` delete it; until then reading leaves it out, so an expired fact
never reaches a template).
This module is the one place that spells the key and the record.

Committed with the turn, in the same atomic write (issue 37). The engine keeps what a turn
remembered (`Conversation.remembered`) and puts it in the turn's history entry (record.py
`Remembered`); `Commit.encode` takes it out of the stored entry, and every store writes it in
the commit's own atomic write: the SQLite and in-memory stores in the same transaction (lock),
the Redis store in the same fenced Lua script (a compare-and-set on the record: the record is
read first and the script writes the new one only if it is still what was read, else the whole
commit is sent again from a fresh read), PostgreSQL in the same transaction under the session's
lock plus a lock on the record. So a turn that committed has its facts, and a turn that did not
(refused as stale, its lease lost, the store down, the replica killed before the commit) has
none: no moment exists where one is stored without the other.

Why not the turn's outbox (apply the facts later, once, by turn id)? The record is keyed per
bot and principal, not per session, so it is not in the session's keys, but every built-in
store keeps it in the same database as the session and can write both at once; an outbox would
leave a window where the turn is committed and its facts are not yet readable (the user's next
conversation greets a stranger), and a delayed, replayed apply could bring back a fact the user
erased in between. The one cost is a read-modify-write of the record inside the commit, which
only commits of the same user contend for.
A user's own SessionStore, which knows nothing of this, gets the facts saved after its commit
(store/local.py, engine/session.py), as before.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from chatrun.store.record import JSONObject, Remembered

if TYPE_CHECKING:
    from chatrun.store import RecordStore
    from chatrun.store.aio import AsyncStore

PREFIX = "user-memory/"


def user_memory_key(bot: str, principal: str) -> str:
    """The record key of `principal`'s facts kept by `bot`."""
    return f"{PREFIX}{bot}/{principal}"


def facts_of(record: JSONObject | None, keep: float | None, now: float) -> dict[str, Any]:
    """FACT -> value of a stored record, leaving out facts older than `keep` seconds."""
    return {name: kept["value"] for name, kept in _fresh(record, keep, now).items()}


def listed(record: JSONObject | None, keep: float | None, now: float) -> list[JSONObject]:
    """What `GET /bots/{bot}/user-memory` shows: each fact with when it was written."""
    return [{"fact": name, "value": kept["value"], "at": kept["at"]} for name, kept in _fresh(record, keep, now).items()]


def updated(record: JSONObject | None, bot: str, principal: str, changes: Mapping[str, Any], keep: float | None,
            now: float) -> JSONObject | None:
    """The record with `changes` (FACT -> value; None forgets it) written at `now`; None: nothing left."""
    facts = _fresh(record, keep, now)
    for name, value in changes.items():
        if value is None:
            facts.pop(name, None)
        else:
            facts[name] = {"value": value, "at": now}
    return {"bot": bot, "principal": principal, "facts": facts} if facts else None


def written(record: JSONObject | None, remembered: Remembered, now: float) -> JSONObject | None:
    """The user's record after a committed turn's `remembered` (None: nothing left: delete it)."""
    return updated(record, remembered.bot, remembered.principal, remembered.facts, remembered.keep, now)


def remembered_key(remembered: Remembered) -> str:
    return user_memory_key(remembered.bot, remembered.principal)


def _fresh(record: JSONObject | None, keep: float | None, now: float) -> dict[str, JSONObject]:
    facts = (record or {}).get("facts")
    if not isinstance(facts, dict):
        return {}
    return {name: kept for name, kept in facts.items()
            if isinstance(kept, dict) and "value" in kept
            and (keep is None or float(kept.get("at") or 0) >= now - keep)}


# -- a store the engine calls directly (memory, SQLite) ----------------------------------------

def load(records: RecordStore, bot: str, principal: str, keep: float | None, now: float) -> dict[str, Any]:
    return facts_of(records.get_record(user_memory_key(bot, principal)), keep, now)


def save(records: RecordStore, bot: str, principal: str, changes: Mapping[str, Any], keep: float | None,
         now: float) -> None:
    key = user_memory_key(bot, principal)
    record = updated(records.get_record(key), bot, principal, changes, keep, now)
    if record is None:
        records.delete_record(key)
    else:
        records.put_record(key, record)


def seed(records: RecordStore, bot: str, principal: str, facts: Mapping[str, Any]) -> None:
    """Facts kept of `principal` as if an earlier conversation had remembered them now (a
    transcript's `user_memory:`)."""
    save(records, bot, principal, facts, None, time.time())


# -- the server's store (AsyncStore) ---------------------------------------------------------------

async def aload(store: AsyncStore, bot: str, principal: str, keep: float | None, now: float) -> dict[str, Any]:
    return facts_of(await store.get_record(user_memory_key(bot, principal)), keep, now)


async def alist(store: AsyncStore, bot: str, principal: str, keep: float | None, now: float) -> list[JSONObject]:
    return listed(await store.get_record(user_memory_key(bot, principal)), keep, now)


async def asave(store: AsyncStore, bot: str, principal: str, changes: Mapping[str, Any], keep: float | None,
                now: float) -> None:
    key = user_memory_key(bot, principal)
    record = updated(await store.get_record(key), bot, principal, changes, keep, now)
    if record is None:
        await store.delete_record(key)
    else:
        await store.put_record(key, record)


async def aforget(store: AsyncStore, bot: str, principal: str, fact: str, keep: float | None, now: float) -> int:
    """Delete one fact `bot` keeps of `principal` (the user's own erasure of it); 1 if there was one."""
    key = user_memory_key(bot, principal)
    record = await store.get_record(key)
    if fact not in _fresh(record, keep, now):
        return 0
    await asave(store, bot, principal, {fact: None}, keep, now)
    return 1


async def aexpire(store: AsyncStore, bot: str, keep: float | None, now: float, dry_run: bool = False) -> int:
    """Forget the facts `bot` keeps that are older than `keep` (retention); how many went."""
    if keep is None:
        return 0
    dropped = 0
    for key in await store.record_keys(f"{PREFIX}{bot}/"):
        record = await store.get_record(key)
        facts = (record or {}).get("facts")
        fresh = _fresh(record, keep, now)
        gone = len(facts) - len(fresh) if isinstance(facts, dict) else 0
        if gone and not dry_run:
            if fresh:
                await store.put_record(key, {**(record or {}), "facts": fresh})
            else:
                await store.delete_record(key)
        dropped += gone
    return dropped


async def aerase_everywhere(store: AsyncStore, principal: str, dry_run: bool = False) -> int:
    """Delete what every bot keeps of `principal`, served here or not (erasure); how many facts."""
    erased = 0
    for key in await store.record_keys(PREFIX):
        bot, _, whose = key[len(PREFIX):].partition("/")  # a bot's name has no "/"
        if whose == principal:
            erased += await aerase(store, bot, principal, dry_run)
    return erased


async def aerase(store: AsyncStore, bot: str, principal: str, dry_run: bool = False) -> int:
    """Delete everything `bot` keeps of `principal`; how many facts there were (expired ones too)."""
    key = user_memory_key(bot, principal)
    record = await store.get_record(key)
    if record is None:
        return 0
    if not dry_run:
        await store.delete_record(key)
    facts = record.get("facts")
    return len(facts) if isinstance(facts, dict) else 0
