"""Choices (issue 9, section 5): declared in YAML on a route (after its final answers) or on a
tool's action, static or templated, sent as one `Choices` event; the REPL shows numbered
options (typing the number sends it), the web page buttons (in real Chromium), transcripts
expect them like any event."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import chatrun
from chat_support import call, kinds
from chatrun.definition.loader import check_bot
from chatrun.models.scripted import ScriptedModel

REPO = Path(__file__).resolve().parents[1]
BANK = REPO / "bots" / "bank"

BOT = """
name: menu
state: {sizes: [S, M, L]}
routes:
  main:
    default: true
    choices: [Pizza, {label: Pasta of the day, value: pasta}]
    tools: [pick_size, nothing]
tools:
  pick_size:
    action:
      message: Which size?
      choices: "{{ state.sizes }}"
  nothing:
    action:
      choices: "{{ none }}"
"""


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT))


def test_route_choices_follow_its_answer_and_tool_choices_follow_the_message(bot):
    s = bot.session(model=ScriptedModel([call("pick_size"), call("nothing"), {"text": "What would you like?"}]))
    assert kinds(s.chat("hi")) == [
        ("Message", "Which size?"),
        ("Choices", {"choices": [{"label": "S", "value": "S"}, {"label": "M", "value": "M"},
                                 {"label": "L", "value": "L"}]}),
        # `nothing` renders to none: no event
        ("Message", "What would you like?"),
        ("Choices", {"choices": [{"label": "Pizza", "value": "Pizza"}, {"label": "Pasta of the day", "value": "pasta"}]}),
    ]


def test_choices_of_the_wrong_shape_fail_the_turn_naming_the_place(write_bot):
    bot = chatrun.load_bot(write_bot(BOT.replace('"{{ state.sizes }}"', '"{{ state }}"')))
    events = bot.session(model=ScriptedModel([call("pick_size")])).chat("hi")
    assert events[-1].type == "Error"
    assert "tool pick_size choices: the template gave dict, not a list of choices" in events[-1].meta["detail"]


def test_bank_asks_yes_or_no_when_the_transfer_waits_for_the_users_confirmation(fake):
    s = chatrun.load_bot(BANK).session()
    fake.queue(call("transfer_money"), call("set_recipient", recipient="Joe"), {"text": "How much?"})
    assert "Choices" not in [e.type for e in s.chat("send money to Joe")]
    fake.queue(call("set_amount", amount=20), call("send_transfer"))
    assert kinds(s.chat("20"))[-1] == ("Choices", {"choices": [{"label": "Yes", "value": "yes"},
                                                               {"label": "No", "value": "no"}]})


def test_validation_checks_choices(write_bot):
    path = write_bot("""
        name: v
        routes:
          main:
            default: true
            choices: "{{ state.opts | sortt }}"
            tools: [t]
        tools:
          t: {action: {choices: [{value: x}]}}
        """)
    _, diagnostics = check_bot(path)
    messages = [(d.severity, d.line, d.message) for d in diagnostics]
    assert ("error", 6, "template error in `choices` of route `main`: no filter named `sortt`; did you mean "
            "`sort`?") in messages
    # A list of choices that is wrong inside is judged as a list (not "must be a string").
    assert ("error", 9, "missing required key `label` in `action.choices[0]` of tool `t`") in messages


def test_a_typed_value_that_is_a_choice_is_that_choice_not_a_number():
    from chatrun.cli.repl import picked_choice

    scale = [(str(n), str(n)) for n in range(11)]  # a 0-10 rating
    assert picked_choice("9", scale) == "9"  # not the 9th choice, "8"
    assert picked_choice("0", scale) == "0"
    yes_no = [("yes", "Yes, send it"), ("no", "No, cancel")]
    assert picked_choice("2", yes_no) == "no"  # a number picks by position
    assert picked_choice("Yes, send it", yes_no) == "yes"  # a label is its choice
    assert picked_choice("3", yes_no) == "3" and picked_choice("maybe", yes_no) == "maybe"


@pytest.mark.subprocess
def test_the_repl_numbers_choices_and_sends_the_picked_one():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(REPO / "runner")
    script = "\n".join([
        "Send 20 to Joe",
        "/call transfer_money {}",
        '/call set_recipient {"recipient": "Joe"}',
        '/call set_amount {"amount": 20}',
        "/call send_transfer {}",
        "1",
    ]) + "\n"
    out = subprocess.run([sys.executable, "-m", "chatrun", "repl", "bots/bank"], input=script, capture_output=True,
                         text=True, timeout=60, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "  1) Yes\n  2) No" in out.stdout
    assert "→ yes" in out.stdout
    assert "Done: 20 sent to Joe. Your balance is 980." in out.stdout


@pytest.mark.subprocess
def test_the_repl_sends_a_typed_9_as_9_with_choices_0_to_10(write_bot, tmp_path):
    """Piped into a real REPL: with a 0-10 rating shown as numbered choices 1) 0 ... 11) 10,
    typing 9 sends 9 (the saved transcript's turn), not the ninth choice 8."""
    import yaml

    path = write_bot("""
        name: rating
        routes:
          main:
            default: true
            system: Ask how likely the user is to recommend us.
            choices: %s
        """ % [str(n) for n in range(11)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(REPO / "runner")
    script = "hi\n/say From 0 to 10, how likely are you to recommend us?\n9\n/say Thanks!\n/save saved.yaml\n"
    out = subprocess.run([sys.executable, "-m", "chatrun", "repl", str(path), "--play-model"], input=script,
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "  1) 0\n" in out.stdout and "  10) 9\n  11) 10" in out.stdout
    assert "→ 8" not in out.stdout
    saved = yaml.safe_load((tmp_path / "saved.yaml").read_text())
    assert [turn["user"] for turn in saved["turns"]] == ["hi", "9"]


@pytest.mark.browser  # chromium() skips when Debian's Chromium is missing
def test_choices_are_buttons_on_the_page(fake, write_bot, tmp_path):
    from browser_support import chat_page, send
    from chatrun.server import create_app
    from server_support import ThreadServer

    # (A user's confirmation, e.g. bots/bank's send_transfer, is one Yes/No card instead:
    # tests/test_browser_page.py::test_a_confirmation_is_one_card_with_yes_and_no_also_after_a_reload.)
    menu = chatrun.load_bot(write_bot("model: {provider: openai, name: gpt-4o-mini}\n" + BOT))
    app = create_app([menu], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url) as page:
        fake.queue(call("pick_size"), {"text": "Pick one."})
        send(page, "A pizza, please")
        buttons = page.locator("#messages .choices .choice").filter(has_text="M")
        page.locator("#messages .choices").first.wait_for(timeout=10_000)
        sizes = page.locator("#messages .choices").first.locator(".choice")
        assert sizes.all_inner_texts() == ["S", "M", "L"]  # pick_size's choices, after its message
        seen = int(page.get_attribute("body", "data-refreshes") or 0)
        fake.queue({"text": "M it is."})
        buttons.first.click()
        page.wait_for_function(f"Number(document.body.dataset.refreshes || 0) > {seen}", timeout=10_000)
        page.locator(".msg.bot", has_text="M it is.").wait_for(timeout=10_000)
        assert page.locator(".msg.user").last.inner_text() == "M"  # the click sent the choice
        assert fake.requests[-1]["messages"][-1]["content"] == "M"  # as the user's message to the model
        assert all(b.is_disabled() for b in sizes.all())  # a used set of choices is spent
