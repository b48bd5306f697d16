"""`chatrun serve` under hostile clients (issue 13): bounded buffers, no stuck sessions, timeouts,
edge checks, surrogates, roles per request. Real uvicorn on loopback, real sockets."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import os
import socket
import time

import httpx
import pytest
import websockets
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import chatrun
from chatrun.server import ServerLimits, create_app, wire
from chatrun.server.auth import Auth
from chatrun.server.guard import LOOPBACK_HOSTS, EdgePolicy
from chatrun.server.listen import ListenOptions
from server_support import ThreadServer, async_until_done, call, write_travel

SMALL = ServerLimits(send_timeout=1.0, max_outbound_bytes=64 * 1024)


@pytest.fixture
def travel(tmp_path):
    return chatrun.load_bot(write_travel(tmp_path / "bot"))


def serve(app, log_level: str = "warning", **listen):
    return ThreadServer(app, listen=ListenOptions(**listen), log_level=log_level)


# -- a raw WebSocket client: it sends, and reads only when told to --------------------------


def raw_ws(port: int, path: str = "/_chat/routes", origin: str | None = None) -> socket.socket:
    sock = socket.socket()
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    extra = f"Origin: {origin}\r\n" if origin else ""
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def ws_frame(text: str) -> bytes:
    payload = text.encode("utf-8", "surrogatepass")
    mask = os.urandom(4)
    n = len(payload)
    header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def read_until_closed(sock: socket.socket, within: float) -> bool:
    """Read and drop everything; True when the server closed the connection within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


async def one_turn(url: str, chat_id: str, message: str = "hi", resume: bool = False) -> list[dict]:
    async with websockets.connect(url + "/_chat/routes") as ws:
        await ws.send(json.dumps({"type": "Connect", "chatId": chat_id, "resume": resume, "extensions": True}))
        assert (await async_until_done(ws, 20))[-1]["type"] == "Completed"
        await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": chat_id, "data": {"userMessage": message}}))
        return await async_until_done(ws, 20)


# -- item 1: a flood of frames from a client that never reads -------------------------------


def flood(sock: socket.socket, frame: bytes, within: float, through_blocks: bool = False) -> str:
    """Send `frame` over and over without reading, for at most `within` seconds: "blocked" when
    a send did not finish in the socket's timeout (the server stopped reading), "cut off" when the
    server dropped the connection, "sent" when neither happened. With `through_blocks`, a blocked
    send is tried again: only being cut off (or the time) ends it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            sock.sendall(frame)
        except TimeoutError:
            if not through_blocks:
                return "blocked"
        except (ConnectionResetError, BrokenPipeError):
            return "cut off"
    return "sent"


@pytest.mark.slow  # ~6 s: floods a socket until the server cuts it off
def test_a_client_flooding_without_reading_is_cut_off_and_others_are_served(travel, fake):
    fake.responder = lambda body: {"text": "hello"}
    app = create_app([travel], "memory://", limits=SMALL)
    with serve(app) as srv:
        flooder = raw_ws(srv.port)
        flooder.settimeout(0.5)
        frame = ws_frame('{"type": "Nope", "chatId": "x"}')  # each one answered by Error + Failed
        # Bounded in time, not in frames: on an idle machine a server that has already decided
        # to cut the flooder off may read (and drop) a great many frames before its socket closes.
        stopped = flood(flooder, frame, within=60)
        assert stopped != "sent", "the server kept reading a client that reads nothing for 60 s"
        # Meanwhile another client is served as usual.
        frames = asyncio.run(one_turn(srv.ws_url, "other"))
        assert frames[-1]["type"] == "Completed" and any(f["data"] == "hello" for f in frames)
        # A send that blocked may only mean a busy server was slow to read: while its replies
        # still fit in the two sockets' buffers, the client is not yet known not to read. Go on
        # flooding, never reading: once the buffers are full the server's sends stall, and after
        # the send timeout (1 s here) it drops the connection and the replies it had not sent.
        if stopped == "blocked":
            stopped = flood(flooder, frame, within=60, through_blocks=True)
        assert stopped == "cut off", "a client that never reads kept its connection"
        assert read_until_closed(flooder, within=15)
        flooder.close()
        # Nothing kept running for it.
        assert asyncio.run(one_turn(srv.ws_url, "after"))[-1]["type"] == "Completed"


def test_a_send_that_never_finishes_gives_the_client_up_and_stops_the_writer():
    """Outbound's watchdog (one timer for the send in progress, not one per frame): a send the
    client's socket never takes ends the connection with its reason; the writer stops."""
    from chatrun.server.outbound import Outbound

    class StuckSocket:  # a client whose kernel buffers are full: a send never completes
        def __init__(self) -> None:
            self.sends = 0

        async def send_text(self, text: str) -> None:
            self.sends += 1
            await asyncio.Event().wait()

    async def run() -> tuple[Outbound, StuckSocket]:
        socket_ = StuckSocket()
        out = Outbound(socket_, max_bytes=1 << 20, send_timeout=0.05)
        out.put('{"type": "Stream"}')
        out.put('{"type": "Completed"}')
        await asyncio.wait_for(out.gone.wait(), 30)
        await out.close()
        return out, socket_

    out, stuck = asyncio.run(run())
    assert out.reason == "client not reading: a send did not finish in 0.05 s"
    assert stuck.sends == 1  # the writer stopped at the stuck send: the second frame was dropped
    assert out._watchdog is None  # no timer left to keep the connection alive


