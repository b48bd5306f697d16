"""What the loader and the checks share: which file each route and tool came from,
and the words diagnostics are written with."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chatrun.definition.yamlpos import Pos, YamlDoc
from chatrun.errors import Diagnostic


@dataclass
class Sources:
    """The files of one bot and which file each route and tool came from, so checks can
    put their diagnostics on the right line of the right file."""

    main: YamlDoc
    docs: list[YamlDoc] = field(default_factory=list)
    origin: dict[tuple[str, str], YamlDoc] = field(default_factory=dict)  # ("routes", name) -> file

    def doc_of(self, kind: str, name: str) -> YamlDoc:
        return self.origin.get((kind, name), self.main)

    def at(self, kind: str, name: str, *sub: Any) -> tuple[str, Pos]:
        doc = self.doc_of(kind, name)
        return doc.file, doc.pos((kind, name, *sub))

    def diag(self, severity: str, message: str, kind: str, name: str, *sub: Any) -> Diagnostic:
        file, pos = self.at(kind, name, *sub)
        return Diagnostic(file, pos.line, pos.col, severity, message, ".".join(map(str, (kind, name, *sub))))


def suggest(word: str, choices: Iterable[Any]) -> str:
    """"; did you mean `X`?" for the choice closest to `word`, or ""."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""



def subject(path: tuple) -> str:
    """A JSON path in words: ("routes", "flight", "memory") -> "`memory` of route `flight`"."""
    if not path:
        return "the top level"
    if path[0] in ("routes", "tools") and len(path) >= 2:
        owner = f"{'route' if path[0] == 'routes' else 'tool'} `{path[1]}`"
        return f"`{dotted(path[2:])}` of {owner}" if len(path) > 2 else owner
    return f"`{dotted(path)}`"


def inside(path: tuple) -> str:
    """ "in route `flight`", "in `action` of tool `book`", "at the top level"."""
    return f"in {subject(path)}" if path else "at the top level"


def dotted(path: tuple) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
