"""A guarantee is tested on every door it claims (issue 37): the same three turns through each
door of one real server — the WebSocket in both dialects (and a Quarkus `Multi<String>` route),
the HTTP API as JSON and as Server-Sent Events, `/v1` Chat Completions (plain, streamed, the
history resent, the session header) and Responses (plain, streamed, `previous_response_id`)
through the real `openai` client, and AG-UI read with the protocol's own types:

- the model (the fake OpenAI server) streams a card number: no door receives its digits, every
  door reads the redacted reply;
- it streams a sentence an output guardrail blocks: no door receives the blocked words, every
  door reads the checked start and the guardrail's message;
- it cites a knowledge passage: every door carries the citation, each in its own way (a Sources
  frame or event, OpenAI's `url_citation` annotations, an AG-UI `sources` activity).

The guardrails guard the `output` stage only (not `storage`), so a door that read the reply
from the store would not be saved by storage redaction. The channels are in
tests/test_channel_conformance.py (the same turns through Telegram, Slack, WhatsApp and Teams)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
import websockets

import chatrun
from chatrun.server import create_app
from chatrun.testing.fake_openai import FakeOpenAI
from leak_support import card_leaked
from server_support import ThreadServer, async_until_done

pytestmark = [pytest.mark.slow]

BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: true}
knowledge:
  guides: {path: guides, url: "https://docs.example/{path}#{anchor}"}
guardrails:
  - {name: cards, pii: [card], stages: [output], outcome: redact, release: sentence}
  - {name: secret, patterns: ['(?i)internal only'], stages: [output], outcome: block, release: sentence,
     message: "I cannot share that."}
routes:
  main: {default: true, system: You sell things., knowledge: {sources: [guides], retrieve: auto}}
  multi: {system: You sell things., knowledge: {sources: [guides], retrieve: auto}, stream_to_quarkus: true}
"""
GUIDE = "# Returns\n\n## Refund window\n\nReturn any item within 30 days for a full refund.\n"
REPLIES = {  # what the model streams for each user message
    "save my card": ["Thanks. Your card ", "4111 1111 ", "1111 1111 is ", "saved. Bye"],
    "prices?": ["Sure. The price list ", "is for internal ", "only. Ask me later."],
    "refund?": ["Thirty days ", "[returns.md#refund-window]."],
}
TURNS = list(REPLIES)
READS = ["Thanks. Your card [card] is saved. Bye", "Sure. I cannot share that.",
         "Thirty days [returns.md#refund-window]."]
CITATION = ("Returns › Refund window", "https://docs.example/returns#refund-window")


def responder(body: dict[str, Any]) -> dict[str, Any]:
    said = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return {"chunks": REPLIES[said]}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ThreadServer]:
    root = tmp_path_factory.mktemp("doors")
    (root / "guides").mkdir()
    (root / "guides" / "returns.md").write_text(GUIDE)
    (root / "bot.yaml").write_text(BOT)
    with FakeOpenAI(responder=responder) as fake, pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_BASE_URL", fake.base_url)
        env.setenv("OPENAI_API_KEY", "test-key")
        app = create_app([chatrun.load_bot(root / "bot.yaml")], f"sqlite:///{root / 'c.db'}")
        with ThreadServer(app) as srv:
            yield srv


@dataclass
class Seen:
    """What one turn brought a client: everything it received (to search for leaks), the reply
    as its user reads it, and the citations as (title, url)."""

    received: str
    text: str
    citations: list[tuple[str, str]] = field(default_factory=list)


class Door:
    """A client of one door; `talk` runs a conversation's turns (a door keeps its conversation)."""

    def __init__(self, server: ThreadServer):
        self.server = server

    def talk(self, texts: list[str]) -> list[Seen]:
        return [self.say(text) for text in texts]

    def say(self, text: str) -> Seen:
        raise NotImplementedError


def cited(sources: Any) -> list[tuple[str, str]]:
    return [(s["title"], s["url"]) for s in sources["sources"]]


