"""Deliveries answered before their turn ran (Slack's: its `ack_within`), kept durable.

Slack wants its answer within 3 seconds and never sends a delivery it got a 200 for again, so
the turn goes on after the answer; a replica killed in between would lose the message. So,
before the answer, the user's message is written to the store as a record
`channel-in:<bot>:<kind>:<delivery>` (the inbound message, and `until`: when its runner's hold
ends). The replica that answered runs the turn and renews the hold every `ttl / 3` seconds
while it runs; once the turn is done (committed, replayed or refused for good) the record is
deleted. Every replica looks at these records every `ttl / 2` seconds (a range of the store's
record index, cheap on Redis: chatrun.store.redis.record_keys) and runs the turn of a record
whose hold has run out: its runner died. Exactly once still holds through the request id:
the turn's request id is the platform's delivery id, so a turn that did commit (and whose
record's deletion was lost with the replica) is replayed from the store, never run again, and
two replicas taking the same record over at once meet at the session's lease: one runs, the
other replays. A turn failing on something another try may heal (the store down) keeps its
record and is tried again, at most `attempts` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chatrun.errors import ChatrunError
from chatrun.server.channels.base import Inbound, InboundFile
from chatrun.store.record import known_fields

if TYPE_CHECKING:
    from chatrun.server.sessions import SessionRegistry

log = logging.getLogger("chatrun.channels")
PREFIX = "channel-in:"


@dataclass(frozen=True)
class AckedSettings:
    """How long a runner's hold lasts without renewal, and how often a record is tried."""

    ttl: float = 10.0  # seconds (renewed every ttl/3 while the turn runs; looked at every ttl/2)
    attempts: int = 10  # tries of a turn that fails on something another try may heal

    @classmethod
    def from_env(cls) -> AckedSettings:
        """$CHATRUN_CHANNEL_HOLD (seconds) over the default ttl."""
        text = os.environ.get("CHATRUN_CHANNEL_HOLD")
        if not text:
            return cls()
        try:
            ttl = float(text)
        except ValueError:
            raise ChatrunError(f"$CHATRUN_CHANNEL_HOLD must be a number of seconds, not {text!r}") from None
        if ttl <= 0:
            raise ChatrunError(f"$CHATRUN_CHANNEL_HOLD must be more than 0 seconds, not {text!r}")
        return cls(ttl=ttl)


def key_of(bot: str, kind: str, inbound: Inbound) -> str:
    return f"{PREFIX}{bot}:{kind}:{inbound.delivery}"


def saved(inbound: Inbound) -> dict[str, Any]:
    """The message as JSON (its files as their handles: fetched by whoever runs the turn)."""
    return dataclasses.asdict(inbound)


def restored(data: dict[str, Any]) -> Inbound:
    """The message a record keeps. Fields a newer chatrun's replica wrote (a rolling deploy) are
    left out: a TypeError here stopped this replica's recovery at the record, every time."""
    files = tuple(InboundFile(**known_fields(InboundFile, f)) for f in data.get("files") or ())
    return Inbound(**{**known_fields(Inbound, data), "files": files})


# Runs one user message's turn: (bot, kind, inbound) -> None; raises when another try may heal it.
Handler = Callable[[str, str, Inbound], Awaitable[None]]


class AckedDeliveries:
    """One replica's side of the records: writing them, holding them while their turn runs,
    and taking over those whose runner died."""

    def __init__(self, settings: AckedSettings | None = None):
        self.settings = settings or AckedSettings.from_env()
        self.running: dict[str, asyncio.Future[None]] = {}  # record key -> its turn, in this replica

    async def record(self, registry: SessionRegistry, bot: str, kind: str, inbound: Inbound) -> bool:
        """Write the message's record before the platform gets its answer; False when it is
        there already (the platform sent the delivery again: its runner, or a replica taking
        over from a dead one, answers it)."""
        record = {"inbound": saved(inbound), "until": time.time() + self.settings.ttl, "attempts": 0}
        return bool(await registry.store.claim_record(key_of(bot, kind, inbound), record))

    async def run(self, registry: SessionRegistry, handler: Handler, bot: str, kind: str, inbound: Inbound,
                  attempts: int = 0) -> None:
        """The message's turn, holding its record while it runs; the record is deleted once the
        turn is done, kept (for another try) when it failed on something another try may heal."""
        key, store = key_of(bot, kind, inbound), registry.store
        holding = asyncio.ensure_future(self._hold(registry, key, inbound, attempts + 1))
        try:
            await handler(bot, kind, inbound)
        except Exception as exc:
            if attempts + 1 < self.settings.attempts:
                raise  # the record stays: tried again once its hold runs out
            log.error("channel %s of bot %s: delivery %s given up after %d tries: %s", kind, bot,
                      inbound.delivery, attempts + 1, exc)
        finally:  # (cancelled too: the app stops, the turn rolls back, another replica takes it over)
            holding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holding  # no renewal may land after the deletion
        await store.delete_record(key)

    async def _hold(self, registry: SessionRegistry, key: str, inbound: Inbound, attempts: int) -> None:
        ttl = self.settings.ttl
        while True:
            try:
                await registry.store.put_record(key, {"inbound": saved(inbound),
                                                      "until": time.time() + ttl, "attempts": attempts})
            except Exception as exc:  # the store is down for a moment: the turn goes on (it needs the store too)
                log.warning("channels: could not renew the hold on %s: %s", key, exc)
            await asyncio.sleep(ttl / 3)

    async def recover_forever(self, registry: SessionRegistry, handler: Handler) -> None:
        while True:
            try:
                await self.recover_once(registry, handler)
            except asyncio.CancelledError:
                raise
            except Exception:  # the store is down for a moment: look again later, never die
                log.exception("channels: could not look at the acknowledged deliveries")
            await asyncio.sleep(self.settings.ttl / 2)

    async def recover_once(self, registry: SessionRegistry, handler: Handler) -> int:
        """Start the turns of the records whose runner's hold ran out; how many were started."""
        store, now, started = registry.store, time.time(), 0
        for key in await store.record_keys(PREFIX):
            if key in self.running:
                continue
            found = await store.get_record(key)
            parts = key[len(PREFIX):].split(":", 2)
            if found is None or float(found.get("until") or 0) > now or len(parts) != 3 \
                    or parts[0] not in registry.bots:
                continue  # held by its runner, or a bot this replica does not serve
            inbound = restored(found["inbound"])
            log.warning("channel %s of bot %s: delivery %s was acknowledged by a replica that stopped before "
                        "its turn was done; running it here", parts[1], parts[0], inbound.delivery)
            task = asyncio.ensure_future(self.run(registry, handler, parts[0], parts[1], inbound,
                                                  int(found.get("attempts") or 0)))
            self.running[key] = task
            task.add_done_callback(functools.partial(self._finished, key))
            started += 1
        return started

    def _finished(self, key: str, task: asyncio.Future[Any]) -> None:
        self.running.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("channel delivery %s failed (tried again later): %s", key, task.exception())
