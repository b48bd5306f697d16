"""Scale-out: `chatrun serve` replicas (real subprocesses) on one real Redis, a counter bot,
the fake OpenAI server answering after a delay. Nothing lost, nothing run twice, nothing
reordered; kill -9 mid-turn; a lease lost during a long model call; deletes across replicas;
two processes on one SQLite file; SIGTERM drains.

Bounded: a few dozen turns, a handful of kills. Every test here starts `chatrun serve`
processes: marked `subprocess` (so `slow` too); they run in the default suite."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
import time
import uuid
from collections import Counter

import httpx
import pytest
import websockets

from chatrun.server.drain import CLOSE_TIMEOUT
from chatrun.testing.fake_openai import FakeOpenAI
from redis_support import Replica
from server_support import async_until_done
from store_params import store_url

COUNTER = """
name: counter
description: Counts the turns it sees.
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
memory: {type: message_window, max_messages: 1000}
state: {count: 0}
routes:
  main:
    default: true
    system: "Count so far: {{ state.count }}"
    tools: [inc]
tools:
  inc:
    description: Count one
    action: {set: {state.count: "{{ state.count + 1 }}"}, message: "counted", immediate: true}
"""

DELAY = 0.15  # the fake model's answer time

# Leases are renewed every TTL/3 while held. The shared replicas keep the default TTL (10 s): a
# replica starved of CPU for seconds on a busy machine must not lose a lease mid-turn, which would
# fail the turn with a 409 the test did not cause. Only the test of a lost lease shortens it, on a
# replica of its own (the other replica of that test keeps the default), and loses the lease by
# freezing the holder (SIGSTOP), not by timing.
SHORT_LEASE_TTL = 3.0
SLACK = 10.0  # seconds a loaded 2-core machine may add to a bound (the bound is what is tested)

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def counter_bot(tmp_path_factory):
    path = tmp_path_factory.mktemp("bot") / "counter.yaml"
    path.write_text(textwrap.dedent(COUNTER))
    return str(path)


@pytest.fixture(scope="module")
def shared_fake():
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fake(shared_fake):
    shared_fake.reset()
    shared_fake.responder = lambda body: {"tool_calls": [{"name": "inc", "arguments": {}}], "delay": DELAY}
    return shared_fake


@pytest.fixture(scope="module", params=["redis", "postgres"])
def started_trio(request, counter_bot, shared_fake):
    """Three replicas on one Redis or one PostgreSQL (issue 38: the same chaos on both), shared
    by the tests of this module (each test uses its own session ids), with the default lease
    TTL: a killed replica's sessions free up within it."""
    group = replicas(3, counter_bot, store_url(request, None), shared_fake)
    yield group
    for r in group:
        r.signal(signal.SIGCONT)
        r.kill()


@pytest.fixture
def trio(started_trio):
    for r in started_trio:  # a test may have killed one
        if r.proc.poll() is not None:
            r.start()
    return started_trio


def replicas(n: int, bot: str, store: str, fake: FakeOpenAI, *extra: str) -> list[Replica]:
    started = [Replica(bot, store, fake.base_url, *extra).start(wait=False) for _ in range(n)]
    try:
        for r in started:
            r.wait_ready()
    except BaseException:
        for r in started:  # none left behind
            r.kill()
        raise
    return started


