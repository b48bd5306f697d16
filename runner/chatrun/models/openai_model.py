"""The `openai` provider: any OpenAI-compatible Chat Completions server.

Where requests go and with which key, first found wins:

- base URL: `OpenAIModel(base_url=...)`, the route's `model.base_url`, `OPENAI_BASE_URL`,
  else the OpenAI API;
- API key: `OpenAIModel(api_key=...)`, the variable named by `model.api_key_env`,
  `OPENAI_API_KEY`; with none but a base URL, a placeholder key (local servers such as
  vLLM, Ollama or llama.cpp need none).

Retries are ours (the client's own are off) so they are explicit and testable: on 408,
409, 429, 5xx, timeouts and connection errors, up to `model.max_retries` times, waiting
`backoff_base * 2**n` seconds with jitter, or what the server's Retry-After says
(capped). A streamed answer is only retried before its first chunk reached the user.

Structured output: a server that refuses a route's `response_format` (HTTP 400 naming it) is
asked again with the next weaker one — json_schema, then json_object (the schema goes into the
system prompt), then none — and the weaker one is used for that server and model from then on.
The route's answer is checked against its schema either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import importlib
import inspect
import json
import logging
import os
import random
import ssl
import sys
import threading
import time
import types
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

import openai

from chatrun.definition.config import ModelConfig
from chatrun.errors import ModelError, ModelUnavailable
from chatrun.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    UserMessage,
    accepted_kinds,
)
from chatrun.models.base import (
    ChunkCallback,
    ModelRequest,
    ModelResponse,
    ModerationResult,
    begin_again,
)
from chatrun.models.fallback import RETRY_STATUS, unavailable_reason

DEFAULT_BASE_URL = "https://api.openai.com/v1"
PLACEHOLDER_KEY = "not-needed"  # local OpenAI-compatible servers ignore the key, the client wants one
OWN_FIELDS = {"messages", "stream"}  # what the engine decides; params cannot change them

CREATE_PARAMS = set(inspect.signature(openai.resources.chat.AsyncCompletions.create).parameters) - {"self"}
# What a server that cannot do a response_format is asked instead ("none": no response_format).
WEAKER_FORMAT = {"json_schema": "json_object", "json_object": "none"}
FORMAT_WORDS = ("response_format", "response format", "json_schema", "json_object", "structured output")

log = logging.getLogger("chatrun.models")


_ssl_lock = threading.Lock()
# (SSL_CERT_FILE, SSL_CERT_DIR) -> the verifying context built for them.
_ssl_contexts: dict[tuple[str | None, str | None], ssl.SSLContext | bool] = {}


def shared_ssl_context() -> ssl.SSLContext | bool:
    """The HTTP client library's default verifying SSL context, built once per process.

    Loading the CA bundle is most of what a new HTTP client costs (measured: 1.21 s of
    1.72 s of CPU over ten first turns of new library sessions). An SSLContext may be shared
    across threads and event loops; the clients built on it may not, so each loop still gets
    its own client. Keyed by the variables the default context reads, so changing them
    between sessions still takes effect. True (the library builds its own) when the library
    offers no way to build its default context.
    """
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    context = _ssl_contexts.get(key)
    if context is None:
        with _ssl_lock:
            context = _ssl_contexts.get(key)
            if context is None:
                context = _ssl_contexts[key] = _default_ssl_context()
    return context


def _default_ssl_context() -> ssl.SSLContext | bool:
    """What `verify=True` gives, from the library `openai` builds its clients on (httpx or a
    successor): so the shared context verifies exactly as a client of its own would."""
    for cls in openai.DefaultAsyncHttpxClient.__mro__:
        library = sys.modules.get(cls.__module__.split(".")[0])
        create = getattr(library, "create_ssl_context", None)
        if cls.__name__ == "AsyncClient" and callable(create):
            context = create()
            return context if isinstance(context, ssl.SSLContext) else True
    return True


class Refused(ModelError):
    """The server refused the request itself (a 4xx other than 408/409/429): asking again as
    it is would fail again."""

    def __init__(self, reason: str, status: int, message: str):
        super().__init__(reason)
        self.status = status
        self.message = message


class Retryable(Exception):
    """One failed attempt that may succeed when tried again."""

    def __init__(self, reason: str, detail: str = "", retry_after: float | None = None, kind: str = "outage"):
        super().__init__(reason)
        self.reason = reason  # "HTTP 500", "timed out after 60 s"
        self.detail = detail  # what the server or the network said
        self.retry_after = retry_after
        self.kind = kind  # ModelUnavailable.reason: quota, overload, timeout, outage


@dataclass
class ToolCallParts:
    """A tool call being assembled from stream deltas."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIModel:
    """ChatModel over the `openai` package's AsyncOpenAI, Chat Completions API.

    `base_url` and `api_key` override the model config and environment; `client` is used
    as is for every request (its own base URL, key and retry settings apply). `backoff_base`,
    `backoff_max` and `retry_after_cap` (seconds) shape the waits between retries.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None,
                 client: openai.AsyncOpenAI | None = None, *, backoff_base: float = 0.5,
                 backoff_max: float = 8.0, retry_after_cap: float = 30.0):
        self.base_url = base_url
        self.api_key = api_key
        self.client = client
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_after_cap = retry_after_cap
        # An httpx client belongs to the event loop that created it: one client per
        # (loop, base URL, key), dropped with its loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], openai.AsyncOpenAI]] = (
            weakref.WeakKeyDictionary()
        )
        # (base URL, model name) -> the strongest response_format that server took: learnt from refusals.
        self._formats: dict[tuple[str, str], str] = {}

    # -- configuration -----------------------------------------------------------------------------

    def endpoint(self, config: ModelConfig) -> tuple[str, str]:
        """(base URL, API key) for a request, or ModelError saying how to configure one."""
        base_url = self.base_url or config.base_url or os.environ.get("OPENAI_BASE_URL") or None
        key_env = config.api_key_env or "OPENAI_API_KEY"
        api_key = self.api_key or os.environ.get(key_env) or None
        if api_key is None:
            if base_url is None:
                raise ModelError(
                    f"no credentials for model {config.name}: set {key_env} to an API key, or point "
                    "OPENAI_BASE_URL (or model.base_url in the bot) at an OpenAI-compatible server "
                    "such as vLLM, Ollama or llama.cpp"
                )
            api_key = PLACEHOLDER_KEY
        return (base_url or DEFAULT_BASE_URL).rstrip("/"), api_key

    def client_for(self, base_url: str, api_key: str) -> openai.AsyncOpenAI:
        if self.client is not None:
            return self.client
        loop = asyncio.get_running_loop()
        clients = self._clients.setdefault(loop, {})
        client = clients.get((base_url, api_key))
        if client is None:
            # DefaultAsyncHttpxClient, not the client's own wrapper: that one schedules its
            # closing on whatever loop runs when it is garbage collected, which fails noisily
            # once the loop it belongs to has closed (each sync session.chat may use a new loop).
            http_client = openai.DefaultAsyncHttpxClient(verify=shared_ssl_context())
            client = clients[(base_url, api_key)] = openai.AsyncOpenAI(
                api_key=api_key, base_url=base_url, max_retries=0, http_client=http_client
            )
        return client

    async def moderate(self, config: ModelConfig, model: str, text: str) -> ModerationResult:
        """`text` as the `/moderations` endpoint of `config`'s endpoint (its base URL and key) sees
        it (a `moderation` guardrail); ModelError when it cannot say."""
        client = self.client_for(*self.endpoint(config))
        try:
            answer = await client.moderations.create(model=model, input=text)
        except openai.APIStatusError as exc:
            raise ModelError(f"the moderation endpoint answered HTTP {exc.status_code}: {exc.message}") from None
        except openai.APIError as exc:
            raise ModelError(f"the moderation endpoint: {exc}") from None
        if not answer.results:
            raise ModelError(f"the moderation endpoint answered without results: {preview(answer)}")
        result = answer.results[0]
        categories = result.categories.model_dump(by_alias=True) if result.categories is not None else {}
        scores = result.category_scores.model_dump(by_alias=True) if result.category_scores is not None else {}
        return ModerationResult({k: bool(v) for k, v in categories.items() if v is not None},
                                {k: float(v) for k, v in scores.items() if isinstance(v, int | float)})

    async def aclose(self) -> None:
        """Close the HTTP clients made on the running event loop."""
        clients = self._clients.pop(asyncio.get_running_loop(), {})
        for client in clients.values():
            await client.close()

    @staticmethod
    def request_args(request: ModelRequest, stream: bool, send_cache_key: bool = True) -> dict[str, Any]:
        """Keyword arguments of `chat.completions.create` for a request (its `cache_key` left out
        when not `send_cache_key`)."""
        config = request.config
        # The client re-walks every message and tool against its TypedDicts before sending
        # (measured: ~6 ms of CPU for 20 messages and 7 tools, more than the rest of a turn).
        # Ours are plain JSON already, so they travel in `extra_body`, which the client merges
        # into the request body as it is; `messages` itself only satisfies the signature.
        accepts = accepted_kinds(config.accepts)  # what the endpoint takes as parts; the rest is described
        body: dict[str, Any] = {"messages": wire_messages(request.messages, request.blobs, accepts)}
        if request.tools:
            body["tools"] = request.tools
        args: dict[str, Any] = {"model": config.name, "messages": [], "extra_body": body}
        if request.tools and request.tool_choice is not None:  # endpoints refuse a tool_choice without tools
            args["tool_choice"] = openai_tool_choice(request.tool_choice)
        if config.temperature is not None:
            args["temperature"] = config.temperature
        if config.max_tokens is not None:
            args["max_tokens"] = config.max_tokens
        if stream:
            args["stream"] = True
            args["stream_options"] = {"include_usage": True}
        if request.response_format is not None:
            args["response_format"] = request.response_format
        if request.cache_key is not None and send_cache_key:  # `params: {prompt_cache_key: ...}` below still wins
            args["prompt_cache_key"] = request.cache_key
        extra: dict[str, Any] = {}
        for key, value in config.params.items():
            if key in OWN_FIELDS:
                continue
            if value is None:  # `params: {stream_options: null}` drops a field a server rejects
                args.pop(key, None)
            # Fields the client does not know (top_k, min_p, ...) still reach the server.
            elif key in CREATE_PARAMS:
                args[key] = value
            else:
                extra[key] = value
        body.update(extra)
        return args

    # -- the call ------------------------------------------------------------------------------------

    async def complete(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> ModelResponse:
        config = request.config
        base_url, api_key = self.endpoint(config)
        where = f"model {config.name} at {base_url}"
        client = self.client_for(base_url, api_key)
        # Whether the key goes with the request: a flag, not a copy of the request without it
        # (dataclasses.replace of a ModelRequest: ~35,000 instructions a turn; issue 39).
        send_key = request.cache_key is not None and sends_cache_key(config, base_url)
        known = (base_url, config.name)
        asked = format_kind(request.response_format)
        while True:
            taken = self._formats.get(known, asked) if asked is not None else None
            sent = with_format(request, taken) if taken is not None and taken != asked else request
            try:
                return await self.attempts(client, sent, on_chunk, where, send_key)
            except Refused as exc:
                weaker = WEAKER_FORMAT.get(taken or "")
                if weaker is None or exc.status != 400 or not any(w in exc.message.lower() for w in FORMAT_WORDS):
                    raise ModelError(f"{where}: {exc}") from None
                self._formats[known] = weaker
                log.warning("%s refused response_format %s (%s); asking with %s from now on",
                            where, taken, exc.message, weaker)

    async def attempts(self, client: openai.AsyncOpenAI, request: ModelRequest, on_chunk: ChunkCallback | None,
                       where: str, send_cache_key: bool = True) -> ModelResponse:
        """The request, retried as `model.max_retries` allows. Raises Refused as it is."""
        config = request.config
        stream = bool(config.stream and on_chunk is not None)
        args = self.request_args(request, stream, send_cache_key)
        retries = max(0, int(config.max_retries))
        for attempt in range(retries + 1):
            sent = [False]  # whether a chunk reached the user: then a retry would repeat it
            try:
                if stream:
                    assert on_chunk is not None
                    return await self.stream_once(client, args, config.timeout, on_chunk, sent)
                return await self.complete_once(client, args, config.timeout)
            except Retryable as failure:
                if attempt == retries or sent[0]:
                    if sent[0]:
                        done = "(not retried: part of the answer was already shown)"
                    elif attempt:
                        done = f"after {plural(attempt, 'retry', 'retries')}"
                    else:
                        done = "(not retried: model.max_retries is 0)"
                    detail = f": {failure.detail}" if failure.detail else ""
                    message = f"{where}: {failure.reason} {done}{detail}"
                    if sent[0]:  # part of the answer was shown: no other model may start it again
                        raise ModelError(message) from None
                    raise ModelUnavailable(message, failure.kind) from None
                await asyncio.sleep(self.wait_before_retry(attempt, failure.retry_after))
                begin_again(on_chunk)  # nothing of the failed answer was shown: a hold drops what it kept
            except Refused:
                raise
            except ModelError as exc:
                raise ModelError(f"{where}: {exc}") from None
        raise AssertionError("unreachable")

    def wait_before_retry(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.retry_after_cap)
        ceiling = min(self.backoff_max, self.backoff_base * 2**attempt)
        return ceiling * (0.5 + random.random() / 2)  # jitter: clients retrying together spread out

    async def complete_once(self, client: openai.AsyncOpenAI, args: dict[str, Any],
                            timeout: float) -> ModelResponse:
        with translate_errors(timeout):
            completion = await create_completion(client, args, request_timeout(timeout))
        choices = getattr(completion, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise ModelError(f"the server answered without choices: {preview(completion)}")
        message = getattr(choices[0], "message", None)
        if message is None:
            raise ModelError(f"the server answered a choice without a message: {preview(completion)}")
        calls = []
        for i, call in enumerate(getattr(message, "tool_calls", None) or []):
            function = getattr(call, "function", None)
            if function is None:
                continue  # not a function call (custom tools are never offered)
            name, arguments = function.name or "", function.arguments or ""
            name = whole_text("a tool call's name", name, completion)
            arguments = whole_text("a tool call's arguments", arguments, completion)
            calls.append(ToolCall(call.id or f"call_{i}", name, arguments))
        content = whole_text("the message content", message.content or "", completion)
        refusal = getattr(message, "refusal", None)
        if refusal and not content.strip():  # the model declined: its refusal is its answer (content null)
            content = whole_text("the message refusal", refusal, completion)
        return ModelResponse(text=content or None, tool_calls=calls, usage=usage_of(completion),
                             finish_reason=getattr(choices[0], "finish_reason", None))

    async def stream_once(self, client: openai.AsyncOpenAI, args: dict[str, Any], timeout: float,
                          on_chunk: ChunkCallback, sent: list[bool]) -> ModelResponse:
        text: list[str] = []
        calls: dict[int, ToolCallParts] = {}
        usage: dict[str, int] = {}
        got_choice = False
        finish_reason = None
        held = ""  # a high surrogate ending a chunk: its pair starts the next one
        with translate_errors(timeout):
            stream = await create_completion(client, args, request_timeout(timeout))
        chunks = aiter(stream)
        try:
            while True:
                # Only the stream's own failures are translated: on_chunk's exceptions are the caller's.
                with translate_errors(timeout, streaming=True):
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                usage = usage_of(chunk) or usage
                for choice in getattr(chunk, "choices", None) or []:
                    if getattr(choice, "index", 0) not in (0, None):
                        continue
                    got_choice = True
                    finish_reason = getattr(choice, "finish_reason", None) or finish_reason
                    delta = choice.delta
                    if delta is None:
                        continue
                    # A refusal (the model declined, `content` null) streams in `delta.refusal`: it is the answer.
                    piece = delta.content or getattr(delta, "refusal", None)
                    if piece:
                        check_text("streamed content", piece, chunk)
                        content, held = split_high_surrogate(held + piece)
                        content = whole_text("streamed content", content, chunk)
                        if content:
                            text.append(content)
                            sent[0] = (await on_chunk(content)) is not False or sent[0]  # ChunkCallback: False, held back
                    for part in delta.tool_calls or []:
                        add_delta(calls, part)
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
        if not got_choice:
            raise ModelError("the server's stream ended without any answer (is it an OpenAI-compatible server?)")
        if held:
            whole_text("streamed content", held, "the stream's last chunk")
        tool_calls = [
            ToolCall(parts.id or f"call_{index}", whole_text("a streamed tool call's name", parts.name, parts.name),
                     whole_text("streamed tool call arguments", "".join(parts.arguments), parts.id))
            for index, parts in sorted(calls.items())
        ]
        return ModelResponse(text="".join(text) or None, tool_calls=tool_calls, usage=usage,
                             finish_reason=finish_reason)


# The fields request_args sets, in the order `chat.completions.create` writes them into its body
# (its dict of every parameter, those not given then dropped). tests/test_openai_model.py holds
# create_completion to what create itself sends.
_CREATE_ORDER = ("model", "stream", "messages", "max_tokens", "prompt_cache_key", "response_format",
                 "stream_options", "temperature", "tool_choice")
_SENT_AS_IS = frozenset(_CREATE_ORDER) | {"extra_body"}
_CHUNKS = openai.AsyncStream[openai.types.chat.ChatCompletionChunk]


def _posting(base_client: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(create as openai defines it, the helper it builds its request options with, the options'
    `security` where that helper takes it); create None: always call create. The helper is one of
    the client's own modules, not its public API: an `openai` without it (a later release that
    moved it) makes every call go through create. A create wrapped or replaced before chatrun was
    imported (an OpenTelemetry instrumentation of the client, a test's patch) is called as it is,
    so that what it adds still happens."""
    options = getattr(base_client, "make_request_options", None)
    create = vars(openai.resources.chat.AsyncCompletions).get("create")
    if type(create) is not types.FunctionType or not callable(options):
        return None, None, {}
    # create asks for the API key's bearer header through its options where the client has that option.
    security = {"security": {"bearer_auth": True}} if "security" in inspect.signature(options).parameters else {}
    return create, options, security


