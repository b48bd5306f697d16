"""The outbox worker: delivers the backend events of committed turns to the bots' sinks.

A turn's backend events are written into the store's outbox by the turn's own commit
(chatrun.store.record.outbox_of), so a rolled-back turn queues nothing and a committed one
is never lost. This task, started and stopped with the app (server/app.py's Lifecycle),
claims due entries of the routes it serves (a route: a bot's name and a sink's name; it
serves the sinks with a webhook of every version of every bot it holds) for `lease` seconds (on Redis one replica at a time: a claim is a token,
and a replica that dies holding claims lets them come due again for the others), tries each
(chatrun.server.webhook), and settles it under its claim: a delivered entry is deleted; a
failed one gets its next attempt time (exponential backoff with jitter, the sink's `retry:`)
or, out of attempts or too old, becomes a dead letter, listed by `GET /outbox?state=dead`
and retried by `POST /outbox/{id}/retry`. An entry of a route this replica does not serve (another
bot on the same store, a sink only a newer version has) is never claimed here: it waits for a
replica that serves it, and once it is overdue by `unserved_after` seconds the gauge
chatrun_outbox_unserved_entries counts it and a warning names it (no replica serves it).

Delivery is at least once: an entry delivered whose settle never landed (the process was
killed between the receiver's 2xx and the store's delete) is delivered again, with the same
idempotency key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Query

from chatrun.definition.config import BotConfig, RetryPolicy, SinkConfig
from chatrun.engine import tracing
from chatrun.engine.pending import without_secret
from chatrun.errors import ChatrunError
from chatrun.server import wire
from chatrun.server.auth import Principal
from chatrun.server.http import ERROR_RESPONSES
from chatrun.server.plumbing import Caller, Registry
from chatrun.server.webhook import Attempt, WebhookSender
from chatrun.store.record import DEAD, PENDING, OutboxEntry, route_of

if TYPE_CHECKING:
    from chatrun.server.sessions import SessionRegistry

log = logging.getLogger("chatrun.outbox")
GAUGE_LIMIT = 10_000  # the outbox gauges count this many entries at most
MEASURE_EVERY = 10.0  # seconds between two updates of the outbox gauges
WARN_EVERY = 300.0  # seconds between two warnings about the same unserved route
# Seconds one try at a channel reply may take, for the claim: its messages are sent one call
# each while a call's whole timeout (10 s) is left of it, the rest on the next try (door.py, deliver).
CHANNEL_SEND_TIME = 30.0


@dataclass(frozen=True)
class Served:
    """A route this replica delivers: the bot's config (its env and secrets) and the sink's (a
    channel's replies: a sink without a webhook, named `channel:<kind>`, and the channel's kind)."""

    bot: BotConfig
    sink: SinkConfig
    channel: str | None = None


@dataclass(frozen=True)
class OutboxSettings:
    """How the worker polls and claims. A claim must outlast the slowest attempt (a sink's
    `timeout`), so it is at least that plus `lease`'s margin."""

    poll: float = 1.0  # seconds between looks at the outbox when nothing was due
    lease: float = 60.0  # seconds a claim lasts (another replica takes the entry over after)
    batch: int = 32  # entries claimed at once
    unserved_after: float = 300.0  # seconds overdue after which an entry no replica claims is reported

    @classmethod
    def from_env(cls) -> OutboxSettings:
        """$CHATRUN_OUTBOX_POLL and $CHATRUN_OUTBOX_LEASE (seconds) over the defaults."""
        values: dict[str, float] = {}
        for name, var in (("poll", "CHATRUN_OUTBOX_POLL"), ("lease", "CHATRUN_OUTBOX_LEASE")):
            text = os.environ.get(var)
            if text:
                try:
                    values[name] = float(text)
                except ValueError:
                    raise ChatrunError(f"${var} must be a number of seconds, not {text!r}") from None
        return cls(poll=values.get("poll", cls.poll), lease=values.get("lease", cls.lease))


def next_attempt(policy: RetryPolicy, attempts: int, now: float, asked: float | None = None) -> float:
    """When the try after `attempts` failed ones is due: backoff * 2**(attempts-1), at most
    max_backoff, times a jitter in [0.5, 1] (so receivers are not hit by every replica at once);
    never sooner than the `asked` seconds the receiver asked to wait (Telegram's `retry_after`,
    a `Retry-After`), itself at most max_backoff (a receiver cannot park an entry for a day)."""
    delay = min(policy.max_backoff, policy.backoff * 2.0 ** max(0, attempts - 1))
    delay *= 0.5 + random.random() / 2  # noqa: S311 - jitter, not a secret
    return now + max(delay, min(policy.max_backoff, asked or 0.0))


