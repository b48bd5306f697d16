"""What a `Usage` event's `owner` and `principal` hold on each door (docs/observability.md,
"Usage for billing"): over HTTP with a principal signed in by a token of the auth file, and on a
channel (the Telegram fake of tests/channel_support.py). A real server app (its lifespan runs
the delivery worker), real SQLite, the fake OpenAI server, a real local webhook receiver."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from channel_support import FakeTelegram, telegram_message
from chatrun.server.auth import Auth
from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL, RETRY, Receiver

TOKEN, SECRET = "123456:test-token", "tg-secret-0123456789"
BOT = f"""\
name: desk
model: {{{OPENAI_MODEL}}}
env:
  BILLING_URL: {{}}
  TG_TOKEN: {{secret: true}}
  TG_SECRET: {{secret: true}}
  TG_API: {{default: "http://127.0.0.1:9"}}
channels:
  telegram:
    token: TG_TOKEN
    secret: TG_SECRET
    api: "{{{{ env.TG_API }}}}"
    retry: {{attempts: 50, backoff: 0.2, max_backoff: 0.5}}
sinks:
  billing:
    webhook: {{url: "{{{{ env.BILLING_URL }}}}/usage"}}
    events: [Usage]
    retry: {{{RETRY}}}
routes:
  main: {{default: true, system: Answer briefly.}}
"""
ANA, OLGA = "tok-ana-0123456", "tok-olga-0123456"


@pytest.fixture
def setting(tmp_path, fake, monkeypatch):
    with Receiver() as billing, FakeTelegram(TOKEN) as telegram:
        for name, value in (("BILLING_URL", billing.url), ("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET),
                            ("TG_API", telegram.url), ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        fake.responder = lambda body: {"text": "Hi."}
        (tmp_path / "bot.yaml").write_text(BOT)
        yield tmp_path, billing, telegram


def usage_events(billing: Receiver, count: int) -> list[dict]:
    wait_until(lambda: len({d.body["id"] for d in billing.accepted()}) >= count, what=f"{count} Usage events")
    return list({d.body["id"]: d.body for d in billing.accepted()}.values())


def test_over_http_owner_and_principal_are_the_signed_in_principal(setting):
    """Only the session's owner may send it a turn (another principal gets 404: docs/security.md),
    so on HTTP both name the principal the token signs in."""
    tmp_path, billing, _ = setting
    auth = Auth.from_mapping({"tokens": {ANA: {"principal": "ana"},
                                         OLGA: {"principal": "olga", "roles": ["operators"]}}})
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}", auth=auth)
    with TestClient(app) as client:
        ana = {"Authorization": f"Bearer {ANA}"}
        assert client.post("/bots/desk/sessions", json={"id": "s"}, headers=ana).status_code == 201
        said = client.post("/bots/desk/sessions/s/messages", json={"userMessage": "hello"}, headers=ana)
        assert said.status_code == 200 and said.json()["ok"], said.text
        olga = {"Authorization": f"Bearer {OLGA}"}
        said = client.post("/bots/desk/sessions/s/messages", json={"userMessage": "again"}, headers=olga)
        assert said.status_code == 404, said.text  # another's session does not exist for her: no turn of hers
        [event] = usage_events(billing, 1)
    assert (event["session"], event["data"]["owner"], event["data"]["principal"]) == ("s", "ana", "ana")


def test_on_telegram_owner_and_principal_are_the_senders_channel_principal(setting):
    tmp_path, billing, _ = setting
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        for update in (telegram_message(1, "hello"), telegram_message(2, "hi", user=7, first_name="Bo")):
            sent = client.post("/channels/desk/telegram", json=update,
                               headers={"X-Telegram-Bot-Api-Secret-Token": SECRET})
            assert sent.status_code == 200, sent.text
        events = usage_events(billing, 2)
    assert sorted((e["data"]["owner"], e["data"]["principal"]) for e in events) == \
        [("telegram:42", "telegram:42"), ("telegram:7", "telegram:7")]


def test_without_auth_owner_and_principal_are_null(setting):
    tmp_path, billing, _ = setting
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        assert client.post("/bots/desk/sessions", json={"id": "s"}).status_code == 201
        assert client.post("/bots/desk/sessions/s/messages", json={"userMessage": "hello"}).json()["ok"]
        [event] = usage_events(billing, 1)
    assert (event["data"]["owner"], event["data"]["principal"]) == (None, None)
