"""Refusals instead of crashes (issue 9, section 2): a handler refuses with ToolRefusal, a tool
declares its handler's failure with `on_error:`, only an undeclared failure fails the turn,
users never see file paths or exception names, handlers run with a timeout (sync ones in a
worker thread), and tool arguments are checked with JSON Schema `format`."""

from __future__ import annotations

import threading

import pytest

import chatrun
from chat_support import call, kinds
from chatrun.models.scripted import ScriptedModel

BOT = """
name: desk
state: {verified: false, attempts: 0}

routes:
  main:
    default: true
    tools: [start, when, contact]
  booking:
    scope: {local: {reservation: {nights: null}}}
    tools: [set_nights, book, flaky, crash, slow, slow_async, threaded, cancel]
tools:
  start: {action: {push: booking}}
  set_nights:
    parameters: {type: object, properties: {nights: {type: integer}}, required: [nights]}
    action: {set: {scope.reservation.nights: "{{ args.nights }}"}}
  book:
    handler: desk_tools:verify_and_book
    action:
      set: {state.verified: true}
      pop: true
      message: "Booked: {{ result.code }}"
  flaky:
    handler: desk_tools:flaky
    on_error:
      message: Sorry, the booking service is down. Please try again later.
      reply: "The booking service failed ({{ error }}). Apologise; do not retry."
  crash:
    handler: desk_tools:flaky
    action: {pop: true}
  slow:
    handler: desk_tools:slow
    timeout: 0.2
    on_error: {message: That took too long.}
  slow_async:
    handler: desk_tools:slow_async
    timeout: 0.2
    on_error: {}
  threaded:
    handler: desk_tools:threaded
  cancel: {action: {pop: true}}
  when:
    parameters:
      type: object
      properties:
        day: {type: string, format: date}
        at: {type: string, format: date-time}
      required: [day]
    action: {message: "ok {{ args.day }}"}
  contact:
    parameters:
      type: object
      properties:
        email: {type: string, format: email}
        site: {type: string, format: uri}
    action: {message: ok}
"""

TOOLS = """
import asyncio, threading, time
import chatrun

released = threading.Event()

def verify_and_book(ctx):
    ctx.state["attempts"] += 1          # dropped when the handler refuses
    nights = ctx.scope["reservation"]["nights"]
    if not nights or nights > 14:
        raise chatrun.ToolRefusal(f"Error: cannot book {nights} nights; ask for 1 to 14 nights.")
    return {"code": "BK-1"}

def flaky(ctx):
    ctx.state["attempts"] = 99
    raise ConnectionError("booking.internal:8443 refused the connection")

def slow(ctx):
    time.sleep(1.0)
    ctx.state["attempts"] = 42           # after the timeout: written to a copy nobody reads
    return "late"

async def slow_async(ctx):
    await asyncio.sleep(5)

def threaded(ctx):
    ctx.emit("Thinking", "waiting for the loop")
    # Only a loop that keeps running while this blocks can set it: a sync handler on the
    # event loop itself would wait here until the timeout.
    if not released.wait(3):
        raise RuntimeError("the event loop was blocked")
    return threading.current_thread().name
"""


@pytest.fixture
def desk(write_bot):
    return chatrun.load_bot(write_bot(BOT, extra={"desk_tools.py": TOOLS}))


def in_booking(desk, *responses):
    s = desk.session(model=ScriptedModel([call("start"), *responses]))
    s.chat("book")
    assert s.stack == ["main", "booking"]
    return s


def test_a_refusing_handler_applies_nothing_and_the_model_reads_why(desk):
    s = in_booking(desk, call("set_nights", nights=30), call("book"), {"text": "How many nights, 1 to 14?"})
    events = s.chat("30 nights")
    assert kinds(events) == [("Message", "How many nights, 1 to 14?")]
    assert s.stack == ["main", "booking"]  # no pop
    assert s.state == {"verified": False, "attempts": 0}  # no set, and the handler's write dropped
    assert s.memory()[-2].content == "Error: cannot book 30 nights; ask for 1 to 14 nights."

    s._model = ScriptedModel([call("set_nights", nights=3), call("book")])
    events = s.chat("3 then")
    assert ("Message", "Booked: BK-1") in kinds(events)
    assert s.stack == ["main"] and s.state == {"verified": True, "attempts": 1}


def test_a_refusal_reaches_the_model_through_the_openai_client(desk, fake):
    s = desk.session()
    fake.queue(call("start"))
    s.chat("book")
    fake.queue(call("book"), {"text": "How many nights?"})
    s.chat("book it")
    tool_message = fake.requests[-1]["messages"][-1]
    assert tool_message == {"role": "tool", "tool_call_id": tool_message["tool_call_id"],
                            "content": "Error: cannot book None nights; ask for 1 to 14 nights."}
    assert s.stack == ["main", "booking"] and s.state["attempts"] == 0


