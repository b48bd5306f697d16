"""A turn's knowledge: the passages given to the model (`retrieve: auto`) and the sources its
reply cites (the Sources event; `cite: required` is enforced by engine/turn.py with these).

`retrieved` is the one place the per-turn passages are made into what the model is sent: a
system message after the route's memory, with each request of the route's loop, never kept
in the memory (like a correction or a nudge). A route's `context:` template may later take
its place; moving it means calling this from there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from chatrun import events as ev
from chatrun.definition.config import RouteConfig
from chatrun.engine import guardrails
from chatrun.knowledge import Hit, library_of, passages_text
from chatrun.messages import Message, SystemMessage

if TYPE_CHECKING:
    from chatrun.engine.context import TurnContext

RETRIEVED_HEADER = "Knowledge passages that may answer the user's last message:"


async def retrieved(t: TurnContext, route: RouteConfig, guard: guardrails.Guardrails | None = None) -> list[Message]:
    """With `retrieve: auto`: the passages that best match the user's message, as a system
    message for the model (and a Console note naming them, which transcripts can expect). They
    pass the `tool_result` guardrails (`guard`) as the same passages found by search_knowledge do."""
    knowledge = route.knowledge
    if knowledge is None or knowledge.retrieve != "auto" or not (t.user_message or "").strip():
        return []
    hits = await library_of(t.config).asearch(t.user_message or "", knowledge.sources, knowledge.top_k)
    refs = ", ".join(hit.ref for hit in hits) or "nothing"
    t.emit(ev.CONSOLE, f"route {route.name}: retrieved {refs}")
    text = passages_text(hits)
    if guard is not None and hits:
        text = await guard.check_tool_result("search_knowledge", text)
    return [SystemMessage(f"{RETRIEVED_HEADER}\n\n{text}")]


async def cited(t: TurnContext, route: RouteConfig, text: str | None, sent: Sequence[Message]) -> list[Hit]:
    """The passages of the route's sources that a reply cites (`[ref]`), each once, of those the
    model was given in the request it answered (`sent`: a tool's result, `retrieve: auto`'s
    passages): a ref it never read, even of a real passage, is a guess, not a citation (off the
    event loop: the first use of the index refreshes it)."""
    if route.knowledge is None or not text:
        return []
    hits = await asyncio.to_thread(library_of(t.config).cited, text, route.knowledge.sources)
    texts = [(m.role, getattr(m, "content", None)) for m in sent]
    read = "\n".join(text for role, text in texts if isinstance(text, str) and
                     (role == "tool" or text.startswith(RETRIEVED_HEADER)))
    return [hit for hit in hits if f"[{hit.ref}]" in read]


def send_sources(t: TurnContext, hits: list[Hit]) -> None:
    """The Sources event of a reply: each cited passage's title, ref, source and link, redacted
    by the route's `output` guardrails that redact (the user reads them beside the reply)."""
    if hits:
        library = library_of(t.config)
        sources = [library.source_entry(hit) for hit in hits]
        redacting = tuple(g for g in guardrails.Guardrails(t).on("output") if g.outcome == "redact") \
            if t.config.guarded else ()
        if redacting:
            sources = guardrails.map_strings(sources, lambda text: guardrails.judge(redacting, "output", text).text)
        t.emit(ev.SOURCES, {"sources": sources})
