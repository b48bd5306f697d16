"""Issue 34 findings 4 and 5, through the server in process (the real app with a real SQLite
store, the fake OpenAI server, a real local HTTP receiver, the sweeper's clock pinned and its
sweeps run by the test):

- the bot is silent while an operator holds the conversation: an approval that times out (the
  sweeper), or a supervisor's decision, is recorded and applied on release; the model does not
  run until then (bots/refunds);
- `operator: timeout:` with `on_timeout:` opens a ticket through an `http:` tool when nobody
  picks up, also after a restart of the server in between;
- an operator takes over a session that never waited.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.server.sweeper import SweepSettings
from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL, Receiver

ROOT = Path(__file__).resolve().parent.parent
AUTH = """
tokens:
  ana-token-123: {principal: ana}
  sam-token-123: {principal: sam, roles: [supervisor]}
  olga-token-12: {principal: olga, roles: [operators]}
  bea-token-123: {principal: bea, roles: [billing]}
  eve-token-123: {principal: eve, roles: [staff]}
"""
ANA, SAM, OLGA, BEA, EVE = ({"Authorization": f"Bearer {t}"} for t in
                            ("ana-token-123", "sam-token-123", "olga-token-12", "bea-token-123", "eve-token-123"))


def responder(body: dict[str, Any]) -> dict[str, Any]:
    """The fake model: "refund A1001 80" calls refund; "human" calls human; after a tool's
    result: "Bot: RESULT"; anything else: "Bot heard: TEXT". The bot's context (a system message
    after the memory, docs/models.md "Stable prompts") is not what the model answers."""
    last = [m for m in body["messages"] if m["role"] != "system"][-1]
    if last["role"] == "tool":
        return {"text": f"Bot: {last['content']}"}
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    words = str(user).split()
    if words and words[0] == "refund":
        return {"tool_calls": [{"name": "refund", "arguments": {"order": words[1], "amount": float(words[2])}}]}
    if words and words[0] == "human":
        return {"tool_calls": [{"name": "human", "arguments": {"topic": "billing"}}]}
    return {"text": f"Bot heard: {user}"}


def serve(bot: Path, db: Path, auth: Path) -> TestClient:
    """The app on the SQLite file, its sweeper never sweeping by itself (the test sweeps)."""
    app = app_for_testclient([chatrun.load_bot(bot)], f"sqlite:///{db}", auth=str(auth),
                             sweep=SweepSettings(interval=0))
    return TestClient(app)


def sweep_at(client: TestClient, moment: datetime) -> int:
    """One sweep of the server's sweeper with its clock pinned at `moment`."""
    sweeper = client.app.state.registry.sweeper
    sweeper.clock = moment.timestamp
    return client.portal.call(sweeper.sweep)


def messages(reply: dict[str, Any]) -> list[Any]:
    return [e["data"] for e in reply["events"] if e["type"] == "Message"]


def history(client: TestClient, bot: str, session: str) -> dict[str, Any]:
    return client.get(f"/bots/{bot}/sessions/{session}", headers=ANA).json()


def said_by_bot_since(client: TestClient, bot: str, session: str, turn: int) -> list[Any]:
    """The Message events of every turn after `turn` (the bot's and chatrun's; not the operator's)."""
    entries = history(client, bot, session)["history"][turn:]
    return [e["data"] for entry in entries for e in entry.get("events", [])
            if e["type"] == "Message" and (e.get("meta") or {}).get("from") != "operator"]


@pytest.fixture
def refunds(fake, tmp_path):
    fake.responder = responder
    (tmp_path / "auth.yaml").write_text(AUTH)
    with serve(ROOT / "bots" / "refunds", tmp_path / "s.db", tmp_path / "auth.yaml") as client:
        yield client, fake


