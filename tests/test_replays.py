"""Stop 58: what refuses a replay once the records that dedupe it are gone (store/replays.py),
on every store (a real SQLite file, a real redis-server, a real PostgreSQL): a deleted session
leaves its recent request ids behind as hashed marks (nothing else), the retention pass lets
them go past their window, and a claim is made once across two store objects on one store (as
two replicas)."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

from chatrun.store import replays
from chatrun.store.aio import open_async_store
from chatrun.store.record import Commit, committed_turn
from chatrun.store.retention import delete_stored, purge
from chatrun.store.versions import CREATE
from store_params import STORES, store_url


@pytest.fixture(params=STORES)
def url(request, tmp_path):
    return store_url(request, tmp_path)


async def ran(store, session_id, request_ids, at):
    """A channel session that ran one turn per request id, the last committed at `at`."""
    version = CREATE
    for n, request_id in enumerate(request_ids, 1):
        entry = {"turn": n, "ok": True, "input": f"message {n} of ana", "at": at}
        commit = Commit.encode(session_id, {"bot": "shop", "turn": n, "scopes": [], "meta": {"owner": "whatsapp:ana"}},
                               {}, [entry], expected=version, outcome=(request_id, entry),
                               committed=committed_turn(entry, request_id))
        version = await store.commit_turn(commit, None)


def test_a_deleted_sessions_recent_deliveries_stay_refused_for_the_window_then_go(url):
    async def go():
        store = open_async_store(url)
        try:
            now = time.time()
            await ran(store, "ch-recent", ["whatsapp:wamid.A1", "whatsapp:wamid.A2"], now - 60)
            await ran(store, "ch-stale", ["whatsapp:wamid.OLD"], now - replays.WINDOW - 60)
            assert sorted(await store.request_ids("ch-recent")) == ["whatsapp:wamid.A1", "whatsapp:wamid.A2"]
            await delete_stored(store, None, "ch-recent")
            await delete_stored(store, None, "ch-stale")
            assert await store.load_session("ch-recent") is None and await store.request_ids("ch-recent") == []
            assert await replays.seen(store, "whatsapp:wamid.A1", now)
            assert await replays.seen(store, "whatsapp:wamid.A2", now)
            assert not await replays.seen(store, "whatsapp:wamid.OLD", now)  # refused by its age already
            assert not await replays.seen(store, "whatsapp:wamid.A3", now)
            # Only the hash is kept: no delivery id, no text, no user.
            keys = await store.record_keys(replays.PREFIX)
            assert sorted(keys) == sorted(replays.PREFIX + hashlib.sha256(r.encode()).hexdigest()
                                          for r in ("whatsapp:wamid.A1", "whatsapp:wamid.A2"))
            assert [await store.get_record(k) for k in keys] == [{"until": pytest.approx(now + replays.WINDOW, abs=5)}] * 2
            # The retention pass lets them go once past the window, not before: each pass looks
            # at the marks whose hash starts with its minute's two hex digits (one of 256).
            for key in keys:
                minute = int(key[len(replays.PREFIX):][:2], 16)
                before = (now + replays.WINDOW) // 15360 * 15360 + minute * 60  # (256 minutes: 15360 s)
                before -= 15360 if before >= now + replays.WINDOW else 0
                assert replays.part_of(before) == key[len(replays.PREFIX):][:2]
                await purge(store, {}, before, delete=None, blobs=None)  # type: ignore[arg-type]
                assert key in await store.record_keys(replays.PREFIX)
                await purge(store, {}, before + 15360, delete=None, blobs=None)  # type: ignore[arg-type]
                assert key not in await store.record_keys(replays.PREFIX)
            assert await store.record_keys(replays.PREFIX) == []
        finally:
            await store.close()

    asyncio.run(go())


def test_a_call_is_claimed_once_across_replicas_and_a_new_call_is_not_blocked(url):
    async def go():
        one, two = open_async_store(url), open_async_store(url)
        try:
            until = time.time() + replays.CALL_CLAIM_AGE
            first = await asyncio.gather(replays.claim(one, "twilio-call:phone:CA1", until),
                                         replays.claim(two, "twilio-call:phone:CA1", until))
            assert sorted(first) == [False, True]
            assert not await replays.claim(one, "twilio-call:phone:CA1", until)
            assert await replays.claim(two, "twilio-call:phone:CA2", until)
        finally:
            await one.close()
            await two.close()

    asyncio.run(go())
