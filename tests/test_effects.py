"""Side effects declared and run once; one change at a time (issue 32, items 1 and 4).

A tool's `effect:` (read | idempotent | once, with defaults from its kind and its action); an
identical call of a `once` tool already done in the conversation — in the same answer, a later
model call, a later turn, after an approval — is answered with the earlier result, not run; a
call identical to one that waits is never a second item; `limits.max_calls_per_tool` and a
tool's `max_calls_per_turn`; `one_change_per_answer`. Through real parts: the real `openai`
client against the fake server, a SQLite store, sessions reloaded from it."""

from __future__ import annotations

from pathlib import Path

import pytest

import chatrun
from chat_support import call
from chatrun import Approve
from chatrun.definition.loader import check_bot, load_config
from chatrun.engine.once import DONE_KEPT
from chatrun.models.scripted import ScriptedModel
from chatrun.store.sqlite import SQLiteStore

REFUNDS = Path(__file__).resolve().parents[1] / "bots" / "refunds"
CUSTOMER = {"name": "ana", "roles": ["customer"]}
SUPERVISOR = {"name": "bob", "roles": ["supervisor"]}
REFUND_30 = {"name": "refund", "arguments": {"order": "A1001", "amount": 30}}
DONE_30 = ("Already done earlier in this conversation (turn 1): Refunded 30 EUR on order A1001. "
           "It was not run again; do not call it again for the same thing.")


def as_(session, principal):
    session.principal = principal
    session.roles = set(principal["roles"])
    return session


