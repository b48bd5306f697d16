"""Issue 34, findings 3 and 6: while a person decides, the user reads what they are told (an
approval's or a question's `tell:`, else chatrun's default in the session's locale), never the
deciders' `ask`; and every text chatrun itself shows the user has a catalog key with built-in
en/de/ar texts. A German session of bots/bakery (a big order waits for the baker) through the
real openai client against the fake OpenAI server: the library, the WebSocket (both dialects),
the HTTP API and /v1 show the user only German from chatrun, and the baker the question."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import chatrun
from chat_support import call
from chatrun.definition.loader import check_bot
from chatrun.definition.page_texts import BUILTIN
from chatrun.engine.pending import Approve
from chatrun.models.scripted import ScriptedModel
from chatrun.server.wire import written_out
from server_support import app_for_testclient, until_done
from webhook_support import OPENAI_MODEL

ROOT = Path(__file__).resolve().parents[1]
AUTH = """
tokens:
  ana-token-123: {principal: ana}
  ben-token-123: {principal: ben, roles: [baker]}
"""
ANA, BEN = {"Authorization": "Bearer ana-token-123"}, {"Authorization": "Bearer ben-token-123"}
TOLD = "Ihre Anfrage wartet auf eine Genehmigung."  # page_texts BUILTIN["de"]["tell_approval"]
ASKED = "30 Brote für eine Bestellung backen?"  # the baker's question (the bakery's de catalog)
BIG_ORDER = {"tool_calls": [{"name": "add_loaves", "arguments": {"count": 30}}]}


@pytest.fixture
def bakery(tmp_path):
    """bots/bakery as it is, with the test's model (the fake OpenAI server)."""
    shutil.copytree(ROOT / "bots" / "bakery", tmp_path / "bakery")
    path = tmp_path / "bakery" / "bot.yaml"
    path.write_text(path.read_text().replace("format: 3\n", f"format: 3\nmodel: {{{OPENAI_MODEL}}}\n"))
    return chatrun.load_bot(path)


def english_of_chatrun(text: str) -> list[str]:
    """chatrun's own English texts (those its German differs from) found in `text`."""
    def literal(en: str) -> str:  # the text's longest part between placeholders
        return max((part.split("}")[-1].strip(" .:;…") for part in en.split("{")), key=len)

    return [en for key, en in BUILTIN["en"].items()
            if en != BUILTIN["de"][key] and len(literal(en)) > 3 and literal(en) in text]


def test_a_german_user_reads_german_while_the_baker_decides_and_never_the_bakers_question(fake, bakery):
    s = bakery.session()
    s.ask_locale("de")
    fake.queue(BIG_ORDER)
    events = s.chat("Dreißig Brote bitte")
    (told,) = [e.data for e in events if e.type == "Pending" and e.audience == "user"]
    (asked,) = [e.data for e in events if e.type == "Pending" and e.audience == "operators"]
    assert told["ask"] == told["tell"] == TOLD and told["choices"] is None
    assert asked["ask"] == ASKED and asked["by"] == ["baker"]
    events = s.chat("Und?")  # queued: no model call, the user hears what they were told
    said = [e.data for e in events if e.type == "Message"]
    assert said == [f"Es wird noch gewartet: {TOLD}"]
    user_texts = [str(e.data) for e in events if e.for_user and e.type == "Message"] + [told["ask"]]
    assert not any(ASKED in text for text in user_texts)
    assert [english_of_chatrun(text) for text in user_texts if english_of_chatrun(text)] == []
    s.principal, s.roles = {"name": "ben", "roles": ["baker"]}, {"baker"}
    fake.queue({"text": "Gern, 30 Brote."})
    s.chat(Approve("p1"))
    assert s.state["loaves"] == 30


def test_a_bots_tell_and_its_catalog_replace_the_default(fake, bakery, tmp_path):
    path = tmp_path / "bakery" / "bot.yaml"
    asked = "        text: \"{{ t('order.big', count=args.count) }}\"\n"
    assert asked in path.read_text()
    path.write_text(path.read_text().replace(asked, asked + "        tell: \"{{ t('order.waits', count=args.count) }}\"\n"))
    for locale, text in (("en", "Your {count} loaves wait for the baker."), ("de", "Ihre {count} Brote warten auf den Bäcker.")):
        catalog = tmp_path / "bakery" / "locales" / f"{locale}.yaml"
        catalog.write_text(catalog.read_text().replace("  failed:", f"  waits: {text}\n  failed:", 1))
    s = chatrun.load_bot(path).session()
    s.ask_locale("de")
    fake.queue(BIG_ORDER)
    s.chat("Dreißig Brote bitte")
    events = s.chat("Und?")
    assert [e.data for e in events if e.type == "Message"] == ["Es wird noch gewartet: Ihre 30 Brote warten auf den Bäcker."]


