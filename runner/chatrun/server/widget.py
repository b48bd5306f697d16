"""The embeddable widget (docs/widget.md): what a host site's `<script src=".../widget.js"
data-bot="BOT">` reaches.

    GET /widget.js                   the script: a launcher (in a shadow root) and a panel (an iframe)
    GET /widget/{bot}/config         its theme, for a page on one of the bot's `widget.origins` (CORS)
    GET /widget/{bot}/frame?origin=  the panel: the chat page in widget mode, framable only by those origins
    GET /widget/{bot}/logo           the bot's `widget.logo` file

The panel is the chat page itself in an iframe served from this server: one renderer, isolated
from the host page's CSS, and its WebSocket and API requests are same-origin (the edge's Origin
check passes them as the server's own page). Where it may be shown is enforced twice: the
config is refused to a page of another origin (403 with the reason, logged; the script shows
nothing and says why in the console), and the frame carries `Content-Security-Policy:
frame-ancestors` of the declared origins, so a page that frames it directly is refused by the
browser.
"""

from __future__ import annotations

import functools
import html
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response

from chatrun.definition.config import WIDGET_LOGO_TYPES, WidgetConfig
from chatrun.definition.page_texts import page_texts
from chatrun.definition.templates import display_text
from chatrun.server.plumbing import Registry, wanted_locale
from chatrun.server.site import STATIC, _page
from chatrun.server.widget_identity import SIGNED_PREFIX, IdentityRefused, widget_principal

log = logging.getLogger("chatrun.widget")


def add_widget_routes(app: FastAPI) -> None:
    for path, endpoint in (("/widget.js", widget_js), ("/widget/{bot}/config", widget_config),
                           ("/widget/{bot}/frame", widget_frame), ("/widget/{bot}/logo", widget_logo)):
        app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False)


