"""/v1/chat/completions runs a turn once however the client retries (docs/openai-api.md,
"Retries run a turn once"): the real openai SDK, its own retries, two replicas on a real Redis,
and a side-effecting `http:` tool whose calls a local receiver counts."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import redis

import chatrun
from chat_support import call
from chatrun.server import create_app
from chatrun.server.openai_api import OpenAIOptions
from server_support import ThreadServer
from webhook_support import Receiver

pytestmark = pytest.mark.slow  # a redis-server process

BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
routes:
  main:
    default: true
    system: You place orders.
    tools: [place_order]
tools:
  place_order:
    description: Place the order (charges the customer)
    parameters: {type: object, properties: {item: {type: string}}, required: [item]}
    http: {url: "RECEIVER/orders", method: POST, json: {item: "{{ args.item }}"}}
"""


class Alternating(httpx.BaseTransport):
    """Sends each attempt to the next replica in turn: a load balancer the SDK's retries pass."""

    def __init__(self, urls: list[str]):
        self.urls, self.sent = urls, 0
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        target = httpx.URL(self.urls[self.sent % len(self.urls)])
        self.sent += 1
        request.url = request.url.copy_with(host=target.host, port=target.port)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def shop(tmp_path, write_bot):
    with Receiver() as receiver:
        yield chatrun.load_bot(write_bot(BOT.replace("RECEIVER", receiver.url))), receiver


def replicas(bot, url: str, **options) -> tuple[ThreadServer, ThreadServer]:
    return ThreadServer(create_app([bot], url, **options)), ThreadServer(create_app([bot], url, **options))


def sdk(transport: Alternating, timeout: float, retries: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=transport.urls[0] + "/v1", api_key="x", timeout=timeout, max_retries=retries,
                         http_client=httpx.Client(transport=transport))


def test_the_sdks_retries_on_another_replica_replay_the_committed_turn(fake, shop, redis_server):
    bot, receiver = shop
    # The first attempt calls the tool, then its model answers slower than the client waits:
    # the client gives up and retries, on the other replica, while the turn runs and commits.
    fake.queue(call("place_order", item="tea"), {"text": "Ordered: tea.", "delay": 3.0})
    one, two = replicas(bot, redis_server.url())
    with one, two:
        transport = Alternating([one.url, two.url])
        with sdk(transport, timeout=1.5, retries=6) as client:
            reply = client.chat.completions.create(model="shop", messages=[{"role": "user", "content": "tea please"}])
    assert transport.sent >= 2  # the SDK did retry
    assert len(receiver.seen()) == 1  # the order was placed once
    assert reply.choices[0].message.content == "Ordered: tea."
    assert reply.model_extra["chatrun"]["how"] == "replayed"
    assert fake.pending == 0 and len(fake.requests) == 2  # one turn's model calls, no more


def test_an_idempotency_key_replays_on_any_replica_and_a_regenerate_still_forks(fake, shop, redis_server):
    bot, receiver = shop
    fake.queue(call("place_order", item="tea"), {"text": "Ordered: tea."})
    one, two = replicas(bot, redis_server.url())
    messages = [{"role": "user", "content": "tea please"}]
    with one, two:
        transport = Alternating([one.url, two.url])
        with sdk(transport, timeout=30, retries=0) as client:
            first = client.chat.completions.create(model="shop", messages=messages,
                                                   extra_headers={"Idempotency-Key": "order-1"})
            again = client.chat.completions.create(model="shop", messages=messages,
                                                   extra_headers={"Idempotency-Key": "order-1"})
            assert len(receiver.seen()) == 1
            assert again.choices[0].message.content == first.choices[0].message.content == "Ordered: tea."
            assert again.model_extra["chatrun"]["how"] == "replayed"
            assert again.model_extra["chatrun"]["session"] == first.model_extra["chatrun"]["session"]
            # The same request without a key and not marked as a retry is the user's: it runs.
            fake.queue(call("place_order", item="tea"), {"text": "Ordered another tea."})
            regenerated = client.chat.completions.create(model="shop", messages=messages)
    assert regenerated.choices[0].message.content == "Ordered another tea."
    assert regenerated.model_extra["chatrun"]["how"] == "new"
    assert len(receiver.seen()) == 2


