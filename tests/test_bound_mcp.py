"""Bound arguments of MCP tools against the real stdio MCP server of bots/notes (built with the
official SDK): an argument taken from the conversation state, not offered to the model (the
server's schema without it), and `chatrun validate --connect` checking that every argument
the server's tool requires is given — offered or bound."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chatrun.cli import main
from chatrun.messages import ToolResultMessage

pytest.importorskip("mcp", reason="the mcp SDK is not installed (pip install 'chatrun[mcp]')")

SERVER = Path(__file__).resolve().parents[1] / "bots" / "notes" / "notes_server.py"


def call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


@pytest.mark.subprocess  # a stdio MCP server
def test_an_mcp_tool_takes_an_argument_from_state(write_bot):
    bot = chatrun.load_bot(write_bot(f"""
        name: n
        model: {{provider: scripted, name: m}}
        mcp_servers:
          notes: {{command: [python, {SERVER}]}}
        state: {{current_note: wifi}}
        routes:
          main: {{default: true, system: "Editing {{{{ state.current_note }}}}.", tools: [write_current],
                  mcp: [notes/search_notes]}}
        tools:
          write_current:
            description: Write the text of the note being edited
            mcp: {{server: notes, tool: add_note}}
            bind: {{title: "{{{{ state.current_note }}}}"}}
        """))
    model = chatrun.ScriptedModel([call("write_current", text="on the fridge"), {"text": "Saved."},
                                   call("search_notes", query="fridge"), {"text": "Found."}])

    async def talk() -> chatrun.Session:
        session = bot.session(model=model)
        await session.achat("The wifi password is on the fridge")
        await session.achat("Where is it written?")
        await bot.tools.aclose()
        return session

    session = asyncio.run(talk())
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in model.requests[0].tools}
    assert set(offered["write_current"]["properties"]) == {"text"}  # the server's schema without `title`
    assert offered["write_current"]["required"] == ["text"]
    saved, found = [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]
    assert json.loads(saved)["saved"] == "wifi"
    assert json.loads(found)["found"] == [{"title": "wifi", "text": "on the fridge"}]


@pytest.mark.subprocess  # a stdio MCP server
def test_validate_connect_checks_that_required_arguments_are_offered_or_bound(write_bot):
    path = write_bot(f"""
        name: v
        mcp_servers:
          notes: {{command: [python, {SERVER}]}}
        state: {{current_note: null}}
        routes:
          main: {{default: true, system: Hi., tools: [short, bound, typo]}}
        tools:
          short:
            description: Add a note (the title is forgotten)
            parameters: {{type: object, properties: {{text: {{type: string}}}}, required: [text]}}
            mcp: {{server: notes, tool: add_note}}
          bound:
            description: Add to the current note
            parameters: {{type: object, properties: {{text: {{type: string}}, title: {{type: string}}}}}}
            bind: {{title: "{{{{ state.current_note }}}}"}}
            mcp: {{server: notes, tool: add_note}}
          typo:
            description: Add to the current note
            bind: {{titel: "{{{{ state.current_note }}}}"}}
            mcp: {{server: notes, tool: add_note}}
        """)
    plain = CliRunner().invoke(main, ["validate", str(path)])
    assert plain.exit_code == 0, plain.output  # without --connect the server's schema is unknown
    checked = CliRunner().invoke(main, ["validate", str(path), "--connect"])
    assert checked.exit_code == 1, checked.output
    errors = [line for line in checked.output.splitlines() if ": error: " in line]
    assert errors == [
        f"{path}:9:3: error: tool `short` does not give argument `title`, which MCP tool `add_note` of server "
        "`notes` requires: declare it in `parameters` (the model gives it) or bind it (`bind:`)",
        f"{path}:18:3: error: tool `typo` binds `titel`, which MCP tool `add_note` of server `notes` does not take; "
        "did you mean `title`? (it takes: title, text)",
    ], checked.output
