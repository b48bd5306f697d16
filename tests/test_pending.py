"""Humans in the loop through the library API (issue 22): approvals, questions that wait,
operator takeovers; decisions as turns, checked before they start; stored across processes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import chatrun
from chat_support import call
from chatrun import (
    Answer,
    Approve,
    DecisionRefused,
    Expire,
    FixedClock,
    InvalidDecision,
    NotPending,
    OperatorSay,
    Reject,
    Release,
    TakeOver,
)
from chatrun.messages import AssistantMessage, ToolResultMessage, UserMessage
from chatrun.models.scripted import ScriptedModel
from chatrun.store.sqlite import SQLiteStore

DESK = """
name: desk
model: {provider: scripted, name: gpt-4o-mini}
memory: {type: message_window, max_messages: 50}
state: {refunds: 0, last: null, kyc: null, colour: null, age: null}
routes:
  main:
    default: true
    system: You are a refund desk.
    tools: [refund, small_refund, transfer, submit_documents, pick_colour, ask_age, human, human_brief, ask_desk, note]
  menu:
    system: The menu.
tools:
  refund:
    description: Refund an order
    parameters:
      type: object
      properties: {order: {type: string}, amount: {type: number, maximum: 500}}
      required: [order, amount]
    handler: desk_tools:refund
    approval:
      if: args.amount > 50
      by: [supervisor]
      self: false
      edit: [amount]
      ask: "Refund {{ args.amount }} EUR on {{ args.order }}?"
      timeout: 30m
      rejected: "The refund was declined{{ ': ' ~ decision.reason if decision.reason }}."
    action:
      set:
        state.refunds: "{{ state.refunds + 1 }}"
        state.last: "{{ decision.outcome if decision else 'direct' }}"
  small_refund:
    description: Refund a small amount, the user confirms
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    handler: desk_tools:small
    approval: {timeout: 1h, on_timeout: approve}
  transfer:
    description: Transfer money; a timeout's named case decides
    parameters:
      type: object
      properties: {order: {type: string}, amount: {type: number, maximum: 500}}
      required: [order, amount]
    handler: desk_tools:refund
    approval:
      by: [supervisor]
      timeout: 1h
      on_timeout: unanswered
      rejected: "Declined."
      cases:
        unanswered:
          - if: args.order == 'BAD'
            then: {approve: {amount: 900}}
          - if: args.amount <= 200
            then:
              approve: {amount: "{{ [args.amount, 50] | min }}"}
              message: "No one answered in time: {{ [args.amount, 50] | min }} EUR go out now."
          - if: args.amount <= 400
            then:
              reject: "Nobody approved {{ args.amount }} EUR in time ({{ decision.case }})."
              message: Nobody approved it in time; the menu is next.
              route: menu
          - else: {reject: true}
    action:
      set: {state.last: "{{ decision.outcome ~ ' by ' ~ decision.case if decision else 'direct' }}"}
  submit_documents:
    description: Submit the KYC documents
    action:
      ask:
        from: backend
        text: Check the customer's documents.
        tell: We are checking your documents.
        schema: {type: object, properties: {verdict: {enum: [approved, rejected]}}, required: [verdict]}
        into: state.kyc
        timeout: 2d
      cases:
        - if: result.verdict == 'approved'
          then: {message: "Your documents are approved."}
  pick_colour:
    description: Ask the user for a colour
    action:
      ask:
        from: user
        text: Which colour?
        choices: [{label: Red, value: red}, {label: Blue, value: blue}]
        schema: {enum: [red, blue]}
        into: state.colour
  ask_age:
    description: Ask the user's age
    action:
      ask: {from: user, text: How old are you?, schema: {type: integer, minimum: 18}, into: state.age}
  human:
    description: Hand over to a person
    action:
      operator: {text: Connecting you with a colleague., release_to: menu}
  human_brief:
    description: Hand over, remembering a summary
    action:
      operator: {remember: summary}
  ask_desk:
    description: Ask the service desk for the order's status
    action:
      ask: {from: operator, text: Checking with the service desk., schema: {type: string}}
  note:
    description: Take a note
    action: {reply: noted}
"""

TOOLS = """
def refund(ctx):
    ctx.emit("Console", "refunding " + str(ctx.args["amount"]))
    return "Refunded " + str(ctx.args["amount"]) + " EUR on " + ctx.args["order"] + "."

def small(ctx):
    return "Refunded " + str(ctx.args["amount"]) + " EUR."
