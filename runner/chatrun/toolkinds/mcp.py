"""The `mcp:` tool kind: a tool of the bot that calls a tool of an MCP server.

    mcp_servers:
      files: {command: [python, files_server.py]}
    tools:
      read_file: {mcp: {server: files, tool: read}}   # no `parameters`: the server's schema
    routes:
      main: {mcp: [files/list]}                        # a route offers a server's tools as they are

The servers themselves (connections, restarts, results) are in mcp_servers.py. Besides
its tools' config this kind checks the bot's `mcp_servers:` and the routes' `mcp:` lists,
and offers the tools those lists name. A replay mocks it (the MCP server) and stays
offline: a route's server tools are then the mocked ones, and no server starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from chatrun.definition.config import ONCE, BotConfig, Location, RouteConfig, ToolConfig
from chatrun.definition.kinds import Checks, Load
from chatrun.definition.sources import suggest
from chatrun.definition.yamlpos import YamlDoc
from chatrun.errors import Diagnostic, ToolRefusal
from chatrun.toolkinds.base import CallContext, ToolKind, unknown_outcome
from chatrun.toolkinds.mcp_servers import LostCall, McpServerConfig, McpServers, McpTool


@dataclass
class McpToolRef:
    """A tool of the bot that calls an MCP server's tool (`mcp:` of a tool)."""

    server: str
    tool: str | None = None  # the server's tool name; None: the same as the bot's tool
    server_schema: bool = False  # declared without `parameters`: the server's schema is used


