"""Guardrails (issue 37, docs/guardrails.md): the engine applies a bot's and a route's
`guardrails:` on the user's input, tools' results, the model's output (streamed chunks held
until checked) and what is stored; the validator reports bad ones at file:line."""

from __future__ import annotations

import json
import logging

import pytest

import chatrun
from chatrun.definition.config import GuardrailConfig
from chatrun.definition.loader import check_bot
from chatrun.engine.guardrails import find, iban_valid, luhn, redacted
from chatrun.models.scripted import ScriptedModel
from leak_support import card_leaked
from secret_support import ENCODED, SECRET, basic_bot, basic_handler

CARD = "4111 1111 1111 1111"  # passes Luhn
NOT_A_CARD = "4111 1111 1111 1112"  # fails it
IBAN = "DE89 3704 0044 0532 0130 00"  # passes mod 97

BOT = """
name: guarded
model: {provider: scripted, stream: true}
guardrails:
  - {name: cards, pii: [card, iban], stages: [input, tool_result, storage], outcome: redact}
  - {name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: block,
     message: "I cannot share that."}
  - {name: long, max_chars: 500, stages: [input], outcome: block, message: "Please write less."}
routes:
  main:
    default: true
    system: You help.
    tools: [lookup]
  careful:
    system: Careful.
    guardrails:
      - {name: human, patterns: ['(?i)lawyer'], stages: [input], outcome: operator}
tools:
  lookup:
    description: Look the customer up
    action: {reply: "Customer Ann, card 5555 5555 5555 4444, email ann@example.com"}
"""


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT))


def kinds(events, audience="user"):
    return [(e.type, e.data) for e in events if e.audience == audience]


def stream_and_messages(events):
    return [(e.type, e.data) for e in events if e.type in ("Stream", "Message") and e.audience == "user"]


def test_luhn_and_mod97_tell_real_numbers_from_lookalikes():
    assert luhn(CARD.replace(" ", "")) and not luhn(NOT_A_CARD.replace(" ", ""))
    assert iban_valid(IBAN) and not iban_valid("DE89 3704 0044 0532 0130 01")


@pytest.mark.parametrize("text, kept", [
    ("call +41 44 668 18 00 now", "call [phone] now"),
    ("card 4111-1111-1111-1111.", "card [card]."),
    ("card 4111 1111 1111 1111 2024", "card [card] 2024"),
    ("GB82 WEST 1234 5698 7654 32 ok", "[iban] ok"),
    ("gb82west12345698765432", "[iban]"),
    ("mail a.b+c@ex-ample.co.uk!", "mail [email]!"),
    ("order 1234567890123456 on 2026-12-01 at 10:30", "order 1234567890123456 on 2026-12-01 at 10:30"),
])
def test_the_pii_detectors_find_what_they_say_and_leave_lookalikes(text, kept):
    guard = GuardrailConfig("p", "pii", ("input",), "redact")
    assert redacted(guard, text, find(guard, text)) == kept


def test_a_card_number_in_the_input_never_reaches_the_model_and_a_lookalike_does(bot):
    model = ScriptedModel([{"text": "Noted."}, {"text": "Noted."}])
    s = bot.session(model=model)
    s.chat(f"my card is {CARD} and IBAN {IBAN}")
    sent = json.dumps([m.to_dict() for m in model.requests[0].messages])
    assert not card_leaked(sent) and "3704" not in sent
    assert "my card is [card] and IBAN [iban]" in sent
    s.chat(f"order {NOT_A_CARD}")
    assert NOT_A_CARD in json.dumps([m.to_dict() for m in model.requests[1].messages])


def test_a_tool_result_is_redacted_before_the_model_reads_it(bot):
    model = ScriptedModel([{"tool_calls": [{"name": "lookup", "arguments": {}}]}, {"text": "Found Ann."}])
    s = bot.session(model=model)
    s.chat("who am I?")
    read = [m for m in model.requests[1].messages if m.role == "tool"][0].content
    assert "5555" not in read and "[card]" in read
    assert "ann@example.com" in read  # the guard declares card and iban only


