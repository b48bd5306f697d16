"""Issue 32's done-when for a key for every call, with real processes: two `chatrun serve`
replicas of bots/helpdesk on a real Redis (and again on a real PostgreSQL), the fake OpenAI server, and the device-orders API
on loopback recording each request's headers. An IT lead approves Ana's order on the first
replica; the API holds that request until the test has killed the replica (-9) — after the
tool ran, before the turn's commit. The lead's client retries the decision on the second
replica: the order goes out again, with the same `Idempotency-Key`, and an API that honours
the key places it once. What the state, the outbox and the history keep is exactly once (the
killed turn never committed); what reaches the API is at least once, with a key to dedupe by."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from orders_api import LoopbackApi
from redis_support import Replica
from store_params import store_url

REPO = Path(__file__).resolve().parents[1]
HELPDESK = str(REPO / "bots" / "helpdesk")
AUTH = """
tokens:
  tok-ana-0123456: {principal: ana, claims: {email: ana@example.com}}
  tok-lee-0123456: {principal: lee, roles: [it_lead], claims: {email: lee@example.com}}
"""
ANA = {"Authorization": "Bearer tok-ana-0123456"}
LEE = {"Authorization": "Bearer tok-lee-0123456"}


class DeviceOrders(LoopbackApi):
    """POST /device-orders: records each request; holds the first one until `release` is set;
    places one order per `Idempotency-Key` (a key seen again answers the order it placed)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.arrived = threading.Event()
        self.orders: dict[str, dict[str, Any]] = {}  # key -> the order placed under it
        self._lock = threading.Lock()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        body = json.loads(h.rfile.read(int(h.headers.get("content-length") or 0)) or b"null")
        parts = urlsplit(h.path)
        key = h.headers.get("idempotency-key")
        with self._lock:
            self.requests.append({"path": parts.path, "key": key, "body": body})
            first = len(self.requests) == 1
        if first:
            self.arrived.set()
            self.release.wait(120)  # until the replica that sent it is dead
        with self._lock:
            order = self.orders.get(key or "")
            if order is None:
                order = {"id": f"D-{len(self.orders) + 1}", "reporter": parse_qs(parts.query)["reporter"][0],
                         "device": body["device"]}
                self.orders[key or f"unkeyed-{len(self.orders)}"] = order
        self.reply(h, 201, order)


