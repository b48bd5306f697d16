"""Humans in the loop: what waits for a party other than the model, and the inputs that resolve it.

A **pending item** is a tool call (or the whole conversation) waiting for someone: an approval
of a tool call (`approval:` on a tool), a question that waits for an answer (`ask:` in an
action), an operator's takeover (`operator:` in an action, or `TakeOver`). It is plain data
kept in the session's snapshot under `PENDING_KEY`, committed with the turn that made it.

Resolving it is **an input to a turn** — `session.stream(Approve("p1"))` — so a decision is as
atomic, rolled back and recorded as a user's message (docs/format.md, "Humans in the loop").
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from chatrun import events as ev
from chatrun.definition.templates import later
from chatrun.engine.clock import parse_duration

PENDING_KEY = "pending"  # the snapshot's list of open items (plain dicts)
PENDING_COUNTER_KEY = "pending_next"  # the snapshot's next item number
TAKEOVER_KEY = "taken_over"  # the snapshot's takeover: {"by", "since"} or absent
RESOLVED_KEY = "pending_resolved"  # the snapshot's last resolved items: {id: outcome}
HELD_KEY = "held"  # an item's data: a decision made during a takeover, applied on release (engine/waiting.py)

APPROVAL = "approval"
QUESTION = "question"
TAKEOVER = "takeover"
KINDS = (APPROVAL, QUESTION, TAKEOVER)

# Outcomes in Resolved events and `decision.outcome`
APPROVED, EDITED, REJECTED, TIMED_OUT = "approved", "edited", "rejected", "timed_out"
ANSWERED, RELEASED, TAKEN = "answered", "released", "taken"
WITHDRAWN = "withdrawn"  # a version move ended its scope or removed its tool (engine/versions.py)

USER_ROLE = "user"  # in `by:`: the session's own user
BACKEND_ROLE = "backend"  # a question `from: backend` is answered with its token
OPERATOR_ROLE = "operators"  # the server's operator role (server/audience.py): may act on any takeover
ENGINE_AUDIENCES = ev.ENGINE_AUDIENCES  # user and backend: the engine's to say, never a granted role
TOKEN_KEY = "token"  # a backend item's secret: in its snapshot and its sinks' deliveries only

APPROVAL_CHOICES = [{"label": "Approve", "value": "approve"}, {"label": "Reject", "value": "reject"}]


@dataclass
class PendingItem:
    """One open item; `to_dict()`/`from_dict()` are its snapshot form."""

    id: str
    kind: str  # APPROVAL | QUESTION | TAKEOVER
    created: str  # ISO time from the session clock
    due: str | None
    route: str
    scope_id: str
    tool: str | None = None
    call_id: str | None = None
    args: dict[str, Any] | None = None
    ask: str = ""  # the rendered text the deciders see (and the user, when they decide it)
    by: list[str] = field(default_factory=list)  # roles that may decide / answer / take
    edit: list[str] = field(default_factory=list)  # editable parameters (approvals)
    schema: dict[str, Any] | None = None  # questions: the answer's JSON Schema
    choices: list[Any] | None = None  # questions from the user: offered choices; a confirmation's Yes/No
    requested_by: dict[str, Any] | None = None  # the principal whose message created it
    token: str | None = None  # questions from backend: the secret it answers with
    data: dict[str, Any] = field(default_factory=dict)  # kind-specific extras
    tell: str = ""  # the rendered text the user reads while others decide ("": the locale's default)

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PendingItem:
        known = {f.name for f in fields(cls)}
        return cls(**copy.deepcopy({k: v for k, v in d.items() if k in known}))

    def public(self) -> dict[str, Any]:
        """What a `Pending` event carries: everything but the token and the kind's extras."""
        out = self.to_dict()
        del out[TOKEN_KEY], out["data"]
        if self.kind == APPROVAL and not self.choices:  # a user's confirmation has its own: Yes/No
            out["choices"] = copy.deepcopy(APPROVAL_CHOICES)
        held = self.data.get(HELD_KEY)
        if held:  # decided during a takeover: what was decided, applied on release
            out[HELD_KEY] = {"kind": held["decision"]["kind"], "by": (held.get("by") or {}).get("name"),
                             "at": held.get("at")}
        return out

    def for_user(self, texts: dict[str, str]) -> dict[str, Any]:
        """What the session's user is shown of the item (their Pending event, their `/v1` text,
        their session resource), with chatrun's `texts` in their locale (definition/page_texts.py).
        An item the user decides: as it is, with Approve/Reject in their locale. One others
        decide: `ask` is what the user is told (`tell`, else the locale's default), never the
        deciders' question, and no choices (the user has none to make)."""
        out = self.public()
        if USER_ROLE in self.by:
            if self.kind == APPROVAL and not self.choices:
                out["choices"] = [{"label": texts["approve"], "value": "approve"},
                                  {"label": texts["reject"], "value": "reject"}]
            out["reply"] = reply_hint(out, texts)
            return out
        out["ask"] = out["tell"] = self.tell or texts.get(f"tell_{self.kind}", "")
        out["choices"] = None
        return out

    def is_due(self, now: datetime) -> bool:
        return self.due is not None and parse_time(self.due) <= now