async def say(http: httpx.AsyncClient, replica: Replica, sid: str, text: str, key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return await http.post(f"{replica.url}/bots/counter/sessions/{sid}/messages", json={"userMessage": text},
                           headers=headers)


def stored(replica: Replica, sid: str) -> dict:
    return httpx.get(f"{replica.url}/bots/counter/sessions/{sid}", timeout=30).json()


def check_consistent(session: dict) -> list[dict]:
    """The committed turns: numbered 1..N in order, and the counter agrees with them."""
    ok = [h for h in session["history"] if h["ok"]]
    assert [h["turn"] for h in ok] == list(range(1, len(ok) + 1))
    assert session["turn"] == len(ok) and session["state"]["count"] == len(ok)
    return ok


def test_three_replicas_one_session_alternately_and_concurrently_nothing_lost_or_doubled(trio, fake):
    group = trio
    async def drive() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as http:
            assert (await http.post(f"{group[0].url}/bots/counter/sessions", json={"id": "c"})).status_code == 201
            for i in range(9):  # alternately: each replica continues what another one did
                reply = await say(http, group[i % 3], "c", f"a{i}")
                assert reply.status_code == 200 and reply.json()["turn"] == i + 1, reply.text
            # Concurrently: 15 requests spread over the three replicas at once.
            replies = await asyncio.gather(*(say(http, group[i % 3], "c", f"b{i}") for i in range(15)))
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
            return sorted(r.json()["turn"] for r in replies)

    turns = asyncio.run(drive())
    assert turns == list(range(10, 25))  # every concurrent request got its own turn
    for replica in group:  # each replica sees the same, complete session
        session = stored(replica, "c")
        ok = check_consistent(session)
        assert len(ok) == 24
        inputs = [h["input"] for h in ok]
        assert inputs[:9] == [f"a{i}" for i in range(9)]
        assert sorted(inputs[9:]) == sorted(f"b{i}" for i in range(15))
    # Each model call saw every earlier turn: system + 3 messages (user, tool call, result) per earlier turn + the new one.
    calls = [r for r in fake.requests]
    assert sorted(len(r["messages"]) for r in calls) == [2 + 3 * k for k in range(24)]


def test_kill_9_mid_turn_loses_nothing_acknowledged_and_retries_never_run_twice(trio, fake):
    group = trio
    acknowledged: dict[str, int] = {}  # request id -> turn, as the client was told
    sessions = ["k0", "k1", "k2"]
    retries: list[str] = []
    in_flight: dict[str, int] = {}  # session -> the replica its request is waiting on
    try:
        async def client(http: httpx.AsyncClient, sid: str, n: int) -> None:
            """Send n messages, each with its own request id; on any failure retry the same id
            on the next replica until it is answered."""
            for i in range(n):
                key, target = str(uuid.uuid4()), hash((sid, i)) % 3
                while True:
                    in_flight[sid] = target
                    try:
                        reply = await say(http, group[target], sid, f"{sid}-{i}", key)
                        if reply.status_code == 200:
                            acknowledged[key] = reply.json()["turn"]
                            break
                    except httpx.HTTPError:
                        pass  # the replica died under us: in doubt, retry with the same id
                    finally:
                        in_flight.pop(sid, None)
                    retries.append(key)
                    target = (target + 1) % 3
                    await asyncio.sleep(0.1)

        async def killer() -> None:
            # Each round kills a replica a request is waiting on (the fake model answers in DELAY
            # s, so the kill lands mid-turn), not one chosen by the clock: on a fast machine the
            # clients may be between requests, or done, when a fixed time comes.
            for round_ in range(3):
                await asyncio.sleep(0.3)
                while not in_flight and len(acknowledged) < 24:
                    await asyncio.sleep(0.01)
                if not in_flight:
                    return  # every turn answered: the assertion below says the kills hit nothing
                busy = sorted(set(in_flight.values()))
                victim = group[busy[round_ % len(busy)]]
                victim.kill()  # kill -9, turns in flight
                await asyncio.to_thread(victim.start)

        async def drive() -> None:
            async with httpx.AsyncClient(timeout=60) as http:
                for sid in sessions:
                    await http.post(f"{group[0].url}/bots/counter/sessions", json={"id": sid})
                await asyncio.gather(killer(), *(client(http, sid, 8) for sid in sessions))

        asyncio.run(drive())
        assert len(acknowledged) == 24 and retries  # the kills hit requests in flight
        for sid in sessions:
            session = stored(group[0], sid)
            ok = check_consistent(session)
            assert len(ok) == 8, [h["input"] for h in ok]  # no lost and no doubled turn
            per_key = Counter(h["requestId"] for h in ok)
            assert all(count == 1 for count in per_key.values())
            assert {h["requestId"]: h["turn"] for h in ok} == {
                k: t for k, t in acknowledged.items() if k in per_key
            }
            assert [h["input"] for h in ok] == [f"{sid}-{i}" for i in range(8)]  # in order
        # A retry of an acknowledged request replays it on any replica and runs nothing.
        key, turn = next(iter(acknowledged.items()))
        calls = len(fake.requests)
        sid, said = next((s, h["input"]) for s in sessions for h in stored(group[0], s)["history"]
                         if h.get("requestId") == key)
        # The same request again (the key with another message is a 422: tests/test_server_sessions.py).
        reply = httpx.post(f"{group[2].url}/bots/counter/sessions/{sid}/messages", json={"userMessage": said},
                           headers={"Idempotency-Key": key}, timeout=30)
        assert reply.json()["replayed"] is True and reply.json()["turn"] == turn
        assert reply.headers["Idempotent-Replayed"] == "true" and len(fake.requests) == calls
    finally:
        for r in group:  # the next test gets all three
            if r.proc.poll() is not None:
                r.start()


@pytest.fixture
def short_lease_pair(redis_server, counter_bot, shared_fake):
    """Two replicas of their own, for the test that loses a lease: A, the one frozen, holds its
    leases for a short TTL; B keeps the default, so that B's own turn never depends on renewing
    a short lease on time while the machine is loaded (only A's lease is meant to be lost)."""
    store = redis_server.url()  # one URL: each url() is a key prefix of its own
    pair = [*replicas(1, counter_bot, store, shared_fake, "--lease-ttl", str(SHORT_LEASE_TTL)),
            *replicas(1, counter_bot, store, shared_fake)]
    yield pair
    for r in pair:
        r.signal(signal.SIGCONT)
        r.kill()


def test_a_lease_lost_during_a_long_model_call_cannot_commit(short_lease_pair, fake):
    a, b = short_lease_pair
    try:
        created = httpx.post(f"{a.url}/bots/counter/sessions", json={"id": "l"}, timeout=30)
        assert created.status_code == 201, created.text
        fake.queue({"tool_calls": [{"name": "inc", "arguments": {}}], "delay": 3 * SHORT_LEASE_TTL})

        async def drive() -> tuple[list[dict], httpx.Response]:
            async with websockets.connect(a.ws_url) as ws:
                await ws.send(json.dumps({"type": "Connect", "chatId": "l", "resume": True, "extensions": True}))
                await async_until_done(ws, 30)
                await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "l", "data": {"userMessage": "slow"}}))
                while not fake.requests:
                    await asyncio.sleep(0.02)
                a.signal(signal.SIGSTOP)  # replica A freezes (a long pause): it cannot renew its lease
                await asyncio.sleep(2 * SHORT_LEASE_TTL)  # two TTLs: the lease expires
                async with httpx.AsyncClient(timeout=30) as http:
                    other = await say(http, b, "l", "meanwhile")  # B takes the session and commits
                a.signal(signal.SIGCONT)
                return await async_until_done(ws, 30), other

        frames, other = asyncio.run(drive())
        assert other.status_code == 200 and other.json()["turn"] == 1, other.text
        assert [f["type"] for f in frames][-2:] == ["Error", "Failed"] and frames[-1]["data"] == "Conflict"
        assert "not committed" in frames[-2]["data"] and "lease" in frames[-2]["data"]
        session = stored(a, "l")  # A reloaded: it serves the stored session, B's turn and not its own
        ok = check_consistent(session)
        assert [h["input"] for h in ok] == ["meanwhile"]
    finally:
        a.signal(signal.SIGCONT)


