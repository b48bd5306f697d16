"""Flat costs (issue 33, finding 9): what the operators' reads cost as the store fills up.

Measured on SQLite (in this process) and on Redis (a real redis-server on a free loopback
port: the CPU of this process plus the server's, from INFO cpu), at 0, 10,000 and 100,000
stored sessions (one in ten waiting for an approval, owners spread over 1,000 principals,
sessions on two bot versions), written straight through the store API:

    GET /pending        the first page (the endpoint's function: index page, filters, cursor)
    inbox recent        the operator inbox's first page: GET /pending?order=recent&limit=50 (issue 35)
    gauge               the pending gauges' read (server/sweeper.py pending_counts)
    quota               --max-sessions-per-principal's count of one principal's sessions
    versions list       `chatrun versions list`'s read (cli/versions.py _kept: opens the store)

Each figure is CPU milliseconds per call, min and median of several rounds (each round
repeats the call so that Redis' CPU counter, in microseconds, sees it). Before issue 33 these
were linear: GET /pending 1.0 s at 10,000 waiting sessions, the quota 124 ms at 100,000 on
SQLite, versions list 11 s (SQLite) and 20 s (Redis) at 100,000.

    python bench/bench_flat.py                 # about 2-5 minutes (the fills take most)
    python bench/bench_flat.py --sizes 0 1000  # quick look

Figures (2 shared cores; at 0 sessions nothing waits, so the page and the gauge have nothing
to show; from 10,000 on, a page holds its 100 sessions, the inbox's 50; at 100,000 stored,
10,000 wait; the inbox row was measured with issue 35, SQLite only):

    CPU ms per call, min / median (python 3.11.7, 2 cores)
    | store  | read          |       0 sessions |  10,000 sessions | 100,000 sessions |
    |--------|---------------|------------------|------------------|------------------|
    | SQLite | GET /pending  |   0.06 /   0.07 |   6.64 /   6.85 |   6.18 /   6.36 |
    | SQLite | inbox recent  |   0.07 /   0.07 |   3.06 /   3.09 |   3.42 /   3.43 |
    | SQLite | gauge         |   0.06 /   0.06 |   0.18 /   0.19 |   0.16 /   0.17 |
    | SQLite | quota         |   0.06 /   0.06 |   0.06 /   0.07 |   0.06 /   0.07 |
    | SQLite | versions list |   0.91 /   1.26 |   0.95 /   1.20 |   1.14 /   1.17 |
    | Redis  | GET /pending  |   0.11 /   0.12 |   8.96 /   9.35 |   9.32 /   9.52 |
    | Redis  | gauge         |   0.09 /   0.10 |   1.07 /   1.17 |   0.82 /   0.83 |
    | Redis  | quota         |   0.09 /   0.09 |   0.11 /   0.13 |   0.11 /   0.12 |
    | Redis  | versions list |   2.82 /   2.97 |   4.12 /   4.54 |   3.49 /   3.87 |
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(REPO / "tests"))

BOT = "bench"
VERSIONS = ("aaaa00000001", "bbbb00000002")
CREATED = "2024-01-01T00:00:00+00:00"


def snapshot(n: int) -> dict[str, Any]:
    waiting = n % 10 == 0
    pending = [{"id": "p1", "kind": "approval", "created": CREATED, "due": None, "route": "main",
                "scope_id": f"s{n}.1", "tool": "refund", "call_id": "c1", "args": {"amount": n},
                "ask": "Refund?", "by": ["supervisor"]}] if waiting else []
    return {"id": f"s{n}", "bot": BOT, "bot_version": VERSIONS[n % 2], "turn": 3, "scopes": [],
            "state": {"note": "x" * 200}, "meta": {"owner": f"u{n % 1000}"}, "pending": pending,
            "committed": {"turn": 3, "input": f"message {n}", "requestId": None, "at": 1_700_000_000.0 + n}}


async def fill(store: Any, start: int, stop: int) -> None:
    """Sessions start..stop-1, committed as the server commits them (concurrently on Redis)."""
    from chatrun.store.record import Commit
    from chatrun.store.versions import CREATE

    async def one(n: int) -> None:
        commit = Commit.encode(f"s{n}", snapshot(n), {}, [])
        commit.expected = CREATE
        await store.commit_turn(commit, None)

    batch = 200 if getattr(store, "distributed", False) else 1
    for first in range(start, stop, batch):
        await asyncio.gather(*(one(n) for n in range(first, min(first + batch, stop))))


async def publish_versions(store: Any) -> None:
    from chatrun.server.versions import record_key

    for i, content in enumerate(VERSIONS):
        await store.put_record(record_key(BOT, content), {"label": str(i + 1), "published": float(i), "files": {}})


class Registry:
    """What GET /pending's function reads of the registry."""

    def __init__(self, store: Any):
        self.store = store

    def bot(self, name: str) -> None:
        return None