def regenerate_twice_and_edit(client: openai.OpenAI, fake) -> None:
    """A second turn that orders tea; the user regenerates its answer twice, then edits it to ask
    for coffee. Each request forks from turn 1."""
    messages = [{"role": "user", "content": "hello"}]
    fake.queue({"text": "Hello! What would you like?"})
    first = client.chat.completions.create(model="shop", messages=messages)
    messages += [{"role": "assistant", "content": "Hello! What would you like?"},
                 {"role": "user", "content": "tea please"}]
    for answer in ("Ordered: tea.", "Tea is ordered.", "Your tea is on its way."):
        fake.queue(call("place_order", item="tea"), {"text": answer})
        reply = client.chat.completions.create(model="shop", messages=messages)
        assert reply.choices[0].message.content == answer
    assert reply.model_extra["chatrun"]["how"] == "forked"
    assert reply.model_extra["chatrun"]["forked_from"] == first.model_extra["chatrun"]["session"]
    fake.queue(call("place_order", item="coffee"), {"text": "Ordered: coffee."})
    edited = messages[:-1] + [{"role": "user", "content": "coffee please"}]
    assert client.chat.completions.create(model="shop", messages=edited).model_extra["chatrun"]["how"] == "forked"


def regenerate_by_response_id(client: openai.OpenAI, fake) -> None:
    """The same on the Responses API: the answer to `previous_response_id` regenerated twice."""
    fake.queue({"text": "Hello! What would you like?"})
    first = client.responses.create(model="shop", input="hello")
    for answer in ("Ordered: tea.", "Tea is ordered."):
        fake.queue(call("place_order", item="tea"), {"text": answer})
        reply = client.responses.create(model="shop", input="tea please", previous_response_id=first.id)
        assert reply.output_text == answer
    assert reply.model_extra["chatrun"]["how"] == "forked"


def test_a_regenerated_answer_does_not_run_a_once_call_again(fake, shop, redis_server, tmp_path):
    """A regenerate or an edit forks (docs/openai-api.md), and a fork keeps what its original did
    since (docs/tools.md, "Side effects"): the order (an `effect: once` call) regenerated twice, on
    two replicas, reaches the shop once, the model reading that it was done; the edited order
    (other arguments) is another call. The same with `previous_response_id`. On SQLite too."""
    bot, receiver = shop
    for store in (redis_server.url(), f"sqlite:///{tmp_path}/shop.db"):
        receiver.deliveries.clear()
        one, two = replicas(bot, store)
        with one, two, sdk(Alternating([one.url, two.url]), timeout=30, retries=0) as client:
            regenerate_twice_and_edit(client, fake)
            read = [m["content"] for m in fake.requests[-3]["messages"] if m["role"] == "tool"]
            regenerate_by_response_id(client, fake)
        assert [d.body for d in receiver.seen()] == [{"item": "tea"}, {"item": "coffee"}, {"item": "tea"}]
        assert read[-1].startswith("Already done earlier in this conversation (turn 2): ")


def test_a_regenerated_answer_makes_the_same_call_with_its_originals_key(fake, shop, redis_server, tmp_path):
    """A fork's calls carry the keys its original's would (docs/tools.md, "Idempotency keys"): a
    call that runs again in a fork — an `effect: idempotent` one here (a `once` call is not run
    again at all) — regenerated twice, on two replicas, reaches the shop three times with one key;
    the edited call (other arguments) is another call, with another key; another conversation's
    call another key. The same with `previous_response_id`. On SQLite too."""
    _, receiver = shop
    bot = chatrun.load_bot(write_idempotent(shop, tmp_path))
    for store in (redis_server.url(), f"sqlite:///{tmp_path}/shop.db"):
        receiver.deliveries.clear()
        one, two = replicas(bot, store)
        with one, two, sdk(Alternating([one.url, two.url]), timeout=30, retries=0) as client:
            regenerate_twice_and_edit(client, fake)
            regenerate_by_response_id(client, fake)
        keys = [delivery.headers["idempotency-key"] for delivery in receiver.seen()]
        assert len(keys) == 6 and len(set(keys[:3])) == 1 and keys[3] != keys[0]
        assert keys[4] == keys[5] and keys[4] not in keys[:4]  # another conversation: another key