def test_a_deleted_session_stays_deleted_across_replicas(trio, fake):
    a, b = trio[0], trio[1]
    with httpx.Client(timeout=30) as http:
        http.post(f"{a.url}/bots/counter/sessions", json={"id": "d"})
        for r in (a, b, a):  # both replicas hold a live copy now
            assert http.post(f"{r.url}/bots/counter/sessions/d/messages", json={"userMessage": "x"}).status_code == 200
        assert http.delete(f"{a.url}/bots/counter/sessions/d").status_code == 204
        for r in (b, a):
            assert http.get(f"{r.url}/bots/counter/sessions/d").status_code == 404
            gone = http.post(f"{r.url}/bots/counter/sessions/d/messages", json={"userMessage": "x"})
            assert gone.status_code == 404 and gone.json()["error"] == "SessionNotActive"
        # The id can be used again: a new session, and neither replica's old copy comes back.
        assert http.post(f"{b.url}/bots/counter/sessions", json={"id": "d"}).status_code == 201
        for r in (a, b):
            session = http.get(f"{r.url}/bots/counter/sessions/d").json()
            assert session["turn"] == 0 and session["state"]["count"] == 0 and session["history"] == []


def test_a_second_server_process_on_one_sqlite_file_is_refused(tmp_path, counter_bot, fake):
    store = f"sqlite:///{tmp_path / 'one.db'}"
    first = Replica(counter_bot, store, fake.base_url).start()
    try:
        second = Replica(counter_bot, store, fake.base_url).start(wait=False)
        assert second.proc.wait(30) != 0
        out = second.output()
        assert "already served by chatrun serve (pid" in out and "one `chatrun serve`" in out and "Traceback" not in out
        httpx.post(f"{first.url}/bots/counter/sessions", json={"id": "s"}, timeout=30)
        assert httpx.post(f"{first.url}/bots/counter/sessions/s/messages", json={"userMessage": "x"},
                          timeout=30).json()["turn"] == 1
    finally:
        first.kill()
    # Once the first is gone, the file can be served again, with everything it held.
    again = Replica(counter_bot, store, fake.base_url).start()
    try:
        assert stored(again, "s")["state"]["count"] == 1
    finally:
        again.kill()


