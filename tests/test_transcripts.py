"""Golden transcripts: format and validation, matchers, the offline runner, `chatrun test`
(progress, exit codes, -k/-x/-n, --update, --record against the fake OpenAI server),
breaking a bot, the pytest plugin, and saving from a session."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from chatrun.cli import test as cli_test_module
from chatrun.errors import BotError
from chatrun.models.base import ModelResponse
from chatrun.testing.fake_openai import FakeOpenAI
from chatrun.transcripts import load_transcript, run_transcript
from chatrun.transcripts.expect import MISSING, compare_live, match, refresh
from chatrun.transcripts.save import save_transcript

REPO = Path(__file__).resolve().parents[1]
HELLO = REPO / "bots" / "hello"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def hello_transcript(tmp_path: Path, body: str, name: str = "t.yaml") -> Path:
    return write(tmp_path / "transcripts" / name, f"bot: {os.path.relpath(HELLO, tmp_path / 'transcripts')}\n"
                 + textwrap.dedent(body).lstrip("\n"))


def cli(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli_test_module.test, args, catch_exceptions=False)
    return result.exit_code, result.output


CLASSIC_TRAVEL = ("flight_booking.yaml", "model_error.yaml", "route_change.yaml")


def _classic_travel(directory: str, names: list[str]) -> list[str]:
    """What the copy leaves out: caches, and every transcript but the three flight and hotel ones,
    so that the counts below are theirs however many the bot gains (the bot is copied whole)."""
    left_out = [n for n in names if n == "__pycache__"]
    if Path(directory).name == "transcripts":
        left_out += [n for n in names if n.endswith(".yaml") and n not in CLASSIC_TRAVEL]
    return left_out


@pytest.fixture
def travel_copy(tmp_path, monkeypatch):
    """bots/travel (with its transcripts) copied to tmp_path/bots/travel; cwd = tmp_path."""
    shutil.copytree(REPO / "bots" / "travel", tmp_path / "bots" / "travel", ignore=_classic_travel)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "bots" / "travel"


# -- format ------------------------------------------------------------------------------------


def test_turn_lines_and_fields(tmp_path):
    path = hello_transcript(tmp_path, """
        route: chat
        state: {mood: good}
        turns:
          - user: hi
            model: [{text: Hello}]
          # a comment

          - data: {userMessage: hey, channel: web}
            expect: {route: chat}
        """)
    t = load_transcript(path)
    assert [turn.line for turn in t.turns] == [5, 9]
    assert t.turns[1].input == {"userMessage": "hey", "channel": "web"}
    assert t.turns[1].expect_line == 10
    assert t.route == "chat" and t.state == {"mood": "good"}
    assert t.bot_path == HELLO.resolve()


def test_invalid_transcript_diagnostics_name_lines(tmp_path):
    path = write(tmp_path / "bad.yaml", """
        bot: ../x
        turns:
          - user: hi
            data: {userMessage: hi}
          - user: ok
            model:
              - {txt: Hello}
            expect:
              routes: main
              state: {reservation.x: 1}
        extra: 1
        """)
    with pytest.raises(BotError) as info:
        load_transcript(path)
    lines = [d.format() for d in info.value.diagnostics]
    assert any(line.startswith(f"{path}:3:") and "has both `user:` and `data:`" in line for line in lines), lines
    assert any(line.startswith(f"{path}:7:") and "model response" in line for line in lines), lines
    assert any(line.startswith(f"{path}:9:") and "unknown key `routes`" in line for line in lines), lines
    assert any(line.startswith(f"{path}:10:") and "not a state path" in line for line in lines), lines
    assert any(line.startswith(f"{path}:11:") and "unknown key `extra`" in line for line in lines), lines


def test_a_mistyped_role_in_memory_or_sent_is_named_as_a_role_not_a_state_path(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: Hello}]
            expect:
              memory: [{usr: hi}, {assistant: Hello}]
              sent: [{messages: [{uesr: hi}]}]
        """)
    with pytest.raises(BotError) as info:
        load_transcript(path)
    lines = [d.format() for d in info.value.diagnostics]
    assert f"{path}:6:17: error: `usr` in `turns[0].expect.memory[0]` is not a role: user, assistant, tool, " \
           "system or summary" in lines, lines
    assert any(line.startswith(f"{path}:7:") and "`uesr` in `turns[0].expect.sent[0].messages[0]` is not a role"
               in line for line in lines), lines
    assert not any("state path" in line for line in lines), lines


@pytest.mark.parametrize("value", ["", "null", "5", "{detail: gone}"])
def test_an_error_expectation_that_is_neither_true_false_nor_a_matcher_is_refused_at_its_line(tmp_path, value):
    """`error:` left empty read as null, which no turn ever matched: it failed saying the turn
    succeeded though an Error was expected, whatever the author meant."""
    path = hello_transcript(tmp_path, f"""
        turns:
          - user: hi
            model: [{{text: Hello}}]
            expect:
              error: {value}
        """)
    with pytest.raises(BotError) as info:
        load_transcript(path)
    assert [d.format() for d in info.value.diagnostics] == [
        f"{path}:6:7: error: `turns[0].expect.error` must be true, false or a matcher on the Error text (a string, "
        "{contains: ..}, {regex: ..}); empty (`error:` alone) says neither"]


def test_cli_reports_invalid_transcript_with_file_line(tmp_path):
    path = write(tmp_path / "transcripts" / "bad.yaml", "bot: ..\nturns:\n  - model: [{text: hi}]\n")
    code, out = cli([str(path)])
    assert code == 1
    assert out.splitlines()[0] == "E"
    assert f"{path}:3:5: error: turn in `turns[0]` needs `user:`" in out
    assert out.splitlines()[-1] == "0 passed, 1 failed"


