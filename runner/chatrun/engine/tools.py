"""Tool plumbing: OpenAI tool specs, argument checks, and Python handlers.

Everything here turns a bad tool call into a message for the model (`ToolRefusal`),
never a crash: the model reads what was wrong and can try again.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from chatrun.definition.config import BotConfig, ToolConfig
from chatrun.definition.handlers import HandlerResolver
from chatrun.errors import ToolRefusal


class Toolbox:
    """A bot's tools as the engine calls them: argument validators and Python handlers,
    each built once per bot and shared by its sessions."""

    def __init__(self, config: BotConfig):
        self.config = config
        self._handlers = HandlerResolver(config.root or ".", config.name)
        self._validators: dict[str, Draft202012Validator] = {}

    def argument_validator(self, tool: str) -> Draft202012Validator:
        """The validator of a tool's `parameters`."""
        validator = self._validators.get(tool)
        if validator is None:
            validator = self._validators[tool] = Draft202012Validator(self.config.tools[tool].parameters)
        return validator

    def handler(self, spec: str) -> Callable[..., Any]:
        """The function of a `module:function` handler spec."""
        return self._handlers.resolve(spec)


def tool_spec(tool: ToolConfig) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def route_tool_specs(config: BotConfig, route: str) -> list[dict[str, Any]]:
    return [tool_spec(config.tools[name]) for name in config.routes[route].tools if name in config.tools]


def parse_arguments(tool: ToolConfig, raw: str, validator: Draft202012Validator) -> dict[str, Any]:
    """The call's arguments as a dict, checked against the tool's `parameters`."""
    try:
        args = json.loads(raw) if raw and raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise ToolRefusal(
            f"Error: the arguments of {tool.name} are not valid JSON ({exc.msg} at character {exc.pos}). "
            "Call it again with a JSON object matching its parameters."
        ) from None
    if not isinstance(args, dict):
        raise ToolRefusal(f"Error: the arguments of {tool.name} must be a JSON object, not {type(args).__name__}.")
    problems = []
    for err in sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "arguments"
        problems.append(f"{where}: {err.message}")
    if problems:
        raise ToolRefusal(f"Error: invalid arguments for {tool.name}: " + "; ".join(problems) + ". Call it again with valid arguments.")
    return args


@dataclass
class ToolContext:
    """What a Python handler receives. Writes to `state`, `scope` and `turn` are kept
    only if the turn succeeds."""

    tool: str
    args: dict[str, Any]
    state: dict[str, Any]
    scope: Any  # chatrun.engine.scopes.ScopeView: the current scope's state, writable
    turn: dict[str, Any]
    route: str
    session_id: str
    _emit: Callable[[str, Any], None] = field(repr=False, default=lambda t, d: None)

    def emit(self, event_type: str, data: Any) -> None:
        """Send an event to the client now (Thinking, Console, Message, Object or a custom type)."""
        self._emit(event_type, data)


async def call_handler(func: Callable[..., Any], ctx: ToolContext) -> Any:
    result = func(ctx)
    if inspect.isawaitable(result):
        result = await result
    return result


def result_text(value: Any) -> str:
    """A handler's return value as the text of a tool result."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
