"""pytest plugin: golden transcripts as test items.

Enabled by the `pytest11` entry point of the installed chatrun package. Only where that
entry point is not installed (e.g. running from a source tree via PYTHONPATH) load it with
`-p chatrun.pytest_plugin`; with it installed, `-p` makes pytest fail with
"Plugin already registered".
It collects every `*.yaml` / `*.yml` file under a directory named `transcripts` that has a
top-level `turns:` key (or `bot:`, or that does not parse: format.looks_like_transcript), so `pytest bots/` replays the bots' transcripts with pytest's own
reporting and options (-k, -x, -n with pytest-xdist). A failure shows the failing turn's
file:line and a diff of expected against actual, as `chatrun test` does. Transcripts that
declare no `roles:` though their bot has role-restricted routes are named once, in the
terminal summary: role checks are off in them (with -n too: the workers pass it on in
each report's user_properties).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # pytest types Node.repr_failure with these but does not export them
    from _pytest._code.code import TerminalRepr, TracebackStyle

_BOTS = pytest.StashKey[dict]()
ROLES_OFF_PROPERTY = "chatrun_roles_off"


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    if file_path.suffix not in (".yaml", ".yml") or "transcripts" not in file_path.parent.parts:
        return None
    from chatrun.transcripts.format import looks_like_transcript

    if not looks_like_transcript(file_path):  # as `chatrun test DIR` finds them
        return None
    return TranscriptFile.from_parent(parent, path=file_path)


class TranscriptFile(pytest.File):
    def collect(self) -> Iterator[TranscriptItem]:
        yield TranscriptItem.from_parent(self, name=self.path.stem)


class TranscriptFailed(Exception):
    """Carries the runner's report: pytest prints it instead of a traceback."""


class TranscriptItem(pytest.Item):
    """One transcript. Fixtures apply to it as to a test function without arguments: the
    autouse fixtures of conftest files (a bot's own setup, e.g. environment variables or a
    local API server) and `pytest.mark.usefixtures` run around it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # pytest gives fixtures to Function items; these are the same steps for this one.
        self._fixtureinfo = self.session._fixturemanager.getfixtureinfo(node=self, func=None, cls=None)
        self.fixturenames = self._fixtureinfo.names_closure
        self.funcargs: dict[str, Any] = {}

    def setup(self) -> None:
        from _pytest.fixtures import TopRequest

        self._request = TopRequest(self, _ispytest=True)  # type: ignore[arg-type]  # duck-typed as a Function
        self._request._fillfixtures()

    def runtest(self) -> None:
        from chatrun.transcripts.run import run_transcript

        bots = self.config.stash.setdefault(_BOTS, {})
        if self._roles_off(bots):
            self.user_properties.append((ROLES_OFF_PROPERTY, self._relpath()))
        result = run_transcript(self._relpath(), bots)  # an invalid transcript is a failed Result
        for warning in result.warnings:
            self.warn(pytest.PytestWarning(warning))
        if not result.passed:
            raise TranscriptFailed(result.report())

    def _roles_off(self, bots: dict[str, Any]) -> bool:
        from chatrun.errors import ChatrunError
        from chatrun.transcripts.format import load_transcript
        from chatrun.transcripts.roles import roles_off

        try:
            return roles_off(load_transcript(self._relpath()), bots)
        except ChatrunError:  # an invalid transcript: its run says why
            return False

    def _relpath(self) -> str:
        try:
            return str(self.path.relative_to(Path.cwd()))
        except ValueError:
            return str(self.path)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: TracebackStyle | None = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, TranscriptFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)  # a chatrun bug: show the traceback

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"transcript {self.name}"



def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(RolesOffNote(), "chatrun-roles-off-note")


class RolesOffNote:
    """Names, once at the end of the run, the transcripts that ran with role checks off
    (reported by this process, or by the workers of pytest-xdist)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.names += [str(value) for name, value in report.user_properties if name == ROLES_OFF_PROPERTY]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from chatrun.transcripts.roles import roles_off_note

        note = roles_off_note(self.names)
        if note:
            terminalreporter.write_line(note, yellow=True)
