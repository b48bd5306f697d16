"""Guardrails through the doors (issue 37): the model (the fake OpenAI server) streams a card
number and a blocked phrase; the WebSocket, `/v1` (the real `openai` client) and a Slack chat
(its streamed message posted and updated on a fake of Slack's Web API) never see the digits or
the blocked words, because the engine holds a guarded reply before any door gets a chunk. The
store and `/metrics` are read too. Every other door: tests/test_doors.py."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
import websockets

import chatrun
from chatrun.server import create_app
from chatrun.testing.fake_openai import FakeOpenAI
from leak_support import card_leaked
from server_support import ThreadServer, async_until_done, check_frame

pytestmark = [pytest.mark.slow]

BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: true}
guardrails:
  - {name: cards, pii: [card], stages: [output, storage], outcome: redact, release: sentence}
  - {name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: block, release: sentence,
     message: "I cannot share that."}
routes:
  main: {default: true, system: You sell things.}
"""
CARD_REPLY = {"chunks": ["Thanks. Your card ", "4111 1111 ", "1111 1111 is ", "saved. Bye"]}
SECRET_REPLY = {"chunks": ["Sure. The price list ", "is for internal ", "only. Ask me later."]}


@pytest.fixture
def server(monkeypatch, tmp_path):
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        path = tmp_path / "shop.yaml"
        path.write_text(BOT)
        app = create_app([chatrun.load_bot(path)], f"sqlite:///{tmp_path / 'c.db'}")
        with ThreadServer(app) as srv:
            srv.fake = fake
            srv.db = tmp_path / "c.db"
            yield srv


def test_the_websocket_never_sees_a_streamed_card_number_or_a_blocked_sentence(server):
    server.fake.queue(CARD_REPLY, SECRET_REPLY)

    async def run() -> list[list[dict]]:
        async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "g1"}))
            await async_until_done(ws)
            turns = []
            for key, text in (("m1", "save my card"), ("m2", "prices?")):
                await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "g1", "requestId": key,
                                          "data": {"userMessage": text}}))
                turns.append(await async_until_done(ws, 30))
            return turns

    card, secret = asyncio.run(run())
    everything = json.dumps(card + secret)
    assert not card_leaked(everything) and "internal" not in everything
    streamed = "".join(f["data"] for f in card if f["type"] == "Stream")
    assert streamed == "Thanks. Your card [card] is saved. "  # released a checked sentence at a time
    assert [f["data"] for f in card if f["type"] == "Message"] == ["Thanks. Your card [card] is saved. Bye"]
    assert [f["data"] for f in secret if f["type"] == "Message"] == ["Sure. I cannot share that."]
    for frame in card + secret:
        check_frame(frame)
    stored = b"".join(p.read_bytes() for p in server.db.parent.glob("c.db*"))
    assert not card_leaked(stored) and b"[card]" in stored
    metrics = httpx.get(server.url + "/metrics")
    if metrics.status_code == 200:  # prometheus-client installed (the test extra has it)
        assert 'chatrun_guardrail_total{bot="shop",kind="pii",outcome="redact",stage="output"}' in metrics.text
        assert 'chatrun_guardrail_total{bot="shop",kind="pattern",outcome="block",stage="output"}' in metrics.text


def test_v1_streaming_through_the_openai_client_never_sees_the_digits(server):
    server.fake.queue(CARD_REPLY, SECRET_REPLY)
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        seen = []
        for question in ("save my card", "prices?"):
            stream = client.chat.completions.create(model="shop", stream=True,
                                                    messages=[{"role": "user", "content": question}])
            seen.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        whole = client.chat.completions.create(model="shop", messages=[{"role": "user", "content": "again"}]) \
            if server.fake.queue(CARD_REPLY) else None
    assert seen == ["Thanks. Your card [card] is saved. Bye", "Sure. I cannot share that."]
    assert whole is not None and whole.choices[0].message.content == "Thanks. Your card [card] is saved. Bye"