_CREATE, _OPTIONS, _SECURITY = _posting(importlib.import_module("openai._base_client"))


async def create_completion(client: openai.AsyncOpenAI, args: dict[str, Any], timeout: openai.Timeout) -> Any:
    """`client.chat.completions.create(**args, timeout=timeout)`: the same request, answer and
    errors. For the fields request_args sets itself (plain JSON values: strings, numbers, and
    dicts of them), create's own work before the request is ~0.8 M instructions a turn
    (bench/README.md, "The HTTP turn, sixth pass"): it checks and copies every parameter against
    its typed-dict annotations, which leaves such values as they are. So those are posted as
    create posts them; any other field (a `params:` entry create knows) goes through create, and
    so does every call while create is not openai's own (instrumented, patched on the class or
    on this client)."""
    completions = client.chat.completions
    if (not _SENT_AS_IS.issuperset(args) or vars(openai.resources.chat.AsyncCompletions).get("create") is not _CREATE
            or "create" in vars(completions)):  # patched on this client alone (mock.patch.object)
        return await completions.create(**args, timeout=timeout)
    stream = args.get("stream", False)
    return await client.post(
        "/chat/completions",
        body={key: args[key] for key in _CREATE_ORDER if key in args},
        options=_OPTIONS(extra_body=args.get("extra_body"), timeout=timeout, **_SECURITY),
        cast_to=openai.types.chat.ChatCompletion,
        stream=bool(stream),
        stream_cls=_CHUNKS,
    )


