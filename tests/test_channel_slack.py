"""Issue 36: a bot on Slack. Real parts: the app (TestClient, its outbox worker running), the
real `openai` client against the fake OpenAI server, Slack's own SDK computing and checking the
request signatures (slack_sdk's SignatureVerifier), and a local fake of Slack's Web API
(tests/channel_support.py) receiving chat.postMessage. Tried here: the signature (forged,
missing and replayed-after-five-minutes requests get 401 and run nothing), the URL check, one
reply per event however often Slack retries it, the 3-second answer while the model is slow,
threads as conversations, Block Kit buttons and a press deciding the user's confirmation."""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient

from channel_support import FakeSlack, slack_edit, slack_message, slack_press, slack_signed
from channel_support import shop_responder as responder
from chatrun.engine import stream_chunks
from chatrun.server.channels.base import session_id_for
from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL

pytest.importorskip("slack_sdk", reason="slack_sdk is not installed (pip install -e '.[test]' brings it)")

TOKEN, SIGNING = "xoxb-test-token", "slack-signing-secret-0123"

BOT = f"""\
name: shop
model: {{{OPENAI_MODEL}}}
env:
  SLACK_TOKEN: {{secret: true}}
  SLACK_SIGNING: {{secret: true}}
  SLACK_API: {{}}
channels:
  slack:
    token: SLACK_TOKEN
    signing_secret: SLACK_SIGNING
    api: "{{{{ env.SLACK_API }}}}"
    retry: {{attempts: 50, backoff: 0.2, max_backoff: 0.5}}
state: {{booked: 0}}
routes:
  main:
    default: true
    system: "You sell tickets to {{{{ principal.display_name or 'someone' }}}}."
    tools: [book]
tools:
  book:
    description: Book a ticket.
    parameters: {{type: object, properties: {{show: {{type: string}}}}, required: [show]}}
    confirm: "Book {{{{ args.show }}}}?"
    action: {{set: {{state.booked: "{{{{ state.booked + 1 }}}}"}}, reply: "Booked {{{{ args.show }}}}."}}
"""




@pytest.fixture
def slack():
    with FakeSlack(TOKEN) as api:
        yield api


@pytest.fixture
def client(tmp_path, fake, slack, monkeypatch):
    for name, value in (("SLACK_TOKEN", TOKEN), ("SLACK_SIGNING", SIGNING), ("SLACK_API", slack.url + "/api"),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT)
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as c:
        yield c


