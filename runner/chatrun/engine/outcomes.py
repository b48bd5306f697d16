"""Outcomes: what became of a conversation, recorded once (the bot's `outcomes:`; docs/report.md).

The bot names its outcomes (resolved, escalated, abandoned, ...) each with a condition: an event
type the turn emitted, a route the turn reached (entered, or ended on), a Jinja expression over the state,
whether it has ended, whether an operator holds it, and `silent_for` (no user message for that long). After every committed
turn the outcomes are tried in the order written; the first whose condition holds is recorded
and never changes again (the rule: **first match, once**), so a condition that holds again later
records nothing.

All of it lives in the session's snapshot under `outcome` (store/record.py OUTCOME_KEY), so it
is committed with the turn that decided it (fenced like the rest: survives restarts, one replica
wins) and rolled back with a failed turn:
- recorded: `{"name", "turn", "route", "at"}`; the turn emits an `Outcome` backend event with
  the same data (sinks that take it get it; the server counts `chatrun_outcomes_total`).
- armed: `{"due", "since"}` while no outcome is recorded and some outcome has `silent_for`:
  `since` is the last turn that was not the sweeper's, `due` the earliest silence still to come.
  The stores index `due` (record.due_items) and `chatrun serve`'s sweeper runs `Expire()` then,
  as it does for follow-ups; that turn tries the outcomes with the silence it found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from chatrun import events as ev
from chatrun.definition.templates import holds
from chatrun.engine.pending import format_time, parse_time, time_after

if TYPE_CHECKING:
    from chatrun.definition.config import OutcomeConfig
    from chatrun.engine.conversation import Conversation

OUTCOME = ev.OUTCOME  # the backend event of a recorded outcome: data {"name", "turn", "route", "at"}

Emit = Callable[..., None]


def recorded(c: Conversation) -> str | None:
    """The name of the conversation's recorded outcome, or None."""
    name = (c.outcome or {}).get("name")
    return name if isinstance(name, str) else None


def is_due(c: Conversation, now: datetime) -> bool:
    """Whether a `silent_for` outcome is due to be tried by `now` (the sweeper's Expire)."""
    due = (c.outcome or {}).get("due")
    return recorded(c) is None and isinstance(due, str) and parse_time(due) <= now


def disarm(c: Conversation) -> bool:
    """Drop an armed silence (the conversation's user went on in a `/v1` fork of it: this branch's
    silence is not the conversation's); its next turn, if it has one, arms it again. Whether
    there was one to drop (a recorded outcome stays)."""
    if recorded(c) is not None or "due" not in (c.outcome or {}):
        return False
    c.outcome = None
    return True


def decide(c: Conversation, turn: int, events: Iterable[ev.Event], expired: bool, now: datetime,
           emit: Emit) -> None:
    """After a turn that will be committed: record the first outcome whose condition holds
    (emitting its event), or arm the next silence. Nothing once an outcome is recorded."""
    outcomes = c.config.outcomes
    if not outcomes or recorded(c) is not None:
        return
    armed = c.outcome or {}
    since = parse_time(str(armed["since"])) if expired and isinstance(armed.get("since"), str) else now
    silence = (now - since).total_seconds()
    seen = list(events)
    emitted = {e.type for e in seen}
    # The routes the turn reached: where it ends, and each it entered on the way (a chain, a pop).
    reached = {c.scope.route, *(e.data.get("route") for e in seen if e.type == ev.ROUTE_CHANGED
                                and isinstance(e.data, dict))}
    for outcome in outcomes:
        if _holds(c, outcome, emitted, reached, silence):
            data = {"name": outcome.name, "turn": turn, "route": c.scope.route, "at": format_time(now)}
            c.outcome = data
            emit(OUTCOME, dict(data), audience=ev.BACKEND)
            return
    c.outcome = _armed(outcomes, since, silence)


def _holds(c: Conversation, outcome: OutcomeConfig, emitted: set[str], reached: set[Any], silence: float) -> bool:
    if outcome.silent_for is not None and silence < outcome.silent_for:
        return False
    if outcome.events and emitted.isdisjoint(outcome.events):
        return False
    if outcome.routes and reached.isdisjoint(outcome.routes):
        return False
    if outcome.ended is not None and bool(c.ended) != outcome.ended:
        return False
    if outcome.taken_over is not None and bool(c.taken_over) != outcome.taken_over:
        return False
    return outcome.condition is None or holds(outcome.condition, c.template_context({}))


def _armed(outcomes: list[OutcomeConfig], since: datetime, silence: float) -> dict[str, Any] | None:
    """The next silence to wait for (the shortest `silent_for` not reached yet), or None."""
    ahead = [o.silent_for for o in outcomes if o.silent_for is not None and o.silent_for > silence]
    if not ahead:
        return None
    return {"due": time_after(since, timedelta(seconds=min(ahead))), "since": format_time(since)}

