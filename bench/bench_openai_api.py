"""What the OpenAI-compatible API costs the server per turn, early and late in a conversation,
against chatrun's own HTTP API and two floors, all measured in the same run.

Three kinds of process on loopback: the fake OpenAI model (echo, no delay), the server under
test, and this load generator. Measured: CPU time of the server process per turn (its threads'
time on a CPU from /proc/PID/task/*/schedstat, in ns, so the client's and the model's work is not
counted; figures dated 2026-12-06 and before read /proc/PID/stat's 10 ms ticks, too coarse for a
5% change), for turns 1-10 and turns 31-40 of --conversations conversations of --turns turns,
contenders interleaved round by round; the table shows the min and median over rounds.

Contenders:
  floor      a bare FastAPI /v1/chat/completions that forwards the client's whole history to
             the model with the `openai` SDK (`messages=`, which the SDK re-walks) and answers
             the SDK's parsed completion
  floor_eb   the same passing the history the way chatrun does (`extra_body`): the real minimum
  http       chatrun serve, POST /bots/echo/sessions/{id}/messages (the client names the session)
  chat       chatrun serve, POST /v1/chat/completions with the whole history (reconciliation)
  responses  chatrun serve, POST /v1/responses with previous_response_id

Goals (issue 39): http <= 1.15x floor_eb; chat <= 1.3x floor_eb and flat from 5 to 40 turns
(issue 26 had asked chat <= 1.15x). Also printed: the bytes the records table holds after the
run (the turn index; each record holds the session's state). `--before DIR` serves an older
checkout beside this one (rows ending in _before), its rounds interleaved with the others.

Last figures (2026-12-06, `--rounds 5 --conversations 8 --before <main e062a16> --only
http,chat`, load average 6-8 on 2 cores: the medians move by 20% between runs, the mins less),
CPU ms per turn, min / median, turns 1-10 and 31-40:

    floor_eb      1.50 / 2.00    1.75 / 2.38
    http          3.37 / 4.75    4.00 / 4.62   (1.95x floor_eb late, median; 2.29x by mins)
    chat          5.37 / 5.88    5.50 / 6.88   (2.89x; 3.14x by mins; late/early 1.17, floor_eb's 1.19)
    http_before   4.25 / 4.62    4.88 / 5.25   (2.21x; 2.79x by mins)
    chat_before   5.37 / 6.75    6.50 / 6.75   (2.84x; 3.71x by mins)

The /v1 cuts (2026-12-06, `--only chat --before <main 9805da5>`, two runs, load average 3-8), late
turns, min / median: chat 4.13 / 4.87 and 3.88 / 5.00, 2.29x and 2.35x floor_eb (before 5.00 / 5.37
and 4.75 / 5.75, 2.53x and 2.71x); late/early 1.08 and 1.18 beside floor_eb's 0.94 and 1.21.

Instructions per late turn (callgrind, in process; bench/README.md): http 10.08 -> 9.67 M, chat
15.96 -> 14.75 M, floor_eb 6.64 M; after the /v1 cuts (`--instructions`, merged main) chat 14.80 -> 13.69 M (2.02x). After "assemble once" on the HTTP path (2026-12-06, h-walk,
`--instructions`, the ASGI app called directly): floor_eb 6.79 M, http 9.53 -> 9.51 M (1.40x); by
CPU at load average 5-8, http 1.52x and 1.76x floor_eb late (median) in two interleaved runs. Neither goal is met: what is left of the gap is mostly the engine's turn (a turn's model
call through chatrun's model layer, the session's commit) and, for /v1, the index's records
(the session's state is written with every turn, for forks): see bench/README.md.

After h-httpins (2026-12-06, `--instructions --before <main 2d509de>`): floor_eb 6.77 M, http 9.60 -> 9.06 M
(1.34x), chat 13.59 -> 13.04 M (1.93x): a memory's JSON written from its messages' text, the body read
under a timer instead of a task. Where the rest goes, part by part: bench/turn_parts.py, bench/README.md.
After h-httpcut (2026-12-06, `--instructions --before <main 38ee10a>`, load average 3-7): floor_eb 6.77 M,
http 9.36 -> 8.24 M (1.22x; not met), chat 13.13 -> 12.71 M (1.88x): the turn's route reads its own
parameters, is matched first, and skips FastAPI's request wrapping; SQLite's calls through one thread.

After h-v1cut (2026-12-06, `--instructions --before <main 38ee10a>`, load average 4-8): floor_eb 6.75 M,
http 9.13 -> 9.21 M (untouched), chat 13.11 -> 12.69 M (1.88x; goal 1.3x: not met): the list of kept turns not read
back each turn, a JSON answer's turn run whole (bench/README.md, "The `/v1` turn, third pass").

    python bench/bench_openai_api.py                          # 3 rounds, 8 conversations of 40 turns
    python bench/bench_openai_api.py --rounds 5 --conversations 10
    python bench/bench_openai_api.py --before /tmp/before --only http,chat   # an older checkout, interleaved
    python bench/bench_openai_api.py --instructions --before /tmp/before     # callgrind: floor_eb, http, chat (and before)
    python bench/bench_openai_api.py --instructions --only ws --before /tmp/before   # a WebSocket turn: ws_floor_eb, ws
    python bench/bench_openai_api.py --instructions --served --only http   # served by uvicorn over a socket, memory://

The WebSocket kinds (`--only ws`, and bench/turn_parts.py's `ws`, `ws_floor_eb`) count a turn of
bench_server.py's bot and floor on a real socket through the server's own uvicorn protocols
(listen.py: permessage-deflate as the client offers it), the client in a process of its own
(bench_server.lockstep_client, one turn at a time, not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runner"))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402

from bench_server import ThreadsCpu, cpu_seconds, free_port, spawn, wait_port  # noqa: E402

BOT = """
name: echo
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
memory: {type: message_window, max_messages: 200}
routes:
  main:
    default: true
    system: Repeat what the user says.
