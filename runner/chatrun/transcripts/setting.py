"""What a conversation under test starts with, shared by transcripts (run.py) and scenarios
(scenario.py): the bot's versions, and the pinned clock."""

from __future__ import annotations

from typing import Any

from chatrun.engine.clock import FixedClock, parse_duration, parse_instant
from chatrun.errors import ChatrunError


def load_bot_cached(path: str, bots: dict[str, Any] | None) -> Any:
    from chatrun.engine.bot import load_bot

    if bots is None:
        return load_bot(path)
    if path not in bots:
        bots[path] = load_bot(path)
    return bots[path]


class VersionProblem(ChatrunError):
    """A transcript's `version:` or `upgrade:` the bot does not have, or a downgrade."""


def versions_at(path: Any, bots: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
    """The versions of the bot at `path`, oldest first, as (label, Bot) (see `bot_versions`):
    the one rule for transcripts and scenarios."""
    from chatrun.definition.versions import version_layout

    layout = version_layout(path)
    if layout is None:
        bot = load_bot_cached(str(path), bots)
        return [(bot.config.version or bot.config.content_version, bot)]
    return [(label, load_bot_cached(str(folder), bots)) for label, folder in layout.versions]


def version_index(versions: list[tuple[str, Any]], wanted: str, where: str, bot: str) -> int:
    """Where `wanted` (a label, a content hash or a human `version:`) is among `versions`."""
    for i, (label, found) in enumerate(versions):
        if wanted in (label, found.config.content_version, found.config.version):
            return i
    have = ", ".join(f"{label} ({found.config.content_version})" for label, found in versions)
    raise VersionProblem(f"{where} bot {bot} has no version {wanted!r}; it has: {have}")


def pin_clock(session: Any, clock: str | dict[str, Any]) -> None:
    """A top-level `clock:` (a transcript's, a scenario's): the session runs at that instant,
    moved on by its `advance` after every turn (`advance_clock`)."""
    setting = clock if isinstance(clock, dict) else {"at": clock}
    step = parse_duration(setting.get("advance", 0))
    session.clock = FixedClock(parse_instant(setting["at"], session.now().tzinfo), step)


def advance_clock(session: Any) -> None:
    """After a turn, a pinned clock moves on by the transcript's `clock: {advance: ..}`."""
    if isinstance(session.clock, FixedClock):
        session.clock.advance()
