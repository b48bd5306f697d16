"""Call and return, and ending a conversation (issue 9, section 3): `call: ROUTE` runs a nested
route now and hands its result back as the result of the tool call that called it (the
caller resumes in the same turn), `returns: answer` makes a one-off route's final answer its
result, a route never gets the same user message twice in a turn, and `end: true` closes the
conversation with a ConversationEnded event. Through the scripted model, the real openai
client against the fake server, and a SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

import chatrun
from chat_support import call, kinds
from chatrun.definition.graph import Edge
from chatrun.definition.loader import check_bot
from chatrun.messages import AssistantMessage, ToolResultMessage, UserMessage
from chatrun.models.scripted import ScriptedModel

BANK = Path(__file__).resolve().parents[1] / "bots" / "bank"

BOT = """
name: caller
state: {answer: null}
routes:
  main:
    default: true
    system: Main.
    tools: [ask_sql, lookup, bye, back_here]
  sql:
    system: Write SQL for the question.
    memory: {type: none}
    returns: answer
  form:
    system: "Collect a name."
    scope: {local: {name: null}}
    tools: [set_name, done]
  side:
    system: Side.
    tools: [back_with_execute]
tools:
  ask_sql:
    description: Turn a question into SQL
    action: {call: sql}
  lookup:
    description: Ask the user for a name in a form
    action: {call: form}
  set_name:
    parameters: {type: object, properties: {name: {type: string}}, required: [name]}
    action: {set: {scope.name: "{{ args.name }}"}}
  done:
    requires: [scope.name]
    action: {pop: true, result: "The name is {{ scope.name }}."}
  bye:
    action: {message: Bye!, end: true}
  back_here:
    action: {push: side, execute: true}
  back_with_execute:
    action: {pop: true, execute: true}
