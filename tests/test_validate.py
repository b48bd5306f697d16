"""`chatrun validate` and the checks behind it: every error and warning has an invalid-bot
fixture in tests/fixtures/invalid/, and each is asserted with its file, exact line,
severity and message. Then the CLI: output format, exit codes, JSON, a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chatrun.cli import main
from chatrun.definition.checks import _analyse
from chatrun.definition.loader import _fast_check, _validator, check_bot, load_config
from chatrun.definition.schemas import load_schema, schema_path
from chatrun.definition.yamlpos import load_yaml

FIXTURES = Path(__file__).parent / "fixtures" / "invalid"
REPO = Path(__file__).resolve().parents[1]

def changing_system(route: str, reads: str) -> str:
    """The warning for a `system:` that reads what changes (issue 38, "Stable prompts")."""
    return (f"`system` of route `{route}` reads {reads} as the conversation goes: every call is then a new prompt "
            "to the provider's prompt cache. Move them to the route's (or the bot's) `context:`, sent after the "
            'memory on every call (docs/models.md, "Stable prompts"), or set `model: {prompt_cache: false}` on the route')


# fixture -> every diagnostic it must produce, in order: (file, line, severity, message).
# "{d}" stands for the fixtures directory (messages name files as the user gave them).
EXPECTED = {
    "bad_enum.yaml": [
        ("bad_enum.yaml", 2, "error",
         '`model.provider` must be one of openai, scripted (got `openia`); did you mean `openai`?'),
        ("bad_enum.yaml", 3, "error",
         '`memory.type` must be one of message_window, token_window, none, summary (got `tokens_window`); did you mean `token_window`?'),
        ("bad_enum.yaml", 11, "error",
         '`action.wipe` of tool `forget` must be one of schedule, abort (got `later`)'),
    ],
    "bad_names.yaml": [
        ("bad_names.yaml", 3, "error",
         'invalid route name `main menu` in `routes`: use letters, digits, `_` and `-`, starting with a letter or `_`'),
        ("bad_names.yaml", 9, "error",
         '`handler` of tool `go`: `not a handler` is not valid; write `module:function`, e.g. `travel_tools:make_booking` (the module relative to the bot directory)'),
        ("bad_names.yaml", 10, "error",
         '`requires[0]` of tool `go`: `reservation.date` is not valid; a state path starts with `state.`, `scope.` or `turn.` (e.g. `scope.reservation.destination`)'),
        ("bad_names.yaml", 12, "error",
         'invalid `set` path `reservation` in `action.set` of tool `go`: a state path starts with `state.`, `scope.` or `turn.` (e.g. `scope.reservation.destination`)'),
    ],
    "bad_parameters.yaml": [
        ("bad_parameters.yaml", 12, "error",
         "`parameters` of tool `a` is not a valid JSON Schema at `properties.when.type`: 'date' is not valid under any of the given schemas"),
        ("bad_parameters.yaml", 15, "error",
         "`parameters` of tool `b` must have `type: object` (a tool's arguments are a JSON object)"),
        ("bad_parameters.yaml", 18, "error",
         "`parameters` of tool `c`: `$ref: #/nope` points nowhere (a tool's schema can only refer inside itself, "
         "e.g. `#/$defs/NAME`)"),
        ("bad_parameters.yaml", 26, "error",
         "`parameters` of tool `d`: key `1` at `properties.1` must be text; quote it"),
    ],
    # Decisions (cases) and scope visibility: issue 9, sections 1 and 6.
    "decisions.yaml": [
        ("decisions.yaml", 10, "warning",
         "`system` of route `pay_wizard` reads `scope.reservation`, but `scope.reservation` is declared by `booking` and is not visible on route `pay_wizard` (a route sees its own scope's keys and the `shared` keys of the scopes it is pushed from)"),
        ("decisions.yaml", 10, "warning", changing_system("pay_wizard", "`scope.reservation`, which changes")),
        ("decisions.yaml", 23, "error",
         'condition `{{ args.amount > 0 }}` of tool `pay`: a condition is a Jinja expression without `{{ }}` (write `args.amount > state.balance`)'),
        ("decisions.yaml", 25, "error",
         'the `else` case of tool `pay` must be the last case: the cases after it could never apply'),
        ("decisions.yaml", 26, "error",
         "condition `args.amount >` of tool `pay` does not compile: unexpected 'end of the condition'"),
        ("decisions.yaml", 27, "error",
         'tool `pay` (case `if: args.amount >`) pushes unknown route `pay_wizrd`; did you mean `pay_wizard`?'),
        ("decisions.yaml", 28, "warning",
         "condition `args.amont > state.balanse` of tool `pay` reads `args.amont`, but the tool's `parameters` declare no property `amont`; did you mean `amount`?"),
        ("decisions.yaml", 28, "warning",
         'condition `args.amont > state.balanse` of tool `pay` reads `state.balanse`, but `state.balanse` is not declared in the top-level `state:`; did you mean `balance`?'),
        ("decisions.yaml", 35, "error",
         'tool `again` (case `else`) has `execute: true` but no `push`, `pop`, `route` or `call`: it would run the same route again with the same message, over and over until a limit; add a move or remove `execute`'),
        ("decisions.yaml", 37, "warning",
         "`message` of tool `peek` reads `scope.amount`, but `scope.amount` is declared by `pay_wizard` and is not visible on route `main` (a route sees its own scope's keys and the `shared` keys of the scopes it is pushed from)"),
    ],
    "defaults_many.yaml": [
        ("defaults_many.yaml", 6, "error",
         'several default routes: `main` ({d}/defaults_many.yaml:4), `other` ({d}/defaults_many.yaml:6), `third` ({d}/defaults_many.yaml:8); exactly one route may have `default: true`'),
    ],
    "defaults_none.yaml": [
        ("defaults_none.yaml", 2, "error",
         'no default route: mark exactly one route with `default: true` (routes: `main`, `other`)'),
    ],
    "duplicate_key.yaml": [
        ("duplicate_key.yaml", 6, "error",
         'duplicate key `system` in `routes.main`: first defined on line 5; YAML would silently keep only the last one'),
    ],
    "graph_warnings.yaml": [
        ("graph_warnings.yaml", 5, "warning",
         'tool `cancel` pops, but route `main` is only ever the root scope (nothing pushes it): calling it there fails at run time'),
        ("graph_warnings.yaml", 10, "warning",
         'route `orphan` is not reachable from the default route `main`: no tool on a reachable route pushes it or routes to it (if clients start conversations on it, mark it `entry: true`)'),
        ("graph_warnings.yaml", 22, "warning",
         'tool `unused` is not listed by any route, so the model can never call it'),
    ],
    "handlers": [
        ("handlers/bot.yaml", 12, "error",
         'handler `missing_mod:run` of tool `no_module`: no module `missing_mod` in {d}/handlers (looked for missing_mod.py)'),
        ("handlers/bot.yaml", 15, "error",
         'handler `tools_mod:make_bookin` of tool `no_function`: {d}/handlers/tools_mod.py has no function `make_bookin`; did you mean `make_booking`?'),
        ("handlers/bot.yaml", 18, "error",
         'handler `tools_mod:RATE` of tool `not_callable`: `RATE` in {d}/handlers/tools_mod.py is a float, not a function'),
        ("handlers/bot.yaml", 21, "error",
         'handler `broken_mod:run` of tool `broken`: {d}/handlers/broken_mod.py failed to import: RuntimeError: payment service not configured'),
    ],
    "includes": [
        ("includes/bot.yaml", 2, "warning",
         'include pattern `missing/*.yaml` matches no file (relative to {d}/includes)'),
        ("includes/bot.yaml", 2, "warning",
         'include `routes`: `routes` is a directory; use `routes/*.yaml`'),
        ("includes/routes/empty.yaml", 1, "error",
         'the included file is empty: an included file holds `routes:` and/or `tools:`'),
        ("includes/routes/more.yaml", 1, "error",
         'unknown key `state` at the top level of an included file: included files hold only `routes:` and `tools:`'),
        ("includes/routes/more.yaml", 3, "error",
         "route `main` is defined twice: here and at {d}/includes/bot.yaml:4; route names must be unique across the bot's files"),
        ("includes/routes/more.yaml", 6, "error",
         "tool `to_flight` is defined twice: here and at {d}/includes/bot.yaml:8; tool names must be unique across the bot's files"),
    ],
    "memory_keys.yaml": [
        ("memory_keys.yaml", 4, "error",
         '`max_tokens` does not apply to `type: message_window` memory in `memory` (that type uses: max_messages)'),
        ("memory_keys.yaml", 8, "error",
         '`max_messages` does not apply to `type: none` memory in `memory` of route `main` (that type uses: nothing)'),
        ("memory_keys.yaml", 9, "warning",
         'route `other` is not reachable from the default route `main`: no tool on a reachable route pushes it or routes to it (if clients start conversations on it, mark it `entry: true`)'),
        ("memory_keys.yaml", 10, "error",
         'missing required key `type` in `memory` of route `other`'),
    ],
    "memory_encoding.yaml": [
        ("memory_encoding.yaml", 2, "error",
         "unknown tiktoken encoding `o200k_bas`; did you mean `o200k_base`? (leave `encoding` out to use the "
         "model's; e.g. o200k_base, cl100k_base)"),
        ("memory_encoding.yaml", 8, "error",
         "unknown tiktoken encoding `nope` (leave `encoding` out to use the model's; e.g. o200k_base, cl100k_base)"),
    ],
    "missing_name.yaml": [
        ("missing_name.yaml", 1, "error",
         'missing required key `name` at the top level'),
    ],
    "no_routes.yaml": [
        ("no_routes.yaml", 1, "error",
         'the bot has no routes: add `routes:` with at least one route marked `default: true`'),
    ],
    "not_a_mapping.yaml": [
        ("not_a_mapping.yaml", 1, "error",
         'the file must hold a mapping (name:, routes:, tools:, ...), not a list'),
    ],
    "result_without_pop.yaml": [
        ("result_without_pop.yaml", 11, "error",
         '`result` in `action` of tool `done` is only used with `pop: true` (it is handed to the parent route when the scope ends)'),
    ],
    "templates.yaml": [
        ("templates.yaml", 9, "error",
         "template error in `system` of route `main`: Encountered unknown tag 'endfi'. Jinja was looking for the following tags: 'elif' or 'else' or 'endif'. The innermost block that needs to be closed is 'if'."),
        ("templates.yaml", 10, "warning",
         "`user` of route `main` reads `data.userMessage`, which is undefined when a client sends only text (`data` is then empty): every such turn fails. Read the text as `user_message`, and optional fields as `data.userMessage | default('')` or under `{% if data.userMessage is defined %}`"),
        ("templates.yaml", 10, "error",
         'template error in `user` of route `main`: no filter named `upper_case`; did you mean `upper`?'),
        ("templates.yaml", 16, "error",
         '`message` of tool `greet` uses unknown template variable `usr_message`; did you mean `user_message`? (templates can use: state, scope, args, user_message, data, route, stack, turn, result, error, output, now, today, principal, session_id, decision, locale, user_memory)'),
        ("templates.yaml", 17, "error",
         "template error in `reply` of tool `greet`: unexpected '}'"),
    ],
    "undeclared_state.yaml": [
        ("undeclared_state.yaml", 7, "warning", changing_system("main", "`state.traveler_name`, `state.prefs`, which change")),
        ("undeclared_state.yaml", 7, "warning",
         '`system` of route `main` reads `state.traveler_name`, but `state.traveler_name` is not declared in the top-level `state:`; did you mean `traveller_name`?'),
        ("undeclared_state.yaml", 11, "warning",
         "`system` of route `flight` reads `scope.reservation.destinaton`, but `scope.reservation.destinaton` is not declared in any route's `scope: local:` or `shared:`; did you mean `destination`?"),
        ("undeclared_state.yaml", 11, "warning", changing_system("flight", "`scope.reservation`, which changes")),
        ("undeclared_state.yaml", 25, "warning",
         "tool `set_destination` sets `scope.reservaton.departure`, but `scope.reservaton` is not declared in any route's `scope: local:` or `shared:`; did you mean `reservation`?"),
        ("undeclared_state.yaml", 27, "warning",
         'tool `set_destination` sets `state.nickname`, but `state.nickname` is not declared in the top-level `state:`'),
        ("undeclared_state.yaml", 30, "error",
         '`requires` of tool `book_it` names `state.passport`, but `state.passport` is not declared in the top-level `state:`'),
        ("undeclared_state.yaml", 36, "warning",
         "`set state.traveller_name` of tool `set_name` reads `args.nmae`, but the tool's `parameters` declare no property `nmae`; did you mean `name`?"),
        ("undeclared_state.yaml", 37, "warning",
         "`message` of tool `set_name` reads `args.extra`, but the tool's `parameters` declare no property `extra`"),
    ],
    "unknown_key.yaml": [
        ("unknown_key.yaml", 8, "error",
         'unknown key `sytem` in route `flight`; did you mean `system`?'),
        ("unknown_key.yaml", 16, "error",
         'unknown key `mesage` in `action` of tool `cancel`; did you mean `message`?'),
    ],
    "unknown_targets.yaml": [
        ("unknown_targets.yaml", 5, "error",
         'route `main` lists unknown tool `help`'),
        ("unknown_targets.yaml", 6, "warning",
         'route `flight` is not reachable from the default route `main`: no tool on a reachable route pushes it or routes to it (if clients start conversations on it, mark it `entry: true`)'),
        ("unknown_targets.yaml", 8, "warning",
         'tool `cancel` pops, but route `flight` is only ever the root scope (nothing pushes it): calling it there fails at run time'),
        ("unknown_targets.yaml", 12, "error",
         'tool `book_flight` pushes unknown route `fligth`; did you mean `flight`?'),
        ("unknown_targets.yaml", 15, "error",
         'tool `to_agent` routes to unknown route `agent`'),
    ],
    "wrong_type.yaml": [
        ("wrong_type.yaml", 2, "error",
         '`model.temperature` must be a number or null, not a string'),
        ("wrong_type.yaml", 7, "error",
         '`tools` of route `main` must be a list, not a string'),
    ],
    "yaml_values.yaml": [
        ("yaml_values.yaml", 3, "error",
         '`.nan` is not a number JSON can hold (NaN and infinity are not allowed)'),
        ("yaml_values.yaml", 8, "error",
         'unsupported YAML tag `!!python/object:os.system`: a bot holds only plain mappings, lists, strings, '
         'numbers, booleans and null (quote the value to make it text)'),
        ("yaml_values.yaml", 10, "error",
         'mapping keys must be plain scalars in `routes.main`, not a list'),
        ("yaml_values.yaml", 14, "error",
         'unsupported YAML tag `!!binary`: a bot holds only plain mappings, lists, strings, '
         'numbers, booleans and null (quote the value to make it text)'),
        ("yaml_values.yaml", 15, "error",
         '`.inf` is not a number JSON can hold (NaN and infinity are not allowed)'),
    ],
    "yaml_syntax.yaml": [
        ("yaml_syntax.yaml", 7, "error",
         'YAML syntax error: while scanning a quoted scalar (from line 5), found unexpected end of stream'),
    ],
}


def _diagnostics(name: str) -> list[tuple[str, int, str, str]]:
    _config, found = check_bot(FIXTURES / name)
    return [(str(Path(d.file).relative_to(FIXTURES)), d.line, d.severity, d.message.replace(str(FIXTURES), "{d}"))
            for d in found]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_reports_exactly_its_problems(name):
    assert _diagnostics(name) == EXPECTED[name]


def test_every_fixture_is_asserted():
    fixtures = {p.name for p in FIXTURES.iterdir() if p.suffix in (".yaml", "") and not p.name.startswith(".")}
    assert fixtures == set(EXPECTED)


def test_invalid_bot_raises_bot_error_with_every_diagnostic():
    from chatrun.errors import BotError

    with pytest.raises(BotError) as info:
        load_config(FIXTURES / "unknown_targets.yaml")
    assert [d.line for d in info.value.diagnostics] == [5, 6, 8, 12, 15]
    assert [d.line for d in info.value.errors] == [5, 12, 15]
    assert "unknown_targets.yaml:5:36: error: route `main` lists unknown tool `help`" in str(info.value)


def test_warnings_only_is_valid_and_returned():
    config, warnings = load_config(FIXTURES / "graph_warnings.yaml")
    assert config.name == "graph"
    assert [(w.line, w.severity) for w in warnings] == [(5, "warning"), (10, "warning"), (22, "warning")]


def test_handler_check_leaves_sys_modules_alone():
    before = set(sys.modules)
    check_bot(FIXTURES / "handlers")
    assert set(sys.modules) - before == set()


def test_template_error_line_in_single_and_multi_line_scalars(write_bot):
    path = write_bot("""\
        name: lines
        routes:
          main:
            default: true
            system: "{{ state.x ) }}"
            user: |-
              line one
              line two {{ data.a }}
              line three {% for %}
        state: {x: 1}
        """)
    _config, found = check_bot(path)
    assert [(d.line, d.severity) for d in found] == [(5, "error"), (9, "error")]
    assert (found[0].col, found[1].col) == (13, 7)
    assert found[1].message.startswith("template error in `user` of route `main`:")


def test_template_variable_rules(write_bot):
    path = write_bot("""\
        name: vars
        state: {name: null}
        routes:
          main:
            default: true
            system: |
              {% for item in state.name %}{{ item.label }} {{ loop.index }}{% endfor %}
              {{ range(3) | list }} {{ turn.anything }} {{ stack | join(",") }} {{ route }}
              {% set n = namespace(x=1) %}{{ n.x }} {{ nope.field }}
        model: {prompt_cache: false}   # no warning for a system prompt that reads the state
        """)
    _config, found = check_bot(path)
    assert [(d.line, d.severity, d.message.split(";")[0]) for d in found] == [
        (9, "error", "`system` of route `main` uses unknown template variable `nope`")]


def test_scope_declared_by_any_route_and_free_form_below_null_or_empty(write_bot):
    path = write_bot("""\
        name: scopes
        state: {profile: {}, last: null}
        routes:
          main:
            default: true
            system: "{{ state.profile.anything.deep }} {{ state.last.x }} {{ scope.shared_thing }}"
            scope: {shared: {shared_thing: 1}}
            tools: [go]
          other:
            system: "{{ scope.cart.items }} {{ scope.cart.total }}"
            scope: {local: {cart: {items: []}}}
            tools: [back]
        tools:
          go: {description: Go, action: {push: other}}
          back: {description: Back, action: {pop: true, set: {scope.shared_thing: 2}}}
        model: {prompt_cache: false}   # no warning for a system prompt that reads the state
        """)
    _config, found = check_bot(path)
    assert [(d.line, d.severity) for d in found] == [(10, "warning")]
    assert "`scope.cart.total`" in found[0].message and "did you mean" not in found[0].message


def test_schema_messages_name_the_alternatives_and_the_repeated_item(write_bot):
    path = write_bot("""\
        name: msgs
        include: 3
        routes:
          main: {default: true, tools: [t, t]}
        tools:
          t: {description: T}
        """)
    _config, found = check_bot(path)
    assert [(d.line, d.col, d.message) for d in found] == [
        (2, 1, "`include` must be a string or a list, not an integer"),
        (4, 36, "`tools` of route `main` lists `t` twice"),
    ]


@pytest.mark.parametrize("value, what", [('"5MB"', "a string"), ("[1]", "a list"), ("{a: 1}", "a mapping")])
def test_an_attachment_limit_of_the_wrong_type_is_reported_not_a_crash(write_bot, value, what):
    path = write_bot(f"""\
        name: files
        routes:
          main: {{default: true, attachments: {{kinds: [image/png], max_bytes: {value}, max_count: {value}}}}}
        """)
    _config, found = check_bot(path)
    assert [(d.line, d.message) for d in found] == [
        (3, f"`attachments.max_bytes` of route `main` must be an integer, not {what}"),
        (3, f"`attachments.max_count` of route `main` must be an integer, not {what}")]


@pytest.mark.parametrize("line, message", [
    ("locales: [e1]", "`locales[0]`: `e1` is not valid; write a language tag: `en`, `de`, `pt-BR`"),
    ("routes: {main: {default: true, attachments: {kinds: [video]}}}",
     "`attachments.kinds[0]` of route `main`: `video` is not valid; write a media type in lower case: "
     "`image/png`, or `image/*` for every image"),
    ("routes: {main: {default: true, mcp: [a b]}}",
     "`mcp[0]` of route `main`: `a b` is not valid; write `SERVER` (all its tools) or `SERVER/TOOL`"),
    ("env: {API-KEY: null}", "invalid key `API-KEY` in `env`: use letters, digits "
     "and `_`, starting with a letter or `_` (e.g. `API_KEY`)"),
])
def test_a_value_that_misses_its_pattern_is_told_how_that_kind_of_value_is_written(write_bot, line, message):
    path = write_bot(f"name: hints\nroutes: {{main: {{default: true}}}}\n{line}\n".replace(
        "routes: {main: {default: true}}\nroutes", "routes"))
    _config, found = check_bot(path)
    assert message in [d.message for d in found]


def test_fast_schema_path_agrees_with_jsonschema():
    """The compiled yes/no check must never call a document valid that jsonschema rejects."""
    docs = []
    for path in sorted(FIXTURES.rglob("*.yaml")) + sorted(REPO.glob("bots/*/*.yaml")):
        doc = load_yaml(path.read_text(), str(path))
        if isinstance(doc.data, dict):
            docs.append(doc.data)
    docs += [
        {"name": "x", "routes": {"a": {"default": 1}}},
        {"name": "x", "model": {"temperature": True}},
        {"name": "x", "model": {"max_tokens": 2.0}},
        {"name": "x", "routes": {"a": {"tools": ["t", "t"]}}},
        {"name": "x", "memory": {"type": "none"}},
        {"name": "x", "tools": {"t": {"action": {"wipe": "schedule", "result": "r", "pop": True}}}},
        {"name": "x", "include": ["a", 1]},
        {"name": "x", "tools": {"t": {"action": {"cases": []}}}},
        {"name": "x", "tools": {"t": {"action": {"cases": [{"if": "", "then": {}}]}}}},
        {"name": "x", "tools": {"t": {"action": {"cases": [{"if": "a", "then": {}, "else": {}}]}}}},
        {"name": "x", "tools": {"t": {"action": {"cases": [{"else": {"cases": []}}]}}}},
        {"name": "x", "tools": {"t": {"action": {"cases": [{"if": "a", "then": {"pop": True}}, {"else": {}}]}}}},
        # The fused one-pass object check: an unknown key, a missing required key, not a mapping.
        {"name": "x", "routes": {"a": {"descripton": "typo"}}},
        {"routes": {"a": {"default": True}}},
        {"name": "x", "routes": ["a"]},
        {"name": "x", "tools": {"t": {"parameters": {"type": "object"}, "action": "pop"}}},
    ]
    for data in docs:
        for definition in (None, "fragment"):
            assert _fast_check(definition)(data) == (not list(_validator(definition).iter_errors(data))), data


def test_simple_template_reader_matches_jinja():
    """Templates read without Jinja's parser must give what the parser would."""
    from chatrun.definition.checks import _analyse_simple

    for source in ["Hi {{ state.name or 'the user' }}.\n{{ scope.form | tojson }}", "{{ args.value }}",
                   "a {{ x.y.z | upper | trim }} b {{- data.q -}}", "{{ state.prefs.get }}",
                   # conditions, as the validator reads them
                   "{{ args.amount > state.balance }}", "{{ not result.found and scope.x.y == 'a b' }}",
                   "{{ args.kind in state.kinds or turn.n >= 2.5 }}", "{{ scope.r is not none }}",
                   "{{ result.item is defined and args.q != none }}", "{{ state.n - 1 * args.x / 2 }}",
                   "{{ not not args.flag }}", "{{ args.a not in state.seen }}", "{{ True or false }}",
                   # one line, read from its `{{ }}` parts alone: filters known and not, names repeated
                   "Step 7 is {{ args.value | nosuchfilter | upper }}, {{ state.n }} of {{ args.value }}",
                   "{{ a.b }}{{ a.b.c }} and {{ c | trim }}", "{{ state.prefs.items }} and {{ scope.q.keys }}",
                   # a path read beside a longer one below it: the longest alone, as Jinja's reading keeps
                   "{{ state.a.b or state.a.b.c }}", "x {{ state.a.b }}\n{{ state.a.b.c }} {{ state.a }}"]:
        fast = _analyse_simple(source)
        assert fast is not None
        _analyse.cache_clear()
        slow = _analyse.__wrapped__(source + "{% if false %}{% endif %}")  # forces the parser
        assert (dict(fast[0]), fast[1]) == (dict(slow[0]), slow[1]), source


