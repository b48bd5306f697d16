"""Outcomes (issue 38): the bot's `outcomes:` recorded once per conversation — the first whose
condition holds, in the order written — kept in the stored session, emitted as an `Outcome`
backend event; `silent_for` outcomes are tried by Expire (the sweeper's) once due."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner

import chatrun
from chat_support import call
from chatrun import Expire, FixedClock
from chatrun.cli.report import report
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


def test_a_sink_that_takes_outcome_gets_it_once_through_the_outbox(write_bot):
    bot = chatrun.load_bot(write_bot(DESK.replace("outcomes:", """sinks:
  crm:
    webhook: {url: "http://127.0.0.1:9/hook"}
    events: [Outcome]
outcomes:""")))
    store = SQLiteStore(":memory:")
    session = session_with(bot, [call("close_ticket"), "Closed.", call("close_ticket"), "Again."], store=store)
    session.chat("close it")
    session.chat("close it again")
    sent = [e.body for e in store.list_outbox()]
    assert [(b["type"], b["data"]["name"]) for b in sent] == [("Outcome", "resolved")]


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


def test_a_users_rating_is_no_turns_event_so_an_outcome_on_feedback_never_holds(write_bot):
    bot = chatrun.load_bot(write_bot(DESK.replace("  resolved: {event: TicketClosed}\n",
                                                  "  rated: {event: Feedback}\n  resolved: {event: TicketClosed}\n")))
    session = session_with(bot, ["Hello.", "Sorry about that.", call("close_ticket"), "Closed."])
    assert outcome_events(session.chat("hi")) == []
    session.rate(1, "down", "not helpful")
    assert outcome_events(session.chat("that was not helpful")) == []
    assert "name" not in session.snapshot()["outcome"]  # only the silence is armed
    assert outcome_events(session.chat("close it")) == [  # the next outcome that holds
        {"name": "resolved", "turn": 3, "route": "main", "at": START.isoformat()}]


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


# -- chatrun report ----------------------------------------------------------------------------


class Cells(HTMLParser):
    """The report's figures (`<td data-group data-figure data-value>`) and its bars' titles."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[tuple[str, str], float | None] = {}
        self.titles: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "td" and "data-figure" in a:
            self.values[(a["data-group"], a["data-figure"])] = float(a["data-value"]) if a["data-value"] else None
        self._in_title = tag == "title"

    def handle_data(self, data):
        if self._in_title:
            self.titles.append(data)

    def handle_endtag(self, tag):
        self._in_title = False


def run_desk(bot, store, answers, said, locale, *, rate=(), expire_after=None):
    session = session_with(bot, answers, store=store, meta={"locale": locale})
    for text in said:
        session.chat(text)
    for turn, rating in rate:
        session.rate(turn, rating)
    if expire_after is not None:
        at(session, **expire_after).chat(Expire())
    return session


