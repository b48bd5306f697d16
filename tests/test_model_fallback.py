"""Model fallback (issue 38): `model.fallback:` answers when the route's model cannot — quota
(429), overload (503/529), timeout, outage — and only before a chunk of the answer was shown;
never on a refused request (400). A short circuit breaker skips an endpoint that keeps failing
for its cool-down, on the session's clock (moved by the test, never waited for). Which model
answered is in the turn's usage, its span and `chatrun_model_fallbacks_total`. Through the real
`openai` client against the local fake OpenAI server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

import chatrun
from chatrun.definition.loader import check_bot
from chatrun.engine import observe
from chatrun.engine.clock import FixedClock

BOT = """
name: fb
model:
  name: primary-model
  max_retries: 0
  fallback:
    - {name: backup-model}
  breaker: {failures: 2, cool_down: 30s}
routes:
  main:
    default: true
    system: You help.
  strict:
    system: Be strict.
    model: {name: strict-model, fallback: [{name: strict-backup, temperature: 0}]}
  alone:
    system: On your own.
    model: {fallback: []}
"""


@pytest.fixture
def bot(write_bot):
    return chatrun.load_bot(write_bot(BOT))


def models_asked(fake) -> list[str]:
    return [body["model"] for body in fake.requests]


def stream(session, text: str) -> list:
    async def run():
        return [event async for event in session.stream(text)]
    return asyncio.run(run())


def test_a_429_from_the_primary_is_answered_by_the_fallback_with_no_error_and_no_duplicate_text(bot, fake):
    session = bot.session()
    fake.queue_for("primary-model", {"status": 429, "body": {"error": {"message": "quota exceeded"}}})
    fake.queue_for("backup-model", {"chunks": ["Hello ", "from ", "backup."]})
    events = stream(session, "hi")
    assert models_asked(fake) == ["primary-model", "backup-model"]
    assert {e.type for e in events[:-1]} == {"Stream"} and events[-1].type == "Message"  # no Error
    assert "".join(e.data for e in events if e.type == "Stream") == "Hello from backup."  # once
    assert events[-1].data == "Hello from backup."
    usage = session.history[-1]["usage"]["by_call"]
    assert [(u["model"], u["fallbacks"]) for u in usage] == [
        ("backup-model", [{"from": "primary-model", "to": "backup-model", "reason": "quota"}])]


@pytest.mark.parametrize("failure, reason", [
    ({"status": 503}, "overload"), ({"status": 529}, "overload"), ({"status": 500}, "outage"),
    ({"disconnect": True}, "outage"),
])
def test_overload_and_outage_fall_back_too(bot, fake, failure, reason):
    session = bot.session()
    fake.queue_for("primary-model", failure)
    fake.queue_for("backup-model", {"text": "Backup here."})
    events = session.chat("hi")
    assert events[-1].type == "Message" and events[-1].data == "Backup here."
    assert session.history[-1]["usage"]["by_call"][0]["fallbacks"][0]["reason"] == reason


def test_a_timeout_falls_back(write_bot, fake):
    bot = chatrun.load_bot(write_bot(BOT.replace("max_retries: 0", "max_retries: 0\n  timeout: 0.5")))
    session = bot.session()
    fake.queue_for("primary-model", {"text": "too late", "delay": 5})  # the client gives up first
    fake.queue_for("backup-model", {"text": "In time."})
    assert session.chat("hi")[-1].data == "In time."
    assert session.history[-1]["usage"]["by_call"][0]["fallbacks"][0]["reason"] == "timeout"


@pytest.mark.parametrize(("answer", "detail"), [
    ({"status": 400, "body": {"error": {"message": "bad field"}}}, "HTTP 400"),
    ({"raw": "<html>proxy error</html>"}, "is it an OpenAI-compatible server?"),  # the bot streams
], ids=["refused", "not-chat-completions"])
def test_a_refused_request_or_an_answer_that_is_not_chat_completions_is_not_sent_to_the_fallback(bot, fake, answer,
                                                                                                 detail):
    session = bot.session()
    fake.queue_for("primary-model", answer)
    fake.queue_for("backup-model", {"text": "never asked"})
    events = session.chat("hi")
    assert models_asked(fake) == ["primary-model"]
    assert events[-1].type == "Error" and detail in events[-1].meta["detail"]


def test_a_failure_after_the_first_chunk_is_not_sent_to_the_fallback(bot, fake):
    session = bot.session()
    fake.queue_for("primary-model", {"chunks": ["Half an ", "answer"], "disconnect": True})
    fake.queue_for("backup-model", {"text": "never asked"})
    events = stream(session, "hi")
    assert models_asked(fake) == ["primary-model"]
    assert [e.data for e in events if e.type == "Stream"] == ["Half an ", "answer"]  # shown once, not restarted
    assert events[-1].type == "Error" and "already shown" in events[-1].meta["detail"]
    assert session.history[-1]["ok"] is False


def test_when_every_model_fails_the_error_names_each(bot, fake):
    session = bot.session()
    fake.queue_for("primary-model", {"status": 429})
    fake.queue_for("backup-model", {"status": 503})
    events = session.chat("hi")
    detail = events[-1].meta["detail"]
    assert events[-1].type == "Error"
    assert "primary-model" in detail and "HTTP 429" in detail and "backup-model" in detail and "HTTP 503" in detail


def test_a_route_carries_its_own_fallback_and_can_turn_it_off(bot, fake):
    session = bot.session(route="strict")
    fake.queue_for("strict-model", {"status": 429})
    fake.queue_for("strict-backup", {"text": "Strictly."})
    assert session.chat("hi")[-1].data == "Strictly."
    assert models_asked(fake) == ["strict-model", "strict-backup"]
    assert fake.requests[-1]["temperature"] == 0  # the fallback's own field over the route's model
    alone = bot.session(route="alone")
    fake.reset()
    fake.queue_for("primary-model", {"status": 429})
    assert alone.chat("hi")[-1].type == "Error"
    assert models_asked(fake) == ["primary-model"]


def test_the_breaker_opens_after_failures_in_a_row_and_closes_after_its_cool_down(bot, fake):
    clock = FixedClock(datetime(2026, 3, 1, 9, 0, tzinfo=UTC))
    fake.fail_model("primary-model", {"status": 503})
    fake.queue_for("backup-model", *[{"text": f"Backup {n}."} for n in range(1, 8)])
    session = bot.session()
    session.clock = clock
    session.chat("one")
    session.chat("two")  # the second failure in a row opens the breaker (failures: 2)
    assert models_asked(fake) == ["primary-model", "backup-model"] * 2
    session.chat("three")  # open: the primary is not asked
    assert models_asked(fake)[4:] == ["backup-model"]
    assert session.history[-1]["usage"]["by_call"][0]["fallbacks"] == [
        {"from": "primary-model", "to": "backup-model", "reason": "breaker_open"}]
    clock.advance(timedelta(seconds=29))
    session.chat("four")
    assert models_asked(fake)[5:] == ["backup-model"]  # still open
    clock.advance(timedelta(seconds=1))
    session.chat("half open")  # the cool-down is over: tried once, fails, and is open again at once
    assert models_asked(fake)[6:] == ["primary-model", "backup-model"]
    session.chat("again open")
    assert models_asked(fake)[8:] == ["backup-model"]
    clock.advance(timedelta(seconds=30))
    fake.fail_model("primary-model", None)
    fake.queue_for("primary-model", {"text": "Primary again."})
    assert session.chat("five")[-1].data == "Primary again."  # tried after the cool-down, and it answers
    assert models_asked(fake)[9:] == ["primary-model"]
    assert "fallbacks" not in session.history[-1]["usage"]["by_call"][0]


def test_the_breaker_is_shared_by_the_sessions_of_one_model_pool(bot, fake):
    from chatrun.models import ModelPool

    pool = ModelPool()
    fake.fail_model("primary-model", {"status": 429})
    fake.queue_for("backup-model", *[{"text": "ok"}] * 3)
    for _ in range(2):
        bot.session(model=pool.model()).chat("hi")
    bot.session(model=pool.model()).chat("hi")  # a new session skips the primary too
    assert models_asked(fake) == ["primary-model", "backup-model"] * 2 + ["backup-model"]


def test_the_metric_counts_each_move(bot, fake):
    pytest.importorskip("prometheus_client")
    from chatrun.server.metrics import ServerMetrics

    sessions = SimpleNamespace(live_count=lambda: 0, waiting=0, active=0)
    metrics = ServerMetrics.create(sessions)
    assert metrics is not None
    fake.queue_for("primary-model", {"status": 429}, {"status": 503})
    fake.queue_for("backup-model", {"text": "a"}, {"text": "b"})
    session = bot.session()
    with observe.observing(metrics.turn_observer("fb")):
        session.chat("one")
        session.chat("two")
    labels = {"bot": "fb", "from": "primary-model", "to": "backup-model"}
    quota = metrics.registry.get_sample_value("chatrun_model_fallbacks_total", {**labels, "reason": "quota"})
    overload = metrics.registry.get_sample_value("chatrun_model_fallbacks_total", {**labels, "reason": "overload"})
    assert (quota, overload) == (1.0, 1.0)


def test_the_model_span_says_who_answered(bot, fake, spans):
    fake.queue_for("primary-model", {"status": 429})
    fake.queue_for("backup-model", {"text": "Backup."})
    bot.session().chat("hi")
    chat = [s for s in spans.get_finished_spans() if s.name == "chat primary-model"]
    assert len(chat) == 1
    assert chat[0].attributes["gen_ai.request.model"] == "backup-model"
    assert chat[0].attributes["chatrun.model.fallback.from"] == "primary-model"
    (event,) = [e for e in chat[0].events if e.name == "chatrun.model.fallback"]
    assert dict(event.attributes) == {"chatrun.model.fallback.from": "primary-model",
                                      "chatrun.model.fallback.to": "backup-model",
                                      "chatrun.model.fallback.reason": "quota"}


def test_the_validator_names_the_place_of_a_useless_fallback(write_bot):
    path = write_bot("""
        name: bad
        model:
          name: gpt-4o-mini
          fallback: []
        routes:
          main:
            default: true
            system: Hi.
            model: {name: gpt-4o, fallback: [{name: gpt-4o}, {nmae: x}]}
          other:
            system: Hi.
            model: {fallback: [{name: gpt-4o-mini}]}
        """)
    _config, diagnostics = check_bot(str(path))
    text = "\n".join(f"{Path(d.file).name}:{d.line}: {d.severity}: {d.message}" for d in diagnostics)
    assert "bot.yaml:5" in text and "empty" in text  # the bot's `fallback: []`
    assert "bot.yaml:10: error: unknown key `nmae`" in text and "did you mean `name`?" in text
    assert "bot.yaml:10: warning: fallback 1 of the model of route `main` is the same model as the one it " \
           "stands in for" in text
    assert "fallback 2 of the model of route `main`" not in text  # only its unknown key is said
    assert "bot.yaml:13: warning: fallback 1 of the model of route `other`" in text


def test_a_breaker_without_fallbacks_is_a_warning(write_bot):
    path = write_bot("""
        name: lone
        model:
          name: gpt-4o-mini
          breaker: {failures: 2}
        routes:
          main: {default: true, system: Hi.}
        """)
    _config, diagnostics = check_bot(str(path))
    assert [(d.line, d.severity) for d in diagnostics if "breaker" in d.message] == [(5, "warning")]


def test_a_fallback_entry_takes_the_fields_of_a_model():
    """The schema spells a fallback entry's fields out again (its reference resolver takes no
    JSON pointer into another definition): they must stay those of `model`."""
    import json

    defs = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "bot.schema.json").read_text())["$defs"]
    model = {k: v for k, v in defs["model"]["properties"].items() if k not in ("fallback", "breaker")}
    assert defs["fallbackModel"]["properties"] == model


def test_scripted_statuses_are_unavailable_or_refused():
    from chatrun.definition.config import ModelConfig
    from chatrun.errors import ModelError, ModelUnavailable
    from chatrun.models.base import ModelRequest
    from chatrun.models.scripted import ScriptedModel

    model = ScriptedModel([{"error": 429}, {"error": 529}, {"error": 504}, {"error": 404}, {"error": "down"}])
    request = ModelRequest([], [], ModelConfig(name="m"))
    raised = []
    for _ in range(5):
        with pytest.raises(ModelError) as caught:
            asyncio.run(model.complete(request))
        raised.append(getattr(caught.value, "reason", None) if isinstance(caught.value, ModelUnavailable) else None)
    assert raised == ["quota", "overload", "outage", None, None]
    with pytest.raises(chatrun.ChatrunError, match="400 to 599"):
        ScriptedModel([{"error": 200}])


def test_served_a_429_streams_the_fallbacks_answer_once_and_the_metric_counts_it(write_bot, fake, tmp_path):
    """Through `chatrun serve`'s app: the SSE stream carries the fallback's chunks once and no
    Error, and /metrics counts the move."""
    pytest.importorskip("prometheus_client")
    import json

    from starlette.testclient import TestClient

    from server_support import app_for_testclient

    app = app_for_testclient([write_bot(BOT)], "memory://")
    with TestClient(app) as client:
        client.post("/bots/fb/sessions", json={"id": "s1"})
        fake.queue_for("primary-model", {"status": 429})
        fake.queue_for("backup-model", {"chunks": ["Bon", "jour"]})
        with client.stream("POST", "/bots/fb/sessions/s1/messages?stream=true", json={"userMessage": "hi"}) as r:
            body = r.read().decode()
        events = [block.split("\n") for block in body.strip().split("\n\n")]
        names = [lines[0].removeprefix("event: ") for lines in events]
        assert names == ["Stream", "Stream", "Message", "Completed"]
        chunks = [json.loads(lines[1].removeprefix("data: "))["data"] for lines in events[:2]]
        assert chunks == ["Bon", "jour"]
        metrics = client.get("/metrics").text
    assert 'chatrun_model_fallbacks_total{bot="fb",from="primary-model",reason="quota",to="backup-model"} 1.0' \
        in metrics