def test_a_blocked_streamed_reply_sends_no_chunk_and_the_declared_message(bot):
    model = ScriptedModel([{"chunks": ["Sure. This is ", "for internal ", "only: the plan."]}, {"text": "ok"}])
    s = bot.session(model=model)
    events = s.chat("tell me the plan")
    assert stream_and_messages(events) == [("Message", "I cannot share that.")]
    assert ("Guardrail", {"name": "secret", "stage": "output", "kind": "pattern", "outcome": "block",
                          "route": "main", "found": ["pattern"]}) in kinds(events, "operators")
    s.chat("and now?")  # the memory holds what the user read, not the blocked text
    assert "internal" not in json.dumps([m.to_dict() for m in model.requests[1].messages])


def test_sentence_windows_release_checked_sentences_and_redact_a_card_before_it_streams(write_bot):
    bot = chatrun.load_bot(write_bot("""
name: windows
model: {provider: scripted, stream: true}
guardrails:
  - {name: cards_out, pii: [card], stages: [output], outcome: redact, release: sentence}
  - {name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: block, release: sentence,
     message: "I cannot share that."}
routes:
  main: {default: true, system: hi}
"""))
    model = ScriptedModel([{"chunks": ["Hello there. Your card ", "is 4111 1111 ", "1111 1111. Bye"]},
                           {"chunks": ["Sure. It is ", "for internal only. ", "More."]}])
    s = bot.session(model=model)
    events = s.chat("my card?")
    streamed = [d for t, d in stream_and_messages(events) if t == "Stream"]
    final = [d for t, d in stream_and_messages(events) if t == "Message"]
    assert streamed == ["Hello there. ", "Your card is [card]. "]
    assert final == ["Hello there. Your card is [card]. Bye"]
    assert final[0].startswith("".join(streamed))  # what every door relies on
    assert not any(card_leaked(str(d)) for _, d in kinds(events))
    # a sentence that blocks stops the stream: the Message is what went out, then the guard's message
    events = s.chat("the plan?")
    assert stream_and_messages(events) == [("Stream", "Sure. "), ("Message", "Sure. I cannot share that.")]


def test_an_input_guard_hands_the_conversation_to_an_operator(bot):
    model = ScriptedModel([])
    s = bot.session(route="careful", model=model)
    events = s.chat("I want a lawyer")
    assert not model.requests  # no model read it
    assert ("Message", "Connecting you with a person.") in kinds(events)
    assert [(p.kind, p.by) for p in s.pending] == [("takeover", ["operators"])]  # any operator may take it


def test_a_too_long_input_is_blocked_with_its_message(bot):
    model = ScriptedModel([])
    events = bot.session(model=model).chat("x" * 501)
    assert kinds(events) == [("Message", "Please write less.")] and not model.requests


def test_storage_keeps_no_card_number_in_the_store_or_the_logs(bot, caplog, tmp_path):
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    model = ScriptedModel([{"tool_calls": [{"name": "lookup", "arguments": {"card": CARD}}]},
                           {"text": f"Your card {CARD} is on file."}, {"text": "Yes."}])
    s = bot.session(store=store, model=model)
    caplog.set_level(logging.DEBUG)
    s.chat(f"card {CARD}")
    s.chat("again?")
    store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert b"[card]" in stored
    assert not card_leaked(stored) and b"5555 5555" not in stored
    assert not card_leaked(caplog.text)
    # the next turn's model reads the memory as stored
    assert not card_leaked(json.dumps([m.to_dict() for m in model.requests[2].messages]))