"""


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT))


def test_a_called_route_answers_and_the_caller_resumes_in_the_same_turn(bot):
    model = ScriptedModel([call("ask_sql"), {"text": "SELECT 1"}, {"text": "The query is SELECT 1."}])
    s = bot.session(model=model)
    events = s.chat("how do I select one?")
    assert kinds(events) == [
        ("RouteChanged", {"route": "sql", "stack": ["main", "sql"]}),
        ("RouteChanged", {"route": "main", "stack": ["main"]}),
        ("Message", "The query is SELECT 1."),  # the called route's answer is not shown to the user
    ]
    assert s.stack == ["main"]
    first, called, resumed = model.requests
    assert called.route == "sql" and called.tools == []
    assert [type(m) for m in called.messages[1:]] == [UserMessage]
    memory = s.memory()
    call_id = memory[2].tool_calls[0].id
    assert [type(m) for m in memory] == [chatrun.SystemMessage, UserMessage, AssistantMessage, ToolResultMessage,
                                         AssistantMessage]
    assert (memory[3].tool_call_id, memory[3].content) == (call_id, "SELECT 1")  # a call and its result
    assert resumed.messages[-1] == memory[3]  # the caller's model saw the result, not the question again
    assert sum(isinstance(m, UserMessage) for m in memory) == 1


def test_a_called_route_that_takes_several_turns_returns_with_its_result(bot):
    model = ScriptedModel([call("lookup"), {"text": "What name?"}])
    s = bot.session(model=model)
    s.chat("find someone")
    assert s.stack == ["main", "form"]
    parent = s.memory(s.scopes[0].id, "main")
    assert isinstance(parent[-1], AssistantMessage) and parent[-1].tool_calls  # waiting for its result

    s._model = ScriptedModel([{"tool_calls": [{"name": "set_name", "arguments": {"name": "Ada"}},
                                              {"name": "done", "arguments": {}}]},
                              {"text": "Found Ada."}])
    events = s.chat("Ada")
    assert ("Message", "Found Ada.") in kinds(events)
    assert s.stack == ["main"]
    parent = s.memory()
    assert parent[-2] == ToolResultMessage(parent[-3].tool_calls[0].id, "lookup", "The name is Ada.")
    # This turn's message went to the form; the caller resumed with the result only.
    assert [m.content for m in parent if isinstance(m, UserMessage)] == ["find someone"]


def test_pop_and_execute_do_not_give_the_parent_the_user_message_twice(bot):
    model = ScriptedModel([call("back_here"), call("back_with_execute"), {"text": "ok"}])
    s = bot.session(model=model)
    s.chat("go")
    assert s.stack == ["main"]
    assert [m.content for m in s.memory() if isinstance(m, UserMessage)] == ["go"]


def test_end_closes_the_conversation_with_an_event(write_bot, tmp_path):
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    bot = chatrun.load_bot(write_bot(BOT))
    s = bot.session(store=store, model=ScriptedModel([{"text": "hi"}]))
    s.chat("hello")
    memory_ids = s._c.live_memory_ids()
    assert store.get_messages(memory_ids[0])
    s._model = ScriptedModel([{"tool_calls": [{"name": "bye", "arguments": {}},
                                              {"name": "ask_sql", "arguments": {}}]}])
    events = s.chat("bye")
    assert kinds(events) == [("Message", "Bye!"), ("ConversationEnded", {"route": "main", "tool": "bye"})]
    assert s.ended == {"tool": "bye", "route": "main"}
    assert s.history[-1]["ok"] is True
    assert not store.get_messages(memory_ids[0])  # the memories are freed
    with pytest.raises(chatrun.SessionError, match="has ended .*tool bye"):
        s.chat("are you there?")
    again = bot.session(store=store, session_id=s.id)  # resumed from the store: still ended
    assert again.ended == s.ended
    with pytest.raises(chatrun.SessionError, match="has ended"):
        again.chat("hello?")


def test_bank_call_through_the_openai_client(fake):
    bot = chatrun.load_bot(BANK)
    s = bot.session()
    fake.queue(call("transfer_money"), {"text": "Who should receive the money?"})
    s.chat("I need to send money")
    fake.queue(call("check_balance"), {"text": "Your balance is 1000."}, {"text": "You have 1000. To whom?"})
    events = s.chat("how much do I have?")
    assert ("Message", "You have 1000. To whom?") in kinds(events)
    assert ("Message", "Your balance is 1000.") not in kinds(events)
    asked, balance, resumed = fake.requests[-3:]
    assert "tools" not in balance or not balance["tools"]
    assert asked.get("stream") is True and "stream" not in balance  # a returning route's answer is never streamed
    assert balance["messages"][-1] == {"role": "system", "content": "The user's balance is 1000."}  # its context
    call_id = resumed["messages"][-3]["tool_calls"][0]["id"]
    assert resumed["messages"][-2] == {"role": "tool", "tool_call_id": call_id, "content": "Your balance is 1000."}
    assert [m["content"] for m in resumed["messages"] if m["role"] == "user"] == [
        "I need to send money", "how much do I have?"]
    assert s.stack == ["main", "transfer"]


def test_validation_of_call_end_and_returns(write_bot):
    path = write_bot("""
        name: v
        routes:
          main: {default: true, tools: [both, stop, nowhere]}
          helper: {returns: answer}
          lonely: {returns: answer}
        tools:
          both: {action: {call: helper, push: helper}}
          stop: {action: {end: true, execute: true, route: helper}}
          nowhere: {action: {call: helpr}}
        """)
    _, diagnostics = check_bot(path)
    messages = [(d.severity, d.message) for d in diagnostics]
    assert ("error", "tool `both` has `call` with `push`: a call pushes the called route and comes back here; "
            "it cannot move anywhere else too") in messages
    assert ("error", "tool `stop` has `end: true` with `route`, `execute`: the conversation ends after this tool, "
            "so nothing would run on; remove one") in messages
    assert ("error", "tool `nowhere` calls unknown route `helpr`; did you mean `helper`?") in messages
    assert ("warning", "route `lonely` has `returns: answer`, but no tool calls it (`call: lonely`): "
            "it only returns when called") in messages


def test_graph_draws_calls_the_answer_pop_and_the_end(bot):
    graph = bot.graph
    assert Edge("main", "sql", "call", "ask_sql") in graph.edges
    assert Edge("sql", None, "pop", "(answer)") in graph.edges
    assert Edge("main", None, "end", "bye") in graph.edges
    assert graph.can_be_nested("sql") and graph.pop_targets("sql") == ["main"]
    text = graph.render("text")
    assert "ask_sql    call → sql" in text and "bye        end → the conversation ends" in text
    assert "(answer)  pop → back to main" in text
    mermaid = graph.render("mermaid")
    assert 'end_of_conversation(("end"))' in mermaid and '==>|"end: bye"| end_of_conversation' in mermaid
    assert '-->|"call: ask_sql"| n1_sql' in mermaid
    assert '"(end)" [label="end", shape=doublecircle];' in graph.render("dot")