"""
SYSTEM = "Repeat what the user says."
# The stores chatrun is served on. The floors keep nothing, so `memory://` serves the same turn as
# they do (the http and chat rows); SQLite's rows (`_sqlite`) add what keeping every turn on disk costs.
STORES = ("memory", "sqlite")
EARLY, LATE = range(0, 10), range(30, 40)


# -- the floors --------------------------------------------------------------------------------------


def floor_app(extra_body: bool) -> FastAPI:
    import openai

    app = FastAPI()
    client = openai.AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="bench", max_retries=0)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        messages = [{"role": "system", "content": SYSTEM}, *body["messages"]]
        if extra_body:
            completion = await client.chat.completions.create(model="gpt-4o-mini", messages=[],
                                                              extra_body={"messages": messages})
        else:
            completion = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        answer = {"id": completion.id, "object": "chat.completion", "created": completion.created,
                  "model": body["model"], "choices": [{"index": 0, "finish_reason": "stop", "message": {
                      "role": "assistant", "content": completion.choices[0].message.content}}]}
        return Response(json.dumps(answer), media_type="application/json")

    return app


def serve_floor(port: int, extra_body: bool) -> None:
    import uvicorn

    from chatrun.server.app import tune_gc

    app = floor_app(extra_body)
    tune_gc()  # the same collector settings as chatrun serve (see bench_server.py)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# -- conversations ---------------------------------------------------------------------------------


class Conversation:
    """One client conversation against one contender; `turn()` sends the next message."""

    def __init__(self, http: httpx.Client, kind: str, name: str):
        self.http, self.kind, self.name = http, kind, name
        self.history: list[dict[str, Any]] = []
        self.previous: str | None = None
        self.count = 0
        if kind == "http":
            http.post("/bots/echo/sessions", json={"id": name}).raise_for_status()

    def turn(self) -> None:
        text = f"{self.name} message number {self.count}"
        self.count += 1
        if self.kind == "http":
            self.http.post(f"/bots/echo/sessions/{self.name}/messages", json={"userMessage": text}).raise_for_status()
        elif self.kind == "responses":
            body = {"model": "echo", "input": text, "previous_response_id": self.previous}
            reply = self.http.post("/v1/responses", json=body)
            reply.raise_for_status()
            self.previous = reply.json()["id"]
        else:  # chat and the floors
            self.history.append({"role": "user", "content": text})
            reply = self.http.post("/v1/chat/completions", json={"model": "echo", "messages": self.history})
            reply.raise_for_status()
            self.history.append(reply.json()["choices"][0]["message"])


def measure(kind: str, url: str, pid: int, conversations: int, turns: int, round_no: int) -> dict[str, float]:
    """Server CPU ms per turn over the early and the late turns of `conversations` conversations,
    turn k of each conversation before turn k+1 of any (so each block spans many turns)."""
    with httpx.Client(base_url=url, timeout=60) as http:
        endpoint = kind.removesuffix("_before").removesuffix("_sqlite")
        talks = [Conversation(http, endpoint, f"{kind[:4]}-{round_no}-{i}") for i in range(conversations)]
        spent = {"early": 0.0, "late": 0.0}
        clock, ticks, fine = ThreadsCpu(pid), cpu_seconds(pid), 0.0
        for t in range(turns):
            clock.seconds()
            for talk in talks:
                talk.turn()
            block = "early" if t in EARLY else "late" if t in LATE else None
            spent_now = clock.seconds()
            fine += spent_now
            if block:
                spent[block] += spent_now
    ticks = cpu_seconds(pid) - ticks
    if clock.lost or fine < ticks * 0.98 - 0.02:  # short: threads ended (a tick is 10 ms)
        print(f"  {kind}: the threads' clock read {fine:.3f} s where /proc/PID/stat read {ticks:.2f} s; "
              f"{clock.lost} threads ended during the round and took their CPU with them")
    return {block: ms * 1000 / (conversations * 10) for block, ms in spent.items()}


# -- the run ------------------------------------------------------------------------------------------------


def start_servers(workdir: Path, env: dict[str, str], before: Path | None = None,
                  kinds: tuple[str, ...] = ("http", "chat", "responses"),
                  stores: tuple[str, ...] = STORES) -> dict[str, tuple[str, subprocess.Popen]]:
    servers: dict[str, tuple[str, subprocess.Popen]] = {}
    for kind in ("floor", "floor_eb"):
        port = free_port()
        flag = "--serve-floor-eb" if kind == "floor_eb" else "--serve-floor"
        servers[kind] = (f"http://127.0.0.1:{port}", spawn([__file__, flag, str(port)], env))
        wait_port(port, servers[kind][1])
    (workdir / "echo.yaml").write_text(BOT)
    checkouts = {"": ROOT} | ({"_before": before} if before is not None else {})
    for suffix, checkout in checkouts.items():  # one server per checkout and store: its endpoints share it
        served = dict(env, PYTHONPATH=os.pathsep.join([str(checkout / "runner"), *env["PYTHONPATH"].split(os.pathsep)[1:]]))
        for store in stores:
            port = free_port()
            url = "memory://" if store == "memory" else f"sqlite:///{workdir / f'bench{suffix}.db'}"
            proc = spawn(["-m", "chatrun", "serve", str(workdir / "echo.yaml"), "--port", str(port),
                          "--store", url, "--log-level", "warning"], served)
            wait_port(port, proc)
            for kind in kinds:
                servers[kind + ("_sqlite" if store == "sqlite" else "") + suffix] = (f"http://127.0.0.1:{port}", proc)
    return servers


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace, db: Path) -> None:
    def median(kind: str, block: str) -> float:
        return statistics.median(r[block] for r in results[kind])

    print(f"server CPU ms per turn, {args.rounds} rounds x {args.conversations} conversations x {args.turns} turns, "
          f"contenders interleaved; min / median over rounds; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'contender':<17}{'turns 1-10':>16}{'turns 31-40':>16}{'late/early':>12}{'x floor_eb (late)':>19}")
    for kind, runs in results.items():
        early = f"{min(r['early'] for r in runs):.2f} / {median(kind, 'early'):.2f}"
        late = f"{min(r['late'] for r in runs):.2f} / {median(kind, 'late'):.2f}"
        print(f"{kind:<17}{early:>16}{late:>16}{median(kind, 'late') / median(kind, 'early'):>12.2f}"
              f"{median(kind, 'late') / median('floor_eb', 'late'):>19.2f}")
    print("goals (issue 39): http <= 1.15x floor_eb; chat <= 1.3x floor_eb, flat in conversation length "
          "(late/early ~ floor_eb's)")
    if not db.exists():  # not served on SQLite (--stores)
        return
    conn = sqlite3.connect(db)
    records, size = conn.execute("SELECT COUNT(*), SUM(LENGTH(record)) FROM records").fetchone()
    conn.close()
    if records:
        print(f"records after the run: {records} rows, {size / 1024:.0f} KiB ({size / records / 1024:.1f} KiB a row)")


# -- instructions (callgrind) ---------------------------------------------------------------------

COUNTED = r"""
import asyncio, gc, json, os, sys, tempfile
from pathlib import Path
runner, bench, kind, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, runner)
import chatrun  # this checkout's, before the bench module puts its own runner/ on the path
sys.path.insert(0, bench)
import bench_openai_api as b

