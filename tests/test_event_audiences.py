"""Issue 24: event audiences in the bot format. `events:` declares a type's audience once; the
engine sets it on every event of the type (an action's `emit`, a handler's ctx.emit), a handler
may name one; `chatrun validate` reports a bad declaration at its line."""

from __future__ import annotations

import pytest

import chatrun
from chat_support import call
from chatrun import events as ev
from chatrun.definition.loader import check_bot
from chatrun.models.scripted import ScriptedModel

BOT = """\
name: survey
events:
  Detractor: {audience: backend, description: a score of 6 or less}
  Handoff: {audience: operators}
routes:
  main:
    default: true
    system: Ask for a score.
    tools: [score, note]
tools:
  score:
    parameters: {type: object, properties: {n: {type: integer}}, required: [n]}
    action:
      emit: {Detractor: "{{ args.n }}", Handoff: {why: low score}, Thanks: "{{ args.n }}"}
      reply: noted
  note:
    handler: hooks:note
"""

HOOKS = """\
def note(ctx):
    ctx.emit("Detractor", {"from": "handler"})
    ctx.emit("Audit", {"seen": True}, audience="backend")
    ctx.emit("Handoff", "to the user after all", audience="user")
    return "ok"
"""


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT, extra={"hooks.py": HOOKS}))


def audiences(events):
    return {(e.type, e.audience) for e in events if e.type not in (ev.STREAM, ev.MESSAGE)}


def test_an_emitted_event_gets_the_audience_its_type_declares(bot):
    s = bot.session(model=ScriptedModel([call("score", n=3), {"text": "Thanks."}]))
    events = s.chat("3")
    assert audiences(events) == {("Detractor", "backend"), ("Handoff", "operators"), ("Thanks", "user")}
    history = s.history[-1]["events"]
    assert {"type": "Detractor", "data": 3, "turn": 1, "audience": "backend"} in history
    assert next(e for e in history if e["type"] == "Thanks").get("audience") is None  # a user event reads as before


def test_a_handler_emits_with_the_declared_audience_or_the_one_it_names(bot):
    s = bot.session(model=ScriptedModel([call("note"), {"text": "Done."}]))
    assert audiences(s.chat("note it")) == {("Detractor", "backend"), ("Audit", "backend"), ("Handoff", "user")}


def test_a_handler_naming_an_unknown_audience_fails_its_tool_naming_the_choices(bot, write_bot):
    bot = chatrun.load_bot(write_bot(BOT, extra={"hooks.py": 'def note(ctx):\n    ctx.emit("X", 1, audience="ops")\n'}))
    s = bot.session(model=ScriptedModel([call("note"), {"text": "Done."}]))
    events = s.chat("note it")
    assert events[-1].type == ev.ERROR
    assert "audience 'ops' is not one of user, operators, backend" in events[-1].meta["detail"]


def test_bad_declarations_are_reported_at_their_line(write_bot):
    path = write_bot("""\
        name: survey
        env: {HOOK_SECRET: {secret: true, default: x}}
        events:
          Detractor: {audience: backend}
          Message: {audience: operators}
          Lost: {audience: backend}
        sinks:
          crm:
            webhook: {url: "{{ env.HOOK_URL }}/in", secret: HOOK_SECRT}
            events: [Detractor, Detracter]
        routes:
          main: {default: true, system: hi}
        """)
    _, diagnostics = check_bot(path)
    shown = [d.format() for d in diagnostics]
    assert any(":5:3: error: `events.Message`: Message is a built-in event type" in d for d in shown), shown
    assert any(":6:3: warning: event type `Lost` is for the backend, but no sink takes it" in d for d in shown)
    assert any(":9:" in d and "reads `env.HOOK_URL`, but the bot does not declare it" in d for d in shown)
    assert any(":9:" in d and "signs with `env.HOOK_SECRT`" in d and "did you mean `HOOK_SECRET`" in d for d in shown)
    assert any(":10:" in d and "takes event type `Detracter`" in d and "did you mean `Detractor`" in d for d in shown)


def test_an_audience_outside_the_three_is_a_schema_error(write_bot):
    path = write_bot("name: b\nevents: {Handoff: {audience: staff}}\nroutes: {main: {default: true, system: hi}}\n")
    _, diagnostics = check_bot(path)
    assert any(d.line == 2 and "staff" in d.message for d in diagnostics), [d.format() for d in diagnostics]
