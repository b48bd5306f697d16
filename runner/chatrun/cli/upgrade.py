"""`chatrun upgrade BOT...`: rewrite bots to the current format version, keeping every other byte.

ruamel.yaml reads the bot (round trip, so comments and key positions are known); the edit
itself is made on the text, one line, so comments, order, quoting and blank lines stay
exactly as they were: `format: N` is set to the current version, or added after `name:`.
What changed in meaning between the versions (definition/migrations.py, FORMAT_CHANGES) is
printed with the lines to review.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from chatrun.cli._output import BotPath


@dataclass
class Upgrade:
    """What upgrading one file does: its new text, what changed, and what to review by hand."""

    file: Path
    text: str
    changes: list[str] = field(default_factory=list)
    review: list[str] = field(default_factory=list)


@click.command("upgrade")
@click.argument("paths", nargs=-1, required=True, type=BotPath())
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 when a bot is not on the current format (for CI).")
def upgrade(paths: tuple[str, ...], check: bool) -> None:
    """Rewrite bots to the current format version, keeping comments and order, and print
    what changed. A bot served in several versions (`versions/<v>/bot.yaml`) has each
    version upgraded.

    Exit status: 0 when done (or, with --check, when every bot is current), 1 when --check
    finds a bot to upgrade, 2 on errors (a bot that cannot be read: the others are still
    upgraded, and every error is printed).

    \b
    Examples:
      chatrun upgrade bots/travel
      chatrun upgrade bots/shop        (versions/1/bot.yaml, versions/2/bot.yaml, ...)
      chatrun upgrade --check bots/*/
    """
    outdated, failed = 0, 0
    for path in [bot for given in paths for bot in each_bot(given)]:
        try:
            result = upgraded(path)
        except Exception as exc:  # never a traceback from the CLI: `file:line: message`, exit 2
            click.echo(f"{exc}" if str(exc).startswith(path) else f"{path}: error: {exc}", err=True)
            failed += 1
            continue
        for line in [*result.changes, *result.review]:
            click.echo(line)
        if not result.changes:
            click.echo(f"{result.file}: already on the current format")
            continue
        outdated += 1
        if not check:
            result.file.write_text(result.text, encoding="utf-8")
    if failed:
        click.echo(f"{failed} bot(s) could not be upgraded (above)", err=True)
        raise click.exceptions.Exit(2)
    if check and outdated:
        click.echo(f"{outdated} bot(s) to upgrade: run chatrun upgrade {' '.join(paths)}")
        raise click.exceptions.Exit(1)


def each_bot(path: str) -> list[str]:
    """The bots a path names: itself, or each version of a bot in versions/ (docs/versions.md)."""
    from chatrun.definition.versions import version_folders

    found = version_folders(path)
    return [str(folder) for _, folder in found] if found is not None else [path]


def bot_file(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "bot.yaml"
        if not p.is_file():
            raise ValueError(f"no bot.yaml in directory {path}")
    return p


def upgraded(path: str) -> Upgrade:
    """The bot's main file as the current format would have it."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    from chatrun.definition.config import CURRENT_FORMAT, SUPPORTED_FORMATS

    file = bot_file(path)
    text = file.read_text(encoding="utf-8")
    data = YAML().load(text)
    if not isinstance(data, CommentedMap):
        raise ValueError(f"{file}: not a YAML mapping")
    lines = text.splitlines(keepends=True)
    result = Upgrade(file, text)
    declared = data.get("format")
    if declared == CURRENT_FORMAT:
        return result
    if declared is not None and declared not in SUPPORTED_FORMATS:
        raise ValueError(f"{file}:{data.lc.key('format')[0] + 1}: format {declared!r} is not one this chatrun "
                         f"reads ({', '.join(map(str, SUPPORTED_FORMATS))})")
    if declared is None:
        at = data.lc.key("name")[0] + 1 if "name" in data else _first_key_line(data)
        lines.insert(at, f"format: {CURRENT_FORMAT}\n")
        result.changes.append(f"{file}:{at + 1}: added `format: {CURRENT_FORMAT}`")
    else:
        row, col = data.lc.value("format")
        line = lines[row]
        lines[row] = line[:col] + str(CURRENT_FORMAT) + line[col + len(str(declared)):]
        result.changes.append(f"{file}:{row + 1}: `format: {declared}` is now `format: {CURRENT_FORMAT}`")
        result.review += _review(path, declared)
    result.text = "".join(lines)
    return result


def _first_key_line(data: Any) -> int:
    keys = list(data)
    return int(data.lc.key(keys[0])[0]) if keys else 0


def _review(path: str, old_format: int) -> list[str]:
    """The `set` templates whose meaning the upgrade changes, to check by hand."""
    from chatrun.definition.loader import load_config
    from chatrun.definition.migrations import FORMAT_CHANGES, set_templates

    if old_format >= 2:
        return []
    config, _ = load_config(path)
    return [f"{where}: review {what}: {FORMAT_CHANGES[2]}" for where, what in set_templates(config)]
