"""Issue 36: a bot on Telegram. Real parts: the app (TestClient, its outbox worker running),
the real `openai` client against the fake OpenAI server, and a local fake of the Bot API
(tests/channel_support.py) receiving the replies. Each guarantee is tried here: the secret
header (a forged one gets 401 and runs nothing), one reply per user message however often
Telegram delivers it, replies only after the commit and retried while the Bot API is down,
buttons for choices and for the user's own confirmation, a failed turn still answered."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from channel_support import FakeTelegram, shop_responder, telegram_message, telegram_press
from channel_support import shop_responder as responder
from chatrun.definition.page_texts import BUILTIN
from chatrun.server.channels.door import session_id_for
from chatrun.server.sessions import SessionSettings
from server_support import app_for_testclient, until_done, wait_until
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
  telegram:
    token: TG_TOKEN
    secret: TG_SECRET
    api: "{{{{ env.TG_API }}}}"
    retry: {{attempts: 50, backoff: 0.2, max_backoff: 0.5}}
state: {{booked: 0}}
routes:
  main:
    default: true
    system: "You sell tickets to {{{{ principal.display_name }}}} ({{{{ principal.name }}}}, roles: {{{{ principal.roles | join(',') }}}})."
    choices: [Concert, {{label: Theatre tonight, value: theatre}}]
    tools: [book, bye]
tools:
  bye:
    description: End the conversation.
    action: {{message: Goodbye., end: true}}
  book:
    description: Book a ticket.
    parameters: {{type: object, properties: {{show: {{type: string}}}}, required: [show]}}
    confirm: "Book {{{{ args.show }}}}?"
    action: {{set: {{state.booked: "{{{{ state.booked + 1 }}}}"}}, reply: "Booked {{{{ args.show }}}}."}}
"""




@pytest.fixture
def telegram():
    with FakeTelegram(TOKEN) as api:
        yield api


@pytest.fixture
def client(tmp_path, fake, telegram, monkeypatch):
    monkeypatch.setenv("TG_TOKEN", TOKEN)
    monkeypatch.setenv("TG_SECRET", SECRET)
    monkeypatch.setenv("TG_API", telegram.url)
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    fake.responder = responder
    bot = tmp_path / "bot.yaml"
    bot.write_text(BOT)
    with TestClient(app_for_testclient([str(bot)], f"sqlite:///{tmp_path / 's.db'}")) as c:
        yield c


def deliver(client, update, headers=HEADERS):
    return client.post("/channels/shop/telegram", json=update, headers=headers)


def outbox_empty(client) -> bool:
    return client.get("/outbox").json()["entries"] == []


def texts(telegram):
    return [c["text"] for c in telegram.calls("sendMessage")]


def test_a_message_gets_one_reply_in_its_chat_as_its_sender(client, telegram):
    assert deliver(client, telegram_message(1, "hello")).status_code == 200
    wait_until(lambda: texts(telegram), what="the reply")
    sent = telegram.calls("sendMessage")
    assert [(s["chat_id"], s["text"]) for s in sent] == [(42, "You said hello.")]
    # The route's choices ride on the reply as an inline keyboard.
    keyboard = sent[0]["reply_markup"]["inline_keyboard"]
    assert keyboard == [[{"text": "Concert", "callback_data": "Concert"}],
                        [{"text": "Theatre tonight", "callback_data": "theatre"}]]


def test_a_channels_post_and_its_edit_are_both_unanswered(client, telegram, fake):
    """A bot that is an admin of a Telegram channel receives its posts (`channel_post`, no
    `from`: the channel speaks, not a person) and their edits (`edited_channel_post`). The bot
    answers no channel posts, deliberately (a reply would be a post to all its subscribers), so
    an edit of one is not told `channel_edited` either: both are acknowledged and run nothing."""
    channel = {"id": -1001234, "type": "channel", "title": "News"}
    post = {"message_id": 5, "date": 1764950400, "chat": channel, "sender_chat": channel, "text": "Sale today"}
    for update in ({"update_id": 1, "channel_post": post},
                   {"update_id": 2, "edited_channel_post": {**post, "text": "Sale today!", "edit_date": 1764950460}}):
        assert deliver(client, update).status_code == 200
    assert deliver(client, telegram_message(3, "hello")).status_code == 200
    wait_until(lambda: texts(telegram), what="the reply to the person")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert [(s["chat_id"], s["text"]) for s in telegram.calls("sendMessage")] == [(42, "You said hello.")]
    assert len(fake.requests) == 1


