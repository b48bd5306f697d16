"""A replica on Redis heals when Redis restarts (issue 27, "Faults that heal"): a real
redis-server killed (SIGKILL) and started again on the same port under a running replica.
The replica's first requests after the restart succeed (no stale pooled connection fails them),
`/health` says when the store is unreachable (readiness) while answering 200 (liveness), and
`/v1` answers store errors as OpenAI-shaped 503s."""

from __future__ import annotations

import signal

import httpx
import openai
import pytest

import chatrun
from chatrun.server import create_app
from redis_support import REDIS_SERVER, RedisServer
from server_support import ThreadServer, write_travel

pytestmark = pytest.mark.slow  # redis-server processes


@pytest.fixture
def redis():
    import os

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
        assert health.json()["store"] == "unreachable"  # readiness: it cannot serve turns
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
        assert len(ports) == 6 and len(set(ports)) == 1, ports
