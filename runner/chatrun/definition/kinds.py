"""The definition stage's table of tool kinds: what the loader and the checks ask of a kind.

A tool gets its result from one kind — a Python `handler:`, an `http:` call, an `openapi:`
operation, an `mcp:` server's tool — and each kind is one module of `chatrun.toolkinds`,
holding everything about it: its config, its checks, its call, how a replay mocks it.
That package lies above this stage (beside `models/`: a kind's call needs httpx or the
mcp SDK, and what the engine hands it), and nothing imports upward, so the loader and the
checks cannot import the kinds. They reach them through this table instead, which
`chatrun.toolkinds` fills when it is imported. Importing it costs httpx and more, which
`chatrun --help` should not pay, so it is imported when the table is first asked for:
`chatrun/__init__.py` (which runs before any `chatrun.*` module) hands `fill_with` the
function that imports it. This module stays cheap to import for that reason.

The table is keyed by the kind's YAML key and ordered: that order is the order kinds are
parsed, named in "has `handler` and `http`" and checked. Besides a tool's own section, a
kind may declare things for the whole bot or on a route (the mcp kind: `mcp_servers:`, a
route's `mcp:` list), kept by kind key in BotConfig.kind_config and RouteConfig.kind_config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: importing this module must not load jinja2 or yaml
    from chatrun.definition.config import BotConfig, ToolConfig
    from chatrun.definition.sources import Sources
    from chatrun.definition.yamlpos import YamlDoc
    from chatrun.errors import Diagnostic


class Checks(Protocol):
    """What a kind's checks report through (the checker of definition/checks.py)."""

    config: BotConfig
    cache: dict[str, Any]  # what a kind keeps for the rest of one check run (imported modules)

    def add(self, severity: str, message: str, kind: str, name: str, *sub: Any) -> None:
        """A diagnostic at the YAML node `kind.name.sub...` (e.g. "tools", "get_pet", "http", "url")."""

    def template(self, source: str, what: str, path: tuple[Any, ...], tool: ToolConfig | None,
                 variables: tuple[str, ...] = ..., routes: list[str] | None = None,
                 undeclared: str = "warning") -> None:
        """Check a template: it compiles, and what it reads exists (diagnostics on its own line;
        a read of an undeclared `state.`/`scope.`/`args.` path has severity `undeclared`).
        `variables` defaults to definition.templates.TEMPLATE_VARIABLES."""


@dataclass
class Load:
    """What a kind's load-time step (`resolve`) works with."""

    root: Path  # the bot directory
    sources: Sources
    diagnostics: list[Diagnostic]  # where its problems go


class KindDefinition(Protocol):
    """A tool kind as the definition stage sees it (chatrun.toolkinds.base.ToolKind is one)."""

    @property
    def key(self) -> str:
        """Its key in a tool's YAML (`http:`) and in ToolConfig.kinds."""

    def parse(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> Any | None:
        """The kind's config from the tool's YAML mapping `raw` (at path `at` in `doc`), or None
        when the tool does not use this kind (or the schema already reported its section)."""

    def parse_bot(self, top: dict[str, Any], doc: YamlDoc) -> Any | None:
        """What the kind declares for the whole bot (mcp: `mcp_servers:`), from the main file's
        top-level mapping, or None: BotConfig.kind_config."""

    def parse_route(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> Any | None:
        """What the kind declares on a route (mcp: its `mcp:` list), or None: RouteConfig.kind_config."""

    def pattern_hint(self, pattern: str) -> str | None:
        """How to write a value of the kind's section that missed the schema's `pattern`, when
        `pattern` is one of the kind's (else None)."""

    def resolve(self, tools: list[ToolConfig], load: Load) -> None:
        """Complete this kind's tools once every tool is built (an OpenAPI operation is read)."""

    def check(self, tool: ToolConfig, spec: Any, checks: Checks) -> None:
        """What the schema cannot say about one tool's config of this kind."""

    def check_bot(self, config: BotConfig, checks: Checks) -> None:
        """What the schema cannot say about the bot-level declarations the kind uses."""

    def effect(self, spec: Any) -> str:
        """What a call of this kind does when the tool declares no `effect:` ("read",
        "idempotent", "once": definition/effects.py)."""


_TABLE: dict[str, KindDefinition] = {}
_FILL: list[Callable[[], None]] = []  # what fills the table on first use (set by chatrun/__init__.py)


def register(kind: KindDefinition) -> None:
    """Add a kind to the table (chatrun.toolkinds does, for each of its modules)."""
    _TABLE[kind.key] = kind


def fill_with(fill: Callable[[], None]) -> None:
    """Call `fill` (it registers the kinds) the first time the table is asked for."""
    _FILL[:] = [fill]


def kinds() -> list[KindDefinition]:
    """The registered kinds, in table order."""
    while _FILL:  # once, even when some kind was registered by hand before
        _FILL.pop()()
    if not _TABLE:  # only a broken install gets here: chatrun/__init__.py sets the filler
        raise RuntimeError("no tool kinds are registered; import chatrun.toolkinds first")
    return list(_TABLE.values())


def parse_kinds(raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> dict[str, Any]:
    """ToolConfig.kinds of a tool's YAML mapping: each kind it declares, with its config."""
    found = {kind.key: kind.parse(raw, doc, at) for kind in kinds()}
    return {key: spec for key, spec in found.items() if spec is not None}


def route_kinds(raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> dict[str, Any]:
    """RouteConfig.kind_config of a route's YAML mapping."""
    found = {kind.key: kind.parse_route(raw, doc, at) for kind in kinds()}
    return {key: value for key, value in found.items() if value is not None}


def bot_kinds(top: dict[str, Any], doc: YamlDoc) -> dict[str, Any]:
    """BotConfig.kind_config of the main file's top-level mapping."""
    found = {kind.key: kind.parse_bot(top, doc) for kind in kinds()}
    return {key: value for key, value in found.items() if value is not None}


def in_table_order(found: dict[str, Any]) -> dict[str, Any]:
    """`found` (a tool's kinds) ordered like the table."""
    return {kind.key: found[kind.key] for kind in kinds() if kind.key in found}
