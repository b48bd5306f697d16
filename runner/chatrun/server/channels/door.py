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
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from chatrun import events as ev
from chatrun.definition.catalogs import said_count
from chatrun.definition.config import BotConfig
from chatrun.definition.page_texts import page_texts, said
from chatrun.engine.session import REPLY_TO
from chatrun.errors import AttachmentRefused, ChatrunError, SessionError
from chatrun.events import Event
from chatrun.server import wire
from chatrun.server.auth import Auth, Principal
from chatrun.server.channels.acked import AckedDeliveries, AckedSettings
from chatrun.server.channels.base import (
    MAX_DELIVERY_AGE,
    ChannelKind,
    FetchFailed,
    Inbound,
    Outgoing,
    SendFailed,
    Unauthorized,
    Unreachable,
    at_limit_notice,
    local_number,
    outgoing,
    pressed,
    session_after,
    session_id_for,
    too_long_notice,
    too_old,
)
from chatrun.server.channels.slack import Slack
from chatrun.server.channels.teams import Teams
from chatrun.server.channels.telegram import Telegram
from chatrun.server.channels.twilio import Twilio, warn_withheld_entries
from chatrun.server.channels.whatsapp import WhatsApp
from chatrun.server.http import ERROR_RESPONSES
from chatrun.server.plumbing import Registry
from chatrun.server.session_writes import QuotaRefused
from chatrun.server.sessions import OPEN
from chatrun.server.webhook import Attempt, unusable
from chatrun.store import replays

if TYPE_CHECKING:
    from chatrun.engine.session import Session
    from chatrun.server.sessions import SessionRegistry
    from chatrun.server.turn_run import TurnRun
    from chatrun.store.aio import AsyncStore

log = logging.getLogger("chatrun.channels")

# The channel kinds, by their key under `channels:` (definition/config.py's CHANNEL_SECRETS
# lists their credentials for the validator).
CHANNELS: dict[str, type[ChannelKind]] = {kind.kind: kind for kind in (Slack, Teams, Telegram, Twilio, WhatsApp)}
# What httpx raises for a request it cannot make from the values it was given: a URL it cannot
# parse or whose scheme it does not speak, a header value not in ASCII (UnicodeEncodeError).
UNUSABLE = (httpx.InvalidURL, httpx.UnsupportedProtocol, UnicodeEncodeError)


