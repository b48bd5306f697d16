"""A bot's budgets per user (`limits.max_user_tokens`, `max_user_cost`, `user_window`) on the
server: what the session's user has spent in the current window is read from the store before
each turn (the engine checks it before every model call: engine/usage.py `UserSpent`), and the
turn's usage is added after it (store/user_budget.py). Only for bots that set the keys, and
sessions that have a user (an owner: the signed-in principal, widget visitor, channel user)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from chatrun.engine.usage import Usage, UserSpent
from chatrun.store import user_budget
from chatrun.store.aio import AsyncStore
from chatrun.store.record import JSONObject

if TYPE_CHECKING:
    from chatrun.engine.session import Session

log = logging.getLogger("chatrun.server")


async def read_spent(store: AsyncStore, session: Session) -> JSONObject | None:
    """Give the session what its user has spent in the current window (None: no user); the
    record read, for `charge`'s compare-and-set."""
    limits = session.bot.config.limits
    who = session.user_memory_owner
    if who is None:  # no one to count for (a server without --auth)
        session.user_spent = None
        return None
    start = user_budget.window_start(session.clock.now().timestamp(), limits.user_window)
    record = await user_budget.aread(store, session.bot.name, who)
    tokens, cost = user_budget.spent_in(record, start)
    session.user_spent = UserSpent(who, Usage(input_tokens=tokens, cost=cost),
                                   datetime.fromtimestamp(start + limits.user_window, UTC))
    return record


async def charge(store: AsyncStore, session: Session, entry: dict[str, Any], seen: JSONObject | None) -> None:
    """Add the turn's usage (its history entry's) to its user's window; `seen`: the record
    `read_spent` read. A store that fails here is logged, not raised: the turn's own record is
    written next, whatever this did."""
    spent, usage = session.user_spent, entry.get("usage")
    if spent is None or not isinstance(usage, dict) or not session.bot.config.limits.has_user_budget:
        return
    start = user_budget.window_start(session.clock.now().timestamp(), session.bot.config.limits.user_window)
    try:
        await user_budget.acharge(store, session.bot.name, spent.who, start, usage, seen)
    except Exception as exc:  # the store down: the turn stands, its usage is not counted
        log.warning("the usage of turn %s of session %s was not added to %s's budget: %s",
                    entry.get("turn"), session.id, spent.who, exc)
