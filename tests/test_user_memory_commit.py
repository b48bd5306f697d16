"""Issue 37: what a turn remembers of its user (`remember:` facts, the summary at the
conversation's end) is committed WITH the turn, in the same atomic write, on every store
(store/user_memory.py): a committed turn's facts are there, a refused one's (stale, its lease
lost, a failed turn) are not, and two sessions of one user committing at once lose neither's
facts. Through the server's store interface (chatrun.store.aio), on a real SQLite file, a real
redis-server and a real PostgreSQL (tests/store_params.py)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

import chatrun
from chatrun.store import user_memory
from chatrun.store.aio import LeaseSettings, open_async_store
from chatrun.store.memory import InMemoryStore
from chatrun.store.record import REMEMBERED_KEY, Commit, Remembered
from chatrun.store.sqlite import SQLiteStore
from chatrun.store.versions import CREATE, LeaseLost, StaleVersion
from store_params import DISTRIBUTED, STORES, store_url


@pytest.fixture(params=["memory", *STORES])
def url(request, tmp_path):
    return store_url(request, tmp_path)


@pytest.fixture(params=DISTRIBUTED)
def shared_url(request, tmp_path):
    return store_url(request, tmp_path)


def turn(session_id: str, n: int, facts: dict, expected: str = CREATE, ok: bool = True,
         principal: str = "ana") -> Commit:
    """A commit of turn `n` that remembered `facts` of `principal` (as engine/session.py writes it)."""
    entry = {"turn": n, "ok": ok, REMEMBERED_KEY: Remembered("concierge", principal, facts).to_dict()}
    commit = Commit.encode(session_id, {"turn": n, "meta": {"owner": principal}}, {}, [entry])
    commit.expected = expected
    return commit


async def facts(store, principal: str = "ana") -> dict:
    return user_memory.facts_of(await store.get_record(user_memory.user_memory_key("concierge", principal)),
                                None, 0)


def test_a_committed_turns_facts_land_with_it_and_a_refused_turns_do_not(url):
    async def go():
        store = open_async_store(url)
        v1 = await store.commit_turn(turn("s", 1, {"seat": "window"}), None)
        assert await facts(store) == {"seat": "window"}
        # The history keeps no copy: erasing the user's memory leaves none in a session.
        assert REMEMBERED_KEY not in (await store.load_history("s"))[0]
        # A stale copy's turn (another replica committed meanwhile): refused, and its facts with it.
        v2 = await store.commit_turn(turn("s", 2, {"meal": "veg"}, v1), None)
        with pytest.raises(StaleVersion):
            await store.commit_turn(turn("s", 2, {"seat": "aisle", "pet": "cat"}, v1), None)
        assert await facts(store) == {"seat": "window", "meal": "veg"}
        # A failed turn's entry (rolled back) remembers nothing, though its commit lands.
        v3 = await store.commit_turn(turn("s", 3, {"seat": "aisle"}, v2, ok=False), None)
        assert await facts(store) == {"seat": "window", "meal": "veg"}
        # A None forgets the fact; forgetting the last deletes the record.
        v4 = await store.commit_turn(turn("s", 4, {"meal": None}, v3), None)
        assert await facts(store) == {"seat": "window"}
        await store.commit_turn(turn("s", 5, {"seat": None}, v4), None)
        assert await store.get_record(user_memory.user_memory_key("concierge", "ana")) is None
        assert user_memory.user_memory_key("concierge", "ana") not in await store.record_keys("user-memory/")
        await store.close()

    asyncio.run(go())


def test_the_turns_of_one_request_commit_their_facts_together_in_order(url):
    async def go():
        store = open_async_store(url)
        commit = turn("s", 1, {"seat": "window", "meal": "veg"})
        commit.merge(turn("s", 2, {"seat": "aisle"}))
        await store.commit_turn(commit, None)
        assert await facts(store) == {"seat": "aisle", "meal": "veg"}
        await store.close()

    asyncio.run(go())


def test_sessions_of_one_user_committing_at_once_lose_no_fact(url):
    """The record is the user's, not a session's: each commit's read-modify-write of it is
    atomic with the commit (SQLite's transaction, Redis's compare-and-set, PostgreSQL's lock)."""
    async def go():
        first = open_async_store(url)  # two replicas' connections (memory:// is one process's store)
        stores = [first, first if url == "memory://" else open_async_store(url)]
        await asyncio.gather(*[stores[i % 2].commit_turn(turn(f"s{i}", 1, {f"fact{i}": i}), None)
                               for i in range(12)])
        assert await facts(stores[0]) == {f"fact{i}": i for i in range(12)}
        for store in set(stores):
            await store.close()

    asyncio.run(go())


def test_a_turn_whose_lease_was_lost_remembers_nothing(shared_url):
    async def go():
        store = open_async_store(shared_url, LeaseSettings(ttl=2.0))
        first = await store.acquire("s", wait=5)
        first.renewer.cancel()  # a replica that stopped renewing (paused, partitioned)
        version = await store.commit_turn(turn("s", 1, {"seat": "window"}), first)
        await asyncio.sleep(3.0)  # the lease expired...
        second = await store.acquire("s", wait=5)  # ...and another request took it
        with pytest.raises(LeaseLost):
            await store.commit_turn(turn("s", 2, {"seat": "aisle"}, version), first)
        assert await facts(store) == {"seat": "window"}
        await store.commit_turn(turn("s", 2, {"meal": "veg"}, version), second)
        assert await facts(store) == {"seat": "window", "meal": "veg"}
        await store.release(second)
        await store.close()

    asyncio.run(go())


# -- through a Session (the engine's hook) ----------------------------------------------------

BOT = """
name: concierge
format: 3
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
user_memory: {facts: [seat]}
routes:
  desk:
    default: true
    system: You are a concierge.
    tools: [note_seat]
tools:
  note_seat:
    description: Remember the seat the user prefers
    parameters: {type: object, properties: {seat: {type: string}}, required: [seat]}
    action:
      remember: {seat: "{{ args.seat }}"}
      reply: Noted for next time.
"""
ANA = {"name": "ana", "roles": []}


class FailingMemoryWrite(SQLiteStore):
    """A SQLite store whose write of the user's memory fails (a full disk, say), inside the commit."""

    def _remember(self, conn, commit):
        super()._remember(conn, commit)
        if commit.remembered:
            raise sqlite3.OperationalError("database or disk is full")


def remember_aisle(fake, write_bot, store):
    bot = chatrun.load_bot(write_bot(BOT))
    fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "aisle"}}]}, {"text": "Noted."})
    session = bot.session(store=store, principal=ANA, meta={"owner": "ana"})
    session.chat("Aisle, please")
    return session


def test_when_the_memory_write_fails_the_turn_does_not_commit_either(fake, write_bot, tmp_path):
    store = FailingMemoryWrite(tmp_path / "c.db")
    session = remember_aisle(fake, write_bot, store)
    assert session.turn_count == 0 and store.load_history(session.id)[-1]["ok"] is False
    assert "database or disk is full" in store.load_history(session.id)[-1]["error"]
    assert store.get_record(user_memory.user_memory_key("concierge", "ana")) is None


def test_a_store_of_ones_own_gets_the_facts_right_after_its_commit(fake, write_bot):
    class MyStore(InMemoryStore):
        commits_user_memory = False  # knows nothing of a commit's `remembered`

    store = MyStore()
    session = remember_aisle(fake, write_bot, store)
    assert session.turn_count == 1
    assert user_memory.facts_of(store.get_record(user_memory.user_memory_key("concierge", "ana")), None, 0) == {
        "seat": "aisle"}
    assert REMEMBERED_KEY not in store.load_history(session.id)[-1]
