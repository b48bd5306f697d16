"""A sink that lists `Usage` gets one per committed turn, failed turns included, through the
outbox in the turn's own commit (docs/observability.md, "Usage for billing"): a real server app
(its lifespan runs the delivery worker), the real openai client against the fake OpenAI server
over `/v1` and HTTP, real SQLite or memory://, real local webhook receivers. The `total`s of a
session's Usage events sum to its `usage`; a `/v1` replay delivers none again; a sink without
`events:` never gets one. The kill -9 case is in test_usage_sink_killed.py."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient

import chatrun
from chat_support import call
from chatrun.engine.usage import Usage
from chatrun.models.scripted import ScriptedModel
from chatrun.store import open_store
from chatrun.store.record import PENDING
from server_support import app_for_testclient, wait_until
from webhook_support import OPENAI_MODEL, RETRY, Receiver

BOT = f"""\
name: survey
model: {{{OPENAI_MODEL}}}
prices:
  gpt-4o-mini: {{input: 1.0, output: 2.0}}
env:
  CRM_URL: {{}}
  BILLING_URL: {{}}
events:
  Detractor: {{audience: backend}}
sinks:
  crm:
    webhook: {{url: "{{{{ env.CRM_URL }}}}/hooks"}}
    retry: {{{RETRY}}}
  billing:
    webhook: {{url: "{{{{ env.BILLING_URL }}}}/usage"}}
    events: [Usage]
    retry: {{{RETRY}}}
routes:
  main: {{default: true, system: Ask for a score., tools: [score]}}
tools:
  score:
    parameters: {{type: object, properties: {{n: {{type: integer}}}}, required: [n]}}
    action: {{emit: {{Detractor: "{{{{ args.n }}}}"}}, reply: noted}}
