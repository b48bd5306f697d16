"""A follow-up on a channel (issue 36): a Telegram user who goes quiet on a route with
`follow_up:` gets the reminder once, in their chat, through the outbox. Real parts: the app
(TestClient: its sweeper and outbox worker running, its clock a file the test writes), the
real `openai` client against the fake OpenAI server, a local fake of the Bot API."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from channel_support import (
    FakeTelegram,
    FakeWhatsApp,
    telegram_message,
    whatsapp_message,
    whatsapp_signed,
)
from chatrun.engine.clock import FileClock
from chatrun.server.sessions import SessionSettings
from chatrun.server.sweeper import SweepSettings
from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL

TOKEN, SECRET = "123456:test-token", "tg-secret-0123456789"
HEADERS = {"X-Telegram-Bot-Api-Secret-Token": SECRET}

BOT = f"""\
name: shop
model: {{{OPENAI_MODEL}}}
env:
  TG_TOKEN: {{secret: true}}
  TG_SECRET: {{secret: true}}
  TG_API: {{}}
channels:
  telegram: {{token: TG_TOKEN, secret: TG_SECRET, api: "{{{{ env.TG_API }}}}"}}
routes:
  main: {{default: true, system: You sell tickets., tools: [start_booking]}}
  wizard:
    system: Ask for the show.
    follow_up: {{after: 2h, message: "Still there? Your seats are held for you."}}
tools:
  start_booking:
    description: Start booking
    action: {{route: wizard, message: Which show?}}
"""


def responder(body):
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    if user == "book":
        return {"tool_calls": [{"name": "start_booking", "arguments": {}}]}
    return {"text": f"You said {user}."}


def texts(telegram):
    return [c["text"] for c in telegram.calls("sendMessage")]


def test_a_quiet_telegram_user_gets_the_reminder_once(tmp_path, fake, monkeypatch):
    fake.responder = responder
    clock = tmp_path / "clock"
    start = datetime.now(UTC)
    clock.write_text(start.isoformat())
    (tmp_path / "bot.yaml").write_text(BOT)
    with FakeTelegram(TOKEN) as telegram:
        for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                            ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                                 sessions=SessionSettings(clock=FileClock(str(clock))),
                                 sweep=SweepSettings(interval=0.2))
        with TestClient(app) as client:
            assert client.post("/channels/shop/telegram", json=telegram_message(1, "book"),
                               headers=HEADERS).status_code == 200
            wait_until(lambda: texts(telegram) == ["Which show?"], what="the reply")
            clock.write_text((start + timedelta(hours=1)).isoformat())
            time.sleep(1)  # the sweeper looks several times: nothing is due an hour in
            assert texts(telegram) == ["Which show?"]
            clock.write_text((start + timedelta(hours=2, seconds=1)).isoformat())
            wait_until(lambda: len(texts(telegram)) == 2, what="the follow-up in the chat")
            time.sleep(1)  # later sweeps find nothing due: it came once
            assert texts(telegram) == ["Which show?", "Still there? Your seats are held for you."]
            assert {c["chat_id"] for c in telegram.calls("sendMessage")} == {42}


WA_TOKEN, WA_SECRET = "EAAG-test-token", "meta-app-secret-0123"
WA_BOT = f"""\
name: shop
model: {{{OPENAI_MODEL}}}
env:
  WA_TOKEN: {{secret: true}}
  WA_SECRET: {{secret: true}}
  WA_VERIFY: {{secret: true}}
  WA_API: {{}}
channels:
  whatsapp: {{token: WA_TOKEN, app_secret: WA_SECRET, verify_token: WA_VERIFY, api: "{{{{ env.WA_API }}}}"}}
routes:
  main: {{default: true, system: You sell tickets., tools: [start_booking]}}
  wizard:
    system: Ask for the show.
    follow_up:
      after: 2d
      message: Still there?
TEMPLATE
tools:
  start_booking:
    description: Start booking
    action: {{route: wizard, message: Which show?}}
"""


@pytest.mark.parametrize("template", [True, False])
def test_whatsapp_past_24_hours_sends_the_template_or_nothing(template, tmp_path, fake, monkeypatch, caplog):
    fake.responder = responder
    clock = tmp_path / "clock"
    start = datetime.now(UTC)
    clock.write_text(start.isoformat())
    line = "      whatsapp_template: {name: seats_held, language: de}" if template else ""
    (tmp_path / "bot.yaml").write_text(WA_BOT.replace("TEMPLATE", line))
    with FakeWhatsApp(WA_TOKEN) as whatsapp:
        for name, value in (("WA_TOKEN", WA_TOKEN), ("WA_SECRET", WA_SECRET), ("WA_VERIFY", "v-0123"),
                            ("WA_API", whatsapp.url), ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                                 sessions=SessionSettings(clock=FileClock(str(clock))),
                                 sweep=SweepSettings(interval=0.2))
        with TestClient(app) as client:
            body = json.dumps(whatsapp_message("wamid.1", "book")).encode()
            assert client.post("/channels/shop/whatsapp", content=body,
                               headers={**whatsapp_signed(WA_SECRET, body),
                                        "Content-Type": "application/json"}).status_code == 200
            wait_until(lambda: len(whatsapp.seen) == 1, what="the reply")
            clock.write_text((start + timedelta(days=2, seconds=1)).isoformat())
            if template:
                wait_until(lambda: len(whatsapp.seen) == 2, what="the template message")
                assert whatsapp.seen[1].body["type"] == "template"
                assert whatsapp.seen[1].body["template"] == {"name": "seats_held", "language": {"code": "de"}}
            else:
                wait_until(lambda: "not sent" in caplog.text, what="the refusal logged")
                assert "whatsapp_template" in caplog.text
            time.sleep(1)
            assert len(whatsapp.seen) == (2 if template else 1)
