"""`chatrun serve` under load: N concurrent WebSocket sessions against the fake OpenAI server
answering after a fixed delay, side by side with two floors: a bare FastAPI WebSocket endpoint
that calls the same fake model with the same client, sends the same history (the last 20
messages of the chat, as the bot's window keeps) and speaks the same frames, with no engine,
no sessions and no store; "floor" passes the history as the SDK's `messages=` (which the SDK
re-walks on every call), "floor_eb" the way chatrun does (`extra_body`): the real minimum.
CPU ms/turn is the server process's; "x floor_eb" compares it with floor_eb's from the same run.

Per configuration and N (100, 1,000): throughput (turns/s), added latency p50/p99 (time from
sending a ChatRouteMessage to its Completed, minus the model's delay), and server memory per
session (RSS growth once N sessions exist, divided by N). Three processes on loopback: the fake
model, the server under test, and this load generator.

    python bench/bench_server.py                   # N = 100 and 1000, delay 0.2 s, 3 turns each
    python bench/bench_server.py --sessions 100 --turns 5 --delay 0.1
    python bench/bench_server.py --sessions 1000 --runs 5    # medians of 5 runs, interleaved
    python bench/bench_server.py --sessions 1000 --delay 10 --spread 10 --turns 2   # below saturation
    python bench/bench_server.py --sessions 100 --runs 3 --before /tmp/old   # an older checkout beside

With --before DIR (a checkout, e.g. `git worktree add -f /tmp/old main --detach`) the runs add
"before memory://": `chatrun serve` from DIR's runner/, interleaved with the others.

Each run starts fresh server processes; with --runs the configurations take turns (floor,
memory://, sqlite, floor, ...) so a change in machine load hits all of them alike, and the
table shows per-column medians. The load average is printed before and after.

Targets: within 10% of the floor's throughput, under 5 ms added p99 at 1,000 sessions (issue 5);
CPU per turn <= 1.1x floor_eb (issue 26).
Issue 39 (2026-12-06, 100 sessions, --before main e3b2912): CPU per turn 1.19x -> 1.09x floor_eb
(--runs 7 --turns 10), 1.25x -> 1.27x (--runs 5 --turns 5), 1.20x -> 1.28x: the goal <= 1.15x is not met.
2026-12-06 (h-wscut), instructions of a late turn (bench_openai_api.py --instructions --only ws,
bench/turn_parts.py ws; lockstep_client below): 13.54-13.64 M -> 13.21-13.24 M against floor_eb
11.65-11.75 M, 1.16x -> 1.13x; CPU at load average 6.4 (--runs 5 --turns 10 --before): before 1.06x,
after 1.11x floor_eb (noise at that load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))

BOT = """
name: bench
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, timeout: 120}
memory: {type: message_window, max_messages: 20}
routes:
  main:
    default: true
    system: "You are a concise assistant."
