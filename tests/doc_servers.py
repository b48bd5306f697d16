"""Servers the docs' worked examples talk to (tests/test_docs_examples.py, a `given:` line):
the repository's bots served by the real app on a free port, with tokens for a customer, a
supervisor and an operator, their model a local fake OpenAI server that answers like a model
would for the example's messages."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

TOKENS = """
tokens:
  ana-token-123: {principal: ana}
  sam-token-123: {principal: sam, roles: [supervisor]}
  olga-token-12: {principal: olga, roles: [operators]}
"""
REPO = Path(__file__).resolve().parent.parent


def desk_model(body: dict[str, Any]) -> dict[str, Any]:
    """A refund or a person when asked (an order number and an amount; "a person"), the tool's
    result read back, anything else answered briefly. A bot's context (the system message after
    the memory, docs/models.md "Stable prompts") is not what it answers."""
    messages = [m for m in body["messages"] if m["role"] != "system"]
    if messages[-1]["role"] == "tool":
        result = str(messages[-1]["content"])
        return {"text": result if result.startswith("Refunded") else "A supervisor has to approve this refund; "
                "you will hear from us here."}
    user = str(next(m["content"] for m in reversed(messages) if m["role"] == "user"))
    order, amount = re.search(r"\b[A-Z]\d{3,}\b", user), re.search(r"\b(\d+(?:\.\d+)?) EUR\b", user)
    if order and amount and "refund" in user.lower():
        return {"tool_calls": [{"name": "refund", "arguments": {"order": order.group(), "amount": float(amount.group(1))}}]}
    if "person" in user.lower():
        return {"tool_calls": [{"name": "human", "arguments": {"topic": "billing"}}]}
    return {"text": "Glad to help. Anything else?"}


def serve(*bots: str) -> str:
    """Serve bots/NAME for each name until the process ends; the base URL."""
    import chatrun
    from chatrun.server import create_app
    from chatrun.testing.fake_openai import FakeOpenAI
    from server_support import ThreadServer

    model = FakeOpenAI().__enter__()
    model.responder = desk_model
    os.environ["OPENAI_BASE_URL"] = model.base_url
    folder = Path(tempfile.mkdtemp())
    (folder / "tokens.yaml").write_text(TOKENS)
    app = create_app([chatrun.load_bot(REPO / "bots" / name / "bot.yaml") for name in bots],
                     f"sqlite:///{folder / 'chat.db'}", auth=str(folder / "tokens.yaml"))
    return ThreadServer(app).__enter__().url


def serve_site() -> str:
    """A small help site (tests/site_support.py: pages, a sitemap index, robots.txt) until the
    process ends; its base URL."""
    from site_support import Site

    return Site().__enter__().url
