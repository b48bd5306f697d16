"""The fake OpenAI server on the wire: HTTP, SSE framing, scripting, concurrency."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest

from chatrun.testing.fake_openai import FakeOpenAI, echo

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Hi there"}]}


@pytest.fixture
def fake():
    with FakeOpenAI() as server:
        yield server


def sse_events(text: str) -> list:
    lines = [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


def test_free_port_and_models_list():
    with FakeOpenAI() as a, FakeOpenAI() as b:
        assert a.port != b.port and a.base_url == f"http://127.0.0.1:{a.port}/v1"
        models = httpx.get(f"{a.base_url}/models").json()
        assert "gpt-4o-mini" in [m["id"] for m in models["data"]]
        port = a.port
    with socket.create_server(("127.0.0.1", port)):  # stopped: the port is free again
        pass


def test_empty_queue_answers_500_saying_so(fake):
    reply = httpx.post(f"{fake.base_url}/chat/completions", json=CHAT)
    assert reply.status_code == 500
    assert "no response queued" in reply.json()["error"]["message"]
    assert fake.requests == [CHAT]


def test_unknown_path_and_bad_body(fake):
    assert httpx.get(f"{fake.base_url}/nothing").status_code == 404
    bad = httpx.post(f"{fake.base_url}/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and fake.requests == []


def test_queue_then_responder(fake):
    fake.queue({"text": "queued"})
    fake.responder = echo
    with httpx.Client() as client:  # one keep-alive connection for both
        first = client.post(f"{fake.base_url}/chat/completions", json=CHAT).json()
        second = client.post(f"{fake.base_url}/chat/completions", json=CHAT).json()
    assert first["choices"][0]["message"]["content"] == "queued"
    assert second["choices"][0]["message"]["content"] == "Hi there"
    assert second["object"] == "chat.completion" and second["usage"]["total_tokens"] > 0


def test_stream_framing_with_chunks_and_split_tool_calls(fake):
    fake.queue({"chunks": ["Hel", "lo"], "tool_calls": [
        {"name": "a", "arguments": {"x": "long enough to split"}, "id": "id_a"},
        {"name": "b", "arguments": "{broken"},
    ]})
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    reply = httpx.post(f"{fake.base_url}/chat/completions", json=body)
    assert reply.headers["content-type"] == "text/event-stream"
    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert [d["content"] for d in deltas if d.get("content")] == ["Hel", "lo"]
    parts = [t for d in deltas for t in d.get("tool_calls", [])]
    by_index: dict[int, str] = {}
    for part in parts:
        by_index[part["index"]] = by_index.get(part["index"], "") + part["function"].get("arguments", "")
    assert json.loads(by_index[0]) == {"x": "long enough to split"} and by_index[1] == "{broken"
    assert len([p for p in parts if p["index"] == 0]) > 2  # the arguments came in pieces
    assert parts[0]["id"] == "id_a" and parts[0]["function"]["name"] == "a"


def test_errors_carry_retry_after_and_bodies(fake):
    fake.queue({"status": 429, "retry_after": 0.25}, {"status": 503, "body": "overloaded"}, {"raw": "garbage"})
    url = f"{fake.base_url}/chat/completions"
    limited = httpx.post(url, json=CHAT)
    assert limited.status_code == 429 and limited.headers["retry-after"] == "0.25"
    assert limited.json()["error"]["type"] == "rate_limit_exceeded"
    assert httpx.post(url, json=CHAT).text == "overloaded"
    garbage = httpx.post(url, json=CHAT)
    assert garbage.status_code == 200 and garbage.text == "garbage"


def test_unknown_response_keys_fail_when_queued(fake):
    with pytest.raises(ValueError, match="unknown fake response keys"):
        fake.queue({"txt": "typo"})


def test_a_failing_responder_is_a_500_not_a_dead_server(fake):
    fake.responder = lambda body: 1 / 0
    reply = httpx.post(f"{fake.base_url}/chat/completions", json=CHAT)
    assert reply.status_code == 500 and "ZeroDivisionError" in reply.json()["error"]["message"]


def test_many_concurrent_delayed_streams_all_answered(fake):
    fake.responder = lambda body: {**echo(body), "delay": 0.2}
    count = 300

    async def one(port: int, i: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({**CHAT, "stream": True, "messages": [{"role": "user", "content": f"n{i}"}]}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        data = await reader.read()
        writer.close()
        return data

    async def all_of_them() -> list[bytes]:
        return await asyncio.gather(*(one(fake.port, i) for i in range(count)))

    answers = asyncio.run(all_of_them())
    assert all(f'"content": "n{i}"'.encode() in a and a.endswith(b"0\r\n\r\n") for i, a in enumerate(answers))
    assert len(fake.requests) == count
