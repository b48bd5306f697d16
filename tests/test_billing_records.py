"""Where a served session records each model call's usage as it ends (store/billing.py): in a
store that outlives the process (SQLite, Redis, PostgreSQL), so the next process counts what a
killed attempt used (tests/test_billing_killed.py kills real servers); never in memory://, which
dies with the process: a record there could only cost every turn a write nobody reads."""

from __future__ import annotations

import sqlite3

from fastapi.testclient import TestClient

from server_support import app_for_testclient

BOT = """\
name: desk
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
routes:
  main: {default: true, system: Answer briefly.}
"""


def one_turn(tmp_path, store: str):
    (tmp_path / "bot.yaml").write_text(BOT)
    app = app_for_testclient(str(tmp_path / "bot.yaml"), store)
    with TestClient(app) as client:
        assert client.post("/bots/desk/sessions", json={"id": "s"}).status_code == 201
        said = client.post("/bots/desk/sessions/s/messages", json={"userMessage": "hello"})
        assert said.status_code == 200 and said.json()["ok"], said.text
    return app


def test_a_store_that_outlives_the_process_holds_the_attempts_usage_record(fake, tmp_path):
    fake.responder = lambda body: {"text": "Hi."}
    one_turn(tmp_path, f"sqlite:///{tmp_path / 's.db'}")
    with sqlite3.connect(tmp_path / "s.db") as db:
        keys = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert "records" in keys, keys
        usage = [k for (k,) in db.execute("SELECT key FROM records") if k.startswith("usage:")]
    assert usage == ["usage:s"]


def test_memory_keeps_no_usage_record_it_would_lose_with_the_process(fake, tmp_path):
    fake.responder = lambda body: {"text": "Hi."}
    app = one_turn(tmp_path, "memory://")
    store = app.state.registry.store
    assert store.sync.get_record("usage:s") is None
    assert store.sync.load_session("s") is not None  # the turn was kept: only the record is not
