"""The REPL for bot authors (issue 15): playing the model shows what the model would see,
`--roles`/`/roles` walk role-restricted routes, `/help` lists every command."""

from __future__ import annotations

import pytest

from test_repl import run_repl

pytestmark = pytest.mark.subprocess


def test_playing_the_model_shows_tool_results_refusals_route_changes_and_prompts():
    script = "\n".join([
        "I want to book a flight to Ireland",
        "/call book_flight {}",
        "/call book {}",                                        # refused: nothing is set yet
        '/call set_destination {"destination": "Ireland"}',
        "/say When do you want to leave?",
    ]) + "\n"
    out = run_repl(["bots/travel", "--play-model"], script)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "[system prompt: You are a travel agent." in text
    assert "[route: main_menu → flight]" in text
    assert "[system prompt now: You are an airline reservation system." in text
    # The refusal names the tool that sets each missing value (docs/tools.md).
    assert ("[tool book → Error: book cannot run yet: scope.reservation.departure is not set — call set_departure "
            "first (ask the user for it);") in text
    assert "[tool set_destination → " in text
    # The context changed with the destination set: shown again before the next call; the
    # system prompt did not change (docs/models.md, "Stable prompts").
    after = text.split("[tool set_destination → ")[1]
    assert '[context now: Reservation so far: ' in after and '"destination": "Ireland"' in after
    assert "[system prompt now: " not in after
    assert "Traceback" not in text + out.stderr


def test_roles_open_role_restricted_routes_and_without_them_the_repl_says_checks_are_off():
    take_over = "Let a human take over\n/call take_over {}\n/say Staff here.\n/route\n"
    off = run_repl(["bots/support", "--play-model"], take_over)
    assert off.returncode == 0, off.stderr
    assert off.stdout.count("role checks are off") == 1
    assert "staff_desk" in off.stdout.splitlines()[-1]  # /route: open to anyone with checks off

    customer = run_repl(["bots/support", "--play-model", "--roles", "customer"],
                        take_over.replace("/say Staff here.", "/say I cannot do that."))
    assert customer.returncode == 0, customer.stderr
    assert "role checks are off" not in customer.stdout
    assert "[tool take_over → " in customer.stdout and "staff" in customer.stdout
    assert customer.stdout.splitlines()[-1] == "helpdesk"

    switched = run_repl(["bots/support", "--play-model", "--roles", "customer"],
                        "/roles staff\n" + take_over)
    assert "roles: staff" in switched.stdout
    assert switched.stdout.splitlines()[-1] == "staff_desk"


def test_help_lists_every_command_once_with_one_line_each():
    out = run_repl(["bots/hello", "--play-model"], "/help\n")
    lines = [line for line in out.stdout.splitlines() if line.startswith("/")]
    names = [line.split()[0] for line in lines]
    for command in ("/help", "/say", "/call", "/route", "/stack", "/state", "/memory", "/history", "/roles",
                    "/reload", "/save", "/reset", "/quit"):
        assert names.count(command) == 1, command
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # each with its line of help


def test_save_says_when_the_saved_transcript_does_not_replay_what_the_session_did(tmp_path):
    bot = tmp_path / "dice"
    bot.mkdir()
    (bot / "bot.yaml").write_text(
        "name: dice\nformat: 3\nroutes:\n  chat:\n    default: true\n    system: Roll dice when asked.\n"
        "    tools: [roll]\ntools:\n  roll:\n    description: Roll a die\n    handler: dice_tools:roll\n"
        "    action:\n      message: 'You rolled {{ result }}.'\n")
    (bot / "dice_tools.py").write_text(  # another number on each call, in any process: a count kept on disk
        "from pathlib import Path\n\nCOUNT = Path(__file__).with_name('rolls.txt')\n\n\n"
        "def roll(ctx):\n    n = int(COUNT.read_text()) + 1 if COUNT.exists() else 1\n"
        "    COUNT.write_text(str(n))\n    return n\n")
    saved = tmp_path / "roll.yaml"
    out = run_repl([str(bot), "--play-model"], f"roll\n/call roll {{}}\n/say done\n/save {saved}\n")
    assert out.returncode == 0, out.stderr
    assert f"saved 1 turn to {saved}, but its replay does not do what this session did, so `chatrun test` " \
           "fails it:\nturn 1 (" in out.stdout
    assert "-- Message: You rolled" in out.stdout and "run it with: chatrun test" not in out.stdout
    assert saved.is_file()  # kept: the author decides (a mock, a pinned handler) and saves again


# Texts YAML reads as something else when written plainly: a mapping (`: `), a comment (` #`), a
# list item (`- `), a boolean, null, a number, a date, an alias, a tag, a block scalar; and unicode.
YAML_SPECIAL = ["key: value # not a comment", "- leading dash", "yes", "null", "~", "on", "123", "1e3", "0x1F",
                "2026-01-01", "*star", "&anchor", "!tag", "|pipe", ">fold", "'single'", '"double"', "@at", "%pct",
                "Zürich ☕ naïve 🚀", "a\\nb (a backslash n, not a line break)"]


def _saved_texts(path) -> list[str]:
    import yaml

    turns = yaml.safe_load(path.read_text(encoding="utf-8"))["turns"]
    return [t.get("user") for t in turns] + [m["text"] for t in turns for m in t["model"] if "text" in m]


def _chatrun_test(path) -> tuple[int, str]:
    import os
    import subprocess
    import sys

    from test_repl import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    run = subprocess.run([sys.executable, "-m", "chatrun", "test", str(path)], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=120)
    return run.returncode, run.stdout + run.stderr


def test_save_round_trips_yaml_special_texts_tools_a_route_change_and_an_approval(tmp_path):
    flight = tmp_path / "flight.yaml"
    script = [line for text in YAML_SPECIAL for line in (text, f"/say {text}")]
    script += ["I want to book a flight: Dublin # soon", "/call book_flight {}",
               '/call set_destination {"destination": "Dublin"}', "/say When: #1, - yes?", f"/save {flight}"]
    out = run_repl(["bots/travel", "--play-model"], "\n".join(script) + "\n")
    assert out.returncode == 0, out.stderr
    assert _saved_texts(flight) == [*YAML_SPECIAL, "I want to book a flight: Dublin # soon",
                                    *YAML_SPECIAL, "When: #1, - yes?"]
    assert "route: flight" in flight.read_text()
    assert _chatrun_test(flight) == (0, ".\n1 passed, 0 failed\n")

    refund = tmp_path / "refund.yaml"
    script = ["/clock 2026-11-25T09:00", "Refund: 120 EUR # now - yes", '/call refund {"order": "A1001", "amount": 120}',
              "/principal bob roles=supervisor", '/approve p1 {"amount": 80} no: - only # the box',
              "/say 80 € on: their way # null", f"/save {refund}"]
    out = run_repl(["bots/refunds", "--play-model", "--roles", "customer"], "\n".join(script) + "\n")
    assert out.returncode == 0, out.stderr
    assert _saved_texts(refund) == ["Refund: 120 EUR # now - yes", None, "80 € on: their way # null"]
    assert "reason: 'no: - only # the box'" in refund.read_text()
    assert _chatrun_test(refund) == (0, ".\n1 passed, 0 failed\n")