def test_an_approval_timing_out_during_a_takeover_is_applied_on_release_and_the_bot_says_nothing_before(refunds):
    client, fake = refunds
    assert client.post("/bots/refunds/sessions", json={"id": "r1"}, headers=ANA).status_code == 201
    asked = client.post("/bots/refunds/sessions/r1/messages", json={"userMessage": "refund A1001 80"},
                        headers=ANA).json()
    assert [e["data"]["id"] for e in asked["events"] if e["type"] == "Pending"] == ["p1"]
    taken = client.post("/bots/refunds/sessions/r1/takeover", json={}, headers=OLGA)
    assert taken.status_code == 200, taken.text
    turns = len(history(client, "refunds", "r1")["history"])
    model_calls = len(fake.requests)

    assert sweep_at(client, datetime.now(UTC) + timedelta(minutes=31)) == 1  # the approval's 30m are over
    assert said_by_bot_since(client, "refunds", "r1", turns) == []  # the bot says nothing...
    assert len(fake.requests) == model_calls  # ...and its model did not run
    session = history(client, "refunds", "r1")
    assert session["state"]["refunded"] == 0  # decided (recorded), not applied yet
    pending = client.get("/bots/refunds/sessions/r1/pending", headers=OLGA).json()
    held = [i for i in pending["pending"] if i["kind"] == "approval"]
    assert held and held[0]["due"] is None  # held for the release: the sweeper finds nothing due
    assert sweep_at(client, datetime.now(UTC) + timedelta(minutes=62)) == 0
    # A supervisor may not decide it again meanwhile: the timeout decided it.
    again = client.post("/bots/refunds/sessions/r1/pending/p1", json={"decision": "approve"}, headers=SAM)
    assert again.status_code == 422 and "held" in again.json()["message"], again.text

    quiet = client.post("/bots/refunds/sessions/r1/messages", json={"userMessage": "hello?"}, headers=ANA).json()
    assert messages(quiet) == [] and len(fake.requests) == model_calls

    released = client.post("/bots/refunds/sessions/r1/release", json={}, headers=OLGA)
    assert released.status_code == 200, released.text
    events = released.json()["events"]
    assert [(e["data"]["id"], e["data"]["outcome"]) for e in events if e["type"] == "Resolved"] == [
        ("p2", "released"), ("p1", "timed_out")]
    said = [e["data"] for e in events if e["type"] == "Message"]
    assert said[0] == "olga left the conversation"  # the user reads who left, then what was held
    assert said[1].startswith("No supervisor answered in time, so we refunded 50 EUR on A1001")
    # The model runs now, after the release: it reads the refund's result and what the user said meanwhile.
    assert said[-1] == "Bot heard: hello?" and len(fake.requests) == model_calls + 1
    read = [(m["role"], m.get("content")) for m in fake.requests[-1]["messages"]]
    assert read[-3:] == [("tool", "Refunded 50 EUR on order A1001."), ("user", "hello?"),
                         ("system", "Refunded so far in this conversation: 50 EUR.")]  # the context, last
    assert history(client, "refunds", "r1")["state"]["refunded"] == 50


def test_a_supervisors_decision_during_a_takeover_waits_for_the_release(refunds):
    client, fake = refunds
    client.post("/bots/refunds/sessions", json={"id": "r2"}, headers=ANA)
    client.post("/bots/refunds/sessions/r2/messages", json={"userMessage": "refund A1002 80"}, headers=ANA)
    assert client.post("/bots/refunds/sessions/r2/takeover", json={}, headers=OLGA).status_code == 200
    model_calls = len(fake.requests)
    decided = client.post("/bots/refunds/sessions/r2/pending/p1", json={"decision": "approve", "args": {"amount": 70}},
                          headers=SAM)
    assert decided.status_code == 200, decided.text
    assert messages(decided.json()) == [] and len(fake.requests) == model_calls
    assert history(client, "refunds", "r2")["state"]["refunded"] == 0
    released = client.post("/bots/refunds/sessions/r2/release", json={}, headers=OLGA).json()
    resolved = [e["data"] for e in released["events"] if e["type"] == "Resolved"]
    assert [(r["id"], r["outcome"], r.get("by")) for r in resolved] == [
        ("p2", "released", "olga"), ("p1", "edited", "sam")]  # the supervisor decided it, not the operator
    assert messages(released)[-1] == "Bot: Refunded 70 EUR on order A1002."
    state = history(client, "refunds", "r2")["state"]
    assert state["refunded"] == 70 and state["last_refund"]["outcome"] == "edited"


HANDOVER = f"""\
name: desk
model: {{{OPENAI_MODEL}}}
env:
  TICKETS_URL: {{}}
routes:
  main: {{default: true, system: Help., tools: [human]}}
  billing: {{system: Billing questions.}}
tools:
  human:
    description: Hand over to a person
    parameters: {{type: object, properties: {{topic: {{type: string}}}}, required: [topic]}}
    action:
      operator:
        role: billing
        text: Connecting you with a colleague.
        timeout: 10m
        on_timeout:
          tool: open_ticket
          args: {{topic: "{{{{ args.topic }}}}", session: "{{{{ session_id }}}}"}}
          message: "Nobody is free right now: we opened a ticket about {{{{ args.topic }}}} and will write to you."
          route: billing
  open_ticket:
    description: Open a support ticket
    parameters: {{type: object, properties: {{topic: {{type: string}}, session: {{type: string}}}}, required: [topic]}}
    http: {{method: POST, url: "{{{{ env.TICKETS_URL }}}}/tickets", json: {{topic: "{{{{ args.topic }}}}", session: "{{{{ args.session }}}}"}}}}
canned: {{greeting: "Hello, this is a colleague from billing."}}
"""


