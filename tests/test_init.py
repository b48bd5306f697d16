"""`chatrun init` and `chatrun schema` (issue 15): a new bot validates and passes its own
transcript as written, for every template; nothing is ever overwritten."""

from __future__ import annotations

import re
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


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_modelines_point_at_the_real_schemas(tmp_path, template):
    runner = CliRunner()
    assert runner.invoke(main, ["init", str(tmp_path / "b"), "-t", template]).exit_code == 0
    for file, schema in (("bot.yaml", "bot.schema.json"), (next((tmp_path / "b" / "transcripts").glob("*.yaml")).name,
                                                            "transcript.schema.json")):
        path = tmp_path / "b" / file if file == "bot.yaml" else tmp_path / "b" / "transcripts" / file
        first = path.read_text().splitlines()[0]
        match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
        assert match, first
        target = (path.parent / match.group(1)).resolve()
        assert target.name == schema and target.is_file()
        assert target == Path(runner.invoke(main, ["schema", schema.split(".")[0]]).output.strip())


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
    for which in ("bot", "transcript", "wire"):
        out = runner.invoke(main, ["schema", which])
        assert out.exit_code == 0
        assert Path(out.output.strip()).name == f"{which}.schema.json" and Path(out.output.strip()).is_file()
    assert runner.invoke(main, ["schema"]).output.strip().endswith("bot.schema.json")
    assert runner.invoke(main, ["schema", "nope"]).exit_code == 2
