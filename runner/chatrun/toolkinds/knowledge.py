"""The `knowledge` tool kind: `search_knowledge`, the built-in tool a route with `knowledge:` offers.

    knowledge:
      help_centre: {path: help}
    routes:
      main: {knowledge: [help_centre]}     # the model may call search_knowledge({query})

No bot declares a tool of this kind: a route's `knowledge:` adds it (`offer`), reading only
the sources that route names. Its result is the passages as the model reads them (each
`[ref] title`, then its text, then how to cite), from the bot's index (chatrun.knowledge).
It reaches nothing outside the bot (the index is the bot's own files), so a replayed
transcript runs it for real and `calls: [{tool: search_knowledge, result: ...}]` pins what
was retrieved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from chatrun.definition.config import BotConfig, RouteConfig, ToolConfig
from chatrun.definition.yamlpos import YamlDoc
from chatrun.errors import ToolRefusal
from chatrun.toolkinds.base import CallContext, RuntimeDefaults, ToolKind

if TYPE_CHECKING:  # the index (SQLite, threads) loads when a bot runs, not when `validate` reads the kinds
    from chatrun.knowledge import Library

TOOL_NAME = "search_knowledge"
DESCRIPTION = ("Search the knowledge base (help articles, documentation) for passages that answer a question. "
               "Returns the best passages, each with a [ref] to cite.")
PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1,
                             "description": "What to look for: the question, or its key words."}},
    "required": ["query"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class KnowledgeSearch:
    """A route's search tool: the sources it reads and how many passages it returns."""

    sources: tuple[str, ...]
    top_k: int = 5


class KnowledgeKind(ToolKind[KnowledgeSearch]):
    key: ClassVar[str] = "knowledge"

    def parse(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> KnowledgeSearch | None:
        return None  # no tool declares it: a route's `knowledge:` offers it

    def adds_tools(self, route: RouteConfig, offered: dict[str, ToolConfig]) -> bool:
        return route.knowledge is not None

    def runtime(self, config: BotConfig) -> KnowledgeRuntime:
        from chatrun.knowledge import library_of

        return KnowledgeRuntime(library_of(config))


def search_tool(route: RouteConfig) -> ToolConfig | None:
    """The `search_knowledge` tool of a route (None: the route reads no knowledge)."""
    if route.knowledge is None:
        return None
    spec = KnowledgeSearch(tuple(route.knowledge.sources), route.knowledge.top_k)
    return ToolConfig(TOOL_NAME, DESCRIPTION, PARAMETERS, kinds={KnowledgeKind.key: spec}, where=route.where)


class KnowledgeRuntime(RuntimeDefaults):
    """A bot's index, as its search tool reads it."""

    def __init__(self, library: Library):
        self.library = library

    async def call(self, tool: ToolConfig, spec: KnowledgeSearch, args: dict[str, Any], ctx: CallContext) -> Any:
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolRefusal(f"Error: {TOOL_NAME} needs a `query`: the question or its key words. Call it again.")
        from chatrun.knowledge import passages_text

        hits = await self.library.asearch(query, spec.sources, spec.top_k)
        return passages_text(hits)

    async def offer(self, route: RouteConfig, offered: dict[str, ToolConfig], mocked: set[str] | None) -> None:
        tool = search_tool(route)
        if tool is not None:
            offered.setdefault(TOOL_NAME, tool)  # a bot's own tool of that name wins
