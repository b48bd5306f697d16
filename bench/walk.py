"""One message's walk through chatrun's code: the files it enters and the calls that cross files.

Loads bots/travel, opens a library session on the scripted model, sends one warm-up message
(imports, compiled templates, caches), then traces one more message to the main menu with
`sys.setprofile`: every Python function call whose code lives in runner/chatrun/ is counted;
a call is "cross-file" when its caller's file is another chatrun file. Printed: the files in the
order the message first enters them, with how many calls enter each, and the totals.
Goal (issue 39): a message to travel enters <= 30 files. Figures: in process 27 files and 116
cross-file calls before issue 39 (main at 7aabd1b), 22 and 102 after the first cuts, 19 and 94
now (2026-12-06: each route's plan assembled when the bot loads, the call path made only when a
tool is called); through the server's HTTP API (`--server`) 46 and 334 before, 40 and 249 after
the first cuts, 34 and 239 now (also no caller to read with auth off and no token, the author's
stand-in for the model asked by the pool instead of wrapping every session's model): the goal
of 30 is met in process, not on the HTTP path. docs/architecture.md lists the walk, and
tests/test_walk.py checks the list against it (the HTTP path: its count and the hooks it skips).

    python bench/walk.py            # the walk, in order
    python bench/walk.py --json     # the same as JSON (tests/test_walk.py reads it)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))

import chatrun  # noqa: E402
from chatrun.models.scripted import ScriptedModel  # noqa: E402

PACKAGE = str(Path(chatrun.__file__).resolve().parent) + os.sep
MESSAGE = "Hello, I would like to travel somewhere warm."
ANSWER = "Happy to help! May I have your name first?"


@dataclass
class Walk:
    """What one traced message entered: chatrun files in first-entry order, calls into each, cross-file calls."""

    files: list[str] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    cross_file_calls: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "calls": dict(self.calls), "cross_file_calls": self.cross_file_calls}


def own_file(frame: FrameType | None) -> str | None:
    """The chatrun file (relative to the package, e.g. 'engine/turn.py') a frame runs, or None."""
    if frame is None:
        return None
    name = frame.f_code.co_filename
    return name[len(PACKAGE):] if name.startswith(PACKAGE) else None


def trace(send: Any) -> Walk:
    """Run `send()` under a profiler that records every call into chatrun's own files."""
    walk = Walk()
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        callee = own_file(frame)
        if callee is None:
            return
        if callee not in seen:
            seen.add(callee)
            walk.files.append(callee)
        walk.calls[callee] += 1
        caller = own_file(frame.f_back)
        if caller is not None and caller != callee:
            walk.cross_file_calls += 1

    sys.setprofile(profile)
    try:
        send()
    finally:
        sys.setprofile(None)
    return walk


def travel_walk() -> Walk:
    """The walk of one steady message to bots/travel's main menu (after one warm-up message)."""
    bot = chatrun.load_bot(REPO / "bots" / "travel")
    model = ScriptedModel()
    with tempfile.TemporaryDirectory():
        session = bot.session(model=model)
        try:
            model.add({"text": ANSWER})
            session.chat(MESSAGE)
            model.add({"text": ANSWER})
            return trace(lambda: session.chat(MESSAGE))
        finally:
            session.close()


def server_walk() -> Walk:
    """The walk of one steady message to travel through `chatrun serve`'s HTTP API, in process (the app
    over httpx's ASGI transport), the bot's own `openai` model against the fake model in a subprocess."""
    import asyncio
    import subprocess

    import httpx

    sys.path.insert(0, str(REPO / "bench"))
    from bench_server import free_port, wait_port
    from chatrun.server.app import create_app

    port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "chatrun.testing.fake_openai", "--port", str(port), "--text", ANSWER],
                            env=dict(os.environ, PYTHONPATH=str(REPO / "runner")), stdout=subprocess.DEVNULL)
    try:
        wait_port(port, fake)
        saved = {name: os.environ.get(name) for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
        os.environ.update(OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="walk")
        try:
            app = create_app([chatrun.load_bot(REPO / "bots" / "travel")], "memory://", gc_tuning=False)
            return asyncio.run(_http_walk(app, httpx))
        finally:  # a test process goes on with its own environment
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    finally:
        fake.terminate()
        fake.wait(10)


async def _http_walk(app: Any, httpx: Any) -> Walk:
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
        (await http.post("/bots/travel/sessions", json={"id": "walk"})).raise_for_status()
        url = "/bots/travel/sessions/walk/messages"
        (await http.post(url, json={"userMessage": MESSAGE})).raise_for_status()
        done: list[Walk] = []

        async def send() -> None:
            (await http.post(url, json={"userMessage": MESSAGE})).raise_for_status()

        loop_walk = Walk()
        # The profiler sees every coroutine step of this thread's loop while the message is in flight.
        done.append(await _traced(send, loop_walk))
        return done[0]


async def _traced(send: Any, walk: Walk) -> Walk:
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        callee = own_file(frame)
        if callee is None:
            return
        if callee not in seen:
            seen.add(callee)
            walk.files.append(callee)
        walk.calls[callee] += 1
        caller = own_file(frame.f_back)
        if caller is not None and caller != callee:
            walk.cross_file_calls += 1

    sys.setprofile(profile)
    try:
        await send()
    finally:
        sys.setprofile(None)
    return walk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the walk as JSON")
    parser.add_argument("--server", action="store_true",
                        help="through chatrun serve's HTTP API and the openai model (fake model in a subprocess)")
    args = parser.parse_args()
    walk = server_walk() if args.server else travel_walk()
    if args.json:
        print(json.dumps(walk.as_dict(), indent=2))
        return
    for number, name in enumerate(walk.files, 1):
        print(f"{number:>3}  {name:<32}{walk.calls[name]:>6} calls")
    print(f"{len(walk.files)} files entered, {walk.cross_file_calls} cross-file calls, "
          f"{sum(walk.calls.values())} calls in all (goal: <= 30 files)")


if __name__ == "__main__":
    main()
