"""A SQLite (or a user's own) store's calls run in one thread of their own (store/local.py
StoreThread): in the order they come, never on the event loop, their errors raised to the caller,
a call whose caller left before it started not run at all."""

from __future__ import annotations

import asyncio
import threading

import pytest

from chatrun.store.aio import as_async_store
from chatrun.store.sqlite import SQLiteStore


class GatedStore(SQLiteStore):
    """A SQLite store whose version reads wait for `gate` and say which thread ran them."""

    def __init__(self, path):
        super().__init__(path)
        self.gate = threading.Event()
        self.ran: list[tuple[str, str]] = []

    def version(self, session_id):
        self.gate.wait(30)
        self.ran.append((session_id, threading.current_thread().name))
        if session_id == "broken":
            raise ValueError("the disk said no")
        return super().version(session_id)


def test_store_calls_run_in_order_off_the_loop_and_a_left_call_is_skipped(tmp_path):
    sync = GatedStore(tmp_path / "s.db")
    store = as_async_store(sync)

    async def scenario():
        first = asyncio.ensure_future(store.version("a"))
        left = asyncio.ensure_future(store.version("left"))
        broken = asyncio.ensure_future(store.version("broken"))
        last = asyncio.ensure_future(store.version("b"))
        await asyncio.sleep(0)  # all four queued behind the gate; the loop is free meanwhile
        left.cancel()
        sync.gate.set()
        assert await first is None and await last is None
        with pytest.raises(ValueError, match="the disk said no"):
            await broken
        assert left.cancelled()
        await store.close()

    asyncio.run(scenario())
    assert [who for who, _ in sync.ran] == ["a", "broken", "b"]
    assert {thread for _, thread in sync.ran} == {"chatrun-store"}
