"""Every served bot as an OpenAI-compatible model (docs/openai-api.md).

    GET  /v1/models              each bot, and each `bot/route` entry point
    POST /v1/chat/completions    the last user message is one turn of a chatrun session
    POST /v1/responses           the same in the Responses API; previous_response_id, conversation

The client sees the conversation, never chatrun's tools: a turn's Message events (and Object
events as JSON) are the assistant's reply; Thinking, Console and RouteChanged are dropped,
or listed in the `chatrun` field when the request asks with `"chatrun": {"events": true}`.
Which session a request continues is decided by chatrun.server.openai_sessions.
Errors have OpenAI's shape, {"error": {"message", "type", "code"}}, so SDKs raise as usual.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from chatrun import events as ev
from chatrun.memory.tokens import estimate_tokens
from chatrun.server import openai_schema, wire
from chatrun.server.auth import Principal, token_from
from chatrun.server.openai_sessions import Exchange, Identity, Opened, TurnIndex
from chatrun.server.sessions import SessionRegistry

log = logging.getLogger("chatrun.server.openai")

SESSION_HEADER = "x-chatrun-session"
SEPARATOR = "\n\n"  # between the texts of a turn's several Message/Object events
_BACKGROUND: set[asyncio.Task] = set()  # turns whose streaming client left: they still complete


@dataclass(frozen=True)
class OpenAIOptions:
    """session_headers: request headers naming the front end's chat (e.g. X-OpenWebUI-Chat-Id),
    trusted to keep chats apart; keepalive: seconds of silence before an SSE comment."""

    session_headers: tuple[str, ...] = ()
    keepalive: float = 10.0


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": None}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


_TYPES = {401: "invalid_request_error", 403: "permission_error", 404: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error"}
_CODES = {wire.UNAUTHORIZED: "invalid_api_key", wire.BOT_NOT_FOUND: "model_not_found",
          wire.SESSION_NOT_ACTIVE: "session_not_found", wire.ROUTE_NOT_FOUND: "model_not_found"}


def from_failure(exc: wire.RequestFailed) -> OpenAIError:
    status = wire.HTTP_STATUS.get(exc.reason, 400)
    return OpenAIError(status, exc.message, _TYPES.get(status, "invalid_request_error"),
                       _CODES.get(exc.reason, exc.reason))


# -- the turn --------------------------------------------------------------------------------


@dataclass
class Reply:
    """The client's view of a turn: the text of its Message and Object events, in order.
    Streamed chunks are passed on as they come; the Message that ends them adds nothing."""

    parts: list[str] = field(default_factory=list)
    objects: list[Any] = field(default_factory=list)
    other: list[dict] = field(default_factory=list)  # Thinking, Console, RouteChanged, ...
    streaming: str = ""

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
            return self._part(json.dumps(event.data, ensure_ascii=False))
        if event.type != ev.ERROR:
            self.other.append(event.to_dict())
        return ""

    def _part(self, text: str) -> str:
        streamed, self.streaming = self.streaming, ""
        if streamed:  # the client has those chunks already: send what the final text adds, if anything
            self.parts.append(text if text.startswith(streamed) else streamed)
            return text[len(streamed):] if text.startswith(streamed) else ""
        self.parts.append(text)
        return (SEPARATOR if len(self.parts) > 1 else "") + text

    @property
    def text(self) -> str:
        return SEPARATOR.join(self.parts + ([self.streaming] if self.streaming else []))

    def json_text(self) -> str:
        """The reply for response_format json_object/json_schema: the Object events as JSON."""
        if not self.objects:
            return self.text
        return json.dumps(self.objects[0] if len(self.objects) == 1 else self.objects, ensure_ascii=False)


@dataclass
class TurnResult:
    opened: Opened
    reply: Reply
    ok: bool
    error: str | None
    usage: dict[str, Any]  # OpenAI's usage object: counts and *_details mappings
    usage_estimated: bool
    session: dict[str, Any]


Emit = Callable[[ev.Event], None]


async def run_turn(
    index: TurnIndex, ident: Identity, who: Principal | None, text: str, prompt_texts: list[str],
    emit: Emit, keys_after: Callable[[Reply], list[str]],
) -> TurnResult:
    """One turn in the request's session; the index records it when it commits."""
    reply = Reply()
    async with index.open(ident, who) as opened:
        emit(OPENED)  # a streaming response may start: the request found (or made) its session
        session = opened.session
        error = None
        # Through the registry: the turn is committed (fenced by version and lease) before the
        # answer; a refused commit fails the request (Conflict) instead of answering unsaved.
        async for event in index.registry.turn(session, text):
            if event.type == ev.ERROR:
                error = str(event.data)
            reply.feed(event)
            emit(event)
        entry = session.last_turn or {}
        ok = bool(entry.get("ok")) and error is None
        if ok:
            await index.remember(session, who, keys_after(reply))
        usage, estimated, cost = openai_usage(entry.get("usage"), prompt_texts, reply.text)
        info = {"session": session.id, "turn": session.turn_count, "route": session.route, "stack": session.stack,
                "how": opened.how}
        if opened.forked_from:
            info["forked_from"] = opened.forked_from
        if estimated:
            info["usage_estimated"] = True
        if cost is not None:
            info["cost"] = cost
        return TurnResult(opened, reply, ok, error or entry.get("error"), usage, estimated, info)


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