def test_a_conversation_begun_elsewhere_is_seeded_redacted_for_the_model_and_the_store(bot, tmp_path):
    # An OpenAI client's first request resends its earlier messages (server/openai_sessions.py
    # seeds them): they are the user's messages too, so neither the model nor the store reads a card.
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    model = ScriptedModel([{"text": "Noted."}])
    s = bot.session(store=store, model=model)
    s.seed_memory([chatrun.UserMessage(f"my card is {CARD}"), chatrun.AssistantMessage(f"Got {CARD}.")])
    store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert not card_leaked(stored) and b"[card]" in stored
    s = bot.session(session_id=s.id, store=chatrun.SQLiteStore(str(tmp_path / "s.db")), model=model)
    s.chat("thanks")
    sent = json.dumps([m.to_dict() for m in model.requests[0].messages])
    assert not card_leaked(sent) and "my card is [card]" in sent


KNOWLEDGE_BOT = """
name: kb
model: {provider: scripted, stream: true}
knowledge:
  help: {path: help}
guardrails:
  - {name: cards, pii: [card], stages: [tool_result, output], outcome: redact}
routes:
  main: {default: true, system: Answer from help., knowledge: {sources: [help], retrieve: RETRIEVE}}
"""


@pytest.mark.parametrize("retrieve", ["tool", "auto"])
def test_a_knowledge_passage_and_its_citation_are_guarded_on_each_way_to_the_model_and_the_user(write_bot,
                                                                                                   retrieve):
    # search_knowledge's passages pass the tool_result guards; `retrieve: auto` gives the model the
    # same passages (and must too), and the Sources event's titles reach the user beside the reply.
    path = write_bot(KNOWLEDGE_BOT.replace("RETRIEVE", retrieve))
    (path.parent / "help").mkdir()
    (path.parent / "help" / "cards.md").write_text(
        f"# Test cards {CARD}\n\n## Refund window\n\nRefund to the test card {CARD} within 30 days.\n")
    search = {"tool_calls": [{"name": "search_knowledge", "arguments": {"query": "refund test card"}}]}
    answer = {"text": "Within 30 days [cards.md#refund-window]."}
    model = ScriptedModel([search, answer] if retrieve == "tool" else [answer])
    events = chatrun.load_bot(path).session(model=model).chat("refund to the test card?")
    sent = json.dumps([m.to_dict() for r in model.requests for m in r.messages])
    assert not card_leaked(sent) and "test card [card]" in sent
    sources = [e.data for e in events if e.type == "Sources"]
    assert sources and not card_leaked(json.dumps(sources)) and "Test cards [card]" in json.dumps(sources)


CITING_BOT = """
name: kb
model: {provider: scripted}
knowledge:
  help: {path: help}
guardrails:
  - {name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: OUTCOME, message: "I cannot share that."}
routes:
  main: {default: true, system: Answer from help., knowledge: {sources: [help], cite: required}}
"""


@pytest.mark.parametrize("outcome", ["block", "operator"])
def test_a_blocked_reply_on_a_route_that_must_cite_is_the_guards_message_not_asked_again(write_bot, outcome):
    # The guard's message cites nothing: `cite: required` asked the model again and sent the
    # fallback, so the user never read the message docs/guardrails.md promises.
    path = write_bot(CITING_BOT.replace("OUTCOME", outcome))
    (path.parent / "help").mkdir()
    (path.parent / "help" / "returns.md").write_text("# Returns\n\n## Refund window\n\nWithin 30 days.\n")
    model = ScriptedModel([{"text": "It is internal only [returns.md#refund-window]."}, {"text": "Sure."}])
    s = chatrun.load_bot(path).session(model=model)
    events = s.chat("refund?")
    assert [d for t, d in kinds(events) if t == "Message"] == ["I cannot share that."]
    assert len(model.requests) == 1
    assert s.memory()[-1].content == "I cannot share that."


ASKING_BOT = """
name: kyc
model: {provider: scripted}
guardrails:
  - {name: cards, pii: [card], stages: [tool_result], outcome: redact}
routes:
  main: {default: true, system: You help., tools: [card_on_file]}
tools:
  card_on_file:
    description: Ask the back office for the card on file
    action: {ask: {from: backend, text: Which card is on file?, schema: {type: string}}}
"""


