"""Session versions: the fencing token every stored session carries.

A version is "<n>.<random>": n counts the commits of the session (1 for the commit that
created it), the random part tells apart two sessions that reused an id after a delete. A
commit names the version its turn started from; the store refuses it when the stored
version is another one (someone else committed, or deleted the session, meanwhile).
Versions are compared for equality only.
"""

from __future__ import annotations

import secrets

from chatrun.errors import ChatrunError

CREATE = ""  # expected version of a commit that creates the session: refused if it exists
KEEP_OUTCOMES = 1000  # recorded request outcomes kept per session (the oldest are dropped)


class StaleVersion(ChatrunError):
    """A commit refused: the stored session is not at the version the turn started from."""

    def __init__(self, session_id: str, expected: str | None, found: str | None, why: str = ""):
        self.session_id, self.expected, self.found = session_id, expected, found
        if why:
            text = why
        elif expected == CREATE:
            text = f"session {session_id} already exists (version {found})"
        elif found is None:
            text = f"session {session_id} was deleted meanwhile"
        else:
            text = f"session {session_id} is at version {found}, not {expected}: another request committed first"
        super().__init__(text)


class LeaseLost(StaleVersion):
    """A commit refused: the turn's lease on the session expired and may be someone else's now."""

    def __init__(self, session_id: str):
        super().__init__(
            session_id, None, None,
            f"the lease on session {session_id} expired during the turn (the turn outlived the lease "
            "or could not renew it), so another request may hold the session",
        )


class SessionBusy(ChatrunError):
    """The session is running a turn and the request asked not to wait (or waited too long)."""


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
