"""Session versions: the fencing token every stored session carries.

A version is "<n>.<random>": n counts the commits of the session (1 for the commit that
created it), the random part tells apart two sessions that reused an id after a delete. A
commit names the version its turn started from; the store refuses it when the stored
version is another one (someone else committed, or deleted the session, meanwhile).
Versions are compared for equality only.
"""

from __future__ import annotations

import secrets

from chatrun.errors import LeaseLost, SessionBusy, StaleVersion

__all__ = ["CREATE", "KEEP_OUTCOMES", "LeaseLost", "SessionBusy", "StaleVersion", "check_version",
           "next_version", "version_number"]

CREATE = ""  # expected version of a commit that creates the session: refused if it exists
KEEP_OUTCOMES = 1000  # recorded request outcomes kept per session (the oldest are dropped)


def next_version(current: str | None) -> str:
    number = 0 if not current else version_number(current)
    return f"{number + 1}.{secrets.token_hex(4)}"


def version_number(version: str | None) -> int:
    """The commit count of a version ("7.ab12cd34" -> 7; none -> 0)."""
    if not version:
        return 0
    try:
        return int(version.split(".", 1)[0])
    except ValueError:
        return 0


def check_version(session_id: str, expected: str | None, current: str | None) -> None:
    """Raise StaleVersion unless a commit expecting `expected` may land on `current`.
    `expected` None: no check (a single writer, such as the REPL)."""
    if expected is None:
        return
    if expected == CREATE:
        if current is not None:
            raise StaleVersion(session_id, expected, current)
    elif current != expected:
        raise StaleVersion(session_id, expected, current)
