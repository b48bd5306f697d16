"""Every served bot as an OpenAI-compatible model (docs/openai-api.md).

    GET  /v1/models              each bot, and each `bot/route` entry point
    POST /v1/chat/completions    the last user message is one turn of a chatrun session
    POST /v1/responses           the same in the Responses API; previous_response_id, conversation
    GET  /v1/responses/{id}      a response as it was answered (the caller's, while kept)

The client sees the conversation, never chatrun's tools: a turn's Message events (and Object
events as JSON) are the assistant's reply; Thinking, Console and RouteChanged are dropped,
or listed in the `chatrun` field when the request asks with `"chatrun": {"events": true}`.
Which session a request continues is decided by chatrun.server.openai_sessions.
Errors have OpenAI's shape, {"error": {"message", "type", "code"}}, so SDKs raise as usual.
"""

from __future__ import annotations

import json
import logging
import operator
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.types import Receive

from chatrun.server import openai_resent, openai_schema, openai_tasks, wire
from chatrun.server.auth import Principal
from chatrun.server.openai_sessions import (
    KEEP_TURNS,
    RESPONSE,
    USER_NAMESPACE,
    Identity,
    Kept,
    TurnIndex,
)
from chatrun.server.openai_turn import (
    Attempt,
    OpenAIError,
    Reply,
    TurnResult,
    Upload,
    check_said,
    conversation_of,
    exchange_field,
    from_failure,
    last_user_field,
    opened,
    read_conversation,
    run_turn,
    uploads_of,
)
from chatrun.server.plumbing import (
    KEEPALIVE,
    Caller,
    DetachedTurn,
    Emit,
    QuickJSONResponse,
    Registry,
    authenticate,
    file_body_limit,
    read_limited,
    served_directly,
)
from chatrun.server.sessions import SessionRegistry
from chatrun.server.turn_run import check_request_id
from chatrun.server.versions import VERSION_HEADER

log = logging.getLogger("chatrun.server.openai")

SESSION_HEADER = "x-chatrun-session"
IDEMPOTENCY_HEADER = "idempotency-key"
# The openai SDKs (Python, Node) number their own retries of a request: 0 first, then 1, 2, ...
RETRY_HEADER = "x-stainless-retry-count"


class Heard:
    """A request's headers by name, each the first of its name as `request.headers.get` finds it,
    read in one pass: each `Headers.get` walks the list and, for the names a request usually
    lacks (a session, a version, a key, a retry), raises and catches a KeyError; the five a
    /v1 request asks cost ~0.03 M instructions (issue 39)."""

    __slots__ = ("_values",)

    def __init__(self, request: Request):
        self._values = dict(reversed(request.headers.raw))  # reversed: the first of a name is kept

    def get(self, name: str) -> str | None:
        value = self._values.get(name.lower().encode("latin-1"))
        return None if value is None else value.decode("latin-1")


def locale_of(heard: Heard, body: dict[str, Any]) -> str | None:
    """The locale a request asks a new session to speak (docs/i18n.md): the body's
    `metadata.locale`, else the Accept-Language header."""
    metadata = body.get("metadata")
    wanted = metadata.get("locale") if isinstance(metadata, dict) else None
    return wanted if isinstance(wanted, str) and wanted else heard.get("accept-language")


@dataclass(frozen=True)
class OpenAIOptions:
    """session_headers: request headers naming the front end's chat (e.g. X-OpenWebUI-Chat-Id),
    trusted to keep chats apart; keepalive: seconds of silence before an SSE comment;
    front_end_tasks: what Open WebUI's title/tags/follow-up requests get (openai_tasks)."""

    session_headers: tuple[str, ...] = ()
    keepalive: float = 10.0
    front_end_tasks: str = openai_tasks.ANSWER  # a front end's background tasks: answer, run or refuse


# -- the routes --------------------------------------------------------------------------------


