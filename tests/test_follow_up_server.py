"""Follow-ups through real `chatrun serve` processes (issue 36): the sweeper of a replica on
SQLite, and of two replicas on a real Redis, their time moved by `--clock-file`; the follow-up
is sent exactly once, with no client present, as a turn of the session's history."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from redis_support import Replica
from server_support import wait_until
from webhook_support import OPENAI_MODEL

BOT = f"""\
name: booking
model: {{{OPENAI_MODEL}}}
routes:
  main: {{default: true, system: You help., tools: [start_booking]}}
  wizard:
    system: Ask for the city.
    follow_up: {{after: 2h, message: "Still there? Your seats are held."}}
tools:
  start_booking:
    description: Start booking
    action: {{route: wizard}}
"""


def responder(body: dict[str, Any]) -> dict[str, Any]:
    """The fake model: "book" calls start_booking; anything else is noted."""
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    if user == "book":
        return {"tool_calls": [{"name": "start_booking", "arguments": {}}]}
    return {"text": f"Noted: {user}"}


def follow_ups(server: Replica, session: str) -> list[str]:
    history = httpx.get(f"{server.url}/bots/booking/sessions/{session}", timeout=60).json()["history"]
    return [e["data"] for entry in history for e in entry.get("events", [])
            if e["type"] == "Message" and (e.get("meta") or {}).get("from") == "follow_up"]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_the_sweepers_send_a_follow_up_exactly_once(kind, request, tmp_path, fake):
    fake.responder = responder
    bot, clock = tmp_path / "bot.yaml", tmp_path / "clock"
    bot.write_text(BOT)
    start = datetime.now(UTC)
    clock.write_text(start.isoformat())
    store = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else request.getfixturevalue("redis_server").url()
    replicas = [Replica(str(bot), store, fake.base_url, "--clock-file", str(clock), "--sweep-interval", "0.3")
                for _ in range(1 if kind == "sqlite" else 2)]  # a SQLite file serves one process
    try:
        for replica in replicas:
            replica.start()
        first = replicas[0]
        assert httpx.post(f"{first.url}/bots/booking/sessions", json={"id": "f1"}, timeout=60).status_code == 201
        reply = httpx.post(f"{first.url}/bots/booking/sessions/f1/messages", json={"userMessage": "book"},
                           timeout=60).json()
        assert reply["ok"] is True, reply
        time.sleep(1)  # both replicas sweep: nothing is due yet
        assert follow_ups(first, "f1") == []
        clock.write_text((start + timedelta(hours=2, minutes=1)).isoformat())
        wait_until(lambda: follow_ups(replicas[-1], "f1"), what="the follow-up sent by a sweeper")
        time.sleep(2)  # further sweeps of both replicas find nothing due
        assert follow_ups(first, "f1") == ["Still there? Your seats are held."]
    finally:
        for replica in replicas:
            replica.kill()
