"""The session API: one conversation with a bot. The REPL, the server and the
transcript runner are thin clients of this class.

    session = bot.session()
    for event in session.chat("I want to fly to Ireland"):
        print(event.type, event.data)

A turn is atomic: if it fails (the model is unreachable after retries, a handler
raises, a limit is hit, a template fails), scopes, state and memories are exactly
as before it, the history records the failed attempt, and the turn's events end
with an Error event. Nothing reaches the store until a turn succeeds.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import secrets
import threading
import time
import traceback
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from chatrun import events as ev
from chatrun.definition.page_texts import page_texts, said
from chatrun.engine import follow_up, guardrails, once, outcomes, tracing, user_summary
from chatrun.engine.clock import Clock
from chatrun.engine.conversation import NO_FACTS, Checkpoint, Conversation
from chatrun.engine.migrate import chain_from
from chatrun.engine.pausing import announce
from chatrun.engine.pending import (
    DECISION_TYPES,
    Decision,
    Expire,
    PendingItem,
    decision_entry,
    earliest_due,
    parse_time,
    retried,
    without_secret,
)
from chatrun.engine.scopes import Scope, merged_scope
from chatrun.engine.tools import ToolMocks
from chatrun.engine.turn import Turn
from chatrun.engine.usage import UserSpent, usage_event
from chatrun.engine.versions import Moved, produced_by
from chatrun.engine.versions import move as move_conversation
from chatrun.engine.waiting import check_decision
from chatrun.errors import AttachmentRefused, ChatrunError, ModelError, SessionError
from chatrun.events import Event
from chatrun.memory.files import measured
from chatrun.memory.tokens import (
    ESTIMATE,
    TokenCounter,
    encoding_name,
    load_encoding,
    pinned_counter,
    tiktoken_counter,
)
from chatrun.memory.window import TokenWindowMemory
from chatrun.messages import Attachment, ContextMessage, Message, SystemMessage, UserMessage
from chatrun.models import ChatModel, ModelPool
from chatrun.store import HistoryStore, RecordStore, SessionStore, user_memory
from chatrun.store.billing import RecordJournal, failed_entry
from chatrun.store.blobs import BlobArea
from chatrun.store.record import (
    OUTBOX_KEY,
    REMEMBERED_KEY,
    Remembered,
    rating_of_turn,
    route_of_turn,
    turns_of,
)

if TYPE_CHECKING:
    from chatrun.definition.config import AttachmentPolicy, BotConfig
    from chatrun.engine.bot import Bot

log = logging.getLogger("chatrun")
Input = str | dict[str, Any] | Decision | None
_DONE = object()
_TurnInput = tuple[str | None, dict[str, Any], Decision | None, tuple[Attachment, ...]]
_NO_HANDLERS: Mapping[str, list[Callable[[Any], object]]] = MappingProxyType({})


class Session:
    """A conversation: a stack of scopes, conversation state, memories and history."""

    # No __dict__: a server keeps one per cached session (issue 26).
    __slots__ = ("bot", "store", "blobs", "_own_models", "_model", "_handlers", "_default_handlers", "_sink",
                 "_running", "_closed", "_loop", "_last_entry", "tool_mocks", "_moved", "_c", "may_summarize",
                 "_unfinished_counted", "__weakref__")

    def __init__(
        self,
        bot: Bot,
        store: SessionStore,
        *,  # keywords only: Bot.session passes them on, and a shifted position would go unnoticed
        model: ChatModel | None = None,
        session_id: str | None = None,
        route: str | None = None,
        state: dict[str, Any] | None = None,
        roles: set[str] | None = None,
        meta: dict[str, Any] | None = None,
        principal: Mapping[str, Any] | None = None,
        blobs: BlobArea | None = None,
    ):
        self.bot = bot
        self.store = store
        self.blobs = blobs  # the bytes of attachments (chatrun.store.blobs); None: takes none
        self._own_models: ModelPool | None = None
        if model is None:  # the bot's own model, closed with the session
            self._own_models = ModelPool()
            model = self._own_models.model()
        self._model: ChatModel = model
        # Shared empties until a handler comes (most sessions never get one): replaced, not changed.
        self._handlers: Mapping[str, list[Callable[[Any], object]]] = _NO_HANDLERS
        self._default_handlers: tuple[Callable[[str, Any], object], ...] = ()
        self._sink: Callable[[Event], None] | None = None
        self._running = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_entry: dict[str, Any] | None = None
        # The failed entries of earlier attempts that never committed (store/billing.py) which the
        # last turn's commit counted: their usage is the turn's to charge too (server/user_budgets.py).
        self._unfinished_counted: list[dict[str, Any]] = []
        self.tool_mocks: ToolMocks | None = None  # stand-ins for tools (golden transcripts set them)
        # Whether the summary at the conversation's end (`user_memory.summary:`) may call the model now:
        # a replayed transcript says so only when its turn scripts an answer for it (transcripts/run.py).
        self.may_summarize: user_summary.MaySummarize = _always
        # A move to another version of the bot (engine/versions.py), committed with the next
        # turn: the conversation as it was before it, the bot it left, and what the move did.
        self._moved: tuple[Checkpoint, Bot, Moved] | None = None
        roles = set(roles) if roles is not None else None
        snapshot = store.load_session(session_id) if session_id else None
        if roles is None and principal is not None and principal.get("roles") is not None:
            roles = set(principal["roles"])
        self._c = Conversation(bot.config, store, session_id or secrets.token_hex(8), roles)
        self.principal = principal
        if snapshot is not None:  # resume where it was; `route` and `state` apply to new sessions only
            self._c.restore(snapshot)
            self._c.compact()
            self._c.user_memory = self._load_user_memory()  # its owner's, now that its meta is known
            recorded = snapshot.get("bot_version")
            if recorded is None and produced_by(bot.config, snapshot):
                return  # stored before versions were recorded, by this version as far as can be told
            if self._c.gone_routes() or recorded != bot.config.content_version:
                # Stored by an unknown version, or by one no one gave us (none has it: a server
                # loads every version it or the store has first).
                self._begin_move(bot, None, lost=recorded if recorded != bot.config.content_version else None)
            return
        self._c.start(route or bot.config.default_route, state, meta)
        self._c.user_memory = self._load_user_memory()  # its owner's, now that its meta is known
        self.store.commit_turn(self.id, self._c.snapshot(), {}, [])
        self._c.compact()

    # -- introspection -------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._c.id

    @property
    def route(self) -> str:
        return self._c.scope.route

    @property
    def stack(self) -> list[str]:
        return self._c.stack

    @property
    def scope_id(self) -> str:
        return self._c.scope.id

    @property
    def scopes(self) -> list[Scope]:
        return self._c.scopes

    @property
    def state(self) -> dict[str, Any]:
        return self._c.state

    @property
    def meta(self) -> dict[str, Any]:
        return self._c.meta

    def take_up(self, forked_from: dict[str, Any], done: list[Any] | None, of: Bot | None = None) -> None:
        """A new session that takes up another conversation from its start (a `/v1` first message
        sent again in a front end's chat): where it came from (its calls keyed as that
        conversation's: `Conversation.keyed_as`) and the calls done once there, not run again here
        (engine/once.py `carried`). When that conversation ran another version `of` the bot, the
        calls are matched under its names (engine/once.py), and this first turn keys its calls by the names of
        that version, as the conversation's first turn did (`Conversation.moved_by`). Before its first turn."""
        self._c.meta["forked_from"] = forked_from
        if of is not None:
            self._c.moved_by = chain_from(of.config, self.bot.config)
        self._c.done_calls = tuple(once.carried(None, done))  # each entry says the version that spells it

    @property
    def locale(self) -> str | None:
        """The locale the bot speaks in this session (docs/i18n.md), None for a bot without `locales:`."""
        return self._c.locale

    def ask_locale(self, wanted: str) -> str | None:
        """Record the client's locale (a tag or an Accept-Language value; kept with the session,
        as `meta.locale`) and return the locale the session now speaks (`state.locale` still wins)."""
        self._c.meta["locale"] = wanted
        return self._c.locale

    @property
    def roles(self) -> set[str] | None:
        return self._c.roles

    @roles.setter
    def roles(self, roles: set[str] | None) -> None:
        # A server sets the roles of each request's principal (not only the opener's).
        self._c.roles = set(roles) if roles is not None else None

    @property
    def principal(self) -> dict[str, Any] | None:
        """Who is signed in, as templates see it: `name`, `roles` and the principal's claims
        (e.g. `email`); None when no one is. Bound arguments read it (`bind: {email:
        "{{ principal.email }}"}`)."""
        return self._c.principal

    @principal.setter
    def principal(self, principal: Mapping[str, Any] | None) -> None:
        # A server sets the principal of each request (like the roles): it is never stored.
        self._c.principal = plain_principal(principal)
        self._c.user_memory = self._load_user_memory()

    @property
    def user_memory_owner(self) -> str | None:
        """Whose user memory the conversation reads and writes (Conversation.user_memory_owner)."""
        return self._c.user_memory_owner()

    @property
    def user_memory(self) -> Mapping[str, Any]:
        """What the bot keeps of the signed-in user across conversations (`user_memory:`), as
        templates read it (`user_memory.FACT`)."""
        return self._c.user_memory

    @user_memory.setter
    def user_memory(self, facts: Mapping[str, Any]) -> None:
        # The server loads it per request from its store (server/sessions.py), as it sets the principal.
        self._c.user_memory = dict(facts) if facts else NO_FACTS

    def take_remembered(self) -> Mapping[str, Any]:
        """What the turns remembered since the last call that their commits did not write
        (FACT -> value, None: forgotten); cleared."""
        remembered, self._c.remembered = self._c.remembered, NO_FACTS
        return remembered

    def _with_remembered(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The turn's history entry as committed: with what the turn remembered of its user, when
        the store writes that in the commit itself (`commits_user_memory`: the built-in stores,
        the server's TurnBuffer). The store takes it out of the stored entry (record.Remembered)."""
        if self.bot.config.user_memory is None or not self._c.remembered:  # most bots, most turns: nothing to add
            return entry
        whose = self._c.user_memory_owner()
        if whose is None or not getattr(self.store, "commits_user_memory", False):
            return entry
        remembered = Remembered(self.bot.name, whose, dict(self._c.remembered), self.bot.config.retention.user_memory)
        return entry | {REMEMBERED_KEY: remembered.to_dict()}

    def _user_memory_store(self) -> RecordStore | None:
        """The store the Session reads and writes user memory in itself: its own, when it keeps
        records and does not leave user memory to a server (a TurnBuffer: `defers_user_memory`)."""
        if self.bot.config.user_memory is None or getattr(self.store, "defers_user_memory", False):
            return None
        return self.store if isinstance(self.store, RecordStore) else None

    def _load_user_memory(self) -> Mapping[str, Any]:
        if self.bot.config.user_memory is None:  # a bot without `user_memory:` (each request sets the principal)
            return NO_FACTS
        whose, records = self._c.user_memory_owner(), self._user_memory_store()
        if whose is None or records is None:
            return NO_FACTS
        return user_memory.load(records, self.bot.name, whose, self.bot.config.retention.user_memory,
                                time.time()) or NO_FACTS

    def _save_remembered(self) -> None:
        """After a commit: what the turn remembered is the store's now. The built-in stores wrote it
        in the commit itself (_with_remembered); a user's own store that keeps records gets it
        here, right after (it cannot be atomic with a commit the store does not know about)."""
        if not self._c.remembered:
            return
        remembered = self.take_remembered()
        if getattr(self.store, "commits_user_memory", False):
            return
        config, whose, records = self.bot.config.user_memory, self._c.user_memory_owner(), self._user_memory_store()
        if config is None or whose is None or records is None:
            return
        user_memory.save(records, self.bot.name, whose, remembered, self.bot.config.retention.user_memory, time.time())

    @property
    def user_spent(self) -> UserSpent | None:
        """What the session's user used of the bot's `limits.max_user_*` in the current window
        before this turn, over all their sessions (the server reads it from its store per turn:
        store/user_budget.py); None: no user budget is checked. Never stored with the session."""
        return self._c.user_spent

    @user_spent.setter
    def user_spent(self, spent: UserSpent | None) -> None:
        self._c.user_spent = spent

    @property
    def clock(self) -> Clock:
        """What the templates' `now` reads: the system clock unless set (a transcript's `clock:`,
        the REPL's `/clock`, a test's `FixedClock`)."""
        return self._c.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self._c.clock = clock

    @property
    def tokenizer(self) -> str | None:
        """The pinned token counter (`estimate` or a tiktoken encoding; a transcript's
        `tokenizer:`), or None: each memory counts with its policy's or its model's encoding."""
        return self._c.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: str | None) -> None:
        counter = pinned_counter(tokenizer) if tokenizer else None  # raises for one it cannot count with
        self._c.tokenizer = tokenizer
        for memory in self._c.memories_made():  # made before the pin: count again with it
            if counter is not None and isinstance(memory, TokenWindowMemory):
                memory.counter = counter
                memory.set(memory.messages())

    def counting_tokenizer(self) -> str | None:
        """What a transcript of this session pins (`tokenizer:`, written by /save, --record and
        --update): the pinned counter, else the one the bot's token-counting memories count with
        here (`estimate` where tiktoken cannot load it). None when no token window got near its
        limit (at least half full: there another counter could evict other messages; a pin on
        every file would tie transcripts to one machine's files for nothing), or when routes
        count with different encodings (one pin would change some of them)."""
        if self._c.tokenizer:
            return self._c.tokenizer
        if not any(isinstance(m, TokenWindowMemory) and m.near_limit() for m in self._c.memories_made()):
            return None
        config = self.bot.config
        try:
            names = {encoding_name(policy.encoding, config.route_model(route).name) for route in config.routes
                     if (policy := config.route_memory(route)).type in ("token_window", "summary")}
        except ChatrunError:  # an unknown encoding: validation reports it
            return None
        loaded = {name for name in names if load_encoding(name) is not None}
        if names and not loaded:
            return ESTIMATE
        return loaded.pop() if len(names) == 1 and loaded else None

    def token_window(self) -> tuple[TokenCounter, int] | None:
        """The counter and the current maximum of the current route's memory when it counts
        tokens (`token_window`, `summary`), else None."""
        scope = self._c.scope
        memory = self._c.memory_for(scope, scope.route, create=False)
        return (memory.counter, memory.max_tokens) if isinstance(memory, TokenWindowMemory) else None

    def token_counter(self) -> TokenCounter:
        """What counts the current route's memory (for showing counts: `/memory`, the
        inspector): its window's counter, else the pinned one, else the route model's encoding."""
        scope = self._c.scope
        memory = self._c.memory_for(scope, scope.route, create=False)
        if isinstance(memory, TokenWindowMemory):
            return memory.counter
        if self._c.tokenizer:
            return pinned_counter(self._c.tokenizer)
        return tiktoken_counter(model_name=self.bot.config.route_model(scope.route).name
                                if scope.route in self.bot.config.routes else None)

    def now(self) -> datetime:
        """`now` as the next turn's templates see it: the clock's instant in the session's zone."""
        return self._c.now()

    @property
    def turn_count(self) -> int:
        """How many turns this conversation has committed."""
        return self._c.turn_count

    @property
    def usage(self) -> dict[str, Any]:
        """Every model call of the session, summed (failed turns included): tokens, cost
        (None without `prices:`), calls, and whether any count was estimated."""
        return self._c.usage.to_dict()

    def record_usage_in(self, journal: RecordJournal | None) -> None:
        """Have each model call's usage recorded durably in `journal` as the call ends (a server's
        sessions: store/billing.py), so a process killed before the turn's commit loses none of
        what was billed; the next attempt counts it once."""
        self._c.journal = journal

    def held_with(self, usage_record: str | None) -> None:
        """The usage record (its JSON text, None: none) the store read with the lease of the
        request about to use the session (a server's, on Redis or PostgreSQL): what the request's
        first attempt counts, no read of its own; a later attempt of the same request reads the store."""
        self._c.lease_record = (usage_record,)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ended(self) -> dict[str, str] | None:
        """Set when a tool's `end` action ended the conversation: {"route", "tool"}. An ended
        session takes no more turns; its history and last state stay readable."""
        return self._c.ended

    @property
    def pending(self) -> list[PendingItem]:
        """The open pending items (approvals, questions, a takeover), oldest first (copies)."""
        return [PendingItem.from_dict(item.to_dict()) for item in self._c.pending]

    @property
    def taken_over(self) -> dict[str, Any] | None:
        """{"by": principal, "since": iso} while an operator has the conversation, else None."""
        return copy.deepcopy(self._c.taken_over)

    @property
    def next_due(self) -> str | None:
        """The earliest due time of the open items and of the armed follow-up (ISO), or None:
        when `Expire()` has work."""
        due = earliest_due(self._c.pending)
        for other in (self._c.follow_up, self._c.outcome):
            later = (other or {}).get("due")
            if isinstance(later, str) and (due is None or parse_time(later) < parse_time(due)):
                due = later
        return due

    @property
    def retry_after(self) -> float | None:
        """When a sweeper may next try this session's timeouts (epoch seconds) after its last
        timeout turn failed, or None (engine/pending.py `retried`)."""
        return None if self._c.retry is None else float(self._c.retry["after"])

    @property
    def stale(self) -> str | None:
        """Why this session cannot run a turn on its bot, or None. Always None since bot
        versions (docs/versions.md): a session on a route its bot lost moves on its own."""
        return None

    @property
    def bot_version(self) -> str:
        """The content version of the bot this session runs on (its next turn commits it)."""
        return self.bot.config.content_version

    @property
    def moved(self) -> Moved | None:
        """The move to another version of the bot that the next turn commits, if any."""
        return self._moved[2] if self._moved is not None else None

    def visible_state(self) -> dict[str, Any]:
        return {"state": self.state, "scope": merged_scope(self.scopes)}

    def memory(self, scope_id: str | None = None, route: str | None = None) -> list[Message]:
        """The messages of one memory: by default the current route's in the current scope."""
        scope = self._c.scope if scope_id is None else self._c.find_scope(scope_id)
        if (route or scope.route) not in self.bot.config.routes:  # gone in a reload: nothing to show
            return []
        return self._c.memory_for(scope, route or scope.route, create=False).messages()

    def preview_messages(self) -> list[Message]:
        """What the current route will send the model next, before the user's next message:
        its memory, led by the system prompt rendered from the state as it is now."""
        route = self._c.route
        messages = self.memory()
        context = self._c.config.route_context(route.name)
        try:
            if route.system:
                text = self._c.render(route.system, self._c.template_context({}))
                rest = messages[1:] if messages and isinstance(messages[0], SystemMessage) else messages
                messages = [SystemMessage(text), *rest]
            if context:  # what follows the memory on each call (docs/models.md, "Stable prompts")
                text = self._c.render(context, self._c.template_context({})).strip()
                messages = [*messages, ContextMessage(text)] if text else messages
        except Exception:  # the next turn will report the template's error, with its place
            return messages
        return messages

    def memory_ids(self) -> list[str]:
        """Every memory the session's deletion must delete: its scopes', and while a move to
        another version waits for the next turn, those of the scopes it has in the store (which
        the move may have dropped or renamed)."""
        stored = self._moved[0].scopes if self._moved is not None else []
        return list(dict.fromkeys(mid for s in [*stored, *self._c.scopes] for mid in s.memory_ids()))

    def memories(self) -> dict[str, list[Message]]:
        return {
            s.memory_id(r): self._c.memory_for(s, r, create=False).messages()
            for s in self.scopes
            for r in s.memory_routes
        }

    def seed_memory(self, messages: list[Message]) -> int:
        """Put a conversation begun elsewhere (e.g. the earlier messages an OpenAI client sends
        with its first request) into the current route's memory, stored at once. Returns how
        many messages it holds now (0 for a route whose memory policy keeps nothing)."""
        self._check_usable()
        scope = self._c.scope
        memory = self._c.memory_for(scope, scope.route)
        if memory.ephemeral:
            return 0
        if self.bot.config.guarded:  # the earlier messages are the user's too: no model or store reads what a guard redacts
            messages = _seeded(self.bot.config, scope.route, messages)
            self._c.unscreened = guardrails.unscreened(self.bot.config.route_guardrails(scope.route), messages)
        for message in messages:
            memory.add(message)
        self.store.commit_turn(self.id, self._c.snapshot(), {scope.memory_id(scope.route): memory.messages()}, [])
        return len(memory.messages())

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every turn tried, oldest first, as its store keeps it. A session served by
        `chatrun serve` runs on a per-request buffer: its server reads the history itself."""
        if not isinstance(self.store, HistoryStore):
            raise SessionError(f"session {self.id}: its store ({type(self.store).__name__}) keeps no history")
        return self.store.load_history(self.id)

    @property
    def unfinished_counted(self) -> list[dict[str, Any]]:
        """The earlier attempts that never committed (a killed server's: store/billing.py) whose
        usage the last turn's commit counted, as the failed entries it recorded; [] for most turns."""
        return self._unfinished_counted

    @property
    def last_turn(self) -> dict[str, Any] | None:
        """The last turn tried, failed or not (the history's last entry with `turn`: a rating or
        a notice after it is not a turn), without reading the whole history back when this
        session object ran that turn."""
        if self._last_entry is None:
            turns = turns_of(self.history)
            self._last_entry = turns[-1] if turns else None
        return self._last_entry

    def rate(self, turn: int, rating: str, comment: str | None = None,
             by: Mapping[str, Any] | None = None, history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Keep a user's rating of a turn's reply ("up" or "down", an optional comment) in the
        history, as an entry of its own beside the turn's (`{"feedback": {...}, "at"}`: no
        `turn`, so no reader takes it for a turn); the bot's sinks that take `Feedback` events get
        it once it is committed, as a backend event. A later rating of the same turn supersedes
        the earlier one (the newest entry counts); the same rating, comment and rater as the
        turn's newest is that one again (a double click, a retried request): nothing is kept or
        sent again (`give_rating`). Its `route` is the one the rated turn ran on (`_route_of`).
        Between turns only. SessionError for a turn that did not run."""
        return self.give_rating(turn, rating, comment, by, history)[0]

    def give_rating(self, turn: int, rating: str, comment: str | None = None,
                    by: Mapping[str, Any] | None = None, history: list[dict[str, Any]] | None = None
                    ) -> tuple[dict[str, Any], bool]:
        """`rate`, and whether the rating is new (False: it repeats the turn's newest, kept as it was)."""
        if self._running:
            raise SessionError(f"session {self.id} is running a turn; rate a turn between turns")
        if not 1 <= turn <= self.turn_count:
            ran = f"its turns are 1 to {self.turn_count}" if self.turn_count else "no turn has run yet"
            raise SessionError(f"session {self.id} has no turn {turn} to rate ({ran})")
        if history is None and isinstance(self.store, HistoryStore):
            history = self.history
        route = self._route_of(turn, history)
        data: dict[str, Any] = {"turn": turn, "rating": rating, "route": route}
        if comment:  # the user's words, kept in the history and the outbox: the `storage` guards apply
            data["comment"] = guardrails.kept_text(self.bot.config, [route], comment)
        if by is not None:
            data["by"] = by.get("name")
        newest = rating_of_turn(history or [], turn)
        if newest is not None and all(newest.get(k) == data.get(k) for k in ("rating", "comment", "by")):
            return dict(newest), False
        event = Event(ev.FEEDBACK, data, turn, audience=ev.BACKEND)
        entry: dict[str, Any] = {"feedback": data, "at": time.time(), OUTBOX_KEY: _outbox(self.bot.config, self.id, [event])}
        if not entry[OUTBOX_KEY]:
            del entry[OUTBOX_KEY]
        with self._as_stored() as stored:
            self.store.commit_turn(self.id, stored(), {}, [entry])
        return data, True

    def _route_of(self, turn: int, history: list[dict[str, Any]] | None) -> str:
        """The route committed turn `turn` ran on, from its history entry: in `history` (a server
        reads it from its store: the session's buffer keeps none), else the kept last turn's or
        the store's. The route the conversation is on when no history holds the turn any more."""
        if history is None:
            last = self._last_entry
            history = [last] if last is not None and last.get("turn") == turn and last.get("ok") \
                else self.history if isinstance(self.store, HistoryStore) else []
        return route_of_turn(history, turn) or self.route

    def left_for_fork(self) -> bool:
        """Its user went on in a `/v1` fork of it (a regenerated answer, an edited message): an
        armed `silent_for` outcome is dropped and the session committed (outcomes.disarm), so the
        branch left behind is not recorded `abandoned` beside the fork's own outcome. Whether
        anything changed. Between turns only."""
        if self._running:
            raise SessionError(f"session {self.id} is running a turn; it is left for a fork between turns")
        if not outcomes.disarm(self._c):
            return False
        with self._as_stored() as stored:
            self.store.commit_turn(self.id, stored(), {}, [])
        return True

    def notice(self, text: str, why: str) -> None:
        """Tell the session's user `text` where they are (a channel's chat: `meta.reply_to`) with
        no turn: an entry of its own in the history (`{"notice": {"text", "why"}, "at"}`: no
        `turn`, so no reader takes it for a turn), its reply queued in the outbox by the commit
        like a turn's (a channel's message refused before any turn: over the server's
        `--max-message-chars`). Between turns only."""
        if self._running:
            raise SessionError(f"session {self.id} is running a turn; a notice goes between turns")
        entry: dict[str, Any] = {"notice": {"text": text, "why": why}, "at": time.time()}
        replies = _replies(self.meta, self.bot.config, self.id, [Event(ev.ERROR, text)], self.locale)
        if replies:
            entry[OUTBOX_KEY] = replies
        with self._as_stored() as stored:
            self.store.commit_turn(self.id, stored(), {}, [entry])

    def forget_last_turn(self) -> None:
        """Drop the kept copy of the last history entry (an idle session need not hold it; about
        1.3 KB): `last_turn` reads it back from the store's history when asked again."""
        self._last_entry = None

    def snapshot(self) -> dict[str, Any]:
        """The session as JSON-able data (a copy): what the store keeps between turns."""
        return copy.deepcopy(self._c.snapshot())

    def snapshot_to_encode(self) -> dict[str, Any]:
        """`snapshot()` without the copy: the session's own values, which its next turn changes.
        For a caller that encodes it (or lets it go) before the session runs again, as a commit
        does; the copy of a 40-turn session's snapshot cost ~0.18 M instructions (issue 39)."""
        return self._c.snapshot()

    # -- events ------------------------------------------------------------------------

    def on(self, event_type: str, handler: Callable[[Any], object]) -> Session:
        """Call `handler(data)` for every event of this type, as it happens."""
        self._handlers = {**self._handlers, event_type: [*self._handlers.get(event_type, ()), handler]}
        return self

    def on_default(self, handler: Callable[[str, Any], object]) -> Session:
        """Call `handler(type, data)` for events no `on()` handler takes."""
        self._default_handlers = (*self._default_handlers, handler)
        return self

    def _emit(self, event_type: str, data: object, runtime: bool = False, meta: dict[str, Any] | None = None,
              audience: str | None = None, multi: bool = False) -> None:
        # Who it is for: a handler's explicit audience, else as the bot's `events:` declares the type;
        # chatrun's own events (a failed turn's Error) are always the user's.
        who = ev.USER if runtime else audience or self.bot.config.audiences.get(event_type, ev.USER)  # audience_of
        event = Event(event_type, ev.plain(data), self.turn_count + 1, meta or {}, runtime=runtime, audience=who,
                      multi=multi)
        if self._sink is not None:
            self._sink(event)

    def _dispatch(self, event: Event) -> None:
        handlers = self._handlers.get(event.type)
        if handlers:
            for handler in handlers:
                handler(event.data)
        else:
            for default in self._default_handlers:
                default(event.type, event.data)

    # -- turns -----------------------------------------------------------------------------

    def chat(self, message: Input = None) -> list[Event]:
        """Run one turn and return its events. For async code use `await achat(...)`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise SessionError("Session.chat() is synchronous; inside async code use `await session.achat(...)`")
        self._loop = _thread_loop()
        return self._loop.run_until_complete(self.achat(message))

    async def achat(self, message: Input = None) -> list[Event]:
        if self._handlers or self._default_handlers:  # handlers run as the consumer takes each event
            return [event async for event in self.stream(message)]
        # No one to call per event: the turn runs in the caller's task, its events into a list (no
        # task, queue or wake-up per event). Cancelling the caller rolls it back as a stopped stream does.
        turn = self._begin(message)
        if turn is None:
            return []
        events: list[Event] = []
        self._running = True
        self._sink = events.append
        try:
            await self._run_turn(*turn)
        finally:
            self._c.compact()  # the turn is done: its empty dicts go back to the shared one
            self._sink = None
            self._running = False
        return events

    async def stream(self, message: Input = None) -> AsyncIterator[Event]:
        """Run one turn, yielding its events as they happen (Stream chunks included).

        A decision on a pending item (`Approve`, `Reject`, `Answer`, `TakeOver`, `OperatorSay`,
        `Release`, `Expire`; engine/pending.py) is an input too. It is checked before its turn
        starts: `NotPending`, `DecisionRefused`, `InvalidDecision` raise and nothing is committed.
        `Expire()` with nothing due runs no turn."""
        turn = self._begin(message)
        if turn is None:
            return
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._running = True
        self._sink = queue.put_nowait
        task = asyncio.ensure_future(self._run_turn_then(queue.put_nowait, turn))
        try:
            while (item := await queue.get()) is not _DONE:
                self._dispatch(item)
                yield item
            task.result()
        finally:
            if not task.done():  # the consumer stopped listening, or was cancelled: roll back
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
            self._sink = None
            self._running = False

    async def _run_turn_then(self, done: Callable[[object], None], turn: _TurnInput) -> None:
        """The turn, then `done(_DONE)` as its last step however it ends (not a done callback:
        that would cost the stream's consumer one more pass of the event loop)."""
        try:
            await self._run_turn(*turn)
        finally:
            self._c.compact()  # the turn is done: its empty dicts go back to the shared one
            done(_DONE)

    def _begin(self, message: Input) -> _TurnInput | None:
        """The checked input of a turn about to run (text, data, decision, attachments); None for
        an `Expire()` with nothing due (no turn runs). Raises as `stream` says, committing nothing."""
        self._check_usable()
        if isinstance(message, DECISION_TYPES):
            check_decision(self._c, self.bot.tools, message)
            if isinstance(message, Expire) and not self._due(message):
                return None
            return None, {}, message, ()
        text, data = _split_input(message)
        return text, data, None, self._attachments_of(data)

    def _due(self, expire: Expire) -> bool:
        """Whether `Expire` has an item to resolve or a follow-up to send (by its `now`, else the
        session clock's)."""
        now = parse_time(expire.now) if expire.now else self.now()
        return (any(item.is_due(now) for item in self._c.pending) or follow_up.is_due(self._c, now)
                or outcomes.is_due(self._c, now))

    def _attachments_of(self, data: dict[str, Any]) -> tuple[Attachment, ...]:
        """The `attachments` of a mapping input (taken out of its data): references the
        session's blob area holds (`Session.attach` made them), or http(s) URLs."""
        given = data.pop("attachments", None)
        if given is None:
            return ()
        if not isinstance(given, list) or not all(isinstance(a, dict) for a in given):
            raise AttachmentRefused(f"session {self.id}: attachments must be a list of objects")
        found = []
        for i, item in enumerate(given):
            problem = _reference_problem(item)
            if problem:
                raise AttachmentRefused(f"session {self.id}: attachments[{i}]: {problem}")
            attachment = Attachment.from_dict(item)
            if not attachment.is_url:
                held = self.blobs.read(self.id, attachment.ref) if self.blobs is not None else None
                if held is None:
                    raise AttachmentRefused(f"session {self.id}: attachments[{i}]: no upload {attachment.ref!r} in this session")
                # The upload's own size, not the one the client says: the limits apply to the bytes;
                # and its pages or seconds, what the memory counts it by (memory/files.py).
                attachment = measured(Attachment(attachment.ref, attachment.media_type, attachment.name, len(held)), held)
            found.append(attachment)
        self.check_attachments([(a.media_type, a.size) for a in found])
        return tuple(found)

    def check_attachments(self, files: list[tuple[str, int]]) -> None:
        """Raise SessionError unless the current route's `attachments:` takes these files
        (media type, size in bytes) in one message."""
        if not files:
            return
        route = self.route
        problem = self.attachment_policy().problem(route, files)
        if problem is not None:
            raise AttachmentRefused(f"session {self.id}: {problem}")

    def attachment_policy(self) -> AttachmentPolicy:
        """The current route's `attachments:` (what an upload is checked against before its
        bytes are read); AttachmentRefused when the route takes no files."""
        policy = self.bot.config.routes[self.route].attachments
        if policy is None:
            raise AttachmentRefused(f"session {self.id}: route {self.route} takes no attachments "
                                    "(it declares no `attachments:`)")
        return policy

    def attach(self, data: bytes, media_type: str, name: str = "") -> Attachment:
        """Keep a file in the session's blob area (checked against the current route's
        `attachments:`); send its `to_dict()` in a message's `attachments`
        (`{"userMessage": ..., "attachments": [...]}`)."""
        if self.blobs is None:
            raise AttachmentRefused(f"session {self.id}: its store keeps no attachments (no blob area)")
        self.check_attachments([(media_type, len(data))])
        return self.blobs.put(self.id, data, media_type, name)

    async def _run_turn(self, text: str | None, data: dict[str, Any], decision: Decision | None = None,
                        attachments: tuple[Attachment, ...] = ()) -> None:
        if self._moved is None and self._c.gone_routes():  # e.g. restored by a bot that lost its route
            self._begin_move(self.bot, None)
        # After a move, the turn starts from before it: it commits the move, or rolls it back.
        before = self._moved[0] if self._moved is not None else self._c.capture()
        self._unfinished_counted = []
        self._c.turn_instant = self._c.clock.now()  # one turn, one `now`: its decisions agree on the day
        turn = Turn(self._c, self.bot.tools, self._model, self._emit, text, data, self.tool_mocks, decision,
                    attachments, self.blobs)
        given = decision_entry(decision) if decision is not None else text if not data else ev.plain(data)
        if attachments:  # the history keeps what was sent: the references too
            given = {**(given if isinstance(given, dict) else {"userMessage": text}),
                     "attachments": [a.to_dict() for a in attachments]}
        entry = {"turn": turn.number, "input": given, "at": time.time()}
        started = time.perf_counter()
        if turn.number == 1:  # how the conversation started: `chatrun record --from-session` starts there
            entry["start"] = {"route": self.route, "state": ev.plain(before.state)}
        collected: list[Event] = []
        sink = self._sink

        def collect(event: Event) -> None:
            collected.append(event)
            if sink is not None:
                sink(event)

        self._sink = collect
        # The span's attributes are read only when spans are recorded (tracing off: OFF, as turn_span says).
        # A failure's text on the turn's spans (and the tool and model calls' in it) is redacted as the history's.
        span = tracing.turn_span(self.bot.name, self.id, turn.number, self.route, self.stack, self.meta.get("owner"),
                                 self.bot_version, kept=turn.kept_text) \
            if turn.recorded else tracing.OFF
        try:
            with span as current:
                await turn.run()
                if current is not None:  # a span records: what the user said and got goes on it
                    kept = _storage(self.bot.config, [*turn.hops, self.route])
                    tracing.record_turn(current, kept(entry["input"]), kept([e.data for e in collected if e.for_user
                                                                             and e.type in (ev.MESSAGE, ev.OBJECT)]))
                if turn.may_summarize():  # a `summary` memory is loaded (most bots have none)
                    await turn.summarize()  # after the reply: it never delays the user's answer
            if self._c.config.outcomes:  # before the turn is counted: its Outcome event belongs to it
                outcomes.decide(self._c, turn.number, collected, isinstance(decision, Expire),
                                _expire_now(decision) or self._c.now(), self._emit)
            if self._c.config.user_memory is not None:  # the summary at the conversation's end, if it ended
                await user_summary.write(turn, before, self.may_summarize)
            self._c.turn_count = turn.number
            self._c.retry = None  # a committed turn ends a failing timeout's backoff
            if self._c.follow_up is not None or self._c.route.follow_up is not None:  # most turns: neither
                self._c.follow_up = follow_up.armed(self._c, isinstance(decision, Expire))
            entry.update(ok=True, route=self.route, stack=self.stack, events=_plain(collected))
            outbox = _outbox(self.bot.config, self.id, collected) + _replies(self.meta, self.bot.config, self.id,
                                                                             collected, self.locale)
            if outbox:  # the store queues these with the commit (chatrun.store.record.outbox_of)
                entry[OUTBOX_KEY] = outbox
            earlier = self._count(turn, entry)
            self._queue_usage(turn, entry)
            if self._moved is not None:
                entry["moved"] = self._moved[2].to_dict()
            entry["seconds"] = round(time.perf_counter() - started, 4)  # what the user waited (`chatrun report`)
            # Inside the try: a value the store cannot hold (set by a handler) fails the turn, too.
            entry, memories = self._stored(entry, self._c.dirty_memories(before), turn)
            if self._c.remembered and self.bot.config.redacts_kept:  # user memory is stored too: `storage` guards
                kept = _storage(self.bot.config, [*turn.hops, self.route])  # the facts' names are the author's
                self._c.remembered = {fact: kept(value) for fact, value in self._c.remembered.items()}
            self.store.commit_turn(self.id, self._c.snapshot(), memories, [*earlier, self._with_remembered(entry)])
            self._last_entry = entry
            self._moved, self._c.moved_by = None, ()
            self._save_remembered()
        except asyncio.CancelledError:  # stopped (Stop on the page, a Cancel frame, a closed stream)
            self._reopened(before, collected, turn)  # as a failed turn: the items it resolved wait again
            stopped = _stopped(self.bot.config, collected, turn.tool_calls)
            self._rollback(before, entry | {"ok": False, "error": "cancelled", "events": _plain(collected),
                                            "stopped": stopped}, turn, keep_done=self._c.done_calls)
            raise
        except ModelError as exc:
            self._fail(before, entry, collected, f"the model failed on route {self.route}: {exc}", turn,
                       self._page_text("model_failed"))
        except ChatrunError as exc:  # TurnFailed and friends: the message names the place
            self._fail(before, entry, collected, str(exc), turn, self._told(exc), spent=getattr(exc, "spent", None))
        except Exception as exc:  # a bug in chatrun or in a library: still never lose the session
            detail = f"internal error on route {self.route}: {type(exc).__name__}: {exc}"
            self._log_internal(exc, turn.kept_text(detail))
            self._fail(before, entry, collected, detail, turn, self._page_text("turn_failed"))
        except BaseException as exc:  # KeyboardInterrupt and the like: roll back, then let it go on
            self._rollback(before, entry | {"ok": False, "error": f"interrupted: {type(exc).__name__}",
                                            "events": _plain(collected)}, turn)
            raise
        finally:
            self._sink = sink
            self._c.turn_instant = None

    def _stored(self, entry: dict[str, Any], memories: dict[str, list[Message] | None],
                turn: Turn) -> tuple[dict[str, Any], dict[str, list[Message] | None]]:
        """A turn's history entry and changed memories as the store keeps them: with the `storage`
        guardrails of the bot and of the routes the turn ran on applied (engine/guardrails.py).
        When that changed a memory, the live one is dropped too, so the next turn reads the
        store's copy: the model sees what any replica would. The values of the bot's secret
        variables are redacted so too (`guardrails.secrets_guard`)."""
        if not self.bot.config.redacts_kept:
            return entry, memories
        guards = guardrails.bot_storage_guards(self.bot.config, [*turn.hops, self.route])
        if not guards:
            return entry, memories
        redact = guardrails.storage_redactor(guards)
        stored = {mid: None if messages is None else [guardrails.stored_message(m, redact) for m in messages]
                  for mid, messages in memories.items()}
        if stored != memories:
            self._c.forget_cached_memories()
        return guardrails.kept_strings(entry, redact), stored

    def _fail(self, before: Checkpoint, entry: dict[str, Any], collected: list[Event], detail: str, turn: Turn,
              text: str, spent: str | None = None) -> None:
        """The turn failed: the user gets a safe Error text (no file paths, exception names or
        stack details); the author gets `detail` in the Error event's meta, the history and the log.
        `spent`: the budget that ended it ("session", "user"), kept in its record, so a door knows
        that another try of the same message could only tell its user again."""
        # The detail may quote what a handler or a backend raised (a card number, an email): the
        # `storage` guards redact it before the log, the Error's meta and the history keep it.
        detail = turn.kept_text(detail)
        ran = self._ran_with_effect(turn)
        text = self._failed_text(text, ran)
        # INFO: a failed turn is the bot's or the model's problem, reported to the client already;
        # `chatrun serve` logs it (the author's detail), library users opt in with logging.
        log.info("session %s, turn %s failed: %s", self.id, self.turn_count + 1, detail)
        self._reopened(before, collected, turn)
        self._back_off(turn)
        # First, so the history's record of the attempt holds it too.
        self._emit(ev.ERROR, text, runtime=True, meta={"detail": detail})
        failed = entry | {"ok": False, "error": detail, "events": _plain(collected)}
        if ran:  # what a door tells its client, so it does not offer the message to send again
            failed["ran"] = ran
        if spent:
            failed["spent"] = spent
        replies = _replies(self.meta, self.bot.config, self.id, collected, self.locale)
        if replies:  # a channel's user still learns the turn failed (outbox_of keeps replies only)
            failed[OUTBOX_KEY] = replies
        self._rollback(before, failed, turn)

    def _back_off(self, turn: Turn) -> None:
        """A failed turn of the sweeper's Expire: no sweeper tries again before the backoff is
        over (engine/pending.py `retried`, kept in the snapshot the failed turn's record commits),
        so a timeout whose turn keeps failing does not run its approved tool at every sweep."""
        decision = turn.t.decision
        if isinstance(decision, Expire) and decision.backoff:
            now = parse_time(decision.now).timestamp() if decision.now else time.time()
            self._c.retry = retried(self._c.retry, decision.backoff, now)

    def _ran_with_effect(self, turn: Turn) -> list[str]:
        """The tools of a failing turn that may have changed something outside the conversation (a
        handler, http:, openapi:, mcp: tool whose effect is not `read`), each once, in call order:
        the rollback undoes the conversation, never what a tool did. The failed record keeps them
        as `ran` (the extended WebSocket's Failed carries them: the page does not give the
        message back to send again)."""
        tools = self.bot.config.tools  # an action-only tool (no kind) changed the conversation only: undone
        return list(dict.fromkeys(e["tool"] for e in _effects(self.bot.config, turn.tool_calls)
                                  if tools[e["tool"]].kinds))

    def _page_text(self, key: str, **args: object) -> str:
        """chatrun's text `key` in the session's locale (a bot's `page.<key>` replaces it)."""
        return said(page_texts(self.bot.config.catalogs, self.locale), key, **args)

    def _told(self, exc: ChatrunError) -> str:
        """What the user reads of a failed turn: the error's own page text (MessageTooLong's, with
        its `page_args`: UserBudgetSpent's renewal) where it has one, else that something went
        wrong (`turn_failed`); in the session's locale."""
        return self._page_text(getattr(exc, "page_text", None) or "turn_failed", **getattr(exc, "page_args", {}))

    def _failed_text(self, text: str, ran: list[str]) -> str:
        """What the user is told of a failed turn: `text` ("nothing was kept") when no tool with an
        outside effect ran in it (`ran` empty), else that the message was not saved but those tools
        ran, in the session's locale (`failed_after_effect`, definition/page_texts.py). Every door
        shows this Error's text."""
        if not ran:
            return text
        return self._page_text("failed_after_effect", tools=", ".join(ran))

    def _log_internal(self, exc: Exception, detail: str) -> None:
        """Log an internal error with its stack; on a bot with `guardrails:` or secret variables the
        exception's own text is left out of the stack (it may quote what the user said, or a
        secret): `detail` is redacted."""
        if not self.bot.config.redacts_kept:
            log.exception("internal error in session %s", self.id)
            return
        stack = "".join(traceback.format_tb(exc.__traceback__))
        log.error("internal error in session %s: %s\nTraceback (most recent call last):\n%s", self.id, detail, stack)

    def _reopened(self, before: Checkpoint, collected: list[Event], turn: Turn) -> None:
        """An item the failing or stopped turn resolved waits again once it is rolled back, but its
        Resolved event went out as it happened: each such item is announced again (its Pending
        events, before the Error; a stopped turn's are in its record, and the WebSocket sends them
        before its Stopped), so the last a client reads of it is that it waits (docs/operators.md)."""
        if not before.pending:
            return
        ids = {e.data.get("id") for e in collected if e.type == ev.RESOLVED and isinstance(e.data, dict)}
        for data in before.pending:
            if data.get("id") in ids:
                announce(turn.t, PendingItem.from_dict(data))

    def _rollback(self, before: Checkpoint, entry: dict[str, Any], turn: Turn,
                  keep_done: tuple[str, ...] | None = None) -> None:
        """Undo the turn and record its attempt. `keep_done`: the record of calls done once as the
        turn left it, kept (a stopped turn's `once` calls did happen: resending must not repeat them)."""
        with self._as_stored() as stored:  # a failed turn undoes itself, not the bot's change
            self._c.rollback(before)
            if keep_done is not None:
                self._c.done_calls = keep_done
            # The conversation is as before, but the calls were made (and paid for): they count.
            earlier = self._count(turn, entry)
            entry.setdefault("route", self.route)
            self._queue_usage(turn, entry)
            entry, _ = self._stored(entry, {}, turn)
            self.store.commit_turn(self.id, stored(), {}, [*earlier, entry])
            self._last_entry = entry

    def _count(self, turn: Turn, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """Count the turn's model calls in the session's usage and on its history entry, with the
        session's earlier attempts that never committed (store/billing.py), which the commit
        records first, each as a failed attempt: the commit and their record are one count."""
        self._c.usage.add(turn.usage)
        entry.update(_usage_entry(turn))
        attempt = turn.attempt
        if attempt is None:  # no server records this session's calls (or the turn made none)
            return []
        self._c.usage.add(attempt.earlier())
        self._c.billed = attempt.billed(self._c.billed)
        self._unfinished_counted = [failed_entry(a) for a in attempt.unfinished]
        return self._unfinished_counted

    def _queue_usage(self, turn: Turn, entry: dict[str, Any]) -> None:
        """The turn's `Usage` event for the sinks that list it, queued with its commit, committed
        or failed (its calls were billed): `billed` makes outbox_of keep it on a failed entry.
        Replaces the one a commit that then failed queued. A bot whose sinks do not take it: nothing."""
        config = self.bot.config
        sinks = config.sinks_for(ev.USAGE) if config.sinks else ()
        if not sinks:
            return
        principal = self._c.principal
        data = usage_event(turn.number, entry.get("route") or self.route, bool(entry.get("ok")), turn.usage,
                           turn.calls_usage, turn.attempt)
        data.update(owner=self.meta.get("owner"), principal=principal.get("name") if principal else None)
        kept = [item for item in entry.get(OUTBOX_KEY) or () if not item.get("billed")]
        now = time.time()
        entry[OUTBOX_KEY] = kept + [{**_delivery(config, self.id, sink.name, ev.USAGE, data, turn.number, now),
                                     "billed": True} for sink in sinks]

    @contextmanager
    def _as_stored(self) -> Iterator[Callable[[], dict[str, Any]]]:
        """The conversation as its store keeps it, for a write that is not a turn (a failed
        turn's record, a rating, a notice) while a move to another version waits for the next
        turn: the move is committed with a turn and only with one (its migrated memories, its
        `moved` entry); a write between turns that took it along would store the moved snapshot
        without them. Gives the snapshot to write: with the version the session recorded (a lost
        one, or none for a session stored before versions), so the next try moves it again.
        The move is made again after the write."""
        moved, self._moved = self._moved, None
        if moved is None:
            yield self._c.snapshot
            return
        self._c.config = moved[1].config  # as stored: on the bot it left
        self._c.rollback(moved[0])
        try:
            yield lambda: recorded_as(self._c.snapshot(), moved[2].old)
        finally:
            target, self.bot = self.bot, moved[1]
            self._begin_move(target, moved[1] if moved[2].known else None, moved[2].lost)

    # -- reloading ---------------------------------------------------------------------------------

    def use_bot(self, bot: Bot) -> None:
        """Run the next turns with `bot` (the same bot, its files edited and loaded again, or
        another version of it), keeping what `bot.config.on_change` keeps (engine/versions.py):
        state, scopes and memories, migrated or restarted where routes are gone. Between turns
        only; the move is committed with the next turn (rolled back with it)."""
        if self._running:
            raise SessionError(f"session {self.id} is running a turn; change its bot between turns")
        if bot is self.bot:
            return
        self._begin_move(bot, self.bot)

    def _begin_move(self, bot: Bot, old: Bot | None, lost: str | None = None) -> None:
        """Move to `bot` from `old` (None: the version the session was stored by is not known;
        `lost`: the one it recorded, which no one has)."""
        if self._moved is not None:  # moved again before a turn: from where it was stored
            before, left, earlier = self._moved
            self._c.rollback(before)
            self._c.config, old = left.config, (left if earlier.known else None)
            lost = earlier.lost
        before = self._c.capture()
        self._c.forget_cached_memories()  # rebuilt with the new policies from the store
        moved = move_conversation(self._c, old.config if old is not None else None, bot.config, lost)
        self.bot = bot
        self._moved = (before, old if old is not None else bot, moved)
        if moved.notes:
            log.info("session %s moved to bot version %s: %s", self.id, moved.new, "; ".join(moved.notes))

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """End the conversation: delete its scopes, memories and history from the store."""
        if self._closed:
            return
        self.store.delete_session(self.id, self.memory_ids())
        if self.blobs is not None:  # the files go with the session
            self.blobs.delete_session(self.id)
        self._c.forget_cached_memories()
        self._closed = True
        loop = self._loop
        if loop is not None and loop is _own_thread_loop() and not loop.is_running():
            # Models opened on the loop of chat() hold connections bound to it. The loop itself
            # stays: it is the thread's, for its next session (_thread_loop). A loop of another
            # thread, or inherited across fork, is never run from here.
            loop.run_until_complete(self._close_models())

    async def _close_models(self) -> None:
        await self.bot.tools.aclose()  # this private loop's HTTP connections and MCP servers
        aclose = getattr(self._model, "aclose", None)
        if aclose is not None:
            await aclose()
        if self._own_models is not None:
            await self._own_models.aclose()

    def _check_usable(self) -> None:
        if self._closed:
            raise SessionError(f"session {self.id} is closed")
        if self._c.ended:
            raise SessionError(f"session {self.id} has ended (tool {self._c.ended['tool']} ended the conversation "
                               f"on route {self._c.ended['route']}); start a new session")
        if self._running:
            raise SessionError(f"session {self.id} is already running a turn; send one message at a time")


class _LoopOwner:
    """Owns a thread's loop for the synchronous `chat()`: when it goes (its thread ended, or
    the interpreter exits) the loop is shut down, but only in the process that made it."""

    __slots__ = ("loop", "pid", "__weakref__")

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        # Shut down cleanly when the thread ends or at exit: else the HTTP clients' async
        # generators of sessions never closed are finalized on a loop that never runs again, and
        # Python prints "Task was destroyed but it is pending".
        weakref.finalize(self, _shut_down_in, self.pid, self.loop)


_sync_loops = threading.local()


def _own_thread_loop() -> asyncio.AbstractEventLoop | None:
    """This thread's loop for `chat()`, if it has one made in this process."""
    owner: _LoopOwner | None = getattr(_sync_loops, "owner", None)
    if owner is None or owner.pid != os.getpid() or owner.loop.is_closed():
        return None
    return owner.loop


def _thread_loop() -> asyncio.AbstractEventLoop:
    """The event loop the synchronous `Session.chat()` runs turns on: one per thread, kept
    across sessions. A new loop per session cost as much as a tenth of a first turn: the
    loop, the thread of its default executor (the SDK asks it the platform once per client)
    and their shutdown (issue 26).

    A forked child (`chatrun test -n N` runs transcripts in worker processes) makes its own:
    the parent's loop shares its epoll instance and self-pipe with the parent, and its default
    executor still counts an idle worker thread that the child does not have, so a sync
    handler sent there would wait forever (`asyncio.to_thread` queues it and starts no thread)."""
    loop = _own_thread_loop()
    if loop is None:
        owner = _sync_loops.owner = _LoopOwner()
        loop = owner.loop
    return loop


def _shut_down_in(pid: int, loop: asyncio.AbstractEventLoop) -> None:
    """Shut a thread's loop down, if this is the process that made it: a forked child leaves
    the parent's alone (running or closing it there would touch the parent's epoll set)."""
    if os.getpid() == pid:
        _shut_down(loop)


def _shut_down(loop: asyncio.AbstractEventLoop) -> None:
    """Finish a private loop's async generators and close it (once; never a running loop)."""
    if loop.is_closed() or loop.is_running():
        return

    def shut_down() -> None:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        shut_down()
        return
    # Collected while another loop runs in this thread (async code dropped a sync session): a
    # thread of its own may run this one.
    worker = threading.Thread(target=shut_down, name="chatrun-session-loop", daemon=True)
    worker.start()
    worker.join(timeout=5)


def _split_input(message: Input) -> tuple[str | None, dict[str, Any]]:
    if message is None:
        return None, {}
    if isinstance(message, str):
        return message, {}
    if isinstance(message, dict):
        text = message.get("userMessage")
        if text is not None and not isinstance(text, str):
            raise SessionError("the userMessage field must be a string")
        return text, dict(message)
    raise SessionError(f"a message is a string or a mapping, not {type(message).__name__}")


def _expire_now(decision: Decision | None) -> datetime | None:
    """The instant an Expire says it runs at (the sweeper's), or None."""
    return parse_time(decision.now) if isinstance(decision, Expire) and decision.now else None


def _always() -> bool:
    return True


def _usage_entry(turn: Turn) -> dict[str, Any]:
    """A turn's usage for its history entry (the total and each model call's), the summaries
    it made, its tool calls (`calls`: tool, route, args, result or error) and its model's
    answers (`model`, as a transcript writes them)."""
    out: dict[str, Any] = {}
    if turn.calls_usage:
        out["usage"] = {**turn.usage.to_dict(), "by_call": turn.calls_usage}
    if turn.summaries:
        out["summaries"] = turn.summaries
    if turn.tool_calls:
        out["calls"] = turn.tool_calls
    if turn.answers:
        out["model"] = turn.answers
    return out


def _stopped(config: BotConfig, events: list[Event], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """What a stopped turn leaves behind, for its history entry: `shown`, the reply the user saw
    streaming when it stopped (Stream chunks after the last Message), and `effects`, its tool
    calls that ran and may have changed something outside (effect `idempotent` or `once`): the
    rollback undoes the conversation, never what a tool did."""
    shown: list[str] = []
    for event in events:
        if event.type == ev.MESSAGE:
            shown = []
        elif event.type == ev.STREAM and isinstance(event.data, str):
            shown.append(event.data)
    return {"shown": "".join(shown), "effects": _effects(config, calls)}


def _effects(config: BotConfig, calls: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The turn's tool calls that ran and may have changed something outside (effect `idempotent`
    or `once`; a call that failed is left out), as `{tool, effect}`."""
    effects = []
    for call in calls:
        tool = config.tools.get(str(call.get("tool")))
        if tool is not None and "error" not in call and tool.effect != "read":
            effects.append({"tool": tool.name, "effect": tool.effect})
    return effects


def _plain(events: list[Event]) -> list[dict[str, Any]]:
    """The turn's events for the history (their data is plain JSON already), no Stream chunks,
    no backend item's token (only its sinks get that: `_outbox`)."""
    return [without_secret(e.to_dict()) if e.type == ev.PENDING else e.to_dict() for e in events if e.type != ev.STREAM]


def plain_principal(principal: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A principal as templates see it: a plain mapping with `name` (text) and `roles` (a sorted
    list), plus its claims; None stays None."""
    if principal is None:
        return None
    roles = principal.get("roles") or ()
    return {**principal, "name": str(principal.get("name") or ""), "roles": sorted(str(r) for r in roles)}


def _outbox(config: BotConfig, session_id: str, events: list[Event]) -> list[dict[str, Any]]:
    """The deliveries a committed turn queues: each backend event, once per sink that takes its
    type, with the body the sink receives and its own idempotency key."""
    now = time.time()
    out: list[dict[str, Any]] = []
    for event in events:
        if event.audience != ev.BACKEND or event.type == ev.USAGE:  # a Usage is chatrun's only: _queue_usage
            continue
        for sink in config.sinks_for(event.type):
            out.append(_delivery(config, session_id, sink.name, event.type, event.data, event.turn, now))
    return out


def _delivery(config: BotConfig, session_id: str, sink: str, kind: str, data: Any, turn: int,
              now: float) -> dict[str, Any]:
    """One backend event's delivery to one sink: the body it receives, with its own idempotency key."""
    body = {"id": "evt_" + secrets.token_hex(12), "type": kind, "data": data, "turn": turn, "session": session_id,
            "bot": config.name, "created": now}
    return {"sink": sink, "body": body}


REPLY_TO = "reply_to"  # a session's meta key: where its user's events go besides the requests' answers
REPLY = "Reply"  # the type of a reply's outbox entry


def _replies(meta: Mapping[str, Any], config: BotConfig, session_id: str, events: list[Event],
             locale: str | None = None) -> list[dict[str, Any]]:
    """The delivery of a turn's events for the user to where the session's user is (a
    channel's chat: `meta.reply_to` = {sink, address}), queued with the turn's commit like a
    sink's events, so the reply leaves after the commit and survives a crash. Every turn of
    the session queues one (a decision, an operator's words), none when it has nothing for the user.
    `locale`: the session's, for the words the platform's message adds (WhatsApp's list button)."""
    reply_to = meta.get(REPLY_TO)
    if not isinstance(reply_to, Mapping):
        return []
    shown = [e.to_dict() for e in events if e.for_user and e.type != ev.STREAM]
    if not shown:
        return []
    data = {"to": reply_to.get("address"), "events": shown} | ({"locale": locale} if locale else {})
    body = {"id": "rep_" + secrets.token_hex(12), "type": REPLY, "data": data,
            "turn": events[0].turn, "session": session_id, "bot": config.name, "created": time.time()}
    return [{"sink": reply_to["sink"], "body": body, "reply": True}]


def _reference_problem(item: dict[str, Any]) -> str | None:
    """What is wrong with a client's reference to a file (`{ref, media_type, name?, size?}`), or None."""
    for key, kind, required in (("ref", str, True), ("media_type", str, True), ("name", str, False),
                                ("size", int, False)):
        if key not in item:
            if required:
                return f"a reference needs {key} (an upload's reference is {{ref, media_type, name?, size?}})"
            continue
        if not isinstance(item[key], kind) or isinstance(item[key], bool):
            return f"{key} must be {'a string' if kind is str else 'an integer'}, not {type(item[key]).__name__}"
    unknown = sorted(set(item) - {"ref", "media_type", "name", "size"})
    return f"a reference has no field {unknown[0]!r} (it is {{ref, media_type, name?, size?}})" if unknown else None


def _seeded(config: Any, route: str, messages: list[Message]) -> list[Message]:
    """A conversation begun elsewhere as a route's memory keeps it: a user message a local `input`
    guard stops (`block`, `operator`), by its text or a file's name, left out with the answers it
    got, as a live turn's memory leaves a stopped message out (no model reads it); the others
    redacted by the redacting ones (a model reads them next); then every message by the `storage`
    guards (the store keeps them).
    `languages` (its model loads off the event loop) and `moderation` (a round trip) judge them in
    the next turn, before its model call (`Guardrails.check_seeded`): this is synchronous."""
    local = tuple(g for g in guardrails.stage_guards(config.route_guardrails(route), "input") if g.kind != "language")
    seeded: list[Message] = []
    stopped = False
    for m in messages:
        if isinstance(m, UserMessage) and local:
            m, stopped = guardrails.judged_message(local, m)
        if not stopped:
            seeded.append(m)
    stored = guardrails.bot_storage_guards(config, [route])
    if not stored:
        return seeded
    redact = guardrails.storage_redactor(stored)
    return [guardrails.stored_message(m, redact) for m in seeded]


def _storage(config: Any, routes: list[str]) -> Callable[[Any], Any]:
    """What a turn's trace keeps of a value: its strings with the `storage` guardrails applied (a
    bot that redacts nothing keeps it as it is, without entering engine/guardrails.py: the walk)."""
    if not config.redacts_kept:
        return _kept_as_is
    return guardrails.storage_mapper(guardrails.bot_storage_guards(config, routes))


def _kept_as_is(value: Any) -> Any:
    return value


def recorded_as(snapshot: dict[str, Any], version: str | None) -> dict[str, Any]:
    """`snapshot` recording the bot version `version` (None: none, as chatrun 0.2 stored it)."""
    snapshot = {k: v for k, v in snapshot.items() if k != "bot_version"}
    return snapshot if version is None else {**snapshot, "bot_version": version}
