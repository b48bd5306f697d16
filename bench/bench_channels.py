"""What a channel adds to a turn (issue 36: target <= 1 ms CPU per turn over the HTTP API).

One app in process (memory:// store, its outbox worker running), the fake OpenAI server and a
fake Telegram Bot API in threads of their own. Two ways to run the same turn of the same bot:
  http      POST /bots/shop/sessions/S/messages (the reply comes back in the response)
  telegram  POST /channels/shop/telegram with a new update, then the reply's sendMessage
            reaching the fake Bot API (the outbox claims it, sends it, settles it)
  bare      a bare httpx POST of a reply to the same fake Bot API: the platform call every
            channel must make, which the HTTP API's in-process request does not
"own" = telegram - http - bare: what the channel layer itself costs.
CPU is the event loop thread's (time.thread_time): the app, the outbox worker and both
clients; the fakes' threads are the platforms' cost and are not counted. Rounds alternate the
two (interleaved), each --turns turns; min and median of the per-round CPU per turn.

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


async def http_round(client: httpx.AsyncClient, turns: int, start: int) -> float:
    began = time.thread_time()
    for i in range(turns):
        r = await client.post("/bots/shop/sessions/h1/messages", json={"userMessage": f"m{start + i}"})
        assert r.status_code == 200 and r.json()["ok"], r.text
    return (time.thread_time() - began) / turns


class Heard(list):  # type: ignore[type-arg]
    """The fake Bot API's calls, waking the event loop once per call (from the fake's thread):
    the bench waits for a reply without polling, so the wait costs the loop one wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self.loop, self.arrived = loop, asyncio.Event()

    def append(self, call: object) -> None:
        super().append(call)
        self.loop.call_soon_threadsafe(self.arrived.set)


async def telegram_round(client: httpx.AsyncClient, api: FakeTelegram, turns: int, start: int) -> float:
    began = time.thread_time()
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
    heard = api.seen
    assert isinstance(heard, Heard)
    for i in range(turns):
        sent = len(heard)
        r = await client.post("/channels/shop/telegram", json=telegram_message(start + i, f"m{start + i}"),
                              headers=headers)
        assert r.status_code == 200, r.text
        while len(heard) == sent:  # the reply, sent by the outbox worker
            await heard.arrived.wait()
            heard.arrived.clear()
    return (time.thread_time() - began) / turns


async def bare_round(api: FakeTelegram, turns: int) -> float:
    """What the platform call alone costs: a bare httpx POST of a reply to the fake Bot API."""
    began = time.thread_time()
    async with httpx.AsyncClient() as client:
        for i in range(turns):
            r = await client.post(f"{api.url}/bot{TOKEN}/sendMessage", json={"chat_id": 42, "text": f"r{i}"})
            assert r.status_code == 200
    return (time.thread_time() - began) / turns


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
                transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:
            await client.post("/bots/shop/sessions", json={"id": "h1"})
            await http_round(client, 20, 0)  # warm both paths up
            await telegram_round(client, api, 20, 1)
            n = 100
            for _ in range(rounds):
                results["http"].append(await http_round(client, turns, n))
                results["telegram"].append(await telegram_round(client, api, turns, n + 1))
                results["bare"].append(await bare_round(api, turns))
                n += turns + 1
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
