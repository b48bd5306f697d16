"""Does `--cache-mb` bound the memory live sessions take? The cache counts each live session's
estimated size (server/session_cache.py `live_size`); this measures what the sessions really
add to the process's RSS, for conversations of several shapes, and the whole bound: a cache of
--bound-mb filled past its bound (so it evicts) against the RSS it grew by.

Each shape runs in a fresh process: a session registry (SQLite store) on the real engine, the
fake OpenAI model in its own process; --sessions sessions, each given the shape's turns, then
the RSS growth per session against the cache's count per session. Also printed: the JSON size
the cache counted before (snapshot and memories), for comparison.

    python bench/bench_cache.py
    python bench/bench_cache.py --sessions 3000 --bound-mb 32

Goal (issue 26): the bound bounds RSS within 20%.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))

from bench_server import BOT, free_port, rss_mb, spawn, wait_port  # noqa: E402

SHAPES = {  # name: (turns, words per user message)
    "1 turn, short": (1, 3),
    "10 turns, short": (10, 3),
    "3 turns, 500 words": (3, 500),
    "10 turns, 200 words": (10, 200),
}


async def fill(sessions: int, turns: int, words: int, bound_mb: int | None) -> dict[str, float]:
    import chatrun
    from chatrun.server.sessions import NEW, SessionRegistry, SessionSettings
    from chatrun.store import open_store

    tmp = Path(tempfile.mkdtemp())
    (tmp / "bench.yaml").write_text(BOT)
    bot = chatrun.load_bot(tmp / "bench.yaml")
    settings = SessionSettings(cache_size=10**7, cache_bytes=(bound_mb or 10**6) * 2**20)
    registry = SessionRegistry({bot.name: bot}, open_store(f"sqlite:///{tmp / 's.db'}"), settings=settings)
    text = " ".join(["word"] * words)
    json_bytes = 0

    async def one(i: int) -> None:
        nonlocal json_bytes
        async with registry.session("bench", f"s{i}", None, NEW):
            pass
        for t in range(turns):
            async with registry.session("bench", f"s{i}", None) as session:
                async for _ in registry.turn(session, f"turn {t} {text}"):
                    pass
        slot = registry.cache._slots.get(("bench", f"s{i}"))
        json_bytes += slot.buffer.size if slot is not None and slot.buffer is not None else 0

    for i in range(20):  # warm up: imports, connections, the store's caches
        await one(-1 - i)
    gc.collect()
    rss_before, counted_before = rss_mb(os.getpid()), registry.cache_bytes()
    for i in range(sessions):
        await one(i)
    gc.collect()
    live = registry.live_count() - 20 if bound_mb is None else registry.live_count()
    return {"rss": (rss_mb(os.getpid()) - rss_before) * 2**20, "counted": registry.cache_bytes() - counted_before,
            "json": json_bytes, "sessions": sessions, "live": live}


def child(args: argparse.Namespace) -> None:
    port = free_port()
    fake = spawn(["-m", "chatrun.testing.fake_openai", "--port", str(port), "--text", "Sure, happy to help with that."],
                 dict(os.environ, PYTHONPATH=str(REPO / "runner")))
    try:
        wait_port(port, fake)
        os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = f"http://127.0.0.1:{port}/v1", "bench"
        turns, words = SHAPES[args.shape]
        print(json.dumps(asyncio.run(fill(args.sessions, turns, words, args.bound_mb))))
    finally:
        fake.terminate()
        fake.wait(10)


def run_child(shape: str, sessions: int, bound_mb: int | None = None) -> dict[str, float]:
    extra = ["--bound-mb", str(bound_mb)] if bound_mb else []
    out = subprocess.run([sys.executable, __file__, "--child", "--shape", shape, "--sessions", str(sessions), *extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=2000, help="sessions per shape")
    parser.add_argument("--bound-mb", type=int, default=24, help="the cache bound of the whole-bound run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", default="10 turns, short", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print(f"RSS a live session adds against what the cache counts, {args.sessions} sessions per shape "
          "(each shape in a fresh process)")
    print(f"{'shape':<22}{'RSS B/session':>15}{'counted':>10}{'RSS/counted':>13}{'JSON (before)':>15}{'RSS/JSON':>10}")
    for shape in SHAPES:
        r = run_child(shape, args.sessions)
        n = r["live"]
        print(f"{shape:<22}{r['rss'] / n:>15.0f}{r['counted'] / n:>10.0f}{r['rss'] / r['counted']:>13.2f}"
              f"{r['json'] / r['sessions']:>15.0f}{r['rss'] / r['json']:>10.2f}")
    sessions = args.sessions * 4
    r = run_child("10 turns, short", sessions, args.bound_mb)
    print(f"whole bound: --cache-mb {args.bound_mb} with {sessions} sessions of 10 short turns: "
          f"{r['live']:.0f} stay live, counted {r['counted'] / 2**20:.1f} MiB, RSS grew {r['rss'] / 2**20:.1f} MiB "
          f"({r['rss'] / (args.bound_mb * 2**20):.2f}x the bound; goal within 20%)")


if __name__ == "__main__":
    main()
