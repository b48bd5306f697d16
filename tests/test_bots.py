"""The example bots in bots/: each validates clean, and each does what its README line says
when run through the real engine with a scripted model."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import chatrun
from chat_support import call, kinds
from chatrun.definition.loader import check_bot
from chatrun.models.scripted import ScriptedModel

BOTS = Path(__file__).resolve().parents[1] / "bots"
BOT_DIRS = sorted(p for p in BOTS.iterdir() if (p / "bot.yaml").is_file())


def test_the_example_bots_are_there():
    assert {p.name for p in BOT_DIRS} >= {"travel", "hello", "support"}


@pytest.mark.parametrize("bot_dir", BOT_DIRS, ids=lambda p: p.name)
def test_bot_validates_with_no_errors_and_no_warnings(bot_dir):
    config, diagnostics = check_bot(bot_dir)
    assert [d.format() for d in diagnostics] == []
    assert config is not None and config.name == bot_dir.name


@pytest.mark.parametrize("bot_dir", BOT_DIRS, ids=lambda p: p.name)
def test_every_yaml_file_names_its_schema_for_the_editor(bot_dir):
    for file in sorted(bot_dir.rglob("*.yaml")):
        if "transcripts" in file.relative_to(bot_dir).parts or file.name.endswith(".openapi.yaml"):
            continue  # transcripts name theirs (test_transcripts); an API's OpenAPI document is not chatrun's
        if file.parent.name == "locales":
            continue  # a text catalog (docs/i18n.md) is a plain mapping of keys to texts: no schema
        first = file.read_text().splitlines()[0]
        match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
        assert match, f"{file}: first line is {first!r}"
        target = (file.parent / match.group(1).split("#")[0]).resolve()
        assert target == (BOTS.parent / "schemas" / "bot.schema.json").resolve(), file


# -- travel ---------------------------------------------------------------------------


def _travel_tools():
    spec = importlib.util.spec_from_file_location("travel_tools_under_test", BOTS / "travel" / "travel_tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ctx(reservation):
    emitted = []
    ctx = SimpleNamespace(args={}, state={}, scope={"reservation": reservation},
                          emit=lambda type_, data: emitted.append((type_, data)))
    return ctx, emitted


RESERVATION = {"departure": "2026-07-01", "return_date": "2026-07-15", "destination": "Dublin",
               "ticket_class": "economy"}


def test_make_booking_returns_a_code_derived_from_the_reservation_and_emits_it():
    make_booking = _travel_tools().make_booking
    ctx, emitted = _ctx(dict(RESERVATION))
    code = make_booking(ctx)
    assert re.fullmatch(r"FL-[0-9A-F]{6}", code)
    assert emitted == [("Object", {"booking": code, **RESERVATION})]
    assert make_booking(_ctx(dict(RESERVATION))[0]) == code  # same reservation, same code
    assert make_booking(_ctx({**RESERVATION, "destination": "Cork"})[0]) != code


@pytest.fixture
def travel():
    return chatrun.load_bot(BOTS / "travel")


def test_travel_books_a_flight_through_the_wizard_and_pops_back(travel):
    model = ScriptedModel([
        call("set_name", name="Ana"),
        call("book_flight"),
        call("set_destination", destination="Dublin"),
        {"text": "When do you leave?"},
        {"tool_calls": [
            {"name": "set_departure", "arguments": {"date": "2026-07-01"}},
            {"name": "set_return_date", "arguments": {"date": "2026-07-15"}},
            {"name": "set_ticket_class", "arguments": {"ticket_class": "economy"}},
        ]},
        call("book"),
    ])
    s = travel.session(model=model)
    events = s.chat("I'm Ana, book me a flight to Dublin")
    assert s.stack == ["main_menu", "flight"]
    assert s.state["traveller_name"] == "Ana"
    # the destination is written to the flight scope's reservation and to the menu's shared trip
    assert s.visible_state()["scope"]["trip"] == {"destination": "Dublin"}
    assert ("Thinking", "Destination set to Dublin") in kinds(events)

    events = s.chat("July 1st to the 15th, economy, book it")
    code = _travel_tools().make_booking(_ctx(dict(RESERVATION))[0])
    assert kinds(events)[-3:] == [
        ("Object", {"booking": code, **RESERVATION}),
        ("Message", f"Your economy flight to Dublin is booked: {code}."),
        ("RouteChanged", {"route": "main_menu", "stack": ["main_menu"]}),
    ]
    assert s.stack == ["main_menu"]
    assert s.state["last_booking"] == f"flight {code}"
    assert "reservation" not in s.visible_state()["scope"]
    assert s.memory()[-1].content.startswith(f"Booked flight {code} to Dublin")


def test_travel_book_refuses_until_every_field_is_set(travel):
    model = ScriptedModel([call("book_flight"), call("book"), {"text": "I need your dates."}])
    s = travel.session(model=model)
    s.chat("book a flight")
    refusal = model.requests[2].messages[-2].content  # before the route's context, the last message
    for field in ("departure", "return_date", "destination", "ticket_class"):
        assert f"scope.reservation.{field}" in refusal
    assert s.stack == ["main_menu", "flight"]


def test_travel_switch_to_hotel_changes_route_in_the_same_scope_and_cancel_pops(travel):
    model = ScriptedModel([
        call("book_flight"),
        call("set_destination", destination="Lisbon"),
        call("switch_to_hotel"),
        {"text": "Which city? Lisbon?"},
        call("cancel"),
    ])
    s = travel.session(model=model)
    s.chat("flight to Lisbon... actually just a hotel")
    assert s.stack == ["main_menu", "hotel"]
    # the hotel's context reads the destination the flight wizard put in the menu's shared scope
    assert "flying to Lisbon" in model.requests[3].messages[-1].content
    events = s.chat("never mind")
    assert kinds(events) == [
        ("Message", "Booking abandoned."),
        ("RouteChanged", {"route": "main_menu", "stack": ["main_menu"]}),
    ]


# -- support --------------------------------------------------------------------------


@pytest.fixture
def support():
    return chatrun.load_bot(BOTS / "support")


def test_support_classifier_files_a_ticket_and_routes_back(support):
    model = ScriptedModel([
        call("file_ticket"),
        call("categorize", category="billing", summary="Charged twice in May."),
        {"text": "Ticket #1 is filed."},
    ])
    s = support.session(model=model, state={"customer_name": "Bo"})
    events = s.chat("I was charged twice in May")
    assert s.stack == ["helpdesk"]
    assert s.state["ticket_count"] == 1
    assert s.state["last_ticket"] == {"category": "billing", "summary": "Charged twice in May."}
    assert kinds(events)[-1] == ("Message", "Ticket #1 is filed.")
    # classify has no memory: it saw only its system prompt and the customer's message
    classify_request = model.requests[1]
    assert classify_request.route == "classify"
    assert [m.role for m in classify_request.messages] == ["system", "user"]
    # back on the helpdesk, the context knows the ticket was filed during this turn
    assert "Ticket #1 was just filed" in model.requests[2].messages[-1].content

    model.add({"text": "Anything else?"})
    s.chat("thanks")
    assert "was just filed" not in model.requests[3].messages[0].content  # turn state is gone


def test_support_staff_desk_needs_the_staff_role(support):
    customer = support.session(model=ScriptedModel([call("take_over"), {"text": "Only staff can do that."}]),
                               roles={"customer"})
    events = customer.chat("let me talk to a human")
    assert customer.stack == ["helpdesk"]
    assert any(e.type == "Error" and "not allowed" in str(e.data) for e in events)

    staff = support.session(model=ScriptedModel([call("take_over"), {"text": "Staff here."}, call("hand_back")]),
                            roles={"staff"})
    staff.chat("taking over")
    assert staff.stack == ["helpdesk", "staff_desk"]
    staff.chat("done")
    assert staff.stack == ["helpdesk"]


def test_hello_answers(tmp_path):
    bot = chatrun.load_bot(BOTS / "hello")
    s = bot.session(model=ScriptedModel([{"text": "Hi there!"}]))
    assert kinds(s.chat("hello")) == [("Message", "Hi there!")]
