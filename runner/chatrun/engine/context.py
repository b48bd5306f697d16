"""What every part of one turn shares: the conversation, the turn's input, its events, its templates.

The model loop (engine/turn.py), the tool call path (engine/call.py), the items that make a call
wait (engine/pausing.py) and the decisions that resolve them (engine/waiting.py) each take this
context, never each other: a part reads the turn's input and writes the turn's records here, and
nothing else of the turn is within its reach.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any, Literal, overload

from chatrun import events as ev
from chatrun.definition.config import BotConfig, RouteConfig
from chatrun.definition.page_texts import page_texts, said
from chatrun.definition.templates import is_nothing, plain_text
from chatrun.engine.conversation import Conversation
from chatrun.engine.pending import Decision
from chatrun.engine.scopes import set_path
from chatrun.engine.tools import Toolbox, ToolMocks
from chatrun.errors import ChatrunError, TurnFailed
from chatrun.memory import ChatMemory
from chatrun.messages import Attachment, Message, UserMessage
from chatrun.store.blobs import BlobArea

Emit = Callable[..., None]  # (type, data, runtime=False, audience=None, multi=False)
# The events that give the user something: a reply, something to choose or answer, or the end.
_SAYS = frozenset({ev.MESSAGE, ev.OBJECT, ev.CHOICES, ev.PENDING, ev.ERROR, ev.ENDED})
# (route, instructions, text) -> the route's summary model's answer (engine/turn.py's summary_call)
Summarize = Callable[[str, str, str], Awaitable[str]]


def _not_finite(value: Any) -> bool:
    """Whether a value holds NaN or an infinity (1e308 + 1e308 from two numbers a model sent):
    no snapshot can keep it."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_not_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_not_finite(v) for v in value)
    return False


