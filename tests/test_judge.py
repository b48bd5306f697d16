"""Transcripts that judge (issue 15): `judge:` expectations scored by a judge model, recorded
verdicts replayed offline, live runs (`chatrun test --live --repeat N`) against the fake
OpenAI server scripted to answer as the bot's model and as the judge; `roles:` and `refused:`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from chatrun.cli import main

BOT = """\
name: desk
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main:
    default: true
    system: You book flights. Ask for the departure date.
    tools: [go_staff]
  staff:
    roles: [staff]
    system: Staff only.
tools:
  go_staff:
    description: staff desk
    action: {route: staff}
"""

TRANSCRIPT = """\
bot: ..
roles: []
judge:
  model: {name: gpt-4o, temperature: 0}
  threshold: 0.7
turns:
  - user: I want to fly to Dublin
    model:
      - text: When do you want to leave?
    expect:
      route: main
      events:
        - Message: When do you want to leave?
      judge: the reply asks for the departure date and nothing else
"""


def verdict(score: float, reason: str) -> dict:
    return {"text": json.dumps({"score": score, "reason": reason})}


@pytest.fixture
def bot_dir(tmp_path) -> Path:
    folder = tmp_path / "desk"
    (folder / "transcripts").mkdir(parents=True)
    (folder / "bot.yaml").write_text(BOT)
    return folder


def write_transcript(bot_dir: Path, text: str = TRANSCRIPT, name: str = "t.yaml") -> Path:
    path = bot_dir / "transcripts" / name
    path.write_text(textwrap.dedent(text))
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["test", *args])
    return result.exit_code, result.output


# -- replay: recorded verdicts, offline ---------------------------------------------------------


def test_record_stores_the_verdicts_and_replay_uses_them_offline(bot_dir, fake, monkeypatch):
    path = write_transcript(bot_dir)
    fake.queue({"text": "When do you want to leave?"}, verdict(0.9, "It asks only for the date."))
    code, out = run(str(path), "--record")
    assert code == 0, out
    judge_request = fake.requests[-1]
    assert judge_request["model"] == "gpt-4o" and judge_request["temperature"] == 0  # the declared judge model
    assert "the reply asks for the departure date" in judge_request["messages"][-1]["content"]
    assert "When do you want to leave?" in judge_request["messages"][-1]["content"]
    judged = yaml.safe_load(path.read_text())["turns"][0]["judged"]
    assert judged[0]["criterion"] == "the reply asks for the departure date and nothing else"
    assert judged[0]["score"] == 0.9 and judged[0]["reason"] == "It asks only for the date." and judged[0]["digest"]

    asked = len(fake.requests)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9")  # offline: nothing may be asked
    for _ in range(2):  # deterministic
        code, out = run(str(path))
        assert code == 0 and "1 passed, 0 failed" in out, out
    assert len(fake.requests) == asked


def test_a_low_recorded_score_fails_with_the_judges_reason(bot_dir, fake):
    path = write_transcript(bot_dir)
    fake.queue({"text": "When do you want to leave?"}, verdict(0.2, "It also asks for a seat."))
    code, out = run(str(path), "--record")
    assert code == 1
    assert "scored 0.2, below the threshold 0.7" in out and "It also asks for a seat." in out
    code, out = run(str(path))  # the same verdict, replayed
    assert code == 1 and "It also asks for a seat." in out


def test_replay_without_a_verdict_or_with_changed_text_fails_saying_what_to_do(bot_dir, fake):
    path = write_transcript(bot_dir)
    code, out = run(str(path))
    assert code == 1 and "no recorded verdict; record one with `chatrun test --record`" in out

    fake.queue({"text": "When do you want to leave?"}, verdict(1, "Yes."))
    assert run(str(path), "--record")[0] == 0
    edited = path.read_text().replace("- text: When do you want to leave?", "- text: Where do you fly from?") \
        .replace("- Message: When do you want to leave?", "- Message: Where do you fly from?")
    path.write_text(edited)
    code, out = run(str(path))
    assert code == 1 and "the text judged has changed since the verdict was recorded" in out


def test_a_conversation_criterion_is_judged_on_the_whole_conversation(bot_dir, fake):
    path = write_transcript(bot_dir, TRANSCRIPT.replace(
        "  threshold: 0.7\n", "  threshold: 0.7\n  conversation: the assistant stays polite\n"))
    fake.queue({"text": "When do you want to leave?"}, verdict(1, "Date only."), verdict(0.4, "It was curt."))
    code, out = run(str(path), "--record")
    assert code == 1 and "(the conversation) judge 'the assistant stays polite': scored 0.4" in out
    conversation_request = fake.requests[-1]["messages"][-1]["content"]
    assert "User: I want to fly to Dublin" in conversation_request
    judged = yaml.safe_load(path.read_text())["turns"][-1]["judged"]
    assert [v["criterion"] for v in judged] == ["the reply asks for the departure date and nothing else",
                                                 "the assistant stays polite"]


# -- live runs ------------------------------------------------------------------------------------


def test_live_compares_what_the_bot_did_not_the_models_words(bot_dir, fake):
    path = write_transcript(bot_dir)
    fake.queue({"text": "And when would you like to travel?"}, verdict(0.95, "Asks for the date."))
    code, out = run(str(path), "--live")
    assert code == 0, out
    assert fake.requests[0]["model"] == "gpt-4o-mini"  # the bot's model answered, live
    assert path.read_text() == textwrap.dedent(TRANSCRIPT)  # nothing written

    fake.queue({"tool_calls": [{"name": "go_staff", "arguments": {}}]}, {"text": "Staff here."},
               verdict(0.95, "ok"))
    code, out = run(str(path), "--live")
    assert code == 1 and "+- Error: '...'" in out  # the refused tool's Error event, its text left out

    path.write_text(path.read_text().replace("roles: []", "roles: [staff]"))
    fake.queue({"tool_calls": [{"name": "go_staff", "arguments": {}}]}, {"text": "Staff here."},
               verdict(0.95, "ok"))
    code, out = run(str(path), "--live")
    assert code == 1 and "route differs" in out


def test_live_compares_the_pending_items_the_bot_left(tmp_path, fake):
    """A live model that answers instead of asking for the refund leaves no approval waiting:
    `pending:` (and `resolved:`, `taken_over:`) were skipped live, so the transcript passed."""
    refunds = Path(__file__).resolve().parents[1] / "bots" / "refunds"
    path = tmp_path / "transcripts" / "refund.yaml"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(f"""\
        bot: {refunds}
        clock: 2026-11-25T09:00:00+01:00
        turns:
          - user: Please refund 120 EUR on order A1001.
            model:
              - tool_calls: [{{name: refund, arguments: {{order: A1001, amount: 120}}}}]
            expect:
              pending: [{{id: p1, kind: approval, tool: refund}}]
              resolved: {{}}
              taken_over: null
        """))
    fake.queue({"tool_calls": [{"name": "refund", "arguments": {"order": "A1001", "amount": 120}}]})
    code, out = run(str(path), "--live")
    assert code == 0, out  # the bot asked for the approval, live: it passes
    fake.queue({"text": "Done, refunded!"})  # the model skips the tool: nothing waits
    code, out = run(str(path), "--live")
    assert code == 1, out
    assert f"turn 1 ({path}:4): pending differs\n" in out, out


def test_live_reasks_a_failed_judgement_once_and_reports_the_reason(bot_dir, fake):
    path = write_transcript(bot_dir)
    fake.queue({"text": "When?"}, verdict(0.3, "Too terse."), verdict(0.8, "Asks for the date."))
    code, out = run(str(path), "--live")
    assert code == 0, out
    assert len(fake.requests) == 3  # the model, the judge, the judge again

    fake.reset()
    fake.queue({"text": "Where to?"}, verdict(0.1, "Asks for the destination."), verdict(0.2, "Destination, not date."))
    code, out = run(str(path), "--live")
    assert code == 1
    assert "scored 0.2, below the threshold 0.7 (asked twice); the judge's reason: Destination, not date." in out


def test_live_repeat_prints_pass_rates(bot_dir, fake):
    path = write_transcript(bot_dir, TRANSCRIPT.replace("      judge: the reply asks for the departure date and nothing else\n", ""))
    path.write_text(path.read_text().replace("roles: []", "roles: [staff]"))
    fake.queue({"text": "When?"}, {"text": "When then?"},
               {"tool_calls": [{"name": "go_staff", "arguments": {}}]}, {"text": "Staff."})
    code, out = run(str(path), "--live", "--repeat", "3")
    assert code == 1
    assert f"{path}: 2/3 passed (66%)" in out
    assert "0 passed, 1 failed" in out  # one line per transcript in the summary


def test_live_and_record_together_are_refused(bot_dir):
    code, out = run(str(write_transcript(bot_dir)), "--live", "--record")
    assert code == 4 and "--live" in out


# -- roles and refused starts ----------------------------------------------------------------------


def test_transcripts_without_roles_are_told_once_that_role_checks_are_off(bot_dir, fake):
    plain = TRANSCRIPT.replace("roles: []\n", "").replace("judge:\n  model: {name: gpt-4o, temperature: 0}\n  threshold: 0.7\n", "") \
        .replace("      judge: the reply asks for the departure date and nothing else\n", "")
    write_transcript(bot_dir, plain, "a.yaml")
    write_transcript(bot_dir, plain, "b.yaml")
    code, out = run(str(bot_dir / "transcripts"))
    assert code == 0, out
    assert out.count("role checks are off in 2 transcripts") == 1


def test_a_refused_start_route_can_be_expected(bot_dir):
    refused = "bot: ..\nroute: staff\nroles: []\nrefused: {contains: needs one of the roles}\n"
    write_transcript(bot_dir, refused, "refused.yaml")
    code, out = run(str(bot_dir / "transcripts" / "refused.yaml"))
    assert code == 0, out

    write_transcript(bot_dir, refused.replace("roles: []", "roles: [staff]"), "started.yaml")
    code, out = run(str(bot_dir / "transcripts" / "started.yaml"))
    assert code == 1 and "expected the start on route staff to be refused, but the conversation started" in out

    write_transcript(bot_dir, refused.replace("needs one of the roles", "is closed"), "other.yaml")
    code, out = run(str(bot_dir / "transcripts" / "other.yaml"))
    assert code == 1 and "the start was refused, but the message differs" in out

    write_transcript(bot_dir, "bot: ..\nroles: []\n", "empty.yaml")
    code, out = run(str(bot_dir / "transcripts" / "empty.yaml"))
    assert code == 1 and "missing required key `turns`" in out

    # turns after a refused start never run: they passed unrun, whatever they expected
    path = write_transcript(bot_dir, refused + "turns:\n  - user: hi\n    model: [{text: Hi}]\n"
                            "    expect: {route: nowhere}\n", "with_turns.yaml")
    code, out = run(str(path))
    assert code == 1 and f"{path}:5:1: error: `turns:` never run after a refused start (`refused:`): " \
        "remove them, or `refused:` to test a conversation that starts" in out, out

    # success criteria beside a refused start are never checked: refused, naming their line
    path = write_transcript(bot_dir, refused + "success:\n  route: nowhere\n", "with_success.yaml")
    code, out = run(str(path))
    assert code == 1 and f"{path}:5:1: error: `success:` is never checked after a refused start " \
        "(`refused:`): no conversation happens" in out, out
