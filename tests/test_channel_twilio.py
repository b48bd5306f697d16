"""Issue 36: the phone through Twilio ConversationRelay. Real parts: the app (TestClient's
WebSocket, and a real uvicorn server with the `websockets` client playing Twilio's side), the
real `openai` client against the fake OpenAI (streaming), and signatures computed by twilio's
own RequestValidator. The messages are the shapes of Twilio's ConversationRelay documentation
(setup, prompt, interrupt, dtmf; text and end back)."""

from __future__ import annotations

import json
import re
from html import unescape
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from twilio.request_validator import RequestValidator

from chatrun.definition.loader import check_bot
from chatrun.definition.page_texts import BUILTIN
from chatrun.server.channels.base import session_id_for
from server_support import app_for_testclient

OPENAI_MODEL = "provider: openai, name: gpt-4o-mini, max_retries: 0"  # streamed (the default)

AUTH_TOKEN = "twilio-auth-token-0123456789abcdef"
CALLER, NUMBER = "+14155550123", "+18005550100"

BOT = f"""\
name: phone
model: {{{OPENAI_MODEL}}}
env:
  TWILIO_AUTH_TOKEN: {{secret: true}}
channels:
  twilio:
    auth_token: TWILIO_AUTH_TOKEN
    greeting: Hello, this is the ticket line.
    handoff_to: "+14155550199"
state: {{booked: 0}}
routes:
  main:
    default: true
    system: "You sell tickets to {{{{ principal.name }}}}."
    tools: [book, human]
tools:
  book:
    description: Book a ticket.
    parameters: {{type: object, properties: {{show: {{type: string}}}}, required: [show]}}
    confirm: "Book {{{{ args.show }}}}?"
    action: {{set: {{state.booked: "{{{{ state.booked + 1 }}}}"}}, reply: "Booked {{{{ args.show }}}}."}}
  human:
    description: Hand the caller to a person.
    action: {{operator: {{text: Putting you through to a person.}}}}
"""