def post_event(client, payload, secret=SIGNING, timestamp=None, retry=None):
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **slack_signed(secret, body, timestamp or int(time.time()))}
    if retry:
        headers |= {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"}
    return client.post("/channels/shop/slack", content=body, headers=headers)


def post_press(client, payload):
    body = urlencode({"payload": json.dumps(payload)}).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded", **slack_signed(SIGNING, body, int(time.time()))}
    return client.post("/channels/shop/slack", content=body, headers=headers)


def texts(slack):
    return [c["text"] for c in slack.calls("chat.postMessage")]


def outbox_empty(client) -> bool:
    return client.get("/outbox").json()["entries"] == []


def test_slack_checks_the_url_and_a_direct_message_gets_one_reply(client, slack):
    answer = post_event(client, {"type": "url_verification", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "token": "x"})
    assert answer.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    assert post_event(client, slack_message("Ev1", "hello")).status_code == 200
    wait_until(lambda: texts(slack), what="the reply")
    assert [(c["channel"], c.get("thread_ts"), c["text"]) for c in slack.calls("chat.postMessage")] == \
        [("D42", None, "You said hello.")]


def test_an_event_slack_retries_three_times_runs_once(client, slack, fake):
    for retry in (None, 1, 2, 3):
        assert post_event(client, slack_message("Ev7", "hello"), retry=retry).status_code == 200
    wait_until(lambda: texts(slack), what="the reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert texts(slack) == ["You said hello."] and len(fake.requests) == 1


def test_forged_missing_or_stale_signatures_get_401_and_run_nothing(client, slack, fake):
    assert post_event(client, slack_message("Ev1", "hi"), secret="not-the-secret").status_code == 401
    assert post_event(client, slack_message("Ev2", "hi"), timestamp=int(time.time()) - 600).status_code == 401
    assert client.post("/channels/shop/slack", json=slack_message("Ev3", "hi")).status_code == 401
    assert fake.requests == [] and slack.seen == [] and outbox_empty(client)


def test_slack_gets_its_answer_within_3_seconds_while_the_model_is_slow(client, slack):
    started = time.monotonic()
    assert post_event(client, slack_message("Ev9", "slow")).status_code == 200
    assert time.monotonic() - started < 3.5  # Slack's limit, with the test client's own overhead
    wait_until(lambda: texts(slack), what="the slow reply, posted after")
    assert texts(slack) == ["Slow answer."]


def test_in_a_channel_a_thread_is_the_conversation_and_the_bot_answers_in_it(client, slack):
    post_event(client, slack_message("Ev1", "<@B1> hello", channel="C7", ts="100.1", kind="app_mention"))
    post_event(client, slack_message("Ev2", "more", channel="C7", ts="100.5", thread_ts="100.1"))
    post_event(client, slack_message("Ev3", "chatter", channel="C7", ts="101.0"))  # not to the bot
    wait_until(lambda: len(texts(slack)) >= 2, what="two replies in the thread")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    sent = slack.calls("chat.postMessage")
    assert [(c["channel"], c["thread_ts"]) for c in sent] == [("C7", "100.1"), ("C7", "100.1")]
    assert sorted(texts(slack)) == ["You said <@B1> hello.", "You said more."]


def test_a_persons_edit_in_a_thread_is_told_there_and_unfurls_and_the_bots_own_updates_are_not(client, slack, fake):
    """Slack sends `message_changed` for a link's unfurl (no `edited`) and for the bot's own
    messages (chat.update of a streamed reply: `bot_id`) too: neither is a person's edit, and a
    notice for them would answer the bot's every streamed reply. A person's edit in the thread
    is told once, in the thread."""
    asked = slack_message("Ev1", "hello thre", channel="C7", ts="100.5", thread_ts="100.1")
    post_event(client, asked)
    wait_until(lambda: texts(slack), what="the reply")
    unfurl = slack_edit("Ev2", asked, "hello thre")
    del unfurl["event"]["message"]["edited"]
    own = slack_edit("Ev3", slack_message("Ev0", "You said hello thre.", channel="C7", ts="100.6",
                                          thread_ts="100.1"), "You said hello thre. Anything else?")
    own["event"]["message"]["bot_id"] = "B1"
    for event in (unfurl, own, slack_edit("Ev4", asked, "hello there"), slack_edit("Ev5", asked, "hello there!")):
        assert post_event(client, event).status_code == 200
    wait_until(lambda: len(texts(slack)) == 2, what="the notice")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert [(c["channel"], c["thread_ts"], c["text"]) for c in slack.calls("chat.postMessage")] == [
        ("C7", "100.1", "You said hello thre."),
        ("C7", "100.1", "I do not read edited messages, so your edit changed nothing. Please send the message again.")]
    assert len(fake.requests) == 1


def test_an_edited_mention_outside_a_thread_is_told_in_its_thread_and_an_edited_chatter_is_not(client, slack, fake):
    """A mention outside a thread is answered (in a thread on it), so its edit is told there,
    once, like an edit in a thread; a channel's chatter outside a thread is not answered, and
    neither is its edit (the bot is named by the event's `authorizations`)."""
    mention = slack_message("Ev1", "<@B1> helo", channel="C7", ts="100.1", kind="app_mention")
    chatter = slack_message("Ev2", "lunch?", channel="C7", ts="101.0")
    for payload in (mention, chatter):
        post_event(client, payload)
    wait_until(lambda: texts(slack), what="the reply")
    as_message = {**mention, "event": {**mention["event"], "type": "message"}}  # message.channels' copy
    for event in (slack_edit("Ev3", as_message, "<@B1> hello"), slack_edit("Ev4", as_message, "<@B1> hello!"),
                  slack_edit("Ev5", chatter, "lunch at 1?")):
        assert post_event(client, event).status_code == 200
    wait_until(lambda: len(texts(slack)) == 2, what="the notice")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert [(c["channel"], c["thread_ts"], c["text"]) for c in slack.calls("chat.postMessage")] == [
        ("C7", "100.1", "You said <@B1> helo."),
        ("C7", "100.1", "I do not read edited messages, so your edit changed nothing. Please send the message again.")]
    assert len(fake.requests) == 1


def test_the_users_confirmation_is_block_kit_buttons_and_a_press_decides_it(client, slack):
    post_event(client, slack_message("Ev1", "book Hamlet"))
    wait_until(lambda: texts(slack), what="the question")
    question = slack.calls("chat.postMessage")[-1]
    assert question["text"] == "Book Hamlet?"
    buttons = question["blocks"][1]["elements"]
    assert [(b["text"]["text"], b["value"]) for b in buttons] == [("Yes", "yes#p1"), ("No", "no#p1")]
    assert post_press(client, slack_press("trig-1", "yes#p1")).status_code == 200
    wait_until(lambda: any("Booked Hamlet" in t for t in texts(slack)), what="the booking's reply")


def test_a_message_acknowledged_by_a_replica_that_died_is_answered_from_the_store(client, slack, fake):
    """What a replica killed after Slack's 200 leaves: the message's record, its hold run out.
    The app's look at the records (every few seconds) runs its turn, once (tests/test_channel_replicas.py
    kills a real replica)."""
    from chatrun.server.channels.acked import key_of
    from chatrun.server.channels.base import Inbound

    registry = client.app.state.registry
    inbound = Inbound("Ev-dead", "D42:U42", "U42", "hello from the dead", {"channel": "D42", "thread_ts": None})
    record = {"inbound": inbound.__dict__, "until": time.time() - 1, "attempts": 0}
    client.portal.call(registry.store.put_record, key_of("shop", "slack", inbound), record)
    wait_until(lambda: texts(slack), what="the reply")
    wait_until(lambda: client.portal.call(registry.store.record_keys, "channel-in:") == [], what="the record deleted")
    assert texts(slack) == ["You said hello from the dead."] and len(fake.requests) == 1


def test_a_recorded_message_keeps_its_files_handles():
    from chatrun.server.channels.acked import restored, saved
    from chatrun.server.channels.base import Inbound, InboundFile

    inbound = Inbound("Ev1", "D42:U42", "U42", "look", {"channel": "D42"}, files=(
        InboundFile("https://files.slack.com/F1", "image/png", "photo.png", 100),))
    assert restored(json.loads(json.dumps(saved(inbound)))) == inbound
    # A record a newer chatrun wrote, with fields this one lacks (a rolling deploy): read all the same.
    newer = saved(inbound)
    newer = {**newer, "thread": "T1", "files": [{**f, "sha256": "ab"} for f in newer["files"]]}
    assert restored(json.loads(json.dumps(newer))) == inbound


def streaming(body):
    """The fake model streams its answer in chunks; "fail" streams, then drops the connection."""
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    if user == "fail":
        return {"chunks": ["Half ", "an ", "answer"], "disconnect": True}
    return {"chunks": ["The ", "show ", "starts ", "at ", "eight."]}


@pytest.fixture
def streamed(tmp_path, fake, slack, monkeypatch):
    """The app, its bot's model streaming (`stream: true`)."""
    for name, value in (("SLACK_TOKEN", TOKEN), ("SLACK_SIGNING", SIGNING), ("SLACK_API", slack.url + "/api"),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = streaming
    (tmp_path / "bot.yaml").write_text(BOT.replace("stream: false", "stream: true"))
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as c:
        yield c


def test_a_streamed_reply_is_one_message_updated_then_replaced_by_the_committed_text(streamed, slack, monkeypatch):
    from chatrun.server.channels.slack import Slack

    monkeypatch.setattr(Slack, "stream_every", 0.0)  # every chunk shows: the updates are seen
    monkeypatch.setattr(stream_chunks, "STREAM_EVERY", 0.0)  # and the engine sends each chunk on
    post_event(streamed, slack_message("Ev1", "when?"))
    wait_until(lambda: any(c["text"] == "The show starts at eight." for c in slack.calls("chat.update")),
               what="the committed text in the streamed message")
    wait_until(lambda: outbox_empty(streamed), what="the outbox emptied")
    posted, updates = slack.calls("chat.postMessage"), slack.calls("chat.update")
    assert [p["text"] for p in posted] == ["The "]  # the first chunk, posted once; never the reply again
    assert [u["text"] for u in updates] == ["The show ", "The show starts ", "The show starts at ",
                                            "The show starts at eight.", "The show starts at eight."]
    assert {(u["channel"], u["ts"]) for u in updates} == {("D42", "1764950400.000100")}  # the posted one's ts


def test_a_streamed_reply_is_updated_at_most_every_stream_every_seconds(streamed, slack, monkeypatch):
    from chatrun.server.channels.slack import Slack

    monkeypatch.setattr(Slack, "stream_every", 3600.0)  # no update while it streams: the outbox's only
    post_event(streamed, slack_message("Ev1", "when?"))
    wait_until(lambda: slack.calls("chat.update"), what="the committed text")
    wait_until(lambda: outbox_empty(streamed), what="the outbox emptied")
    assert [p["text"] for p in slack.calls("chat.postMessage")] == ["The "]
    assert [u["text"] for u in slack.calls("chat.update")] == ["The show starts at eight."]


def test_a_rolled_back_streamed_reply_is_replaced_by_the_failure_text(streamed, slack, monkeypatch):
    from chatrun.server.channels.slack import Slack

    monkeypatch.setattr(Slack, "stream_every", 3600.0)
    post_event(streamed, slack_message("Ev1", "fail"))
    wait_until(lambda: slack.calls("chat.update"), what="the failure's text")
    wait_until(lambda: outbox_empty(streamed), what="the outbox emptied")
    assert [p["text"] for p in slack.calls("chat.postMessage")] == ["Half "]
    assert [u["text"] for u in slack.calls("chat.update")] == [
        "Sorry, the assistant cannot answer right now. Nothing of your last message was kept; please try again."]
    # The next turn (the same turn number: the failed one rolled back) streams in a message of its own.
    post_event(streamed, slack_message("Ev2", "when?"))
    wait_until(lambda: len(slack.calls("chat.update")) == 2, what="the next reply")
    wait_until(lambda: outbox_empty(streamed), what="the outbox emptied")
    assert [p["text"] for p in slack.calls("chat.postMessage")] == ["Half ", "The "]
    first, second = slack.calls("chat.update")
    assert second["text"] == "The show starts at eight." and second["ts"] != first["ts"]


def test_a_press_not_of_slacks_shape_gets_400_naming_the_channel(client, slack, fake):
    for broken in ({"type": "block_actions", "trigger_id": "T1", "actions": {"a": 1}},
                   {"type": "block_actions", "trigger_id": "T2", "actions": [{"value": "yes"}], "user": "U42"}):
        answer = post_press(client, broken)
        assert answer.status_code == 400, answer.text
        assert "slack delivery" in answer.json()["message"]
    assert fake.requests == [] and slack.seen == []


def test_a_timestamp_that_is_no_number_or_a_signature_beyond_ascii_gets_401_not_a_500(client, slack, fake):
    body = json.dumps(slack_message("Ev1", "hi")).encode()
    good = slack_signed(SIGNING, body, int(time.time()))
    for headers in ({**good, "X-Slack-Request-Timestamp": "soon"},
                    {**good, "X-Slack-Signature": "v0=\xe9".encode("latin-1")}):
        answer = client.post("/channels/shop/slack", content=body, headers={"Content-Type": "application/json", **headers})
        assert answer.status_code == 401, answer.text
    assert fake.requests == [] and slack.seen == []


def test_a_mention_in_a_thread_slack_sends_as_two_events_runs_once_and_replies_once(client, slack, fake):
    """Subscribed to app_mention and message.channels, Slack sends one mention in a thread as
    both events, with two event_ids: one message, so one turn and one reply."""
    post_event(client, slack_message("Ev1", "<@B1> hi", channel="C1", ts="100.1", kind="app_mention"))
    wait_until(lambda: texts(slack), what="the first reply")
    again = {"channel": "C1", "ts": "100.5", "thread_ts": "100.1"}
    assert post_event(client, slack_message("Ev2", "<@B1> more", kind="app_mention", **again)).status_code == 200
    assert post_event(client, slack_message("Ev3", "<@B1> more", kind="message", **again)).status_code == 200
    wait_until(lambda: len(texts(slack)) >= 2, what="the reply in the thread")
    wait_until(lambda: client.portal.call(client.app.state.registry.store.record_keys, "channel-in:") == [],
               what="both deliveries done")
    assert texts(slack) == ["You said <@B1> hi.", "You said <@B1> more."] and len(fake.requests) == 2


def test_an_edit_a_join_or_a_blank_message_runs_no_turn(client, slack, fake):
    """What Slack sends that is not the user saying something new: an edit (`message_changed`,
    its text under `message`, no user at the top), a join (`channel_join`, Slack's own words;
    `member_joined_channel`, no text) and a message of spaces. Each is answered 200 and runs
    no turn; the next message is the only one the model is asked about."""
    edit = slack_message("Ev1", "")
    edit["event"] |= {"subtype": "message_changed", "message": {"type": "message", "user": "U42", "text": "hallo"}}
    del edit["event"]["user"]
    join = slack_message("Ev2", "<@U42> has joined the channel")
    join["event"]["subtype"] = "channel_join"
    member = slack_message("Ev3", "")
    member["event"] = {"type": "member_joined_channel", "user": "U42", "channel": "D42", "event_ts": "1.2"}
    for payload in (edit, join, member, slack_message("Ev4", " \n ")):
        assert post_event(client, payload).status_code == 200
    assert post_event(client, slack_message("Ev5", "hello")).status_code == 200
    wait_until(lambda: texts(slack), what="the reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert texts(slack) == ["You said hello."] and len(fake.requests) == 1


def test_a_429_with_retry_after_puts_the_next_try_that_far_off(tmp_path, fake, slack, monkeypatch):
    """Slack's rate limit (429, `Retry-After: 30`) is honoured by the outbox: its next try of
    the reply is not before 30 s (the sink's own backoff would have tried again at once)."""
    for name, value in (("SLACK_TOKEN", TOKEN), ("SLACK_SIGNING", SIGNING), ("SLACK_API", slack.url + "/api"),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace("max_backoff: 0.5", "max_backoff: 120"))
    slack.status, slack.answer_headers = 429, {"Retry-After": "30"}
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        asked = time.time()
        assert post_event(client, slack_message("Ev1", "hello")).status_code == 200
        entry = wait_until(lambda: [e for e in client.get("/outbox").json()["entries"] if e["attempts"] >= 1],
                           what="the refused attempt")[0]
        assert entry["next_at"] >= asked + 30 and entry["attempts"] == 1, entry
    assert [c.status for c in slack.seen] == [429]


def test_a_token_http_cannot_carry_in_a_header_is_a_request_that_cannot_be_made_never_shown(tmp_path, fake, slack,
                                                                                            monkeypatch):
    for name, value in (("SLACK_TOKEN", "xoxb-tökén"), ("SLACK_SIGNING", SIGNING), ("SLACK_API", slack.url + "/api"),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace("attempts: 50", "attempts: 2"))
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        assert post_event(client, slack_message("Ev1", "hello")).status_code == 200
        dead = wait_until(lambda: client.get("/outbox?state=dead").json()["entries"], what="the dead letter")
    assert dead[0]["error"] == ("channel slack of bot shop: the request cannot be made (UnicodeEncodeError: "
                                "a header or the URL holds a character HTTP cannot carry)")
    assert slack.seen == []


def test_in_a_thread_each_sender_has_their_own_conversation_and_decides_only_their_own_confirmation(client, slack):
    """Two people in one channel thread: each is answered in the thread from a session of their
    own (the second was answered by silence when the thread was one owner-only session), and a
    press by one on the other's confirmation decides nothing of the other's."""
    post_event(client, slack_message("Ev1", "book Hamlet", user="U1", channel="C7", ts="100.1", kind="app_mention"))
    wait_until(lambda: "Book Hamlet?" in texts(slack), what="U1's question")
    post_event(client, slack_message("Ev2", "hello", user="U2", channel="C7", ts="100.5", thread_ts="100.1"))
    wait_until(lambda: "You said hello." in texts(slack), what="U2's own reply in the thread")
    question_ts = "100.9"  # U2 presses Yes under U1's question: U2's own session reads a "yes"
    post_press(client, slack_press("trig-2", "yes", user="U2", channel="C7", message_ts=question_ts)
               | {"message": {"ts": question_ts, "thread_ts": "100.1", "text": "Book Hamlet?"}})
    wait_until(lambda: "You said yes." in texts(slack), what="U2's press answered in U2's conversation")
    assert not any("Booked" in t for t in texts(slack))
    post_press(client, slack_press("trig-3", "yes", user="U1", channel="C7", message_ts=question_ts)
               | {"message": {"ts": question_ts, "thread_ts": "100.1", "text": "Book Hamlet?"}})
    wait_until(lambda: any("Booked Hamlet" in t for t in texts(slack)), what="U1's own press deciding it")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert {(c["channel"], c["thread_ts"]) for c in slack.calls("chat.postMessage")} == {("C7", "100.1")}
    assert len([t for t in texts(slack) if "Booked Hamlet" in t]) == 1
    store = client.app.state.registry.store  # derived from chat, thread and sender: every replica finds it
    for user in ("U1", "U2"):
        record = client.portal.call(store.load_session, session_id_for("shop", "slack", f"C7:100.1:{user}"))
        assert record.owner == f"slack:{user}"


def test_the_senders_display_name_is_asked_of_users_info_once_and_kept(client, slack):
    """Slack's event names the sender by id only: the name (the principal's `display_name`, as
    Telegram and Teams give it) is asked of users.info, once for the user's messages and presses."""
    slack.users = {"U42": "Ana Lima"}
    post_event(client, slack_message("Ev1", "who"))
    wait_until(lambda: texts(slack), what="the first reply")
    post_event(client, slack_message("Ev2", "who"))
    wait_until(lambda: len(texts(slack)) >= 2, what="the second reply")
    assert texts(slack) == ["You sell tickets to Ana Lima."] * 2
    assert slack.lookups == ["U42"]


def test_without_users_read_the_turn_goes_on_without_a_name_and_slack_is_not_asked_each_time(client, slack):
    slack.users = None  # the token lacks users:read
    post_event(client, slack_message("Ev1", "who"))
    wait_until(lambda: texts(slack), what="the first reply")
    post_event(client, slack_message("Ev2", "who"))
    wait_until(lambda: len(texts(slack)) >= 2, what="the second reply")
    assert texts(slack) == ["You sell tickets to someone."] * 2
    assert slack.lookups == ["U42"]


def test_a_slack_users_locale_from_users_info_is_the_conversations(tmp_path, fake, slack, monkeypatch):
    """Slack's events carry no language: the user's `locale` comes with their name from users.info
    (`include_locale`), asked once, and is the new conversation's (de-DE speaks the bot's de)."""
    for name, value in (("SLACK_TOKEN", TOKEN), ("SLACK_SIGNING", SIGNING), ("SLACK_API", slack.url + "/api"),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace("state: {booked: 0}\n", "locales: [en, de]\nstate: {booked: 0}\n")
                                       .replace("system: \"You sell", "system: \"{{ t('hi') }} You sell"))
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text("hi: Hello.\n")
    (tmp_path / "locales" / "de.yaml").write_text("hi: Hallo.\n")
    slack.users, slack.locales = {"U42": "Ana Lima"}, {"U42": "de-DE"}
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        post_event(client, slack_message("Ev1", "who"))
        wait_until(lambda: texts(slack), what="the first reply")
        post_event(client, slack_message("Ev2", "who"))
        wait_until(lambda: len(texts(slack)) >= 2, what="the second reply")
    assert texts(slack) == ["Hallo. You sell tickets to Ana Lima."] * 2
    assert slack.lookups == ["U42"]


def test_a_slack_turn_run_after_the_answer_continues_the_callers_trace(client, slack, spans):
    """A delivery with a W3C traceparent (a proxy or gateway in front of chatrun adds one) is
    continued by its turn, though the turn runs on after Slack got its answer (docs/observability.md,
    "Trace context across services")."""
    from test_observability import TRACE_ID, TRACEPARENT, agent_spans, assert_continued

    body = json.dumps(slack_message("Ev1", "hello")).encode()
    headers = {"Content-Type": "application/json", "traceparent": TRACEPARENT,
               **slack_signed(SIGNING, body, int(time.time()))}
    assert client.post("/channels/shop/slack", content=body, headers=headers).status_code == 200
    wait_until(lambda: texts(slack), what="the reply")
    [agent] = agent_spans(spans, session_id_for("shop", "slack", "D42:U42"))
    assert f"{agent.context.trace_id:032x}" == TRACE_ID
    assert_continued(agent, spans)
