"""A replica on Redis heals when Redis restarts (issue 27, "Faults that heal"): a real
redis-server killed (SIGKILL) and started again on the same port under a running replica.
The replica's first requests after the restart succeed (no stale pooled connection fails them),
`/health` says when the store is unreachable or paused while answering 200 (liveness), `/ready`
answers 503 then (readiness), both at once whatever Redis does, and
`/v1` answers store errors as OpenAI-shaped 503s."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

import chatrun
from chatrun.server import create_app
from chatrun.store.versions import CREATE
from redis_support import REDIS_SERVER, RedisServer
from server_support import ThreadServer, write_travel

pytestmark = pytest.mark.slow  # redis-server processes


@pytest.fixture
def redis():
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed")
    server = RedisServer().start()
    yield server
    server.stop()


def kill(server: RedisServer) -> None:
    assert server.proc is not None
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)
    server.proc = None


def restart(server: RedisServer) -> None:
    """The same port again, empty (as after a crash without persistence, or a failover)."""
    server.start()


def test_after_a_redis_restart_the_first_requests_succeed(fake, tmp_path, redis):
    travel = chatrun.load_bot(write_travel(tmp_path / "bots"))
    fake.responder = lambda body: {"text": "hello"}
    with ThreadServer(create_app([travel], redis.url())) as replica, httpx.Client(timeout=60) as http:
        assert http.post(f"{replica.url}/bots/travel/sessions", json={"id": "before"}).status_code == 201
        kill(redis)
        restart(redis)
        # Every pooled connection is stale now: each request must still succeed the first time.
        for i in range(4):
            created = http.post(f"{replica.url}/bots/travel/sessions", json={"id": f"after-{i}"})
            assert created.status_code == 201, created.text
        said = http.post(f"{replica.url}/bots/travel/sessions/after-0/messages", json={"userMessage": "hi"})
        assert said.status_code == 200, said.text
        health = http.get(f"{replica.url}/health").json()
        assert health["status"] == "ok" and health["store"] == "ok"


def test_while_redis_is_down_health_says_so_and_v1_answers_503(fake, tmp_path, redis):
    travel = chatrun.load_bot(write_travel(tmp_path / "bots"))
    fake.responder = lambda body: {"text": "hello"}
    ports: list[int] = []  # the client-side port of each response's connection

    def record(response: httpx.Response) -> None:
        ports.append(response.extensions["network_stream"].get_extra_info("client_addr")[1])

    # One pooled connection for every request, the SDK's included: a request on a new
    # connection would show as a new port.
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with ThreadServer(create_app([travel], redis.url())) as replica, \
            httpx.Client(timeout=60, limits=one, event_hooks={"response": [record]}) as http:
        client = openai.OpenAI(base_url=replica.url + "/v1", api_key="x", max_retries=0, http_client=http)
        assert http.get(f"{replica.url}/health").json()["store"] == "ok"
        kill(redis)
        health = http.get(f"{replica.url}/health")
        assert health.status_code == 200  # liveness: the process serves
        assert health.json()["store"] == "unreachable" and health.json()["status"] == "degraded"
        assert http.get(f"{replica.url}/ready").status_code == 503  # readiness: it cannot serve turns
        with pytest.raises(openai.InternalServerError) as down:
            client.chat.completions.create(model="travel", messages=[{"role": "user", "content": "hi"}])
        assert down.value.status_code == 503
        assert down.value.body["code"] == "store_unavailable" and down.value.body["type"] == "server_error"
        # The keep-alive connection survived the error: the next request goes out on it.
        assert http.get(f"{replica.url}/health").status_code == 200
        restart(redis)
        reply = client.chat.completions.create(model="travel", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "hello"
        assert http.get(f"{replica.url}/health").json()["store"] == "ok"
        assert len(ports) == 7 and len(set(ports)) == 1, ports


def test_while_redis_is_paused_health_answers_at_once_and_says_degraded(fake, tmp_path, redis):
    """A Redis that accepts connections but answers nothing (SIGSTOP: a stalled server, a
    partition): /health and /ready answer within their probe's timeout (0.3 s; 1.5 s allowed
    here for a loaded machine, where the old probe took its 2 s), saying what is degraded."""
    travel = chatrun.load_bot(write_travel(tmp_path / "bots"))
    with ThreadServer(create_app([travel], redis.url())) as replica, httpx.Client(timeout=60) as http:
        assert http.get(f"{replica.url}/ready").status_code == 200
        assert redis.proc is not None
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            for _ in range(3):  # each asks again: each probe times out on its own
                started = time.monotonic()
                health = http.get(f"{replica.url}/health")
                ready = http.get(f"{replica.url}/ready")
                assert time.monotonic() - started < 1.5
                assert health.status_code == 200  # liveness: restarting would not help
                assert health.json()["status"] == "degraded" and health.json()["store"] == "timeout"
                assert ready.status_code == 503 and ready.json()["store"] == "timeout"
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
        _wait(lambda: http.get(f"{replica.url}/ready").status_code == 200, 30, "/ready did not recover")
        health = http.get(f"{replica.url}/health").json()
        assert health["status"] == "ok" and health["store"] == "ok"
        assert health["store_pool"]["max_connections"] == 100


def _connections_to(port: int) -> set[int]:
    """The local ports of the machine's established TCP connections to 127.0.0.1:`port`
    (/proc/net/tcp; the kernel completes a connection even to a stopped process)."""
    remote = f"0100007F:{port:04X}"
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[2] == remote and fields[3] == "01":  # ESTABLISHED
            found.add(int(fields[1].split(":")[1], 16))
    return found


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


async def _resent_after_a_pause(redis: RedisServer, request) -> object:
    """Run `request` (a coroutine) while Redis is paused (SIGSTOP) beyond the client's socket
    timeout, until redis-py has reconnected to send it again; then let Redis go on (SIGCONT)
    with both sends waiting for it, and give what the request returns."""
    before = _connections_to(redis.port)
    assert redis.proc is not None
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        running = asyncio.ensure_future(request)
        # The first send times out (4 s) and redis-py reconnects to send it again: a new
        # connection appears. Only then does Redis go on, and it runs the first send first.
        await asyncio.to_thread(_wait, lambda: _connections_to(redis.port) - before, 60,
                                "redis-py did not reconnect to send the command again")
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    return await asyncio.wait_for(running, 60)


NO_PROC_NET = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the connections in /proc/net/tcp")


@NO_PROC_NET
def test_a_commit_resent_after_its_reply_timed_out_is_recognised_as_committed(redis):
    """redis-py sends a command again when its reply times out, and Redis may have run it: the
    resent commit must answer with the version the first send wrote, not "stale" (a committed
    turn reported as failed is one the user sends again, and its tools run twice)."""
    from chatrun.store.lease import LeaseSettings
    from chatrun.store.redis import RedisStore
    from test_store_redis import commit, pending

    async def go() -> None:
        store = RedisStore(redis.url() + "&socket_timeout=4", LeaseSettings(ttl=120))
        lease = await store.acquire("s", wait=5)
        v1 = await commit(store, "s", pending("s", {"turn": 0}), CREATE, lease)
        second = pending("s", {"turn": 1}, history=[{"turn": 1, "ok": True}])
        v2 = await _resent_after_a_pause(redis, commit(store, "s", second, v1, lease))
        loaded = await store.load_session("s")
        assert str(v2).startswith("2.") and loaded.version == v2 and loaded.snapshot == {"turn": 1}
        assert await store.load_history("s") == [{"turn": 1, "ok": True}]  # written once
        await store.release(lease)
        await store.close()

    asyncio.run(go())
