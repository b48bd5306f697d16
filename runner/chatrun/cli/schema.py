"""`chatrun schema [bot|transcript|wire]`: the path of a JSON Schema, for editors that need a file."""

from __future__ import annotations

import click

from chatrun.definition.schemas import schema_path

SCHEMAS = {"bot": "bot.schema.json", "transcript": "transcript.schema.json", "wire": "wire.schema.json"}


@click.command()
@click.argument("which", type=click.Choice(list(SCHEMAS)), default="bot")
def schema(which: str) -> None:
    """Print the path of chatrun's JSON Schema for bots (default), transcripts or wire frames.

    \b
    Examples:
      chatrun schema
      chatrun schema transcript
    """
    click.echo(schema_path(SCHEMAS[which]).resolve())
