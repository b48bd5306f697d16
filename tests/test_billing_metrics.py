"""What `/metrics` counts of the paid calls of attempts that never committed (server/metrics.py
`unfinished_counted`; docs/observability.md, "What a killed server's attempt used"): counted by
the process whose commit takes them up, once that commit has landed. tests/test_billing_killed.py
kills real servers; here the dead attempt's record is written as a killed server leaves it, and
the first attempt that takes it up has its commit refused (another writer changed the session)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from starlette.testclient import TestClient

from chatrun.store.aio import open_existing_store
from server_support import app_for_testclient

parser = pytest.importorskip("prometheus_client.parser", reason="the metrics need chatrun[metrics]")

BOT = """\
name: desk
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
prices:
  gpt-4o-mini: {input: 1.0, output: 2.0}
routes:
  main: {default: true, system: Answer briefly.}
"""
DEAD = {"input_tokens": 100, "output_tokens": 10, "calls": 1, "cost": 0.00012,
        "by_call": [{"route": "main", "model": "gpt-4o-mini", "input_tokens": 100, "output_tokens": 10,
                     "cost": 0.00012}]}
MODEL = (("bot", "desk"), ("gen_ai_request_model", "gpt-4o-mini"))


def unfinished(client: TestClient) -> tuple[float, float, float, float]:
    """The unfinished counters of /metrics: (attempts, input tokens, output tokens, cost); 0 for none."""
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in parser.text_string_to_metric_families(client.get("/metrics").text)
               for s in family.samples}
    return (samples.get(("chatrun_unfinished_attempts_total", (("bot", "desk"),)), 0),
            samples.get(("chatrun_unfinished_tokens_total", (*MODEL, ("gen_ai_token_type", "input"))), 0),
            samples.get(("chatrun_unfinished_tokens_total", (*MODEL, ("gen_ai_token_type", "output"))), 0),
            samples.get(("chatrun_unfinished_cost_total", MODEL), 0))


def test_a_refused_commit_counts_nothing_and_the_commit_that_lands_counts_each_attempt_once(fake, tmp_path):
    (tmp_path / "bot.yaml").write_text(BOT)
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    with TestClient(app_for_testclient(str(tmp_path / "bot.yaml"), url)) as client:
        assert client.post("/bots/desk/sessions", json={"id": "s"}).status_code == 201
    asyncio.run(_a_dead_attempt(url, "s"))
    changed: list[bool] = []

    def answer(body: dict) -> dict:
        if not changed:  # another writer commits the session while the first attempt's model call runs
            with sqlite3.connect(db) as other:
                other.execute("UPDATE sessions SET version = 'elsewhere' WHERE session_id = 's'")
            changed.append(True)
        return {"text": "Hi.", "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}

    fake.responder = answer
    # A new process on the store (the killed one's successor), with /metrics.
    with TestClient(app_for_testclient(str(tmp_path / "bot.yaml"), url)) as client:
        refused = client.post("/bots/desk/sessions/s/messages", json={"userMessage": "hello"})
        assert refused.status_code == 409, refused.text
        assert unfinished(client) == (0, 0, 0, 0)  # the refused commit counted nothing
        for text in ("hello", "and again"):  # the retry lands; the next turn counts nothing again
            said = client.post("/bots/desk/sessions/s/messages", json={"userMessage": text})
            assert said.status_code == 200 and said.json()["ok"], said.text
        counted = unfinished(client)
        usage = client.get("/bots/desk/sessions/s").json()["usage"]
    # The dead attempt and the refused one (its call was paid; nothing of it was stored), each
    # once, as the session's usage counts them.
    assert counted[:3] == (2, 100 + 20, 10 + 5)
    assert counted[3] == pytest.approx(0.00012 + (20 + 5 * 2) / 1e6)
    assert (usage["input_tokens"], usage["output_tokens"], usage["calls"]) == (100 + 20 * 3, 10 + 5 * 3, 4)


def test_a_session_in_memory_counts_no_unfinished_attempt(fake, tmp_path):
    """memory:// keeps no usage record (tests/test_billing_records.py): nothing to take up, nothing counted."""
    (tmp_path / "bot.yaml").write_text(BOT)
    fake.responder = lambda body: {"text": "Hi.", "usage": {"prompt_tokens": 20, "completion_tokens": 5,
                                                            "total_tokens": 25}}
    with TestClient(app_for_testclient(str(tmp_path / "bot.yaml"), "memory://")) as client:
        assert client.post("/bots/desk/sessions", json={"id": "s"}).status_code == 201
        for text in ("hello", "again"):
            assert client.post("/bots/desk/sessions/s/messages", json={"userMessage": text}).json()["ok"]
        assert unfinished(client) == (0, 0, 0, 0)


async def _a_dead_attempt(url: str, session: str, version: str | None = None) -> None:
    """The session's usage record as a server killed after a model call answered left it
    (store/billing.py): an attempt no commit counted, with its call's usage."""
    store = await open_existing_store(url)
    try:
        record = {"attempt": "dead0001", "turn": 1, "at": 1796637600.0, "usage": DEAD,
                  **({"version": version} if version else {})}
        await store.put_record(f"usage:{session}", record, session)
    finally:
        await store.close()


def _samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(client.get("/metrics").text)
            for s in family.samples}


def test_a_dead_attempts_cost_counts_for_the_bot_version_that_ran_it(fake, tmp_path):
    """chatrun_version_cost_total gets a dead attempt's cost under the version its usage record
    names (a canary killed mid-turn is billed to the canary), and the record each model call
    writes names the version that made the call."""
    (tmp_path / "bot.yaml").write_text(BOT)
    url = f"sqlite:///{tmp_path / 's.db'}"
    with TestClient(app_for_testclient(str(tmp_path / "bot.yaml"), url)) as client:
        assert client.post("/bots/desk/sessions", json={"id": "s"}).status_code == 201
    asyncio.run(_a_dead_attempt(url, "s", version="v-canary"))
    fake.responder = lambda body: {"text": "Hi.", "usage": {"prompt_tokens": 20, "completion_tokens": 5,
                                                            "total_tokens": 25}}
    with TestClient(app_for_testclient(str(tmp_path / "bot.yaml"), url)) as client:
        said = client.post("/bots/desk/sessions/s/messages", json={"userMessage": "hello"})
        assert said.status_code == 200 and said.json()["ok"], said.text
        samples = _samples(client)
    live = [dict(labels)["bot_version"] for (name, labels) in samples if name == "chatrun_version_turns_total"]
    assert len(live) == 1 and live[0] != "v-canary"
    assert samples[("chatrun_version_cost_total", (("bot", "desk"), ("bot_version", "v-canary")))] == \
        pytest.approx(0.00012)
    assert samples[("chatrun_version_cost_total", (("bot", "desk"), ("bot_version", live[0])))] == \
        pytest.approx((20 + 5 * 2) / 1e6)
    assert asyncio.run(_the_record(url, "s"))["version"] == live[0]


async def _the_record(url: str, session: str) -> dict:
    store = await open_existing_store(url)
    try:
        return await store.get_record(f"usage:{session}")
    finally:
        await store.close()
