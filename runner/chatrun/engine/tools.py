"""Tool plumbing: OpenAI tool specs, argument checks, and Python handlers.

Everything here turns a bad tool call into a message for the model (`ToolRefusal`),
never a crash: the model reads what was wrong and can try again.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import json
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from jsonschema import Draft202012Validator

from chatrun.definition.config import BotConfig, McpToolRef, RouteConfig, ToolConfig
from chatrun.definition.handlers import HandlerResolver
from chatrun.engine.http_tool import HttpCaller
from chatrun.engine.mcp_tools import McpServers, McpTool
from chatrun.errors import ToolRefusal


class Toolbox:
    """A bot's tools as the engine calls them: argument validators and Python handlers,
    each built once per bot and shared by its sessions."""

    def __init__(self, config: BotConfig):
        self.config = config
        self._handlers = HandlerResolver(config.root or ".", config.name)
        self._validators: dict[str, Draft202012Validator] = {}
        self._http: HttpCaller | None = None
        self._mcp: McpServers | None = None

    def argument_validator(self, tool: ToolConfig) -> Draft202012Validator:
        """The validator of a tool's `parameters` (built once per bot tool; an MCP server's
        tools are validated against the schema the server lists), `format` included: date,
        date-time, time, email, uri, uri-reference, uuid, ipv4, ipv6 are checked."""
        key = tool.name if tool.name in self.config.tools and self.config.tools[tool.name] is tool else None
        validator = self._validators.get(key) if key else None
        if validator is None:
            validator = Draft202012Validator(tool.parameters, format_checker=Draft202012Validator.FORMAT_CHECKER)
            if key:
                self._validators[key] = validator
        return validator

    def output_validator(self, route: str) -> Draft202012Validator:
        """The validator of a route's `output` schema (formats checked)."""
        key = f"route:{route}"
        validator = self._validators.get(key)
        if validator is None:
            output = self.config.routes[route].output
            assert output is not None
            validator = self._validators[key] = Draft202012Validator(
                output.schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        return validator

    async def offered(self, route: RouteConfig, mocks: ToolMocks | None = None) -> dict[str, ToolConfig]:
        """The tools the model may call on a route, by name: its `tools:` (an MCP tool declared
        without `parameters` takes the server's), then the MCP tools its `mcp:` lists. With
        mocks that stand in for the servers, no server is started: the route's MCP tools are
        the mocked ones (a replayed transcript stays offline and deterministic)."""
        offered = {name: self.config.tools[name] for name in route.tools if name in self.config.tools}
        offline = mocks is not None and not mocks.live
        if not offline:
            for name, tool in offered.items():
                if tool.mcp is not None and tool.server_schema:
                    offered[name] = await self._with_server_schema(tool)
        for entry in route.mcp:
            server, _, only = entry.partition("/")
            if offline:
                assert mocks is not None
                listed = [McpTool(server, n, "", {"type": "object"}) for n in mocks.mocked_tools()
                          if n not in offered and (not only or n == only)]
            else:
                listed = await self.mcp.server_tools(server, [only] if only else None)
            for found in listed:
                offered.setdefault(found.name, ToolConfig(found.name, found.description, found.parameters,
                                                          mcp=McpToolRef(server, found.name), where=route.where))
        return offered

    async def _with_server_schema(self, tool: ToolConfig) -> ToolConfig:
        assert tool.mcp is not None
        name = tool.mcp.tool or tool.name
        for listed in await self.mcp.server_tools(tool.mcp.server, [name]):
            return dataclasses.replace(tool, description=tool.description or listed.description,
                                       parameters=listed.parameters, server_schema=False)
        return tool  # the server is down: offered as declared; calling it says so

    @property
    def mcp(self) -> McpServers:
        if self._mcp is None:
            self._mcp = McpServers(self.config.mcp_servers, self.config.root or ".")
        return self._mcp

    async def aclose(self) -> None:
        """Close what the tools opened on the running event loop: HTTP connections, MCP servers."""
        if self._http is not None:
            await self._http.aclose()
        if self._mcp is not None:
            await self._mcp.aclose()

    def handler(self, spec: str) -> Callable[..., Any]:
        """The function of a `module:function` handler spec."""
        return self._handlers.resolve(spec)

    @property
    def http(self) -> HttpCaller:
        if self._http is None:
            self._http = HttpCaller(self.config.env)
        return self._http


def tool_spec(tool: ToolConfig) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def route_tool_specs(config: BotConfig, route: str) -> list[dict[str, Any]]:
    return [tool_spec(config.tools[name]) for name in config.routes[route].tools if name in config.tools]


def response_format(route: RouteConfig) -> dict[str, Any] | None:
    """The `response_format` a route with `output:` asks for (OpenAI's field), else None."""
    output = route.output
    if output is None or output.request == "none":
        return None
    if output.request == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": f"{route.name}_output", "schema": output.schema}}


def parse_output(text: str | None, validator: Draft202012Validator) -> tuple[Any, str | None]:
    """A structured answer: (the value, None), or (None, what is wrong with it). A ```json fence
    around the JSON is tolerated (models without JSON mode add one)."""
    raw = (text or "").strip()
    if raw.startswith("```") and raw.endswith("```"):
        raw = raw.strip("`").removeprefix("json").strip()
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, f"it is not JSON ({exc.msg} at character {exc.pos})"
    problems = []
    for err in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "the answer"
        problems.append(f"{where}: {err.message}")
    if problems:
        return None, "; ".join(problems)
    return value, None


def parse_arguments(tool: ToolConfig, raw: str, validator: Draft202012Validator) -> dict[str, Any]:
    """The call's arguments as a dict, checked against the tool's `parameters`."""
    try:
        args = json.loads(raw) if raw and raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolRefusal(
            f"Error: the arguments of {tool.name} are not valid JSON ({exc.msg} at character {exc.pos}). "
            "Call it again with a JSON object matching its parameters."
        ) from None
    if not isinstance(args, dict):
        raise ToolRefusal(f"Error: the arguments of {tool.name} must be a JSON object, not {type(args).__name__}.")
    problems = []
    for err in sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "arguments"
        problems.append(f"{where}: {err.message}")
    if problems:
        raise ToolRefusal(f"Error: invalid arguments for {tool.name}: " + "; ".join(problems) + ". Call it again with valid arguments.")
    return args


@dataclass
class ToolContext:
    """What a Python handler receives (`def handler(ctx: chatrun.ToolContext)`).

    tool        the tool's name
    args        the model's arguments, already checked against the tool's `parameters`
    state       the conversation state (`state.X`), writable
    scope       the current scope's state (`scope.X`) as one writable mapping: a key is read
                and written where it lives (the scope's local state, else the nearest shared)
    turn        this turn's state (`turn.X`), writable
    route       the current route's name
    session_id  the session's id

    Writes to state, scope and turn persist only if the turn succeeds. `emit()` sends an
    event to the client at once. The return value is `result` in the action's templates and
    (as text, or JSON for other values) the tool result the model reads; raise
    `chatrun.ToolRefusal("...")` to refuse: nothing of the action applies and the model reads
    the message. A sync handler runs in a worker thread, an async one on the event loop;
    both may take the tool's `timeout` (default 30 s).
    """

    tool: str
    args: dict[str, Any]
    state: dict[str, Any]
    scope: MutableMapping[str, Any]
    turn: dict[str, Any]
    route: str
    session_id: str
    _emit: Callable[[str, object], None] = field(repr=False, default=lambda t, d: None)
    _loop: asyncio.AbstractEventLoop | None = field(repr=False, default=None)
    _open: bool = field(repr=False, default=True)

    def emit(self, event_type: str, data: object) -> None:
        """Send an event to the client now (Thinking, Console, Message, Object or a custom type).
        Safe from a sync handler's worker thread; ignored once the handler has returned or timed out."""
        if not self._open:
            return
        loop = self._loop
        if loop is not None and _running_loop() is not loop:
            loop.call_soon_threadsafe(self._emit_if_open, event_type, data)
        else:
            self._emit(event_type, data)

    def _emit_if_open(self, event_type: str, data: object) -> None:
        if self._open:
            self._emit(event_type, data)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def call_handler(func: Callable[..., Any], ctx: ToolContext, timeout: float) -> Any:
    """Run a handler: an async one on the event loop, a sync one in a worker thread (so a slow
    one never holds up other sessions), each within `timeout` seconds (TimeoutError after)."""
    ctx._loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):  # inline, not a new task: what the handler raises stays ours
            if inspect.iscoroutinefunction(func):
                return await func(ctx)
            result = await asyncio.to_thread(_call_in_thread, func, ctx)
            if inspect.isawaitable(result):  # a sync function that returned a coroutine
                result = await result
            return result
    except _Exited as exc:
        raise exc.original from None
    finally:
        ctx._open = False


