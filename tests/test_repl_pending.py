"""Humans in the loop in `chatrun repl` (issue 22): pending items are shown as they appear,
`/approve`, `/reject`, `/answer`, `/operator` and `/expire` act on them as the principal
`/principal` signs in, and `/save` writes them as transcript steps that replay."""

from __future__ import annotations

import pytest

from chatrun.transcripts.run import run_transcript
from test_repl import run_repl

pytestmark = pytest.mark.subprocess

REFUND = ["Refund 120 EUR on A1001 please", '/call refund {"order": "A1001", "amount": 120}']


def test_a_supervisor_edits_an_approval_and_save_writes_the_steps(tmp_path):
    saved = tmp_path / "refund.yaml"
    script = "\n".join([
        "/clock 2026-11-25T09:00",
        *REFUND,
        "How long will it take?",
        "/pending",
        "/approve p1",                                      # the customer may not
        "/principal bob roles=supervisor",
        '/approve p1 {"amount": "lots"}',                   # an edit that does not validate
        '/approve p1 {"amount": 80} only the broken part',
        "/say 80 EUR are on their way.",
        "/principal ana roles=customer",
        "Thanks!",
        "/say You are welcome.",
        f"/save {saved}",
    ]) + "\n"
    out = run_repl(["bots/refunds", "--play-model", "--roles", "customer"], script)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    item = ('⏸ p1 approval: Refund 120 EUR on order A1001? (refund {"order": "A1001", "amount": 120}; by supervisor; '
            "may edit amount; due 2026-11-25T09:30:00+00:00) — /approve p1 or /reject p1")
    assert text.count(item) == 2  # once when it appeared (not again for the operators' copy), once for /pending
    # the customer is told their own text (`tell:`), never the supervisor's question
    assert "  the user is told: Your refund of 120 EUR is waiting for a supervisor's approval." in text
    assert "Still waiting: Your refund of 120 EUR is waiting for a supervisor's approval." in text
    assert "Still waiting: Refund" not in text
    assert "error: pending item p1 may be decided only by one of the roles supervisor; the caller has customer" in text
    assert "error: pending item p1: the edited arguments" in text or "'lots' is not of type 'number'" in text
    assert ('✓ p1 approval edited by bob; args {"order": "A1001", "amount": 80}; reason "only the broken part"'
            in text)
    assert "80 EUR are on their way." in text and "Traceback" not in text + out.stderr
    written = saved.read_text()
    assert "  - clock: '2026-11-25T09:00:00+00:00'\n    user: Refund 120 EUR on A1001 please\n" in written
    assert ("    as: {name: bob, roles: [supervisor]}\n"
            "    approve:\n      item: p1\n      args:\n        amount: 80\n      reason: only the broken part\n") in written
    assert "    as: {name: ana, roles: [customer]}\n    user: Thanks!\n" in written
    # the refused decisions are steps too, expecting their refusal
    assert "    approve: p1\n    model: []\n" in written
    assert "error: pending item p1 may be decided only by one of the roles supervisor" in written
    assert "error: \"item p1: invalid arguments for refund: amount: 'lots' is not of type 'number'.\"" in written
    result = run_transcript(str(saved))
    assert result.passed, result.report()


def test_a_supervisor_rejects_with_a_reason_and_save_writes_the_step(tmp_path):
    saved = tmp_path / "reject.yaml"
    script = "\n".join([
        "/clock 2026-11-25T09:00",
        *REFUND,
        "/reject p1",                                       # the customer may not reject either
        "/principal bob roles=supervisor",
        "/reject p9 no such item",
        "/reject p1 no receipt on file",
        "/say Sorry, the refund was declined: there is no receipt on file.",
        "/reject p1 again",                                 # decided already: nothing happens twice
        "/state",
        f"/save {saved}",
    ]) + "\n"
    out = run_repl(["bots/refunds", "--play-model", "--roles", "customer"], script)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "error: pending item p1 may be decided only by one of the roles supervisor; the caller has customer" in text
    assert "p9" in text and "no open item has that id" in text
    assert '✓ p1 approval rejected by bob; reason "no receipt on file"' in text
    assert text.count("✓ p1 approval") == 1 and "resolved already (rejected)" in text
    assert "Sorry, the refund was declined: there is no receipt on file." in text
    assert '"refunded": 0' in text and "Traceback" not in text + out.stderr
    written = saved.read_text()
    assert ("    as: {name: bob, roles: [supervisor]}\n"
            "    reject: {item: p1, reason: no receipt on file}\n") in written
    result = run_transcript(str(saved))
    assert result.passed, result.report()


