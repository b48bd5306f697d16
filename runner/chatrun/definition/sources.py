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


def file_kind(data: Any) -> str | None:
    """What a YAML file is by its top-level keys — "bot" (`routes:`), "transcript" (`turns:` or
    `refused:`) or "scenario" (`persona:`, `goal:`) — or None when it is not clearly one. The one
    rule by which each command tells a file meant for another apart from a broken one of its own."""
    if not isinstance(data, dict):
        return None
    if "routes" in data:
        return None if "turns" in data or "bot" in data else "bot"
    if "turns" in data or "refused" in data:
        return "transcript"
    if "persona" in data or "goal" in data:
        return "scenario"
    return None


def wrong_file(file: str, data: Any, wanted: str) -> Diagnostic | None:
    """The one error for a file given to a command that reads another kind (`wanted`): what it
    is and the command that reads it; None when it is not clearly another kind."""
    import shlex
    from pathlib import Path

    kind = file_kind(data)
    if kind is None or kind == wanted:
        return None
    what = {"bot": "it has `routes:`", "transcript": "it has `turns:`", "scenario": "it has `persona:` and `goal:`"}
    reads = {"bot": "a bot: a directory holding bot.yaml, or one YAML file with `routes:`",
             "transcript": "transcripts: a transcript file, or a directory searched for YAML files with `turns:`",
             "scenario": "scenarios: a scenario file, a folder of them, or a bot's folder holding scenarios/"}
    folder = shlex.quote(str(Path(file).parent))
    run = {"transcript": f"`chatrun test {shlex.quote(file)}` replays it against its bot",
           "scenario": f"`chatrun simulate {shlex.quote(file)}` plays it",
           "bot": (f"`chatrun simulate {folder}` plays the bot's scenarios (its scenarios/ folder)" if wanted == "scenario"
                   else f"`chatrun test {folder}` replays the bot's transcripts (e.g. its transcripts/ folder)")
           + f"; `chatrun validate {shlex.quote(file)}` checks the bot"}[kind]
    return Diagnostic(file, 1, 1, "error", f"this is a {kind} ({what[kind]}), not a {wanted}: {run}; "
                      f"this command takes {reads[wanted]}")