SLACK_BOT = """\
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: true}
env:
  SLACK_TOKEN: {secret: true}
  SLACK_SIGNING: {secret: true}
  SLACK_API: {}
channels:
  slack:
    token: SLACK_TOKEN
    signing_secret: SLACK_SIGNING
    api: "{{ env.SLACK_API }}"
guardrails:
  - {name: cards, pii: [card], stages: [output, storage], outcome: redact, release: sentence}
routes:
  main: {default: true, system: You sell things.}
"""


def test_a_slack_reply_streamed_into_one_message_never_shows_the_digits(tmp_path, fake, monkeypatch):
    pytest.importorskip("slack_sdk", reason="slack_sdk is not installed (pip install -e '.[test]' brings it)")
    from fastapi.testclient import TestClient

    from channel_support import FakeSlack, slack_message, slack_signed
    from chatrun.server.channels.slack import Slack
    from server_support import app_for_testclient, wait_until

    token, signing = "xoxb-test-token", "slack-signing-secret-0123"
    monkeypatch.setattr(Slack, "stream_every", 0.0)  # every released chunk is shown: none may hold the digits
    with FakeSlack(token) as slack:
        for name, value in (("SLACK_TOKEN", token), ("SLACK_SIGNING", signing), ("SLACK_API", slack.url + "/api"),
                            ("CHATRUN_OUTBOX_POLL", "0.2")):
            monkeypatch.setenv(name, value)
        fake.queue(CARD_REPLY)
        (tmp_path / "bot.yaml").write_text(SLACK_BOT)
        with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as client:
            body = json.dumps(slack_message("Ev1", "save my card")).encode()
            headers = {"Content-Type": "application/json", **slack_signed(signing, body, int(time.time()))}
            assert client.post("/channels/shop/slack", content=body, headers=headers).status_code == 200
            final = "Thanks. Your card [card] is saved. Bye"
            wait_until(lambda: any(c["text"] == final for c in slack.calls("chat.update")),
                       what="the committed text in the streamed message")
            wait_until(lambda: client.get("/outbox").json()["entries"] == [], what="the outbox emptied")
            shown = [c["text"] for c in slack.calls("chat.postMessage") + slack.calls("chat.update")]
    assert shown and not any(card_leaked(text) for text in shown)
    assert shown[0] == "Thanks. "  # the first checked sentence, posted as it was released


INPUT_BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
guardrails:
  - {name: cards, pii: [card], stages: [input, storage], outcome: redact}
routes:
  main: {default: true, system: You sell things.}
"""


def test_v1_earlier_messages_resent_by_the_client_reach_neither_the_model_nor_the_store(monkeypatch, tmp_path):
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        (tmp_path / "shop.yaml").write_text(INPUT_BOT)
        app = create_app([chatrun.load_bot(tmp_path / "shop.yaml")], f"sqlite:///{tmp_path / 'c.db'}")
        fake.queue({"text": "Fine."}, {"text": "Fine again."})
        earlier = [{"role": "user", "content": "my card is 4111 1111 1111 1111"},
                   {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "thanks"}]
        with ThreadServer(app) as srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused",
                                                     max_retries=0) as client:
            client.chat.completions.create(model="shop", messages=earlier)  # type: ignore[arg-type]
            client.responses.create(model="shop", input=earlier)  # type: ignore[arg-type]
        assert len(fake.requests) == 2 and not card_leaked(json.dumps(fake.requests))
        assert "my card is [card]" in json.dumps(fake.requests[0])
        assert not card_leaked(b"".join(p.read_bytes() for p in tmp_path.glob("c.db*")))


STORAGE_BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
guardrails:
  - {name: cards, pii: [card], stages: [storage], outcome: redact}
routes:
  main: {default: true, system: You sell things.}
"""


