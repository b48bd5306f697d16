"""The report's figures: what `chatrun report` computes of a list of conversations, per group
(all conversations, each bot version, each locale). docs/report.md defines each figure.

- containment: the share of conversations not escalated (no `escalated` outcome);
- escalation, abandonment: the share with the `escalated` / `abandoned` outcome;
- each outcome's share, and the share with none recorded yet;
- where conversations end: the route each is on, counted (the funnel);
- cost per resolved conversation: all the group's cost (or tokens, when no bot declares
  `prices:`) divided by its conversations with the `resolved` outcome;
- CSAT: thumbs up over all rated turns;
- latency: the 50th, 90th and 99th percentiles of the users' turns' times.
The outcome names that mean resolved, escalated and abandoned are the command's options.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from chatrun.report.read import Conversation

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Meanings:
    """Which outcome names count as resolved, escalated and abandoned (the bot's names are its author's)."""

    resolved: frozenset[str] = frozenset({"resolved"})
    escalated: frozenset[str] = frozenset({"escalated"})
    abandoned: frozenset[str] = frozenset({"abandoned"})


@dataclass
class Group:
    """The figures of one group of conversations."""

    name: str
    conversations: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # outcome name -> conversations ("" : none yet)
    ends: Counter[str] = field(default_factory=Counter)  # route -> conversations on it
    ends_by_outcome: Counter[tuple[str, str]] = field(default_factory=Counter)  # (route, outcome or "") -> conversations
    cost: float = 0.0
    priced: int = 0  # conversations with a cost (their bot declares prices)
    tokens: int = 0
    unfinished: int = 0  # attempts that never committed (their calls are in cost and tokens)
    up: int = 0
    down: int = 0
    seconds: list[float] = field(default_factory=list)

    def add(self, c: Conversation) -> None:
        self.conversations += 1
        self.outcomes[c.outcome or ""] += 1
        self.ends[c.route] += 1
        self.ends_by_outcome[(c.route, c.outcome or "")] += 1
        if c.cost is not None:
            self.cost += c.cost
            self.priced += 1
        self.tokens += c.tokens
        self.unfinished += c.unfinished
        for rating in c.ratings:
            if rating == "up":
                self.up += 1
            elif rating == "down":
                self.down += 1
        self.seconds.extend(c.seconds)

    def share(self, names: Iterable[str]) -> float:
        """The share of conversations whose outcome is one of `names` (0 for an empty group)."""
        return sum(self.outcomes[n] for n in names) / self.conversations if self.conversations else 0.0

    def rates(self, meanings: Meanings) -> dict[str, float]:
        escalation = self.share(meanings.escalated)
        return {"containment": 1.0 - escalation if self.conversations else 0.0, "escalation": escalation,
                "abandonment": self.share(meanings.abandoned), "resolution": self.share(meanings.resolved)}

    def cost_per_resolved(self, meanings: Meanings, priced: bool) -> float | None:
        """Cost per resolved conversation when the report counts cost (`priced`: some bot of the
        report declares prices), else tokens: one unit for every group. None when none was
        resolved, or when the report counts cost and no conversation of this group had a price
        (a version before `prices:`): its cost is not known, and its tokens are not a cost."""
        resolved = sum(self.outcomes[n] for n in meanings.resolved)
        if not resolved or (priced and not self.priced):
            return None
        return (self.cost if priced else float(self.tokens)) / resolved

    @property
    def csat(self) -> float | None:
        rated = self.up + self.down
        return self.up / rated if rated else None

    def latency(self) -> dict[int, float | None]:
        ordered = sorted(self.seconds)
        return {p: percentile(ordered, p) for p in PERCENTILES}


def percentile(ordered: list[float], p: int) -> float | None:
    """The nearest-rank percentile of sorted values (None: no values)."""
    if not ordered:
        return None
    rank = max(1, -(-p * len(ordered) // 100))  # ceil(p/100 * n)
    return ordered[rank - 1]


@dataclass
class Figures:
    """Every group's figures: all conversations, then by bot version, then by locale."""

    total: Group
    by_version: list[Group]
    by_locale: list[Group]

    @property
    def groups(self) -> list[Group]:
        return [self.total, *self.by_version, *self.by_locale]


def figures(conversations: Iterable[Conversation]) -> Figures:
    total = Group("all")
    versions: dict[str, Group] = {}
    locales: dict[str, Group] = {}
    for c in conversations:
        total.add(c)
        _group(versions, f"{c.bot}@{c.version}" if c.version else c.bot).add(c)
        _group(locales, f"locale {c.locale}").add(c)
    by_size: Callable[[Group], tuple[int, str]] = lambda g: (-g.conversations, g.name)  # noqa: E731
    return Figures(total, sorted(versions.values(), key=by_size), sorted(locales.values(), key=by_size))


def _group(groups: dict[str, Group], name: str) -> Group:
    found = groups.get(name)
    if found is None:
        found = groups[name] = Group(name)
    return found
