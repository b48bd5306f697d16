"""Fallback models and their circuit breakers: `model.fallback:` and `model.breaker:`.

A model call whose endpoint cannot answer now — `ModelUnavailable`: quota (429), overload
(503, 529), timeout, outage (cannot connect, other 5xx), after the endpoint's own retries —
is asked of the next model of `fallback:`, while nothing of the answer has been shown: once a
chunk went to the user, asking another model would show a second beginning, so the error
stands as it is. A refused request (400, 401, 404, ...) or an unusable answer is never asked
again elsewhere: another model would be sent the same request.

The breakers: after `breaker.failures` unavailable answers in a row, an endpoint is skipped
for `breaker.cool_down` and the next model answers at once; the first call after the cool-down
tries it again (one more failure opens it again). Time is the session's clock
(chatrun.engine.clock), so tests move it instead of waiting. The breakers live with whoever
holds the model clients (`ModelPool.breakers`: the server's one per process), found on the
session's model as its `breakers` attribute; a model without one has no breakers, only fallbacks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from chatrun.definition.config import ModelConfig
from chatrun.errors import ModelError, ModelUnavailable
from chatrun.models.base import (
    ChatModel,
    ChunkCallback,
    ModelRequest,
    ModelResponse,
    begin_again,
    relaying,
)

BREAKER_OPEN = "breaker_open"  # the reason of a switch made without calling the skipped model

Endpoint = tuple[str, str, str]  # ModelConfig.endpoint: (provider, base URL, name)
RETRY_STATUS = {408, 409, 429}  # the 4xx an endpoint answers when a later try may work (as do all 5xx)


def unavailable_reason(status: int) -> str:
    """Why an endpoint answering HTTP `status` (a retryable one) cannot answer now: the
    `reason` of ModelUnavailable and of `chatrun_model_fallbacks_total`."""
    if status == 429:
        return "quota"
    if status in (503, 529):  # 529: "overloaded", as some providers say it
        return "overload"
    if status == 408:
        return "timeout"
    return "outage"


@dataclass
class BreakerState:
    failures: int = 0  # unavailable answers in a row
    open_until: float | None = None  # a timestamp; None: closed


class Breakers:
    """The circuit breakers of the endpoints one set of model clients calls."""

    def __init__(self) -> None:
        self._states: dict[Endpoint, BreakerState] = {}

    def is_open(self, config: ModelConfig, now: float) -> bool:
        state = self._states.get(config.endpoint)
        return state is not None and state.open_until is not None and now < state.open_until

    def failed(self, config: ModelConfig, now: float) -> bool:
        """One unavailable answer; True when it opens the breaker."""
        state = self._states.setdefault(config.endpoint, BreakerState())
        state.failures += 1
        if state.failures >= config.breaker.failures:
            state.open_until = now + config.breaker.cool_down
            return True
        return False

    def succeeded(self, config: ModelConfig) -> None:
        self._states.pop(config.endpoint, None)


@dataclass(frozen=True)
class Switch:
    """The model call moved from one model to the next: why (a fallback reason or BREAKER_OPEN)."""

    from_model: str
    to_model: str
    reason: str


@dataclass
class Answered:
    """A model call's answer and which model gave it, with the switches made on the way."""

    response: ModelResponse
    config: ModelConfig
    switches: list[Switch] = field(default_factory=list)


Call = Callable[[ChatModel, ModelRequest, ChunkCallback | None], Awaitable[ModelResponse]]


async def complete(model: ChatModel, request: ModelRequest, on_chunk: ChunkCallback | None,
                   call: Call, breakers: Breakers | None, now: Callable[[], datetime],
                   on_switch: Callable[[Switch], None] | None = None) -> Answered:
    """`call(model, request, on_chunk)` with the request's model, else with its fallbacks, in order.

    `call` is the engine's timed call (chatrun.engine.observe.timed_call); `on_switch` hears
    of each move to the next model as it is made (metrics, spans, logs). Raises the last
    model's error when none could answer (naming what each said), and at once an error that is
    no reason to fall back or that came after a chunk was shown.
    """
    primary = request.config
    candidates = [primary, *primary.fallback_configs()]
    if len(candidates) == 1:
        return Answered(await call(model, request, on_chunk), primary)
    started = [False]  # a chunk reached the user (not one an output guardrail's hold keeps back)

    async def watched(chunk: str) -> bool | None:
        assert on_chunk is not None
        said = await on_chunk(chunk)
        if chunk and said is not False:  # ChunkCallback: False, held back
            started[0] = True
        return said

    switches: list[Switch] = []
    failures: list[str] = []

    def switch(made: Switch) -> None:
        switches.append(made)
        if on_switch is not None:
            on_switch(made)

    for index, config in enumerate(candidates):
        last = index == len(candidates) - 1
        successor = candidates[index + 1].name if not last else ""
        if breakers is not None and not last and breakers.is_open(config, now().timestamp()):
            switch(Switch(config.name, successor, BREAKER_OPEN))
            failures.append(f"{config.name}: skipped (its breaker is open after repeated failures)")
            continue
        try:
            response = await call(model, replace_config(request, config),
                                  relaying(watched, on_chunk) if on_chunk else None)
        except ModelUnavailable as exc:
            if breakers is not None:
                breakers.failed(config, now().timestamp())
            if started[0] or last:
                raise ModelUnavailable(joined(failures, config, exc), exc.reason) if failures else exc from None
            switch(Switch(config.name, successor, exc.reason))
            failures.append(f"{config.name}: {exc}")
            begin_again(on_chunk)  # what the hold kept of this answer is not the next one's start
            continue
        if breakers is not None:
            breakers.succeeded(config)
        return Answered(response, config, switches)
    raise AssertionError("unreachable: the last model answers or raises")


def replace_config(request: ModelRequest, config: ModelConfig) -> ModelRequest:
    return request if config is request.config else replace(request, config=config)


def joined(failures: list[str], config: ModelConfig, exc: ModelError) -> str:
    """The message of a call no model could answer: what each one said, in order."""
    return "no model could answer: " + "; then ".join([*failures, f"{config.name}: {exc}"])
