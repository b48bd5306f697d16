"""What `chatrun report` reads of a store: one `Conversation` row per stored session.

The values come from the session's snapshot (bot, version, locale, outcome, the route it is on,
its usage) and its history (when it started, each turn's time, the users' ratings), at the JSON
paths store/record.py names (REPORT_SESSION_PATHS, REPORT_HISTORY_PATHS). A SQLite store reads
them in two scans (`SQLiteStore.report_rows`: JSON read in SQL); any other store through the
async store protocol (`list_sessions`, `load_session`, `load_history`), a batch at a time.

A `/v1` fork (a regenerated answer, an edited message: server/openai_sessions.py) is a stored
session of its own but a branch of the same conversation (its snapshot's `meta.forked_from`
names the first original, `keys`): the report counts the branches as one conversation
(`joined`). Each branch adds only what it did itself: its own turns, ratings and usage (what
it carried over from the fork point, `forked_from.usage`, was billed in its original). The
conversation's outcome, route, version and locale are the branch last spoken in (the sweeper's
turns aside), the outcome else the newest other branch's (docs/report.md, "Forks").
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from chatrun.store import billing
from chatrun.store.aio import AsyncStore
from chatrun.store.record import REPORT_HISTORY_PATHS, REPORT_SESSION_PATHS, json_path

BATCH = 200  # sessions read at once from a store read through the protocol
NO_LOCALE = "-"  # a session that has no locale (a bot without `locales:`, a client that sent none)
EXPIRE = "expire"  # the sweeper's turns (a decision `expire`): not a user's wait, not counted in latency


@dataclass(slots=True)
class Conversation:
    """One conversation as the report counts it."""

    bot: str
    version: str  # the bot's content version it last ran on (the first 8 characters)
    locale: str
    outcome: str | None  # the recorded outcome's name (engine/outcomes.py), None: none yet
    route: str  # the route it is on: where it ended, or stands
    started: float  # epoch seconds of its first turn
    cost: float | None  # in the units of the bot's `prices:`; None: no price declared
    tokens: int
    seconds: list[float] = field(default_factory=list)  # each committed user turn's time
    ratings: list[str] = field(default_factory=list)  # each rated turn's newest rating ("up", "down")
    # Attempts whose process ended before they committed (store/billing.py): their model calls are
    # in `tokens` and `cost` (a record no later attempt took up yet too: `with_unfinished`).
    unfinished: int = 0


async def read_conversations(store: AsyncStore, since: float | None = None) -> list[Conversation]:
    """Every conversation of the store that started at `since` (epoch seconds) or later."""
    sqlite = _sqlite_of(store)
    rows: Iterable[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]
    if sqlite is not None:
        sessions, history = await asyncio.to_thread(sqlite.report_rows, REPORT_SESSION_PATHS, REPORT_HISTORY_PATHS)
        rows = _joined(sessions, history)
    else:
        rows = [row async for row in _protocol_rows(store)]
    branches = [b for b in (_branch(values, entries) for values, entries in rows) if b is not None]
    await with_unfinished(store, branches)
    found = joined(branches)
    return [c for c in found if since is None or c.started >= since]


def _sqlite_of(store: AsyncStore) -> Any:
    inner = getattr(store, "sync", None)
    return inner if hasattr(inner, "report_rows") else None


def _joined(sessions: list[tuple[Any, ...]], history: list[tuple[Any, ...]]
            ) -> Iterator[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]:
    """Each session's values with its history rows (both scans are in session id order)."""
    entries = {sid: [row[1:] for row in rows] for sid, rows in groupby(history, key=lambda r: r[0])}
    for row in sessions:
        yield row[1:], entries.get(row[0], [])


async def _protocol_rows(store: AsyncStore) -> Any:
    ids = await store.list_sessions()
    for start in range(0, len(ids), BATCH):
        batch = ids[start:start + BATCH]
        records = await asyncio.gather(*(store.load_session(sid) for sid in batch))
        histories = await asyncio.gather(*(store.load_history(sid) for sid in batch))
        for record, history in zip(records, histories, strict=True):
            if record is None:  # deleted meanwhile
                continue
            yield (tuple(json_path(record.snapshot, p) for p in REPORT_SESSION_PATHS),
                   [tuple(json_path(e, p) for p in REPORT_HISTORY_PATHS) for e in history])


@dataclass(slots=True)
class Branch:
    """One stored session: a conversation, or a `/v1` fork of one (a branch of it)."""

    id: str
    root: object  # the first original's id (`forked_from.keys`), else its own
    parent: str | None  # the session it forked from, None: not a fork
    fork_turn: int  # the parent's turn it forked after
    last: float  # when its last turn ran that was not the sweeper's
    rated: dict[Any, tuple[Any, str]]  # turn -> (when, as kept; its newest rating)
    conversation: Conversation  # its values, its usage its own (what it carried over taken off)
    billed: Any = None  # the last attempt its usage counts (store/billing.py)


