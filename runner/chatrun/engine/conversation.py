"""The state of one conversation, which a turn acts on.

A conversation is a stack of scopes (root first, each on a route), the conversation
state, a turn counter and the memories of its routes, loaded from the store once and
cached. Everything a tool action does to a conversation is a method here: push, pop,
change route, clear memories. So is what makes turns atomic: `capture()` before a turn,
`rollback()` after a failed one, `dirty_memories()` for the commit of a good one.

It knows nothing of events' consumers, models or the session API (chatrun.engine.session
wraps it): the turn (chatrun.engine.turn) reads and changes it, the session owns it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from chatrun import events as ev
from chatrun.definition.config import BotConfig, MigrationConfig, RouteConfig
from chatrun.definition.templates import CATALOGS_KEY, render, render_value
from chatrun.engine.clock import SYSTEM_CLOCK, Clock, session_zone
from chatrun.engine.pending import (
    PENDING_COUNTER_KEY,
    PENDING_KEY,
    RESOLVED_KEY,
    TAKEOVER_KEY,
    PendingItem,
)
from chatrun.engine.scopes import (
    UNWRITTEN,
    OwnOnRead,
    Scope,
    ScopeView,
    compact,
    init_declared,
    merged_scope,
)
from chatrun.engine.usage import Usage, UserSpent
from chatrun.errors import ForbiddenRouteError, SessionError, UnknownRouteError
from chatrun.memory import ChatMemory, make_memory
from chatrun.messages import AssistantMessage, Message, SummaryMessage, ToolCall, ToolResultMessage
from chatrun.store import SessionStore
from chatrun.store.record import (
    FOLLOW_UP_KEY,
    OUTCOME_KEY,
    RETRY_KEY,
    SCOPE_SEPARATOR,
    follow_up_of,
    outcome_of,
    owner_in_meta,
    retry_of,
    route_of_memory,
    scope_id,
)

if TYPE_CHECKING:
    from chatrun.store.billing import RecordJournal

SNAPSHOT_VERSION = 1
DONE_CALLS_KEY = "calls_done"  # the snapshot's record of calls done once (engine/once.py)
BILLED_KEY = "billed"  # the last attempt whose model calls `usage` counts (store/billing.py)
# Every top-level field a snapshot of this chatrun has: what `snapshot` writes, and "committed",
# which the server adds to it as stored (store/record.py, with_committed). Any other was written
# by a newer chatrun and is kept (Conversation.unknown).
SNAPSHOT_KEYS = frozenset({"version", "bot", "bot_version", "id", "turn", "state", "scopes", "next_scope", "meta",
                           "usage", "updated", "ended", PENDING_KEY, PENDING_COUNTER_KEY, TAKEOVER_KEY, RESOLVED_KEY,
                           DONE_CALLS_KEY, FOLLOW_UP_KEY, OUTCOME_KEY, RETRY_KEY, BILLED_KEY, "committed"})
NOTHING_RESOLVED: Mapping[str, str] = MappingProxyType({})  # shared by every session with none
NO_FACTS: Mapping[str, Any] = MappingProxyType({})  # user memory: shared by every session with none (replaced, not changed)


@dataclass
class Checkpoint:
    """A conversation as it was before a turn, to restore if the turn fails."""

    turn_count: int
    state: dict[str, Any]
    scopes: list[Scope]
    next_scope: int
    # Each loaded memory and its version then (the windows count their changes, so no copy of the
    # messages is needed: a rollback reloads them from the store); a memory without a version: its messages.
    memories: dict[str, tuple[ChatMemory, int] | list[Message]]
    usage: Usage
    ended: dict[str, str] | None = None
    pending: list[dict[str, Any]] | None = None  # the open items (their snapshot form)
    next_pending: int = 1
    taken_over: dict[str, Any] | None = None
    resolved: dict[str, str] | None = None
    done_calls: tuple[str, ...] = ()  # never changed in place: the turn's start, kept as is
    follow_up: dict[str, Any] | None = None  # the armed follow-up (never changed in place)
    outcome: dict[str, Any] | None = None  # the recorded outcome or the armed silence (never changed in place)
    user_memory: Mapping[str, Any] = field(default_factory=lambda: NO_FACTS)  # (never changed in place)
    remembered: Mapping[str, Any] = field(default_factory=lambda: NO_FACTS)  # (never changed in place)
    unscreened: tuple[str, ...] = ()  # a failed turn's memory is the seeded one again: judged by the next


class Conversation:
    # No __dict__: one per cached session (issue 26).
    __slots__ = ("config", "store", "id", "roles", "principal", "turn_count", "_state", "_meta", "scopes", "_next_scope",
                 "_memories", "usage", "ended", "clock", "turn_instant", "tokenizer", "pending", "next_pending",
                 "taken_over", "resolved", "done_calls", "follow_up", "outcome", "user_memory",
                 "remembered", "unknown", "retry", "unscreened", "moved_by", "user_spent", "billed", "journal",
                 "record_read", "lease_record")

    def __init__(self, config: BotConfig, store: SessionStore, session_id: str,
                 roles: set[str] | None = None):
        self.config = config
        self.store = store
        self.id = session_id
        self.roles = roles
        # Who is signed in, as templates see it (`principal.name`, `.roles`, claims such as `.email`);
        # None: no one (the REPL, a server without --auth). Set per request, never stored.
        self.principal: dict[str, Any] | None = None
        # What the bot keeps of that principal across conversations (`user_memory:`; FACT -> value),
        # loaded per request like the principal and never stored in the session; `remembered`:
        # what this request's turns wrote to it (None: a fact forgotten), for whoever saves it.
        self.user_memory: Mapping[str, Any] = NO_FACTS
        self.remembered: Mapping[str, Any] = NO_FACTS
        # What the user has used of `limits.max_user_*` in the current window (the server sets it
        # per turn, store/user_budget.py; None: no user budget to check). Never stored.
        self.user_spent: UserSpent | None = None
        self.turn_count = 0  # turns committed so far
        # The conversation state and meta: properties (below); an idle conversation shares UNWRITTEN
        # for an empty one (scopes.compact).
        self._state: dict[str, Any] = UNWRITTEN
        self._meta: dict[str, Any] = UNWRITTEN
        self.scopes: list[Scope] = []
        self._next_scope = 1
        # The memories loaded or made so far, each under its own `id` (scope id#route): a tuple, not a
        # dict by id (a one-key dict was 184 B of every idle session; a session holds a few; issue 39).
        self._memories: tuple[ChatMemory, ...] = ()
        self.usage = Usage()  # every model call of the session, failed turns included
        self.ended: dict[str, str] | None = None  # set by an `end` action: {"tool", "route"}
        self.clock: Clock = SYSTEM_CLOCK  # what `now` reads (transcripts and the REPL pin it)
        self.turn_instant: datetime | None = None  # the clock read once when a turn starts
        self.tokenizer: str | None = None  # the pinned token counter (a transcript's `tokenizer:`)
        # The user's texts a conversation begun elsewhere was just seeded with (Session.seed_memory),
        # which its next turn's `languages` and `moderation` input guards judge (engine/guardrails.py).
        self.unscreened: tuple[str, ...] = ()
        # Open items, oldest first (engine/pending.py), and the last resolved items' outcomes by
        # id (NotPending says it). Most sessions never have any: both start as shared empties (an
        # empty tuple, a read-only empty mapping) and are replaced, never changed in place, so an
        # idle session keeps no list or dict for them (tests/test_idle_session_memory.py).
        self.pending: tuple[PendingItem, ...] = ()
        self.next_pending = 1  # the number of the next item ("p1", "p2", ...)
        self.taken_over: dict[str, Any] | None = None  # {"by", "since"} while an operator has it
        self.resolved: Mapping[str, str] = NOTHING_RESOLVED
        # The calls of `once` tools done so far, oldest first (engine/once.py): replaced, never
        # changed in place, like `pending`.
        self.done_calls: tuple[str, ...] = ()
        # The migrations a move to another version applied, until the turn that moves commits: that
        # turn's calls are keyed as the version it left spells them (engine/call.py `call_key`).
        self.moved_by: tuple[MigrationConfig, ...] = ()
        # The armed follow-up (engine/follow_up.py): {"due", "route", "since"}; replaced, never changed in place.
        self.follow_up: dict[str, Any] | None = None
        # The outcome (engine/outcomes.py): recorded {"name", ...} or armed {"due", "since"}; replaced, never changed in place.
        self.outcome: dict[str, Any] | None = None
        # The sweep backoff after a failed timeout turn ({"after", "wait"}; engine/pending.py `retried`):
        # set by the failed turn's record, cleared by the next committed turn. Not rolled back.
        self.retry: dict[str, Any] | None = None
        # The stored snapshot's fields this chatrun does not know (a newer replica's, in a rolling
        # deploy): written back as read by every commit (`snapshot`), so this replica never drops
        # them. None for nearly every session: then they cost `snapshot` one test.
        self.unknown: dict[str, Any] | None = None
        # The last attempt (store/billing.py) whose model calls `usage` counts, and what records
        # each model call's usage durably as it ends (the server's; None: nothing does). Set by
        # the commit of a turn that made model calls (Session._count), never rolled back.
        self.billed: str | None = None
        self.journal: RecordJournal | None = None
        self.record_read = False  # this live copy read its usage record (engine/turn.py `open_attempt`)
        # The usage record a store read with the lease of the request about to run a turn (Redis,
        # PostgreSQL: the server's SessionOpener.ready), as a 1-tuple of its JSON text (None: no
        # record), taken by the request's first attempt, which so spares its own read; None: not read.
        self.lease_record: tuple[str | None] | None = None

    # -- starting and resuming ---------------------------------------------------------

    def start(self, route: str, state: dict[str, Any] | None, meta: dict[str, Any] | None) -> None:
        """A new conversation on `route`, with the YAML's state updated by `state`."""
        if route not in self.config.routes:
            raise UnknownRouteError(route, list(self.config.routes))
        if not self.may_enter(route):
            raise ForbiddenRouteError(f"route {route!r} needs one of the roles {self.config.routes[route].roles}")
        self.meta = dict(meta or {})
        self.state = copy.deepcopy(self.config.state)
        self.state.update(copy.deepcopy(state or {}))
        self.scopes = [self._new_scope(self.config.routes[route])]

    def restore(self, snapshot: dict[str, Any]) -> None:
        """The conversation a stored snapshot describes."""
        if snapshot.get("bot") not in (None, self.config.name):
            raise SessionError(f"session {snapshot.get('id')} belongs to bot {snapshot.get('bot')!r}, "
                               f"not {self.config.name!r}")
        self.id = snapshot["id"]
        self.turn_count = snapshot["turn"]
        self.state = snapshot["state"]
        self.meta = snapshot.get("meta", {})
        self._next_scope = snapshot["next_scope"]
        self.scopes = [Scope.from_dict(d) for d in snapshot["scopes"]]
        self.usage = Usage.from_dict(snapshot.get("usage"))
        self.ended = snapshot.get("ended")
        self.pending = tuple(PendingItem.from_dict(d) for d in snapshot.get(PENDING_KEY) or ())
        self.next_pending = snapshot.get(PENDING_COUNTER_KEY, 1)
        self.taken_over = snapshot.get(TAKEOVER_KEY)
        self.resolved = snapshot.get(RESOLVED_KEY) or NOTHING_RESOLVED
        # Absent in older snapshots; a record entry is a string (engine/once.py), anything else is dropped.
        self.done_calls = tuple(e for e in snapshot.get(DONE_CALLS_KEY) or () if isinstance(e, str))
        self.follow_up = follow_up_of(snapshot)
        self.outcome = outcome_of(snapshot)
        self.retry = retry_of(snapshot)
        self.billed = snapshot.get(BILLED_KEY)
        # One subset test in C when every field is known (the usual case).
        self.unknown = None if snapshot.keys() <= SNAPSHOT_KEYS else {
            k: v for k, v in snapshot.items() if k not in SNAPSHOT_KEYS}
        # A scope on a route this bot lacks is moved by the session (engine/versions.py) before it runs.

    def snapshot(self) -> dict[str, Any]:
        """The conversation as JSON-able data (not a copy): what the store keeps between turns,
        with the stored fields this chatrun does not know, as read (`restore`)."""
        snapshot = {
            "version": SNAPSHOT_VERSION,
            "bot": self.config.name,
            "bot_version": self.config.content_version,
            "id": self.id,
            "turn": self.turn_count,
            "state": self._state or {},  # a fresh one for UNWRITTEN: a reader of the snapshot may write it
            "scopes": [s.to_dict() for s in self.scopes],
            "next_scope": self._next_scope,
            "meta": self._meta or {},
            "usage": self.usage.to_dict(),
            "updated": time.time(),
            **({"ended": self.ended} if self.ended else {}),
            # Only sessions that ever had an item carry these: other snapshots read as before.
            **({PENDING_KEY: [item.to_dict() for item in self.pending], PENDING_COUNTER_KEY: self.next_pending}
               if self.next_pending > 1 else {}),
            **({TAKEOVER_KEY: self.taken_over} if self.taken_over else {}),
            **({RESOLVED_KEY: self.resolved} if self.resolved else {}),
            **({DONE_CALLS_KEY: list(self.done_calls)} if self.done_calls else {}),
            **({FOLLOW_UP_KEY: self.follow_up} if self.follow_up else {}),
            **({OUTCOME_KEY: self.outcome} if self.outcome else {}),
            **({RETRY_KEY: self.retry} if self.retry else {}),
            **({BILLED_KEY: self.billed} if self.billed else {}),
        }
        if self.unknown is not None:
            snapshot.update(self.unknown)
        return snapshot

    # -- its state ---------------------------------------------------------------------------

    state = OwnOnRead()  # the conversation state (every scope sees it)
    meta = OwnOnRead()  # what the session's opener told about it (owner, channel, locale...)

    @property
    def keyed_as(self) -> str:
        """The session id its calls' idempotency keys are made of: its own, or for a `/v1` fork the
        original conversation's (the first of a chain of forks), so that regenerating an answer or
        editing a message makes the same call with the same key and a service that dedupes pays once."""
        forked = self._meta.get("forked_from")
        return str(forked.get("keys", forked["session"])) if isinstance(forked, dict) else self.id

    def compact(self) -> None:
        """Between turns: empty state, meta and scope state go back to the shared UNWRITTEN, so an
        idle session keeps no empty dict of its own (four were 256 B of every idle session; issue 39).
        Only when no turn runs: a dict handed out during one may still be written."""
        self._state, self._meta = compact(self._state), compact(self._meta)
        for scope in self.scopes:
            scope.compact()

    # -- where it is -----------------------------------------------------------------------

    @property
    def scope(self) -> Scope:
        return self.scopes[-1]

    @property
    def route(self) -> RouteConfig:
        return self.config.routes[self.scopes[-1].route]

    @property
    def stack(self) -> list[str]:
        return [s.route for s in self.scopes]

    def find_scope(self, scope_id: str) -> Scope:
        for s in self.scopes:
            if s.id == scope_id:
                return s
        raise SessionError(f"session {self.id} has no scope {scope_id!r}; scopes: {[s.id for s in self.scopes]}")

    def user_memory_owner(self) -> str | None:
        """Whose user memory this conversation reads and writes: the person it is with — the
        session's owner (who opened it: the signed-in user, a channel's user), not whoever sends
        this request (an operator deciding, the sweeper's timeout); a session with no owner (a
        library session) is the signed-in principal's. None: no one to remember anything of."""
        owner = owner_in_meta(self.meta)
        if owner is not None:
            return owner
        return str(self.principal["name"]) if self.principal is not None and self.principal.get("name") else None

    def may_enter(self, route: str) -> bool:
        needed = self.config.routes[route].roles
        return not needed or self.roles is None or bool(self.roles.intersection(needed))

    # -- moving between routes (tool actions) ----------------------------------------------

    def push_scope(self, route: str, caller: dict[str, str] | None = None) -> None:
        scope = self._new_scope(self.config.routes[route])
        scope.caller = caller
        self.scopes.append(scope)

    def pop_scope(self, handed_back: str | None) -> dict[str, str] | None:
        """End the current scope. Its result reaches the parent's memory as a tool result, never
        in the assistant's voice (a model imitates its own words: "Sent 1000 to Maria." as an
        assistant message taught one to claim transfers in plain text). A called scope's result
        answers the call waiting in the parent's memory; a pushed scope's `handed_back` answers a
        call the runtime writes for it, `returned_from_<route>` (returned_call). Returns the
        caller of a called scope (the parent resumes), else None."""
        popped = self.scopes.pop()
        self._forget_memories(popped.memory_ids())
        parent = self.scopes[-1]
        if popped.caller:
            text = handed_back or f"{popped.route} finished without a result."
            self.memory_for(parent, parent.route).add(
                ToolResultMessage(popped.caller["call_id"], popped.caller["tool"], text))
            return popped.caller
        if handed_back:
            memory = self.memory_for(parent, parent.route)
            call = returned_call(popped)
            memory.add(AssistantMessage(None, (call,)))
            memory.add(ToolResultMessage(call.id, call.name, handed_back))
        return None

    def end(self, tool: str) -> None:
        """The conversation ends (an `end` action): no more turns; its memories are deleted when
        the turn commits (they are no longer live), its history and last state stay for the author."""
        self.ended = {"tool": tool, "route": self.scope.route}
        for scope in self.scopes:
            scope.memory_routes = ()

    def change_route(self, route: str) -> None:
        scope = self.scopes[-1]
        scope.route = route
        declared = self.config.routes[route].scope
        init_declared(scope, declared.local, declared.shared)

    def gone_routes(self) -> list[str]:
        """The routes of the scope stack this bot does not define (it changed under the session)."""
        return [s.route for s in self.scopes if s.route not in self.config.routes]

    def restart_gone(self, route: str, note: str) -> None:
        """The scopes from the first one on a route the bot lacks ended; the conversation goes on
        in a new scope on `route` (the base scope when the base route is gone), whose memory
        starts with `note` (what happened, for the model)."""
        first = next(i for i, s in enumerate(self.scopes) if s.route not in self.config.routes)
        for scope in self.scopes[first:]:
            self._forget_memories(scope.memory_ids())
        self.scopes = self.scopes[:first]
        self.push_scope(route)
        self.memory_for(self.scope, route).add(SummaryMessage(note))

    def _new_scope(self, route: RouteConfig) -> Scope:
        scope = Scope(scope_id(self.id, self._next_scope), route.name)
        self._next_scope += 1
        init_declared(scope, route.scope.local, route.scope.shared)
        return scope

    # -- memories ----------------------------------------------------------------------------

    def memories_made(self) -> list[ChatMemory]:
        """The memories this conversation object has loaded or made so far."""
        return list(self._memories)

    def memory_for(self, scope: Scope, route: str, create: bool = True) -> ChatMemory:
        """The memory `<scope-id>#<route>`, loaded from the store once per conversation object.
        With create=False a route that has no memory yet gets an empty, unregistered one."""
        mid = scope.memory_id(route)
        memory = self._memory(mid)
        if memory is not None:
            return memory
        policy = self.config.route_memory(route)
        model = self.config.route_model(route)
        memory = make_memory(policy, mid, model.name, model.max_tokens, self.tokenizer)
        if route in scope.memory_routes:
            stored = self.store.get_messages(mid)
            if stored:
                memory.set(stored)
        elif not create:
            return memory
        else:
            scope.memory_routes = (*scope.memory_routes, route)  # a tuple: replaced, never changed in place
        self._memories = (*self._memories, memory)
        return memory

    def clear_scope_memories(self, scope: Scope) -> None:
        for route in scope.memory_routes:
            self.memory_for(scope, route).clear()

    def forget_turn_memories(self) -> None:
        """Policy `none`: what a route held during the turn is gone after it. Only memories
        loaded in this turn can hold anything (they are never persisted)."""
        for memory in self._memories:
            if memory.ephemeral:
                memory.clear()

    def has_loaded(self, kind: type[ChatMemory]) -> bool:
        """Whether a memory of this kind was loaded (live or not)."""
        for memory in self._memories:
            if isinstance(memory, kind):
                return True
        return False

    def loaded_memories(self) -> list[tuple[str, str, ChatMemory]]:
        """(memory id, route, memory) of the memories loaded so far, in the live scopes."""
        live = set(self.live_memory_ids())
        return [(m.id, route_of_memory(m.id), m) for m in self._memories if m.id in live]

    def live_memories(self) -> dict[str, list[Message]]:
        """Every live memory's messages by memory id: as loaded, else as stored."""
        return {mid: self._messages_of(mid) for mid in self.live_memory_ids()}

    def memories_since(self, before: Checkpoint) -> list[list[Message]]:
        """The messages of every memory the conversation had during a turn: live before it, or
        loaded in it (after an `end`, none is live any more), oldest scope first."""
        ids = dict.fromkeys([*(mid for s in before.scopes for mid in s.memory_ids()), *(m.id for m in self._memories),
                             *self.live_memory_ids()])
        return [self._messages_of(mid) for mid in ids]

    def live_memory_ids(self) -> list[str]:
        return [mid for s in self.scopes for mid in s.memory_ids()]

    def forget_cached_memories(self) -> None:
        self._memories = ()

    def _memory(self, mid: str) -> ChatMemory | None:
        """The memory `mid` if loaded (a scan: a session holds a few)."""
        return next((m for m in self._memories if m.id == mid), None)

    def _messages_of(self, mid: str) -> list[Message]:
        """The messages of memory `mid`: as loaded, else as stored."""
        memory = self._memory(mid)
        return memory.messages() if memory is not None else self.store.get_messages(mid)

    def _forget_memories(self, mids: list[str]) -> None:
        gone = set(mids)
        if any(m.id in gone for m in self._memories):
            self._memories = tuple(m for m in self._memories if m.id not in gone)

    # -- templates ------------------------------------------------------------------------------

    def template_context(self, turn: dict[str, Any], user_message: str | None = None,
                         data: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        """What templates see (README, "State"): a merged, read-only copy of the scope state,
        and the time (`now` in the session's zone, `today` its date)."""
        now = self.now()
        context: dict[str, Any] = {
            "state": self.state,
            "scope": merged_scope(self.scopes),
            "turn": turn,
            "user_message": user_message,
            "data": data or {},
            "route": self.scopes[-1].route,
            "stack": self.stack,
            "args": {},
            "result": None,
            "principal": self.principal,  # who is signed in (name, roles, claims), None when no one
            "user_memory": self.user_memory,  # what the bot keeps of them (`user_memory:`)
            "session_id": self.id,
            "decision": None,  # set while a decision on a pending item applies (engine/pending.py)
            "now": now,
            "today": now.date(),
        }
        if self.config.catalogs is not None:  # only a bot with `locales:`: other contexts stay as small
            context["locale"] = self.locale
            context[CATALOGS_KEY] = self.config.catalogs  # what `t()` reads (definition/templates.py)
        context.update(extra)
        return context

    @property
    def locale(self) -> str | None:
        """The session's locale (docs/i18n.md): `state.locale` when the bot set one, else what the
        client asked for (`meta.locale`), matched to the bot's `locales:`; None without them."""
        catalogs = self.config.catalogs
        if catalogs is None:
            return None
        chosen = self.state.get("locale")
        return catalogs.negotiate(chosen if isinstance(chosen, str) and chosen else self.meta.get("locale"))

    def now(self) -> datetime:
        """The clock's instant (as the running turn read it) in the session's zone (`state.timezone`,
        else the bot's `timezone:`)."""
        instant = self.turn_instant or self.clock.now()
        state_zone = self.state.get("timezone")
        if not state_zone and not self.config.timezone:  # no zone anywhere: UTC, as session_zone says
            return instant.astimezone(UTC)
        return instant.astimezone(session_zone(self.config.timezone, state_zone))

    def render(self, source: Any, context: dict[str, Any], *, typed: bool = False) -> Any:
        """A template rendered as text, or (typed) as a value that keeps its type."""
        return render_value(source, context) if typed else render(source, context)

    def state_roots(self, turn: dict[str, Any]) -> dict[str, Any]:
        """The writable roots of state paths: `state.`, `scope.` (where each key lives), `turn.`."""
        return {"state": self.state, "scope": ScopeView(self.scopes), "turn": turn}

    # -- atomic turns -------------------------------------------------------------------------

    def capture(self) -> Checkpoint:
        return Checkpoint(self.turn_count, ev.copy_plain(self.state), [s.copy() for s in self.scopes], self._next_scope,
                          {m.id: _mark(m) for m in self._memories}, self.usage.copy(), self.ended,
                          [item.to_dict() for item in self.pending], self.next_pending,
                          copy.deepcopy(self.taken_over) if self.taken_over else self.taken_over,
                          dict(self.resolved) if self.resolved else None, self.done_calls, self.follow_up,
                          self.outcome, self.user_memory, self.remembered, self.unscreened)

    def rollback(self, before: Checkpoint) -> None:
        self.turn_count = before.turn_count
        self.state = before.state
        self.scopes = before.scopes
        self._next_scope = before.next_scope
        self.usage = before.usage.copy()
        self.ended = before.ended
        self.pending = tuple(PendingItem.from_dict(d) for d in before.pending or ())
        self.next_pending = before.next_pending
        self.taken_over = before.taken_over
        self.resolved = dict(before.resolved) if before.resolved else NOTHING_RESOLVED
        self.done_calls = before.done_calls
        self.follow_up = before.follow_up
        self.outcome = before.outcome
        self.user_memory, self.remembered = before.user_memory, before.remembered
        self.unscreened = before.unscreened
        # The store holds exactly what the memories held before the turn (nothing is written
        # until a turn succeeds), so dropping the cache rolls every memory back.
        self._memories = ()

    def dirty_memories(self, before: Checkpoint) -> dict[str, list[Message] | None]:
        """Memories whose messages changed since `before` (None: deleted with a popped scope)."""
        live = set(self.live_memory_ids())
        dirty: dict[str, list[Message] | None] = {}
        for memory in self._memories:
            mid = memory.id
            if mid not in live:
                dirty[mid] = None
                continue
            if memory.ephemeral:
                continue
            if _changed(memory, before.memories.get(mid)):
                dirty[mid] = memory.messages()
        self._forget_memories([mid for mid, messages in dirty.items() if messages is None])
        for scope in before.scopes:
            for mid in scope.memory_ids():
                if mid not in live:
                    dirty[mid] = None
        return dirty


RETURNED_PREFIX = "returned_from_"  # the name of the call a pushed scope's result answers


def returned_call(popped: Scope) -> ToolCall:
    """The call a pushed scope's `result:` answers in its parent's memory: `returned_from_<route>`
    (at most 64 characters, as function names go), its id unique in the session (the scope's)."""
    number = popped.id.rsplit(SCOPE_SEPARATOR, 1)[-1]
    return ToolCall(f"call_returned_{number}", (RETURNED_PREFIX + popped.route)[:64], "{}")


def _mark(memory: ChatMemory) -> tuple[ChatMemory, int] | list[Message]:
    """What a checkpoint keeps of a memory to tell later whether it changed."""
    version = getattr(memory, "version", None)
    return (memory, version) if isinstance(version, int) else memory.messages()


def _changed(memory: ChatMemory, mark: tuple[ChatMemory, int] | list[Message] | None) -> bool:
    if isinstance(mark, tuple):
        return mark[0] is not memory or mark[1] != getattr(memory, "version", None)
    return mark != memory.messages()
