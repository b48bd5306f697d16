"""Tool calls written as text (issue 32, item 8): `<tool_call>` blocks, fenced and bare JSON calls
are read from the reply (`model.tool_calls: native | text | auto`), run as ordinary calls, and
never reach the user, streamed or not; a route's `tool_choice` reaches the endpoint. Through the
scripted model, and through the real openai client against the fake OpenAI server."""

from __future__ import annotations

import asyncio
import json

import pytest

import chatrun
from chat_support import kinds
from chatrun.definition.loader import check_bot
from chatrun.messages import ToolCall
from chatrun.models.base import ModelResponse
from chatrun.models.scripted import ScriptedModel
from chatrun.models.text_calls import HeldBack, read_calls, read_response
from chatrun.testing.unruly import Unruly

BOT = """
name: desk
format: 3
state: {booked: [], notes: 0}
routes:
  main:
    default: true
    system: You book seats.
    tools: [book, note]
  strict:
    entry: true
    system: Book now.
    tool_choice: book
    tools: [book, note]
  any:
    entry: true
    system: Do something.
    tool_choice: required
    tools: [book, note]
  plain:
    entry: true
    system: Just talk.
    model: {tool_calls: native}
    tools: [book, note]
tools:
  book:
    description: Book a seat
    parameters:
      type: object
      properties: {seat: {type: string}}
      required: [seat]
    action:
      set: {state.booked: "{{ state.booked + [args.seat] }}"}
      reply: "Booked seat {{ args.seat }}."
  note:
    description: Take a note
    effect: idempotent     # each call counts one more note
    action:
      set: {state.notes: "{{ state.notes + 1 }}"}
      reply: Noted.
"""

OFFERED = frozenset({"book", "note"})
HERMES = '<tool_call>\n{"name": "book", "arguments": {"seat": "12A"}}\n</tool_call>'


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT))


def call(name: str, arguments: dict) -> ToolCall:
    return ToolCall("", name, json.dumps(arguments))


# -- reading an answer ------------------------------------------------------------------------------

def test_several_blocks_in_one_answer_are_several_calls():
    text = HERMES + '\n<tool_call>{"name": "note", "arguments": {}}</tool_call>'
    assert read_calls(text, "auto", OFFERED) == ([call("book", {"seat": "12A"}), call("note", {})], None)


def test_text_around_the_blocks_is_the_answer_text():
    text = f"Let me book that.\n{HERMES}\nOne moment."
    calls, rest = read_calls(text, "auto", OFFERED)
    assert calls == [call("book", {"seat": "12A"})]
    assert rest == "Let me book that.\nOne moment."


def test_a_fenced_json_call_and_a_bare_one_with_parameters():
    fenced = 'Booking now.\n```json\n{"name": "book", "arguments": {"seat": "3C"}}\n```'
    assert read_calls(fenced, "auto", OFFERED) == ([call("book", {"seat": "3C"})], "Booking now.")
    bare = '{"name": "book", "parameters": {"seat": "4D"}}'
    assert read_calls(bare, "auto", OFFERED) == ([call("book", {"seat": "4D"})], None)
    two = '```\n{"name": "note", "arguments": {}}\n{"name": "book", "arguments": {"seat": "1A"}}\n```'
    assert read_calls(two, "auto", OFFERED)[0] == [call("note", {}), call("book", {"seat": "1A"})]


def test_arguments_written_as_a_json_string_are_the_arguments():
    text = '<tool_call>{"name": "book", "arguments": "{\\"seat\\": \\"7F\\"}"}</tool_call>'
    assert read_calls(text, "auto", OFFERED) == ([ToolCall("", "book", '{"seat": "7F"}')], None)


