"""`/clock` in `chatrun repl` (issue 24): it shows the time templates see, pins it, moves it
on, returns to the system clock; a pinned clock survives /reset and /save writes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chatrun.transcripts.run import run_transcript

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[1]


def run_repl(args: list[str], stdin: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(REPO / "runner")
    return subprocess.run([sys.executable, "-m", "chatrun", "repl", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)


def test_clock_pins_moves_and_unpins_the_time_the_bot_sees(tmp_path):
    saved = tmp_path / "t" / "same_day.yaml"
    script = "\n".join([
        "/clock 2026-11-25T09:00",             # read in the bot's zone (Europe/Paris)
        "/clock +2h30m",
        "/reset",
        "/memory",                             # the system prompt as the model will see it
        "Please move my flight to the 27th.",
        '/call change_date {"new_date": "2026-11-27"}',
        "/say Sorry, it is today.",
        f"/save {saved}",
        "/clock tomorrow",
        "/clock -1h",
        "/clock real",
        "/quit",
    ]) + "\n"
    out = run_repl(["bots/airline", "--play-model"], script)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "2026-11-25T09:00:00+01:00 (Wednesday, Europe/Paris; pinned)" in text
    assert "2026-11-25T11:30:00+01:00 (Wednesday, Europe/Paris; pinned)" in text
    assert "Today is Wednesday 25 November 2026; it is 11:30 in Paris." in text  # kept across /reset
    assert "same-day changes cannot be made here" in text
    assert "error: Invalid isoformat string: 'tomorrow' (e.g. /clock 2026-12-24T18:00, /clock +1d, /clock real)" in text
    assert "error: -1h: the clock moves on only (what waits is due by it); to go back, pin an earlier instant" in text
    assert text.rstrip().endswith(", Europe/Paris; system clock)")  # /clock real: the real time, unpinned
    assert "Traceback" not in text + out.stderr
    # the saved transcript pins the turn at the REPL's instant, and passes
    assert "  - clock: '2026-11-25T11:30:00+01:00'\n    user: Please move my flight to the 27th.\n" in saved.read_text()
    assert run_transcript(str(saved)).passed


def test_save_pins_the_clock_a_turn_ran_at_so_the_transcript_passes_the_next_day(tmp_path, monkeypatch):
    saved = tmp_path / "t" / "moved.yaml"
    script = "\n".join([
        "Please move my flight to 10 January 2099.",  # the system clock: no /clock
        '/call change_date {"new_date": "2099-01-10"}',
        "/say Done.",
        f"/save {saved}",
        "/quit",
    ]) + "\n"
    out = run_repl(["bots/airline", "--play-model"], script)
    assert out.returncode == 0, out.stderr
    text = saved.read_text()
    assert "days from today)" in text  # what the replay checks reads the date the turn ran on
    assert "\nclock: '" in text  # pinned at the first turn's instant
    from datetime import UTC, datetime, timedelta

    from chatrun.engine.clock import SystemClock

    monkeypatch.setattr(SystemClock, "now", staticmethod(lambda: datetime.now(UTC) + timedelta(days=1)))
    result = run_transcript(str(saved))  # tomorrow
    assert result.passed, result.report()
