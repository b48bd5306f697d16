"""What a served turn sends its store on Redis and PostgreSQL: the session's usage record
(store/billing.py), which each turn must know before its first model call (another replica's
attempt may have died since the copy was cached), comes back with the lease, in the round trip
that grants it, read after the grant. A plain turn of a cached session: the lease, the record's
write after the model call, the commit, the release; no read of the record of its own."""

from __future__ import annotations

import functools
import json

import pytest
from fastapi.testclient import TestClient

from server_support import app_for_testclient

BOT = """\
name: desk
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
routes:
  main: {default: true, system: Answer briefly.}
"""

# What a store does that a request may ask of it (chatrun.store.aio.AsyncStore's operations).
OPERATIONS = ("acquire", "release", "load_session", "commit_turn", "version", "get_record", "put_record",
              "put_record_text", "claim_record", "swap_record", "delete_record", "load_history", "get_outcome")


@pytest.fixture(params=[pytest.param("redis", marks=[pytest.mark.slow, pytest.mark.subprocess]),
                        pytest.param("postgres", marks=[pytest.mark.slow, pytest.mark.subprocess])])
def store_url(request):
    return request.getfixturevalue(f"{request.param}_server").url()


def about(session_id: str, args: tuple) -> bool:
    """Whether a store call is about the session (its id, a key of its, its lease or commit)."""
    return any(a == session_id or (isinstance(a, str) and a.endswith(":" + session_id))
               or getattr(a, "session_id", None) == session_id for a in args)


def counted(store, session_id: str, calls: list[str]) -> None:
    """Note in `calls` each operation the store is asked about the session (the server's own
    workers ask it of no session: they are left out; an operation made of another, put_record
    of put_record_text, is noted once)."""
    inside = [0]
    for name in OPERATIONS:
        method = getattr(store, name)

        async def call(*args, _method=method, _name=name, **kwargs):
            if about(session_id, args) and not inside[0]:
                calls.append(_name)
            inside[0] += 1
            try:
                return await _method(*args, **kwargs)
            finally:
                inside[0] -= 1

        setattr(store, name, functools.wraps(method)(call))


def test_a_plain_turn_reads_the_usage_record_with_its_lease_and_asks_nothing_more(fake, tmp_path, store_url):
    fake.responder = lambda body: {"text": "Hi."}
    (tmp_path / "bot.yaml").write_text(BOT)
    app = app_for_testclient(str(tmp_path / "bot.yaml"), store_url)
    calls: list[str] = []
    with TestClient(app) as client:
        assert client.post("/bots/desk/sessions", json={"id": "s"}).status_code == 201
        assert client.post("/bots/desk/sessions/s/messages", json={"userMessage": "hello"}).json()["ok"]
        counted(app.state.registry.store, "s", calls)
        said = client.post("/bots/desk/sessions/s/messages", json={"userMessage": "and again"})
        assert said.status_code == 200 and said.json()["ok"], said.text
        turn = list(calls)
        # The turn wrote its record after its model call, and counted nothing twice.
        record = client.portal.call(app.state.registry.store.get_record, "usage:s")
        session = client.get("/bots/desk/sessions/s").json()
    assert turn == ["acquire", "put_record", "commit_turn", "release"]
    assert record["turn"] == 2 and "earlier" not in record
    assert session["usage"]["calls"] == 2 and [e["ok"] for e in session["history"]] == [True, True]




@pytest.mark.slow
@pytest.mark.subprocess
def test_postgresql_sends_a_one_statement_call_without_begin_and_commit(postgres_server, monkeypatch):
    """The pool's connections autocommit: taking a lease (with its usage record, one pipeline),
    writing a record and giving the lease back are sent without BEGIN and COMMIT around them (three
    round trips where one does), and the lease still brings the record written under the last one."""
    import asyncio

    import psycopg

    from chatrun.store.postgres import PostgresStore

    began: list[str] = []
    transaction, execute = psycopg.AsyncConnection.transaction, psycopg.AsyncConnection.execute

    def noted(self, *args, **kwargs):
        began.append("BEGIN")
        return transaction(self, *args, **kwargs)

    async def sent(self, query, *args, **kwargs):
        if not self.autocommit:  # psycopg sends BEGIN before a statement, and the pool COMMIT after it
            began.append(f"implicit BEGIN: {str(query)[:40]}")
        return await execute(self, query, *args, **kwargs)

    async def calls() -> tuple[list[str], str | None]:
        store = PostgresStore(postgres_server.url())
        try:
            await store.put_record("warm", {"up": True})  # the pool opened and the schema migrated first
            monkeypatch.setattr(psycopg.AsyncConnection, "transaction", noted)
            monkeypatch.setattr(psycopg.AsyncConnection, "execute", sent)
            lease = await store.acquire("s", 5.0)
            await store.put_record("usage:s", {"turn": 1}, "s")
            await store.release(lease)
            again = await store.acquire("s", 5.0)
            await store.release(again)
            return list(began), again.usage_record
        finally:
            monkeypatch.undo()
            await store.close()

    began_by_calls, held = asyncio.run(calls())
    assert began_by_calls == []
    assert held is not None and json.loads(held) == {"turn": 1}
