"""What the OpenAI-compatible API costs per turn over chatrun's own HTTP API (target: < 5 ms),
and how much the index of turns grows.

One real uvicorn server (SQLite store) serving a one-route bot whose model is the local fake
OpenAI server (echo). A conversation of --turns turns is sent three ways, median per turn:
  http      POST /bots/echo/sessions/{id}/messages (the session named by the client)
  chat      POST /v1/chat/completions with the whole history (session found by reconciliation)
  responses POST /v1/responses with previous_response_id
The difference is the OpenAI layer: parsing, hashing the history, opening the session, and
recording the turn (snapshot and memories) in the store. Also printed: the bytes the records
table holds after one conversation, which grow with its length (each turn records its state).

    python bench/bench_openai_api.py [--turns 40]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runner"))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

import chatrun  # noqa: E402
from chatrun.server import create_app  # noqa: E402
from chatrun.testing.fake_openai import FakeOpenAI, echo  # noqa: E402
from server_support import ThreadServer  # noqa: E402

BOT = """
name: echo
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
memory: {type: message_window, max_messages: 40}
routes:
  main:
    default: true
    system: Repeat what the user says.
"""


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    turns = parser.parse_args().turns
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as fake:
        import os

        os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = fake.base_url, "bench"
        fake.responder = echo
        (Path(tmp) / "echo.yaml").write_text(BOT)
        bot = chatrun.load_bot(Path(tmp) / "echo.yaml")
        db = Path(tmp) / "bench.db"
        with ThreadServer(create_app([bot], f"sqlite:///{db}")) as server, httpx.Client(base_url=server.url) as http:
            http.post("/bots/echo/sessions", json={"id": "h"})
            ms = {"http": [], "chat": [], "responses": []}
            history: list[dict] = []
            previous = None
            for i in range(turns):
                text = f"message number {i}"
                ms["http"].append(timed(lambda t=text: http.post("/bots/echo/sessions/h/messages",
                                                                 json={"userMessage": t}).raise_for_status()))
                history.append({"role": "user", "content": text})

                def chat(h=history) -> None:
                    reply = http.post("/v1/chat/completions", json={"model": "echo", "messages": h}).json()
                    h.append(reply["choices"][0]["message"])

                ms["chat"].append(timed(chat))

                def respond(t=text) -> None:
                    nonlocal previous
                    body = {"model": "echo", "input": t, "previous_response_id": previous}
                    previous = http.post("/v1/responses", json=body).json()["id"]

                ms["responses"].append(timed(respond))
        conn = sqlite3.connect(db)
        records, size = conn.execute("SELECT COUNT(*), SUM(LENGTH(record)) FROM records").fetchone()
        conn.close()
    base = statistics.median(ms["http"])
    print(f"{turns} turns each, median ms per turn (the model is a local fake answering in well under 1 ms):")
    for name, values in ms.items():
        extra = "" if name == "http" else f"   ({statistics.median(values) - base:+.2f} ms against http)"
        print(f"  {name:<10} {statistics.median(values):7.2f}{extra}")
    print(f"records after two conversations of {turns} turns: {records} rows, {size / 1024:.0f} KiB "
          f"({size / records / 1024:.1f} KiB a turn on average)")


if __name__ == "__main__":
    main()
