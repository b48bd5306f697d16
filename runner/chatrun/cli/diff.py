"""`chatrun diff OLD NEW`: what changed between two versions of a bot, which changes break live
sessions, and (with --store) how many stored sessions each one touches."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from chatrun.definition.diff import Change

if TYPE_CHECKING:
    from chatrun.engine.migrate import Footprint


@click.command("diff")
@click.argument("old", type=click.Path(exists=True))
@click.argument("new", type=click.Path(exists=True))
@click.option("--store", "store_url", metavar="URL",
              help="Count the stored sessions of the bot each change touches (sqlite:///path/to.db, redis://host:port/db).")
@click.option("--json", "as_json", is_flag=True, help="Print the changes as one JSON object.")
def diff(old: str, new: str, store_url: str | None, as_json: bool) -> None:
    """Compare two versions of a bot: what changed, and which changes break live sessions.

    A breaking change is one a session started on OLD meets on NEW: a removed or renamed
    route, state key or scope field, a removed or renamed tool, a tool parameter removed,
    retyped or newly required, newly required state. One that a migration of NEW handles
    says which.

    Exit status: 0 when no breaking change is left unhandled, 1 when one is, 2 on errors
    (a bot that does not load, a store that does not open).

    \b
    Examples:
      chatrun diff bots/shop/versions/1 bots/shop/versions/2
      chatrun diff OLD NEW --store sqlite:///sessions.db --json
    """
    from chatrun.definition.diff import diff_bots

    old_config, new_config = _load(old), _load(new)
    changes = diff_bots(old_config, new_config)
    counted = None
    if store_url:
        counted = _count(changes, store_url, old_config.name)
    if as_json:
        click.echo(json.dumps({"old": old, "new": new, "sessions": counted,
                               "changes": [c.to_json() for c in changes],
                               "breaking": sum(c.breaking for c in changes),
                               "unhandled": sum(c.unhandled for c in changes)}, indent=2))
    else:
        _print(changes, counted)
    if any(c.unhandled for c in changes):
        raise click.exceptions.Exit(1)


def _load(path: str) -> Any:
    """A loaded bot, or `file:line: message` lines and exit 2."""
    from chatrun.cli._output import print_diagnostics
    from chatrun.definition.loader import load_config
    from chatrun.errors import BotError, ChatrunError

    try:
        config, _warnings = load_config(path)
        return config
    except BotError as exc:
        print_diagnostics([d for d in exc.diagnostics if d.severity == "error"])
    except ChatrunError as exc:
        click.echo(f"{path}: error: {exc}", err=True)
    raise click.exceptions.Exit(2)


def _count(changes: list[Change], url: str, bot: str) -> int:
    """Set each change's `sessions`: the stored sessions of `bot` it touches. Returns how many
    sessions of the bot the store holds."""
    import asyncio

    from chatrun.errors import ChatrunError

    try:
        found = asyncio.run(_footprints(url, bot))
    except (ChatrunError, OSError) as exc:
        click.echo(f"{url}: error: {exc}", err=True)
        raise click.exceptions.Exit(2) from None
    for change in changes:
        t = change.touch
        change.sessions = sum(1 for h in found if t.every or h.routes & t.routes or h.state & t.state
                              or h.scope & t.scope or h.tools & t.tools)
    return len(found)


async def _footprints(url: str, bot: str) -> list[Footprint]:
    """What each stored session of `bot` holds, read through the server's store (any URL it takes:
    sqlite:///, redis://)."""
    from chatrun.engine.migrate import footprint
    from chatrun.store.aio import open_async_store

    store = open_async_store(url)
    try:
        found = []
        for sid in await store.list_sessions():
            record = await store.load_session(sid)
            if record is not None and record.bot in (None, bot):
                found.append(footprint(record.snapshot, record.memories))
        return found
    finally:
        await store.close()


def _print(changes: list[Change], counted: int | None) -> None:
    if not changes:
        click.echo("no changes a session can meet")
    for c in changes:
        mark = "BREAKING" if c.unhandled else ("migrated" if c.breaking else "        ")
        line = f"{mark}  {c.label}: {c.what}"
        if c.breaking:
            line += f" ({c.why})" if c.migrated is None else f" (by {c.migrated})"
        if c.sessions is not None:
            line += f" [{c.sessions} session{'s' if c.sessions != 1 else ''}]"
        click.echo(line)
    breaking, unhandled = sum(c.breaking for c in changes), sum(c.unhandled for c in changes)
    tail = f"; {counted} stored session{'s' if counted != 1 else ''} of the bot" if counted is not None else ""
    click.echo(f"{len(changes)} change(s), {breaking} breaking, {unhandled} not handled by a migration{tail}")