@functools.lru_cache(maxsize=64)
def request_timeout(seconds: float) -> openai.Timeout:
    """`model.timeout` as the client's Timeout (the same limits a number sets), made once: given a
    number, the HTTP client checks it against a runtime-checkable protocol (`SupportsFloat`) on
    every request, ~5% of chatrun's own share of a turn (issue 39); given a Timeout, it copies it."""
    return openai.Timeout(seconds)


def wire_messages(messages: list[Message], read: Any, accepts: frozenset[str]) -> list[dict[str, Any]]:
    """`[m.to_openai_with(read, accepts) for m in messages]`, the same dicts: a message of text
    alone (most of a window, sent whole every call) is made here, without the two method calls
    of its own (issue 39: ~0.07 M instructions of a 70-message call). tests/test_models.py
    compares the two for every kind of message."""
    out: list[dict[str, Any]] = []
    add = out.append
    for m in messages:
        if type(m) is UserMessage and not m.attachments:
            add({"role": "user", "content": m.content})
        elif type(m) is AssistantMessage and not m.tool_calls:
            add({"role": "assistant", "content": m.content})
        elif type(m) is SystemMessage:
            add({"role": "system", "content": m.content})
        else:
            add(m.to_openai_with(read, accepts))
    return out


def add_delta(calls: dict[int, ToolCallParts], part: Any) -> None:
    """Fold one streamed tool call delta into the calls being assembled, keyed by index."""
    index = part.index
    if index is None:  # some servers omit it: a new id starts a new call
        last = max(calls) if calls else -1
        index = last + 1 if (part.id and (last < 0 or calls[last].id != part.id)) else max(last, 0)
    parts = calls.setdefault(index, ToolCallParts())
    if part.id:
        parts.id = part.id
    function = part.function
    if function is not None:
        check_text("a streamed tool call's name", function.name or "", part)
        check_text("streamed tool call arguments", function.arguments or "", part)
        if function.name and function.name != parts.name:
            parts.name = function.name if not parts.name else parts.name + function.name
        if function.arguments:
            parts.arguments.append(function.arguments)


