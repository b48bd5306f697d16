"""`chatrun simulate`: a scenario's simulated user and bots/travel both answered by the fake
OpenAI server through the real openai client, N trials, exact and judged success criteria,
the pass rate with its Wilson interval, JUnit XML and JSON verdicts, exit codes, and trials
recorded as transcripts that `chatrun test` replays offline."""

from __future__ import annotations

import json
import shutil
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chatrun.cli import main
from chatrun.transcripts.scenario import first_missing, wilson

REPO = Path(__file__).resolve().parents[1]

SCENARIO = """
    description: A traveller books a flight to Dublin.
    bot: ../travel
    persona: Ana, a busy traveller who writes short messages.
    goal: Start booking a flight to Dublin.
    state: {traveller_name: Ana}
    max_turns: 4
    trials: 2
    threshold: %s
    success:
      path: [main_menu, flight]
      calls:
        - tool: set_destination
          args: {destination: Dublin}
      events: [{Message: {contains: leave}}]
      stack: [main_menu, flight]
      judge: The bot asks when the traveller wants to leave.
"""


def call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def verdict(score: float) -> dict:
    return {"text": json.dumps({"score": score, "reason": "asked for the date" if score > 0.5 else "did not"})}


def queue_two_trials(fake) -> None:
    """Trial 1 books Dublin; in trial 2 the bot picks the wrong city. Calls alternate between
    the simulated user, the bot and (once per trial) the judge, in the order they happen."""
    fake.queue(
        {"text": "I need a flight to Dublin"},                       # user
        call("book_flight"), call("set_destination", destination="Dublin"),
        {"text": "When do you want to leave?"},                       # bot
        {"text": "DONE"},                                             # user: goal reached
        verdict(0.9),                                                 # judge
        {"text": "Flight to Dublin please"},                          # trial 2: user
        call("book_flight"), call("set_destination", destination="London"),
        {"text": "When do you want to leave for London?"},
        {"text": "DONE"},
        verdict(0.9),
    )


@pytest.fixture
def scenarios(tmp_path, monkeypatch):
    shutil.copytree(REPO / "bots" / "travel", tmp_path / "bots" / "travel",
                    ignore=shutil.ignore_patterns("__pycache__", "transcripts"))
    folder = tmp_path / "bots" / "scenarios"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    return folder


def line_of(path: str | Path, start: str) -> int:
    """The 1-based line of `path` that starts with `start`."""
    return next(n for n, line in enumerate(Path(path).read_text().splitlines(), 1) if line.startswith(start))


