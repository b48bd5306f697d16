"""A timeout whose turn keeps failing (docs/operators.md, "Timeouts"): an approval with
`on_timeout: approve` approved by the sweeper runs its tool, then the model fails and the turn
is rolled back, so the item is due again. The sweeper waits the sweep interval, then twice as
long each failure (up to an hour), before it tries again, and the wait is kept in the store
(its due index and the session), so every replica honours it; a committed turn ends it.
The sweeper is driven directly with its own clock: no sleeps."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

import chatrun
from chatrun.server.sweeper import PendingSweeper, SweepSettings
from server_support import app_for_testclient, call

BOT = """
name: refunds
routes:
  main:
    default: true
    tools: [refund]
tools:
  refund:
    handler: refund_tools:refund
    effect: once
    approval: {timeout: 1h, on_timeout: approve}
"""

TOOLS = """
from pathlib import Path

def refund(ctx):
    with open(Path(__file__).parent / "refunded.txt", "a") as f:
        f.write("refunded\\n")
    return "refunded"
"""

MODEL_DOWN = {"status": 400, "body": {"error": {"message": "the model is down"}}}
INTERVAL = 5.0


def test_a_failing_timeout_turn_is_tried_again_after_a_doubling_backoff_kept_in_the_store(write_bot, tmp_path, fake):
    folder = Path(write_bot(BOT, extra={"refund_tools.py": TOOLS})).parent
    app = app_for_testclient([chatrun.load_bot(folder / "bot.yaml")], f"sqlite:///{tmp_path / 'chat.db'}")
    runs = folder / "refunded.txt"
    clock = [float(int(time.time()) + 2 * 3600)]  # past the item's hour (whole seconds: the ISO round trip is exact)
    with TestClient(app) as client:
        registry = client.app.state.registry
        sweeper = PendingSweeper(registry, SweepSettings(interval=INTERVAL), clock=lambda: clock[0])
        start = clock[0]

        def sweep_at(offset: float) -> int:
            clock[0] = start + offset
            return client.portal.call(sweeper.sweep)

        def due_at(offset: float) -> list[str]:
            return client.portal.call(registry.store.list_due, start + offset)

        assert client.post("/bots/refunds/sessions", json={"id": "r1"}).status_code == 201
        fake.queue(call("refund"))
        client.post("/bots/refunds/sessions/r1/messages", json={"userMessage": "refund me"})
        assert client.get("/bots/refunds/sessions/r1/pending").json()["pending"]  # the approval waits

        fake.queue(MODEL_DOWN)
        assert sweep_at(0) == 1 and runs.read_text().count("refunded") == 1  # approved, ran, the model failed
        assert due_at(INTERVAL - 1) == [] and sweep_at(INTERVAL - 1) == 0  # the store's index waits
        fake.queue(MODEL_DOWN)
        assert due_at(INTERVAL) == ["r1"] and sweep_at(INTERVAL) == 1  # tried again after the interval
        assert runs.read_text().count("refunded") == 2
        assert sweep_at(INTERVAL + 2 * INTERVAL - 1) == 0  # then after twice as long
        fake.queue(MODEL_DOWN)
        assert sweep_at(3 * INTERVAL) == 1 and runs.read_text().count("refunded") == 3
        assert due_at(3 * INTERVAL + 4 * INTERVAL - 1) == []  # and four times
        fake.queue({"text": "Your refund is done."})
        assert sweep_at(7 * INTERVAL) == 1 and runs.read_text().count("refunded") == 4
        session = client.get("/bots/refunds/sessions/r1").json()
        assert session["turn"] == 2 and client.get("/bots/refunds/sessions/r1/pending").json()["pending"] == []
        assert "sweep_retry" not in client.portal.call(registry.store.load_session, "r1").snapshot