# -- item 2: a client that stops reading does not hold its session --------------------------


def test_a_client_that_stops_reading_does_not_lock_its_session(travel, fake):
    big = ["x" * 16_000] * 400  # ~6 MB of Stream frames: more than any socket buffer holds
    fake.queue({"text": "hi"}, {"chunks": big}, {"text": "second client served"})
    app = create_app([travel], "memory://", limits=SMALL)
    with serve(app) as srv:
        asyncio.run(one_turn(srv.ws_url, "shared"))  # creates the session
        slow = raw_ws(srv.port)
        slow.sendall(ws_frame(json.dumps({"type": "Connect", "chatId": "shared", "resume": True, "extensions": True})))
        slow.sendall(ws_frame(json.dumps({"type": "ChatRouteMessage", "chatId": "shared", "data": {"userMessage": "big"}})))
        time.sleep(0.5)  # its turn starts; it never reads

        async def second() -> list[dict]:
            return await asyncio.wait_for(one_turn(srv.ws_url, "shared", "me too", resume=True), 30)

        frames = asyncio.run(second())
        assert frames[-1]["type"] == "Completed"
        assert any(f["data"] == "second client served" for f in frames)
        slow.close()
        # The slow client's turn was committed: the second turn's model request saw it.
        contents = [m.get("content") for m in fake.requests[-1]["messages"]]
        assert "big" in contents and "".join(big) in contents


def holders(live: list) -> str:
    """What a failure needs to be traced: each live connection's extensions, its reference count
    and what the collector sees holding it (nothing seen means a C-level or running-frame hold),
    and the threads still running (a server of an earlier test still shutting down)."""
    import sys
    import threading

    described = []
    for conn in live:
        seen = [type(r).__name__ for r in gc.get_referrers(conn) if r is not live]
        held = sys.getrefcount(conn) - 3  # beyond `live`, `conn` and the call's own
        described.append(f"extensions {[type(e).__name__ for e in conn.extensions]}, "
                         f"{held} references, held by {seen or 'nothing the collector sees'}")
    return f"{described}; threads {[t.name for t in threading.enumerate()]}"


@pytest.mark.slow  # starts a server
def test_a_closed_websocket_is_freed_at_once_with_its_compression_state(travel, fake):
    """A WebSocket's permessage-deflate contexts are ~50 KB of zlib memory the cyclic collector
    neither sees nor counts. websockets' parser (a generator whose frame refers back to the
    connection) waited for an end of stream uvicorn never passes on, so every closed connection
    lived on as garbage until a full collection, which the server's tuned collector makes rare:
    ~20 MB of RSS after a few hundred conversations (bench/bench_memory_bound.py). With the
    collector off, no connection may outlive its socket."""
    from websockets.server import ServerProtocol

    fake.responder = lambda body: {"text": "hi"}
    app = create_app([travel], "memory://")
    with serve(app) as srv:
        gc.collect()
        gc.disable()
        try:
            for i in range(3):
                asyncio.run(one_turn(srv.ws_url, f"freed-{i}"))  # the client offers permessage-deflate
            deadline = time.monotonic() + 30  # for the server's side of the last close
            # Counted, not kept: a list kept from one look to the next would itself hold a
            # connection the server lets go of meanwhile, and find it again at the next look.
            while any(type(o) is ServerProtocol for o in gc.get_objects()) and time.monotonic() < deadline:
                time.sleep(0.05)
            live = [o for o in gc.get_objects() if type(o) is ServerProtocol]
            assert live == [], f"{len(live)} closed connections still alive: {holders(live)}"
        finally:
            gc.enable()


# -- item 3: lone surrogates ----------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=0, max_size=5), st.characters(categories=["Cs"]), st.text(max_size=5))
def test_client_text_with_a_lone_surrogate_is_a_bad_request(before, surrogate, after):
    text = json.dumps({"chatId": before + surrogate + after})  # valid JSON: the surrogate is escaped
    with pytest.raises(wire.RequestFailed) as caught:
        wire.load_json(text, "frame")
    assert caught.value.reason == wire.BAD_REQUEST and "surrogate" in caught.value.message


