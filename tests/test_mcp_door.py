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


def server_params(cwd: Path, env: dict[str, str], folders: list[Path]):
    """`chatrun mcp FOLDER...` run in `cwd` (no folders: it reads only inside `cwd`)."""
    from mcp import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=["-m", "chatrun", "mcp", *map(str, folders)],
                                 cwd=str(cwd), env=env)


async def session_calls(cwd: Path, env: dict[str, str], calls: list[tuple[str, dict]]) -> tuple[list[str], list]:
    from mcp import Client

    params = server_params(cwd, env, [cwd, REPO / "bots"])
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


async def tool_answers(cwd: Path, env: dict[str, str], calls: list[tuple[str, dict]],
                       folders: list[Path] | None = None) -> list:
    """(is_error, text) of each call, in one server process; then the process must still answer."""
    from mcp import Client

    params = server_params(cwd, env, [cwd, REPO / "bots"] if folders is None else folders)
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


SECRET = "root:x:0:0:SECRET-MARKER-7f3a:/root:/bin/bash\n"


@pytest.mark.slow
def test_paths_outside_the_folders_it_was_started_on_are_refused_and_nothing_of_them_is_quoted(tmp_path):
    """Issue 33, finding 7: `validate`/`explain` read any path and quoted its lines."""
    project, outside_bot = tmp_path / "project", tmp_path / "outside_bot"
    (project / "bad").mkdir(parents=True)
    (project / "bad" / "bot.yaml").write_text(BROKEN)
    (tmp_path / "secret.yaml").write_text(SECRET * 3)  # beside the project, YAML a validator would quote
    (tmp_path / "secret.txt").write_text(SECRET)
    outside_bot.mkdir()
    (outside_bot / "bot.yaml").write_text(f"name: o\nroutes:\n  main: {{default: true, system: '{SECRET.strip()}'}}\n")
    (project / "linked").mkdir()
    (project / "linked" / "bot.yaml").symlink_to(tmp_path / "secret.yaml")  # inside by name, outside by target
    (project / "escape").symlink_to(tmp_path)  # a folder link out of the project
    (project / "transcripts").mkdir()
    (project / "transcripts" / "elsewhere.yaml").write_text("bot: ../../outside_bot\nturns:\n  - user: hi\n")
    (project / "transcripts" / "attaching.yaml").write_text(
        "bot: ../bad\nturns:\n  - user: hi\n    attach: [../../secret.txt]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    refused_calls = [
        ("validate", {"path": "/etc/passwd"}),
        ("validate", {"path": "../secret.yaml"}),
        ("explain", {"path": str(tmp_path / "secret.yaml"), "line": 1}),
        ("explain", {"path": "bad/../../secret.yaml", "line": 1}),
        ("validate", {"path": "linked"}),
        ("validate", {"path": "escape/outside_bot"}),
        ("graph", {"path": "../outside_bot"}),
        ("run_turn", {"bot": "escape/outside_bot", "message": "hi"}),
        ("run_transcripts", {"paths": [str(outside_bot)]}),
        ("run_transcripts", {"paths": ["transcripts/elsewhere.yaml"]}),
        ("run_transcripts", {"paths": ["transcripts/attaching.yaml"]}),
    ]
    answers = asyncio.run(tool_answers(project, env, [*refused_calls, ("validate", {"path": "bad"})], folders=[]))
    allowed = f"is outside the folders this `chatrun mcp` may read ({project.resolve()})"
    for (name, args), (is_error, text) in zip(refused_calls, answers, strict=False):
        assert is_error, (name, args, text)
        assert allowed in text and "chatrun mcp FOLDER" in text, (name, args, text)
        assert "SECRET-MARKER" not in text and "root:x" not in text, (name, args, text)
    assert "secret.yaml (a bot)" in answers[1][1]
    assert "outside_bot (the bot of transcripts/elsewhere.yaml)" in answers[9][1]
    assert "secret.txt (a file transcripts/attaching.yaml attaches)" in answers[10][1]
    # inside, it goes on working
    is_error, text = answers[-1]
    assert not is_error and '"valid": false' in text and "unknown key `prompt`" in text


@pytest.mark.slow
def test_folders_given_on_the_command_line_are_the_ones_it_reads(tmp_path):
    (tmp_path / "a" / "bad").mkdir(parents=True)
    (tmp_path / "a" / "bad" / "bot.yaml").write_text(BROKEN)
    (tmp_path / "b").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    answers = asyncio.run(tool_answers(tmp_path / "b", env, [
        ("validate", {"path": "../a/bad"}),
        ("validate", {"path": str(REPO / "bots" / "hello")}),
    ], folders=[tmp_path / "a"]))
    assert answers[0][0] is False and "unknown key `prompt`" in answers[0][1]  # outside its cwd, inside FOLDER
    assert answers[1][0] is True and f"({(tmp_path / 'a').resolve()})" in answers[1][1]


@pytest.mark.slow
def test_a_folder_s_transcripts_are_the_ones_chatrun_test_finds_in_subfolders_too(tmp_path, monkeypatch):
    """`run_transcripts` read a folder's top level only (`*.yaml`), so a transcript in a subfolder
    or written `.yml` that `chatrun test FOLDER` runs was left out without a word."""
    from chatrun.transcripts.format import discover

    hello = REPO / "bots" / "hello"
    turn = "turns:\n  - user: hi\n    model: [{text: Hello}]\n    expect: {events: [{Message: Hello}]}\n"
    (tmp_path / "transcripts" / "refunds").mkdir(parents=True)
    for name in ("top.yaml", "short.yml", "refunds/deep.yaml"):
        (tmp_path / "transcripts" / name).write_text(f"bot: {hello}\n{turn}")
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    [(is_error, text)] = asyncio.run(tool_answers(tmp_path, env, [("run_transcripts", {"paths": ["transcripts"]})]))
    assert not is_error, text
    ran = sorted(result["transcript"] for result in json.loads(text)["results"])
    monkeypatch.chdir(tmp_path)  # `chatrun test transcripts` run where the server ran
    assert ran == sorted(discover(["transcripts"])) == [
        "transcripts/refunds/deep.yaml", "transcripts/short.yml", "transcripts/top.yaml"]
    assert json.loads(text)["passed"] == 3
