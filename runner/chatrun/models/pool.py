"""The one place a route's model is found: provider name -> model client.

A `ModelPool` builds each provider's client once. The server keeps one pool for the
process, so a thousand sessions share one HTTP connection pool; a session started from
the library gets a pool of its own. `pool.model()` is the `ChatModel` a session uses: it
answers each request with the client of the request's provider — shared clients for
providers that hold no per-conversation state, a client of its own for the others (the
scripted model counts its answers). Who answers a call is decided here: the request's
provider, or a stand-in the running turn's request set (`STAND_IN`: the author playing the
model on the page, server/play_model.py), which no other layer knows about.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from typing import Any, Protocol

from chatrun.definition.config import ModelConfig
from chatrun.models.base import (
    ChatModel,
    ChunkCallback,
    ModelRequest,
    ModelResponse,
    ModerationResult,
)
from chatrun.models.fallback import Breakers

SHARED_PROVIDERS = ("openai",)  # clients that hold no per-conversation state


class StandIn(Protocol):
    """Someone who answers a model call in the model's place (server/play_model.py's ModelPlayer)."""

    def wants(self, request: ModelRequest) -> bool: ...

    async def answer(self, request: ModelRequest) -> ModelResponse: ...


# The stand-in of the turn running in this context, if any. The request that runs the turn sets
# it; the engine's turn task is created inside and inherits it. A context variable, not a wrapper
# model, so a session nobody plays passes no extra layer (issue 39).
STAND_IN: contextvars.ContextVar[StandIn | None] = contextvars.ContextVar("chatrun_model_stand_in", default=None)


def make_model(provider: str, **options: Any) -> ChatModel:
    """A new client for a provider name: "openai" or "scripted"."""
    if provider == "openai":
        from chatrun.models.openai_model import OpenAIModel

        return OpenAIModel(**options)
    if provider == "scripted":
        from chatrun.models.scripted import ScriptedModel

        return ScriptedModel(**options)
    from chatrun.errors import ChatrunError

    raise ChatrunError(f"unknown model provider {provider!r}; use 'openai' or 'scripted'")


class ModelPool:
    def __init__(self) -> None:
        self._shared: dict[str, ChatModel] = {}
        # The circuit breakers of the endpoints these clients call (`model.breaker:`): one set per
        # pool, so a server's sessions all skip an endpoint that keeps failing (models/fallback.py).
        self.breakers = Breakers()

    def warm(self, providers: Iterable[str]) -> None:
        """Build the shared clients now, not on the first request: importing a provider's
        library takes about a second, which would land on the first users' turns."""
        for provider in providers:
            if provider in SHARED_PROVIDERS:
                self.shared(provider)

    def shared(self, provider: str) -> ChatModel:
        model = self._shared.get(provider)
        if model is None:
            model = self._shared[provider] = make_model(provider)
        return model

    def model(self) -> PooledModel:
        """The ChatModel of one conversation."""
        return PooledModel(self)

    async def aclose(self) -> None:
        await _aclose_all(self._shared.values())
        self._shared.clear()


_NONE_OWN: dict[str, ChatModel] = {}  # the models of a conversation that made none (shared, never written)


class PooledModel:
    """A ChatModel for one conversation: the pool's shared clients, its own for the others."""

    __slots__ = ("_pool", "_own")  # one per session, cached sessions included

    def __init__(self, pool: ModelPool):
        self._pool = pool
        self._own: dict[str, ChatModel] = _NONE_OWN  # a dict of its own only once it makes a model

    @property
    def breakers(self) -> Breakers:
        return self._pool.breakers

    def for_provider(self, provider: str) -> ChatModel:
        if provider in SHARED_PROVIDERS:
            return self._pool.shared(provider)
        model = self._own.get(provider)
        if model is None:
            if self._own is _NONE_OWN:
                self._own = {}
            model = self._own[provider] = make_model(provider)
        return model

    async def complete(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> ModelResponse:
        stand_in = STAND_IN.get()
        if stand_in is not None and stand_in.wants(request):
            return await stand_in.answer(request)
        return await self.for_provider(request.config.provider).complete(request, on_chunk)

    async def moderate(self, config: ModelConfig, model: str, text: str) -> ModerationResult | None:
        """The `/moderations` of the config's provider (None: it has none, e.g. the scripted model)."""
        return await moderate_with(self.for_provider(config.provider), config, model, text)

    async def aclose(self) -> None:
        await _aclose_all(self._own.values())
        self._own = _NONE_OWN


async def moderate_with(model: Any, config: ModelConfig, model_name: str, text: str) -> ModerationResult | None:
    """`model.moderate(...)`, or None for a model that has no moderation endpoint to ask."""
    moderate = getattr(model, "moderate", None)
    return None if moderate is None else await moderate(config, model_name, text)


async def _aclose_all(models: Iterable[ChatModel]) -> None:
    for model in list(models):
        aclose = getattr(model, "aclose", None)
        if aclose is not None:
            await aclose()
