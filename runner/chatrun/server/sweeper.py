"""The pending sweeper: timeouts of pending items fire with no client present.

Every replica runs one, started and stopped with the app (server/app.py's Lifecycle). Every
`interval` seconds (`chatrun serve --sweep-interval`, default 5) it asks the store which
sessions have an item due (`list_due`: SQLite's index, Redis' sorted set updated by each
commit) and runs `Expire()` on each through the session registry, as the server itself
(session_open.SYSTEM): the same lease, version fencing and commit as any turn. So a timeout
is resolved exactly once however many replicas see it due: the first takes the lease and
commits; the others find the session busy (they skip it: `ifBusy: reject`) or, once it is
committed, nothing due any more. A replica killed mid-sweep leaves the item due, and the
next sweep (of any replica, or of the restarted one) resolves it.

The same loop refreshes the `chatrun_pending_*` gauges every MEASURE_EVERY seconds, and every
RETAIN_EVERY seconds deletes what is past the served bots' `retention:` (capped by the server's
`--retain-idle` / `--retain-dead-letters`): idle sessions, with their files, and old dead
letters (store/retention.py). A session running a turn is left for the next pass. Then it has
the store sweep the leases that ran out (`sweep_leases`: on PostgreSQL the rows a replica that
died left, its own lease among them; Redis's expire by themselves).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from chatrun.definition.config import Retention
from chatrun.engine.pending import Expire, format_time, parse_time
from chatrun.errors import ChatrunError
from chatrun.server import wire
from chatrun.server.session_gate import REJECT
from chatrun.server.sessions import EXISTING, SYSTEM
from chatrun.store.record import TALLY_PENDING, age_key
from chatrun.store.retention import Counts, purge

if TYPE_CHECKING:
    from chatrun.server.sessions import SessionRegistry
    from chatrun.store.aio import AsyncStore

log = logging.getLogger("chatrun.pending")
MEASURE_EVERY = 30.0  # seconds between two reads of the pending tallies for the gauges
RETAIN_EVERY = 60.0  # seconds between two retention passes (retention is counted in hours and days)


@dataclass(frozen=True)
class SweepSettings:
    interval: float = 5.0  # seconds between two looks at the due index (0: no sweeper on this replica)
    batch: int = 100  # sessions expired per look at most (the rest: on the next look)
    # The server's cap on every bot's `retention:` (`chatrun serve --retain-idle`, `--retain-dead-letters`).
    retention: Retention = Retention()  # noqa: RUF009 - frozen

    @classmethod
    def from_env(cls) -> SweepSettings:
        """$CHATRUN_SWEEP_INTERVAL (seconds) over the default (what create_app uses unless told)."""
        text = os.environ.get("CHATRUN_SWEEP_INTERVAL")
        if not text:
            return cls()
        try:
            interval = float(text)
        except ValueError:
            raise ChatrunError(f"$CHATRUN_SWEEP_INTERVAL must be a number of seconds, not {text!r}") from None
        if interval < 0:
            raise ChatrunError(f"$CHATRUN_SWEEP_INTERVAL must be 0 (off) or more, not {text!r}")
        return cls(interval=interval)


class PendingSweeper:
    def __init__(self, registry: SessionRegistry, settings: SweepSettings = SweepSettings(),  # noqa: B008 - frozen
                 clock: Callable[[], float] = time.time):
        self.registry, self.settings, self.clock = registry, settings, clock
        self.expired = 0  # sessions this sweeper committed an Expire on (tests and /health read it)
        self._measured = 0.0
        self._retained = 0.0
        self.retained = Counts()  # what retention deleted since the start (tests and logs read it)

    async def run_forever(self) -> None:
        if self.settings.interval <= 0:
            return
        while True:
            try:
                await self.sweep()
                await self.measure()
                if self.clock() - self._retained >= RETAIN_EVERY:
                    self._retained = self.clock()
                    await self.retain()
                    await self.registry.store.sweep_leases()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is unreachable: look again next time
                log.warning("pending sweeper: %s", exc)
            await asyncio.sleep(self.settings.interval)

    async def sweep(self) -> int:
        """Expire every session due now (up to `batch`); how many this replica expired."""
        now = self.clock()
        done = 0
        for session_id in (await self.registry.store.list_due(now))[: self.settings.batch]:
            done += await self.expire(session_id, now)
        return done

    async def expire(self, session_id: str, now: float) -> int:
        """Run Expire() on one session if it is still due (1), else nothing (0)."""
        record = await self.registry.store.load_session(session_id)
        if record is None or record.bot not in self.registry.bots:
            return 0  # deleted meanwhile, or a bot another replica serves
        try:
            async with self.registry.session(record.bot, session_id, None, EXISTING, if_busy=REJECT,
                                             reach=SYSTEM) as session:
                due = session.next_due
                if due is None or parse_time(due).timestamp() > now:
                    return 0  # another replica (or a decision) resolved it first
                if (session.retry_after or 0) > now:
                    return 0  # its last timeout turn failed: not before its backoff is over
                # A request id per due time: a retried sweep replays instead of expiring twice.
                async for _ in self.registry.turn(session, sweep_input(now, self.settings.interval), f"expire:{due}"):
                    pass
        except wire.RequestFailed as exc:  # busy (a turn runs: next look), a conflict, draining
            log.info("pending sweeper: session %s not expired now: %s", session_id, exc.message)
            return 0
        self.expired += 1
        return 1

    def retention_of(self, bot: str | None) -> Retention:
        """A served bot's retention within the server's cap (a bot served elsewhere: the cap's)."""
        served = self.registry.bots.get(bot) if bot is not None else None
        own = served.config.retention if served is not None else Retention()
        return own.capped(self.settings.retention)

    async def retain(self) -> Counts:
        """Delete what is past the served bots' retention now (up to `batch` idle sessions a bot)."""
        registry = self.registry
        counts = await purge(registry.store, {name: self.retention_of(name) for name in registry.bots}, self.clock(),
                             registry.erase, registry.blobs, limit=self.settings.batch)
        if counts.sessions or counts.dead_letters or counts.user_memory:
            log.info("retention: deleted %s", counts.shown())
        for name in ("sessions", "files", "dead_letters", "user_memory"):
            setattr(self.retained, name, getattr(self.retained, name) + getattr(counts, name))
        return counts

    async def measure(self) -> None:
        """The pending gauges: open items by bot and kind (the store's tally), and the oldest's
        age (the first of the store's age index): a read per bot and kind, never a read of every
        waiting session."""
        metrics = self.registry.metrics
        if metrics is None or self.clock() - self._measured < MEASURE_EVERY:
            return
        self._measured = now = self.clock()
        metrics.pending_state(await pending_counts(self.registry.store, now))


def sweep_input(now: float, backoff: float | None = None) -> Expire:
    """The Expire a sweep runs: what is due by the sweeper's own clock (the instant it found the
    session due at), so the engine resolves exactly what the sweeper saw due; if its turn fails,
    the session waits `backoff` (the sweep interval), then twice as long, and so on, before a
    sweeper tries again (engine/pending.py `retried`)."""
    return Expire(format_time(datetime.fromtimestamp(now, UTC)), backoff=backoff or None)


async def pending_counts(store: AsyncStore, now: float) -> dict[tuple[str, str], tuple[int, float]]:
    """(bot, kind) -> (open items, the oldest's age in seconds), from the store's flat indexes."""
    counts: dict[tuple[str, str], tuple[int, float]] = {}
    for name, count in (await store.read_tallies(TALLY_PENDING)).items():
        bot, kind = json.loads(name)
        oldest = await store.waiting_page(age_key(str(bot), str(kind)), None, None, 1)
        since = oldest[0].positions.get(age_key(str(bot), str(kind))) if oldest else None
        counts[(str(bot), str(kind))] = (count, max(0.0, now - since) if since is not None else 0.0)
    return counts