def responder(body: dict[str, Any]) -> dict[str, Any]:
    """The fake model: asked for a laptop, it orders one; after the order's result, it says so."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return {"text": f"Done: {last['content']}"}
    return {"tool_calls": [{"name": "order_device",
                            "arguments": {"body": {"device": "laptop", "reason": "cracked screen"}}}]}


@pytest.fixture
def api(monkeypatch):
    with DeviceOrders() as server:
        monkeypatch.setenv("HELPDESK_API_URL", server.url)
        yield server


def decide(server: Replica, session: str, key: str) -> httpx.Response:
    return httpx.post(f"{server.url}/bots/helpdesk/sessions/{session}/pending/p1", json={"decision": "approve"},
                      headers=dict(LEE, **{"Idempotency-Key": key}), timeout=120)


@pytest.fixture(params=["redis", "postgres"])
def shared_store(request, tmp_path):
    """An empty store the replicas share: a real Redis, a real PostgreSQL (issue 38)."""
    return store_url(request, tmp_path)


@pytest.mark.subprocess
def test_a_decision_retried_on_another_replica_after_kill_9_sends_the_same_idempotency_key(
        fake, api, shared_store, tmp_path):
    fake.responder = responder
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    store = shared_store
    first = Replica(HELPDESK, store, fake.base_url, "--auth", str(auth)).start()
    second = None
    try:
        created = httpx.post(f"{first.url}/bots/helpdesk/sessions", json={"id": "o1"}, headers=ANA, timeout=60)
        assert created.status_code == 201, created.text
        asked = httpx.post(f"{first.url}/bots/helpdesk/sessions/o1/messages",
                           json={"userMessage": "My laptop's screen is cracked."}, headers=ANA, timeout=60).json()
        assert [e["data"]["id"] for e in asked["events"] if e["type"] == "Pending"] == ["p1"], asked
        second = Replica(HELPDESK, store, fake.base_url, "--auth", str(auth)).start()

        # The lead approves on the first replica; its order reaches the API, which holds it ...
        lost: list[BaseException] = []
        thread = threading.Thread(target=lambda: _expect_lost(lambda: decide(first, "o1", "lee-1"), lost))
        thread.start()
        assert api.arrived.wait(60), "the approved order never reached the API"
        first.kill()  # ... while the replica dies: the tool ran, the turn is not committed
        api.release.set()
        thread.join(60)
        assert lost, "the first replica answered the decision before it was killed"

        # The lead's client retries on the other replica (once the dead one's lease ran out).
        retried = decide(second, "o1", "lee-1")
        assert retried.status_code == 200, retried.text
        body = retried.json()
        assert body["ok"] is True and body["replayed"] is False
        assert [e["data"]["outcome"] for e in body["events"] if e["type"] == "Resolved"] == ["approved"]

        sent = [r for r in api.requests if r["path"] == "/device-orders"]
        assert len(sent) == 2  # at least once: the order went out twice ...
        assert sent[0]["key"] == sent[1]["key"] and re.fullmatch(r"[0-9a-f]{32}", sent[0]["key"] or "")
        assert sent[0]["body"] == sent[1]["body"] == {"device": "laptop", "reason": "cracked screen"}
        assert len(api.orders) == 1  # ... and with the same key, the API placed it once
        assert [e["data"] for e in body["events"] if e["type"] == "Message"][-1] == "Done: Ordered: laptop, order D-1."

        # Exactly once in the conversation: one resolution, nothing pending.
        history = httpx.get(f"{second.url}/bots/helpdesk/sessions/o1", headers=ANA, timeout=60).json()["history"]
        resolved = [e["data"]["outcome"] for entry in history for e in entry.get("events", [])
                    if e["type"] == "Resolved"]
        assert resolved == ["approved"]
        pending = httpx.get(f"{second.url}/bots/helpdesk/sessions/o1/pending", headers=ANA, timeout=60).json()
        assert pending["pending"] == []
    finally:
        api.release.set()
        for replica in (first, second):
            if replica is not None:
                replica.kill()


def _expect_lost(request: Any, lost: list[BaseException]) -> None:
    """Send `request`; the connection is expected to break (its replica is killed meanwhile)."""
    try:
        request()
    except httpx.HTTPError as exc:
        lost.append(exc)


SHOP = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
env:
  HELPDESK_API_URL: {description: Base URL of the helpdesk API}
routes:
  main: {default: true, system: You order devices., tools: [order_device]}
tools:
  order_device:
    description: Order a device (charges the department)
    parameters: {type: object, properties: {body: {type: object}}, required: [body]}
    http:
      url: "{{ env.HELPDESK_API_URL }}/device-orders?reporter=ana"
      method: POST
      json: {device: "{{ args.body.device }}", reason: "{{ args.body.reason }}"}
"""


LEASE_TTL = 2.0  # the replicas' --lease-ttl
# How long after a replica's death (-9) the SDK's retry may take to answer: the SDK's back-off
# (at most 8 s), the dead replica's lease running out (the TTL), and a look at it every 0.5 s,
# with room for a loaded machine; far below the 5 minutes a retry waited for a claim before.
RETRY_BOUND = 8 + 3 * LEASE_TTL + 10