@pytest.fixture
def client(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    bot = tmp_path / "bot.yaml"
    bot.write_text(BOT)
    with TestClient(app_for_testclient([str(bot)], f"sqlite:///{tmp_path / 's.db'}")) as c:
        yield c


def signed_post(client, path, params, token=AUTH_TOKEN, base="http://testserver"):
    signature = RequestValidator(token).compute_signature(base + path, params)
    return client.post(path, content=urlencode(params), headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": signature})


def call_params(call_sid="CA0001"):
    return {"CallSid": call_sid, "AccountSid": "AC0001", "From": CALLER, "To": NUMBER, "CallStatus": "ringing",
            "Direction": "inbound"}


def relay_path(client, call_sid="CA0001") -> str:
    answer = signed_post(client, "/channels/phone/twilio", call_params(call_sid))
    assert answer.status_code == 200, answer.text
    url = unescape(re.search(r'<ConversationRelay url="([^"]+)"', answer.text).group(1))
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def setup(call_sid="CA0001"):
    return {"type": "setup", "sessionId": "VX0001", "callSid": call_sid, "from": CALLER, "to": NUMBER,
            "direction": "inbound", "customParameters": {}}


def prompt(text, last=True):
    return {"type": "prompt", "voicePrompt": text, "lang": "en-US", "last": last}


def reply(ws) -> tuple[list[str], dict]:
    """The tokens of one answer, and its closing `last` message (an `end` may follow it)."""
    tokens = []
    while True:
        message = ws.receive_json()
        assert message["type"] == "text", message
        if message["last"]:
            return tokens, message
        tokens.append(message["token"])


def test_a_forged_or_missing_signature_gets_401_and_no_call(client, fake):
    path = "/channels/phone/twilio"
    assert signed_post(client, path, call_params(), token="not-the-token").status_code == 401
    unsigned = client.post(path, content=urlencode(call_params()),
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert unsigned.status_code == 401
    tampered = call_params()
    signature = RequestValidator(AUTH_TOKEN).compute_signature("http://testserver" + path, tampered)
    tampered["From"] = "+19995550000"  # a parameter changed after signing
    forged = client.post(path, content=urlencode(tampered), headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": signature})
    assert forged.status_code == 401
    assert fake.requests == []


def test_a_signature_or_relay_token_with_characters_beyond_ascii_is_refused_not_a_500(client, fake):
    from starlette.websockets import WebSocketDisconnect

    answer = client.post("/channels/phone/twilio", content=urlencode(call_params()), headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": "sig\xe9".encode("latin-1")})
    assert answer.status_code == 401
    with pytest.raises(WebSocketDisconnect) as closed, \
            client.websocket_connect("/channels/phone/twilio/relay?token=CA0001.99999999999.%C3%A9") as ws:
        ws.receive_json()
    assert closed.value.code == 1008 and fake.requests == []


def test_the_twiml_connects_the_call_to_a_signed_relay_and_only_that_call_may_open_it(client, fake):
    answer = signed_post(client, "/channels/phone/twilio", call_params())
    assert answer.headers["content-type"].startswith("application/xml")
    assert '<Connect action="http://testserver/channels/phone/twilio/ended">' in answer.text
    assert 'welcomeGreeting="Hello, this is the ticket line."' in answer.text
    assert 'url="ws://testserver/channels/phone/twilio/relay?token=CA0001.' in answer.text
    url = unescape(re.search(r'<ConversationRelay url="([^"]+)"', answer.text).group(1))
    good = f"{urlsplit(url).path}?{urlsplit(url).query}"
    forged = re.sub(r"\.([0-9a-f]{6})", ".000000", good, count=1)
    from starlette.websockets import WebSocketDisconnect
    for path in ("/channels/phone/twilio/relay", "/channels/phone/twilio/relay?token=CA0001.99999999999.abc", forged):
        with pytest.raises(WebSocketDisconnect), client.websocket_connect(path) as ws:
            ws.receive_json()
    with client.websocket_connect(good) as ws:  # a token for CA0001 does not open another call
        ws.send_json(setup("CA9999"))
        with pytest.raises(WebSocketDisconnect):
            ws.receive_json()
    assert fake.requests == []


def refused_setup(client, path, message) -> int:
    """The close code of a relay socket whose setup is `message` (its prompt never runs)."""
    from starlette.websockets import WebSocketDisconnect
    with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect(path) as ws:
        ws.send_json(message)
        ws.send_json(prompt("What are my booked tickets?"))
        ws.receive_json()
    return closed.value.code


def test_a_relay_token_does_not_let_its_holder_choose_the_caller(client, fake, caplog):
    """The principal came from the relay's `setup`, which nobody signs: whoever held a call's
    relay URL (it sits in a URL: proxies and logs see it) could open the socket naming any number
    and be that principal (its sessions, remembered facts, limits and roles). The token binds the
    From of the signed voice webhook: a setup naming another caller, or none, is refused and
    nothing runs; the genuine setup still opens the call as its caller."""
    path = relay_path(client)
    store = client.app.state.registry.store
    victim = "+14155550999"
    with caplog.at_level("WARNING", logger="chatrun.channels"):
        assert refused_setup(client, path, {**setup(), "from": victim}) == 1008
        assert refused_setup(client, path, {k: v for k, v in setup().items() if k != "from"}) == 1008
    refusals = [r.getMessage() for r in caplog.records if "refused the relay socket" in r.getMessage()]
    assert len(refusals) == 2 and all("call CA0001" in line and "another caller" in line for line in refusals)
    assert victim not in "".join(refusals)  # (a number the socket claimed is not logged)
    assert fake.requests == []
    assert client.portal.call(store.sessions_of, f"twilio:{victim}") == []
    assert client.portal.call(store.load_session, session_id_for("phone", "twilio", "CA0001")) is None
    fake.queue({"text": "None yet."})
    with client.websocket_connect(path) as ws:  # Twilio's own setup: the caller the webhook signed
        ws.send_json(setup())
        ws.send_json(prompt("What are my booked tickets?"))
        assert "".join(reply(ws)[0]) == "None yet."
    assert fake.requests[0]["messages"][0]["content"] == f"You sell tickets to twilio:{CALLER}."


def test_a_relay_token_for_one_call_does_not_open_another(client, fake, caplog):
    """Call A's token with call B's setup (B answered too, B's caller named) is refused: B's
    session is not made, nor A's; B's own token opens B."""
    path_a = relay_path(client, "CA0001")
    path_b = relay_path(client, "CA0002")
    with caplog.at_level("WARNING", logger="chatrun.channels"):
        assert refused_setup(client, path_a, setup("CA0002")) == 1008
    assert any("call CA0001: refused the relay socket" in r.getMessage() and "names another call" in r.getMessage()
               for r in caplog.records)
    store = client.app.state.registry.store
    for call_sid in ("CA0001", "CA0002"):
        assert client.portal.call(store.load_session, session_id_for("phone", "twilio", call_sid)) is None
    assert fake.requests == []
    fake.queue({"text": "Hello B."})
    with client.websocket_connect(path_b) as ws:
        ws.send_json(setup("CA0002"))
        ws.send_json(prompt("Hello?"))
        assert "".join(reply(ws)[0]) == "Hello B."


def test_a_call_with_two_prompts_gets_streamed_tokens_as_its_caller(client, fake):
    fake.queue({"chunks": ["Two ", "tickets ", "left."]}, {"chunks": ["Yes, ", "tonight."]})
    with client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Any tickets", last=False))
        ws.send_json(prompt(" for the concert?"))
        # The first token at once; those that follow within 50 ms together (engine/stream_chunks.py).
        tokens = reply(ws)[0]
        assert tokens[0] == "Two " and "".join(tokens) == "Two tickets left."
        ws.send_json(prompt("Is it tonight?"))
        tokens = reply(ws)[0]
        assert tokens[0] == "Yes, " and "".join(tokens) == "Yes, tonight."
    first, second = fake.requests
    assert first["messages"][0]["content"] == f"You sell tickets to twilio:{CALLER}."
    assert first["messages"][-1] == {"role": "user", "content": "Any tickets for the concert?"}
    assert [m["content"] for m in second["messages"][1:]] == [
        "Any tickets for the concert?", "Two tickets left.", "Is it tonight?"]  # one session per call
    store = client.app.state.registry.store  # a call's session says so: its follow-ups are refused (engine/follow_up.py)
    record = client.portal.call(store.load_session, session_id_for("phone", "twilio", "CA0001"))
    assert record.snapshot["meta"]["call"] == "CA0001", record.snapshot.get("meta")


def test_an_interrupt_cancels_the_turn_and_the_next_prompt_says_what_was_heard(client, fake):
    long = [f"word{i} " for i in range(200)]
    fake.queue({"chunks": long, "chunk_delay": 0.2}, {"text": "Sure, the theatre."})
    with client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Tell me everything."))
        assert ws.receive_json() == {"type": "text", "token": "word0 ", "last": False}
        ws.send_json({"type": "interrupt", "utteranceUntilInterrupt": "word0",
                      "durationUntilInterruptMs": 400})
        ws.send_json(prompt("Actually, the theatre."))
        tokens = []
        while not (message := ws.receive_json())["last"]:
            tokens.append(message["token"])
        assert "".join(tokens).endswith("Sure, the theatre.")  # (chunks already on the socket may come first)
    messages = fake.requests[-1]["messages"]
    # The interrupted turn rolled back: the history has no turn of it, only the note in the next prompt.
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[-1]["content"] == ('(The caller asked "Tell me everything."; you began to answer and they '
                                       'interrupted you after hearing: "word0".)\nActually, the theatre.')


def test_dtmf_digits_answer_a_confirmation_read_aloud(client, fake):
    fake.queue({"tool_calls": [{"name": "book", "arguments": {"show": "Hamlet"}}]}, {"text": "All set."})
    with client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Book Hamlet"))
        spoken = "".join(reply(ws)[0])
        assert "Book Hamlet?" in spoken
        assert re.search(r"Say or press 1 for \w+, 2 for \w+\.", spoken), spoken
        yes = re.search(r"(\d) for Yes", spoken).group(1)
        ws.send_json({"type": "dtmf", "digit": yes})
        assert "".join(reply(ws)[0]).strip() == "All set."
    assert fake.requests[-1]["messages"][-1]["content"] == "Booked Hamlet."  # the tool ran: the digit said yes


def test_an_operator_hand_over_ends_the_relay_with_handoff_data_and_dials_the_number(client, fake):
    fake.queue({"tool_calls": [{"name": "human", "arguments": {}}]})
    with client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("A person, please"))
        assert "".join(reply(ws)[0]).strip() == "Putting you through to a person."
        end = ws.receive_json()
    assert end["type"] == "end"
    handoff = json.loads(end["handoffData"])
    assert handoff == {"reason": "operator", "to": "+14155550199"}
    ended = signed_post(client, "/channels/phone/twilio/ended", {
        **call_params(), "HandoffData": end["handoffData"], "SessionStatus": "ended"})
    assert ended.status_code == 200
    assert "<Dial>+14155550199</Dial>" in ended.text
    forged = signed_post(client, "/channels/phone/twilio/ended", {**call_params(), "HandoffData": "{}"},
                         token="wrong")
    assert forged.status_code == 401


def test_a_prompt_twilio_sends_again_after_a_dropped_socket_runs_once(client, fake):
    fake.queue({"chunks": ["Two ", "left."]}, {"text": "Done."})
    path = relay_path(client)
    with client.websocket_connect(path) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Any tickets?"))
        assert reply(ws)[0] == ["Two ", "left."]
    with client.websocket_connect(path) as ws:  # Twilio reconnects the same call
        ws.send_json(setup())
        ws.send_json(prompt("Any tickets?"))
        assert "".join(reply(ws)[0]).strip() == "Two left."  # answered from the committed turn
        assert len(fake.requests) == 1
        ws.send_json(prompt("Any tickets?"))  # said again on the new socket: a new prompt, run
        assert "".join(reply(ws)[0]).strip() == "Done."
    # The history holds the first prompt's turn once, then the new one.
    assert [m["content"] for m in fake.requests[-1]["messages"][1:]] == ["Any tickets?", "Two left.", "Any tickets?"]


def test_a_voice_webhook_replayed_before_the_calls_first_prompt_gets_no_relay_token(client, fake):
    """The 409 looked for the call's session, which its first prompt makes: a captured webhook
    replayed between the call's answer and its first prompt still got a relay token. The first
    webhook claims the CallSid in the store: the same signed webhook posted again gets 409 and
    no token, however soon; the call's own relay URL still opens, and a new call is answered."""
    fake.queue({"text": "Two left."})
    path = relay_path(client)
    replayed = signed_post(client, "/channels/phone/twilio", call_params())
    assert replayed.status_code == 409, replayed.text
    assert "ConversationRelay" not in replayed.text and "token=" not in replayed.text
    assert "CA0001 is already connected" in replayed.json()["message"]
    with client.websocket_connect(path) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Any tickets?"))
        assert "".join(reply(ws)[0]) == "Two left."
    assert relay_path(client, "CA0002")  # another call is answered


def test_a_voice_webhook_replayed_after_the_calls_first_prompt_gets_no_relay_token(client, fake):
    """A captured signed webhook posted again would mint a fresh relay token for the CallSid and
    let whoever holds it go on in the call's session: it is refused (409), while Twilio's
    reconnects (the same relay URL) still work."""
    fake.queue({"text": "Two left."})
    path = relay_path(client)
    with client.websocket_connect(path) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Any tickets?"))
        assert "".join(reply(ws)[0]) == "Two left."
    replayed = signed_post(client, "/channels/phone/twilio", call_params())
    assert replayed.status_code == 409
    assert "ConversationRelay" not in replayed.text and "CA0001 is already connected" in replayed.text
    with client.websocket_connect(path) as ws:  # Twilio reconnecting the live call: its URL still opens
        ws.send_json(setup())
        ws.send_json(prompt("Any tickets?"))
        assert "".join(reply(ws)[0]).strip() == "Two left."
    assert len(fake.requests) == 1
    assert relay_path(client, "CA0002")  # another call is answered


def test_a_socket_dropped_mid_turn_lets_the_turn_commit_and_the_prompt_sent_again_replays_it(client, fake):
    chunks = [f"w{i} " for i in range(10)]
    fake.queue({"chunks": chunks, "chunk_delay": 0.1})
    path = relay_path(client)
    with client.websocket_connect(path) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Read me the list."))
        assert ws.receive_json()["token"] == "w0 "
    # Twilio lost the socket after the first token and opens another one for the same call.
    with client.websocket_connect(path) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Read me the list."))
        assert "".join(reply(ws)[0]).strip() == "".join(chunks).strip()  # the whole answer, replayed
    assert len(fake.requests) == 1


@pytest.mark.slow
def test_a_real_server_and_a_websockets_client_playing_twilio(tmp_path, fake, monkeypatch):
    from websockets.sync.client import connect

    from chatrun.server import create_app
    from server_support import ThreadServer

    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    bot = tmp_path / "bot.yaml"
    bot.write_text(BOT)
    fake.queue({"chunks": ["Hello ", "there."]})
    app = create_app([str(bot)], f"sqlite:///{tmp_path / 's.db'}")
    with ThreadServer(app) as server, httpx.Client(base_url=server.url) as http:
        path = relay_path_at(http, server.url)
        with connect(server.ws_url + path) as ws:
            ws.send(json.dumps(setup()))
            ws.send(json.dumps(prompt("Hi")))
            tokens = []
            while not (message := json.loads(ws.recv(timeout=60)))["last"]:
                tokens.append(message["token"])
    assert tokens == ["Hello ", "there."]


def relay_path_at(http, base) -> str:
    answer = signed_post(http, "/channels/phone/twilio", call_params(), base=base)
    assert answer.status_code == 200, answer.text
    parts = urlsplit(unescape(re.search(r'<ConversationRelay url="([^"]+)"', answer.text).group(1)))
    return f"{parts.path}?{parts.query}"


def test_the_validator_names_an_undeclared_token_and_a_hand_over_without_a_number(tmp_path):
    from chatrun.definition.loader import check_bot

    bot = tmp_path / "bot.yaml"
    bot.write_text(BOT.replace("auth_token: TWILIO_AUTH_TOKEN", "auth_token: TWILIO_AUTH_TOKN")
                   .replace('    handoff_to: "+14155550199"\n', ""))
    _config, found = check_bot(bot)
    messages = {(d.severity, d.message) for d in found}
    assert any(severity == "error" and "`env.TWILIO_AUTH_TOKN`" in text and "TWILIO_AUTH_TOKEN" in text
               for severity, text in messages), messages
    assert any(severity == "warning" and "tool `human`" in text and "`handoff_to:`" in text
               for severity, text in messages), messages
    lines = {d.message: d.line for d in found}
    assert all(line and line > 1 for line in lines.values()), lines  # each at its place in the file
    bot.write_text(BOT)
    assert [d for d in check_bot(bot)[1] if d.path.startswith("channels")] == []


GUARDRAILS = """\
guardrails:  # the output stage only: what the caller hears is not saved by the store's redaction
  - {name: cards, pii: [card], stages: [output], outcome: redact, release: sentence}
  - {name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: block, release: sentence,
     message: I cannot share that.}
"""


def test_a_caller_never_hears_a_guarded_word_and_hears_each_sentence_once(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(BOT.replace("state: {booked: 0}\n", GUARDRAILS + "state: {booked: 0}\n"))
    fake.queue({"chunks": ["Thanks. Your card ", "4111 1111 ", "1111 1111 is ", "saved. Bye"]},
               {"chunks": ["Sure. The price list ", "is for internal ", "only. Ask me later."]})
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client, \
            client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        heard = []
        for said in ("save my card", "prices?"):
            ws.send_json(prompt(said))
            heard.append("".join(reply(ws)[0]))
    assert heard == ["Thanks. Your card [card] is saved. Bye ", "Sure. I cannot share that. "]


def test_a_model_failing_mid_stream_behind_a_held_reply_is_heard_once_from_its_fallback(tmp_path, fake, monkeypatch):
    """The phone door of tests/test_doors_fallback.py: the reply held whole by an output guard,
    the model drops its stream midway, its fallback answers: the caller hears that answer once,
    never a token of the failed one."""
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    held = "guardrails:\n  - {name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: block}\n"
    bot = BOT.replace("max_retries: 0", "max_retries: 0, fallback: [{name: gpt-4o}]")
    (tmp_path / "bot.yaml").write_text(bot.replace("state: {booked: 0}\n", held + "state: {booked: 0}\n"))
    fake.queue_for("gpt-4o-mini", {"chunks": ["Zorblax says ", "half a sen"], "disconnect": True})
    fake.queue_for("gpt-4o", {"chunks": ["The fallback ", "answers whole."]})
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client, \
            client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("hello"))
        tokens, last = reply(ws)
    assert "".join(tokens) + last["token"] == "The fallback answers whole. "  # the last token ends the turn
    assert [r["model"] for r in fake.requests] == ["gpt-4o-mini", "gpt-4o"]


def test_a_prompt_over_max_message_chars_runs_no_turn_and_the_caller_hears_the_limit(tmp_path, fake, monkeypatch):
    """As on every door, a caller's prompt over --max-message-chars runs no turn; the caller
    hears why (a call has no outbox: its answer goes down the socket), then goes on."""
    from chatrun.server.wire import ServerLimits

    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(BOT)
    fake.queue({"chunks": ["Two ", "left."]})
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             limits=ServerLimits(max_message_chars=20))
    with TestClient(app) as client, client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Any tickets for the concert tonight?"))
        assert reply(ws)[0] == ["That was too long for me; please say it in fewer words."]
        ws.send_json(prompt("Any tickets?"))
        assert "".join(reply(ws)[0]) == "Two left."
    assert [r["messages"][-1]["content"] for r in fake.requests] == ["Any tickets?"]


def test_a_call_past_the_callers_session_limit_hears_why_instead_of_silence(tmp_path, fake, monkeypatch):
    """`serve --max-sessions-per-principal 1`: a caller who has a call (its session) calls again.
    The second call's session is refused and the caller heard silence; now they hear why."""
    from chatrun.server.sessions import SessionSettings

    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "auth.yaml").write_text("tokens: {op-token-123: {principal: olga, roles: [operators]}}\n")
    fake.queue({"chunks": ["Hello ", "there."]})
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             auth=str(tmp_path / "auth.yaml"), sessions=SessionSettings(max_sessions_per_principal=1))
    with TestClient(app) as client:
        heard_by_call = []
        for call_sid in ("CA0001", "CA0002"):
            with client.websocket_connect(relay_path(client, call_sid)) as ws:
                ws.send_json(setup(call_sid))
                ws.send_json(prompt("Hello?"))
                heard_by_call.append("".join(reply(ws)[0]))
    assert heard_by_call == ["Hello there.", BUILTIN["en"]["channel_too_many_sessions"].replace("{limit}", "1")]
    assert len(fake.requests) == 1


def test_a_prompt_in_parts_is_refused_once_its_parts_are_over_max_message_chars(tmp_path, fake, monkeypatch,
                                                                                 caplog):
    """`last: false` parts were joined without limit until the prompt's end: they are refused as
    too long as soon as they are over --max-message-chars, the prompt's later parts dropped."""
    from chatrun.server.wire import ServerLimits

    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(BOT)
    fake.queue({"text": "Two left."})
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             limits=ServerLimits(max_message_chars=20))
    with caplog.at_level("WARNING", logger="chatrun.channels"), TestClient(app) as client, \
            client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        for part in ("Any tickets ", "for the concert ", "tonight? " * 1000):  # over 20 at the second
            ws.send_json(prompt(part, last=False))
        ws.send_json(prompt("and more", last=True))
        ws.send_json(prompt("Any tickets?"))
        assert reply(ws)[0] == [BUILTIN["en"]["phone_too_long"]]
        assert "".join(reply(ws)[0]) == "Two left."
    assert [r["messages"][-1]["content"] for r in fake.requests] == ["Any tickets?"]
    # Refused at the part that went over (27 characters kept), not after 9000 more were joined.
    assert [r.getMessage().split("a prompt refused: ", 1)[1] for r in caplog.records if "a prompt refused" in r.getMessage()] \
        == ["userMessage of 27 characters is over the limit of 20 (--max-message-chars): send a shorter one"]


