"""Values from the user (`from_user:` of a tool, issue 32): a parameter listed there takes only a
value the user said. What counts as said (engine/said.py), the refusal the model reads in the
call path, what the model is offered, and the validator's checks."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

import chatrun
from chat_support import kinds
from chatrun.definition.loader import check_bot
from chatrun.engine.said import numbers_in, said
from chatrun.engine.tools import tool_spec
from chatrun.messages import ToolResultMessage
from chatrun.models.scripted import ScriptedModel

TODAY = date(2026, 3, 2)  # a Monday


@pytest.mark.parametrize(("value", "text"), [
    ("Berlin", "To Berlin, please"),
    ("berlin", "TO  BERLIN!"),
    ("Zürich", "zurich"),
    ("New York", "from new york on"),
    ("Maria", "Maria, 1,000 please"),
    (1000, "Maria, 1,000 please"),
    (1000, "send 1.000 EUR"),
    (1000, "send 1 000"),
    (1000, "one thousand"),
    (1500, "one thousand five hundred"),
    (25, "twenty-five of them"),
    (2000, "2k"),
    (12.5, "12,50 EUR"),
    ("150", "150"),
    ("2026-03-05", "the 5th of March"),
    ("2027-03-05", "March 5th"),
    ("2026-03-05", "le 5 mars"),  # with the session's locale: fr
    ("2026-03-05", "05/03"),
    ("2026-05-03", "05/03"),  # day/month or month/day: both count
    ("2026-03-05", "2026-03-05"),
    ("2026-07-03", "3 to 17 July"),
    ("2026-07-17", "3-17 July"),
    ("2026-07-15", "July 1st to the 15th"),
    ("2026-03-03", "tomorrow"),
    ("2026-03-01", "yesterday"),
    ("2026-03-06", "on Friday"),
    ("2026-03-28", "the 28th"),
    (["Ana", "Bo"], "Ana and Bo"),
])
def test_a_value_the_user_said_counts(value, text):
    assert said(value, [text], TODAY, "fr")


@pytest.mark.parametrize(("value", "text"), [
    ("Berlin", "I want to book a flight"),
    ("not given yet", "I want to send some money"),  # the prompt's words, copied (issue 32)
    ("John Doe", "my name is John"),
    ("New York", "York, new"),
    (1000, "I want to send some money"),
    (100, "1000"),
    (1000, "10,00"),
    ("2026-07-01", "in July"),
    ("2026-03-06", "on the 5th of March"),
    ("2026-04-02", "4 tickets in February"),
    ("", "anything"),
    (["Ana", "Bo"], "Ana and Cy"),
])
def test_a_value_the_user_did_not_say_does_not(value, text):
    assert not said(value, [text], TODAY, "fr")


def test_numbers_read_each_way_their_separators_allow():
    assert {Decimal(1000), Decimal("1.000")} <= numbers_in("1,000")
    assert Decimal("1000.5") in numbers_in("1.000,50") and Decimal("1000.5") in numbers_in("1,000.50")
    assert {Decimal(100), Decimal(200)} <= numbers_in("100 200")
    assert Decimal(1000) not in numbers_in("10,00")


BANK = """
name: pay
model: {provider: scripted, name: m}
routes:
  main:
    default: true
    system: Send money.
    tools: [set_amount, set_note]
tools:
  set_amount:
    description: Record the amount
    parameters:
      type: object
      properties:
        amount: {type: number}
        currency: {type: string}
      required: [amount]
    from_user: [amount]
    action: {set: {state.amount: "{{ args.amount }}"}}
  set_note:
    description: A note of the model's own
    parameters: {type: object, properties: {note: {type: string}}}
    action: {set: {state.note: "{{ args.note }}"}}
"""


def test_the_call_path_refuses_a_value_only_the_model_said(write_bot):
    """The model's own words do not make a value the user's: "1000" in its answer is not said."""
    bot = chatrun.load_bot(write_bot(BANK))
    model = ScriptedModel([
        {"text": "Shall I send 1000?"},
        {"tool_calls": [{"name": "set_amount", "arguments": {"amount": 1000, "currency": "EUR"}}]},
        {"text": "How much?"},
        {"tool_calls": [{"name": "set_amount", "arguments": {"amount": 250}}]},
        {"text": "Noted."},
    ])
    s = bot.session(model=model)
    s.chat("hello")
    events = s.chat("sure")
    assert s.state.get("amount") is None
    refusal = [m for m in s.memory() if isinstance(m, ToolResultMessage)][-1]
    assert refusal.content == ('Error: set_amount cannot take amount = 1000: the user has not said it. Ask the '
                               "user for the amount, then call set_amount with their words. Do not guess.")
    assert kinds(events) == [("Message", "How much?")]
    s.chat({"userMessage": "the form", "amount": "250"})  # the client's data is the user's too
    assert s.state["amount"] == 250


def test_the_model_is_offered_plain_json_schema(write_bot):
    bot = chatrun.load_bot(write_bot(BANK))
    spec = tool_spec(bot.config.tools["set_amount"])
    assert "from_user" not in repr(spec)
    assert spec["function"]["parameters"] == bot.config.tools["set_amount"].parameters


def test_the_validator_names_a_from_user_that_is_no_parameter_or_is_bound(write_bot):
    path = write_bot(BANK.replace("from_user: [amount]", "from_user: [amout, currency]\n    bind: {currency: EUR}"))
    config, diagnostics = check_bot(path)
    messages = [d.format() for d in diagnostics]
    assert f"{path}:18:17: warning: `from_user` of tool `set_amount` names `amout`, which is not one of its " \
           "parameters; did you mean `amount`? (it takes: amount, currency); nothing is checked for it" in messages
    assert f"{path}:18:24: error: `from_user` of tool `set_amount` names `currency`, which the bot binds " \
           "(`bind:`): its value is the bot's, never the user's; drop one of the two" in messages
