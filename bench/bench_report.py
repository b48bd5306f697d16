"""How fast is `chatrun report` on a big store? 100,000 synthetic conversations in SQLite, then
the report's work (read the store, count, draw the HTML) timed in CPU seconds, min and median
of several rounds.

The conversations are made from one real one: a session of the support-desk bot run through
the engine (scripted model: a turn that closes a ticket, a rating), its stored snapshot and
history entries copied with varied bot versions, locales, outcomes, end routes, turns (1-6),
turn times and ratings, and written straight into the store's tables (writing 100,000 through
the engine would take the bench's time, not the report's).

    python bench/bench_report.py
    python bench/bench_report.py --conversations 20000 --rounds 3 --out /tmp/report.html

Goal (issue 38): the report renders for 100,000 conversations (figure in bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))

OUTCOMES = ["resolved"] * 45 + ["escalated"] * 15 + ["abandoned"] * 20 + ["converted"] * 10 + [None] * 10
ROUTES = {"resolved": "main", "escalated": "human", "abandoned": "main", "converted": "checkout", None: "main"}
LOCALES = ["en"] * 6 + ["de"] * 3 + ["fr"]


def template(tmp: Path) -> tuple[dict, list[dict]]:
    """One real conversation's stored snapshot and history (turn entries, then a rating)."""
    import chatrun
    from chat_support import call
    from chatrun.models.scripted import ScriptedModel
    from chatrun.store.sqlite import SQLiteStore
    from test_outcomes import DESK

    (tmp / "desk.yaml").write_text(DESK)
    bot = chatrun.load_bot(tmp / "desk.yaml")
    store = SQLiteStore(str(tmp / "template.db"))
    session = bot.session(model=ScriptedModel([call("close_ticket"), "Closed."]), store=store, meta={"locale": "en"})
    session.chat("please close my ticket")
    session.rate(1, "up")
    return store.load_session(session.id), store.load_history(session.id)


def fill(path: Path, n: int, snapshot: dict, history: list[dict], seed: int = 38) -> None:
    """n conversations like the template, varied, written in bulk."""
    from chatrun.store.sqlite import SQLiteStore

    SQLiteStore(str(path)).close()  # the schema
    rng = random.Random(seed)
    turn, rating = history[0], history[-1]
    versions = ["a1b2c3d4e5", "f6a7b8c9d0"]
    start = time.time() - 30 * 86400
    sessions, entries = [], []
    for i in range(n):
        sid = f"s{i:06d}"
        outcome = rng.choice(OUTCOMES)
        snap = dict(snapshot, id=sid, bot_version=rng.choice(versions), meta={"locale": rng.choice(LOCALES)},
                    scopes=[dict(snapshot["scopes"][0], route=ROUTES[outcome])])
        snap.pop("outcome", None)  # the template's own (it closed a ticket)
        if outcome is not None:
            snap["outcome"] = {"name": outcome, "turn": 1, "route": ROUTES[outcome], "at": "2026-11-25T09:00:00+00:00"}
        turns = rng.randint(1, 6)
        snap["usage"] = dict(snapshot["usage"], cost=snapshot["usage"]["cost"] * turns,
                             input_tokens=snapshot["usage"]["input_tokens"] * turns)
        sessions.append((sid, json.dumps(snap), start + i * 20))
        at = start + i * 20
        for t in range(1, turns + 1):
            entry = dict(turn, turn=t, at=at + t * 30, seconds=round(rng.lognormvariate(-0.5, 0.6), 4))
            entries.append((sid, t, json.dumps(entry)))
        if rng.random() < 0.3:
            feedback = dict(rating, feedback=dict(rating["feedback"], rating="up" if rng.random() < 0.75 else "down"))
            entries.append((sid, turns + 1, json.dumps(feedback)))
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.executemany("INSERT INTO sessions (session_id, snapshot, updated_at) VALUES (?, ?, ?)", sessions)
        conn.executemany("INSERT INTO history (session_id, seq, entry) VALUES (?, ?, ?)", entries)


def report_once(path: Path, out: Path) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, conversations) of one report: read, count, draw, write."""
    from chatrun.cli.report import _report
    from chatrun.report.figures import Meanings

    cpu, wall = time.process_time(), time.perf_counter()
    html, count = asyncio.run(_report(f"sqlite:///{path}", None, None, Meanings()))
    out.write_text(html, encoding="utf-8")
    return time.process_time() - cpu, time.perf_counter() - wall, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="keep the last report here")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-report-"))
    snapshot, history = template(tmp)
    db = tmp / "big.db"
    made = time.perf_counter()
    fill(db, args.conversations, snapshot, history)
    print(f"{args.conversations:,} conversations written in {time.perf_counter() - made:.1f} s "
          f"({db.stat().st_size / 2**20:.0f} MiB); load average {os.getloadavg()[0]:.1f}")
    out = args.out or tmp / "report.html"
    cpu, wall = [], []
    for _ in range(args.rounds):
        c, w, count = report_once(db, out)
        cpu.append(c)
        wall.append(w)
        assert count == args.conversations, count
    print(f"chatrun report over {count:,} conversations: CPU min {min(cpu):.2f} s, median {statistics.median(cpu):.2f} s;"
          f" wall min {min(wall):.2f} s, median {statistics.median(wall):.2f} s ({out.stat().st_size / 1024:.0f} KiB of HTML, "
          f"{out})")


if __name__ == "__main__":
    main()
