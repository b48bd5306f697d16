"""Decisions in YAML (issue 9, section 1): an action's `cases:` (first matching `if:` adds its
action, `else:` when none holds), conditions over args/result/state/scope/turn, the rule that
`emit`/`set` templates rendering to nothing send/assign nothing, and the conditional edges of
the route graph. Through the scripted model, and through the real openai client against the
local fake server with the bank bot (Rasa's transfer_money flow, no Python)."""

from __future__ import annotations

from pathlib import Path

import pytest

import chatrun
from chat_support import call, kinds
from chatrun.definition.graph import Edge, RouteGraph
from chatrun.models.scripted import ScriptedModel

BANK = Path(__file__).resolve().parents[1] / "bots" / "bank"

SHOP = """
name: shop
state: {stock: 3, vip: false, last: null}
routes:
  main:
    default: true
    tools: [order, lookup, grade, nested]
  checkout:
    scope: {local: {qty: null}}
    tools: [done]
tools:
  order:
    parameters: {type: object, properties: {qty: {type: integer}}, required: [qty]}
    action:
      emit: {Thinking: "ordering {{ args.qty }}"}
      cases:
        - if: args.qty > state.stock
          then: {message: "Only {{ state.stock }} left.", reply: "Refused: not enough stock."}
        - if: state.vip or args.qty == 1
          then:
            set: {state.stock: "{{ state.stock - args.qty }}"}
            push: checkout
            message: "VIP or single item: {{ args.qty }}"
        - else:
            set: {state.stock: "{{ state.stock - args.qty }}"}
            push: checkout
            reply: "{{ args.qty }} ordered"
  lookup:
    parameters: {type: object, properties: {sku: {type: string}}}
    handler: shop_tools:find
    action:
      set: {state.last: "{{ result.item if result.found else none }}"}
      emit:
        Object: "{{ result if result.found else none }}"
        Console: "{{ result.missing }}"
      cases:
        - if: not result.found
          then: {message: "No such item: {{ args.sku }}."}
  grade:
    parameters: {type: object, properties: {score: {type: number}}}
    action:
      cases:
        - if: args.score >= 90
          then: {message: A}
        - if: args.score >= 50
          then: {message: B}
  nested:
    action:
      cases:
        - if: "args.x.y.z > 1"
          then: {message: never}
  done:
    action: {pop: true}
"""

SHOP_TOOLS = """
def find(ctx):
    if ctx.args.get("sku") == "A1":
        return {"found": True, "item": {"sku": "A1", "name": "anvil"}}
    return {"found": False}
"""


@pytest.fixture
def shop(write_bot):
    return chatrun.load_bot(write_bot(SHOP, extra={"shop_tools.py": SHOP_TOOLS}))


def test_first_matching_case_applies_with_the_tools_own_keys(shop):
    s = shop.session(model=ScriptedModel([call("order", qty=5), {"text": "Sorry."}]))
    events = s.chat("five please")
    # case 1: nothing moves, the tool's own emit applies first, then the case's message
    assert kinds(events) == [("Thinking", "ordering 5"), ("Message", "Only 3 left."), ("Message", "Sorry.")]
    assert s.stack == ["main"] and s.state["stock"] == 3
    assert s.memory()[-2].content == "Refused: not enough stock."  # the case's reply is the tool result


def test_later_case_and_else(shop):
    s = shop.session(model=ScriptedModel([call("order", qty=1)]))
    events = s.chat("one")
    assert ("Message", "VIP or single item: 1") in kinds(events)
    assert s.stack == ["main", "checkout"] and s.state["stock"] == 2
    assert s.visible_state()["scope"]["qty"] is None  # case 2 does not set it

    s = shop.session(model=ScriptedModel([call("order", qty=2)]))
    events = s.chat("two")
    assert s.stack == ["main", "checkout"] and s.state["stock"] == 1
    assert [t for t, _ in kinds(events)] == ["Thinking", "RouteChanged"]  # no message: that was case 2's
    assert s.memory(s.scopes[0].id, "main")[-1].content == "2 ordered"


def test_no_case_matches_and_no_else_applies_the_tool_alone(shop):
    s = shop.session(model=ScriptedModel([call("grade", score=20), {"text": "ok"}]))
    events = s.chat("grade me")
    assert kinds(events) == [("Message", "ok")]
    assert s.memory()[-2].content == "Done."
    s = shop.session(model=ScriptedModel([call("grade", score=95), {"text": "ok"}]))
    assert kinds(s.chat("again"))[0] == ("Message", "A")


def test_conditions_see_the_handler_result_and_nothing_renders_nothing(shop):
    s = shop.session(model=ScriptedModel([call("lookup", sku="ZZ"), {"text": "Not found."}]))
    events = s.chat("find ZZ")
    # `result if result.found else none`: no Object event, `state.last` not assigned;
    # `result.missing` is undefined: no Console event either.
    assert kinds(events) == [("Message", "No such item: ZZ."), ("Message", "Not found.")]
    assert s.state["last"] is None and "last" in s.state

    s = shop.session(model=ScriptedModel([call("lookup", sku="A1"), {"text": "Found."}]))
    events = s.chat("find A1")
    assert kinds(events) == [("Object", {"found": True, "item": {"sku": "A1", "name": "anvil"}}), ("Message", "Found.")]
    assert s.state["last"] == {"sku": "A1", "name": "anvil"}


