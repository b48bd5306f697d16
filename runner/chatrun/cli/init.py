"""`chatrun init NAME [--template hello|wizard|support]`: a new bot directory that validates
and passes `chatrun test` as written: a commented bot.yaml (with the `$schema` modeline for
editors), one golden transcript and a short README. The starters live in cli/starters/.

The modelines point at copies of the schemas inside the bot (`.chatrun/schemas/`, see
cli/schema.py), relatively: a path into the author's virtualenv would break as soon as the
bot is committed, cloned elsewhere or chatrun is installed again."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click

from chatrun.cli.schema import BOT_SCHEMA_DIR, schema_ref, write_schemas
from chatrun.version import DOCS_URL

STARTERS = Path(__file__).parent / "starters"
TEMPLATES = ("hello", "wizard", "support")


def bot_name(directory: Path) -> str:
    """A valid bot name from the directory's name: `My Bot!` -> `My_Bot`."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", directory.resolve().name).strip("_-") or "bot"
    return name if re.match(r"[A-Za-z_]", name) else f"_{name}"


def _utf8_name(directory: Path) -> None:
    """The bot's files name its directory (`chatrun repl DIR` in their comments), and they are UTF-8
    text: a name that is not (a byte such as 0xff, which the file system allows) cannot be written."""
    try:
        str(directory).encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = str(directory).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        byte = str(directory)[exc.start].encode("utf-8", "surrogateescape")
        raise click.BadParameter(f"{shown} is not UTF-8 text (byte {byte[0]:#04x}): the bot's files name "
                                 "their directory and are UTF-8; choose a name in UTF-8", param_hint="NAME") from None


def render_starter(template: str, directory: Path) -> dict[Path, str]:
    """The files to write (path -> text), placeholders filled in."""
    source = STARTERS / template
    files: dict[Path, str] = {}
    for path in sorted(source.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(source)
        target = directory / rel
        text = path.read_text(encoding="utf-8")
        replacements = {
            "__NAME__": bot_name(directory),
            "__DIR__": shlex.quote(directory.as_posix()),  # in commands to copy: `chatrun repl 'my bot'`
            "__DOCS__": DOCS_URL,
            "__SCHEMA__": schema_ref(directory / BOT_SCHEMA_DIR / "bot.schema.json", target.parent),
            "__TRANSCRIPT_SCHEMA__": schema_ref(directory / BOT_SCHEMA_DIR / "transcript.schema.json", target.parent),
        }
        for key, value in replacements.items():
            text = text.replace(key, value)
        files[target] = text
    return files


def create_bot(directory: Path, template: str = "hello") -> list[Path]:
    """Write the starter into `directory` (which must not hold a bot yet); the files written."""
    files = render_starter(template, directory)
    existing = [p for p in files if p.exists()]
    if existing or (directory.exists() and any(directory.iterdir())):
        what = ", ".join(str(p) for p in existing) or f"{directory} is not empty"
        raise click.ClickException(f"refusing to overwrite: {what}; choose a new directory")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return [*files, *write_schemas(directory / BOT_SCHEMA_DIR)]


def copy_example_bot(directory: Path, example: str) -> list[Path]:
    """Copy an example bot (`chatrun examples`) into `directory`, which must not hold files yet."""
    from chatrun.cli.examples import copy_example, example_path

    example_path(example)  # an unknown name fails before anything is written
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise click.ClickException(f"refusing to overwrite: {directory} is not empty; choose a new directory")
    schemas = directory / BOT_SCHEMA_DIR
    write_schemas(schemas)  # first: the copy's modelines are pointed at these
    return [*copy_example(example, directory, schemas), *sorted(schemas.iterdir())]


@click.command()
@click.argument("name", metavar="[NAME]", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--template", "-t", type=click.Choice(TEMPLATES), default="hello", show_default=True,
              help="hello: one route; wizard: a nested scope collecting answers; support: state, events and roles.")
@click.option("--example", "-e", metavar="BOT", help="Copy this example bot with its transcripts instead "
              "(`chatrun examples` lists them); NAME defaults to BOT.")
def init(name: Path | None, template: str, example: str | None) -> None:
    """Create a bot directory NAME: bot.yaml, a golden transcript and a README.

    \b
    Examples:
      chatrun init mybot
      chatrun init bots/pizza --template wizard
      chatrun init desk -t support && chatrun test desk
      chatrun init --example travel
    """
    if name is None and example is None:
        raise click.UsageError("say which directory to create: chatrun init NAME (or copy an example bot: "
                               "chatrun init --example BOT; `chatrun examples` lists them)")
    directory = name if name is not None else Path(str(example))
    _utf8_name(directory)
    if directory.suffix.lower() in (".yaml", ".yml"):  # a bot is a directory: `init bots/x/bot.yaml` made one named bot.yaml
        raise click.BadParameter(f"{directory} names a file: a bot is a directory holding bot.yaml; give the "
                                 f"directory, e.g. chatrun init {shlex.quote(str(directory.parent))}"
                                 if directory.name.lower() in ("bot.yaml", "bot.yml") else
                                 f"{directory} names a YAML file: a bot is a directory holding bot.yaml; give a "
                                 "directory name, e.g. chatrun init mybot", param_hint="NAME")
    if example:
        written = copy_example_bot(directory, example)
        click.echo(f"copied the example bot {example} into {directory} ({len(written)} files, its transcripts "
                   "and the schemas its files name included)")
    else:
        for path in create_bot(directory, template):
            click.echo(f"created {path}")
    shown = shlex.quote(str(directory))
    click.echo(f"\nnext: chatrun validate {shown} && chatrun test {shown} && chatrun repl {shown}")
