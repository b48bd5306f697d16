"""What a channel adds to a turn (issue 36: target <= 1 ms CPU per turn over the HTTP API).

One app in process (memory:// store, its outbox worker running), the fake OpenAI server and a
fake Telegram Bot API in threads of their own. Two ways to run the same turn of the same bot:
  http      POST /bots/shop/sessions/S/messages (the reply comes back in the response)
  telegram  POST /channels/shop/telegram with a new update, then the reply's sendMessage
            reaching the fake Bot API (the outbox claims it, sends it, settles it)
  bare      a bare httpx POST of a reply to the same fake Bot API: the platform call every
            channel must make, which the HTTP API's in-process request does not
"own" = telegram - http - bare: what the channel layer itself costs. It can be below zero: the
HTTP API's answer carries the reply (its events serialised into the response), a webhook's is
{"ok": true}, and the reply goes to the platform as a short message instead.
CPU is the event loop thread's (time.thread_time): the app, the outbox worker and both
clients; the fakes' threads are the platforms' cost and are not counted. The three alternate
turn by turn (an http turn, a telegram turn, a bare call, again), so a loaded machine's drift
falls on all three alike; each of --rounds rounds gives each one's CPU per turn over --turns
turns, and the table shows the rounds' min and median.

    python bench/bench_channels.py [--rounds 15] [--turns 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(REPO / "tests"))

import httpx  # noqa: E402

from channel_support import FakeTelegram, telegram_message  # noqa: E402
from chatrun.testing.fake_openai import FakeOpenAI  # noqa: E402

TOKEN, SECRET = "123456:bench", "bench-secret-0123456789"
BOT = """\
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
memory: {type: message_window, max_messages: 20}
env:
  TG_TOKEN: {secret: true}
  TG_SECRET: {secret: true}
  TG_API: {}
channels:
  telegram: {token: TG_TOKEN, secret: TG_SECRET, api: "{{ env.TG_API }}"}
routes:
  main: {default: true, system: You sell tickets.}
"""


async def http_turn(client: httpx.AsyncClient, n: int) -> None:
    r = await client.post("/bots/shop/sessions/h1/messages", json={"userMessage": f"m{n}"})
    assert r.status_code == 200 and r.json()["ok"], r.text


class Heard(list):  # type: ignore[type-arg]
    """The fake Bot API's calls, waking the event loop once per call (from the fake's thread):
    the bench waits for a reply without polling, so the wait costs the loop one wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self.loop, self.arrived = loop, asyncio.Event()

    def append(self, call: object) -> None:
        super().append(call)
        self.loop.call_soon_threadsafe(self.arrived.set)


async def telegram_turn(client: httpx.AsyncClient, heard: Heard, n: int) -> None:
    """A delivery, then the wait for its reply at the fake Bot API (sent by the outbox worker)."""
    sent = len(heard)
    r = await client.post("/channels/shop/telegram", json=telegram_message(n, f"m{n}"),
                          headers={"X-Telegram-Bot-Api-Secret-Token": SECRET})
    assert r.status_code == 200, r.text
    while len(heard) == sent:
        await heard.arrived.wait()
        heard.arrived.clear()


async def bare_call(client: httpx.AsyncClient, api: FakeTelegram, n: int) -> None:
    """What the platform call alone costs: a bare httpx POST of a reply to the fake Bot API."""
    r = await client.post(f"{api.url}/bot{TOKEN}/sendMessage", json={"chat_id": 42, "text": f"r{n}"})
    assert r.status_code == 200


async def one_round(client: httpx.AsyncClient, bare: httpx.AsyncClient, api: FakeTelegram, turns: int,
                    n: int) -> dict[str, float]:
    """`turns` of each way, one after the other turn by turn (a loaded machine's drift hits all
    three alike); the CPU per turn of each."""
    spent = {"http": 0.0, "telegram": 0.0, "bare": 0.0}
    heard = api.seen
    assert isinstance(heard, Heard)
    for i in range(n, n + turns):
        began = time.thread_time()
        await http_turn(client, i)
        middle = time.thread_time()
        await telegram_turn(client, heard, i)
        late = time.thread_time()
        await bare_call(bare, api, i)
        spent["http"] += middle - began
        spent["telegram"] += late - middle
        spent["bare"] += time.thread_time() - late
    return {kind: total / turns for kind, total in spent.items()}


async def run(rounds: int, turns: int, folder: Path) -> dict[str, list[float]]:
    from chatrun.server import create_app
    from chatrun.server.guard import LOOPBACK_HOSTS, EdgePolicy

    (folder / "bot.yaml").write_text(BOT)
    app = create_app([str(folder / "bot.yaml")], "memory://", edge=EdgePolicy(allowed_hosts=(*LOOPBACK_HOSTS, "bench")))
    results: dict[str, list[float]] = {"http": [], "telegram": [], "bare": []}
    with FakeTelegram(TOKEN) as api:
        api.seen = Heard(asyncio.get_running_loop())
        os.environ["TG_API"] = api.url
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://bench") as client, \
                httpx.AsyncClient() as bare:
            await client.post("/bots/shop/sessions", json={"id": "h1"})
            await one_round(client, bare, api, 20, 1)  # warm every path up
            for r in range(rounds):
                for kind, value in (await one_round(client, bare, api, turns, 100 + r * turns)).items():
                    results[kind].append(value)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--turns", type=int, default=100)
    args = parser.parse_args()
    os.environ.update(TG_TOKEN=TOKEN, TG_SECRET=SECRET, OPENAI_API_KEY="bench", CHATRUN_OUTBOX_POLL="1")
    with FakeOpenAI() as fake, tempfile.TemporaryDirectory() as folder:
        os.environ["OPENAI_BASE_URL"] = fake.base_url
        fake.responder = lambda body: {"text": "Here you are."}
        results = asyncio.run(run(args.rounds, args.turns, Path(folder)))
    http, tg, bare = results["http"], results["telegram"], results["bare"]
    print(f"CPU ms per turn, {args.rounds} interleaved rounds of {args.turns} turns (event loop thread)")
    print(f"{'':10} {'min':>8} {'median':>8}")
    for name, values in (("http", http), ("telegram", tg), ("bare call", bare)):
        print(f"{name:10} {min(values) * 1e3:8.3f} {statistics.median(values) * 1e3:8.3f}")
    added = [t - h for t, h in zip(tg, http, strict=True)]
    print(f"{'added':10} {min(added) * 1e3:8.3f} {statistics.median(added) * 1e3:8.3f}")
    own = [a - b for a, b in zip(added, bare, strict=True)]
    print(f"{'own':10} {min(own) * 1e3:8.3f} {statistics.median(own) * 1e3:8.3f}   "
          "(added minus the bare platform call: the channel layer's own CPU; target <= 1.000 ms)")
    medians = statistics.median(tg) - statistics.median(http) - statistics.median(bare)
    print(f"own from the three medians: {medians * 1e3:.3f} ms (a loaded machine's rounds differ: read both)")


if __name__ == "__main__":
    main()
