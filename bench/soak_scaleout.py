"""Soak: kill -9 replicas under load and count what the issue counted — turns lost, turns run
twice. Three `chatrun serve` replicas on one Redis (lease TTL 1 s), a counter bot, the fake
model answering after a delay; clients send turns with an Idempotency-Key each and, whenever a
reply does not come (the replica died: the turn is in doubt), retry the same key on another
replica until answered; a share of clients (--impatient) give up on a request before its
model answers and retry it, so many retries find their turn already committed. Every `--every` seconds a replica is killed with SIGKILL and started
again. At the end every session is read back:

    acknowledged turns missing from the store            (must be 0)
    turns stored twice (one key, two history entries)   (must be 0)
    counter != committed turns, or turns not numbered 1..N (must be 0)

    python bench/soak_scaleout.py                       # 10 kills, 6 sessions
    python bench/soak_scaleout.py --kills 20 --sessions 10 --delay 0.3

Loopback only; bounded by --kills (and a few seconds per kill).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scaleout import start_redis  # noqa: E402
from bench_server import free_port, spawn, wait_port  # noqa: E402

BOT = """
name: counter
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
memory: {type: message_window, max_messages: 40}
state: {count: 0}
routes:
  main:
    default: true
    system: "Count so far: {{ state.count }}"
    tools: [inc]
tools:
  inc:
    description: Count one
    action: {set: {state.count: "{{ state.count + 1 }}"}, message: "counted", immediate: true}
"""


class Replica:
    def __init__(self, bot: Path, store: str, env: dict[str, str]):
        self.bot, self.store, self.env = bot, store, env
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = spawn(["-m", "chatrun", "serve", str(self.bot), "--port", str(self.port), "--store", self.store,
                           "--lease-ttl", "1", "--log-level", "warning"], self.env)
        wait_port(self.port, self.proc, 60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


async def soak(args: argparse.Namespace, group: list[Replica]) -> dict[str, int]:
    import httpx

    acknowledged: dict[str, tuple[str, int]] = {}  # key -> (session, turn the client was told)
    in_doubt = replayed = 0
    stop = asyncio.Event()

    async def client(http: httpx.AsyncClient, sid: str) -> None:
        nonlocal in_doubt, replayed
        i = 0
        while not stop.is_set():
            key, target = str(uuid.uuid4()), (hash(sid) + i) % len(group)
            retried = False
            while True:
                # Some clients give up before the model answers (their reply is lost while the
                # turn runs on and commits): their retry must get the committed turn, not a second one.
                impatient = random.random() < args.impatient
                timeout = args.delay * 0.75 if impatient else 120
                try:
                    r = await http.post(f"{group[target].url}/bots/counter/sessions/{sid}/messages",
                                        json={"userMessage": f"{sid}-{i}"}, headers={"Idempotency-Key": key},
                                        timeout=timeout)
                    if r.status_code == 200:
                        acknowledged[key] = (sid, r.json()["turn"])
                        in_doubt += retried
                        replayed += r.json()["replayed"]
                        break
                except httpx.HTTPError:
                    pass
                retried = True
                target = (target + 1) % len(group)
                await asyncio.sleep(0.05)
            i += 1

    async def killer() -> None:
        for k in range(args.kills):
            await asyncio.sleep(args.every)
            victim = group[k % len(group)]
            victim.kill()
            await asyncio.to_thread(victim.start)
        stop.set()

    async with httpx.AsyncClient(timeout=120) as http:
        sessions = [f"soak{i}" for i in range(args.sessions)]
        for sid in sessions:
            await http.post(f"{group[0].url}/bots/counter/sessions", json={"id": sid})
        await asyncio.gather(killer(), *(client(http, sid) for sid in sessions))
        missing = doubled = inconsistent = stored_turns = 0
        for sid in sessions:
            session = (await http.get(f"{group[1].url}/bots/counter/sessions/{sid}")).json()
            ok = [h for h in session["history"] if h["ok"]]
            stored_turns += len(ok)
            keys = Counter(h.get("requestId") for h in ok)
            doubled += sum(n - 1 for n in keys.values() if n > 1)
            missing += sum(1 for key, (s, _) in acknowledged.items() if s == sid and key not in keys)
            numbered = [h["turn"] for h in ok] == list(range(1, len(ok) + 1))
            inconsistent += not (numbered and session["state"]["count"] == len(ok) == session["turn"])
    return {"kills": args.kills, "acknowledged": len(acknowledged), "retried in doubt": in_doubt,
            "answered by replay": replayed,
            "stored": stored_turns, "lost": missing, "run twice": doubled, "inconsistent sessions": inconsistent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--every", type=float, default=1.5, help="seconds between kills")
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--delay", type=float, default=0.2, help="the fake model's answer delay, seconds")
    parser.add_argument("--impatient", type=float, default=0.2,
                        help="share of requests whose client gives up before the answer, then retries")
    args = parser.parse_args()
    from chatrun.testing.fake_openai import FakeOpenAI

    redis, redis_port = start_redis()
    # The fake model, in this process: every answer calls the counter's tool after the delay.
    fake = FakeOpenAI(responder=lambda body: {"tool_calls": [{"name": "inc", "arguments": {}}], "delay": args.delay})
    fake.start()
    fake_port = fake.port
    group: list[Replica] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            bot = Path(tmp) / "counter.yaml"
            bot.write_text(textwrap.dedent(BOT))
            env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{fake_port}/v1", OPENAI_API_KEY="soak")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "runner"), env.get("PYTHONPATH")]))
            env.pop("CHATRUN_AUTH_FILE", None)
            group = [Replica(bot, f"redis://127.0.0.1:{redis_port}/0", env) for _ in range(3)]
            for r in group:
                r.start()
            started = time.monotonic()
            figures = asyncio.run(soak(args, group))
            print(f"{time.monotonic() - started:.0f} s, " + ", ".join(f"{k}: {v}" for k, v in figures.items()))
    finally:
        for r in group:
            r.kill()
        fake.stop()
        redis.terminate()
        redis.wait(10)


if __name__ == "__main__":
    main()