def operations(store: Any, url: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    from chatrun.cli.versions import _kept
    from chatrun.server.pending_api import list_all_pending
    from chatrun.server.sweeper import pending_counts

    registry = Registry(store)
    return {
        "GET /pending": lambda: list_all_pending(None, registry),  # type: ignore[arg-type]
        "inbox recent": lambda: list_all_pending(None, registry, limit=50, order="recent"),  # type: ignore[arg-type]
        "gauge": lambda: pending_counts(store, time.time()),
        "quota": lambda: store.count_owned("u1"),
        "versions list": lambda: _kept(url, None),
    }


async def cpu_now(redis_client: Any | None) -> float:
    """This process's CPU seconds, plus redis-server's when there is one."""
    mine = time.process_time()
    if redis_client is None:
        return mine
    info = await redis_client.info("cpu")
    return mine + float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def measure(call: Callable[[], Awaitable[Any]], redis_client: Any | None, rounds: int,
                  repeat: int) -> tuple[float, float]:
    """(min, median) CPU ms per call over `rounds` rounds of `repeat` calls."""
    await call()  # warm: the first read of a Redis store written before the index indexes it
    per_call = []
    for _ in range(rounds):
        before = await cpu_now(redis_client)
        for _ in range(repeat):
            await call()
        per_call.append((await cpu_now(redis_client) - before) / repeat * 1000)
    return min(per_call), statistics.median(per_call)


async def run_store(kind: str, url: str, sizes: list[int], rounds: int) -> dict[tuple[str, int], tuple[float, float]]:
    from chatrun.store.aio import open_async_store

    store = open_async_store(url)
    redis_client = getattr(store, "client", None)
    results: dict[tuple[str, int], tuple[float, float]] = {}
    await publish_versions(store)
    filled = 0
    try:
        for size in sizes:
            started = time.monotonic()
            await fill(store, filled, size)
            filled = size
            print(f"  {kind}: {size:,} sessions stored (fill {time.monotonic() - started:.0f} s)", file=sys.stderr)
            for name, call in operations(store, url).items():
                repeat = 5 if name == "versions list" else 20
                results[(name, size)] = await measure(call, redis_client, rounds if size < 100_000 else max(3, rounds // 2),
                                                      repeat)
    finally:
        await store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--stores", nargs="+", default=["sqlite", "redis"])
    args = parser.parse_args()
    table: dict[str, dict[tuple[str, int], tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "sqlite" in args.stores:
            table["SQLite"] = asyncio.run(run_store("SQLite", f"sqlite:///{tmp}/flat.db", args.sizes, args.rounds))
        if "redis" in args.stores:
            from redis_support import RedisServer

            server = RedisServer().start()
            try:
                table["Redis"] = asyncio.run(run_store("Redis", server.url(), args.sizes, args.rounds))
            finally:
                server.stop()
    print_table(table, args.sizes)


def print_table(table: dict[str, dict[tuple[str, int], tuple[float, float]]], sizes: list[int]) -> None:
    print(f"CPU ms per call, min / median (python {sys.version.split()[0]}, {os.cpu_count()} cores)")
    head = "| store  | read          | " + " | ".join(f"{n:>7,} sessions" for n in sizes) + " |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for store, results in table.items():
        for name in ("GET /pending", "inbox recent", "gauge", "quota", "versions list"):
            cells = " | ".join(f"{results[(name, n)][0]:6.2f} / {results[(name, n)][1]:6.2f}" for n in sizes)
            print(f"| {store:<6} | {name:<13} | {cells} |")


if __name__ == "__main__":
    main()