def test_lone_surrogates_from_clients_are_refused_at_the_edge(travel, fake):
    fake.responder = lambda body: {"text": "fine"}
    app = create_app([travel], "memory://")
    with serve(app) as srv:

        async def run() -> list[list[dict]]:
            async with websockets.connect(srv.ws_url + "/_chat/routes") as ws:
                out = []
                await ws.send('{"type": "Connect", "chatId": "ok", "extensions": true}')
                connected = await async_until_done(ws)
                await ws.send('{"type": "Connect", "chatId": "\\ud800"}')
                out.append(await async_until_done(ws))
                out.append(connected)
                await ws.send('{"type": "ChatRouteMessage", "chatId": "ok", "data": {"userMessage": "a\\udc00b"}}')
                out.append(await async_until_done(ws))
                return out

        bad_id, connected, bad_message = asyncio.run(run())
        assert [f["type"] for f in bad_id] == ["Error", "Failed"] and bad_id[-1]["data"] == "BadRequest"
        assert connected[-1]["type"] == "Completed"  # the connection still works
        assert bad_message[-1]["data"] == "BadRequest" and "surrogate" in bad_message[0]["data"]
        assert fake.requests == []
        headers = {"content-type": "application/json"}
        for url, body in [("/bots/travel/sessions", '{"id": "\\ud800"}'),
                          ("/bots/travel/sessions/ok/messages", '{"userMessage": "\\udfff"}')]:
            r = httpx.post(srv.url + url, content=body, headers=headers)
            assert r.status_code == 400 and r.headers["content-type"] == "application/json"
            assert r.json()["error"] == "BadRequest" and "surrogate" in r.json()["message"]
        history = httpx.get(srv.url + "/bots/travel/sessions/ok").json()["history"]
        assert history == []


@pytest.mark.slow
def test_uvicorn_reads_a_websocket_frame_only_up_to_twice_the_frame_limit(travel):
    # uvicorn read frames up to its own 16 MiB whole before chatrun's 64 KiB limit refused them.
    # Now: a little over the limit is still TooLarge on a usable connection; far over is 1009.
    app = create_app([travel], "memory://", limits=ServerLimits(max_frame_bytes=2000))

    async def run(url: str) -> None:
        async with websockets.connect(url + "/_chat/routes", max_size=None) as ws:
            await ws.send(json.dumps({"type": "Connect", "chatId": "w", "extensions": True}))
            assert (await async_until_done(ws))[-1]["type"] == "Completed"
            await ws.send(json.dumps({"type": "Disconnect", "chatId": "w", "pad": "x" * 3000}))
            error, failed = await async_until_done(ws)
            assert failed["data"] == "TooLarge" and "limit of 2000 bytes" in error["data"], error
            await ws.send(json.dumps({"type": "Disconnect", "chatId": "w", "pad": "x" * 5000}))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009, closed.value

    with serve(app) as srv:
        asyncio.run(run(srv.ws_url))
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


@pytest.mark.slow
def test_a_text_frame_that_is_not_utf8_closes_with_1007_without_a_server_error(travel):
    # uvicorn closed it 1007 as RFC 6455 says, but logged the client's bytes as a server ERROR
    # with a traceback: any client could fill the error log with them.
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")
    try:
        with serve(create_app([travel], "memory://")) as srv:
            logger.addHandler(handler)  # after uvicorn configured its logging, which drops handlers
            sock = raw_ws(srv.port)
            sock.sendall(ws_frame('{"type": "Connect", "chatId": "\udcff"}'))  # surrogatepass: no UTF-8
            sock.settimeout(10)
            close = sock.recv(16)
            sock.close()
            assert close[:1] == b"\x88" and int.from_bytes(close[2:4], "big") == 1007, close
            assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
    finally:
        logger.removeHandler(handler)
    assert [r for r in records if r.levelno >= logging.ERROR or r.exc_info] == []


