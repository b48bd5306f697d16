"""A turn as an OpenAI client sees it, shared by the /v1 endpoints (chatrun.server.openai_api):
the conversation a request sends, the reply text a turn's events make, OpenAI's usage and
error objects.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from chatrun import events as ev
from chatrun.definition.page_texts import BUILTIN as PAGE_TEXTS
from chatrun.definition.page_texts import page_texts, said
from chatrun.engine import guardrails
from chatrun.engine.pending import TAKEOVER
from chatrun.errors import AttachmentRefused
from chatrun.memory.tokens import estimate_tokens
from chatrun.messages import Attachment
from chatrun.server import wire
from chatrun.server.audience import for_clients
from chatrun.server.auth import Principal
from chatrun.server.guard import openai_code
from chatrun.server.inspect import pending_data
from chatrun.server.openai_sessions import (
    REPLAYED,
    Claim,
    Exchange,
    Identity,
    Kept,
    Opened,
    TurnIndex,
)
from chatrun.server.plumbing import END, DetachedTurn, Emit, Unauthorized
from chatrun.store.blobs import BlobArea

if TYPE_CHECKING:
    from chatrun.engine.session import Session
    from chatrun.server.turn_run import TurnRun

SEPARATOR = "\n\n"  # between the texts of a turn's several Message/Object events
# The HTTP API's wording names its three ways to send a token; an OpenAI client has one.
UNAUTHORIZED_MESSAGE = "unauthorized: send a valid token as Authorization: Bearer <token> (the OpenAI SDKs' api_key)"


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=wire.status_headers(self.status))


_TYPES = {401: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error"}
_CODES = {wire.UNAUTHORIZED: "invalid_api_key", wire.BOT_NOT_FOUND: "model_not_found",
          wire.SESSION_NOT_ACTIVE: "session_not_found", wire.ROUTE_NOT_FOUND: "model_not_found"}


def from_failure(exc: wire.RequestFailed) -> OpenAIError:
    status = wire.HTTP_STATUS.get(exc.reason, 400)
    message = UNAUTHORIZED_MESSAGE if isinstance(exc, Unauthorized) else exc.message
    return OpenAIError(status, message, _TYPES.get(status, "invalid_request_error"), _CODES.get(exc.reason) or openai_code(exc.reason))


def conversation_ended(session_id: str, ended: dict[str, str]) -> OpenAIError:
    """A message to a conversation an `end` action ended: 409 `conversation_ended` (the SDKs
    raise ConflictError). Nothing runs; a new conversation (a new chat) starts afresh."""
    return OpenAIError(
        409, f"this conversation has ended (tool {ended.get('tool')} ended it on route {ended.get('route')}) "
        f"and takes no more messages; start a new conversation (session {session_id} stays readable)",
        code="conversation_ended")


# -- the turn --------------------------------------------------------------------------------


@dataclass
class Reply:
    """The client's view of a turn: the text of its Message and Object events, in order.
    Streamed chunks are passed on as they come; the Message that ends them adds nothing."""

    parts: list[str] = field(default_factory=list)
    objects: list[Any] = field(default_factory=list)
    other: list[dict[str, Any]] = field(default_factory=list)  # Thinking, Console, RouteChanged, ...
    streaming: str = ""
    # The passages the reply's messages cite (Sources events): (the part they cite in, the sources).
    cited: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)

    def feed(self, event: ev.Event) -> str:
        """The text to send the client now for this event ('' for none)."""
        if event.type == ev.STREAM:
            delta = (SEPARATOR if not self.streaming and self.parts else "") + str(event.data)
            self.streaming += str(event.data)
            return delta
        if event.type == ev.MESSAGE:
            return self._part(str(event.data))
        if event.type == ev.OBJECT:
            self.objects.append(event.data)
            return self._part(readable(event.data))
        if event.type == ev.PENDING:  # a front end without buttons: the user's next message answers it
            self.other.append(event.to_dict())
            return self._part(wire.written_out(event.data))
        if event.type == ev.SOURCES and isinstance(event.data, dict) and self.parts:  # of the Message before it
            self.cited.append((len(self.parts) - 1, [s for s in event.data.get("sources") or () if isinstance(s, dict)]))
        if event.type != ev.ERROR:
            self.other.append(event.to_dict())
        return ""

    def _part(self, text: str) -> str:
        streamed, self.streaming = self.streaming, ""
        # Blanks streamed and not this text: an empty answer the engine set aside (it asked again,
        # or sent the fallback), not the start of this message, which the client has not got.
        if streamed and (text.startswith(streamed) or streamed.strip()):
            # the client has those chunks already: send what the final text adds, if anything
            self.parts.append(text if text.startswith(streamed) else streamed)
            return text[len(streamed):] if text.startswith(streamed) else ""
        self.parts.append(text)
        return (SEPARATOR if len(self.parts) > 1 else "") + text

    @property
    def text(self) -> str:
        return SEPARATOR.join(self.parts + ([self.streaming] if self.streaming else []))

    @property
    def sources(self) -> list[dict[str, Any]]:
        """Every passage the reply cites, as its Sources events carry them (with or without a link)."""
        return [source for _, sources in self.cited for source in sources]

    def annotations(self) -> list[dict[str, Any]]:
        """The cited passages that have a link, as OpenAI's `url_citation` annotations of `text`:
        each spans the `[ref]` the reply cites it with (`text[start_index:end_index]`; else the
        whole message that cites it). Chat Completions nests these under `url_citation`, the
        Responses API has them flat (server/openai_api.py)."""
        out = []
        for part, sources in self.cited:
            start = sum(len(p) + len(SEPARATOR) for p in self.parts[:part])
            text = self.parts[part]
            for source in sources:
                if not isinstance(source.get("url"), str):
                    continue  # OpenAI's citations are links; every source is in `chatrun.sources`
                marker = f"[{source.get('ref')}]"
                at = text.find(marker)
                span = (start + at, start + at + len(marker)) if at >= 0 else (start, start + len(text))
                out.append({"url": source["url"], "title": str(source.get("title") or source.get("ref") or ""),
                            "start_index": span[0], "end_index": span[1]})
        return out

    def json_text(self) -> str:
        """The reply for response_format json_object/json_schema: the Object events as JSON."""
        if not self.objects:
            return self.text
        return json.dumps(self.objects[0] if len(self.objects) == 1 else self.objects, ensure_ascii=False)


def readable(value: Any) -> str:
    """An Object event as a chat client shows it: Markdown a person reads ("- **Check in:**
    2026-12-01"), not JSON in front of the reply. Programs get the object itself from
    response_format or the response's `chatrun.objects`."""
    if isinstance(value, dict | list):
        return "\n".join(_readable_lines(value, 0)) or "-"
    return _scalar(value)


def _readable_lines(value: dict[str, Any] | list[Any], depth: int) -> list[str]:
    indent = "  " * depth
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    lines: list[str] = []
    for key, item in items:
        label = f"**{str(key).replace('_', ' ').capitalize()}:** " if key is not None else ""
        if isinstance(item, dict | list) and item:
            lines.append(f"{indent}- {label}".rstrip())
            lines.extend(_readable_lines(item, depth + 1))
        else:
            lines.append(f"{indent}- {label}{_scalar(item)}")
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or value == [] or value == {}:
        return "—"
    return str(value)


@dataclass(frozen=True)
class Attempt:
    """One attempt of a request that may be retried: `key` names its outcome in the index,
    `retry` whether an earlier attempt may have committed it (an Idempotency-Key, or an SDK's
    retry): then that attempt's answer is replayed instead of running the turn again."""

    key: str
    retry: bool
    idempotency_key: str | None = None  # the Idempotency-Key that names it, if one does
    asks: str | None = None  # with an Idempotency-Key: the hash of what the request asks (its outcome keeps it)


@dataclass
class TurnResult:
    opened: Opened | None  # None: a replay
    reply: Reply
    ok: bool
    error: str | None
    usage: dict[str, Any]  # OpenAI's usage object: counts and *_details mappings
    usage_estimated: bool
    session: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)  # the client's events, without Stream chunks


