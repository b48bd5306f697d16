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
