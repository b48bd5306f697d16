"""What time it is for a conversation: the seam behind the templates' `now` and `today`.

A session asks its `Clock` (the system clock unless told otherwise) and shows the instant
in the bot's `timezone:` (or the session's own, `state.timezone`). Golden transcripts and
the REPL's `/clock` pin it with a `FixedClock`, so a rule such as "no same-day changes"
replays the same on every machine and every day. Nothing else in chatrun reads the time
of day for templates: a test that pins the clock pins everything a bot can see of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import partial
from typing import Protocol

from chatrun.definition.templates import later, zone_named
from chatrun.errors import TurnFailed

_DURATION_PART = re.compile(r"(\d+)\s*(d|h|m|s)")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, timezone-aware (any zone: the session converts it)."""
        ...


class SystemClock:
    """The machine's clock (the default)."""

    # The C function itself, bound once: reading the machine's clock runs no Python frame of ours.
    now = staticmethod(partial(datetime.now, UTC))

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()  # stateless: every session that does not pin its clock shares it


@dataclass
class FixedClock:
    """A pinned instant that moves only when told: `advance()` by `step` (or by what it is
    given), or `set()` to another instant. Transcripts advance it after every turn."""

    at: datetime
    step: timedelta = timedelta(0)

    def __post_init__(self) -> None:
        if self.at.tzinfo is None:
            raise ValueError(f"a pinned clock needs an instant with a UTC offset or zone, not {self.at.isoformat()}")

    def now(self) -> datetime:
        return self.at

    def set(self, at: datetime) -> None:
        if at.tzinfo is None:
            raise ValueError(f"a pinned clock needs an instant with a UTC offset or zone, not {at.isoformat()}")
        self.at = at

    def advance(self, by: timedelta | None = None) -> None:
        step = self.step if by is None else by
        try:
            self.at = later(self.at, step)
        except OverflowError:  # a datetime ends with the year 9999
            raise ValueError(f"the clock cannot move {step} on from {self.at.isoformat()}: past the year 9999") from None


@dataclass(frozen=True)
class FileClock:
    """The instant written in a file (ISO 8601 with an offset), read at every look; the system
    clock while the file is missing or empty. `chatrun serve --clock-file` gives it to every
    session and to the sweeper, so a test of a running server (or a demo) moves time by
    writing the file: timeouts, retention and `now` all see the same instant."""

    path: str

    def now(self) -> datetime:
        try:
            text = open(self.path, encoding="utf-8").read().strip()  # noqa: SIM115 - read whole at once
        except FileNotFoundError:
            text = ""
        if not text:
            return datetime.now(UTC)
        try:
            return parse_instant(text)
        except ValueError as exc:
            raise TurnFailed(f"{self.path}: the clock file holds {text[:60]!r}, not an instant "
                             f"(write e.g. 2026-12-05T10:00:00+00:00): {exc}") from None

    def timestamp(self) -> float:
        """The instant as epoch seconds (the sweeper's clock)."""
        return self.now().timestamp()


def parse_instant(text: str, zone: tzinfo | None = None) -> datetime:
    """An ISO 8601 date-time (`2026-11-25T09:00:00+01:00`; a date alone is its midnight).
    Without an offset it is read in `zone`; with neither it is an error (ValueError)."""
    value = datetime.fromisoformat(str(text).strip())
    if value.tzinfo is None:
        if zone is None:
            raise ValueError(f"{text!r} has no UTC offset; write it as e.g. {value.isoformat()}+01:00")
        value = value.replace(tzinfo=zone)
    return value


def parse_duration(text: str | int | float) -> timedelta:
    """`5m`, `90s`, `1h30m`, `2d` (or a number of seconds). Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"not a duration: {text!r} (a clock only moves forward)")
        return timedelta(seconds=text)
    compact = str(text).replace(" ", "")
    parts = _DURATION_PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"not a duration: {text!r} (write e.g. 30s, 5m, 1h30m, 2d)")
    total = timedelta(0)
    try:
        for number, unit in parts:
            total += timedelta(**{_UNITS[unit]: int(number)})
    except OverflowError:  # over 999,999,999 days: no clock goes that far
        raise ValueError(f"not a duration: {text!r} (too long for a clock)") from None
    return total


def session_zone(bot_zone: str | None, state_zone: object) -> tzinfo:
    """The zone a conversation's `now` is shown in: the session's own (`state.timezone`, when
    it is a text), else the bot's `timezone:`, else UTC."""
    if isinstance(state_zone, str) and state_zone:
        zone = zone_named(state_zone)
        if zone is None:
            raise TurnFailed(f"state.timezone is {state_zone!r}, which is not an IANA time zone name "
                             "(e.g. Europe/Paris, America/New_York, UTC)")
        return zone
    if bot_zone:
        return zone_named(bot_zone) or UTC  # validated at load
    return UTC
