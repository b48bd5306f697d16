"""Stop at each door of `chatrun serve` (issue 35): a Cancel frame on the WebSocket (extended
dialect), a closed Server-Sent Events stream, a closed `/v1` stream (the real `openai` client).
Each stopped turn is rolled back and recorded as stopped; the session is free at once and the
next message is answered. Real uvicorn, the fake OpenAI server as a model that streams a first
chunk and then stalls until the turn is stopped (no timing assumptions: each test acts on what
it has received)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import websockets

import chatrun
from chatrun.server import create_app
from chatrun.testing.fake_openai import FakeOpenAI
from server_support import ThreadServer, async_until_done, check_frame, wait_until, write_travel

pytestmark = [pytest.mark.slow]

STALLING = {"chunks": ["Let me ", "think"], "stall": True}


@pytest.fixture
def server(monkeypatch, tmp_path):
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        app = create_app([chatrun.load_bot(write_travel(tmp_path))], f"sqlite:///{tmp_path / 'c.db'}")
        with ThreadServer(app) as srv:
            srv.fake = fake
            yield srv


def history(server, session_id: str) -> list[dict]:
    return httpx.get(f"{server.url}/bots/travel/sessions/{session_id}").json()["history"]


def stopped_then_answered(server, session_id: str) -> None:
    """The stopped turn is in the history, rolled back; the session takes the next message."""
    entries = wait_until(lambda: history(server, session_id) or None, 30, "the stopped turn's record")
    [entry] = entries
    assert entry["ok"] is False and entry["error"] == "cancelled"
    assert entry["stopped"]["shown"].startswith("Let me")
    server.fake.queue({"text": "Here again."})
    reply = httpx.post(f"{server.url}/bots/travel/sessions/{session_id}/messages", json={"userMessage": "again"},
                       timeout=30).json()
    assert reply["ok"] is True and reply["turn"] == 1  # the stopped turn was rolled back: this is turn 1
    assert [e["data"] for e in reply["events"] if e["type"] == "Message"] == ["Here again."]
    # The model saw no trace of the stopped turn in the conversation's memory.
    assert [m["content"] for m in server.fake.requests[-1]["messages"][1:]] == ["again"]


def test_a_cancel_frame_stops_the_streaming_turn_and_the_chat_goes_on(server):
    server.fake.queue(STALLING)

    async def run() -> tuple[list[dict], list[dict]]:
        async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "ws1"}))
            await async_until_done(ws)
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "ws1", "requestId": "m1",
                                      "data": {"userMessage": "hello"}}))
            frames = [check_frame(json.loads(await asyncio.wait_for(ws.recv(), 30)))]
            assert frames[0]["type"] == "Stream"
            await ws.send(json.dumps({"type": "Cancel", "chatId": "ws1", "requestId": "c1"}))
            while sum(f["type"] in ("Completed", "Failed") for f in frames) < 2:
                frames.append(check_frame(json.loads(await asyncio.wait_for(ws.recv(), 30))))
            server.fake.queue({"text": "Hi again."})
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "ws1", "requestId": "m2",
                                      "data": {"userMessage": "hello?"}}))
            return frames, await async_until_done(ws, 30)

    frames, after = asyncio.run(run())
    ends = {f["requestId"]: (f["type"], f["data"]) for f in frames if f["type"] in ("Completed", "Failed")}
    assert ends == {"c1": ("Completed", None), "m1": ("Failed", "Cancelled")}
    assert any(f["type"] == "Error" and f["data"].startswith("Stopped") for f in frames if f.get("requestId") == "m1")
    assert after[-1]["type"] == "Completed" and "Hi again." in [f["data"] for f in after if f["type"] == "Message"]
    entries = history(server, "ws1")
    assert [(e["ok"], e.get("error")) for e in entries] == [(False, "cancelled"), (True, None)]
    assert entries[0]["stopped"]["shown"] in ("Let me ", "Let me think")  # as streamed when it stopped


def test_a_cancel_frame_is_an_extension_a_quarkus_chat_gets_bad_request(server):
    async def run() -> list[dict]:
        async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps({"type": "Connect", "chatId": "q1"}))
            await async_until_done(ws)
            await ws.send(json.dumps({"type": "Cancel", "chatId": "q1", "requestId": 1}))
            return await async_until_done(ws)

    assert [(f["type"], f["data"]) for f in asyncio.run(run())] == [("Failed", "BadRequest")]


def test_closing_the_event_stream_stops_the_turn(server):
    httpx.post(f"{server.url}/bots/travel/sessions", json={"id": "sse1"}).raise_for_status()
    server.fake.queue(STALLING)
    with httpx.Client(timeout=30) as http, http.stream(
            "POST", f"{server.url}/bots/travel/sessions/sse1/messages?stream=true",
            json={"userMessage": "hello"}) as response:
        for line in response.iter_lines():
            if line == "event: Stream":
                break  # the reader saw the reply start: Stop
    stopped_then_answered(server, "sse1")


def test_closing_a_v1_stream_stops_the_turn(server):
    server.fake.queue(STALLING)
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30) as client:
        stream = client.chat.completions.create(
            model="travel", messages=[{"role": "user", "content": "hello"}], stream=True,
            extra_headers={"X-Chatrun-Session": "v1stop"})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()
    stopped_then_answered(server, "v1stop")


@pytest.mark.parametrize("m2_sent", ["queued", "with_the_cancel"])
def test_a_cancel_also_stops_the_chats_queued_message_before_it_runs(server, m2_sent):
    """m2 waits in the session's queue behind m1 when the Cancel comes (`queued`), or it comes in
    one write with the Cancel (`with_the_cancel`), so the server reads both before m2's request
    has begun: either way m2 never runs and ends with Failed("Cancelled") (a request cancelled
    before its first step used to end with no frame at all)."""
    server.fake.queue(STALLING)
    m2 = {"type": "ChatRouteMessage", "chatId": "ws2", "requestId": "m2", "data": {"userMessage": "m2"}}
    cancel = {"type": "Cancel", "chatId": "ws2", "requestId": "c1"}

    async def run() -> list[dict]:
        async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "ws2"}))
            await async_until_done(ws)
            await ws.send(json.dumps({**m2, "requestId": "m1", "data": {"userMessage": "m1"}}))
            if m2_sent == "queued":
                await ws.send(json.dumps(m2))
            frames = [check_frame(json.loads(await asyncio.wait_for(ws.recv(), 30)))]
            assert (frames[0]["type"], frames[0]["requestId"]) == ("Stream", "m1")
            for frame in ([cancel] if m2_sent == "queued" else [m2, cancel]):
                ws.protocol.send_text(json.dumps(frame).encode())
            ws.transport.write(b"".join(ws.protocol.data_to_send()))  # one write
            while sum(f["type"] in ("Completed", "Failed") for f in frames) < 3:
                frames.append(check_frame(json.loads(await asyncio.wait_for(ws.recv(), 30))))
            return frames

    ends = {f["requestId"]: (f["type"], f["data"]) for f in asyncio.run(run()) if f["type"] in ("Completed", "Failed")}
    assert ends == {"c1": ("Completed", None), "m1": ("Failed", "Cancelled"), "m2": ("Failed", "Cancelled")}
    assert len(server.fake.requests) == 1  # m2 never ran
    assert [(e["input"], e["error"]) for e in history(server, "ws2")] == [("m1", "cancelled")]


def test_a_v1_stream_closed_while_queued_for_its_session_never_runs(server):
    # The handler waited for the session (behind a running turn) without listening to its client:
    # a request whose client had gone ran its turn once the session was free (tools and all), and
    # was stopped only when its first chunk found nobody to read it.
    import socket

    def in_progress() -> int:
        return httpx.get(f"{server.url}/health").json()["in_progress"]

    server.fake.queue(STALLING)
    body = {"model": "travel", "stream": True, "messages": [{"role": "user", "content": "first"}]}
    headers = {"X-Chatrun-Session": "queued1"}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{server.url}/v1/chat/completions", json=body,
                                                       headers=headers) as first:
        lines = first.iter_lines()  # kept: a dropped iterator closes the stream (a Stop)
        for line in lines:
            if '"content": "Let me' in line:
                break  # the first turn runs, holding the session
        queued = socket.create_connection(("127.0.0.1", server.port))
        raw = json.dumps(body | {"messages": [{"role": "user", "content": "second"}]}).encode()
        queued.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"X-Chatrun-Session: queued1\r\nContent-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw)
        wait_until(lambda: in_progress() == 2, 30, "the second request waiting for the session")
        queued.close()
        wait_until(lambda: in_progress() == 1, 30, "the gone client's request leaving the session's queue")
    wait_until(lambda: in_progress() == 0, 30, "the first turn stopped")
    assert [e["input"] for e in history(server, "queued1")] == ["first"]
    assert len(server.fake.requests) == 1


DECIDING = """
name: sender
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main: {default: true, system: You send., tools: [send]}
tools:
  send:
    description: Send money
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    confirm: "Send {{ args.amount }} EUR?"
    action: {reply: "Sent {{ args.amount }} EUR."}