def test_report_counts_outcomes_feedback_cost_and_latency_by_version_and_locale(desk, tmp_path):
    path = tmp_path / "report.db"
    store = SQLiteStore(str(path))
    runs = [
        run_desk(desk, store, [call("close_ticket"), "Closed."], ["close it"], "en", rate=[(1, "up")]),
        run_desk(desk, store, [call("close_ticket"), "Closed."], ["close it"], "de",
                 rate=[(1, "down"), (1, "up")]),  # the later rating of the turn counts
        run_desk(desk, store, [call("escalate")], ["a person please"], "en", rate=[(1, "down")]),
        run_desk(desk, store, ["Hi."], ["hi"], "en", expire_after={"minutes": 31}),  # abandoned
        run_desk(desk, store, [call("order"), "Ordered."], ["buy"], "de"),  # converted
        run_desk(desk, store, ["Hi.", "Yes?"], ["hi", "hello"], "en"),  # no outcome yet
    ]
    # Expired again later: the abandoned conversation stays abandoned, recorded once.
    assert at(runs[3], hours=3).chat(Expire()) == []
    assert [r.snapshot().get("outcome", {}).get("name") for r in runs] == \
        ["resolved", "resolved", "escalated", "abandoned", "converted", None]
    out = tmp_path / "r.html"
    result = CliRunner().invoke(report, ["--store", f"sqlite:///{path}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "6 conversations" in result.output
    page = out.read_text()
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    cells = Cells()
    cells.feed(page)
    v = cells.values
    assert v[("all", "conversations")] == 6
    assert v[("all", "escalation")] == pytest.approx(1 / 6)
    assert v[("all", "containment")] == pytest.approx(5 / 6)
    assert v[("all", "abandonment")] == pytest.approx(1 / 6)
    assert v[("all", "resolution")] == pytest.approx(2 / 6)
    assert v[("all", "csat")] == pytest.approx(2 / 3) and v[("all", "ratings")] == 3
    costs = [store.load_session(r.id)["usage"]["cost"] for r in runs]
    assert all(c > 0 for c in costs)
    assert v[("all", "cost_per_resolved")] == pytest.approx(sum(costs) / 2)
    assert v[("locale en", "conversations")] == 4 and v[("locale de", "conversations")] == 2
    assert v[("locale en", "escalation")] == pytest.approx(1 / 4)
    assert v[("locale de", "containment")] == 1.0 and v[("locale de", "csat")] == 1.0
    version = f"desk@{desk.config.content_version[:8]}"
    assert v[(version, "conversations")] == 6
    turns = [e["seconds"] for r in runs for e in store.load_history(r.id)
             if "turn" in e and e.get("ok") and "decision" not in str(e.get("input"))]
    assert len(turns) == v[("all", "turns")] == 7 and v[("all", "p99")] == pytest.approx(max(turns))
    # The funnel: where conversations end.
    assert {"main resolved: 2", "main abandoned: 1", "main converted: 1", "main (none yet): 1",
            "human escalated: 1"} <= set(cells.titles)
    assert not [t for t in cells.titles if t.startswith("human ") and "escalated" not in t]
    # --since: conversations that started later only.
    later = CliRunner().invoke(report, ["--store", f"sqlite:///{path}", "--out", str(out), "--since", "2999-01-01"])
    assert later.exit_code == 0 and "0 conversations" in later.output


def test_report_reads_other_stores_through_the_protocol(desk, tmp_path):
    """The generic path (Redis's) gives the same rows as SQLite's two scans."""
    import asyncio

    from chatrun.report.read import _protocol_rows, read_conversations
    from chatrun.store.local import LocalAsyncStore

    store = SQLiteStore(str(tmp_path / "p.db"))
    run_desk(desk, store, [call("close_ticket"), "Closed."], ["close it"], "en", rate=[(1, "up")])
    run_desk(desk, store, ["Hi."], ["hi"], "de", expire_after={"minutes": 40})

    async def both():
        fast = await read_conversations(LocalAsyncStore(store, "sqlite"))
        generic = [row async for row in _protocol_rows(LocalAsyncStore(store, "sqlite"))]
        return fast, generic

    fast, generic = asyncio.run(both())
    from chatrun.report.read import _branch, joined

    assert sorted((c.outcome, c.locale, c.ratings) for c in fast) == [("abandoned", "de", []), ("resolved", "en", ["up"])]
    assert sorted(map(repr, fast)) == sorted(map(repr, joined(b for b in (_branch(*row) for row in generic) if b)))


def test_report_refuses_a_store_that_is_not_there(tmp_path):
    result = CliRunner().invoke(report, ["--store", f"sqlite:///{tmp_path}/none.db", "--out", str(tmp_path / "x.html")])
    assert result.exit_code == 2 and "none.db" in result.output


def test_report_reads_a_redis_store_through_the_protocol(desk, tmp_path, redis_server):
    """The same conversations, copied commit by commit into a real Redis, give the same figures."""
    import asyncio

    from chatrun.store.record import Commit
    from chatrun.store.redis import RedisStore
    from chatrun.store.versions import CREATE

    store = SQLiteStore(str(tmp_path / "r.db"))
    runs = [run_desk(desk, store, [call("close_ticket"), "Closed."], ["close it"], "en", rate=[(1, "up")]),
            run_desk(desk, store, [call("escalate")], ["a person please"], "de", rate=[(1, "down")]),
            run_desk(desk, store, ["Hi."], ["hi"], "en", expire_after={"minutes": 31})]
    url = redis_server.url()

    async def copy():
        redis = RedisStore(url)
        try:
            for r in runs:
                commit = Commit.encode(r.id, store.load_session(r.id), {}, store.load_history(r.id), CREATE)
                await redis.commit_turn(commit, None)
        finally:
            await redis.close()

    asyncio.run(copy())
    pages = {}
    for name, where in (("sqlite", f"sqlite:///{tmp_path / 'r.db'}"), ("redis", url)):
        out = tmp_path / f"{name}.html"
        result = CliRunner().invoke(report, ["--store", where, "--out", str(out)])
        assert result.exit_code == 0, result.output
        cells = Cells()
        cells.feed(out.read_text())
        pages[name] = cells.values
    assert pages["redis"][("all", "escalation")] == pytest.approx(1 / 3)
    assert pages["redis"][("all", "csat")] == 0.5 and pages["redis"][("locale de", "containment")] == 0.0
    assert pages["redis"] == pages["sqlite"]


def test_a_golden_transcript_expects_the_outcome_after_a_silence(desk, tmp_path):
    from chatrun.transcripts import run_transcript

    (tmp_path / "bot").mkdir()
    (tmp_path / "bot" / "bot.yaml").write_text(DESK)
    path = tmp_path / "abandoned.yaml"
    path.write_text("""\
bot: bot
clock: {at: "2026-11-25T09:00:00Z"}
turns:
  - user: hi
    model: [{text: Hello.}]
    expect: {events: [{Message: Hello.}], backend_events: []}
  - clock: {advance: 31m}
    expire: true
    expect:
      events: []
      backend_events: [{Outcome: {name: abandoned, turn: 2, route: main, at: "2026-11-25T09:31:00+00:00"}}]
  - clock: {advance: 3h}
    expire: true
    expect: {backend_events: []}
""")
    result = run_transcript(str(path))
    assert result.passed and result.warnings == [], (result.error, result.turns, result.warnings)


def test_an_operator_taking_over_is_an_outcome_when_the_bot_says_so(write_bot):
    from chatrun import TakeOver

    bot = chatrun.load_bot(write_bot(DESK.replace("escalated: {route: human}", "escalated: {taken_over: true}")))
    session = session_with(bot, ["Hi."])
    session.chat("hi")
    assert [o["name"] for o in outcome_events(session.chat(TakeOver()))] == ["escalated"]


@pytest.mark.subprocess  # its own redis-server, with a password
def test_the_report_names_its_store_without_the_password(tmp_path):
    """The report is a file to share: the store's URL it names has no password in it."""
    from redis_support import REDIS_SERVER, RedisServer

    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed")
    locked = RedisServer("--requirepass", "s3cret-pw").start()
    try:
        out = tmp_path / "report.html"
        result = CliRunner().invoke(report, ["--store", f"redis://:s3cret-pw@127.0.0.1:{locked.port}/0",
                                             "--out", str(out)])
        assert result.exit_code == 0, result.output
        page = out.read_text()
        assert "s3cret-pw" not in page and "s3cret-pw" not in result.output
        assert f"redis://:***@127.0.0.1:{locked.port}/0" in page
    finally:
        locked.stop()
