"""OpenAIModel through the real `openai` client against the local fake OpenAI server."""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import sys
import time
from unittest import mock

import pytest

from chatrun.definition.config import ModelConfig
from chatrun.errors import ModelError
from chatrun.messages import (
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.models import make_model
from chatrun.models.base import ModelRequest
from chatrun.models.openai_model import OpenAIModel, retry_after
from chatrun.testing.fake_openai import FakeOpenAI

TOOLS = [
    {"type": "function", "function": {"name": "set_destination", "description": "Set it",
                                      "parameters": {"type": "object", "properties": {"destination": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "book", "description": "Book", "parameters": {"type": "object"}}},
]
MESSAGES = [
    SystemMessage("You are a travel agent."),
    UserMessage("Fly me to Ireland"),
    AssistantMessage(None, (ToolCall("call_a", "set_destination", '{"destination": "Ireland"}'),)),
    ToolResultMessage("call_a", "set_destination", "ok"),
    UserMessage("Book it"),
]


@pytest.fixture
def fake(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with FakeOpenAI() as server:
        yield server


def config(fake: FakeOpenAI, **fields) -> ModelConfig:
    fields.setdefault("base_url", fake.base_url)
    fields.setdefault("stream", False)
    fields.setdefault("max_retries", 2)
    fields.setdefault("timeout", 5.0)
    return ModelConfig(**fields)


def call(model, cfg: ModelConfig, tools=None, messages=None, stream: bool = False):
    """Run one completion; returns (response, streamed chunks)."""
    chunks: list[str] = []

    async def on_chunk(text: str) -> None:
        chunks.append(text)

    async def run():
        request = ModelRequest(list(messages or MESSAGES), list(tools or []), cfg, "main")
        try:
            return await model.complete(request, on_chunk if stream else None)
        finally:
            await model.aclose()  # this loop ends here: close its connections

    return asyncio.run(run()), chunks


def model() -> OpenAIModel:
    return OpenAIModel(backoff_base=0.01, backoff_max=0.05)


def test_text_answer_and_what_the_server_received(fake):
    fake.queue({"text": "Booked."})
    cfg = config(fake, name="gpt-4o-mini", temperature=0.2, max_tokens=50, params={"seed": 7, "top_k": 3})
    response, _ = call(model(), cfg, TOOLS)
    assert response.text == "Booked." and response.tool_calls == []
    assert response.usage["input_tokens"] > 0 and response.usage["output_tokens"] > 0  # in chatrun's names
    (body,) = fake.requests
    assert body["model"] == "gpt-4o-mini"
    assert body["temperature"] == 0.2 and body["max_tokens"] == 50
    assert body["seed"] == 7 and body["top_k"] == 3  # unknown params travel in the body too
    assert body["tools"] == TOOLS
    assert "stream" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "user"]
    assert body["messages"][0] == {"role": "system", "content": "You are a travel agent."}
    assert body["messages"][2]["tool_calls"][0]["function"] == {"name": "set_destination",
                                                                "arguments": '{"destination": "Ireland"}'}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_a", "content": "ok"}
    # no key configured but a base URL: a placeholder key, as local servers need none
    assert fake.log[0].headers["authorization"] == "Bearer not-needed"


def test_no_tools_no_temperature_means_fields_left_out(fake):
    fake.queue({"text": "hi"})
    call(model(), config(fake))
    (body,) = fake.requests
    assert "tools" not in body and "temperature" not in body and "max_tokens" not in body


def test_streamed_text_reaches_on_chunk_in_order(fake):
    fake.queue({"chunks": ["Your ", "flight ", "is booked", "."]})
    response, chunks = call(model(), config(fake, stream=True), stream=True)
    assert chunks == ["Your ", "flight ", "is booked", "."]
    assert response.text == "Your flight is booked."
    assert response.usage["output_tokens"] >= 0 and "input_tokens" in response.usage  # stream_options.include_usage
    body = fake.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_params_can_drop_a_field_but_not_change_the_messages(fake):
    fake.queue({"chunks": ["ok"]})
    cfg = config(fake, stream=True, params={"stream_options": None, "messages": [], "stream": False})
    response, chunks = call(model(), cfg, stream=True)
    assert response.text == "ok" and chunks == ["ok"]
    body = fake.requests[0]
    assert "stream_options" not in body and body["stream"] is True and len(body["messages"]) == len(MESSAGES)


def test_stream_config_without_on_chunk_asks_for_a_whole_answer(fake):
    fake.queue({"text": "whole"})
    response, _ = call(model(), config(fake, stream=True), stream=False)
    assert response.text == "whole" and "stream" not in fake.requests[0]


def several_calls() -> dict:
    return {"text": "Setting both.", "tool_calls": [
        {"name": "set_destination", "arguments": {"destination": "Ireland"}, "id": "call_x"},
        {"name": "set_destination", "arguments": {"destination": "Dublin, Éire"}},
        {"name": "book", "arguments": {}},
    ]}


@pytest.mark.parametrize("stream", [False, True])
def test_several_tool_calls_in_one_answer(fake, stream):
    fake.queue(several_calls())
    response, chunks = call(model(), config(fake, stream=stream), TOOLS, stream=stream)
    assert response.text == "Setting both."
    assert [c.name for c in response.tool_calls] == ["set_destination", "set_destination", "book"]
    assert json.loads(response.tool_calls[0].arguments) == {"destination": "Ireland"}
    assert json.loads(response.tool_calls[1].arguments) == {"destination": "Dublin, Éire"}
    assert response.tool_calls[2].arguments == "{}"
    assert response.tool_calls[0].id == "call_x"
    assert len({c.id for c in response.tool_calls}) == 3
    if stream:
        assert "".join(chunks) == "Setting both."


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_arguments_are_passed_through_raw(fake, stream):
    fake.queue({"tool_calls": [{"name": "book", "arguments": '{"seat": 12A'}]})
    response, _ = call(model(), config(fake, stream=stream), TOOLS, stream=stream)
    assert response.tool_calls[0].name == "book"
    assert response.tool_calls[0].arguments == '{"seat": 12A'


@pytest.mark.parametrize("stream", [False, True])
def test_429_waits_for_retry_after_then_succeeds(fake, stream):
    fake.queue({"status": 429, "retry_after": 0.3}, {"text": "finally"})
    started = time.monotonic()
    response, _ = call(model(), config(fake, stream=stream), stream=stream)
    assert response.text == "finally"
    first, second = fake.log
    assert second.at - first.at >= 0.3
    assert time.monotonic() - started >= 0.3
    assert len(fake.requests) == 2


def test_retry_after_is_capped(fake):
    fake.queue({"status": 503, "retry_after": 120}, {"text": "ok"})
    started = time.monotonic()
    m = OpenAIModel(backoff_base=0.01, retry_after_cap=0.1)
    response, _ = call(m, config(fake))
    assert response.text == "ok" and time.monotonic() - started < 5


def test_retry_after_forms():
    assert retry_after({"retry-after": "1.5"}) == 1.5
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    date = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8 <= retry_after({"retry-after": date}) <= 10
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


def test_500_then_success(fake):
    fake.queue({"status": 500}, {"text": "recovered"})
    response, _ = call(model(), config(fake))
    assert response.text == "recovered"
    assert len(fake.requests) == 2


def test_persistent_500_is_a_model_error_naming_the_retries(fake):
    fake.queue(*[{"status": 500, "body": {"error": {"message": "the GPUs are on fire"}}}] * 3)
    with pytest.raises(ModelError) as info:
        call(model(), config(fake, name="gpt-4o-mini", max_retries=2))
    assert str(info.value) == (
        f"model gpt-4o-mini at {fake.base_url}: HTTP 500 after 2 retries: the GPUs are on fire"
    )
    assert len(fake.requests) == 3


def test_no_retries_configured(fake):
    fake.queue({"status": 503})
    with pytest.raises(ModelError, match="HTTP 503 .not retried: model.max_retries is 0.: fake HTTP 503"):
        call(model(), config(fake, max_retries=0))
    assert len(fake.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_timeout_is_retried_then_a_model_error(fake, stream):
    fake.queue(*[{"delay": 1.0, "text": "too late"}] * 2)
    with pytest.raises(ModelError, match=r"timed out after 0.2 s \(model.timeout\) after 1 retry"):
        call(model(), config(fake, timeout=0.2, max_retries=1, stream=stream), stream=stream)
    assert len(fake.requests) == 2


def test_timeout_then_success(fake):
    fake.queue({"delay": 1.0, "text": "too late"}, {"text": "in time"})
    response, _ = call(model(), config(fake, timeout=0.2, max_retries=1))
    assert response.text == "in time"


def test_client_errors_are_not_retried_and_say_what_to_check(fake):
    fake.queue({"status": 401, "body": {"error": {"message": "Incorrect API key provided"}}})
    with pytest.raises(ModelError, match="HTTP 401: Incorrect API key provided .check the API key"):
        call(model(), config(fake))
    assert len(fake.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_garbage_answer_is_a_clear_model_error(fake, stream):
    fake.queue({"raw": "<html>proxy error</html>"})
    with pytest.raises(ModelError) as info:
        call(model(), config(fake, stream=stream), stream=stream)
    message = str(info.value)
    assert message.startswith(f"model gpt-4o-mini at {fake.base_url}: ")
    assert "not valid Chat Completions JSON" in message or "without any answer" in message
    assert len(fake.requests) == 1  # a server that speaks another protocol will not improve


def test_json_without_choices_is_a_model_error(fake):
    fake.queue({"raw": '{"object": "chat.completion", "choices": []}'})
    with pytest.raises(ModelError, match="answered without choices"):
        call(model(), config(fake))


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": 5},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": 3}}]},
])
def test_wrongly_typed_answer_is_a_model_error_not_a_crash(fake, message):
    body = {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    fake.queue({"raw": json.dumps(body)})
    with pytest.raises(ModelError, match="not valid Chat Completions: .* is a int, not text"):
        call(model(), config(fake))


def test_wrongly_typed_stream_delta_is_a_model_error(fake):
    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": 3}}]}}]}
    fake.queue({"raw": f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"})
    with pytest.raises(ModelError, match="streamed tool call arguments is a int, not text"):
        call(model(), config(fake, stream=True), stream=True)


def test_unreachable_server_is_retried_then_a_model_error(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = ModelConfig(base_url=f"http://127.0.0.1:{port}/v1", stream=False, max_retries=1)
    with pytest.raises(ModelError, match=rf"127.0.0.1:{port}/v1: cannot connect after 1 retry: "):
        call(model(), cfg)


def test_no_credentials_says_how_to_configure(monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelError) as info:
        call(model(), ModelConfig(stream=False))
    message = str(info.value)
    assert "OPENAI_API_KEY" in message and "OPENAI_BASE_URL" in message and "model.base_url" in message


def test_environment_variables_and_api_key_env(fake, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-default")
    monkeypatch.setenv("TRAVEL_KEY", "sk-travel")
    fake.queue({"text": "a"}, {"text": "b"})
    m = model()
    assert call(m, ModelConfig(stream=False))[0].text == "a"
    assert call(m, ModelConfig(stream=False, api_key_env="TRAVEL_KEY"))[0].text == "b"
    assert [r.headers["authorization"] for r in fake.log] == ["Bearer sk-default", "Bearer sk-travel"]


def test_constructor_overrides_config(fake):
    fake.queue({"text": "here"})
    m = OpenAIModel(base_url=fake.base_url, api_key="sk-explicit")
    response, _ = call(m, ModelConfig(base_url="http://127.0.0.1:9/v1", stream=False))
    assert response.text == "here" and fake.log[0].headers["authorization"] == "Bearer sk-explicit"


def test_one_client_per_event_loop(fake):
    fake.queue({"text": "1"}, {"text": "2"}, {"text": "3"})
    m = make_model("openai")
    assert isinstance(m, OpenAIModel)
    cfg = config(fake)

    async def twice():
        request = ModelRequest(MESSAGES, [], cfg, "main")
        await m.complete(request)
        await m.complete(request)
        await m.aclose()

    asyncio.run(twice())
    # a new loop (as each sync session.chat may run) gets a working client of its own
    assert call(m, cfg)[0].text == "3"
    first, second, third = fake.log
    assert first.peer == second.peer  # one client, one kept-alive connection
    assert third.peer != first.peer


def test_sessions_on_their_own_loops_share_one_verifying_ssl_context(fake, monkeypatch):
    """Loading the CA bundle is most of a new HTTP client's cost: each library session (its own
    model, its own loop) gets a client of its own, all on the process's one SSL context."""
    import ssl

    import openai

    built: list[object] = []

    class Recording(openai.DefaultAsyncHttpxClient):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs):
            built.append(kwargs.get("verify", True))
            super().__init__(**kwargs)

    monkeypatch.setattr(openai, "DefaultAsyncHttpxClient", Recording)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    fake.queue({"text": "1"}, {"text": "2"})
    cfg = config(fake)
    assert [call(OpenAIModel(), cfg)[0].text for _ in range(2)] == ["1", "2"]
    first, second = built
    assert isinstance(first, ssl.SSLContext) and first is second
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
    # The variables the default context reads still take effect when they change.
    monkeypatch.setenv("SSL_CERT_FILE", ssl.get_default_verify_paths().openssl_cafile)
    from chatrun.models.openai_model import shared_ssl_context

    assert shared_ssl_context() is not first


def test_dropped_connection_is_retried(fake):
    fake.queue({"disconnect": True}, {"text": "second try"})
    response, _ = call(model(), config(fake))
    assert response.text == "second try" and len(fake.requests) == 2


def test_stream_dropped_before_any_text_is_retried(fake):
    fake.queue({"disconnect": True}, {"chunks": ["fine"]})
    response, chunks = call(model(), config(fake, stream=True), stream=True)
    assert response.text == "fine" and chunks == ["fine"] and len(fake.requests) == 2


def test_stream_dropped_after_text_is_not_retried(fake):
    fake.queue({"chunks": ["Half an ", "answer"], "disconnect": True}, {"text": "never asked"})
    chunks: list[str] = []

    async def on_chunk(text: str) -> None:
        chunks.append(text)

    async def run():
        m = model()
        try:
            await m.complete(ModelRequest(MESSAGES, [], config(fake, stream=True), "main"), on_chunk)
        finally:
            await m.aclose()

    with pytest.raises(ModelError, match="connection lost while streaming .not retried: part of the answer was already shown.: "):
        asyncio.run(run())
    assert chunks == ["Half an ", "answer"] and len(fake.requests) == 1


def test_error_event_inside_a_stream_is_a_model_error(fake):
    fake.queue({"raw": 'data: {"error": {"message": "context length exceeded"}}\n\n'})
    with pytest.raises(ModelError, match="context length exceeded"):
        call(model(), config(fake, stream=True), stream=True)


def test_on_chunk_failures_are_the_callers(fake):
    fake.queue({"chunks": ["a", "b"]})

    async def on_chunk(text: str) -> None:
        raise RuntimeError("client went away")

    async def run():
        m = model()
        try:
            await m.complete(ModelRequest(MESSAGES, [], config(fake, stream=True), "main"), on_chunk)
        finally:
            await m.aclose()

    with pytest.raises(RuntimeError, match="client went away"):
        asyncio.run(run())
    assert len(fake.requests) == 1


def test_the_wire_messages_are_each_messages_own_wire_form_for_every_kind():
    # models/openai_model.py `wire_messages` makes a text message's dict itself (issue 39): it must
    # be what the message's own `to_openai_with` gives, for every kind and shape.
    from chatrun.messages import DEFAULT_ACCEPTS, Attachment, ContextMessage, SummaryMessage
    from chatrun.models.openai_model import wire_messages

    class Quoted(UserMessage):  # a subclass keeps its own wire form
        def to_openai_with(self, read, accepts=DEFAULT_ACCEPTS):
            return {"role": "user", "content": f"> {self.content}"}

    photo = Attachment("https://example.org/p.png", "image/png", "p.png", 3)
    messages = [*MESSAGES, AssistantMessage(None), AssistantMessage("sure"), AssistantMessage(""),
                SummaryMessage("they asked about Dublin"), ContextMessage("today is Monday"),
                UserMessage("see this", (photo,)), UserMessage(""), SystemMessage(""), Quoted("hi")]
    for accepts in (DEFAULT_ACCEPTS, frozenset({"text"})):
        assert wire_messages(messages, None, accepts) == [m.to_openai_with(None, accepts) for m in messages]


@pytest.mark.parametrize("stream", [False, True])
def test_the_model_timeout_reaches_the_request_as_the_number_did(fake, stream):
    # models/openai_model.py passes `model.timeout` as a Timeout made once (issue 39), not the number:
    # the request carries the same read timeout (the client's header says it), every limit the same.
    import openai

    from chatrun.models.openai_model import request_timeout

    fake.queue({"text": "hi"})
    call(model(), config(fake, timeout=7.5, stream=stream), stream=stream)
    assert fake.log[0].headers["x-stainless-read-timeout"] == str(7.5)
    assert request_timeout(7.5).as_dict() == openai.Timeout(7.5).as_dict() == dict.fromkeys(
        ("connect", "read", "write", "pool"), 7.5)
    assert request_timeout(7.5) is request_timeout(7.5)


SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": True}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fields", [
    {},
    {"temperature": 0.3, "max_tokens": 50},
    {"response_format": SCHEMA_FORMAT, "prompt_cache_key": "bot/main"},
    {"response_format": {"type": "json_object"}, "temperature": 0},
    {"tool_choice": "required"},
    {"tool_choice": {"type": "function", "function": {"name": "book"}}, "max_tokens": None},
    {"top_p": 0.5, "seed": 7},  # fields create knows and request_args does not set: create posts them
])
def test_create_completion_posts_what_create_posts(stream, fields):
    """create_completion skips create's per-parameter checks and copies (~0.8 M instructions a
    turn) for the fields request_args sets: the request it posts (path, body and its order,
    options with the key's header and the timeout, answer type, stream) is create's own."""
    import openai

    from chatrun.models.openai_model import create_completion, request_timeout

    args = {"model": "gpt-4o-mini", "messages": [],
            "extra_body": {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}}
    if stream:
        args |= {"stream": True, "stream_options": {"include_usage": True}}
    args |= {key: value for key, value in fields.items() if value is not None}

    def posted(call):
        client = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
        seen = []

        async def post(path, **kwargs):
            seen.append((path, list(kwargs.pop("body").items()), kwargs))
            return "answer"

        client.post = post  # the resources take the client's post when first made
        assert asyncio.run(call(client)) == "answer"
        return seen

    timeout = request_timeout(12.5)
    ours = posted(lambda client: create_completion(client, args, timeout))
    theirs = posted(lambda client: client.chat.completions.create(**args, timeout=timeout))
    assert ours == theirs and len(ours) == 1
    assert ours[0][2]["options"]["timeout"] is timeout


def test_create_completion_calls_create_when_it_is_wrapped(monkeypatch):
    """An instrumentation that wraps create (OpenTelemetry's for the openai client does) still
    sees every call: create_completion then calls create itself."""
    import openai

    from chatrun.models.openai_model import create_completion, request_timeout

    own = openai.resources.chat.AsyncCompletions.create
    seen = []

    async def wrapped(self, **kwargs):
        seen.append(sorted(kwargs))
        return await own(self, **kwargs)

    monkeypatch.setattr(openai.resources.chat.AsyncCompletions, "create", wrapped)
    client = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")

    async def post(path, **kwargs):
        return "answer"

    client.post = post
    args = {"model": "m", "messages": [], "extra_body": {"messages": []}}
    assert asyncio.run(create_completion(client, args, request_timeout(5))) == "answer"
    assert seen == [["extra_body", "messages", "model", "timeout"]]


def test_create_completion_calls_create_patched_on_the_client_alone():
    """A create patched on one client's resource (`mock.patch.object(client.chat.completions,
    "create")`, as a user's test does) is called too, not passed by."""
    import openai

    from chatrun.models.openai_model import create_completion, request_timeout

    client = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
    seen = []

    async def patched(**kwargs):
        seen.append(sorted(kwargs))
        return "patched"

    async def post(path, **kwargs):
        return "posted"

    client.post = post
    args = {"model": "m", "messages": [], "extra_body": {"messages": []}}
    assert asyncio.run(create_completion(client, args, request_timeout(5))) == "posted"  # not patched: posted
    with mock.patch.object(client.chat.completions, "create", patched):
        assert asyncio.run(create_completion(client, args, request_timeout(5))) == "patched"
    assert seen == [["extra_body", "messages", "model", "timeout"]]


def test_create_completion_calls_create_when_openai_lacks_the_options_helper(monkeypatch):
    """An `openai` whose module no longer has the helper create builds its options with (a later
    release that moved it): every call goes through create."""
    import types

    import openai

    from chatrun.models import openai_model

    assert openai_model._posting(types.SimpleNamespace()) == (None, None, {})
    monkeypatch.setattr(openai_model, "_CREATE", None)
    monkeypatch.setattr(openai_model, "_OPTIONS", None)
    client = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
    sent = []

    async def post(path, **kwargs):
        sent.append(path)
        return "posted"

    client.post = post
    args = {"model": "m", "messages": [], "extra_body": {"messages": []}}
    # create's own pass over its parameters (a global of its module: patching it leaves create as it is)
    module = sys.modules[openai.resources.chat.AsyncCompletions.create.__module__]
    with mock.patch.object(module, "async_maybe_transform", wraps=module.async_maybe_transform) as passed:
        assert asyncio.run(openai_model.create_completion(client, args, openai_model.request_timeout(5))) == "posted"
    assert passed.call_count == 1 and sent == ["/chat/completions"]
    monkeypatch.undo()
    with mock.patch.object(module, "async_maybe_transform", wraps=module.async_maybe_transform) as passed:
        assert asyncio.run(openai_model.create_completion(client, args, openai_model.request_timeout(5))) == "posted"
    assert passed.call_count == 0  # openai's own create and helper: posted without create's pass
