"""The summary a bot keeps of a user when a conversation ends (`user_memory.summary:`; docs/memory.md,
"A summary at conversation end").

When the turn that ends the conversation has run — a tool's `end` action ended it (`when: end`),
or its outcome was recorded (`when: outcome`, the sweeper's `silent_for` turn included) — the
model is asked once, through the bot's endpoint (the route's model, its `fallback:` too), to
write a note of the conversation, given the note kept before. The note is kept as the fact
`summary` (`user_memory.summary` in templates), saved like a `remember:` fact: with the turn's
commit, so a failed, stopped or stale turn writes nothing and its retry writes it once.

Once per conversation: it is written on the turn where the first of its `when` came to hold, and
neither `ended` nor a recorded outcome can come to hold again (an ended conversation takes no
turn; an outcome is recorded once). A failing call is skipped: logged at WARNING, noted in the
turn's history (`summaries`), and the note kept before stays as it was; the turn goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from chatrun.definition.config import SUMMARY_FACT, UserSummaryConfig
from chatrun.engine import tracing
from chatrun.engine.turn import summary_answer
from chatrun.messages import AssistantMessage, Message, SummaryMessage, SystemMessage, UserMessage
from chatrun.models.base import ModelRequest

if TYPE_CHECKING:
    from chatrun.engine.conversation import Checkpoint, Conversation
    from chatrun.engine.turn import Turn

log = logging.getLogger("chatrun.engine")

USER_SUMMARY_PROMPT = (
    "You keep a short note of what an assistant should remember about a user for their next "
    "conversations. You are given the note kept so far (if any) and the conversation that has "
    "just ended. Write the new note: the note so far updated with what this conversation adds — "
    "who the user is, what they prefer, what they asked for, what was arranged and what is still "
    "open — in at most 120 words, in the conversation's language. Answer with the note only."
)

MaySummarize = Callable[[], bool]  # False: no call now (a replayed transcript with no `model:` answer left)


def over(summary: UserSummaryConfig, ended: Mapping[str, Any] | None, outcome: Mapping[str, Any] | None) -> bool:
    """Whether the conversation has ended as `summary.when` means it."""
    recorded = isinstance((outcome or {}).get("name"), str)  # an armed silence is not an outcome
    return ("end" in summary.when and bool(ended)) or ("outcome" in summary.when and recorded)


async def write(turn: Turn, before: Checkpoint, may_summarize: MaySummarize) -> None:
    """After the turn (its outcome decided): the summary, if this turn ended the conversation."""
    c = turn.t.c
    memory = c.config.user_memory
    summary = memory.summary if memory is not None else None
    if summary is None or not over(summary, c.ended, c.outcome) or over(summary, before.ended, before.outcome):
        return
    if c.user_memory_owner() is None:
        log.info("session %s: no summary is kept at the conversation's end: no one is signed in", c.id)
        return
    if not may_summarize():
        log.info("session %s: no summary written: the transcript scripts no model answer for it", c.id)
        return
    try:
        text = await _call(turn, summary, before)
    except Exception as exc:  # the summary never fails the turn, nor loses what was kept before
        reason = turn.kept_text(f"{type(exc).__name__}: {exc}")  # it may quote what was said
        log.warning("session %s: writing the user's summary at the conversation's end failed (skipped; the "
                    "summary kept before stays): %s", c.id, reason)
        turn.summaries.append({"user_memory": SUMMARY_FACT, "failed": reason})
        return
    c.remembered = {**c.remembered, SUMMARY_FACT: text}
    c.user_memory = {**c.user_memory, SUMMARY_FACT: text}
    turn.summaries.append({"user_memory": SUMMARY_FACT, "written": len(text)})


async def _call(turn: Turn, summary: UserSummaryConfig, before: Checkpoint) -> str:
    """One call on the current route's model, accounted like any; raises when it answers no text."""
    c = turn.t.c
    route = c.scope.route
    instructions = (turn.t.render_template(summary.prompt, "user_memory.summary.prompt", summary.where)
                    if summary.prompt else USER_SUMMARY_PROMPT)
    config = c.config.route_model(route)
    request = ModelRequest([SystemMessage(instructions), UserMessage(conversation_text(c, before))], [], config,
                           f"{route} (user summary)")
    # After the turn's span: this span redacts its failure's text itself, as the turn's would.
    with tracing.chat_span(config.provider, config.name, request.route, config.temperature,
                           turn.kept_text) as span:
        response, used, switches = await turn.call_model(request, None)
        tracing.record_answered_by(span, used.name, config.name)
    turn.account(request.route, used.name, response.usage, c.config.prices.get(used.name), request.messages,
                 AssistantMessage(response.text), used.provider, switches=switches)
    return summary_answer(response, used, f"route {route}'s model")


def conversation_text(c: Conversation, before: Checkpoint) -> str:
    """The call's input: the note kept so far, then the conversation's messages as a transcript
    (what the user and the assistant said, and the running summaries of longer memories)."""
    lines = []
    kept = c.user_memory.get(SUMMARY_FACT)
    if kept:
        lines += ["Note kept so far:", str(kept), ""]
    lines.append("The conversation:")
    for messages in c.memories_since(before):
        lines += [line for m in messages if (line := _line(m))]
    return "\n".join(lines)


def _line(message: Message) -> str:
    if isinstance(message, SummaryMessage):
        return f"(earlier: {message.content})"
    if isinstance(message, UserMessage):
        return f"user: {message.content}" if message.content.strip() else ""
    if isinstance(message, AssistantMessage):
        return f"assistant: {message.content}" if (message.content or "").strip() else ""
    return ""