def test_a_condition_that_fails_fails_the_turn_naming_the_place(shop):
    s = shop.session(model=ScriptedModel([call("order", qty=5), call("nested")]))
    before = s.snapshot()
    events = s.chat("go")
    error = events[-1]
    assert error.type == "Error" and error.data == chatrun.events.TURN_FAILED_TEXT
    assert "condition `args.x.y.z > 1` failed" in error.meta["detail"] and "bot.yaml:" in error.meta["detail"]
    assert s.snapshot()["scopes"] == before["scopes"] and s.state == before["state"]


def test_bank_insufficient_funds_through_the_openai_client(fake):
    """Rasa's "amount over the balance -> tell the user and end the transfer", over HTTP."""
    bot = chatrun.load_bot(BANK)
    s = bot.session(state={"balance": 100})
    fake.queue(call("transfer_money"), call("set_recipient", recipient="Ana"), {"text": "How much?"})
    s.chat("Send money to Ana")
    assert s.stack == ["main", "transfer"]
    fake.queue(call("set_amount", amount=250))
    events = s.chat("250")
    assert ("Message", "You cannot send 250: your balance is 100. The transfer is cancelled.") in kinds(events)
    assert s.stack == ["main"] and s.state["balance"] == 100
    last = fake.requests[-1]
    assert [t["function"]["name"] for t in last["tools"]] == bot.config.routes["transfer"].tools
    assert last["messages"][-2] == {"role": "user", "content": "250"}  # then the route's context
    # the parent's memory got the popped scope's result
    assert s.memory()[-1].content == "The transfer was cancelled for insufficient funds."


def test_bank_sends_only_on_the_users_own_yes_through_the_openai_client(fake):
    bot = chatrun.load_bot(BANK)
    s = bot.session()
    # The model consents for the user (a flag of its own): the runtime asks the user instead.
    fake.queue(call("transfer_money"),
               {"tool_calls": [{"name": "set_recipient", "arguments": {"recipient": "Joe"}},
                               {"name": "set_amount", "arguments": {"amount": 300}}]},
               call("send_transfer", confirmed=True))
    events = s.chat("Send 300 to Joe")
    assert "Call send_transfer to send 300 to Joe" in fake.requests[-1]["messages"][-1]["content"]  # the context
    assert ("Choices", {"choices": [{"label": "Yes", "value": "yes"}, {"label": "No", "value": "no"}]}) in kinds(events)
    assert s.state["balance"] == 1000 and [p.ask for p in s.pending] == ["Send 300 to Joe?"]
    calls = len(fake.requests)
    events = s.chat("yes")  # the user's yes runs it, without asking the model
    assert ("Object", {"transfer": {"to": "Joe", "amount": 300}, "balance": 700}) in kinds(events)
    assert s.state["balance"] == 700 and s.stack == ["main"] and len(fake.requests) == calls

    fake.queue(call("transfer_money"),
               {"tool_calls": [{"name": "set_recipient", "arguments": {"recipient": "Joe"}},
                               {"name": "set_amount", "arguments": {"amount": 50}}]},
               call("send_transfer"))
    s.chat("and 50 more")
    fake.queue(call("cancel_transfer"))
    events = s.chat("no")
    assert fake.requests[-1]["messages"][-2]["content"].startswith('The user declined "Send 50 to Joe?"')
    assert ("Message", "The transfer was cancelled; no money was sent.") in kinds(events)
    assert s.state["balance"] == 700 and s.state["transfers"] == [{"to": "Joe", "amount": 300}]


# -- the route graph ----------------------------------------------------------------------


def test_conditional_edges_carry_their_conditions(shop):
    graph = RouteGraph.from_config(shop.config)
    order = [e for e in graph.edges if e.tool == "order"]
    assert order == [Edge("main", "checkout", "push", "order", condition="if state.vip or args.qty == 1; else")]
    bank = RouteGraph.from_config(chatrun.load_bot(BANK).config)
    pops = [e for e in bank.edges if e.kind == "pop"]
    assert pops == [
        Edge("transfer", None, "pop", "set_amount", condition="if args.amount > state.balance"),
        Edge("transfer", None, "pop", "send_transfer"),
        Edge("transfer", None, "pop", "cancel_transfer"),
        Edge("balance", None, "pop", "(answer)"),  # the called balance route returns with its answer
    ]
    text = bank.render("text")
    assert "set_amount       pop → back to main  [if args.amount > state.balance]" in text
    assert '"pop: set_amount [if args.amount #gt; state.balance], send_transfer, cancel_transfer"' in bank.render("mermaid")
    assert 'label="pop: set_amount [if args.amount > state.balance], send_transfer, cancel_transfer"' in bank.render("dot")


def test_a_case_moving_where_the_tool_does_not_is_otherwise_labelled(write_bot):
    path = write_bot("""
        name: g
        routes:
          a: {default: true, tools: [go]}
          b: {tools: [back]}
          c: {tools: [back]}
        tools:
          go:
            action:
              push: b
              cases:
                - if: args.c
                  then: {push: c}
          back: {action: {pop: true}}
        """)
    graph = chatrun.load_bot(path).graph
    assert [e for e in graph.edges if e.tool == "go"] == [
        Edge("a", "c", "push", "go", condition="if args.c"),
        Edge("a", "b", "push", "go", condition="otherwise"),
    ]