@pytest.mark.parametrize(
    "answer",
    [{"text": "bad \ud800 text"}, {"chunks": ["bad ", "\udc00", "text"]}, call("remember_name", name="\ud83d"),
     {"chunks": ["ends high \ud83d"]}],
    ids=["reply", "stream", "tool-arguments", "stream-ends-half-pair"],
)
def test_a_lone_surrogate_from_the_model_fails_the_turn_cleanly(travel, fake, answer):
    fake.queue(answer)
    app = create_app([travel], "memory://")
    with serve(app) as srv:
        frames = asyncio.run(one_turn(srv.ws_url, "m"))
        assert sum(f["type"] in ("Completed", "Failed") for f in frames) == 1
        assert any(f["type"] == "Error" for f in frames)  # the user's safe message; the detail is below
        session = httpx.get(srv.url + "/bots/travel/sessions/m")
        assert session.status_code == 200
        [attempt] = session.json()["history"]  # the failed attempt is recorded, nothing else
        assert attempt["ok"] is False and "surrogate" in attempt["error"]
        # A model error, as docs/protocol.md promises (not an internal error of chatrun's)...
        assert attempt["error"].startswith("the model failed on route main_menu")
        assert [f["data"] for f in frames if f["type"] == "Error"] == [chatrun.events.MODEL_FAILED_TEXT]
        assert all(wire.lone_surrogate_at(f) is None for f in frames)  # ...and no frame carried one


ECHO_NAME = """
  greet:
    description: Greet the traveller by name
    parameters: {type: object, properties: {name: {type: string}}, required: [name]}
    action: {set: {state.traveller_name: "{{ args.name }}"}, message: "Hello {{ args.name }}", immediate: true}
"""


@pytest.mark.parametrize("arguments", ['{"name": "\\ud800"}', '{"name": "ok \\udfff"}'])
def test_a_lone_surrogate_in_escaped_tool_arguments_is_a_model_error_on_http_and_v1(fake, tmp_path, arguments):
    """The arguments' JSON is plain ASCII; its escapes make the lone surrogate. It used to reach
    a Message event and the state, then fail the commit: HTTP 500, no history entry."""
    import openai

    path = write_travel(tmp_path / "bot")
    path.write_text(path.read_text().replace("tools: [book_flight, vip_lounge, remember_name]",
                                             "tools: [book_flight, vip_lounge, remember_name, greet]") + ECHO_NAME)
    travel = chatrun.load_bot(path)
    bad = {"tool_calls": [{"name": "greet", "arguments": arguments}]}
    app = create_app([travel], f"sqlite:///{tmp_path / 'chat.db'}")
    with serve(app) as srv:
        fake.queue(bad)
        assert httpx.post(srv.url + "/bots/travel/sessions", json={"id": "h"}).status_code == 201
        said = httpx.post(srv.url + "/bots/travel/sessions/h/messages", json={"userMessage": "I am Ann"})
        assert said.status_code != 500, said.text
        assert said.json()["ok"] is False and wire.lone_surrogate_at(said.json()) is None
        [attempt] = httpx.get(srv.url + "/bots/travel/sessions/h").json()["history"]
        assert attempt["ok"] is False and attempt["error"].startswith("the model failed")
        assert httpx.get(srv.url + "/bots/travel/sessions/h").json()["turn"] == 0  # rolled back
        fake.queue(bad)
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as client:
            with pytest.raises(openai.InternalServerError) as failed:
                client.chat.completions.create(model="travel", messages=[{"role": "user", "content": "I am Ann"}])
        assert failed.value.body["code"] == "turn_failed"  # the turn failed, in OpenAI's shape


def test_a_surrogate_pair_split_across_stream_chunks_is_joined(travel, fake):
    fake.queue({"chunks": ["smile \ud83d", "\ude00 done"]})
    app = create_app([travel], "memory://")
    with serve(app) as srv:
        frames = asyncio.run(one_turn(srv.ws_url, "p"))
        assert frames[-1]["type"] == "Completed"
        assert "".join(f["data"] for f in frames if f["type"] == "Stream") == "smile \U0001f600 done"
        [turn] = httpx.get(srv.url + "/bots/travel/sessions/p").json()["history"]
        assert turn["events"][0]["data"] == "smile \U0001f600 done"


# -- item 4: header and body timeouts, a connection cap -------------------------------------


def test_dripped_headers_and_bodies_time_out(travel):
    app = create_app([travel], "memory://", edge=EdgePolicy(body_timeout=1.0))
    with serve(app, header_timeout=1.0) as srv:
        drip = socket.create_connection(("127.0.0.1", srv.port))
        drip.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(3):
            time.sleep(0.2)
            drip.sendall(b"X-Drip: 1\r\n")
        drip.settimeout(10)
        answer = drip.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and b"RequestTimeout" in answer
        assert read_until_closed(drip, 5)

        body = socket.create_connection(("127.0.0.1", srv.port))
        body.sendall(b"POST /bots/travel/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\"")
        body.settimeout(10)
        answer = body.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and b'"RequestTimeout"' in answer
        body.close()
        assert httpx.get(srv.url + "/health").status_code == 200


