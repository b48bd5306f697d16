"""`chatrun serve` as a newcomer starts it: it warns without a model, says where the store file
is, binds before claiming to serve, closes its SQLite store on a clean stop (no -wal/-shm
left), and fails on bad bots with the exit codes of the other commands."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from server_support import free_port

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.subprocess


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    e["PYTHONPATH"] = str(REPO / "runner")
    return e


def serve(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "chatrun", "serve", *args], cwd=cwd, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 60) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if text in line:
            return lines
    raise AssertionError(f"{text!r} not printed; stderr so far: {lines}")


def test_start_warns_without_a_model_names_the_store_file_and_stops_cleanly(tmp_path):
    port = free_port()
    proc = serve([str(REPO / "bots" / "hello"), "--port", str(port), "--store", "sqlite:///chat.db"], tmp_path)
    try:
        lines = wait_for_line(proc, "serving")
        warning = next(line for line in lines if line.startswith("warning:"))
        assert "bot hello has no model configured" in warning and "OPENAI_API_KEY" in warning
        serving = lines[-1]
        assert f"on http://127.0.0.1:{port}/" in serving
        assert f"store: SQLite file {tmp_path / 'chat.db'}" in serving
        request = urllib.request.Request(f"http://127.0.0.1:{port}/bots/hello/sessions", method="POST",
                                         data=json.dumps({"id": "s1"}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status in (200, 201)
        assert (tmp_path / "chat.db-wal").exists()  # WAL in use while serving
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read()
    assert (tmp_path / "chat.db").exists()
    assert not (tmp_path / "chat.db-wal").exists() and not (tmp_path / "chat.db-shm").exists()


def test_a_port_in_use_is_an_error_and_serving_is_never_claimed(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "chatrun", "serve", str(REPO / "bots" / "hello"), "--port",
                              str(port), "--store", "memory://"], cwd=tmp_path, env=env(), capture_output=True,
                             text=True, timeout=60)
    assert out.returncode == 1
    assert f"error: cannot listen on 127.0.0.1:{port}: Address already in use" in out.stderr
    assert "serving" not in out.stderr + out.stdout


def test_bad_bot_paths_exit_like_the_other_commands(tmp_path):
    bad = tmp_path / "bot.yaml"
    bad.write_text("name: x\nroutes: {a: {sytem: hi}}\n")
    for command in ("serve", "repl", "validate"):
        missing = subprocess.run([sys.executable, "-m", "chatrun", command, str(tmp_path / "nope")], cwd=tmp_path,
                                 env=env(), capture_output=True, text=True, timeout=60, input="")
        assert missing.returncode == 2, (command, missing.stderr)
        assert "does not exist" in missing.stderr
        invalid = subprocess.run([sys.executable, "-m", "chatrun", command, str(bad)], cwd=tmp_path,
                                 env=env(), capture_output=True, text=True, timeout=60, input="")
        assert invalid.returncode == 1, (command, invalid.stderr)
        assert f"{bad}:2:" in invalid.stdout + invalid.stderr
        assert "Traceback" not in invalid.stderr