def _v1(url: str, key: str, timeout: float = 120) -> httpx.Response:
    """The conversation's first /v1 request, under the Idempotency-Key `key`."""
    return httpx.post(f"{url}/v1/chat/completions", json={
        "model": "shop", "messages": [{"role": "user", "content": "My laptop's screen is cracked."}]},
        headers={"Idempotency-Key": key}, timeout=timeout)


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_v1_first_message_retried_on_another_replica_after_kill_9_sends_the_same_idempotency_key(
        fake, api, shared_store, tmp_path):
    """docs/tools.md, "Idempotency keys": a conversation's first `/v1` request orders a device;
    its replica dies (-9) after the order reached the API, before the commit. The SDK retries on
    the other replica, which takes over the dead attempt's claim as soon as that replica's lease
    has run out (docs/openai-api.md, "Retries run a turn once"), and runs the turn in the session
    that attempt made: the order goes out again with the same key, and the API places it once."""
    import openai

    from test_openai_exactly_once import Alternating

    replicas = _shops(tmp_path, shared_store, fake, 2, "--lease-ttl", str(LEASE_TTL))
    try:
        transport = Alternating([replica.url for replica in replicas])
        client = openai.OpenAI(base_url=replicas[0].url + "/v1", api_key="x", timeout=120, max_retries=2,
                               http_client=httpx.Client(transport=transport))
        answers: list[Any] = []
        thread = threading.Thread(target=lambda: answers.append(client.chat.completions.create(
            model="shop", messages=[{"role": "user", "content": "My laptop's screen is cracked."}])))
        thread.start()
        assert api.arrived.wait(60), "the order never reached the API"
        replicas[0].kill()  # the tool ran, the turn is not committed
        died = time.monotonic()
        api.release.set()
        thread.join(RETRY_BOUND)
        assert answers, f"the SDK's retry got no answer within {RETRY_BOUND:g} s of the replica's death"
        assert time.monotonic() - died < RETRY_BOUND
        reply = answers[0]
        assert reply.choices[0].message.content.startswith("Done: ") and reply.model_extra["chatrun"]["how"] == "new"
        sent = [r for r in api.requests if r["path"] == "/device-orders"]
        assert len(sent) == 2 and sent[0]["key"] == sent[1]["key"]  # again, with the same key ...
        assert len(api.orders) == 1  # ... so the API placed it once
    finally:
        api.release.set()
        for replica in replicas:
            replica.kill()


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_v1_attempt_alive_but_slow_is_waited_for_by_its_retry_on_another_replica(
        fake, api, shared_store, tmp_path):
    """An attempt whose tool (or model) takes several lease TTLs is alive: its retry on the other
    replica, under the same Idempotency-Key, waits for it and replays its answer; nothing runs twice."""
    replicas = _shops(tmp_path, shared_store, fake, 2, "--lease-ttl", str(LEASE_TTL))
    try:
        answers: dict[str, httpx.Response] = {}
        first = threading.Thread(target=lambda: answers.setdefault("first", _v1(replicas[0].url, "slow-1")))
        first.start()
        assert api.arrived.wait(60), "the order never reached the API"
        retry = threading.Thread(target=lambda: answers.setdefault("retry", _v1(replicas[1].url, "slow-1")))
        retry.start()
        time.sleep(3 * LEASE_TTL)  # the attempt outlives its claim's age by more than a lease's TTL ...
        assert not answers, answers  # ... and the retry still waits for it
        api.release.set()
        first.join(60)
        retry.join(60)
        ran, replayed = answers["first"], answers["retry"]
        assert ran.status_code == replayed.status_code == 200, (ran.text, replayed.text)
        assert replayed.json()["chatrun"]["how"] == "replayed"
        assert replayed.json()["choices"][0]["message"]["content"] == ran.json()["choices"][0]["message"]["content"]
        assert len([r for r in api.requests if r["path"] == "/device-orders"]) == 1  # the tool ran once
    finally:
        api.release.set()
        for replica in replicas:
            replica.kill()


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_v1_retry_after_the_sqlite_server_restarted_runs_at_once(fake, api, tmp_path):
    """One `chatrun serve` on SQLite, killed (-9) while a /v1 request's tool runs, started again on
    the same file: the request's retry takes over the claim the dead process left at once (no
    other process can be running it) and runs the turn in the session that attempt made."""
    store = f"sqlite:///{tmp_path / 'chatrun.db'}"
    [server] = _shops(tmp_path, store, fake, 1)
    restarted = None
    try:
        lost: list[BaseException] = []
        thread = threading.Thread(target=lambda: _expect_lost(lambda: _v1(server.url, "restart-1"), lost))
        thread.start()
        assert api.arrived.wait(60), "the order never reached the API"
        server.kill()
        api.release.set()
        thread.join(60)
        assert lost, "the server answered before it was killed"
        restarted = Replica(str(tmp_path / "shop.yaml"), store, fake.base_url).start()
        began = time.monotonic()
        retried = _v1(restarted.url, "restart-1", RETRY_BOUND)
        assert retried.status_code == 200, retried.text
        assert time.monotonic() - began < RETRY_BOUND
        assert retried.json()["chatrun"]["how"] == "new"
        sent = [r for r in api.requests if r["path"] == "/device-orders"]
        assert len(sent) == 2 and sent[0]["key"] == sent[1]["key"] and len(api.orders) == 1
    finally:
        api.release.set()
        for replica in (server, restarted):
            if replica is not None:
                replica.kill()


def _shops(tmp_path, store: str, fake, count: int, *extra: str) -> list[Replica]:
    """`count` replicas of the SHOP bot on `store`, started; the fake model answers as `responder`."""
    fake.responder = responder
    bot = tmp_path / "shop.yaml"
    bot.write_text(SHOP)
    return [Replica(str(bot), store, fake.base_url, *extra).start() for _ in range(count)]
