"""Optional authentication: API keys / bearer tokens mapped to a principal with roles.

The auth file (YAML), given with `--auth FILE` or the CHATRUN_AUTH_FILE environment variable:

    tokens:
      s3cret-ana: {principal: ana, roles: [staff], claims: {email: ana@example.com}}
      s3cret-bob: {principal: bob}

`principals:` gives roles and claims to principals no token names: the users of a channel
(docs/channels.md), whose names are `<channel>:<platform user id>`:

    principals:
      telegram:4242: {roles: [approvers]}
      widget:cust-42: {roles: [vip]}      # a widget's signed identity (server/widget_identity.py)

`claims:` are what templates read besides the name and roles (`principal.email`), e.g. for
bound arguments (`bind:`): text, numbers or booleans, by name.

`user` and `backend` are refused as roles: they are the engine's own audiences (the session's
user; whoever holds a backend item's token), never granted by a token (docs/security.md).

A client sends its token as `Authorization: Bearer <token>`, as `X-API-Key: <token>`, or
(for browsers' WebSockets, which cannot set headers) as `?token=<token>`.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatrun.engine.pending import BACKEND_ROLE, ENGINE_AUDIENCES, USER_ROLE
from chatrun.errors import ChatrunError

AUTH_ENV = "CHATRUN_AUTH_FILE"
WIDGET_TOKEN_PREFIXES = ("cw1.", "cwv.")  # signed identities and anonymous visitors (server/widget_identity.py)
# The names of the widget's signed identities (`widget:ID`, server/widget_identity.py): no token of
# the auth file is one of them, so a widget visitor and another door's principal never share a name.
WIDGET_PRINCIPAL_PREFIX = "widget:"


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[str] = field(default_factory=frozenset)
    claims: tuple[tuple[str, Any], ...] = ()  # (name, value) pairs: hashable, like the rest

    def as_template(self) -> dict[str, Any]:
        """The principal as templates see it (`principal.name`, `.roles`, `.email`, ...)."""
        return {**dict(self.claims), "name": self.name, "roles": sorted(self.roles)}


def template_principal(principal: Principal | None) -> dict[str, Any] | None:
    """What a session's templates see of a request's principal (None: anonymous)."""
    return principal.as_template() if principal is not None else None


ANONYMOUS = None  # with auth off every request is anonymous: no owner, no role checks


@dataclass
class Auth:
    tokens: dict[str, Principal]
    source: str = ""
    principals: dict[str, Principal] = field(default_factory=dict)  # `principals:`: by name

    def principal(self, name: str, claims: tuple[tuple[str, Any], ...] = ()) -> Principal:
        """A principal the server names itself (a channel's user): the roles and claims the
        auth file's `principals:` gives that name, over `claims`."""
        known = self.principals.get(name)
        if known is None:
            return Principal(name, claims=claims)
        return Principal(name, known.roles, tuple({**dict(claims), **dict(known.claims)}.items()))

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal of a token, or None. Compares in constant time."""
        if not token:
            return None
        found = None
        for known, principal in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found

    @classmethod
    def load(cls, path: str | Path) -> Auth:
        from chatrun.definition.yamlpos import load_yaml

        path = Path(path)
        try:
            raw = path.read_bytes()  # once: `--auth <(...)` is a pipe
            text = raw.decode("utf-8")
        except OSError as exc:
            raise ChatrunError(f"cannot read the auth file {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise ChatrunError(f"{path}:{line}: the auth file is not UTF-8 text (byte {raw[exc.start]:#04x}); "
                               "save it as UTF-8") from None
        # Read as a bot's files are: a syntax error or a duplicate key (a token given twice) is
        # `file:line:col:` and one line, not PyYAML's several.
        doc = load_yaml(text, str(path))
        errors = [d for d in doc.diagnostics if d.severity == "error"]
        if errors:
            first = errors[0]
            message = ("a token is given twice (the keys of `tokens:` are the tokens: keep one entry)"
                       if first.path.startswith("tokens.") and first.message.startswith("duplicate key")
                       else first.message)  # a token is a secret: not printed, not even in an error
            raise ChatrunError(f"{first.file}:{first.line}:{first.col}: the auth file is not valid: {message}")
        return cls.from_mapping(doc.data, str(path))

    @classmethod
    def from_mapping(cls, raw: object, source: str = "<auth>") -> Auth:
        if isinstance(raw, dict) and raw.get("principals") is not None and not raw.get("tokens"):
            raw = {**raw, "tokens": {}}  # channels' users only: no token opens the HTTP API
        elif not isinstance(raw, dict) or not isinstance(raw.get("tokens"), dict) or not raw["tokens"]:
            raise ChatrunError(
                f"{source}: the auth file needs a `tokens:` mapping, e.g. "
                "tokens: {my-secret: {principal: ana, roles: [staff]}}"
            )
        tokens: dict[str, Principal] = {}
        for token, entry in raw["tokens"].items():
            where = f"{source}: tokens.{str(token)[:4]}…"
            if not isinstance(token, str) or len(token) < 8:
                raise ChatrunError(f"{where}: a token is a string of at least 8 characters")
            if token.startswith(WIDGET_TOKEN_PREFIXES):
                raise ChatrunError(f"{where}: a token may not start with {' or '.join(WIDGET_TOKEN_PREFIXES)}: those are "
                                   "the widget's tokens (docs/widget.md); choose another token")
            if isinstance(entry, str):
                entry = {"principal": entry}
            if not isinstance(entry, dict) or not isinstance(entry.get("principal"), str):
                raise ChatrunError(f"{where}: each token maps to {{principal: NAME, roles: [ROLE, ...]}}")
            roles = entry.get("roles") or []
            if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
                raise ChatrunError(f"{where}: roles is a list of role names")
            _refuse_engine_audiences(where, entry["principal"], roles)
            if entry["principal"].startswith(WIDGET_PRINCIPAL_PREFIX):
                raise ChatrunError(f"{where}: a token's principal may not be named {WIDGET_PRINCIPAL_PREFIX}…: those are "
                                   "the widget's signed identities (docs/widget.md); give such a visitor roles "
                                   f"under `principals:` ({WIDGET_PRINCIPAL_PREFIX}ID: {{roles: [...]}})")
            tokens[token] = Principal(entry["principal"], frozenset(roles), _claims(entry.get("claims"), where))
        return cls(tokens, source, _principals(raw.get("principals"), source))


def _principals(raw: object, source: str) -> dict[str, Principal]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ChatrunError(f"{source}: `principals:` maps a principal's name to {{roles: [ROLE, ...], claims: {{...}}}}")
    out: dict[str, Principal] = {}
    for name, entry in raw.items():
        where = f"{source}: principals.{name}"
        entry = entry if entry is not None else {}
        roles = entry.get("roles") or [] if isinstance(entry, dict) else None
        if not isinstance(name, str) or roles is None or not isinstance(roles, list) \
                or not all(isinstance(r, str) for r in roles):
            raise ChatrunError(f"{where}: each principal maps to {{roles: [ROLE, ...], claims: {{...}}}}")
        _refuse_engine_audiences(where, name, roles)
        out[name] = Principal(name, frozenset(roles), _claims(entry.get("claims"), where))
    return out


class AuthFileWarning(UserWarning):
    """An auth file's entry that gives nothing to anyone (shown as one line by the CLI)."""


_RESERVED_CLAIMS = ("name", "roles")

# Why a token may not grant the engine's own audiences (engine/pending.py ENGINE_AUDIENCES), and
# what to give instead: a role named `user` would let its holder decide every user's approvals,
# one named `backend` would answer backend questions without their item's token.
_ENGINE_AUDIENCE_USE = {
    USER_ROLE: ("`user` in a `by:` is the session's own user (its owner, or whoever caused the call), "
                "which chatrun works out for each item; a principal who should decide other people's "
                "approvals needs a role of your own (e.g. `approvers`) named in the tool's `approval: by:`, "
                "and a principal who only chats needs no role at all"),
    BACKEND_ROLE: ("`backend` is whoever holds a backend question's item token (the one the bot's sinks "
                   "receive); a backend answers with `Authorization: Bearer <the item token>` and needs no "
                   "entry here; a person who answers questions needs `operators` (questions `from: operator`)"),
}


def _refuse_engine_audiences(where: str, principal: str, roles: list[str]) -> None:
    for role in roles:
        if role in ENGINE_AUDIENCES:
            raise ChatrunError(f"{where}: principal {principal!r} has the role `{role}`, which no token may "
                               f"grant: {_ENGINE_AUDIENCE_USE[role]}. Remove `{role}` from its roles.")


def _claims(raw: object, where: str) -> tuple[tuple[str, Any], ...]:
    """A token's `claims:`: NAME -> text, number or boolean (templates read `principal.NAME`)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ChatrunError(f"{where}: claims is a mapping, e.g. claims: {{email: ana@example.com}}")
    for name, value in raw.items():
        if not isinstance(name, str) or name in _RESERVED_CLAIMS:
            raise ChatrunError(f"{where}: claim {name!r}: a claim is named by text other than "
                               f"{' and '.join(_RESERVED_CLAIMS)} (those are the principal's own)")
        if not isinstance(value, (str, int, float, bool)):
            raise ChatrunError(f"{where}: claim `{name}` must be text, a number or a boolean")
    return tuple(sorted(raw.items()))


def resolve_auth(auth: Auth | str | Path | None) -> Auth | None:
    """The auth to use: the one given, a file path, else $CHATRUN_AUTH_FILE, else none (auth off)."""
    if isinstance(auth, Auth):
        return auth
    if auth:
        return Auth.load(auth)
    env = os.environ.get(AUTH_ENV)
    return Auth.load(env) if env else None


# Where a request may carry a token: these headers, or this query parameter. A request with none
# of them carries no token (server/plumbing.py answers it without reading further).
AUTHORIZATION, API_KEY = TOKEN_HEADERS = ("authorization", "x-api-key")
TOKEN_QUERY = "token"


def token_from(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The token a request carries: Authorization: Bearer, X-API-Key, or ?token=.
    `headers` and `query` are starlette's Headers and QueryParams, both read-only mappings."""
    get_h = headers.get
    value = get_h(AUTHORIZATION)
    if value and value.lower().startswith("bearer "):
        return value[7:].strip()
    key = get_h(API_KEY)
    if key:
        return key.strip()
    return query.get(TOKEN_QUERY) or None
