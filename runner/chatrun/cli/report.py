"""`chatrun report --store URL [--since DATE] [--out report.html]`: containment, escalation and
abandonment, where conversations end, cost per resolved conversation, feedback and latency, by
bot version and locale, as one self-contained HTML file (docs/report.md; chatrun/report/)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from chatrun.cli._output import run_on_store

if TYPE_CHECKING:
    from chatrun.report.figures import Meanings

STORE_HELP = "The store the servers share (sqlite:///path/to.db, redis://host:port/db)."


def _since(value: str | None) -> float | None:
    """--since as epoch seconds: an ISO date or time (a time without a zone is UTC)."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date (write 2026-11-01 or 2026-11-01T09:00)",
                                 param_hint="--since") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _names(value: str) -> frozenset[str]:
    return frozenset(n.strip() for n in value.split(",") if n.strip())


@click.command("report")
@click.option("--store", "store_url", required=True, metavar="URL", help=STORE_HELP)
@click.option("--since", default=None, metavar="DATE", help="Only conversations that started then or later "
              "(2026-11-01, or 2026-11-01T09:00; UTC unless a zone is given).")
@click.option("--out", "out", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The HTML file to write.")
@click.option("--resolved", default="resolved", show_default=True, metavar="NAMES",
              help="The outcome names (comma-separated) that mean resolved: cost per resolved conversation.")
@click.option("--escalated", default="escalated", show_default=True, metavar="NAMES",
              help="The outcome names that mean handed to a person: escalation, and containment (the rest).")
@click.option("--abandoned", default="abandoned", show_default=True, metavar="NAMES",
              help="The outcome names that mean the user gave up: abandonment.")
def report(store_url: str, since: str | None, out: str, resolved: str, escalated: str, abandoned: str) -> None:
    """Write a report of the stored conversations as one self-contained HTML file.

    Containment, escalation and abandonment rates (from the outcomes the bots' `outcomes:`
    recorded), where conversations end, cost per resolved conversation, users' feedback and
    latency percentiles, for all conversations, each bot version and each locale.
    """
    from chatrun.report.figures import Meanings

    meanings = Meanings(_names(resolved), _names(escalated), _names(abandoned))
    html, count = run_on_store(store_url, _report(store_url, _since(since), since, meanings))
    try:  # a problem here is the file's, not the store's: named by its path
        Path(out).write_text(html, encoding="utf-8")
    except OSError as exc:
        click.echo(f"{out}: error: cannot write the report: {exc.strerror or exc}", err=True)
        raise click.exceptions.Exit(2) from None
    click.echo(f"wrote {out}: {count:,} conversations")


async def _report(store_url: str, since: float | None, since_text: str | None, meanings: Meanings) -> tuple[str, int]:
    from chatrun.report.figures import figures
    from chatrun.report.read import read_conversations
    from chatrun.report.render import report_html
    from chatrun.store.aio import open_existing_store

    store = await open_existing_store(store_url)
    try:
        found = figures(await read_conversations(store, since))
    finally:
        await store.close()
    # The store as it names itself (`AsyncStore.url`: without a password): the report is a file to share.
    return report_html(found, meanings, store.url, since_text), found.total.conversations