# What a committed turn's keys' records keep besides the turn, made from its result (run_turn's `kept`).
KeptAfter = Callable[[TurnResult], Kept]


async def run_turn(
    index: TurnIndex, ident: Identity, who: Principal | None, text: str, prompt_texts: Callable[[], list[str]],
    emit: Emit | None, keys_after: Callable[[Reply], list[str]], attempt: Attempt | None = None,
    uploads: tuple[Upload, ...] = (), stopped: Kept | None = None, kept: KeptAfter | None = None,
    again: str | None = None,
) -> TurnResult:
    """One turn in the request's session; the index records it when it commits. With an
    `attempt`, a retry of a committed request replays that turn's answer instead. `emit` None:
    nobody reads the events before the turn ends (a JSON answer), so the turn runs whole in
    this task (SessionRegistry.turn's `whole`: no task and queue of its own). `stopped`: the keys
    that name the session as a stopped turn left it (a Responses stream's response id), with
    what their records keep besides; `kept`: what the committed turn's keys' records keep besides
    (a Responses request's response object), as storage guardrails leave it. `again`: without an
    `attempt` (no replays), what names the request to its next attempt, which runs in the new
    session a failed one made (TurnIndex.remember_failed)."""
    if attempt is None:
        result = await _run_turn(index, ident, who, text, prompt_texts, emit, keys_after, uploads, stopped=stopped,
                                 kept=kept, again=again)
        if again is not None and not result.ok and result.opened is not None:
            await index.remember_failed(again, result.opened)
        return result
    claim = await index.claim(attempt.key)
    if attempt.retry:
        recorded = await index.claim_or_outcome(claim)
        if recorded is not None:
            return _replay(_same_request(recorded, attempt), emit)
    # The user's own request, not a retry, runs whatever an earlier one answered: it claims
    # the outcome's key as its session is looked up (TurnIndex.open).
    try:
        # A committed turn's outcome is settled with the index's records of it (TurnIndex.remember).
        result = await _run_turn(index, ident, who, text, prompt_texts, emit, keys_after, uploads, attempt,
                                 None if attempt.retry else claim, stopped=stopped, kept=kept, again=attempt.key)
    except BaseException:
        await asyncio.shield(index.release(claim))
        raise
    if not result.ok:
        if result.opened is not None:  # its next attempt runs in the session this one made
            await index.remember_failed(attempt.key, result.opened)
        await index.release(claim)
    return result


