"""The engine through the session API, with the scripted model: scopes, routes,
tool actions, memories, atomic turns, persistence."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

import chatrun
from chat_support import call, kinds
from chatrun.errors import SessionError, UnknownRouteError
from chatrun.messages import (
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.models.scripted import ScriptedModel
from chatrun.store.sqlite import SQLiteStore

TRAVEL = """
name: travel
model: {provider: scripted, name: gpt-4o-mini}
memory: {type: message_window, max_messages: 50}
state: {traveller_name: null}
routes:
  main_menu:
    default: true
    system: 'You are a travel agent. Help {{ state.traveller_name or "the user" }}.'
    tools: [book_flight, set_name, pop_here, talk_to_agent, forget_later, keep_memory]
  flight:
    system: 'Airline. Reservation so far: {{ scope.reservation | tojson }}'
    scope:
      local: {reservation: {departure: null, destination: null}}
    tools: [set_destination, set_departure, book, cancel, loop_forever, explode, quit, abort]
  agent:
    system: 'Human agent desk.'
    roles: [staff]
    tools: []
tools:
  book_flight:
    description: Book a flight
    action: {clear_memory: true, push: flight, execute: true, immediate: true}
  set_name:
    description: Remember the traveller's name
    parameters: {type: object, properties: {name: {type: string}}, required: [name]}
    action: {set: {state.traveller_name: '{{ args.name }}'}}
  pop_here:
    description: Pop (invalid at the root)
    action: {pop: true}
  talk_to_agent:
    description: Go to the agent desk
    action: {route: agent}
  forget_later:
    description: Wipe memory at the end of the turn
    action: {wipe: schedule}
  keep_memory:
    description: Abort a scheduled wipe
    action: {wipe: abort}
  set_destination:
    description: Specify the destination
    parameters: {type: object, properties: {destination: {type: string}}, required: [destination]}
    action:
      set: {scope.reservation.destination: '{{ args.destination }}'}
      emit: {Thinking: 'Destination set to {{ args.destination }}'}
  set_departure:
    description: Specify the departure date
    parameters: {type: object, properties: {date: {type: string}}, required: [date]}
    action: {set: {scope.reservation.departure: '{{ args.date }}'}}
  book:
    description: Book it
    requires: [scope.reservation.departure, scope.reservation.destination]
    handler: tools_mod:make_booking
    action:
      pop: true
      message: 'Your flight to {{ scope.reservation.destination }} is booked ({{ result }}).'
      result: 'Booked flight {{ result }} to {{ scope.reservation.destination }}'
  cancel:
    description: Abandon
    action: {pop: true}
  loop_forever:
    description: Re-executes itself
    action: {route: flight, execute: true}
  explode:
    description: A handler that raises
    handler: tools_mod:explode
  quit:
    description: A handler that calls sys.exit
    handler: tools_mod:leave
  abort:
    description: A handler that raises a BaseException
    handler: tools_mod:abort
"""

TOOLS_MOD = """
def make_booking(ctx):
    ctx.emit("Console", "booking " + ctx.scope["reservation"]["destination"])
    return "XY123"

def leave(ctx):
    raise SystemExit(3)

class Abort(BaseException):
    pass

def abort(ctx):
    ctx.state["traveller_name"] = "half-done"
    raise Abort("operator abort")

def explode(ctx):
    ctx.state["traveller_name"] = "changed before the crash"
    raise RuntimeError("payment service down")
