"""Structured output (issue 9, section 4): a route with `output:` asks the model for JSON
(`response_format`), validates the answer against the schema, sends it as an Object event
(not a Message), assigns it with `set`; an invalid answer gets one corrective retry, then the
turn fails. Through the scripted model and the real openai client against the fake server."""

from __future__ import annotations

import json

import pytest

import chatrun
from chat_support import kinds
from chatrun.definition.loader import check_bot
from chatrun.messages import AssistantMessage, UserMessage
from chatrun.models.scripted import ScriptedModel

BOT = """
name: triage
state: {last: null, count: 0}
routes:
  main:
    default: true
    system: Classify the message.
    output:
      schema:
        type: object
        properties:
          category: {enum: [billing, technical, other]}
          urgent: {type: boolean}
        required: [category, urgent]
        additionalProperties: false
      set:
        state.last: "{{ output }}"
        state.count: "{{ state.count + 1 }}"
    tools: [lookup]
  loose:
    system: Answer in JSON.
    output: {schema: {type: object}, request: json_object}
  bare:
    system: Answer in JSON.
    output: {schema: {type: array}, request: none}
  menu:
    system: Menu.
    tools: [classify]
  classifier:
    memory: {type: none}
    returns: answer
    output: {schema: {type: object, properties: {category: {type: string}}, required: [category]}}
tools:
  lookup:
    action: {reply: "Customer is a VIP."}
  classify:
    action: {call: classifier}
"""

GOOD = '{"category": "billing", "urgent": true}'


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT))


def test_a_valid_answer_is_an_object_event_and_is_assigned(bot):
    model = ScriptedModel([{"tool_calls": [{"name": "lookup", "arguments": {}}]}, {"text": GOOD}])
    s = bot.session(model=model)
    events = s.chat("I was charged twice!")
    assert kinds(events) == [("Object", {"category": "billing", "urgent": True})]
    assert s.state == {"last": {"category": "billing", "urgent": True}, "count": 1}
    assert s.memory()[-1] == AssistantMessage(GOOD)
    schema = bot.config.routes["main"].output.schema
    assert [r.response_format for r in model.requests] == [
        {"type": "json_schema", "json_schema": {"name": "main_output", "schema": schema}}] * 2


def test_an_invalid_answer_gets_one_corrective_retry_that_memory_does_not_keep(bot):
    model2 = ScriptedModel([{"text": "It is about billing."}, {"text": GOOD}])
    s = bot.session(model=model2)
    events = s.chat("charged twice")
    assert kinds(events) == [("Object", {"category": "billing", "urgent": True})]
    retry = model2.requests[1].messages
    assert retry[-2] == AssistantMessage("It is about billing.")
    assert isinstance(retry[-1], UserMessage) and retry[-1].content.startswith(
        "Your answer is not valid: it is not JSON (Expecting value at character 0).")
    assert [type(m).__name__ for m in s.memory()[1:]] == ["UserMessage", "AssistantMessage"]  # no bad answer kept


def test_two_invalid_answers_fail_the_turn(bot):
    s = bot.session(model=ScriptedModel([{"text": '{"category": "billing"}'}, {"text": '{"category": "sales", "urgent": 1}'}]))
    before = s.snapshot()
    events = s.chat("hm")
    error = events[-1]
    assert error.type == "Error" and error.data == chatrun.events.TURN_FAILED_TEXT
    detail = error.meta["detail"]
    assert "route main (" in detail and "does not match the route's `output` schema, even after a corrective retry" in detail
    assert "category: 'sales' is not one of ['billing', 'technical', 'other']" in detail
    assert s.state == before["state"] and s.memory() == []


def test_json_object_and_none_requests(bot):
    model = ScriptedModel([{"text": "```json\n{\"a\": 1}\n```"}])
    s = bot.session(route="loose", model=model)
    assert kinds(s.chat("go")) == [("Object", {"a": 1})]  # a fenced answer is read too
    assert model.requests[0].response_format == {"type": "json_object"}
    model = ScriptedModel([{"text": "[1, 2]"}])
    s = bot.session(route="bare", model=model)
    assert kinds(s.chat("go")) == [("Object", [1, 2])]
    assert model.requests[0].response_format is None


