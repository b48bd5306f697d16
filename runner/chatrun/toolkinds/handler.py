"""The `handler:` tool kind: a Python function of the bot, `module:function`.

    tools:
      book: {handler: travel_tools:make_booking}

The module is resolved relative to the bot directory (handler_modules.py: imported
once per bot, and in isolation when a bot is checked). The function gets a `ToolContext`
(exported as `chatrun.ToolContext`); a sync one runs in a worker thread, an async one on
the event loop, both within the tool's `timeout`. It writes to copies of the state, which
the turn adopts only if the tool goes on. Raising `chatrun.ToolRefusal` refuses; any other
exception or a timeout is a `ToolFailed` (the turn fails, unless the tool has `on_error:`).
It is the bot's own code: a replay runs it for real when no mock matches, `--record` does
not keep its results, and its events may be of any type.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from chatrun.definition.config import BotConfig, ToolConfig
from chatrun.definition.kinds import Checks
from chatrun.definition.sources import suggest
from chatrun.definition.yamlpos import YamlDoc
from chatrun.errors import ToolRefusal
from chatrun.events import AUDIENCES
from chatrun.messages import Attachment
from chatrun.toolkinds.attachments import find_attachment, read_or_refuse
from chatrun.toolkinds.base import CallContext, RuntimeDefaults, ToolFailed, ToolKind
from chatrun.toolkinds.handler_modules import HandlerResolver, import_isolated

if TYPE_CHECKING:  # asyncio loads when a handler is first called: `chatrun validate` needs none of it
    import asyncio


class HandlerKind(ToolKind[str]):
    key: ClassVar[str] = "handler"
    emits_events: ClassVar[bool] = True  # ctx.emit() sends any type

    def parse(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> str | None:
        spec = raw.get("handler")
        return spec if isinstance(spec, str) and spec else None

    def pattern_hint(self, pattern: str) -> str | None:
        if ":" not in pattern:  # the schema's `handler` pattern is its only one with a colon
            return None
        return "write `module:function`, e.g. `travel_tools:make_booking` (the module relative to the bot directory)"

    def check(self, tool: ToolConfig, spec: str, checks: Checks) -> None:
        """The module imports (in isolation) and has the function."""
        module_name, _, func_name = spec.partition(":")
        if not module_name or not func_name:
            return  # the schema's pattern reported it
        modules: dict[str, Any] = checks.cache.setdefault("handler modules", {})
        module = modules.get(module_name)
        if module is None:
            module = modules[module_name] = import_isolated(Path(checks.config.root or "."), module_name)
        shown = getattr(module, "__chatrun_shown__", "")
        at = ("tools", tool.name, "handler")
        if isinstance(module, str):  # the reason it could not be imported
            checks.add("error", f"handler `{spec}` of tool `{tool.name}`: {module}", *at)
            return
        func = getattr(module, func_name, None)
        if func is None:
            names = [n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n))]
            checks.add("error", f"handler `{spec}` of tool `{tool.name}`: {shown} has no function "
                       f"`{func_name}`{suggest(func_name, names)}", *at)
        elif not callable(func):
            checks.add("error", f"handler `{spec}` of tool `{tool.name}`: `{func_name}` in {shown} "
                       f"is a {type(func).__name__}, not a function", *at)

    def runtime(self, config: BotConfig) -> HandlerRuntime:
        return HandlerRuntime(HandlerResolver(config.root or ".", config.name))


class HandlerRuntime(RuntimeDefaults):
    """A bot's handlers, each module imported once."""

    def __init__(self, resolver: HandlerResolver):
        self.resolver = resolver

    async def call(self, tool: ToolConfig, spec: str, args: dict[str, Any], ctx: CallContext) -> Any:
        """The handler's return value. Raises ToolRefusal (the handler refused) or ToolFailed."""
        work = ctx.writable()
        context = ToolContext(tool.name, args, work.state, work.scope, work.turn, ctx.route, ctx.session_id,
                              tuple(ctx.attachments()), ctx.message_attachments, ctx.idempotency_key, ctx.emit,
                              _read=ctx.read_attachment)
        try:
            return await call_handler(self.resolver.resolve(spec), context, tool.timeout)
        except ToolRefusal:
            raise
        except TimeoutError as exc:
            raise ToolFailed(f"tool {tool.name} ({tool.where}): handler {spec} did not finish within "
                             f"{tool.timeout:g} s (the tool's `timeout`)",
                             f"it took longer than {tool.timeout:g} seconds") from exc
        except (Exception, SystemExit) as exc:  # a handler's sys.exit() must not end the server
            raise ToolFailed(f"tool {tool.name} ({tool.where}): handler {spec} raised "
                             f"{type(exc).__name__}: {exc}", str(exc) or type(exc).__name__) from exc


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
    attachments the conversation's files the route's memory holds (chatrun.messages.Attachment: ref,
                media_type, name, size), oldest first; `message_attachments` this turn's message's;
                `read_attachment(a)` gives one's bytes (a, its ref or its name)
    idempotency_key  this call's key (32 hex characters): the same when this very call runs again
                (its turn retried after a failure, a decision retried on another replica after
                the first died before its commit), another for every other call. Send it with
                an effect outside the bot (a payment's idempotency key) so that a call run twice
                takes effect once (docs/tools.md, "Idempotency keys").

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
    attachments: tuple[Attachment, ...] = ()
    message_attachments: tuple[Attachment, ...] = ()
    idempotency_key: str = ""
    _emit: Callable[..., None] = field(repr=False, default=lambda t, d, audience=None: None)
    _loop: asyncio.AbstractEventLoop | None = field(repr=False, default=None)
    _open: bool = field(repr=False, default=True)
    _read: Callable[[Attachment], bytes | None] = field(repr=False, default=lambda attachment: None)

    def read_attachment(self, which: Attachment | str) -> bytes:
        """The bytes of one of `attachments` (it, its ref or its name). Raises ToolRefusal (the
        model reads why) when the conversation has no such file or its bytes are not kept."""
        attachment = find_attachment(which.ref if isinstance(which, Attachment) else which, self.attachments,
                                     self.tool, "the file it reads")
        return read_or_refuse(attachment, self._read, self.tool)

    def emit(self, event_type: str, data: object, audience: str | None = None) -> None:
        """Send an event now (Thinking, Console, Message, Object or a custom type). `audience`
        ("user", "operators", "backend"; None: as the bot's `events:` declares the type) says who
        it is for: a backend event goes to the bot's sinks once the turn commits, never to a chat.
        Safe from a sync handler's worker thread; ignored once the handler has returned or timed out."""
        if audience is not None and audience not in AUDIENCES:
            raise ValueError(f"ctx.emit({event_type!r}): audience {audience!r} is not one of {', '.join(AUDIENCES)}")
        if not self._open:
            return
        loop = self._loop
        if loop is not None and _running_loop() is not loop:
            loop.call_soon_threadsafe(self._emit_if_open, event_type, data, audience)
        else:
            self._emit(event_type, data, audience=audience)

    def _emit_if_open(self, event_type: str, data: object, audience: str | None) -> None:
        if self._open:
            self._emit(event_type, data, audience=audience)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def call_handler(func: Callable[..., Any], ctx: ToolContext, timeout: float) -> Any:
    """Run a handler: an async one on the event loop, a sync one in a worker thread (so a slow
    one never holds up other sessions), each within `timeout` seconds (TimeoutError after)."""
    import asyncio

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
