"""`chatrun mcp`: chatrun's authoring tools as an MCP server (stdio), for coding assistants.

The tools are the commands a person uses, returning data instead of printing: `validate`,
`graph`, `run_turn` (a conversation kept per session name while the server runs),
`run_transcripts` and `explain` (what the schema says about the key a diagnostic is about).

The tools read only inside the folders the server was started on (`chatrun mcp [FOLDER]...`,
by default the directory it runs in): a coding assistant — or a prompt injected into one —
must not make it read, quote or run files elsewhere (`/etc/passwd` as a "bot" would be quoted
line by line in its diagnostics). Every path is resolved (symlinks, `..`) before it is checked.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from chatrun.cli._output import fail
from chatrun.errors import ChatrunError

SESSIONS: dict[tuple[str, str], Any] = {}  # (bot path, session name) -> a live Session


@dataclass(frozen=True)
class Roots:
    """The folders the tools may read (resolved): a path is used only if it resolves inside one."""

    folders: tuple[Path, ...]

    @classmethod
    def of(cls, folders: list[Path]) -> Roots:
        return cls(tuple(dict.fromkeys(f.resolve() for f in folders)))

    def check(self, path: str | Path, what: str) -> None:
        """Raise a ChatrunError naming the allowed folders if `path` (symlinks and `..` resolved,
        relative to the directory the server runs in) is outside them."""
        resolved = Path(path).resolve()
        if not any(resolved.is_relative_to(folder) for folder in self.folders):
            shown = ", ".join(str(f) for f in self.folders)
            raise ChatrunError(f"{path} ({what}) is outside the folders this `chatrun mcp` may read ({shown}); "
                               f"it reads nothing else. Use a path inside them, or start it on the folder that "
                               f"holds it: chatrun mcp FOLDER...")

    def check_bot(self, path: str | Path, what: str = "a bot") -> None:
        """A bot's path, its main file and, in a `versions/` layout, each version's: the loader keeps
        everything else a bot reads (includes, handlers, OpenAPI documents) inside its folder."""
        for part in _bot_parts(Path(path)):
            self.check(part, what)


ROOTS = Roots.of([Path.cwd()])  # the server's folders, set by `mcp` before it serves


def _bot_parts(path: Path) -> Iterator[Path]:
    from chatrun.definition.loader import BOT_FILES
    from chatrun.definition.versions import version_folders

    yield path
    if not path.is_dir():
        return
    yield from (path / name for name in BOT_FILES if (path / name).exists())
    for _, folder in version_folders(path) or []:
        yield folder
        yield folder / "bot.yaml"


@click.command("mcp")
@click.argument("folders", nargs=-1, type=click.Path(exists=True, file_okay=False, path_type=Path))
def mcp(folders: tuple[Path, ...]) -> None:
    """Serve chatrun's authoring tools to coding assistants over MCP (stdio).

    Tools: validate, graph, run_turn, run_transcripts, explain. Needs the `mcp` extra
    (pip install 'chatrun[mcp]'). The tools read only inside FOLDERS (by default the
    directory it runs in): any other path is refused. Paths are relative to the directory
    it runs in.

    \b
    Example (an MCP client's configuration):
      {"command": "chatrun", "args": ["mcp"]}
    """
    try:
        server = make_server(list(folders) or [Path.cwd()])
    except ImportError:
        fail(click.ClickException("`chatrun mcp` needs the mcp package: pip install 'chatrun[mcp]'"))
    except Exception as exc:  # never a traceback from the CLI
        fail(exc)
    server.run("stdio")


def make_server(folders: list[Path]) -> Any:
    from mcp.server.mcpserver import MCPServer

    global ROOTS
    ROOTS = Roots.of(folders)
    server = MCPServer("chatrun")
    for tool in (validate, graph, run_turn, run_transcripts, explain):
        server.tool()(_author_errors(tool))
    return server


def _author_errors(tool: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """The tool, its ChatrunErrors (a bot path that is not a bot, an invalid bot: file:line)
    answered as tool errors carrying their message: the SDK answers any other exception with
    only "Error executing tool NAME", which tells a coding agent nothing it can act on."""
    from mcp.server.mcpserver.exceptions import ToolError

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

    ROOTS.check_bot(path)
    try:
        _, warnings = load_config(path)
    except BotError as exc:
        return {"valid": False, "diagnostics": [d.to_dict() for d in exc.diagnostics]}
    return {"valid": True, "diagnostics": [d.to_dict() for d in warnings]}


async def graph(path: str, format: str = "text") -> str:
    """A bot's route graph as `chatrun graph` draws it: format text, mermaid or dot."""
    from chatrun.definition.graph import RouteGraph
    from chatrun.definition.loader import load_config

    ROOTS.check_bot(path)
    config, _ = await asyncio.to_thread(load_config, path)
    return RouteGraph.from_config(config).render(format)


async def run_turn(bot: str, message: str, session: str = "default", reset: bool = False) -> dict[str, Any]:
    """Send `message` to the bot at `bot` (its own model answers) in the conversation named
    `session` (kept while this server runs; `reset` starts it again). Returns the turn's
    events (no Stream chunks), whether it committed, and the route, stack and state after it."""
    from chatrun.engine.bot import load_bot

    ROOTS.check_bot(bot)
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
    """Replay golden transcripts offline as `chatrun test` does (files, or folders searched as it
    searches them: subfolders too). Returns the counts and, per transcript, its report."""
    return await asyncio.to_thread(_run_transcripts, paths)


def _run_transcripts(paths: list[str]) -> dict[str, Any]:
    from chatrun.transcripts.run import run_transcript

    files: list[Path] = []
    for path in map(Path, paths):
        ROOTS.check(path, "a transcript or folder")
        if not path.exists():
            raise ChatrunError(f"no such transcript or folder: {path} (paths are relative to {Path.cwd()})")
        found = _transcripts_in(path) if path.is_dir() else [path]
        if not found:
            raise ChatrunError(f"no transcripts in {path} (its YAML files with `turns:`, in subfolders too, "
                               "as `chatrun test` finds them)")
        files += found
    bots: dict[str, Any] = {}
    results = [run_transcript(_confined_transcript(f), bots) for f in files]
    return {"passed": sum(r.passed for r in results), "failed": sum(not r.passed for r in results),
            "results": [{"transcript": r.name, "passed": r.passed, "report": r.report(), "warnings": r.warnings}
                        for r in results]}


def _transcripts_in(folder: Path) -> list[Path]:
    """The transcripts of a folder, found as `chatrun test FOLDER` finds them (format.transcripts_under:
    `.yaml` and `.yml`, subfolders too), each checked to be inside the roots before it is read (a
    file may be a symlink to elsewhere)."""
    from chatrun.transcripts.format import transcripts_under

    return transcripts_under(folder, lambda file: ROOTS.check(file, "a transcript"))


def _confined_transcript(file: Path) -> Any:
    """The transcript at `file` once it, its bot and the files it attaches are inside the roots
    (an invalid transcript: its path, which `run_transcript` reports)."""
    from chatrun.errors import BotError
    from chatrun.transcripts.format import load_transcript

    ROOTS.check(file, "a transcript")
    try:
        transcript = load_transcript(file)
    except BotError:
        return str(file)
    ROOTS.check_bot(transcript.bot_path, f"the bot of {file}")
    for turn in transcript.turns:
        for attached in turn.attach:
            ROOTS.check(attached.path, f"a file {file} attaches")
    return transcript


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