def test_a_backends_answer_is_redacted_before_the_model_reads_it_as_the_calls_result(write_bot):
    model = ScriptedModel([{"tool_calls": [{"name": "card_on_file", "arguments": {}}]}, {"text": "Found it."}])
    s = chatrun.load_bot(write_bot(ASKING_BOT)).session(model=model)
    token = next(e.data["token"] for e in s.chat("which card?") if e.type == "Pending" and e.data.get("token"))
    events = s.chat(chatrun.Answer("p1", f"the card {CARD}", token=token))
    read = [m for m in model.requests[1].messages if m.role == "tool"][0].content
    assert not card_leaked(read) and read == "the card [card]"
    assert {"name": "cards", "stage": "tool_result", "kind": "pii", "outcome": "redact", "route": "main",
            "found": ["card"]} in [e.data for e in events if e.type == "Guardrail"]


def test_a_rejects_reason_is_redacted_before_the_model_reads_it_as_the_calls_result(write_bot):
    path = write_bot(ASKING_BOT.replace("action: {ask: {from: backend, text: Which card is on file?, "
                                        "schema: {type: string}}}",
                                        "action: {reply: done}\n    approval: {by: [user], ask: Look it up?}"))
    model = ScriptedModel([{"tool_calls": [{"name": "card_on_file", "arguments": {}}]}, {"text": "Understood."}])
    s = chatrun.load_bot(path).session(model=model)
    s.chat("which card?")
    s.chat(chatrun.Reject("p1", reason=f"not with my card {CARD}"))
    read = [m for m in model.requests[1].messages if m.role == "tool"][0].content
    assert not card_leaked(read) and "not with my card [card]" in read


@pytest.mark.parametrize("release", ["reply", "sentence"])
def test_max_chars_on_a_streamed_reply_limits_the_whole_reply_released_a_sentence_at_a_time_or_not(write_bot, release):
    # Each sentence was judged alone: a reply of short sentences passed any max_chars.
    path = write_bot(f"""
        name: short
        model: {{provider: scripted, stream: true}}
        guardrails:
          - {{name: short, max_chars: 30, stages: [output], outcome: redact, release: {release}}}
        routes:
          main: {{default: true, system: You help.}}
        """)
    chunks = ["One short line. ", "Another short line. ", "A third short line here. ", "End."]
    events = chatrun.load_bot(path).session(model=ScriptedModel([{"chunks": chunks}])).chat("hi")
    shown = stream_and_messages(events)
    assert shown[-1] == ("Message", "One short line. Another short ")
    assert all(len(data) <= 30 for kind, data in shown)


def test_the_validator_names_bad_patterns_and_outcomes_at_their_line(write_bot):
    path = write_bot("""
name: bad
model: {provider: scripted}
guardrails:
  - {patterns: ['ok', 'bad('], stages: [output], outcome: block}
  - {pii: [card], stages: [storage], outcome: block}
  - {pii: [crad], stages: [inptu], outcome: redact}
  - {pii: [card], max_chars: 9, stages: [input], outcome: redact}
  - {pi: [card], stages: [input], outcome: redact}
routes:
  main: {default: true, system: hi}
""")
    _, diagnostics = check_bot(path)
    text = "\n".join(f"{d.file}:{d.line}: {d.message}" for d in diagnostics)
    assert ":5:" in text and "'bad(' is not a valid regular expression" in text
    assert ":6:" in text and "stage `storage` cannot `block` (it can: redact)" in text
    assert "did you mean `card`?" in text and "did you mean `input`?" in text
    assert ":8: guardrail `guardrails[3]` has `pii` and `max_chars`: one detector per guardrail" in text
    assert "unknown key `pi` in `guardrails[4]`; did you mean `pii`?" in text
    assert ":9: guardrail `guardrails[4]` detects nothing: give it `patterns`, `pii`, `max_chars`, `moderation` or `languages`" in text


