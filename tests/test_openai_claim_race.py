"""Two retries of one `/v1` request taking over the same dead claim at once run its turn once
(docs/openai-api.md, "Retries run a turn once"): the real openai SDK, a real server on loopback,
a real SQLite store, and a side-effecting `http:` tool (`effect: once`) whose calls a local
receiver counts. The store is slowed at one place only, so that the race happens however fast
the machine is: both retries read the dead claim before either takes it over, and the second
taker's write lands after the first one's claim (as a network delay or a paused process would
make it). The compare-and-swap on each store: tests/test_claim_takeover.py."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

import chatrun
from chat_support import call
from chatrun.server import create_app
from chatrun.server.openai_sessions import TurnIndex
from chatrun.store import open_store
from chatrun.store.aio import as_async_store
from server_support import ThreadServer
from test_openai_exactly_once import BOT
from webhook_support import Receiver

DEAD = {"running": True, "at": 1.5, "by": "0123456789abcdef"}  # a crashed process's incarnation


def _slowed(store: Any, key: str) -> Any:
    """`store`, its reads of the dead claim under `key` held until two readers met (the two
    retries read it at once), and its second take-over of `key` held until the first taker's
    claim is in (the second retry is slower to act on what it read)."""
    met = asyncio.Barrier(2)
    claimed = asyncio.Event()
    takeovers = 0
    get_record, claim_record = store.get_record, store.claim_record
    delete_record, swap_record = store.delete_record, getattr(store, "swap_record", None)

    async def read(k: str) -> Any:
        record = await get_record(k)
        if k == key and record == DEAD:
            await asyncio.wait_for(met.wait(), 30)
        return record

    async def claim(k: str, record: Any) -> bool:
        done: bool = await claim_record(k, record)
        if k == key and done:
            claimed.set()
        return done

    async def take_over(k: str, write: Any, *args: Any) -> Any:
        nonlocal takeovers
        if k == key:
            takeovers += 1
            if takeovers == 2:
                await asyncio.wait_for(claimed.wait(), 30)
        done = await write(k, *args)
        if k == key and done and args and args[-1] is not None:
            claimed.set()
        return done

    store.get_record = read
    store.claim_record = claim
    store.delete_record = lambda k: take_over(k, delete_record)
    if swap_record is not None:
        store.swap_record = lambda k, expected, record: take_over(k, swap_record, expected, record)
    return store


@pytest.mark.slow  # a server on loopback
def test_two_retries_taking_over_one_dead_claim_at_once_run_the_turn_once(fake, write_bot, tmp_path):
    # Enough answers for two turns: were both retries to run, the order would be placed twice.
    fake.queue(call("place_order", item="tea"), {"text": "Ordered: tea."},
               call("place_order", item="tea"), {"text": "Ordered: tea."})
    key = TurnIndex.request_key("shop", None, ["idempotency-key", "order-9"])
    store = as_async_store(open_store(f"sqlite:///{tmp_path / 'chatrun.db'}"))
    asyncio.run(store.put_record(key, DEAD))  # the claim a server killed mid-turn left
    with Receiver() as receiver:
        bot = chatrun.load_bot(write_bot(BOT.replace("RECEIVER", receiver.url)))
        with ThreadServer(create_app([bot], store=_slowed(store, key))) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=60, max_retries=0,
                                   http_client=httpx.Client())

            def retry(_: int) -> Any:
                return client.chat.completions.create(
                    model="shop", messages=[{"role": "user", "content": "tea please"}],
                    extra_headers={"Idempotency-Key": "order-9"})

            began = time.monotonic()
            with ThreadPoolExecutor(2) as pool:
                replies = list(pool.map(retry, range(2)))
        assert len(receiver.seen()) == 1  # one turn ran: the order was placed once
    assert time.monotonic() - began < 30  # the dead claim was taken over at once, not waited out
    assert sorted(r.model_extra["chatrun"]["how"] for r in replies) == ["new", "replayed"]
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content == "Ordered: tea."
    assert replies[0].model_extra["chatrun"]["session"] == replies[1].model_extra["chatrun"]["session"]
