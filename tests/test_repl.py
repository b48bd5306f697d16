"""`chatrun repl` driven through a pipe, as a script would: the author plays the model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[1]


def run_repl(args: list[str], stdin: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(REPO / "runner")
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "chatrun", "repl", *args],
        input=stdin, capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )


def test_no_credentials_lets_the_author_play_the_model():
    out = run_repl(["bots/hello"], "hello there\n/say Hi! I am the hello bot.\n/route\n")
    assert out.returncode == 0, out.stderr
    assert "No model is configured" in out.stdout
    assert "OPENAI_API_KEY" in out.stdout
    assert "Hi! I am the hello bot." in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_travel_flow_push_and_pop_through_the_pipe(tmp_path):
    script = "\n".join([
        "I want to book a flight to Ireland",
        "/call book_flight {}",
        '/call set_destination {"destination": "Ireland"}',
        "/say When do you want to leave?",
        "/stack",
        "cancel that",
        "/call cancel {}",
        "/stack",
        "/quit",
    ]) + "\n"
    out = run_repl(["bots/travel", "--play-model"], script)
    assert out.returncode == 0, out.stderr
    assert "→ main_menu > flight" in out.stdout
    assert "When do you want to leave?" in out.stdout
    assert "→ main_menu" in out.stdout.split("cancel that")[-1] or out.stdout.rstrip().endswith("main_menu")
    assert "Traceback" not in out.stdout + out.stderr


def test_resume_a_session_from_sqlite(tmp_path):
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    first = run_repl(["bots/travel", "--play-model", "--store", db, "--session", "s1"],
                     "flight please\n/call book_flight {}\n/say Where to?\n")
    assert first.returncode == 0, first.stderr
    again = run_repl(["bots/travel", "--play-model", "--store", db, "--session", "s1"], "/route\n/history\n")
    assert again.returncode == 0, again.stderr
    assert "session s1 on main_menu > flight" in again.stdout
    assert "flight please" in again.stdout  # the history survived


def test_bad_bot_path_is_an_error_not_a_traceback(tmp_path):
    bad = tmp_path / "bot.yaml"
    bad.write_text("name: x\nroutes: {a: {sytem: hi}}\n")
    out = run_repl([str(bad)], "")
    assert out.returncode == 1
    assert "bot.yaml:2" in out.stderr
    assert "Traceback" not in out.stderr


def test_memory_shows_the_system_message_as_the_model_will_see_it():
    out = run_repl(["bots/hello", "--play-model"], "hi\n/say Hello!\n/memory\n")
    assert out.returncode == 0, out.stderr
    memory = out.stdout.split("Hello!\n", 1)[1].strip().splitlines()
    assert memory[0].startswith('{"role": "system"') and "friendly assistant" in memory[0]
    assert '"role": "user"' in memory[1] and '"role": "assistant"' in memory[2]


def test_offline_tiktoken_warning_is_one_sentence_on_one_line(tmp_path):
    bot = tmp_path / "bot.yaml"
    bot.write_text("name: t\nroutes:\n  chat:\n    default: true\n    system: hi\n"
                   "    memory: {type: token_window, max_tokens: 500}\n")
    out = run_repl([str(bot), "--play-model"], "hello\n/say hi\n",
                   {"TIKTOKEN_CACHE_DIR": str(tmp_path / "empty")})
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("warning: tiktoken could not load the o200k_base encoding")
    assert "TIKTOKEN_CACHE_DIR" in lines[0] and lines[0].count(". ") == 0


@pytest.mark.parametrize("encoding, line, said", [
    ("ascii", "Grüße\n".encode(), "error: input line 1 is not ascii text (byte 0xc3 at column 3); it was left out "
                                  "(for UTF-8 input set PYTHONIOENCODING=utf-8)"),
    ("utf-8", b"caf\xe9\n", "error: input line 1 is not utf-8 text (byte 0xe9 at column 4); it was left out "
                            "(save the input as UTF-8)"),
])
def test_a_line_that_is_not_text_in_the_inputs_encoding_is_named_and_left_out(encoding, line, said):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env |= {"PYTHONPATH": str(REPO / "runner"), "PYTHONIOENCODING": encoding}
    done = subprocess.run([sys.executable, "-m", "chatrun", "repl", "bots/hello"], capture_output=True, timeout=60,
                          env=env, cwd=REPO, input=line + b"hello\n/say Hi!\n/history\n")
    out, err = done.stdout.decode(encoding, errors="replace"), done.stderr.decode(encoding, errors="replace")
    assert done.returncode == 0 and "Traceback" not in err, err
    assert said in err
    assert '"input": "hello"' in out and out.count('{"turn": ') == 1  # the lines after it: read, as a turn