def test_traces_keep_no_card_number_even_with_message_content_captured(bot, spans, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    model = ScriptedModel([{"text": f"Card {CARD} noted."}])
    bot.session(model=model).chat(f"card {CARD}")
    recorded = json.dumps([dict(span.attributes or {}) for span in spans.get_finished_spans()])
    assert "gen_ai.input.messages" in recorded and "[card]" in recorded
    assert not card_leaked(recorded)


def test_an_approved_calls_result_is_redacted_too(write_bot):
    bot = chatrun.load_bot(write_bot("""
name: approved
model: {provider: scripted}
guardrails:
  - {name: cards, pii: [card], stages: [tool_result], outcome: redact}
routes:
  main: {default: true, system: hi, tools: [lookup]}
tools:
  lookup:
    description: Look the customer up
    approval: {by: [user]}
    action: {reply: "Card 5555 5555 5555 4444"}
"""))
    model = ScriptedModel([{"tool_calls": [{"name": "lookup", "arguments": {}}]}, {"text": "Done."}])
    s = bot.session(model=model)
    s.chat("look me up")
    s.chat(chatrun.Approve(s.pending[0].id))
    read = [m for m in model.requests[1].messages if m.role == "tool"][-1].content
    assert read == "Card [card]"


def test_a_flag_only_output_guard_lets_the_reply_stream_and_flags_it(write_bot):
    bot = chatrun.load_bot(write_bot("""
name: flagged
model: {provider: scripted, stream: true}
guardrails:
  - {name: refunds, patterns: ['(?i)refund'], stages: [output], outcome: flag}
routes:
  main: {default: true, system: hi}
"""))
    events = bot.session(model=ScriptedModel([{"chunks": ["A refund ", "is on its way."]}])).chat("money?")
    assert stream_and_messages(events) == [("Stream", "A refund "), ("Stream", "is on its way."),
                                           ("Message", "A refund is on its way.")]
    assert [d["outcome"] for t, d in kinds(events, "operators") if t == "Guardrail"] == ["flag"]


def test_a_block_after_a_released_line_keeps_the_message_starting_with_what_went_out(write_bot):
    bot = chatrun.load_bot(write_bot("""
name: lines
model: {provider: scripted, stream: true}
guardrails:
  - {name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: block, release: sentence,
     message: No.}
routes:
  main: {default: true, system: hi}
"""))
    events = bot.session(model=ScriptedModel([{"chunks": ["Line one\n", "internal only\n"]}])).chat("?")
    assert stream_and_messages(events) == [("Stream", "Line one\n"), ("Message", "Line one\nNo.")]


def test_a_bot_may_send_its_guardrail_events_to_the_backend(write_bot):
    bot = chatrun.load_bot(write_bot("""
name: backend
model: {provider: scripted}
events: {Guardrail: {audience: backend}}
guardrails:
  - {name: mails, pii: [email], stages: [input], outcome: flag}
routes:
  main: {default: true, system: hi}
"""))
    model = ScriptedModel([{"text": "ok"}])
    events = bot.session(model=model).chat("write to ann@example.com")
    assert [d["found"] for t, d in kinds(events, "backend") if t == "Guardrail"] == [["email"]]
    assert "ann@example.com" in json.dumps([m.to_dict() for m in model.requests[0].messages])  # flag changes nothing


LEAKY = """
name: leaky
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
guardrails:
  - {name: pii, pii: [card, email], stages: [storage], outcome: redact}
routes:
  main: {default: true, system: You help., tools: [look]}
tools:
  look:
    description: Look the customer up
    handler: leaky_tools:look
"""
LEAKY_TOOLS = """
def look(ctx):
    raise ValueError("no account for ann@example.com, card 4111 1111 1111 1111")
"""


def test_a_handlers_exception_text_is_redacted_in_the_error_the_history_and_the_log(fake, write_bot, tmp_path,
                                                                                      caplog):
    """A handler raised with a card number and an email in its message: the turn's Error kept it
    in `meta.detail` (the HTTP answer's events), and the log held it; the history alone was redacted."""
    from fastapi.testclient import TestClient

    from server_support import app_for_testclient
    bot = chatrun.load_bot(write_bot(LEAKY, extra={"leaky_tools.py": LEAKY_TOOLS}))
    app = app_for_testclient([bot], f"sqlite:///{tmp_path / 's.db'}")
    caplog.set_level(logging.DEBUG)
    fake.queue({"tool_calls": [{"name": "look", "arguments": {}}]})
    with TestClient(app) as client:
        assert client.post("/bots/leaky/sessions", json={"id": "s1"}).status_code == 201
        body = client.post("/bots/leaky/sessions/s1/messages", json={"userMessage": "who am I?"}).json()
        history = client.get("/bots/leaky/sessions/s1").json()["history"]
    [error] = [e for e in body["events"] if e["type"] == "Error"]
    assert error["meta"]["detail"].endswith("raised ValueError: no account for [email], card [card]")
    assert history[-1]["error"] == error["meta"]["detail"]
    for seen in (json.dumps(body), caplog.text):
        assert not card_leaked(seen) and "ann@example.com" not in seen
    assert "no account for [email], card [card]" in caplog.text


def test_what_is_said_during_a_takeover_is_stored_redacted(write_bot, tmp_path):
    """A `storage` guard keeps a card number out of the store also while an operator has the
    conversation: the talk the bot gets on release waits in the session's record meanwhile."""
    bot = chatrun.load_bot(write_bot(
        "name: desk\nmodel: {provider: scripted}\n"
        "guardrails:\n  - {name: cards, pii: [card], stages: [storage], outcome: redact}\n"
        "routes:\n  main: {default: true, system: You help.}\n"))
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    model = ScriptedModel([{"text": "Hello."}, {"text": "Welcome back."}])
    s = bot.session(store=store, model=model)
    s.chat("hi")
    s.chat(chatrun.TakeOver())
    s.chat(f"my card is {CARD}")
    s.chat(chatrun.OperatorSay("I see the card 5555 5555 5555 4444 on file."))
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))  # while the operator has it
    assert not card_leaked(stored) and b"5555 5555" not in stored and b"[card]" in stored
    s.chat(chatrun.Release())
    s.chat("thanks")
    store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert not card_leaked(stored) and b"5555 5555" not in stored
    sent = json.dumps([m.to_dict() for m in model.requests[-1].messages])
    assert "my card is [card]" in sent and not card_leaked(sent)


