"""The phone, through Twilio ConversationRelay (docs/channels.md, "The phone"): Twilio does the
speech both ways; chatrun reads and writes text over a WebSocket.

1. `POST /channels/{bot}/twilio`: the number's voice webhook (a form signed with
   X-Twilio-Signature: base64 HMAC-SHA1 of the URL and the sorted POST parameters, keyed with
   the account's auth token). A wrong signature gets 401 and no call. The answer is TwiML that
   connects the call to the relay socket, whose URL carries a token chatrun signed for this
   call (`relay_token`): only the call Twilio announced may open a socket, and its `setup`
   (unsigned) must name the CallSid and From the signed webhook gave, so whoever holds the
   token cannot choose the caller, hence the principal (`check_setup`). The first webhook
   claims the CallSid in the store: the same webhook posted again (a captured one replayed)
   gets 409 and no token, whenever it comes (store/replays.py: CALL_CLAIM_AGE).
2. `/channels/{bot}/twilio/relay`: Twilio's messages (setup, prompt, interrupt, dtmf, error).
   Each complete prompt (or DTMF digit) runs one turn of the call's session (one per CallSid,
   as the principal `twilio:<caller's number>`, or `twilio:anonymous:<CallSid>` when the number is
   withheld: `caller_principal`); its reply is streamed down the socket as
   `text` tokens, not through the outbox (a live call has no later). An `interrupt` cancels
   the running turn (it rolls back) and the next prompt tells the model what the caller heard.
3. An operator's takeover (`operator:`) or an ended conversation sends `end`: Twilio then asks
   `POST /channels/{bot}/twilio/ended` (signed too), which dials `handoff_to` or hangs up. An
   operator's written message to the call's session is refused (engine/waiting.py
   `check_decision`): the caller is reached on the line, not in writing.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time
import warnings
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode
from xml.sax.saxutils import escape, quoteattr

import httpx
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from chatrun import events as ev
from chatrun.definition.page_texts import page_texts, said
from chatrun.engine.follow_up import CALL
from chatrun.engine.pending import TAKEOVER
from chatrun.errors import ChatrunError, SessionError
from chatrun.server import wire
from chatrun.server.audience import USER_ONLY, history_for
from chatrun.server.auth import Auth, AuthFileWarning, Principal
from chatrun.server.channels.base import (
    ChannelKind,
    Inbound,
    Outgoing,
    SendFailed,
    Unauthorized,
    at_limit_notice,
    session_id_for,
    too_long_notice,
)
from chatrun.server.http import ERROR_RESPONSES
from chatrun.server.plumbing import Registry
from chatrun.server.session_writes import QuotaRefused
from chatrun.server.sessions import OPEN
from chatrun.store import replays

if TYPE_CHECKING:
    from chatrun.server.channels.door import Channels
    from chatrun.server.sessions import SessionRegistry

log = logging.getLogger("chatrun.channels")

KIND = "twilio"
SIGNATURE_HEADER = "x-twilio-signature"
RELAY_TTL = 4 * 3600  # seconds a relay URL may open a socket: Twilio's longest call
POLICY_VIOLATION = 1008  # the WebSocket close code of a socket that is not the call's
NOTE = "(The caller "  # an interrupt's note starts so, on a line of its own before the caller's words
# What Twilio's From holds for a caller whose number is withheld (lower case, without spaces):
# its words, and the numbers that spell them on a keypad (+266696687 is ANONYMOUS).
WITHHELD = frozenset({"", "anonymous", "restricted", "unknown", "unavailable", "blocked", "private",
                      "+266696687", "+7378742833", "+86282452253", "+2562533", "266696687"})
ANONYMOUS = f"{KIND}:anonymous"  # the prefix of a withheld caller's principal: `twilio:anonymous:<CallSid>`


@dataclass(frozen=True)
class CallOf:
    """A call as the signed voice webhook names it: its CallSid and the caller's number (From: the
    principal `twilio:<From>`). The number called (To) is not bound: nothing reads it, and a
    setup that wrote it otherwise than the webhook (a SIP address) would refuse every call."""

    call_sid: str
    caller: str


def withheld(caller: str) -> bool:
    """Whether Twilio's From names no caller (a withheld, restricted or unknown number)."""
    return caller.strip().replace(" ", "").lower() in WITHHELD


