"""The unruly model (issue 32) on every door of one real server: the WebSocket in both dialects,
the HTTP API as JSON and as Server-Sent Events, `/v1` Chat Completions (the history resent, the
session header; plain and streamed) and Responses (`previous_response_id`; plain and streamed),
through the real `openai` client, and AG-UI (read with the protocol's own types); then two
replicas on one Redis. tests/test_unruly_doors.py holds the single-door cases, the channels are
in tests/test_channel_conformance.py.

Whatever the model does, on every door: a `once` call it repeats six times an answer, answer
after answer and turn after turn, pays once; its own consent flag (and the values it invents)
pays nothing until the user says yes, and the yes pays once; a model that calls a tool for ever
ends its turn at `limits.max_model_calls`, and the user reads the fallback; a model that answers
garbage or does not answer in time fails the turn, and the user is told."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
import websockets

import chatrun
from chatrun.definition.page_texts import BUILTIN
from chatrun.events import MODEL_FAILED_TEXT
from chatrun.server import create_app
from chatrun.testing.fake_openai import FakeOpenAI
from server_support import ThreadServer, async_until_done
from webhook_support import Receiver

pytestmark = [pytest.mark.slow]

BOT = """
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: true, timeout: 1}
env: {PAY_URL: {}}
limits: {max_model_calls: 4}
routes:
  main: {default: true, system: You pay and send money., tools: [pay, send, bump]}
tools:
  pay:
    effect: once
    description: Pay someone
    parameters:
      type: object
      properties: {to: {type: string}, amount: {type: number}}
      required: [to, amount]
    http: {method: POST, url: "{{ env.PAY_URL }}/pay", json: {to: "{{ args.to }}", amount: "{{ args.amount }}"}}
    action: {reply: "Paid {{ args.amount }} to {{ args.to }}."}
  send:
    description: Send money (the user is asked to confirm)
    parameters:
      type: object
      properties: {to: {type: string}, amount: {type: number}}
      required: [to, amount]
    http: {method: POST, url: "{{ env.PAY_URL }}/send", json: {to: "{{ args.to }}", amount: "{{ args.amount }}"}}
    confirm: "Send {{ args.amount }} EUR to {{ args.to }}?"
    action: {reply: "Sent {{ args.amount }} EUR to {{ args.to }}."}
  bump:
    description: Count one more
    action: {reply: Counted.}
