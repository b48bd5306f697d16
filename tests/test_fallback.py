"""Never silent, never generic (issue 32, item 7): an empty model answer is asked again once with
a nudge the memory never keeps, then the declared `fallback:` (a route's over the bot's; else the
built-in text in the session's locale); a turn that reaches `limits.max_model_calls` (a model
repeating one call forever) ends with that reply, naming the limit for the author, and keeps what
its tools did."""

from __future__ import annotations

import textwrap

import pytest

import chatrun
from chat_support import call, kinds
from chatrun.definition.loader import check_bot
from chatrun.definition.page_texts import BUILTIN
from chatrun.models.scripted import ScriptedModel

BOT = """
name: quiet
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
state: {count: 0, topic: tea}
limits: {max_model_calls: 3}
routes:
  main:
    default: true
    system: You help.
    tools: [bump, note, ask_topic]
    choices: [More, Done]
  strict:
    system: Be strict.
    fallback: "Let us stay on {{ state.topic }}: what would you like to know?"
    tools: [bump]
tools:
  bump:
    description: Count one more
    effect: once           # a repeat is answered with the first call's result, not counted again
    action: {set: {state.count: "{{ state.count + 1 }}"}, reply: "Counted {{ state.count }}."}
  note:
    description: Tell the user something
    action: {message: Noted., reply: The user was told.}
  ask_topic:
    description: Go to the strict route
    action: {route: strict, execute: true}
"""


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT))


def messages(events):
    return [data for kind, data in kinds(events) if kind == "Message"]


def test_an_empty_answer_is_asked_again_once_with_a_nudge_the_memory_never_keeps(bot, fake):
    s = bot.session()
    fake.queue({"text": ""}, {"text": "Hello! How can I help?"})
    events = s.chat("hi")
    assert messages(events) == ["Hello! How can I help?"]
    assert ("Choices", {"choices": [{"label": "More", "value": "More"}, {"label": "Done", "value": "Done"}]}) \
        in kinds(events)
    first, second = fake.requests
    assert first["messages"][-1] == {"role": "user", "content": "hi"}
    nudge = second["messages"][-1]
    assert nudge["role"] == "user" and "Your last answer was empty" in nudge["content"]
    assert second["messages"][:-1] == first["messages"]  # the empty answer was not sent back either
    assert [(m.role, m.content) for m in s.memory()[1:]] == [("user", "hi"), ("assistant", "Hello! How can I help?")]


def test_two_empty_answers_get_the_built_in_fallback_in_the_sessions_locale(write_bot, tmp_path):
    (tmp_path / "locales").mkdir()
    path = write_bot(BOT.replace("name: quiet", "name: quiet\nlocales: [en, de]").replace(
        "    choices: [More, Done]\n", ""), extra={"locales/en.yaml": "x: y\n", "locales/de.yaml": "x: z\n"})
    s = chatrun.load_bot(path).session(model=ScriptedModel([{"text": ""}, {"text": "   "}]), meta={"locale": "de"})
    events = s.chat("hm")
    german = BUILTIN["de"]["fallback"]
    assert messages(events) == [german]
    consoles = [data for kind, data in kinds(events) if kind == "Console"]
    assert consoles[-1] == "the model answered nothing on route main, again after a nudge; the fallback reply was sent"
    assert s.memory()[-1].role == "assistant" and s.memory()[-1].content == german
    assert s.history[-1]["ok"] is True


def test_a_routes_fallback_wins_over_the_bots_and_is_a_template(write_bot):
    path = write_bot(BOT.replace("limits:", "fallback: Sorry, say it again?\nlimits:"))
    s = chatrun.load_bot(path).session(model=ScriptedModel([{"text": ""}, {"text": ""}]))
    assert messages(s.chat("?")) == ["Sorry, say it again?"]
    s._model = ScriptedModel([call("ask_topic"), {"text": ""}, {"text": ""}])
    assert messages(s.chat("strict please")) == ["Let us stay on tea: what would you like to know?"]


def test_no_nudge_when_the_user_already_has_a_reply_this_turn(bot):
    model = ScriptedModel([call("note"), {"text": ""}])
    s = bot.session(model=model)
    events = s.chat("note it")
    assert messages(events) == ["Noted."]
    assert model.remaining == 0  # two model calls, no third: the tool's message was the reply
    assert not any("answered nothing" in str(data) for _, data in kinds(events))