def after_failure(entry: OutboxEntry, policy: RetryPolicy, error: str, now: float,
                  asked: float | None = None) -> OutboxEntry:
    """The entry's bookkeeping after a failed attempt (its `attempts` already counts it)."""
    entry.error = error
    if entry.attempts >= policy.attempts or now - entry.created >= policy.max_age:
        entry.state = DEAD
        entry.next_at = now
    else:
        entry.next_at = next_attempt(policy, entry.attempts, now, asked)
    return entry


class OutboxWorker:
    """The delivery task of one app (one per replica)."""

    def __init__(self, registry: SessionRegistry, settings: OutboxSettings = OutboxSettings()):  # noqa: B008
        self.registry = registry
        self.settings = settings
        self.sender = WebhookSender()
        self._wake = asyncio.Event()
        self._turn = 0  # where the routes' round starts (run_once)
        self._warned: dict[str, float] = {}  # route -> when its entries were last reported unserved

    def nudge(self) -> None:
        """Look at the outbox now (a turn committed backend events in this process)."""
        self._wake.set()

    async def run_forever(self) -> None:
        measured = 0.0
        while True:
            try:
                if time.monotonic() - measured >= MEASURE_EVERY:
                    measured = time.monotonic()
                    await self.measure()
                claimed = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the store is down for a moment: try again later, never die
                log.exception("outbox: could not claim entries")
                claimed = 0
            # Fewer than a batch: nothing else was due when it was claimed, so wait (a turn
            # committed meanwhile has nudged already) instead of claiming again to find none.
            # (Redis drops a queue's ids whose entry is gone as it claims; those count against
            # the batch, so what they hid waits for the next look, at most `poll` later.)
            if claimed < self.settings.batch:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for makes a task of every poll.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.poll):
                        await self._wake.wait()
                self._wake.clear()

    async def run_once(self) -> int:
        """Claim the due entries of the routes this replica serves and try them all; how many
        were claimed."""
        served = self.served()
        if not served:
            return 0
        lease = self.settings.lease + max((s.sink.webhook.timeout if s.sink.webhook else CHANNEL_SEND_TIME
                                           for s in served.values()), default=0)
        routes = list(served)
        self._turn = (self._turn + 1) % len(routes)  # a busy route cannot starve the others of the batch
        routes = routes[self._turn:] + routes[:self._turn]
        entries = await self.registry.store.claim_outbox(time.time(), lease, self.settings.batch, routes)
        if entries:
            await asyncio.gather(*(self.deliver(entry, served.get(entry.route)) for entry in entries))
        return len(entries)

    def served(self) -> dict[str, Served]:
        """The routes this replica delivers: every sink with a webhook of every version of every
        bot it holds (a version loaded from the store for one of its sessions too), with the
        primary version's definition of a sink before an older or newer one's."""
        out: dict[str, Served] = {}
        for name, versions in self.registry.shelf.bots.items():
            primary = versions.primary
            for version in [primary, *reversed(versions.versions)]:
                config = version.bot.config
                for sink in config.sinks.values():
                    if sink.webhook is not None:
                        out.setdefault(route_of(name, sink.name), Served(config, sink))
                for kind, channel in config.channels.items():
                    out.setdefault(route_of(name, channel.sink),
                                   Served(config, SinkConfig(channel.sink, retry=channel.retry), kind))
        return out

    async def deliver(self, entry: OutboxEntry, served: Served | None) -> None:
        if served is None or (served.sink.webhook is None and served.channel is None):
            # Claimed just before a reload took its sink away: not an attempt, so no dead
            # letter either; it is due again at once, for a replica that serves it.
            entry.next_at = time.time()
            await self.registry.store.settle_outbox(entry, delivered=False)
            log.info("outbox: %s: this replica no longer serves sink %s of bot %s; left for one that does",
                     entry.id, entry.sink, entry.body.get("bot"))
            return
        entry.attempts += 1
        started = time.monotonic()
        attributes = {"chatrun.sink": entry.sink, "chatrun.event.id": entry.id,
                      "chatrun.event.type": entry.body.get("type"), "chatrun.attempt": entry.attempts}
        with tracing.span(f"deliver {entry.sink}", attributes) as current:
            attempt = await self._attempt(served, entry)
            if not attempt.delivered:
                tracing.delivery_failed(current, attempt.error or "failed")
        await self._settle(entry, attempt, served.sink.retry, time.monotonic() - started)

    async def _attempt(self, served: Served, entry: OutboxEntry) -> Attempt:
        if served.channel is not None:  # a reply to a channel's user (server/channels/door.py)
            return await self.registry.channels.deliver(  # type: ignore[no-any-return]
                served.bot, served.channel, entry.body, within=CHANNEL_SEND_TIME)
        assert served.sink.webhook is not None
        return await self.sender.send(served.bot, served.sink.webhook, entry.body, entry.attempts)

    async def _settle(self, entry: OutboxEntry, attempt: Attempt, policy: RetryPolicy, seconds: float) -> None:
        if not attempt.delivered:
            after_failure(entry, policy, attempt.error or "failed", time.time(), attempt.retry_after)
            log.warning("outbox: %s to sink %s, attempt %d failed: %s%s", entry.id, entry.sink, entry.attempts,
                        attempt.error, " (now a dead letter)" if entry.state == DEAD else "")
        if not await self.registry.store.settle_outbox(entry, attempt.delivered):
            log.info("outbox: %s: its claim ended before the attempt did; another worker has it", entry.id)
        metrics = self.registry.metrics
        if metrics is not None:
            outcome = "delivered" if attempt.delivered else "dead" if entry.state == DEAD else "retry"
            metrics.delivered(str(entry.body.get("bot")), entry.sink, outcome, seconds)

    async def measure(self) -> None:
        """The outbox gauges: entries by state (counted up to GAUGE_LIMIT) and the oldest's age;
        and the entries no replica serves (report_unserved)."""
        pending = await self.registry.store.list_outbox(PENDING, GAUGE_LIMIT)
        self.report_unserved(pending, time.time())
        metrics = self.registry.metrics
        if metrics is None:
            return
        dead = await self.registry.store.list_outbox(DEAD, GAUGE_LIMIT)
        oldest = min((e.created for e in pending), default=None)
        metrics.outbox_state(len(pending), len(dead), 0.0 if oldest is None else max(0.0, time.time() - oldest))

    def report_unserved(self, pending: list[OutboxEntry], now: float) -> dict[str, list[OutboxEntry]]:
        """Entries of routes this replica does not serve, overdue by `unserved_after` (a replica
        serving them would have claimed them long ago): the gauge chatrun_outbox_unserved_entries
        by bot and sink, and a warning per route at most every WARN_EVERY seconds. They are kept:
        a replica that serves them delivers them when it comes; `GET /outbox` lists them."""
        served = self.served()
        unserved: dict[str, list[OutboxEntry]] = {}
        for entry in pending:
            if entry.route not in served and now - entry.due >= self.settings.unserved_after:
                unserved.setdefault(entry.route, []).append(entry)
        for route, entries in unserved.items():
            if now - self._warned.get(route, -WARN_EVERY) >= WARN_EVERY:
                self._warned[route] = now
                log.warning("outbox: %d entries for sink %s of bot %s have waited up to %.0f s: no replica "
                            "serves them (this one serves %s); start one that does, or they stay pending",
                            len(entries), entries[0].sink, entries[0].body.get("bot"),
                            max(now - e.created for e in entries), ", ".join(sorted(served)) or "no sink")
        if self.registry.metrics is not None:
            self.registry.metrics.outbox_unserved({(str(e[0].body.get("bot")), e[0].sink): len(e)
                                                   for e in unserved.values()})
        return unserved

    async def aclose(self) -> None:
        await self.sender.aclose()


