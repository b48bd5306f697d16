"""The shop bot of the humans-in-the-loop page tests (tests/fixtures/hitl_shop) and its model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SHOP = Path(__file__).parent / "fixtures" / "hitl_shop"


def responder(body: dict[str, Any]) -> dict[str, Any]:
    """The model: `refund ORDER AMOUNT`, `delivery`, `size`, `check`, `human` call their tools; a tool's
    result is read back; anything else is echoed."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return {"text": "Tool said: " + str(messages[-1]["content"])}
    user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    words = str(user).split()
    if words and words[0] == "cancel":
        return {"tool_calls": [{"name": "cancel", "arguments": {"order": words[1]}}]}
    if words and words[0] == "refund":
        return {"tool_calls": [{"name": "refund", "arguments": {"order": words[1], "amount": float(words[2])}}]}
    if words and words[0] in ("delivery", "size", "check", "human"):
        return {"tool_calls": [{"name": words[0], "arguments": {}}]}
    return {"text": f"You said {user}."}