"""


def used(prompt: int, completion: int) -> dict:
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


@pytest.fixture
def receivers():
    with Receiver() as crm, Receiver() as billing:
        yield crm, billing


@pytest.fixture(params=["sqlite", "memory"])
def served(request, tmp_path, fake, receivers, monkeypatch):
    crm, billing = receivers
    monkeypatch.setenv("CRM_URL", crm.url)
    monkeypatch.setenv("BILLING_URL", billing.url)
    monkeypatch.setenv("CHATRUN_OUTBOX_POLL", "0.2")
    bot = tmp_path / "bot.yaml"
    bot.write_text(BOT)
    url = f"sqlite:///{tmp_path / 's.db'}" if request.param == "sqlite" else "memory://"
    with TestClient(app_for_testclient([str(bot)], url)) as client:
        yield client


def summed(events: list[dict]) -> dict:
    total = Usage()
    for data in events:
        total.add(Usage.from_dict(data["total"]))
    return total.to_dict()


def usage_of(client: TestClient, session: str) -> dict:
    return client.get(f"/bots/survey/sessions/{session}").json()["usage"]


def test_a_billing_sink_gets_each_turns_usage_once_failed_turns_too_and_they_sum_to_the_sessions(
        served, receivers, fake):
    client, (crm, billing) = served, receivers
    client.post("/bots/survey/sessions", json={"id": "s1"})
    fake.queue({**call("score", n=3), **used(100, 10)}, {"text": "Thanks.", **used(120, 5)},
               {**call("score", n=2), **used(200, 20)}, {"status": 500, "body": "down"})
    send = lambda text: client.post("/bots/survey/sessions/s1/messages", json={"userMessage": text}).json()  # noqa: E731
    assert send("3")["ok"] is True
    assert send("2")["ok"] is False  # its first call answered (billed), its second failed
    # Over /v1, with the real openai client: a turn, then the same request replayed by its key.
    fake.queue({"text": "Hello.", **used(7, 3)})
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client, max_retries=0)
    asked = {"model": "survey", "messages": [{"role": "user", "content": "hi"}],
             "extra_headers": {"Idempotency-Key": "hi-1"}}
    first = sdk.chat.completions.create(**asked)
    again = sdk.chat.completions.create(**asked)
    assert again.model_extra["chatrun"]["how"] == "replayed"
    v1 = first.model_extra["chatrun"]["session"]
    got = wait_until(lambda: len(billing.accepted()) >= 3 and billing.accepted(), what="three Usage deliveries")
    wait_until(lambda: client.get("/outbox").json()["entries"] == [], what="the outbox emptied")
    bodies = [d.body for d in billing.accepted()]
    assert len(got) == 3 and len(bodies) == 3  # two turns of s1, one of /v1: the replay delivered none
    assert all(b["type"] == "Usage" and b["bot"] == "survey" for b in bodies)
    s1 = [b["data"] for b in bodies if b["session"] == "s1"]
    assert [(d["turn"], d["ok"], d["usage"]["calls"]) for d in s1] == [(1, True, 2), (2, False, 1)]
    assert [c["model"] for c in s1[0]["calls"]] == ["gpt-4o-mini", "gpt-4o-mini"]
    assert (s1[1]["calls"][0]["input_tokens"], s1[1]["calls"][0]["output_tokens"]) == (200, 20)
    assert s1[1]["total"]["cost"] == pytest.approx((200 * 1.0 + 20 * 2.0) / 1e6)
    assert s1[0]["route"] == "main" and s1[0]["unfinished"] == []
    assert summed(s1) == usage_of(client, "s1") and usage_of(client, "s1")["input_tokens"] == 420
    [other] = [b["data"] for b in bodies if b["session"] == v1]
    assert summed([other]) == usage_of(client, v1) and other["total"]["input_tokens"] == 7
    # The sink without `events:` gets the bot's backend events, never a Usage.
    assert [d.body["type"] for d in crm.accepted()] == ["Detractor"]


def test_a_bot_whose_sinks_do_not_list_usage_queues_none(tmp_path, monkeypatch):
    monkeypatch.setenv("CRM_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("BILLING_URL", "http://127.0.0.1:9")
    bot_file = tmp_path / "bot.yaml"
    bot_file.write_text(BOT.replace("events: [Usage]", "events: [Detractor]"))
    store = open_store("memory://")
    session = chatrun.load_bot(bot_file).session(store=store, model=ScriptedModel([call("score", n=5), "Thanks."]))
    session.chat("5")
    assert [q["body"]["type"] for q in session.last_turn["outbox"]] == ["Detractor", "Detractor"]
    assert [e.body["type"] for e in store.list_outbox(PENDING)] == ["Detractor", "Detractor"]


def test_a_library_sessions_usage_is_queued_in_its_store_with_a_failed_turns(tmp_path, monkeypatch):
    monkeypatch.setenv("CRM_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("BILLING_URL", "http://127.0.0.1:9")
    bot_file = tmp_path / "bot.yaml"
    bot_file.write_text(BOT)
    store = open_store("memory://")
    model = ScriptedModel([call("score", n=5), "Thanks.", call("nope")])  # an unknown tool fails turn 2
    session = chatrun.load_bot(bot_file).session(store=store, model=model, principal={"name": "ana"})
    session.chat("5")
    session.chat("again")
    assert session.last_turn["ok"] is False
    queued = [e.body for e in store.list_outbox(PENDING) if e.body["type"] == "Usage"]
    assert [(b["turn"], b["data"]["ok"], b["data"]["principal"]) for b in queued] == [(1, True, "ana"), (2, False, "ana")]
    assert [b["data"]["total"]["calls"] for b in queued] == [2, 1]  # the failed turn's call was made
    assert summed([b["data"] for b in queued]) == session.usage
    assert "outbox" not in store.load_history(session.id)[-1]


def test_a_bots_own_event_cannot_pass_for_the_billed_usage(tmp_path, write_bot, monkeypatch):
    monkeypatch.setenv("CRM_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("BILLING_URL", "http://127.0.0.1:9")
    declared = BOT.replace("  Detractor: {audience: backend}\n", "  Detractor: {audience: backend}\n  Usage: {audience: backend}\n")
    with pytest.raises(chatrun.BotError, match=r"bot.yaml:\d+:\d+: error: `events.Usage`: Usage is chatrun's own"):
        chatrun.load_bot(write_bot(declared))
    # A handler's event named Usage stays in the history, never in the billing sink's outbox.
    spoof = BOT.replace("tools: [score]}", "tools: [score, spoof]}") + "  spoof: {handler: hooks:spoof}\n"
    hooks = 'def spoof(ctx):\n    ctx.emit("Usage", {"total": {"input_tokens": -1}}, audience="backend")\n    return "ok"\n'
    store = open_store("memory://")
    bot = chatrun.load_bot(write_bot(spoof, extra={"hooks.py": hooks}))
    session = bot.session(store=store, model=ScriptedModel([call("spoof"), "Done."]))
    assert ("Usage", {"total": {"input_tokens": -1}}) in [(e.type, e.data) for e in session.chat("hi")]
    [queued] = [e.body["data"] for e in store.list_outbox(PENDING)]
    assert queued["total"]["calls"] == 2 and queued["total"] == session.usage


async def stop_after_first_chunk(session, message: str) -> None:
    """Run a turn until its first Stream chunk arrives, then cancel it (what every door does)."""
    import asyncio

    chunk = asyncio.Event()

    async def consume() -> None:
        async for event in session.stream(message):
            if event.type == "Stream":
                chunk.set()

    task = asyncio.ensure_future(consume())
    await chunk.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_stopped_turns_billed_call_is_queued_as_its_usage(tmp_path, fake, monkeypatch):
    import asyncio

    monkeypatch.setenv("CRM_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("BILLING_URL", "http://127.0.0.1:9")
    bot_file = tmp_path / "bot.yaml"
    bot_file.write_text(BOT.replace("stream: false", "stream: true"))
    store = open_store(f"sqlite:///{tmp_path / 'lib.db'}")
    session = chatrun.load_bot(bot_file).session(store=store)
    fake.queue({**call("score", n=3), **used(50, 5)}, {"chunks": ["Thanks", " a lot"], "stall": True})
    asyncio.run(stop_after_first_chunk(session, "3"))
    assert session.last_turn["error"] == "cancelled"
    [queued] = [e.body for e in store.list_outbox(PENDING)]  # the rolled-back Detractor is not queued
    assert queued["type"] == "Usage" and queued["data"]["ok"] is False
    assert (queued["data"]["total"]["input_tokens"], queued["data"]["total"]["calls"]) == (50, 1)
    assert summed([queued["data"]]) == session.usage