def test_on_every_protocol_the_user_is_told_and_the_baker_is_asked(fake, bakery, tmp_path):
    (tmp_path / "auth.yaml").write_text(AUTH)
    app = app_for_testclient([bakery], f"sqlite:///{tmp_path / 's.db'}", auth=str(tmp_path / "auth.yaml"))
    de = {"Accept-Language": "de"}
    with TestClient(app) as client:
        # The WebSocket, extended dialect: the user's Pending says what they are told.
        with client.websocket_connect("/_chat/routes", headers=ANA) as ws:
            ws.send_json({"type": "Connect", "chatId": "w1", "extensions": True, "locale": "de"})
            until_done(ws)
            fake.queue(BIG_ORDER)
            ws.send_json({"type": "ChatRouteMessage", "chatId": "w1", "data": {"userMessage": "30 Brote"}})
            frames = until_done(ws)
            assert [f["data"]["ask"] for f in frames if f["type"] == "Pending"] == [TOLD]
            assert ASKED not in str(frames)
        # The Quarkus dialect: the Pending is a Message, and the "Still waiting" reply is German too.
        with client.websocket_connect("/_chat/routes", headers=ANA) as ws:
            ws.send_json({"type": "Connect", "chatId": "q1", "locale": "de"})
            until_done(ws)
            fake.queue(BIG_ORDER)
            ws.send_json({"type": "ChatRouteMessage", "chatId": "q1", "data": {"userMessage": "30 Brote"}})
            assert TOLD in [f["data"] for f in until_done(ws)]
            ws.send_json({"type": "ChatRouteMessage", "chatId": "q1", "data": {"userMessage": "Und?"}})
            assert f"Es wird noch gewartet: {TOLD}" in [f["data"] for f in until_done(ws)]
        # The HTTP API: the turn's events and the session resource; the baker reads the question.
        assert client.post("/bots/bakery/sessions", json={"id": "h1"}, headers=ANA | de).status_code == 201
        fake.queue(BIG_ORDER)
        reply = client.post("/bots/bakery/sessions/h1/messages", json={"userMessage": "30 Brote"}, headers=ANA).json()
        assert [e["data"]["ask"] for e in reply["events"] if e["type"] == "Pending"] == [TOLD]
        assert [i["ask"] for i in client.get("/bots/bakery/sessions/h1", headers=ANA).json()["pending"]] == [TOLD]
        assert [i["ask"] for i in client.get("/bots/bakery/sessions/h1/pending", headers=BEN).json()["pending"]] == [ASKED]
        # /v1: the reply's text and its chatrun.pending.
        fake.queue(BIG_ORDER)
        body = client.post("/v1/chat/completions", headers=ANA | de | {"X-Chatrun-Session": "o1"},
                           json={"model": "bakery", "messages": [{"role": "user", "content": "30 Brote"}]}).json()
        assert body["choices"][0]["message"]["content"] == TOLD
        assert [i["ask"] for i in body["chatrun"]["pending"]] == [TOLD]
        assert ASKED not in str(body)


def test_validate_warns_about_a_tell_no_one_reads_and_a_question_text_users_no_longer_see(write_bot):
    path = write_bot("""\
name: desk
format: 3
routes:
  main: {default: true, system: Desk., tools: [refund, check, age]}
tools:
  refund:
    description: Refund
    approval: {by: [user], ask: {text: Refund?, tell: Your refund waits.}}
  check:
    description: Check documents
    action:
      ask: {from: backend, text: We are checking your documents.}
  age:
    description: Ask the age
    action:
      ask: {from: user, text: How old are you?, tell: Please wait.}
""")
    diagnostics = [(d.severity, d.message) for d in check_bot(path)[1]]
    assert any(s == "warning" and "`approval.ask.tell` of tool `refund` is never shown" in m for s, m in diagnostics)
    assert any(s == "warning" and "`ask.tell` of tool `age` is never shown" in m for s, m in diagnostics)
    assert any(s == "warning" and "`ask.text` of tool `check` is the question the backend reads" in m
               for s, m in diagnostics)


