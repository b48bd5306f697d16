"""A bot's budgets per user (`limits.max_user_tokens`, `max_user_cost`, `user_window`) on the
server: what the session's user has spent in the current window is read from the store before
each turn (the engine checks it before every model call: engine/usage.py `UserSpent`), and the
turn's usage is added in the turn's own commit (store/user_budget.py). Only for bots that set the keys, and
sessions that have a user (an owner: the signed-in principal, widget visitor, channel user)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from chatrun.engine.usage import Usage, UserSpent
from chatrun.store import user_budget
from chatrun.store.aio import AsyncStore
from chatrun.store.record import Charge

if TYPE_CHECKING:
    from chatrun.engine.session import Session
    from chatrun.store.buffer import TurnBuffer



async def read_spent(store: AsyncStore, session: Session) -> None:
    """Give the session what its user has spent in the current window (None: no user)."""
    limits = session.bot.config.limits
    who = session.user_memory_owner
    if who is None:  # no one to count for (a server without --auth)
        session.user_spent = None
        return
    start = user_budget.window_start(session.clock.now().timestamp(), limits.user_window)
    tokens, cost = user_budget.spent_in(await user_budget.aread(store, session.bot.name, who), start)
    session.user_spent = UserSpent(who, Usage(input_tokens=tokens, cost=cost),
                                   datetime.fromtimestamp(start + limits.user_window, UTC))


def charge(buffer: TurnBuffer | None, session: Session, entry: dict[str, Any]) -> None:
    """Put the turn's usage (its history entry's, and the earlier attempts' its commit counts: a
    killed server's, store/billing.py) in the commit the buffer holds for it, as a
    `Charge` on its user's current window: the store adds it in that commit's atomic write
    (store/user_records.py), so it counts exactly when the turn is stored. Nothing to commit:
    nothing counts."""
    spent = session.user_spent
    if spent is None or buffer is None or buffer.pending is None:
        return
    start = user_budget.window_start(session.clock.now().timestamp(), session.bot.config.limits.user_window)
    for counted in (entry, *session.unfinished_counted):  # a killed attempt's calls, counted by this commit
        usage = counted.get("usage")
        if isinstance(usage, dict):
            buffer.pending.charges.append(Charge(session.bot.name, spent.who, start, usage))