class Channels:
    """The app's channels: each bot's declared ones, built from the bot's config as served now,
    and the one HTTP client that calls the platforms."""

    def __init__(self, auth: Auth | None, store: AsyncStore | None = None, acked: AckedSettings | None = None,
                 limits: wire.ServerLimits | None = None):
        self.auth, self.store = auth, store  # the store: where a streamed reply's message is noted
        warn_withheld_entries(auth)
        self.limits = limits or wire.ServerLimits()  # a user's message: --max-message-chars, as on every door
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
        built = self._built.get(key)
        if built is None or built.bot is not bot:  # (an id is reused once its bot is gone)
            built = self._built[key] = CHANNELS[kind](bot, config)
        return built

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

    async def deliver(self, bot: BotConfig, kind: str, body: dict[str, Any], within: float | None = None) -> Attempt:
        """Send one queued reply (an outbox entry's body) through the bot's channel: its messages
        (`fitted`) in order, one platform call each. `within`: the seconds this try may take
        (the outbox's claim covers them): a further message starts only while a whole call's
        `timeout` is left, and the rest is left to the next try (a failed one), so that a long
        reply to a slow platform never outlives the claim while another replica, claiming the
        entry after it, sends the same messages."""
        started = time.monotonic()
        channel = self.of(bot, kind)
        if channel is None:
            return Attempt(False, f"bot {bot.name} declares no channel {kind}")
        data = body.get("data") or {}
        locale = data.get("locale")  # the session's when the reply was made: chatrun's own words speak it
        heading = page_texts(bot.catalogs, locale)["sources"]
        messages = [dataclasses.replace(message, locale=locale)  # a text over the platform's limit: several
                    for message in channel.fitted(outgoing(data.get("events") or [], heading))]
        # A reply of several messages notes how many the platform took, so a retry after a
        # refusal half-way sends only the rest (the user never reads the first ones twice).
        key = f"channel-sent:{body['id']}" if self.store is not None and body.get("id") and len(messages) > 1 else None
        try:
            streamed = await self._streamed(channel, body)
            sent = int((await self.store.get_record(key) or {}).get("sent") or 0) if key and self.store else 0
            for i, message in enumerate(messages[sent:], sent):
                if i > sent and within is not None and time.monotonic() - started + channel.timeout > within:
                    return Attempt(False, f"channel {kind} of bot {bot.name}: {i} of the reply's {len(messages)} "
                                   f"messages sent within this try's {within:g} s (a call may take "
                                   f"{channel.timeout:g} s); the rest on the next try")
                if i == 0 and streamed is not None:  # the message the model's stream was shown in
                    await channel.replace(self.client(), streamed, message)
                else:
                    await channel.send(self.client(), data.get("to") or {}, message)
                if key and self.store and i + 1 < len(messages):
                    await self.store.put_record(key, {"sent": i + 1}, str(body.get("session") or "") or None)
        except SendFailed as exc:
            return Attempt(False, str(exc), exc.status, exc.retry_after)
        except ChatrunError as exc:  # an unset credential: named, never shown
            return Attempt(False, str(exc))
        except UNUSABLE as exc:  # an env value (`api:`, a token) made the URL or a header unusable
            return Attempt(False, f"channel {kind} of bot {bot.name}: the request cannot be made ({unusable(exc)})")
        except ValueError as exc:  # a bug (a kind's, chatrun's): a failed attempt, its traceback in the log
            log.exception("channel %s of bot %s: outbox entry %s: a bug while sending it", kind, bot.name, body.get("id"))
            return Attempt(False, f"channel {kind} of bot {bot.name}: a bug in chatrun while sending "
                                  f"({type(exc).__name__}; its traceback is in the server's log)")
        if key and self.store:
            await self.store.delete_record(key)
        return Attempt(True, status=200)


    async def _streamed(self, channel: ChannelKind, body: dict[str, Any]) -> dict[str, Any] | None:
        """The message a reply's turn was streamed in, if it was and before this reply was made
        (a rolled-back attempt's partial message is its apology's; a later attempt of the same
        turn number streams in a message of its own, which an earlier apology leaves alone)."""
        if channel.stream_every is None or self.store is None or not body.get("session"):
            return None
        found = await self.store.get_record(stream_key(str(body["session"]), int(body.get("turn") or 0)))
        if found is None or float(found.get("at") or 0) > float(body.get("created") or 0):
            return None
        return found


def stream_key(session_id: str, turn: int) -> str:
    """The store's record of the message a turn's reply was streamed in (Slack's channel and ts)."""
    return f"channel-stream:{session_id}:{turn}"


