"""Taking over a dead `/v1` attempt's claim is one compare-and-swap (docs/openai-api.md, "Retries
run a turn once"; chatrun.store.RecordSwaps): of two retries taking over the same claim at once,
exactly one holds the key and runs; the other waits for its outcome. A release drops the
attempt's own claim only. On every store: memory://, a real SQLite file, and (slow) a real Redis
and a real PostgreSQL (tests/store_params.py). The whole request over HTTP: tests/test_openai_claim_race.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from chatrun.server.openai_sessions import Claim
from chatrun.store.aio import open_async_store
from store_params import POSTGRES, REDIS, store_url

KEY = "openai:request:takeover"
DEAD = {"running": True, "at": 1.5, "by": "0123456789abcdef"}  # an incarnation that holds no lease


@pytest.fixture(params=["memory", "sqlite", REDIS, POSTGRES])
def url(request, tmp_path):
    return store_url(request, tmp_path)


def _claim(by: str) -> Claim:
    return Claim(KEY, {"running": True, "at": time.time(), "by": by, "id": by * 2})


async def _race(url: str) -> None:
    store = open_async_store(url)
    try:
        await store.put_record(KEY, DEAD)
        judged = await store.get_record(KEY)  # what both takers read, and judged dead
        assert judged == DEAD
        first, second = _claim("aaaa"), _claim("bbbb")
        won = await asyncio.gather(*(store.swap_record(KEY, judged, taker.record) for taker in (first, second)))
        assert sorted(won) == [False, True]  # exactly one took it over ...
        winner, loser = (first, second) if won[0] else (second, first)
        assert await store.get_record(KEY) == winner.record  # ... and its claim stands
        # The loser, taking it over again from what it read, changes nothing either.
        assert await store.swap_record(KEY, judged, loser.record) is False
        # A release is the attempt's own claim only: the loser's drops nothing, the winner's its claim.
        assert await store.swap_record(KEY, loser.record, None) is False
        assert await store.get_record(KEY) == winner.record
        assert await store.swap_record(KEY, winner.record, None) is True
        assert await store.get_record(KEY) is None
        assert KEY not in await store.record_keys("openai:request:")
        assert await store.swap_record(KEY, winner.record, None) is False  # nothing there: nothing to swap
        assert await store.claim_record(KEY, loser.record) is True  # released: the next attempt claims it
    finally:
        await store.close()


def test_of_two_takers_of_one_dead_claim_exactly_one_wins_and_a_release_drops_its_own_claim_only(url):
    asyncio.run(_race(url))


def test_a_claim_written_as_the_index_writes_it_is_the_claim_a_swap_compares(tmp_path):
    """The /v1 index writes a claim from its own text (openai_sessions._flat_text); a swap
    compares the stores' encoding of the claim read back: the two are the same text."""
    from chatrun.server.openai_sessions import _flat_text

    async def check() -> None:
        store = open_async_store(f"sqlite:///{tmp_path / 's.db'}")
        claim = Claim(KEY, {"running": True, "at": time.time(), "by": "c0ffee", "id": "0f" * 8})
        assert await store.put_record_text(KEY, _flat_text(claim.record))
        assert await store.swap_record(KEY, claim.record, None) is True
        await store.close()

    asyncio.run(check())
