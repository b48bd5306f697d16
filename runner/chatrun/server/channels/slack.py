"""Slack (the Events API and interactivity, one Slack app): every request is signed with the
app's signing secret (X-Slack-Signature over "v0:<timestamp>:<body>", checked with slack_sdk's
SignatureVerifier, which also refuses a timestamp over five minutes old); `url_verification`
is answered with its challenge; `message` events (direct messages, and messages in a thread
the bot is in) and `app_mention`s are user messages; a Block Kit button press arrives on the
interactivity URL as a form field `payload` holding `block_actions`. Replies are
chat.postMessage, with Block Kit buttons for choices and approvals.

A direct message channel is one conversation; in a channel, a thread is one conversation per
sender (the top message's `ts` and the sender's id: a second person writing in the thread has
their own, owner-only session), and the bot answers in the thread. The principal is `slack:<user id>`. The delivery is
the message's channel and `ts` (a retry, with X-Slack-Retry-Num, carries the same; so do the
`app_mention` and the `message` event Slack sends for one mention in a thread), else the
event's `event_id`; a press's is its `trigger_id`. The sender's display name (the principal's claim
`display_name`) and locale (a new session's), which an event does not carry, are asked of
users.info (scope `users:read`) once per user and kept an hour (`SenderNames`); without the
scope there are none, and a press
gives its username. Slack waits 3 seconds for the answer: the
webhook answers within `ack_within` and the turn goes on."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from chatrun.errors import ChatrunError
from chatrun.server.channels.base import (
    ChannelKind,
    FetchFailed,
    Inbound,
    InboundFile,
    Outgoing,
    SendFailed,
    Unauthorized,
    media_type_of,
)

log = logging.getLogger("chatrun.channels")

DEFAULT_API = "https://slack.com/api"
FILES_HOST = "https://files.slack.com/"  # where a file's url_private is: the only host the token goes to
MAX_VALUE = 2000  # Slack's limit on a button's value
MAX_TEXT = 40000  # Slack's limit on a message's text (a longer reply is several messages: ChannelKind.fitted)
MAX_SECTION = 3000  # Slack's limit on a section block's text: a message with buttons


Sender = tuple[str, str | None]  # a Slack user's display name ("" when none) and locale (None when none)


class SenderNames:
    """Slack users' display names and locales, asked of users.info once per user and kept `ttl`
    seconds (a failure, such as a token without `users:read`, `retry_after`: not one call per
    message), at most `limit` users (the oldest dropped first). One per channel of a bot version."""

    def __init__(self, ttl: float = 3600.0, retry_after: float = 300.0, limit: int = 10000):
        self.ttl, self.retry_after, self.limit = ttl, retry_after, limit
        self._names: dict[str, tuple[Sender, float]] = {}  # user id -> (sender, when to ask again)

    def get(self, user: str) -> Sender | None:
        """The kept sender (a name "" when Slack gave none), or None when it must be asked."""
        kept = self._names.get(user)
        return kept[0] if kept is not None and kept[1] > time.monotonic() else None

    def put(self, user: str, sender: Sender) -> None:
        self._names.pop(user, None)
        while len(self._names) >= self.limit:
            del self._names[next(iter(self._names))]
        self._names[user] = (sender, time.monotonic() + (self.ttl if sender[0] else self.retry_after))


class Slack(ChannelKind):
    kind = "slack"
    ack_within = 2.0
    stream_every = 1.0  # Slack's chat.update is rate-limited (Tier 3, about 50 a minute)
    max_text, max_button_text = MAX_TEXT, MAX_SECTION

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.names = SenderNames()

    @classmethod
    def missing(cls) -> str | None:
        try:
            import slack_sdk.signature  # noqa: F401
        except ImportError:
            return "the Slack channel needs slack_sdk: pip install 'chatrun[channels]'"
        return None

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        from slack_sdk.signature import SignatureVerifier

        verifier = SignatureVerifier(self.secret("signing_secret"))
        try:
            valid = verifier.is_valid(body, headers.get("x-slack-request-timestamp"), headers.get("x-slack-signature"))
        except (ValueError, TypeError):  # slack_sdk's int() of a timestamp that is no number; a non-ASCII signature
            valid = False
        if not valid:
            raise Unauthorized("slack: the X-Slack-Signature is missing, wrong or over five minutes old")

    def read(self, body: bytes, headers: Mapping[str, str]) -> Any:
        if headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            form = parse_qs(body.decode())
            return json.loads(form.get("payload", ["{}"])[0])  # an interaction
        return json.loads(body)

    def handshake(self, payload: Any) -> dict[str, Any] | None:
        if isinstance(payload, dict) and payload.get("type") == "url_verification":
            return {"challenge": payload.get("challenge")}
        return None

    def inbound(self, payload: Any) -> list[Inbound]:
        if not isinstance(payload, dict):
            return []
        if payload.get("type") == "event_callback" and isinstance(payload.get("event"), dict):
            return _event(payload.get("event_id"), payload["event"], _bot_users(payload))
        if payload.get("type") == "block_actions" and payload.get("actions"):
            return _press(payload)
        return []

    async def named(self, client: httpx.AsyncClient, inbound: Inbound) -> Inbound:
        """The message with its sender's name and locale (an event carries neither)."""
        sender = self.names.get(inbound.user)
        if sender is None:
            sender = await self._sender(client, inbound.user)
            self.names.put(inbound.user, sender)
        name, locale = sender
        return dataclasses.replace(inbound, name=name or inbound.name, locale=locale or inbound.locale)

    async def _sender(self, client: httpx.AsyncClient, user: str) -> Sender:
        """users.info's name for the user (the profile's display name, else the real name), or ""
        when Slack does not give it (logged: the turn goes on without a name); and their locale
        (`include_locale`: the language of their Slack, `de-DE`), None without one."""
        url = f"{self.option('api', DEFAULT_API).rstrip('/')}/users.info"
        try:
            response = await self.call(client, "GET", url, "slack users.info", "the Web API",
                                       params={"user": user, "include_locale": "true"},
                                       headers={"Authorization": f"Bearer {self.secret('token')}"})
            answer = response.json() if response.status_code == 200 else {"error": response.status_code}
        except SendFailed as exc:  # unreachable, too slow, too big
            answer = {"error": str(exc)}
        except (ValueError, ChatrunError) as exc:  # not JSON, no token
            answer = {"error": type(exc).__name__}
        found = answer.get("user") if isinstance(answer, dict) and answer.get("ok") else None
        if not isinstance(found, dict):
            error = answer.get("error") if isinstance(answer, dict) else None
            log.info("slack: no display name for %s: users.info answered %s", user, error or "nothing")
            return "", None
        profile: dict[str, Any] = found["profile"] if isinstance(found.get("profile"), dict) else {}
        locale = found.get("locale")
        return (str(profile.get("display_name") or profile.get("real_name") or found.get("real_name")
                    or found.get("name") or ""), locale if isinstance(locale, str) and locale else None)

    async def fetch(self, client: httpx.AsyncClient, file: InboundFile, limit: int) -> bytes:
        """A file's url_private, read with the bot token (scope `files:read`). The token goes only
        to Slack's file host (or the origin of the channel's `api`, a local Slack)."""
        api = urlsplit(self.option("api", DEFAULT_API))
        if not (file.ref.startswith(FILES_HOST) or file.ref.startswith(f"{api.scheme}://{api.netloc}/")):
            raise FetchFailed(f"slack: a file URL not on {FILES_HOST}: {file.ref[:80]}")
        return await self.download(client, file.ref, limit, "url_private",
                                   {"Authorization": f"Bearer {self.secret('token')}"})

    async def send(self, client: httpx.AsyncClient, address: dict[str, Any], message: Outgoing) -> None:
        body: dict[str, Any] = {"channel": address["channel"], **_content(message)}
        if address.get("thread_ts"):
            body["thread_ts"] = address["thread_ts"]
        await self._call(client, "chat.postMessage", body)

    async def stream_start(self, client: httpx.AsyncClient, address: dict[str, Any], text: str) -> dict[str, Any]:
        body: dict[str, Any] = {"channel": address["channel"], "text": text[:MAX_TEXT]}
        if address.get("thread_ts"):
            body["thread_ts"] = address["thread_ts"]
        answer = await self._call(client, "chat.postMessage", body)
        return {"channel": str(answer.get("channel") or address["channel"]), "ts": str(answer.get("ts"))}

    async def stream_update(self, client: httpx.AsyncClient, handle: dict[str, Any], message: Outgoing) -> None:
        # chat.update names the message by its channel and ts; done twice, it shows the same.
        await self._call(client, "chat.update", {"channel": handle["channel"], "ts": handle["ts"], **_content(message)})

    async def _call(self, client: httpx.AsyncClient, method: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.option('api', DEFAULT_API).rstrip('/')}/{method}"
        response = await self.call(client, "POST", url, f"slack {method}", "the Web API", json=body,
                                   headers={"Authorization": f"Bearer {self.secret('token')}"})
        answer = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        if response.status_code != 200 or not answer.get("ok"):
            raise SendFailed.answered(f"slack {method}: {response.status_code} "
                                      f"{answer.get('error') or response.text[:200]}", response)
        return answer


