"""A store's error text goes through the bot's `storage` guardrails (docs/guardrails.md): a
failed commit is logged and its reason answered to the client, and PostgreSQL's error quotes the
row written (`DETAIL: Failing row contains (...)`). A real PostgreSQL, started by the test.
(Redis's errors on a commit name the script's line, not the values: no Redis error of that path
quotes one, so there is none to provoke.)"""

from __future__ import annotations

import logging

from starlette.testclient import TestClient

from chatrun.server.auth import Auth
from server_support import app_for_testclient

BOT = """
name: careful
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
guardrails:
  - {name: pii, pii: [card, email], stages: [storage], outcome: redact}
routes:
  main: {default: true, system: You help.}
"""
ANN = "ann@example.com"  # a principal named by their address, as many sign-ins name them
HEADERS = {"Authorization": "Bearer token-ann-123"}


def chatrun_log(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("chatrun"))


def test_a_postgresql_error_quoting_the_row_written_is_redacted_in_the_log_and_the_answer(
        fake, write_bot, postgres_server, caplog):
    """A CHECK constraint the database's owner added refuses the sessions row: PostgreSQL's error
    quotes the row (`Failing row contains (..., ann@example.com, ...)`), and the failed commit's
    log line and the client's 500 said it as it was."""
    import psycopg

    url = postgres_server.url()
    auth = Auth.from_mapping({"tokens": {"token-ann-123": {"principal": ANN}}})
    app = app_for_testclient([str(write_bot(BOT))], url, auth=auth)
    caplog.set_level(logging.INFO)
    fake.queue({"text": "Hello."}, {"text": "Again."})
    with TestClient(app) as client:
        assert client.post("/bots/careful/sessions", json={"id": "s1"}, headers=HEADERS).status_code == 201
        said = client.post("/bots/careful/sessions/s1/messages", json={"userMessage": "hello"}, headers=HEADERS)
        assert said.status_code == 200, said.text
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE sessions ADD CONSTRAINT owner_is_no_address CHECK (owner NOT LIKE '%@%') "
                         "NOT VALID")
        refused = client.post("/bots/careful/sessions/s1/messages", json={"userMessage": "again"}, headers=HEADERS)
    assert refused.status_code == 500
    assert "Failing row contains" in refused.text and "[email]" in refused.text and ANN not in refused.text
    logged = chatrun_log(caplog)
    assert "commit of session s1 failed" in logged and "Failing row contains" in logged
    assert "[email]" in logged and ANN not in logged
