"""Issue 36's channel conformance suite: the SAME conversation through every webhook channel.

Each channel has a driver (what a user does on that platform: send a text, press a button,
send a file; and what the user reads: the replies as (text, button values)), built on the
local fakes of tests/channel_support.py, with signatures computed by the platforms' own
algorithms. One bot declares all the channels at once; each test runs its script through each
channel: choices offered as buttons and a press choosing; a `confirm:` approval decided by a
button; an operator's takeover from the operators' API while the user is on the channel; a
delivery sent again three times answered once by one model call, and posted again after its
user's data was erased running nothing; a forged signature refused with 401 and no turn; an image the user sends reaching the model; a reply's card number and
blocked sentence never reaching the platform, and its cited sources shown as links (issue 37;
the other doors are tests/test_doors.py). The killed replica is tests/test_channel_replicas.py (real processes).

Twilio ConversationRelay is not driven here: a call is a WebSocket of speech already turned
into text, with no buttons to press, no signed delivery a platform retries (the call's
messages are in order on one socket) and no files, and its operator path is a hand-off to a
human phone number; tests/test_channel_twilio.py covers what it has, and tests/test_phone_doors.py
the unruly model and the budgets there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient

from channel_support import (
    FakeSlack,
    FakeTelegram,
    FakeWhatsApp,
    die_after_a_notice_commits,
    slack_edit,
    slack_file_share,
    slack_message,
    slack_press,
    slack_signed,
    telegram_edit,
    telegram_file,
    telegram_message,
    telegram_press,
    whatsapp_edit,
    whatsapp_media,
    whatsapp_message,
    whatsapp_signed,
)
from chatrun.definition.page_texts import BUILTIN
from chatrun.server.channels.base import session_id_for
from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL

pytest.importorskip("slack_sdk", reason="slack_sdk is not installed (pip install -e '.[test]' brings it)")
pytest.importorskip("jwt", reason="PyJWT is not installed (pip install -e '.[test]' brings it)")

from channel_support import FakeBotFramework  # noqa: E402
from leak_support import card_leaked

KINDS = ["telegram", "slack", "whatsapp", "teams"]
PAGE_TEXTS = BUILTIN["en"]
OPERATOR = {"Authorization": "Bearer op-token-123"}
SECRETS = {"TG_TOKEN": "123456:conform", "TG_SECRET": "tg-secret-conform-01", "SLACK_TOKEN": "xoxb-conform",
           "SLACK_SIGNING": "slack-signing-conform", "WA_TOKEN": "EAAG-conform", "WA_SECRET": "meta-secret-conform",
           "WA_VERIFY": "verify-conform", "TEAMS_APP_ID": "app-conform", "TEAMS_APP_PASSWORD": "teams-secret-conform"}
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 200  # the bytes of a small image
RETRY = "retry: {attempts: 50, backoff: 0.2, max_backoff: 0.5}"

BOT = f"""\
name: shop
model: {{{OPENAI_MODEL}}}
env:
{chr(10).join(f"  {name}: {{secret: true}}" for name in SECRETS)}
  TG_API: {{}}
  SLACK_API: {{}}
  WA_API: {{}}
  BF: {{}}
channels:
  telegram: {{token: TG_TOKEN, secret: TG_SECRET, api: "{{{{ env.TG_API }}}}", {RETRY}}}
  slack: {{token: SLACK_TOKEN, signing_secret: SLACK_SIGNING, api: "{{{{ env.SLACK_API }}}}", {RETRY}}}
  whatsapp: {{token: WA_TOKEN, app_secret: WA_SECRET, verify_token: WA_VERIFY, api: "{{{{ env.WA_API }}}}", {RETRY}}}
  teams: {{app_id: TEAMS_APP_ID, app_password: TEAMS_APP_PASSWORD, openid: "{{{{ env.BF }}}}/openid",
           token_url: "{{{{ env.BF }}}}/token", {RETRY}}}
state: {{booked: 0, paid: 0, refunded: 0}}
limits: {{max_session_tokens: 100000}}
knowledge:
  guides: {{path: guides, url: "https://docs.example/{{path}}#{{anchor}}"}}
guardrails:  # the output stage only: a platform is not saved by the store's redaction
  - {{name: cards, pii: [card], stages: [output], outcome: redact}}
  - {{name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: block, message: I cannot share that.}}
