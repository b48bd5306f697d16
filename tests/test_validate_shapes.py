"""The checks' memos on repeated shapes change no diagnostic (issue 39).

`checks.MEMOS` turns off every memo and shortcut the checks take on a big bot's repeated shapes
(a template read once per shape of its digit runs, a state path judged once, the loop check
skipped when no action can loop). Each bot is checked with them on and off, every cache emptied
in between, and the whole list of diagnostics (file, line, column, severity, message, path, in
order) must be the same: every example bot, every fixture bot, every bot written in a test file
of this suite, and generated bots whose repeated routes and tools differ in one detail that
matters (a scope key one route does not declare, a tool listed on a route that cannot see its
scope, a route target that does not exist, runs of digits that repeat or not).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from chatrun.definition import checks
from chatrun.definition.loader import check_bot
from chatrun.definition.templates import ENV

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_BOTS = sorted(p for p in (REPO / "bots").iterdir() if (p / "bot.yaml").exists())
FIXTURE_BOTS = sorted([*(REPO / "tests" / "fixtures").rglob("*.yaml")])


def _clear() -> None:
    for cache in (checks._analyse, checks._paths_read, checks._analyse_one_line, checks._simple_expression,
                  checks._SHAPES):
        cache.cache_clear()


def _both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """(diagnostics with the memos, without them), from empty caches each time."""
    _clear()
    raw_on = _raw(path)
    memo = check_bot(path)[1]
    with monkeypatch.context() as patched:
        patched.setattr(checks, "MEMOS", False)
        _clear()
        raw_off = _raw(path)
        plain = check_bot(path)[1]
    _clear()
    assert raw_on == raw_off  # before sorting too: the same diagnostics in the same order
    return memo, plain


def _raw(path: Path) -> list:
    """The checks' own list, in the order they found them (check_bot sorts it)."""
    found: list = []
    original = checks.run_checks

    def keeping(config, sources):  # type: ignore[no-untyped-def]
        out = original(config, sources)
        found.extend(out)
        return out

    from chatrun.definition import loader

    loader.run_checks = keeping
    try:
        check_bot(path)
    finally:
        loader.run_checks = original
    return found


@pytest.mark.parametrize("path", EXAMPLE_BOTS + FIXTURE_BOTS, ids=lambda p: str(p.relative_to(REPO)))
def test_example_and_fixture_bots_get_the_same_diagnostics_with_and_without_the_memos(path, monkeypatch):
    memo, plain = _both(path, monkeypatch)
    assert memo == plain


