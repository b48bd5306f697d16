"""Microsoft Teams (the Bot Framework's Bot Connector): each activity comes with a JWT in the
Authorization header, signed by the Bot Framework, whose keys are listed by its OpenID
metadata; the token must be for this bot (`aud` = the app id), from the Bot Framework
(`iss` https://api.botframework.com) and name the activity's `serviceUrl` (a token without
that claim is refused: a forged activity cannot send replies, nor the bot's token, elsewhere).
`message` activities are the user's texts, or the `value` of an Adaptive Card's Action.Submit
(a button press). Replies are POSTed to the activity's
serviceUrl with a token the bot gets from Microsoft Entra ID (client credentials), as Adaptive
Cards when they carry buttons.

A user's files come as the activity's `attachments`: a file sent in a personal chat is a
`application/vnd.microsoft.teams.file.download.info` attachment whose `downloadUrl` is
pre-authorised (fetched without a token); an image pasted into the message has a
`contentUrl` on the Bot Connector's host, fetched with the bot's token (the token goes only to
the origin of the activity's `serviceUrl`, which the verified JWT names). Any other file URL is
fetched only over https from a host name (`_public_https`): never plain http nor an address.
The message's own HTML (`text/html`) and cards are not files.

The checks are the ones botbuilder's JwtTokenValidation makes, done with PyJWT (its own
dependency) instead of the botbuilder packages, which would bring aiohttp and msal to every
server. A conversation is Teams' conversation id for a personal chat, and that id and the
sender in a group chat or a channel's thread (each member has their own, owner-only session;
the bot answers in the chat or thread); the principal is `teams:<aadObjectId>` (the user's Entra ID object id, else their channel id);
the delivery is the activity's `id`."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import mimetypes
import time
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from chatrun.server.channels.base import (
    MAX_DELIVERY_AGE,
    ChannelKind,
    FetchFailed,
    Inbound,
    InboundFile,
    Outgoing,
    SendFailed,
    Unauthorized,
    Unreachable,
    media_type_of,
)

OPENID = "https://login.botframework.com/v1/.well-known/openidconfiguration"
TOKEN_URL = "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"
ISSUER = "https://api.botframework.com"
SCOPE = "https://api.botframework.com/.default"
FILE_INFO = "application/vnd.microsoft.teams.file.download.info"  # a file sent in a personal chat
LEEWAY = 300  # seconds of clock skew the Bot Framework allows
MAX_TEXT_BYTES = 25000  # a message's text as sent (see Teams.max_text)


class Teams(ChannelKind):
    kind = "teams"
    # The Bot Connector refuses an activity over about 28 KB: a message's text is held to 25,000
    # bytes as sent (JSON-escaped, UTF-8), the rest of the activity fits in what is left.
    max_text = MAX_TEXT_BYTES

    def text_size(self, text: str) -> int:
        return len(json.dumps(text).encode()) - 2  # (without the quotes)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._keys: Any = None  # jwt.PyJWKClient over the OpenID metadata's jwks_uri (it caches the keys)
        self._token: tuple[str, float] = ("", 0.0)  # the bot's access token and when it expires
        self._read: tuple[bytes, Any] = (b"", None)  # the last verified body and its payload

    @classmethod
    def missing(cls) -> str | None:
        try:
            import jwt  # noqa: F401
            from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: F401
        except ImportError:
            return "the Teams channel needs PyJWT with cryptography: pip install 'chatrun[channels]'"
        return None

    async def averify(self, headers: Mapping[str, str], body: bytes) -> None:
        await asyncio.to_thread(self.verify, headers, body)  # the first check fetches the signing keys

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        import jwt

        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("teams: no Bot Framework token (Authorization: Bearer)")
        keys = self._signing_keys()  # Unreachable: the metadata cannot be read (503, retried)
        try:
            key = keys.get_signing_key_from_jwt(token)
        except (jwt.PyJWKClientConnectionError, OSError) as exc:  # the keys' endpoint, not the token: 503
            raise Unreachable(f"teams: the Bot Framework's signing keys at {_shown(keys.uri)} cannot be "
                              f"fetched ({exc})") from None
        except jwt.PyJWTError as exc:  # no key of the token's `kid` (after fetching them again): forged
            raise Unauthorized(f"teams: the Bot Framework token is not valid ({type(exc).__name__}: {exc})") from None
        try:
            claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=self.secret("app_id"),
                                issuer=ISSUER, leeway=LEEWAY, options={"require": ["exp", "iss", "aud"]})
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"teams: the Bot Framework token is not valid ({type(exc).__name__}: {exc})") from None
        if float(claims["exp"]) > time.time() + MAX_DELIVERY_AGE - LEEWAY:
            # A replay once an erasure's marks are gone (24 h) must find its token expired.
            raise Unauthorized(f"teams: the Bot Framework token is valid for over {MAX_DELIVERY_AGE // 3600} h "
                               "(its exp): a replay of its activity would outlive the replay window")
        try:
            payload = json.loads(body)
            self._read = (body, payload)  # `read` takes it: the body is parsed once
            service_url = payload.get("serviceUrl")
        except (ValueError, AttributeError):
            service_url = None
        # Required, as botbuilder's channel validation requires it: a token naming no serviceUrl,
        # replayed with another activity, would send its replies (and the bot's token) anywhere.
        if not claims.get("serviceurl"):
            raise Unauthorized("teams: the Bot Framework token names no serviceurl")
        if claims["serviceurl"] != service_url:
            raise Unauthorized("teams: the token's serviceurl is not the activity's serviceUrl")

    def read(self, body: bytes, headers: Mapping[str, str]) -> Any:
        read = self._read  # (one tuple: a delivery verified meanwhile on another thread replaces it whole)
        return read[1] if read[0] is body else super().read(body, headers)

    def _signing_keys(self) -> Any:
        import jwt

        if self._keys is None:
            url = self.option("openid", OPENID)
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as answer:  # noqa: S310 - the bot's own setting
                    jwks_uri = json.load(answer)["jwks_uri"]
            except (OSError, ValueError, LookupError, TypeError) as exc:  # down, refusing, or not the metadata
                raise Unreachable(f"teams: the Bot Framework's OpenID metadata at {_shown(url)} cannot be read "
                                  f"({type(exc).__name__}: {exc})") from None
            self._keys = jwt.PyJWKClient(str(jwks_uri), cache_keys=True, lifespan=86400)
        return self._keys

    def inbound(self, payload: Any) -> list[Inbound]:
        if isinstance(payload, dict) and payload.get("type") == "messageUpdate" \
                and (payload.get("channelData") or {}).get("eventType") == "editMessage":
            return _edit(payload)
        if not isinstance(payload, dict) or payload.get("type") != "message":
            return []
        value, text = payload.get("value"), payload.get("text")
        choice = value.get("choice") if isinstance(value, dict) else None
        pressed = isinstance(choice, str)
        if pressed:
            text = choice  # an Adaptive Card's button
        text = text.strip() if isinstance(text, str) else ""
        files = _files(payload.get("attachments"), str(payload.get("serviceUrl") or ""))
        if not text and not files:
            return []
        user, key, address = _who(payload)
        return [Inbound(payload.get("id") or "", key, user, text, address,
                        str((payload.get("from") or {}).get("name") or ""), payload.get("locale"), files=files,
                        pressed=pressed)]

    async def fetch(self, client: httpx.AsyncClient, file: InboundFile, limit: int) -> bytes:
        """A file's bytes: a Bot Connector URL with the bot's token, a downloadUrl as it is."""
        if not (file.bearer or _public_https(file.ref)):  # (a bearer URL is on the serviceUrl's origin)
            raise FetchFailed(f"teams: a file URL neither on the Bot Connector nor https to a host name: {file.ref[:80]}")
        headers = None
        if file.bearer:
            try:
                headers = {"Authorization": f"Bearer {await self._access_token(client)}"}
            except SendFailed as exc:
                raise FetchFailed(str(exc)) from None
        return await self.download(client, file.ref, limit, "attachment", headers)

    async def send(self, client: httpx.AsyncClient, address: dict[str, Any], message: Outgoing) -> None:
        activity: dict[str, Any] = {"type": "message", "text": message.text, "replyToId": address.get("reply_to")}
        if address.get("bot"):
            activity["from"] = address["bot"]
        if message.buttons:
            activity["attachments"] = [_card(message)]
            activity.pop("text")
        url = f"{str(address['service_url']).rstrip('/')}/v3/conversations/{address['conversation']}/activities"
        token = await self._access_token(client)
        response = await self.call(client, "POST", url, "teams", "the Bot Connector", json=activity,
                                   headers={"Authorization": f"Bearer {token}"})
        if response.status_code not in (200, 201, 202):
            if response.status_code == 401:
                self._token = ("", 0.0)
            raise SendFailed.answered(f"teams: the Bot Connector answered {response.status_code}: "
                                      f"{response.text[:200]}", response)

    async def _access_token(self, client: httpx.AsyncClient) -> str:
        token, expires = self._token
        if token and time.time() < expires - 60:
            return token
        form = {"grant_type": "client_credentials", "client_id": self.secret("app_id"),
                "client_secret": self.secret("app_password"), "scope": SCOPE}
        response = await self.call(client, "POST", self.option("token_url", TOKEN_URL), "teams: the bot's token",
                                   "Entra ID", data=form)
        try:
            answer = response.json()
        except ValueError as exc:
            raise SendFailed(f"teams: cannot get the bot's token from Entra ID ({type(exc).__name__})") from None
        if response.status_code != 200 or "access_token" not in answer:
            raise SendFailed(f"teams: Entra ID refused the bot's credentials ({response.status_code}: "
                             f"{answer.get('error', '')})", response.status_code)
        self._token = (str(answer["access_token"]), time.time() + float(answer.get("expires_in", 3600)))
        return self._token[0]


def _files(attachments: Any, service_url: str) -> tuple[InboundFile, ...]:
    """The files among an activity's attachments (see the module); the token goes only with a
    contentUrl on the serviceUrl's origin."""
    origin = _origin(service_url)
    files = []
    for item in attachments if isinstance(attachments, list) else ():
        if not isinstance(item, dict):
            continue
        kind, content, name = str(item.get("contentType") or ""), item.get("content"), str(item.get("name") or "")
        if kind == FILE_INFO and isinstance(content, dict) and isinstance(content.get("downloadUrl"), str):
            guessed = mimetypes.guess_type(name or f"file.{content.get('fileType', '')}")[0]
            files.append(InboundFile(content["downloadUrl"], media_type_of(guessed), name))
        elif isinstance(item.get("contentUrl"), str) and kind and not kind.startswith(("text/html", "application/vnd.")):
            url = item["contentUrl"]
            if kind.endswith("/*"):  # an image pasted into the message is `image/*`: its name says more
                kind = mimetypes.guess_type(name)[0] or kind.replace("*", "png")
            files.append(InboundFile(url, media_type_of(kind), name, bearer=bool(origin) and _origin(url) == origin))
    return tuple(files)