def test_headers_over_the_limit_are_refused_431_not_held(travel):
    # httptools keeps a request's headers whatever their size: one header of 20 MB, sent within the
    # header timeout, was held whole and then served 200 (a thousand such connections, 20 GB).
    # Here one byte over the limit (and no more: everything sent is read, the answer is not lost
    # to a reset), the headers not even finished.
    app = create_app([travel], "memory://")
    with serve(app) as srv:
        big = socket.create_connection(("127.0.0.1", srv.port))
        start = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
        big.sendall(start + b"a" * (64 * 1024 + 1 - len(start)))
        big.settimeout(5)  # (the header timeout, 10 s, would answer 408)
        answer = b""
        while chunk := big.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert body == {"error": "TooLarge", "message": "the request's line and headers are over the limit of "
                                                         "65536 bytes"}
        # Headers within it (cookies, a long token) are served, one chunk or dripped in several.
        assert httpx.get(srv.url + "/health", headers={"X-Fits": "b" * 60_000}).status_code == 200
        drip = socket.create_connection(("127.0.0.1", srv.port))
        drip.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(6):
            drip.sendall(b"X-Part: " + b"c" * 8000 + b"\r\n")
        drip.sendall(b"\r\n")
        drip.settimeout(10)
        assert drip.recv(4096).startswith(b"HTTP/1.1 200")
        drip.close()


def test_a_keep_alive_connections_later_request_has_its_own_header_deadline(travel):
    # One header timer a connection (listen.py): requests that finish their headers in time go on
    # past the first deadline, and a later request that drips its headers still gets its 408.
    app = create_app([travel], "memory://")
    with serve(app, header_timeout=1.0) as srv:
        conn = socket.create_connection(("127.0.0.1", srv.port))
        conn.settimeout(10)
        started = time.monotonic()
        while time.monotonic() - started < 1.5:  # well past the connection's first deadline
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _one_response(conn).startswith(b"HTTP/1.1 200")
            time.sleep(0.1)
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
        assert _one_response(conn).startswith(b"HTTP/1.1 408")
        assert read_until_closed(conn, 5)


def _one_response(sock: socket.socket) -> bytes:
    """One whole HTTP response of a keep-alive connection (its Content-Length body included)."""
    got = b""
    while b"\r\n\r\n" not in got:
        got += sock.recv(4096)
    head, _, body = got.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


