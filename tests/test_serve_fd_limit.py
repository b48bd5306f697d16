"""`chatrun serve` under a lowered file-descriptor limit (issue 27, "Slowloris beats
--max-connections"): connections that never finish their headers cannot make the server
unreachable, and a cap that does not fit under the limit is said at start-up. Real processes
(`ulimit -n 256` through setrlimit), real sockets."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from redis_support import REPO, free_port

pytestmark = pytest.mark.slow
FD_LIMIT = 256


def lowered_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def start(tmp_path: Path, port: int, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO / "runner"), OPENAI_API_KEY="unused")
    return subprocess.Popen(
        [sys.executable, "-m", "chatrun", "serve", str(REPO / "bots" / "hello"), "--port", str(port),
         "--store", f"sqlite:///{tmp_path / 'chat.db'}", "--log-level", "warning", *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=lowered_fd_limit)


def startup_lines(proc: subprocess.Popen, timeout: float = 90) -> list[str]:
    """stderr up to the "serving" line (the start-up warnings come before it)."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"chatrun serve exited: {''.join(lines)}")
        lines.append(line)
        if "chatrun: serving" in line:
            return lines
    raise AssertionError(f"chatrun serve did not start in {timeout} s: {''.join(lines)}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def test_stalled_connections_past_the_fd_limit_leave_new_clients_a_503(tmp_path):
    port = free_port()
    proc = start(tmp_path, port, "--max-connections", "180", "--header-timeout", "300")
    stalled: list[socket.socket] = []
    try:
        lines = startup_lines(proc)
        assert not any("open-file limit" in line for line in lines), lines  # 180 + reserve fits
        # More stalled connections than the process has descriptors: each sends half a request.
        for _ in range(306):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            stalled.append(sock)
        # A new client is answered at once (503), not left without an answer until they time out.
        answer = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert answer.json()["error"] == "Unavailable" and "--max-connections" in answer.json()["message"]
        # The stalled connections over the cap were refused when accepted, with the same answer.
        stalled[-1].settimeout(30)
        assert stalled[-1].recv(4096).startswith(b"HTTP/1.1 503")
        for sock in stalled:
            sock.close()
        stalled.clear()
        deadline = time.monotonic() + 60
        while True:  # the held connections close: the server serves again
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not recover after the clients left"
            time.sleep(0.2)
    finally:
        for sock in stalled:
            sock.close()
        stop(proc)


def test_a_cap_over_the_fd_limit_is_a_startup_warning(tmp_path):
    proc = start(tmp_path, free_port(), "--max-connections", "1000")
    try:
        lines = startup_lines(proc)
    finally:
        stop(proc)
    warning = [line for line in lines if "open-file limit" in line]
    assert len(warning) == 1 and warning[0].startswith("chatrun: warning: --max-connections 1000")
    assert f"({FD_LIMIT};" in warning[0] and f"Lower --max-connections to {FD_LIMIT - 64}" in warning[0]