def test_a_chat_past_the_users_session_limit_is_told_why_in_their_language_once(tmp_path, fake, telegram,
                                                                                    monkeypatch):
    """`serve --max-sessions-per-principal 1`: a German user who has a private chat with the bot
    writes to it in a group (a second conversation, a second session). The delivery was answered
    429 and Telegram kept delivering it, the user reading nothing; now it is answered 200 and the
    user reads, in the group, in their language (the update's `language_code`), why nothing runs,
    once: Telegram's retry of the update is told nothing again. A text the Bot API refuses leaves
    the update to Telegram's retry (503), which tells it."""
    for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace("state: {booked: 0}", "locales: [en, de]\nstate: {booked: 0}"))
    (tmp_path / "locales").mkdir()
    for locale in ("en", "de"):
        (tmp_path / "locales" / f"{locale}.yaml").write_text("shop: Shop\n")
    (tmp_path / "auth.yaml").write_text("tokens: {op-token-123: {principal: olga, roles: [operators]}}\n")
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             auth=str(tmp_path / "auth.yaml"), sessions=SessionSettings(max_sessions_per_principal=1))
    with TestClient(app) as client:
        assert deliver(client, telegram_message(1, "hallo", language="de")).status_code == 200
        wait_until(lambda: texts(telegram), what="the reply in the private chat")
        group = telegram_message(2, "hallo", chat=-100777, language="de-AT")
        telegram.status = 502  # the Bot API down: the text is not sent, the update left to Telegram's retry
        assert deliver(client, group).status_code == 503
        telegram.status = 200
        for _ in range(2):  # Telegram's retry, told; and its retry again, told nothing
            assert deliver(client, group).status_code == 200
        assert deliver(client, telegram_message(3, "noch da?", language="de")).status_code == 200
        wait_until(lambda: len(texts(telegram)) == 3, what="the reply to the private chat's second message")
    told = BUILTIN["de"]["channel_too_many_sessions"].replace("{limit}", "1")
    assert [(s["chat_id"], s["text"]) for s in telegram.calls("sendMessage")] == [
        (42, "You said hallo."), (-100777, told), (42, "You said noch da?.")]
    assert len(fake.requests) == 2  # the group's message asked no model


def test_the_sender_is_the_principal_with_the_roles_the_auth_file_gives_it(tmp_path, fake, telegram, monkeypatch):
    for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT)
    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens: {op-token-123: {principal: olga, roles: [operators]}}\n"
                    "principals: {'telegram:42': {roles: [vip]}}\n")
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}", auth=str(auth))
    with TestClient(app) as client:
        deliver(client, telegram_message(1, "who"))
        deliver(client, telegram_message(2, "who", user=7, first_name="Bo"))
        wait_until(lambda: len(texts(telegram)) == 2, what="two replies")
        assert sorted(texts(telegram)) == ["You sell tickets to Ana (telegram:42, roles: vip).",
                                           "You sell tickets to Bo (telegram:7, roles: )."]


