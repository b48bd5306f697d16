"""Make a held slot's live session the stored session's current state, or create it.

A cached copy is used only while it matches the stored version the lease saw: a turn
committed elsewhere (another replica, the REPL on the same SQLite file) or a delete makes
the request reload it. Loading checks the session's bot and owner (chatrun.store.record's
SessionRecord); creating checks the principal's quota and writes the new session at once
(versions.CREATE: refused if the id exists meanwhile).

Only the principal who created a session may use it, answered exactly like an unknown id
(no existence oracle). Requests about pending items (`Reach.pending`) may also come from
the parties an item waits for: an operator (role `operators`), a principal with a role
named in an open item's `by`, or a backend sending an open item's token; the server's own
sweeper (`Reach.system`) reaches every session. The engine then decides who may decide what
(DecisionRefused). Sessions created with auth off have no owner: once auth is on, no
principal reaches them (they stay in the store, untouched); sessions created with auth on
are not reachable with auth off either. See docs/security.md.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from chatrun.engine.clock import Clock
from chatrun.engine.pending import TOKEN_KEY, granted_roles
from chatrun.engine.waiting import handover_roles
from chatrun.errors import ChatrunError, ForbiddenRouteError, SessionError, UnknownRouteError
from chatrun.models import ModelPool
from chatrun.server import wire
from chatrun.server.audience import OPERATOR_ROLE
from chatrun.server.auth import Principal, template_principal
from chatrun.server.session_cache import SessionCache, Slot
from chatrun.server.session_writes import SessionWrites, exists
from chatrun.server.versions import VersionShelf
from chatrun.store import RecordStore
from chatrun.store.aio import AsyncStore, Lease
from chatrun.store.billing import RecordJournal
from chatrun.store.blobs import BlobArea
from chatrun.store.buffer import TurnBuffer
from chatrun.store.record import SessionRecord, owner_in_meta, owner_meta
from chatrun.store.versions import CREATE

if TYPE_CHECKING:
    from chatrun.engine.bot import Bot
    from chatrun.engine.session import Session

NEW = "new"  # the session must not exist yet
EXISTING = "existing"  # the session must exist
OPEN = "open"  # the session is used if it exists, else started (a channel's conversation: server/channels)


@dataclass(frozen=True)
class SessionStart:
    """How a new session starts (ignored when the session exists): its entry route (None:
    the bot's default) and the state it starts with, over the YAML's."""

    route: str | None = None
    state: dict[str, Any] | None = None
    locale: str | None = None  # what the client asked for (a tag or Accept-Language; docs/i18n.md)
    meta: dict[str, Any] | None = None  # more of the session's meta (a channel's `reply_to`)


@dataclass(frozen=True)
class Reach:
    """Who besides its owner a request may use a session as: `pending`, a party one of its
    pending items waits for (see the module's text), `token` the bearer token a backend sent;
    `system`, the server itself (the sweeper's Expire); `takeover`, an operator stepping in
    (any session of the bot, waiting or not: `takes_over`)."""

    pending: bool = False
    token: str | None = None
    system: bool = False
    takeover: bool = False


OWNER_ONLY = Reach()
SYSTEM = Reach(system=True)


def reaches(reach: Reach, principal: Principal | None, record: SessionRecord, bot: Bot,
            versions: Iterable[Bot] = ()) -> bool:
    """Whether a request that is not the owner's may use a stored session (see the module's
    text): the server itself; an operator, or a principal with a role an open item waits for,
    or a backend with an open item's token; and, once items were resolved, a principal with a
    role the bot names as a decider in any of its `versions` this replica holds (so a decision
    retried after it landed is replayed, and a late one told NotPending, rather than not found:
    an item a move to a new version withdrew was asked by the version it left, whose deciders
    the new one may not name)."""
    if reach.system:
        return True
    if reach.takeover and takes_over(principal, bot):
        return True
    if not reach.pending or not (record.pending or record.taken_over or record.resolved):
        return False
    roles = granted_roles(principal.roles) if principal is not None else set()
    if OPERATOR_ROLE in roles:
        return True
    if any(roles & set(item.get("by") or ()) for item in record.pending):
        return True
    if record.resolved and any(roles & decider_roles(b) for b in (bot, *versions)):
        return True
    return reach.token is not None and any(_same_token(item.get(TOKEN_KEY), reach.token) for item in record.pending)


def takes_over(principal: Principal | None, bot: Bot) -> bool:
    """Whether a principal may step in on any session of the bot (docs/format.md, "Operators"):
    an operator, or one with a role the bot's `operator:` actions name."""
    roles = granted_roles(principal.roles) if principal is not None else set()
    return bool(roles & {OPERATOR_ROLE, *handover_roles(bot.config)})


def _same_token(expected: object, sent: str) -> bool:
    return isinstance(expected, str) and hmac.compare_digest(expected.encode(), sent.encode())


def decider_roles(bot: Bot) -> frozenset[str]:
    """The roles a bot names as deciders: its approvals' `by` and its operator actions' roles."""
    roles: set[str] = set()
    for tool in bot.config.tools.values():
        if tool.approval is not None:
            roles.update(tool.approval.by)
        if tool.action.operator is not None:
            roles.add(tool.action.operator.role)
    return frozenset(granted_roles(roles))


@dataclass(frozen=True)
class SessionRequest:
    """Which session a request wants, on whose behalf, and whether it must exist (`mode`)."""

    bot: Bot
    session_id: str
    principal: Principal | None
    mode: str = EXISTING
    start: SessionStart = SessionStart()
    reach: Reach = OWNER_ONLY
    version: str | None = None  # the version a new session starts on (a tester's header), else by weight

    @property
    def owner(self) -> str | None:
        return self.principal.name if self.principal is not None else None


class SessionOpener:
    def __init__(self, store: AsyncStore, cache: SessionCache, writes: SessionWrites, models: ModelPool,
                 shelf: VersionShelf, max_sessions_per_principal: int = 0, blobs: BlobArea | None = None,
                 clock: Clock | None = None):
        self.store = store
        self.clock = clock  # every session's (None: the system clock)
        self.blobs = blobs
        self.shelf = shelf
        self.cache = cache
        self.writes = writes
        self.models = models
        self.max_sessions_per_principal = max_sessions_per_principal
        # Records a Session's own store (its TurnBuffer) passes through: an in-process store's.
        self.records: RecordStore | None = getattr(store, "records", None)
        # store/billing.py: what a killed attempt's calls used, for the next process to count; a
        # store that dies with the process (memory://) keeps nothing for it: no record written.
        self.journal = RecordJournal(store) if getattr(store, "outlives_process", True) else None

    async def ready(self, slot: Slot, request: SessionRequest, lease: Lease) -> None:
        """Make slot.session the stored session's current state (reload if stale), or create it."""
        if slot.session is not None and (slot.version != lease.version or slot.session.closed):
            self.cache.drop(slot)  # committed or deleted elsewhere since it was loaded
        if slot.session is None:
            await self._open(slot, request, lease)
        elif request.mode == NEW:
            raise exists(request.session_id)
        elif owner_in_meta(slot.session.meta) != request.owner:
            snapshot = slot.session.snapshot()
            record = SessionRecord.of(request.session_id, snapshot, "", "")
            # the live session's own version: whose `operator:` roles may step in
            if not reaches(request.reach, request.principal, record, slot.session.bot, self._versions(request.bot)):
                raise not_found(request.session_id)
        if slot.session is not None and lease.usage_read:  # its turn's first attempt takes the usage
            slot.session.held_with(lease.usage_record)  # record the store read with the lease (Redis, PostgreSQL)

    async def _open(self, slot: Slot, request: SessionRequest, lease: Lease) -> None:
        record = await self._load(request.session_id)
        versions = self.shelf.bots[request.bot.name]
        if record is not None:
            self._check_loaded(record, request)
            if record.owner != request.owner and not await self._reached(record, request):
                raise not_found(request.session_id)
            bot = await self.shelf.bot_for(request.bot.name, record) or request.bot
            buffer = TurnBuffer(request.session_id, record, self.records, track_committed=True, lean=True)
            version, committed = record.version, record.committed
        elif request.mode == EXISTING:
            raise not_found(request.session_id)
        else:
            bot = versions.for_new(request.session_id, request.version)
            buffer = TurnBuffer(request.session_id, records=self.records, track_committed=True, lean=True)
            version, committed = CREATE, None
        slot.session = self._build(replace(request, bot=bot), buffer)
        slot.buffer, slot.version, slot.committed = buffer, version, committed
        if version == CREATE:  # the store checks the owner's limit and counts the session in one step
            await self.writes.commit(slot, request.session_id, lease, self.max_sessions_per_principal)

    async def refuse_unreached(self, request: SessionRequest) -> None:
        """Not found, unless the stored session is the caller's to reach: what a request that found
        the session busy (the gate refused it, or it waited out the queue) answers one that may not
        use it, as it answers once it holds the session. So "busy" never tells another principal
        that a session exists, nor that its owner is in a turn right now. Read without the lease."""
        record = await self._load(request.session_id)
        if record is not None and request.mode == NEW:
            raise exists(request.session_id)  # as once it is held: ids are one namespace
        if record is None or record.owner == request.owner:
            return
        if record.bot not in (None, request.bot.name) or not await self._reached(record, request):
            raise not_found(request.session_id)

    async def _load(self, session_id: str) -> SessionRecord | None:
        try:
            return await self.store.load_session(session_id)
        except Exception as exc:  # a corrupt record or an unreachable store
            raise wire.RequestFailed(wire.SERVER_ERROR, f"session {session_id}: could not load it: {exc}") from None

    def _check_loaded(self, record: SessionRecord, request: SessionRequest) -> None:
        if request.mode == NEW:
            raise exists(request.session_id)
        if record.bot not in (None, request.bot.name):
            if record.owner != request.owner:
                raise not_found(request.session_id)  # another principal's: no word of where it is
            raise wire.RequestFailed(
                wire.SESSION_NOT_ACTIVE,
                f"session {request.session_id} belongs to bot {record.bot!r}, not {request.bot.name!r}",
            )

    async def _reached(self, record: SessionRecord, request: SessionRequest) -> bool:
        """Whether a request that is not the owner's reaches the stored session (`reaches`), by
        the versions this replica holds and the session's own: a replica that has not loaded the
        session's version yet loads it for a decider it names (else it would answer 404 where a
        replica holding it answers). A version that cannot be loaded here: not reached (no word
        of the session to whom it may not concern)."""
        held, reach = self._versions(request.bot), request.reach
        if reach.takeover:  # who may step in: the session's own version's `operator:` roles, not the primary's
            own = await self._own_version(request.bot, record)
            if own is not None and takes_over(request.principal, own):
                return True
            reach = replace(reach, takeover=False)
        if reaches(reach, request.principal, record, request.bot, held):
            return True
        if not (reach.pending and record.resolved and record.bot_version is not None):
            return False  # the versions' deciders are not asked
        own = await self._own_version(request.bot, record)
        return own is not None and own not in held and reaches(reach, request.principal, record, request.bot, [own])

    async def _own_version(self, bot: Bot, record: SessionRecord) -> Bot | None:
        """The version of `bot` the stored session runs on (loaded when this replica lacks it),
        the primary for a session the engine moves to it; None when it cannot be loaded here."""
        try:
            return await self.shelf.bot_for(bot.name, record) or bot
        except wire.RequestFailed:
            return None

    def _versions(self, bot: Bot) -> list[Bot]:
        """The versions of `bot` this replica holds (served, or loaded from the store)."""
        held = self.shelf.bots.get(bot.name)
        return [v.bot for v in held.versions] if held is not None else []

    def _build(self, request: SessionRequest, buffer: TurnBuffer) -> Session:
        principal = request.principal
        try:
            session = request.bot.session(
                route=request.start.route,
                store=buffer,
                model=self.models.model(),  # the pool's model, which the author may play (play_model.py)
                session_id=request.session_id,
                state=request.start.state,
                roles=set(principal.roles) if principal is not None else None,
                principal=template_principal(principal),
                meta={**owner_meta(request.owner), **({"locale": request.start.locale} if request.start.locale else {}),
                      **(request.start.meta or {})},
                blobs=self.blobs,
            )
        except UnknownRouteError as exc:
            raise wire.RequestFailed(wire.ROUTE_NOT_FOUND, str(exc)) from None
        except ForbiddenRouteError as exc:
            raise wire.RequestFailed(wire.FORBIDDEN, str(exc)) from None
        except SessionError as exc:
            raise wire.RequestFailed(wire.SESSION_NOT_ACTIVE, str(exc)) from None
        except ChatrunError as exc:
            raise wire.RequestFailed(wire.SERVER_ERROR, str(exc)) from None
        if self.clock is not None:
            session.clock = self.clock
        session.record_usage_in(self.journal)  # each model call's usage, durable as it ends
        return session


def not_found(session_id: str) -> wire.RequestFailed:
    return wire.RequestFailed(wire.SESSION_NOT_ACTIVE, f"no session {session_id!r}; start it first "
                             "(a WebSocket Connect, or POST /bots/BOT/sessions)")
