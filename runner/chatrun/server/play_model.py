"""Playing the model from the author's page: the server asks the page what the model answers.

The REPL lets an author walk a bot with no model configured by answering each model call at
its `model>` prompt (cli/human_model.py). This is the same over the WebSocket (docs/protocol.md,
"Playing the model"): a turn request that carries `"playModel": "auto"` (ask the page only when
the route's model cannot be reached: no key, no endpoint) or `"always"` (the author ticked "I'll
answer as the model") makes each model call of that turn a `ModelRequest` frame: the route, the
messages the model would see (in short) and the tools offered. The turn waits until a
`ModelAnswer` frame of the same connection answers it (text, or a tool call), then goes on.

How the answer reaches the model call: the request's task sets `PLAYING` (models/pool.py's
`STAND_IN`, a context variable) before it iterates the turn; the engine's turn task is created
inside it and inherits it, and the session's pooled model asks the player when one is set and
wants the call. Nothing else of the engine knows, and a turn nobody plays never enters this file.

Who may play: a caller with no auth (the server's own author, `chatrun serve` without `--auth`),
or a principal with the role `authors`. Never the end-user page (it never asks), never a
widget's visitor. A Cancel stops the waiting turn; a connection that closes fails it; nobody
answering within `ServerLimits.model_answer_timeout` (15 minutes) fails it with a clear message.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chatrun.errors import ModelError
from chatrun.messages import ToolCall
from chatrun.models.base import ModelRequest, ModelResponse
from chatrun.models.pool import STAND_IN, StandIn
from chatrun.server import wire
from chatrun.server.auth import Principal

AUTHOR_ROLE = "authors"
MODEL_REQUEST = "ModelRequest"  # server -> client: answer this model call
SHOWN_MESSAGES = 8  # the last messages a ModelRequest carries (the system prompt besides)
SHOWN_CHARS = 2000  # characters of each message's content in a ModelRequest


def may_play(principal: Principal | None) -> bool:
    """Only the author plays the model: no auth at all, or the role `authors`."""
    return principal is None or AUTHOR_ROLE in principal.roles


def unreachable(request: ModelRequest) -> str | None:
    """Why this call's model cannot answer (no credentials, no endpoint), else None."""
    if request.config.provider != "openai":
        return None
    from chatrun.models.openai_model import credentials_problem

    return credentials_problem(request.config)


@dataclass
class Asks:
    """The model calls waiting for an answer on one connection, by ask id ("m1", "m2", ...)."""

    waiting: dict[str, tuple[str, asyncio.Future[ModelResponse]]] = field(default_factory=dict)
    numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def answer(self, chat_id: str, data: dict[str, Any]) -> None:
        """A ModelAnswer frame's answer to its ask; RequestFailed(NotPending) when none waits."""
        ask = data["ask"]
        found = self.waiting.get(ask)
        if found is None or found[0] != chat_id or found[1].done():
            raise wire.RequestFailed(wire.NOT_PENDING, f"no model call {ask!r} waits for an answer on chat "
                                                       f"{chat_id} (answered already, stopped or timed out)")
        found[1].set_result(response_of(data, ask))

    def abandon(self, why: str) -> None:
        """The connection closed: every waiting turn fails (rolled back) with `why`."""
        for _, future in self.waiting.values():
            if not future.done():
                future.set_exception(ModelError(why))


@dataclass
class ModelPlayer:
    """The page playing the model for one turn request: sends ModelRequest frames, awaits answers."""

    mode: str
    chat_id: str
    asks: Asks
    send: Callable[[str, Any], None]  # (frame type, data) as part of the turn request
    timeout: float

    def wants(self, request: ModelRequest) -> bool:
        return self.mode == "always" or unreachable(request) is not None

    async def answer(self, request: ModelRequest) -> ModelResponse:
        ask = f"m{next(self.asks.numbers)}"
        future: asyncio.Future[ModelResponse] = asyncio.get_running_loop().create_future()
        self.asks.waiting[ask] = (self.chat_id, future)
        try:
            self.send(MODEL_REQUEST, model_request_data(ask, request, unreachable(request)))
            try:
                return await asyncio.wait_for(future, self.timeout)
            except TimeoutError:
                minutes = f"{self.timeout / 60:g} minutes" if self.timeout >= 60 else f"{self.timeout:g} seconds"
                why = f"nobody answered as the model within {minutes}; this message was not kept: send it again to answer it"
                self.send("Error", why)  # the author reads why (the turn's own Error is the user's "Sorry…")
                raise ModelError(why) from None
        finally:
            del self.asks.waiting[ask]


PLAYING: contextvars.ContextVar[StandIn | None] = STAND_IN  # a ModelPlayer answers the turn's model calls


def model_request_data(ask: str, request: ModelRequest, why: str | None) -> dict[str, Any]:
    """What the page shows the author: the route, the model's messages in short, the tools."""
    messages = [_short(m.to_dict()) for m in request.messages]
    system = messages[0] if messages and messages[0].get("role") == "system" else None
    rest = messages[1:] if system else messages
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description") or "",
              "parameters": t["function"].get("parameters") or {"type": "object"}} for t in request.tools]
    data: dict[str, Any] = {
        "ask": ask, "route": request.route, "tools": tools,
        "system": system["content"] if system else None,
        "messages": rest[-SHOWN_MESSAGES:], "omitted": max(0, len(rest) - SHOWN_MESSAGES),
    }
    if why:
        data["why"] = why
    if request.response_format is not None:
        data["output"] = request.response_format
    if request.tool_choice is not None:
        data["toolChoice"] = request.tool_choice
    return data


def _short(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str) and len(content) > SHOWN_CHARS:
        message = {**message, "content": content[:SHOWN_CHARS] + f"… ({len(content) - SHOWN_CHARS} more characters)"}
    return message


def response_of(data: dict[str, Any], ask: str) -> ModelResponse:
    """A checked ModelAnswer's model response: its text, or its one tool call."""
    if "tool" in data:
        arguments = data.get("arguments", {})
        return ModelResponse(tool_calls=[ToolCall(f"played_{ask}", data["tool"], json.dumps(arguments))],
                             finish_reason="tool_calls")
    return ModelResponse(text=data["text"], finish_reason="stop")
