"""A model call the provider billed is counted even when the server dies before the turn commits
(store/billing.py; docs/observability.md, "What a killed server's attempt used").

A real `chatrun serve` (SQLite, Redis, PostgreSQL) answered by fake_openai: a turn's first model call
answers (a tool call), its second hangs, and the server is killed (SIGKILL) then. Started again,
the page sends the message again (or, over `/v1`, the client sends its request again: the retry
takes over the dead attempt's claim): the session's usage, its history and `chatrun report`'s
tokens count the dead attempt's call and the retry's calls, each once.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest
import websockets

from chatrun.report.read import read_conversations
from chatrun.store.aio import open_async_store
from chatrun.testing.fake_openai import FakeOpenAI
from server_support import async_until_done, call, free_port, start_serve, write_travel

pytestmark = pytest.mark.subprocess


def used(prompt: int, completion: int) -> dict:
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


async def send(ws_url: str, text: str, fake: FakeOpenAI, calls_before_kill: int | None = None,
               first: bool = False) -> list[dict]:
    """Send `text` on chat r1 (`first`: a new chat); with `calls_before_kill`, return once the
    model has that many requests (the turn is then in its last, hanging call), else the turn's frames."""
    async with websockets.connect(ws_url) as ws:
        await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "r1", "resume": not first}))
        await async_until_done(ws, timeout=60)
        await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "r1", "data": {"userMessage": text}}))
        if calls_before_kill is None:
            return await async_until_done(ws, timeout=60)
        deadline = time.monotonic() + 60
        while len(fake.requests) < calls_before_kill:
            assert time.monotonic() < deadline, f"the model got {len(fake.requests)} requests, not {calls_before_kill}"
            await asyncio.sleep(0.02)
        return []


PRICES = "prices:\n  gpt-4o-mini: {input: 1.0, output: 2.0}\n"  # per million tokens


def killed_then_retried(tmp_path, store: str, extra: str = "", settled: Callable[[], object] = lambda: None,
                        ) -> tuple[dict, list[dict], tuple[int, int], dict]:
    """The session r1 (its resource) after a committed turn, a killed attempt, its retry and one
    more turn; the retry's frames; what the report read between the kill and the restart (tokens,
    unfinished); the restarted server's metrics after the retry and the next turn (`scraped`).
    `extra`: more of the bot's YAML; `settled`: waited for before the restarted server stops."""
    path = write_travel(tmp_path / "bots")
    path.write_text(path.read_text() + PRICES + extra)
    bot = str(path)
    port = free_port()
    base, ws_url = f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/_chat/routes"
    with FakeOpenAI() as fake:
        # A committed turn (10 + 1 tokens), then the dead attempt: its first call answers (100 + 10
        # tokens, billed), its second hangs.
        fake.queue({"text": "Hello", **used(10, 1)},
                   {**call("remember_name", name="Ana"), **used(100, 10)}, {"text": "never", "delay": 60})
        first = start_serve(bot, store, port, fake)
        try:
            asyncio.run(send(ws_url, "hi", fake, first=True))
            asyncio.run(send(ws_url, "I'm Ana", fake, calls_before_kill=3))
        finally:
            first.kill()  # SIGKILL, after the model answered and before the commit
            first.wait(10)
        between = asyncio.run(reported(store))
        fake.queue({**call("remember_name", name="Ana"), **used(200, 20)}, {"text": "Hi Ana", **used(300, 30)},
                   {"text": "Bye", **used(5, 1)})
        second = start_serve(bot, store, port, fake)
        try:
            frames = asyncio.run(send(ws_url, "I'm Ana", fake))
            asyncio.run(send(ws_url, "bye", fake))  # the next turn does not count the dead attempt again
            settled()
            metrics = scraped(httpx.get(f"{base}/metrics").text)
            return httpx.get(f"{base}/bots/travel/sessions/r1").json(), frames, between, metrics
        finally:
            second.kill()
            second.wait(10)


def check_counted_once(session: dict, frames: list[dict]) -> None:
    assert frames[-1]["type"] == "Completed" and "Hi Ana" in [f.get("data") for f in frames]
    # The dead attempt's one answered call and the retry's two, each once.
    usage = session["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["calls"]) == (615, 62, 5)
    dead, retry = [e for e in session["history"] if e.get("turn") == 2]
    assert dead["ok"] is False and dead["unfinished"] is True
    assert (dead["usage"]["input_tokens"], dead["usage"]["output_tokens"], dead["usage"]["calls"]) == (100, 10, 1)
    assert retry["ok"] is True and (retry["usage"]["input_tokens"], retry["usage"]["calls"]) == (500, 2)


def scraped(text: str) -> dict:
    """A /metrics page's samples: {(name, ((label, value), ...)): value}."""
    parser = pytest.importorskip("prometheus_client.parser", reason="the metrics need chatrun[metrics]")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in parser.text_string_to_metric_families(text) for sample in family.samples}


