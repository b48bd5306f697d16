"""Issue 36: files users send on a channel become the turn's attachments. Real parts: the app
(TestClient, its outbox worker), the real `openai` client against the fake OpenAI server (which
sees the image as a content part), the SQLite store's blob area, and local fakes of Telegram's
Bot API (getFile, then the file's path), Slack's Web API (url_private with the bot token) and
the WhatsApp Cloud API (GET /MEDIA_ID, then its URL with the token). Tried here: a photo, a
document and a file share reach the model; a kind or a size the route does not take, a route
that takes no files and a file the platform will not give are told to the user and run no turn;
a retried delivery fetches nothing again and answers once."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from channel_support import (
    FakeSlack,
    FakeTelegram,
    FakeWhatsApp,
    die_after_a_notice_commits,
    slack_file_share,
    slack_signed,
    telegram_file,
    telegram_message,
    whatsapp_media,
    whatsapp_message,
    whatsapp_signed,
)
from chatrun.definition.page_texts import BUILTIN
from chatrun.server.channels.base import session_id_for
from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL

TG_TOKEN, TG_SECRET = "123456:test-token", "tg-secret-0123456789"
SLACK_TOKEN, SLACK_SIGNING = "xoxb-test-token", "slack-signing-secret-0123"
WA_TOKEN, WA_SECRET = "EAAG-test-token", "meta-app-secret-0123"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 200  # the bytes of a small "image"
FILE_UNREADABLE, FILES_NOT_TAKEN = BUILTIN["en"]["channel_file_unreadable"], BUILTIN["en"]["channel_no_files"]

BOT = f"""\
name: shop
model: {{{OPENAI_MODEL}}}
env:
  TG_TOKEN: {{secret: true}}
  TG_SECRET: {{secret: true}}
  TG_API: {{}}
  SLACK_TOKEN: {{secret: true}}
  SLACK_SIGNING: {{secret: true}}
  SLACK_API: {{}}
  WA_TOKEN: {{secret: true}}
  WA_SECRET: {{secret: true}}
  WA_VERIFY: {{secret: true, default: verify-me}}
  WA_API: {{}}
channels:
  telegram: {{token: TG_TOKEN, secret: TG_SECRET, api: "{{{{ env.TG_API }}}}"}}
  slack: {{token: SLACK_TOKEN, signing_secret: SLACK_SIGNING, api: "{{{{ env.SLACK_API }}}}"}}
  whatsapp: {{token: WA_TOKEN, app_secret: WA_SECRET, verify_token: WA_VERIFY, api: "{{{{ env.WA_API }}}}"}}
