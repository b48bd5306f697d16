"""Stop at the engine (issue 35): a turn whose consumer is cancelled is rolled back and
recorded as stopped, with what the user saw stream and the tools that ran; a `once` tool
that ran stays done. And a user's rating of a turn (Session.rate), kept in the history.
Through real parts: the real `openai` client against the fake server (a model that streams,
then stalls until it is stopped), a SQLite store, the session read back from it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import chatrun
from chatrun.errors import SessionError
from chatrun.store.sqlite import SQLiteStore

REFUNDS = Path(__file__).resolve().parents[1] / "bots" / "refunds"
CUSTOMER = {"name": "ana", "roles": ["customer"]}
REFUND_30 = {"name": "refund", "arguments": {"order": "A1001", "amount": 30}}


def customer_session(store, session_id=None):
    session = chatrun.load_bot(REFUNDS).session(store=store, session_id=session_id)
    session.principal, session.roles = CUSTOMER, {"customer"}
    return session


async def stop_after_first_chunk(session, message) -> list:
    """Run a turn until its first Stream chunk arrives, then cancel it (what every door does)."""
    seen: list = []
    chunk = asyncio.Event()

    async def consume() -> None:
        async for event in session.stream(message):
            seen.append(event)
            if event.type == "Stream":
                chunk.set()

    task = asyncio.ensure_future(consume())
    await chunk.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return seen


def test_a_stopped_turn_is_rolled_back_recorded_and_its_once_call_stays_done(fake, tmp_path):
    store = SQLiteStore(str(tmp_path / "s.db"))
    session = customer_session(store)
    fake.queue({"tool_calls": [REFUND_30]}, {"chunks": ["Refunded ", "30 EUR"], "stall": True})
    asyncio.run(stop_after_first_chunk(session, "Refund 30 EUR on A1001"))

    # Rolled back: the conversation is as before the turn, in the live session and in the store.
    assert session.turn_count == 0 and session.state["refunded"] == 0
    again = customer_session(SQLiteStore(str(tmp_path / "s.db")), session.id)
    assert again.turn_count == 0 and again.state["refunded"] == 0
    [entry] = again.history
    assert entry["ok"] is False and entry["error"] == "cancelled"
    # What the user saw, and what the tools did: the refund ran and is not undone.
    assert entry["stopped"]["shown"].startswith("Refunded")
    assert entry["stopped"]["effects"] == [{"tool": "refund", "effect": "once"}]
    assert [c["tool"] for c in entry["calls"]] == ["refund"]

    # Usable at once, and the refund is not paid twice when the user asks again.
    fake.queue({"tool_calls": [REFUND_30]}, {"text": "It is refunded."})
    events = again.chat("Refund 30 EUR on A1001")
    assert [e.data for e in events if e.type == "Message"] == ["It is refunded."]
    replies = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert replies[-1].startswith("Already done earlier in this conversation")
    assert again.state["refunded"] == 0  # the action did not run again (its first run was rolled back)
    assert [e["ok"] for e in again.history] == [False, True]


def test_a_rating_is_kept_beside_its_turn_and_refused_for_a_turn_that_did_not_run(fake, tmp_path):
    store = SQLiteStore(str(tmp_path / "s.db"))
    session = customer_session(store)
    fake.queue({"text": "Which order?"})
    session.chat("I want a refund")
    kept = session.rate(1, "down", "It should know my order", by=CUSTOMER)
    assert kept == {"turn": 1, "rating": "down", "route": "desk", "comment": "It should know my order", "by": "ana"}
    history = customer_session(SQLiteStore(str(tmp_path / "s.db")), session.id).history
    assert history[-1]["feedback"] == kept and "turn" not in history[-1]
    assert session.turn_count == 1  # a rating is not a turn
    with pytest.raises(SessionError, match="has no turn 2 to rate"):
        session.rate(2, "up")


def test_a_cancelled_achat_is_rolled_back_like_a_stopped_stream(fake, tmp_path):
    # `achat` with no `on()` handlers runs the turn in the caller's own task (no queue): cancelling
    # that task must still roll the turn back, record it, and keep its `once` call done.
    store = SQLiteStore(str(tmp_path / "s.db"))
    session = customer_session(store)
    fake.queue({"tool_calls": [REFUND_30]}, {"chunks": ["Refunded ", "30 EUR"], "stall": True})

    async def cancel_while_the_model_stalls() -> None:
        task = asyncio.ensure_future(session.achat("Refund 30 EUR on A1001"))
        while len(fake.requests) < 2:  # the refund ran; the model's second answer stalls
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_while_the_model_stalls())
    assert session.turn_count == 0 and session.state["refunded"] == 0
    again = customer_session(SQLiteStore(str(tmp_path / "s.db")), session.id)
    [entry] = again.history
    assert entry["ok"] is False and entry["error"] == "cancelled"
    assert entry["stopped"]["effects"] == [{"tool": "refund", "effect": "once"}]
    fake.queue({"tool_calls": [REFUND_30]}, {"text": "It is refunded."})
    assert [e.data for e in again.chat("Refund 30 EUR on A1001") if e.type == "Message"] == ["It is refunded."]
    assert again.state["refunded"] == 0  # not paid twice


SENDER = """
name: sender
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main: {default: true, system: You send., tools: [send]}
tools:
  send:
    description: Send money
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    confirm: "Send {{ args.amount }} EUR?"
    action: {reply: "Sent {{ args.amount }} EUR."}
"""


def test_a_stopped_decision_turn_announces_its_item_again_in_its_record(fake, write_bot, tmp_path):
    """Every door that stops a turn (a closed event stream, a `/v1` client leaving) leaves the
    record: after the Resolved the stream showed, the item's Pending again, as a failed turn does."""
    store = SQLiteStore(str(tmp_path / "s.db"))
    session = chatrun.load_bot(write_bot(SENDER)).session(store=store)
    fake.queue({"tool_calls": [{"name": "send", "arguments": {"amount": 5}}]})
    session.chat("send 5")
    fake.queue({"chunks": ["Sending ", "now"], "stall": True})
    seen = asyncio.run(stop_after_first_chunk(session, "yes"))
    assert [e.type for e in seen if e.type != "Stream"] == ["Resolved"]
    [entry] = [e for e in SQLiteStore(str(tmp_path / "s.db")).load_history(session.id) if not e["ok"]]
    assert entry["error"] == "cancelled"
    told = [(e["type"], e["data"]["id"]) for e in entry["events"] if e["type"] in ("Resolved", "Pending")
            and e.get("audience", "user") == "user"]
    assert told == [("Resolved", "p1"), ("Pending", "p1")]
    assert [p.id for p in session.pending] == ["p1"]
