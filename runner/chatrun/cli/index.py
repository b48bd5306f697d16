"""`chatrun index PATH`: build a bot's knowledge index, reading only the files that changed."""

from __future__ import annotations

import io

import click

from chatrun.cli._output import BotPath, fail, plural, print_diagnostics, summary
from chatrun.errors import BotError


@click.command("index")
@click.argument("path", type=BotPath())
@click.option("--quiet", "-q", is_flag=True, help="No progress bar; only the summary line.")
@click.option("--store", "store_url", metavar="URL", default=None,
              help="Build the index shared by replicas in PostgreSQL (postgresql://USER@HOST:PORT/DB, the URL "
              "`chatrun serve --store` is given) instead of the bot's folder.")
def index(path: str, quiet: bool, store_url: str | None) -> None:
    """Build the knowledge index of a bot's `knowledge:` sources, reading only changed files.

    Each file is cut into passages along its headings and indexed for full-text search (BM25,
    SQLite FTS5) in the bot's `.chatrun/knowledge.db`. A file whose bytes did not change since
    the last run is not read again; files gone from a folder leave the index. A running bot
    does the same on its first search, so this only moves the work ahead of the first user.

    Web pages (a source's `urls:` or `sitemap:`) are fetched here, and only here: a page
    that did not change (304, or the same bytes) is not cut again; a page that fails keeps
    its passages from the last run and is named on stderr at its source's line. The exit
    status is 1 when a web source yielded no page at all.

    With --store postgresql://…, the passages go to that database (full-text search by
    PostgreSQL, pgvector when installed), where every `chatrun serve --store` replica reads
    them at once; run it again after changing articles (docs/knowledge.md). Web pages go
    there too, as incrementally: each source's pages are written in one transaction.

    The bot is validated first (a missing, empty or unreadable source is an error at its line);
    an invalid bot is not indexed and the exit status is 1.

    \b
    Examples:
      chatrun index bots/helpcentre
      chatrun index bots/helpcentre --quiet
      chatrun index bots/helpcentre --store postgresql://chatrun@db:5432/chatrun
    """
    from chatrun.definition.loader import load_config
    from chatrun.knowledge import Library, open_index
    from chatrun.knowledge.index import plan

    shared = _shared_url(store_url)
    try:
        try:
            config, warnings = load_config(path)
        except BotError as exc:
            print_diagnostics(exc.diagnostics)
            click.echo(summary(exc.diagnostics, path), err=True)
            raise click.exceptions.Exit(1) from None
        print_diagnostics(warnings)
        if not config.knowledge:
            click.echo(f"{path}: the bot declares no `knowledge:` sources; nothing to index")
            return
        library = Library(config.root or ".", config.knowledge, config.model,
                          open_index(config, shared))
        files = plan(library.root, config.knowledge.values())
        pages = library.list_web()  # the web sources' pages (sitemaps fetched): only `chatrun index` fetches
        length = len(files) + sum(len(listing.urls) for listing in pages)
        with click.progressbar(length=length, label="Indexing", show_pos=True,
                               file=io.StringIO() if quiet else None) as bar:
            try:
                done = library.refresh(lambda item: bar.update(1), pages)
            finally:
                library.close()
    except click.exceptions.Exit:
        raise
    except Exception as exc:  # never a traceback from the CLI
        fail(exc)
    for problem in done.problems:
        click.echo(f"{path}: left out: {problem}", err=True)
    for problem in library.web.problems:  # each page that failed, at its source's line; its passages are kept
        click.echo(problem, err=True)
    for name in library.web.silent:
        click.echo(f"{path}: knowledge source `{name}`: no page could be fetched", err=True)
    if done.embeddings_problem:  # not a failure: searches use BM25 alone until the endpoint answers
        click.echo(f"{path}: no embeddings ({done.embeddings_problem}); searches use BM25 alone", err=True)
    embedded = f", {done.embedded} embedded" if library.embedding_models(list(config.knowledge)) else ""
    folders = any(not source.web for source in config.knowledge.values())
    held = " and ".join([plural(done.files, "file")] * folders + [plural(library.web.pages, "page")] * bool(pages))
    click.echo(f"{path}: {held} in {plural(len(config.knowledge), 'source')}, "
               f"{done.changed} read, {done.removed} removed{embedded}; {plural(done.passages, 'passage')} in "
               f"{library.where}")
    if done.problems or library.web.silent:  # a page that failed alone is not: the others answered
        raise click.exceptions.Exit(1)



def _shared_url(url: str | None) -> str | None:
    """The shared index's URL (None: the bot's folder); a store that cannot hold one is refused."""
    from chatrun.store import POSTGRES_SCHEMES
    from chatrun.store.urls import shown_url

    if url is None or url.startswith(POSTGRES_SCHEMES):
        return url
    raise click.BadParameter(f"{shown_url(url)!r}: a shared knowledge index lives in PostgreSQL (postgresql://USER@HOST:PORT/DB); "
                             "without --store the index is the bot folder's .chatrun/knowledge.db",
                             param_hint="--store")
