"""Who sees which events, for every client of the server: one rule, applied in two places.

A turn's events leave the engine toward clients in one place, `TurnRun` (the WebSocket in both
dialects, the HTTP reply and SSE, /v1 and the page all read a turn through it): it passes on
only the events `for_clients` lets through, those for the user (`Event.for_user`). Operators
and backend events stay in the stored history, with their audience.

Reading the history back (`history_for`), each view sees the audiences it may:

- the session resource (`GET .../sessions/{id}`, what the user's page replays): the user's
  events, and the operators' for a principal with the role `operators` (OPERATOR_ROLE);
- the inspector (`GET .../inspect`, the author's and operators' view): every event, each
  marked with its audience, with auth off (the author on their own machine) or for a
  principal with the role `operators`; only the user's events for any other principal.

Backend events never reach a chat: they go to the bot's sinks (and the inspector).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from chatrun.engine.pending import without_secret
from chatrun.events import AUDIENCES, OPERATORS, USER, Event
from chatrun.server.auth import Principal

OPERATOR_ROLE = "operators"  # a principal with this role (in --auth) sees operators events
EVERY_AUDIENCE = frozenset(AUDIENCES)
USER_ONLY = frozenset({USER})


# Whether a turn's event is sent to the user's clients as it happens (or is replayed): its
# `for_user`. A C getter, not a function of ours: every event of every turn passes it.
for_clients: Callable[[Event], bool] = attrgetter("for_user")


def _is_operator(who: Principal | None) -> bool:
    return who is not None and OPERATOR_ROLE in who.roles


def resource_audiences(who: Principal | None) -> frozenset[str]:
    """The audiences the session resource's history lists for `who`."""
    return frozenset({USER, OPERATORS}) if _is_operator(who) else USER_ONLY


def inspector_audiences(who: Principal | None) -> frozenset[str]:
    """The audiences the inspector shows `who` (None: auth is off, the author's own server)."""
    return EVERY_AUDIENCE if who is None or _is_operator(who) else USER_ONLY


def history_for(history: list[dict[str, Any]], audiences: frozenset[str]) -> list[dict[str, Any]]:
    """The history entries with only the events of `audiences` (an event without `audience` is
    the user's), and the turn's tool calls (`calls`: arguments and results the bot's tools saw)
    only for operators. A backend item's token is never shown, whoever asks (a history stored
    before chatrun kept it out of the history still has it: it is taken out here).
    Entries are copied when something is left out; the stored history is untouched."""
    out = []
    for entry in history:
        events = entry.get("events")
        if isinstance(events, list):
            shown = [without_secret(e) if isinstance(e, dict) else e for e in events if _audience(e) in audiences]
            if len(shown) != len(events) or any(a is not b for a, b in zip(shown, events, strict=True)):
                entry = entry | {"events": shown}
        if "calls" in entry and OPERATORS not in audiences:
            entry = {k: v for k, v in entry.items() if k != "calls"}
        out.append(entry)
    return out


def _audience(event: Any) -> str:
    return (event.get("audience") if isinstance(event, dict) else None) or USER
