"""Issue 22's guarantees, with real `chatrun serve` processes (tests/redis_support.py `Replica`),
a real Redis or a real PostgreSQL (every test runs on both), the fake OpenAI server and a real local HTTP receiver that counts the refund
tool's calls: a pending approval survives `kill -9` of the replica that asked and is decided
through another one; the tool runs exactly once however often (and wherever) the decision is
POSTed; a timeout fires with no client present, after a restart too, exactly once; a decision
by a principal without the role is refused, and one by the principal who caused the call when the
approval says `self: false`, on every replica; a message sent while the approval waits is queued
through another replica and read after the decision; a timeout that approves runs the tool once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from redis_support import Replica
from server_support import wait_until
from store_params import store_url
from webhook_support import OPENAI_MODEL, Receiver

AUTH = """
tokens:
  ana-token-123: {principal: ana}
  sam-token-123: {principal: sam, roles: [supervisor]}
  eve-token-123: {principal: eve, roles: [staff]}
  sue-token-123: {principal: sue, roles: [supervisor]}
"""
ANA, SAM, EVE, SUE = ({"Authorization": f"Bearer {t}"}
                      for t in ("ana-token-123", "sam-token-123", "eve-token-123", "sue-token-123"))


def refund_bot(timeout: str = "1d", more: str = "") -> str:
    """The refund bot; `more` adds lines to its `approval:` (e.g. `self: false`, `on_timeout: approve`)."""
    return f"""\
name: refunds
model: {{{OPENAI_MODEL}}}
env:
  REFUND_URL: {{}}
routes:
  main: {{default: true, system: Refund orders., tools: [refund]}}