def test_invalid_regex_is_a_diagnostic_at_its_line(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: Hello}]
            expect:
              events:
                - Message: {regex: "(unclosed"}
              error: {regex: "[a-"}
        """)
    with pytest.raises(BotError) as info:
        load_transcript(path)
    lines = [d.format() for d in info.value.diagnostics]
    assert lines[0].startswith(f"{path}:7:") and "invalid regex '(unclosed' in `turns[0].expect.events[0].Message`" in lines[0]
    assert lines[1].startswith(f"{path}:8:") and "invalid regex '[a-'" in lines[1], lines
    code, out = cli([str(path)])
    assert code == 1 and out.splitlines()[0] == "E" and "Traceback" not in out
    assert f"{path}:7:" in out and out.splitlines()[-1] == "0 passed, 1 failed"


def test_transcript_not_utf8_is_a_diagnostic(tmp_path):
    path = hello_transcript(tmp_path, "turns:\n  - user: hi\n")
    path.write_bytes(path.read_bytes() + b"  - user: caf\xe9\n")
    with pytest.raises(BotError) as info:
        load_transcript(path)
    assert [d.format() for d in info.value.diagnostics] == [
        f"{path}:4:14: error: the transcript is not valid UTF-8 (byte 0xe9); save it as UTF-8"]
    code, out = cli([str(path.parent)])  # found by discovery too, not skipped
    assert code == 1 and out.splitlines()[0] == "E"
    assert f"{path}:4:14: error: the transcript is not valid UTF-8" in out


def crashing_bot(tmp_path: Path, body: str) -> Path:
    """A bot whose tool handler runs `body`, and a transcript that calls the tool."""
    write(tmp_path / "crash" / "bot.yaml", """
        name: crash
        routes:
          chat: {default: true, description: d, system: s, tools: [boom]}
        tools:
          boom: {description: b, handler: "tools:boom", action: {reply: ok}}
        """)
    write(tmp_path / "crash" / "tools.py", f"import os\nimport sys\n\n\ndef boom(ctx):\n    {body}\n")
    return write(tmp_path / "crash" / "transcripts" / "crash.yaml", """
        bot: ..
        turns:
          - user: hi
            model: [{tool_calls: [{name: boom, arguments: {}}]}, {text: ok}]
        """)


def test_a_handler_calling_sys_exit_fails_that_transcript_only(travel_copy, tmp_path):
    crash = crashing_bot(tmp_path, "sys.exit(3)")  # the engine turns it into the turn's Error
    for args in ([], ["-n", "2"]):
        code, out = cli([*args, str(crash), "bots/travel"])
        assert code == 1, out
        assert "handler tools:boom raised SystemExit: 3" in out
        assert out.splitlines()[-1] == "3 passed, 1 failed"


def test_a_dying_worker_fails_its_transcripts_and_the_run_ends(travel_copy, tmp_path):
    crash = crashing_bot(tmp_path, "os._exit(3)")
    code, out = cli(["-n", "2", str(crash), "bots/travel"])
    assert code == 1, out
    assert f"{crash}: running the transcript raised BrokenProcessPool" in out
    # the transcripts the dead pool still held fail with it; the run itself still ends with a summary
    assert re.fullmatch(r"\d passed, [1-4] failed", out.splitlines()[-1]), out


# -- matchers ------------------------------------------------------------------------------------


def test_matchers():
    assert match("Dublin", "Dublin") and not match("Dublin", "dublin")
    assert match({"contains": "booked"}, "Your flight is booked: FL-1")
    assert match({"regex": r"FL-[0-9A-F]{6}$"}, "FL-ABC123") and not match({"regex": "^x"}, "y")
    assert match({"booking": {"regex": "^FL-"}, "n": 2}, {"booking": "FL-1", "n": 2})
    assert not match({"booking": "FL-1"}, {"booking": "FL-1", "n": 2})  # mappings: exactly these keys
    assert match([1, {"contains": "b"}], [1, "abc"]) and not match([1], [1, 2])
    assert match(None, MISSING) and not match("x", MISSING)  # null: not set
    assert not match(1, True) and not match(True, 1)
    assert match({"contains": "3"}, {"count": 3})  # non-text is matched as JSON


def test_refresh_keeps_matchers_that_hold():
    expected = [{"Message": {"contains": "booked"}}, {"Thinking": "old"}]
    actual = [{"Message": "Your flight is booked"}, {"Thinking": "new"}, {"Message": "more"}]
    assert refresh(expected, actual) == [{"Message": {"contains": "booked"}}, {"Thinking": "new"}, {"Message": "more"}]


def test_refresh_finds_the_items_that_hold_when_the_list_gained_or_lost_one():
    expected = [{"Message": {"contains": "booked"}}, {"Message": {"regex": "^Anything"}}]
    actual = [{"Thinking": "new"}, {"Message": "Your flight is booked"}, {"Message": "Anything else?"}]
    assert refresh(expected, actual, aligned=True) == [{"Thinking": "new"}, *expected]
    assert refresh([*expected, {"Thinking": "gone"}], actual[1:], aligned=True) == expected
    assert refresh([{"Message": {"contains": "x"}}, expected[1]], actual, aligned=True) == [*actual[:2], expected[1]]


def test_update_keeps_a_matcher_after_an_event_the_bot_now_sends(travel_copy):
    path = travel_copy / "transcripts" / "flight_booking.yaml"
    path.write_text(path.read_text().replace(
        "        - Thinking: Destination set to Dublin\n"
        "        - Message: When do you want to leave, and when do you come back?\n",
        "        - Message: {contains: When do you want}\n", 1))
    assert cli([str(path), "--update"])[0] == 0
    assert ("        - Thinking: Destination set to Dublin\n"
            "        - Message: {contains: When do you want}\n") in path.read_text()


# -- the runner ----------------------------------------------------------------------------------


def test_leftover_response_fails_naming_the_turn(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: Hello}]
          - user: again
            model:
              - text: Hi again
              - text: never used
        """)
    result = run_transcript(str(path))
    assert not result.passed
    assert result.report() == f"turn 2 ({path}:5): 1 scripted model response left unused"


def test_running_out_of_responses_fails(tmp_path):
    path = write(tmp_path / "transcripts" / "t.yaml", f"""
        bot: {REPO / 'bots' / 'travel'}
        turns:
          - user: a flight please
            model:
              - tool_calls: [{{name: book_flight, arguments: {{}}}}]
        """)
    result = run_transcript(str(path))
    report = result.report()
    assert report.startswith(f"turn 1 ({path}:3): the turn needed more model responses than the transcript gives")
    assert "it gives 1, and model call 2 (route flight) found none left" in report


def test_unexpected_error_and_error_expectations(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{error: down}]
          - user: hi
            model: [{error: down}]
            expect: {error: {contains: down}}
          - user: hi
            model: [{error: down}]
            expect: {error: {contains: up}}
          - user: hi
            model: [{text: fine}]
            expect: {error: true}
        """)
    result = run_transcript(str(path))
    problems = {tr.turn.index: [p.message for p in tr.problems] for tr in result.turns}
    assert problems[1] == ["the turn ended in an Error the transcript does not expect: "
                           "the model failed on route chat: down"]
    assert problems[2] == []
    assert problems[3] == ["the Error text differs"]
    assert problems[4] == ["expected the turn to end in an Error, but it succeeded"]


def test_error_false_passes_a_turn_without_an_error_and_fails_one_with_it_saying_so(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: fine}]
            expect: {error: false, route: chat}
          - user: hi
            model: [{error: down}]
            expect: {error: false}
        """)
    result = run_transcript(str(path))
    problems = {tr.turn.index: [p.format() for p in tr.problems] for tr in result.turns}
    assert problems[1] == []
    assert len(problems[2]) == 1 and problems[2][0].startswith(
        "expected the turn not to end in an Error, but it did: the model failed on route chat: down"), problems
    assert "-error: false" in problems[2][0], problems[2][0]
    live = {tr.turn.index: [p.message for p in compare_live(tr.turn.expect, tr.observed)] for tr in result.turns}
    assert live[1] == [] and live[2][0].startswith("expected the turn not to end in an Error")  # --live asks the same
    path.write_text(path.read_text().replace("model: [{error: down}]", "model: [{text: fine too}]"))
    assert cli([str(path), "--update"])[0] == 0
    assert [t.expect.get("error") for t in load_transcript(path).turns] == [False, False]  # kept as written


