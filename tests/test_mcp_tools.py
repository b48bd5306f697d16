"""MCP tools against real MCP servers built with the official SDK (bots/notes/notes_server.py):
over stdio and streamable HTTP, listed per route, called through the action machinery, shared by
the sessions of a bot, restarted after a crash, and a server that is down is a refusal."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chatrun
from chatrun.messages import ToolResultMessage

pytest.importorskip("mcp", reason="the mcp SDK is not installed (pip install 'chatrun[mcp]')")

REPO = Path(__file__).resolve().parents[1]
NOTES = REPO / "bots" / "notes"
SERVER = NOTES / "notes_server.py"


def call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def results(session: chatrun.Session) -> list[str]:
    return [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]


def bot_with(write_bot, server: str, tools: str = "mcp: [notes]") -> chatrun.Bot:
    return chatrun.load_bot(write_bot(f"""
        name: n
        model: {{provider: scripted, name: m}}
        mcp_servers:
          notes: {server}
        routes:
          main: {{default: true, system: Notes., {tools}}}
        """))


@pytest.mark.subprocess  # a stdio MCP server
def test_the_notes_bot_through_the_real_openai_client_and_a_stdio_server(fake):
    fake.queue(
        call("remember", title="wifi", text="on the fridge"),
        {"text": "Noted."},
        call("search_notes", query="WIFI"),
        {"text": "On the fridge."},
    )
    bot = chatrun.load_bot(NOTES)

    async def talk() -> chatrun.Session:
        session = bot.session()
        first = [e for e in await session.achat("Remember: wifi password on the fridge") if e.type != "Stream"]
        assert [(e.type, e.data) for e in first] == [("Thinking", "Saved note wifi"), ("Message", "Noted.")]
        await session.achat("Where is the wifi password?")
        await bot.tools.aclose()
        return session

    session = asyncio.run(talk())
    assert session.state["saved"] == 1
    offered = [[t["function"]["name"] for t in r["tools"]] for r in fake.requests]
    assert offered[0] == ["remember", "search_notes"]  # declared tool, then the server's (route `mcp:`)
    # `remember` has no parameters in the YAML: the server's schema is offered
    assert fake.requests[0]["tools"][0]["function"]["parameters"]["required"] == ["title", "text"]
    assert results(session)[0] == "Saved. The user has 1 notes."
    assert '"found": [{"title": "wifi", "text": "on the fridge"}]' in results(session)[1]


@pytest.mark.subprocess  # a stdio MCP server
def test_sessions_of_a_bot_share_one_server_on_a_loop(write_bot):
    bot = bot_with(write_bot, "{command: [python, " + str(SERVER) + "]}")

    async def two_sessions() -> list[str]:
        a = bot.session(model=chatrun.ScriptedModel([call("add_note", title="t", text="x"), {"text": "ok"}]))
        b = bot.session(model=chatrun.ScriptedModel([call("search_notes", query="t"), {"text": "ok"}]))
        await a.achat("save")
        await b.achat("find")
        await bot.tools.aclose()
        return results(b)

    [found] = asyncio.run(two_sessions())
    assert '"title": "t"' in found


@pytest.mark.subprocess  # a stdio MCP server
def test_a_crashed_server_fails_that_call_and_is_started_again(write_bot):
    bot = bot_with(write_bot, "{command: [python, " + str(SERVER) + "]}")

    async def crash_then_use() -> chatrun.Session:
        session = bot.session(model=chatrun.ScriptedModel([
            call("crash"), {"text": "it broke"},
            call("add_note", title="after", text="restart"), {"text": "saved"},
        ]))
        await session.achat("crash it")
        await session.achat("save something")
        await bot.tools.aclose()
        return session

    session = asyncio.run(crash_then_use())
    first, second = results(session)
    assert first.startswith("Error: the MCP server notes is not reachable")
    assert second == '{"saved": "after", "count": 1}'  # a new server process: its notes start empty
    assert [h["ok"] for h in session.history] == [True, True]


def test_a_server_that_cannot_start_is_a_refusal_not_a_failure(write_bot):
    bot = chatrun.load_bot(write_bot("""
        name: n
        model: {provider: scripted, name: m}
        mcp_servers:
          notes: {command: [python, /no/such/server.py]}
        routes:
          main: {default: true, system: Notes., tools: [save]}
        tools:
          save: {description: s, mcp: {server: notes, tool: add_note}}
        """))
    session = bot.session(model=chatrun.ScriptedModel([call("save"), {"text": "sorry"}]))
    events = session.chat("save")
    assert events[-1].type != "Error"
    [reply] = results(session)
    assert reply.startswith("Error: the MCP server notes is not reachable")
    session.close()


@pytest.mark.subprocess  # a stdio MCP server (that cannot start)
def test_a_server_whose_stderr_is_logged_says_where_when_it_cannot_start(write_bot, tmp_path):
    from chatrun.toolkinds.mcp_servers import send_stderr_to

    bot = chatrun.load_bot(write_bot("""
        name: n
        model: {provider: scripted, name: m}
        mcp_servers:
          notes: {command: [python, -c, "import sys; sys.exit('cannot open the notes database')"]}
        routes:
          main: {default: true, system: Notes., tools: [save]}
        tools:
          save: {description: s, mcp: {server: notes, tool: add_note}}
        """))
    log = tmp_path / "notes.log"
    send_stderr_to(lambda server, root: log.open("a", encoding="utf-8"))
    try:
        session = bot.session(model=chatrun.ScriptedModel([call("save"), {"text": "sorry"}]))
        session.chat("save")
        [reply] = results(session)
        assert reply.startswith("Error: the MCP server notes is not reachable")
        assert f"its stderr is in {log}" in reply
        assert "cannot open the notes database" in log.read_text()
        session.close()
    finally:
        send_stderr_to(None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.subprocess
def test_a_streamable_http_server(write_bot):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        bot = bot_with(write_bot, f"{{url: 'http://127.0.0.1:{port}/mcp'}}")
        session = bot.session(model=chatrun.ScriptedModel([call("add_note", title="h", text="over http"),
                                                           {"text": "ok"}]))
        session.chat("save")
        assert results(session) == ['{"saved": "h", "count": 1}']
        session.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_validation_of_mcp_declarations(write_bot):
    from chatrun.definition.loader import check_bot

    path = write_bot("""
        name: v
        mcp_servers:
          both: {command: [python, x.py], url: "http://127.0.0.1:1/mcp"}
        routes:
          main: {default: true, system: Hi., tools: [t], mcp: [nowhere/x]}
        tools:
          t: {description: t, mcp: {server: notse}, handler: "m:f"}
        """)
    _config, diagnostics = check_bot(path)
    messages = [d.message for d in diagnostics if d.severity == "error"]
    assert "MCP server `both` needs exactly one of `command` (a stdio server) and `url` (a streamable HTTP server)" in messages
    assert any("route `main` lists MCP tools of unknown server `nowhere`" in m for m in messages)
    assert any("tool `t` calls unknown MCP server `notse`" in m for m in messages)
    assert any("tool `t` has `handler` and `mcp`; give one" in m for m in messages)


@pytest.mark.subprocess  # a stdio MCP server
def test_validate_connect_checks_mcp_tool_names(write_bot):
    from click.testing import CliRunner

    from chatrun.cli import main

    path = write_bot(f"""
        name: v
        mcp_servers:
          notes: {{command: [python, {SERVER}]}}
        routes:
          main: {{default: true, system: Hi., tools: [t], mcp: [notes/search_notes, notes/no_such]}}
        tools:
          t: {{description: t, mcp: {{server: notes, tool: add_nte}}}}
        """)
    plain = CliRunner().invoke(main, ["validate", str(path)])
    assert plain.exit_code == 0
    assert f"{path}: MCP tool names not checked (--connect starts the servers to check them)" in plain.output
    checked = CliRunner().invoke(main, ["validate", str(path), "--connect"])
    assert checked.exit_code == 1, checked.output
    assert "tool `t` uses MCP tool `add_nte`, which server `notes` does not list; it lists: add_note, crash, " \
           "search_notes" in checked.output
    assert "route `main` uses MCP tool `no_such`" in checked.output
    assert "search_notes`, which" not in checked.output


ENV_SERVER = '''
import os
from mcp.server.mcpserver import MCPServer

server = MCPServer("env")


@server.tool()
def read_env(variable: str) -> str:
    """The value of an environment variable of this server."""
    return os.environ.get(variable, "<unset>")


server.run("stdio")
'''


@pytest.mark.subprocess  # a stdio MCP server
def test_a_stdio_servers_env_adds_variables_to_the_environment_it_inherits(write_bot, tmp_path, monkeypatch):
    (tmp_path / "env_server.py").write_text(ENV_SERVER)
    monkeypatch.setenv("CHATRUN_TEST_INHERITED", "from chatrun's environment")
    bot = chatrun.load_bot(write_bot("""
        name: n
        model: {provider: scripted, name: m}
        mcp_servers:
          envs: {command: [python, env_server.py], env: {NOTES_DIR: /srv/notes, CHATRUN_TEST_INHERITED: replaced}}
        routes:
          main: {default: true, system: Env., mcp: [envs]}
        """))
    model = chatrun.ScriptedModel([call("read_env", variable="NOTES_DIR"), call("read_env", variable="CHATRUN_TEST_INHERITED"),
                                   call("read_env", variable="PATH"), {"text": "ok"}])

    async def run() -> chatrun.Session:
        session = bot.session(model=model)
        await session.achat("where?")
        await bot.tools.aclose()
        return session

    told = results(asyncio.run(run()))
    assert told[:2] == ['{"result": "/srv/notes"}', '{"result": "replaced"}']  # env: wins over the inherited value
    assert told[2] not in ('{"result": ""}', '{"result": "<unset>"}')  # the rest of the environment is inherited


SLOW_SERVER = """\
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("slow")