def _public_https(url: str) -> bool:
    """Whether a file URL off the Bot Connector may be fetched: https to a host name (Teams' are
    SharePoint's), never plain http nor an address, where the server's own network answers (a
    cloud's metadata endpoint, a local admin port) and its bytes would reach the model."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme != "https" or not host or host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def _shown(url: str) -> str:
    """An endpoint as the log names it: no query (it might carry a key)."""
    return url.split("?", 1)[0]


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else ""


def _card(message: Outgoing) -> dict[str, Any]:
    """An Adaptive Card: the text, and an Action.Submit per button (its data: the value)."""
    return {"contentType": "application/vnd.microsoft.card.adaptive", "content": {
        "type": "AdaptiveCard", "$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "version": "1.4",
        "body": [{"type": "TextBlock", "text": message.text, "wrap": True}],
        "actions": [{"type": "Action.Submit", "title": label, "data": {"choice": value}}
                    for label, value in message.buttons]}}


def _who(payload: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """An activity's sender, conversation key and reply address: a group chat or a channel's
    thread is one conversation per member."""
    sender, conversation = payload.get("from") or {}, payload.get("conversation") or {}
    user = str(sender.get("aadObjectId") or sender.get("id"))
    address = {"service_url": payload.get("serviceUrl"), "conversation": conversation.get("id"),
               "reply_to": payload.get("id"), "bot": payload.get("recipient")}
    key = str(conversation.get("id"))
    if conversation.get("isGroup") or conversation.get("conversationType") in ("groupChat", "channel"):
        key = f"{key}:{user}"
    return user, key, address


def _edit(payload: dict[str, Any]) -> list[Inbound]:
    """A `messageUpdate` activity of a person's edit (`channelData.eventType` editMessage): an
    Inbound `edited`, its delivery the edited message's id (the activity's), so each edited
    message is told once, however often it is edited or the activity sent again."""
    if not payload.get("id"):
        return []
    user, key, address = _who(payload)
    text = payload.get("text")
    return [Inbound(f"{payload['id']}:edited", key, user, text.strip() if isinstance(text, str) else "", address,
                    str((payload.get("from") or {}).get("name") or ""), payload.get("locale"), edited=True)]
