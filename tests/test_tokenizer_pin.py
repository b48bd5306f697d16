"""A transcript pins its token counter (`tokenizer:`), so a token window evicts the same
messages on every machine, with tiktoken's encoding files present or not.

The window is chosen at the boundary: two turns of the same 120-character user message and
an "ok" reply. o200k_base counts 25 + 5 + 25 + 5 = 60 tokens, exactly `max_tokens: 60`, so
nothing is evicted; the estimate (~4 characters per token) counts 34 + 5 + 34 + 5 = 78, so the
first user message goes. A transcript written against one counter fails against the other
unless it pins it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chatrun.transcripts import load_transcript, run_transcript
from test_tokens import RUNNER, offline_env

TEXT = "hello world " * 10
BOT = """\
name: window
model: {provider: openai, name: gpt-4o-mini}
routes:
  chat:
    default: true
    memory: {type: token_window, max_tokens: 60}
"""
# What the window holds after turn 2, counted with the estimate, and exactly.
ESTIMATED = f'[{{assistant: ok}}, {{user: "{TEXT}"}}, {{assistant: ok}}]'
EXACT = f'[{{user: "{TEXT}"}}, {{assistant: ok}}, {{user: "{TEXT}"}}, {{assistant: ok}}]'


def window_transcript(tmp_path: Path, tokenizer: str | None, memory: str, name: str = "t.yaml") -> Path:
    (tmp_path / "bot.yaml").write_text(BOT)
    pin = f"tokenizer: {tokenizer}\n" if tokenizer else ""
    path = tmp_path / name
    path.write_text(
        f"bot: bot.yaml\n{pin}turns:\n"
        f'  - user: "{TEXT}"\n    model: [{{text: ok}}]\n'
        f'  - user: "{TEXT}"\n    model: [{{text: ok}}]\n    expect:\n      memory: {memory}\n'
    )
    return path


def chatrun_test(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chatrun", "test", str(path)], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.needs_encodings
def test_a_window_written_with_the_estimate_fails_with_exact_counts_unless_pinned(tmp_path):
    unpinned = run_transcript(str(window_transcript(tmp_path, None, ESTIMATED, "unpinned.yaml")))
    assert not unpinned.passed
    report = unpinned.report()
    assert "expected 3 messages in memory, got 4" in report
    assert "tokens in memory, counted with o200k_base (exact): 25 + 5 + 25 + 5 = 60 of max_tokens 60" in report

    pinned = run_transcript(str(window_transcript(tmp_path, "estimate", ESTIMATED)))
    assert pinned.passed, pinned.report()


@pytest.mark.subprocess
def test_the_pinned_estimate_passes_without_encoding_files(tmp_path):
    path = window_transcript(tmp_path, "estimate", ESTIMATED)
    proc = chatrun_test(path, offline_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert "tiktoken could not load" not in proc.stderr  # the estimate is asked for: no warning


@pytest.mark.needs_encodings
def test_a_pinned_encoding_gives_the_exact_window(tmp_path):
    result = run_transcript(str(window_transcript(tmp_path, "o200k_base", EXACT)))
    assert result.passed, result.report()


@pytest.mark.subprocess
def test_a_pinned_encoding_without_its_file_is_a_clear_failure(tmp_path):
    path = window_transcript(tmp_path, "o200k_base", EXACT)
    proc = chatrun_test(path, offline_env(tmp_path))
    assert proc.returncode != 0
    assert f"{path}:2: cannot start the conversation: tokenizer o200k_base is pinned" in proc.stdout
    assert "tokenizer: estimate" in proc.stdout


def test_an_unknown_tokenizer_is_a_diagnostic_at_its_line(tmp_path):
    path = window_transcript(tmp_path, "o200k_bse", EXACT)
    with pytest.raises(Exception) as caught:
        load_transcript(path)
    text = "\n".join(d.format() for d in caught.value.diagnostics)  # type: ignore[attr-defined]
    assert f"{path}:2:" in text
    assert "unknown tokenizer `o200k_bse`; did you mean `o200k_base`?" in text


@pytest.mark.needs_encodings
def test_update_pins_the_counter_it_counted_with(tmp_path):
    from chatrun.transcripts.update import update_from_result

    path = window_transcript(tmp_path, None, ESTIMATED)  # written elsewhere, with the estimate
    assert update_from_result(run_transcript(str(path)))
    assert path.read_text().splitlines()[1] == "tokenizer: o200k_base  # the token counter its windows were written with"
    transcript = load_transcript(path)
    assert transcript.tokenizer == "o200k_base"
    assert transcript.turns[1].expect["memory"] == [{"user": TEXT}, {"assistant": "ok"}] * 2
    assert run_transcript(transcript).passed
    assert not update_from_result(run_transcript(transcript))  # pinned once: nothing more to write


@pytest.mark.subprocess
def test_update_without_encoding_files_pins_the_estimate_it_used(tmp_path):
    path = window_transcript(tmp_path, None, EXACT)  # written where counts were exact: fails here
    env = offline_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "chatrun", "test", "--update", str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = path.read_text()
    assert "tokenizer: estimate  #" in text
    expect = load_transcript(path).turns[1].expect
    assert expect["memory"] == [{"assistant": "ok"}, {"user": TEXT}, {"assistant": "ok"}]  # the estimate's window
    assert run_transcript(str(path)).passed  # here, with the files: the pinned estimate gives the same window


def repl_window(tmp_path: Path, script: list[str], offline: bool = False) -> subprocess.CompletedProcess[str]:
    (tmp_path / "bot.yaml").write_text(BOT)
    env = offline_env(tmp_path) if offline else {**os.environ, "PYTHONPATH": str(RUNNER)}
    env = {k: v for k, v in env.items() if not k.startswith("OPENAI_")}
    return subprocess.run([sys.executable, "-m", "chatrun", "repl", str(tmp_path / "bot.yaml"), "--play-model"],
                          input="\n".join(script) + "\n", env=env, capture_output=True, text=True, timeout=120)


TWO_TURNS = [TEXT, "/say ok", TEXT, "/say ok"]  # the REPL strips the line: 119 characters, 24 tokens


@pytest.mark.subprocess
@pytest.mark.needs_encodings
def test_repl_memory_shows_each_messages_tokens_and_the_exact_counter(tmp_path):
    saved = tmp_path / "saved.yaml"
    out = repl_window(tmp_path, [*TWO_TURNS, "/memory", f"/save {saved}"])
    assert out.returncode == 0, out.stderr
    shown = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"role"')]
    assert [(m["role"], m["tokens"]) for m in shown] == [("user", 24), ("assistant", 5)] * 2
    assert "4 messages, 58 tokens of max_tokens 60, counted with o200k_base (exact)" in out.stdout
    text = saved.read_text()
    assert "\ntokenizer: o200k_base\n" in text  # the window was full: /save pins what counted it
    assert run_transcript(str(saved)).passed


@pytest.mark.subprocess
def test_repl_memory_says_when_counts_are_estimated(tmp_path):
    saved = tmp_path / "saved.yaml"
    out = repl_window(tmp_path, [*TWO_TURNS, "/memory", f"/save {saved}"], offline=True)
    assert out.returncode == 0, out.stderr
    assert '"tokens": 34}' in out.stdout
    assert "3 messages, 44 tokens of max_tokens 60, counted with estimate" in out.stdout
    assert "\ntokenizer: estimate\n" in saved.read_text()
    assert run_transcript(str(saved)).passed  # and with the files here: the same window


@pytest.mark.needs_encodings
def test_record_pins_the_counter_the_recording_counted_with(tmp_path, fake):
    from chatrun.transcripts.record import record_transcript

    path = window_transcript(tmp_path, None, EXACT)
    fake.queue({"text": "OK"}, {"text": "OK"})  # 5 tokens each, as "ok": the window is as full
    assert record_transcript(load_transcript(path))
    transcript = load_transcript(path)
    assert transcript.tokenizer == "o200k_base"
    assert [turn.model for turn in transcript.turns] == [[{"text": "OK"}]] * 2

    fake.queue({"text": "OK"}, {"text": "OK"})
    assert not record_transcript(transcript)  # the same answers: not a byte changes, the pin stays


def test_a_failing_sent_expectation_ends_with_the_token_counts_of_each_call(tmp_path):
    """Why a message was not sent (the window evicted it) is read off the counts under the diff."""
    (tmp_path / "bot.yaml").write_text(BOT.replace("    default: true\n", "    default: true\n    system: Be brief.\n"))
    path = tmp_path / "t.yaml"
    path.write_text(
        f"bot: bot.yaml\ntokenizer: estimate\nturns:\n"
        f'  - user: "{TEXT}"\n    model: [{{text: ok}}]\n'
        f'  - user: "{TEXT}"\n    model: [{{text: ok}}]\n    expect:\n      sent: [{{messages_count: 3}}]\n'
    )
    report = run_transcript(str(path)).report()
    assert report.endswith("    -- messages_count: 3\n    +- messages_count: 2\n"
                           "    tokens sent, counted with estimate:\n"
                           "      call 1 (route chat): 7 (system) + 5 + 34 = 46"), report
