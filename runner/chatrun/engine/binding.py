"""Bound arguments (`bind:` of a tool): arguments the bot fills in, which the model never sees.

A tool's `bind:` maps argument names to templates over the state, the principal, the session
id and the clock. Whatever the tool's kind (handler, http, openapi, mcp), one path applies:

- the model is offered the tool's parameters without the bound ones (`offered_parameters`);
- a bound name the model sends anyway is dropped (the tool result says so: `ignored_note`), and
  so is a name the tool does not take at all (`undeclared_note`; docs/tools.md);
- the bound values are rendered and put into the arguments before they are validated against
  the tool's whole schema, so the kind's call, a transcript's mocks and `--record` all see
  exactly what is sent (`bind_arguments`);
- a required bound argument that renders to nothing fails the call, naming the tool and the
  argument: an empty value is never sent in its place.

Why it matters (docs/security.md): a "list my tickets" tool bound to `principal.email` lets the
model choose nothing about whose tickets it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chatrun.definition.config import ToolConfig
from chatrun.definition.templates import is_nothing

Render = Callable[[Any, str], Any]  # (template, what) -> the typed value, seeing `args` = the model's


@dataclass
class Unbound(Exception):
    """A required bound argument rendered to nothing: the call must not run."""

    tool: str
    name: str
    template: Any

    def __str__(self) -> str:
        return (f"tool {self.tool}: its bound argument `{self.name}` rendered to nothing "
                f"(from {self.template!r}); the call was not made")


def offered_parameters(tool: ToolConfig) -> dict[str, Any]:
    """The tool's parameters as the model is offered them: the bound arguments left out."""
    parameters = tool.parameters
    if not tool.bind:
        return parameters
    offered = dict(parameters)
    properties = parameters.get("properties")
    if isinstance(properties, dict):
        offered["properties"] = {k: v for k, v in properties.items() if k not in tool.bind}
    required = parameters.get("required")
    if isinstance(required, list):
        offered["required"] = [name for name in required if name not in tool.bind]
    return offered


def bind_arguments(tool: ToolConfig, sent: dict[str, Any], render: Render) -> tuple[dict[str, Any], list[str]]:
    """(the call's arguments: the model's without the bound names, with the bound values; the
    bound names the model sent, which were ignored). Raises Unbound for a required bound
    argument that renders to none, undefined or blank text; an optional one is left out."""
    if not tool.bind:
        return sent, []
    ignored = [name for name in tool.bind if name in sent]
    args = {k: v for k, v in sent.items() if k not in tool.bind}
    required = tool.parameters.get("required")
    required = required if isinstance(required, list) else []
    bound: dict[str, Any] = {}
    for name, template in tool.bind.items():
        value = render(template, f"bind {name}")
        if is_nothing(value) or (isinstance(value, str) and not value.strip()):
            if name in required:
                raise Unbound(tool.name, name, template)
            continue
        bound[name] = value
    return {**args, **bound}, ignored


def ignored_note(names: list[str]) -> str:
    """What the model reads after the result when it sent arguments the bot sets."""
    listed = ", ".join(f"`{name}`" for name in names)
    which = "is" if len(names) == 1 else "are"
    return (f"\n\nNote: {listed} {which} set by the bot, not by you; the value you sent was ignored. "
            "Do not send it.")


def undeclared_note(tool: str, names: list[str], takes: list[str]) -> str:
    """What the model reads after the result when it sent arguments the tool does not take
    (dropped before the call ran: engine/call.py)."""
    listed = ", ".join(f"`{name}`" for name in names)
    if not takes:
        return f"\n\nNote: {tool} takes no arguments; what you sent ({listed}) was ignored. Do not send it."
    which, values = ("is not an argument", "value you sent was") if len(names) == 1 else \
        ("are not arguments", "values you sent were")
    return (f"\n\nNote: {listed} {which} of {tool} (it takes {', '.join(f'`{n}`' for n in takes)}); "
            f"the {values} ignored.")


def bound_problem(tool: ToolConfig, path: list[Any]) -> str | None:
    """The bound argument a validation error is about (its path starts with it), or None."""
    return str(path[0]) if path and str(path[0]) in tool.bind else None
