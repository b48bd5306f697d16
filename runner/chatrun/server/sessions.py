"""The server's session registry: live Session objects, one turn at a time per session,
ownership, exactly-once retries.

Requests for one session are served one after the other, in arrival order, so two turns
never interleave; different sessions run concurrently. In one process an asyncio.Lock per
session orders them; on a shared store (Redis) the session's lease does, across replicas
(chatrun.store.redis). A request that finds the session busy waits in that FIFO queue up to
`LeaseSettings.wait` seconds, or, with the `reject` if-busy policy, fails at once.

Every stored session has a version. A live Session is kept in a cache (bounded by count,
bytes and idle time) together with the version it was loaded at, and used only while that
is still the stored version: a turn committed elsewhere (another replica, the REPL on the
same SQLite file) or a delete makes the next request reload it. The engine runs against a
TurnBuffer (no I/O); after the turn the registry writes its commit to the store, fenced by
the version the turn started from and by the lease: a refused commit is reported as
Failed(Conflict) and the session reloaded, never written over. The client's Completed
comes after the commit: Completed means committed.

A request id (a string requestId on the WebSocket, Idempotency-Key over HTTP) is recorded
with the turn it committed; a retry of it replays the recorded events instead of running
again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chatrun.errors import ChatrunError, ForbiddenRouteError, SessionError, UnknownRouteError
from chatrun.events import Event
from chatrun.models import ModelPool
from chatrun.server import wire
from chatrun.server.auth import Principal
from chatrun.server.turnlog import CANCELLED, CONFLICT, ERROR, REFUSED, TurnReport
from chatrun.store import RecordStore, SessionStore
from chatrun.store.aio import AsyncStore, Lease, LeaseSettings, as_async_store
from chatrun.store.buffer import TurnBuffer
from chatrun.store.record import Committed, owner_in_meta, owner_meta
from chatrun.store.versions import CREATE, SessionBusy, StaleVersion

if TYPE_CHECKING:
    from chatrun.engine.bot import Bot
    from chatrun.engine.session import Session
    from chatrun.server.metrics import ServerMetrics

NEW = "new"  # the session must not exist yet
EXISTING = "existing"  # the session must exist

QUEUE = "queue"  # if busy: wait in the session's FIFO queue (the default)
REJECT = "reject"  # if busy: fail at once with TooManyRequests
IF_BUSY = (QUEUE, REJECT)
MAX_REQUEST_ID = 200  # characters of an idempotency key (each session keeps its last 1,000)

log = logging.getLogger("chatrun.server")


@dataclass(frozen=True)
class SessionSettings:
    """How the registry shares sessions: see docs/deploy.md."""

    if_busy: str = QUEUE  # what a request for a busy session does (a request may override it)
    lease: LeaseSettings = LeaseSettings()
    cache_size: int = 10_000  # live sessions kept at most
    cache_bytes: int = 256 * 2**20  # their size (JSON bytes of snapshot and memories) at most
    cache_idle: float = 900.0  # seconds a live session stays cached unused
    max_sessions_per_principal: int = 0  # sessions one principal may own (0: no limit; auth only)


@dataclass
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    session: Session | None = None
    buffer: TurnBuffer | None = None
    version: str | None = None  # the stored version the live session matches
    committed: Committed | None = None  # the last committed turn: number, input, requestId, at
    users: int = 0
    size: int = 0  # bytes counted for this slot in the registry's total
    used: float = field(default_factory=time.monotonic)


@dataclass
class _Held:
    slot: _Slot
    lease: Lease


class TurnRun:
    """One turn's events (async iteration). `replayed`: a retry of a committed request,
    whose recorded events are sent again and nothing runs; `turn`: the turn's number; `entry`:
    its history entry once iterated (ok, usage, ...; the recorded one for a replay)."""

    def __init__(self, registry: SessionRegistry, session: Session, message: Any, request_id: str | None):
        self._registry, self._session, self._message, self.request_id = registry, session, message, request_id
        self.replayed = False
        self.turn = 0
        self.entry: dict[str, Any] = {}
        self._recorded: dict | None = None
        self._looked_up = request_id is None

    async def is_replay(self) -> bool:
        """Whether this request id already committed a turn (then iterating replays it). Checks
        that apply to new turns only (the scope the client names) are skipped for a replay."""
        if not self._looked_up:
            self._recorded = await self._registry.store.get_outcome(self._session.id, self.request_id or "")
            self._looked_up = True
        return self._recorded is not None

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        registry, session = self._registry, self._session
        held = registry._held_by(session)
        report = TurnReport(session, self.request_id, registry.metrics, registry.log_content, self._message)
        try:
            if await self.is_replay():
                recorded = self._recorded or {}
                self.replayed, self.turn, self.entry = True, recorded.get("turn", 0), recorded
                report.replayed(recorded)
                for item in recorded.get("events", []):
                    yield Event.from_dict(item)
                return
            assert held.slot.buffer is not None
            held.slot.buffer.request_id = self.request_id
            try:
                with report.observing():
                    async for event in session.stream(self._message):
                        report.saw(event)
                        yield event
            finally:
                held.slot.buffer.request_id = None
            report.ran()
            self.turn, self.entry = session.turn_count, session.last_turn or {}
            await registry._flush(held.slot, session.id, held.lease, self.request_id)
        except (asyncio.CancelledError, GeneratorExit):  # the request was cancelled, or stopped reading
            report.outcome = CANCELLED
            raise
        except SessionError:  # e.g. a conversation an `end` action ended
            report.outcome = REFUSED
            raise
        except wire.RequestFailed as exc:
            report.outcome = CONFLICT if exc.reason == wire.CONFLICT else ERROR
            raise
        finally:
            report.finish()


class SessionRegistry:
    def __init__(
        self,
        bots: dict[str, Bot],
        store: SessionStore | AsyncStore,
        cache_size: int = 10_000,
        models: ModelPool | None = None,
        settings: SessionSettings | None = None,
    ):
        self.bots = bots
        self.store = as_async_store(store)
        # Records a Session's own store (its TurnBuffer) passes through: an in-process store's.
        self._records: RecordStore | None = getattr(self.store, "records", None)
        self.settings = settings or SessionSettings(cache_size=cache_size)
        self.models = models or ModelPool()
        self.draining = False  # set on SIGTERM: new requests are refused, running ones finish
        self.active = 0  # requests holding a session
        self.waiting = 0  # requests queued for a session
        self.metrics: ServerMetrics | None = None  # set by create_app when prometheus-client is installed
        self.log_content = False  # the turn log line carries the user's message and the replies
        self._slots: OrderedDict[tuple[str, str], _Slot] = OrderedDict()
        self._held: dict[int, _Held] = {}
        self._bytes = 0

    def bot(self, name: str | None) -> Bot:
        if name is None:
            return next(iter(self.bots.values()))
        bot = self.bots.get(name)
        if bot is None:
            raise wire.RequestFailed(
                wire.BOT_NOT_FOUND, f"no bot named {name!r}; this server serves: {', '.join(self.bots)}"
            )
        return bot

    @asynccontextmanager
    async def session(
        self,
        bot_name: str | None,
        session_id: str,
        principal: Principal | None,
        mode: str = EXISTING,
        route: str | None = None,
        state: dict[str, Any] | None = None,
        if_busy: str | None = None,
        history: bool = False,
    ) -> AsyncIterator[Session]:
        """The session, held for the caller until the block ends (its turn, see `turn`).
        history: load the stored history too (session.history). Raises wire.RequestFailed."""
        bot = self.bot(bot_name)
        self._refuse_if_draining()
        policy = if_busy or self.settings.if_busy
        if policy not in IF_BUSY:
            raise wire.RequestFailed(wire.BAD_REQUEST, f"ifBusy must be one of {', '.join(IF_BUSY)}, not {policy!r}")
        key = (bot.name, session_id)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        slot.users += 1
        self.waiting += 1
        entered = False
        lease: Lease | None = None
        asked = time.monotonic()
        try:
            try:
                lease = await self._enter(slot, session_id, policy)
                if self.metrics is not None:
                    self.metrics.waited(bot.name, time.monotonic() - asked)
            except (wire.RequestFailed, asyncio.CancelledError):
                raise
            except Exception as exc:  # the store is unreachable or failing: say so, as a request failure
                log.warning("store %s failed for session %s: %s", self.store.url, session_id, exc)
                raise wire.RequestFailed(
                    wire.SERVER_ERROR, f"session {session_id}: the store failed ({type(exc).__name__}: {exc})"
                ) from None
            self.waiting, self.active, entered = self.waiting - 1, self.active + 1, True
            self._refuse_if_draining()
            await self._ready(slot, bot, session_id, principal, mode, route, state, lease)
            assert slot.session is not None and slot.buffer is not None
            session = slot.session
            if history:
                slot.buffer.history = await self.store.load_history(session_id)
            self._slots.move_to_end(key)
            self._held[id(session)] = _Held(slot, lease)
            # Roles are the requester's, not those of the token that opened the session.
            session.roles = set(principal.roles) if principal is not None else None
            bot = self.bot(bot.name)  # the newest: a reload may have come while this request waited
            if session.bot is not bot:  # the bot was reloaded (serve --reload)
                session.use_bot(bot)
            try:
                yield session
            except SessionError as exc:  # e.g. a message to a conversation an `end` action ended
                raise wire.RequestFailed(wire.SESSION_NOT_ACTIVE, str(exc)) from None
            finally:
                self._held.pop(id(session), None)
                if slot.buffer is not None:
                    slot.buffer.history = None
                    if slot.buffer.pending is not None:
                        # The request ended without writing what its turn did (cancelled): the
                        # live copy is ahead of the store, so it goes; the store is the truth.
                        self._drop(slot)
        finally:
            if entered:
                self.active -= 1
                slot.lock.release()
            else:
                self.waiting -= 1
            if lease is not None:
                await self._release(lease)
            slot.users -= 1
            slot.used = time.monotonic()
            self._account(slot)
            if slot.session is None and slot.users == 0 and self._slots.get(key) is slot:
                del self._slots[key]
            self._evict()

    def turn(self, session: Session, message: Any, request_id: str | None = None) -> TurnRun:
        """Run one turn of a session held by `session()`: its events, then the commit (the
        last step of the iteration). A retry of a committed `request_id` replays its events."""
        if request_id is not None and not 0 < len(request_id) <= MAX_REQUEST_ID:
            raise wire.RequestFailed(
                wire.BAD_REQUEST,
                f"a request id (string requestId, Idempotency-Key) has 1 to {MAX_REQUEST_ID} characters, "
                f"not {len(request_id)}",
            )
        return TurnRun(self, session, message, request_id)

    def last_committed(self, session: Session) -> Committed | None:
        """The session's last committed turn: {"turn", "input", "requestId", "at"}, or None."""
        return self._held_by(session).slot.committed

    async def delete(self, bot_name: str | None, session_id: str, principal: Principal | None) -> None:
        bot = self.bot(bot_name)
        async with self.session(bot.name, session_id, principal, EXISTING) as session:
            held = self._held_by(session)
            memory_ids = [mid for s in session.scopes for mid in s.memory_ids()]
            try:
                await self.store.delete_session(session_id, memory_ids, held.lease)
            except StaleVersion as exc:
                self._drop(held.slot)
                raise wire.RequestFailed(wire.CONFLICT, f"session {session_id} was not deleted: {exc}") from None
            session.close()
            self._drop(held.slot)

    def bots_in_use(self) -> set[int]:
        """The ids of the bots the sessions this registry holds run on (a session moves to a
        reloaded bot when next used; until then it keeps the one it had)."""
        return {id(slot.session.bot) for slot in self._slots.values() if slot.session is not None}

    def live_count(self) -> int:
        return sum(1 for s in self._slots.values() if s.session is not None)

    def cache_bytes(self) -> int:
        return self._bytes

    @property
    def in_progress(self) -> int:
        """Requests holding or waiting for a session."""
        return self.active + self.waiting

    async def sweep_forever(self) -> None:
        """Evict idle sessions even when no request comes (started with the app)."""
        while True:
            await asyncio.sleep(max(0.05, min(30.0, self.settings.cache_idle / 4)))
            self._evict()

    # -- internals ------------------------------------------------------------------------

    def _held_by(self, session: Session) -> _Held:
        held = self._held.get(id(session))
        if held is None:
            raise ChatrunError(f"session {session.id} is not held by a request of this registry")
        return held

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise wire.RequestFailed(
                wire.UNAVAILABLE, "the server is shutting down; send the request again (another replica will serve it)"
            )

    async def _enter(self, slot: _Slot, session_id: str, policy: str) -> Lease:
        """Wait for the session: its lease (FIFO across replicas) and this process's lock."""
        wait = self.settings.lease.wait
        if policy == REJECT and slot.lock.locked():
            raise _busy(f"session {session_id} is running a turn (if busy: reject); send again when it completes")
        if self.store.distributed:
            try:
                lease = await self.store.acquire(session_id, wait, policy == REJECT, lambda: self.draining)
            except SessionBusy as exc:
                self._refuse_if_draining()
                raise _busy(str(exc)) from None
            try:  # the lease orders requests; this lock only guards the live copy in this process
                await slot.lock.acquire()
            except BaseException:
                await self._release(lease)
                raise
            return lease
        try:
            await asyncio.wait_for(slot.lock.acquire(), wait)
        except TimeoutError:
            raise _busy(f"session {session_id} stayed busy for {wait:g} s; try again later") from None
        try:
            return await self.store.acquire(session_id, wait)
        except BaseException:
            slot.lock.release()
            raise

    async def _release(self, lease: Lease) -> None:
        try:
            await asyncio.shield(self.store.release(lease))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the lease expires on its own
            log.warning("could not release the lease on session %s: %s", lease.session_id, exc)

    async def _ready(
        self, slot: _Slot, bot: Bot, session_id: str, principal: Principal | None,
        mode: str, route: str | None, state: dict[str, Any] | None, lease: Lease,
    ) -> None:
        """Make slot.session the stored session's current state (reload if stale), or create it."""
        if slot.session is not None and (slot.version != lease.version or slot.session.closed):
            self._drop(slot)  # committed or deleted elsewhere since it was loaded
        if slot.session is None:
            await self._open(slot, bot, session_id, principal, mode, route, state, lease)
        elif mode == NEW:
            raise _exists(session_id)
        else:
            self._check_owner(owner_in_meta(slot.session.meta), principal, session_id)

    async def _open(
        self, slot: _Slot, bot: Bot, session_id: str, principal: Principal | None,
        mode: str, route: str | None, state: dict[str, Any] | None, lease: Lease,
    ) -> None:
        try:
            record = await self.store.load_session(session_id)
        except Exception as exc:  # a corrupt record or an unreachable store
            raise wire.RequestFailed(wire.SERVER_ERROR, f"session {session_id}: could not load it: {exc}") from None
        if record is not None:
            if mode == NEW:
                raise _exists(session_id)
            if record.bot not in (None, bot.name):
                raise wire.RequestFailed(
                    wire.SESSION_NOT_ACTIVE, f"session {session_id} belongs to bot {record.bot!r}, not {bot.name!r}"
                )
            self._check_owner(record.owner, principal, session_id)
            buffer = TurnBuffer(session_id, record, self._records, track_committed=True)
            version, committed = record.version, record.committed
        elif mode == EXISTING:
            raise _not_found(session_id)
        else:
            await self._check_quota(principal)
            buffer, version, committed = TurnBuffer(session_id, records=self._records, track_committed=True), CREATE, None
        slot.session = self._build(bot, session_id, principal, route, state, buffer)
        slot.buffer, slot.version, slot.committed = buffer, version, committed
        if version == CREATE:
            await self._flush(slot, session_id, lease, None)

    async def _check_quota(self, principal: Principal | None) -> None:
        limit = self.settings.max_sessions_per_principal
        if not limit or principal is None:
            return
        owned = await self.store.count_owned(principal.name)
        if owned >= limit:
            raise wire.RequestFailed(
                wire.TOO_MANY_REQUESTS,
                f"principal {principal.name} already has {owned} sessions (limit {limit}); delete one first",
            )

    def _build(
        self, bot: Bot, session_id: str, principal: Principal | None,
        route: str | None, state: dict[str, Any] | None, buffer: TurnBuffer,
    ) -> Session:
        roles = set(principal.roles) if principal is not None else None
        meta = owner_meta(principal.name if principal is not None else None)
        try:
            return bot.session(
                route=route,
                store=buffer,
                model=self.models.model(),
                session_id=session_id,
                state=state,
                roles=roles,
                meta=meta,
            )
        except UnknownRouteError as exc:
            raise wire.RequestFailed(wire.ROUTE_NOT_FOUND, str(exc)) from None
        except ForbiddenRouteError as exc:
            raise wire.RequestFailed(wire.FORBIDDEN, str(exc)) from None
        except SessionError as exc:
            raise wire.RequestFailed(wire.SESSION_NOT_ACTIVE, str(exc)) from None
        except ChatrunError as exc:
            raise wire.RequestFailed(wire.SERVER_ERROR, str(exc)) from None

    async def _flush(self, slot: _Slot, session_id: str, lease: Lease, request_id: str | None) -> None:
        """Write what the request's turn committed to the buffer: fenced by version and lease."""
        assert slot.buffer is not None
        commit = slot.buffer.take()
        if commit is None:
            return
        expected = commit.expected = slot.version if slot.version is not None else CREATE
        try:
            version = await self.store.commit_turn(commit, lease)
        except StaleVersion as exc:
            self._drop(slot)
            if expected == CREATE:
                raise _exists(session_id) from None
            what = f"turn {commit.turn}" if commit.turn is not None else "the change"
            raise wire.RequestFailed(
                wire.CONFLICT,
                f"{what} of session {session_id} was not committed: {exc}. The session was reloaded "
                "as stored; send the message again.",
            ) from None
        except Exception as exc:  # the store failed: whether the commit landed is unknown
            self._drop(slot)
            log.warning("commit of session %s failed: %s", session_id, exc)
            raise wire.RequestFailed(
                wire.SERVER_ERROR,
                f"session {session_id}: the turn could not be saved ({type(exc).__name__}: {exc}); "
                "retry with the same request id: a turn that was saved is not run again",
            ) from None
        slot.version, slot.committed = version, commit.committed

    def _drop(self, slot: _Slot) -> None:
        slot.session = slot.buffer = slot.version = slot.committed = None
        self._account(slot)

    def _account(self, slot: _Slot) -> None:
        size = slot.buffer.size if slot.session is not None and slot.buffer is not None else 0
        self._bytes += size - slot.size
        slot.size = size

    @staticmethod
    def _check_owner(owner: str | None, principal: Principal | None, session_id: str) -> None:
        # Only the principal who created a session may use it, answered exactly like an unknown
        # id (no existence oracle). Sessions created with auth off have no owner: once auth is
        # on, no principal reaches them (they stay in the store, untouched); sessions created
        # with auth on are not reachable with auth off either. See docs/security.md.
        if owner != (principal.name if principal is not None else None):
            raise _not_found(session_id)

    def _evict(self) -> None:
        """Drop least recently used idle sessions while over the count or byte bound, and every
        session unused for longer than the idle bound (they stay in the store)."""
        limits, now = self.settings, time.monotonic()
        for key in list(self._slots):
            slot = self._slots[key]
            over = (
                len(self._slots) > limits.cache_size
                or self._bytes > limits.cache_bytes
                or now - slot.used > limits.cache_idle
            )
            if not over:
                break
            if slot.users == 0 and not slot.lock.locked():
                self._drop(slot)
                del self._slots[key]


def _not_found(session_id: str) -> wire.RequestFailed:
    return wire.RequestFailed(wire.SESSION_NOT_ACTIVE, f"no session {session_id!r}; create it (Connect) first")


def _exists(session_id: str) -> wire.RequestFailed:
    return wire.RequestFailed(
        wire.SESSION_EXISTS,
        f"session {session_id!r} already exists; to continue it send Connect with \"resume\": true",
    )


def _busy(message: str) -> wire.RequestFailed:
    return wire.RequestFailed(wire.TOO_MANY_REQUESTS, message)
