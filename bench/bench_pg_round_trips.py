"""Store round trips and wall time of a served HTTP turn of a cached session, on PostgreSQL.

    python bench/bench_pg_round_trips.py [--turns 60]

Starts PostgreSQL (tests/postgres_support.py) and the fake OpenAI server; serves one session
5 turns, then `--turns` more, and prints the medians: psycopg's waits on its socket per turn (its
own bookkeeping in a pipeline counts too), round trips on the wire (counted by the loopback proxy
of tests/test_postgres_commit_round_trips.py: each time the client speaks after the server did),
and wall time (without the proxy). bench/README.md, "A served turn on PostgreSQL in fewer round trips".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runner"))
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from chatrun.testing.fake_openai import FakeOpenAI  # noqa: E402
from postgres_support import PostgresServer  # noqa: E402
from server_support import app_for_testclient  # noqa: E402
from test_postgres_commit_round_trips import FlightProxy  # noqa: E402

BOT = """\
name: desk
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
routes:
  main: {default: true, system: Answer briefly.}
"""
WAITS = [0]


def _counting() -> None:
    wait = psycopg.AsyncConnection.wait

    async def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        WAITS[0] += 1
        return await wait(self, *args, **kwargs)

    psycopg.AsyncConnection.wait = counted  # type: ignore[method-assign]


def serve(url: str, turns: int, proxy: FlightProxy | None) -> tuple[float, float, float]:
    """(waits, round trips, wall ms): the medians per turn."""
    with FakeOpenAI() as fake, tempfile.TemporaryDirectory() as folder:
        os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = fake.base_url, "k"
        fake.responder = lambda body: {"text": "Hi."}
        (Path(folder) / "bot.yaml").write_text(BOT)
        with TestClient(app_for_testclient(str(Path(folder) / "bot.yaml"), url)) as client:
            client.post("/bots/desk/sessions", json={"id": "s"})
            for _ in range(5):
                client.post("/bots/desk/sessions/s/messages", json={"userMessage": "hi"})
            waits, trips, times = [], [], []
            for _ in range(turns):
                w0, r0, t0 = WAITS[0], proxy.trips if proxy else 0, time.perf_counter()
                assert client.post("/bots/desk/sessions/s/messages", json={"userMessage": "hi"}).json()["ok"]
                times.append((time.perf_counter() - t0) * 1000)
                waits.append(WAITS[0] - w0)
                trips.append((proxy.trips if proxy else 0) - r0)
    return statistics.median(waits), statistics.median(trips), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    turns = parser.parse_args().turns
    _counting()
    server = PostgresServer().start()
    try:
        waits, _, wall = serve(server.url(), turns, None)
        proxy = FlightProxy(server.port)
        proxy.counting = True
        _, trips, _ = serve(server.url().replace(f":{server.port}/", f":{proxy.port}/"), turns, proxy)
        proxy.close()
    finally:
        server.stop()
    print(f"PostgreSQL, {turns} turns: psycopg waits {waits:g}, round trips on the wire {trips:g}, "
          f"wall {wall:.2f} ms (medians per turn)")


if __name__ == "__main__":
    main()
