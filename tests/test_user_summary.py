"""The summary a bot keeps of a user when a conversation ends (`user_memory.summary:`, issue 37).

Through real parts: the real `openai` client against the fake OpenAI server, SQLite (and the
server's stores over HTTP), the real loader, validator and transcript runner. The conversation
that ends writes the summary with one model call that reads the conversation; the NEXT
conversation of the same user reads it in its context; it is written once however the
conversation ends and however a request is retried; a failing call keeps what was kept before.
"""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

import chatrun
from chatrun.definition.loader import check_bot
from chatrun.server.auth import Auth
from chatrun.store import open_store
from chatrun.store.user_memory import user_memory_key
from chatrun.transcripts.run import run_transcript
from server_support import app_for_testclient
from store_params import STORES
from store_params import store_url as store_url_of

BOT = """
name: concierge
format: 3
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
user_memory:
  facts: [seat]
  summary: {when: WHEN}
OUTCOMES
routes:
  desk:
    default: true
    system: You are a concierge.
    context: "{% if user_memory.summary %}Earlier: {{ user_memory.summary }}{% else %}A new guest.{% endif %}"
    tools: [note_seat, goodbye]
tools:
  note_seat:
    description: Remember the seat the user prefers
    parameters: {type: object, properties: {seat: {type: string}}, required: [seat]}
    action: {emit: {SeatNoted: "{{ args.seat }}"}, remember: {seat: "{{ args.seat }}"}, reply: Noted.}
  goodbye:
    description: End the conversation
    action: {message: Goodbye!, end: true}
"""
ANA = {"name": "ana", "roles": []}
BYE = {"tool_calls": [{"name": "goodbye", "arguments": {}}]}


def bot_text(when: str = "end", outcomes: str = "") -> str:
    return BOT.replace("WHEN", when).replace("OUTCOMES", outcomes)


def contexts(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "system"][1:]


def summary_requests(fake) -> list[dict]:
    """The summarizing calls the fake received (their system message is the summary prompt)."""
    return [r for r in fake.requests if "note of what an assistant should remember" in r["messages"][0]["content"]]


def test_the_ending_conversation_writes_a_summary_the_next_one_reads(fake, write_bot, tmp_path):
    bot = chatrun.load_bot(write_bot(bot_text()))
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    session = bot.session(store=store, principal=ANA, meta={"owner": "ana"})
    fake.queue({"text": "Of course."}, BYE, {"text": "Ana wants a late check-out on Friday."})
    session.chat("Can I check out late on Friday?")
    assert summary_requests(fake) == []  # not before the conversation ends
    events = session.chat("That's all, thanks")
    assert [e.type for e in events][-1] == "ConversationEnded"
    [call] = summary_requests(fake)
    assert "user: Can I check out late on Friday?\nassistant: Of course.\nuser: That's all, thanks" in \
        call["messages"][1]["content"]
    assert session.last_turn["summaries"] == [{"user_memory": "summary", "written": 37}]
    fake.queue({"text": "Welcome back."})
    bot.session(store=store, principal=ANA).chat("Hello")
    assert contexts(fake.requests[-1]) == ["Earlier: Ana wants a late check-out on Friday."]
    # The next ending reads the note kept so far and replaces it.
    fake.queue(BYE, {"text": "Ana wants a late check-out; she asked again."})
    bot.session(store=store, principal=ANA, meta={"owner": "ana"}).chat("Bye")
    assert "Note kept so far:\nAna wants a late check-out on Friday." in summary_requests(fake)[-1]["messages"][1]["content"]
    record = store.get_record(user_memory_key("concierge", "ana"))
    assert record["facts"]["summary"]["value"] == "Ana wants a late check-out; she asked again."