def openai_tool_choice(choice: str) -> str | dict[str, Any]:
    """A route's `tool_choice` as OpenAI's field: the word, or a function to call by name."""
    if choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def format_kind(response_format: dict[str, Any] | None) -> str | None:
    return None if response_format is None else str(response_format.get("type"))


def sends_cache_key(config: ModelConfig, base_url: str) -> bool:
    """Whether a request to `base_url` carries its prompt-cache key (`model.prompt_cache`): as
    said, else only to OpenAI's own API (other endpoints may refuse a field they do not know)."""
    if config.prompt_cache is not None:
        return bool(config.prompt_cache)
    return base_url.rstrip("/") == DEFAULT_BASE_URL


def with_format(request: ModelRequest, kind: str) -> ModelRequest:
    """The request with a weaker response_format `kind` ("none": without one). The schema it
    loses goes into the system prompt, so the model still knows what to answer."""
    schema = ((request.response_format or {}).get("json_schema") or {}).get("schema")
    messages = list(request.messages)
    if schema is not None:
        # json_object also needs the word JSON in the messages (OpenAI refuses it otherwise).
        note = ("Answer with only a JSON value, no other text, matching this JSON Schema:\n"
                + json.dumps(schema, ensure_ascii=False))
        if messages and isinstance(messages[0], SystemMessage):
            messages[0] = SystemMessage(f"{messages[0].content}\n\n{note}")
        else:
            messages.insert(0, SystemMessage(note))
    response_format = None if kind == "none" else {"type": kind}
    return replace(request, messages=messages, response_format=response_format)