"""


@pytest.fixture
def travel(write_bot):
    return chatrun.load_bot(write_bot(TRAVEL, extra={"tools_mod.py": TOOLS_MOD}))


def test_hello_turn_reply_and_memory(travel):
    model = ScriptedModel([{"text": "Hi! Where to?"}])
    s = travel.session(model=model)
    events = s.chat("hello")
    assert kinds(events) == [("Message", "Hi! Where to?")]
    assert all(e.turn == 1 for e in events)
    assert s.memory() == [
        SystemMessage("You are a travel agent. Help the user."),
        UserMessage("hello"),
        AssistantMessage("Hi! Where to?"),
    ]
    sent = model.requests[0]
    assert [t["function"]["name"] for t in sent.tools] == travel.config.routes["main_menu"].tools
    assert sent.messages[0] == SystemMessage("You are a travel agent. Help the user.")


def test_main_menu_push_execute_immediate_then_wizard(travel):
    model = ScriptedModel([
        call("book_flight"),
        call("set_destination", destination="Ireland"),
        {"text": "When do you want to leave?"},
    ])
    s = travel.session(model=model)
    events = s.chat("I want to book a flight to Ireland in July")
    assert kinds(events) == [
        ("RouteChanged", {"route": "flight", "stack": ["main_menu", "flight"]}),
        ("Thinking", "Destination set to Ireland"),
        ("Message", "When do you want to leave?"),
    ]
    assert s.stack == ["main_menu", "flight"]
    # execute: the flight route got the same user message, with its own system prompt and tools only
    second = model.requests[1]
    assert second.messages == [
        SystemMessage('Airline. Reservation so far: {"departure": null, "destination": null}'),
        UserMessage("I want to book a flight to Ireland in July"),
    ]
    assert [t["function"]["name"] for t in second.tools] == travel.config.routes["flight"].tools
    # the system prompt is rendered again before each call, so the model sees the setter's effect
    assert model.requests[2].messages[0].content.endswith('{"departure": null, "destination": "Ireland"}')
    # clear_memory emptied main_menu's memory, and the book_flight result was not left as an orphan
    assert s.memory(s.scopes[0].id) == []
    assert s.visible_state()["scope"]["reservation"]["destination"] == "Ireland"
    assert len(model.requests) == 3  # immediate: the book_flight result never went back to main_menu


def test_memory_ids_are_scope_and_route(travel):
    s = travel.session(model=ScriptedModel([call("book_flight"), {"text": "ok"}]))
    s.chat("fly")
    root, nested = s.scopes
    assert set(s.memories()) == {f"{root.id}#main_menu", f"{nested.id}#flight"}
    assert root.id != nested.id


def test_requires_refuses_incomplete_booking_then_books_and_pops(travel, tmp_path):
    model = ScriptedModel([
        call("book_flight"),
        call("set_destination", destination="Ireland"),
        {"text": "When?"},
        call("book"),
        {"text": "I still need the departure date."},
        call("set_departure", date="2026-07-01"),
        call("book"),
    ])
    s = travel.session(model=model)
    s.chat("flight to Ireland")
    flight_scope = s.scopes[-1]
    events = s.chat("book it")
    refusal = model.requests[4].messages[-1]
    assert isinstance(refusal, ToolResultMessage)
    assert "scope.reservation.departure" in refusal.content and "not set" in refusal.content
    assert s.stack == ["main_menu", "flight"]
    assert kinds(events) == [("Message", "I still need the departure date.")]

    events = s.chat("July 1st, and book")
    assert kinds(events) == [
        ("Console", "booking Ireland"),
        ("Message", "Your flight to Ireland is booked (XY123)."),
        ("RouteChanged", {"route": "main_menu", "stack": ["main_menu"]}),
    ]
    assert s.stack == ["main_menu"]
    # the nested scope's state and memory are gone, in the session and in the store
    assert "reservation" not in s.visible_state()["scope"]
    assert flight_scope.memory_id("flight") not in s.memories()
    assert s.store.get_messages(flight_scope.memory_id("flight")) == []
    # pop's result was handed to main_menu's memory as the result of a call the runtime wrote, never
    # in the assistant's own voice; without execute the turn ends with the pop
    returned = ToolCall("call_returned_2", "returned_from_flight", "{}")
    assert s.memory()[-2:] == [AssistantMessage(None, (returned,)),
                               ToolResultMessage("call_returned_2", "returned_from_flight", "Booked flight XY123 to Ireland")]
    assert model.remaining == 0


def test_tool_calls_after_a_route_change_are_answered_not_run(travel):
    model = ScriptedModel([
        {"tool_calls": [
            {"name": "set_name", "arguments": {"name": "Ana"}},
            {"name": "talk_to_agent", "arguments": {}},
            {"name": "set_name", "arguments": {"name": "Bob"}},
        ]},
        {"text": "agent here"},
    ])
    s = travel.session(model=model)
    s.chat("agent please")
    assert s.stack == ["agent"]  # route change: same scope, no nesting
    assert s.state["traveller_name"] == "Ana"
    results = [m for m in s.memory(route="main_menu") if isinstance(m, ToolResultMessage)]
    assert len(results) == 3
    assert results[2].content.startswith("Not run")
    # the route change ended main_menu's loop: no further model call on it
    assert len(model.requests) == 1


def test_roles_forbid_entering_a_route(travel):
    model = ScriptedModel([call("talk_to_agent"), {"text": "Sorry, I can't do that."}])
    s = travel.session(model=model, roles={"customer"})
    events = s.chat("agent please")
    assert s.stack == ["main_menu"]
    assert [e.type for e in events if e.type != "Stream"] == ["Error", "Message"]
    assert "not allowed" in events[0].data
    assert "not allowed" in model.requests[1].messages[-1].content
    with pytest.raises(SessionError):
        travel.session(route="agent", roles={"customer"})
    assert travel.session(route="agent", roles={"staff"}).stack == ["agent"]


def test_pop_at_root_is_an_error_and_changes_nothing(travel):
    model = ScriptedModel([call("pop_here"), {"text": "Can't go back from here."}])
    s = travel.session(model=model)
    events = s.chat("go back")
    assert [e.type for e in events if e.type != "Stream"] == ["Error", "Message"]
    assert "root scope" in events[0].data
    assert s.stack == ["main_menu"]


def test_bad_tool_calls_become_tool_results(travel):
    model = ScriptedModel([
        {"tool_calls": [
            {"name": "set_name", "arguments": "{not json"},
            {"name": "set_name", "arguments": {"nom": "Ana"}},
            {"name": "set_destination", "arguments": {"destination": "X"}},
            {"name": "no_such_tool", "arguments": {}},
        ]},
        {"text": "sorry"},
    ])
    s = travel.session(model=model)
    s.chat("hi")
    results = [m.content for m in model.requests[1].messages if isinstance(m, ToolResultMessage)]
    assert "not valid JSON" in results[0]
    assert "'name' is a required property" in results[1]
    assert "no tool 'set_destination'" in results[2]  # not offered on this route
    assert "no tool 'no_such_tool'" in results[3]
    assert s.state["traveller_name"] is None


def test_failed_turn_restores_everything(travel):
    model = ScriptedModel([
        call("book_flight"),
        call("set_destination", destination="Ireland"),
        {"error": "upstream 500"},
    ])
    s = travel.session(model=model)
    before = (s.snapshot(), s.memories())
    events = s.chat("flight to Ireland")
    assert events[-1].type == "Error" and "upstream 500" in events[-1].meta["detail"]
    assert events[-1].data == chatrun.events.MODEL_FAILED_TEXT  # what users see: no detail
    assert s.stack == ["main_menu"]
    after = s.snapshot()
    kept = lambda snap: {k: v for k, v in snap.items() if k not in ("updated", "usage")}  # noqa: E731
    assert kept(after) == kept(before[0])
    assert after["usage"]["calls"] > before[0]["usage"]["calls"]  # the failed turn's calls were made: they count
    assert s.memories() == before[1]
    assert s.turn_count == 0
    assert s.history[-1]["ok"] is False and "upstream 500" in s.history[-1]["error"]
    assert s.history[-1]["events"][-1]["type"] == "Error"
    assert s.last_turn == s.history[-1]
    # the user simply retries
    model.add(call("book_flight"), {"text": "Where to?"})
    assert kinds(s.chat("flight to Ireland"))[-1] == ("Message", "Where to?")
    assert s.turn_count == 1


def test_handler_exception_is_an_error_naming_the_tool(travel):
    model = ScriptedModel([call("book_flight"), call("explode")])
    s = travel.session(model=model)
    events = s.chat("go")
    assert events[-1].type == "Error"
    detail = events[-1].meta["detail"]
    assert "explode" in detail and "payment service down" in detail and "bot.yaml:" in detail
    # What users see names no file, exception or handler; the history keeps the detail.
    assert events[-1].data == chatrun.events.TURN_FAILED_TEXT
    assert s.history[-1]["error"] == detail
    assert s.state["traveller_name"] is None  # the handler's write was rolled back
    assert s.stack == ["main_menu"]


def test_hop_limit_stops_a_route_that_executes_itself(travel):
    model = ScriptedModel([call("book_flight")] + [call("loop_forever")] * 20)
    s = travel.session(model=model)
    events = s.chat("go")
    assert events[-1].type == "Error" and "max_hops" in events[-1].meta["detail"]
    assert s.stack == ["main_menu"]


def test_clear_memory_and_scheduled_wipe(travel):
    model = ScriptedModel([call("forget_later"), {"text": "noted"}])
    s = travel.session(model=model)
    s.chat("forget this at the end")
    assert s.memory() == []  # wiped at the end of the turn
    model.add({"tool_calls": [{"name": "forget_later", "arguments": {}}, {"name": "keep_memory", "arguments": {}}]},
              {"text": "kept"})
    s.chat("actually keep it")
    assert s.memory()[-1] == AssistantMessage("kept")


def test_streaming_yields_chunks_then_message(travel):
    model = ScriptedModel([{"chunks": ["Hel", "lo!"]}])
    s = travel.session(model=model)

    async def run():
        return [e async for e in s.stream("hi")]

    events = asyncio.run(run())
    assert [(e.type, e.data) for e in events] == [("Stream", "Hel"), ("Stream", "lo!"), ("Message", "Hello!")]


def test_handlers_per_event_type_and_default(travel):
    seen = []
    model = ScriptedModel([call("book_flight"), call("set_destination", destination="Rome"), {"text": "ok"}])
    s = travel.session(model=model)
    s.on("Message", lambda d: seen.append(("msg", d))).on_default(lambda t, d: seen.append((t, d)))
    s.chat("Rome")
    assert ("msg", "ok") in seen and ("Thinking", "Destination set to Rome") in seen
    assert ("RouteChanged", {"route": "flight", "stack": ["main_menu", "flight"]}) in seen


def test_structured_input(travel):
    model = ScriptedModel([{"text": "got it"}])
    s = travel.session(model=model)
    s.chat({"userMessage": "hello", "seat": "12A"})
    assert model.requests[0].messages[-1] == UserMessage("hello")
    model.add({"text": "data only"})
    s.chat({"seat": "14C"})
    assert model.requests[1].messages[-1] == UserMessage('{"seat": "14C"}')


def test_unknown_start_route(travel):
    with pytest.raises(UnknownRouteError, match="unknown route 'nowhere'"):
        travel.session(route="nowhere")


def test_sessions_resume_from_sqlite_with_everything(write_bot, tmp_path):
    path = write_bot(TRAVEL, extra={"tools_mod.py": TOOLS_MOD})
    db = tmp_path / "sessions.db"
    model = ScriptedModel([call("book_flight"), call("set_destination", destination="Oslo"), {"text": "When?"}])
    first = chatrun.load_bot(path).session(store=SQLiteStore(str(db)), model=model)
    first.chat("Oslo")
    sid, memories, history = first.id, first.memories(), first.history

    again = chatrun.load_bot(path).session(store=SQLiteStore(str(db)), session_id=sid,
                                           model=ScriptedModel([{"text": "Noted."}]))
    assert again.stack == ["main_menu", "flight"]
    assert again.visible_state()["scope"]["reservation"]["destination"] == "Oslo"
    assert again.memories() == memories
    assert again.history == history
    again.chat("July")
    assert again.memory()[-1] == AssistantMessage("Noted.")
    again.close()
    assert SQLiteStore(str(db)).load_session(sid) is None


class StallingModel(ScriptedModel):
    """Streams one chunk on its second call, then never finishes (a model that hangs)."""

    async def complete(self, request, on_chunk=None):
        if len(self.requests) == 0:
            return await super().complete(request, on_chunk)
        self.requests.append(request)
        await on_chunk("Thinking about")
        await asyncio.sleep(3600)


def test_cancelled_turn_rolls_back(travel):
    s = travel.session(model=StallingModel([call("set_name", name="Ana")]))

    async def run_and_stop():
        stream = s.stream("hi, I'm Ana")
        async for event in stream:
            if event.type == "Stream":
                break  # the client goes away mid-turn
        await stream.aclose()

    asyncio.run(run_and_stop())
    assert s.state["traveller_name"] is None
    assert s.memory() == []
    assert s.history[-1]["error"] == "cancelled"
    assert s.turn_count == 0


def test_closed_session_refuses_turns(travel):
    s = travel.session(model=ScriptedModel([]))
    s.close()
    with pytest.raises(SessionError, match="closed"):
        s.chat("hi")


def test_preview_shows_what_the_model_will_be_sent_next(travel):
    model = ScriptedModel([call("book_flight"), {"text": "Where to?"}, call("cancel")])
    s = travel.session(model=model)
    assert s.preview_messages() == [SystemMessage("You are a travel agent. Help the user.")]
    s.chat("a flight")
    s.chat("no, cancel")
    # main_menu's memory was cleared by book_flight; the next call still leads with its system prompt
    assert s.memory() == []
    assert s.preview_messages() == [SystemMessage("You are a travel agent. Help the user.")]
    s.state["traveller_name"] = "Ana"
    assert s.preview_messages()[0] == SystemMessage("You are a travel agent. Help Ana.")


def test_event_data_is_plain_json_for_every_client(write_bot):
    path = write_bot("""
        name: odd
        model: {provider: scripted}
        routes:
          main: {default: true, system: hi, tools: [odd]}
        tools:
          odd: {description: emits odd data, handler: odd_mod:odd}
        """, extra={"odd_mod.py": """