@server.tool()
def wait() -> str:
    time.sleep(30)
    return "too late"


server.run()
"""


@pytest.mark.subprocess  # a stdio MCP server that answers too late
@pytest.mark.parametrize("effect", ["read", "once"])
def test_a_server_slower_than_the_tools_timeout_is_a_refusal_not_a_failure(write_bot, tmp_path, effect):
    (tmp_path / "slow_server.py").write_text(SLOW_SERVER)
    bot = chatrun.load_bot(write_bot(f"""
        name: n
        model: {{provider: scripted, name: m}}
        mcp_servers:
          slow: {{command: [python, {tmp_path / 'slow_server.py'}]}}
        routes:
          main: {{default: true, system: Wait., tools: [wait]}}
        tools:
          wait: {{description: w, timeout: 2, effect: {effect}, mcp: {{server: slow, tool: wait}}}}
        """))
    session = bot.session(model=chatrun.ScriptedModel([call("wait"), {"text": "it is slow"}]))
    events = session.chat("wait")
    [reply] = results(session)  # the call gave up at its timeout: the server's answer is not in it
    assert reply.startswith("Error:") and "too late" not in reply, reply
    if effect == "once":  # it may have been done: the model does not call it again, as for an unkeyed POST
        assert reply.startswith("Error: wait's outcome is unknown: no answer within 2 s from the MCP server slow. "
                                "The MCP server slow may have done it, so it was not sent again. Do not call wait "
                                "again for this;"), reply
    else:  # calling it again changes nothing
        assert reply.startswith("Error: wait failed: the MCP server slow did not answer within 2 s."), reply
    assert events[-1].type == "Message" and session.history[-1]["ok"] is True
    session.close()


ERROR_SERVER = """\
import os

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