def caller_principal(channels: Channels, call: CallOf) -> Principal:
    """The call's principal: `twilio:<From>`, with the roles the auth file's `principals:` gives
    it; a caller whose number is withheld is `twilio:anonymous:<CallSid>`, a principal of this
    call alone (never one every withheld caller shares: their user memory, sessions, roles), and
    has no roles whatever the auth file says (server/auth.py warns of an entry naming one)."""
    if withheld(call.caller):
        return Principal(f"{ANONYMOUS}:{call.call_sid}")
    return channels.principal(KIND, Inbound("", call.call_sid, call.caller, "", {}))


def warn_withheld_entries(auth: Auth | None) -> None:
    """Warn of each auth file `principals:` entry naming a caller whose number is withheld
    (`twilio:anonymous`, `twilio:+266696687`...): it gives its roles to no one (`caller_principal`)."""
    if auth is None:
        return
    for name in auth.principals:
        kind, _, caller = name.partition(":")
        if kind == KIND and (withheld(caller) or name.startswith(ANONYMOUS + ":")):
            warnings.warn(f"{auth.source}: principals.{name}: gives its roles to no one: a caller whose number is "
                          f"withheld is a principal of their call alone ({ANONYMOUS}:<CallSid>) and has no roles; "
                          "give roles to callers by their number (twilio:+14155550123), or remove the entry",
                          AuthFileWarning, stacklevel=2)


@dataclass(frozen=True)
class RelayGrant:
    """What a relay token was signed for: the call, and the digest binding its caller (`check_setup`)."""

    call_sid: str
    bound: str


class Twilio(ChannelKind):
    """A Twilio number. Its webhook and socket are routes of their own (make_twilio_router), not
    the shared webhook: the reply streams down the live call instead of through the outbox."""

    kind = KIND

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        raise Unauthorized("twilio: a call is checked by its URL (check_signature), not by the shared webhook")

    def check_signature(self, url: str, params: list[tuple[str, str]], signature: str) -> None:
        """Twilio's request signature: base64(HMAC-SHA1(auth token, URL + each POST parameter's
        name and value, sorted by name)). Unauthorized unless it matches."""
        data = url + "".join(f"{name}{value}" for name, value in sorted(params, key=lambda p: p[0]))
        expected = base64.b64encode(hmac.new(self.secret("auth_token").encode(), data.encode(),
                                             hashlib.sha1).digest()).decode()
        # (compared as bytes: a forged header may hold characters compare_digest refuses in a str)
        if not signature or not hmac.compare_digest(expected.encode(), signature.encode()):
            raise Unauthorized(f"twilio: the {SIGNATURE_HEADER} header is missing or wrong")

    def relay_token(self, call: CallOf, now: float | None = None) -> str:
        """The token in a call's relay URL: the CallSid, an expiry, the call's binding (a keyed
        digest of its CallSid and From, as the signed webhook gave them: the number is not in
        the URL) and the HMAC-SHA256 of all three, keyed with a key derived from the auth token."""
        expires = int((now if now is not None else time.time()) + RELAY_TTL)
        bound = self._binding(call)
        return f"{call.call_sid}.{expires}.{bound}.{self._mac('chatrun relay', call.call_sid, str(expires), bound)}"

    def check_relay_token(self, token: str, now: float | None = None) -> RelayGrant:
        """What a relay token was signed for; Unauthorized when forged or expired."""
        parts = token.rsplit(".", 3)
        if len(parts) != 4 or not all(parts) or not parts[1].isdigit():
            raise Unauthorized("twilio: the relay URL has no token")
        call_sid, expires, bound, mac = parts
        if not hmac.compare_digest(mac.encode(), self._mac("chatrun relay", call_sid, expires, bound).encode()):
            raise Unauthorized("twilio: the relay token is forged")
        if int(expires) < (now if now is not None else time.time()):
            raise Unauthorized("twilio: the relay token expired")
        return RelayGrant(call_sid, bound)

    def check_setup(self, grant: RelayGrant, setup: Mapping[str, Any]) -> CallOf:
        """The call a relay's `setup` names (its callSid and from: unsigned) when it is the one
        the signed webhook gave the token for; Unauthorized otherwise: a relay token does not let
        whoever holds it choose the caller, hence the principal (docs/channels.md, "The phone")."""
        call = CallOf(str(setup.get("callSid") or ""), str(setup.get("from") or ""))
        if call.call_sid != grant.call_sid:
            raise Unauthorized(f"twilio: the relay token is for call {grant.call_sid}, the setup names another call")
        if not hmac.compare_digest(self._binding(call).encode(), grant.bound.encode()):
            raise Unauthorized(f"twilio: the setup of call {grant.call_sid} names another caller or number than its "
                               "signed voice webhook (From): a relay token used by someone else?")
        return call

    def _binding(self, call: CallOf) -> str:
        """The digest binding a relay token to its call's CallSid and From (keyed: a phone
        number's few digits cannot be tried against it without the auth token)."""
        return self._mac("chatrun relay caller", call.call_sid, call.caller)[:32]

    def _mac(self, purpose: str, *fields: str) -> str:
        """HMAC-SHA256 of the bot and `fields` (as a JSON list: no two lists of fields alike),
        keyed with a key derived from the auth token for `purpose` (so a token never reveals it)."""
        key = hmac.new(self.secret("auth_token").encode(), purpose.encode(), hashlib.sha256).digest()
        message = json.dumps([self.bot.name, *fields]).encode()  # (ASCII: any text encodes)
        return hmac.new(key, message, hashlib.sha256).hexdigest()

    def public_base(self, request_base: str) -> str:
        """The server's public URL (the `public_url` option, else the request's own)."""
        return self.option("public_url", request_base).rstrip("/")

    def inbound(self, payload: Any) -> list[Inbound]:
        return []  # a call's messages arrive on its socket (Call), never on the shared webhook

    async def send(self, client: httpx.AsyncClient, address: dict[str, Any], message: Outgoing) -> None:
        raise SendFailed("twilio: a call's replies go down its socket; a call that is over cannot be written to")