async def widget_js() -> FileResponse:
    # Cached for a while by browsers and proxies: it is the same for every site and bot.
    return FileResponse(STATIC / "widget.js", media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=300", "Access-Control-Allow-Origin": "*"})


def _widget_of(registry: Any, bot: str) -> tuple[Any, WidgetConfig | None]:
    found = registry.bot(bot)  # 404 BotNotFound for an unknown bot
    return found, found.config.widget


def _refusal(bot: str, widget: WidgetConfig | None, origin: str | None, where: str) -> str | None:
    """Why a page of `origin` may not show the widget of `bot` (None: it may). Logged."""
    if widget is None:
        reason = f"bot {bot!r} has no `widget:` block, so it cannot be embedded (docs/widget.md)"
    elif not origin:
        reason = f"the widget of bot {bot!r} is shown only on the pages of its `widget.origins`; this request names no origin"
    elif not widget.allows(origin):
        reason = (f"the widget of bot {bot!r} may not be embedded on {origin}: add it to `widget.origins` "
                  f"({widget.where.file}:{widget.where.line}) to allow it")
    else:
        return None
    log.warning("chatrun: widget %s refused (%s): %s", where, origin or "no origin", reason)
    return reason


async def widget_config(bot: str, request: Request, registry: Registry) -> JSONResponse:
    found, widget = _widget_of(registry, bot)
    origin = request.headers.get("origin")
    # The host page's script reads the answer, refusal included: it says why in the console.
    cors = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"} if origin else {"Vary": "Origin"}
    refused = _refusal(bot, widget, origin, "config")
    if refused is not None or widget is None:
        return JSONResponse({"error": "Forbidden", "message": refused}, status_code=403, headers=cors)
    base = str(request.base_url).rstrip("/")
    body = {
        "bot": bot,
        **_shown_texts(found, widget, request),
        "color": widget.color,
        "position": widget.position,
        "identity": widget.identity,
        "logo": _logo_url(base, bot, widget),
        "frame": f"{base}/widget/{bot}/frame",
        "texts": _launcher_texts(found, request),
    }
    return JSONResponse(body, headers={**cors, "Cache-Control": "no-cache"})


def _locale(bot: Any, request: Request) -> str | None:
    """The bot's locale the visitor's browser asks for (None: a bot without `locales:`)."""
    catalogs = bot.config.catalogs
    return catalogs.negotiate(wanted_locale(request)) if catalogs is not None else None


def _launcher_texts(bot: Any, request: Request) -> dict[str, str]:
    """The launcher's words in the visitor's language (the page's texts; a bot's `page.widget_*` replace them)."""
    texts = page_texts(bot.config.catalogs, _locale(bot, request))
    return {key: texts[f"widget_{key}"] for key in ("open", "close", "unread")}


def _shown_texts(bot: Any, widget: WidgetConfig, request: Request) -> dict[str, str]:
    """`widget.title` (the bot's `description`, else its name) and `widget.greeting` in the
    visitor's language: their `t()` rendered as a route's `title:` is (texts shown apart from any
    conversation; checks.py `display_texts` warns of a plain one)."""
    catalogs, locale = bot.config.catalogs, _locale(bot, request)
    return {"title": display_text(widget.title or bot.config.description, catalogs, locale) or bot.config.name,
            "greeting": display_text(widget.greeting, catalogs, locale)}


def _logo_url(base: str, bot: str, widget: WidgetConfig) -> str:
    if not widget.logo:
        return ""
    return f"{base}/widget/{bot}/logo" if widget.logo_is_file else widget.logo


async def widget_frame(bot: str, request: Request, registry: Registry) -> HTMLResponse:
    found, widget = _widget_of(registry, bot)
    origin = request.query_params.get("origin")
    referrer = request.headers.get("referer")
    if referrer and _origin_of(referrer) not in ((origin or "").lower().rstrip("/"), _own_origin(request)):
        origin = _origin_of(referrer)  # the page that asked for it, not the one it claims to be
    refused = _refusal(bot, widget, origin, "frame")
    if refused is None and widget is not None and widget.identity == "signed":
        refused = _unsigned(bot, widget, request.query_params.get("token"))
    if refused is not None or widget is None:
        text = f"<!doctype html><meta charset=utf-8><title>Refused</title><p role=alert>{html.escape(refused or '')}</p>"
        return HTMLResponse(text, status_code=403, headers={"Cache-Control": "no-cache"})
    # The chat page as site.py makes it (its texts in the visitor's locale), with the widget's parts added.
    page = bytes(_page(bot, found, request, "user").body).decode()  # an end user's page (h-page's modes)
    data = {**_shown_texts(found, widget, request),
            "color": widget.color, "logo": _logo_url(str(request.base_url).rstrip("/"), bot, widget),
            "origin": origin}
    page = page.replace("</head>", f"{_frame_head()}</head>", 1)
    page = page.replace("<body ", f"<body data-widget=\"{html.escape(json.dumps(data), quote=True)}\" ", 1)
    page = page.replace("</body>", '<script src="/_chat/static/widget-frame.js"></script>\n</body>', 1)
    csp = "frame-ancestors " + " ".join(widget.origins)
    return HTMLResponse(page, headers={"Cache-Control": "no-cache", "Content-Security-Policy": csp})


def _unsigned(bot: str, widget: WidgetConfig, token: str | None) -> str | None:
    """Why a frame of a `identity: signed` widget is not shown (None: its token is a good signed identity)."""
    if not token or not token.startswith(SIGNED_PREFIX):
        return "This chat is for signed-in users: sign in on this site to chat with us."
    try:
        widget_principal(bot, widget, token)
    except IdentityRefused as exc:
        log.info("chatrun: widget frame of bot %s refused a signed identity: %s", bot, exc)
        return f"This chat is for signed-in users: {exc}."
    return None


@functools.cache
def _frame_head() -> str:
    return '<link rel="stylesheet" href="/_chat/static/widget-frame.css">\n'


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def _own_origin(request: Request) -> str:
    return str(request.base_url).rstrip("/").lower()


async def widget_logo(bot: str, registry: Registry) -> Response:
    found, widget = _widget_of(registry, bot)
    if widget is None or not widget.logo_is_file:
        return JSONResponse({"error": "NotFound", "message": f"bot {bot!r} has no logo file"}, status_code=404)
    root = Path(found.config.root).resolve()
    path = (root / widget.logo).resolve()
    kind = WIDGET_LOGO_TYPES.get(path.suffix.lower())
    if kind is None or not path.is_file() or not path.is_relative_to(root):  # only the bot's own files
        return JSONResponse({"error": "NotFound", "message": f"bot {bot!r}: no logo {widget.logo!r}"}, status_code=404)
    return FileResponse(path, media_type=kind, headers={"Cache-Control": "public, max-age=300"})