async def call(app, path, data):
    # One request straight into the ASGI app: no client library, no socket in the count.
    body = json.dumps(data).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80)}
    done, given, out = asyncio.Event(), [], {"status": 0, "body": []}
    async def receive():
        if not given:
            given.append(1)
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}
    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"].append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()
    await app(scope, receive, send)
    assert out["status"] < 300, (out["status"], b"".join(out["body"]))
    return json.loads(b"".join(out["body"]) or b"null")

ws_frames = [0]

def turn_frame():
    # A turn's frame reached the server: the WebSocket kinds count their turns here (turn_parts.py hooks it).
    ws_frames[0] += 1
    if ws_frames[0] == 5:  # after one turn each, as for HTTP below
        gc.collect(); gc.freeze(); gc.disable()

def counting(app):
    async def counted(scope, receive, send):
        async def receive_counted():
            message = await receive()
            if '"ChatRouteMessage"' in (message.get("text") or ""):
                turn_frame()
            return message
        await app(scope, receive_counted if scope["type"] == "websocket" else receive, send)
    return counted

async def websocket_turns(tmp):
    # The WebSocket kinds: the server on a real socket with its real uvicorn protocols (listen.py;
    # permessage-deflate as the client offers it), the client in its own process (not counted).
    import bench_server
    port = bench_server.free_port()
    app = b.contender_app(bench_server.floor_app(True) if kind == "ws_floor_eb" else None, bench_server.BOT, tmp)
    await b.serve_during(counting(app), port, kind != "ws_floor_eb", [sys.executable, f"{bench}/bench_server.py",
                         "--client", f"ws://127.0.0.1:{port}/_chat/routes", "--turns", str(turns)])

