"""Tool plumbing: OpenAI tool specs, argument checks, and Python handlers.

Everything here turns a bad tool call into a message for the model (`ToolRefusal`),
never a crash: the model reads what was wrong and can try again.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from chatrun.config import BotConfig, ToolConfig
from chatrun.errors import ChatrunError


class ToolRefusal(Exception):
    """A tool call that cannot run; the message is the tool result the model reads."""


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
    scope: Any  # chatrun.scopes.ScopeView: the current scope's state, writable
    turn: dict[str, Any]
    route: str
    session_id: str
    _emit: Callable[[str, Any], None] = field(repr=False, default=lambda t, d: None)

    def emit(self, event_type: str, data: Any) -> None:
        """Send an event to the client now (Thinking, Console, Message, Object or a custom type)."""
        self._emit(event_type, data)


def handler_file(root: Path, module_name: str) -> Path:
    """The file of a handler module `a.b` in a bot directory: a/b.py or a/b/__init__.py."""
    rel = Path(*module_name.split("."))
    for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise ChatrunError(f"no module `{module_name}` in {root} (looked for {rel.with_suffix('.py')})")


class HandlerResolver:
    """Imports `module:function` handlers from a bot's directory, once per module."""

    def __init__(self, root: str, bot_name: str):
        self.root = Path(root)
        self.bot_name = bot_name
        self._modules: dict[str, Any] = {}

    def resolve(self, spec: str) -> Callable[..., Any]:
        module_name, _, func_name = spec.partition(":")
        if not module_name or not func_name:
            raise ChatrunError(f"handler {spec!r} must look like module:function")
        module = self._modules.get(module_name)
        if module is None:
            module = self._modules[module_name] = self._import(module_name)
        func = getattr(module, func_name, None)
        if not callable(func):
            raise ChatrunError(f"handler {spec!r}: {module_name} has no function {func_name!r}")
        return func

    def _import(self, module_name: str) -> Any:
        candidate = handler_file(self.root, module_name)
        # A private module name per bot, so two bots' travel_tools never collide in sys.modules.
        unique = f"_chatrun_bot_{abs(hash(str(self.root)))}_{module_name.replace('.', '_')}"
        spec = importlib.util.spec_from_file_location(unique, candidate)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[unique] = module
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as exc:
            del sys.modules[unique]
            raise ChatrunError(f"handler module {candidate} failed to import: {exc!r}") from exc
        return module


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