def test_a_delivery_telegram_retries_three_times_runs_once_and_replies_once(client, telegram, fake):
    for _ in range(4):  # the first and three retries of update 7
        assert deliver(client, telegram_message(7, "hello")).status_code == 200
    wait_until(lambda: texts(telegram), what="the reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert texts(telegram) == ["You said hello."]
    assert len(fake.requests) == 1  # the model was asked once: the retries replayed the committed turn


def test_a_forged_or_missing_secret_gets_401_and_runs_nothing(client, telegram, fake):
    assert deliver(client, telegram_message(1, "hello"), {"X-Telegram-Bot-Api-Secret-Token": "guess"}).status_code == 401
    assert deliver(client, telegram_message(2, "hello"), {}).status_code == 401
    assert client.post("/channels/shop/slack", json={}, headers=HEADERS).status_code == 404
    assert fake.requests == [] and outbox_empty(client) and telegram.seen == []


def test_the_users_confirmation_comes_as_buttons_and_a_press_decides_it(client, telegram):
    deliver(client, telegram_message(1, "book Hamlet"))
    wait_until(lambda: texts(telegram), what="the question")
    question = telegram.calls("sendMessage")[-1]
    assert len(telegram.calls("sendMessage")) == 1 and question["text"] == "Book Hamlet?"
    buttons = [b[0] for b in question["reply_markup"]["inline_keyboard"]]
    assert buttons == [{"text": "Yes", "callback_data": "yes#p1"}, {"text": "No", "callback_data": "no#p1"}]
    deliver(client, telegram_press(2, "yes#p1"))
    wait_until(lambda: any("Booked Hamlet" in t for t in texts(telegram)), what="the booking's reply")
    assert telegram.calls("answerCallbackQuery") == [{"callback_query_id": "cbq-2"}]


def test_replies_wait_for_the_bot_api_and_arrive_once_it_is_back(client, telegram):
    telegram.status = 502
    deliver(client, telegram_message(1, "hello"))
    wait_until(lambda: len(telegram.seen) >= 2, what="two refused attempts")
    assert texts(telegram) == []
    telegram.status = 200
    wait_until(lambda: texts(telegram), what="the reply after the Bot API came back")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert texts(telegram) == ["You said hello."]


def test_a_failed_turn_still_tells_the_user(client, telegram):
    deliver(client, telegram_message(1, "fail"))
    wait_until(lambda: texts(telegram), what="the failure's text")
    assert texts(telegram) == ["Sorry, the assistant cannot answer right now. Nothing of your last message was kept; "
                               "please try again."]


def test_each_sender_in_a_group_has_their_own_conversation(client, telegram):
    deliver(client, telegram_message(1, "one", user=1, chat=-100))
    deliver(client, telegram_message(2, "two", user=2, chat=-100))
    wait_until(lambda: len(texts(telegram)) == 2, what="two replies")
    assert sorted(texts(telegram)) == ["You said one.", "You said two."]
    assert {c["chat_id"] for c in telegram.calls("sendMessage")} == {-100}


def test_after_the_bot_ends_a_conversation_the_next_message_starts_a_new_one(client, telegram, fake):
    deliver(client, telegram_message(1, "bye"))
    wait_until(lambda: texts(telegram), what="the goodbye")
    deliver(client, telegram_message(1, "bye"))  # Telegram retries the ending delivery: replayed, not run
    deliver(client, telegram_message(2, "hello again"))
    deliver(client, telegram_message(2, "hello again"))  # and the first message of the new one: once
    wait_until(lambda: len(texts(telegram)) >= 2, what="the new conversation's reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert texts(telegram) == ["Goodbye.", "You said hello again."]
    assert len(fake.requests) == 2


def test_an_operator_takes_over_a_telegram_user_and_the_user_reads_the_operator(tmp_path, fake, telegram, monkeypatch):
    for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "auth.yaml").write_text("tokens: {op-token-123: {principal: olga, roles: [operators, outbox]}}\n")
    olga = {"Authorization": "Bearer op-token-123"}
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             auth=str(tmp_path / "auth.yaml"))
    with TestClient(app) as client:
        deliver(client, telegram_message(1, "hello"))
        wait_until(lambda: texts(telegram), what="the bot's reply")
        session = f"/bots/shop/sessions/{session_id_for('shop', 'telegram', '42:42')}"
        assert client.post(f"{session}/takeover", json={"note": "vip"}, headers=olga).status_code == 200
        said = client.post(f"{session}/operator/messages", json={"text": "Hi, I am Olga."}, headers=olga)
        assert said.status_code == 200, said.text
        wait_until(lambda: "Hi, I am Olga." in texts(telegram), what="the operator's words on Telegram")
        deliver(client, telegram_message(2, "thanks Olga"))  # to the operator, not the bot: no bot reply
        history = client.get(session, headers=olga).json()["history"]
        assert any(e["type"] == "UserMessage" and e["data"]["text"] == "thanks Olga"
                   for entry in history for e in entry.get("events", []))
        assert client.post(f"{session}/release", json={}, headers=olga).status_code == 200
        deliver(client, telegram_message(3, "and now?"))
        wait_until(lambda: "You said and now?." in texts(telegram), what="the bot again after the release")
        wait_until(lambda: client.get("/outbox", headers=olga).json()["entries"] == [], what="the outbox emptied")
    assert len(fake.requests) == 2
    assert texts(telegram) == ["You said hello.", "olga joined the conversation", "Hi, I am Olga.",
                               "olga left the conversation", "You said and now?."]


