"""The Redis store's connection pool waits instead of failing (issue 33, finding 8): a real
`chatrun serve` replica on a real Redis, its pool deliberately small (`?max_connections=5`),
serves many concurrent WebSocket conversations with no error. redis-py's default pool raised
"Too many connections" as soon as more commands were in flight than it had connections.

Bounded: a few hundred conversations of two turns each on loopback, the fake model answering
after a short delay; the only time limit is a generous overall one."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from collections import Counter

import pytest
import websockets

from chatrun.testing.fake_openai import FakeOpenAI
from redis_support import Replica

pytestmark = pytest.mark.subprocess

BOT = """
name: echo
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main:
    default: true
    system: "Be brief."
"""

CONVERSATIONS = 300
TURNS = 2
OVERALL = 240.0  # seconds for all of them on a loaded 2-core machine (they take a few seconds)


async def converse(url: str, chat_id: str) -> list[str]:
    """Connect, then TURNS messages; the types of the frames that end each step."""
    ends = []
    async with websockets.connect(url, open_timeout=OVERALL, close_timeout=5) as ws:
        await ws.send(json.dumps({"type": "Connect", "chatId": chat_id, "extensions": True}))
        ends.append(await _end(ws))
        for turn in range(TURNS):
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": chat_id,
                                      "data": {"userMessage": f"turn {turn}"}}))
            ends.append(await _end(ws))
    return ends


async def _end(ws) -> str:
    """The step's last frame: `Completed`, or `Failed` with its reason (after an `Error`)."""
    error = ""
    while True:
        frame = json.loads(await ws.recv())
        if frame["type"] == "Error":
            error = str(frame.get("data"))
        if frame["type"] in ("Completed", "Failed"):
            reason = re.sub(r"session c\d+", "session c*", f"{frame.get('data')} {error}")  # alike, counted together
            return "Completed" if frame["type"] == "Completed" else f"Failed: {reason}"


async def many(url: str) -> Counter:
    results = await asyncio.wait_for(
        asyncio.gather(*(converse(url, f"c{i}") for i in range(CONVERSATIONS)), return_exceptions=True), OVERALL)
    outcomes: Counter = Counter()
    for result in results:
        if isinstance(result, BaseException):
            outcomes[f"{type(result).__name__}: {result}"] += 1
        else:
            outcomes.update(result)
    return outcomes


def test_a_small_pool_makes_commands_wait_not_fail(redis_server, tmp_path):
    bot = tmp_path / "echo.yaml"
    bot.write_text(textwrap.dedent(BOT))
    with FakeOpenAI() as fake:
        fake.responder = lambda body: {"text": "ok", "delay": 0.05}
        replica = Replica(str(bot), redis_server.url() + "&max_connections=5", fake.base_url,
                          "--max-connections", str(CONVERSATIONS + 50)).start()
        try:
            outcomes = asyncio.run(many(replica.ws_url))
        finally:
            replica.kill()
    # Every Connect and every turn completed: none failed for want of a pooled connection.
    assert outcomes == Counter({"Completed": CONVERSATIONS * (1 + TURNS)}), outcomes.most_common(5)
