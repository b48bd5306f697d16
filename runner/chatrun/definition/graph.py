"""The route graph: how a conversation can move between a bot's routes.

Built once from a validated `BotConfig` (`RouteGraph.from_config`). Routes are nodes;
every tool a route lists that pushes, pops or changes route is an edge labelled with
that tool. The validator, the server's inspector and `chatrun graph` all read this one
model; the engine does not (it applies each tool's action from the config).

Edges are drawn from the route that *lists* the tool. A tool that combines `pop` with
`push` or `route` therefore gets both a pop edge and a push/route edge from the same
route (the push/route really applies to the parent scope after the pop); for
reachability that is exact, for nesting (`can_be_nested`) it errs on the side of
"can be nested", which keeps the validator from warning about a pop that may work.

A tool with `cases:` moves differently by case: an edge that only some cases take carries
their conditions (`Edge.condition`: "if EXPR", "else", "otherwise" when no case matched),
drawn on the edge's label in every format.

Tools or targets that do not exist are left out: the validator reports them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from chatrun.definition.config import ActionConfig, ApprovalConfig, BotConfig

EdgeKind = Literal["push", "route", "pop", "call", "end"]
FORMATS = ("text", "mermaid", "dot")
END_NODE = "(end)"  # where `end` edges lead in drawings: the conversation is over
ANSWER = "(answer)"  # the "tool" of the pop a `returns: answer` route makes by answering


@dataclass(frozen=True)
class Node:
    """One route."""

    name: str
    description: str = ""
    default: bool = False
    entry: bool = False  # a route clients start on (`entry: true`), besides the default
    roles: tuple[str, ...] = ()
    memory: str = "message_window"  # the effective memory type (route's, else the bot's)
    tools: tuple[str, ...] = ()


@dataclass(frozen=True)
class Edge:
    """A way out of `source`: `tool` pushes `target`, changes route to `target`, or pops
    (`target` None: back to whichever route pushed the current scope)."""

    source: str
    target: str | None
    kind: EdgeKind
    tool: str
    execute: bool = False  # the new current route runs at once with the same user message
    immediate: bool = False  # the model loop ends after this tool
    condition: str | None = None  # when only some of the tool's cases move: "if EXPR", "else", "otherwise"

    @property
    def flags(self) -> list[str]:
        return [name for name, on in (("execute", self.execute), ("immediate", self.immediate)) if on]

    @property
    def label(self) -> str:
        """The tool, with its condition when the move is conditional: `transfer [if args.amount > 0]`."""
        return f"{self.tool} [{self.condition}]" if self.condition else self.tool


class RouteGraph:
    """Nodes in config order, edges in config order (route, then its tools, then push,
    route, pop). Read-only after construction."""

    def __init__(self, name: str, nodes: Iterable[Node], edges: Iterable[Edge], description: str = ""):
        self.name = name
        self.description = description
        self.nodes: dict[str, Node] = {node.name: node for node in nodes}
        self.edges: list[Edge] = list(edges)
        self.default: str | None = next((n.name for n in self.nodes.values() if n.default), None)
        self._out: dict[str, list[Edge]] = {name: [] for name in self.nodes}
        for edge in self.edges:
            self._out.setdefault(edge.source, []).append(edge)
        self._into: dict[tuple[str, str], list[str]] = {}  # (kind, target) -> sources
        for edge in self.edges:
            if edge.target:
                self._into.setdefault((edge.kind, edge.target), []).append(edge.source)
        self._pop_targets: dict[str, list[str]] = {}  # memo: the graph never changes
        self._nested = self._closure(self.pushed_routes())

    @classmethod
    def from_config(cls, config: BotConfig) -> RouteGraph:
        nodes = [
            Node(
                name=name,
                description=route.description,
                default=route.default,
                entry=route.entry,
                roles=tuple(route.roles),
                memory=config.route_memory(name).type,
                tools=tuple(route.tools),
            )
            for name, route in config.routes.items()
        ]
        return cls(config.name, nodes, _config_edges(config), config.description)

    # -- queries ----------------------------------------------------------------------

    def edges_from(self, route: str) -> list[Edge]:
        """The edges leaving `route`, in the order its tools are listed."""
        return list(self._out.get(route, ()))

    def reachable(self, start: str | None = None) -> set[str]:
        """Routes a conversation starting on `start` (default: the default route) can get
        to through push and route edges, `start` included."""
        start = start if start is not None else self.default
        if start is None or start not in self.nodes:
            return set()
        return self._closure({start})

    def reachable_from_starts(self) -> set[str]:
        """Routes a conversation can get to from where conversations start: the default route
        and every entry route."""
        starts = {n.name for n in self.nodes.values() if n.default or n.entry}
        return self._closure(starts) if starts else set()

    def pushed_routes(self) -> set[str]:
        """Routes some tool pushes (or calls: a call pushes)."""
        return {e.target for e in self.edges if e.kind in ("push", "call") and e.target}

    def can_be_nested(self, route: str) -> bool:
        """Whether `route` can be the current route of a nested scope (so popping there
        can work): some tool pushes it, or a route change reaches it from such a route."""
        return route in self._nested

    def pop_targets(self, route: str) -> list[str]:
        """The routes a pop from `route` can return to: those that push `route`, or push a
        route from which route changes (without nesting) lead to `route`. Config order."""
        if route not in self._pop_targets:
            # Walk route edges backwards: every route from which route changes lead here.
            entries = {route}
            todo = [route]
            while todo:
                for source in self._into.get(("route", todo.pop()), ()):
                    if source not in entries:
                        entries.add(source)
                        todo.append(source)
            parents = {source for entry in entries for kind in ("push", "call")
                       for source in self._into.get((kind, entry), ())}
            self._pop_targets[route] = [name for name in self.nodes if name in parents]
        return list(self._pop_targets[route])

    def _closure(self, start: set[str]) -> set[str]:
        """`start` and every route push and route edges lead to from it."""
        seen = {s for s in start if s in self.nodes}
        todo = list(seen)
        while todo:
            for edge in self._out.get(todo.pop(), ()):
                if edge.target in self.nodes and edge.target not in seen:  # push, route, call
                    seen.add(edge.target)
                    todo.append(edge.target)
        return seen

    # -- rendering --------------------------------------------------------------------

    def render(self, fmt: str = "text", ascii_lines: bool = False) -> str:
        """The graph as `text` (for a terminal), `mermaid` (renders in GitHub Markdown)
        or `dot` (Graphviz). Always ends with a newline. `ascii_lines`: the text's tree and
        arrows drawn in ASCII (`|-`, `->`), for a terminal that cannot show `├─` and `→`."""
        if fmt == "text":
            return _render_text(self, _ASCII_LINES if ascii_lines else _LINES)
        if fmt == "mermaid":
            return _render_mermaid(self)
        if fmt == "dot":
            return _render_dot(self)
        raise ValueError(f"unknown graph format {fmt!r}; use one of {', '.join(FORMATS)}")

    def __repr__(self) -> str:
        return f"<RouteGraph {self.name!r} nodes={len(self.nodes)} edges={len(self.edges)}>"


def _config_edges(config: BotConfig) -> Iterator[Edge]:
    for name, route in config.routes.items():
        for tool_name in route.tools:
            tool = config.tools.get(tool_name)
            if tool is not None:
                yield from _tool_edges(config, name, tool_name, tool.action)
            if tool is not None and tool.approval is not None:
                yield from _timeout_edges(name, tool_name, tool.approval, config)
        if route.returns == "answer":  # a called route that returns with its answer pops by itself
            yield Edge(name, None, "pop", ANSWER)


def _timeout_edges(source: str, tool: str, approval: ApprovalConfig, config: BotConfig) -> Iterator[Edge]:
    """A route a timeout's named case rejects to (labelled with the case and its condition)."""
    for entry in approval.cases.get(approval.on_timeout, ()):
        if entry.route and entry.route in config.routes and entry.reject is not None:
            yield Edge(source, entry.route, "route", tool, condition=f"timeout {approval.on_timeout} {entry.label}")