def test_broken_json_in_a_block_is_a_call_the_call_path_refuses():
    text = '<tool_call>{"name": "book", "arguments": {"seat": "12A"</tool_call>'
    assert read_calls(text, "auto", OFFERED) == ([ToolCall("", "book", '{"name": "book", "arguments": {"seat": "12A"')],
                                                 None)
    nameless = "Sure <tool_call>not json at all</tool_call>"
    assert read_calls(nameless, "auto", OFFERED) == ([ToolCall("", "", "not json at all")], "Sure ")  # as a stream may have shown it


def test_json_that_is_not_a_call_stays_text():
    for text in ('{"name": "Ana", "age": 3}', '{"city": "Paris"}', "```json\n{\"a\": 1}\n```",
                 "Use {braces} and `code` freely.", '{"name": "book", "arguments": {"seat": 1}'):  # the last one: cut
        assert read_calls(text, "auto", OFFERED) == ([], text)


def test_auto_reads_json_calls_only_to_offered_tools_text_reads_them_all():
    text = '{"name": "fly", "arguments": {}}'
    assert read_calls(text, "auto", OFFERED) == ([], text)
    assert read_calls(text, "text", OFFERED) == ([call("fly", {})], None)
    # The tag says it is a call: under auto too, an unknown name is a call (refused to the model).
    assert read_calls('<tool_call>{"name": "fly", "arguments": {}}</tool_call>', "auto", OFFERED)[0] == [
        call("fly", {})]


def test_native_mode_and_native_calls_leave_the_text_alone():
    response = ModelResponse(text=HERMES)
    assert read_response(response, "native", OFFERED) is response
    native = ModelResponse(text=HERMES, tool_calls=[ToolCall("c1", "note", "{}")])
    assert read_response(native, "auto", OFFERED) is native
    both = read_response(native, "text", OFFERED)
    assert (both.text, [c.name for c in both.tool_calls]) == (None, ["note", "book"])
    assert read_response(ModelResponse(text=HERMES), "auto", frozenset()).text == HERMES  # no tools offered


# -- streaming: the chunks shown add up to the final text, and hold no call ---------------------------

REPLIES = [
    HERMES,
    f"Let me book that.\n{HERMES}\nOne moment.",
    f"  {HERMES}  ",
    'Booking now.\n```json\n{"name": "book", "arguments": {"seat": "3C"}}\n```',
    '{"name": "book", "parameters": {"seat": "4D"}}',
    '{"name": "fly", "arguments": {}}',  # not offered under auto: text, shown at the end
    "Plain text with {braces}, `ticks`, <b>tags</b> and a ```python\nprint(1)\n``` block.",
    "Ends with a half tag <tool_",
    f"On it. \n\n{HERMES}\n\nDone. ",
    f"Inline {HERMES} then more",
    " \n Paragraphs.\n\nNo call here.\n",
    'Two: <tool_call>{"name": "note", "arguments": {}}</tool_call> and {"name": "book", "arguments": {"seat": "1"}}',
]


def stream(chunks: list[str], mode: str = "auto") -> tuple[list[str], str | None]:
    """What the user is shown of a streamed reply cut in `chunks`, and the answer's final text."""
    shown: list[str] = []

    async def run() -> str | None:
        async def show(chunk: str) -> None:
            shown.append(chunk)
        held = HeldBack(show)
        for chunk in chunks:
            await held.send(chunk)
        text = read_response(ModelResponse(text="".join(chunks)), mode, OFFERED).text
        await held.finish(text)
        return text

    return shown, asyncio.run(run())


@pytest.mark.parametrize("reply", REPLIES)
def test_a_streamed_reply_shows_its_final_text_and_never_a_call(reply):
    final = read_response(ModelResponse(text=reply), "auto", OFFERED).text
    cuts = [[reply[:i], reply[i:]] for i in range(len(reply) + 1)] + [list(reply)]
    for chunks in cuts:
        shown, text = stream(chunks)
        assert text == final
        assert "".join(shown) == (final or ""), chunks
        calls = read_calls(reply, "auto", OFFERED)[0]
        if calls:
            assert not any("tool_call" in c or '"arguments"' in c or '"parameters"' in c for c in shown), chunks


