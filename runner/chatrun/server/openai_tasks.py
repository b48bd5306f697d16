"""A chat front end's background tasks, recognised on /v1/chat/completions (docs/openai-api.md,
"Front-end tasks").

Open WebUI asks the chat's model for a title, tags, follow-up suggestions, search queries, ...
of every chat: each request one user message, a prompt starting `### Task:` that quotes the chat
history and asks for a JSON object. Run as turns, each would be a new session running the bot
(its routes, tools and model) for nothing the user sees as the bot. By default they are
answered at once with a fixed, valid answer and nothing runs; `--front-end-tasks run` runs them
as turns, `refuse` answers 400 `front_end_task`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

ANSWER = "answer"  # a fixed answer, nothing run (the default)
RUN = "run"  # a turn like any other
REFUSE = "refuse"  # 400 front_end_task
CHOICES = (ANSWER, RUN, REFUSE)

TASK_MARKER = "### Task:"
# The JSON key each of Open WebUI's task prompts asks for, and its fixed answer's value. The
# title is made from the chat's first user message (below); the lists are left empty, which
# Open WebUI shows as no tags, no suggestions, no search.
ANSWERS: dict[str, Any] = {"title": None, "tags": [], "follow_ups": [], "queries": []}
TITLE_WORDS = 5
_HISTORY = re.compile(r"<chat_history>(.*?)</chat_history>", re.S)
_USER_LINE = re.compile(r"^\s*USER:\s*(.+)$", re.M)


def task_of(earlier: Sequence[tuple[str, str]], text: str) -> str | None:
    """The JSON key a front end's task request asks for ('' for an unknown task), or None
    for a chat message. A task is one user message starting with `### Task:`."""
    if earlier or not text.lstrip().startswith(TASK_MARKER):
        return None
    found = [(text.find(f'"{key}"'), key) for key in ANSWERS if f'"{key}"' in text]
    return min(found)[1] if found else ""


def fixed_answer(task: str, text: str) -> str:
    """The reply to a task request: the JSON object it asks for, with a cheap value."""
    if task == "title":
        return json.dumps({"title": _title(text)}, ensure_ascii=False)
    if task in ANSWERS:
        return json.dumps({task: ANSWERS[task]}, ensure_ascii=False)
    return "{}"


def _title(text: str) -> str:
    """The first words of the chat's first user message, as the prompt quotes the history."""
    history = _HISTORY.search(text)
    first = _USER_LINE.search(history.group(1)) if history else None
    words = first.group(1).split() if first else []
    return " ".join(words[:TITLE_WORDS]) + (" …" if len(words) > TITLE_WORDS else "") if words else "New chat"
