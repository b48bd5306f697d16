"""What the inspector beside the chat shows: the route graph, the scope stack with each scope's
visible state, and the current route's memory exactly as the model will see it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chatrun.scopes import scope_view
from chatrun.tools import route_tool_specs

if TYPE_CHECKING:
    from chatrun.bot import Bot
    from chatrun.session import Session


def graph_data(bot: Bot) -> dict[str, Any]:
    """Routes and the tool actions that move between them, plus the mermaid text of the graph."""
    config = bot.config
    nodes = [
        {
            "name": name,
            "description": route.description,
            "default": route.default,
            "roles": list(route.roles),
            "tools": list(route.tools),
        }
        for name, route in config.routes.items()
    ]
    edges = []
    for name, route in config.routes.items():
        for tool_name in route.tools:
            tool = config.tools.get(tool_name)
            if tool is None:
                continue
            action = tool.action
            if action.push:
                edges.append({"from": name, "to": action.push, "kind": "push", "tool": tool_name})
            if action.route:
                edges.append({"from": name, "to": action.route, "kind": "route", "tool": tool_name})
            if action.pop:
                edges.append({"from": name, "to": None, "kind": "pop", "tool": tool_name})
    return {"bot": bot.name, "default": config.default_route, "nodes": nodes, "edges": edges, "mermaid": _mermaid(bot)}


def _mermaid(bot: Bot) -> str:
    graph = getattr(bot, "graph", None)
    try:
        return graph.render("mermaid") if graph is not None else ""
    except Exception:  # the graph module is another part; the inspector draws from `edges` anyway
        return ""


def session_data(session: Session) -> dict[str, Any]:
    """A session as the HTTP API reads it (no memories)."""
    return {
        "id": session.id,
        "bot": session.bot.name,
        "turn": session.turn,
        "route": session.route,
        "stack": session.stack,
        "scopeId": session.scope_id,
        "state": session.state,
        "visible": session.visible_state(),
        "scopes": scopes_data(session),
    }


def scopes_data(session: Session) -> list[dict[str, Any]]:
    out = []
    for i, scope in enumerate(session.scopes):
        out.append(
            {
                "id": scope.id,
                "route": scope.route,
                "local": scope.local,
                "shared": scope.shared,
                # What a route running in this scope reads as `scope`: ancestors' shared, own shared, own local.
                "visible": scope_view(session.scopes[: i + 1]),
                "memories": scope.memory_ids(),
            }
        )
    return out


def inspect_data(session: Session) -> dict[str, Any]:
    """Everything the inspector panel shows, refreshed after every turn."""
    config = session.bot.config
    route = session.route
    memory = session.memory()
    policy = config.route_memory(route)
    history = session.history
    return session_data(session) | {
        "last_turn": history[-1] if history else None,
        "graph": graph_data(session.bot),
        "memory": {
            "id": session.scopes[-1].memory_id(route),
            "policy": {"type": policy.type, "max_messages": policy.max_messages, "max_tokens": policy.max_tokens},
            "messages": [m.to_openai() for m in memory],
            "tools": route_tool_specs(config, route),
            "model": config.route_model(route).name,
        },
    }
