"""Issue 36's done-when with real processes: two `chatrun serve` replicas on a real Redis, the
fake OpenAI server and a local fake of each platform's API. A delivery the platform sends again
after the replica that took it was killed (-9) before its turn committed yields exactly one
committed turn and one reply — on every webhook channel (Telegram, Slack, WhatsApp, Teams).
Slack, which gets its answer before the turn is done and never sends a delivery again after
a 200, loses nothing either: the replica that answered wrote the message to the store first,
and the other runs its turn (server/channels/acked.py). A burst of Telegram deliveries, each
sent three times across both replicas at once, loses none and doubles none."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from channel_support import (
    FakeSlack,
    FakeTelegram,
    FakeWhatsApp,
    slack_message,
    slack_signed,
    telegram_message,
    whatsapp_message,
    whatsapp_signed,
)
from redis_support import Replica
from server_support import wait_until
from webhook_support import OPENAI_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

TOKEN, SECRET = "123456:replica-token", "tg-secret-replicas-0123"
HEADERS = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
RETRY = "retry: {backoff: 0.2, max_backoff: 1}"
CHANNELS = {
    "telegram": f'telegram: {{token: TG_TOKEN, secret: TG_SECRET, api: "{{{{ env.TG_API }}}}", {RETRY}}}',
    "slack": f'slack: {{token: SLACK_TOKEN, signing_secret: SLACK_SIGNING, api: "{{{{ env.SLACK_API }}}}", {RETRY}}}',
    "whatsapp": f'whatsapp: {{token: WA_TOKEN, app_secret: WA_SECRET, verify_token: WA_VERIFY, '
                f'api: "{{{{ env.WA_API }}}}", {RETRY}}}',
    "teams": f'teams: {{app_id: TEAMS_APP_ID, app_password: TEAMS_APP_PASSWORD, openid: "{{{{ env.BF }}}}/openid", '
             f'token_url: "{{{{ env.BF }}}}/token", {RETRY}}}',
}
ENV_VARS = ["TG_TOKEN", "TG_SECRET", "TG_API", "SLACK_TOKEN", "SLACK_SIGNING", "SLACK_API", "WA_TOKEN", "WA_SECRET",
            "WA_VERIFY", "WA_API", "TEAMS_APP_ID", "TEAMS_APP_PASSWORD", "BF"]


def bot_yaml(kind: str) -> str:
    env = "\n".join(f"  {name}: {{}}" for name in ENV_VARS)
    return f"""\
name: shop
model: {{{OPENAI_MODEL}}}
env:
{env}
channels:
  {CHANNELS[kind]}
routes:
  main: {{default: true, system: You sell tickets., tools: [bye]}}
tools:
  bye: {{description: End the conversation., action: {{message: Goodbye., end: true}}}}
