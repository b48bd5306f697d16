"""What model calls cost: tokens as the endpoint reports them (or as counted when it reports
none), money from the bot's `prices:`, summed per turn and per session, and the budgets of
`limits:` checked before each call.

A call's usage, as kept in the history entry of its turn:

    {"route": "flight", "model": "gpt-4o-mini", "input_tokens": 812, "output_tokens": 37,
     "cached_input_tokens": 512, "reasoning_tokens": 0, "cost": 0.00014, "estimated": false}

Totals (a turn's, a session's) have the same token keys, `cost` (None when no call had a
price), `calls`, and `estimated` (true when any call was counted rather than reported).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from chatrun.definition.config import Limits, Price
from chatrun.errors import SessionBudgetSpent, TurnFailed, UserBudgetSpent
from chatrun.memory.tokens import TokenCounter
from chatrun.messages import Message

TOKEN_KEYS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
# What OpenAI-compatible endpoints call them, for usage dicts given in that form.
_ALIASES = {"prompt_tokens": "input_tokens", "completion_tokens": "output_tokens"}


@dataclass(slots=True)  # one per session, cached sessions included: no __dict__
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None
    calls: int = 0
    estimated: bool = False

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: Usage) -> None:
        # TOKEN_KEYS written out (not getattr/setattr by name: 7,200 -> 2,900 instructions, twice
        # a turn; issue 39); tests/test_usage.py adds every one of them.
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_input_tokens += other.cached_input_tokens
        self.reasoning_tokens += other.reasoning_tokens
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost
        self.calls += other.calls
        self.estimated = self.estimated or other.estimated

    def to_dict(self) -> dict[str, Any]:
        # Written out (not dataclasses.fields()): three of these a turn; test_usage checks the keys.
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_input_tokens": self.cached_input_tokens, "reasoning_tokens": self.reasoning_tokens,
                "cost": None if self.cost is None else round(self.cost, 10), "calls": self.calls,
                "estimated": self.estimated}

    def copy(self) -> Usage:
        """A copy (copy.copy of a slotted dataclass goes through __reduce_ex__: a turn's checkpoint makes one)."""
        return Usage(self.input_tokens, self.output_tokens, self.cached_input_tokens, self.reasoning_tokens,
                     self.cost, self.calls, self.estimated)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Usage:
        data = data or {}
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def reported(raw: dict[str, Any]) -> dict[str, int]:
    """A provider's usage in chatrun's names (input/output/cached_input/reasoning tokens)."""
    out: dict[str, int] = {}
    for key, value in raw.items():
        name = _ALIASES.get(key, key)
        if name in TOKEN_KEYS and isinstance(value, int) and not isinstance(value, bool):
            out[name] = value
    return out


def call_usage(raw: dict[str, Any], price: Price | None, sent: Iterable[Message], answer: Message,
               count: TokenCounter, sent_tokens: Callable[[], int] | None = None) -> Usage:
    """One model call's usage: what the endpoint reported, else counted and marked estimated.
    `sent_tokens`: the count of `sent` when the caller has it cheaper than a walk of every message."""
    tokens = reported(raw)
    usage = Usage(calls=1)
    if "input_tokens" in tokens and "output_tokens" in tokens:
        for key, value in tokens.items():
            setattr(usage, key, value)
    else:  # some servers report nothing (or only when streaming is asked to): count it ourselves
        usage.input_tokens = sent_tokens() if sent_tokens is not None else sum(map(count, sent))  # each message's count is kept with it: no re-tokenizing
        usage.output_tokens = count(answer)
        usage.estimated = True
    usage.cost = cost_of(usage, price)
    return usage


def cost_of(usage: Usage, price: Price | None) -> float | None:
    if price is None:
        return None
    cached = min(usage.cached_input_tokens, usage.input_tokens)
    cached_price = price.cached_input if price.cached_input is not None else price.input
    return ((usage.input_tokens - cached) * price.input + cached * cached_price
            + usage.output_tokens * price.output) / 1_000_000


def usage_event(turn: int, route: str, ok: bool, usage: Usage, calls: list[dict[str, Any]],
                attempt: Attempt | None) -> dict[str, Any]:
    """The data of a turn's `Usage` backend event (docs/observability.md, "Usage for billing"):
    its model calls (`calls`, summed in `usage`), the killed attempts its commit counted
    (`unfinished`, store/billing.py), and `total`, what the commit added to the session's usage:
    the `total`s of a session's Usage events sum to its `usage`."""
    unfinished = list(attempt.unfinished) if attempt is not None else []
    total = usage.copy()
    if attempt is not None and unfinished:
        total.add(attempt.earlier())
    return {"turn": turn, "route": route, "ok": ok, "usage": usage.to_dict(), "calls": calls,
            "unfinished": [{"turn": a.get("turn"), "attempt": a.get("attempt"), "at": a.get("at"),
                            "usage": a.get("usage") or {}, "unfinished": True} for a in unfinished],
            "total": total.to_dict()}


@dataclass(frozen=True, slots=True)
class UserSpent:
    """What the session's user has used of `limits.max_user_tokens` / `max_user_cost` in the
    current window, over all their sessions (before this turn), and when the window renews.
    The server reads it per turn from its store (store/user_budget.py) for the bots that set them."""

    who: str
    usage: Usage
    renews: datetime


def check_budgets(limits: Limits, turn: Usage, session: Usage, next_input: int, price: Price | None,
                  route: str, spent: UserSpent | None = None) -> None:
    """Refuse the next model call when it would pass a budget (counting the tokens it sends)."""
    session_tokens, session_cost = session.tokens + turn.tokens, (session.cost or 0.0) + (turn.cost or 0.0)
    next_cost = cost_of(Usage(input_tokens=next_input), price) or 0.0
    checks: list[tuple[str, float | None, float, str, type[TurnFailed]]] = [
        ("max_turn_tokens", limits.max_turn_tokens, turn.tokens + next_input, "this turn", TurnFailed),
        ("max_session_tokens", limits.max_session_tokens, session_tokens + next_input, "this session",
         SessionBudgetSpent),
        ("max_turn_cost", limits.max_turn_cost, (turn.cost or 0.0) + next_cost, "this turn", TurnFailed),
        ("max_session_cost", limits.max_session_cost, session_cost + next_cost, "this session", SessionBudgetSpent),
    ]
    for name, budget, projected, whose, error in checks:
        if budget is not None and projected > budget:
            raise error(_past(route, whose, name, budget, projected))
    if spent is not None:
        _check_user(limits, turn, spent, next_input, next_cost, route)


def _check_user(limits: Limits, turn: Usage, spent: UserSpent, next_input: int, next_cost: float,
                route: str) -> None:
    """The user's budgets over the window (limits.max_user_*): UserBudgetSpent, which tells the
    user when the budget renews (the page text `user_budget_spent`, in their locale)."""
    for name, budget, projected in (
        ("max_user_tokens", limits.max_user_tokens, spent.usage.tokens + turn.tokens + next_input),
        ("max_user_cost", limits.max_user_cost, (spent.usage.cost or 0.0) + (turn.cost or 0.0) + next_cost),
    ):
        if budget is not None and projected > budget:
            renews = spent.renews.strftime("%Y-%m-%d %H:%M %Z").strip()
            whose = f"user {spent.who} in the window until {renews}"
            raise UserBudgetSpent(_past(route, whose, name, budget, projected), renews)


def _past(route: str, whose: str, name: str, budget: float, projected: float) -> str:
    unit = "tokens" if name.endswith("tokens") else "in cost"
    return (f"the next model call on route {route} would take {whose} to {projected:.6g} {unit}, "
            f"past limits.{name} = {budget:g}; the turn stops here")


class Attempt:
    """A turn tried on a server that records each model call's usage as it ends (store/billing.py):
    its random `id`, the session's earlier attempts that no commit counted (`unfinished`, from
    the record it found), and whether its own record was written (`written`)."""

    __slots__ = ("id", "unfinished", "written")

    def __init__(self, unfinished: list[dict[str, Any]]):
        self.id = secrets.token_hex(8)
        self.unfinished = unfinished
        self.written = False

    def earlier(self) -> Usage:
        """What the unfinished attempts used, summed."""
        total = Usage()
        for attempt in self.unfinished:
            usage = attempt.get("usage")
            total.add(Usage.from_dict(usage if isinstance(usage, dict) else None))  # its `by_call` is no field
        return total

    def billed(self, before: str | None) -> str | None:
        """The attempt a session's usage counts last once this one is counted: this one when its
        record was written (it names the unfinished ones too), else the one the record still names."""
        if self.written:
            return self.id
        return self.unfinished[-1].get("attempt") if self.unfinished else before

    def record(self, turn: int, usage: Usage, calls: list[dict[str, Any]], version: str) -> dict[str, Any]:
        """This attempt's usage record after a model call (store/billing.py), naming the bot
        `version` that made the calls (its cost counts for it should the attempt never commit)."""
        return {"attempt": self.id, "turn": turn, "at": time.time(), "version": version,
                "usage": {**usage.to_dict(), "by_call": calls},
                **({"earlier": self.unfinished} if self.unfinished else {})}
