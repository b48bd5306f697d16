"""Whether a `/v1` retry waits for the claim of its request's first attempt (docs/openai-api.md,
"Retries run a turn once"; server/liveness.py), on a real SQLite store: a claim of this process
is waited for and never taken over; one of an earlier process (a server restarted after a crash)
is taken over at once; one that names no process (an older chatrun's) by its age. The replicas
on Redis and PostgreSQL: tests/test_idempotency_replicas.py."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from chatrun.server import openai_sessions, wire
from chatrun.server.liveness import Liveness
from chatrun.server.openai_sessions import TurnIndex
from chatrun.store import open_store
from chatrun.store.aio import as_async_store
from chatrun.store.lease import LeaseSettings

KEY = "openai:request:abc"


def _index(tmp_path) -> TurnIndex:
    store = as_async_store(open_store(f"sqlite:///{tmp_path / 'chatrun.db'}"))
    return TurnIndex(SimpleNamespace(store=store, liveness=Liveness(store, LeaseSettings())))  # type: ignore[arg-type]


def _claim(index: TurnIndex, **claim: Any) -> None:
    asyncio.run(index.records.put_record(KEY, {"running": True, "at": time.time()} | claim))


def _retry(index: TurnIndex) -> dict[str, Any] | None:
    """A retry's look for the outcome of KEY's request: None when it holds the claim (it runs)."""

    async def retry() -> dict[str, Any] | None:
        return await index.claim_or_outcome(await index.claim(KEY))

    return asyncio.run(retry())


def test_a_claim_of_an_earlier_process_on_sqlite_is_taken_over_at_once(tmp_path):
    index = _index(tmp_path)
    _claim(index, by="0123456789abcdef")  # the incarnation of a server that was killed
    began = time.monotonic()
    assert _retry(index) is None  # this attempt holds the claim: it runs
    assert time.monotonic() - began < openai_sessions.REPLAY_WAIT / 10
    claim = asyncio.run(index.records.get_record(KEY))
    assert claim is not None and claim["by"] == index.registry.liveness.incarnation


def test_a_claim_of_this_process_is_waited_for_and_never_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(openai_sessions, "REPLAY_WAIT", 0.5)
    index = _index(tmp_path)
    _claim(index, by=index.registry.liveness.incarnation, at=time.time() - 3600)  # alive, however old
    with pytest.raises(wire.RequestFailed) as failed:
        _retry(index)
    assert failed.value.reason == wire.CONFLICT and "still running" in failed.value.message
    assert asyncio.run(index.records.get_record(KEY))["by"] == index.registry.liveness.incarnation


def test_a_claim_that_names_no_process_is_judged_by_its_age(tmp_path, monkeypatch):
    monkeypatch.setattr(openai_sessions, "REPLAY_WAIT", 0.5)
    index = _index(tmp_path)
    _claim(index, at=time.time() - 3600)  # an older chatrun's claim, older than REPLAY_WAIT
    assert _retry(index) is None


def test_the_apps_of_one_process_on_one_local_store_are_one_incarnation(tmp_path):
    """Two apps in one process sharing a store object: neither takes over the other's claims."""
    first = _index(tmp_path)
    second = Liveness(first.records, LeaseSettings())
    assert asyncio.run(second.alive({"running": True, "by": first.registry.liveness.incarnation})) is True
    restarted = Liveness(as_async_store(open_store(f"sqlite:///{tmp_path / 'chatrun.db'}")), LeaseSettings())
    assert asyncio.run(restarted.alive({"running": True, "by": first.registry.liveness.incarnation})) is False


def test_an_attempt_releases_its_own_claim_never_the_claim_of_one_that_took_over_since(tmp_path):
    index = _index(tmp_path)

    async def check() -> None:
        first = await index.claim(KEY)
        assert await index.claim_or_outcome(first) is None  # the first attempt holds the key
        taker = await index.claim(KEY)  # judged dead meanwhile, its claim taken over by a retry
        assert await index.records.swap_record(KEY, first.record, taker.record) is True
        await index.release(first)  # the first attempt fails late: the taker's claim stays
        assert await index.records.get_record(KEY) == taker.record
        await index.release(taker)
        assert await index.records.get_record(KEY) is None

    asyncio.run(check())