def test_a_message_for_a_busy_session_is_given_back_to_telegram_to_send_again(tmp_path, fake, telegram, monkeypatch):
    """With `--if-busy reject`, a second message while the first's turn runs is refused busy:
    Telegram gets 429 and sends it again (a 200 would tell it the message was handled: lost)."""
    import threading

    from chatrun.server.sessions import SessionSettings

    for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    go_on = threading.Event()

    def held(body):  # the first turn's model answers only once the second message was refused
        if not go_on.is_set() and len(fake.requests) == 1:
            go_on.wait(60)
        return responder(body)

    fake.responder = held
    (tmp_path / "bot.yaml").write_text(BOT)
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             sessions=SessionSettings(if_busy="reject"))
    with TestClient(app) as client:
        first = threading.Thread(target=deliver, args=(client, telegram_message(1, "one")))
        first.start()
        wait_until(lambda: fake.requests, what="the first turn asking the model")
        refused = deliver(client, telegram_message(2, "two"))
        go_on.set()
        first.join()
        assert refused.status_code == 429, refused.text
        assert deliver(client, telegram_message(2, "two")).status_code == 200  # Telegram sends it again
        wait_until(lambda: len(texts(telegram)) == 2, what="both replies")
    assert texts(telegram) == ["You said one.", "You said two."]


def test_an_update_not_of_telegrams_shape_gets_400_naming_the_channel(client, telegram, fake):
    broken = {"update_id": 9, "message": {"message_id": 1, "chat": "42", "from": {"id": 42}, "text": "hi"}}
    answer = deliver(client, broken)
    assert answer.status_code == 400, answer.text
    assert "telegram delivery" in answer.json()["message"]
    assert fake.requests == [] and telegram.seen == []


class _RefusesOneSend(FakeTelegram):
    """The Bot API refusing (502) the sendMessage call number `refuse` (counting from 0), once."""

    refuse = -1

    @property
    def status(self) -> int:
        sends = sum(c.path.endswith("/sendMessage") for c in self.seen)
        return 502 if sends == self.refuse else 200

    @status.setter
    def status(self, value: int) -> None:
        pass


def test_a_reply_of_two_messages_refused_half_way_sends_only_the_rest_again(tmp_path, fake, monkeypatch):
    with _RefusesOneSend(TOKEN) as telegram:
        for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                            ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        telegram.refuse = 1  # the reply's second message
        fake.queue({"tool_calls": [{"name": "note", "arguments": {}}]}, {"text": "Done."})
        bot = BOT.replace("tools: [book, bye]", "tools: [book, bye, note]").replace(
            "tools:\n  bye:", "tools:\n  note:\n    description: Take a note.\n    action: {message: Noted.}\n  bye:")
        (tmp_path / "bot.yaml").write_text(bot)
        with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
            deliver(client, telegram_message(1, "note it"))
            wait_until(lambda: len(telegram.seen) >= 3, what="the retried reply")
            wait_until(lambda: outbox_empty(client), what="the outbox emptied")
        assert [(c.status, c.body["text"]) for c in telegram.seen] == [(200, "Noted."), (502, "Done."), (200, "Done.")]


def test_a_credential_written_as_a_value_instead_of_a_variables_name_is_an_error(write_bot):
    """docs/channels.md: credentials are the names of `env:` variables, never values."""
    from chatrun.definition.loader import check_bot

    _, found = check_bot(write_bot("""\
        name: shop
        env:
          TELEGRAM_WEBHOOK_SECRET: {secret: true, default: set-me-too}
        channels:
          telegram:
            token: "123456:AAH-the-token-itself"
            secret: TELEGRAM_WEBHOOK_SECRET
        routes:
          main: {default: true, system: Shop.}
        """))
    errors = [(d.line, d.message) for d in found if d.severity == "error"]
    # Refused at the token's line (by the schema, and by the check that it names a declared variable).
    assert errors and all(line == 6 and "123456:AAH-the-token-itself" in message for line, message in errors), errors