def make_twilio_router() -> APIRouter:
    """The phone's routes; included before the shared webhook, whose path the first one shares."""
    twiml: dict[int | str, dict[str, Any]] = {200: {"description": "TwiML", "content": {"application/xml": {"schema": {"type": "string"}}}}}
    router = APIRouter(tags=["channels"], responses=ERROR_RESPONSES)
    router.add_api_route(f"/channels/{{bot}}/{KIND}", answer_call, methods=["POST"], response_class=Response,
                         responses=twiml,
                         summary="Twilio's voice webhook: TwiML connecting the call to its relay socket")
    router.add_api_route(f"/channels/{{bot}}/{KIND}/ended", relay_ended, methods=["POST"], response_class=Response,
                         responses=twiml,
                         summary="Twilio's <Connect action>: the call after its relay ended (hand-off or hang-up)")
    router.add_api_websocket_route(f"/channels/{{bot}}/{KIND}/relay", relay)
    return router


def _twilio(registry: SessionRegistry, bot: str) -> Twilio:
    config = registry.bot(bot).config
    channel = registry.channels.of(config, KIND)
    if not isinstance(channel, Twilio):
        raise wire.RequestFailed(wire.NOT_FOUND, f"bot {bot} has no channel {KIND!r} "
                                 f"(its channels: {', '.join(config.channels) or 'none'})")
    return channel


async def _signed_form(channel: Twilio, request: Request) -> list[tuple[str, str]] | None:
    """The POST's parameters when Twilio signed them for this URL, else None (logged)."""
    params = parse_qsl((await request.body()).decode(errors="replace"), keep_blank_values=True)
    url = channel.public_base(str(request.base_url)) + request.url.path
    if request.url.query:
        url += "?" + request.url.query
    try:
        channel.check_signature(url, params, request.headers.get(SIGNATURE_HEADER, ""))
    except Unauthorized as exc:
        log.warning("channel twilio of bot %s: refused a request: %s", channel.bot.name, exc)
        return None
    return params


def _twiml(inner: str) -> Response:
    return Response(f'<?xml version="1.0" encoding="UTF-8"?><Response>{inner}</Response>',
                    media_type="application/xml")