"""


@dataclass
class Platform:
    """One platform's side of the test: its env, how it delivers a user's text (`send(replica,
    delivery number, text)`, the HTTP status), and the replies its fake API received."""

    kind: str
    env: dict[str, str]
    send: Callable[[Replica, int, str], int]
    replies: Callable[[], list[str]]


@contextlib.contextmanager
def platform(kind: str) -> Iterator[Platform]:
    if kind == "telegram":
        with FakeTelegram(TOKEN) as tg:
            yield Platform(kind, {"TG_TOKEN": TOKEN, "TG_SECRET": SECRET, "TG_API": tg.url},
                           lambda r, n, text: _post(r, kind, json.dumps(telegram_message(n, text)).encode(),
                                                    HEADERS),
                           lambda: [c["text"] for c in tg.calls("sendMessage")])
    elif kind == "slack":
        with FakeSlack("xoxb-replicas") as slack:
            def send(r: Replica, n: int, text: str) -> int:
                body = json.dumps(slack_message(f"Ev{n}", text)).encode()
                return _post(r, kind, body, slack_signed("slack-signing-0123", body, int(time.time())))
            yield Platform(kind, {"SLACK_TOKEN": "xoxb-replicas", "SLACK_SIGNING": "slack-signing-0123",
                                  "SLACK_API": slack.url + "/api"}, send,
                           lambda: [c["text"] for c in slack.calls("chat.postMessage")])
    elif kind == "whatsapp":
        with FakeWhatsApp("EAAG-replicas") as meta:
            def send(r: Replica, n: int, text: str) -> int:
                body = json.dumps(whatsapp_message(f"wamid.{n}", text)).encode()
                return _post(r, kind, body, whatsapp_signed("meta-secret-0123", body))
            yield Platform(kind, {"WA_TOKEN": "EAAG-replicas", "WA_SECRET": "meta-secret-0123",
                                  "WA_VERIFY": "verify-0123", "WA_API": meta.url + "/v21.0"}, send,
                           lambda: [m.get("text", {}).get("body") or m["interactive"]["body"]["text"]
                                    for m in meta.calls("1065550001/messages")])
    else:
        pytest.importorskip("jwt", reason="PyJWT is not installed (pip install -e '.[test]' brings it)")
        from channel_support import FakeBotFramework

        with FakeBotFramework("app-replicas", "teams-secret-0123") as bf:
            def send(r: Replica, n: int, text: str) -> int:
                activity = bf.activity(f"act-{n}", text)
                token = bf.activity_token(activity["serviceUrl"])
                return _post(r, kind, json.dumps(activity).encode(), {"Authorization": f"Bearer {token}"})
            yield Platform(kind, {"TEAMS_APP_ID": "app-replicas", "TEAMS_APP_PASSWORD": "teams-secret-0123",
                                  "BF": bf.url}, send, lambda: [a["text"] for a in list(bf.activities)])


def _post(replica: Replica, kind: str, body: bytes, headers: dict[str, str]) -> int:
    return httpx.post(f"{replica.url}/channels/shop/{kind}", content=body, timeout=120,
                      headers={"Content-Type": "application/json", **headers}).status_code


def serve(tmp_path, monkeypatch, kind: str, stack: contextlib.ExitStack) -> tuple[str, Platform]:
    api = stack.enter_context(platform(kind))
    for name in ENV_VARS:
        monkeypatch.setenv(name, api.env.get(name, "unused"))
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    (tmp_path / "bot.yaml").write_text(bot_yaml(kind))
    return str(tmp_path / "bot.yaml"), api


def hold_the_first_call(fake) -> threading.Event:
    """The fake model: the first call hangs (until its replica is dead), the others answer."""
    held = threading.Event()

    def responder(body):
        if not held.is_set():
            held.set()
            return {"text": "never sent", "delay": 600}
        return {"text": "You said hello."}

    fake.responder = responder
    return held


def outbox_empty(replica: Replica) -> bool:
    return httpx.get(f"{replica.url}/outbox", timeout=30).json()["entries"] == []


@pytest.mark.parametrize("kind", ["telegram", "slack", "whatsapp", "teams"])
def test_a_delivery_retried_after_its_replica_was_killed_before_the_commit_answers_once(
        tmp_path, fake, redis_server, monkeypatch, kind):
    with contextlib.ExitStack() as stack:
        bot, api = serve(tmp_path, monkeypatch, kind, stack)
        held = hold_the_first_call(fake)
        store = redis_server.url()  # (each call names a new key prefix: both replicas take this one)
        first = Replica(bot, store, fake.base_url).start()
        second = Replica(bot, store, fake.base_url).start()
        try:
            threading.Thread(target=lambda: _quietly(api.send, first, 5, "hello"), daemon=True).start()
            wait_until(held.is_set, what="the first replica's model call")
            first.kill()  # -9: its turn never committed, its lease runs out
            for _ in range(3):  # the platform's retries, now on the replica that lives
                assert api.send(second, 5, "hello") == 200
            wait_until(api.replies, what="the reply")
            wait_until(lambda: outbox_empty(second), what="the outbox emptied")
        finally:
            first.kill()
            second.kill()
        assert api.replies() == ["You said hello."]
        assert len(fake.requests) == 2  # the killed attempt and the one turn that committed


def test_slack_answered_by_a_replica_killed_before_the_commit_is_answered_once_by_the_other(
        tmp_path, fake, redis_server, monkeypatch):
    """Slack got its 200 (it never sends that event again); the replica dies before the turn
    commits; the other replica finds the message in the store and answers it, once."""
    with contextlib.ExitStack() as stack:
        bot, api = serve(tmp_path, monkeypatch, "slack", stack)
        held = hold_the_first_call(fake)
        store = redis_server.url()  # (each call names a new key prefix: both replicas take this one)
        first = Replica(bot, store, fake.base_url).start()
        second = Replica(bot, store, fake.base_url).start()
        try:
            assert api.send(first, 9, "hello") == 200  # answered within Slack's time, the model still held
            wait_until(held.is_set, what="the first replica's model call")
            first.kill()
            wait_until(api.replies, what="the reply, from the replica that lives")
            wait_until(lambda: outbox_empty(second), what="the outbox emptied")
        finally:
            first.kill()
            second.kill()
        assert api.replies() == ["You said hello."]
        assert len(fake.requests) == 2  # the killed attempt and the one turn that committed


def test_a_burst_delivered_three_times_across_two_replicas_loses_none_and_doubles_none(
        tmp_path, fake, redis_server, monkeypatch):
    with contextlib.ExitStack() as stack:
        bot, api = serve(tmp_path, monkeypatch, "telegram", stack)
        telegram = api.replies
        fake.responder = lambda body: {"text": "Hi " + body["messages"][-1]["content"]}
        store = redis_server.url()
        replicas = [Replica(bot, store, fake.base_url).start(), Replica(bot, store, fake.base_url).start()]
        users = range(1, 61)
        try:
            sends = [(replicas[(user + copy) % 2], telegram_message(1000 + user, f"u{user}", user=user))
                     for copy in range(3) for user in users]
            with ThreadPoolExecutor(12) as pool:
                statuses = list(pool.map(lambda s: deliver(*s), sends))
            assert statuses == [200] * len(sends)
            wait_until(lambda: len(telegram()) >= len(users), what="a reply to every user")
            wait_until(lambda: all(outbox_empty(r) for r in replicas), what="the outbox emptied")
        finally:
            for r in replicas:
                r.kill()
        assert sorted(telegram()) == sorted(f"Hi u{u}" for u in users)
        assert len(fake.requests) == len(users)



def test_two_messages_right_after_the_end_on_two_replicas_go_on_in_one_new_session(
        tmp_path, fake, redis_server, monkeypatch):
    """The turn that ends a conversation runs on one replica; a message arrives at each replica
    meanwhile. Both find the conversation ended and go on in one new session, derived from the
    ended one on each replica (each replica started its own, named after its delivery)."""
    asked, released = threading.Event(), threading.Event()

    async def responder(body):
        said = body["messages"][-1]
        if said == {"role": "user", "content": "bye"}:
            asked.set()
            while not released.is_set():  # the ending turn holds its session until both wait for it
                await asyncio.sleep(0.02)
            return {"tool_calls": [{"name": "bye", "arguments": {}}]}
        return {"text": f"Heard {sorted(m['content'] for m in body['messages'] if m['role'] == 'user')}"}

    with contextlib.ExitStack() as stack:
        bot, api = serve(tmp_path, monkeypatch, "telegram", stack)
        fake.responder = responder
        store = redis_server.url()
        replicas = [Replica(bot, store, fake.base_url).start(), Replica(bot, store, fake.base_url).start()]
        try:
            with ThreadPoolExecutor(3) as pool:
                ending = pool.submit(deliver, replicas[0], telegram_message(1, "bye"))
                wait_until(asked.is_set, what="the ending turn asking the model")
                both = [pool.submit(deliver, r, telegram_message(n, text))
                        for r, n, text in ((replicas[0], 2, "one"), (replicas[1], 3, "two"))]
                wait_until(lambda: [waiting(r) for r in replicas] == [1, 1], what="a message waiting on each replica")
                released.set()
                assert [f.result() for f in (ending, *both)] == [200, 200, 200]
            wait_until(lambda: len(api.replies()) >= 3, what="three replies")
            wait_until(lambda: all(outbox_empty(r) for r in replicas), what="the outbox emptied")
        finally:
            for r in replicas:
                r.kill()
        assert sorted(api.replies()) in (["Goodbye.", "Heard ['one', 'two']", "Heard ['one']"],
                                         ["Goodbye.", "Heard ['one', 'two']", "Heard ['two']"]), api.replies()


def waiting(replica: Replica) -> float:
    """The replica's requests waiting for a session held elsewhere (its /metrics gauge)."""
    text = httpx.get(f"{replica.url}/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("chatrun_session_requests_waiting"))


def deliver(replica: Replica, update: dict) -> int:
    return httpx.post(f"{replica.url}/channels/shop/telegram", json=update, headers=HEADERS, timeout=120).status_code


def _quietly(fn, *args):
    try:
        fn(*args)
    except httpx.HTTPError:  # the replica was killed under the request
        pass