@pytest.fixture
def desk(fake, tmp_path, monkeypatch):
    """(serve(): the handover bot on one SQLite file, the ticket receiver)."""
    fake.responder = responder
    (tmp_path / "auth.yaml").write_text(AUTH)
    (tmp_path / "bot.yaml").write_text(HANDOVER)
    with Receiver() as tickets:
        monkeypatch.setenv("TICKETS_URL", tickets.url)
        yield (lambda: serve(tmp_path / "bot.yaml", tmp_path / "s.db", tmp_path / "auth.yaml")), tickets


def hand_over(client: TestClient, session: str) -> None:
    assert client.post("/bots/desk/sessions", json={"id": session}, headers=ANA).status_code == 201
    reply = client.post(f"/bots/desk/sessions/{session}/messages", json={"userMessage": "human"}, headers=ANA).json()
    assert "Connecting you with a colleague." in messages(reply)


@pytest.mark.parametrize("restart", [False, True], ids=["same-server", "after-a-restart"])
def test_a_handover_nobody_takes_in_10_minutes_opens_a_ticket_and_tells_the_user(desk, restart):
    serve_desk, tickets = desk
    client = serve_desk().__enter__()
    try:
        hand_over(client, "h1")
        assert sweep_at(client, datetime.now(UTC) + timedelta(minutes=9)) == 0  # not due yet
        assert tickets.seen() == []
        if restart:  # the due time is the store's: a new server (another replica) sweeps it
            client.__exit__(None, None, None)
            client = serve_desk().__enter__()
        assert sweep_at(client, datetime.now(UTC) + timedelta(minutes=11)) == 1
        assert [d.body for d in tickets.seen()] == [{"topic": "billing", "session": "h1"}]
        assert sweep_at(client, datetime.now(UTC) + timedelta(minutes=30)) == 0  # once: nothing due any more
        session = history(client, "desk", "h1")
        last = session["history"][-1]["events"]
        assert [(e["data"]["kind"], e["data"]["outcome"]) for e in last if e["type"] == "Resolved"] == [
            ("takeover", "timed_out")]
        assert [e["data"] for e in last if e["type"] == "Message"] == [
            "Nobody is free right now: we opened a ticket about billing and will write to you."]
        assert session["route"] == "billing"
        assert client.get("/bots/desk/sessions/h1/pending", headers=ANA).json() == {"pending": [], "taken_over": None}
        # The bot has the conversation back: the next message is the model's to answer.
        back = client.post("/bots/desk/sessions/h1/messages", json={"userMessage": "ok"}, headers=ANA).json()
        assert messages(back) == ["Bot heard: ok"]
    finally:
        client.__exit__(None, None, None)


def test_a_handover_taken_in_time_opens_no_ticket(desk):
    serve_desk, tickets = desk
    with serve_desk() as client:
        hand_over(client, "h2")
        assert client.post("/bots/desk/sessions/h2/takeover", json={}, headers=BEA).status_code == 200
        assert sweep_at(client, datetime.now(UTC) + timedelta(minutes=11)) == 0  # taken: the SLA was met
        assert tickets.seen() == []
        assert history(client, "desk", "h2")["route"] == "main"


def test_an_operator_takes_over_a_session_that_never_waited(desk):
    serve_desk, _ = desk
    with serve_desk() as client:
        assert client.post("/bots/desk/sessions", json={"id": "n1"}, headers=ANA).status_code == 201
        first = client.post("/bots/desk/sessions/n1/messages", json={"userMessage": "hi"}, headers=ANA).json()
        assert messages(first) == ["Bot heard: hi"]
        # Neither an operator's role nor one the bot's `operator:` names: not found, as before.
        assert client.post("/bots/desk/sessions/n1/takeover", json={}, headers=EVE).status_code == 404
        taken = client.post("/bots/desk/sessions/n1/takeover", json={"note": "checking"}, headers=BEA)  # `billing`
        assert taken.status_code == 200, taken.text
        # `operators` may take it too, but bea holds it: refused, naming her (docs/operators.md).
        second = client.post("/bots/desk/sessions/n1/takeover", json={"note": "checking"}, headers=OLGA)
        assert second.status_code == 409 and "the operator bea holds" in second.json()["message"], second.text
        assert client.get("/bots/desk/sessions/n1/pending", headers=OLGA).json()["taken_over"]["by"]["name"] == "bea"
        quiet = client.post("/bots/desk/sessions/n1/messages", json={"userMessage": "hello?"}, headers=ANA).json()
        assert messages(quiet) == []  # the bot is silent: the message went to the operators
        said = client.post("/bots/desk/sessions/n1/operator/messages", json={"text": "Bea here."}, headers=BEA)
        assert said.status_code == 200, said.text
        assert client.post("/bots/desk/sessions/n1/release", json={}, headers=BEA).status_code == 200
        back = client.post("/bots/desk/sessions/n1/messages", json={"userMessage": "thanks"}, headers=ANA).json()
        assert messages(back) == ["Bot heard: thanks"]