def reply_hint(item: dict[str, Any], texts: dict[str, str]) -> str:
    """How a user without buttons (the Quarkus dialect, /v1) answers an item they decide, in
    their locale: "Reply approve or reject." for an approval, the choices' labels for a
    question with choices; "" when anything they type is the answer."""
    choices = [c for c in item.get("choices") or () if isinstance(c, dict)]
    if item.get("kind") == APPROVAL and [c.get("value") for c in choices] in ([], ["approve", "reject"]):
        by_value = {c.get("value"): c.get("label") for c in choices}
        # the words as typed in a reply ("Reply approve or reject."); any case is understood
        return _filled(texts["reply_approve_reject"], approve=str(by_value.get("approve") or "approve").lower(),
                       reject=str(by_value.get("reject") or "reject").lower())
    labels = [str(c.get("label", c.get("value"))) if isinstance(c, dict) else str(c) for c in item.get("choices") or ()]
    return _filled(texts["reply_choices"], choices=", ".join(labels)) if labels else ""


def _filled(text: str, **args: str) -> str:
    for name, value in args.items():
        text = text.replace("{" + name + "}", value)
    return text


def granted_roles(roles: Iterable[str]) -> set[str]:
    """The roles a principal holds that may match an item's `by`: never the engine's own
    audiences (ENGINE_AUDIENCES), whatever a token's roles say. `user` is given by the engine
    to the session's own user, `backend` is proven with the item's token."""
    return {role for role in roles if role not in ENGINE_AUDIENCES}


def without_secret(event: dict[str, Any]) -> dict[str, Any]:
    """An event (its dict) as stored in the history or shown to anyone: a backend's Pending
    without the item's token. The token leaves the server only in the deliveries to the item's
    sinks (engine/session.py `_outbox`, from the live event); every history, replay, inspector
    and transcript reads events through here (engine/session.py `_plain`, server/audience.py)."""
    data = event.get("data")
    if event.get("type") == ev.PENDING and isinstance(data, dict) and TOKEN_KEY in data:
        return event | {"data": {k: v for k, v in data.items() if k != TOKEN_KEY}}
    return event


# -- the inputs that resolve items (accepted by Session.stream / chat / achat) ---------------


@dataclass(frozen=True)
class Approve:
    """Approve the tool call of item `item`, optionally with edited arguments."""

    item: str
    args: dict[str, Any] | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Reject:
    """Refuse the tool call of item `item`: the model is told the tool's `rejected` text."""

    item: str
    reason: str | None = None


