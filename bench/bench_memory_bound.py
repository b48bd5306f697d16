"""Does `--cache-mb` bound a real server's RSS? (issue 33, finding 10)

A real `chatrun serve` process (SQLite store) with `--cache-mb N`, driven over WebSocket by
many conversations of one shape, each in a fresh server: its RSS growth (VmRSS, after warm-up
sessions, against the end) next to N. The cache counts each live session's estimated size
(server/session_cache.py `live_size`) and evicts past N, so with enough sessions to fill it
several times over the RSS growth should be N within 20%, whatever the sessions hold:

    small          3 short turns (a window of 6 short messages)
    big state      8 turns, each adding 8 KB to `state.notes` through a handler tool (small memory)
    full memory    20 turns of 8 KB messages answered with 8 KB: a full 40-message window

The model is the fake OpenAI server (chatrun.testing.fake_openai) in this process, answering by
shape. Also printed: the server's own count (`/health` cache_bytes) and the sessions live at the end.

    python bench/bench_memory_bound.py                       # --cache-mb 64, all three shapes
    python bench/bench_memory_bound.py --cache-mb 32 --shape "full memory"
    python bench/bench_memory_bound.py --fill 0.5            # half the bound: RSS/counted per session

Goal (issue 33): RSS growth within 20% of --cache-mb for every shape.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import string
import subprocess
import sys
import tempfile
import textwrap
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))

from bench_server import free_port, rss_mb, wait_port  # noqa: E402

MESSAGE_BYTES = 8192

BOT = """
name: bench
model: {{provider: openai, name: gpt-4o-mini, max_retries: 0, timeout: 120}}
memory: {{type: message_window, max_messages: {window}}}
state: {{notes: []}}
routes:
  main:
    default: true
    system: "You are a concise assistant. Notes kept: {{{{ state.notes | length }}}}."
    tools: [note]
tools:
  note:
    description: Keep a note
    parameters: {{type: object, properties: {{n: {{type: integer}}}}, required: [n]}}
    handler: grow:note
    action:
      set: {{state.notes: "{{{{ state.notes + [result] }}}}"}}
      reply: noted
