"""A streamed reply's chunks reach clients as Stream events at most every STREAM_EVERY seconds
(engine/stream_chunks.py): the first at once, those that follow within the interval joined, none
lost or reordered, and what is held sent when the time is up or the model's answer ends."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time

import jsonschema
import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.engine.stream_chunks import READER, STREAM_EVERY_NOW, StreamBatcher
from chatrun.errors import FrameError
from chatrun.server import wire
from server_support import WIRE_SCHEMA, app_for_testclient, check_frame, until_done


def batcher(multi: bool = False):
    sent: list[str] = []
    arrived = asyncio.Event()

    def emit(kind, text, multi):
        assert kind == "Stream"
        sent.append(text)
        arrived.set()
    return StreamBatcher(emit, multi), sent, arrived


def test_the_first_chunk_goes_at_once_and_the_next_ones_together_at_the_end():
    async def run():
        b, sent, _ = batcher()
        await b.send("Two ")
        await b.send("")  # nothing to send: no event
        await b.send("tickets ")
        await b.send("left.")
        held = list(sent)
        b.close()
        return held, sent
    held, sent = asyncio.run(run())
    assert held == ["Two "]
    assert sent == ["Two ", "tickets left."]


def test_a_route_streaming_to_quarkus_sends_each_chunk_as_its_own_frame():
    """Quarkus' Multi<String>: each item is a value of its own on that wire (WebsocketTest.testMulti)."""
    async def run():
        b, sent, _ = batcher(multi=True)
        for chunk in "01234":
            await b.send(chunk)
        b.close()
        return sent
    assert asyncio.run(run()) == list("01234")


def test_what_is_held_goes_when_the_time_is_up_without_another_chunk():
    async def run():
        b, sent, arrived = batcher()
        await b.send("a")
        arrived.clear()
        await b.send("b")  # within the interval: held, a timer sends it
        await asyncio.wait_for(arrived.wait(), timeout=30)
        b.close()  # nothing more held: no empty event
        return sent
    assert asyncio.run(run()) == ["a", "b"]


def test_a_fast_stream_through_the_openai_client_is_a_few_events_with_the_whole_text(fake, tmp_path):
    chunks = [f"word{i} " for i in range(300)]  # all at once: far faster than 20 a second
    fake.queue({"chunks": chunks})
    (tmp_path / "bot.yaml").write_text(textwrap.dedent("""\
        format: 3
        name: fast
        model: {provider: openai, name: gpt-4o-mini, stream: true}
        routes:
          main:
            default: true
            system: You answer.
        """))
    session = chatrun.load_bot(tmp_path / "bot.yaml").session()
    events = session.chat("Talk")
    streamed = [e.data for e in events if e.type == "Stream"]
    assert streamed[0] == "word0 "  # the first word is not held back
    assert "".join(streamed) == "".join(chunks)
    assert len(streamed) < 10, len(streamed)  # not 300 frames on every door
    assert [e.data for e in events if e.type == "Message"] == ["".join(chunks)]


def test_a_turn_asking_for_fewer_stream_events_holds_chunks_that_long():
    async def run():
        token = STREAM_EVERY_NOW.set(30.0)  # what ws.py sets for a turn frame's streamEvery (here far longer)
        try:
            b, sent, _ = batcher()
        finally:
            STREAM_EVERY_NOW.reset(token)
        await b.send("a")
        await b.send("b")  # the default 50 ms would be long past on a loaded machine: held all the same
        await asyncio.sleep(0.2)
        held = list(sent)
        b.close()
        return held, sent
    held, sent = asyncio.run(run())
    assert held == ["a"] and sent == ["a", "b"]


FAST_BOT = """\
format: 3
name: fast
model: {provider: openai, name: gpt-4o-mini, stream: true}
routes:
  main:
    default: true
    system: You answer.
"""


def stream_frames(ws, chat: str, **fields) -> list[dict]:
    ws.send_json({"type": "ChatRouteMessage", "chatId": chat, "requestId": "m", "data": {"userMessage": "Talk"}, **fields})
    return until_done(ws)


def test_a_client_asks_for_fewer_stream_frames_with_stream_every(fake, tmp_path):
    """A client that shows a reply less often asks for fewer Stream frames (`streamEvery`, chatrun
    dialect). Quarkus-dialect chats cannot ask; a value out of range fails."""
    (tmp_path / "bot.yaml").write_text(FAST_BOT)
    chunks = [f"word{i} " for i in range(300)]
    app = app_for_testclient([chatrun.load_bot(tmp_path / "bot.yaml")], "memory://")
    with TestClient(app) as client, client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": "c1", "extensions": True})
        assert until_done(ws)[-1]["type"] == "Completed"
        fake.queue({"chunks": chunks})
        frames = stream_frames(ws, "c1", streamEvery=1000)
        streamed = [f["data"] for f in frames if f["type"] == "Stream"]
        assert frames[-1]["type"] == "Completed"
        assert streamed[0] == "word0 " and "".join(streamed) == "".join(chunks)
        assert len(streamed) <= 3, len(streamed)  # the first chunk at once, the rest within a second or two
        for bad in (10, 5000, "250", "fast", True):
            failed = stream_frames(ws, "c1", streamEvery=bad)[-1]
            assert failed["type"] == "Failed" and failed["data"] == "BadRequest", failed
    with TestClient(app) as client, client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": "q1"})  # Quarkus' dialect
        assert until_done(ws)[-1]["type"] == "Completed"
        fake.queue({"chunks": chunks})
        frames = stream_frames(ws, "q1", streamEvery=250)
        assert [f["type"] for f in frames] == ["Failed"], frames
        fake.queue({"chunks": chunks})
        frames = stream_frames(ws, "q1")
        assert frames[-1]["type"] == "Completed"  # without it, the turn runs


