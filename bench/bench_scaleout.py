"""Scale-out figures: `chatrun serve` as 1, 2 and 3 replicas on one Redis, against one process
on memory:// and on SQLite, the fake OpenAI server answering after a fixed delay.

Each session sends its turns over WebSocket, turn t of session i to replica (i + t) mod N, so
with N > 1 every turn runs on another replica than the previous one (no sticky sessions: each
turn reloads the session the previous replica committed). Figures per configuration:
throughput (turns/s), added latency p50/p99 (send -> Completed, minus the model's delay), and
CPU per turn: chatrun's processes together, and redis-server's apart, with Redis commands per
turn. The floor is bench_server.py's floor_eb (a bare WebSocket endpoint calling the same fake
model, passing the history as chatrun does), measured in the same run. Configurations take
turns round by round (--rounds), so a change in machine load hits all alike; the table shows
min and median over rounds. Then the lease's own cost: acquire + release of an uncontended
session lease, and one fenced commit, on loopback.

    python bench/bench_scaleout.py                          # 3 rounds, 50 sessions x 6 turns, delay 0.1 s
    python bench/bench_scaleout.py --sessions 100 --turns 10 --delay 0.2 --rounds 5
    python bench/bench_scaleout.py --lock-only              # only the lease's cost

Target (issue 12): the lock's own cost under 2 ms p99 on loopback.

Read the throughput with care: a machine with 2 cores runs the replicas, Redis, the fake model
and this load generator on them, so "3 replicas beat 1" there mostly measures the second core
coming into use, not scale-out. What carries over is CPU per turn. The last table models N
cores from it: a replica turn costs c ms of chatrun CPU (measured with 3 replicas, where every
turn reloads the session another replica committed) and r ms of Redis CPU (one Redis thread),
so with N cores for replicas the ceiling is min(N * 1000 / c, 1000 / r) turns/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_server import cpu_seconds, free_port, load_average, spawn, timed_turn, wait_port  # noqa: E402

BOT = """
name: bench
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, timeout: 120}
memory: {type: message_window, max_messages: 20}
routes:
  main:
    default: true
    system: "You are a concise assistant."
