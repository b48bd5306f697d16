"""Feedback on a bot's reply (issue 35): thumbs up/down with an optional comment, over HTTP
(POST .../feedback) and the WebSocket (a Feedback frame); kept in the session's history beside
the turn, counted in /metrics, delivered to the bot's sink as a backend `Feedback` event. A real
app (its lifespan runs the delivery worker), the real openai client against the fake server, a
real local webhook receiver, on SQLite and on a real Redis."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from server_support import app_for_testclient, until_done, wait_until
from webhook_support import OPENAI_MODEL, SECRET, Receiver, survey_bot, survey_responder


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=[pytest.mark.slow, pytest.mark.subprocess])])
def served(request, tmp_path, fake, receiver, monkeypatch):
    monkeypatch.setenv("HOOK_URL", receiver.url)
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    fake.responder = survey_responder
    bot = tmp_path / "bot.yaml"
    bot.write_text(survey_bot(OPENAI_MODEL))
    store = f"sqlite:///{tmp_path / 's.db'}" if request.param == "sqlite" else \
        request.getfixturevalue("redis_server").url()
    with TestClient(app_for_testclient([str(bot)], store)) as client:
        yield client


def test_a_rating_is_kept_with_its_turn_counted_and_sent_to_the_sink(served, receiver):
    client = served
    client.post("/bots/survey/sessions", json={"id": "s1"})
    assert client.post("/bots/survey/sessions/s1/messages", json={"userMessage": "3"}).json()["ok"] is True

    reply = client.post("/bots/survey/sessions/s1/feedback", json={"turn": 1, "rating": "down", "comment": "Too slow"})
    assert reply.status_code == 201, reply.text
    assert reply.json() == {"turn": 1, "rating": "down", "route": "main", "comment": "Too slow"}
    with client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": "s1", "resume": True, "extensions": True})
        until_done(ws)
        ws.send_json({"type": "Feedback", "chatId": "s1", "turn": 1, "rating": "up", "requestId": "f1"})
        assert [(f["type"], f["data"]) for f in until_done(ws)] == [("Completed", None)]

    # Kept in the history beside the turn (a rating is no turn: the session is still at turn 1).
    session = client.get("/bots/survey/sessions/s1").json()
    assert session["turn"] == 1
    assert [e.get("feedback", {}).get("rating") for e in session["history"]] == [None, "down", "up"]
    # Counted, by bot, route and rating.
    metrics = client.get("/metrics").text
    assert 'chatrun_feedback_total{bot="survey",rating="down",route="main"} 1.0' in metrics
    assert 'chatrun_feedback_total{bot="survey",rating="up",route="main"} 1.0' in metrics
    # Sent to the sink, signed, as the turn's own backend events are.
    got = receiver.wait_for(lambda seen: len([d for d in seen if d.body["type"] == "Feedback"]) >= 2,
                            what="two Feedback deliveries")
    ratings = sorted((d.body["data"]["rating"], d.body["turn"]) for d in got if d.body["type"] == "Feedback")
    assert ratings == [("down", 1), ("up", 1)]
    assert all(d.signed_with(SECRET) and d.body["session"] == "s1" for d in got)
    wait_until(lambda: client.get("/outbox").json()["entries"] == [], what="the outbox emptied")


def test_a_rating_sent_again_is_kept_counted_and_sent_once(served, receiver):
    """A double click, a request retried after its answer was lost: the same rating (and comment)
    of the same reply as its newest one is that rating again. Not kept, counted or sent again;
    a changed rating is (docs/protocol.md, "Feedback on a reply")."""
    client = served
    client.post("/bots/survey/sessions", json={"id": "s3"})
    assert client.post("/bots/survey/sessions/s3/messages", json={"userMessage": "3"}).json()["ok"] is True
    sent = [("up", None), ("up", None), ("down", "Slow"), ("down", "Slow"), ("up", "last")]
    for rating, comment in sent:
        body = {"turn": 1, "rating": rating, **({"comment": comment} if comment else {})}
        reply = client.post("/bots/survey/sessions/s3/feedback", json=body)
        assert reply.status_code == 201 and reply.json()["rating"] == rating, reply.text
    history = client.get("/bots/survey/sessions/s3").json()["history"]
    assert [e["feedback"]["rating"] for e in history if "feedback" in e] == ["up", "down", "up"]
    metrics = client.get("/metrics").text
    assert 'chatrun_feedback_total{bot="survey",rating="up",route="main"} 2.0' in metrics
    assert 'chatrun_feedback_total{bot="survey",rating="down",route="main"} 1.0' in metrics
    got = receiver.wait_for(lambda seen: any(d.body["type"] == "Feedback" and d.body["data"].get("comment") == "last"
                                             for d in seen), what="the last Feedback delivered")
    assert [d.body["data"]["rating"] for d in got if d.body["type"] == "Feedback"] == ["up", "down", "up"]


def test_a_rating_of_a_turn_that_did_not_run_or_without_a_rating_is_refused(served):
    client = served
    client.post("/bots/survey/sessions", json={"id": "s2"})
    refused = client.post("/bots/survey/sessions/s2/feedback", json={"turn": 1, "rating": "up"})
    assert refused.status_code == 400 and "has no turn 1 to rate" in refused.json()["message"]
    assert "no turn has run yet" in refused.json()["message"]  # not "its turns are 1 to 0"
    bad = client.post("/bots/survey/sessions/s2/feedback", json={"turn": 1, "rating": "meh"})
    assert bad.status_code == 400 and 'rating must be "up" or "down"' in bad.json()["message"]
    with client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": "s2", "resume": True, "extensions": True})
        until_done(ws)
        ws.send_json({"type": "Feedback", "chatId": "s2", "turn": 0, "rating": "up"})
        frames = until_done(ws)
        assert frames[-1]["data"] == "BadRequest" and "Feedback.turn must be" in frames[0]["data"]
    assert client.get("/bots/survey/sessions/s2").json()["history"] == []


DESK_BOT = f"""\
name: desk
model: {{{OPENAI_MODEL}}}
routes:
  main: {{default: true, system: Greet., tools: [to_desk]}}
  desk: {{system: Help.}}