"""
FALLBACK = BUILTIN["en"]["fallback"]


def _calls_since_user(body: dict[str, Any]) -> int:
    """The model's answers with calls since the user's last message."""
    count = 0
    for message in reversed(body["messages"]):
        if message["role"] == "user":
            return count
        count += bool(message["role"] == "assistant" and message.get("tool_calls"))
    return count


def _user_said(body: dict[str, Any]) -> str:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


def model(body: dict[str, Any]) -> dict[str, Any]:
    """The unruly model, by what the user said last (a door's session id is in it)."""
    said, calls = _user_said(body), _calls_since_user(body)
    who = said.split()[-1]  # the door's own payee: each door's payments are its own
    if said.startswith("pay"):  # six times an answer, two answers, every turn
        if calls < 2:
            return {"unruly": "repeat_call", "call": {"name": "pay", "arguments": {"to": who, "amount": 30}},
                    "times": 6}
        return {"text": "Paid."}
    if said.startswith("send"):  # the model fills in its own consent; after the user's yes, calls again
        if calls == 0:
            return {"unruly": "self_confirm", "call": {"name": "send", "arguments": {"to": who, "amount": 1000}}}
        return {"unruly": ["repeat_call", "self_confirm"]} if calls < 3 else {"text": "Sent."}
    if said.startswith("write"):  # the call written into the text (`write tag NAME`), streamed
        if calls == 0 and body["messages"][-1]["role"] == "user":
            return {"unruly": "as_text", "format": said.split()[1], "text": "Paying now.",
                    "call": {"name": "pay", "arguments": {"to": who, "amount": 5}}}
        return {"text": "Paid."}
    if said.startswith("loop"):
        return {"tool_calls": [{"name": "bump", "arguments": {}}]}
    if said.startswith("garbage"):
        return {"raw": "<html>502 Bad Gateway</html>"}
    if said.startswith("slow"):
        return {"stall": True, "chunks": ["Let me"]}
    raise AssertionError(f"the unruly model has no answer for {said!r}")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def server(tmp_path_factory, receiver) -> Iterator[ThreadServer]:
    root = tmp_path_factory.mktemp("unruly")
    (root / "bot.yaml").write_text(BOT)
    with FakeOpenAI(responder=model) as fake, pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_BASE_URL", fake.base_url)
        env.setenv("OPENAI_API_KEY", "test-key")
        env.setenv("PAY_URL", receiver.url)
        app = create_app([chatrun.load_bot(root / "bot.yaml")], f"sqlite:///{root / 'c.db'}")
        with ThreadServer(app) as srv:
            yield srv


@dataclass
class Reply:
    """What one turn brought the user: the texts they read, and whether they were told it failed."""

    texts: list[str] = field(default_factory=list)
    failed: str | None = None

    @property
    def text(self) -> str:
        return "\n\n".join(self.texts)


class Door:
    """A client of one door, keeping one conversation."""

    def __init__(self, server: ThreadServer):
        self.server = server

    def say(self, text: str) -> Reply:
        raise NotImplementedError


CHATS = itertools.count(1)


class WebSocket(Door):
    def __init__(self, server: ThreadServer, extensions: bool):
        super().__init__(server)
        self.extensions = extensions
        self.chat = f"chat-{'ext' if extensions else 'quarkus'}-{next(CHATS)}"  # a session of its own
        self.count = 0

    def say(self, text: str) -> Reply:
        self.count += 1
        return asyncio.run(self._say(text))

    async def _say(self, text: str) -> Reply:
        async with websockets.connect(self.server.ws_url + "/_chat/routes") as ws:
            await ws.send(json.dumps({"type": "Connect", "chatId": self.chat, "extensions": self.extensions,
                                      "resume": self.count > 1}))
            await async_until_done(ws)
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": self.chat, "requestId": f"r{self.count}",
                                      "data": {"userMessage": text}}))
            frames = await async_until_done(ws, 60)
        reply = Reply([f["data"]["ask"] if f["type"] == "Pending" else f["data"] for f in frames
                       if f["type"] in ("Message", "Pending")])
        if frames[-1]["type"] == "Failed":
            reply.failed = " ".join([str(frames[-1]["data"]), *(f["data"] for f in frames if f["type"] == "Error")])
        return reply


class Http(Door):
    def __init__(self, server: ThreadServer, sse: bool):
        super().__init__(server)
        self.sse = sse
        self.session = httpx.post(server.url + "/bots/shop/sessions", json={}).json()["id"]

    def say(self, text: str) -> Reply:
        url = f"{self.server.url}/bots/shop/sessions/{self.session}/messages" + ("?stream=true" if self.sse else "")
        response = httpx.post(url, json={"userMessage": text}, timeout=60)
        assert response.status_code == 200, response.text
        if self.sse:
            events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        else:
            events = response.json()["events"]
        reply = Reply([e["data"]["ask"] if e["type"] == "Pending" else e["data"] for e in events
                       if e["type"] in ("Message", "Pending")])
        errors = [str(e["data"]) for e in events if e["type"] == "Error"]
        if errors:
            reply.failed = " ".join(errors)
        return reply


def openai_client(server: ThreadServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(timeout=60))