def _same_request(recorded: dict[str, Any], attempt: Attempt) -> dict[str, Any]:
    """`recorded`, when it is the outcome of this request; a 422 when its Idempotency-Key was
    used before for a request that asked something else (the IETF draft's and Stripe's answer):
    the client learns its mistake instead of getting the answer to another question. An outcome
    recorded before chatrun kept what it asked (no `asks`) is replayed as before."""
    asked = recorded.get("asks")
    if attempt.asks is None or asked is None or asked == attempt.asks:
        return recorded
    raise OpenAIError(422, f"the Idempotency-Key {attempt.idempotency_key!r} was used for another request "
                      "(another message, conversation, session, route or response_format); "
                      "send a new key for a new request", code="idempotency_key_reused")


def _replay(recorded: dict[str, Any], emit: Emit | None) -> TurnResult:
    """The answer a committed attempt gave, sent again (its events, as the client saw them)."""
    reply = Reply()
    emit = emit or _nobody
    emit(OPENED)
    for item in recorded.get("events", []):
        event = ev.Event.from_dict(item)
        reply.feed(event)
        emit(event)
    info = dict(recorded.get("session") or {}) | {"how": REPLAYED}
    info.pop("forked_from", None)
    return TurnResult(None, reply, True, None, recorded.get("usage") or {}, bool(recorded.get("estimated")), info)


