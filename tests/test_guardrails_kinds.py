"""The whole-text guardrail kinds (issue 37, docs/guardrails.md): `moderation` (the bot's
endpoint's `/moderations`, through the real `openai` client against chatrun.testing.fake_openai)
and `languages` (offline, py3langid); their validator checks at file:line."""

from __future__ import annotations

import json
import logging

import pytest

import chatrun
from chatrun.definition import languages
from chatrun.definition.loader import check_bot
from chatrun.engine import language_id

MODERATED = """
name: moderated
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: true}
guardrails:
  - {name: cards, pii: [card], stages: [input], outcome: redact}
  - name: abuse
    moderation: {categories: [harassment, hate], on_error: %(on_error)s, timeout: %(timeout)s}
    stages: [input, output]
    outcome: block
    release: %(release)s
    message: Let us keep this friendly.
routes:
  main: {default: true, system: You help.}
"""


def moderated_bot(write_bot, on_error="block", release="reply", window=None, timeout=30):
    text = MODERATED % {"on_error": on_error, "release": release, "timeout": timeout}
    if window is not None:
        text = text.replace(f"timeout: {timeout}}}", f"timeout: {timeout}, window: {window}}}")
    return chatrun.load_bot(write_bot(text))


def user_events(events):
    return [(e.type, e.data) for e in events if e.audience == "user" and e.type in ("Stream", "Message")]


def guardrail_events(events):
    return [e.data for e in events if e.type == "Guardrail"]


def moderated_inputs(fake):
    return [body["input"] for body in fake.moderation_requests]


def test_a_flagged_input_is_blocked_before_any_model_reads_it(fake, write_bot):
    fake.flag_word("idiot", "harassment", 0.97)
    s = moderated_bot(write_bot).session()
    events = s.chat("you idiot, my card is 4111 1111 1111 1111")
    assert user_events(events) == [("Message", "Let us keep this friendly.")]
    assert fake.requests == []  # no chat completion: the model never read it
    # the endpoint read the text as the card guard redacted it, never the number
    assert moderated_inputs(fake) == ["you idiot, my card is [card]"]
    assert fake.moderation_requests[0]["model"] == "omni-moderation-latest"
    assert {"name": "abuse", "stage": "input", "kind": "moderation", "outcome": "block", "route": "main",
            "found": ["harassment"]} in guardrail_events(events)


def test_a_category_not_declared_does_not_count(fake, write_bot):
    fake.flag_word("stab", "violence", 0.99)
    fake.queue({"chunks": ["Sure, ", "here."]})
    events = moderated_bot(write_bot).session().chat("how do I stab a potato with a fork?")
    assert user_events(events)[-1] == ("Message", "Sure, here.")
    assert guardrail_events(events) == []


def test_a_streamed_reply_is_moderated_once_and_no_flagged_chunk_streams(fake, write_bot):
    fake.flag_word("worthless", "harassment", 0.9)
    fake.queue({"chunks": ["You are ", "worthless. ", "Go away."]})
    events = moderated_bot(write_bot).session().chat("hello there")
    assert user_events(events) == [("Message", "Let us keep this friendly.")]  # not one chunk went out
    assert moderated_inputs(fake) == ["hello there", "You are worthless. Go away."]  # one call for the reply


def test_sentence_release_moderates_in_windows_one_call_each(fake, write_bot):
    fake.queue({"chunks": ["One two. ", "Three four. ", "Five six seven. ", "Eight nine ten. ", "End."]})
    events = moderated_bot(write_bot, release="sentence", window=20).session().chat("count for me")
    streamed = [d for t, d in user_events(events) if t == "Stream"]
    assert streamed == ["One two. Three four. ", "Five six seven. Eight nine ten. "]  # runs of 20+ characters
    assert user_events(events)[-1] == ("Message", "One two. Three four. Five six seven. Eight nine ten. End.")
    assert moderated_inputs(fake)[1:] == ["One two. Three four. ", "Five six seven. Eight nine ten. ", "End."]