def test_a_prompt_is_measured_by_the_callers_words_and_a_refused_one_keeps_the_interrupts_note(
        tmp_path, fake, monkeypatch):
    """The limit is on what the caller said, not on chatrun's note of an interrupt before it; a
    prompt refused as too long runs no turn and loses nothing (the note waits for the next prompt),
    and the caller speaking over the notice is no answer of the model's to tell it about."""
    from chatrun.server.wire import ServerLimits

    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(BOT)
    fake.queue({"chunks": [f"word{i} " for i in range(200)], "chunk_delay": 0.2}, {"text": "Sure, the theatre."})
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             limits=ServerLimits(max_message_chars=30))
    with TestClient(app) as client, client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Tell me everything."))
        assert ws.receive_json()["token"] == "word0 "
        ws.send_json({"type": "interrupt", "utteranceUntilInterrupt": "word0"})
        ws.send_json(prompt("And the concert tonight, the one at eight?"))  # 42 characters: refused
        while (message := ws.receive_json())["token"] != "That was too long for me; please say it in fewer words.":
            assert not message["last"], message  # (chunks of the cancelled answer already on the socket)
        assert ws.receive_json() == {"type": "text", "token": "", "last": True}
        ws.send_json({"type": "interrupt", "utteranceUntilInterrupt": "That was too long"})
        ws.send_json(prompt("Actually, the theatre."))  # 22 characters, 130 with the note
        assert "".join(reply(ws)[0]).strip() == "Sure, the theatre."
    assert len(fake.requests) == 2
    assert [m["content"] for m in fake.requests[-1]["messages"][1:]] == [
        '(The caller asked "Tell me everything."; you began to answer and they interrupted you after hearing: '
        '"word0".)\nActually, the theatre.']