"""

ALICE = {"name": "alice", "roles": ["customer"]}
BOB = {"name": "bob", "roles": ["supervisor"]}
CAROL = {"name": "carol", "roles": ["supervisor"]}
OPERATOR = {"name": "olga", "roles": ["operators"]}
START = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)


@pytest.fixture
def desk(write_bot):
    return chatrun.load_bot(write_bot(DESK, extra={"desk_tools.py": TOOLS}))


def as_(session, principal):
    session.principal = principal
    session.roles = set(principal["roles"]) if principal else None
    return session


def of(events, kind, audience="user"):
    return [e.data for e in events if e.type == kind and e.audience == audience]


def start(desk, model, store=None, principal=ALICE):
    session = desk.session(model=model, store=store) if store is not None else desk.session(model=model)
    session.clock = FixedClock(START)
    return as_(session, principal)


def request_refund(desk, amount=120, store=None):
    model = ScriptedModel([call("refund", order="A1", amount=amount)])
    session = start(desk, model, store)
    events = session.chat("Refund my order A1")
    return session, model, events


def test_a_call_that_needs_approval_ends_the_turn_with_nothing_run(desk):
    session, model, events = request_refund(desk)
    (pending,) = of(events, "Pending")
    assert pending["kind"] == "approval" and pending["tool"] == "refund"
    assert pending["args"] == {"order": "A1", "amount": 120}
    # the user reads what they are told (no `tell:`: the default), never the supervisor's question
    assert pending["ask"] == pending["tell"] == "Your request is waiting for approval."
    assert pending["by"] == ["supervisor"] and pending["edit"] == ["amount"]
    assert pending["choices"] is None  # the user has no decision to make
    assert "token" not in pending and "data" not in pending
    (for_operators,) = of(events, "Pending", audience="operators")
    assert for_operators["ask"] == "Refund 120 EUR on A1?"
    assert for_operators["choices"] == [{"label": "Approve", "value": "approve"}, {"label": "Reject", "value": "reject"}]
    assert pending["due"] == (START + timedelta(minutes=30)).isoformat()
    assert of(events, "Console") == []  # the handler did not run
    assert session.state["refunds"] == 0
    assert [i.id for i in session.pending] == ["p1"] and session.next_due == pending["due"]
    memory = session.memory()
    assert isinstance(memory[-2], AssistantMessage) and memory[-2].tool_calls[0].name == "refund"
    assert memory[-1] == ToolResultMessage(memory[-2].tool_calls[0].id, "refund",
                                           "Waiting for approval: Refund 120 EUR on A1?")
    assert len(model.requests) == 1


def test_below_the_condition_the_tool_runs_at_once(desk):
    model = ScriptedModel([call("refund", order="A1", amount=20), "Done: refunded 20 EUR."])
    session = start(desk, model)
    events = session.chat("Refund 20")
    assert of(events, "Pending") == [] and session.pending == []
    assert session.state == {**session.state, "refunds": 1, "last": "direct"}


def test_a_supervisor_approves_the_tool_runs_once_and_the_model_goes_on(desk):
    session, model, _ = request_refund(desk)
    model.add("The refund of 120 EUR is done.")
    events = as_(session, BOB).chat(Approve("p1"))
    assert of(events, "Console") == ["refunding 120"]
    assert of(events, "Resolved") == [{"id": "p1", "kind": "approval", "outcome": "approved", "by": "bob",
                                       "args": {"order": "A1", "amount": 120}}]
    assert of(events, "Message") == ["The refund of 120 EUR is done."]
    assert session.state["refunds"] == 1 and session.state["last"] == "approved"
    assert session.pending == []
    sent = model.requests[-1].messages
    assert sent[-1] == ToolResultMessage(sent[-2].tool_calls[0].id, "refund", "Refunded 120 EUR on A1.")
    assert not any(isinstance(m, UserMessage) and m.content == "" for m in sent)
    entry = session.history[-1]
    assert entry["ok"] and entry["input"] == {"decision": {"kind": "approve", "item": "p1"}}
    with pytest.raises(NotPending) as info:  # decided twice: nothing happens twice
        session.chat(Approve("p1"))
    assert info.value.outcome == "approved" and "resolved already (approved)" in str(info.value)
    assert session.state["refunds"] == 1 and session.history[-1] == entry  # no turn for it


def test_an_edited_amount_is_validated_again_and_used(desk):
    session, model, _ = request_refund(desk)
    as_(session, BOB)
    before = len(session.history)
    with pytest.raises(InvalidDecision, match="amount: 900 is greater than the maximum of 500"):
        session.chat(Approve("p1", args={"amount": 900}))
    with pytest.raises(InvalidDecision, match=r"may not be edited: order \(editable: amount\)"):
        session.chat(Approve("p1", args={"order": "B2"}))
    assert len(session.history) == before and [i.id for i in session.pending] == ["p1"]  # nothing committed
    model.add("Refunded 80 instead.")
    events = session.chat(Approve("p1", args={"amount": 80}, reason="policy cap"))
    assert of(events, "Console") == ["refunding 80"]
    (resolved,) = of(events, "Resolved")
    assert resolved["outcome"] == "edited" and resolved["args"] == {"order": "A1", "amount": 80}
    assert resolved["reason"] == "policy cap"
    assert session.state["last"] == "edited"


def test_a_rejection_tells_the_model_the_rejected_text_and_runs_nothing(desk):
    session, model, _ = request_refund(desk)
    model.add("Sorry, the refund was declined.")
    events = as_(session, BOB).chat(Reject("p1", reason="no receipt"))
    assert of(events, "Console") == [] and session.state["refunds"] == 0
    assert of(events, "Resolved")[0]["outcome"] == "rejected"
    assert model.requests[-1].messages[-1].content == "The refund was declined: no receipt."
    assert of(events, "Message") == ["Sorry, the refund was declined."]


def test_roles_and_the_self_rule_refuse_before_the_turn(desk):
    session, _, _ = request_refund(desk)
    before = len(session.history)
    with pytest.raises(DecisionRefused, match="roles supervisor; the caller has customer, user"):
        session.chat(Approve("p1"))  # alice, the customer
    self_approver = {"name": "alice", "roles": ["supervisor"]}
    with pytest.raises(DecisionRefused, match="may not decide it"):
        as_(session, self_approver).chat(Approve("p1"))
    assert len(session.history) == before and session.state["refunds"] == 0
    with pytest.raises(NotPending, match="no open item has that id"):
        as_(session, BOB).chat(Approve("p9"))
    with pytest.raises(InvalidDecision, match="it is an approval, not a question: approve or reject it"):
        session.chat(Answer("p1", "yes"))


def test_a_timeout_rejects_on_the_session_clock(desk):
    session, model, _ = request_refund(desk)
    assert session.chat(Expire()) == []  # nothing due yet: no turn at all
    turns = len(session.history)
    session.clock = FixedClock(START + timedelta(minutes=31))
    model.add("Nobody approved it in time.")
    events = session.chat(Expire())
    assert of(events, "Resolved") == [{"id": "p1", "kind": "approval", "outcome": "timed_out", "by": None}]
    assert session.state["refunds"] == 0 and session.pending == []
    assert len(session.history) == turns + 1
    assert session.history[-1]["input"] == {"decision": {"kind": "expire"}}


def test_a_timeout_can_approve(desk):
    model = ScriptedModel([call("small_refund", amount=5)])
    session = start(desk, model)
    session.chat("Refund 5")
    model.add("Done.")
    events = session.chat(Expire(now=(START + timedelta(hours=2)).isoformat()))
    assert of(events, "Resolved")[0]["outcome"] == "timed_out"
    assert model.requests[-1].messages[-1].content == "Refunded 5 EUR."


def expire_transfer(desk, amount, order="A1"):
    """A transfer nobody decides: its `on_timeout: unanswered` case decides an hour later."""
    model = ScriptedModel([call("transfer", order=order, amount=amount)])
    session = start(desk, model)
    session.chat("Transfer it")
    asked = len(model.requests)
    model.add("Told the user.")
    events = session.chat(Expire(now=(START + timedelta(hours=2)).isoformat()))
    return session, model, events, asked


def test_a_timeouts_named_case_approves_with_capped_arguments(desk):
    session, model, events, _ = expire_transfer(desk, 120)
    assert [e.type for e in events if e.audience == "user"][:3] == ["Message", "Resolved", "Console"]
    assert of(events, "Message") == ["No one answered in time: 50 EUR go out now.", "Told the user."]
    assert of(events, "Resolved") == [{"id": "p1", "kind": "approval", "outcome": "timed_out", "by": None,
                                       "case": "unanswered", "args": {"order": "A1", "amount": 50}}]
    assert of(events, "Console") == ["refunding 50"]  # the handler ran once, with the capped amount
    assert session.state["last"] == "timed_out by unanswered"  # `decision.case` in the action's templates
    assert model.requests[-1].messages[-1].content == "Refunded 50 EUR on A1."


def test_a_timeouts_named_case_rejects_with_its_own_text_and_moves(desk):
    session, model, events, asked = expire_transfer(desk, 300)
    assert of(events, "Message") == ["Nobody approved it in time; the menu is next."]
    assert of(events, "Resolved")[0] == {"id": "p1", "kind": "approval", "outcome": "timed_out", "by": None,
                                         "case": "unanswered"}
    assert of(events, "Console") == [] and session.state["last"] is None  # nothing of the tool ran
    assert of(events, "RouteChanged") == [{"route": "menu", "stack": ["menu"]}]
    assert len(model.requests) == asked  # the model is not asked: the next message goes to the menu
    main = session.memory(route="main")
    assert main[-1].content == "Nobody approved 300 EUR in time (unanswered)."
    assert "transfer  route → menu  [timeout unanswered if args.amount <= 400]" in desk.graph.render()


def test_a_timeouts_named_case_falls_to_else_and_refuses_invalid_arguments(desk):
    session, model, events, _ = expire_transfer(desk, 450)  # the else entry: `reject: true`
    assert of(events, "Console") == [] and model.requests[-1].messages[-1].content == "Declined."
    session, model, events, _ = expire_transfer(desk, 80, order="BAD")  # the case gives amount 900 > 500
    (console,) = of(events, "Console")  # the handler did not run; the author learns why
    assert console == ("timeout case unanswered of transfer: invalid arguments for transfer: amount: 900 is "
                       "greater than the maximum of 500.")
    assert of(events, "Resolved")[0]["outcome"] == "timed_out" and session.state["last"] is None
    assert "the arguments the timeout's case `unanswered` gave are invalid" in model.requests[-1].messages[-1].content


def test_validation_checks_a_timeouts_named_case(write_bot):
    path = write_bot("""
        name: bad
        routes: {main: {default: true, system: Hi., tools: [pay, send, both]}}
        tools:
          pay:
            description: Pay
            parameters: {type: object, properties: {amount: {type: number}}}
            approval:
              timeout: 1h
              on_timeout: unanswerd
              cases:
                unanswered:
                  - else: {reject: true}
                  - if: args.amount < 10
                    then: {approve: {amont: 5}}
          send:
            description: Send
            approval:
              timeout: 1h
              on_timeout: late
              cases:
                late:
                  - else: {reject: Too late., route: nowhere}
          both:
            description: Both
            approval:
              timeout: 1h
              on_timeout: late
              cases:
                late:
                  - if: "true"
                    then: {approve: true, route: main}
                  - else: {approve: true, reject: true}
        """)
    _, diagnostics = chatrun_check(path)
    errors = [(d.line, d.message) for d in diagnostics if d.severity == "error"]
    assert (10, "`approval.on_timeout` of tool `pay` names `unanswerd`, which is neither `reject`, `approve` nor "
                "one of the approval's `cases`; did you mean `unanswered`? (it may be: `reject`, `approve`, "
                "`unanswered`)") in errors
    assert (13, "the `else` entry of case `unanswered` of tool `pay`'s approval must be the last: the entries "
                "after it could never decide") in errors
    assert (15, "`approve` of case `unanswered` (if args.amount < 10) of tool `pay`'s approval changes `amont`, "
                "which is not one of the tool's parameters; did you mean `amount`?") in errors
    assert (23, "`route` of case `late` (else) of tool `send`'s approval names unknown route `nowhere`") in errors
    assert (32, "case `late` (if true) of tool `both`'s approval has `route` with `approve`: a call that runs "
                "moves by its own action (cases on `decision.case`); `route` goes with `reject`") in errors
    assert (33, "case `late` (else) of tool `both`'s approval must say `approve` or `reject` (exactly one): "
                "what the decision is") in errors
    assert len(errors) == 6, errors


def test_the_user_decides_their_own_approval_by_message(desk):
    model = ScriptedModel([call("small_refund", amount=5)])
    session = start(desk, model)
    events = session.chat("Refund 5")
    (pending,) = of(events, "Pending")
    assert pending["by"] == ["user"] and pending["choices"] == [{"label": "Yes", "value": "yes"},
                                                                {"label": "No", "value": "no"}]
    assert of(events, "Choices") == [{"choices": pending["choices"]}]
    model.add("Refunded.")
    events = session.chat("Yes, please!")
    assert of(events, "Resolved")[0]["outcome"] == "approved"
    assert of(events, "Message") == ["Refunded."]


def test_another_message_declines_the_users_own_approval_and_reaches_the_model(desk):
    model = ScriptedModel([call("small_refund", amount=5)])
    session = start(desk, model)
    session.chat("Refund 5")
    model.add("How much should I refund instead?")
    events = session.chat("make it 4")  # neither yes nor no: not run; the model reads the message
    assert of(events, "Resolved")[0]["outcome"] == "rejected" and session.pending == []
    assert of(events, "Message") == ["How much should I refund instead?"]
    sent = model.requests[-1].messages
    assert [type(m).__name__ for m in sent[-2:]] == ["ToolResultMessage", "UserMessage"]
    assert sent[-2].content.startswith('The user did not confirm "Approve small_refund with {\\"amount\\": 5}?"')
    assert sent[-1] == UserMessage("make it 4")


def test_messages_while_a_supervisor_decides_are_queued_for_the_model(desk):
    session, model, _ = request_refund(desk)
    events = session.chat("Any news? Order A1 is urgent.")
    assert of(events, "Message") == ["Still waiting: Your request is waiting for approval."]
    assert len(model.requests) == 1  # no model call
    model.add("Done, and noted it is urgent.")
    as_(session, BOB).chat(Approve("p1"))
    sent = model.requests[-1].messages
    assert [type(m).__name__ for m in sent[-3:]] == ["AssistantMessage", "ToolResultMessage", "UserMessage"]
    assert sent[-1] == UserMessage("Any news? Order A1 is urgent.")
    assert sent[-2].content == "Refunded 120 EUR on A1."


def test_a_question_from_the_user_validates_the_answer(desk):
    model = ScriptedModel([call("ask_age")])
    session = start(desk, model)
    events = session.chat("Sign me up")
    (pending,) = of(events, "Pending")
    assert pending["kind"] == "question" and pending["schema"] == {"type": "integer", "minimum": 18}
    events = session.chat("12")
    assert of(events, "Message") == ["That answer does not fit: the answer: 12 is less than the minimum of 18. "
                                     "How old are you?"]
    assert len(session.pending) == 1 and session.state["age"] is None
    model.add("Welcome!")
    events = session.chat("42")
    assert session.state["age"] == 42 and session.pending == []
    assert of(events, "Resolved")[0] == {"id": "p1", "kind": "question", "outcome": "answered", "by": "alice",
                                         "answer": 42}
    assert model.requests[-1].messages[-1].content == "42"


def test_a_question_with_choices_takes_a_label_or_a_value(desk):
    model = ScriptedModel([call("pick_colour")])
    session = start(desk, model)
    events = session.chat("Paint it")
    assert of(events, "Pending")[0]["choices"] == [{"label": "Red", "value": "red"}, {"label": "Blue", "value": "blue"}]
    model.add("Blue it is.")
    session.chat("Blue")
    assert session.state["colour"] == "blue"


def test_a_backend_answers_with_its_token_and_the_cases_see_the_answer(desk):
    model = ScriptedModel([call("submit_documents")])
    session = start(desk, model)
    events = session.chat("Here are my documents")
    user_copy = [e for e in events if e.type == "Pending" and e.audience == "user"][0].data
    backend_copy = [e for e in events if e.type == "Pending" and e.audience == "backend"][0].data
    assert "token" not in user_copy and backend_copy["token"] and backend_copy["by"] == ["backend"]
    events = session.chat("Is it done?")  # the user waits; queued
    assert of(events, "Message") == ["Still waiting: We are checking your documents."]
    with pytest.raises(DecisionRefused, match="token does not match"):
        session.chat(Answer("p1", {"verdict": "approved"}, token="wrong"))
    with pytest.raises(DecisionRefused):
        session.chat(Answer("p1", {"verdict": "approved"}))  # alice, no token
    as_(session, None)  # roles not checked (a program, a server without --auth): still the token
    with pytest.raises(DecisionRefused, match="answered with its token"):
        session.chat(Answer("p1", {"verdict": "approved"}))
    with pytest.raises(InvalidDecision, match="'maybe' is not one of"):
        session.chat(Answer("p1", {"verdict": "maybe"}, token=backend_copy["token"]))
    model.add("You are verified.")
    events = session.chat(Answer("p1", {"verdict": "approved"}, token=backend_copy["token"]))
    assert session.state["kyc"] == {"verdict": "approved"}
    assert of(events, "Message") == ["Your documents are approved.", "You are verified."]
    assert "token" not in str(session.history[-1]["input"])


def test_an_operator_takes_over_and_releases_with_the_talk_in_memory(desk):
    model = ScriptedModel([call("human")])
    session = start(desk, model)
    events = session.chat("I want a human")
    assert of(events, "Message") == ["Connecting you with a colleague."]
    assert [e.audience for e in events if e.type == "Pending"] == ["operators"]
    events = session.chat("Hello? Is anyone there?")
    assert [(e.type, e.audience, e.data) for e in events] == [
        ("UserMessage", "operators", {"text": "Hello? Is anyone there?", "data": {}})]
    with pytest.raises(DecisionRefused):
        session.chat(TakeOver())  # alice is no operator
    as_(session, OPERATOR)
    events = session.chat(TakeOver())
    assert of(events, "Resolved") == [{"id": "p1", "kind": "takeover", "outcome": "taken", "by": "olga"}]
    assert session.taken_over["by"]["name"] == "olga"
    events = session.chat(OperatorSay("Hi, I am Olga. Your refund is on its way."))
    assert [(e.type, e.data, e.meta) for e in events] == [
        ("Message", "Hi, I am Olga. Your refund is on its way.", {"from": "operator", "name": "olga"})]
    as_(session, ALICE).chat("Thanks!")
    assert len(model.requests) == 1  # the bot stayed silent
    events = as_(session, OPERATOR).chat(Release())
    assert of(events, "RouteChanged") == [{"route": "menu", "stack": ["menu"]}]
    assert session.taken_over is None and session.pending == []
    memory = session.memory(route="menu")  # the route the bot goes on with reads what was said
    assert memory[-3:] == [UserMessage("Hello? Is anyone there?"),
                           AssistantMessage("[operator olga] Hi, I am Olga. Your refund is on its way."),
                           UserMessage("Thanks!")]


def test_a_failed_decision_turn_rolls_back_and_the_item_stays(desk):
    session, model, _ = request_refund(desk)
    model.add({"error": "the model is down"})
    events = as_(session, BOB).chat(Approve("p1"))
    assert events[-1].type == "Error"
    assert [i.id for i in session.pending] == ["p1"] and session.state["refunds"] == 0
    assert session.history[-1]["ok"] is False
    model.add("Done now.")
    events = session.chat(Approve("p1"))
    assert of(events, "Console") == ["refunding 120"] and session.state["refunds"] == 1


def test_a_pending_approval_survives_closing_the_store_and_is_decided_in_another(desk, tmp_path):
    path = tmp_path / "s.db"
    store = SQLiteStore(str(path))
    session, _, _ = request_refund(desk, store=store)
    sid = session.id
    store.close()
    again = SQLiteStore(str(path))
    model = ScriptedModel(["Refunded."])
    resumed = desk.session(model=model, store=again, session_id=sid)
    assert [(i.id, i.kind, i.args) for i in resumed.pending] == [("p1", "approval", {"order": "A1", "amount": 120})]
    assert resumed.next_due == (START + timedelta(minutes=30)).isoformat()
    assert resumed.snapshot()["pending"][0]["requested_by"]["name"] == "alice"
    events = as_(resumed, BOB).chat(Approve("p1"))
    assert of(events, "Console") == ["refunding 120"]
    assert model.requests[0].messages[-1].content == "Refunded 120 EUR on A1."
    again.close()


def test_with_the_real_openai_client(desk, fake):
    fake.queue(call("refund", order="A1", amount=120))
    session = as_(desk.session(model=chatrun.OpenAIModel()), ALICE)
    session.chat("Refund A1")
    fake.queue({"text": "Refunded."})
    events = as_(session, BOB).chat(Approve("p1"))
    assert of(events, "Message") == ["Refunded."]
    body = fake.requests[-1]
    assert body["messages"][-1] == {"role": "tool", "tool_call_id": body["messages"][-2]["tool_calls"][0]["id"],
                                    "content": "Refunded 120 EUR on A1."}


def test_validation_names_the_line_of_each_bad_part(write_bot):
    path = write_bot("""
        name: bad
        routes: {main: {default: true, system: Hi., tools: [pay]}}
        tools:
          pay:
            description: Pay
            parameters: {type: object, properties: {amount: {type: number}}}
            approval:
              if: args.amount >
              edit: [amont]
              by: [user]
              self: false
            action:
              operator: {release_to: nowhere}
        """)
    _, diagnostics = chatrun_check(path)
    assert [(d.line, d.message) for d in diagnostics if d.severity == "error"] == [
        (9, "`approval.if` of tool `pay` does not compile: unexpected 'end of the condition'"),
        (10, "`approval.edit` of tool `pay` names `amont`, which is not one of its parameters; did you mean `amount`?"),
        (12, "`approval` of tool `pay` has `by: [user]` and `self: false`: the user who caused the call is the only "
             "one who may decide it, so no one could; add a role to `by`"),
        (14, "`operator.release_to` of tool `pay` names unknown route `nowhere`"),
    ]


def test_a_duration_is_a_number_and_a_unit(write_bot):
    path = write_bot("""
        name: bad
        routes: {main: {default: true, system: Hi., tools: [pay]}}
        tools:
          pay: {description: Pay, approval: {timeout: 10 minutes}}
        """)
    _, diagnostics = chatrun_check(path)
    (error,) = [d for d in diagnostics if d.severity == "error"]
    assert error.line == 5 and "timeout" in error.message


def chatrun_check(path):
    from chatrun.definition.loader import check_bot

    return check_bot(path)


def test_the_calls_after_a_waiting_call_do_not_run(desk):
    model = ScriptedModel([{"tool_calls": [{"name": "refund", "arguments": {"order": "A1", "amount": 120}},
                                           {"name": "note", "arguments": {}}]}])
    session = start(desk, model)
    session.chat("Refund and note it")
    results = [m for m in session.memory() if isinstance(m, ToolResultMessage)]
    assert [r.content for r in results] == [
        "Waiting for approval: Refund 120 EUR on A1?",
        "Not run: an earlier tool call waits for a person; call this again after it is resolved."]


def test_an_operator_action_without_a_role_waits_for_the_servers_role_operators(desk):
    # One name for one role: server/audience.py's OPERATOR_ROLE, not "operator".
    from chatrun.server.audience import OPERATOR_ROLE

    assert desk.config.tools["human"].action.operator.role == OPERATOR_ROLE == "operators"
    session = start(desk, ScriptedModel([call("human")]))
    session.chat("I want a human")
    assert session.pending[0].by == ["operators"]
    with pytest.raises(DecisionRefused):  # the old default's name is just another role now
        as_(session, {"name": "oscar", "roles": ["operator"]}).chat(TakeOver())
    as_(session, OPERATOR).chat(TakeOver())
    assert session.taken_over["by"]["name"] == "olga"


def test_one_operator_holds_a_taken_conversation_in_the_library_too(desk):
    # The rule is the engine's (check_decision): a program, the REPL and transcripts get it as the server does.
    from chatrun import HeldByAnother

    session = start(desk, ScriptedModel([call("human")]))
    session.chat("I want a human")
    as_(session, OPERATOR).chat(TakeOver())
    max_ = {"name": "max", "roles": ["operators"]}
    for decision in (TakeOver(), OperatorSay("max here"), Release()):
        with pytest.raises(HeldByAnother, match="the operator olga holds the conversation"):
            as_(session, max_).chat(decision)
    assert as_(session, OPERATOR).chat(TakeOver()) == [] and session.taken_over["by"]["name"] == "olga"
    as_(session, OPERATOR).chat(Release())
    as_(session, max_).chat(TakeOver())
    assert session.taken_over["by"]["name"] == "max"
    as_(session, max_).chat(Release())
    as_(session, None).chat(TakeOver())  # taken while no one was signed in (auth off) ...
    assert session.taken_over["by"] is None
    as_(session, OPERATOR).chat(Release())  # ... is not held for ever: whoever may act does
    assert session.taken_over is None


def test_an_operator_answers_a_question_and_others_may_not(desk):
    model = ScriptedModel([call("ask_desk")])
    session = start(desk, model)
    events = session.chat("Where is my order?")
    assert of(events, "Pending")[0]["by"] == ["operators"]
    assert [e.audience for e in events if e.type == "Pending"] == ["user", "operators"]
    with pytest.raises(DecisionRefused):
        session.chat(Answer("p1", "shipped"))
    model.add("It has shipped.")
    events = as_(session, OPERATOR).chat(Answer("p1", "shipped yesterday"))
    assert of(events, "Message") == ["It has shipped."]
    assert model.requests[-1].messages[-1].content == "shipped yesterday"


def test_an_operator_steps_in_unasked_and_a_summary_is_remembered(desk):
    model = ScriptedModel([call("human_brief")])
    session = start(desk, model)
    events = session.chat("Let me talk to someone")
    assert of(events, "Message") == ["Connecting you with a person."]
    as_(session, OPERATOR)
    with pytest.raises(chatrun.UnknownRouteError):
        session.chat(Release(route="nowhere"))
    session.chat(OperatorSay("Hello, how can I help?"))  # speaking takes it
    assert session.taken_over["by"]["name"] == "olga"
    as_(session, ALICE).chat("My parcel is late.")
    events = as_(session, OPERATOR).chat(Release())
    assert of(events, "Resolved")[0]["outcome"] == "released" and of(events, "RouteChanged") == []
    assert session.memory()[-1] == AssistantMessage(
        "(An operator talked with the user while I was away: 1 message(s) from the user, 1 from the operator:\n"
        "operator olga: Hello, how can I help?\nuser: My parcel is late.)")
    model.add("Back with the bot.")
    events = as_(session, ALICE).chat("Thanks")
    assert of(events, "Message") == ["Back with the bot."]


def test_a_long_talk_is_summarized_line_by_line_within_a_bound(desk):
    session = start(desk, ScriptedModel([call("human_brief")]))
    session.chat("Let me talk to someone")
    for n in range(13):
        as_(session, OPERATOR).chat(OperatorSay(f"Operator line {n}."))
        as_(session, ALICE).chat(f"User line {n}. " + "very long " * 60)
    as_(session, OPERATOR).chat(Release())
    summary = session.memory()[-1].content
    lines = summary.splitlines()
    assert lines[0] == ("(An operator talked with the user while I was away: 13 message(s) from the user, "
                        "13 from the operator; the first 6 left out:")
    assert len(lines) == 21 and lines[1] == "operator olga: Operator line 3."  # the last 20 lines, in order
    assert lines[2].startswith("user: User line 3. very long") and lines[2].endswith("…")
    assert len(lines[2]) == len("user: ") + 300 and lines[-1].startswith("user: User line 12.")


SUMMARIZED = """
name: brief
model: {provider: scripted, name: gpt-4o-mini}
routes:
  main:
    default: true
    system: Support.
    memory: {type: summary, max_tokens: 4000, keep_messages: 10, summary_model: {name: gpt-4o-nano}}
    tools: [human]
