"""The `scripted` provider: answers from a list, for tests and golden transcripts.

    model = ScriptedModel([
        {"text": "Hello"},
        {"tool_calls": [{"name": "book", "arguments": {"seat": "12A"}}]},
        {"chunks": ["Str", "eamed"]},
        {"error": "the model is down"},
    ])

Response forms (one per model call, in order): {"text"}, {"tool_calls": [{"name",
"arguments": dict | str, "id"?}]}, both, {"chunks": [...]} (the text streamed in these
pieces), {"error": "message"} (the call raises ModelError), {"error": 429} (the endpoint
answers that HTTP status: 429, 503, 529, 408 or another 5xx raise ModelUnavailable, which a
route's `model.fallback:` answers; a 4xx is a refused request), {"model": NAME} with any of
them (the call must go to that model: a fallback's answer pins it), {"delay": seconds} with any
of them, a plain string (text), a ModelResponse, or a callable that makes one of these from
the request (chatrun.testing.unruly.Unruly: an answer made from what the model was offered). Tool call ids the script leaves out
are "call_1", "call_2", ... counted per model, so transcripts are stable.
Every request is kept in `.requests`.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from chatrun.errors import ChatrunError, ModelError, ModelUnavailable
from chatrun.messages import ToolCall
from chatrun.models.base import ChunkCallback, ModelRequest, ModelResponse
from chatrun.models.fallback import RETRY_STATUS, Breakers, unavailable_reason

Answer = dict[str, Any] | ModelResponse | str
Scripted = Answer | Callable[[ModelRequest], Answer]
KEYS = {"text", "tool_calls", "chunks", "error", "delay", "usage", "model"}


class ScriptedModel:
    def __init__(self, responses: Iterable[Scripted] | None = None):
        self._responses: deque[Scripted] = deque()
        self.requests: list[ModelRequest] = []
        self._ids = 0
        self.breakers = Breakers()  # the circuit breakers of the endpoints it stands in for
        self.add(*(responses or []))

    def add(self, *responses: Scripted) -> ScriptedModel:
        for response in responses:
            check(response)
        self._responses.extend(responses)
        return self

    @property
    def remaining(self) -> int:
        return len(self._responses)

    async def complete(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> ModelResponse:
        self.requests.append(request)
        if not self._responses:
            raise ModelError(
                f"scripted model has no response left for call {len(self.requests)} (route {request.route})"
            )
        response = self._responses.popleft()
        if callable(response):  # made from the request: checked as any entry
            response = response(request)
            check(response)
        if isinstance(response, ModelResponse):
            result = ModelResponse(response.text, list(response.tool_calls), dict(response.usage))
            chunks = [result.text] if result.text else []
        else:
            if isinstance(response, str):
                response = {"text": response}
            if response.get("delay"):
                await asyncio.sleep(float(response["delay"]))
            expected = response.get("model")
            if expected is not None and expected != request.config.name:
                raise ModelError(f"the scripted answer {response!r} is for model {expected}, but this call "
                                 f"went to model {request.config.name} (route {request.route})")
            if "error" in response:
                raise scripted_error(response["error"], request)
            chunks = [str(c) for c in response.get("chunks") or []]
            text = "".join(chunks) if "chunks" in response else response.get("text")
            if not chunks and text:
                chunks = [text]
            calls = [self.tool_call(c) for c in response.get("tool_calls") or []]
            result = ModelResponse(text or None, calls, dict(response.get("usage") or {}))
        if on_chunk is not None:
            for chunk in chunks:
                await on_chunk(chunk)
        return result

    def tool_call(self, call: dict[str, Any] | ToolCall) -> ToolCall:
        if isinstance(call, ToolCall):
            return call
        self._ids += 1
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return ToolCall(call.get("id") or f"call_{self._ids}", call["name"], arguments)


def scripted_error(error: Any, request: ModelRequest) -> ModelError:
    """A script's `error:`: a message (ModelError), or the HTTP status the endpoint answers."""
    if isinstance(error, bool) or not isinstance(error, int):
        return ModelError(str(error))
    message = f"model {request.config.name}: HTTP {error} (scripted)"
    if error in RETRY_STATUS or error >= 500:
        return ModelUnavailable(message, unavailable_reason(error))
    return ModelError(message)


def check(response: Scripted) -> None:
    """Reject a malformed script entry when it is added, not when the model is called."""
    if isinstance(response, (ModelResponse, str)) or callable(response):
        return
    if not isinstance(response, dict):
        raise ChatrunError(f"a scripted response must be a mapping, a string or a ModelResponse, not {response!r}")
    unknown = sorted(set(response) - KEYS)
    if unknown:
        raise ChatrunError(
            f"scripted response {response!r} has unknown keys {unknown}; use {', '.join(sorted(KEYS))}"
        )
    if not (set(response) & {"text", "tool_calls", "chunks", "error"}):
        raise ChatrunError(f"scripted response {response!r} needs text, tool_calls, chunks or error")
    error = response.get("error")
    if isinstance(error, int) and not isinstance(error, bool) and not 400 <= error <= 599:
        raise ChatrunError(f"scripted response {response!r}: an `error:` status is an HTTP error, 400 to 599")
    calls = response.get("tool_calls", [])
    if not isinstance(calls, list):
        raise ChatrunError(f"tool_calls of scripted response {response!r} must be a list")
    for call in calls:
        if isinstance(call, ToolCall):
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ChatrunError(f"a scripted tool call needs a name: {call!r}")
        unknown = sorted(set(call) - {"name", "arguments", "id"})
        if unknown:
            raise ChatrunError(f"scripted tool call {call!r} has unknown keys {unknown}; use name, arguments, id")