def tool_results(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


# -- bots/refunds: the Done-when -----------------------------------------------------------------


def test_a_refund_repeated_six_times_and_once_more_next_turn_is_paid_once(fake, tmp_path):
    store = SQLiteStore(str(tmp_path / "s.db"))
    session = as_(chatrun.load_bot(REFUNDS).session(store=store), CUSTOMER)
    fake.queue({"tool_calls": [REFUND_30] * 6}, {"text": "Refunded 30 EUR."})
    session.chat("Refund 30 EUR on A1001")
    assert tool_results(fake.requests[1]) == ["Refunded 30 EUR on order A1001."] + [DONE_30] * 5

    # The next turn, in a new process's objects (a new bot, the session read back from the store).
    again = as_(chatrun.load_bot(REFUNDS).session(store=SQLiteStore(str(tmp_path / "s.db")), session_id=session.id),
                CUSTOMER)
    fake.queue({"tool_calls": [REFUND_30]}, {"text": "It is refunded."})
    again.chat("Did it work? Refund it please")
    assert tool_results(fake.requests[3])[-1] == DONE_30
    assert again.state["refunded"] == 30
    calls = [c for entry in again.history for c in entry.get("calls") or []]
    assert len(calls) == 7
    ran = [c for c in calls if c["reply"] == "Refunded 30 EUR on order A1001."]
    assert len(ran) == 1 and all(c["reply"] == DONE_30 for c in calls if c not in ran)
    assert all(c["args"] == {"order": "A1001", "amount": 30} for c in calls)


def test_an_approved_refund_asked_again_gets_the_approved_result_not_a_second_approval(tmp_path):
    store = SQLiteStore(str(tmp_path / "s.db"))
    bot = chatrun.load_bot(REFUNDS)
    model = ScriptedModel([call("refund", order="B2002", amount=200),
                           # the decision turn: the model asks for what it asked for once more
                           call("refund", order="B2002", amount=200), {"text": "80 EUR are refunded."},
                           call("refund", order="B2002", amount=200), {"text": "Yes, 80 EUR."}])
    session = as_(bot.session(store=store, model=model), CUSTOMER)
    session.chat("200 EUR back on B2002, please")
    assert [i.id for i in session.pending] == ["p1"]
    as_(session, SUPERVISOR).chat(Approve("p1", args={"amount": 80}))
    done = ("Already done earlier in this conversation (turn 2): Refunded 80 EUR on order B2002. "
            "It was not run again; do not call it again for the same thing.")
    assert model.requests[2].messages[-2].content == done  # the route's context follows it
    as_(session, CUSTOMER).chat("Did the 200 EUR on B2002 go through?")
    assert model.requests[4].messages[-2].content == done
    assert session.pending == [] and session.state["refunded"] == 80


def test_a_call_identical_to_one_that_waits_makes_no_second_item(write_bot):
    """Two identical calls in one answer: the first asks (p1), the second is no p2."""
    bot = chatrun.load_bot(write_bot("""
    name: desk
    model: {provider: scripted, name: m}
    state: {refunded: 0}
    routes:
      main: {default: true, system: Desk., tools: [refund]}
    tools:
      refund:
        description: Refund
        parameters: {type: object, properties: {order: {type: string}, amount: {type: number}}}
        approval: {by: [supervisor], ask: "Refund {{ args.amount }} EUR on {{ args.order }}?"}
        action: {set: {state.refunded: "{{ state.refunded + args.amount }}"}}
    """))
    same = {"name": "refund", "arguments": {"order": "B2002", "amount": 120}}
    model = ScriptedModel([{"tool_calls": [same, same]}, {"text": "It waits for a supervisor."}])
    session = bot.session(model=model)
    events = session.chat("Refund 120 EUR on B2002")
    assert [i.id for i in session.pending] == ["p1"]
    assert {e.data["id"] for e in events if e.type == "Pending"} == {"p1"}


def test_an_approval_whose_scope_a_bot_update_ends_is_withdrawn_and_the_same_call_asks_again(tmp_path, write_bot):
    """A bot update that ends the scope an approval waits in withdraws it (it stayed open before,
    and no decision could run it: its scope was gone); the model asking for the same refund
    again opens p2, which a supervisor approves: the refund runs once."""
    v1 = """
    name: desk
    model: {provider: scripted, name: m}
    state: {refunded: 0}
    routes:
      main: {default: true, system: Desk., tools: [open_refunds, refund]}
      refunds: {system: Refunds., tools: [refund]}
    tools:
      open_refunds: {description: Refunds, action: {push: refunds, execute: true, immediate: true}}
      refund:
        description: Refund
        parameters: {type: object, properties: {order: {type: string}, amount: {type: number}}}
        approval: {by: [supervisor], ask: "Refund {{ args.amount }} EUR on {{ args.order }}?"}
        action: {set: {state.refunded: "{{ state.refunded + args.amount }}"}}
    """
    store = SQLiteStore(str(tmp_path / "s.db"))
    first = chatrun.load_bot(write_bot(v1, "v1.yaml"))
    model = ScriptedModel([call("open_refunds"), call("refund", order="B2002", amount=120)])
    session = first.session(store=store, model=model)
    session.chat("Refund 120 EUR on B2002")
    assert [(i.id, i.route) for i in session.pending] == [("p1", "refunds")]

    second = chatrun.load_bot(write_bot(v1.replace("      refunds: {system: Refunds., tools: [refund]}\n", "")
                                        .replace("push: refunds", "route: main"), "v2.yaml"))
    model = ScriptedModel([call("refund", order="B2002", amount=120), {"text": "It waits for a supervisor."},
                           {"text": "Refunded."}])
    moved = second.session(store=store, model=model, session_id=session.id)
    events = moved.chat("Refund 120 EUR on B2002, please")
    assert moved.route == "main" and [i.id for i in moved.pending] == ["p2"]
    assert {e.data["id"] for e in events if e.type == "Pending"} == {"p2"}  # the user's copy and the deciders'
    as_(moved, SUPERVISOR).chat(Approve("p2"))
    assert moved.state["refunded"] == 120 and not moved.pending


# -- the record ------------------------------------------------------------------------------------

DESK = """
name: desk
model: {provider: scripted, name: m}
state: {total: 0, city: null, sent: []}
limits: {max_calls_per_tool: LIMIT}
routes:
  main: {default: true, system: Desk., tools: [pay, set_city, book, fetch, refuse_or_pay, pay_twice]}
tools:
  pay:
    parameters: {type: object, properties: {amount: {type: number}}}
    action: {set: {state.total: "{{ state.total + args.amount }}"}, reply: "Paid {{ args.amount }}."}
  set_city:
    parameters: {type: object, properties: {city: {type: string}}}
    action: {set: {state.city: "{{ args.city }}"}}
  book:
    requires: [state.city]
    action: {set: {state.sent: "{{ state.sent + [state.city] }}"}, reply: "Booked {{ state.city }}."}
  fetch:
    effect: read
    action: {reply: "{{ state.total }}"}
  refuse_or_pay:
    parameters: {type: object, properties: {amount: {type: number}}}
    action:
      cases:
        - if: args.amount > 100
          then: {reply: Too much; nothing was paid.}
        - else: {set: {state.total: "{{ state.total + args.amount }}"}, reply: "Paid {{ args.amount }}."}
  pay_twice:
    effect: idempotent
    parameters: {type: object, properties: {amount: {type: number}}}
    max_calls_per_turn: 2
    action: {set: {state.total: "{{ state.total + args.amount }}"}}
"""


def desk(write_bot, limit: int = 20, changes: tuple[tuple[str, str], ...] = ()) -> chatrun.Bot:
    text = DESK.replace("LIMIT", str(limit))
    for old, new in changes:
        assert old in text
        text = text.replace(old, new)
    return chatrun.load_bot(write_bot(text))


def answer(*calls: tuple[str, dict]) -> dict:
    return {"tool_calls": [{"name": name, "arguments": args} for name, args in calls]}


def test_a_failed_turn_forgets_the_calls_it_did(write_bot):
    model = ScriptedModel([call("pay", amount=5), {"error": "the model is down"},
                           call("pay", amount=5), {"text": "Paid."}])
    session = desk(write_bot).session(model=model)
    session.chat("Pay 5")
    assert session.state["total"] == 0 and "calls_done" not in session.snapshot()
    session.chat("Pay 5")
    assert session.state["total"] == 5
    assert model.requests[3].messages[-1].content == "Paid 5."


def test_what_a_call_acts_on_besides_its_arguments_makes_it_another_call(write_bot):
    """`book` has no parameters: it books what `requires` names, so booking another city is new."""
    model = ScriptedModel([answer(("set_city", {"city": "Rome"}), ("book", {}), ("book", {})),
                           answer(("set_city", {"city": "Oslo"}), ("book", {})), {"text": "Booked."}])
    session = desk(write_bot).session(model=model)
    session.chat("Book Rome, then Oslo")
    assert session.state["sent"] == ["Rome", "Oslo"]
    assert [m.content for m in model.requests[1].messages[-3:]] == [
        "Done.", "Booked Rome.", "Already done earlier in this conversation (turn 1): Booked Rome. It was not run "
        "again; do not call it again for the same thing."]


def test_a_case_that_only_answered_did_nothing_to_remember(write_bot):
    model = ScriptedModel([call("refuse_or_pay", amount=500), call("refuse_or_pay", amount=500), {"text": "No."}])
    session = desk(write_bot).session(model=model)
    session.chat("Pay 500")
    assert [m.content for m in model.requests[2].messages if m.role == "tool"] == ["Too much; nothing was paid."] * 2
    assert "calls_done" not in session.snapshot()


def test_the_record_keeps_the_last_calls_and_an_older_snapshot_without_it_loads(write_bot, tmp_path):
    amounts = range(1, DONE_KEPT + 11)
    model = ScriptedModel([answer(*[("pay", {"amount": a}) for a in amounts]), {"text": "Paid."}])
    store = SQLiteStore(str(tmp_path / "s.db"))
    bot = desk(write_bot, limit=100)
    session = bot.session(model=model, store=store)
    session.chat("Pay them all")
    record = session.snapshot()["calls_done"]
    assert len(record) == DONE_KEPT and record[-1].endswith(f" 1 Paid {amounts[-1]}.")
    assert all(entry.split(" ")[1] == "1" for entry in record)  # identity, turn, what the model read

    snapshot = store.load_session(session.id)
    del snapshot["calls_done"]  # as stored before this record existed
    store.commit_turn(session.id, snapshot, {}, [])
    model = ScriptedModel([call("pay", amount=60), {"text": "Paid again."}])
    bot.session(model=model, store=store, session_id=session.id).chat("Pay 60 again")
    assert model.requests[1].messages[-1].content == "Paid 60."


# -- limits --------------------------------------------------------------------------------------------


def test_calls_past_a_tools_limit_are_refused_and_the_turn_goes_on(write_bot):
    model = ScriptedModel([answer(*[("fetch", {})] * 4), answer(*[("pay_twice", {"amount": 1})] * 3),
                           {"text": "Enough."}])
    session = desk(write_bot, limit=3).session(model=model)
    events = session.chat("Check")
    assert [e.data for e in events if e.type == "Message"] == ["Enough."]
    tools = [m.content for m in model.requests[1].messages if m.role == "tool"]
    assert tools[:3] == ["0"] * 3 and tools[3] == (
        "Error: fetch was not run: it was called 3 times in this turn already, the most this bot allows "
        "(limits.max_calls_per_tool: 3). Do not call it again in this turn; answer the user with what you have.")
    tools = [m.content for m in model.requests[2].messages if m.role == "tool"][4:]
    assert tools[:2] == ["Done.", "Done."] and "(tools.pay_twice.max_calls_per_turn: 2)" in tools[2]
    assert session.state["total"] == 2  # idempotent by declaration: both ran
    assert [c.get("error", "")[:25] for c in session.last_turn["calls"]][3] == "Error: fetch was not run:"


# -- one change per answer -----------------------------------------------------------------------------


def test_one_change_per_answer_stops_the_answer_after_a_once_effect(write_bot):
    bot = desk(write_bot, changes=(("main: {default: true,", "main: {default: true, one_change_per_answer: true,"),))
    model = ScriptedModel([answer(("fetch", {}), ("pay", {"amount": 5}), ("pay", {"amount": 7}), ("fetch", {})),
                           {"text": "Paid 5."}])
    session = bot.session(model=model)
    session.chat("Pay 5, no 7")
    assert session.state["total"] == 5
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == ["0", "Paid 5."] + [
        "Not run: an earlier call in this answer (pay) did something that is done once; read its result first, "
        "then call this again if it is still needed."] * 2
    assert [c["tool"] for c in session.last_turn["calls"]] == ["fetch", "pay"]  # what was not run was not called


def test_one_change_per_answer_stops_before_a_call_that_requires_what_changed(write_bot):
    bot = desk(write_bot, changes=(("  set_city:\n", "  set_city:\n    one_change_per_answer: true\n"),))
    model = ScriptedModel([answer(("set_city", {"city": "Rome"}), ("book", {})), call("book"), {"text": "Booked."}])
    session = bot.session(model=model)
    session.chat("Rome, and book")
    assert model.requests[1].messages[-1].content == (
        "Not run: an earlier call in this answer (set_city) changed state.city, which a later call requires; "
        "read its result first, then call this again if it is still needed.")
    assert session.state["sent"] == ["Rome"]  # booked by the next model call, after it read the change


def test_without_it_each_call_sees_the_state_the_calls_before_it_left(write_bot):
    """`requires` and a case's condition are checked against the state after the previous call of
    the same answer, never the state before the answer."""
    model = ScriptedModel([answer(("set_city", {"city": "Rome"}), ("book", {}), ("pay", {"amount": 150}),
                                  ("refuse_or_pay", {"amount": 50})), {"text": "Done."}])
    session = desk(write_bot).session(model=model)
    session.chat("Rome, book, pay")
    assert session.state["sent"] == ["Rome"] and session.state["total"] == 200
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == [
        "Done.", "Booked Rome.", "Paid 150.", "Paid 50."]


# -- the definition ------------------------------------------------------------------------------------


def test_effect_defaults_come_from_the_kind_and_the_action(write_bot):
    config, _ = load_config(write_bot("""
    name: fx
    state: {n: 0, cart: [], who: null, answer: null}
    routes: {main: {default: true, tools: [post, get, count, cart, setter, from_other, asked, declared, code]}}
    tools:
      post: {http: {url: "https://api.example.com/x", method: POST}}
      get: {http: {url: "https://api.example.com/x"}}
      count: {action: {cases: [{if: "true", then: {set: {state.n: "{{ state.n + 1 }}"}}}]}}
      cart: {parameters: {type: object, properties: {item: {type: string}}}, action: {set: {state.cart: "{{ state['cart'] + [args.item] }}"}}}
      setter: {action: {set: {state.who: "{{ args.name | title }}", state.n: 3}}}
      from_other: {action: {set: {state.who: "{{ state.answer }}"}}}
      asked: {action: {ask: {from: user, text: Which?, into: state.answer}}}
      declared: {effect: read, http: {url: "https://api.example.com/x", method: DELETE}}
      code: {handler: "tools:f"}
    """, extra={"tools.py": "def f(ctx):\n    return 1\n"}))
    effects = {name: (tool.effect, tool.effect_declared) for name, tool in config.tools.items()}
    assert effects == {"post": ("once", False), "get": ("read", False),
                       "count": ("idempotent", False), "cart": ("once", False), "setter": ("idempotent", False),
                       "from_other": ("idempotent", False), "asked": ("idempotent", False),
                       "declared": ("read", True), "code": ("read", False)}


def test_an_openapi_operations_method_gives_its_default():
    config, _ = load_config(Path(__file__).resolve().parents[1] / "bots" / "orders")
    assert config.tools["cancel_order"].effect == "once"


def test_a_misspelt_effect_is_refused_with_a_suggestion(write_bot):
    _, diagnostics = check_bot(write_bot("""
    name: fx
    routes: {main: {default: true, tools: [pay]}}
    tools:
      pay: {effect: onse, max_calls_per_turn: 0, one_change_per_answer: sure}
    limits: {max_calls_per_tool: -1}
    """))
    messages = [f"{d.line}: {d.message}" for d in diagnostics if d.severity == "error"]
    assert any("`effect` of tool `pay` must be one of read, idempotent, once (got `onse`); did you mean `once`?" in m
               for m in messages), messages
    assert any("max_calls_per_turn" in m for m in messages) and any("max_calls_per_tool" in m for m in messages)
    assert any("one_change_per_answer" in m for m in messages)


@pytest.mark.parametrize("raw", ["read", "idempotent", "once"])
def test_a_declared_effect_wins(write_bot, raw):
    config, _ = load_config(write_bot(f"""
    name: fx
    routes: {{main: {{default: true, tools: [t]}}}}
    tools: {{t: {{effect: {raw}, action: {{set: {{state.n: "{{{{ state.n + 1 }}}}"}}}}}}}}
    state: {{n: 0}}
    """))
    assert config.tools["t"].effect == raw and config.tools["t"].effect_declared


def test_a_tool_without_arguments_runs_each_time_unless_it_says_once(write_bot):
    """A counter's "one more" is a new request each time: with no arguments and no `requires`, an
    accumulating action is not `once` by default (the identical-call rule could not tell a repeat
    from a new request); `effect: once` keeps it once, and no warning is needed either way."""
    text = """
    name: fx
    format: 3
    state: {n: 0}
    routes: {main: {default: true, tools: [bump, bump_by, counted]}}
    tools:
      bump: {action: {set: {state.n: "{{ state.n + 1 }}"}}}
      bump_by: {parameters: {type: object, properties: {by: {type: integer}}}, action: {set: {state.n: "{{ state.n + args.by }}"}}}
      counted: {effect: once, action: {set: {state.n: "{{ state.n + 1 }}"}}}
    """
    config, diagnostics = check_bot(write_bot(text))
    assert [d for d in diagnostics if d.severity == "warning"] == []
    tools = config.tools
    assert (tools["bump"].effect, tools["bump_by"].effect, tools["counted"].effect) == ("idempotent", "once", "once")


def test_the_record_finds_a_reply_of_several_lines_whole_and_the_newest_of_a_call_done_again():
    from types import SimpleNamespace

    from chatrun.engine import once

    c = SimpleNamespace(done_calls=())
    once.remember(c, "a" * 32, 3, "line one\nline two")
    once.remember(c, "b" * 32, 4, "other")
    assert once.done_before(c, "a" * 32) == {"turn": 3, "reply": "line one\nline two"}
    once.remember(c, "a" * 32, 5, "again")
    assert once.done_before(c, "a" * 32) == {"turn": 5, "reply": "again"} and len(c.done_calls) == 2
    assert once.done_before(c, "c" * 32) is None