def make_openai_router() -> APIRouter:
    """The /v1 routes. What they share is app.state.openai (OpenAIState, set by create_app)."""
    router = APIRouter(prefix="/v1", tags=["openai"], route_class=OpenAIRoute)
    router.add_api_route("/models", models, methods=["GET"], responses=openai_schema.ERROR_RESPONSES)
    for path, handler, schema, route_class in (
            ("/chat/completions", chat_completions, openai_schema.CHAT_COMPLETIONS, ChatCompletionsRoute),
            ("/responses", responses, openai_schema.RESPONSES, OpenAIRoute)):
        router.add_api_route(path, handler, methods=["POST"], responses=openai_schema.ERROR_RESPONSES,
                             openapi_extra=openai_schema.request_body(schema), route_class_override=route_class)
    router.add_api_route("/responses/{response_id}", retrieve_response, methods=["GET"],
                         responses=openai_schema.ERROR_RESPONSES)
    router.add_api_route("/{path:path}", unsupported, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                         include_in_schema=False)
    return router


class OpenAIRoute(APIRoute):
    """A /v1 route: every failure, authentication's included, answered in OpenAI's error shape
    (so the SDKs raise as usual) instead of the HTTP API's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return _in_openai_shape(super().get_route_handler())


def _in_openai_shape(handler: Callable[[Request], Coroutine[Any, Any, Response]]
                     ) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    async def in_openai_shape(request: Request) -> Response:
        try:
            return await handler(request)
        except OpenAIError as exc:
            return exc.response()
        except wire.RequestFailed as exc:
            if exc.reason == wire.SERVER_ERROR:
                return (await _server_failure(request, exc)).response()
            return from_failure(exc).response()
        except Exception as exc:  # the store's client raising, or a bug: still OpenAI's shape
            return (await _server_failure(request, exc)).response()

    return in_openai_shape


class ChatCompletionsRoute(OpenAIRoute):
    """POST /v1/chat/completions: documented by `chat_completions`' signature (the OpenAPI text is
    FastAPI's, unchanged), served without FastAPI's request handler, whose solving of its two
    parameters and exit stacks cost ~0.27 M instructions of a late turn (issue 39; the HTTP
    API's turn route does the same: http.py SendMessageRoute): the caller read as the `Caller`
    dependency reads it, every failure answered in OpenAI's shape as OpenAIRoute answers it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.app = served_directly(_in_openai_shape(_chat_completions_direct))

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return _in_openai_shape(_chat_completions_direct)


async def _chat_completions_direct(request: Request) -> Response:
    response: Response = await chat_completions(request, authenticate(request))
    return response


async def _server_failure(request: Request, exc: Exception) -> OpenAIError:
    """A 503 `store_unavailable` when the store does not answer (the SDKs retry 503s, and the
    request can succeed once it is back), else a 500 (logged)."""
    if not await state_of(request).registry.store_ready():
        log.warning("/v1 request failed, the store is unreachable: %s", exc)
        return OpenAIError(503, "the session store is unreachable (nothing of this request was saved); "
                           "send it again shortly", "server_error", "store_unavailable")
    if isinstance(exc, wire.RequestFailed):
        return from_failure(exc)
    log.error("/v1 request failed", exc_info=exc)
    return OpenAIError(500, f"internal server error: {type(exc).__name__}", "server_error")


@dataclass(frozen=True)
class OpenAIState:
    """What the /v1 endpoints share, kept as app.state.openai; and the checks of a request."""

    index: TurnIndex
    limits: wire.ServerLimits
    options: OpenAIOptions
    trusted: tuple[str, ...]  # options.session_headers, lower-case
    resent: openai_resent.ResentBodies  # what this process read of the conversations resent to it

    @classmethod
    def create(cls, registry: SessionRegistry, limits: wire.ServerLimits, options: OpenAIOptions) -> OpenAIState:
        return cls(TurnIndex(registry), limits, options, tuple(h.lower() for h in options.session_headers),
                   openai_resent.ResentBodies())

    @property
    def registry(self) -> SessionRegistry:
        return self.index.registry

    async def read_body(self, request: Request, schema: dict[str, Any]) -> dict[str, Any]:
        return self.checked_body(await self.read_raw(request), schema)[0]

    async def read_raw(self, request: Request) -> bytearray:
        """The body's bytes (read_json_object's reading, its failures in OpenAI's shape)."""
        limit = self.body_limit()
        try:
            return await read_limited(request, limit, lambda: f"body over the limit of {limit} bytes")
        except wire.RequestFailed as exc:
            raise _unreadable(exc) from None

    def checked_body(self, raw: bytearray, schema: dict[str, Any],
                     decode: Callable[[Any, str | None], Any] | None = None) -> tuple[dict[str, Any], bool]:
        """(the body, whether the schema surely accepts it without its validator): refused
        as OpenAI refuses a body that is no JSON object, or one the schema refuses."""
        try:
            body = wire.load_json(raw, "body", decode)
        except wire.RequestFailed as exc:
            raise _unreadable(exc) from None
        if not isinstance(body, dict):
            raise OpenAIError(400, "the body must be a JSON object", code="invalid_json")
        plain = openai_schema.surely_valid(schema, body)
        wrong = None if plain else openai_schema.problem(schema, body)
        if wrong is not None:
            raise OpenAIError(400, wrong.message, code="invalid_request", param=wrong.param)
        return body, plain

    def body_limit(self) -> int:
        """A body's limit: a frame's, plus room for the most files (as base64 data URLs) a
        route of a served bot takes in one message (its `attachments:`)."""
        return file_body_limit(self.limits, self.registry.bots.values())

    def bot_and_route(self, model: Any) -> tuple[str, str | None]:
        if not isinstance(model, str) or not model:
            raise OpenAIError(400, "model must be the name of a served bot (GET /v1/models lists them)",
                              code="model_not_found", param="model")
        name, slash, route = model.partition("/")
        bot = self.registry.bots.get(name)
        if bot is None or (slash and route not in bot.config.routes):  # "travel/" is no model either
            raise OpenAIError(404, f"the model {model!r} does not exist; this server serves: "
                              f"{', '.join(model_ids(self.registry))}", code="model_not_found", param="model")
        return name, route or None

    def check_length(self, text: str, field: str) -> None:
        """413 for a user message over the limit, naming its `field` (`messages[N].content`, `input`)."""
        too_long = self.limits.message_too_long(text, field)
        if too_long:
            raise OpenAIError(413, too_long, code="too_large", param=field)

    def check_earlier(self, earlier: Sequence[tuple[str, str]], messages: Any, where: str, before: int = 0) -> None:
        """413 for an earlier user message of the list over the limit, as for the last one: a new
        session's memory is seeded with them (openai_sessions._seed), so the model would read a
        message no door takes. `messages`: the list `earlier` was read from (`before` messages
        ahead of it), to name the field."""
        limit = self.limits.max_message_chars
        if max(map(len, map(operator.itemgetter(1), earlier)), default=0) <= limit:
            return
        for n, (role, text) in enumerate(earlier):
            if role == "user" and len(text) > limit:
                self.check_length(text, exchange_field(messages, where, n, before))

    def namespace(self, heard: Heard, body: dict[str, Any]) -> str:
        for header in self.trusted:
            value = heard.get(header)
            if value:
                return f"{header}:{value}"
        user = body.get("user") or body.get("safety_identifier")
        return f"{USER_NAMESPACE}{user}" if isinstance(user, str) and user else ""


def _unreadable(exc: wire.RequestFailed) -> OpenAIError:
    if exc.reason == wire.TOO_LARGE:
        return OpenAIError(413, exc.message, code="too_large")
    if exc.reason == wire.REQUEST_TIMEOUT:
        return OpenAIError(408, exc.message, code="timeout")
    return OpenAIError(400, exc.message, code="invalid_json")


def state_of(request: Request) -> OpenAIState:
    api: OpenAIState = request.app.state.openai
    return api


# -- the endpoints (their docstrings are the operations' descriptions in /openapi.json) ---------------


async def models(who: Caller, registry: Registry) -> Any:
    """Each served bot as a model, and each `bot/route` entry point."""
    return {"object": "list", "data": [
        {"id": mid, "object": "model", "created": 0, "owned_by": "chatrun"} for mid in model_ids(registry)
    ]}


async def chat_completions(request: Request, who: Caller) -> Any:
    """OpenAI Chat Completions: the last user message is one turn of a chatrun session."""
    api = state_of(request)
    body, completion = await _chat_completion(api, request, who)
    task = openai_tasks.task_of(completion.ident.earlier, completion.text)
    if task is not None and api.options.front_end_tasks != openai_tasks.RUN:
        if api.options.front_end_tasks == openai_tasks.REFUSE:
            raise OpenAIError(400, "this server does not run a chat front end's background tasks (title, tags, "
                              "follow-ups): turn them off in the front end (docs/openai-api.md)", code="front_end_task")
        return completion.fixed(openai_tasks.fixed_answer(task, completion.text), bool(body.get("stream")))
    return await completion.stream(request.receive) if body.get("stream") else await completion.answer()


async def _chat_completion(api: OpenAIState, request: Request, who: Principal | None
                           ) -> tuple[dict[str, Any], ChatCompletion]:
    """The request read (its body's fields, and the completion): from where the conversation
    this process read before ends when the body resends it (server/openai_resent.py), else
    whole; either way, what it read is kept for the conversation's next request."""
    raw = await api.read_raw(request)
    owner = who.name if who is not None else None
    resent = api.resent.read(raw, owner)
    if resent is not None:
        completion = ChatCompletion.parse(api, request, resent.body, who, resent)
        if completion is not None:
            _learn(api, raw, completion, resent.known.size, resent.hashed, resent.end, resent.known.head,
                   resent.known.count + len(resent.body["messages"]))
            return resent.body, completion
    noted = openai_resent.Noted()
    body, plain = api.checked_body(raw, openai_schema.CHAT_COMPLETIONS, noted)
    completion = ChatCompletion.parse(api, request, body, who)
    if completion.usual and noted.head is not None and (plain or openai_schema.all_plain(body["messages"])):
        end = noted.end if raw.isascii() else len(noted.text[:noted.end].encode("utf-8", "surrogatepass"))
        _learn(api, raw, completion, 0, None, end, noted.head, len(body["messages"]))
    return body, completion


def _learn(api: OpenAIState, raw: bytearray, completion: ChatCompletion, start: int, hashed: Any, end: int,
           head: Sequence[tuple[str, Any]], count: int) -> None:
    """Keep what reading this body up to the end of its last message gave, for the next request."""
    ident, owner = completion.ident, completion.who.name if completion.who is not None else None
    running = ident.running_after(owner, [("user", completion.text)])
    api.resent.learn(raw, start, hashed, end, head, count, (ident.bot, owner, ident.namespace), running)


async def responses(request: Request, who: Caller) -> Any:
    """OpenAI Responses: one turn; previous_response_id and conversation name the session."""
    api = state_of(request)
    body = await api.read_body(request, openai_schema.RESPONSES)
    response = await ResponseRequest.parse(api, request, body, who)
    return await response.stream(request.receive) if body.get("stream") else await response.answer()


async def retrieve_response(response_id: str, request: Request, who: Caller) -> Any:
    """OpenAI Responses: a response this caller made, as its request was answered (the last
    turns of each conversation are kept, while the conversation is)."""
    if request.query_params.get("stream", "false").lower() not in ("false", "0", ""):
        raise OpenAIError(400, "a kept response is not streamed again: retrieve it without stream",
                          code="unsupported_parameter", param="stream")
    kept = await state_of(request).index.kept_response(response_id, who)
    if kept is None:
        raise OpenAIError(404, f"no response {response_id!r} for this caller: chatrun keeps the responses of "
                          f"a conversation's last {KEEP_TURNS} turns, and only for the caller that made them",
                          code="response_not_found", param="id")
    return QuickJSONResponse(kept)


async def unsupported(request: Request) -> Any:
    raise OpenAIError(404, f"{request.method} {request.url.path} is not part of chatrun's OpenAI API "
                      "(see docs/openai-api.md)", code="unknown_url")


@dataclass
class TurnRequest:
    """What a request of either OpenAI API holds once checked: where its turn goes, who asks,
    the model named, the input, and which conversation it continues."""

    index: TurnIndex
    keepalive: float
    who: Principal | None
    model: str
    text: str  # the last user message: the turn's input
    ident: Identity


    def prompts(self) -> list[str]:
        """The texts of the conversation, for a usage estimate (asked only for one)."""
        return [t for _, t in self.ident.earlier] + [self.text]


def turn_failed(result: TurnResult) -> OpenAIError:
    """500 `turn_failed`: the `message` is what the user reads of the failed turn (its Error text,
    in the session's locale; docs/format.md "When a turn fails"), with no English before it: a
    client shows it as it is, a program reads the `code`."""
    return OpenAIError(500, str(result.error), "server_error", "turn_failed")


# -- Chat Completions ------------------------------------------------------------------------------


@dataclass
class ChatCompletion(TurnRequest):
    """One /v1/chat/completions request, checked: its turn, and the reply in either form."""

    as_json: bool  # response_format json_object/json_schema: the Object events as the reply
    want_events: bool
    include_usage: bool
    attempt: Attempt
    id: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))
    uploads: tuple[Upload, ...] = ()  # the files of the last user message
    usual: bool = False  # every message a usual one (openai_turn.read_conversation)

    @overload
    @classmethod
    def parse(cls, api: OpenAIState, request: Request, body: dict[str, Any], who: Principal | None,
              resent: None = None) -> ChatCompletion: ...
    @overload
    @classmethod
    def parse(cls, api: OpenAIState, request: Request, body: dict[str, Any], who: Principal | None,
              resent: openai_resent.Resent) -> ChatCompletion | None: ...
    @classmethod
    def parse(cls, api: OpenAIState, request: Request, body: dict[str, Any], who: Principal | None,
              resent: openai_resent.Resent | None = None) -> ChatCompletion | None:
        """The request checked; with `resent` (its body read from a known prefix), None when that
        prefix's hash is another caller's or namespace's: read the body whole."""
        bot, route = api.bot_and_route(body.get("model"))
        earlier: Sequence[tuple[str, str]]
        if resent is None:
            earlier, text, usual = read_conversation(body.get("messages"), "messages")
        else:
            earlier, text, usual = resent.earlier, resent.text, True
        api.check_length(text, last_user_field(body.get("messages"), "messages",
                                               resent.known.count if resent is not None else 0))
        if resent is None:
            api.check_earlier(earlier, body.get("messages"), "messages")
        else:  # the known prefix passed this check when it was new
            api.check_earlier(resent.new_pairs, body.get("messages"), "messages", resent.known.count)
        heard = Heard(request)
        ident = Identity(bot, earlier, heard.get(SESSION_HEADER), api.namespace(heard, body), route=route,
                         version=heard.get(VERSION_HEADER), locale=locale_of(heard, body))
        if resent is not None and not ident.hashed_as(who.name if who is not None else None,
                                                       resent.running((bot, who.name if who else None, ident.namespace))):
            return None
        uploads = () if resent is not None else uploads_of(body["messages"], "messages")
        check_said(text, uploads, "the last user message of messages", "messages")
        return cls(
            api.index, api.options.keepalive, who, body["model"], text, ident,
            as_json=(body.get("response_format") or {}).get("type") in ("json_object", "json_schema"),
            want_events=bool(body["chatrun"].get("events")) if isinstance(body.get("chatrun"), dict) else False,
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            attempt=attempt_of(api.index, heard, body, ident, text, who),
            uploads=uploads, usual=usual,
        )

    def keys_after(self, reply: Reply) -> list[str]:
        content = (reply.json_text() if self.as_json else reply.text).strip()
        turn = [("user", self.text), ("assistant", content)]
        return [self.ident.prefix_key(self.who.name if self.who else None, turn)]

    def run(self, emit: Emit | None) -> Coroutine[Any, Any, TurnResult]:
        return run_turn(self.index, self.ident, self.who, self.text, self.prompts, emit, self.keys_after,
                        self.attempt, self.uploads)

    def info(self, result: TurnResult) -> dict[str, Any]:
        return result.session | _objects_and_events(result.reply, self.want_events)

    async def answer(self) -> JSONResponse:
        result = await self.run(None)
        if not result.ok:
            raise turn_failed(result)
        content = result.reply.json_text() if self.as_json else result.reply.text
        annotations = [] if self.as_json else _chat_annotations(result.reply)
        return QuickJSONResponse({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": content, "refusal": None,
                                     "annotations": annotations}}],
            "usage": result.usage, "system_fingerprint": None, "chatrun": self.info(result),
        }, headers={"X-Chatrun-Session": result.session["session"]})

    async def stream(self, receive: Receive) -> StreamingResponse:
        turn = DetachedTurn(self.run)
        await opened(turn, receive)
        return _sse(self.frames(turn))

    def fixed(self, content: str, stream: bool) -> Response:
        """An answer made without a turn (a front end's task): no session, no usage."""
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        info = {"front_end_task": True}
        if stream:
            frames = [self.chunk({"role": "assistant", "content": ""}), self.chunk({"content": content}),
                      self.chunk({}, "stop", chatrun=info), "data: [DONE]\n\n"]
            return _sse(_frames_of(frames))
        return JSONResponse({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": {"role": "assistant", "content": content, "refusal": None}}],
            "usage": usage, "system_fingerprint": None, "chatrun": info,
        })

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        payload = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                   "system_fingerprint": None,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
        return "data: " + json.dumps(payload, ensure_ascii=False) + "\n\n"

    async def frames(self, turn: DetachedTurn) -> AsyncIterator[str]:
        view = Reply()
        yield self.chunk({"role": "assistant", "content": ""})
        async for item in turn.items(self.keepalive):
            if item is KEEPALIVE:
                yield ": keep-alive\n\n"
                continue
            delta = view.feed(item)
            if delta and not self.as_json:
                yield self.chunk({"content": delta})
        for frame in self.closing(turn):
            yield frame

    def closing(self, turn: DetachedTurn) -> list[str]:
        """The stream's last frames: the outcome, and the usage when the request asked for it."""
        try:
            result: TurnResult = turn.task.result()
        except (OpenAIError, wire.RequestFailed) as exc:
            failure = exc if isinstance(exc, OpenAIError) else from_failure(exc)
            return ["data: " + json.dumps(failure.body()) + "\n\n"]
        except Exception as exc:  # reported to the client, logged here
            log.exception("chat completion turn failed")
            return ["data: " + json.dumps(OpenAIError(500, f"internal server error: {exc}", "server_error").body()) + "\n\n"]
        if not result.ok:
            failed = turn_failed(result)
            return ["data: " + json.dumps(failed.body()) + "\n\n"]
        frames = [self.chunk({"content": result.reply.json_text()})] if self.as_json else []
        annotations = [] if self.as_json else _chat_annotations(result.reply)
        if annotations:  # the reply's citations, once its text is whole (as OpenAI streams a search's)
            frames.append(self.chunk({"annotations": annotations}))
        frames.append(self.chunk({}, "stop", chatrun=self.info(result)))
        if self.include_usage:
            payload: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                                       "model": self.model, "system_fingerprint": None, "choices": [],
                                       "usage": result.usage}
            frames.append("data: " + json.dumps(payload) + "\n\n")
        return [*frames, "data: [DONE]\n\n"]


