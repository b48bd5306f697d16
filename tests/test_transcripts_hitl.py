"""Golden transcripts script the third party (issue 22): steps that approve (with edited
arguments), reject, answer as the user or the backend, act as an operator and let timeouts
fire; expectations on the pending items (`pending:`), on what a turn resolved (`resolved:`) and
on who has the conversation (`taken_over:`); `--update`, `--record` and `/save` write them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chatrun.errors import BotError
from chatrun.transcripts.format import load_transcript
from chatrun.transcripts.update import update_from_result

REPO = Path(__file__).resolve().parents[1]
REFUNDS = REPO / "bots" / "refunds"
ONBOARDING = REPO / "bots" / "onboarding"

REQUEST = """\
  - user: Please refund 120 EUR on A1001.
    model:
      - tool_calls: [{name: refund, arguments: {order: A1001, amount: 120}}]
"""


def write(tmp_path: Path, body: str, bot: Path = REFUNDS, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(f"bot: {bot}\nprincipal: {{name: ana, roles: [customer]}}\n"
                    f"clock: 2026-11-25T09:00:00+01:00\nturns:\n" + body)
    return path


def test_a_supervisor_edits_the_amount_and_the_expectations_hold(tmp_path):
    path = write(tmp_path, REQUEST + """\
    expect:
      pending: [{id: p1, kind: approval, tool: refund, args: {order: A1001, amount: 120}, edit: [amount]}]
      resolved: {}
  - as: {name: bob, roles: [supervisor]}
    approve: {item: p1, args: {amount: 80}, reason: partly}
    model: [{text: Refunded 80 EUR.}]
    expect:
      resolved: {p1: edited}
      pending: []
      state: {state.refunded: 80}
""")
    result = chatrun.run_transcript(str(path))
    assert result.passed, result.report()


def test_a_wrong_pending_expectation_fails_at_its_turns_line_with_a_diff(tmp_path):
    path = write(tmp_path, REQUEST + """\
    expect:
      pending: [{id: p1, args: {order: A1001, amount: 99}}]
  - as: {name: bob, roles: [supervisor]}
    reject: p1
    model: [{text: Declined.}]
    expect:
      resolved: {p1: approved}
""")
    result = chatrun.run_transcript(str(path))
    assert not result.passed
    first, second = result.failed_turns
    report = result.report()
    assert report.startswith(f"turn 1 ({path}:5): pending differs")
    assert "-    amount: 99" in report and "+    amount: 120" in report
    assert second.problems[0].format().startswith("resolved differs")
    assert "p1: rejected" in second.problems[0].format()


def test_a_refused_decision_is_an_error_the_turn_expects_or_fails_naming_its_line(tmp_path):
    refused = write(tmp_path, REQUEST + """\
  - approve: p1
    expect:
      error: {contains: "may be decided only by one of the roles supervisor; the caller has customer"}
      pending: [{id: p1}]
""")
    assert chatrun.run_transcript(str(refused)).passed
    unexpected = write(tmp_path, REQUEST + """\
  - approve: p1
    model: [{text: never called}]
""", name="u.yaml")
    result = chatrun.run_transcript(str(unexpected))
    assert not result.passed
    report = result.report()
    assert f"turn 2 ({unexpected}:8): the turn ended in an Error the transcript does not expect" in report
    assert "the decision was refused before its turn, so no model was called" in report


def test_the_backend_answers_with_the_items_token_and_without_it_is_refused(tmp_path):
    path = write(tmp_path, """\
  - user: Lea Martin, passport X1234567.
    model:
      - tool_calls: [{name: submit_documents, arguments: {name: Lea Martin, document: X1234567}}]
    expect:
      backend_events: [{Pending: {id: p1, kind: question, tool: submit_documents, args: {name: Lea Martin, document: X1234567}, ask: {contains: Check the documents}, by: [backend], due: "2026-11-27T08:00:00+00:00", schema: {contains: verdict}}}]
  - answer: {item: p1, value: {verdict: approved}}
    expect: {error: {contains: answered with its token}}
  - as: backend
    answer: {item: p1, value: {verdict: approved}}
    expect: {resolved: {p1: answered}, route: account, state: {state.kyc: {verdict: approved}}}
""", bot=ONBOARDING)
    result = chatrun.run_transcript(str(path))
    assert result.passed, result.report()
    assert "token" not in str(result.turns[0].observed.backend_events)  # the secret is never shown


def test_time_passes_to_a_timeout_and_expire_before_it_is_due_runs_no_turn(tmp_path):
    path = write(tmp_path, REQUEST + """\
  - clock: {advance: 29m}
    expire: true
    expect: {events: [], pending: [{id: p1}]}
  - clock: {advance: 1m}
    expire: true
    model: [{text: Nobody decided in time; 50 EUR are refunded now.}]
    expect:
      resolved: {p1: timed_out}
      memory:
        - user: Please refund 120 EUR on A1001.
        - assistant: 'refund({"order": "A1001", "amount": 120})'
        - tool: Refunded 50 EUR on order A1001.          # the approval's case `unanswered` decided
        - assistant: Nobody decided in time; 50 EUR are refunded now.