@pytest.mark.parametrize("kind", ["ChatRouteMessage", "Decide", "Answer"])
def test_the_wire_schema_takes_the_stream_every_values_the_server_takes(kind):
    """schemas/wire.schema.json describes a turn frame's `streamEvery` as the server reads it:
    milliseconds from 50 to 1000, or "reader"."""
    schema = jsonschema.Draft202012Validator(WIRE_SCHEMA["$defs"][kind]["properties"]["streamEvery"])
    frame = {"type": "ChatRouteMessage", "chatId": "c1", "data": {"userMessage": "hi"}}
    for value in (50, 250, 1000, 333.5, "reader", 10, 5000, "250", "fast", True, None):
        try:
            taken = value is not None and wire.parse_frame(json.dumps(frame | {"streamEvery": value}),
                                                           wire.ServerLimits()).stream_every is not None
        except FrameError:
            taken = False
        assert schema.is_valid(value) == taken, value


def test_a_readers_pace_is_four_events_a_second_fewer_while_a_reply_comes_faster_than_anyone_reads():
    """READER (streamEvery "reader", chatrun's page): the wait after an event carrying so many
    characters that came in so many seconds (measured over 250 ms at least)."""
    assert READER.next_wait(12, 3600.0) == 0.25  # the first event
    assert READER.next_wait(100, 0.25) == 0.25  # 400 characters a second: one reads along
    assert READER.next_wait(250, 0.25) == 0.5  # 1,000 a second
    assert READER.next_wait(575, 0.25) == 2.0  # 2,300 a second: the page's 17 KB reply
    assert READER.next_wait(500, 0.01) == 2.0  # a burst is measured over 250 ms
    assert READER.next_wait(3000, 2.0) == 0.5  # slower again: 1,500 a second
    assert READER.next_wait(400, 2.0) == 0.25


def timed_stream_frames(ws, chat: str, **fields) -> tuple[list[str], list[float]]:
    """A turn's Stream texts and when each came (seconds since the turn's frame was sent)."""
    ws.send_json({"type": "ChatRouteMessage", "chatId": chat, "requestId": "m", "data": {"userMessage": "Talk"}, **fields})
    start, texts, times = time.monotonic(), [], []
    while (frame := check_frame(ws.receive_json()))["type"] not in ("Completed", "Failed"):
        if frame["type"] == "Stream":
            texts.append(frame["data"])
            times.append(time.monotonic() - start)
    assert frame["type"] == "Completed", frame
    return texts, times


def test_a_page_asks_for_a_readers_pace_and_a_fast_reply_comes_in_a_few_frames(fake, tmp_path):
    """streamEvery "reader": a reply far faster than anyone reads (here some 20,000 characters a
    second, 200 every 10 ms) comes every 2 s after its first chunk (its second event too: the pace
    is that of what is held), not four times a second; one at reading pace (20 characters every
    50 ms) still four times a second. No chunk lost or reordered."""
    (tmp_path / "bot.yaml").write_text(FAST_BOT)
    fast = [f"{i:04d}" + "x" * 195 + " " for i in range(300)]
    slow = [f"{i:03d} words go " + "." * 6 for i in range(40)]
    app = app_for_testclient([chatrun.load_bot(tmp_path / "bot.yaml")], "memory://")
    with TestClient(app) as client, client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": "c1", "extensions": True})
        assert until_done(ws)[-1]["type"] == "Completed"
        fake.queue({"chunks": fast, "chunk_delay": 0.01})
        streamed, times = timed_stream_frames(ws, "c1", streamEvery="reader")
        assert streamed[0] == fast[0] and "".join(streamed) == "".join(fast)
        # At once, then every 2 s (the second too), and what is left at the end (at four a second:
        # 12 or more; the client's clock sees the server's 2 s give or take a delivery's delay).
        assert len(streamed) <= 2 + times[-1] / 1.9 and times[1] - times[0] > 1.5, times
        fake.queue({"chunks": slow, "chunk_delay": 0.05})
        streamed, times = timed_stream_frames(ws, "c1", streamEvery="reader", requestId="slow")
        assert "".join(streamed) == "".join(slow)
        assert len(streamed) >= min(6, times[-1] / 0.5), times  # every 2 s would be 2 or 3
