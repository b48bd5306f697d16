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


def write(folder: Path, threshold: str) -> Path:
    path = folder / "dublin.yaml"
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

    # Each trial is a transcript that replays offline to what happened.
    recorded = sorted(p.name for p in (tmp_path / "recorded").iterdir())
    assert recorded == ["dublin.trial1.yaml", "dublin.trial2.yaml"]
    tested = CliRunner().invoke(main, ["test", "recorded"])
    assert tested.exit_code == 0, tested.output
    assert "2 passed, 0 failed" in tested.output


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
    result = CliRunner().invoke(main, ["simulate", str(path), "--trials", "1"])
    assert result.exit_code == 1
    assert "trial 1: judge 'The bot asks when the traveller wants to leave.': scored 0.2" in result.output


def test_an_invalid_scenario_names_its_line_and_fails(scenarios):
    path = scenarios / "bad.yaml"
    path.write_text("bot: ../travel\npersona: P\ngoal: G\nsuccess:\n  calls: [{args: {}}]\n  rout: x\n")
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{path}:5:" in result.output and "'tool' is a required property" in result.output
    assert f"{path}:4:" in result.output and "'rout' was unexpected" in result.output


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