LOCALE_BOT = BOT.replace("state: {booked: 0}\n", "locales: [en, de]\nstate: {booked: 0}\n").replace(
    'confirm: "Book {{ args.show }}?"', "confirm: \"{{ t('book', show=args.show) }}\"")


@pytest.mark.parametrize(("lang", "asked", "offered"), [
    ("de-DE", "Hamlet buchen?", "Sagen oder drücken Sie 1 für Ja, 2 für Nein."),
    ("en-US", "Book Hamlet?", "Say or press 1 for Yes, 2 for No."),
])
def test_a_caller_hears_the_digits_offered_in_the_calls_language(tmp_path, fake, monkeypatch, lang, asked, offered):
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(LOCALE_BOT)
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text('book: "Book {show}?"\n')
    (tmp_path / "locales" / "de.yaml").write_text('book: "{show} buchen?"\n')
    fake.queue({"tool_calls": [{"name": "book", "arguments": {"show": "Hamlet"}}]}, {"text": "Gebucht."})
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client, \
            client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json({**prompt("Hamlet, bitte"), "lang": lang})
        assert "".join(reply(ws)[0]) == f"{asked} {offered} "
        ws.send_json({"type": "dtmf", "digit": "1"})
        assert "".join(reply(ws)[0]).strip() == "Gebucht."
    assert fake.requests[-1]["messages"][-1]["content"] == "Booked Hamlet."  # 1: yes, in either language