def check_metrics_count_it_once(metrics: dict) -> None:
    """The restarted process's metrics count the dead attempt's call once, apart from the calls
    it made itself (the retry's two and the next turn's: 200 + 300 + 5 input tokens)."""
    model = (("bot", "travel"), ("gen_ai_request_model", "gpt-4o-mini"))
    assert metrics[("chatrun_unfinished_attempts_total", (("bot", "travel"),))] == 1
    assert metrics[("chatrun_unfinished_tokens_total", (*model, ("gen_ai_token_type", "input")))] == 100
    assert metrics[("chatrun_unfinished_tokens_total", (*model, ("gen_ai_token_type", "output")))] == 10
    assert metrics[("chatrun_unfinished_cost_total", model)] == pytest.approx((100 * 1.0 + 10 * 2.0) / 1e6)
    live = (("bot", "travel"), ("gen_ai_operation_name", "chat"), ("gen_ai_provider_name", "openai"),
            ("gen_ai_request_model", "gpt-4o-mini"), ("gen_ai_token_type", "input"))
    assert metrics[("gen_ai_client_token_usage_sum", live)] == 505
    # The version's cost: its own calls and the dead attempt's (its record names the version).
    [version_cost] = [v for (name, _), v in metrics.items() if name == "chatrun_version_cost_total"]
    assert version_cost == pytest.approx(((505 + 100) * 1.0 + (51 + 10) * 2.0) / 1e6)


async def reported(url: str) -> tuple[int, int]:
    """What `chatrun report` counts of the one conversation: (tokens, unfinished attempts)."""
    store = open_async_store(url)
    try:
        [conversation] = await read_conversations(store)
        return conversation.tokens, conversation.unfinished
    finally:
        await store.close()


@pytest.mark.slow
def test_a_killed_attempts_billed_call_is_counted_once_with_its_retry(tmp_path):
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    session, frames, between, metrics = killed_then_retried(tmp_path, url)
    check_counted_once(session, frames)
    check_metrics_count_it_once(metrics)
    # The report counts the dead attempt's record before any attempt took it up, then its entry.
    assert between == (11 + 110, 1)
    assert asyncio.run(reported(url)) == (11 + 110 + 550 + 6, 1)


@pytest.mark.slow
def test_on_redis_a_killed_attempts_billed_call_is_counted_once_with_its_retry(tmp_path, redis_server):
    url = redis_server.url()
    session, frames, between, metrics = killed_then_retried(tmp_path, url)
    check_counted_once(session, frames)
    check_metrics_count_it_once(metrics)
    # The report counts the dead attempt's record before any attempt took it up, then its entry.
    assert between == (11 + 110, 1)
    assert asyncio.run(reported(url)) == (11 + 110 + 550 + 6, 1)


@pytest.mark.slow
def test_on_postgres_a_killed_attempts_billed_call_is_counted_once_with_its_retry(tmp_path, postgres_server):
    url = postgres_server.url()
    session, frames, between, metrics = killed_then_retried(tmp_path, url)
    check_counted_once(session, frames)
    check_metrics_count_it_once(metrics)
    assert between == (11 + 110, 1)
    assert asyncio.run(reported(url)) == (11 + 110 + 550 + 6, 1)


def v1_killed_then_retried(tmp_path, store: str, extra: str = "", settled: Callable[[], object] = lambda: None,
                           ) -> dict:
    """The same dead attempt over `/v1` (the real `openai` client): a committed answer, then the
    next request's turn killed after its first call answered; the client sends the request again
    (its retry takes over the dead attempt's claim) and one more. The stored session (its resource).
    `extra`: more of the bot's YAML; `settled`: waited for before the restarted server stops."""
    path = write_travel(tmp_path / "bots")
    path.write_text(path.read_text() + extra)
    bot = str(path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)
    hi = [{"role": "user", "content": "hi"}]
    with FakeOpenAI() as fake:
        fake.queue({"text": "Hello", **used(10, 1)},
                   {**call("remember_name", name="Ana"), **used(100, 10)}, {"text": "never", "delay": 60})
        first = start_serve(bot, store, port, fake)
        again = [*hi, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "I'm Ana"}]
        try:
            assert client.chat.completions.create(model="travel", messages=hi).choices[0].message.content == "Hello"
            threading.Thread(target=_ignoring_errors, args=(client, again), daemon=True).start()
            deadline = time.monotonic() + 60
            while len(fake.requests) < 3:
                assert time.monotonic() < deadline, f"the model got {len(fake.requests)} requests, not 3"
                time.sleep(0.02)
        finally:
            first.kill()  # SIGKILL, after the model answered and before the commit
            first.wait(10)
        fake.queue({**call("remember_name", name="Ana"), **used(200, 20)}, {"text": "Hi Ana", **used(300, 30)},
                   {"text": "Bye", **used(5, 1)})
        second = start_serve(bot, store, port, fake)
        try:
            retried = client.chat.completions.create(model="travel", messages=again)
            assert retried.choices[0].message.content == "Hi Ana"
            more = [*again, {"role": "assistant", "content": "Hi Ana"}, {"role": "user", "content": "bye"}]
            last = client.chat.completions.create(model="travel", messages=more)
            session = last.model_extra["chatrun"]["session"]
            settled()
            return httpx.get(f"{base}/bots/travel/sessions/{session}").json()
        finally:
            second.kill()
            second.wait(10)


def _ignoring_errors(client, messages: list[dict]) -> None:
    """A request whose server is killed under it: its connection error is the point."""
    try:
        client.chat.completions.create(model="travel", messages=messages)
    except Exception:  # noqa: BLE001 - the server died under the request, as the test wants
        pass


@pytest.mark.slow
def test_over_v1_a_killed_attempts_billed_call_is_counted_once_with_the_retry_that_took_its_claim(tmp_path):
    session = v1_killed_then_retried(tmp_path, f"sqlite:///{tmp_path / 'sessions.db'}")
    usage = session["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["calls"]) == (615, 62, 5)
    dead = [e for e in session["history"] if e.get("unfinished")]
    assert len(dead) == 1 and (dead[0]["usage"]["input_tokens"], dead[0]["usage"]["calls"]) == (100, 1)
