"""Instructions (or a profile) of the late turns of bench_openai_api.py's conversations, in one
process: the app called through httpx's ASGI transport (no sockets, no uvicorn), its SQLite
store called inline (no worker thread), the fake model in its own process (not counted).
8 conversations of 40 turns; measured: turns 31-40 of each (80 turns).

    PYTHONHASHSEED=0 valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg \\
        python bench/turn_instructions.py callgrind chat     # "Collected" / 80 = instructions a turn
    python bench/turn_instructions.py cprofile chat          # /tmp/turn_instructions.prof (pstats)
    python bench/turn_instructions.py time http              # CPU ms a turn (noisy: a rough check)

Kinds: chat (/v1/chat/completions, the whole history resent), responses (previous_response_id),
http (POST /bots/echo/sessions/{id}/messages). Figures: bench/README.md, "HTTP and /v1 turns".
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runner"))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402

from bench_openai_api import BOT, LATE  # noqa: E402
from bench_server import free_port, spawn, wait_port  # noqa: E402

CONVERSATIONS, TURNS = 8, 40


class Talk:
    """One conversation of `kind`; `turn(http, t)` sends its message number t."""

    def __init__(self, kind: str, name: str):
        self.kind, self.name = kind, name
        self.history: list[dict[str, Any]] = []
        self.previous: str | None = None

    async def turn(self, http: httpx.AsyncClient, t: int) -> None:
        text = f"{self.name} message number {t}"
        if self.kind == "http":
            reply = await http.post(f"/bots/echo/sessions/{self.name}/messages", json={"userMessage": text})
            reply.raise_for_status()
        elif self.kind == "responses":
            body = {"model": "echo", "input": text, "previous_response_id": self.previous}
            reply = await http.post("/v1/responses", json=body)
            reply.raise_for_status()
            self.previous = reply.json()["id"]
        else:
            self.history.append({"role": "user", "content": text})
            reply = await http.post("/v1/chat/completions", json={"model": "echo", "messages": self.history})
            reply.raise_for_status()
            self.history.append(reply.json()["choices"][0]["message"])


def toggle(mode: str, on: bool, profile: cProfile.Profile) -> None:
    if mode == "callgrind":
        os.system(f"callgrind_control -i {'on' if on else 'off'} {os.getpid()} >/dev/null")
    elif mode == "cprofile":
        profile.enable() if on else profile.disable()


async def run(mode: str, kind: str) -> None:
    from chatrun.server.app import create_app

    tmp = Path(tempfile.mkdtemp())
    (tmp / "echo.yaml").write_text(BOT)
    app = create_app([str(tmp / "echo.yaml")], store_url=f"sqlite:///{tmp / 'bench.db'}")
    async with app.router.lifespan_context(app):
        app.state.registry.store._executor = None  # the store's calls inline: every instruction in this thread
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            talks = [Talk(kind, f"c{i}") for i in range(CONVERSATIONS)]
            if kind == "http":
                for talk in talks:
                    (await http.post("/bots/echo/sessions", json={"id": talk.name})).raise_for_status()
            profile, started = cProfile.Profile(), 0.0
            for t in range(TURNS):
                if t == LATE.start:
                    toggle(mode, True, profile)
                    started = time.process_time()
                for talk in talks:
                    await talk.turn(http, t)
            toggle(mode, False, profile)
            spent = (time.process_time() - started) * 1000 / (CONVERSATIONS * len(LATE))
    if mode == "cprofile":
        profile.dump_stats("/tmp/turn_instructions.prof")
    print(f"{kind}: {spent:.2f} ms CPU a late turn ({mode})")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "time"
    kind = sys.argv[2] if len(sys.argv) > 2 else "chat"
    port = free_port()
    fake = spawn(["-m", "chatrun.testing.fake_openai", "--port", str(port), "--echo"],
                 dict(os.environ, PYTHONPATH=str(ROOT / "runner")))
    try:
        wait_port(port, fake)
        os.environ.update(OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="bench")
        asyncio.run(run(mode, kind))
    finally:
        fake.terminate()
        fake.wait(10)


if __name__ == "__main__":
    main()
