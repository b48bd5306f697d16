"""Where usage is shown: the REPL's /usage, `chatrun test -v`, the HTTP session resource. The
numbers come from the fake OpenAI server's reported usage through the real openai client
(or, when the model is played or scripted, from chatrun's own count, marked estimated)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat_support import COSTLY_BOT, usage

REPO = Path(__file__).resolve().parents[1]

BOT = COSTLY_BOT


def run_chatrun(args: list[str], stdin: str = "", env_extra: dict[str, str] | None = None,
                cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(REPO / "runner")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "chatrun", *args], input=stdin, capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)


# -- the REPL ------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_repl_usage_shows_each_call_of_the_last_turn_and_the_session_total(fake, write_bot):
    fake.queue(
        {"tool_calls": [{"name": "note", "arguments": {}}], "usage": usage(1000, 50, cached=400)},
        {"text": "Noted.", "usage": usage(1200, 20, reasoning=8)},
        {"text": "Again.", "usage": usage(2000, 10)},
    )
    path = write_bot(BOT)
    out = run_chatrun(["repl", str(path)], "/usage\ntake a note\n/usage\nagain\n/usage\n",
                      {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "test-key"})
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    before, first, second = out.stdout.split("Noted.")[0], *out.stdout.split("Noted.")[1].split("Again.")
    assert "no turn yet" in before and "session (0 calls): input 0  output 0" in before
    # 600 input at 0.15 + 400 cached at 0.075 + 50 output at 0.60, per million: 0.00015
    assert first.strip().splitlines() == [
        "last turn 1 (2 calls):",
        "  route main  model gpt-4o-mini  input 1,000 (400 cached)  output 50  cost 0.00015",
        "  route main  model gpt-4o-mini  input 1,200  output 20 (8 reasoning)  cost 0.000192",
        "  total  input 2,200 (400 cached)  output 70 (8 reasoning)  cost 0.000342",
        "session (2 calls): input 2,200 (400 cached)  output 70 (8 reasoning)  cost 0.000342",
    ]
    lines = second.strip().splitlines()
    assert lines[:2] == ["last turn 2 (1 call):", "  route main  model gpt-4o-mini  input 2,000  output 10  cost 0.000306"]
    assert lines[-1] == "session (3 calls): input 4,200 (400 cached)  output 80 (8 reasoning)  cost 0.000648"
    assert "estimated" not in out.stdout  # every count was reported by the endpoint


@pytest.mark.subprocess
def test_repl_usage_after_a_failed_turn_counts_the_calls_it_made(fake, write_bot):
    fake.queue({"tool_calls": [{"name": "note", "arguments": {}}], "usage": usage(1000, 50)},
               {"status": 400, "body": {"error": {"message": "no", "type": "invalid_request_error"}}})
    out = run_chatrun(["repl", str(write_bot(BOT))], "take a note\n/usage\n/history\n",
                      {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "test-key"})
    assert out.returncode == 0, out.stderr
    assert "error: the model failed on route main" in out.stdout
    assert ("last turn 1 (1 call, failed and rolled back; its calls still count):\n"
            "  route main  model gpt-4o-mini  input 1,000  output 50  cost 0.00018\n") in out.stdout
    assert "session (1 call): input 1,000  output 50  cost 0.00018\n" in out.stdout


@pytest.mark.subprocess
def test_repl_usage_while_playing_the_model_is_counted_and_marked_estimated():
    out = run_chatrun(["repl", "bots/hello", "--play-model"], "hi\n/say Hello there!\n/usage\n/help\n")
    assert out.returncode == 0, out.stderr
    after = out.stdout.split("Hello there!\n", 1)[1]
    turn, call, total, session = after.splitlines()[:4]
    assert turn == "last turn 1 (1 call):"
    assert call.startswith("  route chat  model gpt-4o-mini  input ") and call.endswith("(estimated)")
    assert total.startswith("  total  input ") and session.startswith("session (1 call): input ")
    assert "cost" not in after.split("/help")[0]  # the hello bot declares no prices
    assert "/usage             the last turn's tokens and cost" in out.stdout


# -- chatrun test -v -------------------------------------------------------------------------------

TRANSCRIPT = """
bot: bot.yaml
turns:
  - user: take a note
    model:
      - tool_calls: [{name: note, arguments: {}}]
      - text: Noted.
    expect: {route: main}
  - user: thanks
    model: [{text: "You are welcome."}]
