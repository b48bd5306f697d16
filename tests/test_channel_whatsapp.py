"""Issue 36: a bot on WhatsApp (the Cloud API). Real parts: the app (TestClient, its outbox
worker running), the real `openai` client against the fake OpenAI server, and a local fake of
the Graph API (tests/channel_support.py) receiving the replies. Tried here: Meta's URL check
(answered only with the verify token), the body signature (X-Hub-Signature-256: forged and
missing get 401 and run nothing), one reply per message however often Meta delivers it,
status webhooks ignored, reply buttons for the user's confirmation and a press deciding it,
a list for more than three choices."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from channel_support import FakeWhatsApp, whatsapp_message, whatsapp_signed
from channel_support import shop_responder as responder
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
state: {{booked: 0}}
routes:
  main:
    default: true
    system: You sell tickets.
    choices: [Concert, Theatre, Opera, Ballet]
    tools: [book]
tools:
  book:
    description: Book a ticket.
    parameters: {{type: object, properties: {{show: {{type: string}}}}, required: [show]}}
    confirm: "Book {{{{ args.show }}}}?"
    action: {{set: {{state.booked: "{{{{ state.booked + 1 }}}}"}}, reply: "Booked {{{{ args.show }}}}."}}
"""




@pytest.fixture
def meta():
    with FakeWhatsApp(TOKEN) as api:
        yield api


@pytest.fixture
def client(tmp_path, fake, meta, monkeypatch):
    for name, value in (("WA_TOKEN", TOKEN), ("WA_SECRET", APP_SECRET), ("WA_VERIFY", VERIFY),
                        ("WA_API", meta.url + "/v21.0"), ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT)
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as c:
        yield c


def post(client, payload, secret=APP_SECRET):
    body = json.dumps(payload).encode()
    return client.post("/channels/shop/whatsapp", content=body,
                       headers={"Content-Type": "application/json", **whatsapp_signed(secret, body)})


def sent(meta):
    return meta.calls("1065550001/messages")


def outbox_empty(client) -> bool:
    return client.get("/outbox").json()["entries"] == []


def test_meta_checks_the_url_with_the_verify_token_only(client):
    query = {"hub.mode": "subscribe", "hub.challenge": "1158201444", "hub.verify_token": VERIFY}
    answer = client.get("/channels/shop/whatsapp", params=query)
    assert (answer.status_code, answer.text) == (200, "1158201444")
    assert client.get("/channels/shop/whatsapp", params=query | {"hub.verify_token": "guess"}).status_code == 403


