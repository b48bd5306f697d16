"""A real redis-server for tests (started on a free loopback port, no persistence), and
`chatrun serve` replicas as subprocesses. No tests here."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.extra = extra  # more redis-server options, e.g. "--requirepass", "s3cret"
        self.proc: subprocess.Popen | None = None

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def url(self, prefix: str | None = None) -> str:
        """A URL with its own key prefix: every test gets an empty keyspace."""
        return f"redis://127.0.0.1:{self.port}/0?prefix={prefix or 't' + secrets.token_hex(4) + ':'}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def answers_health(url: str, pid: int) -> bool:
    """Whether the `chatrun serve` of process `pid` answers /health at `url`. Another process
    (a second suite on this machine) may hold the port: its answer names another replica."""
    try:
        answer = httpx.get(f"{url}/health", timeout=0.5)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and answer.json().get("replica", "").endswith(f":{pid}")


class PortTaken(AssertionError):
    """`chatrun serve` could not listen: another process took the free port first."""


class Replica:
    """`chatrun serve BOT --store STORE` in a subprocess on a free port."""

    def __init__(self, bot: str, store: str, fake_url: str, *extra: str):
        self.bot, self.store, self.fake_url, self.extra = bot, store, fake_url, extra
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/_chat/routes"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "chatrun", "serve", self.bot, "--port", str(self.port),
                "--store", self.store, "--log-level", "warning", *self.extra]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "runner"), env.get("PYTHONPATH")]))
        env["OPENAI_BASE_URL"] = self.fake_url
        env["OPENAI_API_KEY"] = "test-key"
        env.pop("CHATRUN_AUTH_FILE", None)
        return env

    def start(self, wait: bool = True) -> Replica:
        first = self.proc is None  # no one has its URL yet: a port taken meanwhile may be swapped for another
        for _attempt in range(5):
            self.proc = subprocess.Popen(self.command(), env=self.env(), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
            if not wait:
                return self
            try:
                self.wait_ready()
                return self
            except PortTaken:
                if not first:
                    raise
                self.port = free_port()  # another process (a second suite) took it between free_port and listen
        raise AssertionError("chatrun serve found no free port in 5 tries")

    def wait_ready(self, timeout: float = 90) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = self.proc.stdout.read().decode()
                if "Address already in use" in output:
                    raise PortTaken(output)
                raise AssertionError(f"chatrun serve exited: {output}")
            if answers_health(self.url, self.proc.pid):
                return
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"chatrun serve did not start in {timeout} s (a loaded machine?): {self.output()}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    @contextmanager
    def served(self) -> Iterator[Replica]:
        """The replica (started already, or started here) until the block ends, then stopped as
        Ctrl-C stops `chatrun serve` (SIGINT: a graceful shutdown)."""
        if self.proc is None:
            self.start()
        try:
            yield self
        finally:
            self.signal(signal.SIGINT)
            self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def output(self) -> str:
        assert self.proc is not None and self.proc.poll() is not None
        return self.proc.stdout.read().decode(errors="replace")