def test_failure_diff_shows_only_what_differs(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: Hello there}]
            expect:
              route: chat
              events:
                - Message: {contains: Hello}
              memory:
                - user: hi
                - assistant: Goodbye
        """)
    report = run_transcript(str(path)).report()
    assert report == textwrap.dedent(f"""\
        turn 1 ({path}:3): memory differs
            --- expected
            +++ actual
            @@ -1,3 +1,3 @@
             memory:
             - user: hi
            -- assistant: Goodbye
            +- assistant: Hello there""")


def test_sent_expectations_and_structured_input(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - data: {userMessage: hi, channel: web}
            model: [{text: Hello}]
            expect:
              sent:
                - route: chat
                  system: {regex: "^You are a friendly assistant"}
                  tools: []
                  messages: [{user: hi}]
                  messages_count: 1
        """)
    assert run_transcript(str(path)).passed


# -- chatrun test ------------------------------------------------------------------------------------


def test_discovery_progress_summary_and_exit_codes(travel_copy, tmp_path):
    code, out = cli([])
    assert code == 0
    assert out.splitlines() == ["...", "3 passed, 0 failed"]
    code, out = cli(["-v"])
    assert "bots/travel/transcripts/flight_booking.yaml PASSED" in out
    code, out = cli(["-k", "nothing_matches"])
    assert code == 5 and out.splitlines()[-1] == "0 passed, 0 failed"
    code, out = cli(["-k", "flight and not route"])
    assert code == 0 and out.splitlines()[-1] == "1 passed, 0 failed"
    code, out = cli(["-k", "(model or route) and travel", "-v"])
    assert out.splitlines()[-1] == "2 passed, 0 failed" and "flight_booking" not in out
    code, out = cli(["-k", "flight and ("])
    assert code == 4 and "invalid expression" in out
    code, out = cli(["no/such/file.yaml"])
    assert code == 4
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli([str(empty)])[0] == 5


def test_chatrun_test_without_paths_runs_the_yml_and_subfolder_transcripts_the_plugin_runs(travel_copy):
    """`chatrun test` alone globbed bots/*/transcripts/*.yaml: a `.yml` transcript, or one in a
    subfolder, passed unrun there while `chatrun test bots` and pytest ran it."""
    folder = travel_copy / "transcripts"
    failing = "bot: {bot}\nturns:\n  - user: hi\n    model: [{{text: Hello}}]\n    expect: {{route: nowhere}}\n"
    (folder / "short.yml").write_text(failing.format(bot=".."))
    (folder / "more").mkdir()
    (folder / "more" / "nested.yaml").write_text(failing.format(bot="../.."))
    code, out = cli(["-v"])
    assert code == 1 and out.splitlines()[-1] == "3 passed, 2 failed", out
    assert "bots/travel/transcripts/short.yml FAILED" in out and "bots/travel/transcripts/more/nested.yaml FAILED" in out
    assert cli(["bots"])[1].splitlines()[-1] == "3 passed, 2 failed"  # the same as given the folder


def test_exitfirst_and_parallel(travel_copy):
    route_file = travel_copy / "routes" / "flight.yaml"
    route_file.write_text(route_file.read_text().replace("Destination set to", "Destination now"))
    code, out = cli([])
    assert code == 1 and out.splitlines()[-1] == "1 passed, 2 failed"
    code, out = cli(["-x"])
    assert code == 1 and out.splitlines()[-1] == "0 passed, 1 failed"
    code, out = cli(["-n", "2"])
    assert code == 1 and out.splitlines()[-1] == "1 passed, 2 failed"
    assert "+  - Thinking: Destination now Dublin" in out or "+- Thinking: Destination now Dublin" in out


def test_renaming_a_route_fails_the_right_transcripts_then_update_passes(travel_copy):
    flight = travel_copy / "routes" / "flight.yaml"
    flight.write_text(flight.read_text().replace("  flight:\n", "  flights:\n"))
    bot = travel_copy / "bot.yaml"
    bot.write_text(bot.read_text().replace("push: flight,", "push: flights,"))
    code, out = cli(["-v"])
    assert code == 1
    assert "bots/travel/transcripts/flight_booking.yaml FAILED" in out
    assert "bots/travel/transcripts/model_error.yaml FAILED" in out
    assert "bots/travel/transcripts/route_change.yaml FAILED" in out
    assert "turn 1 (bots/travel/transcripts/flight_booking.yaml:10): route differs" in out
    assert "    -route: flight\n    +route: flights\n" in out
    assert "-stack: [main_menu, flight]\n    +stack: [main_menu, flights]" in out

    before = {p: p.read_text() for p in (travel_copy / "transcripts").glob("*.yaml")}
    code, out = cli(["--update"])
    assert code == 0, out
    assert "updated bots/travel/transcripts/flight_booking.yaml" in out
    code, out = cli([])
    assert code == 0 and out.splitlines()[-1] == "3 passed, 0 failed"
    for path, old in before.items():
        new = path.read_text()
        assert _outside_expect(new) == _outside_expect(old)  # turns, model lists, comments: as they were
        assert "flights" in new


def _outside_expect(text: str) -> list[str]:
    out, inside = [], False
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if line.strip().startswith("expect:"):
            inside, depth = True, indent
            continue
        if inside and line.strip() and indent <= depth:
            inside = False
        if not inside:
            out.append(line)
    return out


def test_changing_a_prompt_fails_with_a_diff_of_what_was_sent(travel_copy):
    bot = travel_copy / "bot.yaml"
    bot.write_text(bot.read_text().replace("The traveller: {{ state.traveller_name", "Traveller: {{ state.traveller_name"))
    code, out = cli([])
    assert code == 1 and out.splitlines()[-1] == "2 passed, 1 failed"
    assert "turn 1 (bots/travel/transcripts/flight_booking.yaml:10): sent differs" in out
    assert ("     - route: main_menu\n"
            "    -  context:\n"
            "    -    contains: 'The traveller: Ana.'\n"
            "    +  context: 'Traveller: Ana.'\n") in out
    assert cli(["--update"])[0] == 0
    assert cli([])[0] == 0
    text = (travel_copy / "transcripts" / "flight_booking.yaml").read_text()
    assert "# shared state of the main menu's scope" in text  # comments in expect blocks survive