def test_the_validator_checks_an_operator_timeout_where_it_is_written(tmp_path):
    from chatrun.definition.loader import check_bot

    bad = HANDOVER.replace("        timeout: 10m\n", "").replace("tool: open_ticket", "tool: open_tickt").replace(
        "route: billing\n  open_ticket", "route: bilings\n  open_ticket")
    (tmp_path / "bot.yaml").write_text(bad)
    _config, found = check_bot(tmp_path / "bot.yaml")
    errors = [(d.line, d.message) for d in found if d.severity == "error"]
    assert errors == [
        (16, "`operator.on_timeout` of tool `human` never applies: the handover has no `timeout` (e.g. `timeout: 10m`)"),
        (17, "`operator.on_timeout` of tool `human` calls unknown tool `open_tickt`; did you mean `open_ticket`?"),
        (20, "`route` of `operator.on_timeout` of tool `human` names unknown route `bilings`; did you mean `billing`?"),
    ], found
    (tmp_path / "bot.yaml").write_text(HANDOVER.replace('topic: "{{ args.topic }}", session', "session"))
    _config, found = check_bot(tmp_path / "bot.yaml")
    assert [d.message for d in found if d.severity == "warning" and "open_ticket" in d.message] == []  # it is used
    assert [(d.line, d.message) for d in found if d.severity == "error"] == [
        (19, "`operator.on_timeout` of tool `human` calls `open_ticket` without its required argument(s) topic "
             "(give them in `args:`)")]


# -- the same through a real `chatrun serve` process, its time moved by --clock-file -------------


class ServedProcess:
    """`chatrun serve BOT` on a SQLite file, its clock the instant in `clock` (a file the test
    writes: the sessions' `now` and timeouts and the sweeper's all read it), sweeping every 0.2 s."""

    def __init__(self, bot: Path, db: Path, auth: Path, clock: Path):
        import os
        import subprocess
        import sys

        from server_support import free_port

        for _attempt in range(5):  # another process (a second suite) may take the free port before it listens
            self.port = free_port()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "chatrun", "serve", str(bot), "--store", f"sqlite:///{db}", "--auth", str(auth),
                 "--port", str(self.port), "--clock-file", str(clock), "--sweep-interval", "0.2"],
                env={**os.environ, "PYTHONPATH": str(ROOT / "runner")}, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)
            self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
            if wait_until(self.ready, what="chatrun serve is ready") == "ready":
                return
            self.client.close()
        raise AssertionError("chatrun serve found no free port in 5 tries")

    def ready(self) -> str | None:
        """"ready", "port taken" (it exited: another process listens there), or None (not yet)."""
        if self.process.poll() is not None:
            output = self.process.communicate()[0]
            assert "Address already in use" in output, output
            return "port taken"
        try:
            return "ready" if self.client.get("/ready").status_code == 200 else None
        except httpx.TransportError:
            return None

    def stop(self) -> None:
        self.client.close()
        self.process.terminate()
        self.process.communicate(timeout=60)


