"""The scale-out case of issue 33 (finding 8): 2 `chatrun serve` replicas on one Redis against one
process on SQLite, 1,000 concurrent WebSocket conversations, the fake model answering after
200 ms. Each conversation opens one WebSocket to replica i mod N, sends Connect (all of them at
once: the burst that redis-py's default pool refused with "Too many connections"), then its
turns one after the other. Figures per configuration: Connects and turns that failed, turns/s
over the turn phase (and x the SQLite process), added latency p50/p99 (send -> Completed minus
the model's delay), beside the floor (bench_server.py's floor_eb: a bare WebSocket endpoint
calling the same fake model) measured in the same run.

    python bench/bench_pool.py                              # 1,000 conversations x 3 turns, 1 round
    python bench/bench_pool.py --conversations 500 --turns 4 --rounds 3
    python bench/bench_pool.py --pools 100 5 2000           # Redis pool sizes (max_connections) to compare

Target (issue 33): 0 errors, and 2 replicas >= 0.9x one SQLite process. Read the throughput with
care on a small machine: the replicas, Redis, the fake model and this load generator share its
cores, so 2 replicas cannot beat one process there by much; errors and the pool's effect carry over.
On a CPU-starved machine (load far above its cores) a replica's event loop may stall for more
than 2/3 of its lease TTL: it loses leases mid-turn (`Failed(Conflict)`) whatever its pool size;
`--lease-ttl 60` shows what the pool does apart from that.

Figures (2 CPUs shared with other work, load average 10; 1,000 conversations x 2 turns, 200 ms):

    --lease-ttl 60        errors   turns/s  x sqlite
    floor_eb (1 process)   0 / 0     61.2      1.32
    sqlite (1 process)     0 / 0     46.4      1.00
    redis x2, default pool 0 / 0     86.9      1.87
    redis x2, pool 5       0 / 0    119.6      2.58
    default --lease-ttl (10 s), same load: redis x2 0 / 649 Failed(Conflict) (leases lost, CPU-starved);
    with ?max_connections=2000: 0 / 1835 Conflict. Before issue 33, the default pool also refused
    Connects and turns with "Too many connections" (the issue: 800 of 1,000 Connects).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scaleout import BOT, start_redis  # noqa: E402
from bench_server import free_port, load_average, spawn, wait_port  # noqa: E402

STEP_TIMEOUT = 300.0  # seconds one Connect or turn may take before it counts as failed


async def _step(ws, frame: dict) -> str:
    """Send `frame`, read up to its Completed/Failed: "ok", or what failed."""
    await ws.send(json.dumps(frame))
    while True:
        reply = json.loads(await asyncio.wait_for(ws.recv(), STEP_TIMEOUT))
        if reply["type"] == "Completed":
            return "ok"
        if reply["type"] == "Failed":
            return f"Failed({reply.get('data')})"


class Phase:
    """The conversations' meeting point: all Connects done (ok or not), then the turns go."""

    def __init__(self, conversations: int) -> None:
        self.left, self.connected, self.go = conversations, asyncio.Event(), asyncio.Event()

    def connect_done(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.connected.set()


async def conversation(url: str, chat_id: str, turns: int, phase: Phase, latencies: list[float],
                       errors: Counter) -> None:
    import websockets

    connecting = True
    try:
        async with websockets.connect(url, open_timeout=STEP_TIMEOUT, ping_interval=None, close_timeout=5) as ws:
            connected = await _step(ws, {"type": "Connect", "chatId": chat_id})
            connecting = False
            phase.connect_done()
            if connected != "ok":
                errors[f"Connect: {connected}"] += 1
                return
            await phase.go.wait()
            for t in range(turns):
                start = time.perf_counter()
                said = await _step(ws, {"type": "ChatRouteMessage", "chatId": chat_id,
                                        "data": {"userMessage": f"turn {t}"}})
                if said != "ok":
                    errors[f"turn: {said}"] += 1
                    continue
                latencies.append(time.perf_counter() - start)
    except Exception as exc:  # refused, closed, timed out: an error of this conversation
        errors[f"{'Connect' if connecting else 'turn'}: {type(exc).__name__}"] += 1
        if connecting:
            phase.connect_done()


async def run_load(ports: list[int], conversations: int, turns: int) -> dict[str, object]:
    tag = secrets.token_hex(3)
    latencies: list[float] = []
    errors: Counter = Counter()
    phase = Phase(conversations)
    tasks = [asyncio.ensure_future(conversation(f"ws://127.0.0.1:{ports[i % len(ports)]}/_chat/routes",
                                                f"p{tag}-{i}", turns, phase, latencies, errors))
             for i in range(conversations)]
    await phase.connected.wait()  # every Connect at once (the burst), then every conversation's turns
    start = time.perf_counter()
    phase.go.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    latencies.sort()
    n = len(latencies)
    return {"turns": n, "throughput": n / wall if wall else 0.0, "errors": errors,
            "p50": statistics.median(latencies) if n else float("nan"),
            "p99": latencies[min(n - 1, int(n * 0.99))] if n else float("nan")}


def measure(kind: str, replicas: int, pool: int | None, args: argparse.Namespace, fake_url: str, workdir: Path,
            redis_port: int) -> dict[str, object]:
    env = dict(os.environ, OPENAI_BASE_URL=fake_url, OPENAI_API_KEY="bench")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "runner"), env.get("PYTHONPATH")]))
    env.pop("CHATRUN_AUTH_FILE", None)
    if kind == "redis":
        store = f"redis://127.0.0.1:{redis_port}/0?prefix=pool{secrets.token_hex(3)}:"
        store += f"&max_connections={pool}" if pool is not None else ""
    else:
        store = f"sqlite:///{workdir / f'bench-{secrets.token_hex(3)}.db'}"
    ports = [free_port() for _ in range(replicas)]
    if kind == "floor_eb":
        procs = [spawn([str(REPO / "bench" / "bench_server.py"), "--serve-floor-eb", str(p)], env) for p in ports]
    else:
        cap = str(args.conversations + 100)  # the server's connection cap is not what is measured
        lease = ["--lease-ttl", str(args.lease_ttl)] if args.lease_ttl and kind == "redis" else []
        procs = [logged(["-m", "chatrun", "serve", str(workdir / "bench.yaml"), "--port", str(p), "--store", store,
                         "--log-level", "warning", "--max-connections", cap, *lease], env, workdir / f"replica-{p}.log")
                 for p in ports]
    try:
        for port, proc in zip(ports, procs, strict=True):
            wait_port(port, proc, 90)
        result = asyncio.run(run_load(ports, args.conversations, args.turns))
        result["log"] = Counter(_log_lines(workdir / f"replica-{p}.log") for p in ports if kind != "floor_eb")
        return result
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def logged(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def _log_lines(log: Path) -> str:
    """The replica's warnings and errors, the first of each kind (for the report)."""
    seen: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        if "ERROR" in line or "WARNING" in line or "Error" in line:
            seen.setdefault(line[:60], line[:300])
    return "\n".join(list(seen.values())[:5])


def configs(pools: list[int | None]) -> list[tuple[str, int, int | None]]:
    return [("floor_eb", 1, None), ("sqlite", 1, None), *(("redis", 2, p) for p in pools)]


def report(results: dict[tuple[str, int, int | None], list[dict]], args: argparse.Namespace) -> None:
    print(f"{'store':<8}{'replicas':>9}{'pool':>8}{'errors (Connect/turn)':>24}{'turns/s':>10}{'x sqlite':>10}"
          f"{'x floor':>9}{'p50 +ms':>10}{'p99 +ms':>10}")
    throughput = {config: statistics.median(r["throughput"] for r in runs) for config, runs in results.items()}
    sqlite, floor = throughput[("sqlite", 1, None)], throughput[("floor_eb", 1, None)]
    for (kind, n, pool), runs in results.items():
        errors: Counter = sum((r["errors"] for r in runs), Counter())
        connects = sum(v for k, v in errors.items() if k.startswith("Connect"))
        turns = sum(errors.values()) - connects
        shown_pool = "-" if kind != "redis" else str(pool) if pool is not None else "default"
        p50 = statistics.median(r["p50"] for r in runs) - args.delay
        p99 = statistics.median(r["p99"] for r in runs) - args.delay
        print(f"{kind:<8}{n:>9}{shown_pool:>8}{f'{connects} / {turns}':>24}{throughput[(kind, n, pool)]:>10.1f}"
              f"{throughput[(kind, n, pool)] / sqlite:>10.2f}{throughput[(kind, n, pool)] / floor:>9.2f}"
              f"{p50 * 1000:>10.1f}{p99 * 1000:>10.1f}", flush=True)
        for what, count in errors.most_common(3):
            print(f"{'':<17}{count} x {what}")
        if args.show_logs:
            for run in runs:
                for text in run.get("log", {}):
                    if text:
                        print(textwrap.indent(text, " " * 17))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=1000, help="concurrent WebSocket conversations")
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation")
    parser.add_argument("--delay", type=float, default=0.2, help="the fake model's answer delay, seconds")
    parser.add_argument("--rounds", type=int, default=1, help="rounds; configurations interleaved in each")
    parser.add_argument("--pools", nargs="*", type=int, default=None,
                        help="Redis pool sizes (max_connections) to run besides the default")
    parser.add_argument("--lease-ttl", type=float, default=None,
                        help="the replicas' --lease-ttl (default: the server's); a replica whose event loop lags "
                             "over 2/3 of it (a CPU-starved machine) loses leases: Failed(Conflict)")
    parser.add_argument("--show-logs", action="store_true", help="print the replicas' first warnings and errors")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds every client socket
    redis_folder = Path(tempfile.mkdtemp(prefix="chatrun-bench-redis-"))
    redis, redis_port = start_redis(redis_folder)
    fake_port = free_port()
    fake = spawn(["-m", "chatrun.testing.fake_openai", "--port", str(fake_port), "--text",
                  "Sure, happy to help with that.", "--delay", str(args.delay)],
                 dict(os.environ, PYTHONPATH=str(REPO / "runner")))
    try:
        wait_port(fake_port, fake)
        print(f"{os.cpu_count()} CPUs, load average {load_average()}; fake model delay {args.delay * 1000:.0f} ms, "
              f"{args.conversations} conversations x {args.turns} turns, {args.rounds} round(s); conversation i on "
              "replica i mod N; added = latency - delay (medians over rounds)")
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            (workdir / "bench.yaml").write_text(textwrap.dedent(BOT))
            results: dict[tuple[str, int, int | None], list[dict]] = {c: [] for c in configs([None, *(args.pools or [])])}
            for _ in range(args.rounds):
                for kind, n, pool in results:
                    results[(kind, n, pool)].append(measure(kind, n, pool, args, f"http://127.0.0.1:{fake_port}/v1",
                                                            workdir, redis_port))
            report(results, args)
        print(f"load average after: {load_average()}")
    finally:
        fake.terminate()
        fake.wait(10)
        redis.terminate()
        redis.wait(10)
        shutil.rmtree(redis_folder, ignore_errors=True)


if __name__ == "__main__":
    main()