def test_text_before_a_call_is_streamed_as_it_comes():
    shown, _ = stream(["Let me ", "book that.", "\n<tool_", 'call>{"name": "book", ', '"arguments": {}}</tool_call>'])
    assert shown[:2] == ["Let me ", "book that."]  # as they came: only the line break before the call waits


# -- in a turn --------------------------------------------------------------------------------------

def test_a_text_call_books_and_the_user_never_sees_it(bot):
    model = ScriptedModel([{"text": f"On it.\n{HERMES}"}, {"text": "Seat 12A is yours."}])
    s = bot.session(model=model)
    events = s.chat("Book me 12A")
    assert kinds(events) == [("Message", "On it."), ("Message", "Seat 12A is yours.")]
    assert s.state["booked"] == ["12A"]
    second = model.requests[1].messages
    assert [m.role for m in second[-2:]] == ["assistant", "tool"]
    assert second[-2].tool_calls[0].name == "book" and second[-2].content == "On it."
    assert second[-1].content == "Booked seat 12A."


def test_a_broken_block_is_refused_to_the_model_never_shown(bot):
    model = ScriptedModel([{"text": '<tool_call>{"name": "book", "arguments": {"seat": 12A}}</tool_call>'},
                           {"text": "<tool_call>{oops</tool_call>"}, {"text": "Which seat again?"}])
    s = bot.session(model=model)
    events = s.chat("Book me 12A")
    assert kinds(events) == [("Message", "Which seat again?")]
    assert s.state["booked"] == []
    refusals = [m.content for r in model.requests[1:] for m in r.messages[-1:]]
    assert refusals[0].startswith("Error: the arguments of book are not valid JSON")
    assert refusals[1].startswith("Error: this tool call names no tool") and "Tools you can call: book, note" in \
        refusals[1]


@pytest.mark.parametrize("form", ["tag", "fenced", "bare"])
def test_the_unruly_models_calls_written_as_text_run(bot, form):
    book = {"name": "book", "arguments": {"seat": "9C"}}
    model = ScriptedModel([Unruly("as_text", tool_calls=[book, {"name": "note"}], text="On it.", format=form),
                           {"text": "Done."}])
    s = bot.session(model=model)
    assert kinds(s.chat("9C please")) == [("Message", "On it."), ("Message", "Done.")]
    assert (s.state["booked"], s.state["notes"]) == (["9C"], 1)


def test_native_mode_shows_the_text_as_it_is(bot):
    model = ScriptedModel([{"text": HERMES}])
    s = bot.session(route="plain", model=model)
    assert kinds(s.chat("hi")) == [("Message", HERMES)]
    assert s.state["booked"] == []


# -- through the openai client and the fake server ----------------------------------------------------

@pytest.mark.parametrize("streamed", [True, False])
def test_a_hermes_style_endpoint_books_streamed_or_not(bot, fake, streamed):
    s = bot.session()
    s.bot.config.model.stream = streamed  # the bot's model block: `stream: true | false`
    fake.queue({"chunks": ["Sure, ", "booking.\n<tool", '_call>\n{"name": "book", ', '"arguments": {"seat": "12A"}}',
                           "\n</tool_call>"]},
               {"text": "Seat 12A is yours."})
    events = s.chat("Book me 12A")
    assert s.state["booked"] == ["12A"]
    assert kinds(events) == [("Message", "Sure, booking."), ("Message", "Seat 12A is yours.")]
    chunks = [e.data for e in events if e.type == "Stream"]
    assert "".join(chunks) == ("Sure, booking.Seat 12A is yours." if streamed else "")
    assert all("tool_call" not in c and "{" not in c for c in chunks)
    first, second = fake.requests
    assert first.get("stream", False) is streamed
    assistant, result = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"] == {"name": "book", "arguments": '{"seat": "12A"}'}
    assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "Booked seat 12A."}