@pytest.mark.parametrize("locale", ["en", "de", "ar"])
def test_every_builtin_locale_has_every_text(locale):
    assert set(BUILTIN[locale]) == set(BUILTIN["en"])
    for key, text in BUILTIN["en"].items():  # the same placeholders in each translation
        assert sorted(part.split("}")[0] for part in text.split("{")[1:]) == \
            sorted(part.split("}")[0] for part in BUILTIN[locale][key].split("{")[1:]), key


DESK = """\
name: desk
format: 3
locales: [en, de]
routes:
  main: {default: true, system: Desk., tools: [refund, age]}
tools:
  refund:
    description: Refund
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    approval: {by: [user, supervisor], ask: {text: "{{ t('refund', amount=args.amount) }}"}}
    action: {reply: Refunded.}
  age:
    description: Ask the age
    action:
      ask: {from: user, text: "{{ t('age') }}", schema: {type: integer, minimum: 18}}
      set: {state.age: "{{ result }}"}
"""


def test_a_german_user_who_decides_gets_german_buttons_a_german_hint_and_a_german_refusal(write_bot):
    path = write_bot(DESK)
    (path.parent / "locales").mkdir()
    (path.parent / "locales" / "en.yaml").write_text("refund: Refund {amount} EUR?\nage: How old are you?\n")
    (path.parent / "locales" / "de.yaml").write_text("refund: '{amount} EUR erstatten?'\nage: Wie alt sind Sie?\n")
    model = ScriptedModel([call("refund", amount=20), "Erstattet.", call("age"), "Danke."])
    s = chatrun.load_bot(path).session(model=model)
    s.ask_locale("de")
    (told,) = [e.data for e in s.chat("Erstatten") if e.type == "Pending" and e.audience == "user"]
    assert told["ask"] == "20 EUR erstatten?"  # the user decides: they read the question
    assert told["choices"] == [{"label": "Genehmigen", "value": "approve"}, {"label": "Ablehnen", "value": "reject"}]
    assert written_out(told) == "20 EUR erstatten?\n\nAntworten Sie mit genehmigen oder ablehnen."
    events = s.chat("Genehmigen")  # a button's label, typed
    assert [e.data["outcome"] for e in events if e.type == "Resolved"] == ["approved"]
    s.chat("Mein Alter")
    events = s.chat("zwölf")
    (refusal,) = [e.data for e in events if e.type == "Message"]
    assert refusal.startswith("Diese Antwort passt nicht: ") and refusal.endswith(". Wie alt sind Sie?")


QUESTIONS = """\
name: desk
format: 3
routes:
  main: {default: true, system: Desk., tools: [status, documents]}
tools:
  status:
    description: Ask the service desk
    action:
      ask: {from: operator, text: Check order A1 in the warehouse system., schema: {type: string}}
  documents:
    description: Have the documents checked
    action:
      ask: {from: backend, text: Verify passport 4711 against the register., tell: We are checking your documents.}
"""


@pytest.mark.parametrize(("tool", "question", "told"), [
    ("status", "Check order A1 in the warehouse system.", "Your request is waiting for an answer."),
    ("documents", "Verify passport 4711 against the register.", "We are checking your documents."),
])
def test_while_an_operator_or_a_backend_answers_the_user_reads_tell_never_the_question(write_bot, tool, question,
                                                                                      told):
    s = chatrun.load_bot(write_bot(QUESTIONS)).session(model=ScriptedModel([call(tool)]))
    events = s.chat("Where is my order?")
    (pending,) = [e.data for e in events if e.type == "Pending" and e.audience == "user"]
    assert pending["ask"] == told
    others = [e.data for e in events if e.type == "Pending" and e.audience != "user"]
    assert others and all(item["ask"] == question for item in others)  # those who answer read the question
    events += s.chat("Any news?")  # queued: the reply says what the user was told
    assert [e.data for e in events if e.type == "Message"][-1] == f"Still waiting: {told}"
    assert not [e for e in events if e.for_user and question in str(e.data)]
