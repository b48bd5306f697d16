"""Stable prompts (issue 38, docs/models.md "Stable prompts"): what changes every turn goes in
`context:`, sent after the memory on every model call and never kept; `system:` stays byte-identical
so providers' prompt caches hit; a prompt-cache key per bot and route; the cached tokens the
provider reports reach usage; `chatrun validate` warns about a `system:` that reads the clock or
the state. Through the real `openai` client against chatrun.testing.fake_openai."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

import chatrun
from chatrun.definition.loader import check_bot
from chatrun.messages import ContextMessage
from chatrun.testing.fake_openai import FakeOpenAI

DESK = """\
name: desk
format: 3
model: {provider: openai, name: gpt-4o-mini, stream: false, prompt_cache: true}
timezone: Europe/Paris
state: {notes: 0}
routes:
  main:
    default: true
    system: |
      You keep the user's notes. Call note to save one. Be brief.
    context: |
      It is {{ now.strftime('%A %d %B %Y, %H:%M') }}.
      Notes saved so far: {{ state.notes }}.
    tools: [note]
tools:
  note:
    description: Save a note
    action: {set: {state.notes: "{{ state.notes + 1 }}"}, reply: Saved.}
"""


@pytest.fixture
def cache(monkeypatch):
    """The fake provider, playing a prompt cache."""
    with FakeOpenAI(prompt_cache=True) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        yield server


def desk_session(write_bot, text: str = DESK) -> chatrun.Session:
    session = chatrun.load_bot(write_bot(text)).session()
    session.clock = chatrun.FixedClock(datetime.fromisoformat("2026-11-24T18:00:00+01:00"))
    return session


def three_turns(session: chatrun.Session, fake: FakeOpenAI) -> None:
    """A note saved (a tool call, then the answer), then two more messages, the clock moving on."""
    fake.queue({"tool_calls": [{"name": "note", "arguments": {}}]}, {"text": "Saved."},
               {"text": "Anything else?"}, {"text": "Bye."})
    for text in ("Note: buy milk", "What time is it?", "Thanks"):
        session.chat(text)
        session.clock.advance(timedelta(minutes=7))


def test_the_system_message_is_byte_identical_on_every_call_and_the_context_follows_the_memory(cache, write_bot):
    session = desk_session(write_bot)
    three_turns(session, cache)
    sent = cache.requests
    assert len(sent) == 4
    firsts = {json.dumps(body["messages"][0]) for body in sent}
    assert firsts == {json.dumps({"role": "system",
                                  "content": "You keep the user's notes. Call note to save one. Be brief."})}
    # the context is the last message of each call, rendered anew: the clock and the state it reads
    contexts = [body["messages"][-1] for body in sent]
    assert all(c["role"] == "system" for c in contexts)
    assert [c["content"] for c in contexts] == [
        "It is Tuesday 24 November 2026, 18:00.\nNotes saved so far: 0.",
        "It is Tuesday 24 November 2026, 18:00.\nNotes saved so far: 1.",  # after the tool's `set`
        "It is Tuesday 24 November 2026, 18:07.\nNotes saved so far: 1.",
        "It is Tuesday 24 November 2026, 18:14.\nNotes saved so far: 1.",
    ]
    # everything before the context is the previous call's prompt, grown: a prefix a cache keeps
    for before, after in zip(sent, sent[1:], strict=False):
        kept = before["messages"][:-1]
        assert after["messages"][:len(kept)] == kept
    # never kept: not in the memory, not in the history
    assert not any(isinstance(m, ContextMessage) for m in session.memory())
    assert "Notes saved so far" not in json.dumps(session.history) and "It is Tuesday" not in json.dumps(session.history)
    # the key of the bot's route, on every call
    assert {body.get("prompt_cache_key") for body in sent} == {"desk/main"}


def test_the_provider_s_cached_tokens_reach_each_call_s_usage_and_the_turn_s(cache, write_bot):
    session = desk_session(write_bot)
    three_turns(session, cache)
    calls = [call for entry in session.history for call in entry["usage"]["by_call"]]
    cached = [call["cached_input_tokens"] for call in calls]
    assert cached[0] == 0 and all(n > 0 for n in cached[1:])  # the first call warmed the cache
    assert all(call["cached_input_tokens"] < call["input_tokens"] for call in calls)  # the context never is
    assert [entry["usage"]["cached_input_tokens"] for entry in session.history] == [
        cached[0] + cached[1], cached[2], cached[3]]
    assert session.usage["cached_input_tokens"] == sum(cached)


def test_a_clock_in_the_system_prompt_makes_every_call_a_cache_miss(cache, write_bot):
    """The contrast (and why `validate` warns): the same bot with the clock in `system:`."""
    text = DESK.replace("""    system: |
      You keep the user's notes. Call note to save one. Be brief.
    context: |
      It is""", """    system: |
      You keep the user's notes. Call note to save one. Be brief.
      It is""")
    session = desk_session(write_bot, text)
    cache.queue({"text": "Hi."}, {"text": "Hi again."})
    session.chat("hello")
    session.clock.advance(timedelta(minutes=1))
    session.chat("hello?")
    assert [entry["usage"]["cached_input_tokens"] for entry in session.history] == [0, 0]
    first, second = (body["messages"][0]["content"] for body in cache.requests)
    assert first != second and "18:01" in second


def test_the_bot_s_context_serves_every_route_but_one_with_its_own_and_blank_sends_nothing(fake, write_bot):
    text = """\
