"""A killed attempt's billed model call reaches a billing sink once, in the `Usage` event of the
commit that counted it (docs/observability.md, "Usage for billing"): a real `chatrun serve` on
SQLite answered by fake_openai, killed (SIGKILL) after a model call and before the commit, then
started again; a real local webhook receiver lists `Usage`."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from chatrun.engine.usage import Usage
from chatrun.testing.fake_openai import FakeOpenAI
from server_support import call, free_port, start_serve, wait_until, write_travel
from test_billing_killed import PRICES, send, used
from webhook_support import Receiver

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]


def billing(url: str) -> str:
    return f"sinks:\n  billing:\n    webhook: {{url: \"{url}/usage\"}}\n    events: [Usage]\n" \
           "    retry: {attempts: 50, backoff: 0.2, max_backoff: 2}\n"


def test_a_killed_attempts_usage_is_delivered_once_with_the_next_commit(tmp_path):
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    path = write_travel(tmp_path / "bots")
    port = free_port()
    base, ws_url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/_chat/routes"
    with FakeOpenAI() as fake, Receiver() as receiver:
        path.write_text(path.read_text() + PRICES + billing(receiver.url))
        fake.queue({"text": "Hello", **used(10, 1)},
                   {**call("remember_name", name="Ana"), **used(100, 10)}, {"text": "never", "delay": 60})
        first = start_serve(str(path), store, port, fake)
        try:
            asyncio.run(send(ws_url, "hi", fake, first=True))
            asyncio.run(send(ws_url, "I'm Ana", fake, calls_before_kill=3))
        finally:
            first.kill()  # SIGKILL, after the model answered and before the commit
            first.wait(10)
        fake.queue({**call("remember_name", name="Ana"), **used(200, 20)}, {"text": "Hi Ana", **used(300, 30)},
                   {"text": "Bye", **used(5, 1)})
        second = start_serve(str(path), store, port, fake)
        try:
            asyncio.run(send(ws_url, "I'm Ana", fake))
            asyncio.run(send(ws_url, "bye", fake))
            # At least once: a delivery the kill cut short is sent again, with the same id.
            wait_until(lambda: len({d.body["id"] for d in receiver.accepted()}) >= 3, what="three Usage events")
            session = httpx.get(f"{base}/bots/travel/sessions/r1").json()
        finally:
            second.kill()
            second.wait(10)
    events = {d.body["id"]: d.body["data"] for d in receiver.accepted()}
    assert [(d["turn"], d["ok"], d["usage"]["calls"]) for d in events.values()] == [(1, True, 1), (2, True, 2), (3, True, 1)]
    dead = [a for d in events.values() for a in d["unfinished"]]
    assert len(dead) == 1 and dead[0]["turn"] == 2 and dead[0]["unfinished"] is True
    assert (dead[0]["usage"]["input_tokens"], dead[0]["usage"]["output_tokens"]) == (100, 10)
    total = Usage()
    for data in events.values():
        total.add(Usage.from_dict(data["total"]))
    assert total.to_dict() == session["usage"]
    assert (total.input_tokens, total.output_tokens, total.calls) == (615, 62, 5)
    assert total.cost == pytest.approx((615 * 1.0 + 62 * 2.0) / 1e6)