def test_a_failing_summary_call_keeps_the_turn_the_facts_and_the_earlier_summary(fake, write_bot, tmp_path, caplog):
    bot = chatrun.load_bot(write_bot(bot_text()))
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    fake.queue(BYE, {"text": "Ana was here."})
    bot.session(store=store, principal=ANA).chat("Bye")
    fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "aisle"}}]}, BYE,
               {"status": 500}, {"status": 500})
    session = bot.session(store=store, principal=ANA)
    events = session.chat("Aisle, and goodbye")
    assert "Goodbye!" in [e.data for e in events if e.type == "Message"]
    assert session.ended is not None and session.last_turn["ok"] is True
    assert session.last_turn["summaries"][0]["failed"].startswith("ModelUnavailable")
    assert "writing the user's summary at the conversation's end failed (skipped" in caplog.text
    kept = store.get_record(user_memory_key("concierge", "ana"))["facts"]
    assert (kept["summary"]["value"], kept["seat"]["value"]) == ("Ana was here.", "aisle")


def test_a_summary_cut_off_at_its_length_limit_keeps_the_note_kept_before(fake, write_bot, tmp_path):
    """The call that writes the new note is given the note kept so far: an answer cut off at its
    `max_tokens` is the start of a note, and taking it would drop what the old note ended with."""
    bot = chatrun.load_bot(write_bot(bot_text()))
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    fake.queue(BYE, {"text": "Ana likes aisle seats and late check-outs."})
    bot.session(store=store, principal=ANA).chat("Bye")
    fake.queue(BYE, {"text": "Ana likes aisle", "finish_reason": "length"})
    session = bot.session(store=store, principal=ANA)
    session.chat("Bye again")
    assert session.ended is not None and session.last_turn["ok"] is True
    [failed] = session.last_turn["summaries"]
    assert "cut off at its length limit" in failed["failed"] and "route desk's model" in failed["failed"]
    kept = store.get_record(user_memory_key("concierge", "ana"))["facts"]
    assert kept["summary"]["value"] == "Ana likes aisle seats and late check-outs."


def test_written_once_at_the_first_of_end_and_outcome(fake, write_bot, tmp_path):
    outcomes = "outcomes:\n  seat_noted: {event: SeatNoted}\n"
    bot = chatrun.load_bot(write_bot(bot_text("[end, outcome]", outcomes)))
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    session = bot.session(store=store, principal=ANA)
    fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "aisle"}}]}, {"text": "Noted."},
               {"text": "Likes aisle seats."})
    session.chat("Aisle, please")
    assert len(summary_requests(fake)) == 1  # the outcome was recorded: the conversation is over for the summary
    fake.queue(BYE)
    session.chat("Bye")
    assert len(summary_requests(fake)) == 1 and session.ended is not None  # the end writes nothing more
    assert session.user_memory["summary"] == "Likes aisle seats."


def test_no_one_signed_in_no_summary_call(fake, write_bot, tmp_path):
    bot = chatrun.load_bot(write_bot(bot_text()))
    fake.queue(BYE)
    session = bot.session(store=open_store(f"sqlite:///{tmp_path / 'c.db'}"))
    session.chat("Bye")
    assert summary_requests(fake) == [] and session.ended is not None


@pytest.fixture(params=STORES)
def url(request, tmp_path):
    return store_url_of(request, tmp_path)


