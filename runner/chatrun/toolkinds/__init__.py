"""The table of tool kinds: where a tool's result comes from, one module per kind.

    handler   handler.py   the bot's Python function (`module:function`)
    http      http.py      a declarative HTTP call
    openapi   openapi.py   an OpenAPI operation; becomes an `http` tool when the bot loads
    mcp       mcp.py       a tool of an MCP server (the servers: mcp_servers.py)
    knowledge knowledge.py `search_knowledge`, which a route's `knowledge:` offers (chatrun.knowledge)

Each module holds its whole kind (base.py says what a kind provides): the config and how
it is parsed, its checks, its call, and how replays treat it — as jsonschema keeps one
function per keyword in a table, and Rasa one module per kind of call. Adding a kind is
its module, a line in KINDS, its key in schemas/bot.schema.json and its docs.

Layering (tests/test_architecture.py): this package is layer 2, beside models/ — above the
definition stage, below the engine. A kind's call needs libraries and what the engine
hands it (`CallContext`), never the engine itself, so the engine and the clients
(transcripts, cli) import this table directly. The definition stage must not import
upward, so it reaches the kinds through its own table (chatrun.definition.kinds), filled
here by `register`: chatrun/__init__.py (which runs before any chatrun module) tells that
table to import this package the first time it is asked for, so the kinds are registered
before any bot is loaded, and `chatrun --help` never imports them.
"""

from __future__ import annotations

from typing import Any

from chatrun.definition.config import BotConfig, ToolConfig
from chatrun.definition.kinds import register
from chatrun.errors import Diagnostic
from chatrun.toolkinds.base import ToolKind
from chatrun.toolkinds.handler import HandlerKind
from chatrun.toolkinds.http import HttpKind
from chatrun.toolkinds.knowledge import KnowledgeKind
from chatrun.toolkinds.mcp import McpKind
from chatrun.toolkinds.openapi import OpenApiKind

KINDS: dict[str, ToolKind[Any]] = {kind.key: kind for kind in (HandlerKind(), HttpKind(), OpenApiKind(), McpKind(),
                                                                  KnowledgeKind())}

for _kind in KINDS.values():
    register(_kind)


def kind_of(tool: ToolConfig) -> ToolKind[Any] | None:
    """The kind that gives `tool` its result (None: an action-only tool)."""
    key = tool.kind
    return KINDS[key] if key is not None else None


def outside(tool: ToolConfig) -> str | None:
    """What calling `tool` reaches outside the bot ("an HTTP API", "the MCP server files"), or
    None when it is the bot's own code or an action only. A replay must mock what is outside;
    `chatrun test --record` keeps its real results as mocks."""
    kind = kind_of(tool)
    return kind.outside(tool.kinds[kind.key]) if kind is not None else None


def may_emit_any_event(config: BotConfig) -> bool:
    """Whether some tool's own code may send events of any type (a handler's ctx.emit)."""
    return any(kind is not None and kind.emits_events for kind in map(kind_of, config.tools.values()))


def unconnected(config: BotConfig) -> list[str]:
    """What `chatrun validate` leaves unchecked without `--connect` (MCP tool names), in words."""
    notes = [kind.unconnected(config) for kind in KINDS.values()]
    return [note for note in notes if note is not None]


async def connect_checks(config: BotConfig) -> list[Diagnostic]:
    """`chatrun validate --connect`: what the kinds can check only by reaching their services."""
    found: list[Diagnostic] = []
    for kind in KINDS.values():
        if kind.unconnected(config) is not None:
            found += await kind.connect_check(config)
    return found
