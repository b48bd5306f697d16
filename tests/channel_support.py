"""Local fakes of the messaging platforms' APIs for the channel tests (no tests here): real
HTTP servers on 127.0.0.1 in a thread, built from the payloads of each platform's public
documentation, recording every call and answering with the status a test sets."""

from __future__ import annotations

import json
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs


def write_body(handler: BaseHTTPRequestHandler, data: bytes, trickle: float, pad: int = 0) -> None:
    """An answer's body (its headers sent): at once, or, as a platform answering too slowly
    (`trickle` > 0), a byte every `trickle` seconds; `pad` spaces after it (a huge answer, which
    the Content-Length the caller sent must count)."""
    try:
        if not trickle:
            handler.wfile.write(data + b" " * pad)
            return
        for byte in data:
            time.sleep(trickle)
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
    except OSError:  # the client hung up (it gave up on the answer): nothing more to write
        pass


@dataclass
class ApiCall:
    path: str
    body: dict[str, Any]
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    refused: bool = False  # refused in a 200 (Slack's {"ok": false})


class _FakeApi:
    """A platform's Web API on 127.0.0.1: records every POST (JSON or form body) as an ApiCall
    and answers `answer(call)`'s (status, JSON) pair."""

    def __init__(self) -> None:
        self.status = 200
        self.answer_headers: dict[str, str] = {}  # sent with every answer not 200 (Slack's Retry-After)
        self.trickle = 0.0  # seconds between two bytes of an answer's body (0: at once)
        self.delay = 0.0  # seconds a POST waits before it is answered (a slow platform)
        self.pad = 0  # spaces after an answer's JSON (a huge answer)
        self.seen: list[ApiCall] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                call = ApiCall(self.path, json.loads(raw or b"{}"), 0)
                call.headers = {k.lower(): v for k, v in self.headers.items()}
                time.sleep(fake.delay)
                status, body = fake.answer(call)
                call.status = status
                with fake._lock:
                    fake.seen.append(call)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data) + fake.pad))
                for name, value in fake.answer_headers.items() if status != 200 else ():
                    self.send_header(name, value)
                self.end_headers()
                write_body(self, data, fake.trickle, fake.pad)

            def do_GET(self) -> None:  # noqa: N802 - a GET: a file's bytes, or what `got` answers
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, body, content_type = fake.got(self.path, headers)
                if not self.path.startswith("/api/"):  # a Web API method (Slack's users.info) is no download
                    with fake._lock:
                        fake.downloads.append((self.path, headers.get("authorization", "")))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.files: dict[str, bytes] = {}  # GET path -> bytes, served with the platform's token only
        self.downloads: list[tuple[str, str]] = []  # (path, Authorization) of every GET
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, call: ApiCall) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def got(self, path: str, headers: dict[str, str]) -> tuple[int, bytes, str]:
        """A GET's answer: a file of `files` to the bearer of the platform's token, else 404/401."""
        if headers.get("authorization") != f"Bearer {getattr(self, 'token', '')}":
            return 401, b'{"error": "not_authed"}', "application/json"
        path = path.split("?", 1)[0]
        if path not in self.files:
            return 404, b"Not Found", "text/plain"
        return 200, self.files[path], "application/octet-stream"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):  # noqa: ANN204
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def calls(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [c.body for c in self.seen if c.status == 200 and not c.refused and c.path.endswith(f"/{method}")]


class FakeSlack(_FakeApi):
    """Slack's Web API under /api: chat.postMessage with `Authorization: Bearer <bot token>`,
    answered as Slack does: HTTP 200 with {"ok": true, "ts": ...}, or {"ok": false, "error"}
    (invalid_auth for another token); `status` other than 200 answers that status."""

    def __init__(self, token: str):
        super().__init__()
        self.token = token
        # users.info's users: id -> display name ({} answers user_not_found, None missing_scope)
        self.users: dict[str, str] | None = {}
        self.lookups: list[str] = []  # the user of every users.info call
        self.locales: dict[str, str] = {}  # users.info's `locale` of a user (given with include_locale=true)

    def got(self, path: str, headers: dict[str, str]) -> tuple[int, bytes, str]:
        """GET /api/users.info?user=ID as Slack answers it (recorded in `lookups`), else a file."""
        method, _, query = path.partition("?")
        if not method.endswith("/users.info"):
            return super().got(path, headers)
        asked = parse_qs(query)
        user = asked.get("user", [""])[0]
        with self._lock:
            self.lookups.append(user)
        if headers.get("authorization") != f"Bearer {self.token}":
            answer: dict[str, Any] = {"ok": False, "error": "invalid_auth"}
        elif self.users is None:
            answer = {"ok": False, "error": "missing_scope", "needed": "users:read"}
        elif user not in self.users:
            answer = {"ok": False, "error": "user_not_found"}
        else:
            name = self.users[user]
            answer = {"ok": True, "user": {"id": user, "name": name.lower().split()[0], "real_name": name,
                                           "profile": {"display_name": name, "real_name": name}}}
            if asked.get("include_locale") == ["true"] and user in self.locales:
                answer["user"]["locale"] = self.locales[user]
        return 200, json.dumps(answer).encode(), "application/json"

    def answer(self, call: ApiCall) -> tuple[int, dict[str, Any]]:
        if self.status != 200:
            return self.status, {"ok": False, "error": "service_unavailable"}
        if call.headers.get("authorization") != f"Bearer {self.token}":
            call.status = 401  # recorded as refused
            return 200, {"ok": False, "error": "invalid_auth"}
        # Slack's limits: a message's text, a section block's text (where buttons go)
        sections = [b["text"]["text"] for b in call.body.get("blocks") or () if b.get("type") == "section"]
        if len(call.body.get("text") or "") > 40000 or any(len(text) > 3000 for text in sections):
            call.refused = True
            return 200, {"ok": False, "error": "msg_too_long" if not sections else "invalid_blocks"}
        return 200, {"ok": True, "channel": call.body.get("channel"), "ts": f"{1764950400 + len(self.seen)}.000100"}

    def calls(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [c.body for c in self.seen if c.path.endswith(f"/{method}") and not c.refused and c.status == 200
                    and c.headers.get("authorization") == f"Bearer {self.token}" and self.status == 200]


def slack_signed(secret: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The headers Slack signs a request with, computed by slack_sdk's own SignatureVerifier."""
    from slack_sdk.signature import SignatureVerifier

    signature = SignatureVerifier(secret).generate_signature(timestamp=str(timestamp), body=body)
    return {"X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": signature}


def slack_message(event_id: str, text: str, user: str = "U42", channel: str = "D42", ts: str | None = None,
                  thread_ts: str | None = None, kind: str = "message") -> dict[str, Any]:
    """An Events API event_callback with a message (a direct message by default), as Slack documents it.
    Each message has its own `ts` (by default one derived from the event_id: a retry of the event
    carries the same, as Slack's do)."""
    ts = ts or f"1764950400.{zlib.crc32(event_id.encode()) % 1000000:06d}"
    event = {"type": kind, "user": user, "text": text, "ts": ts, "channel": channel,
             "channel_type": "im" if channel.startswith("D") else "channel", "event_ts": ts}
    if thread_ts:
        event["thread_ts"] = thread_ts
    return {"token": "verification-token-unused", "team_id": "T1", "api_app_id": "A1", "event": event,
            "type": "event_callback", "event_id": event_id, "event_time": 1764950400,
            "authorizations": [{"enterprise_id": None, "team_id": "T1", "user_id": "B1", "is_bot": True,
                                "is_enterprise_install": False}]}  # the bot's user: `<@B1>` mentions it


def slack_edit(event_id: str, edited: dict[str, Any], text: str, edit_ts: str = "1764950460.000100") -> dict[str, Any]:
    """The `message_changed` event Slack sends when a person edits the message of `edited` (a
    delivery of slack_message), as its Events API documents it: the message as it now is, with
    its `edited` user and ts, and the message before."""
    before = edited["event"]
    message = {**{k: before[k] for k in ("type", "user", "text", "ts") if k in before}, "text": text,
               "edited": {"user": before["user"], "ts": edit_ts}}
    if before.get("thread_ts"):
        message["thread_ts"] = before["thread_ts"]
    event = {"type": "message", "subtype": "message_changed", "hidden": True, "channel": before["channel"],
             "channel_type": before["channel_type"], "message": message, "previous_message": dict(before),
             "ts": edit_ts, "event_ts": edit_ts}
    return {**edited, "event": event, "event_id": event_id}


def slack_file_share(event_id: str, text: str, url: str, mimetype: str = "image/png", size: int = 100,
                     user: str = "U42", channel: str = "D42") -> dict[str, Any]:
    """A message event with a file shared (subtype file_share), its file read from url_private."""
    delivery = slack_message(event_id, text, user=user, channel=channel)
    delivery["event"] |= {"subtype": "file_share", "files": [{
        "id": "F1", "name": "photo.png", "mimetype": mimetype, "filetype": "png", "size": size,
        "url_private": url, "url_private_download": url + "?download=1"}]}
    return delivery


def slack_press(trigger: str, value: str, user: str = "U42", channel: str = "D42",
                message_ts: str = "1764950401.000200") -> dict[str, Any]:
    """An interactivity payload: a Block Kit button pressed (type block_actions)."""
    return {"type": "block_actions", "trigger_id": trigger, "user": {"id": user, "name": "ana"},
            "team": {"id": "T1"}, "channel": {"id": channel, "name": "directmessage"},
            "container": {"type": "message", "message_ts": message_ts, "channel_id": channel},
            "message": {"ts": message_ts, "text": "Book it?"},
            "actions": [{"type": "button", "action_id": "choice_0", "value": value, "action_ts": "1764950402.1"}]}


class FakeWhatsApp(_FakeApi):
    """The Cloud API: POST /v21.0/PHONE_NUMBER_ID/messages with `Authorization: Bearer <token>`,
    answered {"messaging_product": "whatsapp", "contacts": [...], "messages": [{"id": "wamid..."}]},
    or Meta's error shape with `status`."""

    def __init__(self, token: str):
        super().__init__()
        self.token = token

    def answer(self, call: ApiCall) -> tuple[int, dict[str, Any]]:
        if call.headers.get("authorization") != f"Bearer {self.token}":
            return 401, {"error": {"message": "Invalid OAuth access token.", "type": "OAuthException", "code": 190}}
        if self.status != 200:
            return self.status, {"error": {"message": "Service temporarily unavailable", "code": 2}}
        # The Cloud API's limits: a text's body, an interactive message's body (where buttons go)
        text, interactive = call.body.get("text") or {}, call.body.get("interactive") or {}
        if len(text.get("body") or "") > 4096 or len((interactive.get("body") or {}).get("text") or "") > 1024:
            return 400, {"error": {"message": "(#100) Invalid parameter", "type": "OAuthException", "code": 100}}
        return 200, {"messaging_product": "whatsapp", "contacts": [{"input": call.body.get("to"), "wa_id": call.body.get("to")}],
                     "messages": [{"id": f"wamid.out{len(self.seen)}"}]}


def whatsapp_media(api: FakeWhatsApp, media_id: str, data: bytes, mime_type: str = "image/jpeg") -> None:
    """Media the Cloud API holds: GET /v21.0/MEDIA_ID answers its URL (on the fake) and size, as
    Meta documents it; GET of that URL with the token answers the bytes."""
    api.files[f"/media/{media_id}"] = data
    api.files[f"/v21.0/{media_id}"] = json.dumps({
        "messaging_product": "whatsapp", "url": f"{api.url}/media/{media_id}", "mime_type": mime_type,
        "sha256": "unused", "file_size": len(data), "id": media_id}).encode()


def whatsapp_signed(app_secret: str, body: bytes) -> dict[str, str]:
    """X-Hub-Signature-256 as Meta computes it: HMAC-SHA256 of the raw body with the app secret."""
    import hashlib
    import hmac

    return {"X-Hub-Signature-256": "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()}


def whatsapp_edit(wamid: str, original: str, text: str, user: str = "4915112345678",
                  number: str = "1065550001") -> dict[str, Any]:
    """A Cloud API webhook with an `edit` message: the user edited the message `original` (its
    wamid) to `text`, as Meta's edit webhook reference shows it."""
    payload = whatsapp_message(wamid, text, user=user, number=number)
    message = payload["entry"][0]["changes"][0]["value"]["messages"][0]
    edited = {"type": "text", "text": message.pop("text")}
    message |= {"type": "edit", "edit": {"original_message_id": original, "message": edited}}
    return payload


def whatsapp_message(wamid: str, text: str | None = None, user: str = "4915112345678", number: str = "1065550001",
                     button: str | None = None, media: tuple[str, str, str, str | None] | None = None,
                     sent: float | None = None) -> dict[str, Any]:
    """A Cloud API webhook with one text message (or, with `button`, an interactive reply
    button's press; with `media`, an image or document), as Meta's documentation shows it,
    sent now (or at `sent`, seconds since the epoch)."""
    message: dict[str, Any] = {"from": user, "id": wamid, "timestamp": str(int(time.time() if sent is None else sent))}
    if media is not None:  # (kind, media id, mime type, caption)
        kind, media_id, mime_type, caption = media
        message |= {"type": kind, kind: {"id": media_id, "mime_type": mime_type, "sha256": "unused",
                                         **({"caption": caption} if caption is not None else {})}}
    elif button is None:
        message |= {"type": "text", "text": {"body": text}}
    else:
        message |= {"type": "interactive", "interactive": {"type": "button_reply",
                                                              "button_reply": {"id": button, "title": button.title()}}}
    value = {"messaging_product": "whatsapp",
             "metadata": {"display_phone_number": "15550001", "phone_number_id": number},
             "contacts": [{"profile": {"name": "Ana"}, "wa_id": user}], "messages": [message]}
    return {"object": "whatsapp_business_account",
            "entry": [{"id": "WABA1", "changes": [{"value": value, "field": "messages"}]}]}


class FakeBotFramework:
    """The Bot Framework for a Teams bot, on 127.0.0.1: the OpenID metadata (GET /openid) and
    its signing keys (GET /keys, an RSA key made here), the Entra ID token endpoint (POST /token,
    client credentials) and the Bot Connector (POST /v3/conversations/ID/activities, and GET of
    a user's file at its contentUrl (`files`), both requiring the token it issued). `activity_token(...)` signs what the Bot Connector sends a
    bot with the same algorithm and claims (PyJWT, RS256)."""

    ISSUER = "https://api.botframework.com"

    def __init__(self, app_id: str, app_password: str):
        import jwt
        from cryptography.hazmat.primitives.asymmetric import rsa

        self.app_id, self.app_password = app_id, app_password
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        self.jwks = {"keys": [jwk | {"kid": "test-key-1", "use": "sig", "alg": "RS256"}]}
        self.status = 200
        self.trickle = 0.0  # seconds between two bytes of the Bot Connector's answer (0: at once)
        self.delay = 0.0  # seconds an activity's POST waits before it is answered (a slow platform)
        self.keys_status = 200  # what GET /keys answers (another status: the keys' endpoint failing)
        self.activities: list[dict[str, Any]] = []
        self.tokens_issued = 0
        self.files: dict[str, bytes] = {}  # GET path -> bytes (an attachment's contentUrl), with the token only
        self.downloads: list[tuple[str, str]] = []  # (path, Authorization) of every file GET
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/openid":
                    self._json(200, {"issuer": fake.ISSUER, "jwks_uri": f"{fake.url}/keys",
                                     "id_token_signing_alg_values_supported": ["RS256"]})
                elif self.path == "/keys":
                    self._json(fake.keys_status, fake.jwks if fake.keys_status == 200 else {"error": "unavailable"})
                elif self.path in fake.files:  # a file on the Bot Connector: only with the token it issued
                    fake.downloads.append((self.path, self.headers.get("Authorization") or ""))
                    if self.headers.get("Authorization") != "Bearer bf-access-1":
                        return self._json(401, {"message": "Authorization has been denied for this request."})
                    data = fake.files[self.path]
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    self._json(404, {})

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/token":
                    form = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
                    if (form.get("client_id"), form.get("client_secret")) != (fake.app_id, fake.app_password):
                        return self._json(401, {"error": "invalid_client"})
                    fake.tokens_issued += 1
                    return self._json(200, {"token_type": "Bearer", "expires_in": 3600, "access_token": "bf-access-1"})
                if self.headers.get("Authorization") != "Bearer bf-access-1":
                    return self._json(401, {"message": "Authorization has been denied for this request."})
                if fake.status != 200:
                    return self._json(fake.status, {"error": {"code": "ServiceError"}})
                if len(raw) > 28 * 1024:  # the Bot Connector's limit on an activity
                    return self._json(413, {"error": {"code": "MessageSizeTooBig", "message": "Activity too large"}})
                time.sleep(fake.delay)
                fake.activities.append({"path": self.path, **json.loads(raw)})
                return self._json(201, {"id": f"reply-{len(fake.activities)}"}, fake.trickle)

            def _json(self, status: int, body: dict[str, Any], trickle: float = 0.0) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                write_body(self, data, trickle)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeBotFramework:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def activity_token(self, service_url: str | None, audience: str | None = None, key: Any = None,
                       issued: float | None = None, lifetime: float = 3600) -> str:
        """A Bot Framework token for an activity (valid `lifetime` seconds, an hour, from `issued`,
        default now); `service_url` None: one without the claim."""
        import jwt

        now = int(time.time() if issued is None else issued)
        claims: dict[str, Any] = {"iss": self.ISSUER, "aud": audience or self.app_id,
                                  "nbf": now - 10, "iat": now - 10, "exp": now + int(lifetime)}
        if service_url is not None:
            claims["serviceurl"] = service_url
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": "test-key-1"})

    def edit_activity(self, activity_id: str, text: str, **who: Any) -> dict[str, Any]:
        """The messageUpdate activity Teams sends when the user edits the message `activity_id`:
        the message's id, its new text, `channelData.eventType` editMessage."""
        body = self.activity(activity_id, text, **who)
        body |= {"type": "messageUpdate", "channelData": {"eventType": "editMessage", "tenant": {"id": "t1"}}}
        return body

    def activity(self, activity_id: str, text: str | None = None, value: dict[str, Any] | None = None,
                 user: str = "29:1abc", aad: str = "aad-42", conversation: str = "a:1personal") -> dict[str, Any]:
        """A message activity as the Bot Connector sends it for a personal chat in Teams."""
        body: dict[str, Any] = {
            "type": "message", "id": activity_id, "timestamp": "2026-12-05T10:00:00.000Z", "channelId": "msteams",
            "serviceUrl": f"{self.url}/teams-service/", "locale": "en-US",
            "from": {"id": user, "name": "Ana Lima", "aadObjectId": aad},
            "conversation": {"conversationType": "personal", "tenantId": "t1", "id": conversation},
            "recipient": {"id": f"28:{self.app_id}", "name": "shop"}}
        if text is not None:
            body["text"] = text
        if value is not None:
            body["value"] = value
        return body


class FakeTelegram:
    """The Bot API: POST /bot<token>/<method> with JSON; answers {"ok": true, "result": ...}
    (or `status` with Telegram's error shape). `calls` are the ones answered 200. `files` (by
    file_id) are what getFile finds and GET /file/bot<token>/<file_path> serves (`downloads`)."""

    def __init__(self, token: str):
        self.token = token
        self.status = 200
        self.retry_after: int | None = None  # a 429's `parameters.retry_after`, when set
        self.trickle = 0.0  # seconds between two bytes of an answer's body (0: at once)
        self.delay = 0.0  # seconds a POST waits before it is answered (a slow platform)
        self.files: dict[str, bytes] = {}
        self.downloads: list[str] = []
        self.seen: list[ApiCall] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(fake.delay)
                status = fake.status if self.path.startswith(f"/bot{fake.token}/") else 401
                call = ApiCall(self.path, json.loads(raw or b"{}"), status)
                with fake._lock:
                    fake.seen.append(call)
                result: dict[str, Any] = {"message_id": len(fake.seen)}
                if self.path.endswith("/getFile"):  # a File object: its path under /file/bot<token>/
                    file_id = call.body.get("file_id")
                    if file_id not in fake.files:
                        status, call.status = 400, 400
                    else:
                        result = {"file_id": file_id, "file_unique_id": f"u-{file_id}",
                                  "file_size": len(fake.files[file_id]), "file_path": f"documents/{file_id}.bin"}
                if status == 200 and self.path.endswith("/sendMessage") and \
                        len(str(call.body.get("text") or "").encode("utf-16-le")) > 2 * 4096:
                    status = call.status = 400  # Telegram's limit on a message's text, in UTF-16 units
                body = {"ok": True, "result": result} if status == 200 else \
                    {"ok": False, "error_code": status, "description": "Bad Gateway" if status >= 500 else
                     "Bad Request: message is too long" if self.path.endswith("/sendMessage") and status == 400
                     else "Bad Request: invalid file_id" if status == 400 else "Unauthorized"}
                if status == 429:  # Telegram's flood control: the wait in the body, no header
                    body = {"ok": False, "error_code": 429, "description": "Too Many Requests: retry after "
                            f"{fake.retry_after}", "parameters": {"retry_after": fake.retry_after}}
                self._send(status, json.dumps(body).encode(), "application/json", fake.trickle)

            def do_GET(self) -> None:  # noqa: N802 - a file's download, as getFile named it
                prefix = f"/file/bot{fake.token}/documents/"
                file_id = self.path[len(prefix):].removesuffix(".bin") if self.path.startswith(prefix) else None
                with fake._lock:
                    fake.downloads.append(self.path)
                if file_id not in fake.files:
                    return self._send(404, b"Not Found", "text/plain")
                self._send(200, fake.files[file_id], "application/octet-stream")

            def _send(self, status: int, data: bytes, content_type: str, trickle: float = 0.0) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                write_body(self, data, trickle)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeTelegram:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def calls(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [c.body for c in self.seen if c.status == 200 and c.path.endswith(f"/{method}")]


def telegram_message(update_id: int, text: str, user: int = 42, chat: int | None = None,
                     first_name: str = "Ana", language: str = "en") -> dict[str, Any]:
    """An Update with a text message, as the Bot API documents it."""
    sender = {"id": user, "is_bot": False, "first_name": first_name, "language_code": language}
    return {"update_id": update_id, "message": {
        "message_id": update_id * 10, "date": 1764950400, "text": text, "from": sender,
        "chat": {"id": chat if chat is not None else user, "type": "private", "first_name": first_name}}}


def telegram_edit(update_id: int, edited: dict[str, Any], text: str) -> dict[str, Any]:
    """An Update with an edited_message: the message of `edited` (a telegram_message) as it now
    is, with its edit_date, as the Bot API documents it."""
    return {"update_id": update_id, "edited_message": {**edited["message"], "text": text, "edit_date": 1764950460}}


def telegram_press(update_id: int, data: str, user: int = 42, chat: int | None = None) -> dict[str, Any]:
    """An Update with a callback_query: an inline keyboard button pressed."""
    sender = {"id": user, "is_bot": False, "first_name": "Ana"}
    chat_id = chat if chat is not None else user
    return {"update_id": update_id, "callback_query": {
        "id": f"cbq-{update_id}", "from": sender, "chat_instance": "ci-1", "data": data,
        "message": {"message_id": 7, "date": 1764950400, "chat": {"id": chat_id, "type": "private"},
                    "text": "Book it?"}}}


def telegram_file(update_id: int, file_id: str, kind: str = "photo", caption: str | None = None, user: int = 42,
                  mime_type: str = "application/pdf", size: int = 1000) -> dict[str, Any]:
    """An Update with a photo (its sizes, smallest first) or a document, as the Bot API documents it."""
    update = telegram_message(update_id, "", user=user)
    message = update["message"]
    del message["text"]
    if kind == "photo":
        message["photo"] = [{"file_id": f"{file_id}-small", "file_unique_id": "s", "width": 90, "height": 90,
                             "file_size": 100},
                            {"file_id": file_id, "file_unique_id": "l", "width": 800, "height": 600, "file_size": size}]
    else:
        message["document"] = {"file_id": file_id, "file_unique_id": "d", "file_name": "invoice.pdf",
                               "mime_type": mime_type, "file_size": size}
    if caption is not None:
        message["caption"] = caption
    return update


def shop_responder(body: dict[str, Any]) -> dict[str, Any]:
    """The fake model of the channel tests' ticket shop: "book X" calls book(show=X), "bye"
    calls bye(), "who" repeats the system prompt, "fail" answers 500, "slow" answers after 6 s;
    after a tool it says "Done: RESULT"; anything else it echoes as "You said X."."""
    messages = body["messages"]
    user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if messages[-1]["role"] == "tool":
        return {"text": "Done: " + str(messages[-1]["content"])}
    if user.startswith("book "):
        return {"tool_calls": [{"name": "book", "arguments": {"show": user[5:]}}]}
    special = {"bye": {"tool_calls": [{"name": "bye", "arguments": {}}]},
               "who": {"text": messages[0]["content"]},
               "fail": {"status": 500, "body": "down"},
               "slow": {"text": "Slow answer.", "delay": 6}}
    return special.get(user, {"text": f"You said {user}."})


def die_after_a_notice_commits(store: Any, monkeypatch: Any) -> list[str]:
    """The server dying right after a channel notice's commit landed, before anything after it
    ran: the real store writes the commit, then the request fails as a kill leaves it (no answer
    to the platform). The sessions it happened in, once it has (at the first notice only)."""
    commit_turn, crashed = store.commit_turn, []

    async def commit_then_die(commit: Any, lease: Any) -> str:
        version = await commit_turn(commit, lease)
        if not crashed and any('"notice"' in entry for entry in commit.history_json):
            crashed.append(commit.session_id)
            raise RuntimeError("killed right after the notice's commit")
        return str(version)

    monkeypatch.setattr(store, "commit_turn", commit_then_die)
    return crashed