def listening(pid: int) -> bool:
    """Whether process `pid` has a listening TCP socket (Linux: its socket fds against /proc/net/tcp*).
    Asked of the process, not by connecting to its port: once it stops listening, a test on another
    worker may be given the same free port, and a probe would reach that test's server (and be
    recorded there as a stray request)."""
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:  # gone (exited), or a descriptor closed while listed: ask again
        return os.path.exists(f"/proc/{pid}")
    inodes = {link[len("socket:["):-1] for link in links if link.startswith("socket:[")}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    return True
    return False


def test_sigterm_lets_the_turn_in_flight_finish_and_exits(tmp_path, counter_bot, fake):
    server = Replica(counter_bot, f"sqlite:///{tmp_path / 't.db'}", fake.base_url).start()
    fake.queue({"tool_calls": [{"name": "inc", "arguments": {}}], "delay": 3})
    try:
        async def drive() -> tuple[list[dict], float]:
            async with websockets.connect(server.ws_url) as ws:
                await ws.send(json.dumps({"type": "Connect", "chatId": "t"}))
                await async_until_done(ws, 30)
                await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "t", "data": {"userMessage": "x"}}))
                while not fake.requests:
                    await asyncio.sleep(0.02)
                assert listening(server.proc.pid), "the server does not listen: the check below would prove nothing"
                server.signal(signal.SIGTERM)
                sent = time.monotonic()
                while listening(server.proc.pid):  # soon after SIGTERM no new connection is accepted
                    assert time.monotonic() - sent < SLACK, "still accepting connections after SIGTERM"
                    await asyncio.sleep(0.05)
                return await async_until_done(ws, 30), sent

        frames, sent = asyncio.run(drive())
        assert frames[-1]["type"] == "Completed", frames  # the turn finished and its client was told
        assert server.proc.wait(30) == 0, server.output()
        took = time.monotonic() - sent
        assert took < 3 + CLOSE_TIMEOUT + SLACK, f"exited {took:.1f} s after SIGTERM"
    finally:
        server.kill()
    again = Replica(counter_bot, f"sqlite:///{tmp_path / 't.db'}", fake.base_url).start()
    try:
        assert stored(again, "t")["state"]["count"] == 1  # and it was committed
    finally:
        again.kill()