def attempt_of(index: TurnIndex, heard: Heard, body: dict[str, Any], ident: Identity, text: str,
               who: Principal | None) -> Attempt:
    """Which request this is, for exactly-once: an Idempotency-Key names it; without one, it is
    what it says about its turn, and only the SDKs' own retries (x-stainless-retry-count > 0)
    look for an earlier attempt: the same request sent again by a user is a regenerate (a fork)."""
    owner = who.name if who is not None else None
    key = heard.get(IDEMPOTENCY_HEADER)
    what = [ident.explicit_id, ident.route, text, body.get("response_format")]  # and the conversation: hashed once
    if key is not None:
        check_request_id(key)
        # What the request asks, kept with its outcome: the key reused for another request is a 422.
        return Attempt(index.request_key(ident.bot, owner, ["idempotency-key", key]), True,
                       key, ident.request_key(owner, what))
    retry = heard.get(RETRY_HEADER)
    retries = "0" if retry is None else retry.strip()
    return Attempt(ident.request_key(owner, what), retries.isdigit() and int(retries) > 0)


# -- Responses ---------------------------------------------------------------------------------------


@dataclass
class ResponseRequest(TurnRequest):
    """One /v1/responses request, checked: its turn, and the response object in either form."""

    previous_id: str | None
    conversation: str | None
    want_events: bool
    id: str = field(default_factory=lambda: "resp_" + secrets.token_hex(16))
    message_id: str = field(default_factory=lambda: "msg_" + secrets.token_hex(16))
    created: float = field(default_factory=time.time)
    uploads: tuple[Upload, ...] = ()  # the files of the last user message

    @classmethod
    async def parse(cls, api: OpenAIState, request: Request, body: dict[str, Any],
                    who: Principal | None) -> ResponseRequest:
        bot, route = api.bot_and_route(body.get("model"))
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        earlier, text = conversation_of(items, "input")
        api.check_length(text, "input" if isinstance(body.get("input"), str) else last_user_field(items, "input"))
        api.check_earlier(earlier, items, "input")
        uploads = uploads_of(items if isinstance(items, list) else [], "input")
        check_said(text, uploads, "input" if isinstance(body.get("input"), str) else "the last user message of input",
                   "input")
        previous_id = body.get("previous_response_id")
        previous = None if previous_id is None else await _previous_response(api.index, str(previous_id), bot, who)
        if previous is not None:
            earlier = []  # the response's session already holds what came before
        conversation = _conversation_id(body.get("conversation"))
        heard = Heard(request)
        explicit = conversation or heard.get(SESSION_HEADER)
        ident = Identity(bot, earlier, explicit, api.namespace(heard, body), previous, route,
                         heard.get(VERSION_HEADER), locale_of(heard, body))
        want_events = isinstance(body.get("chatrun"), dict) and bool(body["chatrun"].get("events"))
        return cls(api.index, api.options.keepalive, who, body["model"], text, ident, previous_id, conversation,
                   want_events, uploads=uploads)

    def keys_after(self, reply: Reply) -> list[str]:
        keys = [self.index.response_key(self.id)]
        if self.ident.previous is None:
            turn = [("user", self.text), ("assistant", reply.text.strip())]
            keys.append(self.ident.prefix_key(self.who.name if self.who else None, turn))
        return keys

    def run(self, emit: Emit | None) -> Coroutine[Any, Any, TurnResult]:
        stopped = {self.index.response_key(self.id): {RESPONSE: self.response_object("cancelled", None, None)}}
        # No replays (each attempt is its own response), but a failed first turn's retry runs in its session.
        again = self.ident.request_key(self.who.name if self.who else None, ["responses", self.ident.route, self.text])
        return run_turn(self.index, self.ident, self.who, self.text, self.prompts, emit, self.keys_after,
                        uploads=self.uploads, stopped=stopped, kept=self.kept_after, again=again)

    def kept_after(self, result: TurnResult) -> Kept:
        """What the response id's record keeps besides the turn: the response object as this
        request answers it (JSON or the stream's response.completed), for GET /v1/responses/{id}."""
        return {self.index.response_key(self.id): {RESPONSE: self.response_object("completed", result, result.reply.text)}}

    def response_object(self, status: str, result: TurnResult | None, text_out: str | None) -> dict[str, Any]:
        annotations = _response_annotations(result.reply) if result is not None else []
        output = [] if text_out is None else [_output_message(self.message_id, text_out, "completed", annotations)]
        obj: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": status, "output": output, "parallel_tool_calls": False, "tool_choice": "auto",
            "tools": [], "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
            "previous_response_id": self.previous_id, "text": {"format": {"type": "text"}}, "usage": None,
        }
        if self.conversation:
            obj["conversation"] = {"id": self.conversation}
        if result is not None:
            obj["usage"] = _responses_usage(result.usage)
            obj["chatrun"] = result.session | _objects_and_events(result.reply, self.want_events)
        return obj

    async def answer(self) -> JSONResponse:
        result = await self.run(None)
        if not result.ok:
            raise turn_failed(result)
        return QuickJSONResponse(self.response_object("completed", result, result.reply.text),
                       headers={"X-Chatrun-Session": result.session["session"]})

    async def stream(self, receive: Receive) -> StreamingResponse:
        turn = DetachedTurn(self.run)
        await opened(turn, receive)
        return _sse(self.frames(turn))

    async def frames(self, turn: DetachedTurn) -> AsyncIterator[str]:
        events = _NumberedEvents()
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        yield events.frame("response.created", response=self.response_object("in_progress", None, None))
        yield events.frame("response.in_progress", response=self.response_object("in_progress", None, None))
        yield events.frame("response.output_item.added", output_index=0,
                           item=_output_message(self.message_id, None, "in_progress"))
        yield events.frame("response.content_part.added", part={"type": "output_text", "text": "", "annotations": []},
                           **where)
        view = Reply()
        async for item in turn.items(self.keepalive):
            if item is KEEPALIVE:
                yield ": keep-alive\n\n"
                continue
            delta = view.feed(item)
            if delta:
                yield events.frame("response.output_text.delta", delta=delta, logprobs=[], **where)
        for frame in self.closing(turn, events, where):
            yield frame

    def closing(self, turn: DetachedTurn, events: _NumberedEvents, where: dict[str, Any]) -> list[str]:
        """The stream's last events: response.failed, or the done events and response.completed."""
        try:
            result: TurnResult = turn.task.result()
            failure = None if result.ok else turn_failed(result).message
        except (OpenAIError, wire.RequestFailed) as exc:
            failure = exc.message
        except Exception as exc:  # reported to the client, logged here
            log.exception("responses turn failed")
            failure = f"internal server error: {exc}"
        if failure is not None:
            failed = self.response_object("failed", None, None) | {"error": {"code": "server_error", "message": failure}}
            return [events.frame("response.failed", response=failed)]
        final = result.reply.text
        annotations = _response_annotations(result.reply)
        part = {"type": "output_text", "text": final, "annotations": annotations}
        return [
            *(events.frame("response.output_text.annotation.added", annotation=annotation, annotation_index=i, **where)
              for i, annotation in enumerate(annotations)),
            events.frame("response.output_text.done", text=final, logprobs=[], **where),
            events.frame("response.content_part.done", part=part, **where),
            events.frame("response.output_item.done", output_index=0,
                         item=_output_message(self.message_id, final, "completed", annotations)),
            events.frame("response.completed", response=self.response_object("completed", result, final)),
        ]


