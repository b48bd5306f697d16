"""The one flow every channel shares (docs/channels.md):

1. `POST /channels/{bot}/{kind}`: the delivery's signature is checked first (a forged one
   gets 401 and runs nothing), then its body is read as the platform's JSON.
2. Each user message in it runs one turn of the conversation's session (opened, or started:
   its id is a digest of the bot, the kind and the conversation, so every replica and every
   retry finds the same one), as the principal `<kind>:<user id>` with the roles the auth
   file's `principals:` gives it. The turn's request id is the platform's delivery id: a
   delivery the platform sends again (it timed out waiting, or another replica took the
   first) is answered from the committed turn and never runs again (server/turn_run.py).
3. The reply is not sent from here: the session's `reply_to` makes each committed turn queue
   its user's events in the store's outbox with the commit (engine/session.py's _replies),
   and the outbox worker sends them through the channel (`deliver`), at least once, after the
   commit, across a crash. So a turn the platform retried three times answers once, and an
   operator's words or a supervisor's decision reach the user on their platform too.
4. A platform that wants its answer before the turn is done (Slack: `ack_within`) gets it
   only once the message is written to the store (acked.py): a replica killed after the
   answer and before the commit leaves the message to another one, which runs its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from chatrun.definition.config import BotConfig
from chatrun.engine.session import REPLY_TO
from chatrun.errors import ChatrunError, SessionError
from chatrun.server import wire
from chatrun.server.auth import Auth, Principal
from chatrun.server.channels.acked import AckedDeliveries, AckedSettings
from chatrun.server.channels.base import (
    ChannelKind,
    Inbound,
    SendFailed,
    Unauthorized,
    outgoing,
    session_id_for,
)
from chatrun.server.channels.slack import Slack
from chatrun.server.channels.teams import Teams
from chatrun.server.channels.telegram import Telegram
from chatrun.server.channels.twilio import Twilio
from chatrun.server.channels.whatsapp import WhatsApp
from chatrun.server.http import ERROR_RESPONSES
from chatrun.server.plumbing import Registry
from chatrun.server.sessions import OPEN
from chatrun.server.webhook import Attempt

if TYPE_CHECKING:
    from chatrun.server.sessions import SessionRegistry

log = logging.getLogger("chatrun.channels")

# The channel kinds, by their key under `channels:` (definition/config.py's CHANNEL_SECRETS
# lists their credentials for the validator).
CHANNELS: dict[str, type[ChannelKind]] = {kind.kind: kind for kind in (Slack, Teams, Telegram, Twilio, WhatsApp)}


class Channels:
    """The app's channels: each bot's declared ones, built from the bot's config as served now,
    and the one HTTP client that calls the platforms."""

    def __init__(self, auth: Auth | None, acked: AckedSettings | None = None):
        self.auth = auth
        self.acked = AckedDeliveries(acked)  # deliveries answered before their turn ran (Slack's)
        self._built: dict[tuple[int, str], ChannelKind] = {}
        self._client: httpx.AsyncClient | None = None
        self.running: set[asyncio.Future[None]] = set()  # turns going on after their delivery was answered

    def finished(self, task: asyncio.Future[None]) -> None:
        self.running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("channel delivery failed after it was acknowledged: %s", task.exception())

    def of(self, bot: BotConfig, kind: str) -> ChannelKind | None:
        """The channel `kind` of this version of a bot, or None when it declares none."""
        config = bot.channels.get(kind)
        if config is None or kind not in CHANNELS:
            return None
        key = (id(bot), kind)
        if key not in self._built:
            self._built[key] = CHANNELS[kind](bot, config)
        return self._built[key]

    @staticmethod
    def check_installed(bots: list[BotConfig]) -> None:
        """Refuse to start when a served bot declares a channel whose library is not installed."""
        for bot in bots:
            for kind in bot.channels:
                problem = CHANNELS[kind].missing() if kind in CHANNELS else f"no channel kind {kind!r}"
                if problem:
                    raise ChatrunError(f"bot {bot.name}, channel {kind}: {problem}")

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False)
        return self._client

    async def recover_forever(self, registry: SessionRegistry) -> None:
        """Run the turns of deliveries answered by a replica that died before they were done."""

        async def handle(bot: str, kind: str, inbound: Inbound) -> None:
            channel = self.of(registry.bot(bot).config, kind)
            if channel is not None:
                await _handle(registry, self, channel, bot, inbound)

        await self.acked.recover_forever(registry, handle)

    async def aclose(self) -> None:
        for task in [*self.running, *self.acked.running.values()]:  # the app stops: turns still running roll back
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def principal(self, kind: str, inbound: Inbound) -> Principal:
        name, claims = f"{kind}:{inbound.user}", (("display_name", inbound.name),) if inbound.name else ()
        return self.auth.principal(name, claims) if self.auth is not None else Principal(name, claims=claims)

    async def deliver(self, bot: BotConfig, kind: str, body: dict[str, Any]) -> Attempt:
        """Send one queued reply (an outbox entry's body) through the bot's channel."""
        channel = self.of(bot, kind)
        if channel is None:
            return Attempt(False, f"bot {bot.name} declares no channel {kind}")
        data = body.get("data") or {}
        try:
            for message in outgoing(data.get("events") or []):
                await channel.send(self.client(), data.get("to") or {}, message)
        except SendFailed as exc:
            return Attempt(False, str(exc), exc.status)
        except ChatrunError as exc:  # an unset credential: named, never shown
            return Attempt(False, str(exc))
        return Attempt(True, status=200)


def make_channel_router() -> APIRouter:
    router = APIRouter(tags=["channels"], responses=ERROR_RESPONSES)
    router.add_api_route("/channels/{bot}/{kind}", receive, methods=["POST"],
                         summary="A messaging platform's webhook (docs/channels.md)")
    router.add_api_route("/channels/{bot}/{kind}", check_url, methods=["GET"],
                         summary="A platform checking the webhook's URL (WhatsApp's hub.challenge)")
    return router


def _channel(registry: SessionRegistry, bot: str, kind: str) -> ChannelKind:
    config = registry.bot(bot).config
    channel = registry.channels.of(config, kind)
    if channel is None:
        raise wire.RequestFailed(wire.NOT_FOUND, f"bot {bot} has no channel {kind!r} "
                                 f"(its channels: {', '.join(config.channels) or 'none'})")
    return channel  # type: ignore[no-any-return]


async def check_url(bot: str, kind: str, request: Request, registry: Registry) -> Response:
    answer = _channel(registry, bot, kind).subscribe(request.query_params)
    if answer is None:
        log.warning("channel %s of bot %s: refused a URL check (wrong verify token)", kind, bot)
        return PlainTextResponse("forbidden", status_code=403)
    return PlainTextResponse(answer)


async def receive(bot: str, kind: str, request: Request, registry: Registry) -> JSONResponse:
    """A platform's delivery: checked, then each user message in it handled (see the module)."""
    channels: Channels = registry.channels
    channel = _channel(registry, bot, kind)
    body = await request.body()
    try:
        await channel.averify(request.headers, body)
    except Unauthorized as exc:
        log.warning("channel %s of bot %s: refused a delivery: %s", kind, bot, exc)
        return JSONResponse({"ok": False, "error": "unauthorized"}, status_code=401)
    try:
        payload = channel.read(body, request.headers)
    except ValueError as exc:
        raise wire.RequestFailed(wire.BAD_REQUEST, f"a {kind} delivery that cannot be read: {exc}") from None
    answer = channel.handshake(payload)
    if answer is not None:
        return JSONResponse(answer)
    messages = channel.inbound(payload)
    if channel.ack_within is None:
        await _handle_all(registry, channels, channel, bot, messages)
        return JSONResponse({"ok": True})
    # Answer in the platform's time, the turn going on after (its reply leaves through the
    # outbox); the messages are in the store first, so a replica dying meanwhile loses none.
    recorded = [m for m in messages if await channels.acked.record(registry, bot, channel.kind, m)]
    handling = asyncio.ensure_future(_handle_recorded(registry, channels, channel, bot, recorded))
    channels.running.add(handling)
    handling.add_done_callback(channels.finished)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(handling), channel.ack_within)
    return JSONResponse({"ok": True})


