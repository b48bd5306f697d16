"""A guarantee the docs state points at the test that tries to break it (the house rule: "a doc
that says 'exactly once' or 'never' points at the test that tries to break it").

A unit of prose — a paragraph, a list item or a table row outside fenced code; a heading goes
with the unit after it — of README.md or docs/*.md that says "exactly once" or "never" names
`tests/NAME.py`, a file of this suite. Advice or a fact about another system is worded without
those words ("do not", "has no"); a claim is cited, or narrowed to what a test holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CLAIM = re.compile(r"exactly[ -]once|\bnever\b", re.IGNORECASE)
CITED = re.compile(r"tests/([\w/]+\.py)")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s|^\s*\|")  # a list item or a table row starts a unit


def units(text: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each unit of prose outside fenced code."""
    unit: list[str] = []
    start, fenced, heading = 0, False, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            if unit:
                yield start, "\n".join(unit)
            unit, heading = [], False
            continue
        if fenced:
            continue
        breaks = not line.strip() or ITEM.match(line) or line.startswith("#")
        if breaks and unit and not (heading and len(unit) == 1):
            yield start, "\n".join(unit)
            unit = []
        if not line.strip():
            continue
        if not unit:
            start = number
        unit.append(line)
        heading = line.startswith("#")
    if unit:
        yield start, "\n".join(unit)


def uncited(text: str) -> list[int]:
    """The first lines of the units that claim without naming a test of this suite."""
    return [line for line, unit in units(text)
            if CLAIM.search(unit) and not any((ROOT / "tests" / name).is_file() for name in CITED.findall(unit))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_test_a_page_names_exists(page):
    """`tests/NAME.py::test_x` names a test function of that file (a renamed test breaks the link)."""
    missing = [m.group(0) for m in re.finditer(r"tests/([\w/]+\.py)::(\w+)", page.read_text(encoding="utf-8"))
               if not (ROOT / "tests" / m.group(1)).is_file()
               or not re.search(rf"^\s*(?:async )?def {m.group(2)}\b", (ROOT / "tests" / m.group(1)).read_text(), re.M)]
    assert not missing, f"{page.relative_to(ROOT)} names tests that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_claim_of_the_page_names_its_test(page):
    lines = uncited(page.read_text(encoding="utf-8"))
    assert not lines, (f"{page.relative_to(ROOT)}: lines {lines} say 'never' or 'exactly once' without naming "
                       "tests/NAME.py: cite the test that tries to break the claim, or word advice without them")


def test_the_units_of_a_page():
    text = """# A title

A paragraph that never
cites (tests/test_docs_claims.py).

- an item that never cites
- an item citing tests/test_docs_claims.py that never fails
| a row | never |

## A heading that says never
and the text under it cites tests/test_docs_claims.py

```sh
echo never
```
Text after code, exactly once, citing tests/no_such_file.py.
"""
    found = list(units(text))
    assert [line for line, _ in found] == [1, 6, 7, 8, 10, 16]  # a heading and the unit after it are one
    assert found[0][1].startswith("# A title\nA paragraph") and "cites" in found[4][1]
    assert uncited(text) == [6, 8, 16]  # an item, a row, a test that does not exist
