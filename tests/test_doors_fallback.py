"""A model that fails mid-stream, behind an output guardrail that holds the whole reply, on every
door (tests/test_doors.py's clients): nothing of its answer was shown, so its fallback answers,
and each door reads the fallback's reply once — never a byte of the failed model's partial text,
never a second beginning. Without a hold the first chunk is shown, and the failure stands
(tests/test_model_fallback.py `test_a_failure_after_the_first_chunk_is_not_sent_to_the_fallback`);
a `release: sentence` hold has shown a sentence by then too (the engine test below)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

import chatrun
from chatrun.server import create_app
from chatrun.testing.fake_openai import FakeOpenAI
from server_support import ThreadServer
from test_doors import DOORS

pytestmark = [pytest.mark.slow]

BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: true, fallback: [{name: gpt-4o}],
        breaker: {failures: 1000000, cool_down: 30s}}  # each turn tries the primary
guardrails:
  - {name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: block, message: "I cannot share that."}
routes:  # a route with tools reads calls a model writes as text too (models/text_calls.py): one more hold
  main: {default: true, system: You sell things., tools: [note]}
  multi: {system: You sell things., stream_to_quarkus: true}
tools:
  note: {description: Take a note., action: {reply: Noted.}}
"""
PRIMARY = {"chunks": ["Zorblax says ", "half a sen"], "disconnect": True}  # fails mid-stream, every time
FALLBACK = ["The fallback ", "answers whole."]


def responder(body: dict[str, Any]) -> dict[str, Any]:
    return PRIMARY if body["model"] == "gpt-4o-mini" else {"chunks": FALLBACK}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ThreadServer]:
    root = tmp_path_factory.mktemp("fallback-doors")
    (root / "bot.yaml").write_text(BOT)
    with FakeOpenAI(responder=responder) as fake, pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_BASE_URL", fake.base_url)
        env.setenv("OPENAI_API_KEY", "test-key")
        app = create_app([chatrun.load_bot(root / "bot.yaml")], f"sqlite:///{root / 'c.db'}")
        with ThreadServer(app) as srv:
            srv.fake = fake
            yield srv


@pytest.mark.parametrize("door", DOORS)
def test_a_model_failing_mid_stream_behind_a_held_reply_falls_back_and_no_door_sees_it_twice(server, door):
    asked = len(server.fake.requests)
    seen = DOORS[door](server).talk(["hello", "and again"])
    assert [turn.text for turn in seen] == ["The fallback answers whole."] * 2
    for turn in seen:
        assert "zorblax" not in turn.received.lower() and "half a sen" not in turn.received
    assert [r["model"] for r in server.fake.requests[asked:]] == ["gpt-4o-mini", "gpt-4o"] * 2


def test_a_sentence_released_before_the_failure_stands_and_no_fallback_repeats_it(tmp_path, monkeypatch):
    """`release: sentence` shows a checked sentence as it comes: once one is out, a fallback would
    start the reply again, so the failure stands, as without a hold."""
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        (tmp_path / "bot.yaml").write_text(BOT.replace("message:", "release: sentence, message:"))
        fake.queue_for("gpt-4o-mini", {"chunks": ["Zorblax says hi. ", "half a sen"], "disconnect": True})
        fake.queue({"text": "never asked"})

        async def run() -> list[Any]:
            return [e async for e in chatrun.load_bot(tmp_path / "bot.yaml").session().stream("hello")]
        events = asyncio.run(run())
    assert [e.data for e in events if e.type == "Stream"] == ["Zorblax says hi. "]
    assert events[-1].type == "Error" and [r["model"] for r in fake.requests] == ["gpt-4o-mini"]


SENTENCE_PRIMARY = {"chunks": ["Zorblax says", " half a sen"], "disconnect": True}  # no whole sentence