class Streamer:
    """A reply shown while the model streams it: its first chunks posted as one message, that
    message updated at most every `stream_every` seconds. The message is noted in the store
    before the turn commits (the updates are awaited between the turn's events, so every one is
    done before the commit); the committed reply, or the apology of a rolled-back turn, then
    replaces it from the outbox (`Channels.deliver`): shown once, never posted twice. (The
    turn's events are made ahead of this reading: the reply's `created` may be before the first
    post; the commit that makes it deliverable is after the last event is read.)"""

    def __init__(self, channels: Channels, channel: ChannelKind, session_id: str, address: dict[str, Any]):
        self.channels, self.channel, self.session_id, self.address = channels, channel, session_id, address
        self.text, self.shown_at, self.broken = "", 0.0, False
        # Before the turn starts: the turn's reply is made after it (its `created`), the reply of
        # an earlier attempt that rolled back before it (`Channels._streamed` tells them apart).
        self.started = time.time()
        self.handle: dict[str, Any] | None = None

    async def chunk(self, event: Event) -> None:
        if self.broken or event.type != ev.STREAM or not isinstance(event.data, str):
            return
        self.text += event.data
        now, every = time.monotonic(), self.channel.stream_every or 0.0
        try:
            if self.handle is None:
                self.handle = await self.channel.stream_start(self.channels.client(), self.address, self.text)
                assert self.channels.store is not None
                await self.channels.store.put_record(stream_key(self.session_id, event.turn),
                                                     {**self.handle, "at": self.started}, self.session_id)
                self.shown_at = now
            elif now - self.shown_at >= every:
                await self.channel.stream_update(self.channels.client(), self.handle, Outgoing(self.text))
                self.shown_at = now
        except SendFailed as exc:  # shown at the end, from the outbox, as without streaming
            log.info("channel %s: a streamed reply is not shown while it streams: %s", self.channel.kind, exc)
            self.broken = True


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
    except Unreachable as exc:  # not the delivery's fault: the platform sends it again
        log.warning("channel %s of bot %s: cannot check a delivery now: %s", kind, bot, exc)
        return JSONResponse({"ok": False, "error": "unavailable"}, status_code=503)
    try:
        payload = channel.read(body, request.headers)
    except ValueError as exc:
        raise wire.RequestFailed(wire.BAD_REQUEST, f"a {kind} delivery that cannot be read: {exc}") from None
    try:
        answer = channel.handshake(payload)
        messages = [] if answer is not None else _fresh(channel, _saying(channel.inbound(payload)))
    except (AttributeError, KeyError, IndexError, TypeError) as exc:  # a field not of the platform's shape
        log.warning("channel %s of bot %s: refused a delivery not of the platform's shape: %s: %s",
                    kind, bot, type(exc).__name__, exc)
        raise wire.RequestFailed(wire.BAD_REQUEST, f"a {kind} delivery not of the shape the platform sends "
                                 f"({type(exc).__name__}: {exc})") from None
    if answer is not None:
        return JSONResponse(answer)
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


def _saying(messages: list[Inbound]) -> list[Inbound]:
    """The messages that say something: one with no text (empty or only whitespace) and no file
    runs no turn and gets no reply (wire.says_nothing, every door's rule); its delivery is
    answered 200 all the same, so the platform does not send it again. An edit is kept, whatever
    it says: its user is told edits are not read (`_run`)."""
    return [message for message in messages if message.edited or not wire.says_nothing(message.text, message.files)]