async def answer_call(bot: str, request: Request, registry: Registry) -> Response:
    channel = _twilio(registry, bot)
    params = await _signed_form(channel, request)
    if params is None:
        return JSONResponse({"ok": False, "error": "unauthorized"}, status_code=401)
    form = dict(params)
    call = CallOf(form.get("CallSid", ""), form.get("From", ""))
    call_sid = call.call_sid
    if not call_sid:
        raise wire.RequestFailed(wire.BAD_REQUEST, "a Twilio voice webhook without a CallSid")
    if not await _first_webhook(registry, bot, call_sid):
        log.warning("channel twilio of bot %s: refused a voice webhook for call %s: the call was answered "
                    "before (a replayed webhook?)", bot, call_sid)
        raise wire.RequestFailed(wire.SESSION_EXISTS, f"call {call_sid} is already connected: a voice webhook gets a "
                                 "relay token only once per call")
    base = channel.public_base(str(request.base_url))
    socket = base.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    relay_url = f"{socket}/channels/{bot}/{KIND}/relay?" + urlencode({"token": channel.relay_token(call)})
    greeting = welcome_greeting(channel)
    attributes = f"url={quoteattr(relay_url)} dtmfDetection=\"true\""
    if greeting:
        attributes += f" welcomeGreeting={quoteattr(greeting)}"
    catalogs = channel.bot.catalogs  # the bot's first locale: what the caller's first words are heard in
    if catalogs is not None:
        attributes += f" language={quoteattr(speech_language(catalogs.default))}"
    action = quoteattr(f"{base}/channels/{bot}/{KIND}/ended")
    return _twiml(f"<Connect action={action}><ConversationRelay {attributes}/></Connect>")


def welcome_greeting(channel: Twilio) -> str:
    """What Twilio says when it picks up, before the caller's first word (so in the bot's first
    locale, the language it hears them in): the bot's `page.phone_greeting` there, else the
    channel's `greeting:` (a bot without `locales:`, or one that says none); '' says nothing."""
    catalogs = channel.bot.catalogs
    own = page_texts(catalogs, catalogs.default)["phone_greeting"] if catalogs is not None else ""
    return own or channel.option("greeting", "")


async def _first_webhook(registry: SessionRegistry, bot: str, call_sid: str) -> bool:
    """Whether this is the call's first voice webhook: it claims the CallSid in the store
    (store/replays.py, atomic across replicas), so the same webhook posted again, at any moment
    after (a captured one replayed to get a relay token), is refused, as is one for a call whose
    session exists (a call answered before the claim was made). A new call has a CallSid of its own."""
    claimed = await replays.claim(registry.store, f"{KIND}-call:{bot}:{call_sid}", time.time() + replays.CALL_CLAIM_AGE)
    return claimed and await registry.store.version(session_id_for(bot, KIND, call_sid)) is None


async def relay_ended(bot: str, request: Request, registry: Registry) -> Response:
    """The relay is over: a hand-off names a number to dial (from `end`'s handoffData)."""
    channel = _twilio(registry, bot)
    params = await _signed_form(channel, request)
    if params is None:
        return JSONResponse({"ok": False, "error": "unauthorized"}, status_code=401)
    try:
        handoff = json.loads(dict(params).get("HandoffData") or "{}")
    except ValueError:
        handoff = {}
    number = handoff.get("to") if isinstance(handoff, dict) else None
    if isinstance(number, str) and number:
        return _twiml(f"<Dial>{escape(number)}</Dial>")
    return _twiml("<Hangup/>")


async def relay(websocket: WebSocket, bot: str) -> None:
    registry: SessionRegistry = websocket.app.state.registry
    try:
        channel = _twilio(registry, bot)
        grant = channel.check_relay_token(websocket.query_params.get("token", ""))
    except (Unauthorized, wire.RequestFailed, ChatrunError) as exc:
        log.warning("channel twilio of bot %s: refused a relay socket: %s", bot, exc)
        await websocket.close(code=POLICY_VIOLATION)
        return
    await websocket.accept()
    await Call(registry, channel, websocket, grant).run()


def one_line(text: str) -> str:
    """A text on one line (an interrupt's note is the first line of the prompt it goes before)."""
    return " ".join(text.split())


def words_of(text: str) -> str:
    """The caller's words of a turn's input: the input without an interrupt's note."""
    return text.split("\n", 1)[1] if text.startswith(NOTE) and "\n" in text else text


@dataclass
class Spoken:
    """What a turn said on the call: its text, and the digits its choices were offered under
    (read in the session's locale)."""

    session: Any
    text: str = ""
    digits: dict[str, str] = field(default_factory=dict)


def same_language(locale: str, other: str | None) -> bool:
    """Whether two BCP 47 tags name the same language (de and de-AT do)."""
    return other is not None and locale.replace("_", "-").split("-")[0].lower() == other.split("-")[0].lower()