def _tool_edges(config: BotConfig, source: str, tool: str, action: ActionConfig) -> Iterator[Edge]:
    """The moves of one tool from `source`. With `cases:`, a move that only some variants make
    is labelled with their conditions ("otherwise": no case matched and there is no else)."""
    variants = action.variants()
    moves: dict[tuple[str, str | None], list[tuple[str, ActionConfig]]] = {}
    for case, merged in variants:
        if not (merged.push or merged.route or merged.call or merged.pop or merged.end or merged.operator):
            continue  # no move (most variants of a big bot's tools): nothing below would be kept
        label = case.label if case is not None else "otherwise"
        # A handover's `release_to` is where the conversation goes on when the operator releases it
        released = merged.operator.release_to if merged.operator is not None else None
        # ...and its `on_timeout.route` where it goes on when nobody took it in time.
        unanswered = merged.operator.on_timeout.route if merged.operator and merged.operator.on_timeout else None
        for kind, target in (("push", merged.push), ("route", merged.route), ("route", released),
                             ("route", unanswered), ("call", merged.call), ("pop", None), ("end", None)):
            if (kind == "pop" and merged.pop) or (kind == "end" and merged.end) or (target and target in config.routes):
                moves.setdefault((kind, target), []).append((label, merged))
    for (kind, target), uses in moves.items():
        condition = None if len(uses) == len(variants) else "; ".join(label for label, _ in uses)
        yield Edge(source, target, kind, tool,  # type: ignore[arg-type]
                   execute=any(m.execute for _, m in uses), immediate=any(m.immediate for _, m in uses),
                   condition=condition)


