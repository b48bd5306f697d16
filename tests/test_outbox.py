"""Issue 24: backend events reach the bot's webhook through an outbox committed with the turn.
A real server app (its lifespan runs the delivery worker), the real openai client against the
fake OpenAI server, a real SQLite store and a real local webhook receiver that checks the
documented signature. The kill -9 and multi-replica tests are in test_outbox_delivery.py."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from chatrun.store import open_store
from chatrun.store.record import DEAD, PENDING, Commit
from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL, RETRY, SECRET, Receiver, survey_bot, survey_responder


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture
def served(request, tmp_path, fake, receiver, monkeypatch):
    """The survey bot served on SQLite, its webhook pointed at the receiver (parametrize
    indirectly with a `retry:` policy to change it)."""
    monkeypatch.setenv("HOOK_URL", receiver.url)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    fake.responder = survey_responder
    bot = tmp_path / "bot.yaml"
    bot.write_text(survey_bot(OPENAI_MODEL, getattr(request, "param", RETRY)))
    with TestClient(app_for_testclient([str(bot)], f"sqlite:///{tmp_path / 's.db'}")) as client:
        yield client


def turn(client, text, session="s1"):
    return client.post(f"/bots/survey/sessions/{session}/messages", json={"userMessage": text}).json()



def outbox(client, state=None):
    return client.get("/outbox", params={"state": state} if state else {}).json()["entries"]


def test_the_webhook_gets_exactly_the_backend_events_of_committed_turns_signed(served, receiver):
    client = served
    client.post("/bots/survey/sessions", json={"id": "s1"})
    assert turn(client, "3")["ok"] is True
    assert turn(client, "fail 2")["ok"] is False  # emitted Detractor(2), then the model failed: rolled back
    assert turn(client, "9")["ok"] is True
    wait_until(lambda: len(receiver.accepted()) >= 2, what="two deliveries")
    wait_until(lambda: outbox(client) == [], what="the outbox emptied")
    got = receiver.accepted()
    assert [d.body["data"] for d in got] == [3, 9]  # never the rolled-back 2, never the user's Thanks
    assert all(d.signed_with(SECRET) for d in got)
    assert not got[0].signed_with("another secret")
    first = got[0]
    assert first.body["type"] == "Detractor" and first.body["session"] == "s1" and first.body["bot"] == "survey"
    assert first.body["turn"] == 1 and got[1].body["turn"] == 2  # the failed attempt at turn 2 counted no turn
    assert first.headers["chatrun-event-id"] == first.headers["idempotency-key"] == first.body["id"]
    assert first.headers["chatrun-event-type"] == "Detractor" and first.headers["chatrun-attempt"] == "1"
    assert abs(int(first.headers["chatrun-timestamp"]) - time.time()) < 600
    assert len({d.body["id"] for d in got}) == 2
    history = client.get("/bots/survey/sessions/s1").json()["history"]
    assert [e["ok"] for e in history] == [True, False, True]
    assert all("outbox" not in e for e in history)  # the deliveries (with the event data) are the outbox's


@pytest.mark.parametrize("served", ["attempts: 3, backoff: 0.1"], indirect=True)
def test_a_failing_receiver_makes_a_dead_letter_that_can_be_retried(served, receiver, tmp_path):
    client = served
    receiver.status = 503
    client.post("/bots/survey/sessions", json={"id": "s2"})
    assert turn(client, "4", "s2")["ok"] is True
    dead = wait_until(lambda: outbox(client, DEAD), timeout=90, what="a dead letter")
    assert dead[0]["attempts"] == 3 and dead[0]["state"] == DEAD
    assert "answered 503" in dead[0]["error"] and dead[0]["body"]["data"] == 4
    assert outbox(client, PENDING) == []
    assert len({d.body["id"] for d in receiver.seen()}) == 1  # every attempt carried the same key
    attempts = [int(d.headers["chatrun-attempt"]) for d in receiver.seen()]
    assert attempts == list(range(1, len(attempts) + 1))
    receiver.status = 200
    retried = client.post(f"/outbox/{dead[0]['id']}/retry")
    assert retried.status_code == 200 and retried.json()["state"] == PENDING
    wait_until(lambda: receiver.accepted(), what="the retried delivery")
    wait_until(lambda: outbox(client) == [], what="the outbox emptied")
    assert receiver.accepted()[0].body["id"] == dead[0]["id"]
    again = client.post(f"/outbox/{dead[0]['id']}/retry")
    assert again.status_code == 404 and again.json()["error"] == "NotFound"
    assert client.get("/outbox", params={"state": "stuck"}).status_code == 400
    metrics = client.get("/metrics").text
    assert 'chatrun_outbox_deliveries_total{bot="survey",outcome="dead",sink="crm"} 1.0' in metrics
    assert 'chatrun_outbox_deliveries_total{bot="survey",outcome="delivered",sink="crm"} 1.0' in metrics
    assert 'chatrun_outbox_deliveries_total{bot="survey",outcome="retry",sink="crm"} 2.0' in metrics


B_CRM = ["b/crm"]  # the route (bot b, sink crm) of the entries below


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_every_store_keeps_the_outbox_of_committed_turns_only_and_hands_each_entry_to_one_claim(url, tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'o.db'}" if url == "sqlite" else url)
    body = {"id": "evt_1", "type": "T", "data": 1, "turn": 1, "session": "s", "bot": "b", "created": 100.0}
    ok = {"turn": 1, "ok": True, "outbox": [{"sink": "crm", "body": body}]}
    failed = {"turn": 2, "ok": False, "outbox": [{"sink": "crm", "body": body | {"id": "evt_2"}}]}
    store.commit_turn("s", {"id": "s"}, {}, [ok, failed])
    assert [e.id for e in store.list_outbox()] == ["evt_1"]
    first = store.claim_outbox(now=200.0, lease=30, limit=10, routes=B_CRM)
    assert [e.id for e in first] == ["evt_1"] and store.claim_outbox(now=210.0, lease=30, limit=10, routes=B_CRM) == []
    second = store.claim_outbox(now=231.0, lease=30, limit=10, routes=B_CRM)  # the first claim ran out: taken over
    assert [e.id for e in second] == ["evt_1"] and second[0].claim != first[0].claim
    assert store.settle_outbox(first[0], delivered=True) is False  # the old claim settles nothing
    second[0].attempts, second[0].state, second[0].error = 1, DEAD, "answered 500"
    assert store.settle_outbox(second[0], delivered=False) is True
    assert store.claim_outbox(now=1e12, lease=30, limit=10, routes=B_CRM) == []  # a dead letter is never claimed
    assert [e.error for e in store.list_outbox(DEAD)] == ["answered 500"]
    assert store.requeue_outbox("evt_1", now=300.0) and not store.requeue_outbox("evt_1", now=300.0)
    third = store.claim_outbox(now=300.0, lease=30, limit=10, routes=B_CRM)
    assert third[0].attempts == 0 and store.settle_outbox(third[0], delivered=True)
    assert store.list_outbox() == []
    store.close()


def test_a_commit_that_cannot_land_queues_nothing(tmp_path):
    from chatrun.store.versions import StaleVersion

    store = open_store(f"sqlite:///{tmp_path / 'o.db'}")
    body = {"id": "evt_1", "type": "T", "data": 1, "turn": 1, "session": "s", "bot": "b", "created": 1.0}
    store.commit_turn("s", {"id": "s"}, {}, [])
    commit = Commit.encode("s", {"id": "s"}, {}, [{"turn": 1, "ok": True, "outbox": [{"sink": "k", "body": body}]}],
                           expected="0.stale")
    with pytest.raises(StaleVersion):
        store.write_commit(commit)
    assert store.list_outbox() == []


def test_with_auth_on_only_principals_with_the_outbox_role_see_the_outbox(tmp_path, fake):
    from chatrun.server.auth import Auth, Principal

    bot = tmp_path / "bot.yaml"
    bot.write_text(survey_bot(OPENAI_MODEL))
    auth = Auth({"t-ana": Principal("ana"), "t-ops": Principal("ops", frozenset({"outbox"}))})
    with TestClient(app_for_testclient([str(bot)], "memory://", auth=auth)) as client:
        assert client.get("/outbox").status_code == 401
        refused = client.get("/outbox", headers={"Authorization": "Bearer t-ana"})
        assert refused.status_code == 403 and "role `outbox`" in refused.json()["message"]
        assert client.post("/outbox/x/retry", headers={"Authorization": "Bearer t-ana"}).status_code == 403
        assert client.get("/outbox", headers={"Authorization": "Bearer t-ops"}).json() == {"entries": []}


def test_a_library_session_returns_backend_events_and_queues_them_in_its_store(tmp_path, monkeypatch):
    import chatrun
    from chat_support import call
    from chatrun.models.scripted import ScriptedModel

    bot_file = tmp_path / "bot.yaml"
    bot_file.write_text(survey_bot("provider: scripted"))
    monkeypatch.setenv("HOOK_URL", "http://127.0.0.1:9")
    store = open_store(f"sqlite:///{tmp_path / 'lib.db'}")
    session = chatrun.load_bot(bot_file).session(store=store, model=ScriptedModel([call("score", n=5), "Thanks."]))
    events = session.chat("5")
    backend = [e for e in events if e.audience == "backend"]
    assert [(e.type, e.data) for e in backend] == [("Detractor", 5)]
    queued = session.last_turn["outbox"]
    assert [(q["sink"], q["body"]["data"]) for q in queued] == [("crm", 5)]
    assert [e.id for e in store.list_outbox(PENDING)] == [queued[0]["body"]["id"]]
    assert "outbox" not in store.load_history(session.id)[-1]


def test_a_webhook_whose_secret_is_unset_sends_nothing_and_names_the_variable(tmp_path, receiver, monkeypatch):
    import asyncio

    import chatrun
    from chatrun.server.webhook import WebhookSender

    bot_file = tmp_path / "bot.yaml"
    bot_file.write_text(survey_bot("provider: scripted"))
    monkeypatch.setenv("HOOK_URL", receiver.url)
    monkeypatch.delenv("HOOK_SECRET", raising=False)
    config = chatrun.load_bot(bot_file).config
    body = {"id": "evt_1", "type": "Detractor", "data": 1, "turn": 1, "session": "s", "bot": "survey", "created": 1.0}

    async def attempt():
        sender = WebhookSender()
        try:
            return await sender.send(config, config.sinks["crm"].webhook, body, 1)
        finally:
            await sender.aclose()

    failed = asyncio.run(attempt())
    assert not failed.delivered and "`env.HOOK_SECRET` is not set" in failed.error
    assert receiver.seen() == []
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    assert asyncio.run(attempt()).delivered and receiver.seen()[0].signed_with(SECRET)


@pytest.mark.parametrize("served", ["attempts: 5, backoff: 0.1"], indirect=True)
def test_each_delivery_attempt_is_a_span(spans, served, receiver):
    receiver.status = 500
    served.post("/bots/survey/sessions", json={"id": "t1"})
    assert turn(served, "1", "t1")["ok"] is True
    receiver.wait_for(lambda seen: len(seen) >= 1, what="a failed attempt")
    receiver.status = 200
    receiver.wait_for(lambda seen: any(d.status == 200 for d in seen), what="the delivery")
    wait_until(lambda: outbox(served) == [], what="the outbox emptied")

    def delivery_spans():
        return [s for s in spans.get_finished_spans() if s.name == "deliver crm"]

    found = wait_until(lambda: len(delivery_spans()) >= 2 and delivery_spans(), what="the spans")
    first, last = found[0], found[-1]
    assert first.attributes["chatrun.event.type"] == "Detractor" and first.attributes["chatrun.attempt"] == 1
    assert first.attributes["chatrun.event.id"] == last.attributes["chatrun.event.id"]
    assert first.status.status_code.name == "ERROR" and first.attributes["error.type"] == "delivery_failed"
    assert last.status.status_code.name == "UNSET" and "error.type" not in last.attributes


@pytest.mark.parametrize("url, header", [("http://[::1", ""), ("http://127.0.0.1:9", "Bearer é")],
                         ids=["invalid-url", "non-ascii-header"])
def test_a_webhook_request_that_cannot_be_made_is_a_failed_attempt_naming_it_then_a_dead_letter(
        url, header, tmp_path, fake, monkeypatch):
    """An env value that makes the URL or a header unusable (httpx refuses before sending) fails
    the attempt with a reason, as an unreachable receiver does: never a worker error that leaves
    the entry claimed and retried without end."""
    monkeypatch.setenv("HOOK_URL", url)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("HOOK_AUTH", header)
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    fake.responder = survey_responder
    bot = tmp_path / "bot.yaml"
    text = survey_bot(OPENAI_MODEL, "attempts: 2, backoff: 0.1, max_backoff: 0.2", timeout=1)
    text = text.replace("  HOOK_SECRET: {secret: true}", "  HOOK_SECRET: {secret: true}\n  HOOK_AUTH: {secret: true}")
    text = text.replace("timeout: 1}", "timeout: 1, headers: {Authorization: \"{{ env.HOOK_AUTH }}\"}}")
    bot.write_text(text)
    with TestClient(app_for_testclient([str(bot)], f"sqlite:///{tmp_path / 's.db'}")) as client:
        client.post("/bots/survey/sessions", json={"id": "s1"})
        assert turn(client, "3")["ok"] is True
        dead = wait_until(lambda: outbox(client, DEAD), what="the dead letter")
    assert dead[0]["attempts"] == 2 and "the request cannot be made" in dead[0]["error"]
    assert "é" not in dead[0]["error"] and "xe9" not in dead[0]["error"]  # a header's value is never shown