def speech_language(locale: str) -> str:
    """The tag Twilio speaks `locale` in: as written when it names a region (de-AT), else with
    the region CLDR finds likely for its language (de: de-DE, en: en-US, ar: ar-EG)."""
    parts = locale.replace("_", "-").split("-")
    if len(parts) > 1:
        return "-".join(parts)
    from babel.core import get_global  # only a bot with locales: has a locale

    likely = str(get_global("likely_subtags").get(parts[0].lower()) or "").split("_")
    return f"{parts[0].lower()}-{likely[-1]}" if len(likely) > 1 and len(likely[-1]) == 2 else locale


class Call:
    """One relay socket of a call: Twilio's messages in, the turns' tokens out (module doc)."""

    def __init__(self, registry: SessionRegistry, channel: Twilio, websocket: WebSocket, grant: RelayGrant):
        self.registry, self.channel, self.ws, self.grant = registry, channel, websocket, grant
        self.call_sid = grant.call_sid
        self.bot = channel.bot.name
        self.principal: Principal | None = None
        self.running: asyncio.Task[None] | None = None
        self.prompt: str | None = ""  # the prompt being answered (an interrupt's note); None: a notice
        self.partial = ""  # a prompt's parts until its `last` (at most --max-message-chars: hear)
        self.overlong = False  # a prompt refused as too long before its `last`: its parts are dropped
        self.heard: str | None = None  # a note for the next prompt: what the interrupted caller heard
        self.digits: dict[str, str] = {}  # the choices just offered, by digit
        self.first = True  # the socket's first prompt may be Twilio re-sending a committed one
        self.locale: str | None = None  # the call's language, as Twilio last said it (a prompt's `lang`)
        self.heard_through: int | None = None  # the session's last turn the caller heard (catch_up)

    async def run(self) -> None:
        try:
            while True:
                raw = await self.ws.receive_text()
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(message, dict) and not await self.on(message):
                    return
        except Exception as exc:  # noqa: BLE001 - the socket closed (Twilio hung up, or dropped it)
            log.info("channel twilio of bot %s: call %s socket closed: %s", self.bot, self.call_sid,
                     type(exc).__name__)
        # A turn still running goes on to its commit (held by the app's channels, which cancel it
        # when the app stops): a prompt Twilio sends again on a new socket replays it (request_id).
        if self.running is not None and not self.running.done():
            channels = self.registry.channels
            channels.running.add(self.running)
            self.running.add_done_callback(channels.finished)

    async def on(self, message: dict[str, Any]) -> bool:
        """Handle one of Twilio's messages; False when the socket is the wrong call's."""
        kind = message.get("type")
        if kind == "setup":
            try:
                call = self.channel.check_setup(self.grant, message)
            except Unauthorized as exc:  # (nothing has run: no session, no turn)
                log.warning("channel twilio of bot %s: call %s: refused the relay socket: %s", self.bot,
                            self.call_sid, exc)
                await self.ws.close(code=POLICY_VIOLATION)
                return False
            self.principal = caller_principal(self.registry.channels, call)
        elif self.principal is None:
            return True  # nothing before the setup
        elif kind == "prompt":
            self.locale = message.get("lang") or self.locale
            await self.hear(str(message.get("voicePrompt") or ""), bool(message.get("last", True)))
        elif kind == "dtmf":
            digit = str(message.get("digit") or "")
            if not wire.says_nothing(digit, ()):
                await self.start(self.digits.get(digit, digit))
        elif kind == "interrupt":
            await self.interrupt(str(message.get("utteranceUntilInterrupt") or ""))
        elif kind == "error":
            log.warning("channel twilio of bot %s: call %s: Twilio reports %s", self.bot, self.call_sid,
                        message.get("description"))
        return True

    async def hear(self, part: str, last: bool) -> None:
        """A part of a prompt: the prompt runs at its `last`, or is refused as too long as soon as
        its parts are over --max-message-chars (the rest of its parts then dropped, not kept)."""
        if self.overlong:
            self.overlong = not last
            return
        self.partial += part
        over = self.registry.channels.limits.message_too_long(self.partial.strip()) is not None
        if last or over:
            text, self.partial, self.overlong = self.partial.strip(), "", over and not last
            if not wire.says_nothing(text, ()):  # silence heard as a prompt runs no turn
                await self.start(text)  # (which refuses one too long)

    async def interrupt(self, heard: str) -> None:
        """The caller spoke over the reply: the running turn is cancelled (it rolls back, the
        prompt with it) and the next prompt carries what was asked and what the caller heard."""
        if self.prompt is None:
            return  # the caller spoke over a notice (a prompt refused), not over an answer
        if self.running is not None and not self.running.done():
            self.running.cancel()
            await asyncio.gather(self.running, return_exceptions=True)
            self.heard = f'{NOTE}asked "{one_line(self.prompt)}"; you began to answer and they interrupted you ' \
                         f'after hearing: "{one_line(heard)}".)'
        elif heard:
            self.heard = f'{NOTE}interrupted your last answer after hearing: "{one_line(heard)}".)'

    async def start(self, words: str) -> None:
        if self.running is not None and not self.running.done():
            await asyncio.gather(self.running, return_exceptions=True)  # one turn at a time, in order
        if (too_long := self.registry.channels.limits.message_too_long(words)) is not None:
            # No turn, as on every door; the limit is on the caller's words, not on an interrupt's
            # note, which waits for the next prompt. The notice is not the model's answer: the
            # caller speaking over it is nothing to tell the model (prompt None).
            self.prompt = None
            self.running = asyncio.ensure_future(self.refuse(too_long))
            return
        self.prompt = words  # the caller's own words (an interrupt's note names them, not an earlier note)
        text = words
        if self.heard is not None:
            text, self.heard = f"{self.heard}\n{words}", None
        self.running = asyncio.ensure_future(self.turn(text, words))

    async def send(self, message: dict[str, Any]) -> None:
        try:
            await self.ws.send_text(json.dumps(message, ensure_ascii=False))
        except Exception:  # noqa: BLE001 - the socket is gone: the turn still commits
            pass

    async def say(self, token: str, last: bool = False) -> None:
        await self.send({"type": "text", "token": token, "last": last})

    def session(self) -> AbstractAsyncContextManager[Any]:
        """The call's session (one per CallSid), held for one prompt."""
        return self.registry.session(self.bot, session_id_for(self.bot, KIND, self.call_sid), self.principal, OPEN,
                                     locale=self.locale, meta={CALL: self.call_sid}, channel=True)  # (no follow-ups)

    async def refuse(self, why: str) -> None:
        """A prompt over --max-message-chars: the caller hears why, in the session's locale (a call
        has no outbox: its socket), and nothing is kept."""
        log.warning("channel twilio of bot %s: call %s: a prompt refused: %s", self.bot, self.call_sid, why)
        self.first = False  # (a prompt sent again after a dropped socket would have been its first)
        try:
            async with self.session() as session:
                await self.agree(session)
                await self.say(too_long_notice(session, self.registry.channels.limits.max_message_chars,
                                               spoken=True))
        except QuotaRefused as exc:
            await self.at_limit(exc)
        except (wire.RequestFailed, SessionError, ChatrunError) as exc:
            log.warning("channel twilio of bot %s: call %s: %s", self.bot, self.call_sid, exc)
        await self.say("", last=True)

    async def turn(self, text: str, words: str) -> None:
        """One prompt's turn: `text` reaches the model (an interrupt's note before the caller's `words`)."""
        handoff: dict[str, Any] | None = None
        try:
            async with self.session() as session:
                run = self.registry.turn(session, text, self.request_id(session, words))
                missed = Spoken(session)  # (its choices are read, and stand until the turn offers its own)
                await self.catch_up(session, missed)
                if session.ended is not None and not await run.is_replay():
                    handoff = {"reason": "ended"}
                else:
                    spoken = Spoken(session)
                    async for event in run:
                        await self.speak(event, spoken)
                    self.digits = spoken.digits or missed.digits
                    handoff = self.handoff(session)
                self.heard_through = session.turn_count
        except QuotaRefused as exc:
            await self.at_limit(exc)
        except (wire.RequestFailed, SessionError, ChatrunError) as exc:  # the caller hears silence, then may ask again
            log.warning("channel twilio of bot %s: call %s: a prompt refused: %s", self.bot, self.call_sid, exc)
        await self.say("", last=True)
        if handoff is not None:
            await self.send({"type": "end", "handoffData": json.dumps(handoff)})

    async def at_limit(self, exc: QuotaRefused) -> None:
        """The call's session refused: its caller owns --max-sessions-per-principal sessions
        already. They hear why (`channel_too_many_sessions`, in the call's language), not silence."""
        log.warning("channel twilio of bot %s: call %s: no session: %s", self.bot, self.call_sid, exc.message)
        await self.say(at_limit_notice(self.channel.bot, self.locale, exc.limit)[0])

    async def catch_up(self, session: Any, spoken: Spoken) -> None:
        """Say what the turns the caller did not send said to them since the last they heard (a
        supervisor's decision, an expired wait; an operator's written words are refused): a call
        has no outbox, so they are heard before the answer to the next prompt, once. A socket
        starts from the session's turns as it finds them."""
        if self.heard_through is None:
            self.heard_through = session.turn_count
        if session.turn_count <= self.heard_through:
            return
        since, self.heard_through = self.heard_through, session.turn_count  # (said once, even if spoken over)
        for entry in history_for(await self.registry.history(session), USER_ONLY):
            if entry.get("ok") and isinstance(entry.get("turn"), int) and entry["turn"] > since:
                for event in entry.get("events") or ():
                    await self.speak(ev.Event.from_dict(event), spoken)

    def request_id(self, session: Any, words: str) -> str:
        """The prompt's request id. The socket's first prompt, when its words are the call's last
        committed prompt's (with or without an interrupt's note before them), is Twilio sending it
        again after a dropped socket: its id, so it replays."""
        committed = self.registry.last_committed(session)
        first, self.first = self.first, False
        if first and committed and words_of(str(committed.get("input"))) == words and committed.get("requestId"):
            return str(committed["requestId"])
        return f"{KIND}:{self.call_sid}:{session.turn_count + 1}"

    def handoff(self, session: Any) -> dict[str, Any] | None:
        """The call's `end` after a turn: a takeover hands the caller to a human (`handoff_to`),
        an ended conversation hangs up; None while the conversation goes on."""
        if session.taken_over is not None or any(item.kind == TAKEOVER for item in session.pending):
            to = self.channel.option("handoff_to", "")
            return {"reason": "operator", "to": to} if to else {"reason": "operator"}
        if session.ended is not None:
            return {"reason": "ended"}
        return None

    async def agree(self, session: Any) -> None:
        """Before words in the session's locale: when Twilio speaks and hears another language (a
        bot's only locale the call was not set up in, a bot switching with `state.locale`), its
        `language` message switches both, to the locale with its likely region (`speech_language`)."""
        wanted = session.locale
        if wanted and not same_language(wanted, self.locale):
            self.locale = speech_language(wanted)
            await self.send({"type": "language", "ttsLanguage": self.locale, "transcriptionLanguage": self.locale})

    async def speak(self, event: ev.Event, spoken: Spoken) -> None:
        """One of the turn's events, as tokens: streamed chunks as they come, a message not
        streamed whole, choices read aloud with their digits; in the session's language (`agree`)."""
        kind, data = event.type, event.data
        await self.agree(spoken.session)
        if kind == ev.STREAM and isinstance(data, str):
            spoken.text += data
            await self.say(data)
        elif kind in (ev.MESSAGE, ev.ERROR) and isinstance(data, str):
            # A streamed reply's message repeats its chunks: only what it adds is said (a guarded
            # reply streams its checked sentences; its last one, or a guardrail's message, is here).
            streamed = spoken.text if kind == ev.MESSAGE and data.startswith(spoken.text) else ""
            if data != streamed:
                await self.say(data[len(streamed):] + " ")
            spoken.text = ""
        elif kind == ev.CHOICES and isinstance(data, dict):
            await self.offer(data.get("choices"), spoken)
        elif kind == ev.PENDING and isinstance(data, dict):
            if data.get("ask"):
                await self.say(str(data["ask"]) + " ")
            await self.offer(data.get("choices"), spoken)

    async def offer(self, choices: Any, spoken: Spoken) -> None:
        options = [c for c in choices or () if isinstance(c, dict)][:9]
        if not options or spoken.digits:
            return  # (a confirmation's Yes/No follow its question: read once)
        texts = page_texts(spoken.session.bot.config.catalogs, spoken.session.locale)  # chatrun's, or page.phone_*
        parts = []
        for number, choice in enumerate(options, 1):
            label = str(choice.get("label", choice.get("value")))
            spoken.digits[str(number)] = str(choice.get("value", label))
            parts.append(said(texts, "phone_choice", digit=number, label=label))
        await self.say(said(texts, "phone_choices", choices=", ".join(parts)) + " ")