def _grouped(graph: RouteGraph) -> list[tuple[str, str, EdgeKind, list[str]]]:
    """(source, target, kind, tools) with parallel edges merged, pops expanded to every
    route they can return to. Config order."""
    groups: dict[tuple[str, str, EdgeKind], list[str]] = {}
    for edge in graph.edges:
        if edge.kind == "end":
            targets = [END_NODE]
        else:
            # Why the ignore: only pop and end edges have no target, and those are expanded here
            targets = graph.pop_targets(edge.source) if edge.kind == "pop" else [edge.target]  # type: ignore[list-item]
        for target in targets:
            tools = groups.setdefault((edge.source, target, edge.kind), [])
            if edge.label not in tools:
                tools.append(edge.label)
    return [(s, t, k, tools) for (s, t, k), tools in groups.items()]


# -- text ---------------------------------------------------------------------------


_LINES = {"branch": "├─", "last": "└─", "to": "→"}
_ASCII_LINES = {"branch": "|-", "last": "`-", "to": "->"}


def _render_text(graph: RouteGraph, drawn: dict[str, str]) -> str:
    lines = [f"{graph.name}: {graph.description}" if graph.description else graph.name]
    reached = graph.reachable_from_starts()
    for node in graph.nodes.values():
        marks = []
        if node.default:
            marks.append("default")
        if node.entry:
            marks.append("entry")
        marks.append(f"memory: {node.memory}")
        if node.roles:
            marks.append("roles: " + ", ".join(node.roles))
        if graph.default and node.name not in reached:
            marks.append(f"unreachable from {graph.default}")
        head = f"{node.name} [{'; '.join(marks)}]"
        lines.append("")
        lines.append(head + (f"  {node.description}" if node.description else ""))
        edges = graph.edges_from(node.name)
        if not edges:
            lines.append("  (no way out: the conversation stays here)")
        width = max((len(e.tool) for e in edges), default=0)
        for i, edge in enumerate(edges):
            branch = drawn["last"] if i == len(edges) - 1 else drawn["branch"]
            to = drawn["to"]
            if edge.kind == "pop":
                parents = graph.pop_targets(node.name)
                where = f"pop {to} back to " + (" | ".join(parents) if parents else "(nothing: never nested)")
            elif edge.kind == "end":
                where = f"end {to} the conversation ends"
            else:
                where = f"{edge.kind} {to} {edge.target}"
            flags = f"  ({', '.join(edge.flags)})" if edge.flags else ""
            condition = f"  [{edge.condition}]" if edge.condition else ""
            lines.append(f"  {branch} {edge.tool.ljust(width)}  {where}{flags}{condition}")
    return "\n".join(lines) + "\n"


