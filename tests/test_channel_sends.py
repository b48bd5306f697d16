"""A reply the outbox sends to a platform that misbehaves (the local fakes of
tests/channel_support.py, real HTTP servers on loopback), through `Channels.deliver` as the
outbox calls it: a platform trickling its answer in fails the attempt within the channel's
timeout (httpx's timeout is per read: the attempt outlived the outbox's claim, and another
replica sent the reply again), a huge answer is not read whole, and a long reply to a slow
platform is sent over several tries, each within the outbox's claim, none sending a message
again. Every kind calls its platform through the one `ChannelKind.call`."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import chatrun
from channel_support import FakeSlack, FakeTelegram, FakeWhatsApp
from chatrun.server.channels.base import MAX_ANSWER_BYTES, ChannelKind
from chatrun.server.channels.door import CHANNELS, Channels
from chatrun.server.webhook import Attempt
from chatrun.store.aio import open_async_store

pytest.importorskip("jwt", reason="PyJWT is not installed (pip install -e '.[test]' brings it)")

from channel_support import FakeBotFramework  # noqa: E402

SECRETS = {"TG_TOKEN": "123456:sends", "TG_SECRET": "tg-secret-sends-01", "SLACK_TOKEN": "xoxb-sends",
           "SLACK_SIGNING": "slack-signing-sends", "WA_TOKEN": "EAAG-sends", "WA_SECRET": "meta-secret-sends",
           "WA_VERIFY": "verify-sends", "TEAMS_APP_ID": "app-sends", "TEAMS_APP_PASSWORD": "teams-secret-sends"}
BOT = f"""\
name: shop
model: {{provider: scripted, name: gpt-4o-mini}}
env:
{chr(10).join(f"  {name}: {{secret: true}}" for name in SECRETS)}
  API: {{}}
channels:
  telegram: {{token: TG_TOKEN, secret: TG_SECRET, api: "{{{{ env.API }}}}"}}
  slack: {{token: SLACK_TOKEN, signing_secret: SLACK_SIGNING, api: "{{{{ env.API }}}}/api"}}
  whatsapp: {{token: WA_TOKEN, app_secret: WA_SECRET, verify_token: WA_VERIFY, api: "{{{{ env.API }}}}/v21.0"}}
  teams: {{app_id: TEAMS_APP_ID, app_password: TEAMS_APP_PASSWORD, openid: "{{{{ env.API }}}}/openid",
           token_url: "{{{{ env.API }}}}/token"}}
routes:
  main: {{default: true, system: s}}
"""
API = {"telegram": "the Bot API", "slack": "the Web API", "whatsapp": "the Cloud API", "teams": "the Bot Connector"}
WHO = {"telegram": "telegram sendMessage", "slack": "slack chat.postMessage", "whatsapp": "whatsapp messages",
       "teams": "teams"}


def fake_of(kind: str) -> Any:
    if kind == "teams":
        return FakeBotFramework(SECRETS["TEAMS_APP_ID"], SECRETS["TEAMS_APP_PASSWORD"])
    return {"telegram": FakeTelegram(SECRETS["TG_TOKEN"]), "slack": FakeSlack(SECRETS["SLACK_TOKEN"]),
            "whatsapp": FakeWhatsApp(SECRETS["WA_TOKEN"])}[kind]


def address(kind: str, api: Any) -> dict[str, Any]:
    return {"telegram": {"chat_id": 42}, "slack": {"channel": "D42"},
            "whatsapp": {"to": "4915112345678", "phone_number_id": "1065550001"},
            "teams": {"service_url": api.url, "conversation": "c1", "reply_to": "a1"}}[kind]


def deliver(tmp_path, kind: str, api: Any) -> Attempt:
    """The outbox's attempt at a reply of one message, as Channels.deliver makes it."""
    (tmp_path / "bot.yaml").write_text(BOT)
    bot = chatrun.load_bot(tmp_path / "bot.yaml").config
    body = {"id": "evt_1", "data": {"to": address(kind, api), "events": [{"type": "Message", "data": "Hello."}]}}

    async def attempt() -> Attempt:
        channels = Channels(None)
        try:
            return await channels.deliver(bot, kind, body)
        finally:
            await channels.aclose()

    return asyncio.run(attempt())