def test_over_the_connection_cap_new_clients_get_503(travel):
    app = create_app([travel], "memory://")
    with serve(app, max_connections=3, header_timeout=60) as srv:
        held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(3)]
        for sock in held:
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # headers never finished
        time.sleep(0.3)
        r = httpx.get(srv.url + "/health", timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"] == "Unavailable" and "--max-connections" in r.json()["message"]
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 10
        while httpx.get(srv.url + "/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)


@pytest.mark.slow
def test_a_request_that_is_not_valid_http_gets_the_json_error_body(travel):
    # uvicorn answered "Invalid HTTP request received." as text/plain; every other refusal is JSON.
    app = create_app([travel], "memory://")
    head = b"POST /bots/travel/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with serve(app) as srv:
        for broken in (head + b"Content-Length: abc\r\n\r\n{}",
                       head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
                       b"GET /health HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n"):
            sock = socket.create_connection(("127.0.0.1", srv.port))
            sock.settimeout(10)
            sock.sendall(broken)
            answer = _one_response(sock)
            sock.close()
            head_part, _, body = answer.partition(b"\r\n\r\n")
            assert head_part.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head_part.lower(), answer
            assert json.loads(body)["error"] == "BadRequest" and "HTTP" in json.loads(body)["message"]
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


# -- item 5: the body limit holds while reading ---------------------------------------------


def test_a_body_over_the_limit_is_refused_before_it_is_read(travel):
    app = create_app([travel], "memory://")
    with serve(app) as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.sendall(b"POST /bots/travel/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 67108864\r\n\r\n")  # 64 MiB announced, none sent
        sock.settimeout(10)
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413") and b'"TooLarge"' in answer
        sock.close()

        def chunks():
            for _ in range(1000):  # 16 MiB without a Content-Length
                yield b"x" * 16384

        r = httpx.post(srv.url + "/bots/travel/sessions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"] == "TooLarge"


# -- item 6: cross-site use -----------------------------------------------------------------


def test_foreign_origins_hosts_and_simple_posts_are_refused(travel, fake):
    fake.responder = lambda body: {"text": "ok"}
    app = create_app([travel], "memory://", edge=EdgePolicy(allowed_origins=("https://chat.example.com",)))
    with serve(app) as srv:

        async def open_ws(origin: str) -> str:
            try:
                async with websockets.connect(srv.ws_url + "/_chat/routes", origin=origin) as ws:
                    await ws.send(json.dumps({"type": "Connect", "chatId": origin.replace("/", "_")}))
                    return (await async_until_done(ws))[-1]["type"]
            except websockets.InvalidStatus as exc:
                return f"HTTP {exc.response.status_code}"

        assert asyncio.run(open_ws("http://evil.example")) == "HTTP 403"
        assert asyncio.run(open_ws(srv.url)) == "Completed"  # same origin: the server's own page
        assert asyncio.run(open_ws("https://chat.example.com")) == "Completed"  # allowed

        simple = httpx.post(srv.url + "/bots/travel/sessions", content='{"id": "x"}', headers={"content-type": "text/plain"})
        assert simple.status_code == 415 and simple.json()["error"] == "UnsupportedMediaType"
        foreign = httpx.post(srv.url + "/bots/travel/sessions", json={"id": "y"}, headers={"origin": "http://evil.example"})
        assert foreign.status_code == 403 and foreign.json()["error"] == "Forbidden"
        rebound = httpx.get(srv.url + "/bots", headers={"host": "evil.example"})
        assert rebound.status_code == 400 and rebound.json()["error"] == "BadHost"
        assert httpx.post(srv.url + "/bots/travel/sessions", json={"id": "z"}).status_code == 201


def test_an_allowed_sites_preflight_is_answered_and_the_edges_refusals_are_readable_by_it(travel):
    # (tests/test_browser_cors.py: the same in Chromium.) A preflight of another site is not answered
    # for it; the server's own page needs no CORS.
    app = create_app([travel], "memory://", edge=EdgePolicy(allowed_origins=("https://chat.example.com",)))
    with serve(app) as srv:
        asked = {"access-control-request-method": "POST", "access-control-request-headers": "authorization,content-type"}
        ok = httpx.options(srv.url + "/bots/travel/sessions", headers={"origin": "https://chat.example.com", **asked})
        assert ok.status_code == 204 and ok.headers["access-control-allow-origin"] == "https://chat.example.com"
        assert ok.headers["access-control-allow-headers"] == "authorization,content-type"
        assert "POST" in ok.headers["access-control-allow-methods"]
        foreign = httpx.options(srv.url + "/bots/travel/sessions", headers={"origin": "http://evil.example", **asked})
        assert "access-control-allow-origin" not in foreign.headers
        typed = httpx.post(srv.url + "/bots/travel/sessions", content="{}",
                           headers={"origin": "https://chat.example.com", "content-type": "text/plain"})
        assert typed.status_code == 415 and typed.headers["access-control-allow-origin"] == "https://chat.example.com"
        own = httpx.post(srv.url + "/bots/travel/sessions", json={}, headers={"origin": srv.url})
        assert own.status_code == 201 and "access-control-allow-origin" not in own.headers


def test_the_edges_refusals_on_v1_have_openai_shape(travel):
    # The Host, Origin and Content-Type checks answered /v1 clients {"error": "BadHost", ...}: not
    # the error object docs/openai-api.md (and /openapi.json's 400/403/415) promise there.
    from fastapi.testclient import TestClient

    app = create_app([travel], "memory://", edge=EdgePolicy(allowed_hosts=(*LOOPBACK_HOSTS, "testserver")))
    body = {"model": "travel", "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(app) as client:
        refusals = {
            415: client.post("/v1/chat/completions", content=json.dumps(body), headers={"content-type": "text/plain"}),
            403: client.post("/v1/responses", json=body, headers={"origin": "https://evil.example"}),
            400: client.post("/v1/chat/completions", json=body, headers={"host": "evil.example"}),
        }
        for status, answer in refusals.items():
            error = answer.json()["error"]
            assert answer.status_code == status and isinstance(error, dict), answer.text
            assert {"message", "type", "code"} <= set(error) and error["message"], answer.text
        assert refusals[415].json()["error"]["code"] == "unsupported_media_type"
        assert refusals[403].json()["error"]["type"] == "permission_error"
        # the HTTP API's refusals keep theirs
        plain = client.post("/bots/travel/sessions", content="{}", headers={"content-type": "text/plain"})
        assert plain.json()["error"] == "UnsupportedMediaType"


def test_v1_codes_of_the_shared_refusals_are_snake_case_like_its_own(travel, fake):
    # A shared refusal (wire.RequestFailed) reached a /v1 client with the HTTP API's reason as its
    # code ("BadRequest") beside /v1's own "model_not_found": one spelling now.
    from fastapi.testclient import TestClient

    body = {"model": "travel", "messages": [{"role": "user", "content": "hi"}]}
    app = create_app([travel], "memory://", edge=EdgePolicy(allowed_hosts=(*LOOPBACK_HOSTS, "testserver")))
    with TestClient(app) as client:
        answer = client.post("/v1/chat/completions", json=body, headers={"X-Chatrun-Session": "a/b"})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "bad_request", answer.text
    assert fake.requests == []


@pytest.mark.slow
def test_the_listeners_408_and_503_on_v1_have_openai_shape(travel):
    # A dripped /v1 request's 408 and a /v1 request over the connection cap's 503 came in the HTTP
    # API's shape ({"error": "RequestTimeout", ...}); the HTTP API keeps its own.
    app = create_app([travel], "memory://")
    with serve(app, max_connections=3, header_timeout=1.0) as srv:
        drip = socket.create_connection(("127.0.0.1", srv.port))
        drip.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        drip.settimeout(10)
        head, _, body = _one_response(drip).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), head
        error = json.loads(body)["error"]
        assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error", body
    with serve(app, max_connections=3, header_timeout=60) as srv:
        held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(2)]
        for sock in held:
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # headers never finished
        time.sleep(0.3)
        answer = httpx.get(srv.url + "/v1/models", timeout=10)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.text
        error = answer.json()["error"]
        assert error["code"] == "unavailable" and "--max-connections" in error["message"], answer.text
        plain = httpx.get(srv.url + "/health", timeout=10)
        assert plain.status_code == 503 and plain.json()["error"] == "Unavailable"
        for sock in held:
            sock.close()


def test_serve_help_says_allow_origin_also_opens_the_http_api_to_that_origin():
    """--allow-origin answers an allowed site's fetch calls with CORS headers (docs/protocol.md,
    "Origin, Host and content type"): its help says so, not only the WebSocket and POSTs."""
    import click
    from click.testing import CliRunner

    from chatrun.cli import main

    serve = main.get_command(click.Context(main), "serve")
    [option] = [p for p in serve.params if p.name == "allow_origin"]
    assert "HTTP API" in str(option.help) and "(CORS)" in str(option.help)
    help_text = " ".join(CliRunner().invoke(main, ["serve", "--help"]).output.split())
    assert "(CORS)" in help_text


def test_serve_binds_loopback_by_default_and_warns_when_exposed_without_auth(tmp_path):
    from click.testing import CliRunner

    from chatrun.cli import main

    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "[default: 127.0.0.1]" in help_text and "--allow-origin" in help_text
    # An unusable port makes serve stop right after its checks, before it would listen.
    bot = write_travel(tmp_path / "bot")
    result = CliRunner().invoke(main, ["serve", str(bot), "--host", "0.0.0.0", "--port", "-1", "--store", "memory://"])
    assert "warning: listening on 0.0.0.0 without --auth" in result.output
    assert "any Host name is accepted" in result.output


# -- item 7: roles are those of each request's token ----------------------------------------


def test_roles_come_from_each_requests_token_not_the_sessions_opener(travel, fake):
    auth = Auth.from_mapping({"tokens": {"ana-staff-123": {"principal": "ana", "roles": ["staff"]},
                                        "ana-plain-456": {"principal": "ana"}}})
    app = create_app([travel], "memory://", auth=auth)
    fake.queue(call("vip_lounge"), {"text": "Sorry."})
    with serve(app) as srv:
        staff = {"authorization": "Bearer ana-staff-123"}
        plain = {"authorization": "Bearer ana-plain-456"}
        assert httpx.post(srv.url + "/bots/travel/sessions", json={"id": "s"}, headers=staff).status_code == 201
        r = httpx.post(srv.url + "/bots/travel/sessions/s/messages", json={"userMessage": "lounge"}, headers=plain)
        assert r.status_code == 200
        assert r.json()["route"] == "main_menu", "the token without the staff role entered the lounge"
        tool_result = fake.requests[-1]["messages"][-1]
        assert tool_result["role"] == "tool" and "not allowed" in tool_result["content"]


# -- item 8: tokens stay out of logs --------------------------------------------------------


def test_tokens_are_redacted_from_access_logs(travel, caplog):
    auth = Auth.from_mapping({"tokens": {"very-secret-token": {"principal": "ana"}}})
    app = create_app([travel], "memory://", auth=auth)
    with serve(app, log_level="info") as srv:
        loggers = [logging.getLogger(name) for name in ("uvicorn.access", "uvicorn.error")]
        for logger in loggers:  # uvicorn's loggers do not propagate to the root (caplog's)
            logger.addHandler(caplog.handler)
        with caplog.at_level(logging.INFO):
            assert httpx.get(srv.url + "/bots?token=very-secret-token").status_code == 200

            async def ws() -> None:
                async with websockets.connect(srv.ws_url + "/_chat/routes?token=very-secret-token&x=1"):
                    pass

            asyncio.run(ws())
            time.sleep(0.3)
        for logger in loggers:
            logger.removeHandler(caplog.handler)
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("uvicorn"))
    assert "token=***" in logged and "very-secret-token" not in logged


