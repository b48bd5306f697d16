"""What every channel is: a `ChannelKind` turns a platform's webhook delivery into `Inbound`
user messages (after checking its signature) and a committed turn's reply into the
platform's API calls. The flow around them, the same for every platform, is door.py's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import httpx

from chatrun import events as ev
from chatrun.definition.catalogs import said_count
from chatrun.definition.config import BotConfig, ChannelConfig
from chatrun.definition.page_texts import builtin_locale, page_texts, said
from chatrun.definition.templates import CATALOGS_KEY, ENV
from chatrun.errors import ChatrunError
from chatrun.server.wire import channel_session_id
from chatrun.store import replays
from chatrun.toolkinds.http import Environment, retry_after

if TYPE_CHECKING:
    from chatrun.engine.session import Session

MAX_ANSWER_BYTES = 1_000_000  # of a platform's answer to a call (a message's id, an error): more is not read
# The oldest a message's own signed timestamp may be: past it a delivery is refused, since the
# turn's dedupe record (the last outcomes of a session) may be gone and a captured delivery would
# run again. The replay window of store/replays.py, which keeps a deleted session's delivery ids
# (hashed) that long (docs/channels.md, "Replays").
MAX_DELIVERY_AGE = replays.WINDOW


def too_old(sent: float | None, max_age: float, now: float | None = None) -> bool:
    """Whether a delivery's signed timestamp `sent` (seconds since the epoch) is over `max_age`
    seconds old; a message without one is not judged so (its platform's signature bounds it)."""
    return sent is not None and sent < (now if now is not None else time.time()) - max_age


def epoch_seconds(value: Any) -> float | None:
    """A platform's timestamp (seconds since the epoch, a number or its digits) or None."""
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def session_id_for(bot: str, kind: str, conversation: str) -> str:
    """The session of a platform conversation: the same on every replica, for every retry."""
    return channel_session_id(hashlib.sha256(f"{bot}\0{kind}\0{conversation}".encode()).hexdigest())


def session_after(session_id: str) -> str:
    """The session a platform conversation goes on in after `session_id` ended (`end: true`):
    derived from the ended one alone, so two messages arriving together, on one replica or two,
    both go on in the same new session (one derived from each message's delivery made two)."""
    return channel_session_id(hashlib.sha256(f"after\0{session_id}".encode()).hexdigest())


class Unauthorized(ChatrunError):
    """A delivery whose signature (or secret header) is missing or wrong: 401, nothing runs."""


class Unreachable(ChatrunError):
    """What checking a delivery needs cannot be had (Teams' signing keys: their endpoint is down):
    503, nothing runs, and the platform sends the delivery again; the message names the endpoint."""


class SendFailed(ChatrunError):
    """The platform refused a reply or did not answer: the outbox retries it (backoff, then a
    dead letter); `status` is the platform's HTTP status when it answered, `retry_after` the
    seconds it asked to be left alone (the outbox's next try waits that long, up to its
    `max_backoff`)."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after

    @classmethod
    def answered(cls, message: str, response: httpx.Response) -> SendFailed:
        """The platform's refusal `response`: its status, and the wait it asks for."""
        return cls(message, response.status_code, asked_wait(response))


def asked_wait(response: httpx.Response) -> float | None:
    """The seconds a platform's refusal asks to wait before the next call: its `Retry-After`
    header (Slack's, the Bot Connector's, any HTTP API's), else Telegram's
    `parameters.retry_after` in the body of its 429; None when it asks for none."""
    wait = retry_after(response)
    if wait is not None:
        return wait
    try:
        answer = response.json()
    except ValueError:
        return None
    asked = answer.get("parameters", {}).get("retry_after") if isinstance(answer, dict) else None
    asked = asked if isinstance(asked, (int, float)) and not isinstance(asked, bool) else None
    return max(0.0, float(asked)) if asked is not None else None


class FetchFailed(ChatrunError):
    """A user's file could not be fetched from the platform (it refused, did not answer, or the
    file is over the route's `max_bytes`): the user is told, the turn does not run."""

    def __init__(self, message: str, too_large: bool = False):
        super().__init__(message)
        self.too_large = too_large


@dataclass(frozen=True)
class InboundFile:
    """A file a user sent, as the platform names it: fetched by the kind (`fetch`) only when
    the route takes its media type, before the turn."""

    ref: str  # the platform's handle: Telegram's file_id, Slack's url_private, WhatsApp's media id
    media_type: str
    name: str = ""
    size: int | None = None  # the size the platform announces, when it does (checked before fetching)
    # The download carries the bot's platform token (Teams: a file on the Bot Connector's own
    # host, which the activity's verified serviceUrl names); otherwise the URL needs none.
    bearer: bool = False


@dataclass(frozen=True)
class Inbound:
    """One user message a delivery carries (a text, or a button press as the value pressed)."""

    delivery: str  # the platform's id of the delivery: a retry carries the same, so it runs once
    conversation: str  # the chat (thread, call) and sender: one session each
    user: str  # the sender's platform id; the principal is "<kind>:<user>"
    text: str
    address: dict[str, Any]  # where this conversation's replies go (the chat's id, a thread's)
    name: str = ""  # the sender's display name (the principal's claim `display_name`)
    locale: str | None = None  # the sender's language, when the platform says it
    extra: dict[str, Any] = field(default_factory=dict)  # what the kind needs after the turn (a callback's id)
    files: tuple[InboundFile, ...] = ()  # photos, documents: the turn's attachments once fetched
    pressed: bool = False  # a button's value, pressed (not typed): it may name a waiting item (press_value)
    sent: float | None = None  # when the user sent it, as the platform signed it (too_old refuses a replay)
    # An edit of a message sent before: no turn runs, the user is told edits are not read
    # (door.py; its delivery names the edited message, so each edited message is told once).
    edited: bool = False
    # The platform's number of the delivery, increasing per bot (Telegram's update_id): one at or
    # below the bot's floor is a replay (store/replays.py `out_of_sequence`; `sequence_scope`).
    sequence: int | None = None

    def __post_init__(self) -> None:
        # The delivery id is the turn's request id (and names the message's records): a delivery
        # without one (the kinds pass the platform's field as it is, None when absent) gets an id
        # of its own, so two of them are never one turn answered from the other's commit. Its
        # retry, unrecognisable, runs again: without an id, at-least-once is all a platform gives.
        delivery: Any = self.delivery
        object.__setattr__(self, "delivery", f"no-id-{uuid.uuid4().hex}" if delivery in (None, "")
                           else str(delivery))


@dataclass(frozen=True)
class Outgoing:
    """One message of a reply, as every platform has it: text, and buttons (label, value)."""

    text: str
    buttons: list[tuple[str, str]] = field(default_factory=list)
    # A follow-up past WhatsApp's 24-hour window: the approved template sent instead (name, language).
    whatsapp_template: tuple[str, str] | None = None
    # The session's locale when the reply was made: for the words the platform's message adds
    # around the reply's own (WhatsApp's list button), chatrun's texts (definition/page_texts.py).
    locale: str | None = None


class ChannelKind:
    """A platform. Subclasses set `kind` and implement verify, inbound and send."""

    kind: ClassVar[str]
    timeout: ClassVar[float] = 10.0  # seconds one platform API call may take
    # Seconds the platform waits for the webhook's answer before it counts the delivery failed
    # (Slack: 3): the turn goes on after the answer. None: the answer waits for the turn, and a
    # delivery the platform gives up on is sent again and replayed.
    ack_within: ClassVar[float | None] = None
    # Seconds between the updates of a reply shown while the model streams it (Slack: post the
    # first chunk, update that message); None: the kind shows only the committed reply.
    stream_every: ClassVar[float | None] = None
    # The longest text one message of the platform takes, in `text_size`'s units (None: no
    # limit), and with buttons (Slack's section block, WhatsApp's interactive body take less): a
    # longer reply is sent as several messages (`fitted`), never cut short or refused.
    max_text: ClassVar[int | None] = None
    max_button_text: ClassVar[int | None] = None

    def __init__(self, bot: BotConfig, config: ChannelConfig):
        self.bot, self.config = bot, config
        self._options: dict[str, str] = {}  # rendered once: the process's environment is read at start

    @classmethod
    def missing(cls) -> str | None:
        """What the kind needs that is not installed (checked when the server starts), or None."""
        return None

    def secret(self, key: str) -> str:
        """The value of the env variable the channel's `key` names; ChatrunError when unset."""
        name = str(self.config.options.get(key) or "")
        var = self.bot.env.get(name)
        value = os.environ.get(name, var.default if var is not None else None)
        if not value:
            raise ChatrunError(f"channel {self.kind} of bot {self.bot.name}: `env.{name}` (its {key}) is not set")
        return str(value)

    def option(self, key: str, default: str) -> str:
        """A template option rendered over `env` (`default` when absent); its `t()` (a phone's
        `greeting:`) in the bot's first locale, the one a channel speaks before it knows the user's."""
        if key not in self._options:
            text, catalogs = self.config.options.get(key), self.bot.catalogs
            context: dict[str, Any] = {"env": Environment(self.bot.env)}
            if catalogs is not None:
                context |= {"locale": catalogs.default, CATALOGS_KEY: catalogs}
            self._options[key] = ENV.from_string(text).render(context) if isinstance(text, str) else default
        return self._options[key]

    def text_size(self, text: str) -> int:
        """A text's length as the platform counts it against `max_text` (characters, unless the
        kind says otherwise: Telegram's UTF-16 units, the Bot Connector's bytes)."""
        return len(text)

    def fitted(self, messages: list[Outgoing]) -> list[Outgoing]:
        """The messages as the platform takes them: one over `max_text` (`max_button_text` for
        the part its buttons go under) split at paragraph, line, sentence or word boundaries into
        several, the buttons under the last. The same reply always gives the same messages, so
        the outbox's count of those the platform took stays right for a retry."""
        if self.max_text is None:
            return messages
        out: list[Outgoing] = []
        for message in messages:
            if message.whatsapp_template is not None:  # the template is sent, not the text
                out.append(message)
                continue
            pieces = split_text(message.text, self.max_text, self.text_size)
            if message.buttons and self.max_button_text is not None:
                pieces[-1:] = split_text(pieces[-1], self.max_button_text, self.text_size)
            out.extend(Outgoing(piece) for piece in pieces[:-1])
            out.append(Outgoing(pieces[-1], message.buttons))
        return out

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Raise Unauthorized unless the delivery is the platform's own."""
        raise NotImplementedError

    async def averify(self, headers: Mapping[str, str], body: bytes) -> None:
        """`verify`, for a kind whose check may wait on the network (Teams' signing keys)."""
        self.verify(headers, body)

    def read(self, body: bytes, headers: Mapping[str, str]) -> Any:
        """A verified delivery's payload (JSON unless the kind says otherwise); ValueError if unreadable."""
        return json.loads(body)

    def handshake(self, payload: Any) -> dict[str, Any] | None:
        """The answer to a delivery that is the platform checking the URL (Slack's
        url_verification), not a user's message; None for every other delivery."""
        return None

    def subscribe(self, query: Mapping[str, str]) -> str | None:
        """The answer to the platform's GET checking the webhook URL (WhatsApp's hub.challenge),
        or None when the query is not the platform's (then 403)."""
        return None

    def sequence_scope(self) -> str | None:
        """What the platform numbers its deliveries within (`Inbound.sequence`): Telegram's bot;
        None for a platform whose deliveries are not numbered in order."""
        return None

    def inbound(self, payload: Any) -> list[Inbound]:
        """The user messages in a verified delivery (none for what is not one: an edit, a join)."""
        raise NotImplementedError

    async def send(self, client: httpx.AsyncClient, address: dict[str, Any], message: Outgoing) -> None:
        """Post one message to the conversation at `address`; SendFailed when the platform refuses."""
        raise NotImplementedError

    async def named(self, client: httpx.AsyncClient, inbound: Inbound) -> Inbound:
        """The message with its sender's display name, for a platform whose deliveries carry only
        the sender's id (Slack: users.info); as it is for the others."""
        return inbound

    async def after(self, client: httpx.AsyncClient, inbound: Inbound) -> None:
        """What the platform wants once a message is handled (Telegram: answer a button's callback)."""

    async def stream_start(self, client: httpx.AsyncClient, address: dict[str, Any], text: str) -> dict[str, Any]:
        """Post the first chunks of a streamed reply; the handle `stream_update` and `replace` use."""
        raise NotImplementedError

    async def stream_update(self, client: httpx.AsyncClient, handle: dict[str, Any], message: Outgoing) -> None:
        """Show more of a streamed reply in the message `stream_start` posted."""
        raise NotImplementedError

    async def replace(self, client: httpx.AsyncClient, handle: dict[str, Any], message: Outgoing) -> None:
        """Make the streamed message the reply's first message: the committed text, or the
        failure's when the turn rolled back (`stream_update`, unless the kind needs more)."""
        await self.stream_update(client, handle, message)

    async def call(self, client: httpx.AsyncClient, method: str, url: str, who: str, api: str,
                   **options: Any) -> httpx.Response:
        """One call of the platform's API (`options`: httpx's json, data, headers), its answer read
        whole within `timeout` seconds in all and at most MAX_ANSWER_BYTES of it. httpx's own
        timeout is per read: a platform trickling its answer in would hold the outbox's claim past
        its lease (and another replica would send the reply again), and a huge answer would be
        read whole. SendFailed names `who` ("slack chat.postMessage") and the `api` it could not reach."""
        request = client.build_request(method, url, timeout=self.timeout, **options)
        try:
            async with asyncio.timeout(self.timeout):
                response = await client.send(request, stream=True)
                try:
                    body = await _capped(response, f"{who}: {api} answered more than {MAX_ANSWER_BYTES} bytes")
                finally:
                    await response.aclose()
        except TimeoutError:
            raise SendFailed(f"{who}: no answer from {api} within {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise SendFailed(f"{who}: cannot reach {api} ({type(exc).__name__})") from None
        # the body as read (decoded): the answer without the headers that described it on the wire
        headers = [(k, v) for k, v in response.headers.multi_items()
                   if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(response.status_code, headers=headers, content=body, request=request)

    async def fetch(self, client: httpx.AsyncClient, file: InboundFile, limit: int) -> bytes:
        """The bytes of a user's file (at most `limit`); FetchFailed when they cannot be had."""
        raise FetchFailed(f"{self.kind}: files are not read on this channel")

    async def download(self, client: httpx.AsyncClient, url: str, limit: int, what: str,
                       headers: Mapping[str, str] | None = None) -> bytes:
        """GET a file's bytes, read as they come and given up past `limit` (never whole first)."""
        data = bytearray()
        try:
            async with client.stream("GET", url, headers=headers, timeout=self.timeout) as response:
                if response.status_code != 200:
                    raise FetchFailed(f"{self.kind} {what}: the platform answered {response.status_code}")
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise FetchFailed(f"{self.kind} {what}: the file is over {limit} bytes", too_large=True)
        except httpx.HTTPError as exc:
            raise FetchFailed(f"{self.kind} {what}: cannot reach the platform ({type(exc).__name__})") from None
        return bytes(data)


async def _capped(response: httpx.Response, too_large: str) -> bytes:
    """A streamed answer's body, SendFailed(`too_large`) past MAX_ANSWER_BYTES."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise SendFailed(too_large, response.status_code)
    return bytes(body)


# Where a sentence ends: its mark (and a closing quote or bracket) before a space; CJK's marks
# need none.
SENTENCE_END = re.compile(r"""[.!?…؟۔।]["'”’)\]]*(?=\s)|[。！？]""")  # (؟ ۔: Arabic, Urdu; ।: Devanagari)


def split_text(text: str, limit: int, size: Callable[[str], int] = len) -> list[str]:
    """`text` in pieces of at most `limit` (by `size`), each cut at the last paragraph break
    before the limit, else line break, else sentence end, else space (each only when it leaves
    the piece at least half full), else at the limit; the whitespace at a cut is dropped (the
    messages' own break shows it). At least one piece, each non-empty unless the text is."""
    pieces: list[str] = []
    rest = text
    while size(rest) > limit:
        cut = _boundary(rest, _fitting(rest, limit, size))
        piece, rest = rest[:cut].rstrip(), rest[cut:].lstrip()
        if piece:
            pieces.append(piece)
    if rest or not pieces:
        pieces.append(rest)
    return pieces


def _fitting(text: str, limit: int, size: Callable[[str], int]) -> int:
    """The most characters of `text`'s start within `limit` (at least one: no piece is empty)."""
    if size is len:
        return max(1, limit)
    low, high = 1, min(len(text), limit)  # (no unit counts a character as less than one)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if size(text[:middle]) <= limit else (low, middle - 1)
    return low


def _boundary(text: str, n: int) -> int:
    """Where to cut `text`, whose first `n` characters fit: the last good boundary at or before n."""
    least = n // 2
    for mark in ("\n\n", "\n"):
        at = text.rfind(mark, 0, n + len(mark))
        if at >= max(least, 1):
            return at
    ends = [m.end() for m in SENTENCE_END.finditer(text, 0, n + 1) if least <= m.end() <= n]
    if ends:
        return ends[-1]
    at = text.rfind(" ", 0, n + 1)
    return at if at >= max(least, 1) else n


def local_number(number: str, locale: str | None) -> str:
    """A number (as Python writes it) in the locale's digits and separators (English: as it is)."""
    if locale and builtin_locale(locale) != "en":
        from babel.numbers import format_decimal  # only a bot with locales: has a locale

        return str(format_decimal(float(number), locale=locale.replace("-", "_")))
    return number


def too_long_notice(session: Session, limit: int, spoken: bool = False) -> str:
    """What a user reads when their message is over the server's --max-message-chars (chatrun's
    texts `channel_too_long_one`/`_other` by the limit's plural form, which a bot's
    `page.channel_too_long_*` replace), the limit stated; a caller (`spoken`) hears
    `phone_too_long` (no count of characters)."""
    texts = page_texts(session.bot.config.catalogs, session.locale)
    if spoken:
        return texts["phone_too_long"]
    return said_count(texts, "channel_too_long", session.locale, limit, limit=local_number(str(limit), session.locale))


def at_limit_notice(bot: BotConfig, wanted: str | None, limit: int) -> tuple[str, str | None]:
    """What a user reads (a caller hears) when their new conversation is refused because they own
    --max-sessions-per-principal sessions already, and its locale: chatrun's text
    `channel_too_many_sessions` (a bot's `page.channel_too_many_sessions` replaces it), the limit
    stated, in the declared locale that best matches the one the platform says (`wanted`), as a
    session's would be: there is no session (making one is what was refused)."""
    locale = bot.catalogs.negotiate(wanted) if bot.catalogs is not None else None
    texts = page_texts(bot.catalogs, locale)
    return said(texts, "channel_too_many_sessions", limit=local_number(str(limit), locale)), locale


def media_type_of(value: Any, default: str = "application/octet-stream") -> str:
    """A platform's MIME type as a media type: lower case, without parameters (`; codecs=opus`)."""
    text = str(value or "").split(";", 1)[0].strip().lower()
    return text or default


def outgoing(events: list[dict[str, Any]], sources: str = "Sources") -> list[Outgoing]:
    """A reply's events for the user as plain messages: texts, and the buttons of choices and of
    the items the user decides (an approval's Yes/No) on the message before them. `sources`: the
    heading of its Sources (chatrun's text `sources` in the reply's locale)."""
    out: list[Outgoing] = []
    for event in events:
        kind, data = event.get("type"), event.get("data")
        if kind in (ev.MESSAGE, ev.ERROR) and isinstance(data, str) and data:
            template = (event.get("meta") or {}).get("whatsapp_template")
            out.append(Outgoing(data, whatsapp_template=(str(template["name"]), str(template["language"]))
                                if isinstance(template, dict) else None))
        elif kind == ev.OBJECT:
            out.append(Outgoing(_object_text(data)))
        elif kind == ev.CHOICES and isinstance(data, dict):
            _with_buttons(out, "", data.get("choices"), asked=True)
        elif kind == ev.SOURCES and isinstance(data, dict) and (text := sources_text(data, sources)):
            out.append(Outgoing(text))
        elif kind == ev.PENDING and isinstance(data, dict):
            text = str(data.get("ask") or "")
            if not data.get("choices") and data.get("reply"):
                text = f"{text}\n{data['reply']}".strip()
            _with_buttons(out, text, data.get("choices"), item=str(data.get("id") or ""))
    return out


# A button of a pending item's question says which item it answers: the value, "#", the item's
# id. A chat keeps its old messages, and a press on an answered question's button must not
# answer the question asked since (door.py reads it back: `pressed`).
_PRESSED = re.compile(r"(?s)(.+)#(p\d+)")


def press_value(value: str, item: str) -> str:
    return f"{value}#{item}" if item else value


def pressed(inbound: Inbound) -> tuple[str, str] | None:
    """(the value, the item) a press on a pending item's button sent; None for any other
    message (a typed "order #p12" is a message, whatever it ends with)."""
    return _value_and_item(inbound.text) if inbound.pressed else None


def _value_and_item(value: str) -> tuple[str, str] | None:
    found = _PRESSED.fullmatch(value)
    return (found.group(1), found.group(2)) if found else None


def sources_text(data: dict[str, Any], heading: str = "Sources") -> str:
    """A reply's Sources event as a message: each cited passage's title and link, numbered."""
    lines = [f"{i}. {s.get('title') or s.get('ref')}" + (f" — {s['url']}" if isinstance(s.get("url"), str) else "")
             for i, s in enumerate((s for s in data.get("sources") or () if isinstance(s, dict)), 1)]
    return f"{heading}:\n" + "\n".join(lines) if lines else ""


def _with_buttons(out: list[Outgoing], text: str, choices: Any, item: str = "", asked: bool = False) -> None:
    buttons = [(str(c.get("label", c.get("value"))), press_value(str(c.get("value", c.get("label"))), item))
               for c in choices or () if isinstance(c, dict)]
    if asked and out and [(label, (_value_and_item(value) or (value, ""))[0]) for label, value in out[-1].buttons] == buttons:
        return  # the same buttons again (a confirmation's Yes/No follow its question): shown once
    if not text and out and not out[-1].buttons:
        out[-1] = Outgoing(out[-1].text, buttons)  # the buttons go under the question just asked
    else:
        out.append(Outgoing(text or "…", buttons))


def _object_text(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, indent=1)
