"""Issue 33, finding 4: a mixed fleet on one real Redis delivers every event to the right
receiver and dead-letters none. Two `chatrun serve` replicas (real processes) serve different
bots, or different versions of one bot where only the newer has a sink; each replica's worker
claims only the routes (bot, sink) it serves. The receivers (real local HTTP servers) answer
503 at first, so every entry is retried by polling, where both replicas' workers race for it
(before issue 33 the replica that did not know the bot or sink made it a dead letter at once)."""

from __future__ import annotations

import httpx
import pytest

from redis_support import Replica
from server_support import wait_until
from webhook_support import OPENAI_MODEL, SECRET, Receiver, survey_bot, survey_responder

pytestmark = pytest.mark.subprocess

RETRY = "attempts: 50, backoff: 0.2, max_backoff: 1"
AUDIT = ("  audit:\n"
         '    webhook: {url: "{{ env.AUDIT_URL }}/hooks/audit", secret: HOOK_SECRET, timeout: 20}\n'
         "    retry: {" + RETRY + "}\n")


def poll_bot() -> str:
    """Another bot: the survey under the name poll, its `crm` sink at $POLL_URL."""
    return survey_bot(OPENAI_MODEL, RETRY).replace("name: survey", "name: poll").replace("HOOK_URL", "POLL_URL")


def survey_v2() -> str:
    """The survey's next version: the same, plus a sink `audit` at $AUDIT_URL."""
    text = survey_bot(OPENAI_MODEL, RETRY).replace("  HOOK_SECRET:", "  AUDIT_URL: {}\n  HOOK_SECRET:")
    return text.replace("routes:\n", AUDIT + "routes:\n")


def turn(replica: Replica, bot: str, session: str, n: int) -> None:
    assert httpx.post(f"{replica.url}/bots/{bot}/sessions", json={"id": session}, timeout=60).status_code == 201
    r = httpx.post(f"{replica.url}/bots/{bot}/sessions/{session}/messages", json={"userMessage": str(n)},
                   timeout=60)
    assert r.status_code == 200 and r.json()["ok"], r.text


def outbox(replica: Replica) -> list[dict]:
    return httpx.get(f"{replica.url}/outbox", params={"limit": 1000}, timeout=30).json()["entries"]


@pytest.mark.parametrize("fleet", ["two bots", "a rolling deploy that adds a sink"])
def test_a_mixed_fleet_delivers_every_event_to_its_receiver_and_dead_letters_none(
        fleet, redis_server, fake, tmp_path, monkeypatch):
    fake.responder = survey_responder
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "bot.yaml").write_text(survey_bot(OPENAI_MODEL, RETRY))
    (second / "bot.yaml").write_text(poll_bot() if fleet == "two bots" else survey_v2())
    with Receiver(status=503) as crm, Receiver(status=503) as other:
        for name, url in (("HOOK_URL", crm.url), ("POLL_URL", other.url), ("AUDIT_URL", other.url)):
            monkeypatch.setenv(name, url)
        monkeypatch.setenv("HOOK_SECRET", SECRET)
        monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
        store = redis_server.url()
        replicas = [Replica(str(first), store, fake.base_url).start(wait=False),
                    Replica(str(second), store, fake.base_url).start(wait=False)]
        try:
            for replica in replicas:
                replica.wait_ready()
            if fleet == "two bots":  # survey's events to crm, poll's to the other receiver
                for n in range(1, 11):
                    turn(replicas[0] if n <= 5 else replicas[1], "survey" if n <= 5 else "poll", f"s{n}", n)
                expected = {"crm": {1, 2, 3, 4, 5}, "other": {6, 7, 8, 9, 10}}
            else:  # sessions on version 2 (the new replica): each event to crm and to audit
                for n in range(1, 11):
                    turn(replicas[1], "survey", f"s{n}", n)
                expected = {"crm": set(range(1, 11)), "other": set(range(1, 11))}
            count = sum(len(v) for v in expected.values())
            # Every entry tried at least twice while the receivers are down: both workers polled.
            wait_until(lambda: (entries := outbox(replicas[0])) and len(entries) == count
                       and all(e["attempts"] >= 2 or e["state"] == "dead" for e in entries),
                       what="every entry tried twice")
            crm.status = other.status = 200
            wait_until(lambda: not [e for e in outbox(replicas[0]) if e["state"] == "pending"],
                       what="no entry pending")
            assert [(e["body"]["bot"], e["sink"], e["error"]) for e in outbox(replicas[0])] == []  # no dead letter
            for receiver, name in ((crm, "crm"), (other, "other")):
                got = receiver.accepted()
                assert {d.body["data"] for d in got} == expected[name], name
                assert all(d.signed_with(SECRET) for d in got)
                want_bot = "poll" if fleet == "two bots" and name == "other" else "survey"
                assert {d.body["bot"] for d in got} == {want_bot}
            # The first replica never claimed an entry of a route it does not serve.
            metrics = httpx.get(f"{replicas[0].url}/metrics", timeout=30).text
            assert 'sink="audit"' not in metrics and 'bot="poll"' not in metrics
        finally:
            for replica in replicas:
                replica.kill()
