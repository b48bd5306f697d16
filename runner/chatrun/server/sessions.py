"""The server's session registry: live Session objects, one turn at a time per session,
ownership, exactly-once retries.

`SessionRegistry` is a thin facade over its parts, each readable alone:

    session_cache.py   SessionCache   the live sessions of this process, bounded (count, bytes, idle)
    session_gate.py    SessionGate    one request at a time per session: lock, lease, FIFO queue,
                                      if-busy policy, draining; counts waiting/active requests
    session_open.py    SessionOpener  the held slot's session made current: reload if stale, load
                                      (bot, owner), or create (quota); SessionRequest, SessionStart
    session_writes.py  SessionWrites  a request's commit and a deletion, fenced by version and lease
    turn_run.py        TurnRun        one turn: its events then its commit, or the replay of a
                                      committed request id; its TurnReport (chatrun.server.turnlog)

`session()` holds a session for a request: the cache's slot, the gate, the opener, then the
caller's block; `turn()` runs one turn of it; `delete()` deletes it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chatrun.engine.clock import FileClock
from chatrun.errors import AttachmentRefused, ChatrunError, SessionError
from chatrun.models import ModelPool
from chatrun.server import wire
from chatrun.server.auth import Principal, template_principal
from chatrun.server.bundles import BundlePolicy
from chatrun.server.liveness import Liveness
from chatrun.server.session_cache import CacheLimits, Hold, SessionCache, Slot
from chatrun.server.session_gate import IF_BUSY, QUEUE, REJECT, SessionGate
from chatrun.server.session_open import (
    EXISTING,
    NEW,
    OPEN,
    OWNER_ONLY,
    SYSTEM,
    Reach,
    SessionOpener,
    SessionRequest,
    SessionStart,
)
from chatrun.server.session_writes import SessionWrites
from chatrun.server.turn_run import MAX_REQUEST_ID, TurnRun, check_request_id
from chatrun.server.turnlog import TurnReport
from chatrun.server.versions import BotVersions, Version, VersionShelf, own_label
from chatrun.store import SessionStore, user_memory
from chatrun.store.aio import AsyncStore, LeaseSettings, as_async_store
from chatrun.store.blobs import BlobArea, blobs_of
from chatrun.store.record import Committed
from chatrun.store.retention import SessionBusyNow, delete_stored

# Seconds /health waits for the store's answer before calling it "timeout": short enough that
# /health answers well within a readiness probe's usual 1 s, whatever the store is doing.
STORE_PROBE_TIMEOUT = 0.3
STORE_OK, STORE_TIMEOUT, STORE_UNREACHABLE = "ok", "timeout", "unreachable"  # /health's `store`

if TYPE_CHECKING:
    from chatrun.engine.bot import Bot
    from chatrun.engine.session import Session
    from chatrun.server.metrics import ServerMetrics

__all__ = ["EXISTING", "IF_BUSY", "MAX_REQUEST_ID", "NEW", "OPEN", "OWNER_ONLY", "QUEUE", "REJECT", "SYSTEM", "Reach",
           "SessionRegistry",
           "SessionRequest", "SessionSettings", "SessionStart", "TurnRun"]


@dataclass(frozen=True)
class SessionSettings:
    """How the registry shares sessions: see docs/deploy.md."""

    if_busy: str = QUEUE  # what a request for a busy session does (a request may override it)
    lease: LeaseSettings = LeaseSettings()
    cache_size: int = 10_000  # live sessions kept at most
    cache_bytes: int = 256 * 2**20  # their estimated memory (session_cache.live_size) at most
    cache_idle: float = 900.0  # seconds a live session stays cached unused
    max_sessions_per_principal: int = 0  # sessions one principal may own (0: no limit; auth only)
    # Which bot versions in the store this replica loads, what it signs its own with, their size
    # limit (server/bundles.py). None: from the environment ($CHATRUN_BUNDLE_KEY), else no key.
    bundles: BundlePolicy | None = None
    # The clock sessions' templates and timeouts read and the sweeper sweeps by (None: the
    # system's; `chatrun serve --clock-file`: engine/clock.FileClock).
    clock: FileClock | None = None


class SessionRegistry:
    def __init__(
        self,
        bots: dict[str, Bot],
        store: SessionStore | AsyncStore,
        cache_size: int = 10_000,
        models: ModelPool | None = None,
        settings: SessionSettings | None = None,
        versions: dict[str, BotVersions] | None = None,
    ):
        self.store = as_async_store(store)
        # Every version of each bot (server/versions.py); `bots` are the primaries: what new
        # sessions start on unless a canary's weights or a tester's header say otherwise.
        self.settings = settings = settings or SessionSettings(cache_size=cache_size)
        self.shelf = VersionShelf(versions or {name: BotVersions(name, [Version(bot, own_label(bot), 100)])
                                               for name, bot in bots.items()}, self.store,
                                  settings.bundles or BundlePolicy.from_env())
        self.bots = self.shelf.primaries()
        self.models = models or ModelPool()
        self.metrics: ServerMetrics | None = None  # set by create_app when prometheus-client is installed
        self.outbox: Any = None  # the app's OutboxWorker (chatrun.server.outbox), while the app runs
        self.sweeper: Any = None  # the app's PendingSweeper (chatrun.server.sweeper), while the app runs
        self.channels: Any = None  # the app's Channels (chatrun.server.channels.door): platforms' webhooks
        self.log_content = False  # the turn log line carries the user's message and the replies
        self.cache = SessionCache(CacheLimits(settings.cache_size, settings.cache_bytes, settings.cache_idle))
        self.gate = SessionGate(self.store, settings.lease, settings.if_busy)
        # This process's incarnation, which a /v1 claim names, and its lease on a shared store.
        self.liveness = Liveness(self.store, settings.lease)
        self.writes = SessionWrites(self.store, self.cache)
        # Where attached files live, beside the store (None: a store that keeps none).
        self.blobs: BlobArea | None = blobs_of(self.store)
        self.opener = SessionOpener(self.store, self.cache, self.writes, self.models, self.shelf,
                                    settings.max_sessions_per_principal, self.blobs, settings.clock)
        self._holds: dict[int, Hold] = {}  # id(session) -> the hold of the request using it
        self._probe: asyncio.Future[str] | None = None  # the store probe running (store_state)

    # -- what the gate counts (the metrics, /health and the drain read them; drain sets draining)

    @property
    def draining(self) -> bool:
        """Set on SIGTERM: new requests are refused, running ones finish."""
        return self.gate.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.gate.draining = value

    @property
    def active(self) -> int:
        """Requests holding a session."""
        return self.gate.active

    @property
    def waiting(self) -> int:
        """Requests queued for a session."""
        return self.gate.waiting

    @property
    def in_progress(self) -> int:
        """Requests holding or waiting for a session."""
        return self.gate.active + self.gate.waiting

    async def store_ready(self) -> bool:
        """Whether the store answers now (readiness, and whether a failure was the store's)."""
        return await self.store_state() == STORE_OK

    async def store_state(self) -> str:
        """STORE_OK, STORE_TIMEOUT (no answer within STORE_PROBE_TIMEOUT) or STORE_UNREACHABLE
        (refused, an error). Callers that ask while a probe runs share its answer, so a burst of
        probes sends one ping. A store that cannot be asked (a file, memory) is taken as ok."""
        ping = getattr(self.store, "ping", None)
        if ping is None:
            return STORE_OK
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(_probe_store(ping))
        return await asyncio.shield(self._probe)

    # -- bots -------------------------------------------------------------------------------

    def bot(self, name: str | None) -> Bot:
        if name is None:
            return next(iter(self.bots.values()))
        bot = self.bots.get(name)
        if bot is None:
            raise wire.RequestFailed(
                wire.BOT_NOT_FOUND, f"no bot named {name!r}; this server serves: {', '.join(self.bots)}"
            )
        return bot

    def serve_new_version(self, bot: Bot) -> Version:
        """A reloaded bot (`serve --reload`) becomes its bot's primary version (server/versions.py)."""
        version = self.shelf.bots[bot.name].replace_primary(bot, time.time())
        self.bots[bot.name] = bot
        return version

    def bots_in_use(self) -> set[int]:
        """The ids of the bots the sessions this registry holds run on (a session moves to a
        reloaded bot when next used; until then it keeps the one it had)."""
        return self.cache.bots_in_use()

    # -- sessions -----------------------------------------------------------------------------

    def session(
        self,
        bot_name: str | None,
        session_id: str,
        principal: Principal | None,
        mode: str = EXISTING,
        route: str | None = None,
        state: dict[str, Any] | None = None,
        if_busy: str | None = None,
        reach: Reach = OWNER_ONLY,
        version: str | None = None,
        locale: str | None = None,
        meta: dict[str, Any] | None = None,
        channel: bool = False,
    ) -> AbstractAsyncContextManager[Session]:
        """The session, held for the caller until the block ends (its turn, see `turn`); its
        stored history is `history(session)`. `reach`: who besides its owner may use it
        (session_open.Reach: the parties its pending items wait for). `channel`: a channel's
        conversation (server/channels), the only requester that may start a session under a
        channel's id (wire.refuse_reserved_id; refused before anything is read, so the refusal
        says nothing of whether it exists). Raises wire.RequestFailed."""
        if mode != EXISTING and not channel:
            wire.refuse_reserved_id(session_id)
        return Holding(self, bot_name, session_id, principal, if_busy,
                       lambda bot: SessionRequest(bot, session_id, principal, mode,
                                                  SessionStart(route, state, locale, meta), reach, version))

    async def history(self, session: Session) -> list[dict[str, Any]]:
        """The stored history of a session the caller holds (`session`), oldest first: read
        from the store, which keeps it (the live session's buffer does not)."""
        return await self.store.load_history(session.id)

    async def _load_user_memory(self, session: Session) -> None:
        """What the session's bot keeps of the person the conversation is with (`user_memory:`;
        its owner, whoever sends this request), read fresh per request: another conversation of
        theirs may have remembered something since."""
        if session.bot.config.user_memory is None:  # the bot keeps nothing of its users
            return
        whose = session.user_memory_owner
        if whose is not None:
            session.user_memory = await user_memory.aload(self.store, session.bot.name, whose,
                                                          session.bot.config.retention.user_memory,
                                                          time.time())

    async def _hand_over(self, slot: Slot, hold: Hold, request: SessionRequest) -> Session:
        """The ready session, handed to the request on the newest bot with the requester's roles."""
        assert slot.session is not None and slot.buffer is not None
        session = slot.session
        self.cache.touch((request.bot.name, request.session_id))
        self._holds[id(session)] = hold
        # Roles are the requester's, not those of the token that opened the session.
        principal = request.principal
        session.roles = set(principal.roles) if principal is not None else None
        session.principal = template_principal(principal) if principal is not None else None
        # The version policy, now: a reload or a promotion may have come while this request waited.
        # A bot served in one version the session already runs needs no policy (server/versions.py).
        held = self.shelf.bots[request.bot.name]
        only = held.versions[0].bot if len(held.versions) == 1 else None
        bot = session.bot if only is session.bot else held.target(session.bot)
        if session.bot is not bot:
            session.use_bot(bot)
        if session.bot.config.user_memory is not None:
            await self._load_user_memory(session)
        return session

    def _let_go(self, slot: Slot, session: Session) -> None:
        """What the request's block leaves: its hold, the turn's entry, a live copy ahead of the store."""
        self._holds.pop(id(session), None)
        # Readers of the turn's entry (frames, logs, metrics) ran inside the block; an idle
        # cached session keeps less (the buffer keeps no history to read it back from, and
        # a server reads the history from its store itself).
        session.forget_last_turn()
        if slot.buffer is not None:
            if slot.buffer.pending is not None:
                # The request ended without writing what its turn did (cancelled): the
                # live copy is ahead of the store, so it goes; the store is the truth.
                self.cache.drop(slot)

    def turn(self, session: Session, message: Any, request_id: str | None = None, whole: bool = False,
             asks: str | None = None) -> TurnRun:
        """Run one turn of a session held by `session()`: its events, then the commit (the
        last step of the iteration). A retry of a committed `request_id` replays its events.
        whole: the caller uses the events only once the turn has ended (a JSON reply); asks:
        what the request asks (turn_run.request_asks), refused under another request's key."""
        check_request_id(request_id)
        report = functools.partial(TurnReport, session, request_id, self.metrics, self.log_content, message)
        return TurnRun(session, message, request_id, functools.partial(self._hold_of, session),
                       self.store, self.writes, report, whole, asks)

    async def rate(self, bot_name: str | None, session_id: str, principal: Principal | None,
                   feedback: dict[str, Any]) -> dict[str, Any]:
        """A user's rating of a turn (wire.feedback_of's fields): kept in the session's history
        (Session.rate) and committed like a turn, with its backend event for the bot's sinks;
        counted in chatrun_feedback. Waits its turn behind a running one. RequestFailed."""
        async with self.session(bot_name, session_id, principal, EXISTING) as session:
            try:
                data, new = session.give_rating(feedback["turn"], feedback["rating"], feedback.get("comment"),
                                                template_principal(principal),
                                                await self._history_of_turn(session, feedback["turn"]))
            except SessionError as exc:
                raise wire.RequestFailed(wire.BAD_REQUEST, str(exc)) from None
            if not new:  # the same rating again (a double click, a retry): kept, counted and sent once
                return data
            hold = self._hold_of(session)
            await self.writes.commit(hold.slot, session.id, hold.lease)
            if self.metrics is not None:
                self.metrics.feedback_given(session.bot.name, str(data["route"]), str(data["rating"]))
            return data

    async def left_for_fork(self, bot_name: str, session_id: str, principal: Principal | None) -> None:
        """Session `session_id`'s user went on in a `/v1` fork of it: its armed silence dropped and
        committed (Session.left_for_fork). Nothing when it is gone or has none. RequestFailed."""
        async with self.session(bot_name, session_id, principal, EXISTING) as session:
            if session.left_for_fork():
                hold = self._hold_of(session)
                await self.writes.commit(hold.slot, session.id, hold.lease)

    async def _history_of_turn(self, session: Session, turn: int) -> list[dict[str, Any]]:
        """The stored history that holds turn `turn` of `session`, oldest first: its own; for a turn
        of a `/v1` fork from before its fork point, the original's that ran it (and its ratings of
        that reply) before it (a fork's history starts after its fork point; a fork of a fork:
        up the chain, as far as the originals are kept)."""
        histories = [await self.history(session)]
        forked = session.meta.get("forked_from")
        while isinstance(forked, dict) and isinstance(forked.get("turn"), int) and turn <= forked["turn"]:
            original = await self.store.load_session(str(forked.get("session")))
            if original is None:
                break
            histories.append(await self.store.load_history(original.session_id))
            forked = (original.snapshot.get("meta") or {}).get("forked_from")
        return [entry for history in reversed(histories) for entry in history]

    def last_committed(self, session: Session) -> Committed | None:
        """The session's last committed turn: {"turn", "input", "requestId", "at"}, or None."""
        return self._hold_of(session).slot.committed

    async def delete(self, bot_name: str | None, session_id: str, principal: Principal | None) -> None:
        bot = self.bot(bot_name)
        async with self.session(bot.name, session_id, principal, EXISTING) as session:
            await self.writes.delete(self._hold_of(session), session_id, session.memory_ids())

    async def discard_unused(self, session: Session) -> bool:
        """Delete a held session that ran no turn and recorded none (a /v1 request that created
        it and was refused before its turn): left in the store, it would count against
        `--max-sessions-per-principal` for a request that did nothing. Whether it was deleted."""
        if session.closed or session.turn_count:
            return False
        try:
            if session.last_turn is not None:  # a turn tried: failed or stopped, its record is kept
                return False
        except SessionError:  # nothing recorded to read back: no turn was tried
            pass
        await self.writes.delete(self._hold_of(session), session.id, session.memory_ids())
        return True

    async def erase(self, session_id: str, bot_name: str | None) -> int:
        """Delete a stored session for retention or erasure (store/retention.py), whatever its
        bot (this replica may serve another): held as a request holds it (lock and lease), never
        opened; its live copy, if this replica has one, is dropped. How many files went with it.
        A session running a turn is left (SessionBusyNow), for the next pass."""
        async with self.cache.use((bot_name or "", session_id)) as slot:
            try:
                async with self.gate.through(slot.lock, session_id, REJECT) as lease:
                    files = await delete_stored(self.store, self.blobs, session_id, lease)
                    if slot.session is not None:
                        slot.session.close()
                    self.cache.drop(slot)
                    return files
            except wire.RequestFailed as exc:
                if exc.reason != wire.TOO_MANY_REQUESTS:
                    raise
                raise SessionBusyNow(exc.message) from None

    def _hold_of(self, session: Session) -> Hold:
        hold = self._holds.get(id(session))
        if hold is None:
            raise ChatrunError(f"session {session.id} is not held by a request of this registry")
        return hold

    # -- the cache ------------------------------------------------------------------------------

    def live_count(self) -> int:
        return self.cache.live_count()

    def cache_bytes(self) -> int:
        return self.cache.byte_count()

    async def sweep_forever(self) -> None:
        """Evict idle sessions even when no request comes (started with the app)."""
        await self.cache.sweep_forever()


class Holding:
    """`SessionRegistry.session`'s hold on a session, as one object: the cache's slot, the gate
    (lock and lease), the opener, the hand-over; then, when the block ends, the same undone in
    reverse. It was four nested generator context managers; one object saves a served turn
    about 0.03 M instructions (bench/README.md, "The HTTP turn, third pass"), in the same order."""

    __slots__ = ("_registry", "_bot_name", "_session_id", "_principal", "_if_busy", "_request", "_key",
                 "_slot", "_lock", "_lease", "_session")

    def __init__(self, registry: SessionRegistry, bot_name: str | None, session_id: str, principal: Principal | None,
                 if_busy: str | None, request: Callable[[Bot], SessionRequest]):
        self._registry, self._bot_name, self._session_id = registry, bot_name, session_id
        self._principal, self._if_busy, self._request = principal, if_busy, request

    async def __aenter__(self) -> Session:
        registry = self._registry
        bot = registry.bot(self._bot_name)
        registry.gate.refuse_if_draining()
        policy = registry.gate.policy(self._if_busy)
        request = self._request(bot)
        metrics = registry.metrics
        waited = functools.partial(metrics.waited, bot.name) if metrics is not None else None
        self._key = key = (bot.name, self._session_id)
        self._slot = slot = registry.cache.enter(key)
        try:
            self._lock = lock = slot.lock
            if lock.locked():  # busy here: one who may not use it neither waits behind its turn nor hears of it
                await registry.opener.refuse_unreached(request)
            try:
                self._lease = lease = await registry.gate.enter(lock, self._session_id, policy, waited)
            except wire.RequestFailed as exc:
                if exc.reason == wire.TOO_MANY_REQUESTS:  # busy on another replica (its lease): the same
                    await registry.opener.refuse_unreached(request)
                raise
            try:
                await registry.opener.ready(slot, request, lease)
                self._session = await registry._hand_over(slot, Hold(slot, lease), request)
            except BaseException:
                await registry.gate.leave(lock, lease)
                raise
        except BaseException:
            registry.cache.leave(key, slot)
            raise
        return self._session

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        registry, slot = self._registry, self._slot
        try:
            try:
                if isinstance(exc, AttachmentRefused):  # a file the route does not take, or no such upload
                    raise wire.RequestFailed(wire.BAD_REQUEST, str(exc)) from None
                if isinstance(exc, SessionError):  # e.g. a message to a conversation an `end` action ended
                    raise wire.RequestFailed(wire.SESSION_NOT_ACTIVE, str(exc)) from None
            finally:
                registry._let_go(slot, self._session)
        finally:
            try:
                await registry.gate.leave(self._lock, self._lease)
            finally:
                registry.cache.leave(self._key, slot)


async def _probe_store(ping: Callable[[], Awaitable[None]]) -> str:
    try:
        await asyncio.wait_for(ping(), STORE_PROBE_TIMEOUT)
    except TimeoutError:
        return STORE_TIMEOUT
    except Exception:  # refused, an error: whatever the cause, it does not answer
        return STORE_UNREACHABLE
    return STORE_OK