@pytest.mark.parametrize(("lang", "own", "heard"), [
    ("de-DE", False, "Das war zu lang für mich; bitte sagen Sie es mit weniger Worten."),
    ("en-US", False, "That was too long for me; please say it in fewer words."),
    ("de-DE", True, "Zu lang, fürchte ich: bitte in weniger Worten."),
])
def test_a_caller_hears_the_phones_own_too_long_text_in_the_calls_language(tmp_path, fake, monkeypatch, lang, own,
                                                                            heard):
    """The phone's notice said "Please send a shorter one", written for a chat, odd when spoken:
    a caller hears `phone_too_long`, in the call's language, which a bot's catalog replaces."""
    from chatrun.server.wire import ServerLimits

    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(LOCALE_BOT)
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text('book: "Book {show}?"\n'
                                                  + ('page.phone_too_long: "Too long."\n' if own else ""))
    (tmp_path / "locales" / "de.yaml").write_text('book: "{show} buchen?"\n'
                                                  + (f'page.phone_too_long: "{heard}"\n' if own else ""))
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             limits=ServerLimits(max_message_chars=20))
    with TestClient(app) as client, client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json({**prompt("Karten für das Konzert heute Abend?"), "lang": lang})
        assert reply(ws)[0] == [heard]
    assert fake.requests == []


