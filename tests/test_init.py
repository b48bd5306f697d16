"""`chatrun init` and `chatrun schema` (issue 15): a new bot validates and passes its own
transcript as written, for every template; nothing is ever overwritten."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from chatrun.cli import main
from chatrun.cli.init import TEMPLATES, bot_name


@pytest.mark.parametrize("template", TEMPLATES)
def test_each_template_validates_and_passes_chatrun_test(tmp_path, monkeypatch, template):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    made = runner.invoke(main, ["init", "mybot", "--template", template])
    assert made.exit_code == 0, made.output
    assert {p.relative_to(tmp_path / "mybot").as_posix() for p in (tmp_path / "mybot").rglob("*") if p.is_file()} >= {
        "bot.yaml", "README.md"}
    transcripts = list((tmp_path / "mybot" / "transcripts").glob("*.yaml"))
    assert len(transcripts) == 1

    validated = runner.invoke(main, ["validate", "mybot"])
    assert validated.exit_code == 0 and "mybot: valid" in validated.output, validated.output
    tested = runner.invoke(main, ["test", "mybot"])
    assert tested.exit_code == 0, tested.output
    assert "1 passed, 0 failed" in tested.output


def modeline_target(path: Path) -> Path:
    first = path.read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, first
    assert not Path(match.group(1)).is_absolute(), f"{path}: the modeline must be relative: {first}"
    return (path.parent / match.group(1)).resolve()


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_modelines_point_at_copies_of_the_schemas_inside_the_bot(tmp_path, template):
    runner = CliRunner()
    assert runner.invoke(main, ["init", str(tmp_path / "b"), "-t", template]).exit_code == 0
    bot = tmp_path / "b"
    transcript = next((bot / "transcripts").glob("*.yaml"))
    for path, which in ((bot / "bot.yaml", "bot"), (transcript, "transcript")):
        target = modeline_target(path)
        # Inside the bot (committed with it), never into the virtualenv chatrun is installed in.
        assert target.is_relative_to(bot.resolve()) and target.is_file(), target
        installed = Path(runner.invoke(main, ["schema", which]).output.strip())
        assert target.read_bytes() == installed.read_bytes()


def test_a_new_bot_keeps_working_schemas_when_moved_and_the_install_is_gone(tmp_path):
    # What a clone on another machine sees: the bot elsewhere, no path into anyone's venv.
    runner = CliRunner()
    assert runner.invoke(main, ["init", str(tmp_path / "b")]).exit_code == 0
    moved = tmp_path / "elsewhere" / "clone"
    shutil.copytree(tmp_path / "b", moved)
    shutil.rmtree(tmp_path / "b")
    for path in (moved / "bot.yaml", *(moved / "transcripts").glob("*.yaml")):
        target = modeline_target(path)
        assert target.is_file() and target.is_relative_to(moved.resolve())
        assert "properties" in json.loads(target.read_text())
    validated = runner.invoke(main, ["validate", str(moved)])
    assert validated.exit_code == 0, validated.output


def test_schema_write_refreshes_a_bots_copies(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["init", str(tmp_path / "b")]).exit_code == 0
    copies = tmp_path / "b" / ".chatrun" / "schemas"
    (copies / "bot.schema.json").write_text("{}")  # as an older chatrun wrote it
    written = runner.invoke(main, ["schema", "--write", str(copies)])
    assert written.exit_code == 0, written.output
    assert written.output.count("wrote ") == 4
    for which in ("bot", "transcript", "scenario", "wire"):
        installed = Path(runner.invoke(main, ["schema", which]).output.strip())
        assert (copies / f"{which}.schema.json").read_bytes() == installed.read_bytes()
    assert "differ" not in runner.invoke(main, ["validate", str(tmp_path / "b")]).output
    (copies / "transcript.schema.json").write_text("{}")  # after an upgrade of chatrun
    noted = runner.invoke(main, ["validate", str(tmp_path / "b")])
    assert noted.exit_code == 0, noted.output  # a note, not a problem of the bot
    assert (f"transcript.schema.json in {copies} differ from this chatrun's (editors check against them); "
            f"refresh them: chatrun schema --write {copies}") in noted.output
    fresh = runner.invoke(main, ["schema", "--write", str(tmp_path / "new" / "dir")])
    assert fresh.exit_code == 0 and (tmp_path / "new" / "dir" / "wire.schema.json").is_file()
    (tmp_path / "afile").write_text("x")
    refused = runner.invoke(main, ["schema", "--write", str(tmp_path / "afile")])
    assert refused.exit_code == 1 and "is a file" in refused.output


def test_init_refuses_to_overwrite(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["init", str(tmp_path / "b")]).exit_code == 0
    (tmp_path / "b" / "bot.yaml").write_text("name: mine\n")
    again = runner.invoke(main, ["init", str(tmp_path / "b"), "-t", "wizard"])
    assert again.exit_code == 1 and "refusing to overwrite" in again.output
    assert (tmp_path / "b" / "bot.yaml").read_text() == "name: mine\n"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep")
    into_full = runner.invoke(main, ["init", str(tmp_path / "other")])
    assert into_full.exit_code == 1 and "is not empty" in into_full.output
    assert not (tmp_path / "other" / "bot.yaml").exists()


def test_the_bot_is_named_after_its_directory(tmp_path):
    assert bot_name(tmp_path / "my pizza bot!") == "my_pizza_bot"
    assert bot_name(tmp_path / "2go") == "_2go"


def test_schema_prints_each_schema_path():
    runner = CliRunner()
    for which in ("bot", "transcript", "scenario", "wire"):
        out = runner.invoke(main, ["schema", which])
        assert out.exit_code == 0
        assert Path(out.output.strip()).name == f"{which}.schema.json" and Path(out.output.strip()).is_file()
    assert runner.invoke(main, ["schema"]).output.strip().endswith("bot.schema.json")
    assert runner.invoke(main, ["schema", "nope"]).exit_code == 2


@pytest.mark.parametrize("name, hint", [("x/bot.yaml", "chatrun init x"), ("pizza.yml", "chatrun init mybot")])
def test_a_name_that_is_a_yaml_file_is_refused_with_the_directory_to_give(tmp_path, monkeypatch, name, hint):
    # `chatrun init bots/x/bot.yaml` made a directory named bot.yaml, a bot no command finds.
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["init", name])
    assert result.exit_code == 2 and "a bot is a directory holding bot.yaml" in result.output, result.output
    assert hint in result.output and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("origin", ["notaurl", "https://chat.example.com/app", "ftp://chat.example.com",
                                    "chat.example.com"])
def test_an_allow_origin_no_browser_sends_is_refused(origin):
    # A browser's Origin is scheme://host[:port]: a value with a path (or no scheme) never matched,
    # and the page was refused with nothing said at the start.
    import click

    from chatrun.cli.serve import _origins

    with pytest.raises(click.BadParameter, match="is not an origin: write scheme://host"):
        _origins(("*", origin))


@pytest.mark.slow
def test_serve_with_such_an_origin_exits_2_at_once(tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "chatrun", "serve", str(repo / "bots" / "travel"), "--port", "0",
                          "--allow-origin", "https://chat.example.com/app"], capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(repo / "runner")})
    assert out.returncode == 2 and "'https://chat.example.com/app' is not an origin" in out.stderr, out.stderr


def test_serve_takes_an_origin_with_a_port_a_trailing_slash_or_star():
    from chatrun.cli.serve import _origins

    values = ("https://chat.example.com", "http://localhost:5173/", "*")
    assert _origins(values) == values