class translate_errors:  # lower case: it reads as a `with` clause
    """Turn the client's exceptions into Retryable (worth another try) or ModelError."""

    def __init__(self, timeout: float, streaming: bool = False):
        self.timeout = timeout
        self.streaming = streaming

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, (ModelError, Retryable, asyncio.CancelledError)):
            return  # nothing to translate: the exception (if any) goes on as it is
        if isinstance(exc, openai.APITimeoutError) or (is_transport_error(exc) and "Timeout" in type(exc).__name__):
            raise Retryable(f"timed out after {self.timeout:g} s (model.timeout)", kind="timeout") from None
        if isinstance(exc, openai.APIConnectionError) or is_transport_error(exc):
            cause = exc.__cause__ or exc if isinstance(exc, openai.APIConnectionError) else exc
            what = "connection lost while streaming" if self.streaming else "cannot connect"
            raise Retryable(what, f"{type(cause).__name__}: {cause}") from None
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            message = server_message(exc)
            if status in RETRY_STATUS or status >= 500:
                raise Retryable(f"HTTP {status}", message, retry_after(exc.response.headers),
                                unavailable_reason(status)) from None
            reason = f"HTTP {status}: {message}"
            if status in (401, 403):
                reason += " (check the API key: OPENAI_API_KEY or the variable named by model.api_key_env)"
            elif status == 404:
                reason += " (check model.name and the base URL, which usually ends in /v1)"
            raise Refused(reason, status, message) from None
        if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError, openai.APIResponseValidationError)):
            raise ModelError(f"the server's answer is not valid Chat Completions JSON ({exc})") from None
        if isinstance(exc, openai.OpenAIError):  # e.g. an error event inside a stream
            raise ModelError(f"{type(exc).__name__}: {exc}") from None
        return  # not the client's: goes on as it is


