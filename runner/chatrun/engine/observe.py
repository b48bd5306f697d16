"""Measurements of a turn's model and tool calls, for whoever observes the turn.

The engine only reports; it knows nothing of Prometheus or of the server. An observer (the
server's metrics, chatrun.server.metrics) is installed for the duration of a turn with
`observing(observer)`: a context variable, so every task the turn starts sees it and two
apps in one process (tests) each see only their own turns. With no observer every function
here is a no-op costing one ContextVar lookup.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from chatrun.models.base import ChatModel, ModelRequest, ModelResponse


@dataclass(frozen=True)
class ModelCallMeasure:
    """One model call: how long it took, how long until its first streamed chunk (None when
    not streamed or nothing came), and the exception type's name when it failed."""

    provider: str
    model: str
    route: str
    seconds: float
    first_chunk_seconds: float | None = None
    error: str | None = None


class Observer(Protocol):
    def model_call(self, measure: ModelCallMeasure) -> None: ...

    def model_usage(self, provider: str, model: str, usage: dict[str, Any]) -> None:
        """A call's usage entry (input_tokens, output_tokens, cost, estimated, ...)."""

    def tool_call(self, tool: str, seconds: float, failed: bool) -> None: ...

    def model_fallback(self, from_model: str, to_model: str, reason: str) -> None:
        """A model call moved to the next model of `model.fallback:` (reason: quota, overload,
        timeout, outage, breaker_open)."""


_observer: ContextVar[Observer | None] = ContextVar("chatrun_observer", default=None)


class observing:  # lower case: it reads as a `with` clause
    """Report the measurements of turns run inside this block (and the tasks it starts) to `observer`.
    A class, not a generator context manager: one a turn, and the generator's machinery cost
    ~10,000 instructions more (16,800 against 6,200; issue 39)."""

    __slots__ = ("_observer", "_token")

    def __init__(self, observer: Observer | None):
        self._observer = observer

    def __enter__(self) -> None:
        self._token = _observer.set(self._observer)

    def __exit__(self, *exc: object) -> None:
        try:
            _observer.reset(self._token)
        except ValueError:  # left from another context (a generator closed elsewhere)
            pass


def active() -> bool:
    return _observer.get() is not None


Chunk = Callable[[str], Awaitable[bool | None]]  # models/base.py ChunkCallback


async def timed_call(model: ChatModel, request: ModelRequest, on_chunk: Chunk | None) -> ModelResponse:
    """`model.complete(request, on_chunk)`, reporting its duration and time to first chunk."""
    observer = _observer.get()
    if observer is None:
        return await model.complete(request, on_chunk)
    provider, name, route = request.config.provider, request.config.name, request.route
    started = time.perf_counter()
    first: list[float] = []

    async def timed_chunk(chunk: str) -> bool | None:
        if not first and chunk:
            first.append(time.perf_counter() - started)
        assert on_chunk is not None
        return await on_chunk(chunk)

    # As models/base.py `relaying` does, inline: a served message's walk enters no function of that module.
    again = getattr(on_chunk, "begin_again", None)
    if again is not None:
        timed_chunk.begin_again = again  # type: ignore[attr-defined]
    try:
        response = await model.complete(request, timed_chunk if on_chunk is not None else None)
    except BaseException as exc:
        observer.model_call(ModelCallMeasure(provider, name, route, time.perf_counter() - started,
                                             first[0] if first else None, type(exc).__name__))
        raise
    observer.model_call(ModelCallMeasure(provider, name, route, time.perf_counter() - started,
                                         first[0] if first else None))
    return response


def model_usage(provider: str, model: str, usage: dict[str, Any]) -> None:
    observer = _observer.get()
    if observer is not None:
        observer.model_usage(provider, model, usage)


def tool_call(tool: str, seconds: float, failed: bool) -> None:
    observer = _observer.get()
    if observer is not None:
        observer.tool_call(tool, seconds, failed)


def model_fallback(from_model: str, to_model: str, reason: str) -> None:
    observer = _observer.get()
    if observer is not None:
        observer.model_fallback(from_model, to_model, reason)


def guardrail(stage: str, kind: str, outcome: str) -> None:
    """A guardrail matched (engine/guardrails.py): its stage, its kind and what it did."""
    observer = _observer.get()
    method = getattr(observer, "guardrail", None)  # observers written before guardrails have none
    if method is not None:
        method(stage, kind, outcome)