"""


# -- the floor: same frames, same model client, nothing else ---------------------------------------


WINDOW = 20  # the bot's message_window: the floors send the same history


def floor_app(extra_body: bool = False) -> FastAPI:
    """The floor: the SDK's streaming call with the chat's history (the last WINDOW messages,
    as the bot's memory keeps), passed as `messages=` (the SDK re-walks them) or, for floor_eb,
    the way chatrun passes them (`extra_body`): the real minimum."""
    import openai

    app = FastAPI()
    client = openai.AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="bench", max_retries=0, timeout=120)
    system = {"role": "system", "content": "You are a concise assistant."}

    @app.websocket("/_chat/routes")
    async def routes(ws: WebSocket) -> None:
        await ws.accept()
        histories: dict[str, list[dict]] = {}

        async def turn(frame: dict) -> None:
            chat_id = frame["chatId"]
            history = histories.setdefault(chat_id, [])
            history.append({"role": "user", "content": frame["data"]["userMessage"]})
            del history[:-WINDOW]
            messages = [system, *history]
            if extra_body:
                stream = await client.chat.completions.create(
                    model="gpt-4o-mini", messages=[], stream=True, stream_options={"include_usage": True},
                    extra_body={"messages": messages})
            else:
                stream = await client.chat.completions.create(
                    model="gpt-4o-mini", messages=messages, stream=True,  # type: ignore[arg-type]
                    stream_options={"include_usage": True})
            text = []
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text.append(chunk.choices[0].delta.content)
                    await ws.send_text(json.dumps({"chatId": chat_id, "type": "Stream", "data": text[-1]}))
            history.append({"role": "assistant", "content": "".join(text)})
            await ws.send_text(json.dumps({"chatId": chat_id, "type": "Message", "data": "".join(text)}))
            await ws.send_text(json.dumps({"chatId": chat_id, "type": "Completed", "data": chat_id + ".1"}))

        tasks = set()
        try:
            while True:
                frame = json.loads(await ws.receive_text())
                if frame["type"] == "Connect":
                    await ws.send_text(json.dumps({"chatId": frame["chatId"], "type": "Completed", "data": frame["chatId"] + ".1"}))
                else:
                    task = asyncio.ensure_future(turn(frame))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        except WebSocketDisconnect:
            pass

    return app


def serve_floor(port: int, extra_body: bool = False) -> None:
    import uvicorn

    from chatrun.server.app import tune_gc

    app = floor_app(extra_body)
    # The same garbage-collector settings `chatrun serve` applies once its app is built, so the
    # difference measured is the engine's, not the runtime's (with CPython's defaults the floor
    # spends ~1.4 ms of CPU per turn in the collector at 1,000 sessions, chatrun ~1.8 ms).
    tune_gc()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# -- processes -------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a bench process exited: {proc.stdout.read().decode() if proc.stdout else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port} after {timeout} s")


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ThreadsCpu:
    """CPU time a process's threads spend between readings, in nanoseconds from the scheduler
    (/proc/PID/task/*/schedstat: time on a CPU, user and kernel), where `cpu_seconds` reads
    /proc/PID/stat's clock ticks (10 ms: 0.125 ms a turn over a block of 80 turns, the size of
    a change these benches look for). A thread that ends between two readings takes its time
    in that span with it (`lost` counts those seen at the earlier reading; one that starts and
    ends between two is not seen at all): compare a whole run with `cpu_seconds`, which counts
    ended threads too."""

    def __init__(self, pid: int):
        self.pid, self.lost = pid, 0
        self._last = self._threads()

    def _threads(self) -> dict[int, int]:
        spent = {}
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                spent[int(task.name)] = int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):  # the thread ended while listed
                continue
        return spent

    def seconds(self) -> float:
        """CPU seconds since the last reading (or since this clock was made)."""
        now = self._threads()
        self.lost += len(self._last.keys() - now.keys())
        spent = sum(ns - self._last.get(tid, 0) for tid, ns in now.items())
        self._last = now
        return spent / 1e9


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- load -----------------------------------------------------------------------------------------------------


async def run_load(url: str, sessions: int, turns: int, pid: int, spread: float = 0.0) -> dict[str, float]:
    import websockets

    latencies: list[float] = []
    per_conn = 1  # one chat per connection, like a browser tab
    connections = []
    sem = asyncio.Semaphore(200)  # bounded connect ramp so the accept queue never overflows

    async def open_one(i: int) -> ClientConnection:
        async with sem:
            ws = await websockets.connect(url, max_size=2**20, open_timeout=60, ping_interval=None)
            # Extended dialect: chatrun then sends the chunks and the full Message, as the floor does.
            await ws.send(json.dumps({"type": "Connect", "chatId": f"bench-{os.getpid()}-{i}", "extensions": True}))
            while json.loads(await ws.recv())["type"] != "Completed":
                pass
            return ws

    rss_before = rss_mb(pid)
    connections = await asyncio.gather(*(open_one(i) for i in range(sessions // per_conn)))

    async def chat(i: int, ws: ClientConnection) -> None:
        chat_id = f"bench-{os.getpid()}-{i}"
        # Staggered starts (--spread): session i begins at i/N of the window, so N sessions offer
        # about N/delay turns per second instead of all N arriving in the same instant.
        await asyncio.sleep(spread * i / len(connections))
        for t in range(turns):
            latencies.append(await timed_turn(ws, chat_id, f"turn {t}"))

    start, cpu_start = time.perf_counter(), cpu_seconds(pid)
    await asyncio.gather(*(chat(i, ws) for i, ws in enumerate(connections)))
    wall, cpu = time.perf_counter() - start, cpu_seconds(pid) - cpu_start
    rss_after = rss_mb(pid)
    await asyncio.gather(*(ws.close() for ws in connections))
    latencies.sort()
    return {
        "turns": len(latencies),
        "wall": wall,
        "throughput": len(latencies) / wall,
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "kb_per_session": (rss_after - rss_before) * 1024 / sessions,
        "cpu_ms_per_turn": cpu * 1000 / len(latencies),
    }


async def timed_turn(ws, chat_id: str, text: str) -> float:
    """Send one ChatRouteMessage and wait for its Completed frame: the seconds it took."""
    start = time.perf_counter()
    await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": chat_id, "data": {"userMessage": text}}))
    while True:
        frame = json.loads(await ws.recv())
        if frame["type"] in ("Completed", "Failed"):
            break
    if frame["type"] == "Failed":
        raise SystemExit(f"a turn failed: {frame}")
    return time.perf_counter() - start


async def lockstep_client(url: str, turns: int, conversations: int = 4) -> None:
    """The client of the WebSocket kinds of `bench_openai_api.py --instructions` (run in its own
    process, so its work is not counted): `conversations` chats, one a connection, turn k of each
    before turn k+1 of any, one turn at a time, then one closing turn on the first chat, whose
    frame ends the count."""
    import websockets

    connections = [await websockets.connect(url, max_size=2**20, ping_interval=None) for _ in range(conversations)]
    for i, ws in enumerate(connections):
        await ws.send(json.dumps({"type": "Connect", "chatId": f"c{i}", "extensions": True}))
        while json.loads(await ws.recv())["type"] != "Completed":
            pass
    for t in range(turns):  # one turn at a time, as the HTTP kinds: what runs inside a part is its turn's
        for i, ws in enumerate(connections):
            await timed_turn(ws, f"c{i}", f"c{i} message number {t}")
    await timed_turn(connections[0], "c0", "the closing turn")
    await asyncio.gather(*(ws.close() for ws in connections))


def measure(kind: str, sessions: int, turns: int, fake_url: str, workdir: Path, spread: float = 0.0,
            before: Path | None = None) -> dict[str, float]:
    port = free_port()
    env = dict(os.environ, OPENAI_BASE_URL=fake_url, OPENAI_API_KEY="bench")
    runner = before / "runner" if kind.startswith("before") and before else REPO / "runner"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(runner), env.get("PYTHONPATH")]))
    env.pop("CHATRUN_AUTH_FILE", None)
    if kind in ("floor", "floor_eb"):
        proc = spawn([__file__, "--serve-floor-eb" if kind == "floor_eb" else "--serve-floor", str(port)], env)
    else:
        store = "memory://" if kind.endswith("memory://") else f"sqlite:///{workdir / f'bench-{port}.db'}"
        bot = workdir / "bench.yaml"
        proc = spawn(["-m", "chatrun", "serve", str(bot), "--port", str(port), "--store", store,
                      "--log-level", "warning", "--max-in-flight", "64"], env)
    try:
        wait_port(port, proc)
        return asyncio.run(run_load(f"ws://127.0.0.1:{port}/_chat/routes", sessions, turns, proc.pid, spread))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per-figure medians (each column on its own, so a row need not come from one run)."""
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, action="append", help="concurrent sessions (repeatable); default 100 and 1000")
    parser.add_argument("--turns", type=int, default=3, help="turns per session")
    parser.add_argument("--delay", type=float, default=0.2, help="the fake model's answer delay, seconds")
    parser.add_argument("--spread", type=float, default=0.0,
                        help="start the sessions' first turns evenly over this many seconds (0: all at once); "
                        "with --spread equal to --delay the load is N/delay turns/s, below saturation if the CPU allows")
    parser.add_argument("--runs", type=int, default=1, help="runs per configuration; the table shows medians")
    parser.add_argument("--before", type=Path, help="an older checkout: adds 'before memory://' (its runner/), interleaved")
    parser.add_argument("--serve-floor", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor-eb", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)  # a URL: lockstep_client's turns, then exit
    args = parser.parse_args()
    if args.serve_floor or args.serve_floor_eb:
        serve_floor(args.serve_floor or args.serve_floor_eb, extra_body=bool(args.serve_floor_eb))
        return
    if args.client:
        asyncio.run(lockstep_client(args.client, args.turns))
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    sizes = args.sessions or [100, 1000]
    fake_port = free_port()
    fake = spawn(["-m", "chatrun.testing.fake_openai", "--port", str(fake_port), "--text",
                  "Sure, happy to help with that.", "--delay", str(args.delay)],
                 dict(os.environ, PYTHONPATH=str(REPO / "runner")))
    try:
        wait_port(fake_port, fake)
        fake_url = f"http://127.0.0.1:{fake_port}/v1"
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            (workdir / "bench.yaml").write_text(textwrap.dedent(BOT))
            print(f"fake model delay {args.delay * 1000:.0f} ms, {args.turns} turns per session, "
                  f"{os.cpu_count()} CPUs, median of {args.runs} run(s), starts spread over {args.spread:g} s; latency = send -> Completed, "
                  f"added = latency - delay; load average {load_average()}")
            print(f"{'server':<22}{'sessions':>9}{'turns/s':>10}{'vs floor':>10}{'p50 +ms':>10}{'p99 +ms':>10}"
                  f"{'KiB/session':>13}{'CPU ms/turn':>13}{'x floor_eb':>12}")
            kinds: tuple[str, ...] = ("floor", "floor_eb", "chatrun memory://", "chatrun sqlite")
            if args.before:
                kinds = ("floor", "floor_eb", "before memory://", "chatrun memory://", "chatrun sqlite")
            for n in sizes:
                results: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
                for _ in range(args.runs):
                    for kind in kinds:
                        results[kind].append(measure(kind, n, args.turns, fake_url, workdir, args.spread, args.before))
                floor, floor_eb = median_of(results["floor"]), median_of(results["floor_eb"])
                for kind in kinds:
                    r = median_of(results[kind])
                    ratio = r["throughput"] / floor["throughput"] * 100
                    cpu_ratio = r["cpu_ms_per_turn"] / floor_eb["cpu_ms_per_turn"]
                    print(f"{kind:<22}{n:>9}{r['throughput']:>10.1f}{ratio:>9.0f}%"
                          f"{(r['p50'] - args.delay) * 1000:>10.1f}{(r['p99'] - args.delay) * 1000:>10.1f}"
                          f"{r['kb_per_session']:>13.1f}{r['cpu_ms_per_turn']:>13.2f}{cpu_ratio:>12.2f}", flush=True)
            print(f"load average after: {load_average()}")
    finally:
        fake.terminate()
        fake.wait(10)


if __name__ == "__main__":
    main()
