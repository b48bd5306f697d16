"""The turn log line and the turn metrics on the paths tests/test_observability.py does not take:
a turn stopped by its reader (its line and its version's cost carry what its calls used, as its
history entry does), and `--log-content` on a decision turn (a backend's answer: the input as
the history keeps it, never the item's token). Real servers, the real openai client against the
fake OpenAI server, a real SQLite store."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.server.turnlog import JsonFormatter
from chatrun.store.sqlite import SQLiteStore
from server_support import ThreadServer, app_for_testclient, call, wait_until, write_travel
from test_observability import delta, metrics
from test_pending_flows import ANA, AUTH, BOT, responder

pytest.importorskip("prometheus_client", reason="prometheus-client is not installed (pip install 'chatrun[metrics]')")


def turn_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "chatrun.turns"]


def test_a_backends_answer_is_logged_as_the_history_keeps_it_without_its_token(fake, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="chatrun.turns")
    monkeypatch.setenv("REFUND_URL", "http://127.0.0.1:9")  # the refund tool is not called here
    fake.responder = responder
    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "auth.yaml").write_text(AUTH)
    db = tmp_path / "s.db"
    app = app_for_testclient([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{db}",
                             auth=str(tmp_path / "auth.yaml"), log_content=True)
    with TestClient(app) as client:
        assert client.post("/bots/desk/sessions", json={"id": "b1"}, headers=ANA).status_code == 201
        client.post("/bots/desk/sessions/b1/messages", json={"userMessage": "documents"}, headers=ANA)
        with SQLiteStore(db) as store:
            token = store.read_session("b1").pending[0]["token"]
        answered = client.post("/bots/desk/sessions/b1/pending/p1", json={"answer": {"verdict": "approved"}},
                               headers={"Authorization": f"Bearer {token}"})
        assert answered.status_code == 200, answered.text
        kept = client.get("/bots/desk/sessions/b1", headers=ANA).json()["history"][-1]["input"]
    asked, answer = turn_lines(caplog)
    assert asked.chatrun["input"] == "documents"
    assert answer.chatrun["outcome"] == "ok" and answer.chatrun["resolved"] == "p1:answered"
    assert answer.chatrun["input"] == kept == {"decision": {"kind": "answer", "item": "p1",
                                                            "value": {"verdict": "approved"}}}
    for line in (answer.getMessage(), JsonFormatter().format(answer)):
        assert '"verdict": "approved"' in line and token not in line


@pytest.mark.slow
def test_a_stopped_turn_logs_and_counts_the_calls_it_paid_for(fake, tmp_path, caplog):
    """A reader closes the event stream while the model's second answer stalls: the first call
    was made and paid for. The stopped turn's line has its number and usage, as its history
    entry does, and its cost is in its version's cost as in the calls' (chatrun_cost_total)."""
    caplog.set_level(logging.INFO, logger="chatrun.turns")
    path = write_travel(tmp_path / "bot")
    path.write_text(path.read_text() + "prices:\n  gpt-4o-mini: {input: 1.0, output: 2.0}\n")
    with ThreadServer(create_app_sqlite(path, tmp_path)) as server:
        httpx.post(f"{server.url}/bots/travel/sessions", json={"id": "s1"}).raise_for_status()
        before = metrics(server)
        fake.queue(call("remember_name", name="Ana") | {"usage": {"prompt_tokens": 1000, "completion_tokens": 500}},
                   {"chunks": ["Let me ", "think"], "stall": True})
        with httpx.Client(timeout=30) as http, http.stream(
                "POST", f"{server.url}/bots/travel/sessions/s1/messages?stream=true",
                json={"userMessage": "I am Ana"}) as response:
            for line in response.iter_lines():
                if line == "event: Stream":
                    break  # the reply started: the reader goes
        [line] = wait_until(lambda: turn_lines(caplog) or None, 30, "the stopped turn's log line")
        [entry] = httpx.get(f"{server.url}/bots/travel/sessions/s1").json()["history"]
        after = metrics(server)
    assert entry["error"] == "cancelled" and entry["usage"]["cost"] == pytest.approx(0.002)
    fields = line.chatrun
    assert fields["outcome"] == "cancelled" and fields["turn"] == 1
    assert (fields["input_tokens"], fields["output_tokens"], fields["calls"]) == (1000, 500, 1)
    assert fields["cost"] == pytest.approx(0.002)
    assert "turn=1 " in line.getMessage() and "input_tokens=1000" in line.getMessage()
    paid = delta(before, after, "chatrun_cost_total", bot="travel")
    assert paid == pytest.approx(0.002)
    assert delta(before, after, "chatrun_version_cost_total", bot="travel") == pytest.approx(paid)
    assert delta(before, after, "chatrun_version_turns_total", bot="travel", outcome="cancelled") == 1


def create_app_sqlite(path, tmp_path):
    from chatrun.server import create_app

    return create_app([chatrun.load_bot(path)], f"sqlite:///{tmp_path / 'c.db'}")