async def _run_turn(
    index: TurnIndex, ident: Identity, who: Principal | None, text: str, prompt_texts: Callable[[], list[str]],
    emit: Emit | None, keys_after: Callable[[Reply], list[str]], uploads: tuple[Upload, ...] = (),
    attempt: Attempt | None = None, claim: Claim | None = None, stopped: Kept | None = None,
    kept: KeptAfter | None = None, again: str | None = None,
) -> TurnResult:
    whole, emit = emit is None, emit or _nobody
    reply = Reply()
    events: list[dict[str, Any]] = []
    async with index.open(ident, who, claim, again) as opened:
        session = opened.session
        if session.ended:  # before OPENED: a streaming request fails with its status, no stream
            raise conversation_ended(session.id, session.ended)
        message = turn_input(session, index.registry.blobs, text, uploads)  # refused before a stream starts
        emit(OPENED)  # a streaming response may start: the request found (or made) its session
        for event in caught_up_events(opened.caught_up):  # what others said since: first
            reply.feed(event)
            events.append(event.to_dict())
            emit(event)
        caught_up, before, route = reply.text, session.turn_count, session.route
        # Through the registry: the turn is committed (fenced by version and lease) before the
        # answer; a refused commit fails the request (Conflict) instead of answering unsaved.
        run = index.registry.turn(session, message, whole=whole)
        try:
            error = await _fed(run, reply, events, emit)
        except asyncio.CancelledError:  # stopped (its stream closed): rolled back, its keys name where it began
            if stopped:
                await asyncio.shield(index.remember_stopped(session, who, before, stopped))
            raise
        entry = session.last_turn or {}
        ok = bool(entry.get("ok")) and error is None
        passed_on = ok and reply.text.strip() == caught_up.strip() and operator_text(session)
        if passed_on:  # the bot is silent during a takeover: the user learns where the message went
            event = ev.Event(ev.MESSAGE, passed_on, session.turn_count, {"from": "chatrun"})
            reply.feed(event)
            events.append(event.to_dict())
            emit(event)
        turn_usage = entry.get("usage")  # the conversation's texts only for an estimate: a resent one is read then
        usage, estimated, cost = openai_usage(turn_usage, [] if turn_usage else prompt_texts(), reply.text)
        info = _turn_info(session, opened, estimated, cost)
        result = TurnResult(opened, reply, ok, error or entry.get("error"), usage, estimated, info, events)
        if ok:  # what a retry of the request replays (the attempt's outcome), with the turn's keys
            # The store keeps what a retry replays: the events as the history keeps them (`storage` guardrails).
            routes = [route, session.route]
            outcome = None if attempt is None else (attempt.key, {
                "events": guardrails.kept_value(session.bot.config, routes, events), "usage": usage,
                "estimated": estimated, "session": info, "asks": attempt.asks})
            more = None if kept is None else guardrails.kept_value(session.bot.config, routes, kept(result))
            await index.remember(session, who, keys_after(reply), outcome, run.committed_snapshot(), more)
        return result


def _turn_info(session: Session, opened: Opened, estimated: bool, cost: float | None) -> dict[str, Any]:
    """The turn's `chatrun` block: where the conversation is, how the request found its session,
    what now waits, and how its usage was counted."""
    info: dict[str, Any] = {"session": session.id, "turn": session.turn_count, "route": session.route,
                            "stack": session.stack, "how": opened.how}
    if opened.forked_from:
        info["forked_from"] = opened.forked_from
    if session.ended:  # this turn's `end` action ended the conversation: later messages are refused
        info["ended"] = session.ended
    if session.pending:  # what the reply's text asks, as data (a front end with buttons may use it)
        info["pending"] = pending_data(session, ())["pending"]  # as its user reads them (`for_user`)
    if estimated:
        info["usage_estimated"] = True
    if cost is not None:
        info["cost"] = cost
    return info


async def _fed(run: TurnRun, reply: Reply, events: list[dict[str, Any]], emit: Emit) -> str | None:
    """The turn's events: fed to the reply, kept for a replay, emitted; the text of its Error."""
    error = None
    async for event in run:
        if event.type == ev.ERROR:
            error = str(event.data)
        reply.feed(event)
        if event.type != ev.STREAM:  # what a replay sends again: the Message has the chunks' text
            events.append(event.to_dict())
        emit(event)
    return error


def _nobody(_event: Any) -> None:
    """The emit of a turn whose events nobody reads before it ends (a JSON answer)."""


# What a /v1 user reads when their message went to the operators and nobody said anything yet
# (an OpenAI client shows an empty reply as nothing at all, as if the message were lost): chatrun's
# texts `passed_on` / `passed_on_waiting` in the session's locale (definition/page_texts.py).
PASSED_ON = PAGE_TEXTS["en"]["passed_on"]
WAITING_FOR_OPERATOR = PAGE_TEXTS["en"]["passed_on_waiting"]


def operator_text(session: Any) -> str:
    """The text for a silent turn while an operator holds the conversation or is awaited ('' otherwise)."""
    texts = page_texts(session.bot.config.catalogs, session.locale)
    taken = session.taken_over
    if taken is not None:
        name = ((taken.get("by") or {}).get("name") if isinstance(taken.get("by"), dict) else None) \
            or texts["the_operator"]
        return said(texts, "passed_on", name=name)
    if any(item.kind == TAKEOVER for item in session.pending):
        return texts["passed_on_waiting"]
    return ""