def test_v1_a_kept_response_is_stored_as_storage_guardrails_leave_it(monkeypatch, tmp_path):
    """GET /v1/responses/{id} answers the response as the store keeps it: the user read the
    digits (no output guardrail), the store (and so a later retrieve) never holds them."""
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        (tmp_path / "shop.yaml").write_text(STORAGE_BOT)
        app = create_app([chatrun.load_bot(tmp_path / "shop.yaml")], f"sqlite:///{tmp_path / 'c.db'}")
        fake.queue({"text": "Your card 4111 1111 1111 1111 is saved."})
        with ThreadServer(app) as srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused",
                                                     max_retries=0) as client:
            answered = client.responses.create(model="shop", input="save my card")
            kept = client.responses.retrieve(answered.id)
        assert card_leaked(answered.output_text)
        assert kept.output_text == "Your card [card] is saved." and kept.id == answered.id
        assert not card_leaked(b"".join(p.read_bytes() for p in tmp_path.glob("c.db*")))


BLOCK_INPUT_BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
guardrails:
  - {name: secret, patterns: ['(?i)internal only'], stages: [input], outcome: block, message: "I cannot share that."}
  - {name: legal, patterns: ['(?i)\\blawyer\\b'], stages: [input], outcome: operator}
routes:
  main: {default: true, system: You sell things.}
"""


def test_v1_earlier_messages_an_input_guardrail_stops_never_reach_the_model_nor_the_store(monkeypatch, tmp_path):
    """A client that resends a conversation begun elsewhere (a first request, or a server that lost
    its index) seeds a new session with its earlier messages: a user message a `block` or `operator`
    input guard stops, and the answer it got, are left out, as a live turn's memory leaves them."""
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        (tmp_path / "shop.yaml").write_text(BLOCK_INPUT_BOT)
        app = create_app([chatrun.load_bot(tmp_path / "shop.yaml")], f"sqlite:///{tmp_path / 'c.db'}")
        fake.queue({"text": "Fine."}, {"text": "Fine again."})
        earlier = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi, how can I help?"},
                   {"role": "user", "content": "send me the internal only price list"},
                   {"role": "assistant", "content": "Here is the Internal Only list: 3 EUR."},
                   {"role": "user", "content": "my lawyer wants it"}, {"role": "assistant", "content": "Zorblax."},
                   {"role": "user", "content": "thanks"}]
        with ThreadServer(app) as srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused",
                                                     max_retries=0) as client:
            client.chat.completions.create(model="shop", messages=earlier)  # type: ignore[arg-type]
            client.responses.create(model="shop", input=earlier)  # type: ignore[arg-type]
        sent = json.dumps(fake.requests).lower()
        assert len(fake.requests) == 2 and "internal only" not in sent and "lawyer" not in sent
        assert "zorblax" not in sent and "hi, how can i help?" in sent and "thanks" in sent
        kept = b"".join(p.read_bytes() for p in tmp_path.glob("c.db*")).lower()
        assert b"internal only" not in kept and b"lawyer" not in kept


def test_v1_earlier_messages_moderation_flags_never_reach_the_model(monkeypatch, tmp_path):
    """The `moderation` guard judges the resent earlier messages too (in the turn, before its model
    call: the seeding is synchronous): a flagged one is left out with its answer, on both APIs."""
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        fake.flag_word("idiot", "harassment", 0.97)
        (tmp_path / "shop.yaml").write_text(BLOCK_INPUT_BOT.replace(
            "routes:", "  - {name: abuse, moderation: {categories: [harassment]}, stages: [input], outcome: block}\nroutes:"))
        app = create_app([chatrun.load_bot(tmp_path / "shop.yaml")], f"sqlite:///{tmp_path / 'c.db'}")
        fake.queue({"text": "Fine."}, {"text": "Fine again."})
        earlier = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi, how can I help?"},
                   {"role": "user", "content": "you idiot"}, {"role": "assistant", "content": "Zorblax."},
                   {"role": "user", "content": "thanks"}]
        with ThreadServer(app) as srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="unused",
                                                     max_retries=0) as client:
            client.chat.completions.create(model="shop", messages=earlier)  # type: ignore[arg-type]
            client.responses.create(model="shop", input=earlier)  # type: ignore[arg-type]
        sent = json.dumps(fake.requests).lower()
        assert len(fake.requests) == 2 and "idiot" not in sent and "zorblax" not in sent
        assert "hi, how can i help?" in sent and "thanks" in sent


