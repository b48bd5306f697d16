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

from chatrun.version import VERSION as __version__

# Where each public name lives. A name is imported on first use (PEP 562 `__getattr__`), so
# `import chatrun` -- and with it every `chatrun.*` module and `chatrun --help` -- costs only
# what it uses: the engine, jinja2, jsonschema, httpx and openai load when a program asks.
_LAZY: dict[str, str] = {
    "events": "chatrun.events",
    "Bot": "chatrun.engine.bot",
    "load_bot": "chatrun.engine.bot",
    "Session": "chatrun.engine.session",
    **dict.fromkeys(("Clock", "FixedClock", "SystemClock"), "chatrun.engine.clock"),
    **dict.fromkeys(
        ("AttachmentRefused", "BotError", "ChatrunError", "DecisionRefused", "Diagnostic", "ForbiddenRouteError", "FrameError",
         "HeldByAnother", "InvalidDecision", "KnowledgeUnavailable", "LeaseLost", "MessageTooLong", "ModelError", "ModelUnavailable", "NotPending", "RequestFailed", "SessionBudgetSpent", "SessionBusy", "SessionError", "SessionQuota", "StaleVersion", "ToolRefusal",
         "TurnFailed", "UnknownRouteError", "UserBudgetSpent"),
        "chatrun.errors"),
    "Event": "chatrun.events",
    **dict.fromkeys(("ChatMemory", "MessageWindowMemory", "TokenWindowMemory", "TurnOnlyMemory"), "chatrun.memory"),
    **dict.fromkeys(("AssistantMessage", "Message", "SystemMessage", "ToolCall", "ToolResultMessage", "UserMessage"),
                    "chatrun.messages"),
    **dict.fromkeys(("ChatModel", "ModelPool", "ModelRequest", "ModelResponse"), "chatrun.models"),
    "ScriptedModel": "chatrun.models.scripted",
    **dict.fromkeys(("Answer", "Approve", "Expire", "OperatorSay", "PendingItem", "Reject", "Release", "TakeOver"),
                    "chatrun.engine.pending"),
    "OpenAIModel": "chatrun.models.openai_model",  # the openai package: about half a second
    **dict.fromkeys(("SessionStore", "open_store"), "chatrun.store"),
    "InMemoryStore": "chatrun.store.memory",
    "SQLiteStore": "chatrun.store.sqlite",
    "ToolContext": "chatrun.toolkinds.handler",
    **dict.fromkeys(("load_transcript", "run_transcript"), "chatrun.transcripts"),
}

if _typing.TYPE_CHECKING:  # type checkers see every name; at run time __getattr__ imports it on first use
    from chatrun import events
    from chatrun.engine.bot import Bot, load_bot
    from chatrun.engine.clock import Clock, FixedClock, SystemClock
    from chatrun.engine.pending import (
        Answer,
        Approve,
        Expire,
        OperatorSay,
        PendingItem,
        Reject,
        Release,
        TakeOver,
    )
    from chatrun.engine.session import Session
    from chatrun.errors import (
        AttachmentRefused,
        BotError,
        ChatrunError,
        DecisionRefused,
        Diagnostic,
        ForbiddenRouteError,
        FrameError,
        HeldByAnother,
        InvalidDecision,
        KnowledgeUnavailable,
        LeaseLost,
        MessageTooLong,
        ModelError,
        ModelUnavailable,
        NotPending,
        RequestFailed,
        SessionBudgetSpent,
        SessionBusy,
        SessionError,
        SessionQuota,
        StaleVersion,
        ToolRefusal,
        TurnFailed,
        UnknownRouteError,
        UserBudgetSpent,
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
    from chatrun.models.openai_model import OpenAIModel
    from chatrun.models.scripted import ScriptedModel
    from chatrun.store import SessionStore, open_store
    from chatrun.store.memory import InMemoryStore
    from chatrun.store.sqlite import SQLiteStore
    from chatrun.toolkinds.handler import ToolContext
    from chatrun.transcripts import load_transcript, run_transcript


def _register_tool_kinds() -> None:
    # The definition stage reaches the tool kinds through its own table (definition/kinds.py),
    # which chatrun.toolkinds fills when imported. It cannot import that package (it lies
    # above), so it calls this the first time it needs the table: before any bot is built.
    import chatrun.toolkinds  # noqa: F401


def __getattr__(name: str) -> object:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'chatrun' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(module_name)
    value = module if module_name == f"chatrun.{name}" else getattr(module, name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


from chatrun.definition import kinds as _kinds  # noqa: E402  (after the names it may ask for)

_kinds.fill_with(_register_tool_kinds)

__all__ = [
    "Answer",
    "Approve",
    "AssistantMessage",
    "AttachmentRefused",
    "Bot",
    "BotError",
    "ChatMemory",
    "ChatModel",
    "ChatrunError",
    "Clock",
    "DecisionRefused",
    "Diagnostic",
    "Event",
    "Expire",
    "FixedClock",
    "ForbiddenRouteError",
    "FrameError",
    "HeldByAnother",
    "InMemoryStore",
    "InvalidDecision",
    "KnowledgeUnavailable",
    "LeaseLost",
    "Message",
    "MessageTooLong",
    "MessageWindowMemory",
    "ModelError",
    "ModelPool",
    "ModelRequest",
    "ModelResponse",
    "ModelUnavailable",
    "NotPending",
    "OpenAIModel",
    "OperatorSay",
    "PendingItem",
    "Reject",
    "Release",
    "RequestFailed",
    "SQLiteStore",
    "ScriptedModel",
    "Session",
    "SessionBudgetSpent",
    "SessionBusy",
    "SessionError",
    "SessionQuota",
    "SessionStore",
    "StaleVersion",
    "SystemClock",
    "SystemMessage",
    "TakeOver",
    "TokenWindowMemory",
    "ToolCall",
    "ToolContext",
    "ToolRefusal",
    "ToolResultMessage",
    "TurnFailed",
    "TurnOnlyMemory",
    "UnknownRouteError",
    "UserBudgetSpent",
    "UserMessage",
    "__version__",
    "events",
    "load_bot",
    "load_transcript",
    "open_store",
    "run_transcript",
]
