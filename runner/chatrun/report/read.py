"""What `chatrun report` reads of a store: one `Conversation` row per stored session.

The values come from the session's snapshot (bot, version, locale, outcome, the route it is on,
its usage) and its history (when it started, each turn's time, the users' ratings), at the JSON
paths store/record.py names (REPORT_SESSION_PATHS, REPORT_HISTORY_PATHS). A SQLite store reads
them in two scans (`SQLiteStore.report_rows`: JSON read in SQL); any other store through the
async store protocol (`list_sessions`, `load_session`, `load_history`), a batch at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

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


async def read_conversations(store: AsyncStore, since: float | None = None) -> list[Conversation]:
    """Every conversation of the store that started at `since` (epoch seconds) or later."""
    sqlite = _sqlite_of(store)
    rows: Iterable[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]
    if sqlite is not None:
        sessions, history = await asyncio.to_thread(sqlite.report_rows, REPORT_SESSION_PATHS, REPORT_HISTORY_PATHS)
        rows = _joined(sessions, history)
    else:
        rows = [row async for row in _protocol_rows(store)]
    found = (_conversation(values, entries) for values, entries in rows)
    return [c for c in found if c is not None and (since is None or c.started >= since)]


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


def _conversation(values: tuple[Any, ...], entries: Iterable[tuple[Any, ...]]) -> Conversation | None:
    bot, version, state_locale, meta_locale, outcome, route, cost, input_tokens, output_tokens = values
    started: float | None = None
    seconds: list[float] = []
    rated: dict[Any, str] = {}
    for turn, at, ok, took, decision, rated_turn, rating in entries:
        if turn is not None:
            if started is None and isinstance(at, int | float):
                started = float(at)
            if ok and isinstance(took, int | float) and decision != EXPIRE:
                seconds.append(float(took))
        elif isinstance(rating, str):
            rated[rated_turn] = rating  # a later rating of the same turn supersedes the earlier
    if started is None or not isinstance(bot, str):
        return None  # never ran a turn: not a conversation yet
    locale = state_locale if isinstance(state_locale, str) and state_locale else meta_locale
    return Conversation(bot, str(version or "")[:8], locale if isinstance(locale, str) and locale else NO_LOCALE,
                        outcome if isinstance(outcome, str) else None, str(route or ""), started,
                        float(cost) if isinstance(cost, int | float) else None,
                        int(input_tokens or 0) + int(output_tokens or 0), seconds, list(rated.values()))