class _NumberedEvents:
    """The Responses stream's events, each with its sequence_number (0, 1, ...)."""

    def __init__(self) -> None:
        self.sequence = 0

    def frame(self, kind: str, **data: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _previous_response(index: TurnIndex, previous_id: str, bot: str, who: Principal | None) -> dict[str, Any]:
    """The record of previous_response_id: the caller's, made by the same model."""
    previous = await index.response(previous_id, who)
    if previous is None:
        raise OpenAIError(404, f"no response {previous_id!r} (previous_response_id) for this caller",
                          code="previous_response_not_found", param="previous_response_id")
    if previous.get("bot") != bot:
        raise OpenAIError(400, f"response {previous_id!r} was made by model {previous.get('bot')!r}, "
                          f"not {bot!r}", code="model_mismatch", param="previous_response_id")
    return previous


def _conversation_id(conversation: Any) -> str | None:
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    if conversation is not None and not isinstance(conversation, str):
        raise OpenAIError(400, "conversation must be an id (a string or {\"id\": ...})", code="invalid_conversation",
                          param="conversation")
    return conversation


def _responses_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """The Responses API's usage object, from the Chat Completions one run_turn makes."""
    return {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
            "input_tokens_details": {"cached_tokens": (usage.get("prompt_tokens_details") or {}).get(
                "cached_tokens", 0), "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": (usage.get("completion_tokens_details") or {}).get(
                "reasoning_tokens", 0)}}


def model_ids(registry: SessionRegistry) -> list[str]:
    ids = []
    for name, bot in registry.bots.items():
        ids.append(name)
        ids.extend(f"{name}/{route}" for route in bot.config.routes)
    return ids


def _output_message(message_id: str, text: str | None, status: str,
                    annotations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": annotations or [],
                                        "logprobs": []}]
    return {"type": "message", "id": message_id, "role": "assistant", "status": status, "content": content}


async def _frames_of(frames: list[str]) -> AsyncIterator[str]:
    for frame in frames:
        yield frame


def _sse(frames: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(frames, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _objects_and_events(reply: Reply, want_events: bool) -> dict[str, Any]:
    """What the `chatrun` field adds to the session: the turn's Object events as data (the
    reply text shows them readably), every source the reply cites (with a link or not), and
    the other events when the request asked for them."""
    out: dict[str, Any] = {"objects": reply.objects} if reply.objects else {}
    if reply.sources:
        out["sources"] = reply.sources
    return out | ({"events": reply.other} if want_events else {})


def _chat_annotations(reply: Reply) -> list[dict[str, Any]]:
    """The reply's citations as Chat Completions' message `annotations` (docs/openai-api.md, Sources)."""
    return [{"type": "url_citation", "url_citation": citation} for citation in reply.annotations()]


def _response_annotations(reply: Reply) -> list[dict[str, Any]]:
    """The reply's citations as the Responses API's `output_text` annotations."""
    return [{"type": "url_citation", **citation} for citation in reply.annotations()]
