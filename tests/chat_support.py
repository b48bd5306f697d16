"""Small helpers for tests that script a model's answers and read a turn's events."""

from __future__ import annotations

from typing import Any


def call(tool: str, /, **args: Any) -> dict:
    """A scripted (or fake-OpenAI) answer calling one tool."""
    return {"tool_calls": [{"name": tool, "arguments": args}]}


def kinds(events: list) -> list[tuple[str, Any]]:
    """A turn's events as (type, data), without Stream chunks."""
    return [(e.type, e.data) for e in events if e.type != "Stream"]