class _Exited(Exception):
    """A sync handler's SystemExit, carried out of its worker thread as an ordinary exception
    (a BaseException there would stop the event loop itself)."""

    def __init__(self, original: SystemExit):
        self.original = original


def _call_in_thread(func: Callable[..., Any], ctx: ToolContext) -> Any:
    try:
        return func(ctx)
    except SystemExit as exc:
        raise _Exited(exc) from None


@dataclass
class Mocked:
    """A stand-in for what a tool returns: its `result`, or the `error` it fails with."""

    result: Any = None
    error: str | None = None

    def value(self, tool: ToolConfig) -> Any:
        if self.error is not None:  # a recorded failure is the whole text the model read
            text = self.error if self.error.startswith("Error:") else f"Error: {tool.name} failed: {self.error}"
            raise ToolRefusal(text)
        return copy.deepcopy(self.result)


class ToolMocks(Protocol):
    """Stands in for handlers and HTTP tools (golden transcripts use it): `lookup` gives the
    mocked outcome of a call, or None to run the tool for real (or raises TurnFailed when a
    call must not run for real); `observe` hears the outcome of every real call."""

    live: bool  # False: tools without a mock must not run for real (HTTP, MCP)

    def lookup(self, tool: ToolConfig, args: dict[str, Any]) -> Mocked | None: ...

    def mocked_tools(self) -> set[str]: ...

    def observe(self, tool: ToolConfig, args: dict[str, Any], result: Any, error: str | None) -> None: ...


def result_text(value: Any) -> str:
    """A handler's return value as the text of a tool result."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