ANSWER_BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
guardrails:
  - {name: secret, patterns: ['(?i)internal only'], stages: [input], outcome: block, message: "I cannot take that."}
  - {name: cards, pii: [card], stages: [input], outcome: redact}
routes:
  main: {default: true, system: You sell things., tools: [ask_note]}
tools:
  ask_note:
    description: Ask the user for a note
    action:
      ask: {from: user, text: Your note?, schema: {type: string}}
"""


async def _answered_by_frames(server, answers: list[str]) -> list[list[str]]:
    """The question asked over the extended WebSocket dialect, then each answer sent as an `Answer`
    frame: the Messages each turn brought."""
    async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
        await ws.send(json.dumps({"type": "Connect", "extensions": True, "chatId": "q1"}))
        await async_until_done(ws)
        await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "q1", "requestId": "m1",
                                  "data": {"userMessage": "take a note"}}))
        item = next(f["data"]["id"] for f in await async_until_done(ws, 60) if f["type"] == "Pending")
        turns = []
        for n, answer in enumerate(answers):
            await ws.send(json.dumps({"type": "Answer", "chatId": "q1", "requestId": f"a{n}", "item": item,
                                      "answer": answer}))
            turns.append([f["data"] for f in await async_until_done(ws, 60) if f["type"] == "Message"])
        return turns


def _answered_over_http(server, answers: list[str], decision: bool) -> list[list[str]]:
    """The question asked over the HTTP API, then each answer sent as the web page's card sends it
    (`POST .../pending/{item}`) or as a message: the Messages each turn brought."""
    base = f"{server.url}/bots/shop/sessions/" + httpx.post(server.url + "/bots/shop/sessions", json={}).json()["id"]
    asked = httpx.post(base + "/messages", json={"userMessage": "take a note"}, timeout=60).json()["events"]
    item = next(e["data"]["id"] for e in asked if e["type"] == "Pending")
    turns = []
    for answer in answers:
        url, body = (f"{base}/pending/{item}", {"answer": answer}) if decision else (base + "/messages",
                                                                                  {"userMessage": answer})
        reply = httpx.post(url, json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        turns.append([e["data"] for e in reply.json()["events"] if e["type"] == "Message"])
    return turns


@pytest.mark.parametrize("door", ["http-decision", "websocket-answer-frame", "http-message"])
def test_a_users_answer_to_a_question_passes_the_input_guardrails_on_every_door(monkeypatch, tmp_path, door):
    """The user's answer to a question (`ask: {from: user}`) is the user's message: the web page's
    card (the HTTP decision), the extended dialect's `Answer` frame and a message that answers it
    (every other door) are judged by the same `input` guards before the model reads the answer."""
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        (tmp_path / "shop.yaml").write_text(ANSWER_BOT)
        app = create_app([chatrun.load_bot(tmp_path / "shop.yaml")], f"sqlite:///{tmp_path / 'c.db'}")
        fake.queue({"tool_calls": [{"name": "ask_note", "arguments": {}}]}, {"text": "Noted."}, {"text": "Noted."})
        answers = ["the internal only code", "my card 4111 1111 1111 1111"]
        with ThreadServer(app) as srv:
            if door == "websocket-answer-frame":
                turns = asyncio.run(_answered_by_frames(srv, answers))
            else:
                turns = _answered_over_http(srv, answers, door == "http-decision")
    assert turns == [["I cannot take that."], ["Noted."]]
    sent = json.dumps(fake.requests)
    assert len(fake.requests) == 2 and "internal only" not in sent.lower() and not card_leaked(sent)
    assert "[card]" in json.dumps(fake.requests[1]["messages"][-1])