def test_a_prompt_after_an_interrupt_sent_again_on_a_new_socket_replays_its_turn(client, fake):
    """The prompt that carried an interrupt's note is still the caller's words: Twilio sending it
    again on a new socket (the first dropped mid-turn) is answered from its committed turn."""
    fake.queue({"chunks": [f"word{i} " for i in range(200)], "chunk_delay": 0.2},
               {"chunks": [f"w{i} " for i in range(10)], "chunk_delay": 0.1})
    path = relay_path(client)
    with client.websocket_connect(path) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Tell me everything."))
        assert ws.receive_json()["token"] == "word0 "
        ws.send_json({"type": "interrupt", "utteranceUntilInterrupt": "word0"})
        ws.send_json(prompt("Just the theatre."))
        while ws.receive_json()["token"] != "w0 ":
            pass  # (chunks of the cancelled answer already on the socket)
    with client.websocket_connect(path) as ws:  # Twilio lost the socket and sends the prompt again
        ws.send_json(setup())
        ws.send_json(prompt("Just the theatre."))
        assert "".join(reply(ws)[0]).strip() == "".join(f"w{i} " for i in range(10)).strip()
    assert len(fake.requests) == 2  # the interrupted turn's, and one for the prompt sent twice


SUPERVISED = BOT.replace("tools: [book, human]", "tools: [book, human, refund]") + """\
  refund:
    description: Refund the caller.
    parameters: {type: object, properties: {amount: {type: integer}}, required: [amount]}
    approval: {by: [supervisor], ask: {text: "Refund {{ args.amount }}?"}}
    action: {reply: "Refunded {{ args.amount }}."}
"""


def test_a_supervisors_decision_made_while_the_caller_waits_is_heard_at_the_next_prompt(tmp_path, fake, monkeypatch):
    """What a turn the caller did not send said to them (a supervisor's decision, here) reaches the
    caller as it reaches a user on every other channel: said before the answer to their next prompt,
    once (a call has no outbox)."""
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(SUPERVISED)
    (tmp_path / "auth.yaml").write_text("tokens:\n  sam-token-123: {principal: sam, roles: [supervisor]}\n")
    fake.queue({"tool_calls": [{"name": "refund", "arguments": {"amount": 80}}]}, {"text": "Your money is on its way."},
               {"text": "Anything else?"}, {"text": "Goodbye."})
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             auth=str(tmp_path / "auth.yaml"))
    sam, sid = {"Authorization": "Bearer sam-token-123"}, session_id_for("phone", "twilio", "CA0001")
    with TestClient(app) as client, client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Refund my 80 dollars."))
        assert "".join(reply(ws)[0]).strip() == "Your request is waiting for approval."
        [item] = client.get(f"/bots/phone/sessions/{sid}/pending", headers=sam).json()["pending"]
        decided = client.post(f"/bots/phone/sessions/{sid}/pending/{item['id']}", json={"decision": "approve"},
                              headers=sam)
        assert decided.status_code == 200, decided.text
        ws.send_json(prompt("Hello?"))
        assert "".join(reply(ws)[0]).strip() == "Your money is on its way. Anything else?"
        ws.send_json(prompt("No, thanks."))
        assert "".join(reply(ws)[0]).strip() == "Goodbye."  # said once


def test_an_operators_written_message_to_a_phone_caller_is_refused_and_nothing_is_sent(tmp_path, fake, monkeypatch):
    """A caller handed over is put through to `handoff_to` (or hung up): the relay that could say a
    written message is over, and a call has no outbox, so an operator's message from the inbox
    would go nowhere while the inbox showed it sent. It is refused (422 InvalidDecision, naming the
    session and what to do), nothing is committed, and the takeover and release still work."""
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "auth.yaml").write_text("tokens:\n  olga-token-123: {principal: olga, roles: [operators]}\n")
    app = app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}",
                             auth=str(tmp_path / "auth.yaml"))
    olga, sid = {"Authorization": "Bearer olga-token-123"}, session_id_for("phone", "twilio", "CA0001")
    fake.queue({"tool_calls": [{"name": "human", "arguments": {}}]})
    with TestClient(app) as client:
        with client.websocket_connect(relay_path(client)) as ws:
            ws.send_json(setup())
            ws.send_json(prompt("A person, please"))
            reply(ws)
            assert ws.receive_json()["type"] == "end"  # put through to handoff_to: the relay is over
        base = f"/bots/phone/sessions/{sid}"
        assert client.post(f"{base}/takeover", json={}, headers=olga).status_code == 200
        turns = client.get(base, headers=olga).json()["turn"]
        said = client.post(f"{base}/operator/messages", json={"text": "Hi, Olga here."}, headers=olga)
        assert said.status_code == 422, said.text
        assert said.json()["error"] == "InvalidDecision"
        assert sid in said.json()["message"] and "phone call" in said.json()["message"]
        assert "handoff_to" in said.json()["message"]
        assert client.get(base, headers=olga).json()["turn"] == turns  # nothing committed, nothing queued
        assert client.post(f"{base}/release", json={}, headers=olga).status_code == 200


