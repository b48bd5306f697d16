"""Two replicas on one shared store (a real Redis, a real PostgreSQL), each an app with its own
connection and its own outbox worker (docs/observability.md, "Usage for billing"): a session's
turns alternating between them deliver one `Usage` per turn, each once whichever worker takes
it, and the events' `total`s sum to the session's usage. A real local webhook receiver."""

from __future__ import annotations

from collections import Counter

import pytest
from fastapi.testclient import TestClient

from chatrun.engine.usage import Usage
from server_support import app_for_testclient, wait_until
from store_params import DISTRIBUTED, store_url
from test_usage_sink import BOT, used
from webhook_support import Receiver

pytestmark = pytest.mark.slow  # a redis-server / PostgreSQL
TURNS = 4


@pytest.fixture(params=DISTRIBUTED)
def shared_store(request, tmp_path):
    return store_url(request, tmp_path)


def test_turns_alternating_between_two_replicas_deliver_one_usage_each_once(fake, tmp_path, shared_store,
                                                                            monkeypatch):
    with Receiver() as crm, Receiver() as billing:
        for name, value in (("CRM_URL", crm.url), ("BILLING_URL", billing.url), ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        (tmp_path / "bot.yaml").write_text(BOT)
        fake.queue(*({"text": f"answer {n}", **used(10 * (n + 1), n + 1)} for n in range(TURNS)))
        bot = str(tmp_path / "bot.yaml")
        with TestClient(app_for_testclient(bot, shared_store)) as one, \
                TestClient(app_for_testclient(bot, shared_store)) as two:
            assert one.post("/bots/survey/sessions", json={"id": "s"}).status_code == 201
            for n in range(TURNS):  # turn 1 on the first replica, 2 on the second, ...
                said = (one, two)[n % 2].post("/bots/survey/sessions/s/messages", json={"userMessage": f"m{n}"})
                assert said.status_code == 200 and said.json()["ok"], said.text
            wait_until(lambda: len({d.body["id"] for d in billing.accepted()}) >= TURNS, what=f"{TURNS} Usage events")
            session = two.get("/bots/survey/sessions/s").json()
            wait_until(lambda: one.get("/outbox").json()["entries"] == [], what="an empty outbox")
    deliveries = Counter(d.body["id"] for d in billing.accepted())
    assert set(deliveries.values()) == {1}, deliveries  # each once, by one worker or the other
    events = [d.body["data"] for d in billing.accepted()]
    assert sorted(e["turn"] for e in events) == list(range(1, TURNS + 1))
    total = Usage()
    for data in events:
        total.add(Usage.from_dict(data["total"]))
    assert total.to_dict() == session["usage"]
    assert (total.input_tokens, total.output_tokens, total.calls) == (100, 10, TURNS)
