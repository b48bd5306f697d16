"""Two retries of one `/v1` request taking over the same dead claim at once run its turn once
(docs/openai-api.md, "Retries run a turn once"): the real openai SDK, a real server on loopback
and a real SQLite store, and again two replicas (each retry sent to another) sharing a real Redis
and a real PostgreSQL, and a side-effecting `http:` tool (`effect: once`) whose calls a local
receiver counts. The store is slowed at one place only, so that the race happens however fast
the machine is: both retries read the dead claim before either takes it over, and the second
taker's write lands after the first one's claim (as a network delay or a paused process would
make it). The compare-and-swap on each store: tests/test_claim_takeover.py."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

import chatrun
from chat_support import call
from chatrun.server import create_app
from chatrun.server.liveness import REPLICA_LEASE
from chatrun.server.openai_sessions import TurnIndex
from chatrun.store import open_store
from chatrun.store.aio import as_async_store, open_async_store
from server_support import ThreadServer
from store_params import DISTRIBUTED, store_url
from test_openai_exactly_once import BOT
from webhook_support import Receiver

DEAD = {"running": True, "at": 1.5, "by": "0123456789abcdef"}  # a crashed process's incarnation


class Race:
    """Two retries' race over the dead claim under `key`, made to happen however fast the machine
    is: each store `slowed` by it holds its reads of the dead claim until two readers met (the two
    retries read it at once), and the second take-over of `key` until the first taker's claim is
    in (the second retry is slower to act on what it read). The stores may be one replica's or
    two replicas' (their own connections, their own event loops): the meeting is across threads.
    On a shared store a replica judges the claim dead by taking (and at once releasing) the dead
    incarnation's lease (server/liveness.py): two replicas judging at the same instant would see
    each other's hold and one take it for alive, so the two judgements are made one after the
    other, and both retries go on to take the claim over, as two judging a moment apart do."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.met = threading.Barrier(2)
        self.claimed = threading.Event()
        self.takeovers = 0
        self.lock = threading.Lock()
        self.judging = threading.Lock()  # held from a take of the dead incarnation's lease to its release

    def slowed(self, store: Any) -> Any:
        get_record, claim_record = store.get_record, store.claim_record
        delete_record, swap_record = store.delete_record, getattr(store, "swap_record", None)
        acquire, release = store.acquire, store.release

        async def judge(key: str, *args: Any, **kwargs: Any) -> Any:
            if key != REPLICA_LEASE + DEAD["by"]:
                return await acquire(key, *args, **kwargs)
            await asyncio.to_thread(self.judging.acquire, True, 30)
            try:
                return await acquire(key, *args, **kwargs)
            except BaseException:
                self.judging.release()
                raise

        async def judged(lease: Any) -> None:
            await release(lease)
            if lease.session_id == REPLICA_LEASE + DEAD["by"]:
                self.judging.release()

        async def read(k: str) -> Any:
            record = await get_record(k)
            if k == self.key and record == DEAD:
                await asyncio.to_thread(self.met.wait, 30)
            return record

        async def claim(k: str, record: Any) -> bool:
            done: bool = await claim_record(k, record)
            if k == self.key and done:
                self.claimed.set()
            return done

        store.get_record = read
        store.claim_record = claim
        store.acquire, store.release = judge, judged
        store.delete_record = lambda k: self._take_over(k, delete_record)
        if swap_record is not None:
            store.swap_record = lambda k, expected, record: self._take_over(k, swap_record, expected, record)
        return store

    async def _take_over(self, k: str, write: Any, *args: Any) -> Any:
        if k == self.key:
            with self.lock:
                self.takeovers += 1
                second = self.takeovers == 2
            if second:
                await asyncio.to_thread(self.claimed.wait, 30)
        done = await write(k, *args)
        if k == self.key and done and args and args[-1] is not None:
            self.claimed.set()
        return done


def _retry(url: str) -> Any:
    """The retry of one order, through the real openai client."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=60, max_retries=0, http_client=httpx.Client())
    return client.chat.completions.create(
        model="shop", messages=[{"role": "user", "content": "tea please"}],
        extra_headers={"Idempotency-Key": "order-9"})


def _check_once(race: Race, receiver: Receiver, replies: list[Any], began: float) -> None:
    assert race.takeovers == 2  # both retries took the dead claim over ...
    assert len(receiver.seen()) == 1  # ... and one turn ran: the order was placed once
    assert time.monotonic() - began < 30  # the dead claim was taken over at once, not waited out
    assert sorted(r.model_extra["chatrun"]["how"] for r in replies) == ["new", "replayed"]
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content == "Ordered: tea."
    assert replies[0].model_extra["chatrun"]["session"] == replies[1].model_extra["chatrun"]["session"]


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
        race = Race(key)
        with ThreadServer(create_app([bot], store=race.slowed(store))) as server:
            began = time.monotonic()
            with ThreadPoolExecutor(2) as pool:
                replies = list(pool.map(_retry, [server.url] * 2))
        _check_once(race, receiver, replies, began)


@pytest.fixture(params=DISTRIBUTED)
def shared_store(request, tmp_path):
    """An empty store two replicas share: a real Redis, a real PostgreSQL."""
    return store_url(request, tmp_path)


async def _leave_dead_claim(url: str, key: str) -> None:
    store = open_async_store(url)
    try:
        await store.put_record(key, DEAD)  # the claim a replica killed mid-turn left
    finally:
        await store.close()


@pytest.mark.slow  # servers on loopback, a redis-server / PostgreSQL
def test_two_retries_on_two_replicas_taking_over_one_dead_claim_at_once_run_the_turn_once(
        fake, write_bot, shared_store):
    """The same race with each retry sent to another replica: two apps, each with its own
    incarnation (its lease on the store) and its own connection to the shared store."""
    fake.queue(call("place_order", item="tea"), {"text": "Ordered: tea."},
               call("place_order", item="tea"), {"text": "Ordered: tea."})
    key = TurnIndex.request_key("shop", None, ["idempotency-key", "order-9"])
    asyncio.run(_leave_dead_claim(shared_store, key))
    race = Race(key)
    with Receiver() as receiver:
        bot = chatrun.load_bot(write_bot(BOT.replace("RECEIVER", receiver.url)))
        replicas = [ThreadServer(create_app([bot], store=race.slowed(open_async_store(shared_store))))
                    for _ in range(2)]
        with replicas[0], replicas[1]:
            began = time.monotonic()
            with ThreadPoolExecutor(2) as pool:
                replies = list(pool.map(_retry, [r.url for r in replicas]))
        _check_once(race, receiver, replies, began)
