"""Outcomes through real `chatrun serve` processes (issue 38): an `abandoned: {silent_for: 30m}`
outcome recorded by the sweeper with no client present — on SQLite, and on a real Redis with
two replicas sweeping — exactly once: one `Outcome` event in the history, one count in
`chatrun_outcomes_total` over all replicas, however many sweeps see the session."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from redis_support import Replica
from server_support import wait_until
from webhook_support import OPENAI_MODEL

BOT = f"""\
name: desk
model: {{{OPENAI_MODEL}}}
outcomes:
  escalated: {{route: human}}
  abandoned: {{silent_for: 30m}}
routes:
  main: {{default: true, system: You help.}}
  human: {{system: A person answers.}}
"""

COUNTED = re.compile(r'^chatrun_outcomes_total\{bot="desk",outcome="abandoned",version="[^"]+"\} (\S+)$', re.M)


def outcomes(store_url: str, session: str) -> list[str]:
    """The Outcome events of the session's stored history (a backend event: no client's view shows it)."""
    from chatrun.store.aio import open_async_store

    async def read() -> list[dict]:
        store = open_async_store(store_url)
        try:
            return await store.load_history(session)
        finally:
            await store.close()

    return [e["data"]["name"] for entry in asyncio.run(read()) for e in entry.get("events", [])
            if e["type"] == "Outcome"]


def counted(server: Replica) -> float:
    return sum(float(n) for n in COUNTED.findall(httpx.get(f"{server.url}/metrics", timeout=60).text))


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_the_sweepers_record_an_abandoned_conversation_exactly_once(kind, request, tmp_path, fake):
    fake.responder = lambda body: {"text": "Hello."}
    bot, clock = tmp_path / "bot.yaml", tmp_path / "clock"
    bot.write_text(BOT)
    start = datetime.now(UTC)
    clock.write_text(start.isoformat())
    store = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else request.getfixturevalue("redis_server").url()
    replicas = [Replica(str(bot), store, fake.base_url, "--clock-file", str(clock), "--sweep-interval", "0.3")
                for _ in range(1 if kind == "sqlite" else 2)]
    try:
        for replica in replicas:
            replica.start()
        first = replicas[0]
        assert httpx.post(f"{first.url}/bots/desk/sessions", json={"id": "o1"}, timeout=60).status_code == 201
        reply = httpx.post(f"{first.url}/bots/desk/sessions/o1/messages", json={"userMessage": "hi"}, timeout=60)
        assert reply.json()["ok"] is True, reply.text
        time.sleep(1)  # the sweepers look: nothing is due yet
        assert sum(counted(r) for r in replicas) == 0
        clock.write_text((start + timedelta(minutes=31)).isoformat())
        wait_until(lambda: sum(counted(r) for r in replicas), what="the outcome recorded by a sweeper")
        clock.write_text((start + timedelta(hours=5)).isoformat())
        time.sleep(2)  # further sweeps of every replica find nothing due
        assert sum(counted(r) for r in replicas) == 1
    finally:
        for replica in replicas:
            replica.kill()
    assert outcomes(store, "o1") == ["abandoned"]
