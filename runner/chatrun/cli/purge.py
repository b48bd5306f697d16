"""`chatrun purge BOT... --store URL`: delete now what is past the bots' `retention:` (what
`chatrun serve`'s sweeper deletes as it runs), or, with `--principal`, everything stored of one
principal (docs/deploy.md, "What is kept, and for how long"; store/retention.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from chatrun.cli._output import BotPath, run_on_store
from chatrun.definition.config import Retention, duration_seconds

STORE_HELP = "The store the servers share (sqlite:///path/to.db, redis://host:port/db, postgresql://user@host/db)."


class Duration(click.ParamType):
    """A duration option: `30d`, `12h`, `90m`, `45s` (seconds, as a float)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return duration_seconds(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()
RETAIN_IDLE_HELP = ("Delete sessions unwritten this long (e.g. 30d), with their history and files, also for bots "
                    "whose `retention:` keeps them longer or for ever (the shorter wins).")
RETAIN_DEAD_HELP = "Delete dead letters this long after they died (e.g. 30d); the shorter of this and a bot's wins."


def server_retention(idle: float | None, dead_letters: float | None) -> Retention:
    """The server's cap on every bot's retention (`--retain-idle`, `--retain-dead-letters`)."""
    return Retention(idle_sessions=idle, dead_letters=dead_letters)


@click.command("purge")
@click.argument("bots", nargs=-1, type=BotPath())
@click.option("--store", "store_url", required=True, metavar="URL", help=STORE_HELP)
@click.option("--retain-idle", type=DURATION, default=None, metavar="DURATION", help=RETAIN_IDLE_HELP)
@click.option("--retain-dead-letters", type=DURATION, default=None, metavar="DURATION", help=RETAIN_DEAD_HELP)
@click.option("--principal", default=None, metavar="NAME",
              help="Erase everything stored of this principal instead: its sessions (history, files, pending "
                   "items), its dead letters, its undelivered events where its bot says `erased_outbox: drop`.")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def purge(bots: tuple[str, ...], store_url: str, retain_idle: float | None, retain_dead_letters: float | None,
          principal: str | None, dry_run: bool, as_json: bool) -> None:
    """Delete what is past the bots' retention now, or everything stored of one principal.

    What is past a bot's `retention:` (capped by --retain-idle and --retain-dead-letters) is
    what `chatrun serve`'s sweeper deletes as it runs. It prints how many sessions, files,
    dead letters and undelivered events went (or would, with --dry-run).

    Run it while the servers run or not: a session running a turn is left (and counted as busy).

    Exit status: 0 when done, 1 when some sessions were busy, 2 on errors.

    \b
    Examples:
      chatrun purge bots/shop --store sqlite:///sessions.db --dry-run
      chatrun purge bots/shop --store redis://127.0.0.1:6379/0 --retain-idle 30d
      chatrun purge bots/shop --store sqlite:///sessions.db --principal ana
    """
    configs = [_load(path) for path in bots]
    if principal is None and not configs:
        raise click.UsageError("name the bots whose retention applies (BOT...), or erase one --principal")
    cap = server_retention(retain_idle, retain_dead_letters)
    retention = {c.name: c.retention.capped(cap) for c in configs}
    counts = run_on_store(store_url, _purge(store_url, retention, principal, dry_run))
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "principal": principal, **counts.to_json()}, indent=2))
    else:
        what = f"principal {principal}" if principal is not None else ", ".join(retention)
        click.echo(f"{'would delete' if dry_run else 'deleted'} ({what}): {counts.shown()}")
        for sid in counts.busy:
            click.echo(f"busy     {sid}: running a turn; run purge again")
    if counts.busy:
        raise click.exceptions.Exit(1)


async def _purge(url: str, retention: dict[str, Retention], principal: str | None, dry_run: bool) -> Any:
    from chatrun.store.aio import open_existing_store
    from chatrun.store.blobs import blobs_of
    from chatrun.store.retention import SessionBusyNow, delete_stored, erase_principal, purge
    from chatrun.store.versions import SessionBusy

    store = await open_existing_store(url)
    blobs = blobs_of(store)

    async def delete(session_id: str, bot: str | None) -> int:
        try:  # held as a server holds it: a replica's turn on it is never cut short
            lease = await store.acquire(session_id, 0, reject=True)
        except SessionBusy as exc:
            raise SessionBusyNow(str(exc)) from None
        try:
            return await delete_stored(store, blobs, session_id, lease)
        finally:
            await store.release(lease)

    try:
        if principal is not None:
            return await erase_principal(store, principal, lambda bot: retention.get(bot or "", Retention()), delete,
                                         blobs, dry_run)
        return await purge(store, retention, time.time(), delete, blobs, dry_run)
    finally:
        await store.close()
        close = getattr(blobs, "close", None)
        if close is not None and blobs is not getattr(store, "blob_area", None):
            close()


def _load(path: str) -> Any:
    from chatrun.cli._output import print_diagnostics
    from chatrun.definition.loader import load_config
    from chatrun.errors import BotError, ChatrunError

    try:
        return load_config(path)[0]
    except BotError as exc:
        print_diagnostics([d for d in exc.diagnostics if d.severity == "error"])
    except ChatrunError as exc:
        click.echo(f"{path}: error: {exc}", err=True)
    raise click.exceptions.Exit(2)
