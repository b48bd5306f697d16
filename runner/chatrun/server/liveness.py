"""Whether the server process that holds a `/v1` request's claim is still alive.

Each server process is one incarnation (a random id, `Liveness.incarnation`; on a local store,
one per store it opened). A `/v1` request's
claim of its outcome (openai_sessions.TurnIndex.claim_or_outcome) names the incarnation that runs
its attempt, so a retry waiting for that attempt can tell a dead one from a slow one:

- on a local store (SQLite, memory://: one process) a claim of another incarnation was left by an
  earlier process (the server restarted after a crash): it is abandoned at once;
- on a shared store (Redis, PostgreSQL) each incarnation holds a lease of its own from its start
  to its stop (the store's session leases: renewed every ttl/3, `--lease-ttl`). A claim whose
  incarnation's lease another replica can take was left by a replica that died (or lost the store
  for longer than the TTL, so its session leases and its commit are gone too): abandoned. An
  attempt that is alive, however slow its model, keeps its replica's lease: never judged dead.

The incarnation's own claims are alive (it runs them). A claim that names no incarnation (written
by an older chatrun) is judged by its age (openai_sessions.REPLAY_WAIT).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from typing import Any

from chatrun.errors import SessionBusy
from chatrun.store.aio import AsyncStore
from chatrun.store.lease import Lease, LeaseSettings

log = logging.getLogger("chatrun.server.liveness")

# A local store's incarnation, by the store it wraps: the apps of one process that share a store
# object (tests, a program serving two apps) are one incarnation; a restarted server opens it anew.
_LOCAL: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _local_incarnation(store: AsyncStore) -> str:
    underlying = getattr(store, "sync", None) or store
    try:
        return _LOCAL.setdefault(underlying, secrets.token_hex(8))
    except TypeError:  # not weakly referenceable: an incarnation of its own
        return secrets.token_hex(8)


# The lease an incarnation holds on a shared store, + its id: never a session's (a session id has no '/').
REPLICA_LEASE = "chatrun/replica/"


class Liveness:
    """This process's incarnation, its lease on a shared store, and the test of another's."""

    def __init__(self, store: AsyncStore, settings: LeaseSettings):
        self.store, self.settings = store, settings
        self.incarnation = secrets.token_hex(8) if store.distributed else _local_incarnation(store)
        self._holder: asyncio.Task[None] | None = None
        self._taking: asyncio.Future[Lease] | None = None

    async def start(self) -> None:
        """On a shared store: take this incarnation's lease (before the first claim names it: the
        app's start takes it, else the first claim) and keep it until `stop`. At once when taken."""
        if self._holder is not None or not self.store.distributed:
            return
        if self._taking is None:
            self._taking = asyncio.ensure_future(self._take())
        taking = self._taking
        try:
            lease = await asyncio.shield(taking)
        except BaseException:
            if taking.done() and self._taking is taking:  # it failed: the next claim tries again
                self._taking = None
            raise
        if self._holder is None:
            self._holder = asyncio.ensure_future(self._keep(lease))

    async def stop(self) -> None:
        holder, self._holder, self._taking = self._holder, None, None
        if holder is not None:
            holder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holder

    async def alive(self, claim: dict[str, Any]) -> bool | None:
        """Whether the incarnation named by a running `claim` is alive; None when it names none."""
        by = claim.get("by")
        if not isinstance(by, str):
            return None
        if by == self.incarnation:
            return True
        if not self.store.distributed:
            return False  # one process at a time on a local store: an earlier one's
        try:
            lease = await self.store.acquire(REPLICA_LEASE + by, 0.0, reject=True)
        except SessionBusy:
            return True  # its replica holds it
        await self.store.release(lease)  # nobody did: its replica is gone
        return False

    async def _take(self) -> Lease:
        return await self.store.acquire(REPLICA_LEASE + self.incarnation, self.settings.wait)

    async def _keep(self, lease: Lease) -> None:
        """Hold the lease (the store renews it) until cancelled; taken again if it slipped away."""
        try:
            while True:
                if lease.renewer is not None:
                    await asyncio.shield(lease.renewer)  # returns when the lease was lost
                else:
                    await asyncio.Event().wait()
                log.warning("incarnation %s lost its lease: taking it again", self.incarnation)
                lease = await self._retake()
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(lease))
            raise

    async def _retake(self) -> Lease:
        while True:
            try:
                return await self._take()
            except Exception as exc:  # the store unreachable, or a replica testing it holds it a moment
                log.warning("incarnation %s could not take its lease again: %s", self.incarnation, exc)
                await asyncio.sleep(self.settings.ttl / 3)