async def _handle_recorded(registry: SessionRegistry, channels: Channels, channel: ChannelKind, bot: str,
                           recorded: list[Inbound]) -> None:
    """The turns of the recorded messages (a message already recorded is its runner's)."""

    async def handle(bot: str, kind: str, message: Inbound) -> None:
        await _handle(registry, channels, channel, bot, message)

    for message in recorded:
        await channels.acked.run(registry, handle, bot, channel.kind, message)


async def _handle_all(registry: SessionRegistry, channels: Channels, channel: ChannelKind, bot: str,
                      inbound: list[Inbound]) -> None:
    for message in inbound:
        await _handle(registry, channels, channel, bot, message)


async def _handle(registry: SessionRegistry, channels: Channels, channel: ChannelKind, bot: str,
                  inbound: Inbound) -> None:
    """One user message: its turn, run once (a retried delivery replays the committed one). A
    conversation an `end` action ended goes on in a new session, which the store remembers for
    the platform's conversation (its id derives from the delivery, so a retry finds it too)."""
    kind, store = channel.kind, registry.store
    key = f"channel:{bot}:{kind}:{inbound.conversation}"
    found = await store.get_record(key)
    session_id = str(found["session"]) if found else session_id_for(bot, kind, inbound.conversation)
    if not await _run(registry, channels, channel, bot, session_id, inbound):
        session_id = session_id_for(bot, kind, f"{inbound.conversation}#{inbound.delivery}")
        await store.put_record(key, {"session": session_id})
        await _run(registry, channels, channel, bot, session_id, inbound)
    try:
        await channel.after(channels.client(), inbound)
    except ChatrunError as exc:  # a button's spinner left turning: nothing lost
        log.info("channel %s of bot %s: %s", kind, bot, exc)


async def _run(registry: SessionRegistry, channels: Channels, channel: ChannelKind, bot: str, session_id: str,
               inbound: Inbound) -> bool:
    """The message's turn in the session; False when that conversation has ended (nothing ran).
    A refusal that another try cannot change (a message too long, say) is logged and dropped, so
    the platform does not deliver it again forever; a failure another try may heal (the store is
    down, a version this replica lacks) is the platform's to retry: 5xx."""
    kind = channel.kind
    meta = {REPLY_TO: {"sink": channel.config.sink, "address": inbound.address}}
    try:
        async with registry.session(bot, session_id, channels.principal(kind, inbound), OPEN,
                                    locale=inbound.locale, meta=meta) as session:
            run = registry.turn(session, inbound.text, f"{kind}:{inbound.delivery}")
            if session.ended is not None and not await run.is_replay():  # (the ending turn's retry replays)
                return False
            async for _ in run:
                pass  # the events reach the user through the outbox, after the commit
    except wire.RequestFailed as exc:
        if wire.HTTP_STATUS.get(exc.reason, 400) >= 500:
            raise
        log.warning("channel %s of bot %s: delivery %s refused: %s", kind, bot, inbound.delivery, exc.message)
    except SessionError as exc:
        log.warning("channel %s of bot %s: delivery %s refused: %s", kind, bot, inbound.delivery, exc)
    return True