def test_on_error_tells_the_user_and_the_model_and_the_turn_goes_on(desk):
    s = in_booking(desk, call("flaky"), {"text": "Sorry about that."})
    events = s.chat("go")
    assert [t for t, _ in kinds(events)] == ["Console", "Message", "Message"]
    console, message, answer = kinds(events)
    assert "booking.internal:8443" in console[1] and "ConnectionError" in console[1]  # for the author
    assert message == ("Message", "Sorry, the booking service is down. Please try again later.")
    assert answer == ("Message", "Sorry about that.")
    assert s.memory()[-2].content == ("The booking service failed (booking.internal:8443 refused the connection). "
                                      "Apologise; do not retry.")
    assert s.state["attempts"] == 0 and s.history[-1]["ok"] is True


def test_an_undeclared_failure_fails_the_turn_with_a_safe_text(desk, fake):
    s = desk.session()
    fake.queue(call("start"))
    s.chat("book")
    before = s.snapshot()
    fake.queue(call("crash"))
    events = s.chat("go")
    error = events[-1]
    assert error.type == "Error" and error.data == chatrun.events.TURN_FAILED_TEXT
    for secret in ("bot.yaml", "/", "ConnectionError", "desk_tools", "8443"):
        assert secret not in error.data
    detail = error.meta["detail"]
    assert "tool crash (" in detail and "bot.yaml:" in detail and "raised ConnectionError" in detail
    assert s.history[-1]["ok"] is False and s.history[-1]["error"] == detail
    assert s.snapshot()["scopes"] == before["scopes"] and s.state == before["state"]


def test_a_slow_sync_handler_times_out_into_on_error(desk):
    s = in_booking(desk, call("slow"), {"text": "Let us try something else."})
    events = s.chat("go")
    assert ("Message", "That took too long.") in kinds(events)
    assert s.memory()[-2].content == "Error: slow failed: it took longer than 0.2 seconds. Nothing was done."
    assert s.state["attempts"] == 0


def test_a_slow_async_handler_times_out_too(desk):
    s = in_booking(desk, call("slow_async"), {"text": "ok"})
    s.chat("go")
    assert s.memory()[-2].content == "Error: slow_async failed: it took longer than 0.2 seconds. Nothing was done."


def test_sync_handler_does_not_block_the_event_loop(desk):
    import asyncio

    s = in_booking(desk, call("threaded"), {"text": "done"})
    module = desk.tools.runtime("handler").resolver.resolve("desk_tools:threaded").__globals__

    async def main():
        async def release():
            await asyncio.sleep(0.05)
            module["released"].set()

        releaser = asyncio.create_task(release())
        events = await s.achat("go")
        await releaser
        return events

    events = asyncio.run(main())
    assert kinds(events)[0] == ("Thinking", "waiting for the loop")  # ctx.emit from the thread
    assert s.memory()[-2].content != threading.main_thread().name
    assert s.history[-1]["ok"] is True


@pytest.mark.parametrize("args, problem", [
    ({"day": "July 3rd"}, "day: 'July 3rd' is not a 'date'"),
    ({"day": "2026-02-30"}, "day: '2026-02-30' is not a 'date'"),
    ({"day": "2026-07-03", "at": "2026-07-03 10am"}, "at: '2026-07-03 10am' is not a 'date-time'"),
])
def test_date_formats_are_checked(desk, args, problem):
    s = desk.session(model=ScriptedModel([call("when", **args), {"text": "Which day?"}]))
    s.chat("book a day")
    assert s.memory()[-2].content == f"Error: invalid arguments for when: {problem}. Call it again with valid arguments."


def test_valid_formats_pass(desk):
    s = desk.session(model=ScriptedModel([
        call("when", day="2026-07-03", at="2026-07-03T10:00:00+02:00"),
        call("contact", email="ana@example.org", site="https://example.org/a?b=c"),
        {"text": "ok"},
    ]))
    events = s.chat("go")
    assert kinds(events) == [("Message", "ok 2026-07-03"), ("Message", "ok"), ("Message", "ok")]


def test_email_and_uri_formats_are_checked(desk):
    s = desk.session(model=ScriptedModel([call("contact", email="ana at example", site="not a uri"), {"text": "?"}]))
    s.chat("go")
    assert s.memory()[-2].content == ("Error: invalid arguments for contact: email: 'ana at example' is not a 'email'; "
                                      "site: 'not a uri' is not a 'uri'. Call it again with valid arguments.")
