"""`chatrun examples`: the example bots this install carries, and how to copy one
(`chatrun init --example NAME [DIR]`, cli/init.py).

The examples are the repository's bots/, each with its golden transcripts: the wheel carries
them as chatrun/examples (pyproject.toml maps the folder; there is no second copy in git), a
checkout reads bots/ itself. A copy is a bot of its own: its editor modelines are pointed at
the schemas `chatrun init` writes into it (`.chatrun/schemas/`), so nothing in it names the
repository or the virtualenv."""

from __future__ import annotations

import re
import shutil
from functools import partial
from importlib import resources
from pathlib import Path

import click
import yaml

from chatrun.cli.schema import schema_ref

_REPO_BOTS = Path(__file__).resolve().parents[3] / "bots"
# `# yaml-language-server: $schema=../../schemas/bot.schema.json#/$defs/fragment`: the path is rewritten,
# the schema's file name and any fragment kept.
MODELINE = re.compile(r"^(# yaml-language-server: \$schema=)(\S*/)?([\w-]+\.schema\.json)(#\S*)?$", re.M)
# Files a copy leaves out: what running a bot leaves behind, never part of the example.
LEFT_OUT = shutil.ignore_patterns("__pycache__", "*.pyc", "*.db", "*.db-*", ".chatrun")


def examples_dir() -> Path:
    """Where the example bots are: inside the installed package, else the checkout's bots/."""
    try:
        packaged = resources.files("chatrun") / "examples"
        if packaged.is_dir():
            return Path(str(packaged))
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        pass
    return _REPO_BOTS


def example_names() -> list[str]:
    """The example bots by name: the folders holding a bot.yaml (or versions/ of one)."""
    root = examples_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "bot.yaml").is_file() or (p / "versions").is_dir())


def example_path(name: str) -> Path:
    """The folder of example `name`; a click error listing the names when there is none."""
    names = example_names()
    if name not in names:
        raise click.BadParameter(f"no example bot `{name}`; the examples are: {', '.join(names) or '(none)'}",
                                 param_hint="'--example'")
    return examples_dir() / name


def description(folder: Path) -> str:
    """The bot's own `description:` (its newest version's, for a bot with versions/; a description
    written with `t('key')` read from its first locale's catalog)."""
    bot = folder / "bot.yaml"
    if not bot.is_file():
        versions = sorted((folder / "versions").glob("*/bot.yaml"), key=lambda p: p.parent.name)
        if not versions:
            return ""
        bot = versions[-1]
    doc = yaml.safe_load(bot.read_text(encoding="utf-8")) or {}
    text = str(doc.get("description", ""))
    key = re.search(r"t\(['\"]([\w.]+)['\"]\)", text)
    if key and doc.get("locales"):
        catalog = yaml.safe_load((folder / "locales" / f"{doc['locales'][0]}.yaml").read_text(encoding="utf-8"))
        for part in key.group(1).split("."):
            catalog = catalog.get(part, {}) if isinstance(catalog, dict) else {}
        text = catalog if isinstance(catalog, str) else text
    return text


def copy_example(name: str, directory: Path, schema_dir: Path) -> list[Path]:
    """Copy example `name` (bot, transcripts, handlers) into `directory`, its modelines pointed at
    the schemas in `schema_dir`; the files written."""
    shutil.copytree(example_path(name), directory, ignore=LEFT_OUT, dirs_exist_ok=True)
    written = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and schema_dir not in p.parents):
        if path.suffix in (".yaml", ".yml"):
            text = path.read_text(encoding="utf-8")
            pointed = MODELINE.sub(partial(modeline, schema_dir=schema_dir, from_dir=path.parent), text)
            if pointed != text:
                path.write_text(pointed, encoding="utf-8")
        written.append(path)
    return written


def modeline(match: re.Match[str], schema_dir: Path, from_dir: Path) -> str:
    return f"{match.group(1)}{schema_ref(schema_dir / match.group(3), from_dir)}{match.group(4) or ''}"


@click.command()
def examples() -> None:
    """List the example bots this install carries; `chatrun init --example NAME` copies one.

    Each comes with its golden transcripts, so `chatrun test` passes on the copy as it is.

    \b
    Examples:
      chatrun examples
      chatrun init --example travel
      chatrun init --example bank mybank && chatrun test mybank
    """
    names = example_names()
    if not names:
        raise click.ClickException("this install carries no example bots; `chatrun init mybot` writes a new one")
    width = max(map(len, names))
    for name in names:
        click.echo(f"{name:<{width}}  {description(examples_dir() / name)}")
    suggested = "travel" if "travel" in names else names[0]
    click.echo(f"\ncopy one, with its transcripts: chatrun init --example {suggested} [DIR]")
