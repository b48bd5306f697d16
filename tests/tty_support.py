"""Driving a command through a real pseudo-terminal (stdlib `pty`), where a pipe cannot show
what a person at a terminal sees: line editing, Ctrl-C, long pastes, prompt order."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")


class Terminal:
    """A child process whose stdin, stdout and stderr are a pty it controls (Ctrl-C is SIGINT)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path = REPO, ignore_sigint: bool = False):
        pid, fd = pty.fork()
        if pid == 0:  # the child: become the command
            try:
                os.chdir(cwd)
                if ignore_sigint:  # as a script's background job starts (an ignored signal survives exec)
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.raw = b""
        self.pos = 0  # how much of the output expect() has consumed
        self.returncode: int | None = None

    @classmethod
    def chatrun(cls, args: list[str], home: Path, extra_env: dict[str, str] | None = None,
                ignore_sigint: bool = False) -> Terminal:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        env.update({"PYTHONPATH": str(REPO / "runner"), "HOME": str(home), "TERM": "xterm",
                    "INPUTRC": "/dev/null", "XDG_STATE_HOME": str(home / ".local" / "state"),
                    "COLUMNS": "100", "LINES": "40"})
        env.update(extra_env or {})
        return cls([sys.executable, "-m", "chatrun", *args], env, ignore_sigint=ignore_sigint)

    @property
    def text(self) -> str:
        """Everything printed so far, without terminal escape sequences."""
        return ANSI.sub(b"", self.raw).decode("utf-8", "replace")

    def _pump(self, timeout: float) -> bool:
        """Read what is available within `timeout`; False once the child closed the terminal."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child is gone
            return False
        if not data:
            return False
        self.raw += data
        return True

    def expect(self, text: str, timeout: float = 60) -> str:
        """Wait until `text` appears after what earlier calls consumed; return the output up to it."""
        deadline = time.monotonic() + timeout
        while True:
            clean = self.text
            found = clean.find(text, self.pos)
            if found >= 0:
                before = clean[self.pos:found]
                self.pos = found + len(text)
                return before
            if time.monotonic() > deadline or not self._pump(0.2):
                raise AssertionError(f"{text!r} did not appear; the terminal shows:\n{clean[self.pos:][-3000:]}")

    def send(self, data: str | bytes) -> None:
        """Type `data`, in pieces, reading the echo meanwhile so neither side blocks."""
        data = data.encode() if isinstance(data, str) else data
        while data:
            _, writable, _ = select.select([], [self.fd], [], 0.2)
            if writable:
                written = os.write(self.fd, data[:1024])
                data = data[written:]
            self._pump(0)

    def interrupt(self) -> None:
        """Press Ctrl-C once the program is waiting for a key again. CPython's readline checks
        for a signal only when it interrupts its wait for input: a SIGINT that lands while it is
        still handling the previous key (its echo already shown) waits for the next line. A
        person never types that fast; a loaded test machine can deschedule it right there."""
        time.sleep(0.3)
        self.send("\x03")

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.returncode is None:
            self._pump(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"the command did not exit; it shows:\n{self.text[-3000:]}")
        while self._pump(0.05):  # the last output
            if not select.select([self.fd], [], [], 0)[0]:
                break
        return self.returncode

    def close(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.returncode = -9
        if self.fd >= 0:  # closing twice (a failed wait closed it already) is a no-op
            os.close(self.fd)
            self.fd = -1