server = MCPServer("strict")
CALLS = []


@server.tool()
def count() -> dict:
    CALLS.append(1)
    return {"calls": len(CALLS), "pid": os.getpid()}


@server.tool()
def strict(n: int) -> str:
    # what some SDKs answer a bad argument with: a JSON-RPC error, not a result marked an error
    raise MCPError(-32602, f"Invalid params: n must be positive, got {n}")


server.run()
"""


@pytest.mark.subprocess  # a stdio MCP server that answers a call with a JSON-RPC error
def test_a_json_rpc_error_answer_is_the_servers_reason_and_the_server_keeps_running(write_bot, tmp_path):
    (tmp_path / "strict_server.py").write_text(ERROR_SERVER)
    bot = chatrun.load_bot(write_bot(f"""
        name: n
        model: {{provider: scripted, name: m}}
        mcp_servers:
          strict: {{command: [python, {tmp_path / 'strict_server.py'}]}}
        routes:
          main: {{default: true, system: Count., mcp: [strict]}}
        """))

    async def run() -> chatrun.Session:
        session = bot.session(model=chatrun.ScriptedModel([
            call("count"), {"text": "one"}, call("strict", n=-1), {"text": "no"}, call("count"), {"text": "two"},
        ]))
        for text in ("count", "bad", "count"):
            await session.achat(text)
        await bot.tools.aclose()
        return session

    first, refused, second = results(asyncio.run(run()))
    assert refused == "Error: strict failed: Invalid params: n must be positive, got -1"  # not "not reachable"
    assert json.loads(second) == {"calls": 2, "pid": json.loads(first)["pid"]}  # the same process, its state kept


HANGING_LIST_SERVER = """\
import asyncio

