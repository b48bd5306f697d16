"""`chatrun versions list|prune --store URL`: the bot versions kept in a store (every `chatrun
serve` puts the files of the versions it serves there, chatrun.server.versions), how many stored
sessions run each (the store's tally, kept by every commit: the cost does not grow with the
sessions), and retiring the ones no session runs any more (docs/versions.md,
"Retiring a version")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import click

from chatrun.cli._output import run_on_store

STORE_HELP = "The store the servers share (sqlite:///path/to.db, redis://host:port/db, postgresql://user@host/db)."


@click.group("versions")
def versions() -> None:
    """List or retire the bot versions kept in a store."""


@versions.command("list")
@click.option("--store", "store_url", required=True, metavar="URL", help=STORE_HELP)
@click.option("--bot", "bot", metavar="NAME", help="Only this bot's versions.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def list_versions(store_url: str, bot: str | None, as_json: bool) -> None:
    """Each kept version, oldest published first: bot, label, content version, when it was
    first published, and how many stored sessions run it.

    \b
    Example:
      chatrun versions list --store sqlite:///sessions.db
    """
    kept = run_on_store(store_url, _kept(store_url, bot))
    if as_json:
        click.echo(json.dumps({"versions": [k.to_json() for k in kept]}, indent=2))
        return
    for k in kept:
        click.echo(f"{k.bot} {k.label} ({k.content_version}): {_sessions(k.sessions)}")
    if not kept:
        click.echo("no versions kept")


@versions.command("prune")
@click.option("--store", "store_url", required=True, metavar="URL", help=STORE_HELP)
@click.option("--bot", "bot", required=True, metavar="NAME", help="The bot whose versions are pruned.")
@click.option("--keep", "keep", multiple=True, required=True, metavar="VERSION",
              help="A version to keep (a label or a content hash); repeat it. Keep every version a running "
                   "replica serves.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def prune(store_url: str, bot: str, keep: tuple[str, ...], dry_run: bool) -> None:
    """Remove the kept copies of a bot's versions, except those named with --keep and those
    stored sessions still run (refused, with how many).

    A replica that lacks a removed version can no longer load it: a session that still turns
    up on it moves by the primary version's `on_change` (docs/versions.md).

    Exit status: 0 when every version not kept was removed (or, with --dry-run, could be),
    1 when sessions still run one of them (it stays), 2 on errors.

    \b
    Example:
      chatrun versions prune --store sqlite:///sessions.db --bot shop --keep 2
    """
    kept = run_on_store(store_url, _kept(store_url, bot))
    unknown = [k for k in keep if not any(k in (v.label, v.content_version) for v in kept)]
    if unknown:
        listed = ", ".join(f"{v.label} ({v.content_version})" for v in kept) or "none"
        from chatrun.store.urls import shown_url

        click.echo(f"{shown_url(store_url)}: error: --keep {', '.join(unknown)}: bot {bot} keeps no such version "
                   f"(it keeps: {listed})", err=True)
        raise click.exceptions.Exit(2)
    refused = 0
    for version in kept:
        shown = f"{bot} {version.label} ({version.content_version})"
        if version.label in keep or version.content_version in keep:
            click.echo(f"kept     {shown}")
        elif version.sessions:
            refused += 1
            click.echo(f"refused  {shown}: {_sessions(version.sessions)} still run it")
        else:
            if not dry_run:
                run_on_store(store_url, _remove(store_url, bot, version.content_version))
            click.echo(f"{'would remove' if dry_run else 'removed '} {shown}")
    if refused:
        raise click.exceptions.Exit(1)


@dataclass
class Kept:
    bot: str
    label: str
    content_version: str
    published: float
    sessions: int  # stored sessions that record it

    def to_json(self) -> dict[str, Any]:
        return {"bot": self.bot, "label": self.label, "content_version": self.content_version,
                "published": self.published, "sessions": self.sessions}



async def _kept(url: str, bot: str | None) -> list[Kept]:
    """The versions kept in the store, each with the number of stored sessions recording it."""
    from chatrun.server.versions import stored_versions
    from chatrun.store.aio import open_existing_store
    from chatrun.store.record import TALLY_VERSION, tally_name

    store = await open_existing_store(url)
    try:
        found = await stored_versions(store, bot)
        # The store's tally of sessions per version, kept by each commit: never a read of every session.
        runs = await store.read_tallies(TALLY_VERSION, [tally_name(name, content) for content, _, _, name in found])
        return [Kept(name, label, content, published, runs.get(tally_name(name, content), 0))
                for content, label, published, name in found]
    finally:
        await store.close()


async def _remove(url: str, bot: str, content: str) -> None:
    from chatrun.server.versions import record_key
    from chatrun.store.aio import open_existing_store

    store = await open_existing_store(url)
    try:
        await store.delete_record(record_key(bot, content))
    finally:
        await store.close()


def _sessions(n: int) -> str:
    return f"{n} session{'s' if n != 1 else ''}"