class WebSocket(Door):
    """The `/_chat/routes` WebSocket, one chat on one connection: chatrun's dialect, or the
    Quarkus one (on a route)."""

    def __init__(self, server: ThreadServer, extensions: bool, route: str | None = None):
        super().__init__(server)
        self.chat = f"chat-{'ext' if extensions else 'quarkus'}-{route or 'main'}"  # a session of its own
        self.connect = {"type": "Connect", "chatId": self.chat, "extensions": extensions} | ({"route": route} if route else {})

    def talk(self, texts: list[str]) -> list[Seen]:
        return [self.seen(frames) for frames in asyncio.run(self._turns(texts))]

    async def _turns(self, texts: list[str]) -> list[list[dict[str, Any]]]:
        async with websockets.connect(self.server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps(self.connect))
            await async_until_done(ws)
            turns = []
            for i, text in enumerate(texts):
                await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": self.chat, "requestId": f"r{i}",
                                          "data": {"userMessage": text}}))
                turns.append(await async_until_done(ws, 60))
            return turns

    @staticmethod
    def seen(frames: list[dict[str, Any]]) -> Seen:
        streamed = "".join(f["data"] for f in frames if f["type"] == "Stream")
        messages = [f["data"] for f in frames if f["type"] == "Message"]
        sources = [cited(f["data"]) for f in frames if f["type"] == "Sources"]
        read = messages[0] if messages else streamed  # a Multi route: its chunks are the reply
        return Seen(json.dumps(frames), read, sources[0] if sources else [])


class Http(Door):
    """The HTTP API: a session, its messages answered as JSON or as Server-Sent Events."""

    def __init__(self, server: ThreadServer, sse: bool):
        super().__init__(server)
        self.sse = sse
        self.session = httpx.post(server.url + "/bots/shop/sessions", json={}).json()["id"]

    def say(self, text: str) -> Seen:
        url = f"{self.server.url}/bots/shop/sessions/{self.session}/messages" + ("?stream=true" if self.sse else "")
        response = httpx.post(url, json={"userMessage": text}, timeout=60)
        assert response.status_code == 200, response.text
        if self.sse:
            events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        else:
            events = response.json()["events"]
        messages = [e["data"] for e in events if e["type"] == "Message"]
        sources = [cited(e["data"]) for e in events if e["type"] == "Sources"]
        return Seen(response.text, messages[0], sources[0] if sources else [])


class ChatCompletions(Door):
    """`/v1/chat/completions` through the `openai` client: plain or streamed; a conversation
    continued by resending its history, or by naming its session in the header."""

    def __init__(self, server: ThreadServer, stream: bool, how: str):
        super().__init__(server)
        self.stream, self.how = stream, how
        self.history: list[dict[str, str]] = []
        self.headers: dict[str, str] = {}
        self.client, self.tee = openai_client(server)

    def say(self, text: str) -> Seen:
        messages = [*self.history, {"role": "user", "content": text}]
        if self.stream:  # the SDK's own accumulation of the deltas into the final message
            with self.client.chat.completions.stream(model="shop", messages=messages,  # type: ignore[arg-type]
                                                     extra_headers=self.headers) as stream:
                chunks = [event.chunk for event in stream if event.type == "chunk"]
                completion = stream.get_final_completion()
            extra = chunks[-1].model_extra  # the final completion the SDK builds drops the last chunk's `chatrun`
        else:
            completion = self.client.chat.completions.create(model="shop", messages=messages,  # type: ignore[arg-type]
                                                             extra_headers=self.headers)
            extra = completion.model_extra
        message = completion.choices[0].message
        if self.how == "history":
            self.history = [*messages, {"role": "assistant", "content": message.content or ""}]
        elif self.how == "header":
            session = (extra or {})["chatrun"]["session"]
            assert self.headers in ({}, {"X-Chatrun-Session": session}), "the header's session was not continued"
            self.headers = {"X-Chatrun-Session": session}
        citations = [(a.url_citation.title, a.url_citation.url) for a in message.annotations or ()]
        for a in message.annotations or ():  # each spans the `[ref]` that cites it
            assert (message.content or "")[a.url_citation.start_index:a.url_citation.end_index] == \
                "[returns.md#refund-window]"
        return Seen(self.tee.received(), message.content or "", citations)


