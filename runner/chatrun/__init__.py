"""chatrun: a declarative LLM chatbot runner.

A bot is YAML: routes (prompt templates, tools, memory policy, scope behaviour)
and tools that may act on the conversation (push, pop, route, set state, emit).

    >>> import chatrun
    >>> bot = chatrun.load_bot("bots/hello")
    >>> session = bot.session()
    >>> events = session.chat("hi")

Everything a program using chatrun needs is importable from here; the submodules are
internals and may change between releases (tests/test_exported_members.py holds the list).
"""

import typing as _typing

from chatrun import events
from chatrun.engine.bot import Bot, load_bot
from chatrun.engine.clock import Clock, FixedClock, SystemClock
from chatrun.engine.session import Session
from chatrun.errors import (
    BotError,
    ChatrunError,
    Diagnostic,
    ForbiddenRouteError,
    FrameError,
    LeaseLost,
    ModelError,
    RequestFailed,
    SessionBusy,
    SessionError,
    StaleVersion,
    ToolRefusal,
    TurnFailed,
    UnknownRouteError,
)
from chatrun.events import Event
from chatrun.memory import ChatMemory, MessageWindowMemory, TokenWindowMemory, TurnOnlyMemory
from chatrun.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.models import ChatModel, ModelPool, ModelRequest, ModelResponse
from chatrun.models.scripted import ScriptedModel
from chatrun.store import SessionStore, open_store
from chatrun.store.memory import InMemoryStore
from chatrun.store.sqlite import SQLiteStore
from chatrun.toolkinds.handler import ToolContext
from chatrun.transcripts import load_transcript, run_transcript
from chatrun.version import VERSION as __version__

if _typing.TYPE_CHECKING:  # type checkers see the class; at run time __getattr__ imports it on first use
    from chatrun.models.openai_model import OpenAIModel


def __getattr__(name: str) -> object:
    # OpenAIModel imports the openai package (about half a second): only when asked for.
    if name == "OpenAIModel":
        from chatrun.models.openai_model import OpenAIModel

        return OpenAIModel
    raise AttributeError(f"module 'chatrun' has no attribute {name!r}")


__all__ = [
    "AssistantMessage",
    "Bot",
    "BotError",
    "ChatMemory",
    "ChatModel",
    "ChatrunError",
    "Clock",
    "Diagnostic",
    "Event",
    "FixedClock",
    "ForbiddenRouteError",
    "FrameError",
    "InMemoryStore",
    "LeaseLost",
    "Message",
    "MessageWindowMemory",
    "ModelError",
    "ModelPool",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "RequestFailed",
    "SQLiteStore",
    "ScriptedModel",
    "Session",
    "SessionBusy",
    "SessionError",
    "SessionStore",
    "StaleVersion",
    "SystemClock",
    "SystemMessage",
    "TokenWindowMemory",
    "ToolCall",
    "ToolContext",
    "ToolRefusal",
    "ToolResultMessage",
    "TurnFailed",
    "TurnOnlyMemory",
    "UnknownRouteError",
    "UserMessage",
    "__version__",
    "events",
    "load_bot",
    "load_transcript",
    "open_store",
    "run_transcript",
]
