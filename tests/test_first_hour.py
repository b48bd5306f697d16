"""The first hour from a package index (issue 39): the example bots come with chatrun
(`chatrun examples`, `chatrun init --example`), a bot path that is not there says how to get a
bot, the files `chatrun init` writes name what the user has, the REPL's `model>` prompt takes
/help, /quit and the read-only commands, and /save writes paths that work on another machine.
tests/test_wheel.py does the same from a built wheel in a fresh virtualenv."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chatrun.cli import main
from chatrun.cli.examples import example_names
from chatrun.version import DOCS_URL

REPO = Path(__file__).resolve().parents[1]
MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+?)(#\S*)?$", re.M)


def invoke(args: list[str], stdin: str | None = None):
    return CliRunner().invoke(main, args, input=stdin)


def test_examples_lists_every_example_bot_with_its_description():
    out = invoke(["examples"])
    assert out.exit_code == 0, out.output
    folders = sorted(p.parent.name for p in REPO.glob("bots/*/bot.yaml")) + ["shop"]  # shop keeps versions/
    assert example_names() == sorted(folders)
    lines = dict(line.split(None, 1) for line in out.output.splitlines()[:len(folders)])
    assert lines["travel"] == "Books flights, hotels, tours and rental cars."
    assert lines["bakery"] == "Takes bread orders in English or German."  # t('bot.description'), from its catalog
    assert "chatrun init --example travel" in out.output


@pytest.mark.parametrize("name", example_names())
def test_a_copied_example_names_only_schemas_inside_itself(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    out = invoke(["init", "--example", name])
    assert out.exit_code == 0, out.output
    assert f"next: chatrun validate {name} && chatrun test {name}" in out.output
    copy = tmp_path / name
    schemas = copy / ".chatrun" / "schemas"
    pointed = 0
    for path in copy.rglob("*.yaml"):
        if schemas in path.parents:
            continue
        for target, _ in MODELINE.findall(path.read_text()):
            assert not Path(target).is_absolute(), f"{path}: {target}"
            assert (path.parent / target).resolve().parent == schemas.resolve(), f"{path}: {target}"
            pointed += 1
    assert pointed, "every example's bot.yaml has a modeline"
    assert not list(copy.rglob("__pycache__"))


@pytest.mark.parametrize("name", ["travel", "bank"])
def test_a_copied_example_validates_and_passes_its_transcripts(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert invoke(["init", "--example", name, "mine"]).exit_code == 0
    validated = invoke(["validate", "mine"])
    assert validated.exit_code == 0, validated.output
    tested = invoke(["test", "mine"])
    assert tested.exit_code == 0, tested.output
    count = len(list((REPO / "bots" / name / "transcripts").glob("*.yaml")))
    assert f"{count} passed, 0 failed" in tested.output


def test_init_with_an_unknown_example_or_without_a_directory_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    unknown = invoke(["init", "--example", "trvel"])
    assert unknown.exit_code == 2 and "no example bot `trvel`" in unknown.output and "travel" in unknown.output
    bare = invoke(["init"])
    assert bare.exit_code == 2 and "chatrun examples" in bare.output
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    refused = invoke(["init", "--example", "hello", "taken"])
    assert refused.exit_code == 1 and "refusing to overwrite" in refused.output
    assert not list(tmp_path.glob("trvel")) and (tmp_path / "taken" / "x").exists()


@pytest.mark.parametrize("command", ["repl", "validate", "graph", "serve", "upgrade"])
def test_a_missing_bot_path_says_how_to_get_a_bot(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    example = invoke([command, "bots/hello"])
    assert example.exit_code == 2, example.output
    assert "Path 'bots/hello' does not exist. It is an example bot: `chatrun init --example hello bots/hello`" \
        in example.output, example.output
    other = invoke([command, "mybot"])
    assert "`chatrun examples` lists the example bots" in other.output and "chatrun init mybot" in other.output
    assert "Traceback" not in example.output + other.output


def test_chatrun_test_of_a_missing_bot_or_of_nothing_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = invoke(["test", "bots/hello"])
    assert missing.exit_code == 4
    assert "no such transcript: bots/hello. It is an example bot: `chatrun init --example hello bots/hello`" \
        in missing.output, missing.output
    nothing = invoke(["test"])
    assert nothing.exit_code == 5 and "`chatrun examples` lists the example bots" in nothing.output
    assert nothing.output.splitlines()[-1] == "0 passed, 0 failed"


def test_the_files_init_writes_name_what_the_user_has(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for template in ("hello", "wizard", "support"):
        assert invoke(["init", template, "-t", template]).exit_code == 0
        for path in (tmp_path / template).rglob("*"):
            if path.is_file() and ".chatrun" not in path.parts:
                text = path.read_text()
                assert not re.search(r"(?<![/\w])docs/\w+\.md", text), f"{path} names a docs/ file the user lacks"
        readme = (tmp_path / template / "README.md").read_text()
        assert f"{DOCS_URL}format.md" in readme and "chatrun examples" in readme and "chatrun schema" in readme


def test_the_package_names_its_documentation_where_the_cli_does():
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Documentation"] == DOCS_URL
    assert DOCS_URL in invoke(["--help"]).output


# -- the REPL, playing the model --------------------------------------------------------------


def test_the_model_prompt_takes_plain_text_help_read_only_commands_and_quit():
    script = "\n".join(["hello", "/help", "/route", "/state", "/reset", "Hi there!",
                        "again", "/quit", "/state", ""])
    out = invoke(["repl", str(REPO / "bots" / "hello"), "--play-model"], stdin=script)
    assert out.exit_code == 0, out.output
    text = out.output
    assert "Ctrl-C cancels the turn" in text.split("\n[model on route chat")[1].splitlines()[0]
    assert "At the model> prompt you answer for the model" in text  # /help, mid-turn
    assert "\nchat\n" in text  # /route ran mid-turn
    assert "(/reset waits for the end of the turn" in text
    assert "Hi there!" in text  # plain text was the model's answer
    assert "you left while the model's answer was awaited" in text
    assert text.count('"state"') == 1, text  # /state after /quit never ran: the REPL had left


def test_save_writes_portable_paths_and_says_turn_in_the_singular(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert invoke(["init", "mybot"]).exit_code == 0
    saved = tmp_path / "mybot" / "transcripts" / "saved.yaml"
    out = invoke(["repl", "mybot", "--play-model"], stdin=f"hello\nHi!\n/save {saved}\n")
    assert f"saved 1 turn to {saved};" in out.output, out.output
    header = saved.read_text().splitlines()[:2]
    assert header == ["# yaml-language-server: $schema=../.chatrun/schemas/transcript.schema.json",
                      "# Saved from `chatrun repl`; run it with: chatrun test mybot/transcripts/saved.yaml"]
    assert yaml.safe_load(saved.read_text())["bot"] == ".."
    assert invoke(["test", "mybot/transcripts/saved.yaml"]).exit_code == 0


def test_init_in_a_folder_whose_name_has_a_space_prints_commands_that_run_as_printed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = invoke(["init", "my bot"])
    assert out.exit_code == 0, out.output
    assert "next: chatrun validate 'my bot' && chatrun test 'my bot' && chatrun repl 'my bot'" in out.output
    assert "# Check it:      chatrun validate 'my bot'\n" in (tmp_path / "my bot" / "bot.yaml").read_text()
    assert "chatrun test 'my bot'/transcripts" in (tmp_path / "my bot" / "README.md").read_text()
    out = invoke(["repl", "my bot", "--play-model"], stdin="hello\nHi!\n/save my bot/transcripts/s.yaml\n")
    assert "saved 1 turn to my bot/transcripts/s.yaml; run it with: chatrun test 'my bot/transcripts/s.yaml'" \
        in out.output, out.output
    assert "run it with: chatrun test 'my bot/transcripts/s.yaml'\n" in \
        (tmp_path / "my bot" / "transcripts" / "s.yaml").read_text()


def test_save_over_the_bots_own_file_is_refused_and_a_transcript_is_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert invoke(["init", "mybot"]).exit_code == 0
    bot = (tmp_path / "mybot" / "bot.yaml").read_text()
    saved = tmp_path / "mybot" / "transcripts" / "saved.yaml"
    script = f"hello\nHi!\n/save mybot/bot.yaml\n/save mybot/transcripts\n/save {saved}\n/save {saved}\n"
    out = invoke(["repl", "mybot", "--play-model"], stdin=script).output
    assert (tmp_path / "mybot" / "bot.yaml").read_text() == bot  # a typo away from losing the bot
    assert "could not save: mybot/bot.yaml holds no transcript (no `turns:`); name a new file, or a " \
           "transcript to replace" in out, out
    assert "could not save: mybot/transcripts is a folder; name a file in it (mybot/transcripts/NAME.yaml)" in out
    assert out.count(f"saved 1 turn to {saved};") == 2  # a transcript is replaced, as before


def test_save_names_the_schema_by_its_id_outside_a_checkout_and_a_bot_without_copies(tmp_path, monkeypatch):
    from chatrun.transcripts.save import schema_reference

    monkeypatch.chdir(tmp_path)
    assert invoke(["init", "--example", "hello", "plain"]).exit_code == 0
    for copy in (tmp_path / "plain" / ".chatrun" / "schemas").iterdir():
        copy.unlink()
    assert schema_reference(tmp_path / "plain" / "t.yaml", tmp_path / "plain") == \
        "https://chatrun.dev/schemas/transcript.schema.json"
    # inside chatrun's own checkout, its schemas/ relatively (as the example transcripts do)
    assert schema_reference(REPO / "bots" / "hello" / "transcripts" / "t.yaml", REPO / "bots" / "hello") == \
        "../../../schemas/transcript.schema.json"