def move_clock(clock: Path, by: timedelta) -> None:
    clock.write_text((datetime.now(UTC) + by).isoformat())


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_real_server_holds_an_approval_that_times_out_during_a_takeover_until_the_release(fake, tmp_path):
    fake.responder = responder
    (tmp_path / "auth.yaml").write_text(AUTH)
    clock = tmp_path / "clock"
    served = ServedProcess(ROOT / "bots" / "refunds", tmp_path / "s.db", tmp_path / "auth.yaml", clock)
    try:
        client = served.client
        assert client.post("/bots/refunds/sessions", json={"id": "r1"}, headers=ANA).status_code == 201
        asked = client.post("/bots/refunds/sessions/r1/messages", json={"userMessage": "refund A1001 80"},
                            headers=ANA).json()
        assert [e["data"]["id"] for e in asked["events"] if e["type"] == "Pending"] == ["p1"]
        assert client.post("/bots/refunds/sessions/r1/takeover", json={}, headers=OLGA).status_code == 200
        turns = len(client.get("/bots/refunds/sessions/r1", headers=ANA).json()["history"])
        model_calls = len(fake.requests)

        move_clock(clock, timedelta(minutes=31))  # the approval's 30 minutes are over: the server's sweeper decides

        def held() -> bool:
            items = client.get("/bots/refunds/sessions/r1/pending", headers=OLGA).json()["pending"]
            return any(i["kind"] == "approval" and i.get("held") for i in items)

        wait_until(held, what="the timed-out approval is held for the release")
        session = client.get("/bots/refunds/sessions/r1", headers=ANA).json()
        said = [e["data"] for entry in session["history"][turns:] for e in entry.get("events", [])
                if e["type"] == "Message" and (e.get("meta") or {}).get("from") != "operator"]
        assert said == [] and len(fake.requests) == model_calls  # the bot said nothing, its model did not run
        assert session["state"]["refunded"] == 0

        released = client.post("/bots/refunds/sessions/r1/release", json={}, headers=OLGA)
        assert released.status_code == 200, released.text
        said = messages(released.json())
        assert said[0] == "olga left the conversation"
        assert said[1].startswith("No supervisor answered in time, so we refunded 50 EUR")
        assert client.get("/bots/refunds/sessions/r1", headers=ANA).json()["state"]["refunded"] == 50
    finally:
        served.stop()


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_real_server_restarted_during_a_handover_opens_the_ticket_when_nobody_picked_up(fake, tmp_path, monkeypatch):
    fake.responder = responder
    (tmp_path / "auth.yaml").write_text(AUTH)
    (tmp_path / "bot.yaml").write_text(HANDOVER)
    clock = tmp_path / "clock"
    with Receiver() as tickets:
        monkeypatch.setenv("TICKETS_URL", tickets.url)
        first = ServedProcess(tmp_path / "bot.yaml", tmp_path / "s.db", tmp_path / "auth.yaml", clock)
        try:
            assert first.client.post("/bots/desk/sessions", json={"id": "h1"}, headers=ANA).status_code == 201
            reply = first.client.post("/bots/desk/sessions/h1/messages", json={"userMessage": "human"},
                                      headers=ANA).json()
            assert "Connecting you with a colleague." in messages(reply)
        finally:
            first.stop()  # the server goes away while the handover waits
        move_clock(clock, timedelta(minutes=11))
        second = ServedProcess(tmp_path / "bot.yaml", tmp_path / "s.db", tmp_path / "auth.yaml", clock)
        try:
            seen = wait_until(tickets.seen, what="the ticket is opened")
            assert [d.body for d in seen] == [{"topic": "billing", "session": "h1"}]
            session = second.client.get("/bots/desk/sessions/h1", headers=ANA).json()
            assert session["route"] == "billing"
            assert [e["data"] for e in session["history"][-1]["events"] if e["type"] == "Message"] == [
                "Nobody is free right now: we opened a ticket about billing and will write to you."]
        finally:
            second.stop()
        assert len(tickets.seen()) == 1  # once


def test_a_role_that_may_take_over_reads_the_canned_replies_and_types_as_the_operator(desk):
    """docs/operators.md: takeover, messages and release need `operators` or the role an
    `operator:` action names; so do the canned replies and typing as the operator, which the
    operator page calls for whoever holds the conversation (bea has only `billing`)."""
    serve_desk, _ = desk
    with serve_desk() as client:
        hand_over(client, "c1")
        assert client.post("/bots/desk/sessions/c1/takeover", json={}, headers=BEA).status_code == 200
        canned = client.get("/bots/desk/sessions/c1/canned", headers=BEA)
        assert canned.status_code == 200, canned.text
        assert canned.json()["canned"] == [{"name": "greeting", "text": "Hello, this is a colleague from billing."}]
        typing = client.post("/bots/desk/sessions/c1/typing", json={"typing": True, "as": "operator"}, headers=BEA)
        assert typing.status_code == 200, typing.text
        assert client.get("/bots/desk/sessions/c1/typing", headers=ANA).json()["operator"] == "bea"
        # A principal with neither role still may not.
        assert client.get("/bots/desk/sessions/c1/canned", headers=EVE).status_code in (403, 404)