def caught_up_events(entries: list[dict[str, Any]]) -> list[ev.Event]:
    """The user's events of others' turns (a decision's reply, an operator's words), as the
    user's clients would have received them live; errors of those turns were their caller's."""
    out = []
    for entry in entries:
        for item in entry.get("events") or ():
            event = ev.Event.from_dict(item)
            if for_clients(event) and event.type != ev.ERROR:
                out.append(event)
    return out


def openai_usage(turn_usage: dict[str, Any] | None, prompt_texts: list[str],
                 reply: str) -> tuple[dict[str, Any], bool, float | None]:
    """(OpenAI's `usage`, whether it is estimated, the cost) from the turn's history entry,
    where the engine sums every model call of the turn (counted, and marked estimated, for
    calls whose endpoint reported none). A turn without model calls gets a rough estimate."""
    if not turn_usage:
        prompt = sum(estimate_tokens(t) for t in prompt_texts)
        completion = estimate_tokens(reply)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}, True, None
    prompt, completion = int(turn_usage.get("input_tokens", 0)), int(turn_usage.get("output_tokens", 0))
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if turn_usage.get("cached_input_tokens"):
        usage["prompt_tokens_details"] = {"cached_tokens": int(turn_usage["cached_input_tokens"])}
    if turn_usage.get("reasoning_tokens"):
        usage["completion_tokens_details"] = {"reasoning_tokens": int(turn_usage["reasoning_tokens"])}
    return usage, bool(turn_usage.get("estimated")), turn_usage.get("cost")


OPENED = ev.Event("chatrun.opened", None)  # marker: the turn's session is open


async def opened(turn: DetachedTurn, receive: Callable[[], Awaitable[Any]]) -> None:
    """Wait until the turn's session is open, so that a request naming a session it may not
    use, or an unknown previous response, fails with its HTTP status before any SSE is sent.
    A client that leaves meanwhile (its turn queued behind another on the session) stops it
    before it runs: no stream is listening for that yet (`receive`: the request's)."""
    first_item = asyncio.ensure_future(turn.next())
    gone = asyncio.ensure_future(_client_gone(receive))
    await asyncio.wait((first_item, gone), return_when=asyncio.FIRST_COMPLETED)
    if not first_item.done():
        first_item.cancel()
        turn.task.cancel()
        raise OpenAIError(499, "the client closed the request before its turn began", code="client_closed")
    gone.cancel()
    first = first_item.result()
    if first is END:
        turn.task.result()  # raises the reason
        raise OpenAIError(500, "the turn ended before it started", "server_error")


async def _client_gone(receive: Callable[[], Awaitable[Any]]) -> None:
    """Until the client disconnects (the body was read: nothing else comes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


# -- requests ----------------------------------------------------------------------------------


TEXT_PARTS = ("text", "input_text", "output_text")
FILE_PARTS = ("image_url", "input_image", "file", "input_file", "input_audio")
AUDIO_MEDIA_TYPES = {"wav": "audio/wav", "mp3": "audio/mpeg"}  # input_audio's `format`s


@dataclass(frozen=True)
class Upload:
    """A file a request's last user message carries: its bytes (a data URL's) or its http(s) URL."""

    media_type: str
    data: bytes | None = None
    url: str | None = None
    name: str = ""


def _text_of(content: Any, where: str) -> str:
    """The text of a message's content: a string, or a list of parts (files are checked by
    `uploads_of` and are no text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in TEXT_PARTS:
                texts.append(str(part.get("text", "")))
            elif not (isinstance(part, dict) and part.get("type") in FILE_PARTS):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise OpenAIError(400, f"{where}.content[{i}]: parts of type {kind!r} are not supported; "
                                  f"send {', '.join(TEXT_PARTS + FILE_PARTS)}", code="unsupported_content",
                                  param=f"{where}.content[{i}].type")
        return "".join(texts)
    raise OpenAIError(400, f"{where}.content must be a string or a list of parts", code="invalid_content",
                      param=f"{where}.content")


def check_said(text: str, uploads: tuple[Upload, ...], where: str, param: str) -> None:
    """A last user message that says nothing (wire.says_nothing: no text, no file) runs no turn:
    400 `empty_message` naming it (`param`: the request's field), before any session is opened."""
    if wire.says_nothing(text, uploads):
        raise OpenAIError(400, wire.nothing_said(where), code="empty_message", param=param)