tools:
  human:
    description: Hand over
    action: {operator: {remember: summary}}
"""


def test_a_summary_memory_has_its_summary_model_write_what_was_said(write_bot):
    bot = chatrun.load_bot(write_bot(SUMMARIZED))
    model = ScriptedModel([call("human")])
    session = start(bot, model)
    session.chat("A person, please")
    as_(session, OPERATOR).chat(OperatorSay("Your refund of 30 EUR is approved."))
    as_(session, ALICE).chat("Great, when does it arrive?")
    model.add("The operator approved a 30 EUR refund; the user asked when it arrives.")
    events = as_(session, OPERATOR).chat(Release())
    request = model.requests[-1]
    assert request.config.name == "gpt-4o-nano" and request.route == "main (summary)"
    assert "human operator talked with the user" in request.messages[0].content
    assert request.messages[1].content == ("operator olga: Your refund of 30 EUR is approved.\n"
                                           "user: Great, when does it arrive?")
    assert session.memory()[-1] == AssistantMessage(
        "(Summary of what an operator and the user said while I was away: The operator approved a 30 EUR "
        "refund; the user asked when it arrives.)")
    assert session.history[-1]["usage"]["calls"] == 1 and of(events, "Console") == []
    # The summarizing call fails: the release still happens, with the digest.
    session = start(bot, ScriptedModel([call("human"), {"error": "the model is down"}]))
    session.chat("A person, please")
    as_(session, OPERATOR).chat(OperatorSay("Hello."))
    events = as_(session, OPERATOR).chat(Release())
    assert of(events, "Resolved")[-1]["outcome"] == "released"
    assert of(events, "Console")[0].startswith("the handover summary failed")
    assert session.memory()[-1].content.startswith("(An operator talked with the user while I was away: 0 message")


def test_an_operator_takes_a_conversation_nobody_handed_over(desk):
    model = ScriptedModel(["Hello."])
    session = start(desk, model)
    session.chat("Hi")
    with pytest.raises(NotPending):
        as_(session, OPERATOR).chat(OperatorSay("Hi"))  # nothing to speak in before taking it
    events = session.chat(TakeOver(note="Quality check"))
    assert of(events, "Resolved")[0]["outcome"] == "taken"
    assert [(i.kind, i.ask, i.by) for i in session.pending] == [("takeover", "Quality check", ["operators"])]
    events = as_(session, ALICE).chat("Are you a bot?")
    assert of(events, "UserMessage", "operators") == [{"text": "Are you a bot?", "data": {}}]
    as_(session, OPERATOR).chat(Release(route="menu"))
    assert session.route == "menu" and session.pending == [] and session.taken_over is None



def test_with_no_one_signed_in_the_user_reads_the_operator_leave_as_they_read_them_join(desk):
    """Auth off (or a program): the takeover has no principal; the user read "An operator
    joined", so they read "The operator left" too, not an operator silently gone."""
    session = start(desk, ScriptedModel(["Hello."]), principal=None)
    session.chat("Hi")
    joined = [(e.data, e.meta) for e in session.chat(TakeOver()) if e.type == "Message"]
    assert joined == [("An operator joined the conversation",
                       {"from": "notice", "notice": "operator_joined", "name": "operator"})]
    left = [(e.data, e.meta) for e in session.chat(Release()) if e.type == "Message"]
    assert left == [("The operator left the conversation",
                     {"from": "notice", "notice": "operator_left", "name": "operator"})]