def test_a_bot_api_url_that_cannot_be_called_makes_the_reply_a_dead_letter_naming_the_channel(tmp_path, fake,
                                                                                              monkeypatch):
    for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", "http://[::1"),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace("attempts: 50", "attempts: 2"))
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        assert deliver(client, telegram_message(1, "hello")).status_code == 200
        dead = wait_until(lambda: client.get("/outbox?state=dead").json()["entries"], what="the dead letter")
    assert dead[0]["attempts"] == 2
    assert dead[0]["error"].startswith("channel telegram of bot shop: the request cannot be made (InvalidURL")


def test_a_429_with_retry_after_puts_the_next_try_that_far_off_bounded_by_max_backoff(tmp_path, fake, telegram,
                                                                                      monkeypatch):
    """Telegram's flood control (a 429 whose body says `parameters.retry_after`) is honoured by
    the outbox: the next try is not before that many seconds (the sink's own backoff, 0.2 s,
    would have tried again at once), and never later than the sink's `max_backoff`."""
    for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace("max_backoff: 0.5", "max_backoff: 120"))
    telegram.status, telegram.retry_after = 429, 30
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        asked = time.time()
        assert deliver(client, telegram_message(1, "hello")).status_code == 200
        entry = wait_until(lambda: [e for e in client.get("/outbox").json()["entries"] if e["attempts"] >= 1],
                           what="the refused attempt")[0]
        assert entry["next_at"] >= asked + 30 and entry["attempts"] == 1, entry
        assert "429" in entry["error"]
    assert [c.status for c in telegram.seen] == [429]  # not tried again meanwhile


def test_the_wait_a_refusal_asks_for_is_read_from_retry_after_or_telegrams_parameters():
    import httpx

    from chatrun.server.channels.base import asked_wait

    assert asked_wait(httpx.Response(429, json={"ok": False, "parameters": {"retry_after": 7}})) == 7
    assert asked_wait(httpx.Response(429, headers={"Retry-After": "12"}, json={"ok": False})) == 12
    assert asked_wait(httpx.Response(429, headers={"Retry-After": "whenever"}, text="slow down")) is None
    assert asked_wait(httpx.Response(503, json={"parameters": {"retry_after": "7"}})) is None
    assert asked_wait(httpx.Response(502, text="<html>Bad Gateway</html>")) is None


def test_the_outbox_waits_the_asked_time_at_least_and_max_backoff_at_most():
    from chatrun.definition.config import RetryPolicy
    from chatrun.server.outbox import next_attempt

    policy = RetryPolicy(backoff=0.2, max_backoff=60)
    assert all(100 + 30 <= next_attempt(policy, 1, 100, asked=30) <= 100 + 60 for _ in range(50))
    assert all(next_attempt(policy, 1, 100, asked=3600) == 100 + 60 for _ in range(50))
    assert all(next_attempt(policy, 1, 100) <= 100 + 0.2 for _ in range(50))


def test_a_value_error_of_a_bug_while_sending_is_a_failed_attempt_named_a_bug_with_its_traceback_logged(
        tmp_path, fake, telegram, monkeypatch, caplog):
    """docs/channels.md: only httpx's errors for a URL or header it cannot use count as "the
    request cannot be made"; any other ValueError is a bug: logged with its traceback, the
    attempt failed (retried, then a dead letter that `POST /outbox/{id}/retry` sends again)."""
    from chatrun.server.channels.telegram import Telegram

    async def broken(self, client, address, message):  # noqa: ANN001, ANN202
        raise ValueError("a bug in the kind")

    for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(Telegram, "send", broken)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace("attempts: 50", "attempts: 2"))
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        assert deliver(client, telegram_message(1, "hello")).status_code == 200
        dead = wait_until(lambda: client.get("/outbox?state=dead").json()["entries"], what="the dead letter")
    assert dead[0]["attempts"] == 2
    assert dead[0]["error"].startswith("channel telegram of bot shop: a bug in chatrun while sending (ValueError")
    logged = [r for r in caplog.records if "a bug while sending" in r.getMessage()]
    assert logged and logged[0].exc_info and "a bug in the kind" in str(logged[0].exc_info[1])


