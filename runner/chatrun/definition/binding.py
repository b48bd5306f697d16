"""Load-time checks of bound arguments (`bind:` of a tool; the engine side is engine/binding.py).

Each bound name must be an argument of the tool — one its `parameters` declare (a handler,
`http:` or action-only tool), one its OpenAPI operation takes (`openapi:`), or, for an `mcp:`
tool that takes the server's schema, one the server lists (checked by `chatrun validate
--connect`, toolkinds/mcp.py) — and each template must compile and read what exists.
"""

from __future__ import annotations

from typing import Any

from chatrun.definition.config import ToolConfig
from chatrun.definition.kinds import Checks
from chatrun.definition.sources import suggest


def check_binding(checks: Checks, tool: ToolConfig, raw: dict[str, Any] | None, routes: list[str]) -> None:
    """The problems of a tool's `bind:` (raw: the tool's YAML mapping, None when unknown)."""
    if not tool.bind:
        return
    raw = raw or {}
    base = ("tools", tool.name, "bind")
    server_schema = "mcp" in raw and "parameters" not in raw
    properties = tool.parameters.get("properties")
    declared = list(properties) if isinstance(properties, dict) else []
    for name, template in tool.bind.items():
        if isinstance(template, str):
            checks.template(template, f"`bind {name}` of tool `{tool.name}`", (*base, name), tool, routes=routes)
        if server_schema or name in declared:
            continue
        if "openapi" in raw:
            problem = (f"its OpenAPI operation takes no argument `{name}`{suggest(name, declared)} "
                       f"(it takes: {', '.join(declared) or 'none'})")
        else:
            problem = (f"its `parameters` declare no property `{name}`{suggest(name, declared)} (a bound argument "
                       "is declared in `parameters` like any other; the model is not offered it)")
        checks.add("error", f"tool `{tool.name}` binds `{name}`, but {problem}", *base, name)