def odd(ctx):
    ctx.emit("Object", {"tags": {"a"}, "pair": (1, 2), "x": float("nan")})
    return "ok"
"""})
    s = chatrun.load_bot(path).session(model=ScriptedModel([call("odd"), {"text": "done"}]))
    events = s.chat("go")
    assert events[0].to_dict()["data"] == {"tags": ["a"], "pair": [1, 2], "x": "NaN"}
    assert s.history[-1]["events"][0]["data"] == {"tags": ["a"], "pair": [1, 2], "x": "NaN"}


def test_a_handler_calling_sys_exit_fails_the_turn_not_the_process(travel):
    s = travel.session(model=ScriptedModel([call("book_flight"), call("quit")]))
    events = s.chat("go")
    assert events[-1].type == "Error" and "SystemExit" in events[-1].meta["detail"]
    assert "SystemExit" not in events[-1].data and "bot.yaml" not in events[-1].data
    assert s.stack == ["main_menu"]


def _sync_handler_turn(travel) -> str:
    """A turn whose sync handler runs in a worker thread of the loop's executor."""
    events = travel.session(model=ScriptedModel([call("book_flight"), call("quit")])).chat("go")
    return events[-1].meta["detail"]


@pytest.mark.slow
def test_a_forked_child_runs_sync_handlers_and_leaves_the_parents_loop_alone(travel):
    """`chatrun test -n N` forks workers from a process whose thread already ran sync turns: a
    child that used the parent's loop would queue its handler on an executor that counts an idle
    thread the child does not have, and wait forever (issue 26's shared loop)."""
    import os
    import select
    import signal

    assert "SystemExit" in _sync_handler_turn(travel)  # the parent's thread loop and its executor thread
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's exit handlers
        try:
            os.write(write_end, _sync_handler_turn(travel).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 60)
        reported = os.read(read_end, 4096).decode() if ready else "the child's handler never ran"
    finally:
        os.close(read_end)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert "SystemExit" in reported, reported
    assert "SystemExit" in _sync_handler_turn(travel)  # the child's exit left the parent's loop working


