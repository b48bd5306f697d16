"""Refusals that teach (issue 32, item 6): arguments a tool does not take are named back to the
model (the call runs without them), a `requires` refusal names the tools that set each missing
value, and every text the model reads when a call is refused is in docs/tools.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import chatrun
from chat_support import call, kinds
from chatrun.definition.loader import check_bot
from chatrun.engine import tools as engine_tools
from chatrun.models.scripted import ScriptedModel

REPO = Path(__file__).resolve().parents[1]

BOT = """
name: teach
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
state: {size: null, crust: null, note: null, sent: null}
routes:
  main:
    default: true
    tools: [goodbye, order, strict, open, place, pick_crust, start]
  side:
    tools: [set_note]
tools:
  goodbye:
    action: {message: Bye!, reply: "Said goodbye."}
  order:
    handler: teach_tools:echo
    parameters: {type: object, properties: {size: {type: string}, crust: {type: string}}}
  strict:
    handler: teach_tools:echo
    parameters: {type: object, properties: {size: {type: string}}, additionalProperties: false}
  open:
    handler: teach_tools:echo
    parameters: {type: object, properties: {size: {type: string}}, additionalProperties: true}
  place:
    requires: [state.size, state.crust, state.note, state.sent]
    action: {message: Placed.}
  start:
    description: Sets the size from the model's arguments, or nothing
    parameters: {type: object, properties: {size: {type: string}}}
    action:
      cases:
        - if: args.size
          then: {set: {state.size: "{{ args.size }}"}}
  pick_crust:
    action:
      ask: {from: user, text: Which crust?, into: state.crust}
  set_note:
    parameters: {type: object, properties: {text: {type: string}}}
    action: {set: {state.note: "{{ args.text }}"}}
"""

TOOLS = """
def echo(ctx):
    return {"got": sorted(ctx.args)}
"""


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT, extra={"teach_tools.py": TOOLS}))


def tool_reply(session) -> str:
    return [m for m in session.memory() if m.role == "tool"][-1].content


def test_a_tool_without_parameters_runs_and_the_model_reads_that_its_arguments_were_ignored(bot, fake):
    s = bot.session()
    fake.queue(call("goodbye", reason="done", mood="happy"), {"text": "ok"})
    events = s.chat("bye")
    assert ("Message", "Bye!") in kinds(events)
    assert ("Console", "tool goodbye: the model sent reason, mood, which the tool does not take (not in its "
            "`parameters`); ignored") in kinds(events)
    sent = fake.requests[-1]["messages"][-1]
    assert sent["role"] == "tool" and sent["content"] == (
        "Said goodbye.\n\nNote: goodbye takes no arguments; what you sent (`reason`, `mood`) was ignored. "
        "Do not send it.")
    assert s.history[-1]["calls"][0]["args"] == {}


def test_a_name_the_tool_does_not_take_is_dropped_before_the_handler_and_named_back(bot):
    s = bot.session(model=ScriptedModel([call("order", size="L", topping="ham"), {"text": "ok"}]))
    s.chat("a large ham")
    assert tool_reply(s) == ('{"got": ["size"]}\n\nNote: `topping` is not an argument of order (it takes `size`, '
                             "`crust`); the value you sent was ignored.")
    assert s.history[-1]["calls"][0]["args"] == {"size": "L"}  # the history's record of the call: without it


def test_additional_properties_false_still_refuses_and_an_open_schema_takes_any_name(bot):
    s = bot.session(model=ScriptedModel([call("strict", size="L", topping="ham"), {"text": "ok"}]))
    s.chat("go")
    assert tool_reply(s).startswith("Error: invalid arguments for strict: arguments: Additional properties are "
                                    "not allowed ('topping' was unexpected).")
    s = bot.session(model=ScriptedModel([call("open", size="L", topping="ham"), {"text": "ok"}]))
    s.chat("go")
    assert tool_reply(s) == '{"got": ["size", "topping"]}'


def test_a_requires_refusal_names_the_tools_that_set_each_missing_value(bot):
    s = bot.session(model=ScriptedModel([call("place"), {"text": "What size?"}]))
    s.chat("place it")
    assert tool_reply(s) == (
        "Error: place cannot run yet: state.size is not set — call start first (ask the user for it); "
        "state.crust is not set — call pick_crust first (it asks the user); "
        "state.note is not set — set_note sets it, not offered here; ask the user for it; "
        "state.sent is not set — ask the user for it.")


def test_the_setters_are_found_once_per_bot(bot, monkeypatch):
    made = []
    real = engine_tools.setter_map
    monkeypatch.setattr(engine_tools, "setter_map", lambda config: made.append(config) or real(config))
    for _ in range(2):
        s = bot.session(model=ScriptedModel([call("place"), call("place"), {"text": "?"}]))
        s.chat("place")
    assert len(made) == 1


def test_the_validator_warns_about_args_of_a_tool_that_takes_none(tmp_path):
    (tmp_path / "bot.yaml").write_text(
        "name: t\nformat: 3\nstate: {x: null}\nroutes:\n  main: {default: true, tools: [keep]}\n"
        "tools:\n  keep:\n    action: {set: {state.x: \"{{ args.text }}\"}}\n")
    _, found = check_bot(tmp_path / "bot.yaml")
    assert [(d.line, d.severity, d.message) for d in found] == [
        (8, "warning", "`set state.x` of tool `keep` reads `args.text`, but the tool's `parameters` declare no "
         "property `text`")]


# -- the texts of refusals are documented ---------------------------------------------------------

# The modules whose texts the model reads when a call is refused or noted (docs/tools.md).
REFUSING = ["call.py", "tools.py", "binding.py", "pausing.py", "waiting.py", "once.py"]
PREFIXES = ("Error:", "Not run:", "Note:", "\n\nNote:", "Waiting for", "This call of", "No one approved",
            "No answer came", "Already done", "Still waiting for")


# Functions whose every text is (part of) one the model reads, whatever it starts with.
COMPOSING = {"_missing_part", "check_action", "run_calls", "check_arguments", "change_of", "check_from_user"}


def refusal_fragments(source: str) -> list[str]:
    """The literal pieces (between the placeholders) of each text the model reads: the texts
    that start like a refusal or a note, and every text of the functions that compose them."""
    tree = ast.parse(source)
    functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in COMPOSING]
    composing = {id(n) for f in functions for n in ast.walk(f)} - {id(ast.get_docstring(f, clean=False) and f.body[0].value)
                                                                   for f in functions}
    inside = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts = [node.value]
        else:
            continue
        if id(node) in composing or (isinstance(parts[0], str) and parts[0].startswith(PREFIXES)):
            found += [p.strip() for p in parts
                      if isinstance(p, str) and len(p.strip()) >= 6 and not p.isidentifier()]  # a key is no prose
    return found


def test_every_refusal_text_the_model_reads_is_in_docs_tools_md():
    docs = (REPO / "docs" / "tools.md").read_text()
    section = docs.split("## What the model reads when a call is refused", 1)[1].split("\n## ", 1)[0]
    section = re.sub(r"\s+", " ", section)
    missing = []
    for name in REFUSING:
        for fragment in refusal_fragments((REPO / "runner" / "chatrun" / "engine" / name).read_text()):
            if re.sub(r"\s+", " ", fragment) not in section:
                missing.append(f"{name}: {fragment!r}")
    assert missing == []


def test_the_documented_texts_check_can_fail():
    assert refusal_fragments('x = f"Error: {tool} cannot fly: it has no wings."') == [
        "Error:", "cannot fly: it has no wings."]
