"""Tab completion in `chatrun repl` (issue 15): slash commands, tool names after /call, route
names after /reset, roles after /roles, from the bot as it is now (after a reload, the new
bot's names). The logic as a function, then at a real terminal with the real readline."""

from __future__ import annotations

import pytest

from chatrun.cli._complete import Names, command_names, completions
from chatrun.cli.repl import COMMAND_NAMES, COMMANDS

NAMES = Names(COMMAND_NAMES, tools=["book_flight", "book_hotel", "cancel"], routes=["flight", "hotel", "main_menu"],
              roles=["customer", "staff"])


def test_every_command_of_the_help_completes_with_a_space_when_it_takes_an_argument():
    assert command_names(COMMANDS) == COMMAND_NAMES
    for name in ("/help", "/route", "/stack", "/state", "/memory", "/history", "/reload", "/quit"):
        assert name in COMMAND_NAMES
    for name in ("/say ", "/call ", "/save ", "/roles ", "/reset "):
        assert name in COMMAND_NAMES
    assert completions("/re", NAMES) == ["/reject ", "/reload", "/reset "]
    assert completions("/rol", NAMES) == ["/roles "]
    assert completions("/nothing", NAMES) == []
    assert completions("hello /re", NAMES) == []  # a message, not a command
    assert completions("", NAMES) == []


def test_call_completes_tool_names_and_only_its_first_argument():
    assert completions("/call book", NAMES) == ["book_flight ", "book_hotel "]
    assert completions("/call ", NAMES) == ["book_flight ", "book_hotel ", "cancel "]
    assert completions("/call  ca", NAMES) == ["cancel "]
    assert completions('/call book_flight {"to', NAMES) == []  # the JSON is the author's
    assert completions("/say book", NAMES) == []


def test_reset_completes_route_names_and_roles_complete_after_each_comma():
    assert completions("/reset h", NAMES) == ["hotel"]
    assert completions("/reset ", NAMES) == ["flight", "hotel", "main_menu"]
    assert completions("/reset hotel fl", NAMES) == []
    assert completions("/roles s", NAMES) == ["staff"]
    assert completions("/roles staff,c", NAMES) == ["customer"]
    assert completions("/route ma", NAMES) == []  # /route takes nothing


# -- at a terminal ----------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_tab_completes_tools_at_the_model_prompt_and_routes_of_the_reloaded_bot(term, tmp_path):
    folder = tmp_path / "bot"
    folder.mkdir()
    bot = (folder / "bot.yaml")
    bot.write_text("""\
name: tabs
model: {provider: openai, name: gpt-4o-mini}
routes:
  main: {default: true, system: Hi., tools: [book_flight]}
  flight: {system: Flights.}
tools:
  book_flight: {description: book a flight, action: {push: flight}}
""")
    t = term(str(folder), "--play-model")
    t.expect("main> ")
    t.send("a flight\r")
    t.expect("model> ")
    t.send("/call boo\t{}\r")  # Tab: "/call book_flight "
    t.expect("→ main > flight")  # the tool ran: the push ends the turn
    t.expect("main > flight> ")

    bot.write_text(bot.read_text().replace("flight: {system: Flights.}",
                                           "flight: {system: Flights.}\n  hotel_desk: {system: Hotels.}"))
    t.send("/rel\t\r")  # Tab: "/reload"
    t.expect("[reloaded tabs")
    t.expect("main > flight> ")
    t.send("/reset hot\t\r")  # Tab: a route only the reloaded bot has
    t.expect("new session")
    t.expect("hotel_desk> ")
    t.send("/route\r")
    assert t.expect("hotel_desk> ").strip().splitlines()[-1] == "hotel_desk"
    t.send("/quit\r")
    assert t.wait() == 0
    assert "unknown command" not in t.text and "error" not in t.text


def test_clock_completes_its_words_after_the_command():
    names = Names(COMMAND_NAMES, clock=["real", "+1h", "+1d", "2026-11-25T09:00"])
    assert "/clock " in COMMAND_NAMES
    assert completions("/clo", names) == ["/clock "]
    assert completions("/clock r", names) == ["real"]
    assert completions("/clock +", names) == ["+1d", "+1h"]
    assert completions("/clock 2026", names) == ["2026-11-25T09:00"]
    assert completions("/clock real x", names) == []


def test_decisions_complete_the_ids_of_pending_items_and_operator_its_words():
    names = Names(COMMAND_NAMES, items=["p1", "p2"])
    assert completions("/approve ", names) == ["p1 ", "p2 "]
    assert completions("/answer p", names) == ["p1 ", "p2 "]
    assert completions("/reject p1 ", names) == []  # the reason is free text
    assert completions("/operator re", names) == ["release "]
