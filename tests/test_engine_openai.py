"""The travel bot end to end through the real `openai` client against the local fake
OpenAI server: what the server received per route, and what the session became."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import chatrun

TRAVEL = Path(__file__).resolve().parents[1] / "bots" / "travel"


def tool(name, **args):
    return {"tool_calls": [{"name": name, "arguments": args}]}


def offered(body):
    return [t["function"]["name"] for t in body.get("tools", [])]


def test_travel_booking_end_to_end(fake):
    bot = chatrun.load_bot(TRAVEL)
    routes = bot.config.routes
    session = bot.session()
    fake.queue(
        tool("book_flight"),  # main_menu: push flight, execute, immediate
        tool("set_destination", destination="Ireland"),
        {"text": "When do you leave, when do you come back, and which class?"},
    )
    events = session.chat("I want to book a flight to Ireland in July")
    assert session.stack == ["main_menu", "flight"]
    assert ("Message", "When do you leave, when do you come back, and which class?") in [(e.type, e.data) for e in events]
    first, second, third = fake.requests
    assert offered(first) == routes["main_menu"].tools
    assert offered(second) == routes["flight"].tools
    assert first["messages"][0]["role"] == "system" and second["messages"][0]["role"] == "system"
    assert first["messages"][0]["content"] != second["messages"][0]["content"]
    assert second["messages"][-2] == {"role": "user", "content": "I want to book a flight to Ireland in July"}
    assert "Ireland" in third["messages"][-1]["content"]  # the wizard's context shows the reservation so far
    assert third["messages"][-3]["role"] == "assistant" and third["messages"][-2]["role"] == "tool"

    # book refuses while the reservation is incomplete
    fake.queue(tool("book"), {"text": "I still need your dates and class."})
    session.chat("Just book it")
    refusal = fake.requests[-1]["messages"][-2]  # the context follows it
    assert refusal["role"] == "tool" and "not set" in refusal["content"]
    assert session.stack == ["main_menu", "flight"]

    fake.queue(
        {"tool_calls": [
            {"name": "set_departure", "arguments": {"date": "2026-07-03"}},
            {"name": "set_return_date", "arguments": {"date": "2026-07-17"}},
            {"name": "set_ticket_class", "arguments": {"ticket_class": "economy"}},
        ]},
        tool("book"),  # pops back to main_menu; without execute the turn ends there
    )
    flight_scope = session.scopes[-1]
    events = session.chat("3 to 17 July, economy")
    assert session.stack == ["main_menu"]
    assert any(e.type == "Message" and "Ireland" in e.data for e in events)
    # the flight scope is gone: its local state and its memory
    assert "reservation" not in session.visible_state()["scope"]
    assert not any(mid.startswith(flight_scope.id) for mid in session.memories())
    # the next message goes to main_menu, whose memory holds the wizard's result
    fake.queue({"text": "Anything else?"})
    session.chat("thanks")
    last = fake.requests[-1]
    assert offered(last) == routes["main_menu"].tools
    assert last["messages"][0]["role"] == "system"
    # ... as a tool result (the answer to a call `returned_from_flight` the runtime wrote), never as
    # words of the assistant's own that the model could imitate
    assert not any(m["role"] == "assistant" and "Booked flight" in (m["content"] or "") for m in last["messages"])
    at = next(i for i, m in enumerate(last["messages"]) if m["role"] == "tool" and m["content"].startswith("Booked flight"))
    call = last["messages"][at - 1]
    assert call["role"] == "assistant" and call["content"] is None
    assert [(c["id"], c["function"]["name"]) for c in call["tool_calls"]] == [(last["messages"][at]["tool_call_id"],
                                                                             "returned_from_flight")]
    session.close()



@pytest.mark.subprocess
def test_a_script_that_never_closes_its_session_exits_quietly(fake, tmp_path):
    # The plainest library use: chat, then let the interpreter end. The session's private loop
    # must still be shut down cleanly, or Python prints "Task was destroyed but it is pending!".
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import chatrun
        session = chatrun.load_bot({str(TRAVEL)!r}).session()
        for text in ("hello", "again"):
            print([e.data for e in session.chat(text) if e.type == "Message"])
    """))
    fake.responder = lambda body: {"chunks": ["Hi ", "there"]}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTHONPATH": str(TRAVEL.parents[1] / "runner")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['Hi there']", "['Hi there']"]
    assert done.stderr == ""