def test_one_line_templates_differing_only_in_text_are_read_once():
    """A one-line template's reading hangs on its `{{ }}` parts alone: templates that differ only
    in the text around them (5,000 generated routes' `Step N is {{ args.value }}`) are read once,
    and each gets what Jinja's parser says of it; a part that is not simple still goes to Jinja."""
    from chatrun.definition.checks import _analyse_one_line, _analyse_simple_text  # (no shape memo)

    _analyse_simple = _analyse_simple_text

    _analyse_one_line.cache_clear()
    sources = [f"Step {n} is set to {{{{ args.value | upper }}}}, {{{{ state.user_name }}}}." for n in range(5)]
    for source in sources:
        fast = _analyse_simple(source)
        slow = _analyse.__wrapped__(source + "{% if false %}{% endif %}")
        assert fast is not None and (dict(fast[0]), fast[1]) == (dict(slow[0]), slow[1]), source
    assert _analyse_one_line.cache_info().misses == 1 and _analyse_one_line.cache_info().hits == 4
    assert _analyse_simple("Step 1 {{ args.value }} {{ args.items[0] }}") is None  # a subscript: Jinja's


# -- the schema ---------------------------------------------------------------------


def _walk(node, path=()):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, (*path, i))


def test_schema_is_valid_and_documents_every_property_and_enum_value():
    from jsonschema import Draft202012Validator

    schema = load_schema("bot.schema.json")
    Draft202012Validator.check_schema(schema)
    assert schema_path("bot.schema.json").is_file()
    undocumented = []
    for path, node in _walk(schema):
        if {"examples", "default", "if"} & set(path):
            continue  # sample values and conditions, not properties
        for name, prop in node.get("properties", {}).items() if path[-1:] != ("properties",) else ():
            if isinstance(prop, dict) and "description" not in prop:
                undocumented.append((*path, "properties", name))
        for choice in node.get("oneOf", []):
            if "const" in choice and "description" not in choice:
                undocumented.append((*path, "oneOf", choice["const"]))
    assert undocumented == []