from mcp.server.mcpserver import MCPServer


class Hanging(MCPServer):
    async def list_tools(self, *args, **kwargs):
        await asyncio.sleep(3600)  # started, but never lists its tools (WHEN_LISTING)


server = Hanging("hanging")


@server.tool()
def hello() -> str:
    return "hi"


server.run()
"""


@pytest.mark.subprocess  # a stdio MCP server that never lists its tools
@pytest.mark.parametrize("when_listing", ["await asyncio.sleep(3600)", "import os; os._exit(3)"], ids=["hangs", "exits"])
def test_a_server_that_never_lists_its_tools_does_not_hold_the_turn(write_bot, tmp_path, monkeypatch, when_listing):
    from chatrun.toolkinds import mcp_servers

    monkeypatch.setattr(mcp_servers, "LIST_TIMEOUT_S", 1.0, raising=False)  # the test need not wait 30 s
    (tmp_path / "hanging_server.py").write_text(HANGING_LIST_SERVER.replace("await asyncio.sleep(3600)", when_listing))
    bot = chatrun.load_bot(write_bot(f"""
        name: n
        model: {{provider: scripted, name: m}}
        mcp_servers:
          hanging: {{command: [python, {tmp_path / 'hanging_server.py'}]}}
        routes:
          main: {{default: true, system: Hello., mcp: [hanging]}}
        """))
    model = chatrun.ScriptedModel([{"text": "hello without its tools"}])

    async def run() -> list[chatrun.Event]:
        session = bot.session(model=model)
        try:  # 60 s: a bound for a turn that was held for as long as the server liked, not a speed figure
            return await asyncio.wait_for(session.achat("hi"), 60)
        finally:
            await bot.tools.aclose()

    events = [e for e in asyncio.run(run()) if e.type != "Stream"]
    assert [(e.type, e.data) for e in events] == [("Message", "hello without its tools")]
    assert model.requests[0].tools == []  # the route is offered without its server's tools


GROWING_SERVER = """\
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("growing")


def late() -> str:
    '''A tool the server adds while it runs.'''
    return "late"


@server.tool()
async def grow(ctx: Context) -> str:
    server.add_tool(late)
    await ctx.notify_tools_changed()  # its tool list changed: the clients that listen are told
    return "grown"


