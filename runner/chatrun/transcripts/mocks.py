"""Tools in golden transcripts: `mocks:` stand in for handlers and HTTP tools, so a transcript
replays offline and deterministically; `--record` writes real results as mocks. Which tools
must be mocked is each tool kind's to say (chatrun.toolkinds.outside). A mock's `request:`
checks the HTTP request an `http:` or `openapi:` tool would have sent (built, not sent)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from chatrun.definition.config import ToolConfig
from chatrun.engine.tools import Mocked
from chatrun.errors import TurnFailed
from chatrun.toolkinds import outside
from chatrun.transcripts.expect import is_matcher, match

REQUEST_KEYS = ("method", "url", "query", "headers", "json", "form", "files")


class TranscriptMocks:
    """The `ToolMocks` of a transcript run: the current turn's mocks, then the transcript's.
    A handler no mock matches runs for real (it is the bot's own code); an HTTP or MCP tool no
    mock matches fails the turn, naming the tool — unless `live` (recording), when it runs
    and its outcome is kept in `recorded`. `file` and `lines` (each mock's line, as the
    turn's `lines` in next_turn) name a mock's place in the messages of a `request:` check."""

    def __init__(self, transcript_mocks: list[dict[str, Any]], live: bool = False, file: str = "",
                 lines: list[int] | None = None):
        self.transcript_mocks = transcript_mocks
        self.file = file
        self.transcript_where = self._where(transcript_mocks, lines)
        self.turn_mocks: list[dict[str, Any]] = []
        self.turn_where: list[str] = []
        self.live = live
        self.recorded: list[dict[str, Any]] = []
        self.used: set[int] = set()  # id() of the mocks that answered a call (see _pick)

    def next_turn(self, mocks: list[dict[str, Any]], lines: list[int] | None = None) -> None:
        self.turn_mocks = mocks
        self.turn_where = self._where(mocks, lines)
        self.recorded = []

    def _where(self, mocks: list[dict[str, Any]], lines: list[int] | None) -> list[str]:
        """Each mock's place, file:line (the mock's tool when its line is not known)."""
        known = lines or []
        return [f"{self.file}:{known[i]}" if i < len(known) and self.file else f"the mock of {m.get('tool')}"
                for i, m in enumerate(mocks)]

    def lookup(self, tool: ToolConfig, args: dict[str, Any]) -> Mocked | None:
        mocks = [*zip(self.turn_mocks, self.turn_where, strict=True),
                 *zip(self.transcript_mocks, self.transcript_where, strict=True)]
        matching = [(m, w) for m, w in mocks if m.get("tool") == tool.name and _includes(args, m.get("args") or {})]
        if matching:
            mock, where = self._pick(matching)
            wanted = mock.get("request")
            check = request_check(wanted, where, tool.name) if isinstance(wanted, dict) else None
            return Mocked(mock.get("result"), mock.get("error"), check)
        what = outside(tool)
        if what is not None and not self.live:
            raise TurnFailed(f"tool {tool.name} calls {what}, and no mock of this transcript matches the call "
                             f"(arguments {args}); add one to the turn's or the transcript's `mocks:` "
                             "(or record real results with `chatrun test --record`)")
        return None

    def _pick(self, matching: list[tuple[dict[str, Any], str]]) -> tuple[dict[str, Any], str]:
        """The first matching mock, as always — unless the same list (the turn's, or the
        transcript's) has more mocks with the same `args` after it: those answer the same call
        in turn, the last one repeating, as /save and --record write a call that was made
        twice and got two answers."""
        first, _ = matching[0]
        source = self.turn_mocks if any(first is m for m in self.turn_mocks) else self.transcript_mocks
        siblings = [(m, w) for m, w in matching if m.get("args") == first.get("args") and any(m is s for s in source)]
        for mock, where in siblings:
            if id(mock) not in self.used or mock is siblings[-1][0]:
                self.used.add(id(mock))
                return mock, where
        return siblings[-1]

    def mocked_tools(self) -> set[str]:
        return {m["tool"] for m in [*self.turn_mocks, *self.transcript_mocks] if isinstance(m.get("tool"), str)}

    def observe(self, tool: ToolConfig, args: dict[str, Any], result: Any, error: str | None) -> None:
        if self.live and outside(tool) is not None:
            mock: dict[str, Any] = {"tool": tool.name, "args": copy.deepcopy(args)}
            mock.update({"error": error} if error is not None else {"result": copy.deepcopy(result)})
            self.recorded.append(mock)


def _includes(args: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(key in args and args[key] == value for key, value in wanted.items())


def request_check(wanted: dict[str, Any], where: str, tool: str) -> Callable[[dict[str, Any] | None], None]:
    """What the engine calls with the request `tool` would send: fails the turn, naming the
    mock's place and every part that differs, unless the request is what `wanted` says."""

    def check(sent: dict[str, Any] | None) -> None:
        if sent is None:
            raise TurnFailed(f"{where}: this mock of {tool} has `request:`, but {tool} sends no HTTP request of "
                             "its own (only `http:` and `openapi:` tools do); remove `request:`")
        differences = request_differences(wanted, sent)
        if differences:
            raise TurnFailed(f"{where}: the request {tool} would send is not the one this mock expects: "
                             + "; ".join(differences))

    return check


def request_differences(wanted: dict[str, Any], sent: dict[str, Any]) -> list[str]:
    """Each part of `wanted` (a mock's `request:`) that `sent` does not match, in words.
    `method` ignores case; `headers` checks the headers named (names ignore case: the client
    adds its own; `null`: not sent); `query` and `form` values are text, so `page: 2` matches "2"."""
    found = []
    for key in REQUEST_KEYS:
        if key not in wanted:
            continue
        expected, actual = wanted[key], sent.get(key)
        if key == "method":
            expected, actual = str(expected).upper(), str(actual).upper()
        elif key in ("query", "form") and isinstance(expected, dict) and not is_matcher(expected):
            expected = {k: _as_sent_text(v) for k, v in expected.items()}
        if key == "headers" and isinstance(expected, dict):
            found += _header_differences(expected, actual or {})
        elif not match(expected, actual):
            found.append(f"{key}: expected {_shown(expected)}, it would send {_shown(actual)}")
    return found


def _header_differences(expected: dict[str, Any], sent: dict[str, str]) -> list[str]:
    by_name = {name.lower(): value for name, value in sent.items()}
    found = []
    for name, value in expected.items():
        actual = by_name.get(name.lower())
        if value is None:  # `null`: the request must not carry it
            if actual is not None:
                found.append(f"header {name}: expected none, it would send {_shown(actual)}")
        elif actual is None:
            found.append(f"header {name}: expected {_shown(value)}, it would not send it")
        elif not match(_as_sent_text(value), actual):
            found.append(f"header {name}: expected {_shown(value)}, it would send {_shown(actual)}")
    return found


def _as_sent_text(value: Any) -> Any:
    """A plain value as the request carries it (text); matchers and text stay as written."""
    if isinstance(value, str) or is_matcher(value):
        return value
    return json.dumps(value)


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
