"""`--max-message-chars` on every door of one real server (docs/protocol.md, "Limits and
timeouts"): the WebSocket in both dialects, the HTTP API as JSON and as Server-Sent Events,
`/v1` Chat Completions (the last user message, and an earlier one of the list resent) and
Responses (a string input, and an earlier item of a list), and AG-UI. On each door a message of
exactly the limit is answered, one character more is refused before any model call, in the
door's own shape, naming the limit — the same number everywhere. The channels and the phone
are in tests/test_channel_conformance.py and tests/test_channel_twilio.py; a question's answer,
a reason and an operator's line in tests/test_pending_server.py."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import websockets

import chatrun
from chatrun.server import create_app
from chatrun.server.wire import ServerLimits
from chatrun.testing.fake_openai import FakeOpenAI
from server_support import ThreadServer, async_until_done

pytestmark = [pytest.mark.slow]

LIMIT = 40
BOT = """
name: desk
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main: {default: true, system: You answer briefly.}
"""
CHATS = itertools.count(1)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[ThreadServer, FakeOpenAI]]:
    root = tmp_path_factory.mktemp("limits")
    (root / "bot.yaml").write_text(BOT)
    with FakeOpenAI(responder=lambda body: {"text": "Noted."}) as fake, pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_BASE_URL", fake.base_url)
        env.setenv("OPENAI_API_KEY", "test-key")
        app = create_app([chatrun.load_bot(root / "bot.yaml")], f"sqlite:///{root / 'c.db'}",
                         limits=ServerLimits(max_message_chars=LIMIT))
        with ThreadServer(app) as server:
            yield server, fake


# Each door sends `text` as a new conversation's user message and says (answered, what the
# client read): the reply's text, or the refusal as the client sees it.
Door = Callable[[ThreadServer, str], tuple[bool, str]]


def websocket(extensions: bool) -> Door:
    def say(server: ThreadServer, text: str) -> tuple[bool, str]:
        async def run() -> list[dict[str, Any]]:
            chat = f"c{next(CHATS)}"
            async with websockets.connect(server.ws_url + "/_chat/routes") as ws:
                await ws.send(json.dumps({"type": "Connect", "chatId": chat, "extensions": extensions}))
                await async_until_done(ws)
                await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": chat, "data": {"userMessage": text}}))
                return await async_until_done(ws)

        frames = asyncio.run(run())
        said = " ".join(str(f["data"]) for f in frames if f["type"] in ("Message", "Error", "Failed"))
        return frames[-1]["type"] == "Completed", said
    return say


def http(sse: bool) -> Door:
    def say(server: ThreadServer, text: str) -> tuple[bool, str]:
        session = httpx.post(server.url + "/bots/desk/sessions", json={}).json()["id"]
        answer = httpx.post(f"{server.url}/bots/desk/sessions/{session}/messages" + ("?stream=true" if sse else ""),
                            json={"userMessage": text}, timeout=30)
        if answer.status_code != 200:
            return False, f"{answer.status_code} {answer.json()['error']}: {answer.json()['message']}"
        lines = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
        events = lines if sse else answer.json()["events"]
        return True, " ".join(str(e["data"]) for e in events if e["type"] == "Message")
    return say


def v1(send: Callable[[openai.OpenAI, str], str]) -> Door:
    def say(server: ThreadServer, text: str) -> tuple[bool, str]:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
            try:
                return True, send(client, text)
            except openai.APIStatusError as error:
                body = error.body if isinstance(error.body, dict) else {}
                return False, f"{error.status_code} {body.get('code')} {body.get('param')}: {body.get('message')}"
    return say


def chat_last(client: openai.OpenAI, text: str) -> str:
    messages: Any = [{"role": "user", "content": text}]
    return client.chat.completions.create(model="desk", messages=messages).choices[0].message.content or ""


def chat_earlier(client: openai.OpenAI, text: str) -> str:
    messages: Any = [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."},
                     {"role": "user", "content": f"and {next(CHATS)}?"}]
    return client.chat.completions.create(model="desk", messages=messages).choices[0].message.content or ""


def responses_input(client: openai.OpenAI, text: str) -> str:
    return client.responses.create(model="desk", input=text).output_text


def responses_earlier(client: openai.OpenAI, text: str) -> str:
    items: Any = [{"role": "user", "content": text}, {"role": "user", "content": f"and {next(CHATS)}?"}]
    return client.responses.create(model="desk", input=items).output_text


def agui(server: ThreadServer, text: str) -> tuple[bool, str]:
    n = next(CHATS)
    answer = httpx.post(server.url + "/agui/desk", timeout=30, json={
        "threadId": f"agui-{n}", "runId": f"run-{n}", "state": {}, "tools": [], "context": [], "forwardedProps": {},
        "messages": [{"id": f"u{n}", "role": "user", "content": text}]})
    if answer.status_code != 200:
        return False, f"{answer.status_code} {answer.json()['error']}: {answer.json()['message']}"
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    return events[-1]["type"] == "RUN_FINISHED", "".join(e.get("delta", "") for e in events)


OVER = f"of {LIMIT + 1} characters is over the limit of {LIMIT} (--max-message-chars): send a shorter one"
DOORS: dict[str, tuple[Door, str]] = {  # the door, and its refusal as its client reads it
    "websocket": (websocket(True), f"userMessage {OVER} TooLarge"),  # the Error saying why, then Failed
    "websocket-quarkus": (websocket(False), "TooLarge"),  # Failed alone: Quarkus never sends an Error (protocol.md)
    "http-json": (http(False), f"413 TooLarge: userMessage {OVER}"),
    "http-sse": (http(True), f"413 TooLarge: userMessage {OVER}"),
    "v1-chat-last": (v1(chat_last), f"413 too_large messages[0].content: messages[0].content {OVER}"),
    "v1-chat-earlier": (v1(chat_earlier), f"413 too_large messages[0].content: messages[0].content {OVER}"),
    "v1-responses-input": (v1(responses_input), f"413 too_large input: input {OVER}"),
    "v1-responses-earlier": (v1(responses_earlier), f"413 too_large input[0].content: input[0].content {OVER}"),
    "agui": (agui, f"413 TooLarge: messages[0].content {OVER}"),
}


@pytest.mark.parametrize("door", DOORS)
def test_every_door_takes_a_message_of_the_limit_and_refuses_one_more_character_before_the_model(served, door):
    server, fake = served
    send, refusal = DOORS[door]
    answered, said = send(server, "a" * LIMIT)
    assert answered and "Noted." in said, said
    asked = len(fake.requests)
    assert send(server, "a" * (LIMIT + 1)) == (False, refusal)
    assert len(fake.requests) == asked  # refused before any model call
