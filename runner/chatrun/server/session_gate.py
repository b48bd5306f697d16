"""One request at a time per session, in arrival order.

In one process an asyncio.Lock per session (its cache slot's) orders the requests; on a
shared store (Redis) the session's lease does, across replicas (chatrun.store.redis), and
the lock only guards the live copy in this process. A request that finds the session busy
waits in that FIFO queue up to `LeaseSettings.wait` seconds, or, with the `reject` if-busy
policy, fails at once. While the server drains (SIGTERM) new requests are refused. The gate
counts the requests waiting and holding a session (the metrics and /health read them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

from chatrun.server import wire
from chatrun.store.aio import AsyncStore, Lease, LeaseSettings
from chatrun.store.versions import SessionBusy

QUEUE = "queue"  # if busy: wait in the session's FIFO queue (the default)
REJECT = "reject"  # if busy: fail at once with TooManyRequests
IF_BUSY = (QUEUE, REJECT)

log = logging.getLogger("chatrun.server")


class SessionGate:
    def __init__(self, store: AsyncStore, lease: LeaseSettings, if_busy: str = QUEUE):
        self.store = store
        self.lease = lease
        self.if_busy = if_busy  # the default policy; a request may override it
        self.draining = False  # set on SIGTERM: new requests are refused, running ones finish
        self.active = 0  # requests holding a session
        self.waiting = 0  # requests queued for a session

    def policy(self, if_busy: str | None) -> str:
        """The request's if-busy policy (its own, else the server's); RequestFailed if unknown."""
        policy = if_busy or self.if_busy
        if policy not in IF_BUSY:
            raise wire.RequestFailed(wire.BAD_REQUEST, f"ifBusy must be one of {', '.join(IF_BUSY)}, not {policy!r}")
        return policy

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise wire.RequestFailed(
                wire.UNAVAILABLE, "the server is shutting down; send the request again (another replica will serve it)"
            )

    @asynccontextmanager
    async def through(self, lock: asyncio.Lock, session_id: str, policy: str,
                      waited: Callable[[float], None] | None = None) -> AsyncIterator[Lease]:
        """Hold the session (its `lock` in this process and its lease) for the block; `waited`
        hears how long the request queued. Raises RequestFailed (busy, draining, store failing)."""
        lease = await self.enter(lock, session_id, policy, waited)
        try:
            yield lease
        finally:
            await self.leave(lock, lease)

    async def enter(self, lock: asyncio.Lock, session_id: str, policy: str,
                    waited: Callable[[float], None] | None = None) -> Lease:
        """`through`'s entry (for a holder that is not a context manager: sessions.py's
        Holding); `leave` ends what it returned. Raises RequestFailed as `through` does."""
        self.waiting += 1
        entered = False
        lease: Lease | None = None
        asked = time.monotonic()
        try:
            lease = await self._enter_or_fail(lock, session_id, policy)
            if waited is not None:
                waited(time.monotonic() - asked)
            self.waiting, self.active, entered = self.waiting - 1, self.active + 1, True
            self.refuse_if_draining()
            return lease
        except BaseException:
            if entered:
                self.active -= 1
                lock.release()
            else:
                self.waiting -= 1
            if lease is not None:
                await self.release(lease)
            raise

    async def leave(self, lock: asyncio.Lock, lease: Lease) -> None:
        """The end of a hold `enter` began: the lock, then the lease, given back."""
        self.active -= 1
        lock.release()
        await self.release(lease)

    async def _enter_or_fail(self, lock: asyncio.Lock, session_id: str, policy: str) -> Lease:
        try:
            return await self._enter(lock, session_id, policy)
        except (wire.RequestFailed, asyncio.CancelledError):
            raise
        except Exception as exc:  # the store is unreachable or failing: say so, as a request failure
            log.warning("store %s failed for session %s: %s", self.store.url, session_id, exc)
            raise wire.RequestFailed(
                wire.SERVER_ERROR, f"session {session_id}: the store failed ({type(exc).__name__}: {exc})"
            ) from None

    async def _enter(self, lock: asyncio.Lock, session_id: str, policy: str) -> Lease:
        """Wait for the session: its lease (FIFO across replicas) and this process's lock."""
        wait = self.lease.wait
        if policy == REJECT and lock.locked():
            raise busy(f"session {session_id} is running a turn (if busy: reject); send again when it completes")
        if self.store.distributed:
            try:
                lease = await self.store.acquire(session_id, wait, policy == REJECT, lambda: self.draining)
            except SessionBusy as exc:
                self.refuse_if_draining()
                raise busy(str(exc)) from None
            try:  # the lease orders requests; this lock only guards the live copy in this process
                await lock.acquire()
            except BaseException:
                await self.release(lease)
                raise
            return lease
        if taken_at_once(lock):
            # No timer for a lock acquire() takes without waiting (the usual case): a timer costs a
            # turn some 36,000 instructions (a handle scheduled, cancelled, then popped), and
            # it could not fire, as nothing waits (bench/README.md, "The HTTP turn, third pass").
            await lock.acquire()
        else:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the acquire in a task
                # of its own, one per request; a timeout is only a timer.
                async with asyncio.timeout(wait):
                    await lock.acquire()
            except TimeoutError:
                raise busy(f"session {session_id} stayed busy for {wait:g} s; try again later") from None
        try:
            return await self.store.acquire(session_id, wait)
        except BaseException:
            lock.release()
            raise

    async def release(self, lease: Lease) -> None:
        try:
            if self.store.distributed:  # giving a lease back may wait on the store: a cancel must not stop it
                await asyncio.shield(self.store.release(lease))
            else:  # a lease of this process only: nothing to give back, nothing to shield (shield costs a task)
                await self.store.release(lease)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the lease expires on its own
            log.warning("could not release the lease on session %s: %s", lease.session_id, exc)


def taken_at_once(lock: asyncio.Lock) -> bool:
    """Whether `lock.acquire()` would take the lock without waiting: asyncio.Lock's own test
    (unlocked, and no earlier request still waiting for it; tests/test_session_gate.py holds
    this to what acquire does)."""
    if not hasattr(lock, "_waiters"):  # a Python whose Lock keeps its queue elsewhere: wait under the timer
        return False
    waiters: Iterable[asyncio.Future[None]] | None = lock._waiters
    return not lock.locked() and (not waiters or all(waiter.cancelled() for waiter in waiters))


def busy(message: str) -> wire.RequestFailed:
    return wire.RequestFailed(wire.TOO_MANY_REQUESTS, message)