# -- mermaid ------------------------------------------------------------------------

_MERMAID_ARROWS = {"push": "-->", "route": "-.->", "pop": "==>", "call": "-->", "end": "==>"}


def _mermaid_ids(graph: RouteGraph) -> dict[str, str]:
    """`n<index>_<name>` in config order: the index makes ids unique (everything up to the
    first `_` differs), the leading `n` keeps them clear of mermaid keywords (`end`,
    `graph`), and the name keeps the source readable."""
    ids = {name: f"n{i}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}" for i, name in enumerate(graph.nodes)}
    ids[END_NODE] = "end_of_conversation"
    return ids


def _mermaid_text(text: str) -> str:
    # Inside "..." mermaid takes entity codes; a raw quote would end the label.
    return text.replace("&", "#amp;").replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def _render_mermaid(graph: RouteGraph) -> str:
    ids = _mermaid_ids(graph)
    lines = ["flowchart LR"]
    for node in graph.nodes.values():
        label = node.name
        if node.default:
            label += " (default)"
        if node.roles:
            label += " [roles: " + ", ".join(node.roles) + "]"
        label = _mermaid_text(label)
        # Stadium for the default route, rectangles for the others.
        shape = f'(["{label}"])' if node.default else f'["{label}"]'
        lines.append(f"    {ids[node.name]}{shape}")
    if any(e.kind == "end" for e in graph.edges):
        lines.append(f'    {ids[END_NODE]}(("end"))')
    for source, target, kind, tools in _grouped(graph):
        text = _mermaid_text(f"{kind}: {', '.join(tools)}")
        lines.append(f'    {ids[source]} {_MERMAID_ARROWS[kind]}|"{text}"| {ids[target]}')
    return "\n".join(lines) + "\n"


# -- dot ----------------------------------------------------------------------------

_DOT_STYLES = {
    "push": "style=solid",
    "route": "style=dashed",
    "pop": "style=bold, color=gray40, fontcolor=gray40",
    "call": "style=solid, arrowhead=diamond",
    "end": "style=bold, color=firebrick, fontcolor=firebrick",
}


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _render_dot(graph: RouteGraph) -> str:
    lines = [f"digraph {_dot_quote(graph.name)} {{", "    rankdir=LR;",
             '    node [shape=box, style=rounded, fontname="Helvetica"];',
             '    edge [fontname="Helvetica", fontsize=10];']
    for node in graph.nodes.values():
        label = node.name + (" (default)" if node.default else "")
        if node.roles:
            label += "\nroles: " + ", ".join(node.roles)
        attrs = [f"label={_dot_quote(label)}"]
        if node.description:
            attrs.append(f"tooltip={_dot_quote(node.description)}")
        if node.default:
            attrs.append("peripheries=2")
        lines.append(f"    {_dot_quote(node.name)} [{', '.join(attrs)}];")
    if any(e.kind == "end" for e in graph.edges):
        lines.append(f'    {_dot_quote(END_NODE)} [label="end", shape=doublecircle];')
    flags = {(e.source, e.kind, e.label): e.flags for e in graph.edges}
    for source, target, kind, tools in _grouped(graph):
        label = f"{kind}: {', '.join(tools)}"
        extra = sorted({f for t in tools for f in flags.get((source, kind, t), [])})
        if extra:
            label += "\n(" + ", ".join(extra) + ")"
        lines.append(f"    {_dot_quote(source)} -> {_dot_quote(target)} [label={_dot_quote(label)}, {_DOT_STYLES[kind]}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