def test_the_backend_answers_with_its_token_and_the_user_picks_a_plan(tmp_path):
    saved = tmp_path / "kyc.yaml"
    script = "\n".join([
        "/clock 2026-11-25T10:00",
        "Lea Martin, passport X1234567.",
        '/call submit_documents {"name": "Lea Martin", "document": "X1234567"}',
        '/answer p1 {"verdict": "approved"}',               # the REPL plays the backend: with the token
        "Which plans are there?",
        "/call pick_plan {}",
        "/answer p2 premium",
        "/say Premium it is.",
        "/state",
        f"/save {saved}",
    ]) + "\n"
    out = run_repl(["bots/onboarding", "--play-model"], script)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "⏸ p1 question: Check the documents of Lea Martin (document X1234567)." in text  # the backend's
    assert "  the user is told: We are checking your documents; this can take up to two days." in text
    assert "— /answer p1 VALUE" in text
    assert '✓ p1 question answered by nobody; answer {"verdict": "approved"}' in text
    assert "Welcome, Lea Martin! Your account is open." in text
    assert "✓ p2 question answered by nobody; answer \"premium\"" in text
    assert '"plan": "premium"' in text
    written = saved.read_text()
    assert "    as: backend\n    answer: {item: p1, value: {verdict: approved}}\n" in written
    assert "    answer: {item: p2, value: premium}\n" in written
    result = run_transcript(str(saved))
    assert result.passed, result.report()


def test_an_operator_takes_over_speaks_and_releases_and_time_passes_to_a_timeout():
    script = "\n".join([
        "I want a person",
        '/call human {"topic": "billing"}',
        "Hello?",
        "/operator dance",
        "/principal carla roles=operators",
        "/operator take",
        "/operator say Hi, I am Carla from billing.",
        "/principal dan roles=operators",
        "/operator say Dan here",  # carla holds it: refused, naming her
        "/operator force",  # dan takes it from her: the user reads her leave and him join
        "/operator release support",
        "/pending",
    ]) + "\n"
    out = run_repl(["bots/handover", "--play-model"], script)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Connecting you with a colleague from billing; they will be with you shortly." in text
    assert "⏸ p1 takeover: Connecting you with a colleague" in text and "— /operator take" in text
    assert "[to operators] user: Hello?" in text
    assert ("error: usage: /operator take [NOTE] | /operator force [NOTE] | /operator say TEXT | "
            "/operator release [ROUTE]") in text
    assert "✓ p1 takeover taken by carla" in text
    assert "[operator carla] Hi, I am Carla from billing." in text
    assert "the operator carla holds the conversation" in text
    assert text.index("carla left the conversation") < text.index("dan joined the conversation")
    assert "✓ p1 takeover released by dan" in text
    assert text.rstrip().endswith("(nothing is pending)")

    timeout = run_repl(["bots/refunds", "--play-model"], "\n".join([
        "/clock 2026-11-25T09:00", *REFUND, "/expire", "/clock +31m", "/expire", "/say Nobody decided in time.",
        "/state"]) + "\n")
    assert timeout.returncode == 0, timeout.stderr
    # the first /expire: nothing due; the second: the approval's case `unanswered` refunds 50 EUR
    assert timeout.stdout.count('✓ p1 approval timed_out by nobody; case "unanswered"; args {"order": "A1001", '
                                '"amount": 50}') == 1
    assert "Nobody decided in time." in timeout.stdout


def test_help_lists_the_pending_commands():
    out = run_repl(["bots/hello", "--play-model"], "/help\n")
    names = [line.split()[0] for line in out.stdout.splitlines() if line.startswith("/")]
    for command in ("/pending", "/approve", "/reject", "/answer", "/operator", "/expire"):
        assert names.count(command) == 1, command