def write_idempotent(shop, tmp_path) -> Path:
    """The shop whose order is `effect: idempotent` (runs again when called again; still keyed)."""
    _, receiver = shop
    path = tmp_path / "idempotent" / "shop.yaml"
    path.parent.mkdir()
    path.write_text(BOT.replace("RECEIVER", receiver.url).replace(
        "    http: {url:", "    effect: idempotent\n    http: {url:"))
    return path


def chats_regenerated(client: openai.OpenAI, fake) -> list[str]:
    """Two chats (a front end's chat id header) whose first answer is regenerated, on either API:
    how each request found its session."""
    hows = []
    for chat in ("chat-1", "chat-1", "chat-2", "chat-2"):
        fake.queue(call("place_order", item="tea"), {"text": "Ordered: tea."})
        if chat == "chat-1":
            reply = client.chat.completions.create(model="shop", messages=[{"role": "user", "content": "tea"}],
                                                   extra_headers={"X-Chat-Id": chat})
        else:
            reply = client.responses.create(model="shop", input="tea", extra_headers={"X-Chat-Id": chat})
        hows.append(reply.model_extra["chatrun"]["how"])
    return hows


def test_a_regenerated_first_answer_in_a_front_ends_chat_forks_from_the_chats_start(fake, shop, redis_server, tmp_path):
    """With a front end's chat id (`--session-header`), the first answer regenerated (the same first
    message again in the same chat, on either API) forks from the chat's start: its `once` order is
    not placed again (the chat's first session placed it), and an order that runs again
    (`effect: idempotent`) carries the key the first answer's did; the same message in another chat
    is a conversation of its own. On two replicas sharing Redis, and on SQLite."""
    _, receiver = shop
    options = {"openai": OpenAIOptions(session_headers=("X-Chat-Id",))}
    for bot in (shop[0], chatrun.load_bot(write_idempotent(shop, tmp_path))):
        for store in (redis_server.url(), f"sqlite:///{tmp_path}/{bot.config.name}-{len(receiver.seen())}.db"):
            receiver.deliveries.clear()
            one, two = replicas(bot, store, **options)
            with one, two, sdk(Alternating([one.url, two.url]), timeout=30, retries=0) as client:
                assert chats_regenerated(client, fake) == ["new", "forked", "new", "forked"]
            keys = [delivery.headers["idempotency-key"] for delivery in receiver.seen()]
            if bot is shop[0]:  # once: one order a chat
                assert len(keys) == 2 and keys[0] != keys[1]
            else:
                assert len(keys) == 4 and keys[0] == keys[1] != keys[2] == keys[3]


def hello(client: openai.OpenAI) -> str:
    reply = client.chat.completions.create(model="shop", messages=[{"role": "user", "content": "hello"}])
    assert reply.model_extra["chatrun"]["how"] == "new"
    return reply.model_extra["chatrun"]["session"]


def test_the_same_first_message_sent_twice_at_once_is_two_conversations(fake, shop, redis_server, tmp_path):
    """A double submit: the same first message twice at the same moment (not a retry: no key, no
    retry count) is two conversations, as the same message sent later is, never a 409 for one of
    them (a new session's id is made from the request, `_made_id`: the second finds it taken)."""
    bot, _ = shop
    fake.responder = lambda body: {"text": "Hello.", "delay": 0.5}
    for store in (redis_server.url(), f"sqlite:///{tmp_path}/shop.db"):
        # Two replicas on Redis; SQLite is served by one process (its leases are that process's).
        served = replicas(bot, store) if store.startswith("redis") else (ThreadServer(create_app([bot], store)),)
        with contextlib.ExitStack() as stack:
            for server in served:
                stack.enter_context(server)
            client = stack.enter_context(sdk(Alternating([server.url for server in served]), timeout=30, retries=0))
            with ThreadPoolExecutor(3) as pool:
                sessions = list(pool.map(hello, [client] * 3))
        assert len(set(sessions)) == 3


