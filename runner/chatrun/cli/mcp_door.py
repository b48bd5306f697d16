"""`chatrun mcp`: chatrun's authoring tools as an MCP server (stdio), for coding assistants.

The tools are the commands a person uses, returning data instead of printing: `validate`,
`graph`, `run_turn` (a conversation kept per session name while the server runs),
`run_transcripts` and `explain` (what the schema says about the key a diagnostic is about).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import click

from chatrun.cli._output import fail

SESSIONS: dict[tuple[str, str], Any] = {}  # (bot path, session name) -> a live Session


@click.command("mcp")
def mcp() -> None:
    """Serve chatrun's authoring tools to coding assistants over MCP (stdio).

    Tools: validate, graph, run_turn, run_transcripts, explain. Needs the `mcp` extra
    (pip install 'chatrun[mcp]'). Paths are relative to the directory it runs in.

    \b
    Example (an MCP client's configuration):
      {"command": "chatrun", "args": ["mcp"]}
    """
    try:
        server = make_server()
    except ImportError:
        fail(click.ClickException("`chatrun mcp` needs the mcp package: pip install 'chatrun[mcp]'"))
    except Exception as exc:  # never a traceback from the CLI
        fail(exc)
    server.run("stdio")


def make_server() -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("chatrun")
    for tool in (validate, graph, run_turn, run_transcripts, explain):
        server.tool()(_author_errors(tool))
    return server


def _author_errors(tool: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The tool, its ChatrunErrors (a bot path that is not a bot, an invalid bot: file:line)
    answered as tool errors carrying their message: the SDK answers any other exception with
    only "Error executing tool NAME", which tells a coding agent nothing it can act on."""
    from mcp.server.mcpserver.exceptions import ToolError

    from chatrun.errors import ChatrunError

    @functools.wraps(tool)
    async def answered(*args: Any, **kwargs: Any) -> Any:
        try:
            return await tool(*args, **kwargs)
        except ChatrunError as exc:
            raise ToolError(str(exc)) from exc

    return answered


async def validate(path: str) -> dict[str, Any]:
    """Check a bot (a directory holding bot.yaml, or a YAML file) as `chatrun validate` does:
    every problem at once, each with file, line, column, severity, message and the key's path."""
    return await asyncio.to_thread(_validate, path)


def _validate(path: str) -> dict[str, Any]:
    from chatrun.definition.loader import load_config
    from chatrun.errors import BotError

    try:
        _, warnings = load_config(path)
    except BotError as exc:
        return {"valid": False, "diagnostics": [d.to_dict() for d in exc.diagnostics]}
    return {"valid": True, "diagnostics": [d.to_dict() for d in warnings]}


async def graph(path: str, format: str = "text") -> str:
    """A bot's route graph as `chatrun graph` draws it: format text, mermaid or dot."""
    from chatrun.definition.graph import RouteGraph
    from chatrun.definition.loader import load_config

    config, _ = await asyncio.to_thread(load_config, path)
    return RouteGraph.from_config(config).render(format)


async def run_turn(bot: str, message: str, session: str = "default", reset: bool = False) -> dict[str, Any]:
    """Send `message` to the bot at `bot` (its own model answers) in the conversation named
    `session` (kept while this server runs; `reset` starts it again). Returns the turn's
    events (no Stream chunks), whether it committed, and the route, stack and state after it."""
    from chatrun.engine.bot import load_bot

    key = (str(Path(bot).resolve()), session)
    if reset or key not in SESSIONS:
        loaded = await asyncio.to_thread(load_bot, bot)
        SESSIONS[key] = loaded.session()
    live = SESSIONS[key]
    events = await live.achat(message)
    last = live.last_turn or {}
    return {"ok": bool(last.get("ok")), "events": [e.to_dict() for e in events if e.type != "Stream"],
            "route": live.route, "stack": list(live.stack), "state": live.visible_state().get("state"),
            "calls": last.get("calls", [])}


async def run_transcripts(paths: list[str]) -> dict[str, Any]:
    """Replay golden transcripts offline as `chatrun test` does (files or folders; a bot
    folder means its transcripts/). Returns the counts and, per transcript, its report."""
    return await asyncio.to_thread(_run_transcripts, paths)


def _run_transcripts(paths: list[str]) -> dict[str, Any]:
    from chatrun.errors import ChatrunError
    from chatrun.transcripts.format import is_transcript_text
    from chatrun.transcripts.run import run_transcript

    files: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise ChatrunError(f"no such transcript or folder: {path} (paths are relative to {Path.cwd()})")
        folder = path / "transcripts" if (path / "transcripts").is_dir() else path
        found = [f for f in sorted(folder.glob("*.yaml")) if is_transcript_text(f.read_text(encoding="utf-8",
                                                                                          errors="replace"))] \
            if folder.is_dir() else [path]
        if not found:
            raise ChatrunError(f"no transcripts in {folder} (its *.yaml files, or a bot folder's transcripts/)")
        files += found
    bots: dict[str, Any] = {}
    results = [run_transcript(str(f), bots) for f in files]
    return {"passed": sum(r.passed for r in results), "failed": sum(not r.passed for r in results),
            "results": [{"transcript": r.name, "passed": r.passed, "report": r.report(), "warnings": r.warnings}
                        for r in results]}


async def explain(path: str, line: int) -> dict[str, Any]:
    """Explain the diagnostics of a bot at a line of its file: each problem with what the
    bot schema says about the key it is about (its description, example and allowed keys)."""
    return await asyncio.to_thread(_explain, path, line)


def _explain(path: str, line: int) -> dict[str, Any]:
    found = [d for d in _validate(path)["diagnostics"] if d["line"] == line]
    return {"diagnostics": found, "explanations": [_schema_note(d["path"]) for d in found]}


def _schema_note(dotted: str) -> dict[str, Any]:
    """What bot.schema.json says about the node at `dotted` (routes.flight.system), or about the
    nearest node above it that it knows (an unknown key: its parent, with the keys it allows)."""
    from chatrun.definition.schemas import inline_refs, load_schema

    schema = load_schema("bot.schema.json")
    node: dict[str, Any] = inline_refs(schema, schema.get("$defs", {}))
    known: list[str] = []
    for part in [p for p in dotted.split(".") if p]:
        child = _child(node, part)
        if child is None:
            break
        node, known = child, [*known, part]
    note: dict[str, Any] = {"path": dotted, "schema_path": ".".join(known),
                            "description": node.get("markdownDescription") or node.get("description", "")}
    if isinstance(node.get("properties"), dict):
        note["allowed_keys"] = sorted(node["properties"])
    return note


def _child(node: dict[str, Any], part: str) -> dict[str, Any] | None:
    props = node.get("properties")
    if isinstance(props, dict) and part in props:
        return dict(props[part])
    if isinstance(node.get("additionalProperties"), dict) and not props:
        return dict(node["additionalProperties"])
    if isinstance(node.get("items"), dict) and part.isdigit():
        return dict(node["items"])
    for alternative in node.get("anyOf", []) + node.get("oneOf", []) + node.get("allOf", []):
        found = _child(alternative, part) if isinstance(alternative, dict) else None
        if found is not None:
            return found
    return None