HANDLED = LEAKY.replace("    handler: leaky_tools:look\n", """    handler: leaky_tools:look
    on_error:
      message: "Lookup failed: {{ error }}"
      reply: "The lookup failed ({{ error }}). Say so."
""")


def test_a_handled_failures_console_note_is_redacted_and_the_authors_error_text_only_where_it_is_stored(
        fake, write_bot, tmp_path):
    """`on_error:`: chatrun's own Console note went to every client with the handler's raw text.
    It holds what the store keeps; the author's `{{ error }}` renders as raised (the author chose
    to show it: guard `output` to hide it), and the history keeps it redacted."""
    from fastapi.testclient import TestClient

    from server_support import app_for_testclient
    bot = chatrun.load_bot(write_bot(HANDLED, extra={"leaky_tools.py": LEAKY_TOOLS}))
    app = app_for_testclient([bot], f"sqlite:///{tmp_path / 's.db'}")
    fake.queue({"tool_calls": [{"name": "look", "arguments": {}}]}, {"text": "Sorry, no luck."})
    with TestClient(app) as client:
        assert client.post("/bots/leaky/sessions", json={"id": "s1"}).status_code == 201
        body = client.post("/bots/leaky/sessions/s1/messages", json={"userMessage": "who am I?"}).json()
        history = client.get("/bots/leaky/sessions/s1").json()["history"]
    [console] = [e["data"] for e in body["events"] if e["type"] == "Console" and "handled failure" in e["data"]]
    assert console.endswith("no account for [email], card [card]")
    assert "Lookup failed: no account for ann@example.com" in json.dumps(body)  # the author's choice, live
    stored = json.dumps(history)
    assert "Lookup failed: no account for [email], card [card]" in stored
    assert not card_leaked(stored) and "ann@example.com" not in stored
    assert "The lookup failed (no account for ann@example.com" in json.dumps(fake.requests[-1])  # the model's, as raised


