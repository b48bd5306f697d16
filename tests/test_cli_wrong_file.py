"""A file given to the command for another kind (a bot to `chatrun test`, a transcript to
`validate` or `repl`, a scenario to `validate`) is one error saying what it is and which command
reads it, at the file's first line, not the other schema's list of errors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from click.testing import CliRunner

from chatrun.cli import main
from chatrun.definition.loader import check_bot

REPO = Path(__file__).resolve().parents[1]


def copy_hello(tmp_path: Path) -> Path:
    bot = tmp_path / "my bots" / "hello"  # a path with a space: the commands it names are quoted
    shutil.copytree(REPO / "bots" / "hello", bot)
    return bot


def test_chatrun_test_given_a_bot_file_says_it_is_a_bot_and_how_to_replay_its_transcripts(tmp_path):
    bot = copy_hello(tmp_path)
    result = CliRunner().invoke(main, ["test", str(bot / "bot.yaml")])
    assert result.exit_code == 1, result.output
    assert (f"{bot / 'bot.yaml'}:1:1: error: this is a bot (it has `routes:`), not a transcript: "
            f"`chatrun test '{bot}'` replays the bot's transcripts") in result.output, result.output
    assert "missing required key" not in result.output and "Traceback" not in result.output
    replay = CliRunner().invoke(main, ["test", str(bot)])  # what it says to run does run
    assert replay.exit_code == 0 and "3 passed, 0 failed" in replay.output, replay.output


def test_validate_and_repl_given_a_transcript_say_it_is_one_and_that_chatrun_test_replays_it(tmp_path):
    transcript = copy_hello(tmp_path) / "transcripts" / "smalltalk.yaml"
    said = (f"{transcript}:1:1: error: this is a transcript (it has `turns:`), not a bot: "
            f"`chatrun test '{transcript}'` replays it against its bot; this command takes a bot")
    for args in (["validate", str(transcript)], ["repl", str(transcript)]):
        result = CliRunner().invoke(main, args, input="")
        assert result.exit_code != 0, result.output
        assert said in result.output and "unknown key" not in result.output, result.output


def test_validate_given_a_scenario_says_chatrun_simulate_plays_it(tmp_path):
    scenario = tmp_path / "refund.yaml"
    scenario.write_text("bot: ../hello\npersona: A hurried customer.\ngoal: Get a refund.\nsuccess: {route: done}\n")
    result = CliRunner().invoke(main, ["validate", str(scenario)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"{scenario}:1:1: error: this is a scenario (it has `persona:` and `goal:`), "
                                    f"not a bot: `chatrun simulate {scenario}` plays it"), result.output


def test_simulate_given_a_bot_or_a_transcript_says_what_it_is(tmp_path):
    bot = copy_hello(tmp_path)
    result = CliRunner().invoke(main, ["simulate", str(bot / "bot.yaml")])
    assert (f"{bot / 'bot.yaml'}:1:1: error: this is a bot (it has `routes:`), not a scenario: "
            f"`chatrun simulate '{bot}'` plays the bot's scenarios") in result.output, result.output
    result = CliRunner().invoke(main, ["simulate", str(bot / "transcripts" / "smalltalk.yaml")])
    assert "error: this is a transcript (it has `turns:`), not a scenario: `chatrun test" in result.output, result.output
    assert "unknown key" not in result.output and result.exit_code != 0


def test_a_bot_file_whose_name_is_not_utf8_validates(tmp_path):
    """A file system allows a name no UTF-8 can spell (byte 0xfe): the content version hashed the
    name as text and validate said "unexpected UnicodeEncodeError (this is a chatrun bug)"."""
    name = os.fsdecode(b"b\xfe.yaml")
    (tmp_path / name).write_bytes((REPO / "bots" / "hello" / "bot.yaml").read_bytes())
    config, found = check_bot(tmp_path / name)  # what validate runs (click's test runner cannot print the name)
    assert config is not None and found == [], found


def test_init_refuses_a_directory_name_that_is_not_utf8_before_writing_anything(tmp_path):
    target = tmp_path / os.fsdecode(b"new\xffbot")
    result = CliRunner().invoke(main, ["init", str(target)])
    assert result.exit_code == 2, result.output
    assert "new\\xffbot is not UTF-8 text (byte 0xff)" in result.output, result.output
    assert not target.exists()


def test_report_names_the_file_it_cannot_write_not_the_store(tmp_path):
    store = tmp_path / "empty.db"
    store.touch()
    out = tmp_path / "no such folder" / "report.html"
    result = CliRunner().invoke(main, ["report", "--store", f"sqlite:///{store}", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"{out}: error: cannot write the report: No such file or directory"
