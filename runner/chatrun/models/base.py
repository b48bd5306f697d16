"""What the engine asks of a model, and what it gets back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from chatrun.definition.config import ModelConfig
from chatrun.messages import BlobReader, Message, ToolCall

# What a model streams goes to `on_chunk`, which says whether the chunk reached the user: False
# when it was held back and nothing of the answer has been shown yet (an output guardrail's hold
# of a whole reply, engine/guardrails.py), so a retry or a fallback may still start the answer
# anew; None (a plain callback) or True: shown, and the answer's start stands. A caller reads it
# as `said is not False` (inline: a served message's walk enters no function of this module).
ChunkCallback = Callable[[str], Awaitable[bool | None]]


def begin_again(on_chunk: ChunkCallback | None) -> None:
    """A new attempt at an answer none of whose chunks reached the user (a retry, the next model of
    `fallback:`): a callback that holds chunks (an output guardrail's hold) drops the failed
    attempt's, so the new answer's text is never joined to them. A plain callback has nothing to drop."""
    again = getattr(on_chunk, "begin_again", None)
    if again is not None:
        again()


def relaying(wrapper: ChunkCallback, on_chunk: ChunkCallback) -> ChunkCallback:
    """`wrapper`, a callback that passes its chunks on to `on_chunk`, passing `begin_again` on too."""
    again = getattr(on_chunk, "begin_again", None)
    if again is not None:
        wrapper.begin_again = again  # type: ignore[attr-defined]
    return wrapper


@dataclass(frozen=True)
class ModerationResult:
    """What a `/moderations` endpoint said of a text (a `moderation` guardrail reads it,
    engine/guardrails.py): per category, whether it flagged it and its score."""

    categories: dict[str, bool]
    scores: dict[str, float]


@dataclass
class ModelRequest:
    """One call to the model.

    `tools` are OpenAI function specs: {"type": "function", "function": {"name",
    "description", "parameters"}}. `config` is the route's merged model config
    (name, temperature, ...). `route` is informational (scripted models and logs).
    """

    messages: list[Message]
    tools: list[dict[str, Any]]
    config: ModelConfig
    route: str = ""
    response_format: dict[str, Any] | None = None  # a route's `output:`: JSON asked for (OpenAI's field)
    blobs: BlobReader | None = None  # the bytes of the messages' attachments, by reference
    # A route's `tool_choice:` for this call: "auto" | "required" | "none" | a tool's name; None: not sent.
    tool_choice: str | None = None
    # The same for every call of a bot's route (`bot/route`): a provider prompt-cache key, sent as
    # `model.prompt_cache` says (models/openai_model.py); None: none.
    cache_key: str | None = None


@dataclass
class ModelResponse:
    """The model's answer: text, tool calls, or both."""

    text: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)  # input/output/cached_input/reasoning tokens
    finish_reason: str | None = None  # "stop", "tool_calls", "length", ... as the endpoint says


class ChatModel(Protocol):
    async def complete(
        self, request: ModelRequest, on_chunk: ChunkCallback | None = None
    ) -> ModelResponse:
        """Answer one request. Call `on_chunk` with text chunks while streaming (if given).

        Raises chatrun.errors.ModelError when the model cannot answer (after retries).
        """
        ...