"""

GROW = '''
import random
import string


def note(ctx):
    """An 8 KB note that differs from every other (no string is shared between sessions)."""
    rnd = random.Random(f"{ctx.session_id}/{ctx.args['n']}")
    return "".join(rnd.choice(string.ascii_letters + "  ") for _ in range(MESSAGE_BYTES))
'''.replace("MESSAGE_BYTES", str(MESSAGE_BYTES))


@dataclass(frozen=True)
class Shape:
    turns: int
    words: int  # of each user message; 0: MESSAGE_BYTES of text
    window: int
    answer: str  # "short", "echo" or "note"


SHAPES = {
    "small": Shape(turns=3, words=3, window=20, answer="short"),
    "big state": Shape(turns=8, words=3, window=8, answer="note"),
    "full memory": Shape(turns=20, words=0, window=40, answer="echo"),
}


def text_of(seed: str, words: int) -> str:
    """A user message: a few words, or MESSAGE_BYTES of words no other message repeats."""
    if words:
        return " ".join(["word"] * words)
    rnd = random.Random(seed)
    return "".join(rnd.choice(string.ascii_lowercase + "   ") for _ in range(MESSAGE_BYTES))


def responder(shape: Shape, fake: Any) -> Any:
    served = 0

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal served
        served += 1
        if served % 50 == 0:
            fake.reset()  # the fake keeps every request: forget them, this process is not measured
        last = (body.get("messages") or [{}])[-1]
        if shape.answer == "echo":
            content = str(last.get("content") or "")
            return {"chunks": [content[i:i + 2048] for i in range(0, len(content), 2048)] or ["ok"]}
        if shape.answer == "note" and last.get("role") == "user":
            kept = str(body["messages"][0].get("content", "")).rsplit("Notes kept: ", 1)[-1].rstrip(".")
            return {"tool_calls": [{"name": "note", "arguments": {"n": int(kept)}}]}  # a new call each turn
        return {"text": "Sure, happy to help with that."}

    return answer


async def converse(url: str, chat_id: str, shape: Shape) -> None:
    import websockets

    async with websockets.connect(url, max_size=2**22, open_timeout=60, ping_interval=None) as ws:
        await ws.send(json.dumps({"type": "Connect", "chatId": chat_id, "extensions": True}))
        while json.loads(await ws.recv())["type"] != "Completed":
            pass
        for t in range(shape.turns):
            text = text_of(f"{chat_id}/{t}", shape.words)
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": chat_id, "data": {"userMessage": text}}))
            while True:
                frame = json.loads(await ws.recv())
                if frame["type"] == "Failed":
                    raise SystemExit(f"a turn failed: {frame}")
                if frame["type"] == "Completed":
                    break


async def drive(url: str, prefix: str, sessions: int, shape: Shape, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await converse(url, f"{prefix}-{i}", shape)

    await asyncio.gather(*(one(i) for i in range(sessions)))


def health(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as answer:
        return json.loads(answer.read())


def measure(name: str, cache_mb: int, fill: float, concurrency: int, warmup: int = 10) -> dict[str, Any]:
    """One shape in a fresh server: RSS growth after enough sessions to fill the cache `fill` times."""
    from chatrun.testing.fake_openai import FakeOpenAI

    shape = SHAPES[name]
    work = Path(tempfile.mkdtemp(prefix="bench-memory-bound-"))
    (work / "bot.yaml").write_text(textwrap.dedent(BOT.format(window=shape.window)))
    (work / "grow.py").write_text(GROW)
    fake = FakeOpenAI()
    fake.responder = responder(shape, fake)
    with fake:
        port = free_port()
        env = dict(os.environ, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="bench")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "runner"), env.get("PYTHONPATH")]))
        env.pop("CHATRUN_AUTH_FILE", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "chatrun", "serve", str(work / "bot.yaml"), "--port", str(port),
             "--store", f"sqlite:///{work / 's.db'}", "--log-level", "warning", "--cache-mb", str(cache_mb),
             "--cache-size", str(10**7),  # the byte bound only
             "--max-message-chars", str(2 * MESSAGE_BYTES)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_port(port, proc, timeout=60)
            url = f"ws://127.0.0.1:{port}/_chat/routes"
            asyncio.run(drive(url, "warm", warmup, shape, concurrency))
            warm = health(port)
            before, counted_before = rss_mb(proc.pid), warm["cache_bytes"]
            # Enough sessions to fill the cache `fill` times, by what the server counts for one.
            sessions = max(20, int(fill * cache_mb * 2**20 * warm["live_sessions"] / max(1, counted_before)))
            asyncio.run(drive(url, "s", sessions, shape, concurrency))
            after, end = rss_mb(proc.pid), health(port)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    growth = (after - before) * 2**20
    return {"shape": name, "sessions": sessions, "growth": growth, "counted": end["cache_bytes"],
            "counted_growth": end["cache_bytes"] - counted_before, "live": end["live_sessions"],
            "cache_mb": cache_mb, "ratio": growth / (cache_mb * 2**20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-mb", type=int, default=64)
    parser.add_argument("--shape", choices=list(SHAPES), action="append", help="only these shapes (repeatable)")
    parser.add_argument("--fill", type=float, default=3.0,
                        help="drive enough sessions to fill the cache this many times over (below 1: no eviction)")
    parser.add_argument("--concurrency", type=int, default=8, help="conversations at once")
    args = parser.parse_args()
    print(f"chatrun serve --cache-mb {args.cache_mb}: RSS growth over warm-up, each shape in a fresh server")
    print(f"{'shape':<13}{'sessions':>9}{'live':>6}{'RSS growth MiB':>16}{'counted MiB':>13}"
          f"{'cache-mb':>10}{'ratio':>7}{'RSS/counted':>13}")
    for name in args.shape or list(SHAPES):
        r = measure(name, args.cache_mb, args.fill, args.concurrency)
        print(f"{r['shape']:<13}{r['sessions']:>9}{r['live']:>6}{r['growth'] / 2**20:>16.1f}"
              f"{r['counted'] / 2**20:>13.1f}{r['cache_mb']:>10}{r['ratio']:>7.2f}"
              f"{r['growth'] / max(1, r['counted_growth']):>13.2f}", flush=True)


if __name__ == "__main__":
    main()
