"""`chatrun simulate` scenarios take what transcripts take — `principal:`, `clock:`, `locale:`,
`version:` — and run on a bot in several versions (docs/versions.md); a recorded trial names
them, so its replay under `chatrun test` runs as the trial did. Scripted sides: no model."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chatrun.cli import main

GREET = {"tool_calls": [{"name": "greet", "arguments": {}}]}


def desk(root: Path) -> Path:
    """bots/desk in two versions (versions/1, versions/2), each greeting the principal in the
    session's locale with its version's prefix, and keeping `now` when it greets."""
    for version in ("1", "2"):
        folder = root / "bots" / "desk" / "versions" / version
        (folder / "locales").mkdir(parents=True)
        (folder / "bot.yaml").write_text(textwrap.dedent(f"""\
            name: desk
            format: 3
            version: "{version}"
            locales: [en, de]
            state: {{seen: null}}
            routes:
              main:
                default: true
                system: "{{{{ t('system') }}}}"
                tools: [greet]
            tools:
              greet:
                description: Greet whoever is signed in
                action:
                  set: {{state.seen: "{{{{ now.isoformat() }}}}"}}
                  message: "{{{{ t('hi', name=principal.name) }}}}"
                  reply: Greeted.
            """))
        (folder / "locales" / "en.yaml").write_text(f"system: You greet people.\nhi: 'v{version}: Hello {{name}}'\n")
        (folder / "locales" / "de.yaml").write_text(f"system: Du grüßt.\nhi: 'v{version}: Hallo {{name}}'\n")
    return root / "bots" / "desk"


def scenario(folder: Path, success: dict, **settings: object) -> Path:
    doc = {"bot": "../bots/desk", "persona": "Ana.", "goal": "Be greeted.", "trials": 2, **settings,
           "script": {"user": [{"text": "hi"}, {"text": "again"}], "bot": [GREET, {"text": "ok"}, GREET, {"text": "ok"}]},
           "success": success}
    folder.mkdir(exist_ok=True)
    path = folder / "greet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens: no model is asked
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    monkeypatch.chdir(tmp_path)
    desk(tmp_path)
    return tmp_path


SETTINGS = {"principal": {"name": "ana", "roles": ["staff"]}, "clock": {"at": "2026-11-25T09:00:00+00:00", "advance": "1m"},
            "locale": "de", "version": 1}


def test_a_scenario_signs_in_pins_the_clock_picks_the_locale_and_the_version(here):
    # The second turn runs a minute after the first, in every trial (each starts at `at` again).
    success = {"events": [{"Message": "v1: Hallo ana"}], "state": {"state.seen": "2026-11-25T09:01:00+00:00"}}
    path = scenario(here / "scenarios", success, **SETTINGS)
    result = CliRunner().invoke(main, ["simulate", str(path), "--record", "recorded"])
    assert result.exit_code == 0, result.output
    assert "2/2 trials passed" in result.output
    recorded = yaml.safe_load((here / "recorded" / "greet.trial2.yaml").read_text())
    assert {key: recorded[key] for key in ("principal", "clock", "locale", "version")} == {**SETTINGS, "version": "1"}
    assert not any("clock" in turn for turn in recorded["turns"])  # the scenario's clock, not the wall's
    tested = CliRunner().invoke(main, ["test", "recorded"])
    assert tested.exit_code == 0 and "2 passed, 0 failed" in tested.output, tested.output


def test_a_versioned_bot_runs_its_primary_version_and_a_bot_folder_finds_its_scenarios(here):
    path = scenario(here / "bots" / "desk" / "scenarios", {"events": [{"Message": "v2: Hello ana"}]},
                    principal={"name": "ana"}, bot="..")  # the scenario lives in the bot's folder
    assert path.parent == here / "bots" / "desk" / "scenarios"
    result = CliRunner().invoke(main, ["simulate", "bots/desk", "--json", "-", "--record", "recorded"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert verdict["scenarios"][0]["passed"] == 2
    assert yaml.safe_load((here / "recorded" / "greet.trial1.yaml").read_text())["version"] == "2"
    assert CliRunner().invoke(main, ["test", "recorded"]).exit_code == 0


def test_a_version_the_bot_lacks_or_a_bad_clock_is_told_at_its_line(here):
    path = scenario(here / "scenarios", {"route": "main"}, version="7")
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("version:"))
    assert f"{path}:{line}: `version:` bot ../bots/desk has no version '7'; it has: 1 (" in result.output
    path = scenario(here / "scenarios", {"route": "main"}, clock="next tuesday")
    result = CliRunner().invoke(main, ["simulate", str(path)])
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("clock:"))
    assert result.exit_code == 1 and f"{path}:{line}:" in result.output, result.output
