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
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from chatrun import events as ev
from chatrun.definition.config import ModelConfig
from chatrun.engine.scopes import Scope, init_declared, scope_view
from chatrun.engine.turn import Turn, new_scope
from chatrun.errors import ChatrunError, ModelError, SessionError, UnknownRouteError
from chatrun.events import Event
from chatrun.memory import ChatMemory, make_memory
from chatrun.messages import AssistantMessage, Message, SystemMessage
from chatrun.models import make_model
from chatrun.models.base import ChatModel
from chatrun.store import SessionStore

if TYPE_CHECKING:
    from chatrun.engine.bot import Bot

Input = str | dict[str, Any] | None
_DONE = object()
SNAPSHOT_VERSION = 1


class ForbiddenRouteError(SessionError):
    """The principal may not enter a route that declares `roles:`."""


class Session:
    """A conversation: a stack of scopes, conversation state, memories and history."""

    def __init__(
        self,
        bot: Bot,
        store: SessionStore,
        model: ChatModel | None = None,
        session_id: str | None = None,
        route: str | None = None,
        state: dict[str, Any] | None = None,
        roles: set[str] | None = None,
        meta: dict[str, Any] | None = None,
    ):
        self.bot = bot
        self.store = store
        self.roles = set(roles) if roles is not None else None
        self._model = model
        self._models: dict[str, ChatModel] = {}
        self._memories: dict[str, ChatMemory] = {}
        self._handlers: dict[str, list[Callable[[Any], Any]]] = {}
        self._default_handlers: list[Callable[[str, Any], Any]] = []
        self._sink: Callable[[Event], None] | None = None
        self._running = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_entry: dict | None = None
        snapshot = store.load_session(session_id) if session_id else None
        if snapshot is not None:  # resume where it was; `route` and `state` apply to new sessions only
            self._restore(snapshot)
            return
        self.id = session_id or secrets.token_hex(8)
        start = route or bot.config.default_route
        if start not in bot.config.routes:
            raise UnknownRouteError(start, list(bot.config.routes))
        if not self.may_enter(start):
            raise ForbiddenRouteError(f"route {start!r} needs one of the roles {bot.config.routes[start].roles}")
        self.turn = 0
        self.meta = dict(meta or {})
        self.state = copy.deepcopy(bot.config.state)
        self.state.update(copy.deepcopy(state or {}))
        self._next_scope = 1
        self.scopes: list[Scope] = [new_scope(self._new_scope_id(), bot.config.routes[start])]
        self.store.commit_turn(self.id, self._snapshot(), {}, [])

    # -- introspection -------------------------------------------------------------

    @property
    def route(self) -> str:
        return self.scopes[-1].route

    @property
    def stack(self) -> list[str]:
        return [s.route for s in self.scopes]

    @property
    def scope_id(self) -> str:
        return self.scopes[-1].id

    def visible_state(self) -> dict[str, Any]:
        return {"state": self.state, "scope": scope_view(self.scopes)}

    def memory(self, scope_id: str | None = None, route: str | None = None) -> list[Message]:
        """The messages of one memory: by default the current route's in the current scope."""
        scope = self.scopes[-1] if scope_id is None else self._scope(scope_id)
        return self.memory_for(scope, route or scope.route, create=False).messages()

    def preview_messages(self) -> list[Message]:
        """What the current route will send the model next, before the user's next message:
        its memory, led by the system prompt rendered from the state as it is now."""
        route = self.bot.config.routes[self.route]
        messages = self.memory()
        if not route.system:
            return messages
        try:
            text = Turn(self, self.turn + 1, None, {}).render_template(route.system, f"route {route.name} system", route.where)
        except ChatrunError:
            return messages  # the next turn will report the template's error
        rest = messages[1:] if messages and isinstance(messages[0], SystemMessage) else messages
        return [SystemMessage(text), *rest]

    def memories(self) -> dict[str, list[Message]]:
        return {
            s.memory_id(r): self.memory_for(s, r, create=False).messages()
            for s in self.scopes
            for r in s.memory_routes
        }

    @property
    def history(self) -> list[dict]:
        return self.store.load_history(self.id)

    @property
    def last_turn(self) -> dict | None:
        """The history's last entry (the last turn tried, failed or not), without reading the
        whole history back when this session object ran that turn."""
        if self._last_entry is None:
            history = self.history
            self._last_entry = history[-1] if history else None
        return self._last_entry

    def snapshot(self) -> dict[str, Any]:
        """The session as JSON-able data (a copy): what the store keeps between turns."""
        return copy.deepcopy(self._snapshot())

    def _snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "bot": self.bot.name,
            "id": self.id,
            "turn": self.turn,
            "state": self.state,
            "scopes": [s.to_dict() for s in self.scopes],
            "next_scope": self._next_scope,
            "meta": self.meta,
            "updated": time.time(),
        }

    # -- events ------------------------------------------------------------------------

    def on(self, event_type: str, handler: Callable[[Any], Any]) -> Session:
        """Call `handler(data)` for every event of this type, as it happens."""
        self._handlers.setdefault(event_type, []).append(handler)
        return self

    def on_default(self, handler: Callable[[str, Any], Any]) -> Session:
        """Call `handler(type, data)` for events no `on()` handler takes."""
        self._default_handlers.append(handler)
        return self

    def emit(self, event_type: str, data: Any) -> None:
        event = Event(event_type, ev.plain(data), self.turn + 1)
        if self._sink is not None:
            self._sink(event)

    def _dispatch(self, event: Event) -> None:
        handlers = self._handlers.get(event.type)
        if handlers:
            for h in handlers:
                h(event.data)
        else:
            for h in self._default_handlers:
                h(event.type, event.data)

    # -- turns -----------------------------------------------------------------------------

    def chat(self, message: Input = None) -> list[Event]:
        """Run one turn and return its events. For async code use `await achat(...)`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise SessionError("Session.chat() is synchronous; inside async code use `await session.achat(...)`")
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self.achat(message))

    async def achat(self, message: Input = None) -> list[Event]:
        return [event async for event in self.stream(message)]

    async def stream(self, message: Input = None) -> AsyncIterator[Event]:
        """Run one turn, yielding its events as they happen (Stream chunks included)."""
        self._check_usable()
        text, data = _split_input(message)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._running = True
        self._sink = queue.put_nowait
        task = asyncio.ensure_future(self._run_turn(text, data))
        task.add_done_callback(lambda _t: queue.put_nowait(_DONE))
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

    async def _run_turn(self, text: str | None, data: dict[str, Any]) -> None:
        before = self._capture()
        turn = Turn(self, self.turn + 1, text, data)
        entry = {"turn": turn.number, "input": text if not data else ev.plain(data), "at": time.time()}
        collected: list[Event] = []
        sink = self._sink
        self._sink = lambda e: (collected.append(e), sink(e))  # type: ignore[misc]
        try:
            await turn.run()
            self.turn = turn.number
            entry.update(ok=True, route=self.route, stack=self.stack, events=_plain(collected))
            # Inside the try: a value the store cannot hold (set by a handler) fails the turn, too.
            self.store.commit_turn(self.id, self._snapshot(), self._dirty_memories(before), [entry])
            self._last_entry = entry
        except asyncio.CancelledError:
            self._rollback(before, entry | {"ok": False, "error": "cancelled", "events": _plain(collected)})
            raise
        except ModelError as exc:
            self._fail(before, entry, collected, f"the model failed on route {self.route}: {exc}")
        except ChatrunError as exc:  # TurnFailed and friends: the message names the place
            self._fail(before, entry, collected, str(exc))
        except Exception as exc:  # a bug in chatrun or in a library: still never lose the session
            self._fail(before, entry, collected, f"internal error on route {self.route}: {type(exc).__name__}: {exc}")
        except BaseException as exc:  # KeyboardInterrupt and the like: roll back, then let it go on
            self._rollback(before, entry | {"ok": False, "error": f"interrupted: {type(exc).__name__}",
                                            "events": _plain(collected)})
            raise
        finally:
            self._sink = sink

    def _fail(self, before: dict, entry: dict, collected: list[Event], message: str) -> None:
        self.emit(ev.ERROR, message)  # first, so the history's record of the attempt holds it too
        self._rollback(before, entry | {"ok": False, "error": message, "events": _plain(collected)})

    # -- atomic turns -------------------------------------------------------------------------

    def _capture(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "state": copy.deepcopy(self.state),
            "scopes": copy.deepcopy(self.scopes),
            "next_scope": self._next_scope,
            "memories": {mid: m.messages() for mid, m in self._memories.items()},
        }

    def _rollback(self, before: dict[str, Any], entry: dict) -> None:
        self.turn = before["turn"]
        self.state = before["state"]
        self.scopes = before["scopes"]
        self._next_scope = before["next_scope"]
        # The store holds exactly what the memories held before the turn (nothing is written
        # until a turn succeeds), so dropping the cache rolls every memory back.
        self._memories.clear()
        entry.setdefault("route", self.route)
        self.store.commit_turn(self.id, self._snapshot(), {}, [entry])
        self._last_entry = entry

    def _dirty_memories(self, before: dict[str, Any]) -> dict[str, list[Message] | None]:
        """Memories whose messages changed in the turn (None: deleted with a popped scope)."""
        live = {s.memory_id(r) for s in self.scopes for r in s.memory_routes}
        saved = before["memories"]
        dirty: dict[str, list[Message] | None] = {}
        for mid in list(self._memories):
            if mid not in live:
                dirty[mid] = None
                del self._memories[mid]
                continue
            memory = self._memories[mid]
            if memory.ephemeral:
                continue
            messages = memory.messages()
            if saved.get(mid) != messages:
                dirty[mid] = messages
        for scope in before["scopes"]:
            for mid in scope.memory_ids():
                if mid not in live:
                    dirty[mid] = None
        return dirty

    # -- scopes and memories (called by the turn) --------------------------------------------------

    def memory_for(self, scope: Scope, route: str, create: bool = True) -> ChatMemory:
        """The memory `<scope-id>#<route>`, loaded from the store once per session object.
        With create=False a route that has no memory yet gets an empty, unregistered one."""
        mid = scope.memory_id(route)
        memory = self._memories.get(mid)
        if memory is not None:
            return memory
        policy = self.bot.config.route_memory(route)
        memory = make_memory(policy, mid, self.bot.config.route_model(route).name)
        if route in scope.memory_routes:
            stored = self.store.get_messages(mid)
            if stored:
                memory.set(stored)
        elif not create:
            return memory
        else:
            scope.memory_routes.append(route)
        self._memories[mid] = memory
        return memory

    def forget_turn_memories(self) -> None:
        """Policy `none`: what a route held during the turn is gone after it. Only memories
        loaded in this turn can hold anything (they are never persisted)."""
        for memory in self._memories.values():
            if memory.ephemeral:
                memory.clear()

    def clear_scope_memories(self, scope: Scope) -> None:
        for route in scope.memory_routes:
            self.memory_for(scope, route).clear()

    def push_scope(self, route: str) -> None:
        self.scopes.append(new_scope(self._new_scope_id(), self.bot.config.routes[route]))

    def pop_scope(self, handed_back: str | None) -> None:
        popped = self.scopes.pop()
        for route in popped.memory_routes:
            self._memories.pop(popped.memory_id(route), None)
        if handed_back:
            parent = self.scopes[-1]
            self.memory_for(parent, parent.route).add(AssistantMessage(handed_back))

    def change_route(self, route: str) -> None:
        scope = self.scopes[-1]
        scope.route = route
        declared = self.bot.config.routes[route].scope
        init_declared(scope, declared.local, declared.shared)

    def may_enter(self, route: str) -> bool:
        needed = self.bot.config.routes[route].roles
        return not needed or self.roles is None or bool(self.roles.intersection(needed))

    def model_for(self, config: ModelConfig) -> ChatModel:
        if self._model is not None:
            return self._model
        model = self._models.get(config.provider)
        if model is None:
            model = self._models[config.provider] = make_model(config.provider)
        return model

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """End the conversation: delete its scopes, memories and history from the store."""
        if self._closed:
            return
        ids = [mid for s in self.scopes for mid in s.memory_ids()]
        self.store.delete_session(self.id, ids)
        self._memories.clear()
        self._closed = True
        if self._loop is not None and not self._loop.is_running() and not self._loop.is_closed():
            # Models opened on the private loop of chat() hold connections bound to it.
            for model in [self._model, *self._models.values()]:
                aclose = getattr(model, "aclose", None)
                if aclose is not None:
                    self._loop.run_until_complete(aclose())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def _check_usable(self) -> None:
        if self._closed:
            raise SessionError(f"session {self.id} is closed")
        if self._running:
            raise SessionError(f"session {self.id} is already running a turn; send one message at a time")

    def _new_scope_id(self) -> str:
        scope_id = f"{self.id}.{self._next_scope}"
        self._next_scope += 1
        return scope_id

    def _scope(self, scope_id: str) -> Scope:
        for s in self.scopes:
            if s.id == scope_id:
                return s
        raise SessionError(f"session {self.id} has no scope {scope_id!r}; scopes: {[s.id for s in self.scopes]}")

    def _restore(self, snapshot: dict[str, Any]) -> None:
        if snapshot.get("bot") not in (None, self.bot.name):
            raise SessionError(f"session {snapshot.get('id')} belongs to bot {snapshot.get('bot')!r}, not {self.bot.name!r}")
        self.id = snapshot["id"]
        self.turn = snapshot["turn"]
        self.state = snapshot["state"]
        self.meta = snapshot.get("meta", {})
        self._next_scope = snapshot["next_scope"]
        self.scopes = [Scope.from_dict(d) for d in snapshot["scopes"]]
        for scope in self.scopes:
            if scope.route not in self.bot.config.routes:
                raise SessionError(
                    f"session {self.id} is on route {scope.route!r}, which the bot no longer defines"
                )


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


def _plain(events: list[Event]) -> list[dict]:
    """The turn's events for the history (their data is plain JSON already), no Stream chunks."""
    return [e.to_dict() for e in events if e.type != ev.STREAM]
