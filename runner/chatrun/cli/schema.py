"""`chatrun schema [bot|transcript|scenario|wire]`: the path of a JSON Schema, for editors that need a
file; `chatrun schema --write DIR` copies all of them into DIR (what `chatrun init` does for a
new bot's `.chatrun/schemas/`, so its modelines point at files committed with it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import click

from chatrun.definition.schemas import BOT_SCHEMA_DIR, schema_path

SCHEMAS = {"bot": "bot.schema.json", "transcript": "transcript.schema.json", "scenario": "scenario.schema.json",
           "wire": "wire.schema.json"}
__all__ = ["BOT_SCHEMA_DIR", "SCHEMAS", "schema", "schema_ref", "write_schemas"]


def schema_ref(schema: Path, from_dir: Path) -> str:
    """How a file in `from_dir` names a schema: relative when it can be, else absolute."""
    schema, from_dir = schema.resolve(), from_dir.resolve()
    try:
        shared = Path(os.path.commonpath([schema, from_dir]))
    except ValueError:  # another drive (Windows)
        return schema.as_posix()
    if shared == Path(shared.anchor):  # nothing in common but the root: the absolute path reads better
        return schema.as_posix()
    return Path(os.path.relpath(schema, from_dir)).as_posix()


def write_schemas(directory: Path) -> list[Path]:
    """Copy every schema into `directory` (made if missing, copies replaced); the files written."""
    if directory.exists() and not directory.is_dir():
        raise click.ClickException(f"{directory} is a file; --write needs a directory")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SCHEMAS.values():
        target = directory / name
        shutil.copyfile(schema_path(name), target)
        written.append(target)
    return written


@click.command()
@click.argument("which", type=click.Choice(list(SCHEMAS)), default="bot")
@click.option("--write", "write_dir", metavar="DIR", type=click.Path(path_type=Path),
              help="Copy all the schemas (bot, transcript, scenario, wire) into DIR, replacing older copies.")
def schema(which: str, write_dir: Path | None) -> None:
    """Print the path of chatrun's JSON Schema for bots (default), transcripts, scenarios or wire frames.

    With --write DIR, copy them all into DIR instead (`chatrun init` puts them in the bot's
    .chatrun/schemas/; refresh those copies after upgrading chatrun).

    \b
    Examples:
      chatrun schema
      chatrun schema transcript
      chatrun schema --write mybot/.chatrun/schemas
    """
    if write_dir is not None:
        for path in write_schemas(write_dir):
            click.echo(f"wrote {path}")
        return
    click.echo(schema_path(SCHEMAS[which]).resolve())
