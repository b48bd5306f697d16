"""`chatrun record --from-session ID --store URL -o FILE`: a stored session becomes a golden transcript."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from chatrun.cli._output import BotPath, fail


@click.command("record")
@click.option("--from-session", "session_id", required=True, metavar="ID", help="The session to record.")
@click.option("--store", "store_url", required=True, metavar="URL",
              help="Where it is stored, as `chatrun serve --store` says: sqlite:///sessions.db, redis://host:6379/0, postgresql://user@host/db.")
@click.option("--bot", "bot_path", type=BotPath(), default=None,
              help="The bot (its directory or YAML file); default: bots/NAME or ./NAME for the session's bot NAME.")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), required=True,
              help="The transcript to write, e.g. bots/travel/transcripts/ticket_4711.yaml.")
def record(session_id: str, store_url: str, bot_path: str | None, output: str) -> None:
    """Turn a stored session into a golden transcript whose tool results are mocks.

    Each turn's input, the model's answers and what the HTTP and MCP tools returned come from
    the session's history; its expectations are what happened (route, stack, the user's events,
    the tool calls and their arguments). Files the session's messages attached are written
    beside the transcript (in `<name>.files/`) and attached again (`attach:`). The transcript
    is then replayed once: exit status 0 when the replay does exactly what the session did, 1
    (and the differences) when not.

    \b
    Example:
      chatrun record --from-session s1 --store sqlite:///sessions.db -o bots/travel/transcripts/s1.yaml
    """
    from chatrun.engine.bot import load_bot
    from chatrun.errors import ChatrunError
    from chatrun.toolkinds import outside
    from chatrun.transcripts.from_session import (
        bot_reference,
        fixture_paths,
        load_stored_session,
        transcript_of,
        write_fixtures,
        write_transcript,
    )
    from chatrun.transcripts.run import run_transcript

    try:
        stored = asyncio.run(load_stored_session(store_url, session_id))
        where = Path(bot_path) if bot_path else _find_bot(stored.bot)
        bot = load_bot(str(where))
        if stored.bot and bot.name != stored.bot:
            raise ChatrunError(f"session {session_id} talks to bot {stored.bot}, and {where} is bot {bot.name}")

        def is_outside(name: str) -> bool:
            tool = bot.config.tools.get(name)
            return tool is None or outside(tool) is not None  # not declared: a route's MCP tool

        path = Path(output)
        fixtures = fixture_paths(stored, f"{path.stem}.files")  # the attached files, beside the transcript
        doc = transcript_of(stored, bot.config, bot_reference(where, path.parent), is_outside, fixtures)
        write_transcript(doc, path, session_id, store_url)  # first: it refuses a file that is not a transcript
        write_fixtures(stored, fixtures, path.parent)
        result = run_transcript(str(path))
    except Exception as exc:  # never a traceback from the CLI
        fail(exc)
    turns = len(doc["turns"])
    if result.passed:
        click.echo(f"{path}: {turns} turn{'s' if turns != 1 else ''} recorded; the replay does what the session did")
        return
    click.echo(f"{path}: written, but the replay differs from what happened:\n{result.report()}", err=True)
    raise click.exceptions.Exit(1)


def _find_bot(name: str | None) -> Path:
    from chatrun.errors import ChatrunError

    for candidate in (Path("bots") / str(name), Path(str(name))):
        if name and (candidate / "bot.yaml").is_file():
            return candidate
    raise ChatrunError(f"cannot find bot {name!r} (looked in bots/{name} and ./{name}); say where with --bot DIR")