def uploads_of(messages: list[Any], where: str) -> tuple[Upload, ...]:
    """The files of the last message (conversation_of checked it is the user's): OpenAI's
    `image_url`/`input_image` (a data URL or http(s)), `file`/`input_file` (`file_data`) and
    `input_audio` (base64 `data`, `format` wav or mp3)."""
    content = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
    if not isinstance(content, list):
        return ()
    return tuple(_upload(part, f"{where}[{len(messages) - 1}].content[{i}]") for i, part in enumerate(content)
                 if isinstance(part, dict) and part.get("type") in FILE_PARTS)


def _upload(part: dict[str, Any], where: str) -> Upload:
    if part["type"] == "input_audio":
        return _audio(part.get("input_audio"), where)
    if part["type"] in ("image_url", "input_image"):
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        name = ""
    else:
        file = part.get("file") if part["type"] == "file" else part
        if not isinstance(file, dict) or not isinstance(file.get("file_data"), str):
            raise OpenAIError(400, f"{where}: a file part needs file_data (a base64 data URL); file ids "
                              "are not supported (chatrun has no Files API)", code="unsupported_content", param=where)
        url, name = file["file_data"], str(file.get("filename") or "")
    if not isinstance(url, str):
        raise OpenAIError(400, f"{where}: the image's url must be a string", code="invalid_content", param=where)
    if url.startswith(("http://", "https://")):
        return Upload("image/*", url=url)
    return _decoded(url, name, where)


def _audio(audio: Any, where: str) -> Upload:
    """An `input_audio` part: {"data": base64, "format": "wav" | "mp3"}."""
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        raise OpenAIError(400, f"{where}: an input_audio part needs input_audio.data (base64)", code="invalid_content",
                          param=f"{where}.input_audio.data")
    media_type = AUDIO_MEDIA_TYPES.get(str(audio.get("format", "")).lower())
    if media_type is None:
        raise OpenAIError(400, f"{where}: input_audio.format must be {' or '.join(AUDIO_MEDIA_TYPES)}, "
                          f"not {audio.get('format')!r}", code="invalid_content", param=f"{where}.input_audio.format")
    try:
        data = base64.b64decode(audio["data"], validate=True)
    except ValueError:
        raise OpenAIError(400, f"{where}: input_audio.data is not valid base64", code="invalid_content",
                          param=f"{where}.input_audio.data") from None
    return Upload(media_type, data, name=f"audio.{audio['format'].lower()}")


def _decoded(url: str, name: str, where: str) -> Upload:
    head, comma, payload = url.partition(",")
    if not (head.startswith("data:") and head.endswith(";base64") and comma):
        if not url.startswith("data:") and name:  # `file_data` may be bare base64 (with a filename)
            head, payload = "data:application/octet-stream;base64", url
        else:
            raise OpenAIError(400, f"{where}: expected a base64 data URL (data:<type>;base64,...) "
                              "or an http(s) URL", code="invalid_content", param=where)
    try:
        data = base64.b64decode(payload, validate=True)
    except ValueError:
        raise OpenAIError(400, f"{where}: the data URL's base64 is invalid", code="invalid_content",
                          param=where) from None
    return Upload(head[len("data:"):-len(";base64")] or "application/octet-stream", data, name=name)


def turn_input(session: Any, blobs: BlobArea | None, text: str, uploads: tuple[Upload, ...]) -> Any:
    """What the session is sent: the text, or with uploads, the text and their references
    (the bytes go to the blob area, once)."""
    if not uploads:
        return text
    if blobs is None:
        raise OpenAIError(400, "this server's store keeps no attachments (no blob area beside it; "
                          "see docs/deploy.md, Attachments)", code="unsupported_content")
    try:
        session.check_attachments([(u.media_type, len(u.data or b"")) for u in uploads])
        refs = [Attachment(u.url, u.media_type, u.name) if u.url is not None
                else session.attach(u.data or b"", u.media_type, u.name) for u in uploads]
    except AttachmentRefused as exc:
        raise OpenAIError(400, str(exc), code="attachment_refused") from None
    return {"userMessage": text, "attachments": [a.to_dict() for a in refs]}