tools:
  refund:
    description: Refund an order
    parameters: {{type: object, properties: {{order: {{type: string}}, amount: {{type: number}}}}, required: [order, amount]}}
    http: {{method: POST, url: "{{{{ env.REFUND_URL }}}}/refunds", json: {{order: "{{{{ args.order }}}}", amount: "{{{{ args.amount }}}}"}}}}
    approval:
      by: [supervisor]
      edit: [amount]
      timeout: {timeout}
{more}"""


def responder(body: dict[str, Any]) -> dict[str, Any]:
    """The fake model: "refund A7 80" calls refund(order=A7, amount=80); after its result: "Done.";
    any other last message: "Noted: TEXT"."""
    if body["messages"][-1]["role"] == "tool":
        return {"text": "Done."}
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    if not user.startswith("refund "):
        return {"text": f"Noted: {user}"}
    _, order, amount = user.split()
    return {"tool_calls": [{"name": "refund", "arguments": {"order": order, "amount": float(amount)}}]}



@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture(params=["redis", "postgres"])
def shared_store(request, tmp_path):
    """The URL of an empty store the replicas share: a real Redis, a real PostgreSQL (issue 38)."""
    return store_url(request, tmp_path)


@pytest.fixture
def setup(tmp_path, fake, receiver, monkeypatch, shared_store):
    """(bot path, auth path, store URL): the refund bot pointed at the receiver, on Redis or Postgres."""
    monkeypatch.setenv("REFUND_URL", receiver.url)
    fake.responder = responder
    (tmp_path / "auth.yaml").write_text(AUTH)

    def make(timeout: str = "1d", more: str = "") -> tuple[str, str, str]:
        bot = tmp_path / "bot.yaml"
        bot.write_text(refund_bot(timeout, more))
        return str(bot), str(tmp_path / "auth.yaml"), shared_store

    return make


def replica(bot: str, auth: str, store: str, fake_url: str, sweep: str = "1") -> Replica:
    return Replica(bot, store, fake_url, "--auth", auth, "--sweep-interval", sweep)


def ask(server: Replica, session: str, text: str = "refund A7 80", who: dict = ANA) -> dict:
    created = httpx.post(f"{server.url}/bots/refunds/sessions", json={"id": session}, headers=who, timeout=60)
    assert created.status_code == 201, created.text
    return say(server, session, text, who)


def say(server: Replica, session: str, text: str, who: dict = ANA) -> dict:
    reply = httpx.post(f"{server.url}/bots/refunds/sessions/{session}/messages", json={"userMessage": text},
                       headers=who, timeout=60).json()
    assert reply["ok"] is True, reply
    return reply


def decide(server: Replica, session: str, body: dict, key: str | None = None, who: dict = SAM) -> httpx.Response:
    headers = dict(who, **({"Idempotency-Key": key} if key else {}))
    return httpx.post(f"{server.url}/bots/refunds/sessions/{session}/pending/p1", json=body, headers=headers,
                      timeout=60)


def pending_of(server: Replica, session: str, who: dict = ANA) -> list[dict]:
    return httpx.get(f"{server.url}/bots/refunds/sessions/{session}/pending", headers=who, timeout=60).json()["pending"]


def history_of(server: Replica, session: str, who: dict = ANA) -> list[dict]:
    return httpx.get(f"{server.url}/bots/refunds/sessions/{session}", headers=who, timeout=60).json()["history"]


def resolved(history: list[dict]) -> list[dict]:
    return [e["data"] for entry in history for e in entry.get("events", []) if e["type"] == "Resolved"]


@pytest.mark.subprocess
def test_a_pending_approval_survives_kill_9_and_another_replica_runs_the_tool_exactly_once(setup, fake, receiver):
    bot, auth, store = setup()
    first = replica(bot, auth, store, fake.base_url).start()
    second = restarted = None
    try:
        asked = ask(first, "k1")
        assert [e["data"]["id"] for e in asked["events"] if e["type"] == "Pending"] == ["p1"]
        assert receiver.seen() == []  # nothing of the tool ran: it waits for a supervisor
        second = replica(bot, auth, store, fake.base_url).start()
        first.kill()  # kill -9 between the request and the decision
        approved = decide(second, "k1", {"decision": "approve", "args": {"amount": 40}}, key="sam-1")
        assert approved.status_code == 200, approved.text
        body = approved.json()
        assert body["ok"] is True and body["replayed"] is False
        assert [e["data"]["outcome"] for e in body["events"] if e["type"] == "Resolved"] == ["edited"]
        assert [e["data"] for e in body["events"] if e["type"] == "Message"][-1] == "Done."
        assert [d.body for d in receiver.seen()] == [{"order": "A7", "amount": 40}]
        # The same key again: the recorded turn, nothing runs. Another key, or a restarted
        # replica: the item is not pending any more.
        again = decide(second, "k1", {"decision": "approve", "args": {"amount": 40}}, key="sam-1")
        assert again.status_code == 200 and again.json()["replayed"] is True
        assert again.headers["idempotent-replayed"] == "true"
        restarted = replica(bot, auth, store, fake.base_url).start()
        late = decide(restarted, "k1", {"decision": "approve"}, key="sam-2")
        assert late.status_code == 409 and late.json()["error"] == "NotPending", late.text
        assert len(receiver.seen()) == 1
        assert pending_of(restarted, "k1") == []
    finally:
        for r in (first, second, restarted):
            if r is not None:
                r.kill()


@pytest.mark.subprocess
def test_a_decision_posted_to_both_replicas_at_once_runs_the_tool_once(setup, fake, receiver):
    bot, auth, store = setup()
    a = replica(bot, auth, store, fake.base_url).start()
    b = replica(bot, auth, store, fake.base_url).start()
    try:
        ask(a, "both")
        answers: list[httpx.Response] = []
        go = threading.Barrier(2)

        def post(server: Replica, key: str) -> None:
            go.wait()
            answers.append(decide(server, "both", {"decision": "approve"}, key=key))

        threads = [threading.Thread(target=post, args=(s, k)) for s, k in ((a, "ka"), (b, "kb"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200, 409], [r.text for r in answers]
        assert len(receiver.seen()) == 1
        assert [r["outcome"] for r in resolved(history_of(a, "both"))] == ["approved"]
    finally:
        a.kill()
        b.kill()


@pytest.mark.subprocess
def test_a_decision_without_the_role_is_refused_and_nothing_runs(setup, fake, receiver):
    bot, auth, store = setup()
    server = replica(bot, auth, store, fake.base_url).start()
    try:
        ask(server, "r1")
        own = decide(server, "r1", {"decision": "approve"}, who=ANA)  # the owner is no supervisor
        assert own.status_code == 403 and own.json()["error"] == "DecisionRefused", own.text
        assert "supervisor" in own.json()["message"]
        stranger = decide(server, "r1", {"decision": "approve"}, who=EVE)
        assert stranger.status_code == 404  # does not learn the session exists
        assert receiver.seen() == [] and [p["id"] for p in pending_of(server, "r1")] == ["p1"]
    finally:
        server.kill()


@pytest.mark.subprocess
def test_a_timeout_fires_with_no_client_after_a_restart_exactly_once(setup, fake, receiver):
    bot, auth, store = setup(timeout="4s")
    first = replica(bot, auth, store, fake.base_url, sweep="0").start()  # this one never sweeps
    replicas = []
    try:
        ask(first, "t1")
        first.kill()  # nobody is up when it comes due
        wait_until(lambda: _due_passed(store, "t1"), what="the due time passing")
        # Two replicas come up and both sweep: exactly one expires it, with no client connected.
        replicas = [replica(bot, auth, store, fake.base_url, sweep="0.5").start() for _ in range(2)]
        wait_until(lambda: pending_of(replicas[0], "t1") == [], what="the timeout resolved by a sweeper")
        outcomes = [r["outcome"] for r in resolved(history_of(replicas[1], "t1"))]
        assert outcomes == ["timed_out"]
        assert receiver.seen() == []  # on_timeout: reject (the default): the tool never ran
        time.sleep(2)  # further sweeps of both replicas find nothing due
        assert [r["outcome"] for r in resolved(history_of(replicas[0], "t1"))] == ["timed_out"]
    finally:
        for r in (first, *replicas):
            r.kill()


@pytest.mark.subprocess
def test_a_supervisor_may_not_approve_their_own_call_on_any_replica(setup, fake, receiver):
    bot, auth, store = setup(more="      self: false\n")
    a = replica(bot, auth, store, fake.base_url).start()
    b = replica(bot, auth, store, fake.base_url).start()
    try:
        ask(a, "own", who=SAM)  # a supervisor asks for a refund of their own
        for server in (a, b):
            own = decide(server, "own", {"decision": "approve"}, key=f"sam-{server.port}", who=SAM)
            assert own.status_code == 403 and own.json()["error"] == "DecisionRefused", own.text
            assert "may not decide it" in own.json()["message"]
        assert receiver.seen() == [] and [p["id"] for p in pending_of(b, "own", who=SAM)] == ["p1"]
        other = decide(b, "own", {"decision": "approve"}, key="sue-1", who=SUE)  # another supervisor may
        assert other.status_code == 200, other.text
        assert [r["outcome"] for r in resolved(history_of(a, "own", who=SAM))] == ["approved"]
        assert [d.body for d in receiver.seen()] == [{"order": "A7", "amount": 80}]
    finally:
        a.kill()
        b.kill()


@pytest.mark.subprocess
def test_a_message_while_the_approval_waits_is_queued_on_another_replica_and_read_after(setup, fake, receiver):
    bot, auth, store = setup()
    a = replica(bot, auth, store, fake.base_url).start()
    b = replica(bot, auth, store, fake.base_url).start()
    try:
        ask(a, "q1")
        asked = len(fake.requests)
        waiting = say(b, "q1", "is it done yet?")  # through the other replica, while p1 waits
        assert [e["data"] for e in waiting["events"] if e["type"] == "Message"] == [
            "Still waiting: Your request is waiting for approval."]  # what the user is told, not the approvers' question
        assert len(fake.requests) == asked and receiver.seen() == []  # no model call, nothing ran
        a.kill()  # the replica that asked is gone; the decision comes through the other one
        approved = decide(b, "q1", {"decision": "approve"}, key="sam-q1")
        assert approved.status_code == 200, approved.text
        assert len(receiver.seen()) == 1
        # The decision's model call reads the real result, then the queued message: never lost.
        sent = fake.requests[-1]["messages"]
        assert [m["role"] for m in sent[-2:]] == ["tool", "user"] and sent[-1]["content"] == "is it done yet?"
        assert [e["data"] for e in approved.json()["events"] if e["type"] == "Message"] == ["Noted: is it done yet?"]
        inputs = [e["input"] for e in history_of(b, "q1")]
        assert [i if isinstance(i, str) else i.get("userMessage") or i["decision"]["kind"] for i in inputs] == [
            "refund A7 80", "is it done yet?", "approve"]
    finally:
        a.kill()
        b.kill()


@pytest.mark.subprocess
def test_a_timeout_that_approves_fires_once_across_replicas_and_the_tool_runs_once(setup, fake, receiver):
    bot, auth, store = setup(timeout="4s", more="      on_timeout: approve\n")
    first = replica(bot, auth, store, fake.base_url, sweep="0").start()  # this one never sweeps
    replicas = []
    try:
        ask(first, "ta")
        assert receiver.seen() == []
        replicas = [replica(bot, auth, store, fake.base_url, sweep="0.5").start() for _ in range(2)]
        wait_until(lambda: pending_of(replicas[0], "ta") == [], what="the timeout resolved by a sweeper")
        assert [r["outcome"] for r in resolved(history_of(replicas[1], "ta"))] == ["timed_out"]
        time.sleep(2)  # further sweeps of both replicas find nothing due
        assert [d.body for d in receiver.seen()] == [{"order": "A7", "amount": 80}]  # exactly once
        assert [r["outcome"] for r in resolved(history_of(replicas[0], "ta"))] == ["timed_out"]
    finally:
        for r in (first, *replicas):
            r.kill()


def _due_passed(store: str, session: str) -> bool:
    import asyncio

    from chatrun.store.aio import open_async_store

    async def due() -> list[str]:
        shared = open_async_store(store)
        try:
            return await shared.list_due(time.time())
        finally:
            await shared.close()

    return session in asyncio.run(due())