# -- the HTTP API: GET /outbox, POST /outbox/{id}/retry ------------------------------------------

OUTBOX_ROLE = "outbox"  # with auth on, only principals with this role see or retry the outbox


def make_outbox_router() -> APIRouter:
    """GET /outbox and POST /outbox/{id}/retry (docs/deploy.md, "Webhook delivery")."""
    router = APIRouter(responses=ERROR_RESPONSES, tags=["outbox"])
    router.add_api_route("/outbox", list_entries, methods=["GET"])
    router.add_api_route("/outbox/{entry_id}/retry", retry_entry, methods=["POST"])
    return router


async def list_entries(who: Caller, registry: Registry, state: Literal["pending", "dead"] | None = None,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
    """The outbox's entries, oldest first (`state`: only pending ones, or only dead letters)."""
    _allowed(who)
    entries = await registry.store.list_outbox(state, limit)
    # The body as the sink gets it, but for a backend item's token: that goes to the sink only.
    return {"entries": [shown | {"body": without_secret(shown["body"])} for shown in (e.shown() for e in entries)]}


async def retry_entry(entry_id: str, who: Caller, registry: Registry) -> Any:
    """A dead letter back in the queue, due now, its tries counted afresh (404: no such dead letter)."""
    _allowed(who)
    if not await registry.store.requeue_outbox(entry_id, time.time()):
        raise wire.RequestFailed(wire.NOT_FOUND, f"outbox entry {entry_id}: no such dead letter")
    worker = getattr(registry, "outbox", None)
    if worker is not None:
        worker.nudge()
    return {"id": entry_id, "state": PENDING}


def _allowed(who: Principal | None) -> None:
    if who is not None and OUTBOX_ROLE not in who.roles:
        raise wire.RequestFailed(wire.FORBIDDEN, f"the outbox is for principals with the role `{OUTBOX_ROLE}`")
