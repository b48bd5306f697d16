"""Events a turn sends to the client, named as on the Quarkus Chat Scopes wire."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from typing import Any

MESSAGE = "Message"  # text for the user
OBJECT = "Object"  # structured data for the user
THINKING = "Thinking"  # progress note while the turn runs
CONSOLE = "Console"  # developer-facing output (a browser console, the REPL's dim lines)
ERROR = "Error"  # the turn (or part of it) failed; data is a message for the user
FEEDBACK = "Feedback"  # a user's rating of a reply: a backend event for the bot's sinks (Session.rate)
GUARDRAIL = "Guardrail"  # a guardrail matched (engine/guardrails.py): for the operators unless `events:` says otherwise
STREAM = "Stream"  # a chunk of the model's reply while it streams
ROUTE_CHANGED = "RouteChanged"  # chatrun extension: data = {"route": str, "stack": [str, ...]}
CHOICES = "Choices"  # chatrun extension: choices offered to the user; data = {"choices": [{"label", "value"}]}
ENDED = "ConversationEnded"  # chatrun extension: an `end` action ended the conversation; data = {"route", "tool"}
# Humans in the loop (chatrun extension; engine/pending.py, docs/format.md "Humans in the loop"):
PENDING = "Pending"  # an item waits: data = PendingItem.public() (a backend's copy adds "token")
RESOLVED = "Resolved"  # an item was resolved: data = {"id", "kind", "outcome", "by", "args"?, "answer"?, "reason"?}
OUTCOME = "Outcome"  # a conversation's outcome was recorded (engine/outcomes.py), for the backend: {"name", "turn", "route", "at"}
# What a committed turn's model calls used (and the killed attempts its commit counted), for a
# billing sink that lists it (docs/observability.md "Usage for billing"): queued in the turn's outbox only.
USAGE = "Usage"
USER_MESSAGE = "UserMessage"  # during a takeover, the user's message for the operators: data = {"text", "data", "attachments"?}
# The knowledge passages a reply cites (docs/knowledge.md): data = {"sources": [{"title", "ref", "source", "url"?}]}
SOURCES = "Sources"

# What a failed turn's Error event says to the user. The author's detail (the file and line,
# the exception) is in the event's meta["detail"], the history, the log: never in the text.
TURN_FAILED_TEXT = "Sorry, something went wrong and your last message could not be handled. Nothing of it was kept; please try again."
MODEL_FAILED_TEXT = "Sorry, the assistant cannot answer right now. Nothing of your last message was kept; please try again."

BUILTIN_TYPES = (MESSAGE, OBJECT, THINKING, CONSOLE, ERROR, STREAM, ROUTE_CHANGED, CHOICES, ENDED, PENDING, RESOLVED,
                 USER_MESSAGE, SOURCES)

# Who an event is for. The user's clients (the WebSocket, HTTP, /v1, the page, the REPL's
# conversation) get only USER events; OPERATORS events are for the people who watch or take
# over conversations; BACKEND events go to the bot's declared sinks (webhooks), never to a chat.
USER = "user"
OPERATORS = "operators"
BACKEND = "backend"
AUDIENCES = (USER, OPERATORS, BACKEND)
# The engine's own parties, by the same names in an item's `by:`: the session's user, and whoever
# holds a backend item's token. The engine says who they are; no principal is given them as a
# role (the --auth file refuses them; engine/pending.py granted_roles ignores them).
ENGINE_AUDIENCES = (USER, BACKEND)


@dataclass
class Event:
    """One event of a turn: its type, its data, and the turn (1-based) it belongs to."""

    type: str
    data: Any
    turn: int = 0
    meta: dict = field(default_factory=dict)
    # True for an Error chatrun itself sends (a failed turn, a refused action), not the bot: on the
    # WebSocket these are the "Error details" extension, which a Quarkus client never gets
    # (the Quarkus runtime never sends Error). Not part of to_dict(): the history is unchanged.
    runtime: bool = field(default=False, compare=False)
    audience: str = USER  # USER, OPERATORS or BACKEND (AUDIENCES): who may receive it
    # True for a Stream chunk of a route with `stream_to_quarkus: true`: Quarkus-dialect chats get
    # its chunks (as from a route returning Multi<String>); of any other route they get the
    # Message that follows. Not part of to_dict(), like `runtime`.
    multi: bool = field(default=False, compare=False)

    def to_dict(self) -> dict:
        out = {"type": self.type, "data": self.data, "turn": self.turn}
        if self.meta:
            out["meta"] = self.meta
        if self.audience != USER:  # the history of a bot without audiences reads as before
            out["audience"] = self.audience
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Event:
        return cls(type=d["type"], data=d.get("data"), turn=d.get("turn", 0), meta=d.get("meta") or {},
                   audience=d.get("audience") or USER)

    @property
    def for_user(self) -> bool:
        """Whether the user's clients may receive it (the other audiences never reach a chat)."""
        return self.audience == USER


def plain(value: object) -> Any:
    """Event data as plain JSON values, once, when the event is made: every client (WebSocket,
    SSE, the history, transcripts) then sees the same shape. Sets and tuples become lists,
    objects with to_dict() their dict, NaN/Infinity and anything else their str()."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return json.loads(_PLAIN_JSON.encode(value), parse_constant=str)


def copy_plain(value: Any) -> Any:
    """A deep copy of plain data (what JSON holds: dicts, lists, text, numbers) at a fraction of
    copy.deepcopy's cost (a turn's checkpoint copies the state and scopes every turn); any other
    value is deep-copied."""
    kind = type(value)
    if kind is dict:
        return {k: copy_plain(v) for k, v in value.items()}
    if kind is list:
        return [copy_plain(v) for v in value]
    if value is None or kind is str or kind is int or kind is float or kind is bool:
        return value
    return copy.deepcopy(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return str(value)


# One encoder (json.dumps with options makes a new one per call, and events are made every turn).
_PLAIN_JSON = json.JSONEncoder(default=_jsonable, ensure_ascii=False)
