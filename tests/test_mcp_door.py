"""`chatrun mcp`: chatrun's authoring tools through the official MCP SDK's client over stdio
(a real `chatrun mcp` process): validate, graph, run_turn (the bot's model is the fake OpenAI
server), run_transcripts and explain."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp SDK is not installed (pip install 'chatrun[mcp]')")

REPO = Path(__file__).resolve().parents[1]
BROKEN = "name: b\nroutes:\n  main:\n    default: true\n    prompt: hi\n"


async def session_calls(cwd: Path, env: dict[str, str], calls: list[tuple[str, dict]]) -> tuple[list[str], list]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "chatrun", "mcp"], cwd=str(cwd), env=env)
    async with Client(params) as client:
        listed = await client.list_tools()
        answers = []
        for name, args in calls:
            answer = await asyncio.wait_for(client.call_tool(name, args), 120)
            assert not answer.is_error, answer.content
            text = "\n".join(getattr(part, "text", "") for part in answer.content)
            answers.append(answer.structured_content if answer.structured_content is not None else text)
    return sorted(t.name for t in listed.tools), answers


def unwrap(value):
    """A tool returning a str comes back as {"result": str} in structured content."""
    return value["result"] if isinstance(value, dict) and set(value) == {"result"} else value


@pytest.mark.slow
def test_the_sdk_client_validates_draws_explains_replays_and_talks(tmp_path, fake):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "bot.yaml").write_text(BROKEN)
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner"), "OPENAI_BASE_URL": fake.base_url,
           "OPENAI_API_KEY": "test-key"}
    fake.queue({"text": "Hello from the bot."}, {"text": "Still here."})
    hello = str(REPO / "bots" / "hello")
    tools, answers = asyncio.run(session_calls(tmp_path, env, [
        ("validate", {"path": hello}),
        ("validate", {"path": "bad"}),
        ("explain", {"path": "bad", "line": 5}),
        ("graph", {"path": str(REPO / "bots" / "travel"), "format": "mermaid"}),
        ("run_transcripts", {"paths": [hello]}),
        ("run_turn", {"bot": hello, "message": "hi"}),
        ("run_turn", {"bot": hello, "message": "again"}),
    ]))
    assert tools == ["explain", "graph", "run_transcripts", "run_turn", "validate"]
    valid, invalid, explained, drawn, replayed, first, second = answers
    assert valid["valid"] is True
    assert invalid["valid"] is False
    [problem] = invalid["diagnostics"]
    assert (problem["line"], problem["path"]) == (5, "routes.main.prompt")
    assert "unknown key `prompt`" in problem["message"]
    [note] = explained["explanations"]
    assert note["schema_path"] == "routes.main" and "system" in note["allowed_keys"]
    assert unwrap(drawn).startswith("flowchart")
    assert replayed["failed"] == 0 and replayed["passed"] == len(list((REPO / "bots/hello/transcripts").glob("*.yaml")))
    assert first["ok"] and first["route"] == "chat"
    assert (first["events"][-1]["type"], first["events"][-1]["data"]) == ("Message", "Hello from the bot.")
    assert second["events"][-1]["data"] == "Still here."
    # the same conversation: the second turn's request carries the first exchange
    assert [m["role"] for m in fake.requests[1]["messages"]] == ["system", "user", "assistant", "user"]
    assert json.dumps(second)  # plain JSON all the way


async def tool_answers(cwd: Path, env: dict[str, str], calls: list[tuple[str, dict]]) -> list:
    """(is_error, text) of each call, in one server process; then the process must still answer."""
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "chatrun", "mcp"], cwd=str(cwd), env=env)
    async with Client(params) as client:
        answers = []
        for name, args in calls:
            answer = await asyncio.wait_for(client.call_tool(name, args), 120)
            answers.append((answer.is_error, "\n".join(getattr(part, "text", "") for part in answer.content)))
    return answers


@pytest.mark.slow
def test_bad_paths_are_tool_errors_that_say_what_is_wrong_and_the_server_goes_on(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "bot.yaml").write_text(BROKEN)
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    hello = str(REPO / "bots" / "hello")
    answers = asyncio.run(tool_answers(tmp_path, env, [
        ("run_turn", {"bot": "nowhere", "message": "hi"}),
        ("run_turn", {"bot": "bad", "message": "hi"}),
        ("graph", {"path": "nowhere"}),
        ("run_transcripts", {"paths": ["missing.yaml"]}),
        ("run_transcripts", {"paths": ["bad"]}),
        ("validate", {"path": hello}),
    ]))
    for is_error, text in answers[:5]:
        assert is_error and "Traceback" not in text, text
    no_bot, invalid, no_graph, no_transcript, no_transcripts = (text for _, text in answers[:5])
    assert "nowhere" in no_bot and "nowhere" in no_graph
    assert "bad/bot.yaml:5" in invalid and "unknown key `prompt`" in invalid
    assert "missing.yaml" in no_transcript and "no such" in no_transcript
    assert "bad" in no_transcripts and "no transcripts" in no_transcripts
    assert answers[5][0] is False and '"valid": true' in answers[5][1]
