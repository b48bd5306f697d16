"""Errors and diagnostics shared by every part of chatrun."""

from __future__ import annotations

from dataclasses import asdict, dataclass


class ChatrunError(Exception):
    """Base class of every error chatrun raises on purpose.

    The message is written for a bot author: it names the place and says what to do.
    """


@dataclass(frozen=True)
class Diagnostic:
    """One problem found in a bot or transcript file.

    `path` is the JSON path of the node at fault ("routes.flight.system"), `line`
    and `col` are 1-based positions in `file` (0 when unknown).
    """

    file: str
    line: int
    col: int
    severity: str  # "error" | "warning"
    message: str
    path: str = ""

    def format(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}:{self.col or 1}"
        return f"{where}: {self.severity}: {self.message}"

    def to_dict(self) -> dict:
        return asdict(self)


class BotError(ChatrunError):
    """A bot (or transcript) is invalid. Carries every diagnostic found, not just the first."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        errors = [d for d in self.diagnostics if d.severity == "error"]
        shown = errors or self.diagnostics
        head = "\n".join(d.format() for d in shown)
        super().__init__(head)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]


class ModelError(ChatrunError):
    """The model could not be reached or answered something unusable (after retries)."""


class SessionError(ChatrunError):
    """A session API call was misused: unknown route, unknown or closed session."""


class UnknownRouteError(SessionError):
    """A route name that the bot does not define."""

    def __init__(self, route: str, known: list[str]):
        self.route = route
        self.known = sorted(known)
        super().__init__(f"unknown route {route!r}; the bot defines: {', '.join(self.known)}")