def is_transport_error(exc: BaseException) -> bool:
    """A network failure of the HTTP library under the client (whatever its name and version)."""
    if isinstance(exc, OSError):
        return True
    return any(c.__module__.startswith(("httpx", "httpcore")) for c in type(exc).__mro__)


def server_message(exc: openai.APIStatusError) -> str:
    """The error text the server sent, without the client's decoration."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    try:
        text = exc.response.text.strip()
    except Exception:  # a streamed body may be unreadable; the status still says enough
        text = ""
    return text[:500] or exc.message


def retry_after(headers: Any) -> float | None:
    """Seconds the server asks us to wait: retry-after-ms, or Retry-After in seconds or as an HTTP date."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return float(millis) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def usage_of(obj: Any) -> dict[str, int]:
    """The usage an answer reports, in chatrun's names (input/output/cached_input/reasoning tokens)."""
    usage = getattr(obj, "usage", None)
    if usage is None:
        return {}
    out = {}
    for key, name in (("prompt_tokens", "input_tokens"), ("completion_tokens", "output_tokens")):
        value = getattr(usage, key, None)
        if isinstance(value, int):
            out[name] = value
    for details, key, name in (("prompt_tokens_details", "cached_tokens", "cached_input_tokens"),
                               ("completion_tokens_details", "reasoning_tokens", "reasoning_tokens")):
        value = getattr(getattr(usage, details, None), key, None)
        if isinstance(value, int):
            out[name] = value
    return out


