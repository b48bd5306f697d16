"""Tools in golden transcripts: `mocks:` stand in for handlers and HTTP tools, so a transcript
replays offline and deterministically; `--record` writes real results as mocks. Which tools
must be mocked is each tool kind's to say (chatrun.toolkinds.outside)."""

from __future__ import annotations

import copy
from typing import Any

from chatrun.definition.config import ToolConfig
from chatrun.engine.tools import Mocked
from chatrun.errors import TurnFailed
from chatrun.toolkinds import outside


class TranscriptMocks:
    """The `ToolMocks` of a transcript run: the current turn's mocks, then the transcript's.
    A handler no mock matches runs for real (it is the bot's own code); an HTTP or MCP tool no
    mock matches fails the turn, naming the tool — unless `live` (recording), when it runs
    and its outcome is kept in `recorded`."""

    def __init__(self, transcript_mocks: list[dict[str, Any]], live: bool = False):
        self.transcript_mocks = transcript_mocks
        self.turn_mocks: list[dict[str, Any]] = []
        self.live = live
        self.recorded: list[dict[str, Any]] = []

    def next_turn(self, mocks: list[dict[str, Any]]) -> None:
        self.turn_mocks = mocks
        self.recorded = []

    def lookup(self, tool: ToolConfig, args: dict[str, Any]) -> Mocked | None:
        for mock in [*self.turn_mocks, *self.transcript_mocks]:
            if mock.get("tool") == tool.name and _includes(args, mock.get("args") or {}):
                return Mocked(mock.get("result"), mock.get("error"))
        what = outside(tool)
        if what is not None and not self.live:
            raise TurnFailed(f"tool {tool.name} calls {what}, and no mock of this transcript matches the call "
                             f"(arguments {args}); add one to the turn's or the transcript's `mocks:` "
                             "(or record real results with `chatrun test --record`)")
        return None

    def mocked_tools(self) -> set[str]:
        return {m["tool"] for m in [*self.turn_mocks, *self.transcript_mocks] if isinstance(m.get("tool"), str)}

    def observe(self, tool: ToolConfig, args: dict[str, Any], result: Any, error: str | None) -> None:
        if self.live and outside(tool) is not None:
            mock: dict[str, Any] = {"tool": tool.name, "args": copy.deepcopy(args)}
            mock.update({"error": error} if error is not None else {"result": copy.deepcopy(result)})
            self.recorded.append(mock)


def _includes(args: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(key in args and args[key] == value for key, value in wanted.items())