"""


def test_a_stopped_decision_turn_says_its_item_waits_again_before_the_stop(monkeypatch, tmp_path):
    """The user's yes resolves the confirmation (Resolved goes out), the model's answer streams and
    is stopped: the turn is rolled back and the item waits again. The client read Resolved last;
    now the item's Pending comes again before the Stopped Error, as for a failed decision turn."""
    (tmp_path / "bot.yaml").write_text(DECIDING)
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        app = create_app([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 'c.db'}")
        with ThreadServer(app) as srv:
            fake.queue({"tool_calls": [{"name": "send", "arguments": {"amount": 5}}]}, STALLING)

            async def run() -> list[dict]:
                async with websockets.connect(srv.ws_url + "/_chat/routes") as ws:
                    await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "d1"}))
                    await async_until_done(ws)
                    await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "d1", "requestId": "m1",
                                              "data": {"userMessage": "send 5"}}))
                    await async_until_done(ws, 30)
                    await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "d1", "requestId": "m2",
                                              "data": {"userMessage": "yes"}}))
                    frames = [check_frame(json.loads(await asyncio.wait_for(ws.recv(), 30)))]
                    while frames[-1]["type"] != "Stream":
                        frames.append(check_frame(json.loads(await asyncio.wait_for(ws.recv(), 30))))
                    await ws.send(json.dumps({"type": "Cancel", "chatId": "d1", "requestId": "c1"}))
                    while sum(f["type"] in ("Completed", "Failed") for f in frames) < 2:
                        frames.append(check_frame(json.loads(await asyncio.wait_for(ws.recv(), 30))))
                    return frames

            frames = [f for f in asyncio.run(run()) if f.get("requestId") == "m2"]
            entries = httpx.get(f"{srv.url}/bots/sender/sessions/d1").json()
    kinds = [f["type"] for f in frames if f["type"] != "Stream"]
    assert kinds == ["Resolved", "Pending", "Error", "Failed"], frames
    assert frames[-1]["data"] == "Cancelled" and frames[-2]["data"].startswith("Stopped")
    assert [p["id"] for p in entries["pending"]] == ["p1"]
    assert entries["history"][-1]["error"] == "cancelled"


