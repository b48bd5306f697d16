"""A killed attempt's billed model call reaches a billing sink once, in the `Usage` event of the
commit that counted it (docs/observability.md, "Usage for billing"): a real `chatrun serve` on
SQLite, Redis and PostgreSQL answered by fake_openai, killed (SIGKILL) after a model call and
before the commit, then started again; the page sends the message again, or over `/v1` the real
`openai` client sends its request again (its retry takes over the dead attempt's claim); a real
local webhook receiver lists `Usage` (tests/test_billing_killed.py runs the same kill)."""

from __future__ import annotations

import pytest

from chatrun.engine.usage import Usage
from server_support import wait_until
from test_billing_killed import PRICES, killed_then_retried, v1_killed_then_retried
from webhook_support import Receiver

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]


def billing(url: str) -> str:
    return f"sinks:\n  billing:\n    webhook: {{url: \"{url}/usage\"}}\n    events: [Usage]\n" \
           "    retry: {attempts: 50, backoff: 0.2, max_backoff: 2}\n"


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def store(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sessions.db'}"
    return request.getfixturevalue(f"{request.param}_server").url()


def three_delivered(receiver: Receiver) -> None:
    # At least once: a delivery the kill cut short is sent again, with the same id.
    wait_until(lambda: len({d.body["id"] for d in receiver.accepted()}) >= 3, what="three Usage events")


def check_delivered_once(receiver: Receiver, session: dict) -> None:
    """One Usage per committed turn, the dead attempt's call in the retry's `unfinished` once, and
    the `total`s summing to the session's usage."""
    events = {d.body["id"]: d.body["data"] for d in receiver.accepted()}
    assert sorted((d["turn"], d["ok"], d["usage"]["calls"]) for d in events.values()) == \
        [(1, True, 1), (2, True, 2), (3, True, 1)]
    dead = [a for d in events.values() for a in d["unfinished"]]
    assert len(dead) == 1 and dead[0]["turn"] == 2 and dead[0]["unfinished"] is True
    assert (dead[0]["usage"]["input_tokens"], dead[0]["usage"]["output_tokens"]) == (100, 10)
    total = Usage()
    for data in events.values():
        total.add(Usage.from_dict(data["total"]))
    assert total.to_dict() == session["usage"]
    assert (total.input_tokens, total.output_tokens, total.calls) == (615, 62, 5)
    assert total.cost == pytest.approx((615 * 1.0 + 62 * 2.0) / 1e6)


def test_a_killed_attempts_usage_is_delivered_once_with_the_next_commit(tmp_path, store):
    with Receiver() as receiver:
        session, _, _, _ = killed_then_retried(tmp_path, store, billing(receiver.url),
                                               lambda: three_delivered(receiver))
    check_delivered_once(receiver, session)


def test_over_v1_the_retry_that_took_the_dead_claim_delivers_its_usage_once(tmp_path, store):
    with Receiver() as receiver:
        session = v1_killed_then_retried(tmp_path, store, PRICES + billing(receiver.url),
                                         lambda: three_delivered(receiver))
    check_delivered_once(receiver, session)
