"""Issue 38: what is the Postgres store's own, against a real PostgreSQL (tests/postgres_support.py):
its schema's migrations (recorded, applied once however many replicas start at once, a newer
schema refused), a replica that heals when PostgreSQL restarts under it, and the errors of a
URL that cannot work. The contract it shares with SQLite and Redis: test_store_conformance.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'chatrun[postgres]')")

import chatrun
from chatrun.errors import ChatrunError
from chatrun.server import create_app
from chatrun.store import open_store
from chatrun.store.aio import open_async_store
from chatrun.store.postgres import PostgresStore, check_reachable, postgres_url_parts
from chatrun.store.postgres_schema import MIGRATIONS, SCHEMA_VERSION
from chatrun.store.urls import shown_url
from redis_support import free_port
from server_support import ThreadServer, write_travel


def test_a_postgres_url_opens_the_postgres_store_and_its_own_parameters_stay_chatruns():
    assert isinstance(open_async_store("postgresql://u@127.0.0.1:5432/db"), PostgresStore)
    assert isinstance(open_async_store("postgres://u@127.0.0.1:5432/db"), PostgresStore)
    conninfo, size = postgres_url_parts("postgresql://u@h/db?sslmode=require&max_connections=7&max_blob_files=3")
    assert conninfo == "postgresql://u@h/db?sslmode=require" and size == 7
    assert shown_url("postgresql://u:s3cret@h/db") == "postgresql://u:***@h/db"
    with pytest.raises(ChatrunError, match="max_connections must be a positive number"):
        PostgresStore("postgresql://u@h/db?max_connections=none")
    with pytest.raises(ChatrunError, match="Postgres store is asynchronous"):
        open_store("postgresql://u@h/db")


def test_a_postgres_nobody_answers_at_is_named_without_its_password():
    port = free_port()  # nothing listens there
    with pytest.raises(ChatrunError, match=rf"store postgresql://u:\*\*\*@127.0.0.1:{port}/db: cannot reach PostgreSQL") \
            as failed:
        check_reachable(f"postgresql://u:s3cret@127.0.0.1:{port}/db")
    assert "s3cret" not in str(failed.value)


def test_the_schema_is_migrated_once_in_order_even_by_replicas_starting_at_once(postgres_server):
    url = postgres_server.url()

    async def go():
        stores = [PostgresStore(url) for _ in range(4)]
        await asyncio.gather(*(s.ping() for s in stores))  # four replicas connect at the same instant
        rows = await stores[0]._all("read", "SELECT version, name FROM chatrun_migrations ORDER BY version")
        assert [r[0] for r in rows] == [v for v, _, _ in MIGRATIONS] and rows[-1][0] == SCHEMA_VERSION
        for s in stores:
            await s.close()
        again = PostgresStore(url)  # a restart applies nothing
        await again.ping()
        assert len(await again._all("read", "SELECT version FROM chatrun_migrations")) == len(MIGRATIONS)
        await again._one("pretend", "INSERT INTO chatrun_migrations (version, name) VALUES (%s, 'future') "
                         "RETURNING 1", (SCHEMA_VERSION + 1,))
        await again.close()
        with pytest.raises(ChatrunError, match=rf"newer chatrun \(schema {SCHEMA_VERSION + 1}, this one knows "
                                               rf"{SCHEMA_VERSION}\)"):
            await PostgresStore(url).ping()

    asyncio.run(go())


def test_after_a_postgres_restart_the_first_requests_succeed_and_sessions_are_kept(fake, tmp_path, postgres_server):
    travel = chatrun.load_bot(write_travel(tmp_path / "bots"))
    fake.responder = lambda body: {"text": "hello"}
    with ThreadServer(create_app([travel], postgres_server.url())) as replica, httpx.Client(timeout=60) as http:
        assert http.post(f"{replica.url}/bots/travel/sessions", json={"id": "before"}).status_code == 201
        said = http.post(f"{replica.url}/bots/travel/sessions/before/messages", json={"userMessage": "hi"})
        assert said.status_code == 200, said.text
        postgres_server.restart()  # every pooled connection is cut
        for i in range(4):  # each request must still succeed the first time
            created = http.post(f"{replica.url}/bots/travel/sessions", json={"id": f"after-{i}"})
            assert created.status_code == 201, created.text
        said = http.post(f"{replica.url}/bots/travel/sessions/before/messages", json={"userMessage": "again"})
        assert said.status_code == 200 and said.json()["turn"] == 2, said.text
        health = http.get(f"{replica.url}/health").json()
        assert health["status"] == "ok" and health["store"] == "ok"


def test_while_postgres_is_down_health_says_so_and_ready_answers_503(fake, tmp_path, postgres_server):
    travel = chatrun.load_bot(write_travel(tmp_path / "bots"))
    fake.responder = lambda body: {"text": "hello"}
    with ThreadServer(create_app([travel], postgres_server.url())) as replica, httpx.Client(timeout=60) as http:
        assert http.get(f"{replica.url}/health").json()["store"] == "ok"
        postgres_server.stop()
        try:
            health = http.get(f"{replica.url}/health")
            assert health.status_code == 200  # liveness: the process serves
            assert health.json()["store"] == "unreachable" and health.json()["status"] == "degraded"
            assert http.get(f"{replica.url}/ready").status_code == 503  # readiness: it cannot serve turns
        finally:
            postgres_server.start()
        created = http.post(f"{replica.url}/bots/travel/sessions", json={"id": "back"})
        assert created.status_code == 201, created.text
        assert http.get(f"{replica.url}/health").json()["store"] == "ok"


def test_a_release_on_one_replica_wakes_the_waiters_of_another_at_once_by_notify(postgres_server):
    url = postgres_server.url()

    async def go():
        one, two = PostgresStore(url), PostgresStore(url)
        lease = await one.acquire("s", wait=5)
        two._start_listening()
        while not two._listening:  # LISTEN is up on the second replica
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(two._wait_for_release("s", 600))  # would sleep ten minutes unwoken
        await asyncio.sleep(0)
        await one.release(lease)
        await asyncio.wait_for(waiting, 60)  # woken by the first replica's NOTIFY, not by its pause
        assert two._wakers == {}  # nothing kept for a session nobody waits for
        taken = await two.acquire("s", wait=5, reject=True)
        await two.release(taken)
        await one.close()
        await two.close()

    asyncio.run(go())


@pytest.mark.slow  # builds the whole app before it connects (about 3 s)
def test_serve_says_when_postgres_cannot_be_reached_and_commands_that_read_a_store_too(tmp_path):
    from click.testing import CliRunner

    from chatrun.cli import main

    bot = str(write_travel(tmp_path))
    url = f"postgresql://chatrun:pw@127.0.0.1:{free_port()}/chatrun"
    result = CliRunner().invoke(main, ["serve", bot, "--store", url])
    assert result.exit_code != 0 and "cannot reach PostgreSQL" in result.output and "Traceback" not in result.output
    assert "pw@" not in result.output
    result = CliRunner().invoke(main, ["record", "--store", url, "--from-session", "s1", "-o", str(tmp_path / "t.yaml")])
    assert result.exit_code != 0 and "cannot reach PostgreSQL" in result.output and "Traceback" not in result.output


def test_the_sweeper_deletes_the_lease_rows_a_dead_replica_left_and_keeps_the_live_ones(postgres_server, write_bot):
    """A replica killed (-9) leaves its own lease's row (chatrun/replica/<id>, server/liveness.py)
    and its sessions' behind, and a waiter's queue row: nobody asks for them again, so they would
    stay for good. Any replica's sweeper deletes them once they ran out; a live lease stays."""
    from chatrun.server.liveness import REPLICA_LEASE
    from chatrun.server.sessions import SessionRegistry
    from chatrun.server.sweeper import PendingSweeper, SweepSettings

    dead_replica, live_replica = REPLICA_LEASE + "dead0123", REPLICA_LEASE + "live4567"

    async def rows(store: PostgresStore) -> set[str]:
        leases = await store._all("read leases", "SELECT session_id FROM leases")
        queued = await store._all("read the queue", "SELECT session_id FROM lease_queue")
        return {r[0] for r in leases} | {"queued:" + r[0] for r in queued}

    async def go():
        store = PostgresStore(postgres_server.url())
        for held in (dead_replica, "s1"):  # the dead replica's own lease and a session's it held
            lease = await store.acquire(held, wait=5)
            lease.renewer.cancel()  # killed: never renewed, never released
        live = await store.acquire(live_replica, wait=5)
        # An hour later by the database's clock: the dead ones ran out long ago, as did a waiter.
        await store._one("age the dead replica's leases", "UPDATE leases SET expires = expires - 3600000 "
                         "WHERE session_id <> %s RETURNING 1", (live_replica,))
        await store._one("a waiter gone", "INSERT INTO lease_queue (session_id, token, alive) VALUES "
                         "('s2', 'gone', 0) RETURNING 1")
        assert await rows(store) == {dead_replica, "s1", live_replica, "queued:s2"}
        bot = chatrun.load_bot(write_bot("name: shop\nmodel: {provider: openai, name: gpt-4o-mini}\n"
                                         "routes: {main: {default: true, system: Hi.}}\n"))
        sweeper = asyncio.ensure_future(PendingSweeper(SessionRegistry({"shop": bot}, store),
                                                       SweepSettings(interval=0.1)).run_forever())
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while await rows(store) != {live_replica} and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            assert await rows(store) == {live_replica}
        finally:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
        await store.release(live)
        await store.close()

    asyncio.run(go())