server.run()
"""


@pytest.mark.subprocess  # a stdio MCP server whose tool list changes while it runs
def test_a_server_whose_tool_list_changes_is_listed_again(write_bot, tmp_path):
    (tmp_path / "growing_server.py").write_text(GROWING_SERVER)
    bot = chatrun.load_bot(write_bot(f"""
        name: n
        model: {{provider: scripted, name: m}}
        mcp_servers:
          growing: {{command: [python, {tmp_path / 'growing_server.py'}]}}
        routes:
          main: {{default: true, system: Grow., mcp: [growing]}}
        """))
    model = chatrun.ScriptedModel([call("grow"), {"text": "grown"}, call("late"), {"text": "done"}])

    async def run() -> chatrun.Session:
        session = bot.session(model=model)
        await session.achat("grow")
        for _ in range(100):  # the change arrives on its own stream: wait for it, not for a time
            if bot.tools.runtime("mcp").servers.connection("growing")._tools is None:
                break
            await asyncio.sleep(0.05)
        await session.achat("use the new one")
        await bot.tools.aclose()
        return session

    session = asyncio.run(run())
    offered = [[t["function"]["name"] for t in request.tools] for request in model.requests]
    assert offered == [["grow"], ["grow"], ["grow", "late"], ["grow", "late"]]
    assert results(session) == ['{"result": "grown"}', '{"result": "late"}']


BOOKING_SERVER = """\
import json
import re
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("booking")
LOG = sys.argv[1]


@server.tool()
def book(seat: str, ctx: Context) -> dict:
    meta = dict(ctx.request_context.meta or {})
    with open(LOG, "a") as log:
        log.write(json.dumps({"seat": seat, "meta": meta, "pid": os.getpid()}) + "\\n")
    if not os.path.exists(LOG + ".crashed"):  # the first call: taken, then the server is gone
        open(LOG + ".crashed", "w").close()
        os._exit(3)
    return {"booked": seat}


server.run()
"""


@pytest.mark.slow
@pytest.mark.subprocess  # a stdio MCP server that records the _meta of each call, and dies in the first
def test_each_mcp_call_carries_its_idempotency_key_the_same_when_its_turn_runs_again(write_bot, tmp_path):
    from chatrun.models.scripted import ScriptedModel

    server, log = tmp_path / "booking_server.py", tmp_path / "calls.jsonl"
    server.write_text(BOOKING_SERVER)
    bot = chatrun.load_bot(write_bot(f"""
        name: n
        model: {{provider: scripted, name: m}}
        mcp_servers:
          booking: {{command: [python, {server}, {log}]}}
        routes:
          main: {{default: true, system: Book., tools: [book]}}
        tools:
          book: {{description: b, effect: once, mcp: {{server: booking}}}}
        """))
    model = ScriptedModel([call("book", seat="12A"), {"error": "the model is down"}])

    async def run() -> chatrun.Session:
        session = bot.session(model=model, session_id="s1")
        failed = await session.achat("book 12A")  # the server took it and died; then the turn failed
        assert failed[-1].type == "Error" and session.turn_count == 0
        model.add(call("book", seat="12A"), "Booked.")
        await session.achat("book 12A")  # the turn again: the same call, a new server process
        model.add(call("book", seat="12B"), "Booked.")
        await session.achat("and 12B")  # another call
        await bot.tools.aclose()
        return session

    session = asyncio.run(run())
    lost = model.requests[1].messages[-1].content  # what the model read of the call the server died in
    assert lost.startswith("Error: book's outcome is unknown: the connection to the MCP server booking was lost "
                           "during the call ("), lost
    assert "The MCP server booking may have done it, so it was not sent again. Do not call book again" in lost
    first, again, other = [json.loads(line) for line in log.read_text().splitlines()]
    key = first["meta"]["dev.chatrun/idempotency-key"]
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert first["pid"] != again["pid"] and again["meta"]["dev.chatrun/idempotency-key"] == key  # the same call
    assert other["meta"]["dev.chatrun/idempotency-key"] != key  # another call: another key
    assert results(session) == ['{"booked": "12A"}', '{"booked": "12B"}']