@pytest.mark.parametrize("door", ["http-sse", "v1-chat-stream-history"])
@pytest.mark.parametrize("retries", [0, 1])  # asked of the fallback; retried on its own model first
def test_a_served_model_failing_before_its_first_sentence_is_retried_or_falls_back(tmp_path, door, retries):
    """Through the server (its metrics time each model call: one more layer between model and
    hold), `release: sentence`: the retry or the fallback answers, and the door never reads the
    failed part."""
    bot = BOT.replace("max_retries: 0", f"max_retries: {retries}").replace("message:", "release: sentence, message:")
    (tmp_path / "bot.yaml").write_text(bot)
    tries = iter([SENTENCE_PRIMARY])  # fails once: retried, the primary answers; else the fallback
    with FakeOpenAI(responder=lambda body: next(tries, {"chunks": ["The answer. ", "Whole."]})) as fake, \
            pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_BASE_URL", fake.base_url)
        env.setenv("OPENAI_API_KEY", "test-key")
        app = create_app([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 'c.db'}")
        with ThreadServer(app) as srv:
            seen = DOORS[door](srv).talk(["hello"])
        assert [r["model"] for r in fake.requests] == ["gpt-4o-mini", "gpt-4o-mini" if retries else "gpt-4o"]
    assert [turn.text for turn in seen] == ["The answer. Whole."]
    assert "zorblax" not in seen[0].received.lower()


def sentence_events(tmp_path, monkeypatch, bot: str, *answers: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """One turn of `bot` released by the sentence, the fake answering `answers` in order: its
    events, and the models asked."""
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        (tmp_path / "bot.yaml").write_text(bot.replace("message:", "release: sentence, message:"))
        fake.queue(*answers)

        async def run() -> list[Any]:
            return [e async for e in chatrun.load_bot(tmp_path / "bot.yaml").session().stream("hello")]
        return asyncio.run(run()), [r["model"] for r in fake.requests]


@pytest.mark.parametrize("route", ["main", "multi"])  # with tools (calls written as text: one more hold), without
def test_a_model_failing_before_its_first_sentence_was_released_falls_back(tmp_path, monkeypatch, route):
    """`release: sentence`: while no checked sentence went out, nothing of the reply reached the
    user, so the fallback answers; and what the failed model streamed (no whole sentence) is
    never joined to the fallback's first sentence."""
    bot = BOT.replace("default: true, ", "") .replace(f"{route}: {{", f"{route}: {{default: true, ")
    events, asked = sentence_events(tmp_path, monkeypatch, bot, {"chunks": ["Zorblax says", " half a sen"], "disconnect": True},
                                    {"chunks": ["The fallback answers. ", "Whole."]})
    assert asked == ["gpt-4o-mini", "gpt-4o"]
    streamed = "".join(e.data for e in events if e.type == "Stream")
    assert "Zorblax" not in streamed and streamed.startswith("The fallback answers.")
    assert [e.data for e in events if e.type == "Message"] == ["The fallback answers. Whole."]


def test_a_dropped_stream_before_its_first_sentence_is_retried_on_its_own_model(tmp_path, monkeypatch):
    events, asked = sentence_events(tmp_path, monkeypatch, BOT.replace("max_retries: 0", "max_retries: 1"),
                                    {"chunks": ["Zorblax says", " half a sen"], "disconnect": True},
                                    {"chunks": ["The retry answers. ", "Whole."]})
    assert asked == ["gpt-4o-mini", "gpt-4o-mini"]
    assert "Zorblax" not in "".join(e.data for e in events if e.type == "Stream")
    assert [e.data for e in events if e.type == "Message"] == ["The retry answers. Whole."]


def test_a_dropped_stream_behind_a_held_reply_is_retried_on_its_own_model(tmp_path, monkeypatch, caplog):
    """`max_retries` works behind the hold too (the model's own retry, before any fallback), on a
    route with tools: the retry's answer is the reply, whole, and nothing is said of a mismatch."""
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        (tmp_path / "bot.yaml").write_text(BOT.replace("max_retries: 0", "max_retries: 1"))
        fake.queue(PRIMARY, {"chunks": FALLBACK})

        async def run() -> list[Any]:
            return [e async for e in chatrun.load_bot(tmp_path / "bot.yaml").session().stream("hello")]
        events = asyncio.run(run())
    assert [(e.type, e.data) for e in events] == [("Message", "The fallback answers whole.")]
    assert [r["model"] for r in fake.requests] == ["gpt-4o-mini", "gpt-4o-mini"]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_slack_reply_held_whole_is_posted_from_the_fallback_alone(tmp_path, fake, monkeypatch):
    """The streamed channel (Slack posts a message and updates it as the reply streams): behind
    a hold of the whole reply, the model dropping its stream midway leaves nothing posted of it;
    the fallback's answer is the one message."""
    pytest.importorskip("slack_sdk", reason="slack_sdk is not installed (pip install -e '.[test]' brings it)")
    import time

    from fastapi.testclient import TestClient

    from channel_support import FakeSlack, slack_message, slack_signed
    from chatrun.server.channels.slack import Slack
    from server_support import app_for_testclient, wait_until
    from test_guardrails_server import SLACK_BOT

    token, signing = "xoxb-test-token", "slack-signing-secret-0123"
    monkeypatch.setattr(Slack, "stream_every", 0.0)  # every chunk let out is posted
    bot = SLACK_BOT.replace("max_retries: 0", "max_retries: 0, fallback: [{name: gpt-4o}]").replace(
        ", release: sentence", "")
    with FakeSlack(token) as slack:
        for name, value in (("SLACK_TOKEN", token), ("SLACK_SIGNING", signing), ("SLACK_API", slack.url + "/api"),
                            ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        fake.queue_for("gpt-4o-mini", PRIMARY)
        fake.queue_for("gpt-4o", {"chunks": FALLBACK})
        (tmp_path / "bot.yaml").write_text(bot)
        with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
            body = json.dumps(slack_message("Ev1", "hello")).encode()
            headers = {"Content-Type": "application/json", **slack_signed(signing, body, int(time.time()))}
            assert client.post("/channels/shop/slack", content=body, headers=headers).status_code == 200
            wait_until(lambda: client.get("/outbox").json()["entries"] == [] and slack.calls("chat.postMessage"),
                       what="the reply posted and the outbox emptied")
            shown = [c["text"] for c in slack.calls("chat.postMessage") + slack.calls("chat.update")]
    assert set(shown) == {"The fallback answers whole."}
    assert [r["model"] for r in fake.requests] == ["gpt-4o-mini", "gpt-4o"]