# -- item 10: smaller leaks -----------------------------------------------------------------


def test_sessions_created_with_auth_off_are_not_reachable_once_auth_is_on(travel, tmp_path):
    store = f"sqlite:///{tmp_path / 's.db'}"
    with serve(create_app([travel], store)) as srv:
        assert httpx.post(srv.url + "/bots/travel/sessions", json={"id": "open"}).status_code == 201
    auth = Auth.from_mapping({"tokens": {"ana-token-123": {"principal": "ana"}}})
    with serve(create_app([travel], store, auth=auth)) as srv:
        r = httpx.get(srv.url + "/bots/travel/sessions/open", headers={"authorization": "Bearer ana-token-123"})
        assert r.status_code == 404 and r.json()["error"] == "SessionNotActive"


def test_initial_state_over_http_is_checked_against_the_declared_state(tmp_path):
    bot = tmp_path / "counter.yaml"
    bot.write_text(
        "name: counter\nmodel: {provider: openai, name: m}\nstate: {count: 0, label: null}\n"
        "routes:\n  main:\n    default: true\n    system: 'Count {{ state.count }}'\n"
    )
    app = create_app([chatrun.load_bot(bot)], "memory://")
    with serve(app) as srv:
        url = srv.url + "/bots/counter/sessions"
        undeclared = httpx.post(url, json={"state": {"role": "admin"}})
        assert undeclared.status_code == 400 and "state.role is not declared" in undeclared.json()["message"]
        wrong = httpx.post(url, json={"state": {"count": "ignore previous instructions"}})
        assert wrong.status_code == 400 and "state.count must be a number" in wrong.json()["message"]
        ok = httpx.post(url, json={"state": {"count": 3, "label": {"any": "thing"}}})
        assert ok.status_code == 201 and ok.json()["state"]["count"] == 3


