"""Issue 33, finding 11 ("Nothing ever expires"): a bot's `retention:` is enforced by the
server's sweeper on every store (memory, SQLite, a real redis-server, a real PostgreSQL), `chatrun purge` deletes
by it now (or counts, with --dry-run), and everything of one principal is erased through the
API (role `privacy` only) and the CLI. Time is the stores' and the sweeper's injected clocks,
never a sleep."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import chatrun
from chatrun.cli import main
from chatrun.definition.config import Retention
from chatrun.definition.loader import check_bot
from chatrun.messages import UserMessage
from chatrun.server.auth import Auth
from chatrun.server.sessions import SessionRegistry
from chatrun.server.sweeper import PendingSweeper, SweepSettings
from chatrun.store import user_memory
from chatrun.store.aio import open_async_store
from chatrun.store.postgres import PostgresStore
from chatrun.store.record import DEAD, Commit, memory_id, scope_id
from chatrun.store.redis import RedisStore
from chatrun.store.retention import delete_stored, erase_principal
from chatrun.store.versions import CREATE
from server_support import app_for_testclient
from store_params import STORES
from store_params import store_url as store_url_of

DAY = 86400.0
NOW = 2_000_000_000.0  # the sweeper's "now"; sessions are written at NOW minus some days

BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
RETENTION
routes:
  main:
    default: true
    system: "You help."
"""


def bot_file(tmp_path, retention="retention: {idle_sessions: 30d, dead_letters: 7d}"):
    path = tmp_path / "shop.yaml"
    path.write_text(BOT.replace("RETENTION", retention))
    return path


def snapshot(owner, bot="shop"):
    return {"bot": bot, "turn": 1, "scopes": [], "meta": {"owner": owner} if owner else {},
            "pending": [{"id": "p1", "kind": "approval", "created": "2030-01-01T00:00:00+00:00", "due": None,
                         "route": "main", "scope_id": "s.1", "ask": "refund?", "by": ["supervisors"]}]}


def outbox_entry(session_id, n, bot="shop"):
    body = {"id": f"evt_{session_id}_{n}", "type": "Detractor", "data": n, "session": session_id, "bot": bot,
            "created": NOW - 100 * DAY}
    return {"sink": "crm", "body": body}


def set_clock(store, at):
    (getattr(store, "sync", None) or store).clock = lambda: at


async def write(store, blobs, session_id, owner, written_at, events=0, files=1, bot="shop"):
    """A stored session of `owner` last written at `written_at`: its snapshot (with an open
    approval), a memory, a history entry, `events` backend events in the outbox, `files` files,
    and a record saved for it (as the OpenAI API's index saves)."""
    set_clock(store, written_at)
    history = [{"turn": 1, "ok": True, "input": "hello", "outbox": [outbox_entry(session_id, n, bot) for n in range(events)]}]
    scope = scope_id(session_id, 1)
    commit = Commit.encode(session_id, snapshot(owner, bot) | {"scopes": [{"id": scope, "memory_routes": ["main"]}]},
                           {memory_id(scope, "main"): [UserMessage("hello")]}, history, expected=CREATE)
    await store.commit_turn(commit, None)
    await store.put_record(f"resp_{session_id}", {"session": session_id}, session=session_id)
    for i in range(files):
        blobs.put(session_id, f"file {i} of {session_id}".encode(), "text/plain", "a.txt")


async def kill(store, entry_id, died_at):
    """Make an entry a dead letter that died at `died_at` (as the outbox worker does)."""
    for entry in await store.claim_outbox(NOW + 1000 * DAY, 30, 100, ["shop/crm"]):
        if entry.id == entry_id:
            entry.state, entry.next_at = DEAD, died_at
            assert await store.settle_outbox(entry, False)
        else:
            await store.settle_outbox(entry, False)  # back to pending, unclaimed


@pytest.fixture(params=["memory", *STORES])
def store_url(request, tmp_path):
    return store_url_of(request, tmp_path)


def registry_on(tmp_path, url, retention="retention: {idle_sessions: 30d, dead_letters: 7d}"):
    bot = chatrun.load_bot(bot_file(tmp_path, retention))
    return SessionRegistry({"shop": bot}, open_async_store(url))


async def gone(registry, session_id):
    store = registry.store
    return (await store.load_session(session_id) is None and await store.load_history(session_id) == []
            and await store.get_record(f"resp_{session_id}") is None and registry.blobs.refs(session_id) == [])


