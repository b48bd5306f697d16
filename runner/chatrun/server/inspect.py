"""What the inspector beside the chat shows: the route graph, the scope stack with each scope's
visible state, and the current route's memory exactly as the model will see it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chatrun.engine.scopes import merged_scope
from chatrun.engine.tools import route_tool_specs

if TYPE_CHECKING:
    from chatrun.engine.bot import Bot
    from chatrun.engine.session import Session


def graph_data(bot: Bot) -> dict[str, Any]:
    """Routes and the tool actions that move between them (from the bot's route graph), plus its mermaid text."""
    graph = bot.graph
    nodes = [
        {"name": n.name, "description": n.description, "default": n.default, "roles": list(n.roles), "tools": list(n.tools)}
        for n in graph.nodes.values()
    ]
    # `end` edges lead out of the graph: the page's drawing has no node for them (the mermaid text does).
    edges = [{"from": e.source, "to": e.target, "kind": e.kind, "tool": e.tool, "condition": e.condition}
             for e in graph.edges if e.kind != "end"]
    return {"bot": bot.name, "default": graph.default, "nodes": nodes, "edges": edges, "mermaid": graph.render("mermaid")}


def session_data(session: Session) -> dict[str, Any]:
    """A session as the HTTP API reads it (no memories)."""
    return {
        "id": session.id,
        "bot": session.bot.name,
        "turn": session.turn_count,
        "route": session.route,
        "stack": session.stack,
        "scopeId": session.scope_id,
        "state": session.state,
        "visible": session.visible_state(),
        "scopes": scopes_data(session),
        "usage": session.usage,  # every model call of the session, summed (wire.schema.json#/$defs/Usage)
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
                "visible": merged_scope(session.scopes[: i + 1]),
                "memories": scope.memory_ids(),
            }
        )
    return out


def inspect_data(session: Session) -> dict[str, Any]:
    """Everything the inspector panel shows, refreshed after every turn."""
    config = session.bot.config
    route = session.route
    memory = session.preview_messages()  # exactly as the model will be sent it next
    if route not in config.routes:  # gone in a reload: the session must be reset
        route = config.default_route
    policy = config.route_memory(route)
    return session_data(session) | {
        "last_turn": session.last_turn,
        # The bot's files were edited into an invalid bot (serve --reload): the page shows a banner.
        "reload_problems": [d.to_dict() for d in session.bot.reload_problems],
        "graph": graph_data(session.bot),
        "memory": {
            "id": session.scopes[-1].memory_id(route),
            "policy": {"type": policy.type, "max_messages": policy.max_messages, "max_tokens": policy.max_tokens},
            "messages": [m.to_openai() for m in memory],
            "tools": route_tool_specs(config, route),
            "model": config.route_model(route).name,
        },
    }
