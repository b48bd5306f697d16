"""The clock (issue 24): `now` and `today` in every template and condition, in the bot's
`timezone:` or the session's `state.timezone`, read from the session's Clock; the date
filters; transcripts that pin it (`clock:`), and bots/airline's same-day-change rule."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chatrun.cli import test as cli_test_module
from chatrun.definition.loader import check_bot
from chatrun.engine.clock import parse_duration, parse_instant
from chatrun.messages import ToolResultMessage

REPO = Path(__file__).resolve().parents[1]
AIRLINE = REPO / "bots" / "airline"

BOT = """
name: desk
model: {provider: scripted, name: gpt-4o-mini}
timezone: Europe/Paris
state: {due: "2026-11-27", stamped: null, timezone: null}
routes:
  main:
    default: true
    system: You keep the desk's diary.   # the clock is in the context: the system prompt stays the same
    context: "Today is {{ today }}, {{ now.strftime('%H:%M %Z') }}; due in {{ days_between(today, state.due) }} days."
    tools: [stamp, check]
tools:
  stamp:
    description: Stamp the time
    effect: idempotent                      # each call stamps: none is answered as already done
    action:
      set: {state.stamped: "{{ now }}", state.due: "{{ state.due | add_days(1) }}"}
      reply: "{{ now.isoformat() }} / {{ now | add_hours(3) }} / {{ '2026-11-25T10:00' | datetime }}"
  check:
    description: Is it due today?
    parameters: {type: object, properties: {day: {type: string}}}
    action:
      cases:
        - if: (args.day or state.due) | date == today
          then: {reply: due today}
        - if: (args.day or state.due) | date < today
          then: {reply: overdue}
        - else: {reply: "not yet, {{ (state.due | datetime) - now }} to go"}