def test_blank_text_beside_a_tool_call_is_no_reply_the_user_still_gets_one(bot):
    """A model that writes only blanks beside its call, then only blanks again: the blanks are no
    message (the user would read nothing), so the empty answer after them is asked again, then
    answered with the fallback."""
    model = ScriptedModel([{"text": " \n", "tool_calls": [{"name": "bump", "arguments": {}}]}, {"text": "  "},
                           {"text": "\t"}])
    s = bot.session(model=model)
    events = s.chat("count")
    assert messages(events) == [BUILTIN["en"]["fallback"]]
    assert model.remaining == 0 and s.state["count"] == 1


def test_a_loop_of_identical_calls_ends_with_the_fallback_naming_the_limit_and_keeps_what_ran(bot, fake):
    s = bot.session()
    fake.queue(*[call("bump")] * 4)
    events = s.chat("count")
    assert len(fake.requests) == 3 and fake.pending == 1  # limits.max_model_calls: a fourth call is never made
    fake.reset()
    assert "Error" not in [kind for kind, _ in kinds(events)]
    assert messages(events) == [BUILTIN["en"]["fallback"]]
    detail = [data for kind, data in kinds(events) if kind == "Console"][-1]
    assert detail == ("this turn called the model 3 times, as many as limits.max_model_calls = 3 allows (route "
                      "main); its last 3 answers all called bump with the same arguments; the fallback reply was sent")
    # The turn commits: the call that ran did run (the repeats of a `once` tool were answered with
    # its result, not run again), and the state, the memory and the history say so.
    assert s.state["count"] == 1
    entry = s.history[-1]
    assert entry["ok"] is True and len(entry["calls"]) == 3
    assert any(e["type"] == "Console" and "limits.max_model_calls = 3" in e["data"] for e in entry["events"])
    assert s.memory()[-1].content == BUILTIN["en"]["fallback"]
    fake.queue({"text": "I counted three."})
    assert messages(s.chat("so?")) == ["I counted three."]
    assert fake.requests[-1]["messages"][-3]["content"].startswith("Already done earlier in this conversation "
                                                                   "(turn 1): Counted 1.")  # the next turn sees it


def test_a_model_that_varies_its_calls_is_named_by_the_limit_alone(bot):
    s = bot.session(model=ScriptedModel([call("bump"), call("note"), call("bump")]))
    events = s.chat("go")
    detail = [data for kind, data in kinds(events) if kind == "Console"][-1]
    assert detail.startswith("this turn called the model 3 times, as many as limits.max_model_calls = 3 allows")
    assert "same arguments" not in detail
    assert messages(events) == ["Noted.", BUILTIN["en"]["fallback"]] and s.state["count"] == 1


def test_fallback_is_read_checked_and_translated_like_other_texts(tmp_path):
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text("sorry: Sorry?\n")
    (tmp_path / "locales" / "de.yaml").write_text("sorry: Wie bitte?\n")
    (tmp_path / "bot.yaml").write_text(textwrap.dedent("""\
        name: t
        locales: [en, de]
        fallback: Sorry, once more?
        routes:
          main:
            default: true
            fallback: "{{ t('sorry') }} {{ state.nope }}"
        """))
    config, found = check_bot(tmp_path / "bot.yaml")
    assert config is not None and config.fallback == "Sorry, once more?"
    assert config.routes["main"].fallback == "{{ t('sorry') }} {{ state.nope }}"
    said = [(d.line, d.severity, d.message) for d in found]
    assert (3, "warning", "the bot's `fallback` is sent to the user untranslated: the bot declares `locales:`, so "
            "write it as `{{ t('key') }}` with the key in each catalog (docs/i18n.md)") in said
    assert any(line == 7 and "`fallback` of route `main` reads `state.nope`" in message for line, _, message in said)


MOVES = """
name: mover
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main:
    default: true
    system: You help.
    tools: [go, go_on]
  sub:
    system: Sub.
tools:
  go:
    description: Go to sub and say nothing
    action: {push: sub}
  go_on:
    description: Go to sub and let it answer
    action: {push: sub, execute: true}
"""


def test_a_move_with_no_message_and_no_execute_ends_the_turn_as_written(write_bot, fake):
    # The exception docs/tools.md ("When the model has nothing to say") states: the author ended the
    # turn at the move, so the model is not asked again and no fallback is sent.
    s = chatrun.load_bot(write_bot(MOVES)).session()
    fake.queue(call("go"))
    asked = len(fake.requests)
    assert kinds(s.chat("go")) == [("RouteChanged", {"route": "sub", "stack": ["main", "sub"]})]
    assert len(fake.requests) == asked + 1  # the one answer that moved; the model was not asked again
    s = chatrun.load_bot(write_bot(MOVES)).session()
    fake.queue(call("go_on"), {"text": "Sub here."})
    assert messages(s.chat("go on")) == ["Sub here."]
