"""The FastAPI application behind `chatrun serve`.

    app = create_app(["bots/travel"], "sqlite:///chatrun.db")

Serves, for each bot: the WebSocket endpoint (Quarkus Chat Scopes frames), the HTTP API,
the OpenAI-compatible API under /v1, the JavaScript client and the web chat page with its inspector.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from chatrun import __version__
from chatrun.errors import ChatrunError
from chatrun.server import wire
from chatrun.server.auth import Auth, resolve_auth, token_from
from chatrun.server.guard import EdgeGuard, EdgePolicy
from chatrun.server.http import failure_response, make_router
from chatrun.server.listen import redact_tokens_in_logs
from chatrun.server.metrics import CONTENT_TYPE, MISSING, ServerMetrics
from chatrun.server.openai_api import OpenAIOptions, make_openai_router
from chatrun.server.reload import Watchers
from chatrun.server.sessions import SessionRegistry, SessionSettings
from chatrun.server.tracecontext import TraceContext
from chatrun.server.ws import serve_websocket
from chatrun.store import SessionStore
from chatrun.store.aio import AsyncStore, open_async_store

STATIC = Path(__file__).parent / "static"


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
    """
    loaded = _load_bots(bots)
    settings = sessions or SessionSettings(cache_size=cache_size)
    auth_config = resolve_auth(auth)
    own_store = store is None  # opened here, so closed here (SQLite: no -wal/-shm left behind)
    if store is None:
        store = open_async_store(store_url, settings.lease, exclusive=True)
    registry = SessionRegistry(loaded, store, settings=settings)
    registry.metrics = metrics = ServerMetrics.create(registry)
    registry.log_content = log_content
    registry.models.warm({bot.config.route_model(r).provider for bot in loaded.values() for r in bot.config.routes})
    names = ", ".join(loaded)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if gc_tuning:
            tune_gc()
        ping = getattr(registry.store, "ping", None)
        if ping is not None:  # a shared store that cannot be reached: fail at startup, not per request
            await ping()
        sweeper = asyncio.ensure_future(registry.sweep_forever())
        watchers = Watchers(registry) if reload else None
        try:
            yield
        finally:
            sweeper.cancel()
            if watchers is not None:
                await watchers.stop()
            for bot in {id(b): b for b in (*loaded.values(), *registry.bots.values())}.values():
                await bot.tools.aclose()  # HTTP connections and MCP servers the bots' tools opened
            if own_store:
                with contextlib.suppress(Exception):
                    await registry.store.close()

    app = FastAPI(
        lifespan=lifespan,
        title=f"chatrun: {names}",
        version=__version__,
        description="Chat with declarative bots over WebSocket (Quarkus Chat Scopes frames, "
        "see docs/protocol.md) or HTTP. The web page is at `/`.",
        docs_url=None,  # served below from the package's own assets: no CDN, so it works offline
        redoc_url=None,
    )
    app.state.registry = registry
    app.state.auth = auth_config
    app.state.limits = limits
    app.state.metrics = metrics

    # Every HTTP error has the same shape: {"error": REASON, "message": TEXT}.
    @app.exception_handler(wire.RequestFailed)
    async def _failed(request: Request, exc: wire.RequestFailed) -> Any:
        return failure_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Any:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return failure_response(wire.RequestFailed(wire.BAD_REQUEST, problems))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Any:
        reason = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, wire.BAD_REQUEST)
        # exc.headers carries `Allow` on a 405.
        return JSONResponse({"error": reason, "message": f"{request.method} {request.url.path}: {exc.detail}"},
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Any:  # still the documented JSON, not text/plain
        return failure_response(wire.RequestFailed(wire.SERVER_ERROR, f"internal server error: {type(exc).__name__}"))

    @app.exception_handler(ChatrunError)
    async def _chatrun(request: Request, exc: ChatrunError) -> Any:
        return failure_response(wire.RequestFailed(wire.SERVER_ERROR, str(exc)))

    app.include_router(make_router(registry, limits, auth_config))
    app.include_router(make_openai_router(registry, limits, auth_config, openai))

    @app.websocket("/_chat/routes")
    async def chat_routes(websocket: WebSocket) -> None:
        with metrics.websocket() if metrics is not None else contextlib.nullcontext():
            await serve_websocket(websocket, registry, limits, auth_config, None)

    @app.websocket("/bots/{bot}/_chat/routes")
    async def bot_chat_routes(websocket: WebSocket, bot: str) -> None:
        with metrics.websocket() if metrics is not None else contextlib.nullcontext():
            await serve_websocket(websocket, registry, limits, auth_config, bot)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(request: Request) -> Response:
        # Protected like the API: counts and bot names are the operator's, not the public's.
        if auth_config is not None and auth_config.authenticate(token_from(request.headers, request.query_params)) is None:
            raise wire.RequestFailed(wire.UNAUTHORIZED, "unauthorized: send a valid token (Authorization: Bearer "
                                     "<token>, X-API-Key or ?token=)")
        if metrics is None:
            return JSONResponse({"error": "NotImplemented", "message": MISSING}, status_code=501)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/_chat/javascript/chatscopes.js", include_in_schema=False)
    async def chatscopes_js() -> FileResponse:
        return FileResponse(STATIC / "chatscopes.js", media_type="text/javascript")

    app.mount("/_chat/static", StaticFiles(directory=STATIC), name="static")
    _add_api_docs(app)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        return _page(next(iter(loaded)))

    @app.get("/bots/{bot}/", include_in_schema=False)
    async def bot_page(bot: str) -> HTMLResponse:
        registry.bot(bot)  # 404 for an unknown bot
        return _page(bot)

    @app.get("/bots/{bot}/chat", include_in_schema=False)
    async def bot_page_redirect(bot: str) -> RedirectResponse:
        return RedirectResponse(f"/bots/{bot}/")

    policy = edge or EdgePolicy(max_body_bytes=limits.max_frame_bytes)
    app.add_middleware(EdgeGuard, policy=policy)
    app.add_middleware(TraceContext)  # outermost: the edge's refusals are part of the caller's trace too
    app.state.edge = policy
    redact_tokens_in_logs()
    return app


def _add_api_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc over /openapi.json, their scripts and styles served from
    the fastapi-offline package (FastAPI's defaults load them from a CDN: blank offline)."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    try:
        import fastapi_offline
    except ImportError:
        assets = None
    else:
        assets = Path(fastapi_offline.__file__).parent / "static"
        app.mount("/_chat/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    def missing() -> HTMLResponse:
        return HTMLResponse("<p>The API docs need the fastapi-offline package: "
                            "<code>pip install 'chatrun[serve]'</code>. The API itself is at "
                            '<a href="/openapi.json">/openapi.json</a>.</p>', status_code=503)

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        if assets is None:
            return missing()
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} — API",
                                   swagger_js_url="/_chat/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/_chat/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/favicon.ico")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        if assets is None:
            return missing()
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} — API",
                              redoc_js_url="/_chat/docs-assets/redoc.standalone.js",
                              redoc_favicon_url="/favicon.ico", with_google_fonts=False)


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


@functools.cache
def _index_html() -> str:
    return (STATIC / "index.html").read_text()


def _page(bot: str) -> HTMLResponse:
    import html
    import json

    text = _index_html()
    # The page learns its bot from a data attribute; no templating engine needed for one value.
    text = text.replace("__CHATRUN_BOT__", html.escape(json.dumps(bot)[1:-1], quote=True))
    return HTMLResponse(text, headers={"Cache-Control": "no-cache"})


def _load_bots(bots: Any) -> dict[str, Any]:
    import chatrun

    if isinstance(bots, dict):
        items = list(bots.values())
    elif isinstance(bots, list | tuple):
        items = list(bots)
    else:
        items = [bots]
    loaded: dict[str, Any] = {}
    for item in items:
        bot = chatrun.load_bot(item) if isinstance(item, str | Path) else item
        if bot.name in loaded:
            raise ChatrunError(f"two bots are named {bot.name!r}; each bot served needs its own name")
        loaded[bot.name] = bot
    if not loaded:
        raise ChatrunError("no bot to serve; give at least one bot directory or YAML file")
    return loaded