def _bots_in_tests() -> list[tuple[str, str]]:
    """Every bot written as text in this suite's test files (a string holding `routes:`)."""
    bots = []
    for file in sorted((REPO / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "routes:" in node.value \
                    and "\n" in node.value:
                bots.append((f"{file.stem}:{node.lineno}", node.value))
    return bots


def test_every_bot_written_in_the_tests_gets_the_same_diagnostics_with_and_without_the_memos(tmp_path, monkeypatch):
    bots = _bots_in_tests()
    assert len(bots) > 100
    said = 0
    for i, (where, text) in enumerate(bots):
        path = tmp_path / f"bot{i}.yaml"
        path.write_text(text)
        memo, plain = _both(path, monkeypatch)
        assert memo == plain, where
        said += bool(memo)
    assert said > 50  # most say something: the comparison compared diagnostics


def _generate(routes: int) -> str:
    spec = importlib.util.spec_from_file_location("bench_validate", REPO / "bench" / "bench_validate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate(routes)


# One detail changed in one of the repeated routes or tools, so that instances of one shape differ
# in what matters: (text to find, its replacement).
DETAILS = {
    "scope key not declared on one route": ("      local: {form_5: {field: null, other: null}}",
                                            "      local: {form_55: {field: null, other: null}}"),
    "tool listed on a route that cannot see its scope": ("    tools: [set_9, next_9, back_9]",
                                                         "    tools: [set_9, next_9, back_9, next_3, set_4]"),
    "unknown route target": ("{else: {push: r12}}", "{else: {push: r1200}}"),
    "state key read that is not declared": ("state.visits > 13", "state.visit > 13"),
    "nested path below a declared key": ("{{ scope.form_14.field }}", "{{ scope.form_14.field.deep }}"),
    "the same run twice, then two runs": ("'Step 15 field set to {{ args.value }}'",
                                          "'{{ scope.form_15.field }} {{ scope.form_15.field.x }}'"),
    "two runs, then the same run twice": ("'Step 16 field set to {{ args.value }}'",
                                          "'{{ scope.form_16.field }} {{ scope.form_1.field.x }}'"),
    "an undeclared argument": ("Step 17 field set to {{ args.value }}", "Step 17 field set to {{ args.valu }}"),
    "a filter that does not exist": ("{{ scope.form_18 | tojson }}", "{{ scope.form_18 | tojson2 }}"),
    "a condition that does not compile": ("{if: scope.form_19.other,", "{if: scope.form_19.other ==,"),
    "a move beside end": ("{pop: true, result: 'Step 20 done", "{pop: true, end: true, result: 'Step 20 done"),
    "execute without a move": ("{else: {push: r23}}", "{else: {message: stay}}"),
    "a case that loops": ("then: {route: r23}}", "then: {route: r23, call: r2}}"),
    "state declared deeper": ("  visits: 0", "  visits: 0\n  form: {a1: {b2: null}}"),
    "parameters that are no schema on one tool": ("{value: {type: string}}, required: [value]}\n    action:\n"
                                                  "      set: {scope.form_7.field",
                                                  "{value: {type: strng}}, required: [value]}\n    action:\n"
                                                  "      set: {scope.form_7.field"),
    "an unknown variable read whole": ("Step 24 field set to {{ args.value }}", "Step 24 field set to {{ arg }}"),
}


@pytest.mark.parametrize("detail", sorted(DETAILS))
def test_generated_bots_differing_in_one_detail_get_the_same_diagnostics(detail, tmp_path, monkeypatch):
    text = _generate(30)
    old, new = DETAILS[detail]
    assert old in text, old
    path = tmp_path / "bot.yaml"
    path.write_text(text.replace(old, new, 1))
    memo, plain = _both(path, monkeypatch)
    assert memo == plain
    assert len(memo) > 30  # the 30 prompt-cache warnings and what the detail adds


def test_the_generated_bench_bot_gets_the_same_diagnostics(tmp_path, monkeypatch):
    path = tmp_path / "bot.yaml"
    path.write_text(_generate(300))
    memo, plain = _both(path, monkeypatch)
    assert memo == plain and len(memo) == 301


# Templates of one shape (the same text once each run of digits is `0`) that read differently,
# or alike: each must get what the reader says of it alone, whichever was read first.
SHAPES = [
    ["{{ scope.form_1.a }} {{ scope.form_1.a.b }}", "{{ scope.form_1.a }} {{ scope.form_2.a.b }}",
     "{{ scope.form_2.a }} {{ scope.form_2.a.b }}", "{{ scope.form_12.a }} {{ scope.form_21.a.b }}"],
    ["{{ state.a1 or state.a1.b2 }}", "{{ state.a1 or state.a2.b2 }}", "{{ state.a3 or state.a3.b3 }}"],
    ["x {{ args.v1 > 10 }}\n{{ state.s10.x | upper }} {{ state.s10 }}", "x {{ args.v2 > 10 }}\n{{ state.s10.x | upper }} "
     "{{ state.s10 }}", "x {{ args.v2 > 20 }}\n{{ state.s20.x | upper }} {{ state.s20 }}"],
    ["{{ 1.5 * state.n1 }}", "{{ 22.5 * state.n22 }}", "{{ 22.5 * state.n5 }}"],
    ["{{ state.p1.get('k1') }}", "{{ state.p2.get('k2') }}", "{{ state.p2.items }}"],
    ["{{ x | nosuch1 }}", "{{ x | nosuch2 }}", "{{ a7 is none and b7 is not defined }}"],
    ["{{ 'it is 12' ~ state.r12 }}", "{{ 'it is 12' ~ state.r13 }}", "step 3 {{ state.q3 }} 4"],
]


@pytest.mark.parametrize("family", range(len(SHAPES)))
def test_templates_of_one_shape_are_read_as_each_alone(family):
    for order in (SHAPES[family], list(reversed(SHAPES[family]))):
        _clear()
        alone = []
        for source in order:
            checks._SHAPES.cache_clear()
            alone.append(checks._analyse_simple_text(source))
        checks._SHAPES.cache_clear()
        assert [checks._SHAPES.analysis(source) for source in order] == alone


def test_a_filter_named_with_a_digit_turns_the_shapes_off(monkeypatch):
    """With a filter `b64` beside a name `b65`, digits tell words apart: no reading is shared."""
    _clear()
    unknown = checks._SHAPES.analysis("{{ x | b65 }}")
    assert unknown == (((("x",), 1),), (("filter", "b65", 1),))
    monkeypatch.setitem(ENV.filters, "b64", lambda v: v)
    assert checks._SHAPES.analysis("{{ x | b64 }}") == (((("x",), 1),), ())  # known: not b65's reading renamed
    assert checks._SHAPES.analysis("{{ x | b65 }}") == unknown
    monkeypatch.delitem(ENV.filters, "b64")
    _clear()
