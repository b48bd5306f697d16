"""Validation made faster must say exactly what it said before (issue 26).

The quick tag resolver of `definition/yamlpos.py` is compared with PyYAML's own, first
scalar by scalar, then through the whole of `check_bot`: the example bots, every invalid
fixture, and a generated bot (the validation bench's) with errors injected all over it
must give the same diagnostics, file, line, column, severity, message and path, whichever
resolver composes the YAML. Likewise the template reader that skips Jinja's parser for
simple expressions, against Jinja's parser on every template.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from chatrun.definition import checks, yamlpos
from chatrun.definition.loader import check_bot

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_BOTS = sorted(p for p in (REPO / "bots").iterdir() if (p / "bot.yaml").exists())
INVALID = sorted((REPO / "tests" / "fixtures" / "invalid").glob("*.yaml"))

# Every implicit tag's edge cases, near misses, and plain words starting with a claimed letter.
SCALARS = ["", "a", "true", "True", "TRUE", "tRue", "yes", "Yes", "no", "NO", "on", "Off", "y", "n", "Y",
           "null", "Null", "NULL", "~", "nul", "none", "12", "-1", "+3", "0x1f", "0o7", "0b101", "1_000",
           "017", "1.5", ".5", "1e3", "1.0e+3", ".inf", "-.Inf", "+.INF", ".nan", ".NaN", "1:20", "190:20:30.15",
           "2001-01-01", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10", "<<", "=", "-", "+", ".",
           "the user", "name", "nope", "offset", "to", "yes please", "!x", "&x", "*x", "description", "0.",
           "route r1", "1 2", "True story", "~user", "FALSE", "Nothing set"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("implicit", [(True, False), (False, True), (False, False), (True, True)])
def test_the_quick_resolver_gives_pyyamls_tag_for_every_scalar(implicit):
    quick, pyyaml = yamlpos._Loader(""), yaml.SafeLoader("")
    for value in SCALARS:
        assert quick.resolve(yaml.ScalarNode, value, implicit) == pyyaml.resolve(yaml.ScalarNode, value, implicit), value
    for kind in (yaml.SequenceNode, yaml.MappingNode):
        assert quick.resolve(kind, None, implicit) == pyyaml.resolve(kind, None, implicit)


def test_the_quick_resolver_gives_the_same_tags_for_the_same_scalars_in_a_document():
    plain = [v for v in SCALARS if v not in ("", "<<", "-", "!x", "&x", "*x")]  # these are not plain values
    text = "\n".join(f"{v}: {v}" if v != "=" else "k: =" for v in plain) + "\n" + \
        "\n".join(f"k{i}: {v}" for i, v in enumerate(plain))
    quick = yaml.compose(text, Loader=yamlpos._Loader)
    pyyaml = yaml.compose(text, Loader=yaml.SafeLoader)
    assert [(k.tag, v.tag) for k, v in quick.value] == [(k.tag, v.tag) for k, v in pyyaml.value]
    assert len(quick.value) == 2 * len(plain)


def _both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    quick = check_bot(path)[1]
    with monkeypatch.context() as patched:
        patched.setattr(yamlpos, "_Loader", yamlpos._BaseLoader)  # the resolver as PyYAML ships it
        before = check_bot(path)[1]
    return quick, before


@pytest.mark.parametrize("path", EXAMPLE_BOTS + INVALID, ids=lambda p: p.name)
def test_example_and_invalid_bots_get_the_same_diagnostics(path, monkeypatch):
    quick, before = _both(path, monkeypatch)
    assert quick == before
    if path in INVALID:
        assert quick  # every invalid fixture has something to say: the comparison compared something


# Errors to inject into the generated bot: (text to find, its replacement). Misspelt keys, a
# wrong type, bad templates and conditions, unknown tools and routes, a duplicate key, values
# the resolver turns into booleans, null and numbers where text belongs.
INJECTED = [
    ("    description: Route number 3\n", "    descripton: Route number 3\n"),
    ("    description: Route number 7\n", "    description: yes\n"),
    ("    description: Route number 8\n", "    description: 12\n    description: twice\n"),
    ("      You are step 11.", "      You are {{ step 11."),
    ("{{ scope.form_12 | tojson }}", "{{ scope.form_12 | tojsn }}"),
    ("    tools: [set_13, next_13, back_13]", "    tools: [set_13, nxt_13, back_13]"),
    ("    memory: {type: message_window, max_messages: 20}\n    scope:\n      local: {form_14",
     "    memory: {type: message_window, max_messages: off}\n    scope:\n      local: {form_14"),
    ("  set_15:\n    description: Set the field of step 15", "  set_15:\n    description: ~"),
    ("args.value == 'skip' or state.visits > 16", "args.value == 'skip' or stat.visits > 16"),
    ("{else: {push: r18}}", "{else: {push: r1800}}"),
    ("{if: scope.form_19.other,", "{if: scope.form_19.other ==,"),
    ("    requires: [scope.form_20.field]", "    requires: [scope.form_20.field, 0x1f]"),
    ("      emit: {Thinking: 'Step 21 field", "      emit: {Thinking: .nan, Other: 'Step 21 field"),
]


def test_a_generated_bot_with_injected_errors_gets_the_same_diagnostics(tmp_path, monkeypatch):
    quick, before = _both(_generated_with_errors(tmp_path), monkeypatch)
    assert quick == before
    assert len({d.line for d in quick if d.severity == "error"}) >= len(INJECTED) - 2  # nearly all are reported


def _generated_with_errors(tmp_path: Path, routes: int = 40) -> Path:
    text = _load("bench_validate").generate(routes)
    for old, new in INJECTED:
        assert old in text, old
        text = text.replace(old, new, 1)
    bot = tmp_path / "bot.yaml"
    bot.write_text(text)
    return bot


MULTILINE = """\
name: lines
model: {provider: openai, name: gpt-4o-mini}
state: {a: {b: 1}}
routes:
  main:
    default: true
    system: |
      Line one {{ state.a.b }} and {{ stat.a
         | upper }}, {{ state.a.c |
           tojsn }}
      then {{
        args.nope or
        state.a.b
      }} and {{ data.x }} {{ state.a.b | upper | lowr }}
