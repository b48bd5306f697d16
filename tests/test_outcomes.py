"""Outcomes (issue 38): the bot's `outcomes:` recorded once per conversation — the first whose
condition holds, in the order written — kept in the stored session, emitted as an `Outcome`
backend event; `silent_for` outcomes are tried by Expire (the sweeper's) once due."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

import chatrun
from chat_support import call
from chatrun import Expire, FixedClock
from chatrun.definition.loader import check_bot
from chatrun.errors import BotError
from chatrun.models.scripted import ScriptedModel
from chatrun.store.record import SessionRecord
from chatrun.store.sqlite import SQLiteStore

DESK = """
name: desk
model: {provider: scripted, name: gpt-4o-mini}
prices: {gpt-4o-mini: {input: 1.0, output: 2.0}}
state: {order_id: null}
events:
  TicketClosed: {audience: backend}
outcomes:
  converted: {if: state.order_id}
  resolved: {event: TicketClosed}
  escalated: {route: human}
  abandoned: {silent_for: 30m}
routes:
  main:
    default: true
    system: You help.
    tools: [close_ticket, escalate, order]
  human:
    system: A person will answer.
tools:
  close_ticket:
    description: Close the ticket
    action: {emit: {TicketClosed: {why: done}}}
  escalate:
    description: Hand over to a person
    action: {route: human}
  order:
    description: Place an order
    action: {set: {state.order_id: "A1"}}
"""

START = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)


@pytest.fixture
def desk(write_bot):
    return chatrun.load_bot(write_bot(DESK))


def session_with(bot, answers, store=None, meta=None):
    session = bot.session(model=ScriptedModel(answers), store=store or SQLiteStore(":memory:"), meta=meta)
    session.clock = FixedClock(START)
    return session


def at(session, **delta):
    session.clock = FixedClock(START + timedelta(**delta))
    return session


def outcome_events(events):
    return [e.data for e in events if e.type == "Outcome"]


def test_the_first_matching_outcome_is_recorded_once_even_when_it_matches_again(desk):
    session = session_with(desk, [call("close_ticket"), "Done.", call("close_ticket"), "Closed again."])
    first = session.chat("close it")
    assert outcome_events(first) == [{"name": "resolved", "turn": 1, "route": "main", "at": START.isoformat()}]
    assert [e.audience for e in first if e.type == "Outcome"] == ["backend"]
    again = at(session, minutes=5).chat("close it again")
    assert outcome_events(again) == []  # the condition holds again: nothing new is recorded
    assert session.snapshot()["outcome"]["name"] == "resolved"
    assert session.next_due is None  # recorded: no silence to wait for


def test_order_written_decides_when_two_hold(desk):
    # The order tool sets state.order_id; the ticket closes in the same turn: `converted` is written first.
    session = session_with(desk, [{"tool_calls": [{"name": "order", "arguments": {}},
                                                  {"name": "close_ticket", "arguments": {}}]}, "Ordered."])
    assert [o["name"] for o in outcome_events(session.chat("buy"))] == ["converted"]


def test_a_silence_is_armed_and_recorded_by_expire_and_survives_a_restart(desk, tmp_path):
    store = SQLiteStore(str(tmp_path / "s.db"))
    session = session_with(desk, ["Hello, how can I help?"], store=store)
    assert outcome_events(session.chat("hi")) == []
    due = (START + timedelta(minutes=30)).isoformat()
    assert session.next_due == due
    record = SessionRecord.decode(session.id, json.dumps(store.load_session(session.id)), "v")
    assert record.due == due  # the stores' due index sees it: the sweeper will come
    assert at(session, minutes=29).chat(Expire()) == []  # not yet: no turn
    # Another process (a restart, a replica) loads the session and expires it.
    again = desk.session(session_id=session.id, model=ScriptedModel([]), store=SQLiteStore(str(tmp_path / "s.db")))
    again.clock = FixedClock(START + timedelta(minutes=31))
    assert [o["name"] for o in outcome_events(again.chat(Expire()))] == ["abandoned"]
    assert again.next_due is None
    assert again.chat(Expire()) == []  # nothing due any more: recorded once


def test_a_user_message_restarts_the_silence(desk):
    session = session_with(desk, ["Hi.", "Sure."])
    session.chat("hi")
    at(session, minutes=20).chat("still here")
    assert session.next_due == (START + timedelta(minutes=50)).isoformat()
    assert at(session, minutes=31).chat(Expire()) == []


def test_a_failed_turn_records_nothing(desk):
    # The ticket closes, then the model has no answer after the tool: the turn fails and rolls back.
    session = session_with(desk, [call("close_ticket")])
    events = session.chat("close it")
    assert any(e.type == "Error" for e in events)
    assert outcome_events(events) == []
    assert "outcome" not in session.snapshot()  # as before the turn: nothing recorded, nothing armed


def test_validate_names_unknown_routes_and_events_with_did_you_mean(write_bot):
    text = DESK.replace("escalated: {route: human}", "escalated: {route: humen}").replace(
        "resolved: {event: TicketClosed}", "resolved: {event: TicketClose}")
    with pytest.raises(BotError) as raised:
        chatrun.load_bot(write_bot(text))
    message = str(raised.value)
    assert "outcome `escalated` names route `humen`, which the bot does not have; did you mean `human`?" in message
    assert ":11:" in message  # the line of `escalated:` under outcomes
    _, diagnostics = check_bot(write_bot(DESK.replace("{event: TicketClosed}", "{event: TicketClose}")))
    found = [d for d in diagnostics if "TicketClose`" in d.message]
    assert found and found[0].severity == "warning" and "did you mean `TicketClosed`?" in found[0].message
    assert found[0].line == 10