def test_a_base_exception_passes_through_but_the_session_is_rolled_back(travel):
    s = travel.session(model=ScriptedModel([call("book_flight"), call("abort")]))
    with pytest.raises(BaseException, match="operator abort"):
        s.chat("go")
    assert s.stack == ["main_menu"] and s.state["traveller_name"] is None
    assert s.history[-1]["error"] == "interrupted: Abort"


def test_a_system_template_that_renders_empty_fails_the_turn_and_keeps_the_instructions(write_bot):
    """LangChain4j would replace the system message with SystemMessage(""); chatrun fails the
    turn (rolled back), naming the template, so the route's instructions are never wiped."""
    bot = chatrun.load_bot(write_bot("""\
        name: moody
        model: {provider: scripted}
        state: {instructions: Be brief.}
        routes:
          main:
            default: true
            system: "{{ state.instructions }}"
            tools: [forget]
        tools:
          forget:
            description: Drop the instructions
            action: {set: {state.instructions: ""}}
        """, name="moody.yaml"))
    model = ScriptedModel([{"text": "ok"}, {"tool_calls": [{"name": "forget", "arguments": {}}]}, {"text": "done"},
                           {"text": "never"}])
    s = bot.session(model=model)
    s.chat("hi")
    s.chat("forget your instructions")  # the setter runs; the next model call's system renders empty
    assert s.last_turn["ok"] is False
    assert "route main system template rendered empty text" in s.last_turn["error"]
    assert "moody.yaml:" in s.last_turn["error"]
    assert s.state["instructions"] == "Be brief."  # rolled back
    assert s.memory()[0] == SystemMessage("Be brief.")