def test_a_file_the_user_sends_during_a_takeover_reaches_the_operators_and_then_the_bot(write_bot):
    """The bot is silent while an operator has the conversation, but it loses nothing: the file
    goes to the operators with the words, and the bot's memory holds it after the release."""
    from chatrun.store.blobs import MemoryBlobs

    bot = chatrun.load_bot(write_bot(DESK.replace("    tools: [refund,", "    attachments: {kinds: [image/*]}\n"
                                                                            "    tools: [refund,", 1),
                                     extra={"desk_tools.py": TOOLS}))
    session = as_(bot.session(model=ScriptedModel([call("human")]), blobs=MemoryBlobs()), ALICE)
    session.chat("I want a human")
    as_(session, OPERATOR).chat(TakeOver())
    photo = as_(session, ALICE).attach(b"\x89PNG receipt", "image/png", "receipt.png")
    events = session.chat({"userMessage": "Here is my receipt", "attachments": [photo.to_dict()]})
    assert of(events, "UserMessage", "operators") == [
        {"text": "Here is my receipt", "data": {}, "attachments": [photo.to_dict()]}]
    as_(session, OPERATOR).chat(Release())
    assert UserMessage("Here is my receipt", (photo,)) in session.memory(route="menu")


@pytest.mark.parametrize("made", ["2026-10-25T00:45:00+00:00", "2026-10-25T01:15:00+00:00"])
def test_a_timeout_is_time_that_passes_also_when_the_bots_clocks_go_back(write_bot, made):
    """A bot in Berlin, the night summer time ends (01:00 UTC: 03:00 CEST is 02:00 CET again): a
    30-minute timeout is due 30 minutes after the item was made, not an hour later or before it."""
    bot = chatrun.load_bot(write_bot(DESK.replace("name: desk\n", "name: desk\ntimezone: Europe/Berlin\n", 1),
                                     extra={"desk_tools.py": TOOLS}))
    session = as_(bot.session(model=ScriptedModel([call("refund", order="A1", amount=120)])), ALICE)
    session.clock = FixedClock(datetime.fromisoformat(made))
    session.chat("Refund my order A1")
    [item] = session.pending
    assert datetime.fromisoformat(item.due) - datetime.fromisoformat(made) == timedelta(minutes=30)
    assert of(session.chat(Expire()), "Resolved") == []  # nothing is due yet: the item waits
    assert [i.id for i in session.pending] == ["p1"]

