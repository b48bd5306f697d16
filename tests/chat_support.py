"""Small helpers for tests that script a model's answers and read a turn's events."""

from __future__ import annotations

from typing import Any


def call(tool: str, /, **args: Any) -> dict:
    """A scripted (or fake-OpenAI) answer calling one tool."""
    return {"tool_calls": [{"name": tool, "arguments": args}]}


def kinds(events: list) -> list[tuple[str, Any]]:
    """A turn's events as (type, data), without Stream chunks."""
    return [(e.type, e.data) for e in events if e.type != "Stream"]


# A bot with prices, whose one tool makes a turn take two model calls (tests of usage and cost).
COSTLY_BOT = """
name: costly
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
prices:
  gpt-4o-mini: {input: 0.15, output: 0.60, cached_input: 0.075}
routes:
  main: {default: true, system: You help., tools: [note]}
tools:
  note: {description: Take a note, action: {reply: noted}}
"""


def usage(prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> dict:
    """An OpenAI `usage` object, as the fake server reports it with an answer."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning}}