def test_a_failed_attempt_is_run_again_by_its_retry(fake, shop, redis_server):
    bot, receiver = shop
    fake.queue({"status": 500, "body": "down"}, {"text": "Hello."})
    one, two = replicas(bot, redis_server.url())
    with one, two:
        transport = Alternating([one.url, two.url])
        with sdk(transport, timeout=30, retries=2) as client:
            reply = client.chat.completions.create(model="shop", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "Hello."
    assert reply.model_extra["chatrun"]["how"] == "new" and transport.sent == 2


def test_two_first_attempts_with_one_key_at_two_replicas_run_one_turn(fake, shop, redis_server):
    bot, receiver = shop
    # Enough answers for two turns: were both attempts to run, the tool would be called twice.
    fake.queue(call("place_order", item="tea"), {"text": "Ordered: tea.", "delay": 1.0},
               call("place_order", item="tea"), {"text": "Ordered: tea.", "delay": 1.0})
    one, two = replicas(bot, redis_server.url())
    body = {"model": "shop", "messages": [{"role": "user", "content": "tea please"}]}
    start = threading.Barrier(2)

    def post(url: str) -> dict:
        with httpx.Client(timeout=60) as client:
            start.wait(30)  # both requests leave at the same instant
            response = client.post(url + "/v1/chat/completions", json=body, headers={"Idempotency-Key": "order-7"})
        assert response.status_code == 200, response.text
        return response.json()

    with one, two, ThreadPoolExecutor(2) as pool:
        # Redis holds every write (reads go on) while both attempts look for an outcome and
        # claim the key: the claims meet, however fast the machine is.
        with redis.Redis(port=redis_server.port) as admin:
            admin.client_pause(3000, all=False)
        replies = list(pool.map(post, [one.url, two.url]))
    assert len(receiver.seen()) == 1  # one turn ran: the order was placed once
    assert sorted(r["chatrun"]["how"] for r in replies) == ["new", "replayed"]
    assert {r["choices"][0]["message"]["content"] for r in replies} == {"Ordered: tea."}
    assert replies[0]["chatrun"]["session"] == replies[1]["chatrun"]["session"]


@pytest.mark.parametrize("how", ["sdk retry", "idempotency key", "responses"])
def test_a_retry_of_a_failed_first_turn_sends_its_tool_call_with_the_same_idempotency_key(fake, shop, redis_server,
                                                                                         how):
    """The first message of a conversation: the tool POSTs, then the model fails, so the turn is
    rolled back (HTTP 500) and the client retries, on the other replica. The retry runs the turn
    again and the model makes the same call: it must carry the same Idempotency-Key (the session's
    id is part of it), or the service that dedupes by it orders twice. The retry made another new
    session, so another key."""
    bot, receiver = shop
    fake.queue(call("place_order", item="tea"), {"status": 400, "body": "the model broke"},
               call("place_order", item="tea"), {"text": "Ordered: tea."})
    one, two = replicas(bot, redis_server.url())
    messages = [{"role": "user", "content": "tea please"}]
    with one, two:
        transport = Alternating([one.url, two.url])
        with sdk(transport, timeout=30, retries=0 if how == "idempotency key" else 1) as client:
            if how == "responses":  # no replays there, but the retry of a failed first input all the same
                response = client.responses.create(model="shop", input="tea please")
                text, info = response.output_text, response.model_extra["chatrun"]
            else:
                headers = {"Idempotency-Key": "order-9"} if how == "idempotency key" else {}
                if how == "idempotency key":  # the client's own retry, with the same key
                    with pytest.raises(openai.InternalServerError):
                        client.chat.completions.create(model="shop", messages=messages, extra_headers=headers)
                reply = client.chat.completions.create(model="shop", messages=messages, extra_headers=headers)
                text, info = reply.choices[0].message.content, reply.model_extra["chatrun"]
    assert text == "Ordered: tea." and transport.sent == 2
    keys = [d.headers["idempotency-key"] for d in receiver.seen()]
    assert len(keys) == 2 and keys[0] == keys[1], keys
    assert info["how"] == "new" and info["turn"] == 1