routes:
  main:
    default: true
    system: You sell tickets.
    knowledge: {{sources: [guides], retrieve: auto}}  # a citation is of a passage the model was given
    choices: [Concert, {{label: Theatre tonight, value: theatre}}]
    tools: [book, pay, refund]
    attachments: {{kinds: [image/*], max_bytes: 5000, max_count: 2}}
tools:
  book:
    description: Book a ticket.
    parameters: {{type: object, properties: {{show: {{type: string}}}}, required: [show]}}
    confirm: "Book {{{{ args.show }}}}?"
    action: {{set: {{state.booked: "{{{{ state.booked + 1 }}}}"}}, reply: "Booked {{{{ args.show }}}}."}}
  pay:
    effect: once
    description: Pay an amount.
    parameters: {{type: object, properties: {{amount: {{type: number}}}}, required: [amount]}}
    action: {{set: {{state.paid: "{{{{ state.paid + args.amount }}}}"}}, reply: "Paid {{{{ args.amount }}}}."}}
  refund:
    effect: once
    description: Refund an amount (a supervisor approves).
    parameters: {{type: object, properties: {{amount: {{type: number}}}}, required: [amount]}}
    approval:
      by: [supervisor]
      ask: {{text: "Refund {{{{ args.amount }}}} EUR?", tell: "Your refund waits for a supervisor."}}
    action: {{set: {{state.refunded: "{{{{ state.refunded + args.amount }}}}"}}, reply: "Refunded {{{{ args.amount }}}}."}}
"""


def responder(body: dict[str, Any]) -> dict[str, Any]:
    """The fake model: "book X" calls book(show=X); a message with files says what it carried;
    anything else is echoed."""
    messages = body["messages"]
    last = next(m for m in reversed(messages) if m["role"] != "system")  # after it: retrieve: auto's passages
    if last["role"] == "tool":
        return {"text": "Done: " + str(last["content"])}
    user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if not isinstance(user, str):  # content parts: the text and the files' parts
        kinds = [p["type"] for p in user if p["type"] != "text"]
        said = " ".join(p["text"] for p in user if p["type"] == "text")
        return {"text": f"Got {', '.join(kinds)} with '{said}'."}
    text = user
    if text.startswith("book "):
        return {"tool_calls": [{"name": "book", "arguments": {"show": text[5:]}}]}
    if text == "tell me everything":
        return {"text": LONG}
    return {"chunks": GUARDED[text]} if text in GUARDED else {"text": f"You said {text}."}


GUARDED = {  # what the model answers to these, in chunks when the bot streams
    "save my card": ["Thanks. Your card ", "4111 1111 ", "1111 1111 is ", "saved. Bye"],
    "prices?": ["Sure. The price list ", "is for internal ", "only. Ask me later."],
    "refund?": ["Thirty days ", "[returns.md#refund-window]."],
}


# A reply over every platform's limit on one message (46,000 characters: Telegram's and WhatsApp's
# 4,096, Slack's 40,000, the Bot Connector's 28 KB), in paragraphs of sentences.
LONG = "\n\n".join(f"Part {i}. " + " ".join(f"Sentence {j} of part {i} tells a little more." for j in range(12))
                   for i in range(85))

Reply = tuple[str, list[str]]  # what the user reads: a message's text and its buttons' values


class Driver:
    """A user on one platform. `conversation` is the platform's conversation key of that user
    (the session is session_id_for(bot, kind, conversation))."""

    kind: str
    conversation: str

    def __init__(self, client: TestClient):
        self.client = client
        self.count = 0

    def next_id(self) -> int:
        self.count += 1
        return self.count

    def say(self, text: str, delivery: int | None = None, forged: bool = False) -> int:
        raise NotImplementedError

    def press(self, value: str) -> int:
        raise NotImplementedError

    def say_elsewhere(self, text: str, delivery: int) -> int:
        """The same user starts another conversation with the bot (another chat, thread or
        number: the platform's way), saying `text` as `delivery`."""
        raise NotImplementedError

    def edit(self, delivery: int, text: str) -> int:
        """Edit the message sent as `delivery` to `text`: a new delivery of the platform's edit."""
        raise NotImplementedError

    def send_file(self, data: bytes, caption: str) -> int:
        """Send an image with a caption, as the platform's file message."""
        raise NotImplementedError

    def replies(self) -> list[Reply]:
        raise NotImplementedError

    def received(self) -> str:
        """Everything the platform's API was sent."""
        return json.dumps([call.body for call in self.api.seen])  # type: ignore[attr-defined]

    def post(self, body: bytes, headers: dict[str, str]) -> int:
        return self.client.post(f"/channels/shop/{self.kind}", content=body,
                                headers={"Content-Type": "application/json", **headers}).status_code


class TelegramDriver(Driver):
    kind, conversation = "telegram", "42:42"

    def __init__(self, client: TestClient, api: FakeTelegram):
        super().__init__(client)
        self.api = api

    def _send(self, update: dict[str, Any], forged: bool = False) -> int:
        secret = "not-the-secret" if forged else SECRETS["TG_SECRET"]
        return self.post(json.dumps(update).encode(), {"X-Telegram-Bot-Api-Secret-Token": secret})

    def say(self, text: str, delivery: int | None = None, forged: bool = False) -> int:
        return self._send(telegram_message(delivery or self.next_id(), text), forged)

    def press(self, value: str) -> int:
        return self._send(telegram_press(self.next_id(), value))

    def say_elsewhere(self, text: str, delivery: int) -> int:  # a group the user and the bot are in
        return self._send(telegram_message(delivery, text, chat=-100777))

    def edit(self, delivery: int, text: str) -> int:
        return self._send(telegram_edit(1000 + self.next_id(), telegram_message(delivery, ""), text))

    def send_file(self, data: bytes, caption: str) -> int:
        self.api.files["ph-1"] = data
        return self._send(telegram_file(self.next_id(), "ph-1", caption=caption))

    def replies(self) -> list[Reply]:
        return [(c["text"], [b["callback_data"] for row in (c.get("reply_markup") or {}).get("inline_keyboard", [])
                             for b in row]) for c in self.api.calls("sendMessage")]


class SlackDriver(Driver):
    kind, conversation = "slack", "D42:U42"

    def __init__(self, client: TestClient, api: FakeSlack):
        super().__init__(client)
        self.api = api

    def _signed(self, body: bytes, forged: bool = False, form: bool = False) -> int:
        secret = "not-the-secret" if forged else SECRETS["SLACK_SIGNING"]
        headers = slack_signed(secret, body, int(time.time()))
        if form:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        return self.client.post("/channels/shop/slack", content=body,
                                headers={"Content-Type": "application/json", **headers}).status_code

    def say(self, text: str, delivery: int | None = None, forged: bool = False) -> int:
        return self._signed(json.dumps(slack_message(f"Ev{delivery or self.next_id()}", text)).encode(), forged)

    def press(self, value: str) -> int:
        body = urlencode({"payload": json.dumps(slack_press(f"trig-{self.next_id()}", value))}).encode()
        return self._signed(body, form=True)

    def say_elsewhere(self, text: str, delivery: int) -> int:  # a mention in a channel: a thread of its own
        return self._signed(json.dumps(slack_message(f"Ev{delivery}", f"<@B1> {text}", channel="C77",
                                                     kind="app_mention")).encode())

    def edit(self, delivery: int, text: str) -> int:
        return self._signed(json.dumps(slack_edit(f"EvEdit{self.next_id()}", slack_message(f"Ev{delivery}", ""),
                                                  text)).encode())

    def send_file(self, data: bytes, caption: str) -> int:
        self.api.files["/files-pri/T1-F1/photo.png"] = data
        delivery = slack_file_share(f"Ev{self.next_id()}", caption, f"{self.api.url}/files-pri/T1-F1/photo.png")
        return self._signed(json.dumps(delivery).encode())

    def replies(self) -> list[Reply]:
        out = []
        for call in self.api.calls("chat.postMessage"):
            buttons = [e["value"] for block in call.get("blocks", []) if block["type"] == "actions"
                       for e in block["elements"]]
            out.append((call["text"], buttons))
        return out


class WhatsAppDriver(Driver):
    kind, conversation = "whatsapp", "1065550001:4915112345678"

    def __init__(self, client: TestClient, api: FakeWhatsApp):
        super().__init__(client)
        self.api = api

    def _send(self, payload: dict[str, Any], forged: bool = False) -> int:
        body = json.dumps(payload).encode()
        return self.post(body, whatsapp_signed("not-the-secret" if forged else SECRETS["WA_SECRET"], body))

    def say(self, text: str, delivery: int | None = None, forged: bool = False) -> int:
        return self._send(whatsapp_message(f"wamid.{delivery or self.next_id()}", text), forged)

    def press(self, value: str) -> int:
        return self._send(whatsapp_message(f"wamid.{self.next_id()}", button=value))

    def say_elsewhere(self, text: str, delivery: int) -> int:  # the business's other number
        return self._send(whatsapp_message(f"wamid.{delivery}", text, number="1065550002"))

    def edit(self, delivery: int, text: str) -> int:
        return self._send(whatsapp_edit(f"wamid.edit{self.next_id()}", f"wamid.{delivery}", text))

    def send_file(self, data: bytes, caption: str) -> int:
        whatsapp_media(self.api, "media-1", data)
        return self._send(whatsapp_message(f"wamid.{self.next_id()}", media=("image", "media-1", "image/jpeg", caption)))

    def replies(self) -> list[Reply]:
        out: list[Reply] = []
        for call in self.api.calls("messages"):  # (from either of the business's numbers)
            if call["type"] == "text":
                out.append((call["text"]["body"], []))
                continue
            interactive = call["interactive"]
            action = interactive["action"]
            values = [b["reply"]["id"] for b in action.get("buttons", [])] + \
                [r["id"] for s in action.get("sections", []) for r in s["rows"]]
            out.append((interactive["body"]["text"], values))
        return out


class TeamsDriver(Driver):
    kind, conversation = "teams", "a:1personal"

    def __init__(self, client: TestClient, api: FakeBotFramework):
        super().__init__(client)
        self.api = api

    def _send(self, activity: dict[str, Any], forged: bool = False) -> int:
        token = self.api.activity_token(activity["serviceUrl"], audience="another-app" if forged else None)
        return self.post(json.dumps(activity).encode(), {"Authorization": f"Bearer {token}"})

    def say(self, text: str, delivery: int | None = None, forged: bool = False) -> int:
        return self._send(self.api.activity(f"act-{delivery or self.next_id()}", text), forged)

    def press(self, value: str) -> int:
        return self._send(self.api.activity(f"act-{self.next_id()}", value={"choice": value}))

    def say_elsewhere(self, text: str, delivery: int) -> int:  # another chat of the same user
        return self._send(self.api.activity(f"act-{delivery}", text, conversation="a:2personal"))

    def edit(self, delivery: int, text: str) -> int:
        return self._send(self.api.edit_activity(f"act-{delivery}", text))

    def send_file(self, data: bytes, caption: str) -> int:
        """An image in a personal chat, as Teams sends it: its contentUrl on the Bot Connector,
        read with the bot's token."""
        self.api.files["/v3/attachments/att-1/views/original"] = data
        activity = self.api.activity(f"act-{self.next_id()}", caption)
        activity["attachments"] = [{"contentType": "image/*", "name": "photo.png",
                                    "contentUrl": f"{self.api.url}/v3/attachments/att-1/views/original"},
                                   {"contentType": "text/html", "content": f"<p>{caption}</p>"}]
        return self._send(activity)

    def received(self) -> str:
        return json.dumps(list(self.api.activities))

    def replies(self) -> list[Reply]:
        out: list[Reply] = []
        for activity in list(self.api.activities):
            if activity.get("attachments"):
                card = activity["attachments"][0]["content"]
                out.append((card["body"][0]["text"], [a["data"]["choice"] for a in card["actions"]]))
            else:
                out.append((activity["text"], []))
        return out


FAKES = {"telegram": (FakeTelegram, "TG_TOKEN", TelegramDriver), "slack": (FakeSlack, "SLACK_TOKEN", SlackDriver),
         "whatsapp": (FakeWhatsApp, "WA_TOKEN", WhatsAppDriver)}


@dataclass
class Conversation:
    user: Driver
    client: TestClient
    fake: Any

    def texts(self) -> list[str]:
        return [text for text, _ in self.user.replies()]

    def session(self) -> str:
        return f"/bots/shop/sessions/{session_id_for('shop', self.user.kind, self.user.conversation)}"

    def settled(self) -> None:
        wait_until(lambda: self.client.get("/outbox", headers=OPERATOR).json()["entries"] == [],
                   what="the outbox emptied")


@pytest.fixture(params=KINDS)
def chat(request, tmp_path, fake, monkeypatch) -> Iterator[Conversation]:
    kind = request.param
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    for name in ("TG_API", "SLACK_API", "WA_API", "BF"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # the platforms not under test: never called
    fake.responder = responder
    if kind == "teams":
        api: Any = FakeBotFramework(SECRETS["TEAMS_APP_ID"], SECRETS["TEAMS_APP_PASSWORD"])
    else:
        api = FAKES[kind][0](SECRETS[FAKES[kind][1]])
    with api:
        base = {"telegram": api.url, "slack": api.url + "/api", "whatsapp": api.url + "/v21.0", "teams": api.url}[kind]
        monkeypatch.setenv({"telegram": "TG_API", "slack": "SLACK_API", "whatsapp": "WA_API", "teams": "BF"}[kind], base)
        (tmp_path / "bot.yaml").write_text(BOT)
        (tmp_path / "guides").mkdir()
        (tmp_path / "guides" / "returns.md").write_text("# Returns\n\n## Refund window\n\nWithin 30 days.\n")
        (tmp_path / "auth.yaml").write_text("tokens: {op-token-123: {principal: olga, roles: [operators, outbox]}, "
                                            "max-token-123: {principal: max, roles: [operators]}, "
                                            "dpo-token-123: {principal: dora, roles: [privacy]}, "
                                            "sam-token-123: {principal: sam, roles: [supervisor]}}\n")
        app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                                 auth=str(tmp_path / "auth.yaml"))
        with TestClient(app) as client:
            driver = TeamsDriver(client, api) if kind == "teams" else FAKES[kind][2](client, api)
            yield Conversation(driver, client, fake)


def test_choices_arrive_as_buttons_and_a_press_chooses(chat):
    assert chat.user.say("hello") == 200
    wait_until(chat.user.replies, what="the first reply")
    assert chat.user.replies() == [("You said hello.", ["Concert", "theatre"])]
    assert chat.user.press("theatre") == 200
    wait_until(lambda: len(chat.user.replies()) == 2, what="the reply to the press")
    assert chat.user.replies()[1][0] == "You said theatre."


def test_a_confirm_approval_arrives_as_buttons_and_a_press_decides_it(chat):
    chat.user.say("book Hamlet")
    wait_until(chat.user.replies, what="the question")
    assert chat.user.replies() == [("Book Hamlet?", ["yes#p1", "no#p1"])]  # each names its question
    assert chat.user.press("yes#p1") == 200
    wait_until(lambda: any("Booked Hamlet" in t for t in chat.texts()), what="the booking's reply")
    chat.settled()
    assert not any("Booked" in t for t in chat.texts()[:1])


def test_an_operator_takes_over_while_the_user_is_on_the_channel(chat):
    chat.user.say("hello")
    wait_until(chat.user.replies, what="the bot's reply")
    olga = chat.session()
    assert chat.client.post(f"{olga}/takeover", json={"note": "vip"}, headers=OPERATOR).status_code == 200
    said = chat.client.post(f"{olga}/operator/messages", json={"text": "Hi, I am Olga."}, headers=OPERATOR)
    assert said.status_code == 200, said.text
    wait_until(lambda: "Hi, I am Olga." in chat.texts(), what="the operator's words on the platform")
    chat.user.say("thanks Olga")  # to the operator, not the bot
    wait_until(lambda: any(e["type"] == "UserMessage" and e["data"]["text"] == "thanks Olga"
                           for entry in chat.client.get(olga, headers=OPERATOR).json()["history"]
                           for e in entry.get("events", [])), what="the user's words in the session")
    assert chat.client.post(f"{olga}/release", json={}, headers=OPERATOR).status_code == 200
    chat.user.say("and now?")
    wait_until(lambda: "You said and now?." in chat.texts(), what="the bot again after the release")
    chat.settled()
    assert chat.texts() == ["You said hello.", "olga joined the conversation", "Hi, I am Olga.",
                            "olga left the conversation", "You said and now?."]
    assert len(chat.fake.requests) == 2


def test_a_forced_takeover_reaches_the_channel_user_as_a_leaving_then_a_joining(chat):
    chat.user.say("hello")
    wait_until(chat.user.replies, what="the bot's reply")
    session = chat.session()
    assert chat.client.post(f"{session}/takeover", json={}, headers=OPERATOR).status_code == 200
    max_ = {"Authorization": "Bearer max-token-123"}
    assert chat.client.post(f"{session}/takeover", json={"force": True}, headers=max_).status_code == 200
    wait_until(lambda: "max joined the conversation" in chat.texts(), what="the new operator's joining")
    chat.settled()
    assert chat.texts() == ["You said hello.", "olga joined the conversation", "olga left the conversation",
                            "max joined the conversation"]


def test_a_delivery_sent_four_times_is_answered_once_by_one_model_call(chat):
    for _ in range(4):  # the first and the platform's three retries
        assert chat.user.say("hello", delivery=77) == 200
    wait_until(chat.user.replies, what="the reply")
    chat.settled()
    assert chat.texts() == ["You said hello."]
    assert len(chat.fake.requests) == 1


def test_a_delivery_replayed_after_its_user_was_erased_runs_no_turn(chat):
    """Erasure deleted the session with the outcome that dedupes the delivery: the same
    delivery posted again ran its turn again, in a new session. Its hash is kept for the
    replay window (store/replays.py): answered 200, nothing run, nothing stored."""
    assert chat.user.say("hello", delivery=88) == 200
    wait_until(chat.user.replies, what="the reply")
    chat.settled()
    owner = {"telegram": "telegram:42", "slack": "slack:U42", "whatsapp": "whatsapp:4915112345678",
             "teams": "teams:aad-42"}[chat.user.kind]  # the principal `<kind>:<user id>`
    dpo = {"Authorization": "Bearer dpo-token-123"}
    assert chat.client.delete(f"/principals/{owner}", headers=dpo).json()["erased"]["sessions"] == 1
    assert chat.user.say("hello", delivery=88) == 200
    assert chat.client.delete(f"/principals/{owner}?dry_run=true", headers=dpo).json()["erased"]["sessions"] == 0
    assert chat.user.say("hello again") == 200
    wait_until(lambda: len(chat.user.replies()) == 2, what="the new message's reply")
    assert chat.texts() == ["You said hello.", "You said hello again."]
    assert len(chat.fake.requests) == 2


def test_a_forged_signature_gets_401_and_no_turn(chat):
    assert chat.user.say("hello", forged=True) == 401
    assert chat.client.get(chat.session(), headers=OPERATOR).status_code == 404
    assert chat.fake.requests == [] and chat.user.replies() == []


def test_an_image_the_user_sends_reaches_the_model(chat):
    assert chat.user.send_file(PNG, "my ticket") == 200
    wait_until(chat.user.replies, what="the reply to the image")
    assert chat.texts() == ["Got image_url with 'my ticket'."]


def test_no_guarded_word_reaches_the_platform_and_the_sources_arrive_as_links(chat):
    for i, text in enumerate(GUARDED, 1):
        assert chat.user.say(text) == 200
        wait_until(lambda i=i: len(chat.user.replies()) >= i, what=f"the reply to {text!r}")
    wait_until(lambda: len(chat.user.replies()) == 4, what="the sources after the cited reply")
    chat.settled()
    assert chat.texts() == ["Thanks. Your card [card] is saved. Bye", "I cannot share that.",
                            "Thirty days [returns.md#refund-window].",
                            "Sources:\n1. Returns › Refund window — https://docs.example/returns#refund-window"]
    received = chat.user.received()
    assert not card_leaked(received) and "internal" not in received.lower()


def test_a_message_that_says_nothing_runs_no_turn_and_a_file_without_text_still_runs(chat):
    for text in ("", "  \n\t"):  # an empty text, a blank one: answered 200, no turn, no reply
        assert chat.user.say(text) == 200
    assert chat.client.get(chat.session(), headers=OPERATOR).status_code == 404  # not even a session
    assert chat.user.send_file(PNG, "") == 200  # a file with no caption says something
    wait_until(chat.user.replies, what="the reply to the image")
    chat.settled()
    assert chat.texts() == ["Got image_url with ''."]
    assert len(chat.fake.requests) == 1  # the image's turn alone asked the model


def test_a_message_over_max_message_chars_runs_no_turn_and_the_user_is_told_the_limit_once(chat):
    """As the HTTP API and the WebSocket refuse a userMessage over --max-message-chars (8000 by
    default), a channel runs no turn for one: the platform gets its 200 (it would be refused
    again), the user reads why, through the outbox, once however often it is delivered."""
    for _ in range(3):  # the first and the platform's two retries
        assert chat.user.say("x" * 8001, delivery=78) == 200
    wait_until(chat.user.replies, what="the notice")
    chat.settled()
    assert chat.texts() == ["Sorry, your message is too long: I take messages of up to 8000 characters. "
                            "Please send a shorter one."]
    assert chat.fake.requests == []
    store = chat.client.app.state.registry.store
    session_id = session_id_for("shop", chat.user.kind, chat.user.conversation)
    history = chat.client.portal.call(store.load_history, session_id)
    assert [e for e in history if "turn" in e] == [] and history[0]["notice"]["why"] == \
        "userMessage of 8001 characters is over the limit of 8000 (--max-message-chars): send a shorter one"
    assert chat.user.say("hello") == 200  # a message within the limit runs its turn as ever
    wait_until(lambda: len(chat.user.replies()) == 2, what="the reply")
    assert chat.texts()[1] == "You said hello." and len(chat.fake.requests) == 1


def test_a_new_conversation_past_the_users_session_limit_is_acknowledged_and_told_why_once(chat, monkeypatch):
    """With --max-sessions-per-principal 1, a user who has a conversation starts a second one
    (another chat, thread or number). The store refuses its session, and the delivery was
    answered 429: the platform delivered it again (or dropped it) and the user read nothing, the
    bot looked dead. Now the platform gets its 200 and the user reads why, once however often the
    delivery comes; no model is asked, and their first conversation goes on."""
    monkeypatch.setattr(chat.client.app.state.registry.opener, "max_sessions_per_principal", 1)  # the flag's value
    assert chat.user.say("hello") == 200
    wait_until(chat.user.replies, what="the first reply")
    for _ in range(3):  # the first and the platform's two retries
        assert chat.user.say_elsewhere("hi there", delivery=90) == 200
    store = chat.client.app.state.registry.store
    wait_until(lambda: len(chat.user.replies()) == 2, what="the refusal")
    wait_until(lambda: chat.client.portal.call(store.record_keys, "channel-in:") == [],
               what="the acknowledged deliveries done")  # (Slack's, answered before they ran)
    told = PAGE_TEXTS["channel_too_many_sessions"].replace("{limit}", "1")
    assert chat.texts() == ["You said hello.", told]
    assert len(chat.fake.requests) == 1
    assert chat.user.say("again") == 200  # the conversation they have goes on
    wait_until(lambda: len(chat.user.replies()) == 3, what="the reply in the first conversation")
    assert chat.texts() == ["You said hello.", told, "You said again."]


def test_a_limit_of_one_character_is_said_in_the_singular(chat, monkeypatch):
    """The notice said "up to 1 characters": its count now picks `channel_too_long_one` or
    `_other` by the locale's plural rule, as the operator page's "1 turn" / "3 turns"."""
    from chatrun.server.wire import ServerLimits

    monkeypatch.setattr(chat.client.app.state.registry.channels, "limits", ServerLimits(max_message_chars=1))
    assert chat.user.say("ab", delivery=80) == 200
    wait_until(chat.user.replies, what="the notice")
    chat.settled()
    assert chat.texts() == ["Sorry, your message is too long: I take messages of up to 1 character. "
                            "Please send a shorter one."]
    assert chat.fake.requests == []


def test_a_notice_committed_just_before_a_crash_is_not_sent_again_for_the_retried_delivery(chat, monkeypatch):
    """The notice and the mark that its delivery was answered are one commit (the delivery's
    request id is the notice's outcome): a crash right after it leaves nothing half done, and the
    platform's retry of the delivery (Slack's: the replica that takes the message over) is
    answered from it, so the user is told once. (The mark was a store record written after the
    commit: the retry after such a crash told the user a second time.)"""
    crashed = die_after_a_notice_commits(chat.client.app.state.registry.store, monkeypatch)
    chat.user.say("x" * 8001, delivery=79)  # the platform gets no answer: the process died (Slack's got 200)
    wait_until(lambda: crashed, what="the notice's commit")
    for _ in range(2):  # the platform sends it again (Slack: the record of the message is run again)
        assert chat.user.say("x" * 8001, delivery=79) == 200
    store = chat.client.app.state.registry.store
    wait_until(lambda: chat.client.portal.call(store.record_keys, "channel-in:") == [], timeout=60,
               what="the acknowledged message run again")
    chat.settled()
    assert chat.texts() == ["Sorry, your message is too long: I take messages of up to 8000 characters. "
                            "Please send a shorter one."]
    history = chat.client.portal.call(store.load_history, crashed[0])
    assert [e["notice"]["why"] for e in history] == ["userMessage of 8001 characters is over the limit of 8000 (--max-message-chars): send a shorter one"]
    assert chat.fake.requests == []


def test_a_reply_longer_than_the_platform_takes_arrives_whole_in_several_messages(chat):
    """A reply over the platform's limit on one message (Telegram and WhatsApp cut it at 4,096
    characters, Slack at 3,000, the Bot Connector refused it: a dead letter) arrives whole: in
    several messages, each cut at a paragraph's end and within the limit (the fakes refuse a
    longer one as the platforms do; WhatsApp's message with buttons: 1,024, Slack's: 3,000), the
    route's buttons under the last."""
    assert chat.user.say("tell me everything") == 200
    words = LONG.split()
    wait_until(lambda: " ".join(chat.texts()).split() == words, timeout=60, what="the whole reply")
    chat.settled()
    replies = chat.user.replies()
    assert " ".join(chat.texts()).split() == words and len(replies) > 1
    assert all(text.startswith("Part ") and text.endswith("more.") for text, _ in replies)
    assert [buttons for _, buttons in replies] == [[]] * (len(replies) - 1) + [["Concert", "theatre"]]


# -- the unruly model (issue 32) on the channel ---------------------------------------------------

def test_the_models_own_consent_books_nothing_and_the_users_typed_yes_books_once(chat):
    """The model invents the show and consents itself, then after the user's yes calls again,
    consenting, twice: nothing is booked before the yes, one booking after it."""
    chat.fake.queue({"unruly": ["invent_values", "self_confirm"], "tool": "book"},
                    {"unruly": ["repeat_call", "self_confirm"]}, {"unruly": ["repeat_call", "self_confirm"]},
                    {"text": "Booked."})
    chat.user.say("I want a ticket")
    wait_until(chat.user.replies, what="the question")
    ((asked, buttons),) = chat.user.replies()
    assert asked.startswith("Book ") and buttons == ["yes#p1", "no#p1"]
    assert chat.client.get(chat.session(), headers=OPERATOR).json()["state"]["booked"] == 0
    chat.user.say("yes")
    wait_until(lambda: "Booked." in chat.texts(), what="the reply after the booking")
    chat.settled()
    assert chat.client.get(chat.session(), headers=OPERATOR).json()["state"]["booked"] == 1
    assert chat.fake.pending == 0


ALREADY_PAID = ("Already done earlier in this conversation (turn 1): Paid 30. It was not run again; do not call it "
                "again for the same thing.")


def test_a_once_payment_the_model_repeats_in_every_answer_and_turn_is_paid_once(chat):
    """The model pays six times an answer, then repeats its calls, and pays six times again the
    next turn: one payment, and the user reads the model's replies, never an error."""
    pay = {"name": "pay", "arguments": {"amount": 30}}
    chat.fake.queue({"unruly": "repeat_call", "call": pay, "times": 6}, {"unruly": "repeat_call"},
                    {"text": "Paid."}, {"unruly": "repeat_call", "call": pay, "times": 6}, {"text": "Paid already."})
    chat.user.say("pay 30")
    wait_until(lambda: "Paid." in chat.texts(), what="the first reply")
    chat.user.say("pay 30 again to be sure")
    wait_until(lambda: "Paid already." in chat.texts(), what="the second reply")
    chat.settled()
    assert chat.texts() == ["Paid.", "Paid already."]
    results = {m["tool_call_id"]: m["content"] for body in chat.fake.requests for m in body["messages"]
               if m["role"] == "tool"}  # each call's result, as the model read it
    assert len(results) == 24 and sorted(set(results.values())) == [ALREADY_PAID, "Paid 30."], results
    assert list(results.values()).count("Paid 30.") == 1
    assert chat.fake.pending == 0


SAM = {"Authorization": "Bearer sam-token-123"}


def test_only_the_supervisor_approves_and_the_decision_reaches_the_user_on_the_platform(chat):
    """The model consents in its own arguments to a refund a supervisor approves: the user reads
    the `tell`, never the supervisor's question and no buttons; the user's typed yes and a press
    on a yes button of that item decide nothing (the user is not the approver). The supervisor
    approves over HTTP: the refund runs once (the model's repeat after it, consenting again, is
    answered as done), and the reply of that turn, which the user did not send, reaches them
    on the platform."""
    chat.fake.queue({"unruly": "self_confirm", "call": {"name": "refund", "arguments": {"amount": 80}}})
    chat.user.say("refund my 80 EUR")
    wait_until(chat.user.replies, what="the tell")
    assert chat.user.replies() == [("Your refund waits for a supervisor.", [])]
    chat.user.say("yes")
    chat.user.press("yes#p1")
    wait_until(lambda: len(chat.user.replies()) == 3, what="the answers to the yes and the press")
    chat.settled()
    assert not any("Refund 80" in text or "Refunded" in text for text in chat.texts()), chat.texts()
    session = chat.client.get(chat.session(), headers=OPERATOR).json()
    assert session["state"]["refunded"] == 0 and [p["id"] for p in session["pending"]] == ["p1"]
    chat.fake.queue({"unruly": ["repeat_call", "self_confirm"]}, {"text": "Your refund of 80 EUR is done."})
    decided = chat.client.post(f"{chat.session()}/pending/p1", json={"decision": "approve"}, headers=SAM)
    assert decided.status_code == 200, decided.text
    wait_until(lambda: "Your refund of 80 EUR is done." in chat.texts(), what="the decision on the platform")
    chat.settled()
    assert chat.client.get(chat.session(), headers=OPERATOR).json()["state"]["refunded"] == 80
    waiting = "Still waiting: Your refund waits for a supervisor."
    assert chat.user.replies() == [("Your refund waits for a supervisor.", []), (waiting, []), (waiting, []),
                                   ("Your refund of 80 EUR is done.", ["Concert", "theatre"])]
    told = [m["content"] for m in chat.fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told[0] == "Refunded 80." and told[1].startswith(  # turn 4: the decision's (2 and 3 the waiting ones)
        "Already done earlier in this conversation (turn 4): Refunded 80. It was not run again"), told


def test_a_model_that_loops_until_the_session_budget_is_spent_leaves_the_user_told_it_cannot_go_on(chat):
    """The model calls a tool for ever, 40,000 tokens a call: the third call passes the session's
    budget (100,000) and the fourth is not sent. A channel's conversation is one session for
    good, so no message the user sends can go on: they read so (`session_budget_spent`), not
    "please try again", and no later message calls the model."""
    chat.fake.responder = lambda body: {"tool_calls": [{"name": "pay", "arguments": {"amount": 1}}],
                                        "usage": {"prompt_tokens": 39990, "completion_tokens": 10}}
    chat.user.say("hello")
    wait_until(chat.user.replies, what="the reply to the loop")
    assert len(chat.fake.requests) == 3
    chat.user.say("hello again")
    wait_until(lambda: len(chat.user.replies()) == 2, what="the reply to the next message")
    chat.settled()
    assert chat.texts() == [PAGE_TEXTS["session_budget_spent"]] * 2 and len(chat.fake.requests) == 3


@pytest.fixture
def user_budget(monkeypatch) -> None:
    """The bot with a budget per user (100,000 tokens) instead of one per session: request it
    before `chat` (fixtures are made in the order the test names them)."""
    budgeted = BOT.replace("limits: {max_session_tokens: 100000}", "limits: {max_user_tokens: 100000}")
    assert budgeted != BOT
    monkeypatch.setitem(globals(), "BOT", budgeted)


def test_a_model_that_loops_until_the_users_budget_is_spent_leaves_the_user_told_when_it_renews(user_budget, chat):
    """The same loop against the user's budget (`limits.max_user_tokens`): the fourth call is not
    sent, and the user reads `user_budget_spent` (when it renews), not "please try again", once
    however often the platform delivers that message; the next message, and one in a new conversation of theirs (the budget is the user's, not the
    conversation's), call no model and tell them the same."""
    chat.fake.responder = lambda body: {"tool_calls": [{"name": "pay", "arguments": {"amount": 1}}],
                                        "usage": {"prompt_tokens": 39990, "completion_tokens": 10}}
    told = PAGE_TEXTS["user_budget_spent"].split("{renews}")[0]
    for _ in range(2):  # the first and the platform's retry: told once
        chat.user.say("hello", delivery=56)
    wait_until(chat.user.replies, what="the reply to the loop")
    assert len(chat.fake.requests) == 3
    chat.user.say("hello again")
    chat.user.say_elsewhere("hi there", delivery=90)
    wait_until(lambda: len(chat.user.replies()) == 3, what="the replies to the next messages")
    chat.settled()
    assert all(text.startswith(told) for text in chat.texts()) and len(chat.texts()) == 3, chat.texts()
    assert len(chat.fake.requests) == 3


def test_a_delivery_sent_again_after_the_budget_ended_its_turn_tells_its_user_once(chat):
    """The platform sends the delivery of a loop the session's budget ended three times more (no
    answer in time, a replica gone): no model is asked again, and the user, told once already
    that the conversation cannot go on, is not told again for the same message."""
    chat.fake.responder = lambda body: {"tool_calls": [{"name": "pay", "arguments": {"amount": 1}}],
                                        "usage": {"prompt_tokens": 39990, "completion_tokens": 10}}
    for _ in range(4):  # the first and the platform's three retries
        assert chat.user.say("hello", delivery=55) == 200
    assert chat.user.say("hello again") == 200  # a new message: told again, as it should be
    wait_until(lambda: len(chat.user.replies()) >= 2, what="the replies")
    chat.settled()
    assert chat.texts() == [PAGE_TEXTS["session_budget_spent"]] * 2 and len(chat.fake.requests) == 3


@pytest.mark.parametrize("model", [{"raw": "<html>502 Bad Gateway</html>"},
                                   {"tool_calls": [{"name": "book", "arguments": "{\"show\": "}]}])
def test_a_model_that_answers_garbage_or_loops_leaves_the_user_told(chat, model):
    """A body that is no JSON fails the turn; arguments cut mid-JSON for ever (every answer the
    same) end the turn at max_model_calls: either way the user reads a message, never silence."""
    from chatrun.definition.page_texts import BUILTIN
    from chatrun.events import MODEL_FAILED_TEXT

    chat.fake.responder = lambda body: model
    chat.user.say("hello")
    wait_until(chat.user.replies, what="the reply")
    chat.settled()
    told = MODEL_FAILED_TEXT if "raw" in model else BUILTIN["en"]["fallback"]
    assert chat.texts() == [told]


def test_a_press_on_an_answered_questions_button_decides_nothing_else(chat):
    """The user declines "Book Hamlet?" by asking for another show, and the model asks "Book
    Macbeth?". Hamlet's Yes button is still on the platform (a chat keeps its old messages): a
    press on it said only `yes`, so it booked Macbeth, which the user never said yes to. A button
    names its question: a press on an answered one decides nothing, and the user is told."""
    chat.user.say("book Hamlet")
    wait_until(chat.user.replies, what="the first question")
    ((asked, hamlet_buttons),) = chat.user.replies()
    assert asked == "Book Hamlet?" and len(hamlet_buttons) == 2
    chat.fake.queue({"tool_calls": [{"name": "book", "arguments": {"show": "Macbeth"}}]})
    chat.user.say("rather Macbeth")
    wait_until(lambda: "Book Macbeth?" in chat.texts(), what="the second question")
    assert chat.user.press(hamlet_buttons[0]) == 200  # Hamlet's Yes, pressed late
    wait_until(lambda: len(chat.user.replies()) == 3, what="the answer to the late press")
    chat.settled()
    assert chat.client.get(chat.session(), headers=OPERATOR).json()["state"]["booked"] == 0, chat.texts()
    assert chat.texts()[2] == PAGE_TEXTS["channel_answered"]
    macbeth_buttons = chat.user.replies()[1][1]
    chat.fake.queue({"text": "Booked."})
    assert chat.user.press(macbeth_buttons[0]) == 200  # the question that waits: its Yes books it
    wait_until(lambda: "Booked." in chat.texts(), what="the booking")
    chat.settled()
    assert chat.client.get(chat.session(), headers=OPERATOR).json()["state"]["booked"] == 1


def test_a_typed_message_that_ends_like_a_buttons_value_is_a_message(chat):
    chat.user.say("where is order #p7")  # typed: not a press on item p7's button
    wait_until(chat.user.replies, what="the reply")
    chat.settled()
    assert chat.texts() == ["You said where is order #p7."]


def test_an_edited_message_runs_no_turn_and_its_user_is_told_once_to_send_it_again(chat):
    """An edit (Slack's message_changed, Telegram's edited_message, WhatsApp's `edit`, Teams'
    messageUpdate) was dropped silently: the user fixed a typo and waited forever. It runs no
    turn, keeps nothing in the conversation's memory, and its user reads why once per edited
    message, however often the platform delivers the edit or the message is edited again."""
    assert chat.user.say("helo", delivery=90) == 200
    wait_until(chat.user.replies, what="the reply")
    for text in ("hello", "hello", "hello!"):  # the edit, its delivery sent again, a second edit
        assert chat.user.edit(90, text) == 200
    wait_until(lambda: len(chat.user.replies()) == 2, what="the notice")
    chat.settled()
    assert chat.texts() == ["You said helo.", PAGE_TEXTS["channel_edited"]]
    assert len(chat.fake.requests) == 1  # no turn ran for the edits
    assert chat.user.say("next") == 200
    wait_until(lambda: len(chat.user.replies()) == 3, what="the next reply")
    chat.settled()
    assert chat.texts() == ["You said helo.", PAGE_TEXTS["channel_edited"], "You said next."]
    said = [m["content"] for m in chat.fake.requests[-1]["messages"] if m["role"] != "system"]
    assert said == ["helo", "You said helo.", "next"]  # nothing of the edits in the memory