name: two
format: 3
model: {provider: openai, name: gpt-4o-mini, stream: false}
state: {mood: calm}
context: "Mood: {{ state.mood }}."
routes:
  main:
    default: true
    system: Talk.
    tools: [quiet]
  quiet:
    system: Whisper.
    context: "{% if state.mood == 'loud' %}Shout back.{% endif %}"
tools:
  quiet:
    description: Go quiet
    action: {route: quiet}
"""
    fake.queue({"tool_calls": [{"name": "quiet", "arguments": {}}]}, {"text": "shh"})
    session = chatrun.load_bot(write_bot(text)).session()
    session.chat("hi")
    session.chat("psst")
    main, quiet = fake.requests
    assert main["messages"][-1] == {"role": "system", "content": "Mood: calm."}
    assert [m["role"] for m in quiet["messages"]] == ["system", "user"]  # its own context rendered blank
    # OPENAI_BASE_URL is not OpenAI's: without `prompt_cache: true` no key is sent
    assert "prompt_cache_key" not in main


def test_prompt_cache_sends_the_key_as_said(fake, write_bot):
    from chatrun.definition.config import ModelConfig
    from chatrun.engine.turn import prompt_cache_key
    from chatrun.models.openai_model import DEFAULT_BASE_URL, sends_cache_key

    assert sends_cache_key(ModelConfig(), DEFAULT_BASE_URL) and not sends_cache_key(ModelConfig(), fake.base_url)
    assert sends_cache_key(ModelConfig(prompt_cache=True), fake.base_url)
    assert not sends_cache_key(ModelConfig(prompt_cache=False), DEFAULT_BASE_URL)
    long = prompt_cache_key("b" * 40, "r" * 40)
    assert len(long) <= 64 and long == prompt_cache_key("b" * 40, "r" * 40) != prompt_cache_key("b" * 40, "s" * 40)
    text = DESK.replace("prompt_cache: true", "prompt_cache: false")
    fake.queue({"text": "ok"})
    desk_session(write_bot, text).chat("hi")
    assert "prompt_cache_key" not in fake.requests[0]


# -- the warning ------------------------------------------------------------------------------------

WARNED = """\
name: warned
format: 3
model: {provider: scripted}
state: {booking: null}
routes:
  main:
    default: true
    system: |
      You are the desk. {{ principal.name if principal else '' }}
      The time: {{ now }}.
    context: "{{ today }} {{ state.booking }}"
    tools: []
  other:
    entry: true
    system: "Booking {{ state.booking }}, {{ scope.step }} {{ user_message }}"
    scope: {local: {step: 1}}
"""


def test_validate_warns_at_the_line_of_a_system_template_reading_the_clock_or_the_state(write_bot):
    path = write_bot(WARNED)
    _config, found = check_bot(path)
    warned = [(d.line, d.message.split(", which")[0]) for d in found if "prompt cache" in d.message]
    assert warned == [
        (10, "`system` of route `main` reads `now`"),  # the template's second line; principal is stable
        (15, "`system` of route `other` reads `state.booking`, `scope.step`, `user_message`"),
    ]
    assert len(found) == 2
    assert all(d.severity == "warning" and d.file == str(path) and "`context:`" in d.message for d in found)
    assert "Stable prompts" in found[0].message and "prompt_cache: false" in found[0].message


def test_no_warning_with_prompt_cache_false_or_for_what_is_in_the_context(write_bot):
    path = write_bot(WARNED.replace("model: {provider: scripted}", "model: {provider: scripted, prompt_cache: false}"))
    assert check_bot(path)[1] == []
    stable = WARNED.replace("      The time: {{ now }}.\n", "").replace(
        '    system: "Booking {{ state.booking }}, {{ scope.step }} {{ user_message }}"',
        '    system: Book.\n    context: "Booking {{ state.booking }}, {{ scope.step }} {{ user_message }}"')
    assert check_bot(write_bot(stable, name="stable.yaml"))[1] == []
    # a context template is checked as any template is
    _config, found = check_bot(write_bot(stable.replace("{{ today }}", "{{ todya }}"), name="typo.yaml"))
    assert [d.message.split(";")[0] for d in found] == ["`context` of route `main` uses unknown template variable "
                                                        "`todya`"]


def test_the_inspector_shows_the_context_the_next_call_will_end_with(write_bot):
    from chatrun.server.inspect import memory_message

    session = desk_session(write_bot)
    preview = session.preview_messages()
    assert [m.role for m in preview] == ["system", "context"]
    assert preview[-1] == ContextMessage("It is Tuesday 24 November 2026, 18:00.\nNotes saved so far: 0.")
    assert memory_message(preview[-1]) == {"role": "system", "content": preview[-1].content, "context": True}


def test_a_transcript_checks_the_context_a_call_was_sent(tmp_path):
    (tmp_path / "bot.yaml").write_text(DESK.replace("provider: openai", "provider: scripted"))
    transcript = tmp_path / "t.yaml"
    transcript.write_text("""\
bot: bot.yaml
clock: 2026-11-24T18:00:00+01:00
turns:
  - user: hi
    model: [{text: Hello.}]
    expect:
      sent: [{system: "You keep the user's notes. Call note to save one. Be brief.", context: {regex: "18:00"}}]
""")
    assert chatrun.run_transcript(str(transcript)).passed
    transcript.write_text(transcript.read_text().replace('{regex: "18:00"}', "null"))
    result = chatrun.run_transcript(str(transcript))
    assert not result.passed and "Notes saved so far: 0." in repr(result.turns[0])