def test_the_sweeper_deletes_idle_sessions_with_their_files_and_keeps_fresh_ones(tmp_path, store_url):
    registry = registry_on(tmp_path, store_url)
    sweeper = PendingSweeper(registry, SweepSettings(), clock=lambda: NOW)

    async def go():
        store = registry.store
        await write(store, registry.blobs, "old", "ana", NOW - 31 * DAY, files=2)
        await write(store, registry.blobs, "fresh", "ana", NOW - 29 * DAY)
        await write(store, registry.blobs, "other-bot", "ana", NOW - 300 * DAY, bot="crm")  # not served here
        counts = await sweeper.retain()
        assert (counts.sessions, counts.files) == (1, 2)
        assert await gone(registry, "old")
        assert (await store.load_session("fresh")).owner == "ana" and len(registry.blobs.refs("fresh")) == 1
        assert await store.load_session("other-bot") is not None  # its own bot's replica decides
        assert set(await store.sessions_of("ana")) == {"fresh", "other-bot"}
        assert await store.list_pending() and {p.session_id for p in await store.list_pending()} == {
            "fresh", "other-bot"}  # the deleted session left the operators' index too
        assert (await sweeper.retain()).sessions == 0  # nothing more is idle
        await store.close()

    asyncio.run(go())


def test_a_bot_without_retention_keeps_everything_unless_the_server_caps_it(tmp_path, store_url):
    registry = registry_on(tmp_path, store_url, retention="")
    never = PendingSweeper(registry, SweepSettings(), clock=lambda: NOW)
    capped = PendingSweeper(registry, SweepSettings(retention=Retention(idle_sessions=400 * DAY)), clock=lambda: NOW)

    async def go():
        await write(registry.store, registry.blobs, "ancient", "ana", NOW - 1000 * DAY)
        await write(registry.store, registry.blobs, "old", "ana", NOW - 300 * DAY)
        assert (await never.retain()).sessions == 0
        assert (await capped.retain()).sessions == 1
        assert await gone(registry, "ancient") and await registry.store.load_session("old") is not None
        await registry.store.close()

    asyncio.run(go())


def test_delivered_entries_are_deleted_at_delivery_and_old_dead_letters_by_retention(tmp_path, store_url):
    registry = registry_on(tmp_path, store_url)
    sweeper = PendingSweeper(registry, SweepSettings(), clock=lambda: NOW)

    async def go():
        store = registry.store
        await write(store, registry.blobs, "s1", "ana", NOW - DAY, events=3)
        entries = await store.claim_outbox(NOW, 30, 100, ["shop/crm"])
        assert len(entries) == 3
        delivered, old, recent = entries
        assert await store.settle_outbox(delivered, True)
        for entry, died in ((old, NOW - 8 * DAY), (recent, NOW - 6 * DAY)):
            entry.state, entry.next_at = DEAD, died
            assert await store.settle_outbox(entry, False)
        assert {e.id for e in await store.list_outbox()} == {old.id, recent.id}  # delivered: gone already
        counts = await sweeper.retain()
        assert (counts.dead_letters, counts.sessions) == (1, 0)
        assert [e.id for e in await store.list_outbox()] == [recent.id]
        assert await store.requeue_outbox(old.id, NOW) is False  # no such dead letter any more
        await store.close()

    asyncio.run(go())


def test_erasing_a_principal_removes_all_of_it_and_nothing_of_another(tmp_path, store_url):
    registry = registry_on(tmp_path, store_url, retention="retention: {erased_outbox: drop}")

    async def go():
        store = registry.store
        await write(store, registry.blobs, "bob-1", "bob", NOW - DAY, events=1)
        await store.record_keys("")  # erasure lists records (user memory): the store's one-time index marker, first
        before = await everything(store)
        await write(store, registry.blobs, "ana-1", "ana", NOW - DAY, events=2, files=2)
        await write(store, registry.blobs, "ana-2", "ana", NOW - 2 * DAY, events=1)
        dead = next(e for e in await store.list_outbox() if e.session_id == "ana-2")
        await kill(store, dead.id, NOW - DAY)
        dry = await erase_principal(store, "ana", lambda bot: Retention(erased_outbox="drop"), registry.erase,
                                    registry.blobs, dry_run=True)
        assert await store.load_session("ana-1") is not None  # a dry run deletes nothing
        counts = await erase_principal(store, "ana", lambda bot: Retention(erased_outbox="drop"), registry.erase,
                                       registry.blobs)
        assert counts.to_json() == dry.to_json() == {"sessions": 2, "files": 3, "dead_letters": 1, "outbox": 2,
                                                     "user_memory": 0, "busy": []}
        assert await gone(registry, "ana-1") and await gone(registry, "ana-2")
        assert await everything(store) == before  # every key / row of ana gone, bob's untouched
        assert registry.blobs.refs("bob-1") and await store.sessions_of("ana") == []
        await store.close()

    asyncio.run(go())