def _branch(values: tuple[Any, ...], entries: Iterable[tuple[Any, ...]]) -> Branch | None:
    (bot, version, state_locale, meta_locale, outcome, route, cost, input_tokens, output_tokens,
     sid, keys, parent, fork_turn, carried_cost, carried_in, carried_out, billed) = values
    started: float | None = None
    last: Any = 0.0
    seconds: list[float] = []
    rated: dict[Any, tuple[Any, str]] = {}
    unfinished = 0
    for turn, at, ok, took, decision, rated_turn, rating, dead in entries:  # in the order they were kept
        unfinished += dead is True or dead == 1  # SQLite's json_extract reads true as 1
        if turn is not None:
            if started is None and isinstance(at, int | float):
                started = float(at)
            if decision != EXPIRE:
                last = at
                if ok and isinstance(took, int | float):
                    seconds.append(float(took))
        elif isinstance(rating, str):
            rated[rated_turn] = (at, rating)  # a later rating of the same turn supersedes the earlier
    if started is None or not isinstance(bot, str):
        return None  # never ran a turn: not a conversation yet
    locale = state_locale if isinstance(state_locale, str) and state_locale else meta_locale
    own_cost = None if not isinstance(cost, int | float) else float(cost) if carried_cost is None \
        else _less(cost, carried_cost)
    tokens = int(input_tokens or 0) + int(output_tokens or 0)
    if parent is not None:  # a fork: what it carried over was its original's
        tokens -= int(carried_in or 0) + int(carried_out or 0)
    conversation = Conversation(bot, str(version or "")[:8], locale if isinstance(locale, str) and locale
                                else NO_LOCALE, outcome if isinstance(outcome, str) else None, str(route or ""),
                                started, own_cost, tokens, seconds, unfinished=unfinished)
    own = str(sid) if sid is not None else None
    root = keys if isinstance(keys, str) else own if own is not None else object()
    return Branch(own or "", root, parent if isinstance(parent, str) else None,
                  fork_turn if isinstance(fork_turn, int) else 0, last if isinstance(last, int | float) else 0.0,
                  rated, conversation, billed)


async def with_unfinished(store: AsyncStore, branches: list[Branch]) -> None:
    """Count in each stored session the attempts its usage record (store/billing.py) holds that
    no commit counted yet: their process ended after the provider billed their model calls, and
    no later attempt of the session took them up (its next turn would)."""
    by_id = {b.id: b for b in branches}
    for key in await store.record_keys(billing.PREFIX):
        branch = by_id.get(key[len(billing.PREFIX):])
        if branch is None:
            continue
        for attempt in billing.unfinished(await store.get_record(key), branch.billed):
            usage, conversation = attempt.get("usage") or {}, branch.conversation
            conversation.unfinished += 1
            conversation.tokens += int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
            if isinstance(usage.get("cost"), int | float):
                conversation.cost = (conversation.cost or 0.0) + float(usage["cost"])


def _less(value: int | float, carried: Any) -> float:
    return float(value) - (float(carried) if isinstance(carried, int | float) else 0.0)


def joined(branches: Iterable[Branch]) -> list[Conversation]:
    """One conversation per first original, its forks' branches joined into it."""
    groups: dict[object, list[Branch]] = {}
    for branch in branches:
        groups.setdefault(branch.root, []).append(branch)
    return [_one(group) if len(group) > 1 else _alone(group[0]) for group in groups.values()]


def _alone(branch: Branch) -> Conversation:
    """A conversation never forked (most): its own values, its ratings each turn's newest."""
    conversation = branch.conversation
    conversation.ratings = [rating for _, rating in branch.rated.values()]
    return conversation


def _one(branches: list[Branch]) -> Conversation:
    """The branches of one conversation as one: the newest branch's outcome (else the newest
    other's), route, version and locale; every branch's own turns, usage and ratings."""
    branches = sorted(branches, key=lambda b: b.conversation.started)  # the same order from any store
    by_id = {b.id: b for b in branches}
    newest = sorted(branches, key=lambda b: b.last, reverse=True)
    head = newest[0].conversation
    outcome = next((b.conversation.outcome for b in newest if b.conversation.outcome is not None), None)
    costs = [b.conversation.cost for b in branches if b.conversation.cost is not None]
    rated: dict[tuple[str, int], tuple[float, str]] = {}
    for branch in branches:
        for turn, (kept, rating) in branch.rated.items():
            at = float(kept) if isinstance(kept, int | float) else 0.0
            key = (_owner(branch, turn, by_id), turn)  # a turn before the fork point is its original's reply
            if key not in rated or rated[key][0] <= at:
                rated[key] = (at, rating)
    return Conversation(head.bot, head.version, head.locale, outcome, head.route,
                        min(b.conversation.started for b in branches), sum(costs) if costs else None,
                        sum(b.conversation.tokens for b in branches),
                        [s for b in branches for s in b.conversation.seconds], [r for _, r in sorted(rated.values())],
                        sum(b.conversation.unfinished for b in branches))


def _owner(branch: Branch, turn: Any, by_id: dict[str, Branch]) -> str:
    """The id of the branch whose reply turn `turn` of `branch` is (its own after its fork point)."""
    while branch.parent is not None and isinstance(turn, int) and turn <= branch.fork_turn:
        parent = by_id.get(branch.parent)
        if parent is None:  # the original is gone: its turns are still its
            return branch.parent
        branch = parent
    return branch.id