def test_over_http_the_summary_is_carried_listed_and_erased_and_a_retry_writes_it_once(fake, write_bot, url):
    auth = Auth.from_mapping({"tokens": {"token-ana-123": {"principal": "ana"}}})
    app = app_for_testclient([str(write_bot(bot_text()))], url, auth=auth)
    ana = {"Authorization": "Bearer token-ana-123"}

    def say(sid: str, text: str, request_id: str | None = None) -> dict:
        keyed = {**ana, **({"Idempotency-Key": request_id} if request_id else {})}
        answer = client.post(f"/bots/concierge/sessions/{sid}/messages", json={"userMessage": text}, headers=keyed)
        assert answer.status_code == 200, answer.text
        return answer.json()

    with TestClient(app) as client:
        assert client.post("/bots/concierge/sessions", json={"id": "s1"}, headers=ana).status_code == 201
        fake.queue({"tool_calls": [{"name": "note_seat", "arguments": {"seat": "aisle"}}]}, BYE,
                   {"text": "Ana likes aisle seats."})
        first = say("s1", "Aisle, and goodbye", "r-1")
        again = say("s1", "Aisle, and goodbye", "r-1")  # the retry is answered from the store
        assert again["replayed"] is True and again["events"] == first["events"]
        assert len(summary_requests(fake)) == 1
        listed = client.get("/bots/concierge/user-memory", headers=ana).json()["facts"]
        assert {(f["fact"], f["value"], f.get("summary", False)) for f in listed} == {
            ("seat", "aisle", False), ("summary", "Ana likes aisle seats.", True)}
        assert client.post("/bots/concierge/sessions", json={"id": "s2"}, headers=ana).status_code == 201
        fake.queue({"text": "Welcome back."})
        say("s2", "Hello")
        assert contexts(fake.requests[-1]) == ["Earlier: Ana likes aisle seats."]
        gone = client.delete("/bots/concierge/user-memory/summary", headers=ana)
        assert gone.status_code == 200 and gone.json()["erased"] == 1
        assert [f["fact"] for f in client.get("/bots/concierge/user-memory", headers=ana).json()["facts"]] == ["seat"]
        assert client.delete("/bots/concierge/user-memory/nothing", headers=ana).json()["erased"] == 0
        assert client.delete("/bots/concierge/user-memory", headers=ana).json()["erased"] == 1


TRANSCRIPT = """
bot: bot.yaml
principal: {name: ana}
turns:
  - user: Bye
    model: MODEL
    expect:
      events: [{Message: Goodbye!}, {ConversationEnded: {route: desk, tool: goodbye}}]
"""


@pytest.mark.parametrize(("model", "written"), [
    ('[{tool_calls: [{name: goodbye, arguments: {}}]}]', False),
    ('[{tool_calls: [{name: goodbye, arguments: {}}]}, {text: "Ana said goodbye."}]', True),
])
def test_a_replayed_transcript_summarizes_only_when_it_scripts_the_answer(write_bot, tmp_path, model, written):
    write_bot(bot_text())
    path = tmp_path / "t.yaml"
    path.write_text(TRANSCRIPT.replace("MODEL", model))
    result = run_transcript(str(path))
    # Passing proves it both ways: a summary call without an answer left fails the turn ("needed more
    # model responses"), and an answer the summary did not take fails it too ("left unused").
    assert result.passed, result.report()
    assert written is (len(result.turns[0].observed.sent) == 2)


def test_the_validator_refuses_a_fact_named_summary_and_warns_about_when_outcome_without_outcomes(write_bot):
    text = bot_text().replace("facts: [seat]", "facts: [seat, summary]")
    with pytest.raises(chatrun.errors.BotError) as refused:
        chatrun.load_bot(write_bot(text))
    assert "bot.yaml:6:" in str(refused.value) and "`user_memory.facts` names `summary`" in str(refused.value)
    _, found = check_bot(write_bot(bot_text("outcome"), "outcome.yaml"))
    assert [(d.line, d.message[:60]) for d in found if d.severity == "warning"] == [
        (7, "`user_memory.summary` is written `when: outcome`, but the bo")]