def test_a_failures_text_on_the_spans_is_redacted(write_bot, spans):
    """A handler raised with a card number and an email: the turn's and the tool call's spans
    ended with the exception's text as their status."""
    bot = chatrun.load_bot(write_bot(LEAKY.replace("provider: openai, name: gpt-4o-mini, max_retries: 0",
                                                   "provider: scripted"), extra={"leaky_tools.py": LEAKY_TOOLS}))
    bot.session(model=ScriptedModel([{"tool_calls": [{"name": "look", "arguments": {}}]}])).chat("who am I?")
    statuses = [span.status.description or "" for span in spans.get_finished_spans()]
    assert sum("no account for [email], card [card]" in s for s in statuses) == 2  # execute_tool, invoke_agent
    assert not any(card_leaked(s) or "ann@example.com" in s for s in statuses)


def test_the_turn_logs_content_is_redacted_as_the_history_keeps_it(fake, write_bot, tmp_path, caplog):
    """`chatrun serve --log-content`: the turn line's `input` and `reply` held the card number and
    the email the history keeps redacted."""
    from fastapi.testclient import TestClient

    from server_support import app_for_testclient
    bot = chatrun.load_bot(write_bot(LEAKY, extra={"leaky_tools.py": LEAKY_TOOLS}))
    app = app_for_testclient([bot], f"sqlite:///{tmp_path / 's.db'}", log_content=True)
    caplog.set_level(logging.INFO, logger="chatrun.turns")
    fake.queue({"text": f"Noted {CARD} for ann@example.com."})
    with TestClient(app) as client:
        assert client.post("/bots/leaky/sessions", json={"id": "s1"}).status_code == 201
        said = client.post("/bots/leaky/sessions/s1/messages", json={"userMessage": f"card {CARD}, ann@example.com"})
    assert card_leaked(json.dumps(said.json()))  # the user reads the reply as the `output` stage let it through
    [line] = [r.chatrun for r in caplog.records if r.name == "chatrun.turns"]
    assert line["input"] == "card [card], [email]" and line["reply"] == "Noted [card] for [email]."


# LEAKY without its tool: the store keeps a bot's files (its versions), which would hold the card.
QUIET = LEAKY.split("routes:")[0] + "routes:\n  main: {default: true, system: You help.}\n"


@pytest.mark.slow
def test_a_v1_requests_replayable_outcome_is_stored_redacted(fake, write_bot, tmp_path):
    """/v1 with an Idempotency-Key: the outcome a retry replays was kept in the store with the
    reply as the model wrote it (a card number in the SQLite file); the history had it redacted.
    The retry now replays what the store keeps, as the HTTP API's retries do."""
    import openai

    from server_support import ThreadServer, app_for_testclient
    bot = chatrun.load_bot(write_bot(QUIET))
    fake.queue({"text": f"Noted {CARD}."})
    key = {"Idempotency-Key": "order-1"}
    with ThreadServer(app_for_testclient([bot], f"sqlite:///{tmp_path / 's.db'}")) as server, \
            openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        def say():
            return client.chat.completions.create(model="leaky", messages=[{"role": "user", "content": "note it"}],
                                                  extra_headers=key).choices[0].message.content
        first, again = say(), say()
    assert first == f"Noted {CARD}." and again == "Noted [card]." and len(fake.requests) == 1
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*")).decode("utf-8", "replace")
    assert "Noted [card]." in stored and not card_leaked(stored)