def _fresh(channel: ChannelKind, messages: list[Inbound]) -> list[Inbound]:
    """The messages sent within MAX_DELIVERY_AGE by their own signed timestamp: an older one may be
    a captured delivery replayed after its dedupe record is gone (retention, erasure), and runs no
    turn; its delivery is answered 200 all the same, so the platform does not send it again."""
    fresh = [message for message in messages if not too_old(message.sent, MAX_DELIVERY_AGE)]
    for message in messages:
        if message not in fresh:
            log.warning("channel %s of bot %s: refused message %s: sent at %s, over %d s ago (a replay?)",
                        channel.kind, channel.bot.name, message.delivery, message.sent, MAX_DELIVERY_AGE)
    return fresh


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
    conversation an `end` action ended goes on in the session derived from the ended one
    (`session_after`): every message that finds it ended, together or on another replica, goes
    to the same one. The store remembers the latest for the platform's conversation, only so as
    not to walk the chain each time: a note missing, or older than another replica's, is walked
    forward to the same session. The note names the ended session before the latest too, where
    a retry of a message that ran there is replayed."""
    kind, store = channel.kind, registry.store
    if await replays.seen(store, f"{kind}:{inbound.delivery}", time.time()):
        # Its session was deleted (an erasure, retention) after the message ran there: the
        # delivery's mark (store/replays.py) stands for the outcome that went with it.
        # (Or it was refused at its user's session limit and they were told: `_told_at_limit`; or
        # a budget ended its turn and they were told: `_run`.)
        log.warning("channel %s of bot %s: refused delivery %s: it was answered before, in a session since "
                    "deleted, by the session limit's notice or by a spent budget's (a replay?)", kind, bot,
                    inbound.delivery)
        return
    if inbound.sequence is not None and (scope := channel.sequence_scope()) is not None \
            and await replays.out_of_sequence(store, scope, inbound.sequence, time.time()):
        # Numbered below what the platform delivered WINDOW ago: a replay, whose marks may be gone.
        log.warning("channel %s of bot %s: refused delivery %s: number %d is below the bot's floor "
                    "(first delivered over a day ago: a replay?)", kind, bot, inbound.delivery, inbound.sequence)
        return
    inbound = await channel.named(channels.client(), inbound)
    key = f"channel:{bot}:{kind}:{inbound.conversation}"
    found = await store.get_record(key)
    session_id = str(found["session"]) if found else session_id_for(bot, kind, inbound.conversation)
    if found and found.get("before") and await store.get_outcome(str(found["before"]), f"{kind}:{inbound.delivery}"):
        # The platform's retry of the message that ran in the session before (its `end`, say),
        # delivered after the next message moved on: replayed there, not run again here.
        session_id = str(found["before"])
    try:
        while (after := await _run(registry, channels, channel, bot, session_id, inbound)) is not None:
            ended, session_id, inbound = session_id, session_after(session_id), after
            # Deleted with the session it names: it keeps the chat's id (its key), which an erasure takes too.
            await store.put_record(key, {"session": session_id, "before": ended}, session_id)
    except QuotaRefused as exc:  # a new conversation, its user at --max-sessions-per-principal
        await _told_at_limit(channels, channel, store, inbound, exc)
    try:
        await channel.after(channels.client(), inbound)
    except ChatrunError as exc:  # a button's spinner left turning: nothing lost
        log.info("channel %s of bot %s: %s", kind, bot, exc)


async def _run(registry: SessionRegistry, channels: Channels, channel: ChannelKind, bot: str, session_id: str,
               inbound: Inbound) -> Inbound | None:
    """The message's turn in the session; when that conversation has ended (nothing ran), the
    message as the next session reads it (`_carried`), else None.
    A refusal that another try cannot change is logged and dropped, so the platform does not
    deliver it again forever; a failure another try may heal (the store is down, a version this
    replica lacks, the session busy) is the platform's to retry: 5xx or 429. A message over
    --max-message-chars, or with a file the route does not take or that cannot be fetched, runs
    no turn: its user is told why by a notice that answers the delivery (`TurnRun.notice`: the
    one way a channel's user is told anything, committed with the delivery's request id as its
    outcome and sent through the outbox like a reply), so a retry replays it and tells nothing
    again, even after a crash right after its commit."""
    kind = channel.kind
    meta = {REPLY_TO: {"sink": channel.config.sink, "address": inbound.address}}
    try:
        async with registry.session(bot, session_id, channels.principal(kind, inbound), OPEN,
                                    locale=inbound.locale, meta=meta, channel=True) as session:
            request_id = f"{kind}:{inbound.delivery}"
            text, answered = _press_read(session, inbound)
            run = registry.turn(session, text, request_id)
            # A retry replays what the delivery got: its turn, or the notice that answered it
            # (too long, its files refused, a press on an answered question's button): nothing is
            # fetched, run or told again.
            replay = await run.is_replay()
            if session.ended is not None and not replay:  # (the ending turn's retry replays)
                return _carried(session, inbound)
            told = None if replay else _told_instead(channels, session, inbound, answered)
            if told is not None:  # no turn: the user is told why, once
                log.info("channel %s of bot %s: delivery %s: no turn: %s", kind, bot, inbound.delivery, told[1])
                await run.notice(*told)
                return None
            if inbound.files and not replay:
                try:
                    run = registry.turn(session, await _attached(channels, channel, session, inbound), request_id)
                except (AttachmentRefused, FetchFailed) as exc:
                    log.warning("channel %s of bot %s: delivery %s: its files are refused: %s",
                                kind, bot, inbound.delivery, exc)
                    await run.notice(_file_notice(session, exc), str(exc))
                    return None
            streamer = await _streamer(channels, channel, session, inbound, run)
            async for event in run:  # the events reach the user through the outbox, after the commit
                if streamer is not None:
                    await streamer.chunk(event)
            if run.entry.get("spent") and not run.replayed:  # a failed turn keeps no outcome to replay
                # A budget ended it: the platform's retry could only tell the user again (`_handle`).
                await replays.keep(registry.store, [request_id], time.time() + replays.WINDOW)
    except wire.RequestFailed as exc:
        # A busy session (if busy: reject, or a queue waited out) heals too: the platform sends again.
        if wire.HTTP_STATUS.get(exc.reason, 400) >= 500 or exc.reason == wire.TOO_MANY_REQUESTS:
            raise
        log.warning("channel %s of bot %s: delivery %s refused: %s", kind, bot, inbound.delivery, exc.message)
    except SessionError as exc:
        log.warning("channel %s of bot %s: delivery %s refused: %s", kind, bot, inbound.delivery, exc)
    return None


async def _told_at_limit(channels: Channels, channel: ChannelKind, store: AsyncStore, inbound: Inbound,
                         exc: QuotaRefused) -> None:
    """A message that would start a new session, refused because its user owns
    --max-sessions-per-principal sessions already: the platform gets its 200 (another try is
    refused again) and the user is told why, once, in their language (chatrun's text
    `channel_too_many_sessions`, which a bot's `page.channel_too_many_sessions` replaces). There
    is no session to commit a notice in (making one is what was refused), so the delivery's
    replay mark (store/replays.py `claim`, the mark a deleted session's deliveries leave) answers
    it: the first try claims it and sends the text; a retry finds it (`_handle`'s first check)
    and tells nothing. A text the platform refuses releases the mark and leaves the delivery to
    the platform's retry (503), as a reply's failed send is retried by the outbox."""
    request_id = f"{channel.kind}:{inbound.delivery}"
    if not await replays.claim(store, request_id, time.time() + replays.WINDOW):
        return  # another replica's try of the same delivery told them
    text, locale = at_limit_notice(channel.bot, inbound.locale, exc.limit)
    log.info("channel %s of bot %s: delivery %s: no new session: %s", channel.kind, channel.bot.name,
             inbound.delivery, exc.message)
    try:
        for message in channel.fitted([Outgoing(text, locale=locale)]):
            await channel.send(channels.client(), inbound.address, message)
    except (ChatrunError, *UNUSABLE) as failed:  # SendFailed, an unset credential, an unusable `api:`
        await store.delete_record(replays.key_of(request_id))
        why = unusable(failed) if isinstance(failed, UNUSABLE) else str(failed)
        raise wire.RequestFailed(wire.UNAVAILABLE, f"channel {channel.kind} of bot {channel.bot.name}: the "
                                 f"session limit's notice could not be sent ({why}); the platform sends the "
                                 "delivery again") from None


def _carried(session: Session, inbound: Inbound) -> Inbound:
    """A message for the session after an ended one, in the language its user chose there (the
    bot's `state.locale`, docs/i18n.md), which the platform may not say (WhatsApp says none) or
    says otherwise (their app's language): the same person keeps their language."""
    chosen = session.state.get("locale")
    return dataclasses.replace(inbound, locale=chosen) if isinstance(chosen, str) and chosen else inbound


def _told_instead(channels: Channels, session: Session, inbound: Inbound,
                  answered: str | None) -> tuple[str, str] | None:
    """What the user is told instead of a turn, and why (a new delivery's, not a retry's): an
    edit of a message sent before (edits are not read: `channel_edited`), a press on the button
    of a question that waits no more, a message over --max-message-chars (as the HTTP API and
    the WebSocket refuse it; another try would be too); None when the message runs its turn."""
    texts = page_texts(session.bot.config.catalogs, session.locale)
    if inbound.edited:
        return texts["channel_edited"], "an edit of a message sent before: edits are not read"
    if answered is not None:
        return texts["channel_answered"], f"a press on the button of {answered}, which waits no more"
    too_long = channels.limits.message_too_long(inbound.text)
    if too_long is not None:
        return too_long_notice(session, channels.limits.max_message_chars), too_long
    return None


async def _streamer(channels: Channels, channel: ChannelKind, session: Session, inbound: Inbound,
                    run: TurnRun) -> Streamer | None:
    """The streamer of a new turn on a kind that shows streamed replies. A note of a streamed
    message left by an attempt of the same turn number that rolled back is dropped first."""
    if channel.stream_every is None or channels.store is None or await run.is_replay():
        return None
    await channels.store.delete_record(stream_key(session.id, session.turn_count + 1))
    return Streamer(channels, channel, session.id, inbound.address)


async def _attached(channels: Channels, channel: ChannelKind, session: Session, inbound: Inbound) -> dict[str, Any]:
    """The message with its files fetched and kept in the session's blob area, checked against
    the current route's `attachments:` first from what the platform announces (kinds, count,
    sizes), then while each is read (never past `max_bytes`)."""
    policy = session.attachment_policy()  # AttachmentRefused: the route takes no files
    session.check_attachments([(file.media_type, file.size or 0) for file in inbound.files])
    kept = []
    for file in inbound.files:
        data = await channel.fetch(channels.client(), file, policy.max_bytes)
        kept.append(session.attach(data, file.media_type, file.name).to_dict())
    return {"userMessage": inbound.text, "attachments": kept}


def _press_read(session: Session, inbound: Inbound) -> tuple[str, str | None]:
    """A message's text as the turn takes it, and the item an answered question's button named.
    A press on a pending item's button (base.press_value) is its value, as if typed, while that
    item is the one a message answers (the first waiting in the current scope); a press on the
    button of an item that waits no more (answered, declined, timed out) or not yet (another
    waits before it) answers nothing: a chat keeps old messages, and `yes` to an earlier
    question must not be the yes to the question asked since."""
    found = pressed(inbound)
    if found is None:
        return inbound.text, None
    value, item = found
    waiting = [i.id for i in session.pending if i.scope_id == session.scope_id]
    return (value, None) if waiting[:1] == [item] else (inbound.text, item)


def _file_notice(session: Session, exc: ChatrunError) -> str:
    """What the user reads when their files are not taken: what the route takes, in their terms
    and their locale (chatrun's texts `channel_*`, which a bot's `page.channel_*` replace;
    definition/page_texts.py)."""
    texts = page_texts(session.bot.config.catalogs, session.locale)
    if isinstance(exc, FetchFailed) and not exc.too_large:
        return texts["channel_file_unreadable"]
    policy = session.bot.config.routes[session.route].attachments
    if policy is None:
        return texts["channel_no_files"]
    return said(texts, "channel_file_refused", kinds=", ".join(policy.kinds),
                size=_size(texts, policy.max_bytes, session.locale), count=policy.max_count)


def _size(texts: dict[str, str], n: int, locale: str | None) -> str:
    """A size as the page writes it: `size_mb`/`size_kb`/`size_bytes_*` (by the plural rule), the
    number in the locale's digits."""
    if n < 1024:
        return said_count(texts, "size_bytes", locale, n, n=local_number(str(n), locale))
    key, value = ("size_mb", n / 1048576) if n >= 1048576 else ("size_kb", n / 1024)
    return said(texts, key, n=local_number(f"{value:.3g}", locale))