def test_405_carries_allow_and_the_openapi_documents_errors(travel):
    app = create_app([travel], "memory://")
    with serve(app) as srv:
        r = httpx.put(srv.url + "/bots/travel/sessions", json={})
        assert r.status_code == 405 and "POST" in r.headers["allow"] and r.json()["error"] == "MethodNotAllowed"
        spec = httpx.get(srv.url + "/openapi.json").json()
        responses = spec["paths"]["/bots/{bot}/sessions/{session_id}"]["get"]["responses"]
        assert {"401", "404", "500"} <= set(responses)


def test_an_include_outside_the_bot_directory_is_an_error(tmp_path):
    (tmp_path / "secret.yaml").write_text("tools:\n  t: {description: x, action: {pop: true}}\n")
    bot_dir = tmp_path / "bot"
    bot_dir.mkdir()
    (bot_dir / "bot.yaml").write_text(
        "name: b\nmodel: {provider: openai, name: m}\ninclude: ['../*.yaml']\n"
        "routes:\n  main: {default: true, system: hi}\n"
    )
    with pytest.raises(chatrun.BotError) as caught:
        chatrun.load_bot(bot_dir)
    assert any("outside the bot directory" in d.message for d in caught.value.diagnostics)


def documented_refusal(case) -> bool:
    """A request each of whose values the document allows, refused for a rule across two of them
    that OpenAPI cannot state (docs/operators.md states it, tests/test_operator_inbox.py tests it):
    GET /pending's `order=recent` with `role` or `older_than` is a 400 naming the default order."""
    query = case.query or {}
    return case.path == "/pending" and query.get("order") == "recent" and bool({"role", "older_than"} & set(query))


@pytest.mark.slow  # ~13 s of CPU: schemathesis walks every operation
def test_the_api_conforms_to_its_openapi_document(travel, fake):
    """schemathesis with every check, positive and negative data, against the app (bounded:
    a few examples per operation and mode)."""
    import schemathesis
    from hypothesis import HealthCheck
    from hypothesis import settings as hsettings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.checks import CHECKS, load_all_checks
    from schemathesis.generation import GenerationMode

    load_all_checks()
    every_check = CHECKS.get_all()
    fake.responder = lambda body: {"text": "ok"}
    app = create_app([travel], "memory://", edge=EdgePolicy(allowed_hosts=(*LOOPBACK_HOSTS, "testserver")))
    # Schemathesis' defaults plus 413: a userMessage over its documented maxLength is TooLarge.
    config = schemathesis.Config.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": [
        400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"]}}})
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    ran = [0]

    def exercise(operation, mode) -> None:
        @hsettings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                   derandomize=True)  # the same examples every run: CI does not flake
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case):
            assume(not documented_refusal(case))
            ran[0] += 1
            case.call_and_validate(checks=every_check)

        try:
            check()
        except Unsatisfiable:  # no invalid input exists for an operation without parameters
            assert mode == GenerationMode.NEGATIVE

    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            exercise(operation, mode)
    assert ran[0] >= 10
