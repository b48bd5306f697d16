"""A reload never leaves a replaced bot's MCP servers running (issue 15): the REPL closes the old
bot's tools when /reload swaps it and everything when it exits; `chatrun serve --reload` closes
them once no session runs on the old bot any more, and the rest when it stops. Real stdio MCP
servers built with the SDK (bots/notes/notes_server.py), counted as processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from test_reload import Repl, Server

pytest.importorskip("mcp", reason="the mcp SDK is not installed (pip install 'chatrun[mcp]')")
pytestmark = [pytest.mark.subprocess,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc")]

REPO = Path(__file__).resolve().parents[1]
NOTES = REPO / "bots" / "notes"


def notes_bot(folder: Path) -> Path:
    folder.mkdir(parents=True)
    shutil.copy(NOTES / "bot.yaml", folder / "bot.yaml")
    shutil.copy(NOTES / "notes_server.py", folder / "notes_server.py")
    return folder


def edit(folder: Path, old: str, new: str) -> None:
    text = (folder / "bot.yaml").read_text()
    assert old in text
    tmp = folder / ".bot.yaml.tmp"  # write then rename, as an editor saves
    tmp.write_text(text.replace(old, new))
    tmp.replace(folder / "bot.yaml")


def _process(pid: int) -> tuple[str, int, bytes] | None:
    """(state, parent pid, command line) of a process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), cmdline


def alive(pid: int) -> bool:
    found = _process(pid)
    return found is not None and found[0] != "Z"  # a zombie has exited


def mcp_servers(parent: int) -> list[int]:
    """The running notes servers started by `parent`."""
    pids = []
    for entry in Path("/proc").iterdir():
        found = _process(int(entry.name)) if entry.name.isdigit() else None
        if found and found[0] != "Z" and found[1] == parent and b"notes_server.py" in found[2]:
            pids.append(int(entry.name))
    return pids


def eventually(check, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.1)


@pytest.mark.parametrize("watch", [False, True], ids=["/reload", "--reload"])
def test_repl_keeps_one_server_across_turns_closes_it_on_reload_and_the_new_one_on_exit(tmp_path, watch):
    folder = notes_bot(tmp_path / "notes")
    repl = Repl(folder, *(["--reload"] if watch else []))
    repl.send("note the wifi password")
    repl.send('/call remember {"title": "wifi", "text": "pw 123"}')
    repl.wait_for("[tool remember → Saved. The user has 1 notes.]")
    repl.send("/say Saved.")
    repl.send("what was the wifi password?")
    repl.send('/call search_notes {"query": "wifi"}')
    # The same server process as the turn before: it still holds the note.
    repl.wait_for('"found": [{"title": "wifi", "text": "pw 123"}]')
    repl.send("/say pw 123")
    repl.wait_for("pw 123")
    [first] = mcp_servers(repl.proc.pid)

    edit(folder, "description: Take and find notes", "description: Take and find notes (edited)")
    if not watch:
        repl.send("/reload")
    repl.wait_for("[reloaded notes:")
    repl.send("/route")  # the REPL takes a watched edit's bot with the next line it reads
    eventually(lambda: not alive(first), "the replaced bot's MCP server still runs after /reload")

    repl.send("save another")
    repl.send('/call remember {"title": "door", "text": "4711"}')
    repl.wait_for("[tool remember → Saved. The user has 1 notes.]")  # a new server, empty at first
    repl.send("/say Saved.")
    repl.wait_for("Saved.")
    [second] = mcp_servers(repl.proc.pid)
    assert second != first
    out = repl.finish()
    assert not alive(second), "the MCP server outlived the REPL"
    assert "Traceback" not in out and "error occurred" not in out


def test_repl_with_a_real_model_keeps_one_connection_across_turns_and_resets(tmp_path, fake):
    """The real openai client against the fake server: one client for the REPL's life (not one
    per turn, each left open on a closed loop), shared by the sessions /reset starts."""
    fake.queue({"text": "One."}, {"text": "Two."}, {"text": "Three."})
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(PYTHONPATH=str(REPO / "runner"), OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="test-key",
               PYTHONWARNINGS="always::ResourceWarning")
    run = subprocess.run([sys.executable, "-m", "chatrun", "repl", "bots/hello"], input="hi\nagain\n/reset\nnew\n",
                         capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert ["One.", "Two.", "Three."] == [line for line in run.stdout.splitlines() if line.endswith(".")][-3:]
    peers = [r.peer for r in fake.log if r.path.endswith("/chat/completions")]
    assert len(peers) == 3 and len(set(peers)) == 1, peers
    assert "ResourceWarning" not in run.stderr and "Traceback" not in run.stderr


def test_serve_reload_closes_the_old_bots_server_once_no_session_runs_on_it(tmp_path, fake):
    folder = notes_bot(tmp_path / "notes")
    server = Server(folder, fake)
    base = f"{server.base}/bots/notes/sessions"

    def turn(session: str, title: str) -> None:
        fake.queue({"tool_calls": [{"name": "remember", "arguments": {"title": title, "text": "x"}}]},
                   {"text": "Saved."})
        r = httpx.post(f"{base}/{session}/messages", json={"userMessage": f"save {title}"}, timeout=60)
        assert r.status_code == 200 and r.json()["ok"], r.text

    try:
        eventually(lambda: _up(server.base), "chatrun serve did not answer /health")
        assert httpx.post(base, json={"id": "s1"}).status_code == 201
        turn("s1", "first")
        [first] = mcp_servers(server.proc.pid)

        mark = len(server.output)
        edit(folder, "description: Take and find notes", "description: Take and find notes (edited)")
        server.wait_for_output("reloaded bot notes", after=mark)
        time.sleep(2 * 1.0)  # two checks of the replaced bots (Watchers.CHECK_EVERY_S)
        assert alive(first), "closed while session s1, cached on the old bot, may still use it"

        turn("s1", "second")  # s1 moves to the reloaded bot, which starts its own server
        eventually(lambda: not alive(first), "the replaced bot's MCP server still runs with no session on it")
        [second] = mcp_servers(server.proc.pid)
        assert second != first
    finally:
        server.stop()
    assert not alive(second), "the MCP server outlived chatrun serve"
    assert "Traceback" not in "".join(server.output)


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