async def everything(store):
    """All a store holds: every Redis key with its value, every SQLite or Postgres row, the memory store's dicts."""
    if isinstance(store, RedisStore):
        dump = {}
        async for key in store.client.scan_iter(match=f"{store.prefix}*"):
            kind = await store.client.type(key)
            read = {"string": store.client.get, "hash": store.client.hgetall, "list": lambda k: store.client.lrange(k, 0, -1),
                    "set": store.client.smembers, "zset": lambda k: store.client.zrange(k, 0, -1, withscores=True)}[kind]
            dump[key] = await read(key)
        dump |= {f"blob {k}": v for k, v in store.blob_area.client.hgetall(f"{store.prefix}b:bob-1").items()}
        return dump
    if isinstance(store, PostgresStore):
        tables = [r[0] for r in await store._all("list", "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return {t: sorted(map(repr, await store._all("dump", f"SELECT * FROM {t}"))) for t in tables}  # noqa: S608
    sync = store.sync
    if hasattr(sync, "_conn"):
        tables = [r[0] for r in sync._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: sorted(map(repr, sync._conn.execute(f"SELECT * FROM {t}"))) for t in tables}  # noqa: S608
    return {name: repr(value) for name, value in vars(sync).items() if name.startswith("_") and name != "_lock"}


def test_the_api_erases_for_the_privacy_role_only(tmp_path):
    auth = Auth.from_mapping({"tokens": {"token-ana-123": {"principal": "ana"},
                                         "token-dpo-123": {"principal": "dpo", "roles": ["privacy"]},
                                         "token-ops-123": {"principal": "olga", "roles": ["operators", "outbox"]}}})
    app = app_for_testclient([str(bot_file(tmp_path))], f"sqlite:///{tmp_path / 's.db'}", auth=auth)
    ana, dpo, ops = ({"Authorization": f"Bearer token-{who}-123"} for who in ("ana", "dpo", "ops"))
    with TestClient(app) as client:
        for sid in ("a1", "a2"):
            assert client.post("/bots/shop/sessions", json={"id": sid}, headers=ana).status_code == 201
        for who in (ana, ops):
            refused = client.delete("/principals/ana", headers=who)
            assert refused.status_code == 403 and "privacy" in refused.text
        assert client.get("/bots/shop/sessions/a1", headers=ana).status_code == 200
        dry = client.delete("/principals/ana", params={"dry_run": "true"}, headers=dpo).json()
        assert dry["erased"]["sessions"] == 2 and dry["dry_run"] is True
        done = client.delete("/principals/ana", headers=dpo)
        assert done.status_code == 200 and done.json()["erased"]["sessions"] == 2
        assert client.get("/bots/shop/sessions/a1", headers=ana).status_code == 404
        assert client.delete("/principals/ana", headers=dpo).json()["erased"]["sessions"] == 0


def cli(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def stored_sessions(url):
    async def go():
        store = open_async_store(url)
        try:
            return sorted(await store.list_sessions())
        finally:
            await store.close()

    return asyncio.run(go())


def seed(url, tmp_path):
    """ana's old and fresh session, bob's old one, by the real clock (the CLI's now)."""
    async def go():
        store = open_async_store(url)
        from chatrun.store.blobs import blobs_of

        blobs = blobs_of(store)
        await write(store, blobs, "ana-old", "ana", time.time() - 40 * DAY, files=2)
        await write(store, blobs, "ana-new", "ana", time.time() - DAY)
        await write(store, blobs, "bob-old", "bob", time.time() - 40 * DAY)
        await store.close()

    asyncio.run(go())


@pytest.fixture(params=STORES)
def durable_url(request, tmp_path):
    return store_url_of(request, tmp_path)


def test_purge_prints_counts_and_a_dry_run_deletes_nothing(tmp_path, durable_url):
    url = durable_url
    seed(url, tmp_path)
    bot = str(bot_file(tmp_path))
    code, out = cli("purge", bot, "--store", url, "--dry-run")
    assert code == 0 and out.strip() == "would delete (shop): 2 sessions, 3 files, 0 dead letters, 0 undelivered events"
    assert stored_sessions(url) == ["ana-new", "ana-old", "bob-old"]
    code, out = cli("purge", bot, "--store", url, "--json")
    assert code == 0 and json.loads(out)["sessions"] == 2
    assert stored_sessions(url) == ["ana-new"]
    code, out = cli("purge", "--store", url, "--principal", "ana")
    assert code == 0 and out.strip() == "deleted (principal ana): 1 session, 1 file, 0 dead letters, 0 undelivered events"
    assert stored_sessions(url) == []


def test_purge_needs_bots_or_a_principal_and_durations_it_can_read(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    sqlite3.connect(tmp_path / "s.db").close()
    code, out = cli("purge", "--store", url)
    assert code == 2 and "name the bots" in out
    code, out = cli("purge", str(bot_file(tmp_path)), "--store", url, "--retain-idle", "a month")
    assert code == 2 and "not a duration: 'a month'" in out


def test_retention_is_read_checked_and_warned_about(tmp_path):
    config, diagnostics = check_bot(bot_file(tmp_path, "retention: {idle_sessions: 12h, dead_letters: 2d}"))
    assert config.retention == Retention(idle_sessions=12 * 3600.0, dead_letters=2 * DAY)
    assert not [d for d in diagnostics if d.severity == "error"]
    config, _ = check_bot(bot_file(tmp_path, ""))
    assert config.retention == Retention()  # no retention: kept for ever, as before
    _, diagnostics = check_bot(bot_file(tmp_path, "retention: {idle_sessions: 30 days}"))
    assert any(d.severity == "error" and "retention.idle_sessions" in d.path for d in diagnostics)
    path = bot_file(tmp_path, "retention: {idle_sessions: 1d}")
    path.write_text(path.read_text() + """    tools: [refund]
tools:
  refund:
    description: Refund an order.
    approval: {by: [supervisors], timeout: 2d}
""")
    _, diagnostics = check_bot(path)
    warned = [d for d in diagnostics if d.severity == "warning" and "retention.idle_sessions" in d.message]
    assert warned and "tool `refund`: its approval waits up to 2d" in warned[0].message


def test_delete_stored_is_the_one_deletion_of_a_session(tmp_path):
    async def go():
        store = open_async_store("memory://")
        from chatrun.store.blobs import MemoryBlobs

        blobs = MemoryBlobs()
        await write(store, blobs, "s", "ana", NOW)
        assert await delete_stored(store, blobs, "s") == 1
        assert await store.load_session("s") is None and blobs.refs("s") == [] and await store.sessions_of("ana") == []

    asyncio.run(go())


SECRET = "ana-passport-X7Q2-91"  # what ana said, in every place a store keeps of her


@pytest.mark.parametrize("library_default", [0, 1])
def test_erasing_a_principal_leaves_no_copy_in_the_sqlite_files(tmp_path, monkeypatch, library_default):
    """The store's raw files, not only its rows, while the server still runs: SQLite keeps a deleted
    row's bytes in the page it freed (unless `secure_delete` is on: SQLite's own default is off,
    some builds turn it on; `library_default` plays both) and in the write-ahead log until they are
    written over, so the erased text could be read back from the files (a backup, a copied disk)
    after the erasure answered that it was gone."""
    connect = sqlite3.connect

    def connect_as_built(*args, **kwargs):
        conn = connect(*args, **kwargs)
        conn.execute(f"PRAGMA secure_delete = {library_default}")
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect_as_built)
    registry = registry_on(tmp_path, f"sqlite:///{tmp_path / 's.db'}")

    def copies():
        return [p.name for p in tmp_path.iterdir() if p.name.startswith("s.db") and SECRET.encode() in p.read_bytes()]

    async def go():
        store = registry.store
        set_clock(store, NOW)
        scope = scope_id("ana-1", 1)
        history = [{"turn": 1, "ok": True, "input": f"my passport is {SECRET}"}]
        commit = Commit.encode("ana-1", snapshot("ana") | {"scopes": [{"id": scope, "memory_routes": ["main"]}],
                                                          "state": {"passport": SECRET}},
                               {memory_id(scope, "main"): [UserMessage(f"my passport is {SECRET} " * 50)]}, history,
                               expected=CREATE)
        await store.commit_turn(commit, None)
        await store.put_record("resp_ana-1", {"session": "ana-1", "said": SECRET}, session="ana-1")
        await user_memory.asave(store, "shop", "ana", {"passport": SECRET}, None, NOW)
        await write(store, registry.blobs, "bob-1", "bob", NOW, files=0)  # another's data stays
        assert copies()
        counts = await erase_principal(store, "ana", lambda bot: Retention(), registry.erase, registry.blobs)
        assert (counts.sessions, counts.user_memory) == (1, 1)
        assert copies() == []  # at once, the store still open
        await store.close()

    asyncio.run(go())
    assert copies() == []
    with sqlite3.connect(tmp_path / "s.db") as db:  # bob's rows are still there
        assert db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1
