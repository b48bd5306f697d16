"""Who a widget's visitor is (docs/widget.md, "Who the visitor is").

Two kinds of token reach a bot with `widget:` from its frame, both as any other token
(`?token=`, `Authorization: Bearer`), and only for that bot's own paths (`/bots/{bot}/...`):

- a **signed identity** `cw1.PAYLOAD.SIGNATURE` the host site's backend makes for its signed-in
  user: PAYLOAD is base64url JSON `{"sub": ID, "name": NAME, "exp": UNIX_SECONDS}`, SIGNATURE the
  base64url HMAC-SHA256 of `cw1.PAYLOAD` under the key in the bot's `widget.secret_env`. It
  becomes the principal `widget:ID` — a name of the widget's own, so that a host site's user id
  `olga` or `telegram:4242` never is the auth file's olga or a channel's user (their sessions,
  user memory, roles) — with the claims `sub` (ID) and `display_name` (NAME).
- an **anonymous visitor** `cwv.RANDOM` the widget makes once per browser (kept in the host
  page's localStorage): the principal `visitor-` + a hash of it, so that the visitor's sessions
  are theirs alone, and nobody learns the token from the name.

Checked before the `--auth` file: a widget token is never an auth-file token, and it grants no
roles by itself (the auth file's `principals:` may give roles to a `widget:ID`, as to a channel's
user: server/plumbing.py); it is good only for the bot whose `widget:` accepts it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import time
from typing import Any

from chatrun.definition.config import WidgetConfig
from chatrun.server.auth import WIDGET_PRINCIPAL_PREFIX, WIDGET_TOKEN_PREFIXES, Principal

SIGNED_PREFIX, VISITOR_PREFIX = WIDGET_TOKEN_PREFIXES
MIN_KEY_BYTES = 16
MIN_VISITOR_CHARS = 22  # 128 bits of base64url: not guessable
# Signed identities are named `widget:ID` (WIDGET_PRINCIPAL_PREFIX); anonymous visitors stay
# `visitor-HASH`, outside it, so a signed `sub` of `visitor-HASH` is not that visitor either.
log = logging.getLogger("chatrun.widget")


class IdentityRefused(Exception):
    """A widget token this bot does not accept; the message says why and what to do."""


def is_widget_token(token: str | None) -> bool:
    return token is not None and token.startswith(WIDGET_TOKEN_PREFIXES)


def widget_principal(bot: str, widget: WidgetConfig | None, token: str, now: float | None = None) -> Principal:
    """The principal of a widget token for `bot`, or IdentityRefused."""
    if widget is None:
        raise IdentityRefused(f"bot {bot!r} has no `widget:`, so it takes no widget token")
    if token.startswith(VISITOR_PREFIX):
        return _visitor(bot, widget, token)
    return _signed(bot, widget, token, time.time() if now is None else now)


def _visitor(bot: str, widget: WidgetConfig, token: str) -> Principal:
    if widget.identity == "signed":
        raise IdentityRefused(f"bot {bot!r} takes signed identities only (`widget.identity: signed`): "
                              "the host page must hand over a token its backend signed")
    if len(token) - len(VISITOR_PREFIX) < MIN_VISITOR_CHARS:
        raise IdentityRefused("a visitor token needs at least 22 random characters after `cwv.`")
    digest = hashlib.sha256(token.encode()).hexdigest()[:24]
    return Principal(f"visitor-{digest}", claims=(("anonymous", True),))


def _signed(bot: str, widget: WidgetConfig, token: str, now: float) -> Principal:
    if widget.identity == "anonymous":
        raise IdentityRefused(f"bot {bot!r} takes anonymous visitors only (`widget.identity: anonymous`)")
    key = os.environ.get(widget.secret_env, "").encode()
    if len(key) < MIN_KEY_BYTES:
        log.warning("chatrun: widget of bot %s: a signed identity arrived, but $%s is %s; refused", bot,
                    widget.secret_env, "too short (under 16 bytes)" if key else "not set")
        raise IdentityRefused(f"this server cannot check signed identities for bot {bot!r}: "
                              f"${widget.secret_env} is not set")
    payload = _verified_payload(token, key)
    claims = _claims(payload, now)
    return Principal(WIDGET_PRINCIPAL_PREFIX + claims["sub"],
                     claims=(("display_name", claims["name"]), ("sub", claims["sub"])))


def _verified_payload(token: str, key: bytes) -> bytes:
    parts = token.split(".")
    if len(parts) != 3:
        raise IdentityRefused("a signed identity is cw1.PAYLOAD.SIGNATURE (docs/widget.md)")
    expected = hmac.new(key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(expected, _unbase64(parts[2])):
        raise IdentityRefused("the signed identity's signature does not match: sign `cw1.PAYLOAD` with HMAC-SHA256 "
                              "under the key in the server's widget secret (docs/widget.md)")
    return _unbase64(parts[1])


def _claims(payload: bytes, now: float) -> dict[str, Any]:
    try:
        claims = json.loads(payload)
    except ValueError:
        claims = None
    if not isinstance(claims, dict) or not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise IdentityRefused('a signed identity\'s payload is JSON {"sub": ID, "name": NAME, "exp": UNIX_SECONDS}')
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        raise IdentityRefused("a signed identity needs `exp`, its expiry in Unix seconds")
    if exp <= now:
        raise IdentityRefused(f"the signed identity of {claims['sub']!r} expired {int(now - exp)} s ago: "
                              "the host page must fetch a fresh one from its backend")
    name = claims.get("name")
    return {"sub": claims["sub"], "name": name if isinstance(name, str) and name else claims["sub"]}


def _unbase64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return b""


def sign_identity(key: bytes, sub: str, name: str, exp: int) -> str:
    """A signed identity, as a host site's backend makes it (for tests; docs/widget.md has the same in 10 lines)."""
    payload = base64.urlsafe_b64encode(json.dumps({"sub": sub, "name": name, "exp": exp}).encode()).rstrip(b"=")
    signing = SIGNED_PREFIX.encode() + payload
    signature = base64.urlsafe_b64encode(hmac.new(key, signing, hashlib.sha256).digest()).rstrip(b"=")
    return (signing + b"." + signature).decode()
