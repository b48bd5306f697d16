"""Issue 36's done-when for Telegram with real processes: two `chatrun serve` replicas on a
real Redis, the fake OpenAI server and the local fake of the Bot API. A delivery Telegram sends
again — to the same replica, to the other one, and after the replica that took it was killed
(-9) before its turn committed — yields exactly one committed turn and one reply; a burst of
deliveries, each sent three times across both replicas at once, loses none and doubles none."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from channel_support import FakeTelegram, telegram_message
from redis_support import Replica
from server_support import wait_until
from webhook_support import OPENAI_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

TOKEN, SECRET = "123456:replica-token", "tg-secret-replicas-0123"
HEADERS = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
BOT = f"""\
name: shop
model: {{{OPENAI_MODEL}}}
env:
  TG_TOKEN: {{secret: true}}
  TG_SECRET: {{secret: true}}
  TG_API: {{}}
channels:
  telegram: {{token: TG_TOKEN, secret: TG_SECRET, api: "{{{{ env.TG_API }}}}", retry: {{backoff: 0.2, max_backoff: 1}}}}
routes:
  main: {{default: true, system: You sell tickets.}}
"""


@pytest.fixture
def setup(tmp_path, fake, redis_server, monkeypatch):
    with FakeTelegram(TOKEN) as telegram:
        for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                            ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        (tmp_path / "bot.yaml").write_text(BOT)
        yield str(tmp_path / "bot.yaml"), redis_server.url(), telegram


def deliver(replica: Replica, update: dict) -> int:
    return httpx.post(f"{replica.url}/channels/shop/telegram", json=update, headers=HEADERS, timeout=120).status_code


def replies(telegram: FakeTelegram) -> list[tuple[int, str]]:
    return [(c["chat_id"], c["text"]) for c in telegram.calls("sendMessage")]


def test_a_delivery_retried_after_its_replica_was_killed_before_the_commit_answers_once(setup, fake):
    bot, store, telegram = setup
    held = threading.Event()

    def responder(body):
        if not held.is_set():  # the first replica's model call hangs until the replica is dead
            held.set()
            return {"text": "never sent", "delay": 600}
        return {"text": "You said hello."}

    fake.responder = responder
    first, second = Replica(bot, store, fake.base_url).start(), Replica(bot, store, fake.base_url).start()
    try:
        threading.Thread(target=lambda: _quietly(deliver, first, telegram_message(5, "hello")), daemon=True).start()
        wait_until(held.is_set, what="the first replica's model call")
        first.kill()  # -9: its turn never committed, its lease runs out
        for _ in range(3):  # Telegram's retries, now on the replica that lives
            assert deliver(second, telegram_message(5, "hello")) == 200
        wait_until(lambda: replies(telegram), what="the reply")
        wait_until(lambda: httpx.get(f"{second.url}/outbox", timeout=30).json()["entries"] == [],
                   what="the outbox emptied")
    finally:
        first.kill()
        second.kill()
    assert replies(telegram) == [(42, "You said hello.")]
    assert len(fake.requests) == 2  # the killed attempt and the one turn that committed


def test_a_burst_delivered_three_times_across_two_replicas_loses_none_and_doubles_none(setup, fake):
    bot, store, telegram = setup
    fake.responder = lambda body: {"text": "Hi " + body["messages"][-1]["content"]}
    replicas = [Replica(bot, store, fake.base_url).start(), Replica(bot, store, fake.base_url).start()]
    users = range(1, 61)
    try:
        sends = [(replicas[(user + copy) % 2], telegram_message(1000 + user, f"u{user}", user=user))
                 for copy in range(3) for user in users]
        with ThreadPoolExecutor(12) as pool:
            statuses = list(pool.map(lambda s: deliver(*s), sends))
        assert statuses == [200] * len(sends)
        wait_until(lambda: len(replies(telegram)) >= len(users), what="a reply to every user")
        wait_until(lambda: all(httpx.get(f"{r.url}/outbox", timeout=30).json()["entries"] == [] for r in replicas),
                   what="the outbox emptied")
    finally:
        for r in replicas:
            r.kill()
    assert sorted(replies(telegram)) == sorted((u, f"Hi u{u}") for u in users)
    assert len(fake.requests) == len(users)


def _quietly(fn, *args):
    try:
        fn(*args)
    except httpx.HTTPError:  # the replica was killed under the request
        pass
