"""Loading bots into config dataclasses: the brief's travel example field by field,
includes, names unique across files, positions kept for every object, YAML details."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from chatrun.definition.config import ActionConfig, Location, MemoryPolicy, ScopeConfig
from chatrun.definition.loader import load_config
from chatrun.definition.yamlpos import load_yaml
from chatrun.errors import BotError

REPO = Path(__file__).resolve().parents[1]

TRAVEL = """\
# yaml-language-server: $schema=../../schemas/bot.schema.json
name: travel
description: Books flights and hotels.
model: {provider: openai, name: gpt-4o-mini, temperature: 0.2}
memory: {type: token_window, max_tokens: 3000}
limits: {max_hops: 5, max_model_calls: 9}
state:
  traveller_name: null
routes:
  main_menu:
    default: true
    description: Top-level menu
    system: |
      You are a travel agent. Help the traveller.
    memory: {type: message_window, max_messages: 20}
    tools: [book_flight]
  flight:
    description: Flight booking wizard
    context: "Reservation so far: {{ scope.reservation | tojson }}"
    user: "[{{ data.page | default('chat') }}] {{ user_message }}"
    roles: [staff]
    model: {name: gpt-4o, temperature: 0}
    scope:
      local: {reservation: {departure: null, destination: null}}
      shared: {}
    tools: [set_destination, book, cancel]
tools:
  book_flight:
    description: Book a flight
    action: {clear_memory: true, push: flight, execute: true, immediate: true}
  set_destination:
    description: Specify the destination
    parameters: {type: object, properties: {destination: {type: string}}, required: [destination]}
    action:
      set: {scope.reservation.destination: "{{ args.destination }}"}
      emit: {Thinking: "Destination set to {{ args.destination }}"}
  book:
    description: Book the reservation
    requires: [scope.reservation.departure, scope.reservation.destination]
    handler: travel_tools:make_booking
    action: {message: "Your flight to {{ scope.reservation.destination }} is booked.", result: "Flight booked", pop: true}
  cancel:
    description: Abandon the booking
    action: {wipe: schedule, pop: true}
