"""Sliding-window chat memories with LangChain4j's rules (see docs/memory.md).

- One system message at most; once added it is always retained and always kept first.
  The same content again is ignored; different content replaces it (still first).
- Messages are indivisible: a message that does not fit is evicted whole, oldest first.
  The system message counts towards the window but is never evicted; if it alone exceeds
  the window it is kept anyway (as LangChain4j does) and everything else goes.
- When an assistant message with tool calls is evicted, its tool results go with it, so no
  tool result ever leads the window (OpenAI rejects a tool message without its call).
- chatrun's extra rule: a tool result is kept only if it answers a still-unanswered tool call
  of the assistant message it would follow (the latest assistant message, with nothing but
  tool results after it). Anything else would be an orphan the model provider rejects, so
  it is ignored. This is how a memory cleared (or evicted) mid-tool-call drops the results.

A dynamic maximum (a callable, LangChain4j's `dynamicMaxMessages` / `dynamicMaxTokens`) is read
before every `add`, `set` and `messages()`: a value below 1 raises ChatrunError before anything
changes. Messages a smaller maximum evicted are gone: a later, larger maximum does not bring
them back (LangChain4j re-reads its store and may; see docs/memory.md).

Token counts are computed once per message and cached beside it, with a running total, so
adding a message costs one count plus O(evicted): the window is never re-tokenized and the
store is never read back (LangChain4j does both on every add). With a `ChatMemoryStore`:
messages are loaded once at construction, `update_messages` is called after each change and
`delete_messages` on `clear()`, as LangChain4j's ChatMemoryStore contract says.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, MutableSequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from chatrun.errors import ChatrunError
from chatrun.memory.tokens import TokenCounter, pinned_counter, tiktoken_counter
from chatrun.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    SystemMessage,
    ToolResultMessage,
)

DEFAULT_ID = "default"  # LangChain4j's id of a memory built without one
CLEARED = "[cleared:"  # how a tool result `clear_tool_results` emptied begins
_NO_CALLS: frozenset[str] = frozenset()  # the empty `_open` every memory without unanswered calls shares

if TYPE_CHECKING:
    from chatrun.definition.config import MemoryPolicy
    from chatrun.store import ChatMemoryStore


@runtime_checkable
class ChatMemory(Protocol):
    """LangChain4j's ChatMemory: what the model sees of one conversation thread."""

    id: str
    ephemeral: bool  # True: kept for one turn only, never persisted (policy `none`)

    def add(self, message: Message) -> None: ...

    def messages(self) -> list[Message]:
        """The messages in the window, system message first (a new list)."""
        ...

    def clear(self) -> None: ...

    def set(self, messages: Iterable[Message]) -> None:
        """Replace every message (the add rules and the window still apply)."""
        ...