class ChatCompletions(Door):
    """The history resent (as chat front ends do), or the session named in the header."""

    def __init__(self, server: ThreadServer, stream: bool, how: str):
        super().__init__(server)
        self.stream, self.how = stream, how
        self.history: list[dict[str, str]] = []
        self.headers: dict[str, str] = {}
        self.client = openai_client(server)

    def say(self, text: str) -> Reply:
        messages = [*self.history, {"role": "user", "content": text}]
        try:
            if self.stream:
                with self.client.chat.completions.stream(model="shop", messages=messages,  # type: ignore[arg-type]
                                                         extra_headers=self.headers) as stream:
                    chunks = [event.chunk for event in stream if event.type == "chunk"]
                    completion = stream.get_final_completion()
                extra = chunks[-1].model_extra  # the SDK's final completion drops the last chunk's `chatrun`
            else:
                completion = self.client.chat.completions.create(model="shop", messages=messages,  # type: ignore[arg-type]
                                                                 extra_headers=self.headers)
                extra = completion.model_extra
        except openai.APIError as error:
            return Reply(failed=str(error))
        content = completion.choices[0].message.content or ""
        if self.how == "history":
            self.history = [*messages, {"role": "assistant", "content": content}]
        elif self.how == "header":
            self.headers = {"X-Chatrun-Session": (extra or {})["chatrun"]["session"]}
        return Reply([content])


class Responses(Door):
    """Each turn continues the previous response (`previous_response_id`)."""

    def __init__(self, server: ThreadServer, stream: bool):
        super().__init__(server)
        self.stream = stream
        self.last: str | None = None
        self.client = openai_client(server)

    def say(self, text: str) -> Reply:
        more: dict[str, Any] = {"previous_response_id": self.last} if self.last else {}
        try:
            if self.stream:
                events = list(self.client.responses.create(model="shop", input=text, stream=True, **more))
                failed = [e for e in events if e.type in ("error", "response.failed")]
                if failed:
                    return Reply(failed=str(failed[0]))
                response = next(e.response for e in events if e.type == "response.completed")
            else:
                response = self.client.responses.create(model="shop", input=text, **more)
        except openai.APIError as error:
            return Reply(failed=str(error))
        self.last = response.id
        return Reply([response.output_text])