@pytest.fixture
def env(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(ChannelKind, "timeout", 0.5)


@pytest.mark.parametrize("kind", ["telegram", "slack", "whatsapp", "teams"])
def test_a_platform_trickling_its_answer_in_fails_the_attempt_within_the_timeout(tmp_path, monkeypatch, env, kind):
    with fake_of(kind) as api:
        monkeypatch.setenv("API", api.url)
        api.trickle = 0.2  # a byte every 0.2 s: an answer of 40 bytes or more takes 8 s, each read in time
        failed = deliver(tmp_path, kind, api)
    assert not failed.delivered
    assert failed.error == f"{WHO[kind]}: no answer from {API[kind]} within 0.5 s", failed.error


def test_a_huge_answer_is_not_read_whole(tmp_path, monkeypatch, env):
    monkeypatch.setattr(ChannelKind, "timeout", 20.0)
    with FakeSlack(SECRETS["SLACK_TOKEN"]) as api:
        monkeypatch.setenv("API", api.url)
        api.pad = 40 * MAX_ANSWER_BYTES
        failed = deliver(tmp_path, "slack", api)
    assert not failed.delivered
    assert failed.error == f"slack chat.postMessage: the Web API answered more than {MAX_ANSWER_BYTES} bytes"


def test_a_platforms_answer_is_read_as_before(tmp_path, monkeypatch, env):
    """The answer `call` hands the kind is the platform's: Slack's JSON says ok, the reply is delivered."""
    with FakeSlack(SECRETS["SLACK_TOKEN"]) as api:
        monkeypatch.setenv("API", api.url)
        delivered = deliver(tmp_path, "slack", api)
        assert delivered.delivered, delivered.error
        assert [c["text"] for c in api.calls("chat.postMessage")] == ["Hello."]


def sent_texts(kind: str, api: Any) -> list[str]:
    """The texts of the messages the platform took, in order."""
    if kind == "teams":
        return [a["text"] for a in list(api.activities)]
    if kind == "whatsapp":
        return [m["text"]["body"] for m in api.calls("1065550001/messages")]
    return [m["text"] for m in api.calls({"telegram": "sendMessage", "slack": "chat.postMessage"}[kind])]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["telegram", "slack", "whatsapp", "teams"])
def test_a_long_reply_to_a_slow_platform_is_sent_over_tries_within_the_claim_and_never_twice(
        tmp_path, monkeypatch, env, kind):
    """A reply of five messages (five paragraphs, each 0.8 of the platform's most) is five calls,
    one after another. The platform answers each in 0.4 s: a try that may take 1.5 s (the
    outbox's claim) with calls of up to 1 s starts no call past 0.5 s, so it sends two, notes
    them, and fails naming what is left; each next try sends from there (the second is refused
    by the platform), until the reply is whole. (All five were sent in one try however long it took: a reply of many messages held
    the claim past its lease, and another replica claiming it sent them again.)"""
    monkeypatch.setattr(ChannelKind, "timeout", 1.0)
    size = CHANNELS[kind].max_text or 0
    paragraphs = [f"Part {i}. " + "word " * int(0.8 * size / 5) for i in range(5)]
    paragraphs = [p.strip() for p in paragraphs]
    (tmp_path / "bot.yaml").write_text(BOT)
    bot = chatrun.load_bot(tmp_path / "bot.yaml").config
    with fake_of(kind) as api:
        monkeypatch.setenv("API", api.url)
        api.delay = 0.4
        body = {"id": "evt_long", "session": "s1",
                "data": {"to": address(kind, api), "events": [{"type": "Message", "data": "\n\n".join(paragraphs)}]}}

        async def tries() -> list[tuple[Attempt, float]]:
            store = open_async_store(f"sqlite:///{tmp_path / 's.db'}")
            channels = Channels(None, store)
            made: list[tuple[Attempt, float]] = []
            try:
                while not made or not made[-1][0].delivered:
                    assert len(made) < 6, made  # each try but the refused one sends a message at least
                    api.status = 502 if len(made) == 1 else 200  # the second try: the platform refuses
                    started = time.monotonic()
                    attempt = await channels.deliver(bot, kind, body, within=1.5)
                    made.append((attempt, time.monotonic() - started))
                return made
            finally:
                await channels.aclose()
                await store.close()

        made = asyncio.run(tries())
        texts = sent_texts(kind, api)
    assert texts == paragraphs  # each message once, in order
    first, seconds = made[0]
    assert not first.delivered and first.error is not None
    assert first.error.startswith(f"channel {kind} of bot shop: ") and first.error.endswith(
        " of the reply's 5 messages sent within this try's 1.5 s (a call may take 1 s); the rest on the next try")
    assert seconds < 1.5 + 1.0  # (a bound for a loaded machine: what a try may take, plus a call)
    assert not made[1][0].delivered and made[1][0].status == 502


def test_a_replys_sources_are_headed_in_the_sessions_locale(tmp_path, monkeypatch, env):
    """The Sources message's heading is chatrun's word (`sources`), in the locale the reply was
    made in (its outbox entry's `data.locale`), as the page shows it."""
    (tmp_path / "bot.yaml").write_text(BOT)
    bot = chatrun.load_bot(tmp_path / "bot.yaml").config
    sources = {"sources": [{"title": "Rückgabe", "ref": "returns.md", "url": "https://docs.example/returns"}]}
    with FakeTelegram(SECRETS["TG_TOKEN"]) as api:
        monkeypatch.setenv("API", api.url)
        for locale in ("de", None):
            data = {"to": {"chat_id": 42}, "events": [{"type": "Message", "data": "30 Tage."},
                                                      {"type": "Sources", "data": sources}]}
            body = {"id": f"evt_{locale}", "data": data | ({"locale": locale} if locale else {})}

            async def attempt(body=body) -> Attempt:
                channels = Channels(None)
                try:
                    return await channels.deliver(bot, "telegram", body)
                finally:
                    await channels.aclose()

            assert asyncio.run(attempt()).delivered
        texts = [call["text"] for call in api.calls("sendMessage")]
    assert texts == ["30 Tage.", "Quellen:\n1. Rückgabe — https://docs.example/returns",
                     "30 Tage.", "Sources:\n1. Rückgabe — https://docs.example/returns"]