"""


def start_redis(folder: Path) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    # appendonly yes + everysec: the persistence docs/deploy.md assumes, so its cost is counted.
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def redis_commands(port: int | None) -> int:
    """Commands the Redis server has processed so far (INFO stats)."""
    if port is None:
        return 0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"INFO stats\r\n")
        data = b""
        while b"total_commands_processed:" not in data or not data.endswith(b"\r\n"):
            data += s.recv(65536)
    line = next(x for x in data.decode().splitlines() if x.startswith("total_commands_processed:"))
    return int(line.split(":")[1])


async def run_load(ports: list[int], sessions: int, turns: int, pids: list[int], redis_pid: int | None,
                   redis_port: int | None = None) -> dict[str, float]:
    import websockets

    tag = secrets.token_hex(3)
    latencies: list[float] = []
    sem = asyncio.Semaphore(50)

    async def open_all(i: int) -> list:
        async with sem:
            conns = [await websockets.connect(f"ws://127.0.0.1:{p}/_chat/routes", open_timeout=60, ping_interval=None)
                     for p in ports]
            chat_id = f"b{tag}-{i}"
            await conns[0].send(json.dumps({"type": "Connect", "chatId": chat_id}))
            while json.loads(await conns[0].recv())["type"] != "Completed":
                pass
            for ws in conns[1:]:
                await ws.send(json.dumps({"type": "Connect", "chatId": chat_id, "resume": True}))
                while json.loads(await ws.recv())["type"] not in ("Completed", "Failed"):
                    pass
            return conns

    connections = await asyncio.gather(*(open_all(i) for i in range(sessions)))

    async def chat(i: int, conns: list) -> None:
        chat_id = f"b{tag}-{i}"
        for t in range(turns):
            ws = conns[(i + t) % len(conns)]
            latencies.append(await timed_turn(ws, chat_id, f"turn {t}"))

    cpu_start = sum(cpu_seconds(p) for p in pids)
    redis_start = cpu_seconds(redis_pid) if redis_pid else 0.0
    commands_start = redis_commands(redis_port)
    start = time.perf_counter()
    await asyncio.gather(*(chat(i, c) for i, c in enumerate(connections)))
    wall = time.perf_counter() - start
    cpu = sum(cpu_seconds(p) for p in pids) - cpu_start
    redis_cpu = (cpu_seconds(redis_pid) - redis_start) if redis_pid else 0.0
    commands = redis_commands(redis_port) - commands_start - (2 if redis_port else 0)  # our two INFOs
    await asyncio.gather(*(ws.close() for conns in connections for ws in conns))
    latencies.sort()
    n = len(latencies)
    return {
        "throughput": n / wall,
        "p50": statistics.median(latencies),
        "p99": latencies[min(n - 1, int(n * 0.99))],
        "cpu_ms": cpu * 1000 / n,
        "redis_cpu_ms": redis_cpu * 1000 / n,
        "redis_ops": commands / n,
    }


def measure(kind: str, replicas: int, args: argparse.Namespace, fake_url: str, workdir: Path,
            redis_port: int | None, redis_pid: int | None) -> dict[str, float]:
    env = dict(os.environ, OPENAI_BASE_URL=fake_url, OPENAI_API_KEY="bench")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "runner"), env.get("PYTHONPATH")]))
    env.pop("CHATRUN_AUTH_FILE", None)
    if kind == "redis":
        store = f"redis://127.0.0.1:{redis_port}/0?prefix=bench{secrets.token_hex(3)}:"
    elif kind == "sqlite":
        store = f"sqlite:///{workdir / f'bench-{secrets.token_hex(3)}.db'}"
    else:
        store = "memory://"
    ports = [free_port() for _ in range(replicas)]
    if kind == "floor_eb":
        procs = [spawn([str(REPO / "bench" / "bench_server.py"), "--serve-floor-eb", str(p)], env) for p in ports]
    else:
        procs = [spawn(["-m", "chatrun", "serve", str(workdir / "bench.yaml"), "--port", str(p), "--store", store,
                        "--log-level", "warning", "--max-in-flight", "64"], env) for p in ports]
    try:
        for port, proc in zip(ports, procs, strict=True):
            wait_port(port, proc, 60)
        redis = kind == "redis"
        return asyncio.run(run_load(ports, args.sessions, args.turns, [p.pid for p in procs],
                                    redis_pid if redis else None, redis_port if redis else None))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


async def lock_cost(redis_port: int, rounds: int) -> dict[str, list[float]]:
    from chatrun.store.aio import LeaseSettings
    from chatrun.store.buffer import TurnBuffer
    from chatrun.store.redis import RedisStore
    from chatrun.store.versions import CREATE

    store = RedisStore(f"redis://127.0.0.1:{redis_port}/0?prefix=lock{secrets.token_hex(3)}:", LeaseSettings())
    lease_ms, commit_ms = [], []
    version = None
    for i in range(rounds):
        sid = f"s{i % 100}"
        t0 = time.perf_counter()
        lease = await store.acquire(sid, wait=5)
        await store.release(lease)
        lease_ms.append((time.perf_counter() - t0) * 1000)
    lease = await store.acquire("c", wait=5)
    for i in range(rounds):
        buffer = TurnBuffer("c")
        buffer.commit_turn("c", {"turn": i, "state": {"n": i}}, {}, [{"turn": i, "ok": True, "input": "hi"}])
        t0 = time.perf_counter()
        commit = buffer.take()
        assert commit is not None
        commit.expected = version or CREATE
        version = await store.commit_turn(commit, lease)
        commit_ms.append((time.perf_counter() - t0) * 1000)
    await store.release(lease)
    await store.close()
    return {"lease acquire+release": lease_ms, "fenced commit (one Lua script)": commit_ms}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


CONFIGS = (("floor_eb", 1), ("memory", 1), ("sqlite", 1), ("redis", 1), ("redis", 2), ("redis", 3))


def report(results: dict[tuple[str, int], list[dict[str, float]]], delay: float) -> None:
    print(f"{'store':<10}{'replicas':>9}{'turns/s':>10}{'p50 +ms':>10}{'p99 +ms':>10}"
          f"{'CPU ms/turn min/med':>22}{'x floor_eb':>12}{'Redis CPU ms/turn':>19}{'Redis ops/turn':>16}")
    floor = statistics.median(r["cpu_ms"] for r in results[("floor_eb", 1)])
    for (kind, n), runs in results.items():
        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        cpu = f"{min(r['cpu_ms'] for r in runs):.2f} / {med('cpu_ms'):.2f}"
        print(f"{kind:<10}{n:>9}{med('throughput'):>10.1f}{(med('p50') - delay) * 1000:>10.1f}"
              f"{(med('p99') - delay) * 1000:>10.1f}{cpu:>22}{med('cpu_ms') / floor:>12.2f}"
              f"{med('redis_cpu_ms'):>19.2f}{med('redis_ops'):>16.1f}", flush=True)
    three = results[("redis", 3)]
    c = statistics.median(r["cpu_ms"] for r in three)
    r_ms = statistics.median(r["redis_cpu_ms"] for r in three)
    ops = statistics.median(r["redis_ops"] for r in three)
    redis_cap = 1000 / r_ms if r_ms > 0 else float("inf")
    print(f"model of N cores for replicas (from the 3-replica run: {c:.2f} ms chatrun CPU and {r_ms:.3f} ms "
          f"Redis CPU, {ops:.1f} Redis commands per turn; one Redis thread tops out at {redis_cap:,.0f} turns/s):")
    for cores in (1, 2, 4, 8, 16, 32):
        ceiling = min(cores * 1000 / c, redis_cap)
        bound = "Redis" if redis_cap < cores * 1000 / c else "replica CPU"
        print(f"  {cores:>3} cores: <= {ceiling:8,.0f} turns/s (bound by {bound})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50, help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=6, help="turns per session")
    parser.add_argument("--delay", type=float, default=0.1, help="the fake model's answer delay, seconds")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; configurations interleaved in each")
    parser.add_argument("--lock-rounds", type=int, default=2000, help="lease acquire/release rounds timed")
    parser.add_argument("--lock-only", action="store_true", help="only time the lease and the commit")
    args = parser.parse_args()
    redis_folder = Path(tempfile.mkdtemp(prefix="chatrun-bench-redis-"))
    redis, redis_port = start_redis(redis_folder)
    fake_port = free_port()
    fake = spawn(["-m", "chatrun.testing.fake_openai", "--port", str(fake_port), "--text",
                  "Sure, happy to help with that.", "--delay", str(args.delay)],
                 dict(os.environ, PYTHONPATH=str(REPO / "runner")))
    try:
        wait_port(fake_port, fake)
        print(f"{os.cpu_count()} CPUs, load average {load_average()}")
        costs = asyncio.run(lock_cost(redis_port, args.lock_rounds))
        for name, values in costs.items():
            print(f"{name:<34} p50 {statistics.median(values):.3f} ms   p99 {pct(values, 0.99):.3f} ms   "
                  f"({len(values)} rounds, loopback)")
        if args.lock_only:
            return
        fake_url = f"http://127.0.0.1:{fake_port}/v1"
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            (workdir / "bench.yaml").write_text(textwrap.dedent(BOT))
            print(f"fake model delay {args.delay * 1000:.0f} ms, {args.sessions} sessions x {args.turns} turns, "
                  f"{args.rounds} rounds interleaved; with N replicas turn t of session i goes to replica "
                  "(i+t) mod N; added = latency - delay; medians over rounds unless marked")
            results: dict[tuple[str, int], list[dict[str, float]]] = {config: [] for config in CONFIGS}
            for _ in range(args.rounds):
                for kind, n in CONFIGS:
                    results[(kind, n)].append(measure(kind, n, args, fake_url, workdir, redis_port, redis.pid))
            report(results, args.delay)
        print(f"load average after: {load_average()}")
    finally:
        fake.terminate()
        fake.wait(10)
        redis.terminate()
        redis.wait(10)
        shutil.rmtree(redis_folder, ignore_errors=True)


if __name__ == "__main__":
    main()