class TurnContext:
    """One turn's input, what its parts record of it, and the conversation it acts on."""

    def __init__(self, conversation: Conversation, tools: Toolbox, emit: Emit, text: str | None,
                 data: dict[str, Any], mocks: ToolMocks | None, decision: Decision | None,
                 attachments: tuple[Attachment, ...], blobs: BlobArea | None, summarize: Summarize):
        self.c = conversation
        self.config: BotConfig = conversation.config
        self.tools = tools
        self._emit = emit
        # The turn sent the user something to read or act on (a message, an object, choices, a
        # pending item, an error, the end): an empty model answer then leaves no one without a reply.
        self.said = False
        self.mocks = mocks
        self.number = conversation.turn_count + 1
        self.user_message = text
        self.data = data
        self.attachments = attachments  # the files sent with the message: in its UserMessage
        self.blobs = blobs
        self.summarize = summarize
        self.turn_state: dict[str, Any] = {}
        # Each tool call of the turn, in order, for the history (its `calls`): the tool, the route
        # it ran on, the arguments it ran with (bound ones included), its result, and what the
        # model read of it (`reply`, or `error` when it failed).
        self.tool_calls: list[dict[str, Any]] = []
        self.wipe_scheduled: set[str] = set()
        self.wipe_aborted: set[str] = set()
        # Memories that have this turn's user message, or resume a call without it: a route run
        # again in the same turn (pop + execute, a route change back) does not get it twice.
        self.user_given: set[str] = set()
        # The memory last given the user's message and that message, until a request of that memory
        # is made: it must hold the message (engine/turn.py `sent_whole`).
        self.given: tuple[ChatMemory, Message] | None = None
        self.ended: str | None = None  # the tool that ended the conversation
        self.decision = decision  # the input of a decision turn (Approve, Answer, Expire, ...), else None
        self.decision_info: dict[str, Any] | None = None  # `decision` in templates while one applies
        self.paused = False  # a call of this turn waits (approval, question, operator)

    def give(self, memory: ChatMemory, text: str | None) -> None:
        """The user's message (`text` and the turn's files) into `memory`, kept in `given` so the next
        request of that memory is checked to hold it (a window evicts a message larger than itself)."""
        message = UserMessage(text or "", self.attachments)
        memory.add(message)
        self.given = (memory, message)

    def emit(self, event_type: str, data: Any, *args: Any, **kwargs: Any) -> None:
        """Send one of the turn's events (as `Emit`), noting whether the user got something."""
        if event_type in _SAYS and kwargs.get("audience") in (None, ev.USER):
            self.said = True
        self._emit(event_type, data, *args, **kwargs)

    # -- templates ----------------------------------------------------------------

    @overload
    def render_template(self, source: Any, what: str, where: Any, values: dict[str, Any] | None = None,
                        *, typed: Literal[False] = False) -> str: ...

    @overload
    def render_template(self, source: Any, what: str, where: Any, values: dict[str, Any] | None = None,
                        *, typed: bool) -> Any: ...

    def render_template(self, source: Any, what: str, where: Any, values: dict[str, Any] | None = None,
                        *, typed: bool = False) -> Any:
        """Render for text (typed=False) or for a value that keeps its type (setters, event data).
        `values` adds to what templates see (a tool's `args` and `result`)."""
        if not typed and isinstance(source, str):
            text = plain_text(source)
            if text is not None:  # what it renders to needs no context (made anew for each template)
                return text
        try:
            return self.c.render(source, self.context(**(values or {})), typed=typed)
        except ChatrunError:
            raise
        except Exception as exc:  # jinja2 UndefinedError, TypeError in filters, ...
            raise TurnFailed(f"{where}: {what} template failed: {exc}") from exc

    def context(self, **values: Any) -> dict[str, Any]:
        """What this turn's templates see, with `values` (a tool's `args`, `result`) and, while a
        decision applies, `decision`."""
        if self.decision_info is not None:
            values = {"decision": self.decision_info, **values}
        return self.c.template_context(self.turn_state, self.user_message, self.data, **values)

    def roots(self) -> dict[str, Any]:
        """The state a path (`state.x`, `scope.y`, `turn.z`) is read from and written to."""
        return self.c.state_roots(self.turn_state)

    def assigns_nothing(self, template: Any, value: Any) -> bool:
        """Whether a `set` template's value assigns nothing: in format 2 a template that renders to
        none/undefined does; in format 1 it assigned None (docs/format.md, "Format version")."""
        return isinstance(template, str) and is_nothing(value) and self.config.format_version >= 2

    def assign(self, sets: dict[str, Any], what: str, where: Any, values: dict[str, Any], owner: str) -> None:
        """`set` assignments (an action's, a structured answer's): each template rendered for a
        typed value and written at its path; a value that assigns nothing (`assigns_nothing`) is
        skipped."""
        roots = self.roots()
        for path, template in sets.items():
            value = self.render_template(template, f"{what} {path}", where, values, typed=True)
            if not self.assigns_nothing(template, value):
                self.write_state(path, None if is_nothing(value) else value, owner, where, roots)

    def write_state(self, path: str, value: Any, owner: str, where: Any, roots: dict[str, Any] | None = None) -> None:
        """The one place a turn writes state (`set`, `output.set`, `ask.into`): a copy of `value` at
        `path` (`state.x`, `scope.y`, `turn.z`); a path that cannot be written fails the turn, naming
        its owner (e.g. "tool book") and where it is declared."""
        if _not_finite(value):  # here, not when the turn saves: the failure names the tool and the path
            shown = f"be {value!r}" if isinstance(value, float) else "hold a number"
            raise TurnFailed(f"{owner} ({where}): {path} would {shown}, which JSON cannot hold "
                             "(a number out of range, or not a number)")
        try:
            set_path(roots if roots is not None else self.roots(), path, copy.deepcopy(value))
        except ChatrunError as exc:
            raise TurnFailed(f"{owner} ({where}): {exc}") from exc

    def render_user(self, route: RouteConfig) -> str | None:
        """The user's message as the route's memory gets it (its `user:` template, the text, or the data)."""
        if route.user:
            return self.render_template(route.user, f"route {route.name} user", route.where)
        if self.user_message is not None:
            return self.user_message
        if self.data:
            return json.dumps(self.data, ensure_ascii=False)
        return None

    def user_texts(self) -> list[str]:
        """What the user said, for `from_user:` (engine/said.py): this turn's message (its text and
        data) and the user messages the memories of the current scope and the scopes it is nested
        in hold (a wizard's value may have been said to the route that pushed it). Never the
        assistant's or a tool's words: a value the model wrote itself does not become the user's."""
        texts = [self.user_message] if self.user_message else []
        if self.data:
            texts.append(json.dumps(self.data, ensure_ascii=False))
        for scope in reversed(self.c.scopes):
            for route in scope.memory_routes:
                texts += [m.content for m in self.c.memory_for(scope, route).messages()
                          if isinstance(m, UserMessage) and m.content]
        return texts

    # -- chatrun's own texts --------------------------------------------------------

    def texts(self) -> dict[str, str]:
        """chatrun's own texts in the session's locale (definition/page_texts.py; a bot's
        catalog `page.<key>` replaces one)."""
        return page_texts(self.config.catalogs, self.c.locale)

    def own_text(self, key: str, **args: Any) -> str:
        """One of chatrun's own texts for the user, in the session's locale, filled with `args`."""
        return said(self.texts(), key, **args)

    # -- choices ------------------------------------------------------------------

    def offer(self, choices: list[Any] | str | None, what: str, where: Any,
              values: dict[str, Any] | None = None) -> None:
        """A Choices event: static choices, or a template's list (none or empty: no event)."""
        normalized = self.choice_list(choices, what, where, values)
        if normalized:
            self.emit(ev.CHOICES, {"choices": normalized})

    def choice_list(self, choices: list[Any] | str | None, what: str, where: Any,
                    values: dict[str, Any] | None = None) -> list[dict[str, str]]:
        """Choices as `[{label, value}]`: static ones, or a template's list (none: no choices)."""
        if choices is None:
            return []
        items = self.render_template(choices, what, where, values, typed=True) if isinstance(choices, str) else choices
        if is_nothing(items):
            return []
        if not isinstance(items, list):
            raise TurnFailed(f"{where}: {what}: the template gave {type(items).__name__}, not a list of choices")
        normalized = []
        for item in items:
            if isinstance(item, dict) and item.get("label") not in (None, ""):
                normalized.append({"label": str(item["label"]), "value": str(item.get("value") or item["label"])})
            elif isinstance(item, (str, int, float)) and not isinstance(item, bool) and str(item):
                normalized.append({"label": str(item), "value": str(item)})
            else:
                raise TurnFailed(f"{where}: {what}: {item!r} is not a choice (a text, or a mapping with a label)")
        return normalized

    # -- the conversation's moves and files ---------------------------------------

    def resume(self, caller: dict[str, str] | None) -> None:
        """After a called scope returned: the parent runs on without this turn's user message (the
        called route had it; the parent's memory ends with the call and its result)."""
        if caller is not None:
            self.user_given.add(self.c.scope.memory_id(self.c.scope.route))

    def read_blob(self, ref: str) -> bytes | None:
        return self.blobs.read(self.c.id, ref) if self.blobs is not None else None

    def conversation_attachments(self) -> list[Attachment]:
        """The files the current route's memory holds (what its model has seen), oldest first,
        each once, then this turn's message's (a route whose memory keeps no user message)."""
        scope = self.c.scope
        memory = self.c.memory_for(scope, scope.route, create=False)
        found: dict[str, Attachment] = {}
        for message in [*memory.messages(), UserMessage("", self.attachments)]:
            for attachment in message.attachments if isinstance(message, UserMessage) else ():
                found.pop(attachment.ref, None)  # seen again: it is as new as its latest sending
                found[attachment.ref] = attachment
        return list(found.values())


def storable(value: Any) -> Any:
    """A call's arguments or result as the history keeps them: plain JSON, a lone UTF-16
    surrogate (the model's arguments may hold one; no store can) replaced, so that the record of
    a failed turn stays readable."""
    plain = ev.plain(value)
    if isinstance(plain, str):  # most results: text, kept as it is unless it holds a lone surrogate
        return plain.encode("utf-8", "replace").decode("utf-8") if not plain.isascii() else plain
    if plain is None or isinstance(plain, bool | int | float):
        return plain
    text = json.dumps(plain, ensure_ascii=False)
    return json.loads(text.encode("utf-8", "replace").decode("utf-8"))
