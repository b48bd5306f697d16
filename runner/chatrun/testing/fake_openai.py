"""A local HTTP server speaking the OpenAI Chat Completions API, for tests and benchmarks.

It is a real server on a real socket, so the real `openai` client (and browsers, curl,
benchmarks) talk to it exactly as they would to a provider. Answers are scripted:

    with FakeOpenAI() as fake:                       # port 0: a free port
        fake.queue({"text": "Hello"}, {"tool_calls": [{"name": "book", "arguments": {}}]})
        ...  # point OPENAI_BASE_URL at fake.base_url
        fake.requests                                # the JSON bodies received, in order

Response forms (dicts), consumed one per chat completion request:

    {"text": "..."}                                  a plain answer
    {"tool_calls": [{"name": N, "arguments": {...} | "raw text", "id": optional}]}
    {"text": ..., "tool_calls": [...]}               both
    {"chunks": ["Hel", "lo"]}                        the text, streamed in exactly these chunks
    {"status": 429, "retry_after": 0.2, "body": optional dict | str}   an HTTP error
    {"raw": "garbage"}                               a 200 answer whose body is not JSON
    {"delay": 0.5, ...}                              wait before answering (with any of the above)
    {"chunk_delay": 0.01, ...}                       wait between streamed chunks
    {"finish_reason": "length", "usage": {...}}      override those fields ("usage": None: report none)
    {"refusal": "I can't help with that."}           the model declines: `content` null, `refusal` the text
                                                     (streamed: in `delta.refusal` pieces)
    {"disconnect": True, ...}                        drop the connection: before any answer, or
                                                     for a stream after its chunks, before the end
    {"stall": True, ...}                             a stream that sends its chunks, then nothing more
                                                     until the client goes (a model a user stops)
    {"unruly": "repeat_call", "call": {...}, "times": 6, ...}
                                                     an answer that misbehaves, made from the request's
                                                     tools and messages (chatrun.testing.unruly)

`FakeOpenAI(prompt_cache=True)` plays a provider's prompt cache: each answer's usage reports
`prompt_tokens_details.cached_tokens`, the (estimated) tokens of the longest run of leading
messages it had already been sent, whole and byte for byte, under the same model and
`prompt_cache_key` (OpenAI caches prefixes, in 128-token blocks from 1024 tokens on; the fake
keeps no minimum, so short test prompts show hits too).

When the queue is empty, `responder(body)` (if set) makes the answer, e.g. `echo`;
with neither, the fake answers HTTP 500 saying it has no response queued.

One model name can answer on its own (a primary model failing while its fallback answers):

    fake.queue_for("gpt-4o-mini", {"status": 429})  # the next request for that model, before the queue
    fake.fail_model("gpt-4o-mini", {"disconnect": True})  # every request for it, until fail_model(name, None)

`POST /v1/embeddings` answers too (unless `FakeOpenAI(embeddings=False)`: then 404, as an
endpoint without embeddings), with deterministic unit vectors: a hashed bag of the text's
words (`embedding_dimensions` buckets, 64 unless set), so texts sharing words are near. A test makes meaning
that words do not show:

    fake.synonym("reimbursement", "refund")          # the word embeds as the other one
    fake.synonym("the", "")                          # ... or as nothing (a word without meaning)
    fake.embedding_for("exact text", [0.1, ...])     # this input gets this vector
    fake.embedding_requests                          # the /embeddings bodies received

`POST /v1/moderations` answers as OpenAI's does (`results[0]`: `flagged`, `categories`,
`category_scores` over the omni-moderation categories), scripted by words:

    fake.flag_word("idiot", "harassment", 0.93)      # an input holding the word scores 0.93 there
                                                     # (flagged from 0.5 on, as the endpoint's default)
    fake.moderation_fails({"status": 503})           # every /moderations request fails so ...
    fake.moderation_fails({"delay": 2.0})            # ... or answers late; None: as usual again
    fake.moderation_requests                         # the /moderations bodies received

The server is asyncio with a minimal HTTP/1.1 implementation (keep-alive, chunked
transfer for streams) running in a background thread, so it starts in milliseconds,
needs no web framework and holds thousands of concurrent streaming connections.

Standalone, for manual play and benchmarks:

    python -m chatrun.testing.fake_openai --port 8901 --echo --delay 0.05
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import inspect
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from chatrun.testing import unruly

Response = dict[str, Any]
Responder = Callable[[dict[str, Any]], Any]

RESPONSE_KEYS = {
    "text", "tool_calls", "chunks", "status", "retry_after", "body", "raw",
    "delay", "chunk_delay", "finish_reason", "usage", "disconnect", "stall", "refusal",
}
# The categories of OpenAI's omni-moderation (the fake's /moderations scores each).
MODERATION_CATEGORIES = (
    "harassment", "harassment/threatening", "hate", "hate/threatening", "illicit", "illicit/violent",
    "self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "sexual/minors", "violence",
    "violence/graphic")
MODELS = ["gpt-4o-mini", "gpt-4o", "fake-model", "text-embedding-3-small"]
EMBEDDING_DIMENSIONS = 64
MAX_HEADER_LINES = 200


@dataclass
class Received:
    """One HTTP request the fake received. `at` is time.monotonic() on arrival;
    `peer` the client's (host, port), so tests can tell reused connections apart."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    peer: tuple[str, int] | None = None
    at: float = field(default_factory=time.monotonic)


