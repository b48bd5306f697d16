"""What a tool kind is: the base class every kind module subclasses, and what the engine
hands a kind's call.

A kind answers three readers, each through the table of `chatrun.toolkinds`:

- the definition stage (through `chatrun.definition.kinds`, the table it owns, which this
  package fills): `parse` its YAML section, `resolve` it at load time, `check` it;
- the engine (`engine/tools.py`'s Toolbox, `engine/call.py`): `runtime(config)` gives what
  a bot keeps for the kind (connections, imported handlers) — its `call`, the tools it
  adds to a route (`offer`), `aclose`;
- golden transcripts (`transcripts/`): `outside(spec)` says, as plain data, whether the
  call leaves the bot (an API, a server: a replay must mock it, `--record` keeps its real
  results) and `emits_events` whether its code may send events of any type.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from chatrun.definition.config import BotConfig, Location, RouteConfig, ToolConfig
from chatrun.definition.kinds import Checks, Load
from chatrun.definition.yamlpos import YamlDoc
from chatrun.errors import Diagnostic
from chatrun.messages import Attachment

Spec = TypeVar("Spec")  # a kind's own config (HttpConfig, McpToolRef, a handler's "module:function")
SpecIn = TypeVar("SpecIn", contravariant=True)


@dataclass
class Writable:
    """Copies of the conversation's state that a tool's own code may write: the turn adopts
    them when the tool goes on, and drops them when it refuses or fails."""

    state: dict[str, Any]
    scope: MutableMapping[str, Any]  # the current scope's keys, where each lives
    turn: dict[str, Any]


class CallContext(Protocol):
    """What the engine gives a kind's call (engine/call.py implements it)."""

    @property
    def route(self) -> str:
        """The current route's name."""

    @property
    def session_id(self) -> str: ...

    @property
    def idempotency_key(self) -> str:
        """The call's idempotency key: the same when this call runs again after a crash or a
        retried turn, another for every other call (engine/call.py's `call_key`)."""

    def render(self, source: Any, what: str, where: Location, values: dict[str, Any], *, typed: bool) -> Any:
        """A template of the tool's config, seeing the turn's variables and `values`."""

    def writable(self) -> Writable:
        """Fresh copies of the state for the tool's code to write."""

    def emit(self, event_type: str, data: object, audience: str | None = None) -> None:
        """Send an event now (audience None: as the bot's `events:` declares the type)."""

    def trace_headers(self, headers: dict[str, str]) -> None:
        """Add the turn's trace context to outgoing HTTP headers (W3C traceparent)."""

    def attachments(self) -> list[Attachment]:
        """The files of the conversation the current route's memory holds, oldest first (this
        turn's message's last): what a tool may send on (chatrun.toolkinds.attachments)."""

    @property
    def message_attachments(self) -> tuple[Attachment, ...]:
        """The files of this turn's message."""

    def read_attachment(self, attachment: Attachment) -> bytes | None:
        """The bytes of one of `attachments()`, or None: gone, or it came as a URL."""


def unknown_outcome(tool: str, problem: str, who: str) -> str:
    """What the model reads when a call that may change something got no clear answer (the
    connection dropped, no answer in time): `who` ("The API", "The MCP server notes") may have
    done it, so chatrun did not send it again, and the model is not to call it again either. The
    one text of every kind (docs/tools.md, "Retries of a request without a key")."""
    return (f"Error: {tool}'s outcome is unknown: {problem}. {who} may have done it, so it was not sent again. "
            f"Do not call {tool} again for this; tell the user it is not known whether it went through and "
            "that it should be checked before trying again.")


class ToolFailed(Exception):
    """A tool's own code raised or timed out. The message is for the author (it names the
    place and the exception); `reason` is what the model may read through `on_error`."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class KindRuntime(Protocol[SpecIn]):
    """What a bot keeps for one kind, made on first use and shared by its sessions."""

    async def call(self, tool: ToolConfig, spec: SpecIn, args: dict[str, Any], ctx: CallContext) -> Any:
        """The tool's `result`; raises ToolRefusal (the model reads why) or ToolFailed."""

    async def request(self, tool: ToolConfig, spec: SpecIn, args: dict[str, Any],
                      ctx: CallContext) -> dict[str, Any] | None:
        """The HTTP request `call` would send, built but not sent, as plain data (`method`,
        `url`, `query`, `headers`, `json`, `form`; secrets redacted), or None: the kind sends
        no HTTP request. A transcript mock's `request:` is matched against it."""

    async def offer(self, route: RouteConfig, offered: dict[str, ToolConfig], mocked: set[str] | None) -> None:
        """Add to or complete the tools `route` offers (`mocked`: the names a replay's mocks
        cover when they stand in for outside services, else None)."""

    async def aclose(self) -> None:
        """Close what the kind opened on the running event loop."""


class RuntimeDefaults:
    """A KindRuntime's `request`, `offer` and `aclose` for a kind that sends no HTTP request of
    its own, adds no tools and opens nothing."""

    async def request(self, tool: ToolConfig, spec: Any, args: dict[str, Any],
                      ctx: CallContext) -> dict[str, Any] | None:
        return None

    async def offer(self, route: RouteConfig, offered: dict[str, ToolConfig], mocked: set[str] | None) -> None:
        return None

    async def aclose(self) -> None:
        return None


class ToolKind(Generic[Spec]):
    """One kind of tool. A kind module subclasses this; the defaults suit a kind with no
    load-time step, no bot-level declarations and nothing outside the bot. The definition
    stage's methods are described in chatrun.definition.kinds.KindDefinition."""

    key: ClassVar[str]  # its key in a tool's YAML and in ToolConfig.kinds
    emits_events: ClassVar[bool] = False  # its code may send events of any type (ctx.emit)

    # -- the definition stage ------------------------------------------------------------

    def parse(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> Spec | None:
        raise NotImplementedError

    def parse_bot(self, top: dict[str, Any], doc: YamlDoc) -> Any | None:
        return None

    def parse_route(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> Any | None:
        return None

    def pattern_hint(self, pattern: str) -> str | None:
        return None

    def resolve(self, tools: list[ToolConfig], load: Load) -> None:
        return None

    def check(self, tool: ToolConfig, spec: Spec, checks: Checks) -> None:
        return None

    def check_bot(self, config: BotConfig, checks: Checks) -> None:
        return None

    def effect(self, spec: Spec) -> str:
        """A handler's or a server's code may do anything, and chatrun cannot see what: such a
        tool is `read` unless it says otherwise (docs/tools.md, "Side effects")."""
        return "read"

    # -- the engine ------------------------------------------------------------------------

    def runtime(self, config: BotConfig) -> KindRuntime[Spec] | None:
        """What a bot keeps for this kind (None: the kind becomes another one when the bot loads)."""
        return None

    def adds_tools(self, route: RouteConfig, offered: dict[str, ToolConfig]) -> bool:
        """Whether this kind's runtime `offer` may add to or change what `route` offers (its
        `offered` tools, by name): a route no kind changes gets its tools assembled once, when
        the bot loads (engine/tools.py), and its messages never call `offer`."""
        return False

    def unconnected(self, config: BotConfig) -> str | None:
        """What `connect_check` would check for this bot, said when `--connect` is not given
        (None: nothing; then it is not run either)."""
        return None

    async def connect_check(self, config: BotConfig) -> list[Diagnostic]:
        """`chatrun validate --connect`: what only reaching the outside service can tell."""
        return []

    # -- golden transcripts ------------------------------------------------------------------

    def outside(self, spec: Spec) -> str | None:
        """What a call reaches outside the bot ("an HTTP API"), or None: the bot's own code."""
        return None