class McpKind(ToolKind[McpToolRef]):
    key: ClassVar[str] = "mcp"

    def parse(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> McpToolRef | None:
        section = raw.get("mcp")
        if not isinstance(section, dict) or not isinstance(section.get("server"), str):
            return None
        tool = section.get("tool")
        return McpToolRef(section["server"], tool if isinstance(tool, str) else None, "parameters" not in raw)

    def resolve(self, tools: list[ToolConfig], load: Load) -> None:
        """A tool declared without `parameters` takes the server's, listed only when the server
        runs: until then its arguments are open (`{type: object}`), never "takes none", so that
        neither the engine drops what the model sends (engine/call.py) nor the checks flag `args.X`."""
        for tool in tools:
            spec = tool.kinds.get(self.key)
            if isinstance(spec, McpToolRef) and spec.server_schema:
                tool.parameters = {"type": "object"}

    def adds_tools(self, route: RouteConfig, offered: dict[str, ToolConfig]) -> bool:
        """A route's `mcp:` servers add their tools; a tool without `parameters` takes its server's."""
        return bool(route_entries(route)) or any(
            isinstance(spec := tool.kinds.get(self.key), McpToolRef) and spec.server_schema for tool in offered.values())

    def parse_bot(self, top: dict[str, Any], doc: YamlDoc) -> dict[str, McpServerConfig] | None:
        """The bot's `mcp_servers:`."""
        raw = top.get("mcp_servers")
        out: dict[str, McpServerConfig] = {}
        for name, spec in (raw.items() if isinstance(raw, dict) else ()):
            spec = spec if isinstance(spec, dict) else {}
            command, url, env = spec.get("command"), spec.get("url"), spec.get("env")
            pos = doc.pos(("mcp_servers", name))
            out[str(name)] = McpServerConfig(
                name=str(name),
                command=[str(c) for c in command] if isinstance(command, list) else [],
                url=url if isinstance(url, str) else None,
                env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
                where=Location(doc.file, pos.line, pos.col),
            )
        return out or None

    def parse_route(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> list[str] | None:
        """A route's `mcp:`: "SERVER" (all its tools) or "SERVER/TOOL" entries."""
        entries = raw.get("mcp")
        listed = [e for e in entries if isinstance(e, str)] if isinstance(entries, list) else []
        return listed or None

    def check(self, tool: ToolConfig, spec: McpToolRef, checks: Checks) -> None:
        servers = servers_of(checks.config)
        if spec.server not in servers:
            checks.add("error", f"tool `{tool.name}` calls unknown MCP server `{spec.server}`"
                       f"{suggest(spec.server, servers)}; declare it under `mcp_servers:`",
                       "tools", tool.name, "mcp", "server")

    def check_bot(self, config: BotConfig, checks: Checks) -> None:
        servers = servers_of(config)
        for server in servers.values():
            if bool(server.command) == bool(server.url):
                checks.add("error", f"MCP server `{server.name}` needs exactly one of `command` (a stdio server) "
                           "and `url` (a streamable HTTP server)", "mcp_servers", server.name)
        for route in config.routes.values():
            for i, entry in enumerate(route_entries(route)):
                server_name = entry.partition("/")[0]
                if server_name not in servers:
                    checks.add("error", f"route `{route.name}` lists MCP tools of unknown server `{server_name}`"
                               f"{suggest(server_name, servers)}; declare it under `mcp_servers:`",
                               "routes", route.name, "mcp", i)

    def runtime(self, config: BotConfig) -> McpRuntime:
        return McpRuntime(McpServers(servers_of(config), config.root or "."))

    def unconnected(self, config: BotConfig) -> str | None:
        if not servers_of(config):
            return None
        return "MCP tool names not checked (--connect starts the servers to check them)"

    async def connect_check(self, config: BotConfig) -> list[Diagnostic]:
        return await check_mcp_names(config) if servers_of(config) else []

    def outside(self, spec: McpToolRef) -> str | None:
        return f"the MCP server {spec.server}"


class McpRuntime:
    """A bot's MCP servers, as its Toolbox keeps them."""

    def __init__(self, servers: McpServers):
        self.servers = servers

    async def call(self, tool: ToolConfig, spec: McpToolRef, args: dict[str, Any], ctx: CallContext) -> Any:
        """The server's answer, the call's idempotency key in its `_meta`. A call that may have been
        done but got no answer is not sent again; a tool whose effect is `once` then tells the model
        its outcome is unknown and not to call it again, as an unkeyed `http:` POST does."""
        server = self.servers.connection(spec.server)
        try:
            return await server.call(spec.tool or tool.name, args, tool.timeout, ctx.idempotency_key)
        except LostCall as lost:
            if tool.effect != ONCE:  # calling it again does nothing more: the model may
                raise
            raise ToolRefusal(unknown_outcome(tool.name, lost.problem, f"The MCP server {spec.server}")) from None

    async def request(self, tool: ToolConfig, spec: McpToolRef, args: dict[str, Any],
                      ctx: CallContext) -> dict[str, Any] | None:
        return None  # an MCP call is the SDK's message to the server, not an HTTP request of the bot's

    async def offer(self, route: RouteConfig, offered: dict[str, ToolConfig], mocked: set[str] | None) -> None:
        """A tool declared without `parameters` takes the server's; then the tools the route's
        `mcp:` lists. With mocks that stand in for the servers (`mocked`), no server is started:
        the route's MCP tools are the mocked ones (a replayed transcript stays offline)."""
        if mocked is None:
            for name, tool in offered.items():
                spec = tool.kinds.get(McpKind.key)
                if isinstance(spec, McpToolRef) and spec.server_schema:
                    offered[name] = await self._with_server_schema(tool, spec)
        for entry in route_entries(route):
            server, _, only = entry.partition("/")
            if mocked is not None:
                listed = [McpTool(server, n, "", {"type": "object"}) for n in mocked
                          if n not in offered and (not only or n == only)]
            else:
                listed = await self.servers.server_tools(server, [only] if only else None)
            for found in listed:
                offered.setdefault(found.name, ToolConfig(found.name, found.description, found.parameters,
                                                          kinds={McpKind.key: McpToolRef(server, found.name)},
                                                          where=route.where))

    async def _with_server_schema(self, tool: ToolConfig, spec: McpToolRef) -> ToolConfig:
        name = spec.tool or tool.name
        for listed in await self.servers.server_tools(spec.server, [name]):
            return dataclasses.replace(tool, description=tool.description or listed.description,
                                       parameters=listed.parameters,
                                       kinds={**tool.kinds, McpKind.key: dataclasses.replace(spec, server_schema=False)})
        return tool  # the server is down: offered as declared; calling it says so

    async def aclose(self) -> None:
        await self.servers.aclose()


def servers_of(config: BotConfig) -> dict[str, McpServerConfig]:
    """The bot's `mcp_servers:`, by name."""
    servers: dict[str, McpServerConfig] = config.kind_config.get(McpKind.key, {})
    return servers


def route_entries(route: RouteConfig) -> list[str]:
    """A route's `mcp:` entries."""
    entries: list[str] = route.kind_config.get(McpKind.key, [])
    return entries


async def check_mcp_names(config: BotConfig) -> list[Diagnostic]:
    """`chatrun validate --connect`: start each MCP server the bot uses and check that the
    tools it names exist there, and that each tool of the bot gives every argument the
    server's tool requires (offered to the model or bound). A server that cannot start is an
    error at its declaration."""
    declared = servers_of(config)
    servers = McpServers(declared, config.root or ".")
    out: list[Diagnostic] = []
    listed: dict[str, dict[str, McpTool] | None] = {}
    try:
        for name, server in declared.items():
            try:
                listed[name] = {t.name: t for t in await servers.connection(name).tools()}
            except ToolRefusal as refusal:
                listed[name] = None
                out.append(_diag(server.where, f"MCP server `{name}` could not be reached to check its tools: "
                                 f"{refusal}"))
        refs = [(t, t.kinds[McpKind.key]) for t in config.tools.values() if McpKind.key in t.kinds]
        wanted = [(t.where, ref.server, ref.tool or t.name, f"tool `{t.name}`") for t, ref in refs]
        wanted += [(r.where, e.partition("/")[0], e.partition("/")[2], f"route `{r.name}`")
                   for r in config.routes.values() for e in route_entries(r) if "/" in e]
        for where, server_name, tool, who in wanted:
            names = listed.get(server_name)
            if names is not None and tool not in names:
                out.append(_diag(where, f"{who} uses MCP tool `{tool}`, which server `{server_name}` does not list; "
                                 f"it lists: {', '.join(sorted(names)) or 'nothing'}"))
        for bot_tool, ref in refs:
            found = (listed.get(ref.server) or {}).get(ref.tool or bot_tool.name)
            if found is not None:
                out += _argument_problems(bot_tool, ref, found)
    finally:
        await servers.aclose()
    return out


def _argument_problems(tool: ToolConfig, ref: McpToolRef, listed: McpTool) -> list[Diagnostic]:
    """What the server's tool requires that the bot's tool neither offers nor binds, and bound
    names the server's tool does not take."""
    server_props = listed.parameters.get("properties")
    server_names = list(server_props) if isinstance(server_props, dict) else []
    required = listed.parameters.get("required")
    out: list[Diagnostic] = []
    what = f"MCP tool `{listed.name}` of server `{ref.server}`"
    if not ref.server_schema:  # declared `parameters`: they must carry what the server requires
        props = tool.parameters.get("properties")
        given = set(props) if isinstance(props, dict) else set()
        for name in required if isinstance(required, list) else []:
            if name not in given and name not in tool.bind:
                out.append(_diag(tool.where, f"tool `{tool.name}` does not give argument `{name}`, which {what} "
                                 "requires: declare it in `parameters` (the model gives it) or bind it (`bind:`)"))
    for name in tool.bind:
        if server_names and name not in server_names:
            out.append(_diag(tool.where, f"tool `{tool.name}` binds `{name}`, which {what} does not take"
                             f"{suggest(name, server_names)} (it takes: {', '.join(server_names)})"))
    return out


def _diag(where: Location, message: str) -> Diagnostic:
    return Diagnostic(where.file, where.line, where.col, "error", message)