def test_one_sigterm_exits_within_the_drain_bound_even_with_a_stuck_turn(tmp_path, counter_bot, fake):
    server = Replica(counter_bot, "memory://", fake.base_url, "--drain-timeout", "1").start()
    fake.queue({"tool_calls": [{"name": "inc", "arguments": {}}], "delay": 60})
    try:
        httpx.post(f"{server.url}/bots/counter/sessions", json={"id": "s"}, timeout=30)

        async def drive() -> float:
            async with httpx.AsyncClient(timeout=60) as http:
                stuck = asyncio.ensure_future(say(http, server, "s", "x"))
                while not fake.requests:
                    await asyncio.sleep(0.02)
                server.signal(signal.SIGTERM)
                sent = time.monotonic()
                await asyncio.to_thread(server.proc.wait, 30)
                stuck.cancel()
                return time.monotonic() - sent

        took = asyncio.run(drive())
        assert server.proc.returncode == 0
        assert took < 1 + CLOSE_TIMEOUT + SLACK  # drain timeout + close timeout + a loaded machine's slack
    finally:
        server.kill()


def test_a_retry_of_a_turn_whose_reply_was_lost_is_replayed_on_another_replica(trio, fake):
    a, b = trio[1], trio[2]
    frame = {"type": "ChatRouteMessage", "chatId": "r", "data": {"userMessage": "once"}, "requestId": "rid-1"}

    async def lose_the_reply() -> None:
        async with websockets.connect(a.ws_url) as ws:
            await ws.send(json.dumps({"type": "Connect", "chatId": "r", "extensions": True}))
            await async_until_done(ws, 30)
            await ws.send(json.dumps(frame))
        # The socket closed before any reply: the client cannot know whether the turn ran.

    async def retry() -> tuple[list[dict], list[dict]]:
        async with websockets.connect(b.ws_url) as ws:
            await ws.send(json.dumps({"type": "Connect", "chatId": "r", "resume": True, "extensions": True}))
            resumed = await async_until_done(ws, 30)
            await ws.send(json.dumps(frame))
            return resumed, await async_until_done(ws, 30)

    asyncio.run(lose_the_reply())
    deadline = time.monotonic() + 60
    while stored(a, "r")["turn"] == 0:  # the turn runs on and commits without its client
        assert time.monotonic() < deadline, f"the abandoned turn never committed: {stored(a, 'r')}"
        time.sleep(0.05)
    calls = len(fake.requests)
    resumed, frames = asyncio.run(retry())
    last = resumed[0]["data"]["lastTurn"]  # on resume the client learns what was committed
    assert (last["turn"], last["input"], last["requestId"]) == (1, "once", "rid-1")
    assert [(f["type"], f["data"]) for f in frames][0] == ("Message", "counted")
    assert frames[-1]["type"] == "Completed" and all(f["requestId"] == "rid-1" for f in frames), frames
    assert len(fake.requests) == calls  # replayed, not run again
    assert check_consistent(stored(b, "r"))[0]["requestId"] == "rid-1" and stored(b, "r")["turn"] == 1

    # An integer requestId is only a correlation id (per connection): never deduplicated.
    async def integer_ids() -> list[dict]:
        async with websockets.connect(b.ws_url) as ws:
            await ws.send(json.dumps({"type": "Connect", "chatId": "r", "resume": True, "extensions": True}))
            await async_until_done(ws, 30)
            for _ in range(2):
                await ws.send(json.dumps(frame | {"requestId": 7}))
                await async_until_done(ws, 30)
        return stored(b, "r")["history"]

    assert [h["turn"] for h in asyncio.run(integer_ids()) if h["ok"]] == [1, 2, 3]