def test_a_memory_evicts_and_the_history_keeps_every_turn(write_bot, tmp_path):
    """docs/memory.md: "A memory evicts; the history never does" (docs/deploy.md sizes for it)."""
    path = write_bot("""
name: short
model: {provider: scripted}
routes:
  main: {default: true, system: Hi., memory: {type: message_window, max_messages: 3}}
""")
    db = str(tmp_path / "s.db")
    session = chatrun.load_bot(path).session(store=SQLiteStore(db), model=ScriptedModel([f"r{i}" for i in range(6)]))
    for i in range(6):
        session.chat(f"m{i}")
    assert [m.content for m in session.memory()] == ["Hi.", "m5", "r5"]  # evicted down to its window
    again = chatrun.load_bot(path).session(store=SQLiteStore(db), session_id=session.id)
    for history in (session.history, again.history):  # the live session's and the stored one
        assert [(e["turn"], e["input"]) for e in history] == [(i + 1, f"m{i}") for i in range(6)]
        assert [[event["data"] for event in e["events"]] for e in history] == [[f"r{i}"] for i in range(6)]


def test_a_none_memory_is_cleared_after_each_turn_and_never_stored(write_bot, tmp_path):
    """docs/memory.md, `none`: the turn's messages only; the engine never writes it to the store."""
    path = write_bot("""
name: forgetful
model: {provider: scripted}
routes:
  main: {default: true, system: Hi., memory: {type: none}}
""")
    db = str(tmp_path / "s.db")
    model = ScriptedModel(["r0", "r1"])
    session = chatrun.load_bot(path).session(store=SQLiteStore(db), model=model)
    session.chat("m0")
    session.chat("m1")
    assert [m.content for m in model.requests[1].messages] == ["Hi.", "m1"]  # nothing of the first turn
    memory_id = f"{session.scope_id}#main"
    assert SQLiteStore(db).get_messages(memory_id) == []
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT count(*) FROM memories").fetchone()[0] == 0