tools:
  to_desk:
    action: {{route: desk, message: "The desk will help.", immediate: true}}
"""


def desk_responder(body: dict) -> dict:
    """The fake model: "desk" moves the conversation to the desk route; anything else is greeted."""
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    if user == "desk" and body["messages"][-1]["role"] == "user":
        return {"tool_calls": [{"name": "to_desk", "arguments": {}}]}
    return {"text": "Hello."}


def test_a_rating_records_the_route_its_turn_ran_on_not_the_one_the_session_moved_to(tmp_path, fake):
    """Turn 1 ran on `main`; turn 2 moved the conversation to `desk`. A rating of turn 1 given
    afterwards says `main` (it said `desk`, where the session was when rated), in the reply, the
    history, the metric and the sink's event alike; a rating of turn 2 says `desk`."""
    fake.responder = desk_responder
    bot = tmp_path / "bot.yaml"
    bot.write_text(DESK_BOT)
    with TestClient(app_for_testclient([str(bot)], f"sqlite:///{tmp_path / 's.db'}")) as client:
        client.post("/bots/desk/sessions", json={"id": "s1"})
        for text in ("hi", "desk"):
            assert client.post("/bots/desk/sessions/s1/messages", json={"userMessage": text}).json()["ok"] is True
        assert client.get("/bots/desk/sessions/s1").json()["route"] == "desk"

        first = client.post("/bots/desk/sessions/s1/feedback", json={"turn": 1, "rating": "down"})
        assert first.status_code == 201, first.text
        assert first.json() == {"turn": 1, "rating": "down", "route": "main"}
        second = client.post("/bots/desk/sessions/s1/feedback", json={"turn": 2, "rating": "up"})
        assert second.json() == {"turn": 2, "rating": "up", "route": "desk"}

        history = client.get("/bots/desk/sessions/s1").json()["history"]
        assert [e["feedback"]["route"] for e in history if "feedback" in e] == ["main", "desk"]
        metrics = client.get("/metrics").text
        assert 'chatrun_feedback_total{bot="desk",rating="down",route="main"} 1.0' in metrics
        assert 'chatrun_feedback_total{bot="desk",rating="up",route="desk"} 1.0' in metrics