async def main(tmp):
    if kind.startswith("ws"):
        return await websocket_turns(tmp)
    if kind == "floor_eb":
        app = b.floor_app(True)
    else:
        from chatrun.server.app import create_app
        (Path(tmp) / "echo.yaml").write_text(b.BOT)
        store = os.environ.get("COUNTED_STORE") or f"sqlite:///{tmp}/bench.db"  # turn_parts.py --store
        app = create_app([chatrun.load_bot(Path(tmp) / "echo.yaml")], store, gc_tuning=False)
    async with app.router.lifespan_context(app):
        talks = [{"name": f"c{i}", "history": [], "count": 0} for i in range(4)]
        for talk in talks:
            if kind == "http":
                await call(app, "/bots/echo/sessions", {"id": talk["name"]})
        for t in range(turns):
            if t == 1:  # after one turn each (imports, first connections): no collection in the count
                gc.collect(); gc.freeze(); gc.disable()
            for talk in talks:
                text = f"{talk['name']} message number {talk['count']}"
                talk["count"] += 1
                if kind == "http":
                    await call(app, f"/bots/echo/sessions/{talk['name']}/messages", {"userMessage": text})
                    continue
                talk["history"].append({"role": "user", "content": text})
                reply = await call(app, "/v1/chat/completions", {"model": "echo", "messages": talk["history"]})
                talk["history"].append(reply["choices"][0]["message"])