def test_a_rating_records_the_route_its_turn_ran_on(travel):
    """Turn 1 ran on main_menu, turn 2 pushed flight: a rating of turn 1 says main_menu (it said
    flight, where the session was when rated), read back from the history too."""
    s = travel.session(model=ScriptedModel([{"text": "Hello."},
                                            {"tool_calls": [{"name": "book_flight", "arguments": {}}]},
                                            {"text": "Where to?"}]))
    s.chat("hi")
    s.chat("book me a flight")
    assert s.route == "flight"
    assert s.rate(1, "down")["route"] == "main_menu"
    s.forget_last_turn()  # from the history, not the kept last turn
    assert s.rate(2, "up")["route"] == "flight"
    assert [e["feedback"]["route"] for e in s.history if "feedback" in e] == ["main_menu", "flight"]


def test_last_turn_is_the_last_turn_not_a_rating_or_a_notice_after_it(travel):
    """Session.last_turn is the last entry with `turn`: a rating or a notice committed after it
    is an entry of its own (it was history[-1], once the kept copy was forgotten)."""
    s = travel.session(model=ScriptedModel([{"text": "Hello."}]))
    s.notice("Sorry, your message is too long.", "over the limit")
    assert s.history[-1]["notice"]["why"] == "over the limit" and s.last_turn is None
    s.chat("hi")
    s.rate(1, "up")
    s.notice("Sorry, your message is too long.", "over the limit")
    s.forget_last_turn()
    assert "notice" in s.history[-1] and s.last_turn["turn"] == 1 and s.last_turn["input"] == "hi"