def _turn_in_background(start: Callable[[Emit], Any]) -> tuple[asyncio.Queue, asyncio.Task]:
    """Run the turn in its own task, so a client that disconnects does not cancel it."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    task = asyncio.ensure_future(start(queue.put_nowait))
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    task.add_done_callback(lambda _t: queue.put_nowait(_END))
    return queue, task


_END = object()
_KEEPALIVE = object()
OPENED = ev.Event("chatrun.opened", None)  # marker: the turn's session is open


async def _opened(queue: asyncio.Queue, task: asyncio.Task) -> None:
    """Wait until the turn's session is open, so that a request naming a session it may not
    use, or an unknown previous response, fails with its HTTP status before any SSE is sent."""
    first = await queue.get()
    if first is _END:
        task.result()  # raises the reason
        raise OpenAIError(500, "the turn ended before it started", "server_error")


async def _events(queue: asyncio.Queue, keepalive: float) -> AsyncIterator[Any]:
    """The turn's events, with _KEEPALIVE after every `keepalive` seconds of silence."""
    while True:
        try:
            item = await asyncio.wait_for(queue.get(), keepalive)
        except TimeoutError:
            yield _KEEPALIVE
            continue
        if item is _END:
            return
        yield item


# -- requests ----------------------------------------------------------------------------------


def _text_of(content: Any, where: str) -> str:
    """The text of a message's content: a string, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                texts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise OpenAIError(400, f"{where}.content[{i}]: only text parts are supported, not {kind!r}",
                                  code="unsupported_content")
        return "".join(texts)
    raise OpenAIError(400, f"{where}.content must be a string or a list of parts", code="invalid_content")


def conversation_of(messages: Any, where: str) -> tuple[Exchange, str]:
    """(the earlier user/assistant exchange, the last user message) of an OpenAI message list.
    System and developer messages are not part of it: the bot has its own prompts."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(400, f"{where} must be a non-empty list of messages", code="invalid_messages")
    exchange: Exchange = []
    for i, message in enumerate(messages):
        if isinstance(message, str):
            message = {"role": "user", "content": message}
        if not isinstance(message, dict):
            raise OpenAIError(400, f"{where}[{i}] must be a message object", code="invalid_messages")
        role = message.get("role")
        if message.get("type") not in (None, "message"):
            raise OpenAIError(400, f"{where}[{i}]: items of type {message.get('type')!r} are not supported; "
                              "chatrun's tools run inside the bot", code="unsupported_item")
        if role in ("system", "developer"):
            continue
        if role not in ("user", "assistant"):
            raise OpenAIError(400, f"{where}[{i}]: role {role!r} is not supported; chatrun's tools run inside the bot, "
                              "send user and assistant messages", code="unsupported_role")
        exchange.append((role, _text_of(message.get("content"), f"{where}[{i}]").strip()))
    if not exchange or exchange[-1][0] != "user":
        raise OpenAIError(400, f"the last message of {where} must be the user's (the turn to run)",
                          code="invalid_messages")
    return exchange[:-1], exchange[-1][1]


