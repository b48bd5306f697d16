"""The FastAPI application behind `chatrun serve`.

    app = create_app(["bots/travel"], "sqlite:///chatrun.db")

Serves, for each bot: the WebSocket endpoint (Quarkus Chat Scopes frames), the HTTP API,
the OpenAI-compatible API under /v1, the JavaScript client and the web chat page with its inspector.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from chatrun import __version__
from chatrun.errors import ChatrunError
from chatrun.server import wire
from chatrun.server.agui import make_agui_router
from chatrun.server.auth import Auth, resolve_auth
from chatrun.server.channels.door import Channels, make_channel_router
from chatrun.server.channels.twilio import make_twilio_router
from chatrun.server.erasure import make_erasure_router
from chatrun.server.guard import EdgeGuard, EdgePolicy
from chatrun.server.http import SendMessageRoute, failure_response, make_router
from chatrun.server.listen import redact_tokens_in_logs
from chatrun.server.metrics import ServerMetrics
from chatrun.server.openai_api import OpenAIOptions, OpenAIState, make_openai_router
from chatrun.server.outbox import OutboxSettings, OutboxWorker, make_outbox_router
from chatrun.server.pending_api import make_pending_router
from chatrun.server.plumbing import ServerState
from chatrun.server.reload import Watchers
from chatrun.server.sessions import SessionRegistry, SessionSettings
from chatrun.server.site import add_site_routes
from chatrun.server.sweeper import PendingSweeper, SweepSettings
from chatrun.server.tracecontext import TraceContext
from chatrun.server.versions import BotVersions, versions_of
from chatrun.server.widget import add_widget_routes
from chatrun.server.ws import make_websocket_router
from chatrun.store import SHARED_SCHEMES, SessionStore
from chatrun.store.aio import AsyncStore, open_async_store


def create_app(
    bots: Any,
    store_url: str | None = "memory://",
    auth: Auth | str | Path | None = None,
    limits: wire.ServerLimits = wire.ServerLimits(),  # noqa: B008 - frozen dataclass, safe to share
    store: SessionStore | AsyncStore | None = None,
    cache_size: int = 10_000,
    gc_tuning: bool = True,
    openai: OpenAIOptions = OpenAIOptions(),  # noqa: B008 - frozen dataclass, safe to share
    edge: EdgePolicy | None = None,
    sessions: SessionSettings | None = None,
    reload: bool = False,
    log_content: bool = False,
    outbox: OutboxSettings | None = None,
    sweep: SweepSettings | None = None,
) -> FastAPI:
    """The app serving `bots` (Bot objects or paths; a dict name -> Bot; the first is the default).

    store_url: "memory://", "sqlite:///path.db" (this app must be the file's only server) or
    "redis://host:port/db" (shared by replicas); ignored when `store` is given.
    sessions: lease, queue, if-busy and cache settings (default: SessionSettings(cache_size)).
    auth: an Auth, a path to an auth file, or None (then $CHATRUN_AUTH_FILE, else no auth).
    openai: options of the OpenAI-compatible API under /v1 (docs/openai-api.md).
    gc_tuning: apply tune_gc() at startup (process-wide; pass False when embedding the app
    in a process whose garbage-collector settings are someone else's).
    edge: the Host/Origin/body checks (guard.py); by default loopback names only, same-origin
    browsers only, bodies up to limits.max_frame_bytes.
    reload: watch each bot's files and serve the new version of a bot after a valid edit
    (chatrun.server.reload).
    log_content: the per-turn log line (logger chatrun.turns) carries the user's message and
    the replies (docs/observability.md); off by default.
    outbox, sweep: how backend events are delivered, how often pending items' timeouts are looked
    for (chatrun.server.outbox, chatrun.server.sweeper; default: from the environment).
    """
    settings = sessions or SessionSettings(cache_size=cache_size)
    auth_config = resolve_auth(auth)  # before the store opens: a bad auth file leaves nothing open
    versions = _load_bots(bots)  # so does an invalid bot: it is the error said, and no store file is made for it
    own_store = store is None  # opened here, so closed here (SQLite: no -wal/-shm left behind)
    store = open_async_store(store_url, settings.lease, exclusive=True) if store is None else store
    registry = _registry(versions, store, settings, log_content)
    loaded = registry.bots
    app = FastAPI(
        lifespan=Lifecycle(registry, loaded, gc_tuning, reload, own_store, outbox or OutboxSettings.from_env(),
                           sweep or SweepSettings.from_env()).run,
        title=f"chatrun: {', '.join(loaded)}",
        version=__version__,
        description="Chat with declarative bots over WebSocket (Quarkus Chat Scopes frames, see docs/protocol.md) or HTTP. The web page is at `/`.",
        docs_url=None, redoc_url=None,  # served by chatrun.server.site from the package's own assets: works offline
        exception_handlers=ERROR_HANDLERS,
    )
    # What the endpoints reach through request.app.state (chatrun.server.plumbing).
    app.state = ServerState(registry=registry, auth=auth_config, limits=limits)
    app.state.metrics, app.state.default_bot = registry.metrics, next(iter(loaded))
    _add_routes(app, registry, limits, openai)
    policy = edge or EdgePolicy(max_body_bytes=limits.max_frame_bytes)
    app.add_middleware(EdgeGuard, policy=policy)
    app.add_middleware(TraceContext)  # outermost: the edge's refusals are part of the caller's trace too
    app.state.edge = policy
    redact_tokens_in_logs()
    return app


def _registry(versions: dict[str, BotVersions], store: SessionStore | AsyncStore, settings: SessionSettings,
              log_content: bool) -> SessionRegistry:
    loaded = {name: found.primary.bot for name, found in versions.items()}
    registry = SessionRegistry(loaded, store, settings=settings, versions=versions)
    registry.shelf.check_bundles()  # a bot too large to publish is the command's error, before anything starts
    registry.metrics = registry.shelf.metrics = ServerMetrics.create(registry)
    registry.log_content = log_content
    registry.models.warm({bot.config.route_model(r).provider for bot in registry.shelf.all_bots()
                          for r in bot.config.routes})
    return registry


def _add_routes(app: FastAPI, registry: SessionRegistry, limits: wire.ServerLimits, openai: OpenAIOptions) -> None:
    """The wire protocols' routes, then the site's; the order decides which route a path matches.
    A path is matched against every route before it in turn (~15,000 instructions each, FastAPI's
    APIRoute.matches), so the HTTP API's turn comes first of all (its path is no other route's),
    then the platforms' webhooks (the HTTP API's many routes cost a channel delivery about 0.1 ms
    to pass), then /v1's four, then the rest of the HTTP API's (no /v1 path is the HTTP API's,
    nor the reverse)."""
    registry.channels = Channels(app.state.auth, registry.store, limits=limits)
    http_api = make_router(registry, limits)
    turn = next(route for route in http_api.routes if isinstance(route, SendMessageRoute))
    http_api.routes.remove(turn)
    app.router.routes.insert(0, turn)
    _include(app, make_twilio_router())  # before the shared webhook, whose path it shares
    _include(app, make_channel_router())
    app.state.openai = OpenAIState.create(registry, limits, openai)
    _include(app, make_openai_router())  # before the HTTP API's many routes: a /v1 turn passes fewer
    _include(app, http_api)
    _include(app, make_websocket_router())
    _include(app, make_outbox_router())
    _include(app, make_erasure_router())
    _include(app, make_pending_router())
    _include(app, make_agui_router())
    add_widget_routes(app)
    add_site_routes(app)


def _include(app: FastAPI, router: APIRouter) -> None:
    """The router's routes, in the app's own list. An included router (app.include_router) is
    matched lazily by FastAPI, each request walking the router's routes twice: 60-120 us of
    CPU a turn to reach the HTTP API's and /v1's routes, measured. The routes are whole
    already: APIRouter.add_api_route gave each its prefix, tags, responses and dependencies."""
    app.router.routes.extend(router.routes)


@dataclass
class Lifecycle:
    """What the app starts when it starts serving, and stops (and closes) when it stops."""

    registry: SessionRegistry
    bots: dict[str, Any]  # the bots given to create_app (the registry's may be newer versions)
    gc_tuning: bool
    reload: bool
    own_store: bool  # the store was opened by create_app, so it is closed here
    outbox: OutboxSettings = OutboxSettings()  # noqa: RUF009 - frozen
    sweep: SweepSettings = SweepSettings()  # noqa: RUF009 - frozen

    @asynccontextmanager
    async def run(self, _app: FastAPI) -> AsyncIterator[None]:
        registry = self.registry
        if self.gc_tuning:
            tune_gc()
        ping = getattr(registry.store, "ping", None)
        if ping is not None:  # a shared store that cannot be reached: fail at startup, not per request
            await ping()
        await registry.liveness.start()  # before any request: every claim it names has its lease
        await registry.shelf.publish()  # the bots' files, for replicas that lack a session's version
        note = registry.shelf.start_note()
        if note is not None:  # loud where replicas share the store by design, a note elsewhere
            shared = registry.store.url.startswith(SHARED_SCHEMES)
            logging.getLogger("chatrun.versions").log(logging.WARNING if shared else logging.INFO, note)
        sweeper = asyncio.ensure_future(registry.sweep_forever())
        if not registry.store.has_outbox and any(bot.config.sinks or bot.config.channels
                                                 for bot in registry.bots.values()):
            raise ChatrunError(f"store {registry.store.url} keeps no outbox, so the backend events of bots with "
                               "`sinks:` and the replies of `channels:` could not be delivered; serve them on "
                               "memory://, sqlite://, redis:// or postgresql://")
        Channels.check_installed([bot.config for bot in registry.bots.values()])
        worker = registry.outbox = OutboxWorker(registry, self.outbox)
        registry.writes.on_outbox = worker.nudge
        delivering = asyncio.ensure_future(worker.run_forever())
        clock = registry.settings.clock
        pending = registry.sweeper = PendingSweeper(registry, self.sweep,
                                                    **({"clock": clock.timestamp} if clock is not None else {}))
        expiring = asyncio.ensure_future(pending.run_forever())
        recovering = asyncio.ensure_future(registry.channels.recover_forever(registry))
        watchers = Watchers(registry) if self.reload else None
        try:
            yield
        finally:
            sweeper.cancel()
            expiring.cancel()
            recovering.cancel()
            delivering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await delivering
            await registry.liveness.stop()
            await worker.aclose()
            await registry.channels.aclose()
            if watchers is not None:
                await watchers.stop()
            every = (*self.bots.values(), *registry.bots.values(), *registry.shelf.all_bots())
            for bot in {id(b): b for b in every}.values():
                await bot.tools.aclose()  # HTTP connections and MCP servers the bots' tools opened
            registry.shelf.close()
            if self.own_store:
                with contextlib.suppress(Exception):
                    await registry.store.close()


# -- errors: every HTTP error has the same shape, {"error": REASON, "message": TEXT} --------------


async def _failed(request: Request, exc: wire.RequestFailed) -> Response:
    return failure_response(exc)


async def _invalid(request: Request, exc: RequestValidationError) -> Response:
    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return failure_response(wire.RequestFailed(wire.BAD_REQUEST, problems))


async def _http(request: Request, exc: StarletteHTTPException) -> Response:
    reason = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, wire.BAD_REQUEST)
    # exc.headers carries `Allow` on a 405.
    return JSONResponse({"error": reason, "message": f"{request.method} {request.url.path}: {exc.detail}"},
                        status_code=exc.status_code, headers=exc.headers)


async def _bug(request: Request, exc: Exception) -> Response:  # still the documented JSON, not text/plain
    return failure_response(wire.RequestFailed(wire.SERVER_ERROR, f"internal server error: {type(exc).__name__}"))


async def _chatrun(request: Request, exc: ChatrunError) -> Response:
    return failure_response(wire.RequestFailed(wire.SERVER_ERROR, str(exc)))


ERROR_HANDLERS: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    wire.RequestFailed: _failed,
    RequestValidationError: _invalid,
    StarletteHTTPException: _http,
    Exception: _bug,
    ChatrunError: _chatrun,
}


GC_THRESHOLDS = (50_000, 20, 10)


def tune_gc() -> None:
    """Make the garbage collector cheap for a server holding thousands of live sessions.

    With CPython's default thresholds (700, 10, 10) a server under load runs a young
    collection every few turns and a full one every few seconds, each walking every live
    session, socket and HTTP connection: at 1,000 sessions that was ~20% of the CPU
    (bench/bench_server.py): the objects of a thousand in-flight turns outlive a young
    generation of 700 and get promoted, then rescanned. With room for 50,000 most are freed
    by reference counting while still young; freezing moves what exists at startup
    (modules, the bots, the model client) out of every later collection. Cycles are still
    collected, only less often. Process-wide: meant for the process that serves.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _load_bots(bots: Any) -> dict[str, BotVersions]:
    """Each bot's versions: a directory with versions/ serves them all (server/versions.py)."""
    if isinstance(bots, dict):
        items = list(bots.values())
    elif isinstance(bots, list | tuple):
        items = list(bots)
    else:
        items = [bots]
    loaded: dict[str, BotVersions] = {}
    for item in items:
        found = versions_of(item)
        name = found[0].bot.name
        if name in loaded:
            raise ChatrunError(f"two bots are named {name!r}; each bot served needs its own name")
        loaded[name] = BotVersions(name, found)
    if not loaded:
        raise ChatrunError("no bot to serve; give at least one bot directory or YAML file")
    return loaded