class _Window:
    """The shared machinery: a system slot plus a sequence of messages, and beside it their counts
    (None while every message counts 1: a window of messages keeps no count of its own)."""

    # No __dict__: a window is kept per memory of every cached session (issue 26). A subclass
    # of one's own without __slots__ gets a __dict__ as usual.
    __slots__ = ("id", "_store", "_system", "_system_count", "_items", "_counts", "_total", "_first", "_open", "_open_seq", "_limit",
                 "clear_tool_results", "version", "_tally")

    ephemeral = False

    def __init__(self, id: str = DEFAULT_ID, store: ChatMemoryStore | None = None):
        self.id = id
        self._store = store
        self.clear_tool_results: int | None = None  # keep only the newest N tool results' content
        # Bumped by every change of the messages: a turn's checkpoint keeps it instead of a copy of
        # the list, and the commit writes the memories whose version moved (issue 26).
        self.version = 0
        self._tally: tuple[str, TokenCounter, int] | None = None  # see token_sum
        self._reset()
        if store is not None:
            loaded = store.get_messages(id)
            if loaded:
                self._refresh_limit()
                self._fill(loaded)
                if self._evict() or self._size() != len(loaded):
                    self._persist()  # the stored list broke a rule or no longer fits: mirror it

    # -- the ChatMemory API -----------------------------------------------------------------

    def add(self, message: Message) -> None:
        self._refresh_limit()  # a bad dynamic maximum fails before the message is taken
        changed = self._append(message)
        if changed and isinstance(message, ToolResultMessage) and self.clear_tool_results is not None:
            self._clear_old_tool_results(self.clear_tool_results)
        changed = self._evict() or changed
        if changed:
            self._persist()

    def messages(self) -> list[Message]:
        if self._dynamic:
            self._refresh_limit()
            if self._evict():  # the maximum may have shrunk since the last add
                self._persist()
        return self._list()

    def clear(self) -> None:
        self._reset()
        if self._store is not None:
            self._store.delete_messages(self.id)

    def set(self, messages: Iterable[Message]) -> None:
        """Replace every message, applying the add rules and the window; one store update.
        An empty iterable clears the memory (as LangChain4j's `set` does)."""
        messages = list(messages)
        if not messages:
            self.clear()
            return
        self._refresh_limit()
        version, old = self.version, self._list()
        self._reset()
        self._fill(messages)
        self._evict()
        if self._list() == old:  # the same messages again (e.g. recounted with another counter)
            self.version = version
        self._persist()

    def token_sum(self, count: TokenCounter) -> int:
        """The sum of `count` over the messages held (no dynamic maximum is read): what a model call sends of this memory, for a usage
        estimate. Kept running (as messages come and go) for the last encoding asked, so a call at
        1,000 messages does not walk them all (issue 26); a counter without an encoding is summed."""
        encoding = getattr(count, "encoding", None)
        tally = self._tally
        if tally is not None and tally[0] == encoding:
            return tally[2]
        total = sum(map(count, self._list()))
        if isinstance(encoding, str):
            self._tally = (encoding, count, total)
        return total

    def _tallied(self, message: Message, sign: int) -> None:
        tally = self._tally
        if tally is not None:
            self._tally = (tally[0], tally[1], tally[2] + sign * tally[1](message))

    # -- introspection ----------------------------------------------------------------------

    def __len__(self) -> int:
        return self._size()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, messages={self._size()}, size={self._total})"

    # -- to override ------------------------------------------------------------------------

    _dynamic = False  # True when the maximum may change between adds
    # _limit: the maximum in force (a slot each subclass with a maximum sets before _Window.__init__)

    def _count(self, message: Message) -> int:
        return 1

    def _over(self) -> bool:
        return False

    def _maximum(self) -> int:
        """The maximum now (a dynamic one is called)."""
        return 0

    def _refresh_limit(self) -> None:
        """Read a dynamic maximum (once per operation, not once per evicted message)."""
        if not self._dynamic:
            return
        limit = self._maximum()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ChatrunError(
                f"memory {self.id}: the dynamic maximum {self._limit_name} returned {limit!r}; "
                "it must be a whole number greater than zero"
            )
        self._limit = limit

    _limit_name = "maximum"

    # -- internals --------------------------------------------------------------------------

    def _reset(self) -> None:
        if getattr(self, "_system", None) is not None or getattr(self, "_items", None):
            self.version += 1
        self._tally = None
        # The system message and its count, in two slots: a (message, count) pair was 64 B of every
        # memory of every idle session (issue 39).
        self._system: SystemMessage | None = None
        self._system_count = 0
        # A list until the window first evicts, then a deque (_pop_front): a deque's first block
        # alone is ~760 B per memory of every idle session, but evicting from a list's front
        # moves the whole window (2.5 us an add at 30,000 messages, against 0.6).
        self._items: MutableSequence[Message] = []
        # Their counts, in step; None while every message counts 1 (a window that does not
        # override _count: a window of messages): a (message, count) pair per message was 56 B of
        # every message of every idle session (issue 39).
        self._counts: MutableSequence[int] | None = None if type(self)._count is _Window._count else []
        self._total = 0  # sum of the counts of the system message and the items
        self._first = 0  # sequence number of _items[0]; item i has number _first + i
        # Unanswered tool call ids of the tail assistant message; shared empty set when none, so
        # an idle memory holds no set of its own (216 B each).
        self._open: frozenset[str] = _NO_CALLS
        self._open_seq = -1  # sequence number of that assistant message

    def _size(self) -> int:
        return len(self._items) + (self._system is not None)

    def _list(self) -> list[Message]:
        out: list[Message] = [self._system] if self._system is not None else []
        out.extend(self._items)
        return out

    def _fill(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self._append(message)

    def _append(self, message: Message) -> bool:
        """Apply the add rules (not the window). Returns whether anything changed."""
        if isinstance(message, SystemMessage):
            if self._system is not None:
                if self._system.content == message.content:
                    return False
                self._total -= self._system_count
                self._tallied(self._system, -1)
            count = self._count(message)
            self._system, self._system_count = message, count
            self._total += count
            self._tallied(message, 1)
            self.version += 1
            return True
        if isinstance(message, ToolResultMessage):
            if self._open_seq < self._first or message.tool_call_id not in self._open:
                return False  # an orphan: its call is not the tail assistant's, or was answered
            self._open = self._open - {message.tool_call_id}
        elif not isinstance(message, Message):
            raise ChatrunError(f"memory {self.id}: cannot add {type(message).__name__}, not a chat message")
        else:
            self._open = _NO_CALLS
        seq = self._first + len(self._items)
        if isinstance(message, AssistantMessage) and message.tool_calls:
            self._open = frozenset(c.id for c in message.tool_calls)
            self._open_seq = seq
        count = self._count(message)
        self._items.append(message)
        if self._counts is not None:
            self._counts.append(count)
        self._total += count
        self._tallied(message, 1)
        self.version += 1
        return True

    def _clear_old_tool_results(self, keep: int) -> None:
        """Replace the content of all but the newest `keep` tool results by a placeholder (the
        call and its result stay paired; a cleared result is never cleared twice)."""
        results = [i for i, m in enumerate(self._items)
                   if isinstance(m, ToolResultMessage) and not m.content.startswith(CLEARED)]
        for i in results[: max(0, len(results) - keep)]:
            old, count = self._items[i], self._count_at(i)
            assert isinstance(old, ToolResultMessage)
            new = ToolResultMessage(old.tool_call_id, old.name, f"{CLEARED} the result of {old.name} is no longer shown]")
            new_count = self._count(new)
            self._items[i] = new
            if self._counts is not None:
                self._counts[i] = new_count
            self._total += new_count - count
            self._tallied(old, -1)
            self._tallied(new, 1)
            self.version += 1

    def _evict(self) -> bool:
        """Evict from the front until the window fits. Returns whether anything was evicted."""
        evicted = False
        while self._items and self._over():
            self._pop_front()
            evicted = True
            # An evicted assistant message takes its tool results along: none may lead.
            while self._items and isinstance(self._items[0], ToolResultMessage):
                self._pop_front()
        return evicted

    def _pop_front(self) -> None:
        items = self._items
        if not isinstance(items, deque):  # the counts move to a deque with them
            items = self._items = deque(items)
            self._counts = None if self._counts is None else deque(self._counts)
        message = items.popleft()
        counts = self._counts
        count = 1 if counts is None else counts.popleft() if isinstance(counts, deque) else counts.pop(0)
        self._total -= count
        self._tallied(message, -1)
        self._first += 1
        self.version += 1

    def _count_at(self, index: int) -> int:
        """The count of `_items[index]`."""
        return 1 if self._counts is None else self._counts[index]

    def _persist(self) -> None:
        if self._store is not None:
            self._store.update_messages(self.id, self._list())


class MessageWindowMemory(_Window):
    """Keeps the `max_messages` most recent messages (the system message counts, as in
    LangChain4j's MessageWindowChatMemory).

    `max_messages`: an int, or a callable read before every add, set and `messages()`
    (LangChain4j's `dynamicMaxMessages`). `id` defaults to LangChain4j's "default".
    """

    __slots__ = ("_max", "_dynamic")
    _limit_name = "max_messages"

    def __init__(
        self,
        id: str = DEFAULT_ID,
        max_messages: int | Callable[[], int] | None = None,
        store: ChatMemoryStore | None = None,
    ):
        if not callable(max_messages) and (
            isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1
        ):
            raise ChatrunError(f"memory {id}: max_messages must be a whole number >= 1, got {max_messages!r}")
        self._max = max_messages
        self._dynamic = callable(max_messages)
        self._limit = 0 if callable(max_messages) else max_messages
        super().__init__(id, store)

    @property
    def max_messages(self) -> int:
        """The current maximum (a dynamic maximum is read now)."""
        return self._max() if callable(self._max) else self._max

    def _maximum(self) -> int:
        return self.max_messages

    def _over(self) -> bool:
        return self._size() > self._limit


class TokenWindowMemory(_Window):
    """Keeps as many of the most recent messages as fit in `max_tokens` tokens.

    `max_tokens`: an int, or a callable read on every add (and on `messages()`), e.g. the
    model's context size minus the reply reserve. `counter`: any `Message -> int`; by default
    tiktoken with `encoding`, else the model's encoding, else o200k_base (see tokens.py).
    """

    __slots__ = ("_max", "_dynamic", "counter", "fullest", "beside", "_tools_counted")
    _limit_name = "max_tokens"

    def __init__(
        self,
        id: str = DEFAULT_ID,
        max_tokens: int | Callable[[], int] | None = None,
        counter: TokenCounter | None = None,
        encoding: str | None = None,
        model_name: str | None = None,
        store: ChatMemoryStore | None = None,
    ):
        if not callable(max_tokens) and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise ChatrunError(f"memory {id}: max_tokens must be a whole number >= 1, got {max_tokens!r}")
        self._max = max_tokens
        self._dynamic = callable(max_tokens)
        self._limit = 0 if callable(max_tokens) else max_tokens
        self.counter: TokenCounter = counter or tiktoken_counter(encoding, model_name)
        self.fullest = 0  # the most tokens it was asked to hold (before evicting), see near_limit
        # A window sized to the model's context (make_memory): what the next request sends beside
        # it, counted by leave_room; None for any other window (nothing to leave room for).
        self.beside: int | None = None
        self._tools_counted: tuple[list[dict[str, Any]], int] | None = None  # (the specs, their count)
        super().__init__(id, store)

    @property
    def max_tokens(self) -> int:
        """The current maximum (a dynamic maximum is read now)."""
        return self._max() if callable(self._max) else self._max

    @property
    def token_count(self) -> int:
        """Tokens in the window, system message included (from the cached counts)."""
        return self._total

    def _count(self, message: Message) -> int:
        return self.counter(message)

    def _maximum(self) -> int:
        return self.max_tokens

    def _over(self) -> bool:
        self.fullest = max(self.fullest, self._total)
        return self._total > self._limit

    def leave_room(self, sent_with: list[Message], tools: list[dict[str, Any]]) -> None:
        """Before a model call, for a window sized to the model's context: count what the request
        sends beside the window (the offered tools' schemas, the route's `context:`, knowledge
        passages), which its maximum then leaves room for, so the request fits the context. The
        schemas are counted once per list of them (a route's stays the same); a no-op for a window
        of a fixed size."""
        if self.beside is None:
            return
        known = self._tools_counted
        if known is None or known[0] is not tools:
            text = json.dumps(tools, ensure_ascii=False)  # JSON spends more than the model's own form: the safe side
            known = self._tools_counted = (tools, self.counter(SystemMessage(text)) if tools else 0)
        self.beside = known[1] + sum(map(self.counter, sent_with))

    def near_limit(self) -> bool:
        """Whether the window has held at least half its maximum: from there another counter
        (the estimate instead of tiktoken's, or another encoding) may evict other messages."""
        return self.fullest * 2 >= self.max_tokens


class SummaryMemory(TokenWindowMemory):
    """Policy `summary`: keeps every message until the memory passes `max_tokens`; then the
    engine asks a model to fold the oldest messages into a running summary (`fold_plan`,
    `apply_summary`), keeping the newest `keep_messages` verbatim. The system message stays
    first and untouched; the summary comes right after it; a tool call is never separated
    from its results. The summary is extended, never rewritten from scratch: the next fold
    hands the model the summary so far and only the newly folded messages."""

    __slots__ = ("keep_messages",)

    def __init__(self, id: str = DEFAULT_ID, max_tokens: int = 3000, keep_messages: int = 10,
                 counter: TokenCounter | None = None, encoding: str | None = None, model_name: str | None = None,
                 store: ChatMemoryStore | None = None):
        if isinstance(keep_messages, bool) or not isinstance(keep_messages, int) or keep_messages < 1:
            raise ChatrunError(f"memory {id}: keep_messages must be a whole number >= 1, got {keep_messages!r}")
        self.keep_messages = keep_messages
        super().__init__(id, max_tokens, counter, encoding, model_name, store)

    def _over(self) -> bool:
        self.fullest = max(self.fullest, self._total)
        return False  # never evicts by itself: the engine summarizes

    @property
    def summary(self) -> SummaryMessage | None:
        first = self._items[0] if self._items else None
        return first if isinstance(first, SummaryMessage) else None

    def fold_plan(self) -> list[Message] | None:
        """The messages to fold into the summary now, or None while the memory fits."""
        if self._total <= self.max_tokens:
            return None
        verbatim = [m for m in self._items if not isinstance(m, SummaryMessage)]
        boundary = len(verbatim) - self.keep_messages
        while 0 < boundary < len(verbatim) and isinstance(verbatim[boundary], ToolResultMessage):
            boundary -= 1  # keep the call with its results
        return verbatim[:boundary] if boundary > 0 else None

    def apply_summary(self, text: str, folded: list[Message]) -> None:
        """Replace the summary so far and the `folded` messages (the oldest verbatim ones) by `text`."""
        verbatim = [m for m in self._items if not isinstance(m, SummaryMessage)]
        if verbatim[: len(folded)] != folded:
            raise ChatrunError(f"memory {self.id}: the messages to fold changed before the summary arrived")
        summary = SummaryMessage(text)
        # Garbage (a runaway answer, the conversation repeated) would grow the memory it is to shrink,
        # and every later turn would fold again: refused, beyond the heading a first summary adds.
        replaced = sum(map(self.counter, folded)) + self.counter(self.summary or SummaryMessage(""))
        if (tokens := self.counter(summary)) > replaced:
            raise ChatrunError(f"memory {self.id}: the summary ({tokens} tokens) is no shorter than the messages "
                               f"it would replace ({replaced} tokens); they are kept")
        system = [self._system] if self._system is not None else []
        self._reset()
        self._fill([*system, summary, *verbatim[len(folded):]])
        self._persist()


class TurnOnlyMemory(_Window):
    """Policy `none`: holds the messages of the current turn only. The engine clears it at the
    end of each turn and never persists it (`ephemeral`). The add rules still apply."""

    __slots__ = ()
    ephemeral = True

    def __init__(self, id: str = DEFAULT_ID):
        self._limit = 0
        super().__init__(id, None)


def make_memory(
    policy: MemoryPolicy, memory_id: str, model_name: str | None = None, reply_limit: int | None = None,
    tokenizer: str | None = None,
) -> ChatMemory:
    """The memory a route's policy asks for. The token window's counter is the pinned
    `tokenizer` (a transcript's), else the policy's encoding, else the route model's, else o200k_base. A `{context_size, reply_reserve}` window is a
    dynamic maximum: context_size minus the reserve (else minus `reply_limit`, the route
    model's max_tokens). `clear_tool_results` applies to every policy."""
    memory: _Window
    counter = pinned_counter(tokenizer) if tokenizer and policy.type in ("token_window", "summary") else None
    if policy.type == "message_window":
        memory = MessageWindowMemory(memory_id, policy.max_messages)
    elif policy.type == "token_window":
        max_tokens: int | Callable[[], int] = policy.max_tokens
        if policy.context_size is not None:
            context, reserve = policy.context_size, policy.reply_reserve or reply_limit
            if reserve is None:
                raise ChatrunError(f"memory {memory_id}: max_tokens.context_size needs a reply_reserve "
                                   "(or the model's max_tokens)")

            def room() -> int:  # read on every add, as LangChain4j's: the context less the reply's
                # reserve and what the request sends beside the window (leave_room); at least 1
                return max(1, context - reserve - (window.beside or 0))
            max_tokens = room
        window = TokenWindowMemory(memory_id, max_tokens, counter, policy.encoding, model_name)
        if policy.context_size is not None:
            window.beside = 0
        memory = window
    elif policy.type == "summary":
        memory = SummaryMemory(memory_id, policy.max_tokens, policy.keep_messages, counter, policy.encoding,
                               model_name)
    elif policy.type == "none":
        memory = TurnOnlyMemory(memory_id)
    else:
        raise ChatrunError(f"memory {memory_id}: unknown memory type {policy.type!r}; "
                           "use message_window, token_window, summary or none")
    memory.clear_tool_results = policy.clear_tool_results
    return memory
