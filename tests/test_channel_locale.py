"""A channel's user keeps the language they chose when a conversation ends and the next begins
(docs/i18n.md, "The session's locale"). WhatsApp says no language, so a German user's only way
to German is the bot's `state.locale`; after an `end`, their next message started a session in
the bot's first locale again, and they read (and the model was prompted) in English. Real parts:
the app (TestClient, its outbox worker), the real `openai` client against the fake OpenAI
server, and the local fake of the Graph API (tests/channel_support.py)."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from channel_support import FakeWhatsApp, whatsapp_message, whatsapp_signed
from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL

TOKEN, APP_SECRET, VERIFY = "EAAG-test-token", "meta-app-secret-0123", "verify-me-0123"

BOT = f"""\
name: shop
model: {{{OPENAI_MODEL}}}
env:
  WA_TOKEN: {{secret: true}}
  WA_SECRET: {{secret: true}}
  WA_VERIFY: {{secret: true}}
  WA_API: {{}}
channels:
  whatsapp:
    token: WA_TOKEN
    app_secret: WA_SECRET
    verify_token: WA_VERIFY
    api: "{{{{ env.WA_API }}}}"
    retry: {{attempts: 50, backoff: 0.2, max_backoff: 0.5}}
locales: [en, de]
state: {{locale: null}}
routes:
  main:
    default: true
    system: "{{{{ t('prompt') }}}}"
    tools: [speak, bye]
tools:
  speak:
    description: Switch the language you answer in.
    parameters: {{type: object, properties: {{language: {{type: string, enum: [en, de]}}}}, required: [language]}}
    action: {{set: {{state.locale: "{{{{ args.language }}}}"}}}}
  bye:
    description: End the conversation.
    action: {{end: true}}
"""


def post(client, payload):
    body = json.dumps(payload).encode()
    return client.post("/channels/shop/whatsapp", content=body,
                       headers={"Content-Type": "application/json", **whatsapp_signed(APP_SECRET, body)})


def test_a_whatsapp_user_who_chose_german_is_answered_in_german_after_the_conversation_ends(
        tmp_path, fake, monkeypatch):
    with FakeWhatsApp(TOKEN) as meta:
        for name, value in (("WA_TOKEN", TOKEN), ("WA_SECRET", APP_SECRET), ("WA_VERIFY", VERIFY),
                            ("WA_API", meta.url + "/v21.0"), ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        (tmp_path / "bot.yaml").write_text(BOT)
        (tmp_path / "locales").mkdir()
        (tmp_path / "locales" / "en.yaml").write_text("prompt: You sell tickets.\n")
        (tmp_path / "locales" / "de.yaml").write_text("prompt: Du verkaufst Karten.\n")
        fake.queue({"tool_calls": [{"name": "speak", "arguments": {"language": "de"}}]}, {"text": "Gern."},
                   {"tool_calls": [{"name": "bye", "arguments": {}}]}, {"text": "Hallo wieder."})
        with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
            for wamid, text, replies, calls in (("wamid.1", "Deutsch bitte", 1, 2), ("wamid.2", "tschüss", 1, 3),
                                                ("wamid.3", "hallo nochmal", 2, 4)):
                assert post(client, whatsapp_message(wamid, text)).status_code == 200
                wait_until(lambda n=replies, c=calls: len(meta.seen) >= n and len(fake.requests) >= c, what=wamid)
        said = [m.body["text"]["body"] for m in meta.seen]
    assert said == ["Gern.", "Hallo wieder."]
    systems = [r["messages"][0]["content"] for r in fake.requests]
    assert systems[-1] == "Du verkaufst Karten."  # the new conversation's prompt, in German
