"""The server's session registry: live Session objects, one lock per session, ownership.

Requests for one session are served one after the other (an asyncio.Lock per session,
FIFO), so two turns never interleave; different sessions run concurrently. Sessions are
kept live in a bounded LRU cache and reloaded from the store when evicted or after a
restart: every turn is committed to the store when it ends, so nothing is lost.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chatrun.errors import ChatrunError, ForbiddenRouteError, SessionError, UnknownRouteError
from chatrun.models import ModelPool
from chatrun.server import wire
from chatrun.server.auth import Principal
from chatrun.store import SessionStore

if TYPE_CHECKING:
    from chatrun.engine.bot import Bot
    from chatrun.engine.session import Session

NEW = "new"  # the session must not exist yet
EXISTING = "existing"  # the session must exist


@dataclass
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    session: Session | None = None
    users: int = 0


class SessionRegistry:
    def __init__(self, bots: dict[str, Bot], store: SessionStore, cache_size: int = 10_000, models: ModelPool | None = None):
        self.bots = bots
        self.store = store
        self.cache_size = cache_size
        self.models = models or ModelPool()
        self._slots: OrderedDict[tuple[str, str], _Slot] = OrderedDict()

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
    ) -> AsyncIterator[Session]:
        """The session, locked for the caller until the block ends. Raises wire.RequestFailed."""
        bot = self.bot(bot_name)
        key = (bot.name, session_id)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        slot.users += 1
        try:
            async with slot.lock:
                if slot.session is not None and slot.session.closed:
                    slot.session = None
                if slot.session is None:
                    slot.session = self._open(bot, session_id, principal, mode, route, state)
                elif mode == NEW:
                    raise _exists(session_id)
                else:
                    self._check_owner(slot.session.meta.get("owner"), principal, session_id)
                # Roles are the requester's, not those of the token that opened the session.
                slot.session.roles = set(principal.roles) if principal is not None else None
                if slot.session.bot is not bot:  # the bot was reloaded (serve --reload)
                    slot.session.use_bot(bot)
                self._slots.move_to_end(key)
                try:
                    yield slot.session
                except SessionError as exc:  # e.g. a message to a conversation an `end` action ended
                    raise wire.RequestFailed(wire.SESSION_NOT_ACTIVE, str(exc)) from None
        finally:
            slot.users -= 1
            if slot.session is None and slot.users == 0 and self._slots.get(key) is slot:
                del self._slots[key]
            self._evict()

    async def delete(self, bot_name: str | None, session_id: str, principal: Principal | None) -> None:
        bot = self.bot(bot_name)
        async with self.session(bot.name, session_id, principal, EXISTING) as session:
            session.close()
            slot = self._slots.get((bot.name, session_id))
            if slot is not None:
                slot.session = None

    def live_count(self) -> int:
        return sum(1 for s in self._slots.values() if s.session is not None)

    # -- internals ------------------------------------------------------------------------

    def _open(
        self,
        bot: Bot,
        session_id: str,
        principal: Principal | None,
        mode: str,
        route: str | None,
        state: dict[str, Any] | None,
    ) -> Session:
        snapshot = self.store.load_session(session_id)
        if snapshot is not None:
            if mode == NEW:
                raise _exists(session_id)
            if snapshot.get("bot") not in (None, bot.name):
                raise wire.RequestFailed(
                    wire.SESSION_NOT_ACTIVE, f"session {session_id} belongs to bot {snapshot.get('bot')!r}, not {bot.name!r}"
                )
            self._check_owner((snapshot.get("meta") or {}).get("owner"), principal, session_id)
        elif mode == EXISTING:
            raise _not_found(session_id)
        roles = set(principal.roles) if principal is not None else None
        meta = {"owner": principal.name} if principal is not None else {}
        try:
            return bot.session(
                route=route,
                store=self.store,
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

    @staticmethod
    def _check_owner(owner: str | None, principal: Principal | None, session_id: str) -> None:
        # Only the principal who created a session may use it, answered exactly like an unknown
        # id (no existence oracle). Sessions created with auth off have no owner: once auth is
        # on, no principal reaches them (they stay in the store, untouched); sessions created
        # with auth on are not reachable with auth off either. See docs/security.md.
        if owner != (principal.name if principal is not None else None):
            raise _not_found(session_id)

    def _evict(self) -> None:
        """Drop the least recently used idle sessions beyond the cache size (they stay in the store)."""
        excess = len(self._slots) - self.cache_size
        if excess <= 0:
            return
        for key in list(self._slots):
            if excess <= 0:
                break
            slot = self._slots[key]
            if slot.users == 0 and not slot.lock.locked():
                del self._slots[key]
                excess -= 1


def _not_found(session_id: str) -> wire.RequestFailed:
    return wire.RequestFailed(wire.SESSION_NOT_ACTIVE, f"no session {session_id!r}; create it (Connect) first")


def _exists(session_id: str) -> wire.RequestFailed:
    return wire.RequestFailed(
        wire.SESSION_EXISTS,
        f"session {session_id!r} already exists; to continue it send Connect with \"resume\": true",
    )
