"""`chatrun diff OLD NEW`: what changed between two versions of a bot, which changes break live
sessions, and (with --store) how many stored sessions each one touches."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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
    stored = None
    if store_url:
        stored = _count(changes, store_url, old_config.name, old_config.content_version)
    if as_json:
        click.echo(json.dumps({"old": old, "new": new, "old_version": old_config.content_version,
                               "sessions": len(stored.old) if stored else None,
                               "stored": stored.to_json() if stored else None,
                               "changes": [c.to_json() for c in changes],
                               "breaking": sum(c.breaking for c in changes),
                               "unhandled": sum(c.unhandled for c in changes)}, indent=2))
    else:
        _print(changes, stored, old_config)
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


@dataclass
class Stored:
    """The stored sessions of the bot, by the version each records (`SessionRecord.bot_version`):
    those on OLD (what `--store` counts), those from before versions were recorded (no
    version: counted apart, as they may run OLD or not), and how many run other versions."""

    old: list[Footprint] = field(default_factory=list)
    unversioned: list[Footprint] = field(default_factory=list)
    other: int = 0

    def to_json(self) -> dict[str, int]:
        return {"old_version": len(self.old), "unversioned": len(self.unversioned), "other_versions": self.other}


def _count(changes: list[Change], url: str, bot: str, version: str) -> Stored:
    """Set each change's `sessions` (the stored sessions of `bot` on content version `version`
    it touches) and `unversioned` (those with no version recorded it touches)."""
    import asyncio

    from chatrun.errors import ChatrunError

    try:
        stored = asyncio.run(_footprints(url, bot, version))
    except (ChatrunError, OSError) as exc:
        click.echo(f"{url}: error: {exc}", err=True)
        raise click.exceptions.Exit(2) from None
    for change in changes:
        change.sessions = _touched(change, stored.old)
        change.unversioned = _touched(change, stored.unversioned)
    return stored


def _touched(change: Change, found: list[Footprint]) -> int:
    t = change.touch
    return sum(1 for h in found if t.every or h.routes & t.routes or h.state & t.state
               or h.scope & t.scope or h.tools & t.tools)


async def _footprints(url: str, bot: str, version: str) -> Stored:
    """What each stored session of `bot` holds, by its version, read through the server's store
    (any URL it takes: sqlite:///, redis://)."""
    from chatrun.engine.migrate import footprint
    from chatrun.store.aio import open_async_store

    store = open_async_store(url, must_exist=True)
    stored = Stored()
    try:
        for sid in await store.list_sessions():
            record = await store.load_session(sid)
            if record is None or record.bot not in (None, bot):
                continue
            if record.bot_version is None:
                stored.unversioned.append(footprint(record.snapshot, record.memories))
            elif record.bot_version == version:
                stored.old.append(footprint(record.snapshot, record.memories))
            else:
                stored.other += 1
        return stored
    finally:
        await store.close()


def _print(changes: list[Change], stored: Stored | None, old: Any) -> None:
    if not changes:
        click.echo("no changes a session can meet")
    for c in changes:
        mark = "BREAKING" if c.unhandled else ("migrated" if c.breaking else "        ")
        line = f"{mark}  {c.label}: {c.what}"
        if c.breaking:
            line += f" ({c.why})" if c.migrated is None else f" (by {c.migrated})"
        if c.sessions is not None:
            line += f" [{_sessions(c.sessions)}" + (f", {c.unversioned} unversioned" if c.unversioned else "") + "]"
        click.echo(line)
    breaking, unhandled = sum(c.breaking for c in changes), sum(c.unhandled for c in changes)
    click.echo(f"{len(changes)} change(s), {breaking} breaking, {unhandled} not handled by a migration"
               + (_stored_tail(stored, old) if stored is not None else ""))


def _sessions(n: int) -> str:
    return f"{n} session{'s' if n != 1 else ''}"


def _stored_tail(stored: Stored, old: Any) -> str:
    """What the counts cover: the sessions on OLD; those from before versions, apart."""
    label = f"{old.version} ({old.content_version})" if old.version else old.content_version
    tail = f"; {_sessions(len(stored.old))} stored on version {label}"
    if stored.unversioned:
        tail += (f"; {_sessions(len(stored.unversioned))} with no version recorded (stored before versions), "
                 "counted apart as `unversioned`")
    if stored.other:
        tail += f"; {_sessions(stored.other)} on other versions, not counted"
    return tail