def test_a_called_route_with_output_returns_its_json(bot):
    model = ScriptedModel([{"tool_calls": [{"name": "classify", "arguments": {}}]}, {"text": '{"category": "x"}'},
                           {"text": "Filed under x."}])
    s = bot.session(route="menu", model=model)
    events = s.chat("route this")
    assert ("Object", {"category": "x"}) not in kinds(events)  # the caller gets it, not the user
    assert s.memory()[-2].content == json.dumps({"category": "x"})


def test_structured_output_through_the_openai_client(bot, fake):
    s = bot.session()
    fake.queue({"text": '{"category": "technical", "urgent": false}'})
    events = s.chat("the app crashes")
    assert kinds(events) == [("Object", {"category": "technical", "urgent": False})]
    body = fake.requests[-1]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["category", "urgent"]
    assert "stream" not in body  # JSON is not streamed to the user
    assert s.state["last"] == {"category": "technical", "urgent": False}


def refusing(*formats: str):
    """A fake endpoint refusing the given response_format types, as vLLM or an older server would."""
    from chatrun.testing.fake_openai import error_body

    def answer(body):
        kind = (body.get("response_format") or {}).get("type")
        if kind in formats:
            return {"status": 400, "body": error_body(f"response_format type {kind} is not supported",
                                                       "invalid_request_error")}
        return {"text": '{"category": "billing", "urgent": true}'}
    return answer


def test_a_server_refusing_json_schema_is_asked_with_json_object_and_the_schema_in_the_prompt(bot, fake, caplog):
    fake.responder = refusing("json_schema")
    s = bot.session()
    assert kinds(s.chat("I was charged twice")) == [("Object", {"category": "billing", "urgent": True})]
    refused, taken = fake.requests
    assert refused["response_format"]["type"] == "json_schema"
    assert taken["response_format"] == {"type": "json_object"}
    system = taken["messages"][0]["content"]
    assert system.startswith("Classify the message.") and '"required": ["category", "urgent"]' in system
    assert "refused response_format json_schema" in caplog.text and "json_object from now on" in caplog.text
    s.chat("again")  # learnt: the next call asks with json_object at once
    assert [r["response_format"]["type"] for r in fake.requests[2:]] == ["json_object"]
    assert s.memory()[0].content == "Classify the message."  # the schema note was never kept


def test_a_server_refusing_both_is_asked_without_response_format(bot, fake):
    fake.responder = refusing("json_schema", "json_object")
    s = bot.session()
    assert kinds(s.chat("I was charged twice")) == [("Object", {"category": "billing", "urgent": True})]
    assert [(r.get("response_format") or {}).get("type") for r in fake.requests] == ["json_schema", "json_object", None]
    assert "JSON Schema" in fake.requests[-1]["messages"][0]["content"]


def test_other_refusals_are_not_retried(bot, fake):
    from chatrun.testing.fake_openai import error_body

    fake.queue({"status": 400, "body": error_body("messages: too long", "invalid_request_error")})
    s = bot.session()
    events = s.chat("hi")
    assert events[-1].type == "Error" and "HTTP 400: messages: too long" in events[-1].meta["detail"]
    assert len(fake.requests) == 1


def test_validation_of_output(write_bot):
    path = write_bot("""
        name: v
        state: {x: null}
        routes:
          main:
            default: true
            output:
              schema: {type: objekt}
              set: {state.y: "{{ output.z }}"}
        format: 3
        """)
    _, diagnostics = check_bot(path)
    messages = [(d.severity, d.line, d.message) for d in diagnostics]
    assert messages[0][:2] == ("error", 8) and messages[0][2].startswith(
        "`output.schema` of route `main` is not a valid JSON Schema at `type`:")
    assert ("warning", 9, "`output.set` of route `main` sets `state.y`, but `state.y` is not declared in the "
            "top-level `state:`") in messages