"""


@pytest.mark.parametrize("bot", ["generated", "multiline", "travel", "airline"])
def test_templates_read_without_jinja_give_what_jinjas_parser_gives(bot, tmp_path, monkeypatch):
    if bot == "generated":
        path = _generated_with_errors(tmp_path)
    elif bot == "multiline":
        path = tmp_path / "bot.yaml"
        path.write_text(MULTILINE)
    else:
        path = REPO / "bots" / bot
    checks._analyse.cache_clear()
    quick = check_bot(path)[1]
    checks._analyse.cache_clear()
    checks._paths_read.cache_clear()  # (what the effects read: from Jinja's parser too)
    with monkeypatch.context() as patched:
        patched.setattr(checks, "_analyse_simple", lambda source: None)  # every template through Jinja's parser
        parsed = check_bot(path)[1]
    checks._analyse.cache_clear()
    # The same diagnostics; two on one line may come in another order (Jinja walks its tree).
    assert sorted(quick, key=repr) == sorted(parsed, key=repr)
    if bot == "multiline":
        # each at its own line of the file: `tojsn` on the line after its `|` (as Jinja says)
        assert [(d.line, d.severity, d.message.split("; ")[0][-22:]) for d in quick] == [
            (8, "error", "mplate variable `stat`"),
            (8, "warning", ": false}` on the route"),  # a system prompt reading the state: at its first read
            (9, "warning", "the top-level `state:`"),
            (10, "error", "o filter named `tojsn`"), (14, "error", "no filter named `lowr`"),
        ]


FORMAT2_BOT = """\
name: old
routes:
  main:
    default: true
    tools: [pick]
tools:
  pick:
    description: Pick one
    action: {ask: {from: user, text: Which one, into: state.choice}}
"""


@pytest.mark.parametrize("case", ["examples", "format2", "invalid"])
def test_the_format_of_a_bot_without_format_is_judged_part_by_part_as_on_the_whole_file(case, tmp_path):
    """Which schema a bot without `format:` fits is decided route by route and tool by tool
    (the fast path, then jsonschema on a part that fails it), as the diagnostics are: it must
    be what jsonschema says of the whole file, for bots that fit 3, fit only 2, or fit neither."""
    from chatrun.definition import loader

    if case == "examples":
        docs = [yamlpos.read_yaml_file(path / "bot.yaml").data for path in EXAMPLE_BOTS]
    elif case == "format2":
        docs = [yaml.safe_load(FORMAT2_BOT)]
    else:
        docs = [yaml.safe_load(_generated_with_errors(tmp_path).read_text().replace("description: 12\n    ", ""))]
    for data in docs:
        for schema_file in (loader.BOT_SCHEMA, loader.FORMAT2_SCHEMA):
            whole = next(loader._validator(None, schema_file).iter_errors(data), None) is None
            assert loader._fits(data, schema_file) == whole, (data.get("name"), schema_file)
    if case == "format2":
        assert loader._schema_choice(docs[0]) == (loader.FORMAT2_SCHEMA, True)
    if case == "invalid":
        assert loader._schema_choice(docs[0]) == (loader.BOT_SCHEMA, False)