_SPEAKERS = ("user", "assistant")
USUAL_ROLES, _USUAL_TYPES, _DICTS, _STRS = frozenset(_SPEAKERS), frozenset({None, "message"}), {dict}, {str}
_GET = dict.get


def usual_exchange(messages: list[Any]) -> Exchange | None:
    """The exchange of a list of usual messages only (each a dict of a user's or assistant's text
    content, of no other type than "message"), read in C-level passes over the list; None when
    any message is another, whose checks conversation_of makes one by one. The loop's checks of
    each message of a resent conversation cost ~0.2 M instructions at 40 turns (issue 39)."""
    if set(map(type, messages)) != _DICTS:
        return None
    contents: list[Any] = list(map(_GET, messages, repeat("content")))
    roles: list[Any] = list(map(_GET, messages, repeat("role")))
    try:
        if set(map(type, contents)) != _STRS or not set(roles) <= USUAL_ROLES \
                or not set(map(_GET, messages, repeat("type"))) <= _USUAL_TYPES:
            return None
    except TypeError:  # an unhashable role or type: not a usual message
        return None
    return list(zip(roles, map(str.strip, contents), strict=True))


def conversation_of(messages: Any, where: str) -> tuple[Exchange, str]:
    """(the earlier user/assistant exchange, the last user message) of an OpenAI message list.
    System and developer messages are not part of it: the bot has its own prompts."""
    earlier, text, _usual = read_conversation(messages, where)
    return earlier, text


def read_conversation(messages: Any, where: str) -> tuple[Exchange, str, bool]:
    """conversation_of's answer, and whether every message was a usual one (usual_exchange)."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, f"{where} must be a non-empty list of messages", code="invalid_messages", param=where)
    exchange = usual_exchange(messages)
    usual = exchange is not None
    if exchange is None:
        exchange = _exchange_of(messages, where)
    if not exchange or exchange[-1][0] != "user":
        raise OpenAIError(400, f"the last message of {where} must be the user's (the turn to run)",
                          code="invalid_messages", param=where)
    return exchange[:-1], exchange[-1][1], usual


def last_user_field(messages: Any, where: str, before: int = 0) -> str:
    """The field of the turn's text in a message list: `where[N].content`, N the last user
    message's index (after `before` earlier messages the list does not hold); `where` itself when
    it is the text (a string)."""
    if not isinstance(messages, list):
        return where
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, str) or (isinstance(message, dict) and message.get("role") == "user"):
            return f"{where}[{before + i}].content"
    return where


def exchange_field(messages: Any, where: str, n: int, before: int = 0) -> str:
    """The field of the exchange's `n`th message in a message list, `where[N].content` (the
    exchange skips system and developer messages; `before`: earlier messages the list does not
    hold); `where` itself when the list has no such message."""
    if not isinstance(messages, list):
        return where
    seen = -1
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            continue
        seen += 1
        if seen == n:
            return f"{where}[{before + i}].content"
    return where


def _exchange_of(messages: list[Any], where: str) -> Exchange:
    """The user/assistant exchange of a message list, each message read with its checks."""
    exchange: Exchange = []
    for i, message in enumerate(messages):
        # The usual message first (a user's or assistant's text): no further checks to make.
        if type(message) is dict and type(message.get("content")) is str and message.get("role") in _SPEAKERS \
                and message.get("type") in (None, "message"):
            exchange.append((message["role"], message["content"].strip()))
            continue
        if isinstance(message, str):
            message = {"role": "user", "content": message}
        if not isinstance(message, dict):
            raise OpenAIError(400, f"{where}[{i}] must be a message object", code="invalid_messages",
                              param=f"{where}[{i}]")
        role = message.get("role")
        if message.get("type") not in (None, "message"):
            raise OpenAIError(400, f"{where}[{i}]: items of type {message.get('type')!r} are not supported; "
                              "chatrun's tools run inside the bot", code="unsupported_item", param=f"{where}[{i}].type")
        if role in ("system", "developer"):
            continue
        if role not in _SPEAKERS:
            raise OpenAIError(400, f"{where}[{i}]: role {role!r} is not supported; chatrun's tools run inside the bot, "
                              "send user and assistant messages", code="unsupported_role", param=f"{where}[{i}].role")
        exchange.append((role, _text_of(message.get("content"), f"{where}[{i}]").strip()))
    return exchange
