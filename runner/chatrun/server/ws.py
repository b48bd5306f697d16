"""The `/_chat/routes` WebSocket endpoint, speaking Quarkus Chat Scopes frames (see wire.py).

One connection may carry several chats (chatIds). Each request runs in its own task so a
slow turn on one chat does not hold up the others; requests for one chat are served in the
order they arrived (the registry's per-session lock is FIFO). Every request ends with exactly
one Completed or Failed frame (except a Quarkus-dialect Disconnect, which Quarkus never
answers). Closing the connection keeps the sessions in the store; a turn still running when
the client leaves finishes and is committed.

Which frames a chat is sent is its `wire.Dialect` (Quarkus by default, chatrun's extensions
when its Connect asked); this module only asks the dialect.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from typing import Any

from fastapi import APIRouter
from starlette.websockets import WebSocket, WebSocketState

from chatrun.engine import tracing
from chatrun.engine.stream_chunks import STREAM_EVERY_NOW
from chatrun.server import wire
from chatrun.server.auth import Principal
from chatrun.server.outbound import Outbound
from chatrun.server.pending_api import decision_of
from chatrun.server.play_model import PLAYING, Asks, ModelPlayer, may_play
from chatrun.server.plumbing import (
    Unauthorized,
    WidgetRefused,
    authenticate,
    limits_of,
    registry_of,
)
from chatrun.server.sessions import EXISTING, NEW, Reach, SessionRegistry
from chatrun.server.turn_run import request_asks
from chatrun.server.versions import VERSION_HEADER

log = logging.getLogger("chatrun.server")

CLOSE_UNAUTHORIZED = 4401


class Connection:
    def __init__(
        self,
        websocket: WebSocket,
        registry: SessionRegistry,
        limits: wire.ServerLimits,
        principal: Principal | None,
        bot_name: str | None,
    ):
        self.ws = websocket
        self.registry = registry
        self.limits = limits
        self.principal = principal
        self.bot_name = bot_name
        self.chats: dict[str, str] = {}  # chatId -> bot name, from the moment its Connect is received
        self.dialects: dict[str, wire.Dialect] = {}  # chatId -> the dialect its Connect asked for
        # For frames tied to no connected chat: extended once any Connect here asked for it.
        self.dialect = wire.QUARKUS_DIALECT
        self.pending: set[str] = set()  # chats whose Connect is not served yet
        self.in_flight = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.turns: dict[str, set[asyncio.Task[None]]] = {}  # chatId -> its turn requests in flight (what Cancel stops)
        self.stopped: set[asyncio.Task[None]] = set()  # turn requests a Cancel frame cancelled
        self.out = Outbound(websocket, limits.max_outbound_bytes, limits.send_timeout)
        self.asks = Asks()  # model calls the page plays, waiting for its ModelAnswer (play_model.py)

    @property
    def open(self) -> bool:
        return not self.out.gone.is_set()

    def send(self, chat_id: str | None, kind: str, data: Any, request_id: Any = None) -> None:
        # Never waits on the socket (see outbound.py): callers may hold a session's lock. Not a
        # coroutine: one fewer per frame (a few per turn).
        self.out.put(wire.server_frame(chat_id, kind, data, request_id))

    def dialect_of(self, chat_id: str | None) -> wire.Dialect:
        return self.dialects.get(chat_id, self.dialect) if chat_id is not None else self.dialect

    async def fail(self, chat_id: str | None, reason: str, message: str, request_id: Any = None) -> None:
        self.reject(chat_id, reason, message, request_id)

    def reject(self, chat_id: str | None, reason: str, message: str, request_id: Any = None,
               extended: bool = False) -> None:
        """Answer a request with its failure frames, at once: no task per rejected frame.
        `extended`: in the extended dialect whatever the chat's (a Connect that asked for it)."""
        dialect = wire.EXTENDED_DIALECT if extended else self.dialect_of(chat_id)
        for kind, data in dialect.failure(reason, message):
            self.out.put(wire.server_frame(chat_id, kind, data, request_id))

    async def run(self) -> None:
        reader = asyncio.ensure_future(self._receive_loop())
        gone = asyncio.ensure_future(self.out.gone.wait())
        try:
            await asyncio.wait({reader, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, gone):
                task.cancel()
            self.out.give_up(self.out.reason)

    async def _receive_loop(self) -> None:
        # Read the next frame only when the replies to the earlier ones are being read.
        while await self.out.wait_for_room():
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                self.out.give_up(None)
                return
            self.dispatch(message.get("text") if message.get("text") is not None else message.get("bytes"))

    def dispatch(self, raw: str | bytes | None) -> None:
        """Check a frame and start serving it. Runs synchronously in the receive loop, so the
        order of frames decides the order in which their requests queue for a session."""
        try:
            frame = wire.parse_frame(raw, self.limits)
        except wire.FrameError as exc:
            self.reject(exc.chat_id, exc.reason, exc.message, exc.request_id, exc.extensions)
            return
        if self.in_flight >= self.limits.max_in_flight:
            self.reject(
                frame.chat_id,
                wire.TOO_MANY_REQUESTS,
                f"this connection already has {self.in_flight} requests in flight (limit "
                f"{self.limits.max_in_flight}); wait for a Completed or Failed before sending more",
                frame.request_id,
            )
            return
        if frame.type == wire.CONNECT:
            if frame.extensions:
                self.dialect = wire.EXTENDED_DIALECT
            if frame.chat_id not in self.chats and len(self.chats) >= self.limits.max_chats_per_connection:
                self.reject(
                    frame.chat_id,
                    wire.TOO_MANY_REQUESTS,
                    f"this connection already carries {len(self.chats)} chats (limit "
                    f"{self.limits.max_chats_per_connection}); Disconnect one or open another connection",
                    frame.request_id,
                )
                return
            try:
                bot = self.registry.bot(frame.bot or self.bot_name).name
                if self.bot_name is not None and bot != self.bot_name:  # a widget's token is checked for it
                    raise wire.RequestFailed(wire.BOT_NOT_FOUND, f"/bots/{self.bot_name}/_chat/routes serves bot "
                                             f"{self.bot_name!r} only; connect to /_chat/routes to pick another")
            except wire.RequestFailed as exc:
                self.reject(frame.chat_id, exc.reason, exc.message, frame.request_id)
                return
            added = frame.chat_id not in self.chats
            if added:  # later frames of this chat queue behind its Connect
                self.chats[frame.chat_id] = bot
                self.pending.add(frame.chat_id)
            self.dialects[frame.chat_id] = wire.dialect(frame.extensions)
            coro = self.connect(frame, bot, added)
        elif frame.chat_id not in self.chats:
            if frame.type == wire.DISCONNECT and not self.dialect_of(frame.chat_id).answers_disconnect:
                return  # Quarkus ignores a Disconnect of an unknown chat
            problem = _not_connected(frame.chat_id)
            self.reject(frame.chat_id, problem.reason, problem.message, frame.request_id)
            return
        elif self._answered_at_once(frame):
            return
        elif frame.type == wire.CHAT_ROUTE_MESSAGE:
            coro = self.chat(frame, self.chats[frame.chat_id])
        elif frame.type in (wire.DECIDE, wire.ANSWER):
            coro = self.decide(frame, self.chats[frame.chat_id])
        elif frame.type == wire.FEEDBACK:
            coro = self.feedback(frame, self.chats[frame.chat_id])
        else:
            coro = self.disconnect(frame, self.chats[frame.chat_id])
        self._start(frame, coro)

    def _start(self, frame: wire.ClientFrame, coro: Any) -> None:
        """Serve a request in its own task; a turn's task is the chat's until it ends (Cancel stops it)."""
        self.in_flight += 1
        task = self._spawn(self._serve(frame, coro))
        if frame.type in wire.TURN_TYPES:
            running = self.turns.setdefault(frame.chat_id, set())
            running.add(task)
            task.add_done_callback(running.discard)

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def cancel(self, frame: wire.ClientFrame) -> None:
        """Cancel (extended dialect): stop every turn request of the chat sent on this connection
        and not ended yet. The running turn is rolled back and recorded as stopped (the engine:
        Session._run_turn), a queued one never runs; each ends with Failed("Cancelled"). The
        Cancel itself is answered at once: Completed(null). Synchronous, in the
        receive loop: the stop takes effect before the next frame is read."""
        if not self.dialect_of(frame.chat_id).extensions:  # Quarkus has no such frame
            self.reject(frame.chat_id, wire.BAD_REQUEST, "Cancel is a chatrun extension: Connect with "
                        '"extensions": true to stop turns', frame.request_id)
            return
        # Not again a task stopped already: it may be writing its stopped turn's record.
        running = [task for task in self.turns.get(frame.chat_id, ()) if not task.done() and task not in self.stopped]
        for task in running:
            self.stopped.add(task)
            # A request read in the same batch of frames has not begun: cancelling it would throw
            # into _serve before its `try`, ending it with no frame. It stops itself as it begins.
            coro = task.get_coro()
            if not (inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED):
                task.cancel()
        self.out.put(wire.server_frame(frame.chat_id, wire.COMPLETED, None, frame.request_id))

    def _answered_at_once(self, frame: wire.ClientFrame) -> bool:
        """A frame of a connected chat served in the receive loop, not in a task of its own:
        Cancel, ModelAnswer (neither may wait behind the turn they act on), and a turn frame
        asking to play the model when it may not."""
        if frame.type == wire.CANCEL:
            self.cancel(frame)
        elif frame.type == wire.MODEL_ANSWER:
            self.answer_model(frame)
        elif frame.play_model is not None and (refused := self.play_refused(frame)):
            self.reject(frame.chat_id, *refused, frame.request_id)
        elif frame.stream_every is not None and not self.dialect_of(frame.chat_id).extensions:
            self.reject(frame.chat_id, wire.BAD_REQUEST, 'streamEvery is a chatrun extension: Connect with '
                        '"extensions": true to ask for fewer Stream frames', frame.request_id)
        else:
            return False
        return True

    def play_refused(self, frame: wire.ClientFrame) -> tuple[str, str] | None:
        """Why this turn frame may not ask to play the model (reason, message), or None
        (docs/protocol.md, "Playing the model")."""
        if not self.dialect_of(frame.chat_id).extensions:
            return wire.BAD_REQUEST, 'playModel is a chatrun extension: Connect with "extensions": true to play the model'
        if frame.play_model != "auto" and self.principal is not None and not may_play(self.principal):
            return wire.FORBIDDEN, (f"only the bot's author plays the model: principal {self.principal.name} needs "
                                    "the role `authors` in the auth file")
        return None  # "auto" from someone who may not play: the turn runs with the model, as for anyone

    def answer_model(self, frame: wire.ClientFrame) -> None:
        """ModelAnswer (extended dialect): the page's answer to a ModelRequest of this chat; the
        waiting turn goes on. Answered at once: Completed(null), or Failed(NotPending)."""
        try:
            self.asks.answer(frame.chat_id, frame.data)
        except wire.RequestFailed as exc:
            self.reject(frame.chat_id, exc.reason, exc.message, frame.request_id)
            return
        self.out.put(wire.server_frame(frame.chat_id, wire.COMPLETED, None, frame.request_id))

    def player(self, frame: wire.ClientFrame) -> ModelPlayer | None:
        """Who answers as the model in this turn request: the page, when the frame asks to play."""
        if frame.play_model is None or not may_play(self.principal):
            return None

        def send(kind: str, data: Any) -> None:
            self.out.put(wire.server_frame(frame.chat_id, kind, data, frame.request_id))

        return ModelPlayer(frame.play_model, frame.chat_id, self.asks, send, self.limits.model_answer_timeout)

    async def _serve(self, frame: wire.ClientFrame, coro: Any) -> None:
        # A Quarkus-dialect Disconnect gets no frame, not even a Failed (Quarkus sends none).
        silent = frame.type == wire.DISCONNECT and not self.dialect_of(frame.chat_id).answers_disconnect
        try:
            if asyncio.current_task() in self.stopped:  # a Cancel came before it began: it never runs
                coro.close()
                raise asyncio.CancelledError
            await coro
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task not in self.stopped:  # the server is stopping: not ours to answer
                raise
            self.stopped.discard(task)
            self.reject(frame.chat_id, wire.CANCELLED, "Stopped: this reply is not part of the conversation "
                        "(what its tools already did is not undone); send a message to go on", frame.request_id)
        except wire.RequestFailed as exc:
            if silent:
                log.info("Disconnect of chat %s failed (%s: %s); no frame sent", frame.chat_id, exc.reason, exc.message)
            else:
                await self.fail(frame.chat_id, exc.reason, exc.message, frame.request_id)
        except Exception as exc:  # a bug: tell the client, keep the connection
            log.exception("request %s on chat %s failed", frame.type, frame.chat_id)
            if silent:
                return
            await self.fail(
                frame.chat_id, wire.SERVER_ERROR, f"internal server error: {type(exc).__name__}: {exc}", frame.request_id
            )
        finally:
            self.in_flight -= 1
            self._forget_dialect(frame.chat_id)  # after its Failed went out in that dialect

    # -- requests -----------------------------------------------------------------------

    async def connect(self, frame: wire.ClientFrame, bot: str, added: bool) -> None:
        mode = EXISTING if frame.resume else NEW
        try:
            version = self.ws.headers.get(VERSION_HEADER)  # a tester's pick for new sessions (docs/versions.md)
            async with self.registry.session(bot, frame.chat_id, self.principal, mode, route=frame.route,
                                             version=version, locale=frame.locale or self.ws.headers.get("accept-language")) as session:
                self.pending.discard(frame.chat_id)
                if frame.resume:
                    if frame.route and frame.route != session.route:
                        # A resumed session stays where it was; say so rather than ignore the route silently.
                        self.send(
                            frame.chat_id,
                            "Console",
                            f"resumed session is on route {session.route}; the requested route {frame.route} was ignored",
                            frame.request_id,
                        )
                    if self.dialect_of(frame.chat_id).tells_resumed_route:
                        # lastTurn (chatrun extension): what the store holds as the last committed
                        # turn, so a client that lost a reply learns whether its message was taken.
                        self.send(
                            frame.chat_id, "RouteChanged",
                            {"route": session.route, "stack": session.stack,
                             "lastTurn": self.registry.last_committed(session)},
                            frame.request_id,
                        )
                self.send(frame.chat_id, wire.COMPLETED, session.scope_id, frame.request_id)
        except BaseException:
            if added and frame.chat_id in self.pending:  # this Connect attached the chat: detach it
                self.pending.discard(frame.chat_id)
                self.chats.pop(frame.chat_id, None)
            raise

    async def chat(self, frame: wire.ClientFrame, bot: str) -> None:
        async with self.registry.session(
            bot, frame.chat_id, self.principal, EXISTING, if_busy=frame.if_busy
        ) as session:
            if frame.chat_id not in self.chats or frame.chat_id in self.pending:  # its Connect failed
                raise _not_connected(frame.chat_id)
            # A string requestId is an idempotency key: a retry of a committed turn is replayed
            # (even if the scope it named has gone since: that turn may be what ended it).
            key = frame.request_id if isinstance(frame.request_id, str) else None
            message = wire.turn_input(frame.data)
            run = self.registry.turn(session, message, key, asks=None if key is None else request_asks(message))
            replay = await run.is_replay()
            if not replay and frame.scope_id and frame.scope_id not in {s.id for s in session.scopes}:
                raise wire.RequestFailed(
                    wire.SCOPE_NOT_ACTIVE,
                    f"scope {frame.scope_id} is no longer active (the conversation moved on); "
                    f"the current scope is {session.scope_id}",
                )
            await self._send_turn(frame, session, run)

    async def decide(self, frame: wire.ClientFrame, bot: str) -> None:
        """A Decide or Answer frame: a decision turn on a pending item of this chat's session
        (the same rules as POST .../pending/{item}; Failed DecisionRefused, NotPending, InvalidDecision)."""
        assert frame.item is not None
        decision = decision_of(frame.item, frame.data, None, self.limits)
        async with self.registry.session(bot, frame.chat_id, self.principal, EXISTING,
                                         reach=Reach(pending=True)) as session:
            if frame.chat_id not in self.chats or frame.chat_id in self.pending:
                raise _not_connected(frame.chat_id)
            key = frame.request_id if isinstance(frame.request_id, str) else None
            asks = None if key is None else request_asks(decision)
            await self._send_turn(frame, session, self.registry.turn(session, decision, key, asks=asks))

    async def _send_turn(self, frame: wire.ClientFrame, session: Any, run: Any) -> None:
        """A turn's frames in the chat's dialect, then its Completed (or Failed when rolled back)."""
        dialect = self.dialect_of(frame.chat_id)
        frames = dialect.turn()
        playing = PLAYING.set(self.player(frame))  # the engine's turn task inherits it
        every = STREAM_EVERY_NOW.set(frame.stream_every)  # and this (stream_chunks.py)
        try:
            with tracing.own_trace():  # one trace per turn, linked to the connection's
                async for event in run:
                    sent = frames.out(event)
                    if sent is not None:
                        self.send(frame.chat_id, *sent, frame.request_id)
        except asyncio.CancelledError:  # stopped: an item it resolved waits again, said before the Stopped
            for event in run.reopened():
                sent = frames.out(event)
                if sent is not None:
                    self.send(frame.chat_id, *sent, frame.request_id)
            raise
        finally:
            STREAM_EVERY_NOW.reset(every)
            PLAYING.reset(playing)
        # A replay sends a committed turn again: it succeeded (only successes are recorded).
        last = None if run.replayed else session.last_turn
        if last is not None and last.get("ok") is False:
            # Rolled back. Quarkus ends a failing route with Failed("ServerError"), so the
            # client's promise rejects; an extension-aware client got the reason as an Error, and
            # the tools with an outside effect that ran (`ran`: sending the message again repeats them).
            ran = last.get("ran") if dialect.extensions else None
            self.out.put(wire.server_frame(frame.chat_id, wire.FAILED, dialect.reason(wire.SERVER_ERROR),
                                           frame.request_id, ran=ran))
        else:
            self.send(frame.chat_id, wire.COMPLETED, session.scope_id, frame.request_id)

    async def feedback(self, frame: wire.ClientFrame, bot: str) -> None:
        """Feedback (chatrun extension): a rating of one of the chat's turns, answered with
        Completed(null) once it is committed (Session.rate)."""
        await self.registry.rate(bot, frame.chat_id, self.principal, frame.data)
        self.send(frame.chat_id, wire.COMPLETED, None, frame.request_id)

    async def disconnect(self, frame: wire.ClientFrame, bot: str) -> None:
        if not frame.keep:
            await self.registry.delete(bot, frame.chat_id, self.principal)
        self.chats.pop(frame.chat_id, None)
        if self.dialect_of(frame.chat_id).answers_disconnect:
            self.send(frame.chat_id, wire.COMPLETED, None, frame.request_id)
        self._forget_dialect(frame.chat_id)

    def _forget_dialect(self, chat_id: str) -> None:
        if chat_id not in self.chats:
            self.dialects.pop(chat_id, None)


def _not_connected(chat_id: str) -> wire.RequestFailed:
    return wire.RequestFailed(
        wire.SESSION_NOT_ACTIVE,
        f"chat {chat_id} is not connected on this connection; send Connect first "
        '(or Connect with "resume": true to continue a stored session)',
    )


async def chat_routes(websocket: WebSocket) -> None:
    await serve_websocket(websocket, None)


async def bot_chat_routes(websocket: WebSocket, bot: str) -> None:
    await serve_websocket(websocket, bot)


def make_websocket_router() -> APIRouter:
    """/_chat/routes, and the per-bot path whose Connects default to that bot."""
    router = APIRouter()
    router.add_api_websocket_route("/_chat/routes", chat_routes)
    router.add_api_websocket_route("/bots/{bot}/_chat/routes", bot_chat_routes)
    return router


async def serve_websocket(websocket: WebSocket, bot_name: str | None) -> None:
    """One connection: accepted, authenticated, then served until the client leaves. It is
    authenticated after the accept (not as a route dependency, which runs before it) because
    browsers cannot read the status of a refused upgrade, but can read a close code's reason."""
    metrics = websocket.app.state.metrics
    with metrics.websocket() if metrics is not None else contextlib.nullcontext():
        await websocket.accept()
        try:
            principal = authenticate(websocket)
        except WidgetRefused as exc:  # a widget's token: say why (a close reason holds 123 bytes)
            await websocket.close(CLOSE_UNAUTHORIZED, exc.message.encode()[:120].decode(errors="ignore"))
            return
        except Unauthorized:
            await websocket.close(CLOSE_UNAUTHORIZED, "unauthorized: send a valid token (Authorization: Bearer or ?token=)")
            return
        registry = registry_of(websocket)
        if bot_name is not None and bot_name not in registry.bots:
            await websocket.close(4404, f"no bot named {bot_name!r}")
            return
        await _serve(Connection(websocket, registry, limits_of(websocket), principal, bot_name))


async def _serve(connection: Connection) -> None:
    websocket = connection.ws
    await connection.run()
    connection.asks.abandon("the page answering as the model closed its connection; this message was not kept")
    if connection.tasks:  # let running turns finish (and be stored) before the handler returns
        await asyncio.gather(*connection.tasks, return_exceptions=True)
    await connection.out.close()
    if websocket.client_state == WebSocketState.CONNECTED and not connection.out.reason:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(websocket.close(), 1.0)