def make_openai_router(
    registry: SessionRegistry, limits: wire.ServerLimits, auth: Any, options: OpenAIOptions = OpenAIOptions()  # noqa: B008
) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["openai"])
    index = TurnIndex(registry)
    trusted = tuple(h.lower() for h in options.session_headers)

    def principal(request: Request) -> Principal | None:
        if auth is None:
            return None
        found = auth.authenticate(token_from(request.headers, request.query_params))
        if found is None:
            raise OpenAIError(401, "unauthorized: send a valid token as Authorization: Bearer <token> "
                              "(the OpenAI SDKs' api_key)", code="invalid_api_key")
        return found

    async def read_body(request: Request, schema: dict[str, Any]) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > limits.max_frame_bytes:
            raise OpenAIError(413, f"body of {len(raw)} bytes is over the limit of {limits.max_frame_bytes} bytes",
                              code="too_large")
        try:
            body = wire.load_json(raw, "body")
        except wire.RequestFailed as exc:
            raise OpenAIError(400, exc.message, code="invalid_json") from None
        if not isinstance(body, dict):
            raise OpenAIError(400, "the body must be a JSON object", code="invalid_json")
        wrong = openai_schema.problem(schema, body)
        if wrong is not None:
            raise OpenAIError(400, wrong, code="invalid_request")
        return body

    def bot_and_route(model: Any) -> tuple[str, str | None]:
        if not isinstance(model, str) or not model:
            raise OpenAIError(400, "model must be the name of a served bot (GET /v1/models lists them)",
                              code="model_not_found")
        name, _, route = model.partition("/")
        bot = registry.bots.get(name)
        if bot is None or (route and route not in bot.config.routes):
            raise OpenAIError(404, f"the model {model!r} does not exist; this server serves: "
                              f"{', '.join(model_ids(registry))}", code="model_not_found")
        return name, route or None

    def check_length(text: str) -> None:
        too_long = limits.message_too_long(text)
        if too_long:
            raise OpenAIError(413, too_long, code="too_large")

    def namespace(request: Request, body: dict[str, Any]) -> str:
        for header in trusted:
            value = request.headers.get(header)
            if value:
                return f"{header}:{value}"
        user = body.get("user") or body.get("safety_identifier")
        return f"user:{user}" if isinstance(user, str) and user else ""

    def handled(handler: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapper(request: Request) -> Any:
            try:
                return await handler(request)
            except OpenAIError as exc:
                return exc.response()
            except wire.RequestFailed as exc:
                return from_failure(exc).response()

        wrapper.__name__ = handler.__name__
        wrapper.__doc__ = handler.__doc__
        return wrapper

    async def models(request: Request) -> Any:
        """Each served bot as a model, and each `bot/route` entry point."""
        principal(request)
        return {"object": "list", "data": [
            {"id": mid, "object": "model", "created": 0, "owned_by": "chatrun"} for mid in model_ids(registry)
        ]}

    async def chat_completions(request: Request) -> Any:
        """OpenAI Chat Completions: the last user message is one turn of a chatrun session."""
        who = principal(request)
        body = await read_body(request, openai_schema.CHAT_COMPLETIONS)
        model = body.get("model")
        bot, route = bot_and_route(model)
        earlier, text = conversation_of(body.get("messages"), "messages")
        check_length(text)
        ident = Identity(bot, earlier, request.headers.get(SESSION_HEADER), namespace(request, body), route=route)
        as_json = (body.get("response_format") or {}).get("type") in ("json_object", "json_schema")
        want_events = bool((body.get("chatrun") or {}).get("events")) if isinstance(body.get("chatrun"), dict) else False
        prompts = [t for _, t in earlier] + [text]

        def keys_after(reply: Reply) -> list[str]:
            after = earlier + [("user", text), ("assistant", (reply.json_text() if as_json else reply.text).strip())]
            who_name = who.name if who else None
            return [index.prefix_key(bot, who_name, ident.namespace, after)]

        completion_id = "chatcmpl-" + secrets.token_hex(12)
        created = int(time.time())

        def start(emit: Emit) -> Any:
            return run_turn(index, ident, who, text, prompts, emit, keys_after)

        if not body.get("stream"):
            result = await start(lambda _e: None)
            if not result.ok:
                raise OpenAIError(500, f"the turn failed: {result.error}", "server_error", "turn_failed")
            info = result.session | ({"events": result.reply.other} if want_events else {})
            content = result.reply.json_text() if as_json else result.reply.text
            return JSONResponse({
                "id": completion_id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                             "message": {"role": "assistant", "content": content, "refusal": None}}],
                "usage": result.usage, "system_fingerprint": None, "chatrun": info,
            }, headers={"X-Chatrun-Session": result.session["session"]})

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            payload = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "system_fingerprint": None,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
            return "data: " + json.dumps(payload, ensure_ascii=False) + "\n\n"

        queue, task = _turn_in_background(start)
        await _opened(queue, task)

        async def frames() -> AsyncIterator[str]:
            view = Reply()
            yield chunk({"role": "assistant", "content": ""})
            async for item in _events(queue, options.keepalive):
                if item is _KEEPALIVE:
                    yield ": keep-alive\n\n"
                    continue
                delta = view.feed(item)
                if delta and not as_json:
                    yield chunk({"content": delta})
            try:
                result: TurnResult = task.result()
            except (OpenAIError, wire.RequestFailed) as exc:
                failure = exc if isinstance(exc, OpenAIError) else from_failure(exc)
                yield "data: " + json.dumps(failure.body()) + "\n\n"
                return
            except Exception as exc:  # reported to the client, logged here
                log.exception("chat completion turn failed")
                yield "data: " + json.dumps(OpenAIError(500, f"internal server error: {exc}", "server_error").body()) + "\n\n"
                return
            if not result.ok:
                yield "data: " + json.dumps(OpenAIError(500, f"the turn failed: {result.error}", "server_error",
                                                        "turn_failed").body()) + "\n\n"
                return
            if as_json:
                yield chunk({"content": result.reply.json_text()})
            info = result.session | ({"events": result.reply.other} if want_events else {})
            yield chunk({}, "stop", chatrun=info)
            if include_usage:
                payload: dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                           "model": model, "system_fingerprint": None, "choices": [], "usage": result.usage}
                yield "data: " + json.dumps(payload) + "\n\n"
            yield "data: [DONE]\n\n"

        return _sse(frames())

    async def responses(request: Request) -> Any:
        """OpenAI Responses: one turn; previous_response_id and conversation name the session."""
        who = principal(request)
        body = await read_body(request, openai_schema.RESPONSES)
        model = body.get("model")
        bot, route = bot_and_route(model)
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        earlier, text = conversation_of(items, "input")
        check_length(text)
        previous_id = body.get("previous_response_id")
        previous = None
        if previous_id is not None:
            previous = await index.response(str(previous_id), who)
            if previous is None:
                raise OpenAIError(404, f"no response {previous_id!r} (previous_response_id) for this caller",
                                  code="previous_response_not_found")
            if previous.get("bot") != bot:
                raise OpenAIError(400, f"response {previous_id!r} was made by model {previous.get('bot')!r}, "
                                  f"not {bot!r}", code="model_mismatch")
            earlier = []  # the response's session already holds what came before
        conversation = body.get("conversation")
        if isinstance(conversation, dict):
            conversation = conversation.get("id")
        if conversation is not None and not isinstance(conversation, str):
            raise OpenAIError(400, "conversation must be an id (a string or {\"id\": ...})", code="invalid_conversation")
        explicit = conversation or request.headers.get(SESSION_HEADER)
        ident = Identity(bot, earlier, explicit, namespace(request, body), previous, route)
        response_id = "resp_" + secrets.token_hex(16)
        message_id = "msg_" + secrets.token_hex(16)
        created = time.time()
        want_events = isinstance(body.get("chatrun"), dict) and bool(body["chatrun"].get("events"))

        def keys_after(reply: Reply) -> list[str]:
            after = earlier + [("user", text), ("assistant", reply.text.strip())]
            who_name = who.name if who else None
            keys = [index.response_key(response_id)]
            if previous is None:
                keys.append(index.prefix_key(bot, who_name, ident.namespace, after))
            return keys

        def start(emit: Emit) -> Any:
            return run_turn(index, ident, who, text, [t for _, t in earlier] + [text], emit, keys_after)

        def response_object(status: str, result: TurnResult | None, text_out: str | None) -> dict[str, Any]:
            output = [] if text_out is None else [_output_message(message_id, text_out, "completed")]
            obj: dict[str, Any] = {
                "id": response_id, "object": "response", "created_at": created, "model": model,
                "status": status, "output": output, "parallel_tool_calls": False, "tool_choice": "auto",
                "tools": [], "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
                "previous_response_id": previous_id, "text": {"format": {"type": "text"}}, "usage": None,
            }
            if conversation:
                obj["conversation"] = {"id": conversation}
            if result is not None:
                u = result.usage
                obj["usage"] = {"input_tokens": u.get("prompt_tokens", 0), "output_tokens": u.get("completion_tokens", 0),
                                "total_tokens": u.get("total_tokens", 0),
                                "input_tokens_details": {"cached_tokens": (u.get("prompt_tokens_details") or {}).get(
                                    "cached_tokens", 0), "cache_write_tokens": 0},
                                "output_tokens_details": {"reasoning_tokens": (u.get("completion_tokens_details") or {}).get(
                                    "reasoning_tokens", 0)}}
                obj["chatrun"] = result.session | ({"events": result.reply.other} if want_events else {})
            return obj

        if not body.get("stream"):
            result = await start(lambda _e: None)
            if not result.ok:
                raise OpenAIError(500, f"the turn failed: {result.error}", "server_error", "turn_failed")
            return JSONResponse(response_object("completed", result, result.reply.text),
                                headers={"X-Chatrun-Session": result.session["session"]})

        queue, task = _turn_in_background(start)
        await _opened(queue, task)

        async def frames() -> AsyncIterator[str]:
            sequence = 0

            def event(kind: str, **data: Any) -> str:
                nonlocal sequence
                sequence += 1
                payload = {"type": kind, "sequence_number": sequence - 1, **data}
                return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

            yield event("response.created", response=response_object("in_progress", None, None))
            yield event("response.in_progress", response=response_object("in_progress", None, None))
            where = {"item_id": message_id, "output_index": 0, "content_index": 0}
            yield event("response.output_item.added", output_index=0,
                        item=_output_message(message_id, None, "in_progress"))
            yield event("response.content_part.added", part={"type": "output_text", "text": "", "annotations": []},
                        **where)
            view = Reply()
            async for item in _events(queue, options.keepalive):
                if item is _KEEPALIVE:
                    yield ": keep-alive\n\n"
                    continue
                delta = view.feed(item)
                if delta:
                    yield event("response.output_text.delta", delta=delta, logprobs=[], **where)
            try:
                result: TurnResult = task.result()
                failure = None if result.ok else f"the turn failed: {result.error}"
            except (OpenAIError, wire.RequestFailed) as exc:
                failure = exc.message
            except Exception as exc:  # reported to the client, logged here
                log.exception("responses turn failed")
                failure = f"internal server error: {exc}"
            if failure is not None:
                failed = response_object("failed", None, None) | {"error": {"code": "server_error", "message": failure}}
                yield event("response.failed", response=failed)
                return
            final = result.reply.text
            part = {"type": "output_text", "text": final, "annotations": []}
            yield event("response.output_text.done", text=final, logprobs=[], **where)
            yield event("response.content_part.done", part=part, **where)
            yield event("response.output_item.done", output_index=0, item=_output_message(message_id, final, "completed"))
            yield event("response.completed", response=response_object("completed", result, final))

        return _sse(frames())

    router.add_api_route("/models", handled(models), methods=["GET"], responses=openai_schema.ERROR_RESPONSES)
    for path, handler, schema in (("/chat/completions", chat_completions, openai_schema.CHAT_COMPLETIONS),
                                  ("/responses", responses, openai_schema.RESPONSES)):
        router.add_api_route(path, handled(handler), methods=["POST"], responses=openai_schema.ERROR_RESPONSES,
                             openapi_extra=openai_schema.request_body(schema))

    async def unsupported(request: Request) -> Any:
        raise OpenAIError(404, f"{request.method} {request.url.path} is not part of chatrun's OpenAI API "
                          "(see docs/openai-api.md)", code="unknown_url")

    router.add_api_route("/{path:path}", handled(unsupported), methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                         include_in_schema=False)
    return router


def model_ids(registry: SessionRegistry) -> list[str]:
    ids = []
    for name, bot in registry.bots.items():
        ids.append(name)
        ids.extend(f"{name}/{route}" for route in bot.config.routes)
    return ids


def _output_message(message_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": message_id, "role": "assistant", "status": status, "content": content}


def _sse(frames: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(frames, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