def test_the_summary_goes_with_retention_and_with_the_principals_erasure(tmp_path):
    import asyncio

    from chatrun.definition.config import Retention
    from chatrun.store.aio import open_async_store
    from chatrun.store.retention import erase_principal
    from chatrun.store.user_memory import aexpire, aload, asave

    async def run() -> None:
        store = open_async_store(f"sqlite:///{tmp_path / 'c.db'}")
        try:
            await asave(store, "concierge", "ana", {"summary": "Ana was here."}, None, now=1000.0)
            await asave(store, "concierge", "bob", {"summary": "Bob was here.", "seat": "aisle"}, None, now=1000.0)
            assert await aexpire(store, "concierge", keep=100.0, now=1050.0) == 0
            await asave(store, "concierge", "bob", {"seat": "window"}, None, now=1900.0)  # bob's seat is written again
            assert await aexpire(store, "concierge", keep=100.0, now=2000.0) == 2  # both summaries are too old
            assert await aload(store, "concierge", "bob", None, 2000.0) == {"seat": "window"}
            await asave(store, "concierge", "ana", {"summary": "Ana came back."}, None, now=2000.0)
            counts = await erase_principal(store, "ana", lambda bot: Retention(), None, None)  # type: ignore[arg-type]
            assert counts.user_memory == 1 and await store.get_record(user_memory_key("concierge", "ana")) is None
        finally:
            await store.close()

    asyncio.run(run())


def test_a_conversation_the_user_left_is_summarized_when_its_silence_is_recorded(fake, write_bot, tmp_path):
    from datetime import UTC, datetime, timedelta

    from chatrun import Expire, FixedClock

    outcomes = "outcomes:\n  abandoned: {silent_for: 30m}\n"
    bot = chatrun.load_bot(write_bot(bot_text("outcome", outcomes)))
    start = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)
    session = bot.session(store=open_store(f"sqlite:///{tmp_path / 'c.db'}"), principal=ANA, meta={"owner": "ana"})
    session.clock = FixedClock(start)
    fake.queue({"text": "Which day would you like?"})
    session.chat("I'd like a spa appointment")
    assert summary_requests(fake) == []
    # The sweeper's Expire, in another process, once the silence is due: the outcome and the summary.
    later = bot.session(session_id=session.id, store=open_store(f"sqlite:///{tmp_path / 'c.db'}"), principal=ANA)
    later.clock = FixedClock(start + timedelta(minutes=31))
    fake.queue({"text": "Ana asked for a spa appointment; the day is still open."})
    assert [e.data["name"] for e in later.chat(Expire()) if e.type == "Outcome"] == ["abandoned"]
    [call] = summary_requests(fake)
    assert "user: I'd like a spa appointment\nassistant: Which day would you like?" in call["messages"][1]["content"]
    fake.queue({"text": "Hello again."})
    bot.session(store=open_store(f"sqlite:///{tmp_path / 'c.db'}"), principal=ANA).chat("Hi")
    assert contexts(fake.requests[-1]) == ["Earlier: Ana asked for a spa appointment; the day is still open."]


def test_a_failing_summarys_text_is_redacted_on_its_span_and_in_the_log(fake, write_bot, tmp_path, caplog, spans):
    """The summarizing call runs after the turn's span has ended: its span's status and the log line
    of its failure kept what the endpoint said (here, the card the conversation held) as it was."""
    import logging

    from leak_support import card_leaked
    guarded = bot_text().replace("user_memory:", "guardrails:\n  - {name: cards, pii: [card], stages: [storage], "
                                                 "outcome: redact}\nuser_memory:")
    bot = chatrun.load_bot(write_bot(guarded))
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    echoed = {"status": 400, "body": {"error": {"message": "cannot read 'card 4111 1111 1111 1111'",
                                                "type": "invalid_request_error"}}}
    fake.queue(BYE, echoed)
    caplog.set_level(logging.DEBUG)
    session = bot.session(store=store, principal=ANA)
    session.chat("My card is 4111 1111 1111 1111, goodbye")
    assert session.last_turn["summaries"][0]["failed"].endswith("HTTP 400: cannot read 'card [card]'")
    [failed] = [s for s in spans.get_finished_spans() if s.status.description]
    assert failed.status.description.endswith("HTTP 400: cannot read 'card [card]'")
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("chatrun"))
    assert "writing the user's summary at the conversation's end failed" in logged
    assert "cannot read 'card [card]'" in logged and not card_leaked(logged)