def test_two_messages_right_after_the_end_go_on_in_one_new_session(client, telegram, fake):
    """Two messages arrive while the turn that ends the conversation runs: both find it ended
    and go on in the same new session (each started its own, named after its delivery)."""
    asked, released = threading.Event(), threading.Event()

    async def responder(body):
        if body["messages"][-1] == {"role": "user", "content": "bye"}:
            asked.set()
            while not released.is_set():  # the ending turn holds its session until both wait for it
                await asyncio.sleep(0.02)
        return shop_responder(body)

    fake.responder = responder
    registry = client.app.state.registry
    with ThreadPoolExecutor(3) as pool:
        ending = pool.submit(deliver, client, telegram_message(1, "bye"))
        wait_until(asked.is_set, what="the ending turn asking the model")
        both = [pool.submit(deliver, client, telegram_message(n, text)) for n, text in ((2, "one"), (3, "two"))]
        wait_until(lambda: registry.waiting == 2, what="both messages waiting for the ending session")
        released.set()
        assert [f.result().status_code for f in (ending, *both)] == [200, 200, 200]
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert sorted(texts(telegram)) == ["Goodbye.", "You said one.", "You said two."]
    said = [[m["content"] for m in r["messages"] if m["role"] == "user"] for r in fake.requests]
    # one session: the message that ran second reads the first (in either order)
    assert sorted(sorted(users) for users in said[-2:]) in ([["one"], ["one", "two"]], [["one", "two"], ["two"]]), said
    sessions = client.portal.call(registry.store.list_sessions)
    assert len(sessions) == 2, sessions  # the ended one and the one it goes on in


def test_a_retry_of_the_ending_message_after_the_next_one_is_replayed_not_run_again(client, telegram, fake):
    """The platform sends the message that ended the conversation again, after the user's next
    message already went on in the new session: it is the ended session's committed turn
    (replayed: no model call, no second reply), not a new message of the new session."""
    fake.responder = shop_responder
    assert deliver(client, telegram_message(1, "bye")).status_code == 200
    assert deliver(client, telegram_message(2, "hello")).status_code == 200
    wait_until(lambda: outbox_empty(client) and len(texts(telegram)) == 2, what="both replies")
    calls = len(fake.requests)
    assert deliver(client, telegram_message(1, "bye")).status_code == 200  # the retry, late
    assert deliver(client, telegram_message(3, "more")).status_code == 200
    wait_until(lambda: outbox_empty(client) and len(texts(telegram)) >= 3, what="the reply to the next message")
    assert texts(telegram) == ["Goodbye.", "You said hello.", "You said more."]
    assert len(fake.requests) == calls + 1  # the retry asked the model nothing
    said = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "user"]
    assert said == ["hello", "more"]  # and the new session never read it