format: 3
"""

HANDLER = "def make_booking(ctx):\n    return 'XY123'\n"


@pytest.fixture
def travel(write_bot):
    return write_bot(TRAVEL, extra={"travel_tools.py": HANDLER})


def test_travel_example_loads_clean(travel):
    config, warnings = load_config(travel)
    assert warnings == []
    assert (config.name, config.description) == ("travel", "Books flights and hotels.")
    assert config.path == str(travel) and config.root == str(travel.parent)
    assert (config.model.provider, config.model.name, config.model.temperature) == ("openai", "gpt-4o-mini", 0.2)
    assert config.model.where == Location(str(travel), 4, 1)
    assert (config.memory.type, config.memory.max_tokens) == ("token_window", 3000)
    assert (config.limits.max_hops, config.limits.max_model_calls) == (5, 9)
    assert config.state == {"traveller_name": None}
    assert list(config.routes) == ["main_menu", "flight"] and config.default_route == "main_menu"


def test_travel_routes(travel):
    config, _ = load_config(travel)
    menu, flight = config.routes["main_menu"], config.routes["flight"]
    assert menu.default and not flight.default
    assert menu.system == "You are a travel agent. Help the traveller.\n"
    assert flight.context == "Reservation so far: {{ scope.reservation | tojson }}" and menu.context is None
    assert menu.memory == MemoryPolicy(type="message_window", max_messages=20, where=Location(str(travel), 15, 5))
    assert menu.where == Location(str(travel), 10, 3) and flight.where == Location(str(travel), 17, 3)
    assert flight.user == "[{{ data.page | default('chat') }}] {{ user_message }}" and flight.roles == ["staff"]
    assert flight.memory is None and config.route_memory("flight") is config.memory
    assert flight.scope == ScopeConfig(local={"reservation": {"departure": None, "destination": None}}, shared={})
    merged = config.route_model("flight")
    assert (merged.provider, merged.name, merged.temperature) == ("openai", "gpt-4o", 0)
    assert flight.tools == ["set_destination", "book", "cancel"]


def test_travel_tools(travel):
    config, _ = load_config(travel)
    tools = config.tools
    assert tools["book_flight"].action == ActionConfig(clear_memory=True, push="flight", execute=True, immediate=True,
                                                       where=Location(str(travel), 30, 5))
    assert tools["book_flight"].parameters == {"type": "object", "properties": {}}
    setter = tools["set_destination"]
    assert setter.parameters["required"] == ["destination"]
    assert setter.action.set == {"scope.reservation.destination": "{{ args.destination }}"}
    assert setter.action.emit == {"Thinking": "Destination set to {{ args.destination }}"}
    book = tools["book"]
    assert book.requires == ["scope.reservation.departure", "scope.reservation.destination"]
    assert book.kinds["handler"] == "travel_tools:make_booking"
    assert (book.action.pop, book.action.result) == (True, "Flight booked")
    assert book.action.message.startswith("Your flight to")
    assert tools["cancel"].action.wipe == "schedule"
    assert tools["cancel"].where == Location(str(travel), 42, 3)


def test_directory_bot_with_includes(tmp_path):
    (tmp_path / "routes").mkdir()
    (tmp_path / "bot.yaml").write_text(textwrap.dedent("""\
        name: split
        include: routes/*.yaml
        routes:
          main: {default: true, tools: [go]}
        tools:
          go: {description: Go, action: {push: wizard}}
        """))
    (tmp_path / "routes" / "wizard.yaml").write_text(textwrap.dedent("""\
        # the wizard lives here
        routes:
          wizard:
            system: Wizard.
            tools: [back]
        tools:
          back: {description: Back, action: {pop: true}}
        """))
    config, warnings = load_config(tmp_path)
    assert warnings == []
    assert list(config.routes) == ["main", "wizard"] and list(config.tools) == ["go", "back"]
    wizard_file = str(tmp_path / "routes" / "wizard.yaml")
    assert config.routes["wizard"].where == Location(wizard_file, 3, 3)
    assert config.tools["back"].where == Location(wizard_file, 7, 3)
    assert config.path == str(tmp_path / "bot.yaml") and config.root == str(tmp_path)


def test_names_unique_across_files(tmp_path):
    (tmp_path / "bot.yaml").write_text("name: dup\ninclude: [more.yaml]\nroutes:\n  main: {default: true}\n")
    (tmp_path / "more.yaml").write_text("routes:\n  other: {}\n  main: {system: again}\n")
    with pytest.raises(BotError) as info:
        load_config(tmp_path)
    [error] = info.value.errors
    assert (error.file, error.line) == (str(tmp_path / "more.yaml"), 3)
    assert error.message == (f"route `main` is defined twice: here and at {tmp_path / 'bot.yaml'}:4; "
                             "route names must be unique across the bot's files")


def test_directory_without_bot_yaml_and_bot_yml(tmp_path):
    with pytest.raises(BotError, match="no bot.yaml in directory"):
        load_config(tmp_path)
    (tmp_path / "bot.yml").write_text("name: short\nroutes: {main: {default: true}}\n")
    config, _ = load_config(tmp_path)
    assert config.name == "short"


def test_example_bots_load_clean():
    bots = sorted(p for p in (REPO / "bots").glob("*") if (p / "bot.yaml").is_file())
    if not bots:
        pytest.skip("no example bots in this checkout")
    for bot in bots:
        config, warnings = load_config(bot)
        assert warnings == [], (bot, [w.format() for w in warnings])
        assert config.default_route in config.routes


def test_yaml_positions_anchors_merge_keys_and_duplicates():
    doc = load_yaml(textwrap.dedent("""\
        base: &base {type: message_window, max_messages: 5}
        routes:
          a:
            memory:
              <<: *base
              max_messages: 7
          b:
            x: 1
            x: 2
        """), "f.yaml")
    assert doc.data["routes"]["a"]["memory"] == {"type": "message_window", "max_messages": 7}
    assert doc.pos(("routes", "a", "memory", "max_messages"))[:2] == (6, 7)
    assert doc.pos(("routes", "b", "nothing", "here"))[:2] == (7, 3)  # nearest ancestor
    [dup] = doc.diagnostics
    assert (dup.line, dup.col, dup.severity) == (9, 5, "error")
    assert dup.message.startswith("duplicate key `x` in `routes.b`: first defined on line 8")


def test_yaml_scalar_types_and_block_style():
    doc = load_yaml("a: 1\nb: 2.5\nc: true\nd: null\ne: '3'\nf: |\n  text\n", "f.yaml")
    assert doc.data == {"a": 1, "b": 2.5, "c": True, "d": None, "e": "3", "f": "text\n"}
    assert doc.pos(("f",)).style == "|" and doc.pos(("f",)).value_line == 6


def test_empty_file(tmp_path):
    path = tmp_path / "bot.yaml"
    path.write_text("# nothing\n")
    with pytest.raises(BotError, match="the file is empty"):
        load_config(path)


def test_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "bot.yaml"
    path.write_bytes(b"name: latin\nroutes:\n  main: {default: true, system: caf\xe9}\n")
    with pytest.raises(BotError) as info:
        load_config(path)
    assert [(d.line, d.col, d.message) for d in info.value.errors] == [
        (3, 36, "the file is not UTF-8 text: byte 0xe9 on line 3 cannot be decoded; save the file as UTF-8")]


def test_recursive_alias_and_non_string_names_are_diagnostics(tmp_path):
    path = tmp_path / "bot.yaml"
    path.write_text("name: odd\nloop: &x [*x]\nroutes:\n  2: {default: true}\n")
    with pytest.raises(BotError) as info:
        load_config(path)
    assert [(d.line, d.message) for d in info.value.errors] == [
        (2, "unknown key `loop` at the top level"),
        (2, "recursive YAML alias: a node cannot contain itself"),
        (4, "invalid route name `2` in `routes`: use letters, digits, `_` and `-`, starting with a letter or `_`"),
    ]


# -- the alias-bomb guard counts the file's nodes only when the file may hold an anchor (issue 26) --


def compact_bomb(levels: int = 7) -> str:
    """An alias bomb in flow style with no space before any anchor (`"b":&b [*a,*a]`): 9^7 values."""
    parts = ['"a":&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, cur = chr(96 + i), chr(97 + i)
        parts.append(f'"{cur}":&{cur} [' + ",".join([f"*{prev}"] * 9) + "]")
    return "{" + ",".join(parts) + "}\n"


@pytest.mark.parametrize("text", [compact_bomb(), "x: [" + compact_bomb().strip() + "]\n",
                                  "- " + compact_bomb(), "k:\n  " + compact_bomb()])
def test_an_alias_bomb_is_refused_however_its_anchors_are_written(text):
    doc = load_yaml(text, "bomb.yaml")
    assert doc.data is None
    assert [d.message for d in doc.diagnostics if "alias" in d.message][0].startswith(
        "YAML aliases expand to too many values")


def test_a_file_without_anchors_loads_whole_with_its_positions():
    text = "name: Q&A bot\nroutes:\n  chat: {default: true, system: 'salt & pepper'}\n"
    doc = load_yaml(text, "bot.yaml")
    assert doc.diagnostics == []
    assert doc.data == {"name": "Q&A bot", "routes": {"chat": {"default": True, "system": "salt & pepper"}}}
    assert doc.positions[("routes", "chat", "system")] == (3, 25, 3, 33, "'")


def _full_build_positions(text: str) -> dict:
    """The positions the full builder records for every node (what a file with an anchor gets)."""
    import yaml

    from chatrun.definition import yamlpos

    doc = yamlpos.YamlDoc("bot.yaml", text=text)
    yamlpos._Builder(doc).start(yaml.compose(text, Loader=yamlpos._Loader), text)
    return dict(doc.positions)


@pytest.mark.parametrize("file", sorted(Path(__file__).resolve().parents[1].glob("bots/*/**/*.yaml")),
                         ids=lambda p: str(p.relative_to(p.parents[2])))
def test_a_valid_file_read_without_positions_finds_every_position_in_its_node_tree(file):
    text = file.read_text()
    doc = load_yaml(text, str(file))
    full = _full_build_positions(text)
    if "&" not in text:  # an anchor-free file takes the fast build: positions come from the node tree
        assert type(doc.positions).__name__ == "NodePositions"
    assert {path: doc.positions[path] for path in full} == full
    assert set(doc.positions) == set(full)
    assert doc.pos(("routes", "no_such_route", "system")) == full.get(("routes",), full[()])


def test_a_file_the_fast_build_cannot_take_is_built_whole_and_its_problems_reported():
    text = "name: a\nroutes:\n  chat: {system: hi}\n  chat: {system: again}\nvisits: .nan\n"
    doc = load_yaml(text, "bot.yaml")
    assert [(d.line, d.message.split(":")[0]) for d in doc.diagnostics] == [
        (4, "duplicate key `chat` in `routes`"), (5, "`.nan` is not a number JSON can hold (NaN and infinity are not allowed)")]
    assert doc.positions[("routes", "chat", "system")] == (3, 10, 3, 18, "")


def test_loading_pauses_the_cyclic_collector_and_restores_it(travel, tmp_path):
    """A load builds millions of short-lived objects for a big bot; full collections walking them
    tripled its CPU. The collector is paused for the load (even one that raises) and left as it was."""
    import gc
    import sys

    from chatrun.definition import checks, schemas, yamlpos

    bot = travel
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nroutes: {main: {default: true, descripton: typo}}\n")
    collections: list[int] = []

    work = {str(Path(module.__file__)) for module in (yamlpos, schemas, checks)}  # reading, the schema, the checks

    def record(phase: str, info: dict) -> None:  # a collection started from inside the loader's work
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename not in work:
            frame = frame.f_back
        if phase == "start" and frame is not None:
            collections.append(info["generation"])

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.callbacks.append(record)
    try:
        gc.enable()
        gc.set_threshold(1)  # a collection at nearly every allocation, unless paused
        load_config(bot)
        with pytest.raises(BotError):
            load_config(bad)
        assert collections == [] and gc.isenabled()
        gc.disable()
        load_config(bot)
        assert not gc.isenabled()  # a collector the caller turned off stays off
    finally:
        gc.callbacks.remove(record)
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()


def test_a_case_merged_over_its_action_takes_the_cases_keys_and_keeps_the_rest(write_bot):
    """ActionConfig.with_case: the case's set keys win (the case's value, after the action's own
    entries), a key the case leaves unset or false keeps the action's, the merge has no cases of
    its own and is made once per case."""
    path = write_bot(textwrap.dedent("""\
        name: merge
        format: 3
        state: {a: null, b: null, c: null}
        routes:
          main: {default: true, description: Main, tools: [t], system: Hi}
          other: {description: Other, system: Hi}
        tools:
          t:
            description: A tool with cases
            parameters: {type: object, properties: {x: {type: string}}}
            action:
              set: {state.a: one, state.b: two}
              message: base
              pop: false
              cases:
                - if: args.x == 'y'
                  then: {set: {state.c: three, state.a: four}, route: other, message: case}
                - else: {execute: false, route: other}
        """))
    config, _ = load_config(path)
    action = config.tools["t"].action
    merged = action.with_case(action.cases[0])
    assert list(merged.set.items()) == [("state.b", "two"), ("state.c", "three"), ("state.a", "four")]
    assert (merged.route, merged.message, merged.pop, merged.cases) == ("other", "case", False, [])
    assert merged.where == action.cases[0].action.where and merged is action.with_case(action.cases[0])
    otherwise = action.with_case(action.cases[1])
    assert (otherwise.message, otherwise.route, otherwise.set) == ("base", "other", action.set)
    assert otherwise.set is not action.set  # a merge's mappings are its own
    assert [case for case, _ in action.variants()] == action.cases  # an `else`: no variant without a case
