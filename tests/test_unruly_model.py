"""The unruly model (issue 32, item 9): each misbehaviour makes the answer it says, from what the
model was offered, the same every time; from golden transcripts, ScriptedModel and the fake server."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import openai
import pytest

import chatrun
from chatrun.definition.config import ModelConfig
from chatrun.errors import BotError, ChatrunError, ModelError
from chatrun.messages import (
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.models.base import ModelRequest
from chatrun.models.scripted import ScriptedModel
from chatrun.testing import unruly
from chatrun.testing.unruly import MISBEHAVIOURS, Offered, Unruly
from chatrun.transcripts import load_transcript, run_transcript

REPO = Path(__file__).resolve().parents[1]


def function(name: str, properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": properties, "required": required or []}}}


TOOLS = [
    function("send_money", {"to": {"type": "string"}, "amount": {"type": "number"}, "confirmed": {"type": "boolean"},
                            "when": {"type": "string"}}, ["to", "amount"]),
    function("cancel_transfer", {}),
]
SEND = {"name": "send_money", "arguments": {"to": "Maria", "amount": 30}}
CANCEL = {"name": "cancel_transfer", "arguments": {}}


def offered(user: str = "I want to send some money", system: str = "Recipient: not given yet.") -> Offered:
    return Offered.from_specs(TOOLS, [{"role": "system", "content": system}, {"role": "user", "content": user}])


def calls(answer: dict) -> list[tuple[str, dict]]:
    return [(c["name"], c.get("arguments", {})) for c in answer["tool_calls"]]


# -- each misbehaviour -----------------------------------------------------------------------------


def test_repeat_call_repeats_the_call_in_one_answer():
    answer = Unruly("repeat_call", call=SEND, times=6).answer(offered())
    assert calls(answer) == [("send_money", {"to": "Maria", "amount": 30})] * 6 and answer["text"] is None
    assert len(Unruly("repeat_call", call=SEND).answer(offered())["tool_calls"]) == 2  # default


def test_repeat_call_without_a_call_repeats_the_previous_answer_after_its_result():
    request = ModelRequest([SystemMessage("s"), UserMessage("send 30 to Maria"),
                            AssistantMessage(None, (ToolCall("c1", "send_money", '{"to": "Maria", "amount": 30}'),)),
                            ToolResultMessage("c1", "send_money", "Sent.")], TOOLS, ModelConfig(), "main")
    assert calls(Unruly("repeat_call", times=1)(request)) == [("send_money", {"to": "Maria", "amount": 30})]
    with pytest.raises(ModelError, match="no call to repeat: give it `call:`"):
        Unruly("repeat_call").answer(offered())


def test_invent_tool_calls_a_tool_that_is_not_offered():
    answer = Unruly("invent_tool").answer(offered())
    invented = answer["tool_calls"][-1]["name"]
    assert invented not in {"send_money", "cancel_transfer"} and invented in unruly.INVENTED_TOOLS
    added = Unruly("invent_tool", call=SEND, args={"all": True}).answer(offered())
    assert calls(added) == [("send_money", SEND["arguments"]), (invented, {"all": True})]
    crowded = Offered.from_specs([function(n, {}) for n in unruly.INVENTED_TOOLS], [])
    assert Unruly("invent_tool").answer(crowded)["tool_calls"][0]["name"] not in crowded.tools


def test_extra_missing_and_wrong_typed_arguments():
    extra = calls(Unruly("extra_args", call=SEND).answer(offered()))[0][1]
    assert extra == {"to": "Maria", "amount": 30, "note": "as discussed", "priority": "high", "notify_user": True}
    assert calls(Unruly("extra_args", call=SEND, args={"x": 1}).answer(offered()))[0][1] == {**SEND["arguments"], "x": 1}
    assert calls(Unruly("missing_args", call=SEND).answer(offered()))[0][1] == {}  # the required ones dropped
    assert calls(Unruly("missing_args", call=SEND, drop=["amount"]).answer(offered()))[0][1] == {"to": "Maria"}
    assert calls(Unruly("wrong_types", call=SEND).answer(offered()))[0][1] == {"to": 12345, "amount": "30"}
    bare = calls(Unruly("wrong_types", call={"name": "send_money"}).answer(offered()))[0][1]
    assert bare == {"to": 12345, "amount": "a lot"}  # no arguments: the required ones, wrong
    raw = {"name": "send_money", "arguments": "{not json"}
    assert Unruly("wrong_types", call=raw).answer(offered())["tool_calls"] == [raw]  # raw text is left as it is


def test_contradict_sends_cancels_and_sends_again():
    answer = Unruly("contradict", call=SEND, undo=CANCEL).answer(offered())
    assert [name for name, _ in calls(answer)] == ["send_money", "cancel_transfer", "send_money"]


def test_empty_answers_nothing():
    assert Unruly("empty", call=SEND, text="Sure").answer(offered()) == {"text": None, "tool_calls": []}


@pytest.mark.parametrize("form, start, end", [
    ("tag", "<tool_call>\n{", "}\n</tool_call>"), ("fenced", "```json\n{", "}\n```"), ("bare", "{", "}")])
def test_as_text_writes_the_call_into_the_text(form, start, end):
    answer = Unruly("as_text", call=SEND, format=form).answer(offered())
    assert answer["tool_calls"] == [] and answer["text"].startswith(start) and answer["text"].endswith(end)
    body = answer["text"].removeprefix(start[:-1]).removesuffix(end[1:])
    assert json.loads(body) == {"name": "send_money", "arguments": {"to": "Maria", "amount": 30}}
    two = Unruly("as_text", tool_calls=[SEND, CANCEL], text="On it.").answer(offered())["text"]
    assert two.startswith("On it.\n<tool_call>") and two.count("<tool_call>") == 2


def test_self_confirm_sets_the_consent_flag_itself():
    assert calls(Unruly("self_confirm", call=SEND).answer(offered()))[0][1] == {**SEND["arguments"], "confirmed": True}
    typed = Offered.from_specs([function("pay", {"approve": {"type": "string"}})], [])
    assert calls(Unruly("self_confirm", call={"name": "pay"}).answer(typed))[0][1] == {"approve": "yes"}
    assert calls(Unruly("self_confirm", call=CANCEL).answer(offered()))[0][1] == {"confirmed": True}  # none: added


def test_invent_values_fills_slots_with_values_the_user_never_gave():
    answer = Unruly("invent_values", tool="send_money").answer(offered(user="Send some money to Berlin's office"))
    args = calls(answer)[0][1]
    assert set(args) == {"to", "amount", "confirmed", "when"}
    assert args["to"] in ("John Doe", "Jane Smith", "Maria") and args["amount"] in (1000, 500, 42)
    assert args["when"] in ("2024-01-01", "2025-12-24", "tomorrow") and args["confirmed"] is True
    for seed in range(20):  # never a value the user said
        said = "send money to John Doe and Jane Smith"
        assert Unruly("invent_values", tool="send_money", seed=seed).answer(offered(user=said))["tool_calls"][0][
            "arguments"]["to"] == "Maria"
    kept = calls(Unruly("invent_values", call=SEND).answer(offered()))[0][1]
    assert kept["to"] == "Maria" and kept["amount"] == 30 and "when" in kept  # only the missing ones


def test_placeholder_copies_the_prompts_prose_into_arguments():
    assert calls(Unruly("placeholder", call=SEND).answer(offered()))[0][1]["to"] == "not given yet"
    other = offered(system="Recipient: unknown. Amount: unknown.")
    assert calls(Unruly("placeholder", call=SEND).answer(other))[0][1] == {"to": "unknown", "when": "unknown",
                                                                         "amount": 30}
    assert calls(Unruly("placeholder", call=SEND, value="(ask)").answer(other))[0][1]["to"] == "(ask)"


def test_misbehaviours_compose_in_the_order_named():
    answer = Unruly(["invent_values", "self_confirm", "repeat_call", "as_text"], tool="send_money", times=2).answer(
        offered())
    assert answer["tool_calls"] == [] and answer["text"].count("<tool_call>") == 2
    assert '"confirmed": true' in answer["text"]


def test_the_same_item_and_request_give_the_same_answer_and_the_seed_picks():
    item = {"unruly": ["invent_values", "invent_tool"], "tool": "send_money"}
    first = [Unruly.from_item({**item, "seed": s}).answer(offered()) for s in range(8)]
    again = [Unruly.from_item({**item, "seed": s}).answer(offered()) for s in range(8)]
    assert first == again
    assert len({json.dumps(a, sort_keys=True) for a in first}) > 1  # seeds differ


def test_every_misbehaviour_is_in_the_transcript_schema_and_the_docs():
    schema = json.loads((REPO / "schemas" / "transcript.schema.json").read_text())
    assert schema["$defs"]["misbehaviour"]["enum"] == list(MISBEHAVIOURS)
    response = schema["$defs"]["response"]["properties"]
    assert set(unruly.KEYS) <= set(response)
    docs = (REPO / "docs" / "transcripts.md").read_text()
    assert all(f"`{name}`" in docs for name in MISBEHAVIOURS)


@pytest.mark.parametrize("item, message", [
    ({"unruly": "repeat_cal"}, "unknown misbehaviour `repeat_cal` (did you mean repeat_call?)"),
    ({"unruly": "empty", "times": 3}, "`times` is an option of repeat_call, which this answer does not name"),
    ({"unruly": "contradict", "call": SEND}, "contradict needs `undo:`"),
    ({"unruly": "as_text", "format": "xml"}, "`format` is 'xml'; use tag, fenced, bare"),
    ({"unruly": "repeat_call", "times": 0}, "`times` is 0; use a whole number from 1"),
    ({"unruly": "repeat_call", "call": SEND, "tool_calls": [SEND]}, "not both"),
])
def test_a_wrong_item_is_refused_saying_why(item, message):
    assert any(message in m for _, m in unruly.problems(item))
    with pytest.raises(ChatrunError, match="unruly answer"):
        Unruly.from_item(item)


def test_scripted_model_calls_an_unruly_entry_with_the_request():
    model = ScriptedModel([Unruly("repeat_call", call=SEND, times=3, id_prefix="u_"), {"text": "done"}])
    request = ModelRequest([UserMessage("hi")], TOOLS, ModelConfig(), "main")
    first = asyncio.run(model.complete(request))
    assert [c.id for c in first.tool_calls] == ["u_1", "u_2", "u_3"] and first.text is None
    assert {c.arguments for c in first.tool_calls} == {'{"to": "Maria", "amount": 30}'}
    assert asyncio.run(model.complete(request)).text == "done"


# -- from golden transcripts -----------------------------------------------------------------------


def transcript(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(f"bot: {REPO / 'bots' / 'refunds'}\nprincipal: {{name: ana, roles: [customer]}}\n"
                    + textwrap.dedent(body).lstrip())
    return path


def test_a_transcript_scripts_unruly_answers_made_from_the_route(tmp_path):
    path = transcript(tmp_path, """
        turns:
          - user: Refund 30 EUR on G7007.
            model:
              - {unruly: [wrong_types, invent_tool], call: {name: refund, arguments: {order: G7007, amount: 30}}}
              - {unruly: invent_values, tool: refund}
              - {unruly: empty}
              - {unruly: empty}      # an empty answer is asked again once, then the fallback is sent
            expect:
              events:
                - Console: {contains: "the model answered nothing (no text, no tool call); asked again once"}
                - Console: {contains: "again after a nudge; the fallback reply was sent"}
                - Message: Sorry, I have no answer to that. Could you say it another way?
              calls:
                - {tool: refund, error: {contains: "amount: '30' is not of type 'number'"}}
                - {tool: transfer_to_human, error: "Error: there is no tool 'transfer_to_human' here. Tools you can call: refund."}
                - {tool: refund, error: {contains: "order: '12345' does not match"}}
              state: {state.refunded: 0}
        """)
    result = run_transcript(str(path))
    assert result.passed, result.report() if hasattr(result, "report") else result
    sent = result.turns[0].observed.memory
    assert sent[1] == {"assistant": 'refund({"order": 12345, "amount": "30"})\ntransfer_to_human({})'}


def test_keys_that_go_with_unruly_are_named_together_once(tmp_path):
    path = transcript(tmp_path, """
        turns:
          - user: hi
            model:
              - {tool: refund, args: {}}
        """)
    with pytest.raises(BotError) as info:
        load_transcript(path)
    lines = [d.format() for d in info.value.diagnostics if "unruly:" in d.message]
    assert lines == [
        f"{path}:6:10: error: `tool`, `args` in `turns[0].model[0]` go with `unruly:` (they say how the model "
        "misbehaves; docs/transcripts.md, \"A model that misbehaves\")"], lines


def test_unruly_items_are_checked_at_their_lines(tmp_path):
    path = transcript(tmp_path, """
        turns:
          - user: hi
            model:
              - {text: Hi, times: 2}
              - {unruly: [empty, repeat_cal]}
        """)
    with pytest.raises(BotError) as info:
        load_transcript(path)
    lines = [d.format() for d in info.value.diagnostics]
    assert lines == [
        f"{path}:6:20: error: `times` in `turns[0].model[0]` goes with `unruly:` (it says how the model misbehaves; "
        "docs/transcripts.md, \"A model that misbehaves\")",
        f"{path}:7:10: error: `turns[0].model[1].unruly`: unknown misbehaviour `repeat_cal` (did you mean "
        "repeat_call?); known: " + ", ".join(MISBEHAVIOURS)], lines
    path = transcript(tmp_path, """
        turns:
          - user: hi
            model:
              - unruly: empty
                format: tag
              - {unruly: contradict, call: {name: refund}}
        """)
    with pytest.raises(BotError) as info:
        load_transcript(path)
    lines = [d.format() for d in info.value.diagnostics]
    assert lines == [
        f"{path}:7:9: error: `turns[0].model[0]`: `format` is an option of as_text, which this answer does not name "
        "(it names empty)",
        f"{path}:8:10: error: `turns[0].model[1]`: contradict needs `undo:`, the call that takes the first one back"]


# -- through the fake server, with the real openai client ------------------------------------------


@pytest.mark.slow
def test_the_fake_server_answers_unruly_from_the_request():
    from chatrun.testing.fake_openai import FakeOpenAI

    with FakeOpenAI() as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="test")
        fake.queue({"unruly": "repeat_call", "call": SEND, "times": 6},
                   {"unruly": "as_text", "call": SEND, "format": "fenced"},
                   {"unruly": ["invent_values", "self_confirm"], "tool": "send_money", "seed": 1})
        messages = [{"role": "user", "content": "I want to send some money"}]
        answers = [client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
                   for _ in range(3)]
        streamed = None
        fake.queue({"unruly": "contradict", "call": SEND, "undo": CANCEL})
        with client.chat.completions.stream(model="m", messages=messages, tools=TOOLS) as stream:
            streamed = stream.get_final_completion().choices[0].message
        with pytest.raises(ValueError, match="unknown misbehaviour"):
            fake.queue({"unruly": "repeat"})
    repeated, written, invented = answers
    assert [(c.function.name, json.loads(c.function.arguments)) for c in repeated.tool_calls] == [
        ("send_money", {"to": "Maria", "amount": 30})] * 6
    assert written.tool_calls is None and written.content.startswith("```json\n{\"name\": \"send_money\"")
    args = json.loads(invented.tool_calls[0].function.arguments)
    assert args["confirmed"] is True and args["to"] in ("John Doe", "Jane Smith", "Maria")
    assert args == Unruly(["invent_values", "self_confirm"], tool="send_money", seed=1).answer(
        Offered.from_body({"tools": TOOLS, "messages": messages}))["tool_calls"][0]["arguments"]
    assert [c.function.name for c in streamed.tool_calls] == ["send_money", "cancel_transfer", "send_money"]


@pytest.mark.slow
def test_a_bot_refuses_an_unruly_openai_model(fake):
    bot = chatrun.load_bot(REPO / "bots" / "refunds")
    session = bot.session(principal={"name": "ana"}, roles={"customer"})
    fake.queue({"unruly": "invent_tool", "seed": 2},
               {"unruly": "wrong_types", "call": {"name": "refund", "arguments": {"order": "G7007", "amount": 30}}},
               {"text": "I could not refund that yet."})
    events = session.chat("Refund 30 EUR on G7007.")
    assert [e.data for e in events if e.type == "Message"] == ["I could not refund that yet."]
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told[0].startswith("Error: there is no tool '") and told[0].endswith("here. Tools you can call: refund.")
    assert "amount: '30' is not of type 'number'" in told[1]
    assert session.visible_state()["state"]["refunded"] == 0