REQUEST = """
import sys, chatrun
from chatrun import SQLiteStore, ScriptedModel
bot = chatrun.load_bot(sys.argv[1])
model = ScriptedModel([{"tool_calls": [{"name": "refund", "arguments": {"order": "A1", "amount": 120}}]}])
session = bot.session(model=model, store=SQLiteStore(sys.argv[2]), principal={"name": "alice", "roles": ["customer"]})
session.chat("Refund A1")
print(session.id)
"""

DECIDE = """
import sys, chatrun
from chatrun import Approve, SQLiteStore, ScriptedModel
bot = chatrun.load_bot(sys.argv[1])
session = bot.session(model=ScriptedModel(["Refunded."]), store=SQLiteStore(sys.argv[2]), session_id=sys.argv[3],
                      principal={"name": "bob", "roles": ["supervisor"]})
print([e.data for e in session.chat(Approve("p1")) if e.type == "Console"])
"""


@pytest.mark.slow
def test_a_request_in_one_process_is_approved_in_another(desk, tmp_path):
    import subprocess
    import sys

    bot_file = str(tmp_path / "bot.yaml")  # where the desk fixture wrote the bot (and its handlers)
    db = str(tmp_path / "sessions.db")
    first = subprocess.run([sys.executable, "-c", REQUEST, bot_file, db], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    sid = first.stdout.strip()
    second = subprocess.run([sys.executable, "-c", DECIDE, bot_file, db, sid], capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "['refunding 120']"
    store = SQLiteStore(db)
    try:
        history = store.load_history(sid)
    finally:
        store.close()
    assert [entry["input"] for entry in history] == ["Refund A1", {"decision": {"kind": "approve", "item": "p1"}}]


# -- a pause inside a called route; a placeholder the window dropped ------------------------------

CALLED = """
name: called
model: {provider: scripted, name: gpt-4o-mini}
memory: {type: message_window, max_messages: WINDOW}
state: {refunds: 0}
routes:
  main:
    default: true
    system: You are the front desk.
    tools: [refunds_desk]
  refunds:
    system: You handle refunds.
    tools: [refund, done]
tools:
  refunds_desk:
    description: Go to the refunds desk
    action: {call: refunds}
  refund:
    description: Refund an order
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    approval: {by: [supervisor]}
    action:
      set: {state.refunds: "{{ state.refunds + 1 }}"}
      reply: "Refunded {{ args.order }}."
  done:
    description: Back to the front desk
    action: {pop: true, result: "refund handled"}
"""


def test_a_pause_inside_a_called_route_resumes_in_the_called_scope(write_bot):
    bot = chatrun.load_bot(write_bot(CALLED.replace("WINDOW", "50")))
    model = ScriptedModel([call("refunds_desk"), call("refund", order="A1")])
    session = start(bot, model)
    session.chat("Refund A1 please")
    assert session.route == "refunds" and [i.route for i in session.pending] == ["refunds"]
    model.add(call("done"), "The refund of A1 is done.")
    as_(session, BOB).chat(Approve("p1"))
    assert session.state["refunds"] == 1 and session.route == "main" and session.pending == []
    called = model.requests[2]  # the called route's model, right after the decision
    assert called.messages[0].content == "You handle refunds."
    assert called.messages[-1] == ToolResultMessage(called.messages[-2].tool_calls[0].id, "refund", "Refunded A1.")
    front = model.requests[-1].messages  # the caller's model: its call's result is the pop's
    assert front[0].content == "You are the front desk."
    assert front[-1].name == "refunds_desk" and front[-1].content == "refund handled"


def test_a_decision_puts_back_a_call_the_window_dropped_while_it_waited(write_bot):
    bot = chatrun.load_bot(write_bot(CALLED.replace("WINDOW", "3").replace("tools: [refunds_desk]",
                                                                           "tools: [refund]")))
    model = ScriptedModel([call("refund", order="A1")])
    session = start(bot, model)
    session.chat("Refund A1 please")
    for text in ("Any news?", "Hello?", "Still there?"):  # queued: the window drops the call and its placeholder
        session.chat(text)
    assert not [m for m in session.memory(route="main") if isinstance(m, ToolResultMessage)]
    model.add("Refunded, thanks for waiting.")
    as_(session, BOB).chat(Approve("p1"))
    assert session.state["refunds"] == 1
    sent = model.requests[-1].messages[1:]  # after the system prompt
    calls = [m for m in sent if isinstance(m, AssistantMessage) and m.tool_calls]
    results = [m for m in sent if isinstance(m, ToolResultMessage)]
    assert [c.tool_calls[0].name for c in calls] == ["refund"] and [r.content for r in results] == ["Refunded A1."]
    assert results[0].tool_call_id == calls[0].tool_calls[0].id and sent.index(results[0]) == sent.index(calls[0]) + 1
    assert session.memory(route="main")[-1] == AssistantMessage("Refunded, thanks for waiting.")


def test_the_talk_of_a_takeover_is_kept_as_the_history_keeps_it(write_bot, tmp_path):
    """What the user and the operator said during a takeover waits in the takeover item, in the
    session's snapshot, until the release: a card number and an email were kept there as said,
    on a bot whose `storage` guardrails redact them everywhere else."""
    guarded = DESK.replace("state: {refunds", "guardrails:\n  - {pii: [card, email], stages: [storage], "
                           "outcome: redact}\nstate: {refunds")
    bot = chatrun.load_bot(write_bot(guarded, extra={"desk_tools.py": TOOLS}))
    store = SQLiteStore(str(tmp_path / "s.db"))
    session = start(bot, ScriptedModel([call("human")]), store=store)
    session.chat("I want a human")
    session.chat("my card is 4111 1111 1111 1111")
    as_(session, OPERATOR).chat(TakeOver())
    session.chat(OperatorSay("Write to olga@example.com"))
    [item] = session.snapshot()["pending"]
    assert [m["text"] for m in item["data"]["messages"]] == ["my card is [card]", "Write to [email]"]
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert b"4111 1111" not in stored and b"olga@example.com" not in stored
    as_(session, OPERATOR).chat(Release())
    assert session.memory(route="menu")[-2:] == [UserMessage("my card is [card]"),
                                                 AssistantMessage("[operator olga] Write to [email]")]


def test_a_failed_handover_summarys_console_note_passes_the_storage_guardrails(write_bot):
    """The summarizing model's error text (which may quote what it read: the talk) went to every
    client in the Console note as raised, on a bot whose `storage` guardrails redact it."""
    guarded = SUMMARIZED.replace("routes:", "guardrails:\n  - {pii: [card], stages: [storage], outcome: redact}\n"
                                 "routes:", 1)
    bot = chatrun.load_bot(write_bot(guarded))
    session = start(bot, ScriptedModel([call("human"), {"error": "cannot summarize 4111 1111 1111 1111"}]))
    session.chat("A person, please")
    as_(session, OPERATOR).chat(OperatorSay("Hello."))
    events = as_(session, OPERATOR).chat(Release())
    [note] = of(events, "Console")
    assert note.startswith("the handover summary failed") and "cannot summarize [card]" in note


def test_a_forced_takeover_moves_the_hold_announced_and_keeps_the_talk(desk):
    # The holder went home without releasing: another operator takes it, the user reads who left and who joined.
    from chatrun import HeldByAnother

    session = start(desk, ScriptedModel([call("human")]))
    session.chat("I want a human")
    as_(session, OPERATOR).chat(TakeOver())
    as_(session, OPERATOR).chat(OperatorSay("olga here"))
    item = session.pending[0].id
    max_ = {"name": "max", "roles": ["operators"]}
    events = as_(session, max_).chat(TakeOver(force=True))
    notices = [(e.meta["notice"], e.meta["name"]) for e in events if e.type == "Message"]
    assert notices == [("operator_left", "olga"), ("operator_joined", "max")]
    assert [e.data["by"] for e in events if e.type == "Resolved"] == ["max"]
    assert session.taken_over["by"]["name"] == "max" and session.taken_over["item"] == item
    assert [i.id for i in session.pending] == [item] and session.pending[0].data["messages"][0]["text"] == "olga here"
    for decision in (OperatorSay("still me"), Release(), TakeOver()):
        with pytest.raises(HeldByAnother, match="the operator max holds the conversation"):
            as_(session, OPERATOR).chat(decision)
    assert as_(session, max_).chat(TakeOver(force=True)) == []  # the holder's own: nothing happens
    with pytest.raises(DecisionRefused):  # who may force is who may take over at all
        as_(session, {"name": "sam", "roles": ["supervisor"]}).chat(TakeOver(force=True))
    from chatrun.engine.pending import decision_entry

    assert decision_entry(TakeOver()) == {"decision": {"kind": "takeover"}}  # history entries as before
    assert decision_entry(TakeOver(force=True)) == {"decision": {"kind": "takeover", "force": True}}