class AgUi(Door):
    """`POST /agui/shop`, one thread, each event read with ag-ui-protocol's types; the user's
    confirmation is an interrupt (its question what the user reads), decided by the next run's
    `resume` when the user says yes."""

    def __init__(self, server: ThreadServer):
        super().__init__(server)
        self.thread, self.count, self.interrupts = f"agui-{next(CHATS)}", 0, []

    def say(self, text: str) -> Reply:
        from ag_ui.core import Event, EventType
        from pydantic import TypeAdapter

        self.count += 1
        body: dict[str, Any] = {"threadId": self.thread, "runId": f"run-{self.count}", "state": {}, "tools": [],
                                "context": [], "forwardedProps": {},
                                "messages": [{"id": f"u{self.count}", "role": "user", "content": text}]}
        if text == "yes" and self.interrupts:
            body["resume"] = [{"interruptId": self.interrupts[0].id, "status": "resolved",
                               "payload": {"decision": "approve"}}]
        response = httpx.post(self.server.url + "/agui/shop", json=body, timeout=60)
        adapter: TypeAdapter[Any] = TypeAdapter(Event)
        events = [adapter.validate_json(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        reply = Reply(["".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)])
        last = events[-1]
        if last.type == EventType.RUN_ERROR:
            reply.failed = last.message
        elif last.outcome is not None and last.outcome.type == "interrupt":
            self.interrupts = list(last.outcome.interrupts)
            reply.texts.extend(i.message for i in self.interrupts)
        reply.texts = [t for t in reply.texts if t]
        return reply


DOORS = {
    "websocket": lambda s: WebSocket(s, extensions=True),
    "websocket-quarkus": lambda s: WebSocket(s, extensions=False),
    "http-json": lambda s: Http(s, sse=False),
    "http-sse": lambda s: Http(s, sse=True),
    "v1-chat-history": lambda s: ChatCompletions(s, stream=False, how="history"),
    "v1-chat-stream-history": lambda s: ChatCompletions(s, stream=True, how="history"),
    "v1-chat-stream-session-header": lambda s: ChatCompletions(s, stream=True, how="header"),
    "v1-responses-previous": lambda s: Responses(s, stream=False),
    "v1-responses-stream-previous": lambda s: Responses(s, stream=True),
    "agui": AgUi,
}


@pytest.mark.parametrize("door", DOORS)
def test_a_once_call_the_model_repeats_in_every_answer_and_turn_pays_once(server, receiver, door):
    client, who = DOORS[door](server), f"payee-{door}"
    first = client.say(f"pay {who}")
    assert first.failed is None and first.text == "Paid.", first
    again = client.say(f"pay again to be sure {who}")
    assert again.failed is None and again.text == "Paid.", again
    assert [d.body for d in receiver.seen() if d.body["to"] == who] == [{"to": who, "amount": 30}]


@pytest.mark.parametrize("door", DOORS)
def test_the_models_consent_sends_nothing_and_the_users_yes_sends_once(server, receiver, door):
    client, who = DOORS[door](server), f"recipient-{door}"
    asked = client.say(f"send {who}")
    assert asked.failed is None and f"Send 1000 EUR to {who}?" in asked.text, asked
    assert [d.body for d in receiver.seen() if d.body["to"] == who] == []
    decided = client.say("yes")
    assert decided.failed is None and decided.text.endswith("Sent."), decided
    assert [d.body for d in receiver.seen() if d.body["to"] == who] == [{"to": who, "amount": 1000}]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("form", ["tag", "fenced", "bare"])
def test_a_call_written_as_text_runs_once_and_no_door_shows_it(server, receiver, door, form):
    client, who = DOORS[door](server), f"text-{form}-{door}"
    reply = client.say(f"write {form} {who}")
    assert reply.failed is None, reply
    assert reply.texts in (["Paying now.", "Paid."], ["Paying now.\n\nPaid."], ["Paying now.Paid."]), reply
    assert [d.body for d in receiver.seen() if d.body["to"] == who] == [{"to": who, "amount": 5}]


@pytest.mark.parametrize("door", DOORS)
def test_a_model_that_calls_a_tool_for_ever_ends_its_turn_and_the_user_reads_the_fallback(server, door):
    client = DOORS[door](server)
    reply = client.say("loop")
    assert reply.failed is None and reply.text == FALLBACK, reply


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("what", ["garbage", "slow"])
def test_a_model_that_answers_garbage_or_nothing_in_time_fails_the_turn_and_the_user_is_told(server, door, what):
    client = DOORS[door](server)
    reply = client.say(what)
    # Told it failed, in words (the Quarkus dialect has none: Failed("ServerError"), as Quarkus ends a failing route).
    assert reply.failed is not None and (MODEL_FAILED_TEXT in reply.failed or reply.failed == "ServerError"), reply


@pytest.mark.subprocess
def test_on_two_replicas_sharing_redis_the_turns_alternate_and_each_effect_happens_once(
        tmp_path, redis_server, receiver, monkeypatch):
    """`/v1` with the history resent, each request to the other replica than the one before
    (each reads the conversation whole: it did not serve the request before)."""
    from redis_support import Replica

    (tmp_path / "bot.yaml").write_text(BOT)
    monkeypatch.setenv("PAY_URL", receiver.url)
    with FakeOpenAI(responder=model) as fake:
        store = redis_server.url()  # one store: each url() is a key prefix of its own
        replicas = [Replica(str(tmp_path / "bot.yaml"), store, fake.base_url) for _ in range(2)]
        try:
            doors = []
            for replica in replicas:
                door = ChatCompletions(server=replica.start(), stream=False, how="history")  # type: ignore[arg-type]
                doors.append(door)
            history: list[dict[str, str]] = []
            for n, text in enumerate(["pay payee-replicas", "pay again to be sure payee-replicas",
                                      "send recipient-replicas", "yes"]):
                door = doors[n % 2]
                door.history = history
                reply = door.say(text)
                assert reply.failed is None, (text, reply)
                history = door.history
            assert reply.text == "Sent."
        finally:
            for replica in replicas:
                replica.kill()
    assert sorted((d.body["to"], d.body["amount"]) for d in receiver.seen() if "replicas" in d.body["to"]) == [
        ("payee-replicas", 30), ("recipient-replicas", 1000)]