@dataclass(frozen=True)
class Answer:
    """The answer to question `item` (validated against its schema); a backend sends its token."""

    item: str
    value: Any
    token: str | None = None


@dataclass(frozen=True)
class TakeOver:
    """An operator takes the conversation (no item needed): the bot stays silent until `Release`.
    `force`: take it from the operator who holds it (the user reads them leave and this one join;
    the talk so far stays). Without it another operator's hold is refused (HeldByAnother)."""

    note: str | None = None
    force: bool = False


@dataclass(frozen=True)
class OperatorSay:
    """The operator speaks to the user (a Message event with meta {"from": "operator"})."""

    text: str


@dataclass(frozen=True)
class Release:
    """The operator gives the conversation back to the bot, optionally on another route."""

    route: str | None = None


@dataclass(frozen=True)
class Expire:
    """Resolve every item whose due time has passed (by the session clock, or `now`); no-op if none."""

    now: str | None = None
    # The sweeper's interval (seconds): when this turn fails, the session waits that long before
    # the next try, doubled with each failure up to RETRY_CAP (`retried`). Not in the history.
    backoff: float | None = None


RETRY_CAP = 3600.0  # the longest wait between two tries of a failing timeout turn (seconds)


def retried(previous: Mapping[str, Any] | None, backoff: float, now: float) -> dict[str, float]:
    """The backoff after a failed timeout turn at `now`: wait `backoff` the first time, twice
    the last wait after that, at most RETRY_CAP; {"after", "wait"} (store/record.py RETRY_KEY)."""
    last = previous.get("wait") if previous else None
    wait = min(RETRY_CAP, 2 * float(last) if isinstance(last, int | float) and last > 0 else backoff)
    return {"after": now + wait, "wait": wait}


Decision = Approve | Reject | Answer | TakeOver | OperatorSay | Release | Expire
DECISION_TYPES = (Approve, Reject, Answer, TakeOver, OperatorSay, Release, Expire)
_DECISION_NAMES = {Approve: "approve", Reject: "reject", Answer: "answer", TakeOver: "takeover",
                   OperatorSay: "operator_say", Release: "release", Expire: "expire"}


def decision_entry(decision: Decision) -> dict[str, Any]:
    """A decision as a history entry's input: {"decision": {"kind": "approve", "item": "p1", ...}}.
    A backend's token is never recorded, nor a `force` left false (entries stay as they were)."""
    body = {k: v for k, v in asdict(decision).items() if v is not None and k not in (TOKEN_KEY, "backoff")
            and not (k == "force" and v is False)}
    return {"decision": {"kind": _DECISION_NAMES[type(decision)], **body}}


# -- times ------------------------------------------------------------------------------------

def due_after(now: datetime, timeout: str | None) -> str | None:
    """When an item made `now` with `timeout` (a duration such as `30m`) is due; None: never (also
    when no clock reaches it: past the year 9999, which `chatrun validate` refuses)."""
    if not timeout:
        return None
    try:
        return time_after(now, parse_duration(timeout))
    except (OverflowError, ValueError):  # ValueError: a timedelta too long for a clock (engine/clock.py)
        return None


def time_after(moment: datetime, wait: timedelta) -> str:
    """The stored time (format_time) a `wait` after `moment`: time that passes (templates.later), not
    the wall clock's, which the night clocks go back would end a 30-minute wait an hour late, or
    before it began (the sweeper would resolve the item at once)."""
    return format_time(later(moment, wait))


def format_time(moment: datetime) -> str:
    """An instant as stored in items: ISO 8601 in UTC, so stores can compare and index them."""
    return moment.astimezone(UTC).isoformat()


def parse_time(text: str) -> datetime:
    """An ISO time as an aware instant (one without an offset is UTC)."""
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def earliest_due(items: Iterable[PendingItem]) -> str | None:
    dues = [item for item in items if item.due is not None]
    if not dues:
        return None
    return min(dues, key=lambda item: parse_time(item.due or "")).due
