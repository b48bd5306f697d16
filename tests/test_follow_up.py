"""Follow-ups (issue 36, "proactive messages"): a route's `follow_up:` writes to the user once
after their silence, run by `Expire` on the session clock (the server's sweeper runs it; here
the library does), armed by each turn that ends on the route and disarmed by one that leaves it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import chatrun
from chat_support import call
from chatrun import Expire, FixedClock
from chatrun.engine.session import REPLY_TO
from chatrun.models.scripted import ScriptedModel
from chatrun.store.record import OUTBOX_KEY, SessionRecord
from chatrun.store.sqlite import SQLiteStore

BOOKING = """
name: booking
model: {provider: scripted, name: gpt-4o-mini}
state: {city: null}
locales: [en]
routes:
  main:
    default: true
    system: You help.
    tools: [start_booking]
  wizard:
    system: Ask for the city.
    tools: [done]
    follow_up:
      after: 2h
      message: "{{ t('nudge', name='Ann') }} City so far: {{ state.city or 'none' }}."
tools:
  start_booking:
    description: Start booking
    action: {route: wizard}
  done:
    description: Finish
    action: {route: main}
"""

START = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)


@pytest.fixture
def bot(write_bot):
    return load(write_bot, BOOKING)


def load(write_bot, text):
    path = write_bot(text)
    (path.parent / "locales").mkdir(exist_ok=True)
    (path.parent / "locales" / "en.yaml").write_text("nudge: Still there, {name}? Your seats are held.\n")
    return chatrun.load_bot(path)


def in_wizard(bot, store=None, meta=None):
    model = ScriptedModel([call("start_booking")])
    session = bot.session(model=model, store=store, meta=meta) if store is not None else \
        bot.session(model=model, meta=meta)
    session.clock = FixedClock(START)
    session.chat("I want to book")
    return session, model


def at(session, **delta):
    session.clock = FixedClock(START + timedelta(**delta))
    return session


def messages(events):
    return [e.data for e in events if e.type == "Message"]


def test_a_silence_on_the_route_gets_the_follow_up_once(bot):
    session, model = in_wizard(bot)
    assert session.next_due == (START + timedelta(hours=2)).isoformat()
    assert at(session, hours=1, minutes=59).chat(Expire()) == []  # not yet: no turn
    turns, asked = session.turn_count, len(model.requests)
    events = at(session, hours=2).chat(Expire())
    assert messages(events) == ["Still there, Ann? Your seats are held. City so far: none."]
    assert events[0].meta == {"from": "follow_up", "route": "wizard"}
    assert session.turn_count == turns + 1 and session.next_due is None
    assert at(session, hours=9).chat(Expire()) == []  # once: the silence has had its follow-up
    # The model knows it reminded: the text is in the route's memory.
    assert session.memory()[-1].content.startswith("Still there, Ann?")
    assert len(model.requests) == asked  # the follow-up asked no model


def test_the_users_message_starts_the_silence_again(bot):
    session, model = in_wizard(bot)
    model.add("Noted.")
    at(session, hours=1).chat("Hmm, let me think")
    assert session.next_due == (START + timedelta(hours=3)).isoformat()
    assert at(session, hours=2, minutes=30).chat(Expire()) == []
    assert messages(at(session, hours=3).chat(Expire()))  # fired 2 h after the last word
    model.add("Ok.")
    at(session, hours=4).chat("Paris")
    assert session.next_due == (START + timedelta(hours=6)).isoformat()  # armed again by the new word


def test_leaving_the_route_disarms_it(bot):
    session, model = in_wizard(bot)
    model.add(call("done"), "Booked.")
    at(session, minutes=10).chat("Done")
    assert session.route == "main" and session.next_due is None
    assert at(session, hours=5).chat(Expire()) == []


def test_a_failed_turn_keeps_the_armed_follow_up(bot):
    session, model = in_wizard(bot)
    events = at(session, hours=1).chat("still here?")
    assert events[-1].type == "Error"
    assert session.next_due == (START + timedelta(hours=2)).isoformat()  # rolled back: as before


def test_the_due_time_is_in_the_stores_index(bot, tmp_path):
    store = SQLiteStore(str(tmp_path / "s.db"))
    session, _ = in_wizard(bot, store)
    due = (START + timedelta(hours=2)).timestamp()
    assert store.list_due(due - 1) == [] and store.list_due(due) == [session.id]
    at(session, hours=2).chat(Expire())
    assert store.list_due(due + 10_000) == []
    record = store.load_session(session.id)
    assert record is not None and SessionRecord.of(session.id, record, "v", "{}").due is None


def test_whatsapp_past_24_hours_is_refused_without_a_template(bot, write_bot, caplog):
    late = load(write_bot, BOOKING.replace("after: 2h", "after: 25h"))
    meta = {REPLY_TO: {"sink": "channel:whatsapp", "address": {"to": "4917"}}}
    session, _ = in_wizard(late, meta=meta)
    events = at(session, hours=25).chat(Expire())
    assert messages(events) == []
    refused = [e for e in events if e.type == "FollowUpRefused"]
    assert refused and "within 24 hours" in refused[0].data["reason"] and refused[0].audience == "backend"
    assert "whatsapp_template" in caplog.text and session.next_due is None
    assert OUTBOX_KEY not in session.last_turn  # nothing goes to WhatsApp


def test_whatsapp_past_24_hours_sends_the_declared_template(write_bot):
    text = BOOKING.replace("after: 2h", "after: 25h\n      whatsapp_template: {name: booking_reminder, language: de}")
    meta = {REPLY_TO: {"sink": "channel:whatsapp", "address": {"to": "4917"}}}
    session, _ = in_wizard(load(write_bot, text), meta=meta)
    events = at(session, hours=25).chat(Expire())
    assert events[0].meta["whatsapp_template"] == {"name": "booking_reminder", "language": "de"}
    [reply] = session.last_turn[OUTBOX_KEY]
    assert reply["sink"] == "channel:whatsapp" and reply["body"]["data"]["events"][0]["meta"]["whatsapp_template"]


def test_other_channels_get_the_follow_up_through_the_outbox(bot):
    meta = {REPLY_TO: {"sink": "channel:telegram", "address": {"chat_id": 7}}}
    session, _ = in_wizard(bot, meta=meta)
    at(session, hours=30).chat(Expire())
    [reply] = session.last_turn[OUTBOX_KEY]
    assert reply["sink"] == "channel:telegram" and reply["body"]["data"]["to"] == {"chat_id": 7}
    assert reply["body"]["data"]["events"][0]["data"].startswith("Still there")


def test_on_the_phone_it_is_refused_with_a_reason_not_kept_silently(bot, caplog):
    session, _ = in_wizard(bot, meta={"call": "CA0123"})  # a Twilio call's session (channels/twilio.py)
    events = at(session, hours=3).chat(Expire())
    assert messages(events) == []
    [refused] = [e for e in events if e.type == "FollowUpRefused"]
    assert "phone call cannot be written to" in refused.data["reason"] and refused.audience == "backend"
    assert "not sent on the phone" in caplog.text and session.next_due is None


WHATSAPP = """
env: {T: {secret: true}, S: {secret: true}, V: {secret: true}}
channels: {whatsapp: {token: T, app_secret: S, verify_token: V}}
"""


def diagnostics(write_bot, text):
    from chatrun.definition.loader import check_bot

    return [(d.line, d.severity, d.message) for d in check_bot(write_bot(text))[1]]


def test_the_validator_checks_follow_ups_at_their_line(write_bot):
    plain = BOOKING.replace("locales: [en]\n", "").replace("{{ t('nudge', name='Ann') }}", "Still there?")
    bad = diagnostics(write_bot, plain.replace("after: 2h", "after: 2 hours"))
    assert any(sev == "error" and line == 14 and "duration" in msg for line, sev, msg in bad), bad
    late = diagnostics(write_bot, plain.replace("after: 2h", "after: 2d") + WHATSAPP)
    assert [(line, msg[:60]) for line, sev, msg in late if "follow-up" in msg] == [
        (14, "route `wizard`'s follow-up comes more than 24 hours after th")]
    unused = diagnostics(write_bot, plain.replace("after: 2h", "after: 2h\n      whatsapp_template: {name: x}"))
    assert any("no `whatsapp` channel" in msg and line == 15 for line, sev, msg in unused), unused
    typo = diagnostics(write_bot, plain.replace("state.city or", "state.cty or"))
    assert any(line == 15 and "cty" in msg for line, sev, msg in typo), typo
    phone = diagnostics(write_bot, plain + "env: {TW: {secret: true}}\nchannels: {twilio: {auth_token: TW}}\n")
    assert [(line, msg[:62]) for line, sev, msg in phone if "follow-up" in msg] == [
        (13, "route `wizard` has a follow-up, but the bot's only channel is ")]
    untranslated = diagnostics(write_bot, BOOKING.replace("\"{{ t('nudge', name='Ann') }}", "\"Hello"))
    assert any(line == 16 and "untranslated" in msg for line, sev, msg in untranslated), untranslated


def test_an_operator_in_the_conversation_disarms_it_and_the_release_arms_it(bot):
    from chatrun import Release, TakeOver

    session, _ = in_wizard(bot)
    session.principal = {"name": "olga", "roles": ["operators"]}
    session.roles = {"operators"}
    at(session, minutes=5).chat(TakeOver())
    assert session.next_due is None and at(session, hours=5).chat(Expire()) == []
    at(session, hours=6).chat(Release())
    assert session.route == "wizard" and session.next_due == (START + timedelta(hours=8)).isoformat()


def test_a_conversation_handed_to_the_operators_gets_no_follow_up_while_it_waits(write_bot):
    """The bot handed the conversation over (an `operator:` action); nobody has taken it yet. The
    bot is silent meanwhile, as when an operator has it: no follow-up nudges the waiting user."""
    bot = load(write_bot, BOOKING.replace("    tools: [done]\n", "    tools: [done, human]\n", 1)
               + "  human:\n    description: Hand over\n    action: {operator: {text: A colleague comes.}}\n")
    session, model = in_wizard(bot)
    model.add(call("human"))
    at(session, minutes=5).chat("a person please")
    assert [i.kind for i in session.pending] == ["takeover"] and session.taken_over is None
    assert session.next_due is None
    assert messages(at(session, hours=5).chat(Expire())) == []


@pytest.mark.parametrize(("declared", "locale", "language"), [
    ("", "de", "de"),  # none declared: the session's own, as WhatsApp spells it
    ("", "pt-BR", "pt_BR"),
    (", language: en", "de", "en"),  # declared: as declared
])
def test_a_whatsapp_template_without_a_language_is_sent_in_the_sessions_locale(write_bot, declared, locale, language):
    """The template's language was `en` whatever the session spoke: a German user, whose every
    other message was German, got the English template (WhatsApp approves one per language,
    under one name). Without `language:` it is now the session's locale."""
    text = BOOKING.replace("locales: [en]", "locales: [en, de, pt-BR]").replace(
        "after: 2h", "after: 25h\n      whatsapp_template: {name: booking_reminder" + declared + "}")
    path = write_bot(text)
    (path.parent / "locales").mkdir(exist_ok=True)
    for tag in ("en", "de", "pt-BR"):
        (path.parent / "locales" / f"{tag}.yaml").write_text(f"nudge: ({tag}) {{name}}?\n")
    meta = {REPLY_TO: {"sink": "channel:whatsapp", "address": {"to": "4917"}}, "locale": locale}
    session, _ = in_wizard(chatrun.load_bot(path), meta=meta)
    events = at(session, hours=25).chat(Expire())
    assert events[0].meta["whatsapp_template"] == {"name": "booking_reminder", "language": language}