format: 3
"""


def at(text: str) -> chatrun.FixedClock:
    return chatrun.FixedClock(datetime.fromisoformat(text))


def call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def turn(write_bot, clock: chatrun.Clock, *calls: dict, state: dict | None = None,
         bot: str = BOT) -> tuple[chatrun.Session, list[str], chatrun.ScriptedModel]:
    model = chatrun.ScriptedModel([*calls, {"text": "ok"}])
    session = chatrun.load_bot(write_bot(bot)).session(model=model, state=state)
    session.clock = clock
    events = list(session.chat("go"))
    assert events[-1].type != "Error", events[-1].data
    results = [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]
    return session, results, model


def test_now_and_today_are_in_the_bots_time_zone_in_prompts_setters_and_replies(write_bot):
    # 23:30 UTC on the 24th is already the 25th in Paris: `today` is Paris's date.
    session, results, model = turn(write_bot, at("2026-11-24T23:30:00+00:00"), call("stamp"))
    assert model.requests[0].messages[-1].content == "Today is 2026-11-25, 00:30 CET; due in 2 days."
    assert results == ["2026-11-25T00:30:00+01:00 / 2026-11-25T03:30:00+01:00 / 2026-11-25T10:00:00+01:00"]
    # what a setter stores is ISO text (the store keeps JSON), a date stays a date
    assert session.state["stamped"] == "2026-11-25T00:30:00+01:00"
    assert session.state["due"] == "2026-11-28"
    json.dumps(session.state)
    # the next model call of the turn sees the new due date
    assert model.requests[1].messages[-1].content == "Today is 2026-11-25, 00:30 CET; due in 3 days."


def test_a_session_may_have_its_own_time_zone_in_its_state(write_bot):
    session, _, model = turn(write_bot, at("2026-11-24T23:30:00+00:00"), state={"timezone": "America/New_York"})
    assert model.requests[0].messages[-1].content == "Today is 2026-11-24, 18:30 EST; due in 3 days."
    assert session.now().isoformat() == "2026-11-24T18:30:00-05:00"


def test_a_session_time_zone_that_does_not_exist_fails_the_turn_naming_it(write_bot):
    model = chatrun.ScriptedModel([{"text": "ok"}])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model, state={"timezone": "Mars/Olympus"})
    events = list(session.chat("hi"))
    assert events[-1].type == "Error"
    assert "state.timezone is 'Mars/Olympus', which is not an IANA time zone name" in events[-1].meta["detail"]
    assert session.turn_count == 0 and model.requests == []


@pytest.mark.parametrize(("clock", "expected"), [
    ("2026-11-27T08:00:00+01:00", "due today"),
    ("2026-11-26T23:59:00+00:00", "due today"),  # the 27th in Paris already
    ("2026-11-28T08:00:00+01:00", "overdue"),
    ("2026-11-26T12:00:00+01:00", "not yet, 12:00:00 to go"),
])
def test_conditions_compare_dates_from_state_with_today(write_bot, clock, expected):
    _, results, _ = turn(write_bot, at(clock), call("check"))
    assert results == [expected]


def test_a_date_a_filter_cannot_read_fails_the_turn_at_the_tools_line(write_bot):
    model = chatrun.ScriptedModel([call("check", day="next tuesday"), {"text": "ok"}])
    path = write_bot(BOT)
    session = chatrun.load_bot(path).session(model=model)
    session.clock = at("2026-11-25T09:00:00+01:00")
    events = list(session.chat("go"))
    assert events[-1].type == "Error"
    text = events[-1].meta["detail"]
    assert "`date` cannot read 'next tuesday': write dates as 2026-11-25" in text
    assert f"{path}:" in text and session.turn_count == 0


def test_the_system_clock_is_the_default_and_a_fixed_clock_moves_only_when_told(write_bot):
    session = chatrun.load_bot(write_bot(BOT)).session(model=chatrun.ScriptedModel([]))
    assert isinstance(session.clock, chatrun.SystemClock)
    assert abs(session.now() - datetime.now(UTC)) < timedelta(minutes=5)
    assert session.now().utcoffset() in (timedelta(hours=1), timedelta(hours=2))  # Paris, winter or summer
    clock = chatrun.FixedClock(datetime(2026, 11, 25, 9, tzinfo=UTC), step=parse_duration("1h30m"))
    clock.advance()
    clock.advance(timedelta(days=1))
    assert clock.now() == datetime(2026, 11, 26, 10, 30, tzinfo=UTC)
    with pytest.raises(ValueError, match="needs an instant with a UTC offset"):
        chatrun.FixedClock(datetime(2026, 11, 25, 9))



def test_a_pinned_clock_in_a_zone_moves_by_the_time_that_passes_when_the_zone_goes_back():
    """`/clock +30m`, a transcript's step: 30 minutes on from 02:45 CEST, the night Berlin's clocks
    go back at 03:00, is 02:15 CET (00:45 to 01:15 UTC), not 03:15 CET an hour and a half on."""
    from zoneinfo import ZoneInfo

    clock = chatrun.FixedClock(parse_instant("2026-10-25T02:45", ZoneInfo("Europe/Berlin")))
    clock.advance(timedelta(minutes=30))
    # (compared in UTC: Python never finds a time of the repeated hour's second pass, fold=1, equal
    # to one of another zone)
    assert clock.now().astimezone(UTC) == datetime(2026, 10, 25, 1, 15, tzinfo=UTC)
    assert clock.now().utcoffset() == timedelta(hours=1)  # still in the bot's zone
    clock.advance(timedelta(minutes=30))
    assert clock.now().astimezone(UTC) == datetime(2026, 10, 25, 1, 45, tzinfo=UTC)


def test_add_hours_is_time_that_passes_the_night_the_clocks_go_back(write_bot):
    # 02:45 CEST in Paris, 15 minutes before 03:00 CEST becomes 02:00 CET: three hours on is 04:45 CET
    # (03:45 UTC), not the wall clock's 05:45 CET, four hours on.
    _, results, _ = turn(write_bot, at("2026-10-25T00:45:00+00:00"), call("stamp"))
    assert results == ["2026-10-25T02:45:00+02:00 / 2026-10-25T04:45:00+01:00 / 2026-11-25T10:00:00+01:00"]

def test_durations_and_instants():
    assert parse_duration("5m") == timedelta(minutes=5)
    assert parse_duration("1d2h") == timedelta(days=1, hours=2)
    assert parse_duration(90) == timedelta(seconds=90)
    for bad in ("5 minutes", "", "m5", "1.5h", "99999999999d"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    from zoneinfo import ZoneInfo

    assert parse_instant("2026-12-24T18:00", ZoneInfo("Europe/Paris")).isoformat() == "2026-12-24T18:00:00+01:00"
    assert parse_instant("2026-12-24T18:00Z").isoformat() == "2026-12-24T18:00:00+00:00"
    with pytest.raises(ValueError, match="has no UTC offset"):
        parse_instant("2026-12-24T18:00")


def test_the_repl_says_a_clock_cannot_move_past_the_year_9999_and_goes_on(tmp_path):
    from chatrun.cli import main

    script = "/clock 2026-12-24T18:00Z\n/clock +99999999999d\n/clock +999999999d\n/clock\n"
    out = CliRunner().invoke(main, ["repl", str(REPO / "bots" / "hello"), "--play-model"], input=script)
    assert out.exit_code == 0 and out.exception is None, out.output
    assert "error: not a duration: '99999999999d' (too long for a clock)" in out.output, out.output
    assert "error: the clock cannot move 999999999 days, 0:00:00 on from 2026-12-24T18:00:00+00:00: past the " \
           "year 9999" in out.output
    assert out.output.rstrip().endswith("2026-12-24T18:00:00+00:00 (Thursday, UTC; pinned)")


def test_the_filters_and_today_are_known_to_validation_and_a_bad_zone_is_an_error_at_its_line(write_bot):
    path = write_bot(BOT.replace("timezone: Europe/Paris", "timezone: Europe/Pariss")
                     .replace("timezone: null}", 'timezone: "Moon/Base"}'))
    _config, found = check_bot(path)
    assert [(d.line, d.severity, d.message) for d in found] == [
        (4, "error", "`timezone` is 'Europe/Pariss', which is not an IANA time zone name; did you mean "
                     "`Europe/Paris`? (e.g. Europe/Paris, America/New_York, UTC)"),
        (5, "error", "`state.timezone` is 'Moon/Base', which is not an IANA time zone name "
                     "(e.g. Europe/Paris, America/New_York, UTC)"),
    ]
    assert check_bot(write_bot(BOT))[1] == []


def test_a_typo_in_a_date_filter_is_reported(write_bot):
    _config, found = check_bot(write_bot(BOT.replace("| add_days(1)", "| add_day(1)")))
    assert [d.message for d in found] == [
        "template error in `set state.due` of tool `stamp`: no filter named `add_day`; did you mean `add_days`?"]


# -- transcripts ---------------------------------------------------------------------------------


def cli(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli_test_module.test, args, catch_exceptions=False)
    return result.exit_code, result.output


def transcript(tmp_path: Path, body: str) -> Path:
    (tmp_path / "bot.yaml").write_text(textwrap.dedent(BOT))
    path = tmp_path / "t.yaml"
    path.write_text("bot: bot.yaml\n" + textwrap.dedent(body).lstrip("\n"))
    return path


def test_the_airline_transcripts_pin_the_clock_and_cover_both_branches():
    code, out = cli([str(AIRLINE / "transcripts")])
    assert code == 0, out
    texts = [p.read_text() for p in (AIRLINE / "transcripts").glob("*.yaml")]
    assert f"{len(texts)} passed" in out
    assert all("\nclock:" in t for t in texts)
    assert any("same-day changes cannot be made" in t for t in texts)
    assert any("Done: K7QX2D now flies on" in t for t in texts)


def test_without_its_clock_the_airline_transcript_fails_on_another_day(tmp_path):
    """The transcript's `clock:` is what makes it pass: moved two days on, the same-day
    branch is no longer taken (so the pinned clock is really what the bot reads)."""
    text = (AIRLINE / "transcripts" / "same_day.yaml").read_text()
    moved = tmp_path / "same_day.yaml"
    moved.write_text(text.replace("clock: 2026-11-25T09:00:00+01:00", "clock: 2026-11-23T09:00:00+01:00")
                     .replace("bot: ..", f"bot: {AIRLINE}"))
    code, out = cli([str(moved)])
    assert code == 1 and "same-day changes" in out


def test_a_transcript_clock_advances_per_turn_and_a_turn_may_set_it(tmp_path):
    path = transcript(tmp_path, """
        clock: {at: "2026-11-26T23:00:00", advance: 45m}
        turns:
          - user: a
            model: [{text: one}]
            expect: {sent: [{context: "Today is 2026-11-26, 23:00 CET; due in 1 days."}]}
          - user: b
            model: [{text: two}]
            expect: {sent: [{context: "Today is 2026-11-26, 23:45 CET; due in 1 days."}]}
          - user: c
            model: [{text: three}]
            expect: {sent: [{context: "Today is 2026-11-27, 00:30 CET; due in 0 days."}]}
          - clock: 2026-12-01T12:00:00Z
            user: d
            model: [{text: four}]
            expect: {sent: [{context: "Today is 2026-12-01, 13:00 CET; due in -4 days."}]}
          - clock: {advance: 2d}
            user: e
            model: [{text: five}]
            expect: {sent: [{context: "Today is 2026-12-03, 13:45 CET; due in -6 days."}]}
        """)
    code, out = cli([str(path)])
    assert code == 0, out


def test_a_turn_clock_pins_a_transcript_that_had_none(tmp_path):
    path = transcript(tmp_path, """
        turns:
          - clock: 2026-11-27T10:00:00+01:00
            user: a
            model: [{tool_calls: [{name: check, arguments: {}}]}, {text: ok}]
            expect: {events: [{Message: ok}], memory: [{user: a}, {assistant: "check({})"}, {tool: due today}, {assistant: ok}]}
        """)
    code, out = cli([str(path)])
    assert code == 0, out


def test_a_bad_instant_or_duration_is_reported_at_its_line(tmp_path):
    path = transcript(tmp_path, """
        clock: {at: 2026-11-25T09:00:00+01:00, advance: 5 minutes}
        turns:
          - clock: 2026-13-01T00:00:00Z
            user: a
        """)
    code, out = cli([str(path)])
    assert code == 1
    assert "t.yaml:2:" in out and "is '5 minutes', not a duration such as 30s, 5m, 1h30m or 1d" in out
    assert "t.yaml:4:" in out and "`turns[0].clock` is '2026-13-01T00:00:00Z', not an ISO date-time" in out


def test_update_keeps_the_clock_keys(tmp_path):
    path = transcript(tmp_path, """
        clock: {at: 2026-11-27T10:00:00+01:00, advance: 1h}   # the due day
        turns:
          - user: a
            model: [{tool_calls: [{name: check, arguments: {}}]}, {text: ok}]
          - clock: 2026-11-29T10:00:00+01:00
            user: b
            model: [{tool_calls: [{name: check, arguments: {}}]}, {text: ok}]
        """)
    code, out = cli([str(path), "--update"])
    assert code == 0, out
    text = path.read_text()
    assert "clock: {at: 2026-11-27T10:00:00+01:00, advance: 1h}   # the due day\n" in text
    assert "  - clock: 2026-11-29T10:00:00+01:00\n    user: b\n" in text
    assert text.count("expect:") == 2
    assert cli([str(path)])[0] == 0


def test_today_is_a_date_and_now_an_aware_datetime(write_bot):
    session = chatrun.load_bot(write_bot(BOT)).session(model=chatrun.ScriptedModel([]))
    session.clock = at("2026-11-25T09:00:00+00:00")
    now = session.now()
    assert now.tzinfo is not None and now.date() == date(2026, 11, 25) and now.hour == 10


class TickingClock:
    """A clock that moves a minute every time it is read: a turn must read it once."""

    def __init__(self, start: datetime):
        self.at = start
        self.reads = 0

    def now(self) -> datetime:
        self.reads += 1
        self.at += timedelta(minutes=1)
        return self.at


def test_a_turn_reads_the_clock_once_so_its_templates_agree(write_bot):
    clock = TickingClock(datetime(2026, 11, 26, 22, 58, tzinfo=UTC))  # 23:59 in Paris on the first read
    model = chatrun.ScriptedModel([call("stamp"), call("check"), {"text": "ok"}])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model)
    session.clock = clock
    list(session.chat("go"))
    systems = [r.messages[-1].content for r in model.requests]  # the contexts
    assert clock.reads == 1
    assert systems[0].startswith("Today is 2026-11-26, 23:59 CET") and all(s.startswith("Today is 2026-11-26, 23:59")
                                                                           for s in systems)
    assert session.state["stamped"] == "2026-11-26T23:59:00+01:00"


def test_record_plays_each_turn_at_its_clock_and_keeps_the_keys(fake, tmp_path):
    """`--record --update` against a real (fake) OpenAI server: the prompts the model got carry
    the pinned instants, and the file keeps its `clock:` keys."""
    from chatrun.cli import main

    path = tmp_path / "rec.yaml"
    path.write_text(textwrap.dedent(f"""\
        bot: {AIRLINE}
        clock: {{at: 2026-11-24T18:00:00+01:00, advance: 1h}}
        turns:
          - user: Move my flight to the 28th.
          - clock: 2026-11-28T07:00:00+01:00
            user: And to the 29th?
        """))
    fake.queue(
        {"tool_calls": [{"name": "change_date", "arguments": {"new_date": "2026-11-28"}}]}, {"text": "Moved."},
        {"tool_calls": [{"name": "change_date", "arguments": {"new_date": "2026-11-29"}}]}, {"text": "Not today."},
    )
    result = CliRunner().invoke(main, ["test", str(path), "--record", "--update"])
    assert result.exit_code == 0, result.output
    systems = [r["messages"][-1]["content"] for r in fake.requests]  # the contexts
    assert "Tuesday 24 November 2026; it is 18:00" in systems[0] and "Tuesday 24 November 2026; it is 18:00" in systems[1]
    assert "Saturday 28 November 2026; it is 07:00" in systems[2]
    text = path.read_text()
    assert "clock: {at: 2026-11-24T18:00:00+01:00, advance: 1h}\n" in text and "  - clock: 2026-11-28T07:00:00+01:00\n" in text
    assert "same-day changes cannot be made here" in text  # the expectation --update wrote
    assert chatrun.run_transcript(str(path)).passed


def test_a_machine_without_a_time_zone_database_is_told_what_to_install(write_bot, monkeypatch):
    import zoneinfo

    from chatrun.definition import templates

    monkeypatch.setattr(zoneinfo, "available_timezones", lambda: set())
    monkeypatch.setattr(templates, "ZoneInfo", lambda name: (_ for _ in ()).throw(zoneinfo.ZoneInfoNotFoundError(name)))
    _config, found = check_bot(write_bot(BOT))
    assert [d.message for d in found] == [
        "`timezone` is 'Europe/Paris', which is not an IANA time zone name (this machine has no time zone database: "
        "install the system's tzdata, or `pip install tzdata`)"]


def test_a_file_clock_reads_its_file_at_every_look(tmp_path):
    from chatrun.engine.clock import FileClock
    from chatrun.errors import TurnFailed

    clock = FileClock(str(tmp_path / "clock"))
    before = datetime.now(UTC)
    assert before <= clock.now() <= datetime.now(UTC)  # no file yet: the system clock
    (tmp_path / "clock").write_text("2030-01-02T03:04:05+01:00\n")
    assert clock.now() == datetime(2030, 1, 2, 2, 4, 5, tzinfo=UTC)
    assert clock.timestamp() == datetime(2030, 1, 2, 2, 4, 5, tzinfo=UTC).timestamp()
    (tmp_path / "clock").write_text("tomorrow")
    with pytest.raises(TurnFailed, match=r"clock: the clock file holds 'tomorrow', not an instant"):
        clock.now()


def test_serve_refuses_a_clock_file_that_holds_no_instant_before_it_starts(tmp_path, monkeypatch):
    from chatrun.cli import main

    monkeypatch.chdir(tmp_path)  # `serve`'s default store (chatrun.db) is the working folder's, not the checkout's

    (tmp_path / "clock").write_text("tomorrow")
    bot = Path(__file__).resolve().parents[1] / "bots" / "hello"
    result = CliRunner().invoke(main, ["serve", str(bot), "--port", "0", "--clock-file", str(tmp_path / "clock")])
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'clock'}: the clock file holds 'tomorrow', not an instant" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "chatrun.db").exists()  # refused before any store was opened