def test_a_failing_endpoint_blocks_by_default_and_is_logged_with_the_session(fake, write_bot, caplog):
    fake.moderation_fails({"status": 503})
    s = moderated_bot(write_bot).session()
    with caplog.at_level(logging.WARNING, logger="chatrun.engine"):
        events = s.chat("hello")
    assert user_events(events) == [("Message", "Let us keep this friendly.")]
    assert fake.requests == []
    assert guardrail_events(events)[0]["found"] == ["unavailable"]
    assert any(s.id in r.getMessage() and "HTTP 503" in r.getMessage() and "on_error: block" in r.getMessage()
               for r in caplog.records)


def test_on_error_allow_lets_a_timed_out_check_pass_reported(fake, write_bot, caplog):
    fake.moderation_fails({"delay": 60.0})  # the guard waits 1 s
    fake.queue({"text": "Hi!"})
    s = moderated_bot(write_bot, on_error="allow", timeout=1).session()
    with caplog.at_level(logging.WARNING, logger="chatrun.engine"):
        events = s.chat("hello")
    assert user_events(events) == [("Message", "Hi!")]
    assert guardrail_events(events)[0] == {"name": "abuse", "stage": "input", "kind": "moderation",
                                           "outcome": "allow", "route": "main", "found": ["unavailable"]}
    assert any("no answer within 1 s" in r.getMessage() and "passes unchecked" in r.getMessage()
               for r in caplog.records)


LANGUAGES = """
name: english
locales: [en, de]
model: {provider: scripted}
guardrails:
  - {name: english_only, languages: [en], stages: [input], outcome: block}
routes:
  main: {default: true, system: You help.}
"""


def test_an_input_in_another_language_is_refused_in_the_sessions_locale(write_bot):
    from chatrun.models.scripted import ScriptedModel

    path = write_bot(LANGUAGES)
    (path.parent / "locales").mkdir()
    for locale in ("en", "de"):
        (path.parent / "locales" / f"{locale}.yaml").write_text("hello: hi\n")
    bot = chatrun.load_bot(path)
    model = ScriptedModel([{"text": "Sure."}, {"text": "Fine."}])
    s = bot.session(model=model)
    events = s.chat("Hallo, ich habe gestern meine Kreditkarte verloren")
    assert user_events(events) == [("Message", "Sorry, I can only help in: English.")]
    assert guardrail_events(events)[0]["found"] == ["de"]
    assert model.requests == []
    assert user_events(s.chat("Hello, I lost my credit card yesterday"))[-1] == ("Message", "Sure.")
    assert user_events(s.chat("ok danke"))[-1] == ("Message", "Fine.")  # too short to tell: it passes
    german = bot.session(model=ScriptedModel([]), meta={"locale": "de"})
    events = german.chat("Bonjour, j'ai perdu ma carte bancaire hier soir")
    assert user_events(events) == [("Message", "Entschuldigung, ich kann nur in diesen Sprachen helfen: English.")]


def seeded_conversation(said: str) -> list:
    from chatrun.messages import AssistantMessage, UserMessage

    return [UserMessage("hello there"), AssistantMessage("Hi, how can I help?"),
            UserMessage(said), AssistantMessage("Zorblax."), UserMessage("thanks")]


def test_a_seeded_message_moderation_flags_never_reaches_the_model(fake, write_bot, tmp_path):
    """A conversation begun elsewhere (`Session.seed_memory`, what `/v1` seeds a session with from
    the earlier messages a client resends: tests/test_guardrails_server.py) is judged by the
    `moderation` guard before the next turn's model call: a flagged message is left out with the
    answer it got, as a turn's own flagged message is stopped."""
    fake.flag_word("idiot", "harassment", 0.97)
    fake.queue({"chunks": ["Fine."]})
    s = moderated_bot(write_bot).session(store=chatrun.SQLiteStore(tmp_path / "s.db"))
    s.seed_memory(seeded_conversation("you idiot"))
    assert fake.moderation_requests == []  # the seeding is synchronous: the turn asks
    events = s.chat("so?")
    sent = json.dumps(fake.requests)
    assert "idiot" not in sent and "Zorblax" not in sent and "hello there" in sent and "thanks" in sent
    assert [g["outcome"] for g in guardrail_events(events) if g["kind"] == "moderation"] == ["block"]
    assert moderated_inputs(fake)[:4] == ["hello there", "you idiot", "thanks", "so?"]
    fake.queue({"chunks": ["Again."]})
    s.chat("again")
    assert "idiot" not in json.dumps(fake.requests[-1])  # the memory no longer holds it


