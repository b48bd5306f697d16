"""The session gate's queue timeout (`--queue-timeout`) on a store of this process."""

from __future__ import annotations

import asyncio

import pytest

from chatrun.server import wire
from chatrun.server.session_gate import QUEUE, SessionGate
from chatrun.store.aio import open_async_store
from chatrun.store.lease import LeaseSettings


def test_queue_timeout_zero_takes_a_free_session_and_refuses_a_busy_one() -> None:
    """--queue-timeout 0: a free session is served (asyncio.wait_for with 0 timed out even on a
    free lock), a busy one is refused at once with TooManyRequests."""

    async def scenario() -> tuple[bool, str]:
        store = open_async_store("memory://")
        gate = SessionGate(store, LeaseSettings(wait=0))
        lock = asyncio.Lock()
        async with gate.through(lock, "s1", QUEUE) as lease:
            entered = lease.session_id == "s1" and lock.locked()
            with pytest.raises(wire.RequestFailed) as refused:
                async with gate.through(lock, "s1", QUEUE):
                    pass
        assert not lock.locked() and gate.active == 0 and gate.waiting == 0
        return entered, refused.value.reason

    entered, reason = asyncio.run(scenario())
    assert entered
    assert reason == wire.TOO_MANY_REQUESTS