def check_text(what: str, value: Any, answer: Any) -> None:
    """The client does not type-check what a server sends: a number where text belongs is garbage."""
    if not isinstance(value, str):
        raise ModelError(f"the server's answer is not valid Chat Completions: {what} is a "
                         f"{type(value).__name__}, not text: {preview(answer)}")


def whole_text(what: str, value: Any, answer: Any) -> str:
    """Text from the server, safe to send on: surrogate pairs a server escaped as two code points
    (`"\\ud83d\\ude00"` split or kept apart) are joined; a lone surrogate, which no UTF-8 socket,
    file or database can carry, is a ModelError (the turn fails and is rolled back)."""
    check_text(what, value, answer)
    try:
        value.encode()
        return value
    except UnicodeEncodeError:
        pass
    try:
        return value.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        raise ModelError(f"the server's answer is not valid text: {what} holds a lone UTF-16 surrogate: "
                         f"{preview(answer)}") from None


def split_high_surrogate(text: str) -> tuple[str, str]:
    """(text, "") or, when text ends with the first half of a surrogate pair, (the rest, that half)."""
    if text and "\ud800" <= text[-1] <= "\udbff":
        return text[:-1], text[-1]
    return text, ""


def preview(obj: Any) -> str:
    try:
        text = json.dumps(obj.model_dump(exclude_unset=True, warnings=False))
    except Exception:  # only for the message
        text = repr(obj)
    return text if len(text) <= 300 else text[:300] + "..."


def plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def has_credentials(config: ModelConfig) -> bool:
    """Whether a request with this config would find an endpoint (the rules of `endpoint`)."""
    return credentials_problem(config) is None


def credentials_problem(config: ModelConfig) -> str | None:
    """Why a request with this config would find no endpoint (the rules of `endpoint`), or None."""
    try:
        OpenAIModel().endpoint(config)
    except ModelError as exc:
        return str(exc)
    return None