def test_a_seeded_message_is_judged_again_after_a_failed_turn(fake, write_bot):
    """A turn that fails is undone: its memory is the seeded one again, so the next turn judges it."""
    fake.flag_word("idiot", "harassment", 0.97)
    fake.queue({"status": 400}, {"chunks": ["Fine."]})
    s = moderated_bot(write_bot).session()
    s.seed_memory(seeded_conversation("you idiot"))
    assert [e.type for e in s.chat("so?")][-1] == "Error"
    s.chat("so?")
    assert "idiot" not in json.dumps(fake.requests) and len(fake.requests) == 2


def test_a_seeded_message_in_another_language_is_left_out(write_bot):
    from chatrun.models.scripted import ScriptedModel

    model = ScriptedModel([{"text": "Sure."}])
    s = chatrun.load_bot(write_bot(LANGUAGES.replace("locales: [en, de]\n", ""))).session(model=model)
    s.seed_memory(seeded_conversation("Hallo, ich habe gestern meine Kreditkarte verloren"))
    s.chat("Hello, I lost my credit card yesterday")
    sent = json.dumps([m.to_dict() for m in model.requests[0].messages])
    assert "Kreditkarte" not in sent and "Zorblax" not in sent and "hello there" in sent


def test_the_validator_checks_the_new_kinds_at_their_line(write_bot):
    path = write_bot("""
name: bad
model: {provider: scripted}
guardrails:
  - {moderation: {}, stages: [input], outcome: redact}
  - {moderation: {categories: [harasment]}, stages: [storage], outcome: block}
  - {languages: [en, deu], stages: [tool_result], outcome: block}
  - {moderation: {on_error: maybe}, stages: [input], outcome: block}
routes:
  main: {default: true, system: hi}
""")
    _, diagnostics = check_bot(path)
    text = "\n".join(f"{d.file}:{d.line}: {d.message}" for d in diagnostics)
    assert ":5: guardrail `guardrails[0]`: `moderation` judges the whole text: it cannot `redact`" in text
    assert ":6: guardrail `guardrails[1]`: `moderation` does not watch stage `storage`" in text
    assert ("guardrail `guardrails[1]`: moderation category `harasment` is not one of the OpenAI-compatible "
            "endpoint's; did you mean `harassment`?") in text
    assert ":7: guardrail `guardrails[2]`: unknown language `deu` (give ISO 639-1 codes such as `en`" in text
    assert ":7: guardrail `guardrails[2]`: `languages` does not watch stage `tool_result`" in text
    assert ":8:" in text and "maybe" in text


def test_the_validators_language_list_is_the_detectors():
    assert language_id.detector_languages() == languages.KNOWN


@pytest.mark.parametrize("text, allowed, refused", [
    ("Where is my parcel? It was due on Monday.", ("en",), None),
    ("Wo ist mein Paket? Es sollte am Montag kommen.", ("en",), "de"),
    ("Wo ist mein Paket? Es sollte am Montag kommen.", ("en", "de"), None),
    ("thanks!", ("de",), None),
    ("Где моя посылка? Она должна была прийти в понедельник.", ("en", "de"), "ru"),
])
def test_the_language_detector_refuses_only_texts_surely_in_another_language(text, allowed, refused):
    assert language_id.refused(text, allowed) == refused