def test_brief_format_keys_are_all_in_the_schema():
    defs = load_schema("bot.schema.json")["$defs"]
    assert set(defs["route"]["properties"]) >= {"default", "description", "system", "user", "memory", "model",
                                                "tools", "scope", "roles"}
    assert set(defs["action"]["properties"]) == {"push", "pop", "route", "execute", "immediate", "clear_memory",
                                                 "wipe", "set", "emit", "message", "reply", "result", "cases",
                                                 "call", "end", "choices", "ask", "operator", "remember"}
    # A case adds an action with the same keys, but no nested cases and no pause (the tool's own action pauses).
    assert set(defs["caseAction"]["properties"]) == set(defs["action"]["properties"]) - {"cases", "ask", "operator"}
    assert set(defs["tool"]["properties"]) >= {"description", "parameters", "requires", "handler", "action",
                                               "on_error", "timeout"}


# -- the command line ---------------------------------------------------------------


def test_cli_valid_bot_exit_0(write_bot):
    path = write_bot("name: ok\nroutes: {main: {default: true, system: Hi.}}\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output == f"{path}: valid\n"


def test_cli_warnings_exit_0_and_print_lines():
    path = FIXTURES / "graph_warnings.yaml"
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == (f"{path}:5:24: warning: tool `cancel` pops, but route `main` is only ever the root scope "
                        "(nothing pushes it): calling it there fails at run time")
    assert lines[-1] == f"{path}: valid (3 warnings)"


def test_cli_invalid_exit_1_with_file_line_col():
    path = FIXTURES / "unknown_key.yaml"
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"{path}:8:5: error: unknown key `sytem` in route `flight`; did you mean `system`?",
        f"{path}:16:25: error: unknown key `mesage` in `action` of tool `cancel`; did you mean `message`?",
        f"{path}: invalid: 2 errors, 0 warnings",
    ]


