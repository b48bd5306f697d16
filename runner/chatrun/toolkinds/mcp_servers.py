"""A bot's MCP servers (`mcp_servers:`), started on first use and shared by the bot's
sessions, and calls to their tools through the official `mcp` SDK (the `mcp:` tool kind,
chatrun.toolkinds.mcp, uses them).

One connection per server per event loop (an SDK client belongs to the task group that
opened it): a background task opens the client and holds it; calls come from the turns.
A server that exits is started again by the next call, whose turn gets a clear error
first; a server that is down or slow fails the call as a refusal the model reads, never
the process.

What a call gives the action as `result`: the tool's structured content when it has
some, else its text parsed as JSON when it is JSON, else the text. A result the server
marks as an error, or a JSON-RPC error it answers the call with, is a refusal with the
server's text (the server is not restarted for it).

Each `tools/call` carries the call's idempotency key (the one an `http:` tool sends as
`Idempotency-Key`) in its `_meta`, as IDEMPOTENCY_META, for a server to dedupe a call chatrun
makes again (a turn run again after a crash or a failure). A call is never sent twice by
chatrun itself: one whose connection dropped, or that got no answer in time, is a `LostCall`,
whose kind says what the model reads (chatrun.toolkinds.mcp).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from chatrun.definition.config import Location
from chatrun.errors import ToolRefusal

if TYPE_CHECKING:  # asyncio loads when a server is first used: `chatrun validate` needs none of it
    import asyncio

# Where a call's idempotency key goes in `params._meta`: the MCP spec's key format (a prefix of
# dot-separated labels and a slash; reverse DNS recommended from 2025-11-25; `dev.chatrun` is
# chatrun.dev's, not a reserved `mcp`/`modelcontextprotocol` second label), named after the
# HTTP header (draft-ietf-httpapi-idempotency-key-header).
IDEMPOTENCY_META = "dev.chatrun/idempotency-key"
START_TIMEOUT_S = 30.0
LIST_TIMEOUT_S = 30.0  # seconds a started server has to list its tools


@dataclass
class McpServerConfig:
    """An MCP server a bot uses (`mcp_servers:`): a command speaking stdio, or a streamable HTTP URL."""

    name: str
    command: list[str] = field(default_factory=list)  # run in the bot's directory; `python` = chatrun's
    url: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # more environment variables for the command
    where: Location = field(default_factory=Location)


@dataclass
class McpTool:
    """A tool a server lists: its name, description and JSON Schema of arguments."""

    server: str
    name: str
    description: str
    parameters: dict[str, Any]

    def spec(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


# Where a stdio server's stderr goes: given the server and the bot's directory, a file opened
# for writing (with a real file descriptor: the process writes to it directly). None, the
# default, lets the server write to chatrun's own stderr (`chatrun serve`'s log, a script's
# terminal). The REPL sends it to a log file, so a chatty server cannot write over the prompt.
StderrFor = Callable[[McpServerConfig, str], TextIO]
_stderr_for: StderrFor | None = None


def send_stderr_to(stderr_for: StderrFor | None) -> None:
    """Send the stderr of every stdio MCP server started from now on to `stderr_for(server,
    bot_root)` (None: chatrun's own stderr again). Process-wide on purpose: a reloaded bot's
    servers follow the same rule without being told again."""
    global _stderr_for
    _stderr_for = stderr_for


class McpConnection:
    """One running server for one event loop."""

    def __init__(self, config: McpServerConfig, root: str):
        import asyncio

        self.config = config
        self.root = root
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._start_error: BaseException | None = None
        self._tools: list[McpTool] | None = None
        self._lock = asyncio.Lock()
        self._broken = False
        self._stderr: TextIO | None = None  # where the running stdio server writes its stderr, if not ours

    async def client(self) -> Any:
        import asyncio

        async with self._lock:
            if self._broken:  # the last call lost the connection: stop that server, start a new one
                self._broken = False
                await self._end_task()
            if self._task is None or self._task.done():
                self._ready.clear()
                self._stop.clear()
                self._start_error = None
                self._tools = None
                self._task = asyncio.get_running_loop().create_task(self._hold(), name=f"mcp {self.config.name}")
            try:
                await asyncio.wait_for(self._ready.wait(), START_TIMEOUT_S)
            except TimeoutError:
                raise self._unreachable(f"it did not start within {START_TIMEOUT_S:g} s") from None
            if self._client is None:
                raise self._unreachable(_reason(self._start_error))
            return self._client

    async def _hold(self) -> None:
        import asyncio

        try:
            from mcp import Client
        except ImportError:
            self._start_error = ImportError("the mcp package is not installed: pip install 'chatrun[mcp]'")
            self._ready.set()
            return
        try:
            async with Client(self._server(), raise_exceptions=False, message_handler=self._on_message) as client:
                self._client = client
                self._ready.set()
                watcher = asyncio.get_running_loop().create_task(self._listen(client))
                try:
                    await self._stop.wait()
                finally:
                    watcher.cancel()
                    with contextlib.suppress(BaseException):
                        await watcher
        except BaseException as exc:  # an exiting server ends this task, never the process
            self._start_error = exc
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._client = None
            self._ready.set()
            if self._stderr is not None:
                self._stderr.close()

    async def _listen(self, client: Any) -> None:
        """A server of the 2026-07-28 protocol tells of a changed tool list only on a
        `subscriptions/listen` stream: each change has it listed again (an older one sends a
        notification instead: _on_message)."""
        try:
            async with client.listen(tools_list_changed=True) as changes:
                async for _ in changes:
                    self._tools = None
        except Exception:  # an older server (no listen), or the stream dropped: its notifications, or none
            return

    async def _on_message(self, message: Any) -> None:
        """A server that says its tool list changed (tools/list_changed) is listed again when a
        turn next asks: its routes offer the tools it has now, not those of its start."""
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._tools = None

    def _server(self) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        if self.config.url:
            return self.config.url
        command = list(self.config.command)
        if command and command[0] == "python":  # the interpreter chatrun runs on, with its packages
            command[0] = sys.executable
        params = StdioServerParameters(command=command[0], args=command[1:], cwd=self.root,
                                       env={**os.environ, **self.config.env})
        if _stderr_for is None:
            return params
        self._stderr = _stderr_for(self.config, self.root)
        return stdio_client(params, errlog=self._stderr)

    async def tools(self) -> list[McpTool]:
        import asyncio

        if self._tools is None:
            client = await self.client()
            try:  # a route's turn waits for the list: a server that never gives it must not hold it
                async with asyncio.timeout(LIST_TIMEOUT_S):
                    listed = await client.list_tools()
            except TimeoutError:
                self._broken = True
                raise self._unreachable(f"it did not list its tools within {LIST_TIMEOUT_S:g} s") from None
            except Exception as exc:  # it exited, or answered the list with an error
                self._broken = not _refused(exc)
                raise self._unreachable(_reason(exc)) from None
            self._tools = [McpTool(self.config.name, t.name, t.description or "",
                                   dict(t.input_schema or {"type": "object", "properties": {}}))
                           for t in listed.tools]
        return self._tools

    async def call(self, tool: str, args: dict[str, Any], timeout: float, key: str = "") -> Any:
        """The tool's result, called once with the call's idempotency `key` in `_meta` (none when
        empty). Raises ToolRefusal; LostCall when the server may have acted on it."""
        import asyncio

        client = await self.client()  # not reachable: nothing was sent
        name = self.config.name
        try:
            async with asyncio.timeout(timeout):
                answer = await client.call_tool(tool, args, meta={IDEMPOTENCY_META: key} if key else None)
        except TimeoutError:
            raise LostCall(f"Error: {tool} failed: the MCP server {name} did not answer within {timeout:g} s. "
                           "Tell the user it did not work this time.",
                           f"no answer within {timeout:g} s from the MCP server {name}") from None
        except Exception as exc:
            if _refused(exc):  # the server answered the call with an error: it runs, and says why
                raise ToolRefusal(f"Error: {tool} failed: {exc}") from None
            self._broken = True  # a broken connection: start it again next time
            raise LostCall(str(self._unreachable(_reason(exc))),
                           f"the connection to the MCP server {name} was lost during the call ({_reason(exc)})") \
                from None
        text = "\n".join(getattr(part, "text", "") for part in answer.content if getattr(part, "text", None))
        if answer.is_error:
            raise ToolRefusal(f"Error: {tool} failed: {text or 'the MCP server reported an error'}")
        if answer.structured_content is not None:
            return answer.structured_content
        try:
            return json.loads(text)
        except ValueError:
            return text

    def _unreachable(self, why: str) -> ToolRefusal:
        log = getattr(self._stderr, "name", None)
        if isinstance(log, str):  # the author looks there for why it did not start
            why = f"{why}; its stderr is in {log}"
        return ToolRefusal(f"Error: the MCP server {self.config.name} is not reachable ({why}). "
                           "Tell the user this is unavailable right now.")

    async def aclose(self) -> None:
        await self._end_task()

    async def _end_task(self) -> None:
        import asyncio

        self._stop.set()
        task, self._task = self._task, None
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 5)
            except (TimeoutError, Exception):  # ending it anyway
                task.cancel()


class LostCall(ToolRefusal):
    """A call sent to a server that gave no answer (the connection dropped, the tool's time ran
    out): the server may have done it. Its message is what a call that changes nothing reads;
    `problem` says what happened, for the text of an unknown outcome (toolkinds/base.py)."""

    def __init__(self, message: str, problem: str):
        super().__init__(message)
        self.problem = problem


class McpServers:
    """A bot's MCP servers, one connection per server per event loop."""

    def __init__(self, configs: dict[str, McpServerConfig], root: str):
        self.configs = configs
        self.root = root
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, McpConnection]] = (
            weakref.WeakKeyDictionary()
        )

    def connection(self, server: str) -> McpConnection:
        import asyncio

        loop = asyncio.get_running_loop()
        connections = self._by_loop.setdefault(loop, {})
        connection = connections.get(server)
        if connection is None:
            connection = connections[server] = McpConnection(self.configs[server], self.root)
        return connection

    async def server_tools(self, server: str, names: list[str] | None = None) -> list[McpTool]:
        """The tools a route offers from `server` (all, or the named ones); [] when it is down
        (the model is then simply not offered them, and the log says why)."""
        try:
            listed = await self.connection(server).tools()
        except ToolRefusal:
            return []
        return [t for t in listed if names is None or t.name in names]

    async def aclose(self) -> None:
        """Stop the servers started on the running loop."""
        import asyncio

        connections = self._by_loop.pop(asyncio.get_running_loop(), {})
        for connection in connections.values():
            await connection.aclose()


def _refused(exc: Exception) -> bool:
    """A JSON-RPC error the server answered with (invalid params, an unknown tool: what some SDKs
    answer a model's bad call with), not a lost connection. Restarting the server for it would
    drop its state and the other sessions' calls in flight, and tell the model it is down."""
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED

    return isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED


def _reason(exc: BaseException | None) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if exc is None:
        return "it exited"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
