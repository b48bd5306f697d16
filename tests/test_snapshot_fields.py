"""A rolling deploy: a newer chatrun's replica may store session snapshots with top-level fields
this chatrun does not know. This replica's next commit keeps them as they were (a turn, a failed
turn, an HTTP turn of `chatrun serve`), so the newer replica finds what it wrote. Through real
parts: the real `openai` client against the fake server, a SQLite file both replicas share (the
newer replica's write is made in the file itself)."""

from __future__ import annotations

import json
import sqlite3

from fastapi.testclient import TestClient

import chatrun
from chatrun.store.sqlite import SQLiteStore
from server_support import app_for_testclient

BOT = """
name: plain
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main: {default: true, system: You help.}
"""
NEWER = {"future": {"kept": [1, "two"]}, "flags": 3}


def stored(path, session_id: str) -> dict:
    with sqlite3.connect(path) as db:
        [(text,)] = db.execute("SELECT snapshot FROM sessions WHERE session_id = ?", (session_id,)).fetchall()
    return json.loads(text)


def newer_replica_writes(path, session_id: str) -> None:
    """What a newer chatrun's commit leaves: the snapshot with fields of its own."""
    with sqlite3.connect(path) as db:
        db.execute("UPDATE sessions SET snapshot = ? WHERE session_id = ?",
                   (json.dumps(stored(path, session_id) | NEWER), session_id))


def test_a_turn_and_a_failed_turn_write_back_the_fields_a_newer_chatrun_stored(fake, write_bot, tmp_path):
    path = tmp_path / "s.db"
    bot = chatrun.load_bot(write_bot(BOT))
    fake.queue({"text": "Hello."})
    first = bot.session(store=SQLiteStore(str(path)))
    first.chat("hi")
    newer_replica_writes(path, first.id)

    again = bot.session(store=SQLiteStore(str(path)), session_id=first.id)
    fake.queue({"text": "Again."})
    assert [e.data for e in again.chat("more") if e.type == "Message"] == ["Again."]
    after = stored(path, first.id)
    assert after["turn"] == 2 and {k: after.get(k) for k in NEWER} == NEWER
    fake.queue({"status": 500})
    assert [e.type for e in again.chat("fail")][-1] == "Error"  # rolled back, committed as before
    assert {k: stored(path, first.id).get(k) for k in NEWER} == NEWER
    assert "future" not in again.snapshot()["scopes"][0]  # only the top level is carried


def test_a_served_turn_writes_back_the_fields_a_newer_chatrun_stored(fake, write_bot, tmp_path):
    path = tmp_path / "s.db"
    bot = chatrun.load_bot(write_bot(BOT))
    with TestClient(app_for_testclient([bot], f"sqlite:///{path}")) as newer:  # the newer replica opens it
        assert newer.post("/bots/plain/sessions", json={"id": "s1"}).status_code == 201
    newer_replica_writes(path, "s1")
    fake.queue({"text": "Hello."})
    with TestClient(app_for_testclient([bot], f"sqlite:///{path}")) as older:
        assert older.post("/bots/plain/sessions/s1/messages", json={"userMessage": "hi"}).json()["ok"]
    after = stored(path, "s1")
    assert after["turn"] == 1 and {k: after.get(k) for k in NEWER} == NEWER