def test_tool_choice_is_sent_and_lifted_once_the_model_called(bot, fake):
    s = bot.session(route="strict")
    fake.queue({"tool_calls": [{"name": "book", "arguments": {"seat": "2B"}}]}, {"text": "Done."})
    s.chat("2B please")
    forced, after = fake.requests
    assert forced["tool_choice"] == {"type": "function", "function": {"name": "book"}}
    assert "tool_choice" not in after  # else the model could never answer
    s = bot.session(route="any")
    fake.queue({"tool_calls": [{"name": "note", "arguments": {}}]}, {"text": "Noted."})
    s.chat("note it")
    assert [r.get("tool_choice") for r in fake.requests[2:]] == ["required", None]
    s = bot.session()
    fake.queue({"text": "Hello."})
    s.chat("hi")
    assert "tool_choice" not in fake.requests[-1]  # not said: not sent


# -- validation -------------------------------------------------------------------------------------

def test_tool_choice_names_a_tool_of_the_route(write_bot):
    assert check_bot(write_bot(BOT))[1] == []
    bad = BOT.replace("tool_choice: book", "tool_choice: bok")
    errors = [d for d in check_bot(write_bot(bad))[1] if d.severity == "error"]
    assert len(errors) == 1
    assert "`tool_choice` of route `strict` is `bok`" in errors[0].message and "did you mean `book`" in \
        errors[0].message
    assert errors[0].line == bad.splitlines().index("    tool_choice: bok") + 1
    wrong = BOT.replace("model: {tool_calls: native}", "model: {tool_calls: json}")
    assert any("tool_calls" in d.message for d in check_bot(write_bot(wrong))[1] if d.severity == "error")


def test_an_output_shaped_like_a_call_is_warned_about(write_bot):
    pick = ("  pick:\n    entry: true\n    system: Pick.\n    tools: [note]\n    output:\n"
            "      schema: {type: object, properties: {name: {type: string}, arguments: {type: object}}}\n")
    text = BOT.replace("tools:\n  book:", pick + "tools:\n  book:")
    warnings = [d.message for d in check_bot(write_bot(text))[1] if d.severity == "warning"]
    assert any("the `output` of route `pick` has `name` and `arguments`" in w for w in warnings), warnings
    native = text.replace("    tools: [note]\n    output:", "    tools: [note]\n    model: {tool_calls: native}\n"
                          "    output:")
    assert not any("`pick`" in d.message for d in check_bot(write_bot(native))[1])


@pytest.mark.parametrize("chunks, shown", [
    (["Sure, ", "booking.\n<tool", '_call>\n{"name": "book", '], "Sure, booking."),  # text, then a call cut off
    (['<tool_call>\n{"name": "book", '], ""),                                        # only a call, cut off
])
def test_a_stream_cut_off_while_a_call_is_held_back_shows_nothing_of_it_and_leaves_nothing_behind(
        bot, fake, chunks, shown):
    """The connection drops while HeldBack holds what may be a call: the user has seen only the
    text before it; the call is neither run nor shown; the failed answer is not retried once a
    chunk reached the streaming path (a retry could repeat shown text); and the held text does not
    leak into the next answer's stream."""
    s = bot.session()
    s.bot.config.model.stream = True
    fake.queue({"chunks": chunks, "disconnect": True}, {"chunks": ["Hello ", "again."]})
    events = s.chat("Book me 12A")
    streamed = "".join(e.data for e in events if e.type == "Stream")
    assert streamed == shown and "{" not in streamed and "tool_call" not in streamed
    assert [e.type for e in events if e.type != "Stream"] == ["Error"]
    assert s.state["booked"] == [] and len(fake.requests) == 1
    events = s.chat("hi")
    assert "".join(e.data for e in events if e.type == "Stream") == "Hello again."
    assert kinds(events) == [("Message", "Hello again.")]