def test_update_rewrites_only_the_list_items_that_changed_with_the_comments_between_them(travel_copy):
    route_file = travel_copy / "routes" / "flight.yaml"
    route_file.write_text(route_file.read_text().replace("Destination set to", "Destination now"))
    path = travel_copy / "transcripts" / "flight_booking.yaml"
    path.write_text(path.read_text().replace(
        "        - Thinking: Destination set to Dublin\n"
        "        - Message: When do you want to leave, and when do you come back?\n",
        "        # the setter says what it set\n"
        "        - Thinking: Destination set to Dublin\n"
        "        - Message: {contains: When do you want}   # the model's question\n", 1))
    before = path.read_text().splitlines()
    assert cli([str(path), "--update"])[0] == 0
    after = path.read_text().splitlines()
    changed = [line for line in difflib.unified_diff(before, after, n=0, lineterm="")
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["-        - Thinking: Destination set to Dublin", "+        - Thinking: Destination now Dublin"]
    assert cli([str(path)])[0] == 0


def test_update_adds_and_removes_list_items_beside_the_ones_kept(tmp_path):
    from chatrun.transcripts.update import rewrite_turns

    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: Hello}]
            expect:
              events:
              - Message: Hello   # at the key's column
              # kept
              - Message: |
                  two
                  lines
              - Message: gone
              route: chat
        """)
    new_events = [{"Message": "Hello"}, {"Message": "two\nlines\n"}, {"Message": "new"}, {"Choices": ["a", "b"]}]
    assert rewrite_turns(path, {0: {"expect": {"events": new_events, "route": "chat"}}})
    text = path.read_text()
    assert ("      events:\n      - Message: Hello   # at the key's column\n      # kept\n      - Message: |\n"
            "          two\n          lines\n      - Message: new\n      - Choices: [a, b]\n      route: chat\n") in text
    assert load_transcript(path).turns[0].expect == {"events": new_events, "route": "chat"}
    assert rewrite_turns(path, {0: {"expect": {"events": new_events[:1], "route": "chat"}}})
    assert load_transcript(path).turns[0].expect == {"events": new_events[:1], "route": "chat"}
    assert "      - Message: Hello   # at the key's column\n      route: chat\n" in path.read_text()


def test_update_matches_the_items_of_a_list_that_gained_or_lost_one(tmp_path):
    from chatrun.transcripts.update import rewrite_turns

    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: Hello}]
            expect:
              events:
                - Message: {contains: Hel}   # the greeting
                # the choices
                - Choices: {choices: [{label: Yes, value: y}, {label: No, value: n}]}
        """)
    kept = path.read_text().split("      events:\n")[1]
    choices = {"Choices": {"choices": [{"label": "Yes", "value": "y"}, {"label": "No", "value": "n"}]}}
    assert rewrite_turns(path, {0: {"expect": {"events": [{"Thinking": "t"}, {"Message": {"contains": "Hel"}}, choices]}}})
    assert path.read_text().split("      events:\n")[1] == "        - Thinking: t\n" + kept
    assert rewrite_turns(path, {0: {"expect": {"events": [{"Thinking": "t"}, choices]}}})  # the greeting goes
    assert path.read_text().split("      events:\n")[1] == "        - Thinking: t\n" + kept.split("\n", 1)[1]


def test_update_of_passing_transcripts_changes_no_byte(travel_copy):
    before = {p: p.read_bytes() for p in (travel_copy / "transcripts").glob("*.yaml")}
    code, out = cli(["--update"])
    assert code == 0 and "updated" not in out
    assert {p: p.read_bytes() for p in before} == before


def test_update_writes_missing_expectations(tmp_path):
    path = hello_transcript(tmp_path, """
        # header comment
        turns:
          - user: hi    # greeting
            model: [{text: Hello}]
          - user: bye
            model: [{error: gone}]
        """)
    original = path.read_text()
    code, out = cli([str(path), "--update"])
    assert code == 0, out
    text = path.read_text()
    assert text.startswith(original.split("  - user: bye")[0].rstrip("\n").rsplit("\n", 1)[0])
    assert "  - user: hi    # greeting\n    model: [{text: Hello}]\n    expect:\n      route: chat\n" in text
    assert "      error: 'the model failed on route chat: gone'" in text
    assert cli([str(path)])[0] == 0


def test_a_diff_writes_the_characters_a_terminal_does_not_show_as_escapes_a_transcript_can_hold(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: "Das macht 3,20\\u00a0€ (1\\u202f234 Punkte)"}]
            expect:
              events: [{Message: "Das macht 3,20 € (1 234 Punkte)"}]
        """)
    code, out = cli([str(path)])
    assert code == 1
    assert '    -- Message: Das macht 3,20 € (1 234 Punkte)\n' in out
    written = '- Message: "Das macht 3,20\\u00a0€ (1\\u202f234 Punkte)"'
    assert f"    +{written}\n" in out  # not two lines that look the same
    path.write_text(path.read_text().replace('[{Message: "Das macht 3,20 € (1 234 Punkte)"}]', f"\n        {written}"))
    assert cli([str(path)])[0] == 0  # the actual line, pasted, passes


def test_update_writes_the_characters_a_reader_cannot_see_as_escapes_that_read_back_the_same(tmp_path):
    said = "3,20\u00a0€, zero\u200bwidth,\ttab"  # a no-break space, a zero-width space, a tab
    multi = "first\u00a0line\nsecond\tline"
    path = hello_transcript(tmp_path, f"""
        turns:
          - user: hi
            model: [{{text: {json.dumps(said)}}}]
          - user: again
            model: [{{text: {json.dumps(multi)}}}]
        """)
    code, out = cli([str(path), "--update"])
    assert code == 0, out
    text = path.read_text(encoding="utf-8")
    assert not {"\u00a0", "\u200b", "\t"} & set(text), text  # none written raw
    assert '- Message: "3,20\\u00a0€, zero\\u200bwidth,\\ttab"\n' in text, text
    messages = [turn.expect["events"] for turn in load_transcript(path).turns]
    assert messages == [[{"Message": said}], [{"Message": multi}]]  # the same value, read back
    assert cli([str(path)])[0] == 0


def test_update_keeps_a_turns_judge_criteria_and_rewrites_the_rest(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: Hello}]
            expect:
              route: nowhere
              judge: The bot greets the user.   # scored by the judge
            judged:
              - {criterion: The bot greets the user., score: 1.0, reason: it greets}
        """)
    code, out = cli([str(path), "--update"])
    assert code == 0 and "raised" not in out, out
    text = path.read_text()
    assert "      route: chat\n      judge: The bot greets the user.   # scored by the judge\n" in text
    assert cli([str(path)])[0] == 0


def test_update_keeps_a_transcripts_crlf_line_ends(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi    # greeting
            model: [{text: Hello}]
            expect: {route: nowhere}
        """)
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    code, out = cli([str(path), "--update"])
    assert code == 0, out
    raw = path.read_bytes()
    assert b"  - user: hi    # greeting\r\n" in raw and b"route: chat" in raw
    assert raw.count(b"\n") == raw.count(b"\r\n")  # every line, the written ones too
    assert cli([str(path)])[0] == 0


def test_update_refuses_a_turn_written_as_an_alias_or_in_flow_style_at_its_line_and_writes_nothing(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - &hi
            user: hi
            model: [{text: Hello}]
            expect: {route: nowhere}
          - *hi   # again
        """)
    original = path.read_bytes()
    code, out = cli([str(path), "--update"])
    assert code == 1 and path.read_bytes() == original  # it dropped `- *hi` and wrote `expect:` twice
    assert f"{path}:7: turn 2 is an alias of turn 1 (`*hi`); write it out to update it" in out, out
    path.write_text(original.decode().split("turns:")[0] + "turns:\n  - {user: hi, model: [{text: Hi}], expect: {}}\n")
    code, out = cli([str(path), "--update"])
    assert f"\n{path}:3: turn 1 is written in flow style; write it as a block mapping to update it\n" in out, out
    path.write_text(original.decode().replace("  - *hi   # again\n", "  - <<: *hi\n    user: again\n"))
    code, out = cli([str(path), "--update"])  # raised KeyError: 'expect'
    assert f"\n{path}:7: turn 2 takes `expect` from another (`<<:`); write it out to update it\n" in out, out