@pytest.mark.parametrize("withheld", ["anonymous", "+266696687", "Restricted", ""])
def test_callers_whose_number_is_withheld_are_each_a_principal_of_their_call_with_no_roles(
        tmp_path, fake, monkeypatch, withheld):
    from chatrun.server.auth import AuthFileWarning

    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    bot = tmp_path / "bot.yaml"
    bot.write_text(BOT.replace("{{ principal.name }}.", "{{ principal.name }} ({{ principal.roles | join(',') }})."))
    auth = tmp_path / "auth.yaml"
    auth.write_text("principals: {'twilio:anonymous': {roles: [vip]}, 'twilio:+14155550123': {roles: [vip]}}\n")
    fake.queue({"text": "Hello A."}, {"text": "Hello B."})
    with pytest.warns(AuthFileWarning, match=r"principals\.twilio:anonymous: gives its roles to no one"):
        app = app_for_testclient([str(bot)], f"sqlite:///{tmp_path / 's.db'}", auth=str(auth))
    with TestClient(app) as client:
        for call_sid in ("CA0001", "CA0002"):  # two callers, both withheld, through the real relay socket
            params = {**call_params(call_sid), "From": withheld}
            answer = signed_post(client, "/channels/phone/twilio", params)
            parts = urlsplit(unescape(re.search(r'<ConversationRelay url="([^"]+)"', answer.text).group(1)))
            with client.websocket_connect(f"{parts.path}?{parts.query}") as ws:
                ws.send_json({**setup(call_sid), "from": withheld})
                ws.send_json(prompt("Hello?"))
                reply(ws)
    systems = [request["messages"][0]["content"] for request in fake.requests]
    assert systems == ["You sell tickets to twilio:anonymous:CA0001 ().",
                       "You sell tickets to twilio:anonymous:CA0002 ()."]  # never one shared principal


SPEAK_BOT = f"""\
name: phone
model: {{{OPENAI_MODEL}}}
env:
  TWILIO_AUTH_TOKEN: {{secret: true}}
channels:
  twilio:
    auth_token: TWILIO_AUTH_TOKEN
locales: LOCALES
state: {{locale: null}}
routes:
  main:
    default: true
    system: "{{{{ t('prompt') }}}}"
    tools: [speak]
tools:
  speak:
    description: Switch the language you answer in.
    parameters: {{type: object, properties: {{language: {{type: string, enum: [en, de]}}}}, required: [language]}}
    action: {{set: {{state.locale: "{{{{ args.language }}}}"}}}}
"""


def heard(ws) -> list[dict]:
    """Every message of one answer up to its closing `last`: `language` messages and tokens."""
    messages = []
    while not (message := ws.receive_json()).get("last"):
        messages.append(message)
    return messages


def _speak_app(tmp_path, monkeypatch, locales: str) -> TestClient:
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(SPEAK_BOT.replace("LOCALES", locales))
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text("prompt: You sell tickets.\n")
    (tmp_path / "locales" / "de.yaml").write_text("prompt: Du verkaufst Karten.\n")
    return TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}"))


GERMAN = {"type": "language", "ttsLanguage": "de-DE", "transcriptionLanguage": "de-DE"}


def test_a_bot_that_switches_language_mid_call_switches_twilios_voice_and_ear_before_it_speaks(
        tmp_path, fake, monkeypatch):
    """The bot's `state.locale` switched the text to German while Twilio went on speaking (and
    hearing) the call's English: the German reply was read by an English voice. Twilio now gets
    ConversationRelay's `language` message, with the locale's likely region (CLDR: de is de-DE),
    before the first word in the new language, and once: the next prompt comes in that language."""
    fake.queue({"tool_calls": [{"name": "speak", "arguments": {"language": "de"}}]}, {"text": "Gern, auf Deutsch."},
               {"text": "Zwei Karten, gern."})
    with _speak_app(tmp_path, monkeypatch, "[en, de]") as client, client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json(prompt("Können wir Deutsch sprechen?"))  # Twilio heard it as en-US: the session is en
        said = heard(ws)
        assert said[0] == GERMAN and "".join(m["token"] for m in said[1:]).strip() == "Gern, auf Deutsch."
        ws.send_json({**prompt("Zwei Karten"), "lang": "de-DE"})
        assert {m["type"] for m in heard(ws)} == {"text"}  # Twilio speaks German already: no switch
    assert fake.requests[-1]["messages"][0]["content"] == "Du verkaufst Karten."


@pytest.mark.parametrize(("lang", "switched"), [("en-US", [GERMAN]), ("de-AT", [])])
def test_a_bot_whose_only_locale_twilio_does_not_speak_switches_it_before_its_first_word(
        tmp_path, fake, monkeypatch, lang, switched):
    """A German-only bot on a call Twilio set up in English: the session speaks German (its only
    locale), so Twilio is told to before the first reply; a call in Austrian German stays as it is."""
    fake.queue({"text": "Guten Tag."})
    with _speak_app(tmp_path, monkeypatch, "[de]") as client, client.websocket_connect(relay_path(client)) as ws:
        ws.send_json(setup())
        ws.send_json({**prompt("Hallo"), "lang": lang})
        said = heard(ws)
        assert said[:len(switched)] == switched
        assert "".join(m["token"] for m in said[len(switched):]).strip() == "Guten Tag."