def test_cli_several_paths_summary_and_json():
    good = REPO / "bots" / "hello"
    bad = FIXTURES / "duplicate_key.yaml"
    if not good.is_dir():
        pytest.skip("bots/hello is not in this checkout")
    paths = [str(good), str(bad)]
    result = CliRunner().invoke(main, ["validate", *paths])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"{good}: valid",
        f"{bad}:6:5: error: duplicate key `system` in `routes.main`: first defined on line 5; "
        "YAML would silently keep only the last one",
        f"{bad}: invalid: 1 error, 0 warnings",
        "2 bots checked, 1 invalid: 1 error, 0 warnings",
    ]
    result = CliRunner().invoke(main, ["validate", "--format", "json", *paths])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data == [{"file": str(bad), "line": 6, "col": 5, "severity": "error", "path": "routes.main.system",
                     "message": "duplicate key `system` in `routes.main`: first defined on line 5; "
                                "YAML would silently keep only the last one"}]


def test_cli_usage_errors_exit_2(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["validate"]).exit_code == 2
    missing = runner.invoke(main, ["validate", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    assert runner.invoke(main, ["validate", "--format", "xml", str(tmp_path)]).exit_code == 2


def test_cli_directory_without_bot_yaml(tmp_path):
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code == 1
    assert f"error: no bot.yaml in directory {tmp_path}" in result.output


def test_cli_help_has_an_example():
    result = CliRunner().invoke(main, ["validate", "--help"])
    assert result.exit_code == 0 and "chatrun validate bots/travel" in result.output


@pytest.mark.subprocess
def test_cli_in_a_subprocess_no_traceback(tmp_path):
    bot = tmp_path / "bot.yaml"
    bot.write_text(textwrap.dedent("""\
        name: sub
        routes:
          main:
            default: true
            tools: [go]
        tools:
          go: {description: Go, handler: "mod:run"}
        """))
    (tmp_path / "mod.py").write_text("import sys\nsys.exit(3)\n")  # a handler module that exits on import
    proc = subprocess.run([sys.executable, "-c", "from chatrun.cli import main; main()", "validate", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO / "runner")})
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert f"{bot}:7:25: error: handler `mod:run` of tool `go`: {tmp_path / 'mod.py'} failed to import: SystemExit: 3" \
        in proc.stdout


def test_dates_are_text_and_bad_ones_too(write_bot):
    """`2001-01-01` is a timestamp to YAML, but JSON (and a template) wants text: kept as written."""
    path = write_bot("""\
        name: dates
        description: 2001-01-01
        routes:
          main: {default: true, system: 2020-13-45}
        """)
    config, found = check_bot(path)
    assert found == []
    assert (config.description, config.routes["main"].system) == ("2001-01-01", "2020-13-45")


def test_cli_one_broken_bot_does_not_stop_the_others():
    broken = FIXTURES / "yaml_values.yaml"
    fine = FIXTURES / "graph_warnings.yaml"
    result = CliRunner().invoke(main, ["validate", str(broken), str(fine)])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == (f"{broken}:3:22: error: `.nan` is not a number JSON can hold "
                        "(NaN and infinity are not allowed)")
    assert f"{broken}: invalid: 5 errors, 0 warnings" in lines
    assert f"{fine}: valid (3 warnings)" in lines
    assert lines[-1] == "2 bots checked, 1 invalid: 5 errors, 3 warnings"
    assert "chatrun bug" not in result.output


def test_token_window_from_the_context_size_minus_a_reply_reserve(write_bot):
    """`max_tokens: {context_size, reply_reserve}`: a dynamic maximum; the reserve defaults to the
    route model's max_tokens; a missing or too large reserve is an error at the key."""
    import chatrun

    path = write_bot("""\
        name: ctx
        model: {provider: scripted, max_tokens: 1000}
        memory: {type: token_window, max_tokens: {context_size: 128000}}
        routes:
          main:
            default: true
            memory: {type: token_window, max_tokens: {context_size: 128000, reply_reserve: 4000}}
          other:
            system: Other.
        """)
    bot = chatrun.load_bot(path)
    config = bot.config
    assert (config.routes["main"].memory.context_size, config.routes["main"].memory.reply_reserve) == (128000, 4000)
    from chatrun.memory import make_memory

    main = make_memory(config.route_memory("main"), "m", "gpt-4o-mini", config.route_model("main").max_tokens)
    other = make_memory(config.route_memory("other"), "o", "gpt-4o-mini", config.route_model("other").max_tokens)
    assert (main.max_tokens, other.max_tokens) == (124000, 127000)

    bad = write_bot("""\
        name: ctx
        memory: {type: token_window, max_tokens: {context_size: 128000}}
        routes:
          main:
            default: true
            memory: {type: token_window, max_tokens: {context_size: 100, reply_reserve: 100}}
            tools: [go]
          other: {system: Other.}
          third: {memory: {type: token_window, max_tokens: {context: 5}}}
        tools:
          go: {description: Go, action: {push: other}}
        """, name="bad.yaml")
    _config, found = check_bot(bad)
    assert [(d.line, d.severity, d.message) for d in found if "reachable" not in d.message] == [
        (2, "error", "memory `max_tokens` of route `other` has no `reply_reserve` and the route's model sets no "
                     "`max_tokens` to reserve; give one of them"),
        (6, "error", "memory `max_tokens` of route `main` leaves no room for messages: the reserve of 100 tokens "
                     "is not smaller than context_size 100"),
        (9, "error", "unknown key `context` in `memory.max_tokens` of route `third`; did you mean `context_size`?"),
    ]


def test_a_message_window_of_one_beside_a_system_prompt_is_a_warning(write_bot):
    """docs/memory.md: the system prompt counts as one of `max_messages`, and a user message the
    memory cannot hold is refused as too long; a window of one keeps only the prompt."""
    path = write_bot("""\
        name: tiny
        memory: {type: message_window, max_messages: 1}
        routes:
          main: {default: true, system: Hello., tools: [go]}
          bare: {}
          two: {system: Two., memory: {type: message_window, max_messages: 2}}
        tools:
          go: {description: Go, action: {push: bare}}
        """)
    _config, found = check_bot(path)
    assert [(d.line, d.severity, d.message) for d in found if "max_messages" in d.message] == [
        (2, "warning", "memory `max_messages: 1` of route `main` keeps only its system prompt, so every message of "
                       "the user is refused as too long for the memory; keep at least 2 (the system prompt counts as one)"),
    ]


def test_entry_routes_and_what_they_lead_to_are_reachable(write_bot):
    text = """\
        name: pages
        routes:
          main: {default: true}
          support: {entry: true, tools: [escalate]}
          escalated: {}
          orphan: {}
        tools:
          escalate: {action: {route: escalated}}
        """
    _config, found = check_bot(write_bot(text))
    unreachable = [d.message.split("`")[1] for d in found if "is not reachable" in d.message]
    assert unreachable == ["orphan"]  # not support (an entry), nor escalated (reached from it)
    assert "from the default route `main` or an entry route" in found[0].message
    graph = chatrun.load_bot(write_bot(text)).graph.render("text")
    assert "support [entry; memory: message_window]" in graph
    assert "orphan [memory: message_window; unreachable from main]" in graph


def test_a_user_template_reading_data_unguarded_is_a_warning_that_says_what_works(write_bot):
    def warnings(user: str) -> list[str]:
        _config, found = check_bot(write_bot(f"name: u\nroutes:\n  main:\n    default: true\n    user: {user!r}\n"))
        return [d.message for d in found if "`user` of route" in d.message]

    (only,) = warnings("{{ data.userMessage }}")
    assert "reads `data.userMessage`, which is undefined when a client sends only text" in only
    assert "`user_message`" in only
    for fine in ("{{ user_message }}", "[{{ data.page | default('chat') }}] {{ user_message }}",
                 "{% if data.page is defined %}{{ data.page }}: {% endif %}{{ user_message }}",
                 "{{ data.page if 'page' in data else '' }}{{ user_message }}"):
        assert warnings(fine) == [], fine


def test_a_route_asking_to_stream_is_warned_that_quarkus_clients_get_a_message(write_bot):
    path = write_bot("""\
        name: streams
        routes:
          main:
            default: true
            model: {stream: true}
            tools: []
          said:
            entry: true
            model: {stream: true}
            stream_to_quarkus: false
          multi:
            entry: true
            model: {stream: true}
            stream_to_quarkus: true
        """)
    _config, found = check_bot(path)
    assert [(d.line, d.severity) for d in found] == [(5, "warning")]
    assert "add `stream_to_quarkus: true`" in found[0].message and "route `main`" in found[0].message


def test_a_name_yaml_reads_as_true_false_or_null_is_named_as_written_and_told_to_be_quoted(write_bot):
    path = write_bot("""\
        name: b
        format: 3
        null: x
        routes:
          chat: {default: true, system: hi}
          off: {system: x}
        """)
    _, found = check_bot(path)
    assert [(d.line, d.message) for d in found if d.severity == "error"] == [
        (3, "unknown key `null` at the top level (YAML reads `null` as null, not as text: quote it, `'null':`)"),
        (6, "invalid route name `off` in `routes`: YAML reads `off` as false, not as text: quote it, `'off':`"),
    ]


def test_keys_written_apart_that_yaml_reads_as_one_key_are_both_named_as_written(write_bot):
    """`1:` and `on:` are 1 and true to YAML 1.1, and 1 == True in Python: one key once loaded.
    The error names both as written, with their lines, in every mapping the same way."""
    path = write_bot("""\
        name: b
        format: 3
        state: {1: 0, on: 1}
        routes:
          chat: {default: true, system: hi, tools: [t]}
        tools:
          t:
            description: d
            parameters: {type: object, properties: {a: {type: string}}}
            bind:
              yes: a
              on: a
            action: {set: {1: a, true: b}}
        """)
    _, found = check_bot(path)
    same = [(d.line, d.message) for d in found if "the same key" in d.message]
    assert same == [
        (3, "key `on` in `state` is the same key as `1` on line 3: YAML reads `on` as true and `1` as 1, "
            "one key once loaded; quote them to make them text (`'on':`, `'1':`)"),
        (12, "key `on` in `tools.t.bind` is the same key as `yes` on line 11: YAML reads `on` as true and `yes` "
             "as true, one key once loaded; quote them to make them text (`'on':`, `'yes':`)"),
        (13, "key `true` in `tools.t.action.set` is the same key as `1` on line 13: YAML reads `true` as true and "
             "`1` as 1, one key once loaded; quote them to make them text (`'true':`, `'1':`)"),
    ]
    assert not any("True" in d.message or "False" in d.message for d in found), found


def test_every_diagnostic_names_a_key_yaml_reads_as_no_text_as_written(write_bot):
    """Warnings too (an unreachable route, an unlisted tool, a parameters key), at the key's own line;
    a bound argument YAML reads as true is an error, not silently dropped."""
    path = write_bot("""\
        name: b
        format: 3
        routes:
          chat: {default: true, system: hi, tools: [t]}
          on: {system: x}
        tools:
          t:
            description: d
            parameters: {type: object, properties: {a: {type: string}, no: {type: string}}}
            bind: {off: a}
          1: {description: d}
        canned: {yes: hello}
        """)
    _, found = check_bot(path)
    assert [(d.line, d.severity, d.message.split(":")[0]) for d in found] == [
        (5, "error", "invalid route name `on` in `routes`"),
        (5, "warning", "route `on` is not reachable from the default route `chat`"),
        (9, "error", "`parameters` of tool `t`"),
        (10, "error", "invalid key `off` in `bind` of tool `t`"),
        (11, "error", "invalid tool name `1` in `tools`"),
        (11, "warning", "tool `1` is not listed by any route, so the model can never call it"),
        (12, "error", "invalid key `yes` in `canned`"),
    ]
    assert "key `no` at `properties.no` must be text" in found[2].message
    assert not any("True" in d.message or "False" in d.message for d in found), found


def test_a_key_yaml_reads_as_no_text_in_a_free_mapping_is_an_error_not_a_silent_name(write_bot):
    """Mappings whose keys may be any text (prices by model, HTTP headers) still take text only:
    `on:` or `1:` there would have been the name `True` or `1` said nowhere."""
    path = write_bot("""\
        name: b
        format: 3
        prices: {on: {input: 1, output: 2}}
        routes:
          chat: {default: true, system: hi, tools: [t]}
        tools:
          t:
            description: d
            http: {url: "https://x.example/a", headers: {1: a}}
        """)
    _, found = check_bot(path)
    assert [(d.line, d.message) for d in found] == [
        (3, "invalid key `on` in `prices`: YAML reads `on` as true, not as text: quote it, `'on':`"),
        (9, "invalid key `1` in `http.headers` of tool `t`: YAML reads `1` as 1, not as text: quote it, `'1':`"),
    ]