def test_a_ratings_comment_is_kept_redacted(fake, write_bot, tmp_path):
    """POST .../feedback: the user's comment went into the history (and a sink's outbox entry)
    as typed, a card number and an email among it, beside turns the `storage` guards redacted."""
    from fastapi.testclient import TestClient

    from server_support import app_for_testclient
    bot = chatrun.load_bot(write_bot(QUIET))
    fake.queue({"text": "Done."})
    with TestClient(app_for_testclient([bot], f"sqlite:///{tmp_path / 's.db'}")) as client:
        assert client.post("/bots/leaky/sessions", json={"id": "s1"}).status_code == 201
        assert client.post("/bots/leaky/sessions/s1/messages", json={"userMessage": "hi"}).json()["ok"] is True
        rated = client.post("/bots/leaky/sessions/s1/feedback",
                            json={"turn": 1, "rating": "down", "comment": f"you charged {CARD}, ann@example.com"})
        history = client.get("/bots/leaky/sessions/s1").json()["history"]
    assert rated.status_code == 201 and rated.json()["comment"] == "you charged [card], [email]"
    assert history[-1]["feedback"]["comment"] == "you charged [card], [email]"
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*")).decode("utf-8", "replace")
    assert not card_leaked(stored) and "ann@example.com" not in stored
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*")).decode("utf-8", "replace")
    assert not card_leaked(stored) and "ann@example.com" not in stored


KEYED_TOOLS = """
def look(ctx):
    return {"4111 1111 1111 1111": "ok", "5555 5555 5555 4444": "expired", "ann@example.com": {"ann@example.com": 1}}
"""


def test_a_card_number_as_a_key_of_a_tool_result_or_its_arguments_is_stored_redacted(write_bot, tmp_path):
    """A tool's result, and the arguments the model gave it, keyed by card numbers: the history
    (read back from SQLite as a chatrun user reads it) keeps the keys redacted, each of them."""
    bot = chatrun.load_bot(write_bot(LEAKY.replace("provider: openai, name: gpt-4o-mini, max_retries: 0",
                                                   "provider: scripted"), extra={"leaky_tools.py": KEYED_TOOLS}))
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    model = ScriptedModel([{"tool_calls": [{"name": "look", "arguments": {CARD: "yes"}}]}, {"text": "Done."}])
    s = bot.session(store=store, model=model)
    s.chat("look me up")
    history = json.dumps(store.load_history(s.id))
    store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert '"[card]"' in history and '"[email]"' in history
    assert not card_leaked(history) and "5555 5555" not in history and "ann@example.com" not in history
    assert not card_leaked(stored) and b"5555 5555" not in stored and b"ann@example.com" not in stored


def test_a_secret_in_a_handlers_error_is_kept_redacted_as_written_and_base64_encoded(write_bot, tmp_path, caplog,
                                                                                      monkeypatch):
    """A handler's error echoed the Basic credential it built from a `secret: true` variable: the
    Error's detail, the history (SQLite) and the log kept it, encoded and as written, on a bot
    without guardrails as on any."""
    monkeypatch.setenv("API_PASSWORD", SECRET)
    bot = chatrun.load_bot(write_bot(basic_bot("basic", "provider: scripted", "basic_tools"),
                                     extra={"basic_tools.py": basic_handler(fails=True)}))
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    caplog.set_level(logging.DEBUG)
    s = bot.session(store=store, model=ScriptedModel([{"tool_calls": [{"name": "call_api", "arguments": {}}]}]))
    [error] = [e for e in s.chat("call it") if e.type == "Error"]
    assert error.meta["detail"].endswith("the API refused Authorization: Basic [redacted] (password [redacted])")
    history = json.dumps(store.load_history(s.id))
    store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*")).decode("utf-8", "replace")
    assert "Basic [redacted] (password [redacted])" in history
    for kept in (history, stored, caplog.text):
        assert SECRET not in kept and ENCODED[8:24] not in kept
