"""What the inspector beside the chat shows: the route graph, the scope stack with each scope's
visible state, the current route's memory exactly as the model will see it (a `summary`
memory's running summary marked as such), and what the model calls cost, per turn and in all."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from chatrun.definition.page_texts import page_data, page_texts
from chatrun.definition.templates import display_text
from chatrun.engine.scopes import merged_scope
from chatrun.engine.tools import route_tool_specs
from chatrun.memory.tokens import counter_label
from chatrun.messages import ContextMessage, Message, SummaryMessage, UserMessage
from chatrun.store.record import turns_of

if TYPE_CHECKING:
    from chatrun.definition.config import RouteConfig
    from chatrun.engine.bot import Bot
    from chatrun.engine.pending import PendingItem
    from chatrun.engine.session import Session


def graph_data(bot: Bot, locale: str | None = None) -> dict[str, Any]:
    """Routes and the tool actions that move between them (from the bot's route graph), plus its
    mermaid text; each route's `title:` in `locale` (docs/i18n.md)."""
    graph = bot.graph
    routes = bot.config.routes
    catalogs = bot.config.catalogs
    nodes = [
        {"name": n.name, "title": display_text(routes[n.name].title, catalogs, locale) or None,
         "description": n.description, "default": n.default,
         "roles": list(n.roles), "tools": list(n.tools), "output": output_schema(routes[n.name]),
         "attachments": attachment_limits(routes[n.name])}
        for n in graph.nodes.values()
    ]
    # `end` edges lead out of the graph: the page's drawing has no node for them (the mermaid text does).
    edges = [{"from": e.source, "to": e.target, "kind": e.kind, "tool": e.tool, "condition": e.condition}
             for e in graph.edges if e.kind != "end"]
    return {"bot": bot.name, "default": graph.default, "nodes": nodes, "edges": edges, "mermaid": graph.render("mermaid")}


def attachment_limits(route: RouteConfig) -> dict[str, Any] | None:
    """A route's `attachments:` (None: it takes no files): the page checks a file before it
    uploads it, and hides its attach button where none is taken."""
    policy = route.attachments
    if policy is None:
        return None
    return {"kinds": list(policy.kinds), "max_bytes": policy.max_bytes, "max_count": policy.max_count}


def output_schema(route: RouteConfig) -> dict[str, Any] | None:
    """A route's `output:` schema: the page labels an Object event's fields with its titles."""
    return route.output.schema if route.output is not None else None


def model_problem(session: Session) -> str | None:
    """Why no model can answer on the current route (no credentials, no endpoint), else None:
    the page shows it as a banner rather than only the user's "Sorry…"."""
    routes = session.bot.config.routes
    config = session.bot.config.route_model(session.route if session.route in routes else session.bot.config.default_route)
    if config.provider != "openai":
        return None
    from chatrun.models.openai_model import credentials_problem

    return credentials_problem(config)


def session_data(session: Session, roles: Iterable[str] | None = None) -> dict[str, Any]:
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
        "ended": session.ended,  # {"route", "tool"} once an `end` action ended the conversation, else None
        # The version of the bot it runs (docs/versions.md): the content hash, and with the human name.
        "botVersion": session.bot_version,
        "botVersionLabel": session.bot.config.version_label,
        "locale": session.locale,  # the locale it speaks (docs/i18n.md); null for a bot without `locales:`
    } | pending_data(session, roles)


def pending_data(session: Session, roles: Iterable[str] | None = None) -> dict[str, Any]:
    """The session's open items as a Pending event shows them (no backend token), and its takeover.
    `roles`: the viewer's; an item none of them decides (nor `operators`) is shown as its user
    reads it (`for_user`: what they are told, never the deciders' question). None: as the
    deciders see them (the inspector, a pending list)."""
    texts = page_texts(session.bot.config.catalogs, session.locale)
    deciders = None if roles is None else set(roles)

    def shown(item: PendingItem) -> dict[str, Any]:
        if deciders is None or deciders & ({*item.by, "operators"} - {"user"}):
            return item.public()
        return item.for_user(texts)

    return {"pending": [shown(item) for item in session.pending], "taken_over": session.taken_over}


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


def inspect_data(session: Session, history: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything the inspector panel shows, refreshed after every turn (`history`: the
    session's stored history)."""
    config = session.bot.config
    route = session.route
    memory = session.preview_messages()  # exactly as the model will be sent it next
    policy = config.route_memory(route)
    return session_data(session) | {
        "last_turn": turns[-1] if (turns := turns_of(history)) else None,  # (a rating, a notice: no turn)
        "moved": session.moved.to_dict() if session.moved is not None else None,  # committed with the next turn
        "turns_usage": turns_usage(history),
        # The bot's files were edited into an invalid bot (serve --reload): the page shows a banner.
        "reload_problems": [d.to_dict() for d in session.bot.reload_problems],
        "model_problem": model_problem(session),
        "graph": graph_data(session.bot, session.locale),
        # The page's own texts (Send, the notices) in the session's locale, its `lang` and `dir`.
        "page": page_data(config.catalogs, session.locale),
        "description": display_text(config.description, config.catalogs, session.locale),
        "memory": {
            "id": session.scopes[-1].memory_id(route),
            "policy": {"type": policy.type, "max_messages": policy.max_messages, "max_tokens": policy.max_tokens,
                       "keep_messages": policy.keep_messages if policy.type == "summary" else None,
                       "clear_tool_results": policy.clear_tool_results},
            **memory_tokens(session, memory),
            "tools": route_tool_specs(config, route),
            "model": config.route_model(route).name,
        },
    }


def memory_tokens(session: Session, memory: list[Message]) -> dict[str, Any]:
    """The messages exactly as the model is sent them, and beside them their token counts:
    `tokens` = {messages (one count each), total, max_tokens (a token window's, else None),
    counter ("o200k_base (exact)" or "estimate")}: what the window counts."""
    window = session.token_window()
    counter = window[0] if window else session.token_counter()
    counts = [counter(m) for m in memory]
    return {"messages": [memory_message(m) for m in memory],
            "tokens": {"messages": counts, "total": sum(counts), "max_tokens": window[1] if window else None,
                       "counter": counter_label(counter)}}


def memory_message(message: Message) -> dict[str, Any]:
    """A message as the model is sent it; the running summary of a `summary` memory is sent as
    a user message under a heading, so it says what it is (`summary`: its text alone)."""
    sent = message.to_openai()
    if isinstance(message, UserMessage) and message.attachments:  # references, never the bytes
        sent["attachments"] = [a.to_dict() for a in message.attachments]
    if isinstance(message, SummaryMessage):
        sent["summary"] = message.content
    if isinstance(message, ContextMessage):  # the route's `context:`, rendered for each call, never kept
        sent["context"] = True
    return sent


# The inspector lists the usage of this many turns, the latest; the session's total counts all.
USAGE_TURNS = 50


def turns_usage(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each recorded turn's usage (failed attempts too: their calls were paid for), the latest
    USAGE_TURNS, oldest first: {turn, ok, usage (None: no model call), summaries}. A rating or a
    notice is no turn: not listed."""
    return [{"turn": entry.get("turn"), "ok": entry.get("ok", True), "usage": _without_calls(entry.get("usage")),
             "summaries": entry.get("summaries", [])}
            for entry in turns_of(history)[-USAGE_TURNS:]]


def _without_calls(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if usage is None else {k: v for k, v in usage.items() if k != "by_call"}
