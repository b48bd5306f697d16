"""`chatrun validate PATH...`: report every problem of one or more bots."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from chatrun.cli._output import BotPath, counts, fail, plural, print_diagnostics, summary
from chatrun.errors import BotError, ChatrunError, Diagnostic

if TYPE_CHECKING:
    from chatrun.definition.config import BotConfig


@click.command("validate")
@click.argument("paths", nargs=-1, required=True, type=BotPath())
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: `file:line:col: error|warning: message` lines and a summary; json: a list of diagnostics.")
@click.option("--connect", is_flag=True,
              help="Start the bots' MCP servers and check the MCP tool names they use against what the servers list.")
@click.option("--against", "against", type=BotPath(), metavar="OLD",
              help="Check the bots' `migrations:` against OLD, the version they migrate from: every route, tool and "
                   "state key a migration names exists there, every route removed since is mapped.")
def validate(paths: tuple[str, ...], fmt: str, connect: bool, against: str | None) -> None:
    """Check bots (directories holding bot.yaml, or single YAML files) and report every
    problem at once: YAML syntax, schema violations, unknown routes and tools, templates,
    state paths, handlers, the route graph.

    Exit status: 0 when every bot is valid (warnings allowed), 1 when any is invalid,
    2 on usage errors.

    \b
    Examples:
      chatrun validate bots/travel
      chatrun validate bots/*/ --format json
      chatrun validate bots/shop/versions/2 --against bots/shop/versions/1
    """
    found: list[Diagnostic] = []
    invalid = 0
    for path in paths:  # a folder of versions: its versions.yaml, as `chatrun serve` reads it
        problems = layout_problems(path)
        found.extend(problems)
        invalid += any(d.severity == "error" for d in problems)
        if problems and fmt == "text":
            print_diagnostics(problems)
            click.echo(summary(problems, problems[0].file))
    checks = [pair for path in paths for pair in versions_of(path, against)]
    for path, old in checks:
        try:  # per bot: one broken bot must not stop the others being checked
            diagnostics, unchecked = _check(path, connect, old)
            found.extend(diagnostics)
            invalid += any(d.severity == "error" for d in diagnostics)
            if fmt == "text":  # each bot's problems, then its verdict
                print_diagnostics(diagnostics)
                for note in [*unchecked, *stale_schema_copies(path)]:
                    click.echo(f"{path}: {note}")
                click.echo(summary(diagnostics, path))
        except (BrokenPipeError, KeyboardInterrupt) as exc:
            fail(exc)
    errors, warnings = counts(found)
    if fmt == "json":
        print_diagnostics(found, "json")
    elif len(checks) > 1:
        click.echo(f"{plural(len(checks), 'bot')} checked, {invalid} invalid: "
                   f"{plural(errors, 'error')}, {plural(warnings, 'warning')}")
    if errors:
        raise click.exceptions.Exit(1)


def versions_of(path: str, against: str | None) -> list[tuple[str, str | None]]:
    """(bot, the version it migrates from) to check for a PATH: the bot itself; or, for a folder
    of versions (`versions/<v>/bot.yaml`, no bot.yaml of its own), each version in the order the
    server serves them (definition/versions.py), each against the one before it."""
    from chatrun.definition.versions import version_folders

    found = version_folders(path)
    if found is None:
        return [(path, against)]
    shown = [str(folder) for _, folder in found]
    return [(v, shown[i - 1] if i else against) for i, v in enumerate(shown)]


def layout_problems(path: str) -> list[Diagnostic]:
    """What `chatrun serve` refuses in a folder of versions besides its versions: its
    versions.yaml (not YAML, weights naming a version that is not there); and a warning when
    the folders' names order the versions otherwise than their numbers suggest."""
    from chatrun.definition.versions import VERSIONS_DIR, order_problem, version_layout

    try:
        layout = version_layout(path)
    except BotError as exc:
        return exc.diagnostics
    problem = order_problem([label for label, _ in layout.versions]) if layout is not None else None
    return [Diagnostic(str(layout.root / VERSIONS_DIR), 0, 0, "warning", problem)] if layout and problem else []


def stale_schema_copies(path: str) -> list[str]:
    """A bot's own copies of the schemas (`chatrun init` writes them) that differ from this
    chatrun's: the editor would check the bot against another version of the format."""
    from pathlib import Path

    from chatrun.cli.schema import BOT_SCHEMA_DIR, SCHEMAS
    from chatrun.definition.schemas import schema_path

    folder = Path(path) / BOT_SCHEMA_DIR
    stale = [name for name in SCHEMAS.values()
             if (folder / name).is_file() and (folder / name).read_bytes() != schema_path(name).read_bytes()]
    if not stale:
        return []
    return [f"{', '.join(stale)} in {folder} differ from this chatrun's (editors check against them); "
            f"refresh them: chatrun schema --write {folder}"]


def _check(path: str, connect: bool = False, against: str | None = None) -> tuple[list[Diagnostic], list[str]]:
    """Every diagnostic of one bot, and what only --connect would check (MCP tool names). Bad input is
    always a diagnostic; only a fault of chatrun itself becomes the "chatrun bug" line, and
    then for this bot alone."""
    from chatrun.cli._gc import collector_paused
    from chatrun.definition.loader import load_config
    from chatrun.toolkinds import connect_checks, unconnected

    try:
        with collector_paused():
            config, diagnostics = load_config(path)
        if against is not None:
            diagnostics = diagnostics + _against(config, against)
        unchecked = unconnected(config)
        if not unchecked:
            return diagnostics, []
        if not connect:
            return diagnostics, unchecked
        import asyncio

        return diagnostics + asyncio.run(connect_checks(config)), []
    except BotError as exc:
        return exc.diagnostics, []
    except ChatrunError as exc:
        return [Diagnostic(path, 0, 0, "error", str(exc))], []
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except Exception as exc:  # never a traceback from the CLI
        return [Diagnostic(path, 0, 0, "error", f"unexpected {type(exc).__name__}: {exc} "
                           "(this is a chatrun bug; please report it)")], []


def _against(config: BotConfig, old_path: str) -> list[Diagnostic]:
    """The bot's migrations checked against the old version; an old version that does not load
    is one error naming it."""
    from chatrun.definition.loader import load_config
    from chatrun.definition.migrations import against_diagnostics

    try:
        old, _ = load_config(old_path)
    except BotError as exc:
        return [Diagnostic(old_path, 0, 0, "error", f"--against {old_path}: the old version does not load "
                           f"({plural(len(exc.diagnostics), 'problem')}; chatrun validate {old_path} lists them)")]
    return against_diagnostics(old, config)