def test_a_reply_over_4096_utf16_units_is_several_messages_and_a_refusal_half_way_resends_only_the_rest(
        tmp_path, fake, monkeypatch):
    """The Bot API takes 4,096 UTF-16 code units a message (an emoji is two): a longer reply is
    cut at paragraphs into messages within it (it was cut at 4,096 characters: its end lost, or
    refused as too long when they were emoji), and the outbox's count of the messages the Bot
    API took holds for the pieces: the second refused once, the retry sends it and the rest only."""
    text = "\n\n".join(f"Part {i} 🎫. " + " ".join(f"Seat {j} 🎫🎫🎫🎫 is free." for j in range(40)) for i in range(14))
    with _RefusesOneSend(TOKEN) as telegram:
        for name, value in (("TG_TOKEN", TOKEN), ("TG_SECRET", SECRET), ("TG_API", telegram.url),
                            ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        telegram.refuse = 1  # the reply's second message
        fake.queue({"text": text})
        (tmp_path / "bot.yaml").write_text(BOT)
        with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
            deliver(client, telegram_message(1, "which seats?"))
            wait_until(lambda: len(telegram.seen) >= 6, what="the retried reply")
            wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    sent = [(c.status, c.body["text"]) for c in telegram.seen]
    assert [status for status, _ in sent] == [200, 502, 200, 200, 200, 200] and sent[1][1] == sent[2][1]
    taken = [t for status, t in sent if status == 200]
    assert " ".join(taken).split() == text.split() and all(t.startswith("Part ") for t in taken)
    assert all(len(t.encode("utf-16-le")) // 2 <= 4096 for t in taken)


def test_a_text_is_cut_at_the_best_boundary_within_the_limit():
    """split_text's order of boundaries: a paragraph, a line, a sentence's end, a space, each
    only where it leaves the piece at least half full; else at the limit. Whitespace at a cut
    goes; nothing else is lost."""
    from chatrun.server.channels.base import split_text

    assert split_text("One two three.\n\nFour five six.", 20) == ["One two three.", "Four five six."]
    assert split_text("One.\n\nTwo three four five.", 20) == ["One.\n\nTwo three four", "five."]  # (not half full)
    assert split_text("Short. Then a much longer sentence.", 24) == ["Short. Then a much", "longer sentence."]
    assert split_text("A first sentence. A second one here.", 30) == ["A first sentence.", "A second one here."]
    assert split_text("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]
    assert split_text("短い文です。次の文です。", 8) == ["短い文です。", "次の文です。"]
    # Arabic's and Urdu's question mark and full stop, and the Devanagari danda, end sentences too.
    assert split_text("هل لديك تذاكر للحفل الليلة؟ نعم، بقي لدينا مقعدان", 34) == [
        "هل لديك تذاكر للحفل الليلة؟", "نعم، بقي لدينا مقعدان"]
    assert split_text("کیا آج ٹکٹ ہیں۔ ہاں، دو باقی ہیں", 20) == ["کیا آج ٹکٹ ہیں۔", "ہاں، دو باقی ہیں"]
    assert split_text("क्या आज टिकट हैं। हाँ, दो बचे हैं", 22) == ["क्या आज टिकट हैं।", "हाँ, दो बचे हैं"]
    assert split_text("fits", 4) == ["fits"] and split_text("", 4) == [""]


def test_erasing_a_telegram_user_leaves_no_record_of_their_chat(client, telegram, fake, tmp_path):
    """The note of which session a chat went on in after its conversation ended names the chat
    (its key) and the sessions: it goes with them when the user's data is erased. The bot's floor
    of update numbers (store/replays.py `out_of_sequence`) stays: it is the bot's, and names no chat."""
    deliver(client, telegram_message(1, "bye"))
    wait_until(lambda: texts(telegram), what="the goodbye")
    deliver(client, telegram_message(2, "hello again"))
    wait_until(lambda: len(texts(telegram)) >= 2, what="the new conversation's reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    erased = client.delete("/principals/telegram:42").json()["erased"]
    assert erased["sessions"] == 2, erased
    with sqlite3.connect(tmp_path / "s.db") as db:
        left = {key: value for key, value in db.execute("SELECT key, record FROM records")
                if ":42" in key or "telegram" in key}
    floor = json.loads(left.pop("sequence:telegram:123456"))
    assert left == {} and sorted(floor) == ["floor", "last", "seen"]
    # Numbers only: the update ids delivered (1, 2) and times; no chat, no user (42).
    assert {high for _, high in floor["seen"]} <= {1, 2} and floor["floor"] == -1, floor
    assert all(type(n) in (int, float) for n in [floor["last"], *(at for at, _ in floor["seen"])]), floor


def test_no_other_door_can_take_a_channel_conversations_session_id_first(client, telegram, fake):
    """A conversation's session id is a digest anyone can compute from the bot, the kind and the
    chat (a Telegram id, a WhatsApp phone number): a client of the HTTP API, the WebSocket, /v1
    or AG-UI that created a session under it first made the user's every message a 404, dropped
    with no reply. Such ids are the channels' own: every other door refuses to start one."""
    taken = session_id_for("shop", "telegram", "42:42")
    created = client.post("/bots/shop/sessions", json={"id": taken})
    assert created.status_code == 400 and "reserved" in created.json()["message"], created.text
    with client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "extensions": True, "chatId": taken})
        error, failed = until_done(ws)
        assert failed["data"] == "BadRequest" and "reserved" in error["data"]
    v1 = client.post("/v1/chat/completions", headers={"X-Chatrun-Session": taken},
                     json={"model": "shop", "messages": [{"role": "user", "content": "hi"}]})
    assert v1.status_code == 400 and "reserved" in v1.json()["error"]["message"], v1.text
    if importlib.util.find_spec("ag_ui") is not None:
        agui = client.post("/agui/shop", headers={"Accept": "text/event-stream"}, json={
            "threadId": taken, "runId": "r1", "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": [{"id": "u1", "role": "user", "content": "hi"}]})
        assert '"RUN_ERROR"' in agui.text and "reserved" in agui.text, agui.text
    assert fake.requests == []
    assert deliver(client, telegram_message(1, "hello")).status_code == 200
    wait_until(lambda: texts(telegram), what="the reply")
    assert texts(telegram) == ["You said hello."]


def test_an_update_replayed_after_its_erasures_marks_are_gone_is_refused_by_the_bots_floor(client, telegram, fake,
                                                                                           monkeypatch):
    """Telegram signs no time: a captured update replayed more than 24 h after its user's erasure
    (its kept hash gone: store/replays.py WINDOW) ran its turn again in a new session. Its
    `update_id` is below the bot's floor by then (update_ids increase per bot): refused forever,
    answered 200, nothing run or stored; a newer update runs. The clock is the door's, moved on."""
    import types

    from chatrun.server.channels import door
    from chatrun.store import replays

    assert deliver(client, telegram_message(500, "hello")).status_code == 200
    wait_until(lambda: texts(telegram), what="the reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert client.delete("/principals/telegram:42").json()["erased"]["sessions"] == 1
    later = time.time() + replays.WINDOW + 2 * replays.SEQUENCE_BUCKET  # the erasure's marks are past their `until`
    monkeypatch.setattr(door, "time", types.SimpleNamespace(time=lambda: later, monotonic=time.monotonic))
    assert deliver(client, telegram_message(500, "hello")).status_code == 200
    assert client.delete("/principals/telegram:42?dry_run=true").json()["erased"]["sessions"] == 0
    assert len(fake.requests) == 1
    assert deliver(client, telegram_message(501, "hello again")).status_code == 200
    wait_until(lambda: len(texts(telegram)) == 2, what="the newer update's reply")
    assert texts(telegram) == ["You said hello.", "You said hello again."] and len(fake.requests) == 2


def test_the_floor_never_refuses_telegrams_own_retry_within_a_day_and_starts_anew_after_a_quiet_week(tmp_path):
    """Telegram retries an update for up to 24 h, out of order with newer ones: a number first seen
    less than WINDOW - SEQUENCE_BUCKET ago is never refused. After six days without an update
    Telegram may number the next one lower (at random after a week): the floor starts anew."""
    import asyncio

    from chatrun.store import replays
    from chatrun.store.local import LocalAsyncStore
    from chatrun.store.sqlite import SQLiteStore

    async def run() -> list[bool]:
        store = LocalAsyncStore(SQLiteStore(str(tmp_path / "s.db")))
        t0, scope, out = 1_800_000_000.0, "telegram:123456", []
        for number, at in ((10, t0), (12, t0 + 60), (11, t0 + 120),  # 11 after 12: concurrent connections
                           (10, t0 + replays.WINDOW - replays.SEQUENCE_BUCKET),  # a retry late in its day
                           (13, t0 + replays.WINDOW + 60), (12, t0 + replays.WINDOW + 60),  # a replay
                           (5, t0 + replays.WINDOW + 60 + replays.SEQUENCE_QUIET)):  # after a quiet week
            out.append(await replays.out_of_sequence(store, scope, number, at))
        await store.close()
        return out

    assert asyncio.run(run()) == [False, False, False, False, False, True, False]