@pytest.mark.parametrize(("tags", "language"), [(["de"], 'language="de-DE"'), (["en", "de"], 'language="en-US"'),
                                                (["de-AT", "en"], 'language="de-AT"'), (None, None)])
def test_the_twiml_sets_twilios_language_to_the_bots_first_locale(tmp_path, fake, monkeypatch, tags, language):
    """Twilio heard the first prompt of a German bot's call in its default English (and said the
    greeting with an English voice): the TwiML names the bot's first locale, with its likely
    region, so the caller's first words are heard in it. A bot without `locales:` leaves Twilio's
    own setting."""
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    if tags is None:
        (tmp_path / "bot.yaml").write_text(BOT)
    else:
        (tmp_path / "bot.yaml").write_text(SPEAK_BOT.replace("LOCALES", f"[{', '.join(tags)}]")
                                           .replace("enum: [en, de]", f"enum: [{tags[0]}]"))
        (tmp_path / "locales").mkdir()
        for tag in tags:
            (tmp_path / "locales" / f"{tag}.yaml").write_text("prompt: Hi.\n")
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        twiml = signed_post(client, "/channels/phone/twilio", call_params()).text
    assert re.findall(r'language="[^"]*"', twiml) == ([language] if language else [])


def test_the_greeting_is_the_bots_page_phone_greeting_in_its_first_locale(tmp_path, fake, monkeypatch):
    """The welcome greeting was the channel's one `greeting:` whatever the bot's language: a German
    bot's caller heard English before their first word. The bot's `page.phone_greeting` in its first
    locale is said (Twilio hears that locale too); the channel's `greeting:` stays for a bot with none."""
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(SPEAK_BOT.replace("LOCALES", "[de, en]").replace("enum: [en, de]", "enum: [de]")
                                       .replace("auth_token: TWILIO_AUTH_TOKEN", "auth_token: TWILIO_AUTH_TOKEN\n"
                                                "    greeting: Hello, this is the ticket line."))
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "de.yaml").write_text("prompt: Hallo.\npage:\n  phone_greeting: Guten Tag, hier ist die Kartenhotline.\n")
    (tmp_path / "locales" / "en.yaml").write_text("prompt: Hi.\npage:\n  phone_greeting: Hello, this is the ticket line.\n")
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        twiml = signed_post(client, "/channels/phone/twilio", call_params()).text
    assert re.findall(r'welcomeGreeting="[^"]*"', twiml) == ['welcomeGreeting="Guten Tag, hier ist die Kartenhotline."']
    assert 'language="de-DE"' in twiml


def test_a_plain_greeting_in_a_bot_with_locales_is_warned_of_and_a_t_greeting_is_said_in_the_first_locale(
        tmp_path, fake, monkeypatch):
    """`chatrun validate` said nothing of a bot with `locales:` whose phone `greeting:` is plain
    text: the bot's every caller heard it as written, whatever the bot's languages. It is warned
    of at its line, saying what to write (`{{ t('key') }}`, or the catalogs' `page.phone_greeting`,
    which is said instead and silences it); and a greeting written so, which failed each call's
    TwiML (`t()` had no catalogs there), is said in the bot's first locale."""
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    greeting = "auth_token: TWILIO_AUTH_TOKEN\n    greeting: GREETING"
    bot = SPEAK_BOT.replace("LOCALES", "[de, en]").replace("enum: [en, de]", "enum: [de]") \
        .replace("auth_token: TWILIO_AUTH_TOKEN", greeting)
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "de.yaml").write_text("prompt: Hallo.\nhello: Guten Tag, hier ist die Kartenhotline.\n")
    (tmp_path / "locales" / "en.yaml").write_text("prompt: Hi.\nhello: Hello, this is the ticket line.\n")

    def greeting_warnings(text: str) -> list[tuple[int, str]]:
        (tmp_path / "bot.yaml").write_text(bot.replace("GREETING", text))
        return [(d.line, d.message) for d in check_bot(tmp_path / "bot.yaml")[1] if "greeting" in d.message]

    assert greeting_warnings("Hello, this is the ticket line.") == [(8, (
        "`channels.twilio.greeting` is sent to the user untranslated: the bot declares `locales:`, so write it as "
        "`{{ t('key') }}` with the key in each catalog (docs/i18n.md)"))]
    for tag, said in (("de", "Guten Tag."), ("en", "Hello.")):
        (tmp_path / "locales" / f"{tag}.yaml").write_text(f"prompt: Hi.\nhello: Hi.\npage:\n  phone_greeting: {said}\n")
    assert greeting_warnings("Hello, this is the ticket line.") == []  # page.phone_greeting is said instead
    for tag, said in (("de", "Guten Tag, hier ist die Kartenhotline."), ("en", "Hello, this is the ticket line.")):
        (tmp_path / "locales" / f"{tag}.yaml").write_text(f"prompt: Hi.\nhello: {said}\n")
    assert greeting_warnings("\"{{ t('hello') }}\"") == []
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
        twiml = signed_post(client, "/channels/phone/twilio", call_params()).text
    assert re.findall(r'welcomeGreeting="[^"]*"', twiml) == ['welcomeGreeting="Guten Tag, hier ist die Kartenhotline."']