def write(folder: Path, threshold: str, name: str = "dublin.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(SCENARIO % threshold).lstrip())
    return path


def test_trials_pass_rate_interval_and_reports(fake, scenarios, tmp_path):
    path = write(scenarios, "0.5")
    queue_two_trials(fake)
    result = CliRunner().invoke(main, ["simulate", str(path), "--junit", "out.xml", "--json", "out.json",
                                       "--record", "recorded"])
    assert result.exit_code == 0, result.output
    assert f"{path}: 1/2 trials passed (50%, 95% CI 9%-91%), threshold 50%: ok" in result.output
    assert 'trial 2: calls: no {"tool": "set_destination", "args": {"destination": "Dublin"}}' in result.output
    data = json.loads((tmp_path / "out.json").read_text())
    [one] = data["scenarios"]
    assert data["ok"] and one["passed"] == 1 and one["trials"] == 2 and one["interval"] == [0.0945, 0.9055]
    assert one["failures"][0]["trial"] == 2 and one["failures"][0]["turns"] == 1
    suite = ET.parse(tmp_path / "out.xml").getroot()
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    # What the simulated user was told: its persona and goal, the bot's reply as the other side
    user_requests = [r for r in fake.requests if "role-playing a user" in r["messages"][0]["content"]]
    assert "Ana, a busy traveller" in user_requests[0]["messages"][0]["content"]
    assert user_requests[1]["messages"][-1] == {"role": "user", "content": "When do you want to leave?"}
    assert "User: I need a flight to Dublin" in fake.requests[5]["messages"][-1]["content"]  # the judge read it

    # Each trial is a transcript that replays offline to what happened, and keeps the criteria:
    # the failed trial's recording fails, on its last turn, naming the criterion and its line.
    recorded = sorted(p.name for p in (tmp_path / "recorded").iterdir())
    assert recorded == ["dublin.trial1.yaml", "dublin.trial2.yaml"]
    tested = CliRunner().invoke(main, ["test", "recorded"])
    assert tested.exit_code == 1, tested.output
    assert "1 passed, 1 failed" in tested.output
    second = "recorded/dublin.trial2.yaml"
    turn, criterion = line_of(second, "  - clock:"), line_of(second, "  calls:")
    assert (f"turn 1 ({second}:{turn}): success ({second}:{criterion}) calls: no "
            '{"tool": "set_destination", "args": {"destination": "Dublin"}}') in tested.output
    assert "dublin.trial1.yaml" not in tested.output.split("FAILURES")[1]


def test_a_rate_under_the_threshold_fails_the_run(fake, scenarios, tmp_path):
    path = write(scenarios, "1")
    queue_two_trials(fake)
    result = CliRunner().invoke(main, ["simulate", str(path), "--junit", "out.xml"])
    assert result.exit_code == 1, result.output
    assert "threshold 100%: FAILED" in result.output and "0 scenarios passed, 1 failed" in result.output
    failure = ET.parse(tmp_path / "out.xml").getroot().find("testcase/failure")
    assert failure is not None and "trial 2: calls: no" in failure.text


def test_a_judged_criterion_fails_a_trial(fake, scenarios):
    path = write(scenarios, "1")
    fake.queue({"text": "I need a flight to Dublin"}, call("book_flight"),
               call("set_destination", destination="Dublin"), {"text": "When do you want to leave?"},
               {"text": "DONE"}, verdict(0.2), verdict(0.2))  # a low score is asked again once
    result = CliRunner().invoke(main, ["simulate", str(path), "--trials", "1", "--record", "recorded"])
    assert result.exit_code == 1
    assert "trial 1: judge 'The bot asks when the traveller wants to leave.': scored 0.2" in result.output
    # The recording keeps the criterion and the verdict the trial got: its replay fails the same way.
    requests = len(fake.requests)
    tested = CliRunner().invoke(main, ["test", "recorded"])
    assert tested.exit_code == 1 and len(fake.requests) == requests  # offline: no judge asked
    assert ("(the conversation) judge 'The bot asks when the traveller wants to leave.': scored 0.2"
            in tested.output), tested.output


def test_an_invalid_scenario_names_its_line_and_fails(scenarios):
    path = scenarios / "bad.yaml"
    path.write_text("bot: ../travel\npersona: P\ngoal: G\nsuccess:\n  calls: [{args: {}}]\n  rout: x\n")
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{path}:5:11: error: missing required key `tool` in `success.calls[0]`" in result.output
    assert f"{path}:6:3: error: unknown key `rout` in `success`; allowed:" in result.output


def test_an_undeclared_initial_state_is_refused_at_its_line(scenarios):
    path = scenarios / "state.yaml"
    path.write_text("bot: ../travel\npersona: P\ngoal: G\nstate: {nickname: A}\nsuccess: {route: main_menu}\n")
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 1
    assert f"{path}:4: state.nickname is not declared by the bot" in result.output


def test_wilson_interval_and_subsequences():
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(10, 10)
    assert round(low, 3) == 0.722 and high == 1.0
    low, high = wilson(5, 10)
    assert round(low, 3) == 0.237 and round(high, 3) == 0.763
    same = lambda actual, wanted: actual  # noqa: E731
    assert first_missing(["a", "c"], ["a", "b", "c"], same) is None
    assert first_missing(["c", "a"], ["a", "b", "c"], same) == "a"


# -- scripted sides: no model at all ------------------------------------------------------------

BOOKS_DUBLIN = [call("book_flight"), call("set_destination", destination="Dublin"),
                {"text": "When do you want to leave?"}]
NO_MODEL = "http://127.0.0.1:9/v1"  # nothing listens there: a model call would fail the trial


def scripted(folder: Path, success: dict, *, bot: list | None = None, user: list | None = None,
             name: str = "scripted.yaml", **more: object) -> Path:
    """A scenario of bots/travel whose sides are scripted (`script:`)."""
    doc = {"bot": "../travel", "persona": "Ana.", "goal": "Fly to Dublin.", "state": {"traveller_name": "Ana"},
           "trials": 2, "success": success, **more}
    script = {side: answers for side, answers in (("bot", bot), ("user", user)) if answers is not None}
    if script:
        doc["script"] = script
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def no_model(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", NO_MODEL)
    monkeypatch.setenv("OPENAI_API_KEY", "unused")


def test_scripted_sides_run_every_trial_from_the_top_with_no_model(scenarios, no_model, tmp_path):
    path = scripted(scenarios, {"stack": ["main_menu", "flight"], "calls": [{"tool": "set_destination"}]},
                    bot=BOOKS_DUBLIN, user=[{"text": "I need a flight to Dublin"}], trials=3)
    result = CliRunner().invoke(main, ["simulate", str(path), "--json", "-", "--record", "recorded"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("...\n") and "3/3 trials passed" in result.stderr
    verdict = json.loads(result.stdout)  # `--json -`: stdout is the JSON alone, the progress on stderr
    assert verdict["scenarios"][0]["passed"] == 3
    # The user ran out of lines after one: each trial is one turn, the bot's script used from its top.
    recorded = yaml.safe_load((tmp_path / "recorded" / "scripted.trial3.yaml").read_text())
    assert [t["user"] for t in recorded["turns"]] == ["I need a flight to Dublin"]
    assert recorded["turns"][0]["model"][1]["tool_calls"][0]["arguments"] == {"destination": "Dublin"}
    tested = CliRunner().invoke(main, ["test", "recorded"])
    assert tested.exit_code == 0 and "3 passed, 0 failed" in tested.output, tested.output


def test_a_scripted_user_pins_the_user_against_the_bots_model(fake, scenarios):
    path = scripted(scenarios, {"calls": [{"tool": "set_destination", "args": {"destination": "Dublin"}}]},
                    user=[{"text": "I need a flight to Dublin"}, {"text": "DONE"}], trials=1)
    fake.queue(*BOOKS_DUBLIN)
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 0, result.output
    assert len(fake.requests) == 3  # the bot's three model calls; the user asked no model
    assert not [r for r in fake.requests if "role-playing" in r["messages"][0]["content"]]
    # the user's message, then the bot's context (docs/models.md, "Stable prompts")
    assert fake.requests[0]["messages"][-2:] == [{"role": "user", "content": "I need a flight to Dublin"},
                                                 {"role": "system", "content": "The traveller: Ana."}]


def test_a_scripted_bot_that_runs_out_fails_its_turn_not_the_run(scenarios, no_model):
    path = scripted(scenarios, {"route": "flight"}, bot=[call("book_flight")],
                    user=[{"text": "Flight please"}], trials=1)
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "trial 1: route: expected \"flight\", ended with \"main_menu\"" in result.output


def test_an_invalid_script_names_its_line(scenarios):
    path = scenarios / "bad_script.yaml"
    path.write_text("bot: ../travel\npersona: P\ngoal: G\nsuccess: {route: x}\nscript:\n  user: [{say: hi}]\n")
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 1 and f"{path}:6:" in result.output


# -- every exact criterion fails a trial, and its recording ------------------------------------

FAILING = {
    "route": ({"route": "hotel"}, 'route: expected "hotel", ended with "flight"'),
    "stack": ({"stack": ["main_menu"]}, 'stack: expected ["main_menu"], ended with ["main_menu", "flight"]'),
    "state": ({"state": {"scope.reservation.destination": "Paris"}},
              'state scope.reservation.destination: expected "Paris", got "Dublin"'),
    "path": ({"path": ["main_menu", "hotel"]},
             'path: no "hotel" after the ones before it (the conversation\'s path: ["main_menu", "flight"])'),
    "events": ({"events": [{"Message": {"contains": "booked"}}]},
               'events: no {"Message": {"contains": "booked"}} after the ones before it'),
}


@pytest.mark.parametrize("criterion", sorted(FAILING))
def test_each_exact_criterion_fails_a_trial_and_its_recording(criterion, scenarios, no_model, tmp_path):
    success, problem = FAILING[criterion]
    path = scripted(scenarios, success, bot=BOOKS_DUBLIN, user=[{"text": "I need a flight to Dublin"}], trials=1)
    result = CliRunner().invoke(main, ["simulate", str(path), "--record", "recorded"])
    assert result.exit_code == 1, result.output
    assert f"trial 1: {problem}" in result.output
    recording = "recorded/scripted.trial1.yaml"
    tested = CliRunner().invoke(main, ["test", recording])
    assert tested.exit_code == 1, tested.output
    where = f"turn 1 ({recording}:{line_of(recording, '  - clock:')}): "
    assert f"{where}success ({recording}:{line_of(recording, f'  {criterion}:')}) {problem}" in tested.output


def test_scenarios_with_different_thresholds_in_one_run(fake, scenarios, tmp_path):
    strict, lenient = write(scenarios, "1", "a_strict.yaml"), write(scenarios, "0.5", "b_lenient.yaml")
    queue_two_trials(fake)
    queue_two_trials(fake)
    result = CliRunner().invoke(main, ["simulate", str(scenarios), "--json", "out.json", "--junit", "out.xml"])
    assert result.exit_code == 1, result.output
    assert f"{strict}: 1/2 trials passed (50%, 95% CI 9%-91%), threshold 100%: FAILED" in result.output
    assert f"{lenient}: 1/2 trials passed (50%, 95% CI 9%-91%), threshold 50%: ok" in result.output
    assert "1 scenario passed, 1 failed" in result.output
    data = json.loads((tmp_path / "out.json").read_text())
    assert not data["ok"]
    assert [(s["threshold"], s["ok"]) for s in data["scenarios"]] == [(1.0, False), (0.5, True)]
    cases = ET.parse(tmp_path / "out.xml").getroot().findall("testcase")
    assert [c.find("failure") is not None for c in cases] == [True, False]


# -- a scenario's mocks go into the recording ---------------------------------------------------


def test_a_mocked_handler_is_a_mock_of_the_recording(scenarios, no_model, tmp_path):
    """`book` runs a Python handler; the scenario mocks it, so the recording must too (else
    the replay would run the handler and get another confirmation code)."""
    bot = [call("book_flight"), call("set_departure", date="2027-03-01"), call("set_return_date", date="2027-03-08"),
           call("set_destination", destination="Dublin"), call("set_ticket_class", ticket_class="economy"),
           call("book"), {"text": "Anything else?"}]
    path = scripted(scenarios, {"state": {"state.last_booking": "flight FL-MOCKED"}}, bot=bot,
                    user=[{"text": "Economy to Dublin, 1 to 8 March 2027"}], trials=1,
                    mocks=[{"tool": "book", "result": "FL-MOCKED"}])
    result = CliRunner().invoke(main, ["simulate", str(path), "--record", "recorded"])
    assert result.exit_code == 0, result.output
    recorded = yaml.safe_load((tmp_path / "recorded" / "scripted.trial1.yaml").read_text())
    assert recorded["turns"][0]["mocks"] == [{"tool": "book", "args": {}, "result": "FL-MOCKED"}]
    tested = CliRunner().invoke(main, ["test", "recorded"])
    assert tested.exit_code == 0, tested.output


# -- the simulated user's model -----------------------------------------------------------------


def test_the_simulated_user_asks_its_declared_model(fake, scenarios):
    path = scripted(scenarios, {"route": "flight"}, bot=BOOKS_DUBLIN, trials=1,
                    user_model={"name": "user-model-7", "temperature": 1})
    fake.queue({"text": "I need a flight to Dublin"}, {"text": "DONE"})
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 0, result.output
    assert [(r["model"], r["temperature"]) for r in fake.requests] == [("user-model-7", 1)] * 2
    assert all("role-playing a user" in r["messages"][0]["content"] for r in fake.requests)


def test_the_simulated_user_can_talk_to_another_endpoint(fake, scenarios):
    from chatrun.testing.fake_openai import FakeOpenAI

    with FakeOpenAI() as users:
        path = scripted(scenarios, {"route": "flight"}, trials=1, user_model={"base_url": users.base_url})
        users.queue({"text": "I need a flight to Dublin"}, {"text": "DONE"})
        fake.queue(*BOOKS_DUBLIN)
        result = CliRunner().invoke(main, ["simulate", str(path)])
        assert result.exit_code == 0, result.output
        assert len(users.requests) == 2 and len(fake.requests) == 3
        assert all("role-playing a user" in r["messages"][0]["content"] for r in users.requests)
        assert all(r["model"] == "gpt-4o-mini" for r in fake.requests + users.requests)  # the bot's name


def test_a_malformed_scenario_is_told_each_problem_in_words_at_its_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(f"""\
        bot: {Path(__file__).resolve().parents[1] / 'bots' / 'refunds'}
        persona: Ana
        goal: A refund
        max_turns: three
        script:
          user:
            - txt: Refund A1001
          bot:
            - tool_calls: [{{nam: refund}}]
        success: {{calls: [{{tool: refund}}], bogus: 1}}
        """))
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 1
    errors = [line.split(": error: ")[1] for line in result.output.splitlines() if ": error: " in line]
    assert errors == [
        "`max_turns` must be an integer, not a string",
        "unknown key `txt` in `script.user[0]`; allowed: error, text",
        "missing required key `text` in `script.user[0]`",
        "missing required key `name` in `script.bot[0].tool_calls[0]`",
        "unknown key `nam` in `script.bot[0].tool_calls[0]`; allowed: arguments, id, name",
        "unknown key `bogus` in `success`; allowed: calls, events, judge, path, route, stack, state",
    ]
    assert [int(line.split(":")[1]) for line in result.output.splitlines() if ": error: " in line] == [4, 7, 7, 9, 9, 10]


def test_an_empty_a_list_or_a_latin_1_scenario_is_named_a_scenario_at_its_line(tmp_path):
    cases = {b"# nothing yet\n": "1:1: error: the scenario is empty; it needs `bot:`, `persona:`, `goal:` and `success:`",
             b"- a\n": "1:1: error: the scenario must be a mapping (`bot:`, `persona:`, `goal:`, `success:`), not a list",
             b"bot: ..\npersona: Jos\xe9\n": "2:13: error: the file is not UTF-8 text: byte 0xe9 on line 2 cannot be "
                                            "decoded; save the file as UTF-8"}
    for text, said in cases.items():
        path = tmp_path / "s.yaml"
        path.write_bytes(text)
        result = CliRunner().invoke(main, ["simulate", str(path)])
        assert result.exit_code == 1 and result.exception is None or isinstance(result.exception, SystemExit)
        assert f"{path}:{said}\n" in result.output, result.output
