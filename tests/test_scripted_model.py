"""The scripted model: answers from a list, records requests, stable tool call ids."""

from __future__ import annotations

import asyncio

import pytest

from chatrun.definition.config import ModelConfig
from chatrun.errors import ChatrunError, ModelError
from chatrun.messages import SystemMessage, ToolCall, UserMessage
from chatrun.models import make_model
from chatrun.models.base import ModelRequest, ModelResponse
from chatrun.models.scripted import ScriptedModel


def ask(model: ScriptedModel, route: str = "main", stream: bool = True, text: str = "hi"):
    chunks: list[str] = []

    async def on_chunk(chunk: str) -> None:
        chunks.append(chunk)

    request = ModelRequest([SystemMessage("sys"), UserMessage(text)], [], ModelConfig(), route)
    response = asyncio.run(model.complete(request, on_chunk if stream else None))
    return response, chunks


def test_answers_in_order_and_records_requests():
    model = ScriptedModel([{"text": "one"}, "two"])
    assert model.remaining == 2
    first, _ = ask(model, text="a")
    second, _ = ask(model, text="b")
    assert (first.text, second.text) == ("one", "two")
    assert model.remaining == 0
    assert [r.messages[-1].content for r in model.requests] == ["a", "b"]
    assert model.requests[0].route == "main"


def test_tool_calls_get_deterministic_ids_and_json_arguments():
    model = ScriptedModel()
    model.add(
        {"tool_calls": [{"name": "set_destination", "arguments": {"destination": "Éire"}},
                        {"name": "book", "arguments": "{not json", "id": "mine"}]},
        {"text": "and", "tool_calls": [{"name": "book"}]},
    )
    first, _ = ask(model)
    second, chunks = ask(model)
    assert first.text is None
    assert first.tool_calls == [ToolCall("call_1", "set_destination", '{"destination": "Éire"}'),
                                ToolCall("mine", "book", "{not json")]
    assert second.tool_calls == [ToolCall("call_3", "book", "{}")]
    assert second.text == "and" and chunks == ["and"]


def test_ids_restart_per_model_instance():
    script = [{"tool_calls": [{"name": "x"}]}]
    assert ask(ScriptedModel(script))[0].tool_calls[0].id == "call_1"
    assert ask(ScriptedModel(script))[0].tool_calls[0].id == "call_1"


def test_chunks_stream_through_on_chunk():
    model = ScriptedModel([{"chunks": ["Hel", "lo ", "there"]}, {"text": "whole"}])
    response, chunks = ask(model)
    assert response.text == "Hello there" and chunks == ["Hel", "lo ", "there"]
    response, chunks = ask(model, stream=False)
    assert response.text == "whole" and chunks == []


def test_injected_error_is_a_model_error():
    model = ScriptedModel([{"error": "rate limited for good"}, {"text": "back"}])
    with pytest.raises(ModelError, match="rate limited for good"):
        ask(model)
    assert ask(model)[0].text == "back"
    assert len(model.requests) == 2


def test_model_response_objects_are_returned_as_copies():
    given = ModelResponse("hi", [ToolCall("c", "t", "{}")], {"total_tokens": 3})
    model = ScriptedModel([given])
    response, chunks = ask(model)
    assert response == given and response is not given and chunks == ["hi"]


def test_exhausted_names_the_call_and_route():
    model = ScriptedModel(["only"])
    ask(model)
    with pytest.raises(ModelError, match=r"scripted model has no response left for call 2 \(route flight\)"):
        ask(model, route="flight")


def test_delay_waits():
    model = ScriptedModel([{"text": "slow", "delay": 0.05}])

    async def run():
        request = ModelRequest([UserMessage("x")], [], ModelConfig(), "main")
        task = asyncio.create_task(model.complete(request))
        await asyncio.sleep(0.01)
        assert not task.done()  # still waiting: callers can cancel a slow turn
        return await task

    assert asyncio.run(run()).text == "slow"


@pytest.mark.parametrize("bad, message", [
    ({"txt": "typo"}, "unknown keys"),
    ({"delay": 1}, "needs text, tool_calls, chunks or error"),
    ({"tool_calls": [{"arguments": {}}]}, "needs a name"),
    ({"tool_calls": [{"name": "x", "args": {}}]}, "unknown keys"),
    (42, "must be a mapping"),
])
def test_malformed_script_is_rejected_when_added(bad, message):
    with pytest.raises(ChatrunError, match=message):
        ScriptedModel([bad])


def test_make_model_scripted():
    model = make_model("scripted")
    assert isinstance(model, ScriptedModel)
    with pytest.raises(ModelError, match="call 1"):
        ask(model)