"""


def test_chatrun_test_verbose_prints_each_transcripts_usage_and_a_total(tmp_path):
    import re

    from click.testing import CliRunner

    import chatrun
    from chatrun.cli import test as cli_test

    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "notes.yaml").write_text(TRANSCRIPT)
    (tmp_path / "thanks.yaml").write_text(TRANSCRIPT.split("  - user: thanks")[0].replace("take a note", "a note"))
    result = CliRunner().invoke(cli_test.test, [str(tmp_path / "notes.yaml"), str(tmp_path / "thanks.yaml"), "-v"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    pattern = re.compile(r"usage \((\d+) calls?\): input ([\d,]+)  output ([\d,]+)  cost ([\d.]+)  \(estimated\)$")
    notes = pattern.search(lines[lines.index(f"{tmp_path / 'notes.yaml'} PASSED") + 1])
    thanks = pattern.search(lines[lines.index(f"{tmp_path / 'thanks.yaml'} PASSED") + 1])
    total = pattern.search(lines[-2])
    assert lines[-1] == "2 passed, 0 failed"  # still the last line, as pytest's
    assert notes and thanks and total, result.output
    # The scripted model reports nothing: chatrun counts, as the library does for the same conversation.
    session = chatrun.load_bot(tmp_path / "bot.yaml").session(model=chatrun.ScriptedModel(
        [{"tool_calls": [{"name": "note", "arguments": {}}]}, {"text": "Noted."}, {"text": "You are welcome."}]))
    session.chat("take a note")
    session.chat("thanks")
    expected = session.usage
    assert notes.groups()[:3] == (str(expected["calls"]), f"{expected['input_tokens']:,}", f"{expected['output_tokens']:,}")
    assert float(notes.group(4)) == pytest.approx(expected["cost"], abs=1e-6)
    assert int(total.group(1)) == int(notes.group(1)) + int(thanks.group(1)) == 5
    for i in (2, 3):
        assert int(total.group(i).replace(",", "")) == sum(int(m.group(i).replace(",", "")) for m in (notes, thanks))
    assert float(total.group(4)) == pytest.approx(float(notes.group(4)) + float(thanks.group(4)), abs=2e-6)


def test_chatrun_test_without_verbose_prints_no_usage(tmp_path):
    from click.testing import CliRunner

    from chatrun.cli import test as cli_test

    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "notes.yaml").write_text(TRANSCRIPT)
    result = CliRunner().invoke(cli_test.test, [str(tmp_path / "notes.yaml")], catch_exceptions=False)
    assert result.exit_code == 0 and "usage" not in result.output


# -- the HTTP session resource ----------------------------------------------------------------------


def test_the_http_session_resource_carries_the_sessions_usage_as_documented(fake, write_bot, tmp_path):
    from fastapi.testclient import TestClient
    from jsonschema import Draft202012Validator

    import chatrun
    from server_support import app_for_testclient

    bot = chatrun.load_bot(write_bot(BOT))
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    fake.queue(
        {"tool_calls": [{"name": "note", "arguments": {}}], "usage": usage(1000, 50, cached=400)},
        {"text": "Noted.", "usage": usage(1200, 20, reasoning=8)},
        {"status": 400, "body": {"error": {"message": "no", "type": "invalid_request_error"}}},
    )
    with TestClient(app_for_testclient([bot], db)) as client:
        created = client.post("/bots/costly/sessions", json={"id": "u1"})
        assert created.status_code == 201
        assert created.json()["usage"] == {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0,
                                           "reasoning_tokens": 0, "cost": None, "calls": 0, "estimated": False}
        sent = client.post("/bots/costly/sessions/u1/messages", json={"userMessage": "take a note"},
                           headers={"Idempotency-Key": "k1"}).json()
        assert sent["ok"] and sent["usage"]["calls"] == 2 and sent["usage"]["input_tokens"] == 2200
        assert [c["input_tokens"] for c in sent["usage"]["by_call"]] == [1000, 1200]
        replayed = client.post("/bots/costly/sessions/u1/messages", json={"userMessage": "take a note"},
                               headers={"Idempotency-Key": "k1"}).json()
        assert replayed["replayed"] and replayed["usage"] == sent["usage"]  # the recorded turn's, nothing ran
        failed = client.post("/bots/costly/sessions/u1/messages", json={"userMessage": "again"}).json()
        assert failed["ok"] is False  # the endpoint refused: no call was answered, none is counted
        assert "usage" not in failed
        read = client.get("/bots/costly/sessions/u1")
        spec = client.get("/openapi.json").json()
    schema = spec["paths"]["/bots/{bot}/sessions/{session_id}"]["get"]["responses"]["200"]["content"][
        "application/json"]["schema"]
    assert "usage" in schema["required"]
    assert not list(Draft202012Validator(schema).iter_errors(read.json()))
    body = read.json()
    assert body["usage"] == {"input_tokens": 2200, "output_tokens": 70, "cached_input_tokens": 400,
                             "reasoning_tokens": 8, "cost": pytest.approx(0.000342), "calls": 2, "estimated": False}
    assert body["history"][0]["usage"]["by_call"][1]["reasoning_tokens"] == 8
    with TestClient(app_for_testclient([chatrun.load_bot(write_bot(BOT))], db)) as client:  # a restarted server
        assert client.get("/bots/costly/sessions/u1").json()["usage"] == body["usage"]  # from the stored snapshot


def test_a_streamed_http_turn_ends_with_its_usage_in_the_completed_event(fake, write_bot):
    from fastapi.testclient import TestClient

    import chatrun
    from server_support import app_for_testclient

    fake.queue({"text": "Streamed.", "usage": usage(300, 5)})
    with TestClient(app_for_testclient([chatrun.load_bot(write_bot(BOT))], "memory://")) as client:
        assert client.post("/bots/costly/sessions", json={"id": "s1"}).status_code == 201
        streamed = client.post("/bots/costly/sessions/s1/messages?stream=true", json={"userMessage": "hi"}).text
    completed = json.loads(streamed.split("event: Completed\ndata: ", 1)[1].split("\n", 1)[0])
    assert completed["usage"]["input_tokens"] == 300 and completed["usage"]["calls"] == 1
    assert completed["usage"]["by_call"][0]["route"] == "main"
