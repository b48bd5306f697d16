"""What the app serves besides its wire protocols: the web chat page (for end users at /chat/{bot}; for the bot's
author, with the inspector, at / and /bots/{bot}/), the operator page (/operator) and their assets, the
JavaScript client, the API docs (/docs, /redoc) and /metrics. None of it is in /openapi.json.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from chatrun.definition.catalogs import Catalogs
from chatrun.definition.page_texts import BUILTIN, page_data
from chatrun.server.metrics import CONTENT_TYPE, MISSING
from chatrun.server.plumbing import Caller, Registry, wanted_locale

STATIC = Path(__file__).parent / "static"
# The site's pages may be framed by its own pages only: a foreign site framing the chat, the
# author's page or the operator's could make its visitors' clicks land on them (clickjacking).
# The widget's panel, the one page meant for other sites' frames, names its origins instead
# (widget.py). X-Frame-Options for browsers that do not read frame-ancestors.
NOT_FRAMED = {"Content-Security-Policy": "frame-ancestors 'self'", "X-Frame-Options": "SAMEORIGIN"}


def add_site_routes(app: FastAPI) -> None:
    """The site's routes, after the wire protocols' (app.state.default_bot names the page at /)."""
    _get(app, "/metrics", prometheus_metrics)
    _get(app, "/_chat/javascript/chatscopes.js", chatscopes_js)
    app.mount("/_chat/static", StaticFiles(directory=STATIC), name="static")
    app.state.docs_assets = assets = _docs_assets()
    if assets is not None:
        app.mount("/_chat/docs-assets", StaticFiles(directory=assets), name="docs-assets")
    _get(app, "/docs", swagger_ui)
    _get(app, "/redoc", redoc)
    _get(app, "/favicon.ico", favicon)
    _get(app, "/", index)
    _get(app, "/operator", operator_page)
    _get(app, "/bots/{bot}/", bot_page)
    _get(app, "/bots/{bot}/chat", bot_page_redirect)
    _get(app, "/chat/{bot}", end_user_page)
    _get(app, "/chat/{bot}/", end_user_page_redirect)


def _get(app: FastAPI, path: str, endpoint: Callable[..., Any]) -> None:
    app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False)


async def prometheus_metrics(request: Request, who: Caller) -> Response:
    # Protected like the API (who: Caller): counts and bot names are the operator's, not the public's.
    metrics = request.app.state.metrics
    if metrics is None:
        return JSONResponse({"error": "NotImplemented", "message": MISSING}, status_code=501)
    return Response(metrics.render(), media_type=CONTENT_TYPE)


async def chatscopes_js() -> FileResponse:
    return FileResponse(STATIC / "chatscopes.js", media_type="text/javascript")


async def favicon() -> FileResponse:
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")


async def index(request: Request, registry: Registry) -> HTMLResponse:
    bot = request.app.state.default_bot
    return _page(bot, registry.bots.get(bot), request, _author_mode(request))


async def bot_page(bot: str, request: Request, registry: Registry) -> HTMLResponse:
    found = registry.bot(bot)  # 404 for an unknown bot
    return _page(bot, found, request, _author_mode(request))


async def bot_page_redirect(bot: str) -> RedirectResponse:
    return RedirectResponse(f"/bots/{bot}/")


async def end_user_page(bot: str, request: Request, registry: Registry) -> HTMLResponse:
    """The page the bot's users get: the chat alone, in the bot's words (docs/protocol.md, "The end-user page")."""
    found = registry.bot(bot)  # 404 for an unknown bot
    return _page(bot, found, request, "user")


async def end_user_page_redirect(bot: str) -> RedirectResponse:
    return RedirectResponse(f"/chat/{bot}")


def _author_mode(request: Request) -> str:
    # The author's page previews the end-user page with ?view=user.
    return "user" if request.query_params.get("view") == "user" else "author"


@functools.cache
def _index_html() -> str:
    return (STATIC / "index.html").read_text()


@functools.cache
def _operator_html() -> str:
    return (STATIC / "operator.html").read_text()


async def operator_page(request: Request, registry: Registry) -> HTMLResponse:
    # The page itself is public like the chat page; what it shows comes from GET /pending,
    # which needs the role `operators` (the page asks for a token when refused). Its own texts
    # (the inbox, the head, the composer) are in the operator's language; a conversation's cards
    # are in its own bot's texts: `bots`, those of each bot that differ from the page's.
    page = _operator_texts(registry, request.app.state.default_bot, request)
    return _with_texts(_operator_html(), page | _bots_texts(registry, page, request))


def _operator_texts(registry: Registry, default: str, request: Request) -> dict[str, object]:
    """The operator page's own texts, `lang` and `dir` in the operator's language: the one the
    browser asks for (`?locale=`, else Accept-Language) among those the page has texts in (the
    served bots' locales, the default bot's first, and chatrun's built-in ones); else the default
    bot's default. A served bot that declares that locale lends its `page.*` texts (the default
    bot's first). Not the default bot's locale only: an operator serves every bot's users."""
    first = registry.bots.get(default)
    bots = [bot for bot in (first, *registry.bots.values()) if bot is not None]
    catalogs = [bot.config.catalogs for bot in bots if bot.config.catalogs is not None]
    own = catalogs[0].locales if first is not None and first.config.catalogs is not None else ("en",)
    offered = dict.fromkeys([*own, *(locale for c in catalogs for locale in c.locales), *BUILTIN])
    locale = Catalogs(tuple(offered)).negotiate(wanted_locale(request))
    return page_data(next((c for c in catalogs if locale in c.locales), None), locale)


def _bots_texts(registry: Registry, page: dict[str, Any], request: Request) -> dict[str, Any]:
    """Each served bot's page texts in the locale of it the browser asks for: `bots`, only those
    that differ from the page's (a bot whose texts are the page's is left out); `botLangs`, the
    `lang` and `dir` of each bot whose locale is not the page's (its cards are written in it)."""
    found: dict[str, Any] = {}
    langs: dict[str, Any] = {}
    for name, bot in registry.bots.items():
        own = _texts_for(bot, request)
        texts = cast(dict[str, str], own["texts"])
        differ = {key: text for key, text in texts.items() if page["texts"].get(key) != text}
        if differ:
            found[name] = differ
        if own["lang"] != page["lang"]:
            langs[name] = {"lang": own["lang"], "dir": own["dir"]}
    return {"bots": found, "botLangs": langs}


def _page(name: str, bot: Any, request: Request, mode: str) -> HTMLResponse:
    text = _index_html().replace("__CHATRUN_MODE__", mode)
    # The page learns its bot from a data attribute; no templating engine needed for one value.
    text = text.replace("__CHATRUN_BOT__", html.escape(json.dumps(name)[1:-1], quote=True))
    # Its own texts (Send, the notices), `lang` and `dir` come with it in the locale the browser
    # asks for (docs/i18n.md, "The page"): no flash of English, no extra request. Later the
    # session's own locale (which the bot may change) replaces them.
    return _with_texts(text, _texts_for(bot, request))


def _texts_for(bot: Any, request: Request) -> dict[str, object]:
    """The page's texts, `lang` and `dir` in the bot's locale the browser asks for (`?locale=`,
    else its Accept-Language; else the bot's default)."""
    catalogs = bot.config.catalogs if bot is not None else None
    return page_data(catalogs, catalogs.negotiate(wanted_locale(request)) if catalogs is not None else None)


def _with_texts(text: str, page: dict[str, object]) -> HTMLResponse:
    text = text.replace("__CHATRUN_LANG__", html.escape(str(page["lang"]), quote=True))
    text = text.replace("__CHATRUN_DIR__", str(page["dir"]))
    text = text.replace("__CHATRUN_PAGE__", json.dumps(page, ensure_ascii=False).replace("</", "<\\/"))
    return HTMLResponse(text, headers={"Cache-Control": "no-cache", **NOT_FRAMED})


# -- the API docs: /docs (Swagger UI) and /redoc over /openapi.json ---------------------------------


def _docs_assets() -> Path | None:
    """The docs' scripts and styles, from the fastapi-offline package (FastAPI's defaults load
    them from a CDN: blank offline); None without it."""
    try:
        import fastapi_offline
    except ImportError:
        return None
    return Path(fastapi_offline.__file__).parent / "static"


def _not_framed(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(NOT_FRAMED)
    return page


def _docs_missing() -> HTMLResponse:
    return HTMLResponse("<p>The API docs need the fastapi-offline package: "
                        "<code>pip install 'chatrun[serve]'</code>. The API itself is at "
                        '<a href="/openapi.json">/openapi.json</a>.</p>', status_code=503, headers=NOT_FRAMED)


async def swagger_ui(request: Request) -> HTMLResponse:
    if request.app.state.docs_assets is None:
        return _docs_missing()
    return _not_framed(get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} — API",
                               swagger_js_url="/_chat/docs-assets/swagger-ui-bundle.js",
                               swagger_css_url="/_chat/docs-assets/swagger-ui.css",
                               swagger_favicon_url="/favicon.ico"))


async def redoc(request: Request) -> HTMLResponse:
    if request.app.state.docs_assets is None:
        return _docs_missing()
    return _not_framed(get_redoc_html(openapi_url="/openapi.json", title=f"{request.app.title} — API",
                          redoc_js_url="/_chat/docs-assets/redoc.standalone.js",
                          redoc_favicon_url="/favicon.ico", with_google_fonts=False))