def test_update_of_a_turn_that_expected_only_an_error_and_now_succeeds_writes_what_it_did(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: Hello}]
            expect:
              error: true
        """)
    assert cli([str(path)])[0] == 1  # the turn did not fail
    code, out = cli([str(path), "--update"])
    assert code == 0, out
    assert "    expect:\n      route: chat\n" in path.read_text()  # not an empty `expect:`
    assert "error" not in load_transcript(path).turns[0].expect
    assert cli([str(path)])[0] == 0  # valid, and it passes


def test_update_says_each_expected_error_it_drops_adds_or_changes_at_its_line(tmp_path):
    """A turn that used to fail and now succeeds, or fails otherwise, is a behaviour change:
    --update rewrote its `error:` silently, for the author to spot in a diff."""
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{text: Hello}]
            expect:
              error: {contains: the model is down}
          - user: again
            model: [{error: the model is now gone}]
            expect:
              error: the model is down
          - user: once more
            model: [{error: 503}]
          - user: and
            model: [{text: Fine}]
            expect: {route: chat}
        """)
    lines = path.read_text().splitlines()
    expects = [n for n, text in enumerate(lines, 1) if text == "    expect:"]  # turns 1 and 2
    third = lines.index("  - user: once more") + 1  # no `expect:`: the turn's line
    code, out = cli([str(path), "--update"])
    assert code == 0, out
    assert f"updated {path}\n" in out
    assert f"  {path}:{expects[0]}: turn 1: `error:` dropped: the turn now succeeds (it expected the error " \
        '{"contains": "the model is down"})\n' in out, out
    assert f'  {path}:{expects[1]}: turn 2: `error:` changed: "the model is down" -> "the model failed on route chat' in out, out
    line = f"  {path}:{third}: turn 3: `error:` added: the turn now fails with \"the model failed on route chat"
    assert line in out, out
    assert "turn 4" not in out  # its expectation held: nothing to say
    assert cli([str(path)])[0] == 0


def test_update_leaves_a_transcript_whose_turn_the_bot_fails_as_it_was(travel_copy):
    """A handler that raises is the bot failing, not a changed reply: --update used to write the
    Error's text as the turn's `error:` (and over an explicit `error: false`), so the transcript
    passed with the bug in it."""
    tools = travel_copy / "travel_tools.py"
    tools.write_text(tools.read_text().replace('    reservation = dict(ctx.scope["reservation"])\n',
                                               '    reservation = dict(ctx.scope["reservation"])\n    1 / 0\n', 1))
    path = travel_copy / "transcripts" / "flight_booking.yaml"
    said_false = path.read_text().replace("  - user: Business, please\n", "  - user: Business, please\n"
                                          "    # the booking must go through\n", 1)
    for text in (path.read_text(), said_false.replace("    expect:\n      route: main_menu\n",
                                                      "    expect:\n      error: false\n      route: main_menu\n", 1)):
        path.write_text(text)
        code, out = cli([str(path), "--update"])
        assert code == 1, out
        assert path.read_text() == text  # not one byte written
        line = text.splitlines().index("  - user: Business, please") + 1
        assert (f"{path}:{line}: --update left this transcript as it was: turn 3 ends in an Error it does not "
                "expect (tool book") in out, out
        assert "ZeroDivisionError" in out and "fix the bot; if the turn should fail, write its `error:`" in out, out


def test_update_writes_a_scripted_model_failure_but_never_over_error_false(tmp_path):
    path = hello_transcript(tmp_path, """
        turns:
          - user: hi
            model: [{error: 503}]   # no fallback answers: the turn fails, as scripted
          - user: hi again
            model: [{error: 503}]
            expect: {error: false}  # the author says a fallback must answer it
        """)
    code, out = cli([str(path), "--update"])
    assert code == 1 and f"{path}:5: --update left this transcript as it was: turn 2 ends in an Error" in out, out
    path.write_text(path.read_text().replace("expect: {error: false}", "expect: {error: true}"))
    assert cli([str(path), "--update"])[0] == 0
    assert [t.expect["error"] for t in load_transcript(path).turns][0].startswith("the model failed on route chat")


def test_record_against_the_fake_openai_server(tmp_path, monkeypatch):
    path = write(tmp_path / "transcripts" / "rec.yaml", f"""
        bot: {REPO / 'bots' / 'travel'}
        turns:
          - user: I want to fly to Lima   # recorded below
            model: []
          - user: On 2026-09-01
        """)
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        fake.queue(
            {"tool_calls": [{"name": "book_flight", "arguments": {}}]},
            {"tool_calls": [{"name": "set_destination", "arguments": {"destination": "Lima"}}]},
            {"text": "When do you leave?"},
            {"tool_calls": [{"name": "set_departure", "arguments": '{"date": "2026-09-01"}'}]},
            {"chunks": ["And when do ", "you come back?"]},
        )
        code, out = cli([str(path), "--record", "--update"])
        assert fake.pending == 0
        assert len(fake.requests) == 5
        assert [r.get("temperature") for r in fake.requests] == [0.2, 0, 0, 0, 0]  # the routes' model configs
    assert code == 0, out
    t = load_transcript(path)
    assert t.turns[0].model == [
        {"tool_calls": [{"name": "book_flight", "arguments": {}}]},
        {"tool_calls": [{"name": "set_destination", "arguments": {"destination": "Lima"}}]},
        {"text": "When do you leave?"},
    ]
    assert t.turns[1].model == [
        {"tool_calls": [{"name": "set_departure", "arguments": {"date": "2026-09-01"}}]},
        {"text": "And when do you come back?"},
    ]
    assert "# recorded below" in path.read_text()
    assert t.turns[1].expect["route"] == "flight"
    # offline from now on: no server, same result
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert cli([str(path)])[0] == 0


def test_an_option_chatrun_test_cannot_take_is_a_usage_error_exit_4_not_2_interrupted():
    from chatrun.cli import main

    for args in (["-n", "0"], ["--repeat", "x"], ["--no-such-option"]):
        result = CliRunner().invoke(main, ["test", *args])
        assert result.exit_code == 4, (args, result.output)  # as its --help says; 2 means interrupted
        assert "Usage: " in result.output and "Traceback" not in result.output


def test_update_with_repeat_is_a_usage_error_and_writes_nothing(travel_copy):
    # N runs of one file, each rewriting it (two at once with -n) make a file no one ran.
    before = {p: p.read_bytes() for p in (travel_copy / "transcripts").glob("*.yaml")}
    for flag in ("--update", "--record"):
        code, out = cli([flag, "--repeat", "3", "-n", "2"])
        assert code == 4 and "use one or the other" in out, out
    assert {p: p.read_bytes() for p in before} == before