def echo(body: dict[str, Any]) -> Response:
    """A responder answering with the last user message's text."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return {"text": str(content or "")}
    return {"text": ""}


def check_response(response: Response) -> None:
    """Raise ValueError for a response form the fake does not know (typos fail early)."""
    if not isinstance(response, dict):
        raise ValueError(f"fake response must be a dict, got {type(response).__name__}")
    if "unruly" in response:
        found = unruly.problems(unruly_part(response))
        if found:
            raise ValueError(f"unruly fake response {response!r}: {found[0][1]}")
    unknown = set(response) - RESPONSE_KEYS - (set(unruly.KEYS) if "unruly" in response else set())
    if unknown:
        raise ValueError(f"unknown fake response keys {sorted(unknown)}; known: {sorted(RESPONSE_KEYS)}")
    for call in response.get("tool_calls") or []:
        if not isinstance(call, dict) or "name" not in call:
            raise ValueError(f"a fake tool call needs at least a name: {call!r}")


def unruly_part(response: Response) -> Response:
    """The keys of an unruly answer (the rest are the fake's own: delay, status, ...)."""
    return {k: v for k, v in response.items() if k in unruly.KEYS}


def made_unruly(response: Response, body: dict[str, Any]) -> Response:
    """An unruly response made into a plain one, from the request's tools and messages."""
    if "unruly" not in response:
        return response
    answer = unruly.Unruly.from_item(unruly_part(response)).answer(unruly.Offered.from_body(body))
    rest = {k: v for k, v in response.items() if k not in unruly.KEYS}
    return {**rest, "text": answer.get("text"), "tool_calls": answer.get("tool_calls") or []}


class Disconnect(Exception):
    """Raised to drop a connection without finishing the answer."""


class FakeOpenAI:
    """A scripted OpenAI-compatible server in a background thread. See the module doc."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, responder: Responder | None = None,
                 prompt_cache: bool = False, embeddings: bool = True):
        self.host = host
        self.embeddings = embeddings
        self.embedding_dimensions = EMBEDDING_DIMENSIONS  # the vectors' length (a bench may set 1536)
        self._synonyms: dict[str, str] = {}
        self._vectors: dict[str, list[float]] = {}
        self._embedding_requests: list[dict[str, Any]] = []
        self._flagged_words: dict[str, dict[str, float]] = {}  # word -> {category: score}
        self._moderation_failure: Response | None = None
        self._moderation_requests: list[dict[str, Any]] = []
        self.port = port
        self.responder = responder
        self.prompt_cache = prompt_cache
        # What the prompt cache holds: per (model, prompt_cache_key), the prompts sent, as lists
        # of each message's canonical JSON (prompt_cache=True only).
        self._prompts: dict[tuple[str, str], list[list[str]]] = {}
        self._lock = threading.Lock()
        self._queue: collections.deque[Response] = collections.deque()
        self._model_queues: dict[str, collections.deque[Response]] = {}
        self._failing: dict[str, Response] = {}
        self._log: list[Received] = []
        self._requests: list[dict[str, Any]] = []
        self._counter = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self._startup_error: BaseException | None = None

    # -- scripting and inspection (any thread) ---------------------------------------------------

    def queue(self, *responses: Response) -> FakeOpenAI:
        for response in responses:
            check_response(response)
        with self._lock:
            self._queue.extend(responses)
        return self

    def queue_for(self, model: str, *responses: Response) -> FakeOpenAI:
        """Responses for the next requests naming `model`, taken before the general queue."""
        for response in responses:
            check_response(response)
        with self._lock:
            self._model_queues.setdefault(model, collections.deque()).extend(responses)
        return self

    def fail_model(self, model: str, response: Response | None) -> FakeOpenAI:
        """Answer every request naming `model` with `response` (an HTTP error, a dropped
        connection, ...), whatever is queued; None: that model answers as usual again."""
        if response is not None:
            check_response(response)
        with self._lock:
            if response is None:
                self._failing.pop(model, None)
            else:
                self._failing[model] = response
        return self

    def synonym(self, word: str, as_word: str) -> FakeOpenAI:
        """`word` embeds as `as_word` does (a meaning the words of a text do not share)."""
        with self._lock:
            self._synonyms[word.lower()] = as_word.lower()
        return self

    def embedding_for(self, text: str, vector: list[float]) -> FakeOpenAI:
        """The input `text`, exactly, embeds as `vector`."""
        with self._lock:
            self._vectors[text] = list(vector)
        return self

    def flag_word(self, word: str, category: str, score: float = 0.9) -> FakeOpenAI:
        """An input holding `word` (any case, a whole word) scores `score` in `category` at /moderations."""
        with self._lock:
            self._flagged_words.setdefault(word.lower(), {})[category] = score
        return self

    def moderation_fails(self, response: Response | None) -> FakeOpenAI:
        """Answer every /moderations request with `response` (`{"status": 503}`, `{"delay": 2.0}`,
        `{"disconnect": True}`); None: answer as usual again."""
        with self._lock:
            self._moderation_failure = response
        return self

    @property
    def moderation_requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the /moderations requests received, in order (a copy)."""
        with self._lock:
            return list(self._moderation_requests)

    def moderation(self, text: str) -> dict[str, Any]:
        """The fake's `/moderations` result for one input: the scores of the flagged words it holds."""
        with self._lock:
            words = dict(self._flagged_words)
        scores = dict.fromkeys(MODERATION_CATEGORIES, 0.0)
        for word in re.findall(r"\w+", text.lower()):
            for category, score in words.get(word, {}).items():
                scores[category] = max(scores.get(category, 0.0), score)
        categories = {c: score >= 0.5 for c, score in scores.items()}
        return {"flagged": any(categories.values()), "categories": categories, "category_scores": scores,
                "category_applied_input_types": {c: ["text"] for c in scores}}

    @property
    def embedding_requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the /embeddings requests received, in order (a copy)."""
        with self._lock:
            return list(self._embedding_requests)

    def embed(self, text: str) -> list[float]:
        """The fake's vector of `text`: scripted, else its words (synonyms mapped) hashed into buckets."""
        with self._lock:
            if text in self._vectors:
                return list(self._vectors[text])
            synonyms = self._synonyms  # read only here (dict reads are atomic)
        size = self.embedding_dimensions
        vector = [0.0] * size
        for word in re.findall(r"\w+", text.lower()):
            word = synonyms.get(word, word)
            if not word:  # a synonym of "": a word the fake model gives no meaning
                continue
            digest = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big")
            vector[digest % size] += 1.0
        norm = sum(x * x for x in vector) ** 0.5 or 1.0
        return [x / norm for x in vector]

    @property
    def pending(self) -> int:
        """Queued responses not yet consumed."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat completion requests received, in order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def log(self) -> list[Received]:
        """Every HTTP request received, with headers and arrival time (a copy)."""
        with self._lock:
            return list(self._log)

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self._model_queues.clear()
            self._failing.clear()
            self._log.clear()
            self._requests.clear()
            self._prompts.clear()
            self._embedding_requests.clear()
            self._moderation_requests.clear()
            self._flagged_words.clear()
            self._moderation_failure = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> FakeOpenAI:
        if self._thread is not None:
            return self
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="fake-openai", daemon=True)
        self._thread.start()
        ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            self._thread = None
            raise self._startup_error
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()
        self._thread = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(ready))
        except BaseException as exc:  # handed to the starting thread
            self._startup_error = exc
            ready.set()
        finally:
            loop.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        # A large backlog: load tests open a thousand connections at once.
        server = await asyncio.start_server(self._connection, self.host, self.port, backlog=4096)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    # -- HTTP/1.1 ----------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                request = await read_request(reader)
                if request is None:
                    break
                method, path, headers, raw = request
                keep_alive = headers.get("connection", "").lower() != "close"
                await self._dispatch(method, path, headers, raw, reader, writer)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError, ValueError, Disconnect):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _dispatch(self, method: str, path: str, headers: dict[str, str], raw: bytes,
                        reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        path = path.split("?", 1)[0].rstrip("/")
        if path.startswith("/v1/"):
            path = path[3:]
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                body = raw.decode("utf-8", "replace")
        with self._lock:
            self._log.append(Received(method, path, headers, body, writer.get_extra_info("peername")))
        if method == "GET" and path == "/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in MODELS]
            await send_json(writer, 200, {"object": "list", "data": data})
        elif method == "POST" and path == "/chat/completions":
            if not isinstance(body, dict):
                await send_json(writer, 400, error_body("request body is not a JSON object", "invalid_request_error"))
                return
            with self._lock:
                self._requests.append(body)
            try:
                await self._complete(body, reader, writer)
            except (Disconnect, ConnectionError, asyncio.CancelledError):
                raise
            except Exception as exc:  # a fake bug answers 500 instead of hanging the client
                await send_json(writer, 500, error_body(f"the fake failed: {exc!r}", "fake_error"))
                raise Disconnect() from exc  # the answer may have been half sent: end the connection
        elif method == "POST" and path == "/embeddings" and self.embeddings:
            await self._embeddings(body, writer)
        elif method == "POST" and path == "/moderations":
            await self._moderations(body, writer)
        else:
            await send_json(writer, 404, error_body(f"the fake serves no {method} {path}", "not_found"))

    async def _embeddings(self, body: Any, writer: asyncio.StreamWriter) -> None:
        """`/embeddings`: one vector per input (a string or a list of strings)."""
        texts = body.get("input") if isinstance(body, dict) else None
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            await send_json(writer, 400, error_body("`input` must be a string or a list of strings", "invalid_request_error"))
            return
        with self._lock:
            self._embedding_requests.append(body)
        data = [{"object": "embedding", "index": i, "embedding": self.embed(t)} for i, t in enumerate(texts)]
        tokens = sum(len(t.split()) for t in texts)
        await send_json(writer, 200, {"object": "list", "data": data, "model": body.get("model", ""),
                                      "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def _moderations(self, body: Any, writer: asyncio.StreamWriter) -> None:
        """`/moderations`: one result per input (a string or a list of strings), or the scripted failure."""
        with self._lock:
            self._moderation_requests.append(body)
            failure = dict(self._moderation_failure) if self._moderation_failure is not None else None
        if failure is not None:
            await asyncio.sleep(failure.get("delay", 0))
            if failure.get("disconnect"):
                raise Disconnect()
            if "status" in failure:
                await send_json(writer, failure["status"], error_body("the moderation endpoint is down", "server_error"))
                return
        texts = body.get("input") if isinstance(body, dict) else None
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            await send_json(writer, 400, error_body("`input` must be a string or a list of strings", "invalid_request_error"))
            return
        await send_json(writer, 200, {"id": f"modr-{len(self._moderation_requests)}", "model": body.get("model", ""),
                                      "results": [self.moderation(t) for t in texts]})

    # -- chat completions --------------------------------------------------------------------------

    async def _next_response(self, body: dict[str, Any]) -> Response:
        model = body.get("model")
        with self._lock:
            failing = self._failing.get(model) if isinstance(model, str) else None
            if failing is not None:
                return dict(failing)
            own = self._model_queues.get(model) if isinstance(model, str) else None
            queued = own.popleft() if own else (self._queue.popleft() if self._queue else None)
        if queued is not None:
            try:
                return made_unruly(queued, body)
            except Exception as exc:  # e.g. repeat_call with nothing to repeat: an answer, not a crash
                return {"status": 500, "body": error_body(f"fake unruly answer failed: {exc}", "fake_error")}
        if self.responder is None:
            return {"status": 500, "body": error_body(
                "the fake OpenAI server has no response queued for this request "
                "(call FakeOpenAI.queue(...) or set a responder)", "fake_empty")}
        try:
            response = self.responder(body)
            if inspect.isawaitable(response):
                response = await response
            check_response(response)
            response = made_unruly(response, body)
        except Exception as exc:  # a broken responder is an answer, not a crash
            return {"status": 500, "body": error_body(f"fake responder failed: {exc!r}", "fake_error")}
        return response

    async def _complete(self, body: dict[str, Any], reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        response = await self._next_response(body)
        if response.get("delay"):
            await asyncio.sleep(float(response["delay"]))
            if writer.is_closing() or reader.at_eof():  # the client gave up waiting (a timeout test)
                raise Disconnect()
        status = int(response.get("status", 200))
        if status != 200:
            await send_error(writer, status, response)
            return
        if "raw" in response:
            kind = "text/event-stream" if body.get("stream") else "application/json"
            await send(writer, 200, str(response["raw"]).encode(), kind)
            return
        with self._lock:
            self._counter += 1
            number = self._counter
        calls = [
            {
                "id": call.get("id") or f"call_fake_{number}_{i}",
                "name": call["name"],
                "arguments": call["arguments"] if isinstance(call.get("arguments"), str)
                else json.dumps(call.get("arguments") or {}),
            }
            for i, call in enumerate(response.get("tool_calls") or [], start=1)
        ]
        chunks = [str(c) for c in response["chunks"]] if "chunks" in response else None
        text = "".join(chunks) if chunks is not None else response.get("text")
        finish = response.get("finish_reason") or ("tool_calls" if calls else "stop")
        # {"usage": None}: a server that reports no usage at all.
        usage = response["usage"] if "usage" in response and response["usage"] is None else (
            response.get("usage") or estimate_usage(body, text, calls))
        if self.prompt_cache and usage is not None and "usage" not in response:
            usage = {**usage, "prompt_tokens_details": {"cached_tokens": self._cached_tokens(body)}}
        meta = {"id": f"chatcmpl-fake{number}", "created": int(time.time()),
                "model": body.get("model", "fake-model")}
        if body.get("stream"):
            if chunks is None:
                chunks = split_text(text) if text else []
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            await self._stream(writer, meta, chunks, calls, finish, usage if include_usage else None,
                               float(response.get("chunk_delay") or 0), bool(response.get("disconnect")),
                               bool(response.get("stall")), reader, response.get("refusal"))
            return
        if response.get("disconnect"):
            raise Disconnect()
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": response.get("refusal")}
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls
            ]
        await send_json(writer, 200, {
            **meta, "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": usage,
        })

    def _cached_tokens(self, body: dict[str, Any]) -> int:
        """The estimated tokens of the longest leading run of messages an earlier request with the
        same model and `prompt_cache_key` began with (then this prompt is remembered too)."""
        messages = [json.dumps(m, sort_keys=True) for m in body.get("messages") or []]
        key = (str(body.get("model")), str(body.get("prompt_cache_key") or ""))
        with self._lock:
            earlier = self._prompts.setdefault(key, [])
            shared = max((_common_prefix(messages, prompt) for prompt in earlier), default=0)
            earlier.append(messages)
        return sum(message_tokens(m) for m in (body.get("messages") or [])[:shared])

    async def _stream(self, writer: asyncio.StreamWriter, meta: dict[str, Any], chunks: list[str],
                      calls: list[dict[str, str]], finish: str, usage: dict[str, int] | None,
                      pause: float, disconnect: bool = False, stall: bool = False,
                      reader: asyncio.StreamReader | None = None, refusal: str | None = None) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")

        async def event(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
            if writer.is_closing():
                raise Disconnect()
            payload = {**meta, "object": "chat.completion.chunk", "choices": choices, **(extra or {})}
            write_chunk(writer, b"data: " + json.dumps(payload).encode() + b"\n\n")
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)

        def delta(d: dict[str, Any], reason: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": d, "finish_reason": reason, "logprobs": None}]

        await event(delta({"role": "assistant", "content": ""}))
        for piece in chunks:
            await event(delta({"content": piece}))
        for piece in split_text(refusal) if refusal else []:  # as OpenAI streams a refusal
            await event(delta({"refusal": piece}))
        # Tool calls as real providers send them: the id and name first, the arguments in pieces.
        for index, call in enumerate(calls):
            await event(delta({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                               "function": {"name": call["name"], "arguments": ""}}]}))
            for piece in split_arguments(call["arguments"]):
                await event(delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        if disconnect:
            raise Disconnect()
        if stall and reader is not None:  # until the client closes the connection (or the fake stops)
            await reader.read()
            raise Disconnect()
        await event(delta({}, finish))
        if usage is not None:
            await event([], {"usage": usage})
        write_chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


# -- wire helpers --------------------------------------------------------------------------------


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    """One HTTP/1.1 request, or None when the client closed the connection."""
    line = await reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3:
        raise ValueError(f"bad request line {line!r}")
    method, path, _ = parts
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        header = await reader.readline()
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()  # the blank line after the last chunk (no trailers sent)
                break
            body += await reader.readexactly(size)
            await reader.readline()
        return method, path, headers, bytes(body)
    length = int(headers.get("content-length") or 0)
    return method, path, headers, await reader.readexactly(length) if length else b""


def write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


async def send(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str,
               extra_headers: dict[str, str] | None = None) -> None:
    head = [f"HTTP/1.1 {status} {phrase(status)}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (extra_headers or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()


async def send_json(writer: asyncio.StreamWriter, status: int, payload: Any,
                    extra_headers: dict[str, str] | None = None) -> None:
    await send(writer, status, json.dumps(payload).encode(), "application/json", extra_headers)


async def send_error(writer: asyncio.StreamWriter, status: int, response: Response) -> None:
    headers: dict[str, str] = {}
    if response.get("retry_after") is not None:
        after = response["retry_after"]
        headers["Retry-After"] = after if isinstance(after, str) else f"{float(after):g}"
    body = response.get("body")
    if body is None:
        kind = "rate_limit_exceeded" if status == 429 else "server_error"
        body = error_body(f"fake HTTP {status} ({phrase(status)})", kind)
    if isinstance(body, str):
        await send(writer, status, body.encode(), "text/plain", headers)
    else:
        await send_json(writer, status, body, headers)


def phrase(status: int) -> str:
    """The status's reason phrase; "Error" for one HTTP does not name (529, "overloaded")."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": kind}}


def split_text(text: str) -> list[str]:
    """Word-sized stream chunks, as providers send them."""
    return re.findall(r"\s*\S+\s*|\s+", text) or [text]


def split_arguments(arguments: str) -> list[str]:
    """Argument text in up to three pieces, so clients must reassemble it."""
    if len(arguments) < 3:
        return [arguments] if arguments else []
    third = len(arguments) // 3
    return [arguments[:third], arguments[third:2 * third], arguments[2 * third:]]


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def message_tokens(message: dict[str, Any]) -> int:
    """A message's rough token count (4 characters a token, 4 for its role)."""
    return 4 + len(json.dumps(message.get("content") or "")) // 4


def estimate_usage(body: dict[str, Any], text: str | None, calls: list[dict[str, str]]) -> dict[str, int]:
    """Rough token counts (4 characters a token): enough for code that reads usage."""
    prompt = sum(message_tokens(m) for m in body.get("messages") or [])
    completion = len(text or "") // 4 + sum(len(c["name"]) + len(c["arguments"]) for c in calls) // 4
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# -- standalone ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m chatrun.testing.fake_openai",
        description="A local fake OpenAI Chat Completions server (for manual play and benchmarks).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8901, help="0 picks a free port")
    parser.add_argument("--echo", action="store_true", help="answer with the last user message")
    parser.add_argument("--text", help="answer every request with this text")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before each answer")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between streamed chunks")
    parser.add_argument("--prompt-cache", action="store_true",
                        help="report cached tokens as a provider's prompt cache would (the prefix seen before)")
    args = parser.parse_args(argv)

    def responder(body: dict[str, Any]) -> Response:
        answer = {"text": args.text} if args.text is not None else echo(body)
        return {**answer, "delay": args.delay, "chunk_delay": args.chunk_delay}

    fake = FakeOpenAI(args.host, args.port, responder if (args.echo or args.text is not None) else None,
                      prompt_cache=args.prompt_cache)
    with fake:
        mode = "echo" if args.echo else ("fixed text" if args.text is not None else "no responder: HTTP 500")
        print(f"fake OpenAI server at {fake.base_url} ({mode}); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