""")
    result = chatrun.run_transcript(str(path))
    assert result.passed, result.report()


def test_operator_steps_and_taken_over(tmp_path):
    path = write(tmp_path, """\
  - user: I need a person about my bill.
    model: [{tool_calls: [{name: human, arguments: {topic: billing}}]}]
    expect: {pending: [{id: p1, kind: takeover}], taken_over: null}
  - as: {name: carla, roles: [operators]}
    operator: take
    expect: {resolved: {p1: taken}, taken_over: {by: carla, item: p1}}
  - as: {name: carla, roles: [operators]}
    operator: {say: Hello!}
    expect: {events: [{Message: Hello!}]}
  - as: {name: dan, roles: [operators]}
    operator: {release: support}
    expect: {error: {contains: the operator carla holds the conversation}, taken_over: {by: carla}}
  - as: {name: carla, roles: [operators]}
    operator: {release: support}
    expect: {resolved: {p1: released}, taken_over: null, route: support, pending: []}
""", bot=REPO / "bots" / "handover")
    result = chatrun.run_transcript(str(path))
    assert result.passed, result.report()


def test_an_operator_step_takes_a_held_conversation_with_force(tmp_path):
    path = write(tmp_path, """\
  - user: I need a person about my bill.
    model: [{tool_calls: [{name: human, arguments: {topic: billing}}]}]
  - as: {name: carla, roles: [operators]}
    operator: take
  - as: {name: dan, roles: [operators]}
    operator: force
    expect:
      events: [{Message: carla left the conversation}, {Resolved: {id: p1, kind: takeover, outcome: taken, by: dan}},
               {Message: dan joined the conversation}]
      taken_over: {by: dan, item: p1}
      pending: [{id: p1, kind: takeover}]
  - as: {name: carla, roles: [operators]}
    operator: {say: Still here}
    expect: {error: {contains: the operator dan holds the conversation}, taken_over: {by: dan}}
  - as: {name: dan, roles: [operators]}
    operator: {release: support}
    expect: {resolved: {p1: released}, taken_over: null, route: support}
""", bot=REPO / "bots" / "handover")
    result = chatrun.run_transcript(str(path))
    assert result.passed, result.report()


@pytest.mark.parametrize(("turn", "message", "line"), [
    ("  - user: hi\n    approve: p1\n", "turn in `turns[0]` has both `user:` and `approve:`; give one", 5),
    ("  - operator: hold\n", "operator", 5),
    ("  - user: hi\n    expect: {pending: [{id: p1, owner: bob}]}\n", "unknown key `owner` in `turns[0].expect.pending[0]`", 6),
    ("  - expire: false\n", "expire", 5),
])
def test_a_bad_step_or_expectation_is_reported_at_its_line(tmp_path, turn, message, line):
    path = write(tmp_path, turn)
    with pytest.raises(BotError) as caught:
        load_transcript(path)
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.line == line and message in diagnostic.message, diagnostic.format()


def test_update_writes_what_waits_and_what_was_resolved(tmp_path):
    path = write(tmp_path, REQUEST + """\
  - as: {name: bob, roles: [supervisor]}
    approve: p1
    model: [{text: Done.}]
    expect: {resolved: {p1: rejected}}
""")
    result = chatrun.run_transcript(str(path))
    assert not result.passed
    assert update_from_result(result)
    text = path.read_text()
    assert "      pending:\n        - {id: p1, kind: approval, tool: refund}\n" in text  # the turn without expect:
    assert "    expect:\n      resolved:\n        p1: approved\n" in text
    assert "    approve: p1\n" in text and "as: {name: bob, roles: [supervisor]}" in text  # the steps kept
    assert chatrun.run_transcript(str(path)).passed


def test_record_sends_the_decisions_and_records_what_the_model_answered_after_them(fake, tmp_path):
    from chatrun.cli import main

    path = write(tmp_path, """\
  - user: Please refund 120 EUR on A1001.
  - as: {name: bob, roles: [supervisor]}
    approve: {item: p1, args: {amount: 80}}
  - approve: p1
    expect: {error: {contains: not pending}}
""")
    fake.queue({"tool_calls": [{"name": "refund", "arguments": {"order": "A1001", "amount": 120}}]},
               {"text": "80 EUR are refunded."})
    result = CliRunner().invoke(main, ["test", str(path), "--record", "--update"])
    assert result.exit_code == 0, result.output
    tool_result = [m for m in fake.requests[1]["messages"] if m["role"] == "tool"]
    assert tool_result[0]["content"] == "Refunded 80 EUR on order A1001."  # the decision ran before the model
    text = path.read_text()
    assert "    approve: {item: p1, args: {amount: 80}}\n    model:\n      - text: 80 EUR are refunded.\n" in text
    assert chatrun.run_transcript(str(path)).passed


def test_an_item_with_a_timeout_on_the_system_clock_is_warned_about(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(f"bot: {REFUNDS}\nturns:\n" + REQUEST)
    result = chatrun.run_transcript(str(path))
    assert result.passed, result.report()
    assert result.warnings == [f"{path}:3: warning: an item with a timeout waits, but the clock is not pinned, so its "
                               "due time differs on every run; pin it with `clock:` (docs/transcripts.md, \"The clock\")"]