def test_the_help_of_repeat_says_it_refuses_update_and_record():
    from chatrun.cli import main

    result = CliRunner().invoke(main, ["test", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    repeat = result.output[result.output.index("--repeat"):]
    repeat = " ".join(repeat[:repeat.index("--help")].split())
    assert "not with --update or --record" in repeat, repeat


# -- saving a conversation (the REPL's /save) ----------------------------------------------------------


def test_save_then_run_passes(tmp_path):
    import chatrun
    from chatrun.models.scripted import ScriptedModel

    bot = chatrun.load_bot(REPO / "bots" / "travel")
    answers = [
        [ModelResponse(tool_calls=[_call("h1", "set_name", '{"name": "Ana"}')]), ModelResponse("Hi Ana!")],
        [ModelResponse(tool_calls=[_call("h2", "book_flight", "{}")]), ModelResponse("Where to?")],
    ]
    model = ScriptedModel([r for turn in answers for r in turn])
    session = bot.session(model=model)
    records = []
    for text, responses in zip(["I am Ana", "a flight"], answers, strict=True):
        events = session.chat(text)
        records.append({"user": text, "model": responses, "events": events,
                        "route": session.route, "stack": session.stack})
    path = tmp_path / "saved" / "conversation.yaml"
    result = save_transcript(path, bot_path=bot.config.path, route=None, records=records, session=session)
    assert result.passed, result.report()
    t = load_transcript(path)
    assert t.bot_path == (REPO / "bots" / "travel").resolve()
    assert t.turns[1].expect["stack"] == ["main_menu", "flight"]
    assert t.turns[0].model[0] == {"tool_calls": [{"name": "set_name", "arguments": {"name": "Ana"}}]}
    code, out = cli([str(path)])
    assert code == 0, out


def _call(id_: str, name: str, arguments: str):
    from chatrun.messages import ToolCall

    return ToolCall(id_, name, arguments)


@pytest.mark.subprocess
def test_save_from_the_repl_through_a_pipe(tmp_path):
    script = "\n".join([
        "hello", "/say Hi! Where to?",
        "a flight to Rome", "/call book_flight {}", '/call set_destination {"destination": "Rome"}', "/say When?",
        "/save saved.yaml", "/quit", "",
    ])
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    run = subprocess.run([sys.executable, "-m", "chatrun", "repl", str(REPO / "bots" / "travel"), "--play-model"],
                         input=script, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert "saved 2 turns to saved.yaml" in run.stdout, run.stdout + run.stderr
    check = subprocess.run([sys.executable, "-m", "chatrun", "test", "saved.yaml"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert check.returncode == 0, check.stdout
    assert check.stdout.splitlines()[-1] == "1 passed, 0 failed"


# -- the pytest plugin ---------------------------------------------------------------------------------------


def _plugin_option() -> list[str]:
    """`-p chatrun.pytest_plugin`, unless the installed package's pytest11 entry point loads it."""
    from importlib.metadata import entry_points

    installed = any(ep.value == "chatrun.pytest_plugin" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "chatrun.pytest_plugin"]


@pytest.mark.subprocess
def test_pytest_plugin_collects_and_reports(travel_copy):
    (travel_copy / "routes" / "flight.yaml").write_text(
        (travel_copy / "routes" / "flight.yaml").read_text().replace("Destination set to", "Destination now"))
    (travel_copy / "notes.yaml").write_text("turns: not a transcript (not under transcripts/)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    cmd = [sys.executable, "-m", "pytest", *_plugin_option(), "-p", "no:cacheprovider", "bots"]
    run = subprocess.run([*cmd, "-q"], capture_output=True, text=True, cwd=travel_copy.parents[1], env=env, timeout=120)
    assert run.returncode == 1, run.stdout
    assert "2 failed, 1 passed" in run.stdout
    assert "turn 1 (bots/travel/transcripts/flight_booking.yaml:10): events differs" in run.stdout
    assert "+- Thinking: Destination now Dublin" in run.stdout
    assert "Traceback" not in run.stdout
    run = subprocess.run([*cmd, "-q", "-k", "route_change"], capture_output=True, text=True,
                         cwd=travel_copy.parents[1], env=env, timeout=120)
    assert run.returncode == 0 and "1 passed, 2 deselected" in run.stdout, run.stdout
    run = subprocess.run([*cmd, "-q", "-n", "2"], capture_output=True, text=True,
                         cwd=travel_copy.parents[1], env=env, timeout=120)
    assert "2 failed, 1 passed" in run.stdout, run.stdout


def _transcripts_a_text_test_missed(tmp_path: Path) -> None:
    """A misspelled `turns:` and two valid transcripts whose `turns` key is not a plain
    `turns:` line, each expecting a reply the bot does not give, and a YAML file that is not a
    transcript (no `bot:`): discovery skipped the first three, so they passed unrun."""
    hello_transcript(tmp_path, "turn:\n  - user: hi\n    model: [{text: Hello}]\n", "misspelled.yaml")
    hello_transcript(tmp_path, '"turns":\n  - user: hi\n    model: [{text: Hello}]\n'
                     "    expect: {events: [{Message: Bye}]}\n", "quoted.yaml")
    bot = os.path.relpath(HELLO, tmp_path / "transcripts")
    write(tmp_path / "transcripts" / "flow.yaml",
          f"{{bot: {bot}, turns: [{{user: hi, model: [{{text: Hello}}], expect: {{events: [{{Message: Bye}}]}}}}]}}\n")
    write(tmp_path / "transcripts" / "notes.yaml", "owner: ana\n")


def test_a_transcript_folder_runs_every_transcript_in_it_however_its_turns_key_is_written(tmp_path, monkeypatch):
    _transcripts_a_text_test_missed(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, out = cli(["transcripts"])
    assert code == 1, out
    assert "0 passed, 3 failed" in out, out
    assert "transcripts/misspelled.yaml:2:1: error: unknown key `turn` at the top level" in out, out
    assert "turn 1 (transcripts/quoted.yaml:3): events differs" in out, out
    assert "turn 1 (transcripts/flow.yaml:1): events differs" in out, out
    assert "notes.yaml" not in out


@pytest.mark.subprocess
def test_pytest_plugin_collects_every_transcript_of_a_transcripts_folder(tmp_path):
    _transcripts_a_text_test_missed(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    run = subprocess.run([sys.executable, "-m", "pytest", *_plugin_option(), "-p", "no:cacheprovider", "-q",
                          "transcripts"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 1, run.stdout
    assert "3 failed" in run.stdout and "passed" not in run.stdout, run.stdout
    assert "transcripts/misspelled.yaml:2:1: error: unknown key `turn` at the top level" in run.stdout
    assert "turn 1 (transcripts/flow.yaml:1): events differs" in run.stdout, run.stdout
    assert "notes" not in run.stdout


@pytest.mark.subprocess
def test_pytest_plugin_reports_invalid_regex_and_non_utf8_transcripts(tmp_path):
    hello_transcript(tmp_path, """
        turns:
          - user: hi
            expect: {events: [{Message: {regex: "(unclosed"}}]}
        """, "regex.yaml")
    latin1 = hello_transcript(tmp_path, "turns:\n  - user: hi\n", "latin1.yaml")
    latin1.write_bytes(latin1.read_bytes() + b"  - user: caf\xe9\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    run = subprocess.run([sys.executable, "-m", "pytest", *_plugin_option(), "-p", "no:cacheprovider", "-q",
                          "transcripts"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 1, run.stdout
    assert "2 failed" in run.stdout, run.stdout
    assert "transcripts/regex.yaml:4:" in run.stdout and "invalid regex '(unclosed'" in run.stdout
    assert "transcripts/latin1.yaml:4:14: error: the transcript is not valid UTF-8" in run.stdout
    assert "Traceback" not in run.stdout


@pytest.mark.subprocess
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_pytest_plugin_says_once_that_role_checks_are_off_in_transcripts_without_roles(tmp_path, workers):
    support = os.path.relpath(REPO / "bots" / "support", tmp_path / "transcripts")
    turn = "turns:\n  - user: hi\n    model: [{text: Hello.}]\n    expect: {events: [{Message: Hello.}]}\n"
    for name in ("open_a.yaml", "open_b.yaml"):
        write(tmp_path / "transcripts" / name, f"bot: {support}\n{turn}")
    write(tmp_path / "transcripts" / "customer.yaml", f"bot: {support}\nroles: []\n{turn}")
    hello_transcript(tmp_path, turn.replace("Hello.", "Hi."), "hello.yaml")  # no route needs a role
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    run = subprocess.run([sys.executable, "-m", "pytest", *_plugin_option(), "-p", "no:cacheprovider", "-q",
                          *workers, "transcripts"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 0, run.stdout
    assert "4 passed" in run.stdout
    notes = [line for line in run.stdout.splitlines() if "role checks are off" in line]
    assert len(notes) == 1, run.stdout
    assert "role checks are off in 2 transcripts" in notes[0]
    assert "transcripts/open_a.yaml" in notes[0] and "transcripts/open_b.yaml" in notes[0]
    assert "customer" not in notes[0] and "hello" not in notes[0]


def test_record_writes_nothing_when_the_model_fails(tmp_path, monkeypatch):
    path = write(tmp_path / "transcripts" / "rec.yaml", f"""
        bot: {REPO / 'bots' / 'hello'}
        turns:
          - user: hi
            model: [{{text: kept}}]
        """)
    before = path.read_text()
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        fake.queue({"status": 400, "body": {"error": {"message": "bad request", "type": "invalid_request_error"}}})
        code, out = cli([str(path), "--record"])
    assert code == 1
    assert f"turn 1 ({path}:3): the model failed while recording, so nothing was written" in out
    assert path.read_text() == before


def test_setup_problems_name_the_line(tmp_path):
    path = hello_transcript(tmp_path, """
        route: nowhere
        turns:
          - user: hi
        """)
    assert run_transcript(str(path)).report() == (
        f"{path}:2: cannot start the conversation: unknown route 'nowhere'; the bot defines: chat")
    broken = write(tmp_path / "broken" / "bot.yaml", "name: b\nroutes: {a: {default: true, description: d, tools: [nope]}}\n")
    path = write(tmp_path / "broken" / "transcripts" / "t.yaml", "bot: ..\nturns:\n  - user: hi\n")
    report = run_transcript(str(path)).report()
    assert report.startswith(f"{path}:1: bot .. is invalid:\n{broken}:2:")
    assert "unknown tool `nope`" in report


TRAJECTORY = """
    bot: ..
    turns:
      - user: Book me a flight... no wait, I only need a hotel in Rome
        model:
          - tool_calls: [{name: book_flight, arguments: {}}]
          - tool_calls: [{name: switch_to_hotel, arguments: {}}]
          - tool_calls: [{name: set_city, arguments: {city: Rome}}]
          - text: Rome it is. When do you check in?
        expect:
          path: %s
          calls: %s
    """
ROUTE_PATH = "[main_menu, flight, hotel]"
CALLS = "[{tool: book_flight}, {tool: switch_to_hotel, route: flight}, {tool: set_city, args: {city: {regex: '^Ro'}}}]"


def test_trajectory_expectations_pass_when_the_turn_took_that_path_and_made_those_calls(travel_copy):
    path = write(travel_copy / "transcripts" / "trajectory.yaml", TRAJECTORY % (ROUTE_PATH, CALLS))
    result = run_transcript(str(path))
    assert result.passed, result.report()
    assert [c["tool"] for c in result.turns[0].observed.calls] == ["book_flight", "switch_to_hotel", "set_city"]


@pytest.mark.parametrize("route_path, calls, says", [
    ("[main_menu, hotel]", CALLS, "path: expected 2 routes, got 3"),
    ("[main_menu, flight, flight]", CALLS, "path differs"),
    (ROUTE_PATH, "[{tool: book_flight}, {tool: set_city}, {tool: switch_to_hotel}]", "calls differs"),
    (ROUTE_PATH, "[{tool: book_flight}, {tool: switch_to_hotel}]", "calls: expected 2 tool calls, got 3"),
    (ROUTE_PATH, "[{tool: book_flight}, {tool: switch_to_hotel}, {tool: set_city, args: {city: Paris}}]",
     "calls differs"),
])
def test_a_trajectory_that_differs_fails_at_the_turns_line_with_a_diff(travel_copy, route_path, calls, says):
    path = write(travel_copy / "transcripts" / "trajectory.yaml", TRAJECTORY % (route_path, calls))
    report = run_transcript(str(path)).report()
    assert report.startswith(f"turn 1 ({path}:3): {says}"), report
    assert "--- expected" in report and "+++ actual" in report


def test_a_calls_diff_shows_the_differing_argument_and_a_missing_one_as_not_set(travel_copy):
    calls = "[{tool: book_flight}, {tool: switch_to_hotel}, {tool: set_city, args: {city: Paris, nights: 2}}]"
    path = write(travel_copy / "transcripts" / "trajectory.yaml", TRAJECTORY % (ROUTE_PATH, calls))
    report = run_transcript(str(path)).report()
    assert "-    city: Paris\n    -    nights: 2\n    +    city: Rome\n    +    nights: (not set)" in report, report


def test_calls_see_bound_arguments_results_and_refusals(tmp_path):
    """What the tool ran with (the bound email, not the one the model sent), its mocked result,
    and a refused call's error: each is checked, none is a copy of the scripted model."""
    helpdesk = REPO / "bots" / "helpdesk"
    path = write(tmp_path / "t.yaml", f"""
        bot: {helpdesk}
        principal: {{name: ana, email: ana@example.com}}
        roles: []
        mocks:
          - tool: my_tickets
            result: {{status: 200, ok: true, json: {{tickets: [{{id: T-101, title: VPN, status: open}}]}}}}
        turns:
          - user: Show me the tickets of bob@example.com.
            model:
              - tool_calls: [{{name: my_tickets, arguments: {{reporter: bob@example.com}}}}, {{name: nope, arguments: {{}}}}]
              - text: Only yours.
            expect:
              calls:
                - {{tool: my_tickets, args: {{reporter: ana@example.com}}, result: {{contains: T-101}}}}
                - {{tool: nope, error: {{contains: there is no tool 'nope' here}}}}
        """)
    result = run_transcript(str(path))
    assert result.passed, result.report()
    write(path, path.read_text().replace("args: {reporter: ana@example.com}", "args: {reporter: bob@example.com}"))
    report = run_transcript(str(path)).report()
    assert "-    reporter: bob@example.com\n    +    reporter: ana@example.com" in report, report


def test_update_refreshes_a_trajectory_and_the_schema_checks_its_shape(travel_copy):
    path = write(travel_copy / "transcripts" / "trajectory.yaml",
                 TRAJECTORY % ("[main_menu]", "[{tool: book_flight}, {tool: set_city, args: {city: {regex: '^Ro'}}}]"))
    code, _ = cli(["--update", str(path)])
    assert code == 0 and run_transcript(str(path)).passed
    text = path.read_text()
    assert "path: [main_menu, flight, hotel]" in text and "city: Rome" in text
    write(path, TRAJECTORY % (ROUTE_PATH, "[{args: {city: Rome}}]"))
    with pytest.raises(BotError) as exc:
        load_transcript(str(path))
    assert f"{path}:11:15: error: missing required key `tool` in `turns[0].expect.calls[0]`" == str(exc.value)


def test_a_state_the_http_api_refuses_is_refused_at_its_line(travel_copy):
    """`state:` follows the HTTP API's rule (declared keys, each of its default's JSON type), so a
    transcript cannot test a conversation no client can start; the CLI names file:line."""
    path = write(travel_copy / "transcripts" / "state.yaml", """
        bot: ..
        state:
          traveller_name: Ana
          travller_age: 40
        turns:
          - user: hi
            model: [{text: Hello Ana.}]
        """)
    assert run_transcript(str(path)).report() == (
        f"{path}:4: state.travller_age is not declared by the bot (its state keys: traveller_name, last_booking)")
    code, out = cli([str(path)])
    assert code == 1 and f"{path}:4: state.travller_age is not declared" in out
    write(path, """
        bot: ..
        state: {traveller_name: Ana}
        turns:
          - user: hi
            model: [{text: Hello Ana.}]
        """)
    assert run_transcript(str(path)).passed


@pytest.mark.subprocess
def test_pytest_plugin_runs_conftest_fixtures_around_transcripts(tmp_path):
    """A bot's own conftest.py sets things up for its transcripts (here: an environment
    variable its handler reads), with an autouse fixture of any scope."""
    bot = tmp_path / "bots" / "greeter"
    (bot / "transcripts").mkdir(parents=True)
    write(bot / "bot.yaml", """
        name: greeter
        model: {provider: scripted, name: m}
        routes:
          main: {default: true, system: Hi., tools: [secret_word]}
        tools:
          secret_word: {description: The word of the day, handler: "words:word"}
        """)
    write(bot / "words.py", """
        import os

        def word(ctx):
            return os.environ["WORD_OF_THE_DAY"]
        """)
    write(bot / "conftest.py", """
        import os
        import pytest

        @pytest.fixture(autouse=True, scope="session")
        def word_of_the_day():
            os.environ["WORD_OF_THE_DAY"] = "aubergine"
            yield
            del os.environ["WORD_OF_THE_DAY"]
        """)
    write(bot / "transcripts" / "word.yaml", """
        bot: ..
        turns:
          - user: What is the word?
            model:
              - tool_calls: [{name: secret_word, arguments: {}}]
              - text: It is aubergine.
            expect:
              memory:
                - user: What is the word?
                - assistant: {contains: secret_word}
                - tool: aubergine
                - assistant: It is aubergine.
        """)
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    run = subprocess.run([sys.executable, "-m", "pytest", *_plugin_option(), "-p", "no:cacheprovider", "-q",
                          "bots"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


# -- warnings: passing transcripts that probably do not test what they mean ---------------------

BANK = REPO / "bots" / "bank"


def test_a_call_the_route_does_not_offer_warns_when_the_turn_has_no_expect(tmp_path):
    path = write(tmp_path / "t.yaml", f"""
        bot: {BANK}
        turns:
          - user: hi
            model:
              - tool_calls: [{{name: set_amount, arguments: {{amount: 3}}}}]
              - text: hello
          - user: again                 # the same call, but the turn checks what happened
            model:
              - tool_calls: [{{name: set_amount, arguments: {{amount: 3}}}}]
              - text: hello
            expect: {{route: main}}
        """)
    result = run_transcript(str(path))
    assert result.passed
    assert result.warnings == [
        f"{path}:3: warning: the scripted model calls `set_amount`, which route `main` does not offer (it offers: "
        "transfer_money, check_balance, goodbye); the turn has no `expect:`, so nothing checks what happened"]
    code, out = cli([str(path)])
    assert code == 0 and out.splitlines()[-2:] == [result.warnings[0], "1 passed, 0 failed"]


def test_an_event_type_the_bot_never_sends_warns(tmp_path):
    path = write(tmp_path / "t.yaml", f"""
        bot: {BANK}
        turns:
          - user: hi
            model: [{{text: hello}}]
            expect:
              events: [{{Mesage: hello}}]
        """)
    result = run_transcript(str(path))
    assert not result.passed  # the comparison fails too; the warning says why at once
    assert result.warnings == [f"{path}:3: warning: expects a `Mesage` event, but bot bank never sends one (it can "
                               "send: Choices, Console, ConversationEnded, Error, Message, Object, Pending, Resolved, "
                               "RouteChanged, Stream, Thinking, UserMessage)"]


def test_the_example_transcripts_have_no_warnings():
    for path in sorted([*REPO.glob("bots/*/transcripts/*.yaml"), *REPO.glob("bots/*/versions/*/transcripts/*.yaml")]):
        assert run_transcript(str(path)).warnings == [], path


def test_a_transcript_can_expect_a_refused_start(tmp_path):
    support = REPO / "bots" / "support"
    refused = write(tmp_path / "refused.yaml", f"""
        bot: {support}
        route: staff_desk
        roles: [customer]
        refused: {{contains: "needs one of the roles"}}
        """)
    assert run_transcript(str(refused)).passed
    wrong_text = write(tmp_path / "wrong.yaml", refused.read_text().replace("needs one of the roles", "no entry"))
    result = run_transcript(str(wrong_text))
    assert not result.passed and "the start was refused, but the message differs" in result.report()
    started = write(tmp_path / "started.yaml", refused.read_text().replace("[customer]", "[staff]"))
    result = run_transcript(str(started))
    assert result.report() == f"{started}:4: expected the start on route staff_desk to be refused, but the conversation started"
    code, out = cli([str(refused), str(started)])
    assert code == 1 and out.splitlines()[-1] == "1 passed, 1 failed"


ENDING_BOT = """
name: ending
routes:
  main:
    default: true
    tools: [goodbye]
tools:
  goodbye:
    action: {message: Goodbye!, end: true}
"""


def test_a_message_after_end_is_a_refused_turn_that_can_be_expected(tmp_path):
    write(tmp_path / "bot" / "bot.yaml", ENDING_BOT)
    body = ("bot: ../bot\nturns:\n  - user: bye\n    model: [{tool_calls: [{name: goodbye, arguments: {}}]}]\n"
            "  - user: are you there?\n")
    expected = write(tmp_path / "transcripts" / "expected.yaml", body + "    expect: {error: true}\n")
    assert cli([str(expected)])[0] == 0
    unexpected = write(tmp_path / "transcripts" / "unexpected.yaml", body)
    code, out = cli([str(unexpected)])
    assert code == 1
    assert "unexpected.yaml:5): the turn ended in an Error the transcript does not expect" in out  # at its line
    assert "has ended (tool goodbye ended the conversation on route main)" in out
