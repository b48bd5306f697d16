"""A user message that says nothing — empty or only whitespace, with no file — runs no turn on
any door (the lead's decision, wire.says_nothing): the HTTP API answers 422 `EmptyMessage`
(JSON and Server-Sent Events, before a stream starts), the WebSocket a Failed `EmptyMessage`
in the chat's dialect, `/v1` a 400 `empty_message` naming the field through the real `openai`
client (Chat Completions and Responses, plain and streamed). Nothing is asked of the model and
no session is made. A file with no text still runs on each door. The channels are in
tests/test_channel_conformance.py and tests/test_channel_slack.py. Real uvicorn, the fake
OpenAI server as the bot's model."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import openai
import pytest
import websockets

import chatrun
from chatrun.server import create_app
from server_support import ThreadServer, async_until_done, write_travel

pytestmark = [pytest.mark.slow]

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
ATTACHMENTS = "    attachments: {kinds: [image/*], max_bytes: 1000, max_count: 3}\n"
SAY_NOTHING = ["", "  \n\t ", None]


@pytest.fixture
def server(fake, tmp_path):
    path = write_travel(tmp_path / "bots")
    text = path.read_text()
    path.write_text(text.replace("    tools: [book_flight, vip_lounge, remember_name]\n",
                                 "    tools: [book_flight, vip_lounge, remember_name]\n" + ATTACHMENTS, 1))
    with ThreadServer(create_app([chatrun.load_bot(path)], f"sqlite:///{tmp_path / 'chat.db'}")) as s:
        yield s


def upload(server, session: str) -> dict:
    answer = httpx.post(f"{server.url}/bots/travel/sessions/{session}/attachments",
                        json={"media_type": "image/png", "data": base64.b64encode(PNG).decode()})
    assert answer.status_code == 201, answer.text
    return answer.json()


def history(server, session: str) -> list:
    return httpx.get(f"{server.url}/bots/travel/sessions/{session}").json()["history"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_http_api_refuses_a_message_that_says_nothing_with_422_naming_the_field(server, fake, stream):
    base = f"{server.url}/bots/travel/sessions"
    session = httpx.post(base, json={}).json()["id"]
    for body in [*({"userMessage": said} for said in SAY_NOTHING), {"userMessage": "", "attachments": []}]:
        answer = httpx.post(f"{base}/{session}/messages", params={"stream": "true"} if stream else None, json=body)
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["error"] == "EmptyMessage" and answer.json()["message"].startswith("userMessage is empty")
    assert history(server, session) == [] and fake.requests == []
    fake.queue({"text": "A dot."})
    sent = httpx.post(f"{base}/{session}/messages", params={"stream": "true"} if stream else None,
                      json={"userMessage": "", "attachments": [upload(server, session)]})
    assert sent.status_code == 200 and "A dot." in sent.text  # a file with no text runs
    assert len(fake.requests) == 1


@pytest.mark.parametrize("extensions", [False, True])
def test_the_websocket_refuses_a_message_that_says_nothing_in_the_chats_dialect(server, fake, extensions):
    async def run() -> tuple[list[list[dict]], list[dict]]:
        async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps({"type": "Connect", "chatId": "c1", "extensions": extensions}))
            await async_until_done(ws)
            refused = []
            for said in SAY_NOTHING:
                await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "c1", "data": {"userMessage": said}}))
                refused.append(await async_until_done(ws))
            fake.queue({"text": "A dot."})
            ref = await asyncio.to_thread(upload, server, "c1")
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "c1",
                                      "data": {"userMessage": " ", "attachments": [ref]}}))
            return refused, await async_until_done(ws, 30)

    refused, sent = asyncio.run(run())
    for frames in refused:
        assert frames[-1] == {"chatId": "c1", "type": "Failed", "data": "EmptyMessage"}
        if extensions:
            assert frames[0]["type"] == "Error" and "ChatRouteMessage.data.userMessage is empty" in frames[0]["data"]
        else:
            assert len(frames) == 1  # the Quarkus dialect: a Failed alone, as a Quarkus page expects
    assert sent[-1]["type"] == "Completed" and len(fake.requests) == 1


def refused(create, code: str = "empty_message", **request) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        create(**request)
    assert caught.value.code == code, caught.value.body
    return caught.value


@pytest.mark.parametrize("stream", [False, True])
def test_v1_refuses_a_last_user_message_that_says_nothing_with_400_naming_the_field(server, fake, stream):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        for content in ["", " \n ", [{"type": "text", "text": "  "}], []]:
            for earlier in ([], [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]):
                error = refused(client.chat.completions.create, model="travel",
                                messages=[*earlier, {"role": "user", "content": content}], stream=stream)
                assert error.param == "messages" and "the last user message of messages is empty" in error.message
        # `input: ""` is refused by the request's schema already, naming the field.
        error = refused(client.responses.create, "invalid_request", model="travel", input="", stream=stream)
        assert error.body["message"] == "input: '' should be non-empty"
        for given in ["   ", [{"role": "user", "content": [{"type": "input_text", "text": ""}]}]]:
            error = refused(client.responses.create, model="travel", input=given, stream=stream)
            assert error.param == "input" and "is empty" in error.message
        assert fake.requests == []
        refused(client.chat.completions.create, model="travel", messages=[{"role": "user", "content": ""}],
                extra_headers={"X-Chatrun-Session": "named"})
        assert httpx.get(f"{server.url}/bots/travel/sessions/named").status_code == 404  # no session made
        fake.queue({"text": "A dot."}, {"text": "A dot again."})
        image = {"type": "image_url", "image_url": {"url": PNG_URL}}
        client.chat.completions.create(model="travel", messages=[{"role": "user", "content": [image]}])
        client.responses.create(model="travel", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": PNG_URL}]}])
    assert len(fake.requests) == 2  # a file with no text runs


def test_v1_refuses_more_than_one_choice_naming_n(server, fake):
    """`n: 2` ran one turn and answered one choice: a client reading choices[1] failed, and a turn
    whose tools act cannot be sampled twice. Refused before anything runs; `n: 1` runs."""
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        for n, message in [(2, "n: 2 is greater than the maximum of 1"), (0, "n: 0 is less than the minimum of 1")]:
            error = refused(client.chat.completions.create, "invalid_request", model="travel", n=n,
                            messages=[{"role": "user", "content": "Hi"}])
            assert error.body["message"] == message
        assert fake.requests == []
        fake.queue({"text": "Hello."})
        one = client.chat.completions.create(model="travel", n=1, messages=[{"role": "user", "content": "Hi"}])
    assert [c.message.content for c in one.choices] == ["Hello."]