def test_a_message_delivered_three_times_gets_one_reply_with_a_list_of_four_choices(client, meta, fake):
    for _ in range(3):
        assert post(client, whatsapp_message("wamid.A1", "hello")).status_code == 200
    wait_until(lambda: sent(meta), what="the reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    [reply] = sent(meta)
    assert reply["to"] == "4915112345678" and reply["type"] == "interactive"
    assert reply["interactive"]["body"]["text"] == "You said hello."
    rows = reply["interactive"]["action"]["sections"][0]["rows"]
    assert [r["id"] for r in rows] == ["Concert", "Theatre", "Opera", "Ballet"]
    assert len(fake.requests) == 1


def test_a_forged_or_missing_signature_gets_401_and_statuses_are_not_messages(client, meta, fake):
    assert post(client, whatsapp_message("wamid.A1", "hi"), secret="guess").status_code == 401
    body = json.dumps(whatsapp_message("wamid.A2", "hi")).encode()
    assert client.post("/channels/shop/whatsapp", content=body, headers={"Content-Type": "application/json"}).status_code == 401
    statuses = {"object": "whatsapp_business_account", "entry": [{"id": "W", "changes": [{"field": "messages", "value": {
        "messaging_product": "whatsapp", "metadata": {"phone_number_id": "1065550001"},
        "statuses": [{"id": "wamid.out1", "status": "read", "recipient_id": "4915112345678"}]}}]}]}
    assert post(client, statuses).status_code == 200
    assert fake.requests == [] and meta.seen == [] and outbox_empty(client)


def test_a_delivery_whose_message_was_sent_over_a_day_ago_runs_no_turn(client, meta, fake):
    """A captured signed delivery replayed once its dedupe record is gone (retention, erasure)
    would run its turn again: a message older than MAX_DELIVERY_AGE by its own signed timestamp
    is answered 200 (Meta stops sending it) and runs nothing; a fresh one runs."""
    from chatrun.server.channels.base import MAX_DELIVERY_AGE
    old = time.time() - MAX_DELIVERY_AGE - 60
    assert post(client, whatsapp_message("wamid.OLD", "hello", sent=old)).status_code == 200
    assert post(client, whatsapp_message("wamid.NEW", "again")).status_code == 200
    wait_until(lambda: sent(meta), what="the fresh message's reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert [r["interactive"]["body"]["text"] for r in sent(meta)] == ["You said again."]
    assert len(fake.requests) == 1


def test_a_delivery_replayed_after_its_user_was_erased_runs_no_turn_within_the_window(client, meta, fake):
    """Erasure deletes the session, and with it the outcome that dedupes the delivery: a captured
    delivery replayed within MAX_DELIVERY_AGE ran its turn again in a new session. The erased
    session's delivery ids are kept (hashed, store/replays.py) for the window: the replay is
    answered 200 and runs nothing, stores nothing; a new message of the same user runs."""
    assert post(client, whatsapp_message("wamid.E1", "my card is 4111")).status_code == 200
    wait_until(lambda: sent(meta), what="the reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    erased = client.delete("/principals/whatsapp:4915112345678").json()["erased"]
    assert erased["sessions"] == 1, erased
    assert post(client, whatsapp_message("wamid.E1", "my card is 4111")).status_code == 200
    assert client.delete("/principals/whatsapp:4915112345678?dry_run=true").json()["erased"]["sessions"] == 0
    assert len(fake.requests) == 1
    assert post(client, whatsapp_message("wamid.E2", "hello again")).status_code == 200
    wait_until(lambda: len(sent(meta)) == 2, what="the new message's reply")
    assert [r["interactive"]["body"]["text"] for r in sent(meta)] == ["You said my card is 4111.", "You said hello again."]
    assert len(fake.requests) == 2


def test_the_users_confirmation_is_reply_buttons_and_a_press_decides_it(client, meta):
    post(client, whatsapp_message("wamid.B1", "book Hamlet"))
    wait_until(lambda: sent(meta), what="the question")
    question = sent(meta)[-1]["interactive"]
    assert question["type"] == "button" and question["body"]["text"] == "Book Hamlet?"
    assert [b["reply"] for b in question["action"]["buttons"]] == [{"id": "yes#p1", "title": "Yes"},
                                                                   {"id": "no#p1", "title": "No"}]
    post(client, whatsapp_message("wamid.B2", button="yes#p1"))
    wait_until(lambda: any("Booked Hamlet" in json.dumps(m) for m in sent(meta)), what="the booking's reply")


def test_replies_wait_while_the_cloud_api_is_down(client, meta):
    meta.status = 503
    post(client, whatsapp_message("wamid.C1", "hello"))
    wait_until(lambda: len(meta.seen) >= 2, what="two refused attempts")
    meta.status = 200
    wait_until(lambda: sent(meta), what="the reply once the API is back")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert len(sent(meta)) == 1


def test_each_sender_to_the_business_number_has_their_own_conversation(client, meta, fake):
    """WhatsApp delivers one person's chat with the business (no groups): a conversation is the
    number and the sender, each answered at their own number from a session of their own."""
    post(client, whatsapp_message("wamid.D1", "one", user="4915100000001"))
    post(client, whatsapp_message("wamid.D2", "two", user="4915100000002"))
    wait_until(lambda: len(sent(meta)) >= 2, what="two replies")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert sorted((r["to"], r["interactive"]["body"]["text"]) for r in sent(meta)) == [
        ("4915100000001", "You said one."), ("4915100000002", "You said two.")]
    said = [[m["content"] for m in r["messages"] if m["role"] == "user"] for r in fake.requests]
    assert sorted(said) == [["one"], ["two"]]  # neither session holds the other's message


def test_a_list_of_choices_opens_with_words_in_the_sessions_locale(tmp_path, fake, meta, monkeypatch):
    """The list's button and section title are chatrun's words: in the session's locale (here the
    bot's first, German: WhatsApp says no language), not English."""
    for name, value in (("WA_TOKEN", TOKEN), ("WA_SECRET", APP_SECRET), ("WA_VERIFY", VERIFY),
                        ("WA_API", meta.url + "/v21.0"), ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace("state: {booked: 0}\n", "locales: [de, en]\nstate: {booked: 0}\n"))
    (tmp_path / "locales").mkdir()
    for locale in ("de", "en"):
        (tmp_path / "locales" / f"{locale}.yaml").write_text("{}\n")
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        assert post(client, whatsapp_message("wamid.A1", "hello")).status_code == 200
        wait_until(lambda: sent(meta), what="the reply")
    action = sent(meta)[0]["interactive"]["action"]
    assert (action["button"], action["sections"][0]["title"]) == ("Auswählen", "Bitte wählen Sie")