def _content(message: Outgoing) -> dict[str, Any]:
    """A message's text, and its buttons as Block Kit (chat.postMessage and chat.update alike)."""
    body: dict[str, Any] = {"text": message.text[:MAX_TEXT]}  # (a streamed reply's text so far may be longer)
    if message.buttons:
        body["blocks"] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": message.text[:MAX_SECTION]}},
            {"type": "actions", "elements": [
                {"type": "button", "action_id": f"choice_{i}", "text": {"type": "plain_text", "text": label[:75]},
                 "value": value[:MAX_VALUE]} for i, (label, value) in enumerate(message.buttons)]},
        ]
    return body


def _bot_users(payload: dict[str, Any]) -> frozenset[str]:
    """The bot's own user ids, as the event's `authorizations` name them (Slack's Events API
    sends the installation the event is for: `user_id`, `is_bot`): what a mention of it is."""
    found = payload.get("authorizations")
    return frozenset(a["user_id"] for a in found if isinstance(a, dict) and a.get("is_bot")
                     and isinstance(a.get("user_id"), str)) if isinstance(found, list) else frozenset()


def _event(delivery: Any, event: dict[str, Any], bots: frozenset[str] = frozenset()) -> list[Inbound]:
    """A message or a mention from a person (not a bot, not an edit); in a channel only the
    bot's mentions and messages in threads start or go on with a conversation."""
    if event.get("type") == "message" and event.get("subtype") == "message_changed":
        return _edit(event, bots)
    kind, user, text = event.get("type"), event.get("user"), event.get("text", "")
    if kind not in ("message", "app_mention") or event.get("subtype") not in (None, "file_share") \
            or event.get("bot_id") or not isinstance(user, str) or not isinstance(text, str):
        return []
    files = _files(event.get("files"))
    if not text and not files:
        return []
    channel = str(event.get("channel"))
    direct = event.get("channel_type") == "im"
    if kind == "message" and not direct and not event.get("thread_ts"):
        return []  # a channel's chatter: the bot answers mentions (app_mention) and its threads
    thread = None if direct else str(event.get("thread_ts") or event.get("ts"))
    if isinstance(event.get("ts"), str) and event["ts"]:
        # The message, not the event: a mention in a thread comes as an `app_mention` and as a
        # `message` (message.channels), two event_ids for one message, which must run one turn.
        delivery = f"{channel}:{event['ts']}"
    return [Inbound(delivery, _conversation(channel, thread, user), user, text,
                    {"channel": channel, "thread_ts": thread}, files=files)]


