"""A burst of platform deliveries on two replicas (issue 36: 1,000 deliveries, 0 duplicates,
0 losses). Two `chatrun serve` processes on one Redis (started here on a free port), the fake
OpenAI server and a fake Telegram Bot API in this process. N users each send one message;
Telegram delivers every update --copies times (its retries), spread over both replicas at
once. Counted: replies per user at the fake Bot API (exactly one each is the goal), model
calls (one per user), and the time until the last reply.

    python bench/bench_channel_burst.py [--users 334] [--copies 3] [--threads 16]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(REPO / "tests"))

import httpx  # noqa: E402

from channel_support import FakeTelegram, telegram_message  # noqa: E402
from chatrun.testing.fake_openai import FakeOpenAI  # noqa: E402
from redis_support import RedisServer, Replica  # noqa: E402

TOKEN, SECRET = "123456:burst", "burst-secret-0123456789"
BOT = """\
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
env:
  TG_TOKEN: {secret: true}
  TG_SECRET: {secret: true}
  TG_API: {}
channels:
  telegram: {token: TG_TOKEN, secret: TG_SECRET, api: "{{ env.TG_API }}", retry: {backoff: 0.2, max_backoff: 2}}
routes:
  main: {default: true, system: You sell tickets.}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=334)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    redis = RedisServer().start()
    try:
        with FakeOpenAI() as fake, FakeTelegram(TOKEN) as api, tempfile.TemporaryDirectory() as folder:
            fake.responder = lambda body: {"text": "Hi " + body["messages"][-1]["content"]}
            os.environ.update(TG_TOKEN=TOKEN, TG_SECRET=SECRET, TG_API=api.url, CHATRUN_OUTBOX_POLL="0.2")
            (Path(folder) / "bot.yaml").write_text(BOT)
            bot = str(Path(folder) / "bot.yaml")
            store = redis.url()  # one URL: each call names a new key prefix
            replicas = [Replica(bot, store, fake.base_url).start() for _ in range(2)]
            try:
                run(args, replicas, api, fake)
            finally:
                for replica in replicas:
                    replica.kill()
    finally:
        redis.stop()


def run(args: argparse.Namespace, replicas: list[Replica], api: FakeTelegram, fake: FakeOpenAI) -> None:
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
    sends = [(replicas[(user + copy) % 2], telegram_message(10_000 + user, f"u{user}", user=user))
             for copy in range(args.copies) for user in range(1, args.users + 1)]
    started = time.monotonic()
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(args.threads) as pool:
        statuses = collections.Counter(pool.map(
            lambda s: client.post(f"{s[0].url}/channels/shop/telegram", json=s[1], headers=headers).status_code, sends))
    answered = time.monotonic() - started
    deadline = time.monotonic() + 300
    while len(api.calls("sendMessage")) < args.users and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # late duplicates would arrive now
    replies = collections.Counter(c["chat_id"] for c in api.calls("sendMessage"))
    lost = [u for u in range(1, args.users + 1) if u not in replies]
    doubled = {u: n for u, n in replies.items() if n > 1}
    print(f"{len(sends)} deliveries ({args.users} users x {args.copies}) on 2 replicas: statuses {dict(statuses)}, "
          f"all answered in {answered:.1f} s")
    print(f"replies: {sum(replies.values())} to {len(replies)} users; lost {len(lost)}, duplicated {len(doubled)}; "
          f"model calls {len(fake.requests)}")


if __name__ == "__main__":
    main()
