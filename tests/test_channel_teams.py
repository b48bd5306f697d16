"""Issue 36: a bot on Microsoft Teams. Real parts: the app (TestClient, its outbox worker
running), the real `openai` client against the fake OpenAI server, and a local fake of the Bot
Framework (tests/channel_support.py: OpenID metadata and keys, the Entra ID token endpoint, the
Bot Connector) whose tokens are signed with a real RSA key (PyJWT, RS256). Tried here: a token
signed with another key, for another app, or naming another serviceUrl gets 401 and runs
nothing; an activity delivered again runs once; the reply goes to the activity's serviceUrl
with the bot's own token; the user's confirmation is an Adaptive Card and a press decides it."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL

pytest.importorskip("jwt", reason="PyJWT is not installed (pip install -e '.[test]' brings it)")

from channel_support import FakeBotFramework
from channel_support import shop_responder as responder  # noqa: E402

APP_ID, APP_PASSWORD = "0d8c2f4e-app-id", "teams-client-secret-0123"

BOT = f"""\
name: shop
model: {{{OPENAI_MODEL}}}
env:
  TEAMS_APP_ID: {{secret: true}}
  TEAMS_APP_PASSWORD: {{secret: true}}
  BF: {{}}
channels:
  teams:
    app_id: TEAMS_APP_ID
    app_password: TEAMS_APP_PASSWORD
    openid: "{{{{ env.BF }}}}/openid"
    token_url: "{{{{ env.BF }}}}/token"
    retry: {{attempts: 50, backoff: 0.2, max_backoff: 0.5}}
state: {{booked: 0}}
routes:
  main:
    default: true
    system: You sell tickets.
    tools: [book]
tools:
  book:
    description: Book a ticket.
    parameters: {{type: object, properties: {{show: {{type: string}}}}, required: [show]}}
    confirm: "Book {{{{ args.show }}}}?"
    action: {{set: {{state.booked: "{{{{ state.booked + 1 }}}}"}}, reply: "Booked {{{{ args.show }}}}."}}
"""




@pytest.fixture
def bf():
    with FakeBotFramework(APP_ID, APP_PASSWORD) as fake_bf:
        yield fake_bf


@pytest.fixture
def client(tmp_path, fake, bf, monkeypatch):
    for name, value in (("TEAMS_APP_ID", APP_ID), ("TEAMS_APP_PASSWORD", APP_PASSWORD), ("BF", bf.url),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT)
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as c:
        yield c


def post(client, bf, activity, token=None):
    token = token or bf.activity_token(activity["serviceUrl"])
    return client.post("/channels/shop/teams", json=activity, headers={"Authorization": f"Bearer {token}"})


def outbox_empty(client) -> bool:
    return client.get("/outbox").json()["entries"] == []


def test_an_activity_delivered_twice_gets_one_reply_at_its_service_url(client, bf, fake):
    for _ in range(2):
        assert post(client, bf, bf.activity("act-1", "hello")).status_code == 200
    wait_until(lambda: bf.activities, what="the reply")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    [reply] = bf.activities
    assert reply["path"] == "/teams-service/v3/conversations/a:1personal/activities"
    assert (reply["type"], reply["text"], reply["replyToId"]) == ("message", "You said hello.", "act-1")
    assert len(fake.requests) == 1 and bf.tokens_issued == 1


def test_tokens_signed_elsewhere_for_another_app_or_another_service_url_get_401(client, bf, fake):
    from cryptography.hazmat.primitives.asymmetric import rsa

    activity = bf.activity("act-1", "hello")
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = [bf.activity_token(activity["serviceUrl"], key=other_key),
              bf.activity_token(activity["serviceUrl"], audience="another-app"),
              bf.activity_token("https://evil.example/"),
              # A token naming no serviceUrl passed, whatever serviceUrl the activity named (the
              # Bot Framework's validation requires the claim): a replayed one could send replies anywhere.
              bf.activity_token(None)]
    for token in forged:
        assert post(client, bf, activity, token).status_code == 401
    assert client.post("/channels/shop/teams", json=activity).status_code == 401
    assert fake.requests == [] and bf.activities == [] and outbox_empty(client)


def test_an_activity_replayed_with_its_token_expired_gets_401(client, bf, fake):
    """What bounds a captured Teams delivery's replay (docs/channels.md, "Replays"): its token's
    `exp`, with 300 s of clock skew. A token that expired beyond that is refused; one within it runs."""
    activity = bf.activity("act-1", "hello")
    expired = bf.activity_token(activity["serviceUrl"], issued=time.time() - 3600 - 400)
    assert post(client, bf, activity, expired).status_code == 401
    assert fake.requests == []
    skewed = bf.activity_token(activity["serviceUrl"], issued=time.time() - 3600 - 200)
    assert post(client, bf, activity, skewed).status_code == 200
    assert len(fake.requests) == 1


def test_a_token_valid_for_longer_than_the_replay_window_gets_401(client, bf, fake):
    """The Bot Framework signs no time in the activity: what refuses its replay once an erasure's
    marks are gone (24 h, store/replays.py WINDOW) is its token's `exp`. A token valid for days
    would let its activity be replayed after them: refused. The Bot Framework's own (an hour) runs."""
    activity = bf.activity("act-1", "hello")
    lasting = bf.activity_token(activity["serviceUrl"], lifetime=3 * 24 * 3600)
    assert post(client, bf, activity, lasting).status_code == 401
    assert fake.requests == []
    assert post(client, bf, activity, bf.activity_token(activity["serviceUrl"])).status_code == 200
    assert len(fake.requests) == 1


