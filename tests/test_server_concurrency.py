"""Requests for one session are served one after the other; different sessions run concurrently.
Real uvicorn, real WebSocket and HTTP clients, the fake OpenAI server answering after a delay."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets

import chatrun
from chatrun.server import create_app
from chatrun.testing.fake_openai import FakeOpenAI
from server_support import ThreadServer, async_until_done, check_frame, write_travel

pytestmark = pytest.mark.slow

DELAY = 0.6  # the fake model's answer time; big enough that overlap and order are unambiguous


@pytest.fixture
def server(monkeypatch, tmp_path):
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        fake.responder = lambda body: {"text": "re: " + body["messages"][-1]["content"], "delay": DELAY}
        app = create_app([chatrun.load_bot(write_travel(tmp_path))], f"sqlite:///{tmp_path / 'c.db'}")
        with ThreadServer(app) as srv:
            srv.fake = fake
            yield srv


def model_calls(fake: FakeOpenAI) -> list[float]:
    return sorted(r.at for r in fake.log if r.path.endswith("/chat/completions"))


def test_two_requests_for_one_chat_are_served_in_order_never_interleaved(server):
    async def run() -> list[dict]:
        async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "one"}))
            await async_until_done(ws)
            for i in (1, 2):
                await ws.send(json.dumps({
                    "type": "ChatRouteMessage", "chatId": "one", "data": {"userMessage": f"m{i}"}, "requestId": i,
                }))
            frames = []
            while sum(f["type"] == "Completed" for f in frames) < 2:
                frames.append(check_frame(json.loads(await asyncio.wait_for(ws.recv(), 10))))
            return frames

    frames = asyncio.run(run())
    ids = [f["requestId"] for f in frames]
    assert ids == sorted(ids), f"frames of the two requests interleaved: {ids}"
    assert [f["data"] for f in frames if f["type"] == "Message"] == ["re: m1", "re: m2"]
    first, second = model_calls(server.fake)
    assert second - first >= DELAY * 0.9  # the second turn's model call waited for the first turn
    # The second turn saw the first one in its memory.
    assert [m["content"] for m in server.fake.requests[1]["messages"][1:]] == ["m1", "re: m1", "m2"]


def test_concurrent_http_requests_for_one_session_are_serialized(server):
    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            await http.post("/bots/travel/sessions", json={"id": "h"})
            replies = await asyncio.gather(
                *(http.post("/bots/travel/sessions/h/messages", json={"userMessage": f"q{i}"}) for i in range(3))
            )
            return [r.json() for r in replies] + [(await http.get("/bots/travel/sessions/h")).json()]

    *replies, session = asyncio.run(run())
    assert sorted(r["turn"] for r in replies) == [1, 2, 3]
    assert session["turn"] == 3 and all(h["ok"] for h in session["history"])
    # Each model call saw every earlier turn complete: 1 system + 2 messages per earlier turn + 1.
    assert [len(r["messages"]) for r in server.fake.requests] == [2, 4, 6]


def test_different_sessions_run_concurrently(server):
    async def chat(chat_id: str, ready: asyncio.Barrier) -> list[dict]:
        async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": chat_id}))
            await async_until_done(ws)
            await ready.wait()  # all connected: the four messages leave together
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": chat_id, "data": {"userMessage": chat_id}}))
            return await async_until_done(ws)

    async def run() -> list[list[dict]]:
        ready = asyncio.Barrier(4)
        return await asyncio.gather(*(chat(f"s{i}", ready) for i in range(4)))

    results = asyncio.run(run())
    assert [r[-2]["data"] for r in results] == [f"re: s{i}" for i in range(4)]
    calls = model_calls(server.fake)
    # All four model calls were in flight together: the last began before the first was answered.
    assert calls[-1] - calls[0] < DELAY * 0.9


def test_a_turn_whose_sse_client_leaves_is_stopped_and_rolled_back(server):
    """Closing an event stream is Stop (issue 35; it used to let the turn complete): the turn is
    rolled back and recorded as stopped. tests/test_stop_server.py covers every door."""
    server.fake.queue({"chunks": ["one ", "two ", "three"], "stall": True})  # it ends only if stopped
    with httpx.Client(base_url=server.url, timeout=10) as http:
        http.post("/bots/travel/sessions", json={"id": "gone"})
        with http.stream("POST", "/bots/travel/sessions/gone/messages?stream=true", json={"userMessage": "hi"}) as r:
            first = next(r.iter_lines())
        assert first == "event: Stream"  # the client leaves after the first chunk
        deadline = time.monotonic() + 10
        while not (session := http.get("/bots/travel/sessions/gone").json())["history"]:
            assert time.monotonic() < deadline, "the abandoned turn was never recorded"
            time.sleep(0.05)
    assert session["turn"] == 0
    assert (session["history"][-1]["ok"], session["history"][-1]["error"]) == (False, "cancelled")


def test_a_turn_whose_websocket_client_leaves_still_completes_and_is_stored(server):
    server.fake.queue({"chunks": ["one ", "two ", "three"], "chunk_delay": 0.3})

    async def leave_early() -> dict:
        async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "left"}))
            await async_until_done(ws)
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "left", "data": {"userMessage": "hi"}}))
            return json.loads(await ws.recv())

    assert asyncio.run(leave_early())["type"] == "Stream"  # then the socket closes mid-turn
    deadline = time.monotonic() + 10
    while (session := httpx.get(f"{server.url}/bots/travel/sessions/left").json())["turn"] == 0:
        assert time.monotonic() < deadline, "the abandoned turn never completed"
        time.sleep(0.05)
    assert [e["data"] for e in session["history"][-1]["events"]] == ["one two three"]
