"""`/health` (liveness) and `/ready` (readiness) answer at once whatever the store does (issue
33, finding 10): a store whose ping never answers reads as "timeout", one that fails as
"unreachable"; probes that arrive while one runs share it. The real Redis cases (SIGSTOP,
SIGKILL) are in test_redis_restart.py."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import httpx

import chatrun
from chatrun.server import create_app
from chatrun.server.sessions import STORE_PROBE_TIMEOUT
from chatrun.store.local import LocalAsyncStore
from chatrun.store.memory import InMemoryStore
from server_support import write_travel


class PingedStore(LocalAsyncStore):
    """A memory store that can be pinged: `answer` says how (None: it never answers)."""

    def __init__(self, answer: str | None) -> None:
        super().__init__(InMemoryStore(), "memory://")
        self.answer, self.pings = answer, 0

    async def ping(self) -> None:
        self.pings += 1
        if self.answer is None:
            await asyncio.Event().wait()  # a stalled store: never answers
        if self.answer == "refused":
            raise ConnectionRefusedError("refused")


async def _ask(app, *paths: str) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        return list(await asyncio.gather(*(http.get(path) for path in paths)))


def _app(tmp_path, store=None):
    travel = chatrun.load_bot(write_travel(tmp_path / "bots"))
    return create_app([travel], store=store) if store is not None else create_app([travel], "memory://")


def test_a_store_that_cannot_be_pinged_is_ready(tmp_path):
    health, ready = asyncio.run(_ask(_app(tmp_path), "/health", "/ready"))
    assert health.status_code == ready.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["store"] == "ok"
    assert "store_pool" not in health.json()  # Redis only
    assert health.json()["replica"] == f"{socket.gethostname()}:{os.getpid()}"  # which process answered


def test_a_stalled_store_is_degraded_within_the_probe_timeout(tmp_path):
    store = PingedStore(None)
    app = _app(tmp_path, store)
    started = time.monotonic()
    answers = asyncio.run(_ask(app, *["/health", "/ready"] * 10))
    assert time.monotonic() - started < STORE_PROBE_TIMEOUT + 2.0  # never the stalled store's time
    for answer in answers[0::2]:
        assert answer.status_code == 200 and answer.json()["status"] == "degraded"  # liveness
        assert answer.json()["store"] == "timeout"
    assert {a.status_code for a in answers[1::2]} == {503}  # readiness
    assert store.pings < len(answers)  # requests that came while a probe ran shared it


def test_a_refusing_store_is_unreachable(tmp_path):
    health, ready = asyncio.run(_ask(_app(tmp_path, PingedStore("refused")), "/health", "/ready"))
    assert health.status_code == 200 and health.json()["store"] == "unreachable"
    assert ready.status_code == 503 and ready.json()["status"] == "degraded"


def test_while_draining_both_answer_503(tmp_path):
    app = _app(tmp_path, PingedStore("ok"))
    app.state.registry.draining = True
    health, ready = asyncio.run(_ask(app, "/health", "/ready"))
    assert health.status_code == ready.status_code == 503
    assert health.json()["status"] == ready.json()["status"] == "draining"
