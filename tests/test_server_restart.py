"""Sessions survive a server restart: `chatrun serve` with a SQLite store is killed (SIGKILL)
mid-conversation (in the middle of a turn), started again, and the conversation continues with
route, stack, state, memories and history intact; the interrupted turn left no trace."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from chatrun.testing.fake_openai import FakeOpenAI
from server_support import async_until_done, call, free_port, start_serve, write_travel

pytestmark = pytest.mark.subprocess


async def turn(ws, text: str) -> list[dict]:
    await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "r1", "data": {"userMessage": text}}))
    return await async_until_done(ws)


@pytest.fixture
def fake():
    with FakeOpenAI() as server:
        yield server


def test_a_conversation_survives_a_killed_server(tmp_path, fake):
    bot = str(write_travel(tmp_path / "bots"))
    db = str(tmp_path / "sessions.db")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ws_url = f"ws://127.0.0.1:{port}/_chat/routes"

    fake.queue(
        call("remember_name", name="Ana"), {"text": "Hi Ana"},
        call("book_flight"), call("set_destination", destination="Dublin"), {"text": "When do you leave?"},
    )

    async def before() -> str:
        async with websockets.connect(ws_url) as ws:
            await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "r1"}))
            await async_until_done(ws)
            await turn(ws, "I'm Ana")
            frames = await turn(ws, "Fly me to Dublin")
            return frames[-1]["data"]

    async def in_flight() -> None:
        """Start a turn whose model answer is slow, and return once the model has the request."""
        async with websockets.connect(ws_url) as ws:
            await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "r1", "resume": True}))
            await async_until_done(ws)
            seen = len(fake.requests)
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "r1", "data": {"userMessage": "lost"}}))
            while len(fake.requests) == seen:
                await asyncio.sleep(0.02)

    first = start_serve(bot, f"sqlite:///{db}", port, fake)
    try:
        scope = asyncio.run(before())
        saved = httpx.get(f"{base}/bots/travel/sessions/r1/inspect").json()
        saved_history = httpx.get(f"{base}/bots/travel/sessions/r1").json()["history"]
        fake.queue({"text": "never delivered", "delay": 30})
        asyncio.run(in_flight())  # the server dies in the middle of this turn
    finally:
        first.kill()  # SIGKILL: no shutdown hook runs
        first.wait(10)

    second = start_serve(bot, f"sqlite:///{db}", port, fake)
    try:
        restored = httpx.get(f"{base}/bots/travel/sessions/r1/inspect").json()
        for key in ("route", "stack", "scopeId", "state", "scopes", "memory", "turn"):
            assert restored[key] == saved[key], key
        assert restored["stack"] == ["main_menu", "flight"] and restored["state"]["traveller_name"] == "Ana"
        assert restored["scopes"][1]["visible"]["reservation"]["destination"] == "Dublin"
        assert httpx.get(f"{base}/bots/travel/sessions/r1").json()["history"] == saved_history

        fake.queue(call("set_departure", date="2026-07-01"), call("book"), {"text": "Anything else, Ana?"})

        async def after() -> tuple[list[dict], list[dict], list[dict]]:
            async with websockets.connect(ws_url) as ws:
                await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "r1", "resume": True}))
                resumed = await async_until_done(ws)
                return resumed, await turn(ws, "July 1st"), await turn(ws, "thanks")

        resumed, booked, thanks = asyncio.run(after())
    finally:
        second.kill()
        second.wait(10)

    assert resumed[0]["data"]["lastTurn"]["turn"] == 2  # the interrupted turn 3 was never committed
    assert resumed[0]["data"] | {"lastTurn": None} == {"route": "flight", "stack": ["main_menu", "flight"], "lastTurn": None}
    assert resumed[-1] == {"chatId": "r1", "type": "Completed", "data": scope}
    assert "Your flight to Dublin on 2026-07-01 is booked." in [f["data"] for f in booked]
    assert booked[-1]["data"] == "r1.1"
    assert thanks[-2]["data"] == "Anything else, Ana?"
    # The main menu's memory and state came through the restart: its prompt knows Ana, and it
    # holds the name exchange, the flight's hand-back result, then the new message.
    last = fake.requests[-1]["messages"]
    assert "Help Ana" in last[0]["content"]
    # The flight's hand-back is a tool result (of a call the runtime writes), never words the model
    # could take for its own (issue 32).
    assert last[-3]["tool_calls"][0]["function"]["name"].startswith("returned_from_")
    assert last[-2] == {"role": "tool", "tool_call_id": last[-3]["tool_calls"][0]["id"], "content": "Flight booked"}
    assert last[-1] == {"role": "user", "content": "thanks"}