def _edit(event: dict[str, Any], bots: frozenset[str]) -> list[Inbound]:
    """A person's edit of their message (`message_changed`) in a conversation the bot is in: an
    Inbound `edited`, its delivery the message's channel and `ts` (each edited message is told
    once, however often it is edited or the event sent again). A link's unfurl (no `edited`) and
    the bot's own updated replies are no edits of a person. Outside a thread, the edit of a
    message that mentioned the bot (which the bot answered, in a thread on it) is told in that
    thread; any other message there is a channel's chatter, its edit as unanswered as it was."""
    message, channel = event.get("message"), str(event.get("channel"))
    if not isinstance(message, dict) or not isinstance(message.get("edited"), dict) or message.get("bot_id"):
        return []
    user, text, ts = message.get("user"), message.get("text"), message.get("ts")
    direct = event.get("channel_type") == "im"
    if not isinstance(user, str) or not isinstance(text, str) or not isinstance(ts, str) \
            or not (direct or message.get("thread_ts") or _mentioned(event.get("previous_message"), bots)):
        return []  # a channel's chatter, as for a message
    thread = None if direct else str(message.get("thread_ts") or ts)
    return [Inbound(f"{channel}:{ts}:edited", _conversation(channel, thread, user), user, text,
                    {"channel": channel, "thread_ts": thread}, edited=True)]


def _mentioned(message: Any, bots: frozenset[str]) -> bool:
    """Whether a message (the edited one as it was sent) mentioned the bot: an `app_mention`."""
    text = message.get("text") if isinstance(message, dict) else None
    return isinstance(text, str) and any(f"<@{bot}>" in text for bot in bots)


def _conversation(channel: str, thread: str | None, user: str) -> str:
    """One conversation per sender: a direct message's channel and its user (the key every DM
    session had before threads were per sender), or a channel's thread and its sender."""
    return f"{channel}:{user}" if thread is None else f"{channel}:{thread}:{user}"


def _files(files: Any) -> tuple[InboundFile, ...]:
    """A file share's files (the message event's `files`), each read from its url_private."""
    out = []
    for file in files if isinstance(files, list) else ():
        url = isinstance(file, dict) and (file.get("url_private_download") or file.get("url_private"))
        if isinstance(url, str):
            size = file.get("size")
            out.append(InboundFile(url, media_type_of(file.get("mimetype")), str(file.get("name") or ""),
                                   size if isinstance(size, int) else None))
    return tuple(out)


def _press(payload: dict[str, Any]) -> list[Inbound]:
    action, user = payload["actions"][0], payload.get("user") or {}
    channel = str((payload.get("channel") or {}).get("id") or (payload.get("container") or {}).get("channel_id"))
    message = payload.get("message") or {}
    direct = channel.startswith("D")
    thread = None if direct else str(message.get("thread_ts") or message.get("ts"))
    user_id = str(user.get("id"))
    return [Inbound(payload.get("trigger_id") or action.get("action_ts"), _conversation(channel, thread, user_id),
                    user_id, str(action.get("value") or ""), {"channel": channel, "thread_ts": thread},
                    str(user.get("name") or ""), pressed=True)]