routes:
  main:
    default: true
    system: Look at the photos of the damaged parcel.
    attachments: {{kinds: [image/*, application/pdf], max_bytes: 5000, max_count: 2}}
"""


def responder(body):
    """The fake model: says what the user's message carried (its text and its content parts)."""
    content = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    if isinstance(content, str):
        return {"text": f"Text only: {content}"}
    kinds = [p["type"] for p in content if p["type"] != "text"]
    text = " ".join(p["text"] for p in content if p["type"] == "text")
    return {"text": f"Got {', '.join(kinds)} with '{text}'."}


@pytest.fixture
def apis():
    with FakeTelegram(TG_TOKEN) as telegram, FakeSlack(SLACK_TOKEN) as slack, FakeWhatsApp(WA_TOKEN) as meta:
        yield telegram, slack, meta


def serve(tmp_path, fake, apis, monkeypatch, bot=BOT):
    telegram, slack, meta = apis
    for name, value in (("TG_TOKEN", TG_TOKEN), ("TG_SECRET", TG_SECRET), ("TG_API", telegram.url),
                        ("SLACK_TOKEN", SLACK_TOKEN), ("SLACK_SIGNING", SLACK_SIGNING),
                        ("SLACK_API", slack.url + "/api"), ("WA_TOKEN", WA_TOKEN), ("WA_SECRET", WA_SECRET),
                        ("WA_API", meta.url + "/v21.0"), ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(bot)
    return TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}"))


@pytest.fixture
def client(tmp_path, fake, apis, monkeypatch):
    with serve(tmp_path, fake, apis, monkeypatch) as c:
        yield c


def telegram_texts(telegram):
    return [c["text"] for c in telegram.calls("sendMessage")]


def to_telegram(client, update):
    return client.post("/channels/shop/telegram", json=update, headers={"X-Telegram-Bot-Api-Secret-Token": TG_SECRET})


def test_a_telegram_photo_with_a_caption_reaches_the_model_as_an_image(client, apis, fake, tmp_path):
    telegram = apis[0]
    telegram.files["ph-1"] = PNG
    assert to_telegram(client, telegram_file(1, "ph-1", caption="it came broken")).status_code == 200
    wait_until(lambda: telegram_texts(telegram), what="the reply")
    assert telegram_texts(telegram) == ["Got image_url with 'it came broken'."]
    # The largest size was fetched (getFile, then its path), with the bot's token in the URL.
    assert telegram.calls("getFile") == [{"file_id": "ph-1"}]
    assert telegram.downloads == [f"/file/bot{TG_TOKEN}/documents/ph-1.bin"]
    image = next(p for p in fake.requests[0]["messages"][-1]["content"] if p["type"] == "image_url")
    assert image["image_url"]["url"].startswith("data:image/jpeg;base64,")
    # Kept in the store's blob area before the turn: the history holds the reference only.
    assert any((tmp_path / "s.db.blobs").rglob("*"))


def test_a_telegram_document_named_with_a_card_number_meets_the_input_guardrail(tmp_path, fake, apis, monkeypatch):
    """A file's name is text the model reads (a PDF's filename): the route's `input` guards judge
    it on a channel as on every door (tests/test_guardrails_attachments.py)."""
    telegram = apis[0]
    telegram.files["doc-1"] = b"%PDF-1.4\n%%EOF\n"
    bot = BOT.replace("routes:", "guardrails:\n  - {name: cards, pii: [card], stages: [input], outcome: block, "
                      "message: 'No card numbers, please.'}\nroutes:")
    update = telegram_file(1, "doc-1", kind="document")
    update["message"]["document"]["file_name"] = "card 4111 1111 1111 1111.pdf"
    with serve(tmp_path, fake, apis, monkeypatch, bot) as client:
        assert to_telegram(client, update).status_code == 200
        wait_until(lambda: telegram_texts(telegram), what="the guardrail's message")
    assert telegram_texts(telegram) == ["No card numbers, please."] and fake.requests == []


def test_a_telegram_document_of_a_kind_the_route_does_not_take_is_told_and_runs_nothing(client, apis, fake):
    telegram = apis[0]
    telegram.files["doc-1"] = b"a,b\n1,2\n"
    to_telegram(client, telegram_file(1, "doc-1", kind="document", mime_type="text/csv"))
    to_telegram(client, telegram_file(1, "doc-1", kind="document", mime_type="text/csv"))  # retried
    wait_until(lambda: telegram_texts(telegram), what="the refusal")
    assert telegram_texts(telegram) == ["Sorry, I cannot take that file. I take image/*, application/pdf files "
                                        "of up to 4.88 kB, at most 2 per message."]
    assert fake.requests == [] and telegram.downloads == []  # refused from its announced type: nothing fetched
    # The conversation goes on: the next message is a turn.
    to_telegram(client, telegram_message(2, "hello"))
    wait_until(lambda: len(telegram_texts(telegram)) == 2, what="the next reply")
    assert telegram_texts(telegram)[-1] == "Text only: hello"


def test_a_file_notice_the_platform_refuses_at_first_still_arrives_once(tmp_path, fake, apis, monkeypatch):
    """The notice of a refused file leaves through the outbox like a reply (it was sent straight
    to the platform, and lost when the platform refused that one send): the Bot API answering
    502 at first, the user reads it on the outbox's next try, once; the session's history has it
    as a notice, not a turn."""
    telegram = apis[0]
    telegram.files["doc-1"] = b"a,b\n1,2\n"
    telegram.status = 502
    bot = BOT.replace('api: "{{ env.TG_API }}"}', 'api: "{{ env.TG_API }}", retry: {backoff: 0.2, max_backoff: 0.5}}')
    with serve(tmp_path, fake, apis, monkeypatch, bot) as client:
        assert to_telegram(client, telegram_file(1, "doc-1", kind="document", mime_type="text/csv")).status_code == 200
        wait_until(lambda: [c for c in telegram.seen if c.path.endswith("/sendMessage")], what="the refused send")
        telegram.status = 200
        wait_until(lambda: telegram_texts(telegram), what="the notice, on a later try")
        wait_until(lambda: client.get("/outbox").json()["entries"] == [], what="the outbox emptied")
        history = client.portal.call(client.app.state.registry.store.load_history,
                                     session_id_for("shop", "telegram", "42:42"))
    assert telegram_texts(telegram) == ["Sorry, I cannot take that file. I take image/*, application/pdf files "
                                        "of up to 4.88 kB, at most 2 per message."]
    assert fake.requests == [] and [e for e in history if "turn" in e] == []
    assert "text/csv" in history[0]["notice"]["why"]


def test_a_file_notice_committed_just_before_a_crash_is_not_sent_again_for_the_retry(client, apis, fake,
                                                                                      monkeypatch):
    """The refused file's notice is its delivery's answer, in its own commit: the server dying
    right after that commit, Telegram's retry of the update is answered from it (before, a
    record written after the commit said it was told, and the retry told the user again)."""
    telegram = apis[0]
    telegram.files["doc-1"] = b"a,b\n1,2\n"
    crashed = die_after_a_notice_commits(client.app.state.registry.store, monkeypatch)
    update = telegram_file(1, "doc-1", kind="document", mime_type="text/csv")
    assert to_telegram(client, update).status_code >= 500  # the answer the platform never got
    assert crashed
    assert to_telegram(client, update).status_code == 200  # its retry
    wait_until(lambda: client.get("/outbox").json()["entries"] == [], what="the outbox emptied")
    assert telegram_texts(telegram) == ["Sorry, I cannot take that file. I take image/*, application/pdf files "
                                        "of up to 4.88 kB, at most 2 per message."]
    assert fake.requests == [] and telegram.downloads == []


def test_a_limit_of_one_byte_is_said_in_the_singular(tmp_path, fake, apis, monkeypatch):
    """A size under a kilobyte said "1 bytes" (and 1000 bytes as "1e+03 bytes"): `size_bytes_one`
    or `_other` by the locale's plural rule, the number written whole."""
    telegram = apis[0]
    for told, (limit, said) in enumerate(((1, "1 byte"), (1000, "1000 bytes")), 1):
        (tmp_path / str(limit)).mkdir()
        bot = BOT.replace("max_bytes: 5000,", f"max_bytes: {limit},")
        with serve(tmp_path / str(limit), fake, apis, monkeypatch, bot=bot) as client:
            to_telegram(client, telegram_file(limit, "doc-1", kind="document", mime_type="text/csv"))
            wait_until(lambda told=told: len(telegram_texts(telegram)) == told, what="the refusal")
        assert telegram_texts(telegram)[-1] == ("Sorry, I cannot take that file. I take image/*, application/pdf "
                                                f"files of up to {said}, at most 2 per message.")


def test_a_file_over_max_bytes_is_refused_while_it_is_read(client, apis, fake):
    telegram = apis[0]
    telegram.files["big"] = b"%PDF" + b"x" * 6000  # announced as 1000 bytes: found out while reading
    to_telegram(client, telegram_file(1, "big", kind="document", size=1000))
    wait_until(lambda: telegram_texts(telegram), what="the refusal")
    assert telegram_texts(telegram)[0].startswith("Sorry, I cannot take that file. I take image/*")
    assert fake.requests == []


def test_a_file_the_platform_will_not_give_is_told_to_the_user_not_lost(client, apis, fake):
    telegram = apis[0]  # no file "gone" on the Bot API: getFile answers 400
    to_telegram(client, telegram_file(1, "gone", caption="see this"))
    wait_until(lambda: telegram_texts(telegram), what="the notice")
    to_telegram(client, telegram_file(1, "gone", caption="see this"))  # the platform's retry: told already
    wait_until(lambda: client.get("/outbox").json()["entries"] == [], what="the outbox emptied")
    assert telegram_texts(telegram) == [FILE_UNREADABLE]
    assert fake.requests == [] and len([c for c in telegram.seen if c.path.endswith("/getFile")]) == 1


def test_a_route_without_attachments_tells_the_user_it_takes_none(tmp_path, fake, apis, monkeypatch):
    telegram = apis[0]
    telegram.files["ph-1"] = PNG
    bot = BOT.replace("    attachments: {kinds: [image/*, application/pdf], max_bytes: 5000, max_count: 2}\n", "")
    with serve(tmp_path, fake, apis, monkeypatch, bot) as client:
        to_telegram(client, telegram_file(1, "ph-1"))
        wait_until(lambda: telegram_texts(telegram), what="the notice")
    assert telegram_texts(telegram) == [FILES_NOT_TAKEN] and fake.requests == []


def test_a_retried_delivery_with_a_file_fetches_nothing_again_and_answers_once(client, apis, fake):
    telegram = apis[0]
    telegram.files["ph-1"] = PNG
    to_telegram(client, telegram_file(7, "ph-1"))
    wait_until(lambda: telegram_texts(telegram), what="the reply")
    for _ in range(3):
        to_telegram(client, telegram_file(7, "ph-1"))
    wait_until(lambda: client.get("/outbox").json()["entries"] == [], what="the outbox emptied")
    assert telegram_texts(telegram) == ["Got image_url with ''."]
    assert len(telegram.downloads) == 1 and len(fake.requests) == 1


def post_slack(client, payload):
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **slack_signed(SLACK_SIGNING, body, int(time.time()))}
    return client.post("/channels/shop/slack", content=body, headers=headers)


def test_a_slack_file_share_is_read_from_url_private_with_the_bot_token(client, apis, fake):
    slack = apis[1]
    slack.files["/files-pri/T1-F1/photo.png"] = PNG
    delivery = slack_file_share("Ev1", "the box", f"{slack.url}/files-pri/T1-F1/photo.png")
    assert post_slack(client, delivery).status_code == 200
    wait_until(lambda: slack.calls("chat.postMessage"), what="the reply")
    assert [c["text"] for c in slack.calls("chat.postMessage")] == ["Got image_url with 'the box'."]
    assert slack.downloads == [("/files-pri/T1-F1/photo.png?download=1", f"Bearer {SLACK_TOKEN}")]


def test_slack_sends_the_bot_token_to_no_host_but_slacks_own(client, apis, fake):
    slack = apis[1]
    post_slack(client, slack_file_share("Ev1", "look", "https://attacker.example/steal.png"))
    wait_until(lambda: slack.calls("chat.postMessage"), what="the notice")
    assert [c["text"] for c in slack.calls("chat.postMessage")] == [FILE_UNREADABLE]
    assert fake.requests == [] and slack.downloads == []


def post_whatsapp(client, payload):
    body = json.dumps(payload).encode()
    return client.post("/channels/shop/whatsapp", content=body,
                       headers={"Content-Type": "application/json", **whatsapp_signed(WA_SECRET, body)})


def test_a_whatsapp_image_is_read_through_its_media_id(client, apis, fake):
    meta = apis[2]
    whatsapp_media(meta, "media-1", PNG)
    post_whatsapp(client, whatsapp_message("wamid.1", media=("image", "media-1", "image/jpeg", "dented")))
    wait_until(lambda: meta.calls("1065550001/messages"), what="the reply")
    assert [c["text"]["body"] for c in meta.calls("1065550001/messages")] == ["Got image_url with 'dented'."]
    assert meta.downloads == [("/v21.0/media-1", f"Bearer {WA_TOKEN}"), ("/media/media-1", f"Bearer {WA_TOKEN}")]


def test_a_whatsapp_document_over_the_size_is_refused_from_the_size_meta_names(client, apis, fake):
    meta = apis[2]
    whatsapp_media(meta, "media-2", b"%PDF" + b"x" * 9000, "application/pdf")
    post_whatsapp(client, whatsapp_message("wamid.2", media=("document", "media-2", "application/pdf", None)))
    wait_until(lambda: meta.calls("1065550001/messages"), what="the refusal")
    assert meta.calls("1065550001/messages")[0]["text"]["body"].startswith("Sorry, I cannot take that file.")
    assert [path for path, _ in meta.downloads] == ["/v21.0/media-2"] and fake.requests == []


def test_the_notices_speak_the_users_locale_and_the_bots_catalog_replaces_them(tmp_path, fake, apis, monkeypatch):
    telegram = apis[0]
    telegram.files["doc-1"] = b"a,b\n1,2\n"
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text("page: {channel_file_unreadable: Your file got lost. Again?}\n")
    (tmp_path / "locales" / "de.yaml").write_text("page: {channel_file_unreadable: Die Datei ging verloren.}\n")
    with serve(tmp_path, fake, apis, monkeypatch, BOT.replace("routes:", "locales: [en, de]\nroutes:")) as client:
        for update in (telegram_file(1, "doc-1", kind="document", mime_type="text/csv", user=7),
                       telegram_file(2, "gone", user=8)):
            update["message"]["from"]["language_code"] = "de"  # the Telegram user's language
            to_telegram(client, update)
        to_telegram(client, telegram_file(3, "gone", user=9))  # an English user
        wait_until(lambda: len(telegram_texts(telegram)) == 3, what="the three notices")
    by_chat = {c["chat_id"]: c["text"] for c in telegram.calls("sendMessage")}
    assert by_chat == {7: "Leider kann ich diese Datei nicht annehmen. Ich nehme image/*, application/pdf-Dateien "
                          "bis 4,88 kB an, höchstens 2 pro Nachricht.",
                       8: "Die Datei ging verloren.", 9: "Your file got lost. Again?"}
    assert fake.requests == []
