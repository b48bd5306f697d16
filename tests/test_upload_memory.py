"""Issue 33, finding 6: an upload is refused before it is read whole, in bounded memory. A real
`chatrun serve` process serves three bots: one whose route takes no files, one that takes
files of at most 4 MB, one that takes 100 MB (the largest of any served bot, which must not
be the limit of the others). 64 MB uploads, streamed from a generator without a
Content-Length, go to the first two; the server's peak resident memory (VmHWM) may grow by
at most twice the small route's max_bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from redis_support import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

SMALL = 4_000_000
UPLOAD_CHUNKS = 1024  # of 64 KiB: 64 MiB


def bot(name: str, attachments: str = "") -> str:
    return (f"name: {name}\nformat: 3\nroutes:\n  chat:\n    default: true\n    description: Chat\n"
            f"    system: Answer briefly.\n{attachments}")


BOTS = {
    "nofiles": bot("nofiles"),
    "small": bot("small", f"    attachments: {{kinds: [image/*], max_bytes: {SMALL}, max_count: 1}}\n"),
    "big": bot("big", "    attachments: {kinds: [image/*], max_bytes: 100000000, max_count: 1}\n"),
}


def peak_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc")


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[str, int]]:
    paths = []
    for name, text in BOTS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "bot.yaml").write_text(text)
        paths.append(str(tmp_path / name))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO / "runner"), OPENAI_API_KEY="unused")
    proc = subprocess.Popen(
        [sys.executable, "-m", "chatrun", "serve", *paths, "--port", str(port),
         "--store", f"sqlite:///{tmp_path / 'chat.db'}", "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 90
        while "chatrun: serving" not in (line := proc.stderr.readline()):
            assert line and time.monotonic() < deadline, f"chatrun serve did not start: {line}"
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def stream() -> Iterator[bytes]:
    chunk = b"A" * 65536
    for _ in range(UPLOAD_CHUNKS):
        yield chunk


def upload(client: httpx.Client, url: str, content_type: str) -> httpx.Response:
    return client.post(url, content=stream(), headers={"content-type": content_type})


def test_large_uploads_are_refused_early_in_bounded_memory(served):
    base, pid = served
    with httpx.Client(timeout=120) as client:
        sessions = {name: client.post(f"{base}/bots/{name}/sessions", json={}).json()["id"] for name in BOTS}
        small = f"{base}/bots/small/sessions/{sessions['small']}/attachments"
        # Warm up every path measured below (imports, first allocations) with small files.
        assert client.post(small, content=b"\x89PNG" + bytes(1000), headers={"content-type": "image/png"}).status_code == 201
        assert client.post(small, json={"media_type": "image/png", "data": "iVBORw0K"}).status_code == 201
        before = peak_kib(pid)

        refused = upload(client, f"{base}/bots/nofiles/sessions/{sessions['nofiles']}/attachments", "application/json")
        assert refused.status_code == 400 and "route chat takes no attachments" in refused.text
        for content_type in ("application/json", "image/png"):
            refused = upload(client, small, content_type)
            assert refused.status_code == 413, refused.text
            assert f"route chat takes files of at most {SMALL} bytes (attachments.max_bytes)" in refused.text
        grown = (peak_kib(pid) - before) * 1024
        assert client.get(f"{base}/health").status_code == 200
    assert grown <= 2 * SMALL, f"the server's peak memory grew by {grown} bytes for refused uploads"