with tempfile.TemporaryDirectory() as tmp:
    asyncio.run(main(tmp))
"""


SERVED = r"""
import asyncio, gc, sys, tempfile
from pathlib import Path
runner, bench, kind, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, runner)
import chatrun  # this checkout's, before the bench module puts its own runner/ on the path
sys.path.insert(0, bench)
import bench_openai_api as b
import bench_server

CLIENT = '''
import sys, httpx
url, kind, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
with httpx.Client(base_url=url, timeout=60) as http:
    talks = [{"name": f"c{i}", "history": [], "count": 0} for i in range(4)]
    for talk in talks:
        if kind == "http":
            http.post("/bots/echo/sessions", json={"id": talk["name"]}).raise_for_status()
    for t in range(turns):
        if t == 1:  # after one turn each (imports, first connections): no collection in the count
            http.post("/__freeze").raise_for_status()
        for talk in talks:
            text = f"{talk['name']} message number {talk['count']}"
            talk["count"] += 1
            if kind == "http":
                http.post(f"/bots/echo/sessions/{talk['name']}/messages", json={"userMessage": text}).raise_for_status()
                continue
            talk["history"].append({"role": "user", "content": text})
            reply = http.post("/v1/chat/completions", json={"model": "echo", "messages": talk["history"]})
            reply.raise_for_status()
            talk["history"].append(reply.json()["choices"][0]["message"])
'''

def freezing(app):
    async def served(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/__freeze":
            gc.collect(); gc.freeze(); gc.disable()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)
    return served

async def main(tmp):
    port = bench_server.free_port()
    app = b.contender_app(b.floor_app(True) if kind == "floor_eb" else None, b.BOT, tmp)
    await b.serve_during(freezing(app), port, kind != "floor_eb",
                         [sys.executable, "-c", CLIENT, f"http://127.0.0.1:{port}", kind, str(turns)])

with tempfile.TemporaryDirectory() as tmp:
    asyncio.run(main(tmp))