def continued_after_stop(client: openai.OpenAI, previous_id: str) -> openai.types.responses.Response:
    """The next response after `previous_id`: a refusal (404) runs nothing, so it is asked again
    until the stopped response's id is recorded (its stream's end raced the record's write)."""

    def ask() -> openai.types.responses.Response | None:
        try:
            return client.responses.create(model="travel", input="again", previous_response_id=previous_id)
        except openai.NotFoundError:
            return None

    return wait_until(ask, 30, "the stopped response's id continuing its session")


@pytest.mark.parametrize("first", [True, False])
def test_a_stopped_responses_stream_id_continues_where_its_turn_began(server, first):
    """docs/openai-api.md, Stop: a closed Responses stream's turn is rolled back, and its id names
    the session as the stop left it. previous_response_id = that id continues the same session
    from where the stopped turn began (its first turn, or the response before it): the model sees
    no trace of the stopped message."""
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30) as client:
        earlier = None
        if not first:
            server.fake.queue({"text": "Hi."})
            earlier = client.responses.create(model="travel", input="hello")
        server.fake.queue(STALLING)
        stream = client.responses.create(model="travel", input="stop me", stream=True,
                                         previous_response_id=earlier.id if earlier else None)
        stopped_id = None
        for event in stream:
            if event.type == "response.created":
                stopped_id = event.response.id
            if event.type == "response.output_text.delta":
                break
        stream.close()
        server.fake.queue({"text": "Here again."})
        after = continued_after_stop(client, stopped_id)
    info = after.model_extra["chatrun"]
    assert info["how"] == "continued" and info["turn"] == (1 if first else 2)
    if earlier is not None:
        assert info["session"] == earlier.model_extra["chatrun"]["session"]
    assert after.output_text == "Here again."
    sent = [m["content"] for m in server.fake.requests[-1]["messages"][1:]]
    assert sent == (["again"] if first else ["hello", "Hi.", "again"])
    entries = history(server, info["session"])
    assert [(e["ok"], e.get("error")) for e in entries][-2:] == [(False, "cancelled"), (True, None)]
    # Retrieved, the stopped response says it was cancelled: nothing of it was kept.
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=30) as client:
        stopped = client.responses.retrieve(stopped_id)
    assert (stopped.id, stopped.status, stopped.output) == (stopped_id, "cancelled", [])
    assert stopped.previous_response_id == (earlier.id if earlier else None)