def test_no_moderation_request_when_an_earlier_guard_blocked(fake, write_bot):
    bot = chatrun.load_bot(write_bot(MODERATED.replace(
        "  - {name: cards, pii: [card], stages: [input], outcome: redact}",
        "  - {name: cards, pii: [card], stages: [input], outcome: block}") % {"on_error": "block", "release": "reply",
                                                                              "timeout": 30}))
    events = bot.session().chat("card 4111 1111 1111 1111")
    assert [g["name"] for g in guardrail_events(events)] == ["cards"]
    assert fake.moderation_requests == []
    assert json.dumps(fake.requests) == "[]"


TOOLED = """
name: tooled
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
guardrails:
  - name: abuse
    moderation: {threshold: 0.4, timeout: 30}
    stages: [%(stages)s]
    outcome: %(outcome)s
routes:
  main: {default: true, system: You help., tools: [reviews]}
tools:
  reviews:
    description: The latest review
    action: {reply: "Review: the staff are vermin and deserve worse."}
"""


def test_a_tool_result_over_the_threshold_is_withheld_from_the_model(fake, write_bot):
    fake.flag_word("vermin", "hate", 0.45)  # under the endpoint's 0.5, over the declared threshold
    fake.queue({"tool_calls": [{"name": "reviews", "arguments": {}}]}, {"text": "I cannot show that review."})
    events = chatrun.load_bot(write_bot(TOOLED % {"outcome": "block", "stages": "tool_result, output"})).session().chat("latest review?")
    read = [m for m in fake.requests[1]["messages"] if m["role"] == "tool"][0]["content"]
    assert "vermin" not in read and "withheld by the guardrail abuse" in read
    assert {"name": "abuse", "stage": "tool_result", "kind": "moderation", "outcome": "block", "route": "main",
            "found": ["hate"]} in guardrail_events(events)


def test_a_flagged_reply_goes_to_an_operator_and_its_calls_do_not_run(fake, write_bot):
    fake.flag_word("hopeless", "self-harm", 0.8)
    fake.queue({"text": "It is hopeless, give up.", "tool_calls": [{"name": "reviews", "arguments": {}}]})
    s = chatrun.load_bot(write_bot(TOOLED % {"outcome": "operator", "stages": "output"})).session()
    events = s.chat("I failed my exam")
    assert user_events(events) == [("Message", "Connecting you with a person.")]
    assert [p.kind for p in s.pending] == ["takeover"]
    assert len(fake.requests) == 1  # the answer's call did not run: no second model call


def test_a_messages_data_texts_are_moderated_in_one_call(fake, write_bot):
    fake.flag_word("idiot", "harassment", 0.9)
    s = moderated_bot(write_bot).session()
    events = s.chat({"name": "Ann", "comment": "you idiot", "tags": ["a", "b"]})
    assert user_events(events) == [("Message", "Let us keep this friendly.")]
    assert moderated_inputs(fake) == ["Ann\nyou idiot\na\nb"]


def test_a_reply_in_another_language_is_held_and_refused(write_bot):
    from chatrun.models.scripted import ScriptedModel

    bot = chatrun.load_bot(write_bot("""
name: replies
model: {provider: scripted, stream: true}
guardrails:
  - {name: english_replies, languages: [en], stages: [output], outcome: block, message: Let me answer in English.}
routes:
  main: {default: true, system: You help.}
"""))
    model = ScriptedModel([{"chunks": ["Gerne, ich helfe ", "Ihnen mit Ihrer Karte."]},
                           {"chunks": ["Sure, I can help ", "you with your card."]}])
    s = bot.session(model=model)
    events = s.chat("help with my card")
    assert user_events(events) == [("Message", "Let me answer in English.")]  # not one German chunk went out
    assert guardrail_events(events)[0]["found"] == ["de"]
    assert user_events(s.chat("again"))[-1] == ("Message", "Sure, I can help you with your card.")


def test_validate_says_how_to_install_the_detector_when_it_is_missing(write_bot, monkeypatch):
    monkeypatch.setattr(languages, "available", lambda: False)
    _, diagnostics = check_bot(write_bot(LANGUAGES.replace("locales: [en, de]\n", "")))
    assert [(d.line, d.message) for d in diagnostics] == [
        (5, "guardrail `english_only`: `languages` needs the language detector: `pip install chatrun[language]` "
            "(py3langid)")]