"""


def contender_app(floor: Any, bot: str, tmp: str) -> Any:
    """`floor` when given (a floor's app), else chatrun's app serving `bot` (YAML) on memory://."""
    if floor is not None:
        return floor
    import chatrun
    from chatrun.server.app import create_app

    (Path(tmp) / "bot.yaml").write_text(bot)
    return create_app([chatrun.load_bot(Path(tmp) / "bot.yaml")], "memory://", gc_tuning=False)


async def serve_during(app: Any, port: int, as_chatrun_serve: bool, client: list[str]) -> None:
    """Serve `app` on 127.0.0.1:`port` in this process (with `chatrun serve`'s listening options, or
    uvicorn's defaults as the floors are served) until the `client` process ends, which must succeed."""
    import uvicorn

    from chatrun.server.listen import uvicorn_config

    if as_chatrun_serve:
        config = uvicorn_config(app, "127.0.0.1", port, log_level="warning")
    else:
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    process = await asyncio.create_subprocess_exec(*client)
    assert await process.wait() == 0, f"the client failed: {client[1:3]}"
    server.should_exit = True
    await serving


def instructions(kind: str, checkout: Path, env: dict[str, str], served: bool = False) -> int:
    """Instructions of one late turn (turns 31-40) in process, the ASGI app called directly (no
    client library, no sockets; 4 conversations): callgrind's count for 40 turns less that for 30,
    over 40. The fake model runs in its own process, not counted; the server's `openai` client is.
    `served`: the app behind uvicorn on a real socket in the counted process (chatrun on memory://,
    as the floor keeps nothing), the client in a child process, not counted."""
    env = {**env, "PYTHONHASHSEED": "0"}
    env.pop("PYTHONPATH", None)
    setarch = ["setarch", "-R"] if shutil.which("setarch") else []  # no address randomization: steadier counts
    counts = []
    for turns in (30, 40):
        out = subprocess.run([*setarch, "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                              "-c", SERVED if served else COUNTED, str(checkout / "runner"), str(ROOT / "bench"), kind,
                              str(turns)],
                             capture_output=True, text=True, env=env, check=True)
        counts.append(int(next(x for x in out.stderr.splitlines() if "Collected" in x).split()[-1]))
    return (counts[1] - counts[0]) // 40


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=40, help="turns per conversation (at least 40)")
    parser.add_argument("--before", type=Path, help="an older checkout, served beside this one (its http, chat and "
                        "responses rows end in _before)")
    parser.add_argument("--only", default="http,chat,responses",
                        help="which of chatrun's endpoints to measure (comma-separated; default all three); with "
                        "--instructions also `ws`: a WebSocket turn (bench_server.py's bot and floor, over a socket)")
    parser.add_argument("--stores", default=",".join(STORES),
                        help="the stores chatrun is served on (comma-separated; default memory,sqlite: the rows "
                        "http and chat on memory://, the floors' like, and http_sqlite and chat_sqlite on SQLite)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per late turn under callgrind instead (floor_eb, http, chat and the --before ones)")
    parser.add_argument("--served", action="store_true",
                        help="with --instructions: count http, chat and floor_eb served by uvicorn on a real socket "
                        "(chatrun on memory://), the client in a child process, not counted")
    parser.add_argument("--serve-floor", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor-eb", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor or args.serve_floor_eb:
        serve_floor(args.serve_floor or args.serve_floor_eb, extra_body=bool(args.serve_floor_eb))
        return
    fake_port = free_port()
    fake = spawn(["-m", "chatrun.testing.fake_openai", "--port", str(fake_port), "--echo"],
                 dict(os.environ, PYTHONPATH=str(ROOT / "runner")))
    servers: dict[str, tuple[str, subprocess.Popen]] = {}
    try:
        wait_port(fake_port, fake)
        env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{fake_port}/v1", OPENAI_API_KEY="bench")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "runner"), env.get("PYTHONPATH")]))
        env.pop("CHATRUN_AUTH_FILE", None)
        if args.instructions:
            counted = [kind for kind in ("http", "chat", "ws") if kind in args.only.split(",")]
            floors = (["floor_eb"] if {"http", "chat"} & set(counted) else []) + (["ws_floor_eb"] if "ws" in counted else [])
            checkouts = {kind: ROOT for kind in floors + counted}
            if args.before:
                checkouts |= {f"{kind}_before": args.before for kind in counted}
            for kind, checkout in checkouts.items():
                served = args.served and not kind.startswith("ws")
                print(f"{kind:<12} {instructions(kind.removesuffix('_before'), checkout, env, served) / 1e6:.2f} M "
                      "instructions per late turn (callgrind, in process, "
                      + ("over a socket, the client not counted)" if "ws" in kind or served else "no sockets)"),
                      flush=True)
            return
        with tempfile.TemporaryDirectory() as tmp:
            servers = start_servers(Path(tmp), env, args.before, tuple(args.only.split(",")), tuple(args.stores.split(",")))
            results: dict[str, list[dict[str, float]]] = {kind: [] for kind in servers}
            run: Callable[[str, int], dict[str, float]] = lambda kind, r: measure(  # noqa: E731
                kind, servers[kind][0], servers[kind][1].pid, args.conversations, max(args.turns, 40), r)
            for kind in servers:  # warm up: imports, first connections, the bot's compiled templates
                run(kind, -1)
            for r in range(args.rounds):
                for kind in servers:
                    results[kind].append(run(kind, r))
            report(results, args, Path(tmp) / "bench.db")
    finally:
        for _, proc in {id(p): (u, p) for u, p in servers.values()}.values():
            proc.terminate()
            proc.wait(10)
        fake.terminate()
        fake.wait(10)


if __name__ == "__main__":
    main()