def test_the_users_confirmation_is_an_adaptive_card_and_a_press_decides_it(client, bf):
    post(client, bf, bf.activity("act-1", "book Hamlet"))
    wait_until(lambda: bf.activities, what="the question")
    card = bf.activities[-1]["attachments"][0]
    assert card["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert card["content"]["body"][0]["text"] == "Book Hamlet?"
    assert [(a["title"], a["data"]) for a in card["content"]["actions"]] == [("Yes", {"choice": "yes#p1"}),
                                                                           ("No", {"choice": "no#p1"})]
    post(client, bf, bf.activity("act-2", value={"choice": "yes#p1"}))
    wait_until(lambda: any("Booked Hamlet" in a.get("text", "") for a in bf.activities), what="the booking's reply")


def test_a_users_files_are_read_from_the_activity_and_the_token_goes_only_to_the_service_urls_host(bf):
    from chatrun.definition.config import BotConfig, ChannelConfig
    from chatrun.server.channels.teams import FILE_INFO, Teams

    activity = bf.activity("act-1", "")
    connector = f"{bf.url}/v3/attachments/att-1/views/original"
    activity["attachments"] = [
        {"contentType": "image/*", "contentUrl": connector},  # pasted: on the Bot Connector, with the token
        {"contentType": FILE_INFO, "name": "invoice.pdf", "contentUrl": "https://contoso.sharepoint.com/x.pdf",
         "content": {"downloadUrl": "https://contoso.sharepoint.com/dl?tempauth=abc", "fileType": "pdf"}},
        {"contentType": "image/jpeg", "contentUrl": "https://elsewhere.example/a.jpg"},  # never the token
        {"contentType": "text/html", "content": "<p><img src='...'></p>"},  # the message itself: not a file
        {"contentType": "application/vnd.microsoft.card.adaptive", "content": {}}]
    [message] = Teams(BotConfig(name="shop", routes={}, tools={}), ChannelConfig("teams")).inbound(activity)
    assert message.text == ""
    assert [(f.ref, f.media_type, f.bearer) for f in message.files] == [
        (connector, "image/png", True),
        ("https://contoso.sharepoint.com/dl?tempauth=abc", "application/pdf", False),
        ("https://elsewhere.example/a.jpg", "image/jpeg", False)]


def test_signing_keys_that_cannot_be_fetched_are_a_503_naming_the_endpoint_and_the_retry_runs(client, bf, fake,
                                                                                              caplog):
    """The Bot Framework sends an activity again when it gets a 5xx, never after a 401: an
    unreachable keys endpoint is not a forged activity. A key that is fetched but does not
    match (an unknown `kid`) is still 401."""
    import jwt

    activity = bf.activity("act-1", "hello")
    bf.keys_status = 500
    assert post(client, bf, activity).status_code == 503
    assert any("cannot check a delivery now" in r.getMessage() and f"{bf.url}/keys" in r.getMessage()
               for r in caplog.records)
    assert fake.requests == [] and bf.activities == []
    bf.keys_status = 200
    assert post(client, bf, activity).status_code == 200  # the platform's retry
    unknown_kid = jwt.encode({"iss": bf.ISSUER, "aud": APP_ID, "exp": 2**31}, bf.key, algorithm="RS256",
                             headers={"kid": "not-a-key-of-the-bot-framework"})
    assert post(client, bf, bf.activity("act-2", "hello"), unknown_kid).status_code == 401
    wait_until(lambda: bf.activities, what="the reply")
    assert len(fake.requests) == 1


def test_openid_metadata_that_cannot_be_read_is_a_503_naming_it(tmp_path, fake, bf, monkeypatch, caplog):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    for name, value in (("TEAMS_APP_ID", APP_ID), ("TEAMS_APP_PASSWORD", APP_PASSWORD), ("BF", bf.url)):
        monkeypatch.setenv(name, value)
    (tmp_path / "bot.yaml").write_text(BOT.replace('openid: "{{ env.BF }}/openid"', f'openid: "{closed}/openid"'))
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as c:
        assert post(c, bf, bf.activity("act-1", "hello")).status_code == 503
    assert any(f"OpenID metadata at {closed}/openid cannot be read" in r.getMessage() for r in caplog.records)
    assert fake.requests == []


def test_two_activities_without_an_id_are_two_turns_never_one_answered_from_the_other(client, bf, fake):
    """The delivery id is the turn's request id: two id-less activities were both "None", and the
    second was answered from the first's committed turn (the user read "You said hello." twice)."""
    for text in ("hello", "again"):
        activity = bf.activity("unused", text)
        del activity["id"]
        assert post(client, bf, activity).status_code == 200
    wait_until(lambda: len(bf.activities) == 2, what="both replies")
    assert sorted(a["text"] for a in bf.activities) == ["You said again.", "You said hello."]
    assert len(fake.requests) == 2


def group(activity: dict, conversation: str = "19:meeting-group@thread.v2") -> dict:
    """The activity as the Bot Connector sends it from a group chat (several members)."""
    activity["conversation"] = {"conversationType": "groupChat", "isGroup": True, "tenantId": "t1", "id": conversation}
    return activity


def test_in_a_group_chat_each_member_has_their_own_conversation_and_decides_only_their_own(client, bf):
    """Two members of one group chat: each is answered in the chat from a session of their own
    (the second was answered by silence when the chat was one owner-only session), and one's
    press on the other's card decides nothing of the other's."""
    post(client, bf, group(bf.activity("act-1", "book Hamlet", user="29:ana", aad="aad-ana")))
    wait_until(lambda: bf.activities, what="Ana's question")
    post(client, bf, group(bf.activity("act-2", "hello", user="29:bo", aad="aad-bo")))
    wait_until(lambda: any(a.get("text") == "You said hello." for a in bf.activities), what="Bo's own reply")
    post(client, bf, group(bf.activity("act-3", value={"choice": "yes"}, user="29:bo", aad="aad-bo")))
    wait_until(lambda: any(a.get("text") == "You said yes." for a in bf.activities), what="Bo's press, Bo's own")
    assert not any("Booked" in a.get("text", "") for a in bf.activities)
    post(client, bf, group(bf.activity("act-4", value={"choice": "yes"}, user="29:ana", aad="aad-ana")))
    wait_until(lambda: any("Booked Hamlet" in a.get("text", "") for a in bf.activities), what="Ana's press")
    wait_until(lambda: outbox_empty(client), what="the outbox emptied")
    assert {a["path"] for a in bf.activities} == {"/teams-service/v3/conversations/19:meeting-group@thread.v2/activities"}


def test_a_file_url_that_is_not_https_off_the_bot_connector_is_not_fetched(tmp_path, fake, bf, monkeypatch):
    """A file's downloadUrl was fetched from wherever the activity said, plain http to an address
    inside the server's network included (a cloud's metadata endpoint, a local admin port), and its
    bytes became the turn's attachment, which the model reads back to the user. Slack fetches only
    from its file host; a Teams file now only over https to a host name, or from the Bot
    Connector's own origin (with the token): anything else is told to the user as unreadable."""
    from chatrun.definition.page_texts import BUILTIN
    from chatrun.server.channels.teams import FILE_INFO

    for name, value in (("TEAMS_APP_ID", APP_ID), ("TEAMS_APP_PASSWORD", APP_PASSWORD), ("BF", bf.url),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace(
        "    tools: [book]\n", "    tools: [book]\n    attachments: {kinds: [application/pdf], max_bytes: 5000, max_count: 2}\n"))
    inside = bf.url.replace("127.0.0.1", "localhost") + "/internal/secret.pdf"  # another origin than the serviceUrl's
    bf.files["/internal/secret.pdf"] = b"%PDF-1.4 the admin password"
    activity = bf.activity("act-1", "here")
    activity["attachments"] = [{"contentType": FILE_INFO, "name": "secret.pdf",
                                "content": {"downloadUrl": inside, "fileType": "pdf"}}]
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        assert post(client, bf, activity).status_code == 200
        wait_until(lambda: bf.activities, what="the notice")
    assert [a["text"] for a in bf.activities] == [BUILTIN["en"]["channel_file_unreadable"]]
    assert bf.downloads == [] and fake.requests == []


def test_a_teams_users_locale_is_the_conversations_and_a_press_in_it_decides(tmp_path, fake, bf, monkeypatch):
    """The activity's `locale` (de-DE) is the session's, matched to the bot's `locales:` (de): the
    confirmation asks in German with chatrun's German buttons, and a press on Ja decides it."""
    for name, value in (("TEAMS_APP_ID", APP_ID), ("TEAMS_APP_PASSWORD", APP_PASSWORD), ("BF", bf.url),
                        ("CHATRUN_OUTBOX_POLL", "0.2")):
        monkeypatch.setenv(name, value)
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT.replace("state: {booked: 0}\n", "locales: [en, de]\nstate: {booked: 0}\n")
                                       .replace('confirm: "Book {{ args.show }}?"', "confirm: \"{{ t('book') }}\""))
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text('book: "Book it?"\n')
    (tmp_path / "locales" / "de.yaml").write_text('book: "Buchen?"\n')
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        post(client, bf, bf.activity("act-1", "book Hamlet") | {"locale": "de-DE"})
        wait_until(lambda: bf.activities, what="the question")
        card = bf.activities[-1]["attachments"][0]["content"]
        assert card["body"][0]["text"] == "Buchen?"
        assert [a["title"] for a in card["actions"]] == ["Ja", "Nein"]
        post(client, bf, bf.activity("act-2", value={"choice": "yes"}) | {"locale": "de-DE"})
        wait_until(lambda: any("Booked Hamlet" in a.get("text", "") for a in bf.activities), what="the booking")
