"""What one user has spent of a bot's `limits.max_user_tokens` / `max_user_cost` in the current
window, over all their sessions and every replica (docs/observability.md, "Budgets").

One record per bot and user (the session's owner) in the store's records (memory, SQLite,
Redis, PostgreSQL alike), under `user-budget/<bot>/<user>`:

    {"bot": "shop", "principal": "ana", "window": 1796601600.0, "tokens": 5120, "cost": 0.0031}

`window` is when the counted window began (a multiple of the bot's `user_window` in seconds
since the epoch: `1d` windows begin at midnight UTC); a record of an earlier window counts as
nothing. The server reads it once before a turn of a bot that sets the keys; the turn's usage
(committed, failed or stopped: its model calls were made) is added *in the turn's own commit*:
the server puts a `record.Charge` in the `Commit`, and every store adds it to the record in the
commit's atomic write, as it writes what the turn remembered (store/user_records.py; the SQLite
and in-memory stores in the transaction or lock, Redis in the fenced Lua script against the
record it read, PostgreSQL under a row lock). So the record counts exactly the usage of the
turns the store holds: a replica killed before the commit counts neither the turn nor its
usage, one killed after it both; two turns of the same user on two replicas both count. Bots
without the keys read and write nothing.
It belongs to no session: deleting or ending a session leaves it. This module is the one place
that spells the key and the record.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from chatrun.store.record import JSONObject

if TYPE_CHECKING:
    from chatrun.store.aio import AsyncStore

PREFIX = "user-budget/"


def user_budget_key(bot: str, principal: str) -> str:
    """The record key of what `principal` has spent of `bot`'s user budget."""
    return f"{PREFIX}{bot}/{principal}"


def window_start(now: float, length: float) -> float:
    """When the window holding the instant `now` (epoch seconds) began: windows of `length`
    seconds, the first at the epoch."""
    return math.floor(now / length) * length


def spent_in(record: JSONObject | None, start: float) -> tuple[int, float | None]:
    """(tokens, cost) a record counts in the window beginning at `start` (nothing: (0, None))."""
    if not record or record.get("window") != start:
        return 0, None
    tokens, cost = record.get("tokens"), record.get("cost")
    return (tokens if isinstance(tokens, int) else 0), (float(cost) if isinstance(cost, int | float) else None)


def charged(record: JSONObject | None, bot: str, principal: str, start: float, usage: JSONObject) -> JSONObject:
    """The record after a turn's `usage` (a history entry's: input/output tokens, cost)."""
    tokens, cost = spent_in(record, start)
    tokens += int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
    if isinstance(usage.get("cost"), int | float):
        cost = (cost or 0.0) + float(usage["cost"])
    return {"bot": bot, "principal": principal, "window": start, "tokens": tokens, "cost": cost}


async def aread(store: AsyncStore, bot: str, principal: str) -> JSONObject | None:
    """The record of what `principal` has spent of `bot`'s budget (None: nothing yet)."""
    return await store.get_record(user_budget_key(bot, principal))


async def aerase_everywhere(store: AsyncStore, principal: str, dry_run: bool = False) -> int:
    """Delete what `principal` has spent of every bot's budget (erasure: the record names them);
    how many records there were."""
    erased = 0
    for key in await store.record_keys(PREFIX):
        if key[len(PREFIX):].partition("/")[2] == principal:  # a bot's name has no "/"
            erased += 1
            if not dry_run:
                await store.delete_record(key)
    return erased