class Responses(Door):
    """`/v1/responses` through the `openai` client: plain, streamed (its typed events), or each
    turn continuing the previous response (`previous_response_id`)."""

    def __init__(self, server: ThreadServer, stream: bool, previous: bool):
        super().__init__(server)
        self.stream, self.previous = stream, previous
        self.last: str | None = None
        self.client, self.tee = openai_client(server)

    def say(self, text: str) -> Seen:
        more: dict[str, Any] = {"previous_response_id": self.last} if self.previous and self.last else {}
        if self.stream:
            events = list(self.client.responses.create(model="shop", input=text, stream=True, **more))
            response = next(e.response for e in events if e.type == "response.completed")
            added = [e.annotation for e in events if e.type == "response.output_text.annotation.added"]
            assert [(a.title, a.url) for a in added] == \
                [(a.title, a.url) for a in response.output[0].content[0].annotations]  # type: ignore[union-attr]
        else:
            response = self.client.responses.create(model="shop", input=text, **more)
        self.last = response.id
        part = response.output[0].content[0]  # type: ignore[union-attr]
        citations = [(a.title, a.url) for a in part.annotations if a.type == "url_citation"]  # type: ignore[union-attr]
        return Seen(self.tee.received(), response.output_text, citations)


class AgUi(Door):
    """`POST /agui/shop`, every event read with ag-ui-protocol's types; one thread."""

    def __init__(self, server: ThreadServer):
        super().__init__(server)
        self.count = 0

    def say(self, text: str) -> Seen:
        from ag_ui.core import Event, EventType
        from pydantic import TypeAdapter

        self.count += 1
        body = {"threadId": "agui-1", "runId": f"run-{self.count}", "state": {}, "tools": [], "context": [],
                "forwardedProps": {}, "messages": [{"id": f"u{self.count}", "role": "user", "content": text}]}
        response = httpx.post(self.server.url + "/agui/shop", json=body, timeout=60,
                              headers={"Accept": "text/event-stream"})
        adapter: TypeAdapter[Any] = TypeAdapter(Event)
        events = [adapter.validate_json(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1].type == EventType.RUN_FINISHED
        said = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)
        message_ids = {e.message_id for e in events if e.type == EventType.TEXT_MESSAGE_START}
        activities = [e for e in events if e.type == EventType.ACTIVITY_SNAPSHOT and e.activity_type == "sources"]
        assert all(a.content["messageId"] in message_ids for a in activities)  # the message they cite
        return Seen(response.text, said, cited(activities[0].content) if activities else [])


class _Tee(httpx.HTTPTransport):
    """The `openai` client's transport, keeping every byte the server sent it (streams too)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        inner, kept = response.stream, self.bytes

        class Kept(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for chunk in inner:  # type: ignore[union-attr]
                    kept.extend(chunk)
                    yield chunk

            def close(self) -> None:
                inner.close()  # type: ignore[union-attr]

        response.stream = Kept()
        return response

    def received(self) -> str:
        out = self.bytes.decode()
        self.bytes.clear()
        return out


def openai_client(server: ThreadServer) -> tuple[openai.OpenAI, _Tee]:
    tee = _Tee()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(transport=tee, timeout=60))
    return client, tee


DOORS = {
    "websocket": lambda s: WebSocket(s, extensions=True),
    "websocket-quarkus": lambda s: WebSocket(s, extensions=False),
    "websocket-quarkus-multi": lambda s: WebSocket(s, extensions=False, route="multi"),
    "http-json": lambda s: Http(s, sse=False),
    "http-sse": lambda s: Http(s, sse=True),
    "v1-chat": lambda s: ChatCompletions(s, stream=False, how="history"),
    "v1-chat-stream-history": lambda s: ChatCompletions(s, stream=True, how="history"),
    "v1-chat-stream-session-header": lambda s: ChatCompletions(s, stream=True, how="header"),
    "v1-responses": lambda s: Responses(s, stream=False, previous=False),
    "v1-responses-stream": lambda s: Responses(s, stream=True, previous=False),
    "v1-responses-stream-previous": lambda s: Responses(s, stream=True, previous=True),
    "agui": AgUi,
}


@pytest.mark.parametrize("door", DOORS)
def test_no_door_receives_a_guarded_word_and_every_door_carries_the_citation(server, door):
    seen = DOORS[door](server).talk(TURNS)
    for turn in seen:
        assert not card_leaked(turn.received), turn.received
        assert "internal" not in turn.received.lower()
    assert [turn.text for turn in seen] == READS
    assert [turn.citations for turn in seen] == [[], [], [CITATION]]
