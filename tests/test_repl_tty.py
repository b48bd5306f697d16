"""`chatrun repl` at a real terminal (a pseudo-terminal): Ctrl-C, line editing and history,
long pastes, and the order of output and prompts."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import yaml

from tty_support import REPO, Terminal

pytestmark = pytest.mark.subprocess


def test_ctrl_c_at_the_model_prompt_cancels_and_the_next_line_is_not_swallowed(term):
    t = term("bots/hello", "--play-model")
    t.expect("chat> ")
    t.send("first message\r")
    t.expect("model> ")
    t.send("/sa")  # its echo shows readline is reading (a signal sooner could go unseen till input)
    t.expect("/sa")
    t.interrupt()
    t.expect("turn cancelled; the session is as it was before it")
    t.expect("chat> ")
    t.send("second message\r")
    # The line reached the REPL (no leftover reader took it): a new turn asks the model again.
    t.expect("[model on route chat")
    t.expect("model> ")
    t.send("/say Hello again\r")
    t.expect("Hello again")
    t.expect("chat> ")
    t.send("/history\r")
    history = t.expect("chat> ")
    assert "second message" in history
    t.send("/quit\r")
    assert t.wait() == 0


def test_ctrl_c_at_an_idle_prompt_clears_the_line_and_twice_quits(term):
    t = term("bots/hello", "--play-model")
    t.expect("chat> ")
    t.send("half a thought")
    t.expect("half a thought")
    t.interrupt()
    t.expect("(Ctrl-C again or Ctrl-D to quit)")
    t.expect("chat> ")
    t.send("/route\r")  # the session is still there, and the dropped text is gone
    assert "chat" in t.expect("chat> ")
    t.send("x")
    t.expect("x")
    t.interrupt()
    t.expect("chat> ")
    t.send("y")
    t.expect("y")
    t.interrupt()
    assert t.wait() == 0
    assert "Aborted" not in t.text


def test_ctrl_c_works_even_when_started_with_sigint_ignored(tmp_path):
    # A script's background job (`cmd &`) and some IDE consoles start programs with SIGINT ignored;
    # Python then never raises KeyboardInterrupt, and Ctrl-C at the REPL did nothing.
    t = Terminal.chatrun(["repl", "bots/hello", "--play-model"], home=tmp_path, ignore_sigint=True)
    try:
        t.expect("chat> ")
        t.send("half a thought")
        t.expect("half a thought")
        t.interrupt()
        t.expect("(Ctrl-C again or Ctrl-D to quit)", timeout=20)
        t.expect("chat> ")
        t.send("\x04")
        assert t.wait() == 0
    finally:
        t.close()


def test_ctrl_d_quits_cleanly(term):
    t = term("bots/hello", "--play-model")
    t.expect("chat> ")
    t.send("\x04")
    assert t.wait() == 0
    assert "Aborted" not in t.text and "Traceback" not in t.text


def test_up_arrow_recalls_history_which_is_kept_between_runs(term, tmp_path):
    t = term("bots/hello", "--play-model")
    t.expect("chat> ")
    t.send("/state\r")
    t.expect("chat> ")
    t.send("\x1b[A\r")  # Up, Enter: /state again
    shown = t.expect("chat> ")
    assert "^[[A" not in shown
    assert "{" in shown  # the state was printed a second time
    t.send("/quit\r")
    assert t.wait() == 0
    history = tmp_path / ".local" / "state" / "chatrun" / "history"
    assert "/state" in history.read_text()

    again = term("bots/hello", "--play-model")
    again.expect("chat> ")
    again.send("\x1b[A\x1b[A\r")  # two lines back: /state, recalled from the file
    assert "{" in again.expect("chat> ")
    again.send("/quit\r")
    assert again.wait() == 0


def test_tab_completes_slash_commands(term):
    t = term("bots/hello", "--play-model")
    t.expect("chat> ")
    t.send("/rou\t\r")
    assert "chat" in t.expect("chat> ")
    assert "unknown command" not in t.text


def test_a_long_paste_arrives_whole_and_save_expands_the_home_folder(term, tmp_path):
    long = "x" * 54_000
    t = term("bots/hello", "--play-model")
    t.expect("chat> ")
    t.send(long + "\r")
    t.expect("model> ", timeout=120)
    t.send("/say Got it\r")
    t.expect("Got it")
    t.expect("chat> ")
    t.send("/save ~/t.yaml\r")
    t.expect("saved 1 turn to")
    t.expect("chat> ")
    t.send("/quit\r")
    assert t.wait() == 0
    saved = yaml.safe_load((tmp_path / "t.yaml").read_text())  # HOME is tmp_path
    assert saved["turns"][0]["user"] == long
    assert not (tmp_path / "~").exists()


def test_events_are_printed_before_the_next_prompt(term):
    t = term("bots/travel", "--play-model")
    t.expect("main_menu> ")
    t.send("a flight please\r")
    t.expect("model> ")
    t.send("/call book_flight {}\r")
    after_call = t.expect("model> ")  # playing the model: the route change shows before the next call
    t.send("/say Where to?\r")
    between = t.expect("main_menu > flight> ")
    # Everything the turn printed came before the prompt, and nothing follows it.
    assert "→ main_menu > flight" in after_call and "Where to?" in between
    t.send("/route\r")
    assert t.expect("main_menu > flight> ").strip().endswith("flight")
    t.send("/quit\r")
    assert t.wait() == 0


def test_ctrl_c_at_the_model_prompt_then_quit_prints_no_traceback_and_usage_says_cancelled(term):
    # Every newcomer's default mode (no API key: the author plays the model). The interrupted
    # turn task kept its KeyboardInterrupt, and quitting printed "Task exception was never
    # retrieved" with 25 lines of traceback; /usage called the cancelled turn "failed".
    t = term("bots/hello", "--play-model")
    t.expect("chat> ")
    t.send("first message\r")
    t.expect("model> ")
    t.send("/sa")
    t.expect("/sa")
    t.interrupt()
    t.expect("turn cancelled; the session is as it was before it")
    t.expect("chat> ")
    t.send("/usage\r")
    usage = t.expect("chat> ")
    assert "last turn 1: no model call, cancelled" in usage
    assert "failed" not in usage
    t.send("/quit\r")
    assert t.wait() == 0
    assert "Task exception was never retrieved" not in t.text
    assert "Traceback" not in t.text


def test_a_reload_notice_while_typing_draws_the_prompt_and_the_typed_text_again(term, tmp_path):
    # --reload's watcher prints from another thread while input() waits: the notice landed
    # after "chat> half" and the author typed on a line with no prompt.
    bot = tmp_path / "hello"
    shutil.copytree(REPO / "bots" / "hello", bot)
    t = term(str(bot), "--play-model", "--reload")
    t.expect("(watching")
    t.expect("chat> ")
    t.send("half")
    t.expect("half")
    edit_until_reloaded(t, bot / "bot.yaml")
    redrawn = t.expect("chat> half", timeout=20)
    assert redrawn.startswith(" the next turn uses it]"), redrawn  # the prompt follows the notice's line
    t.send(" typed\r")
    t.expect("model> ")
    t.send("/say Noted\r")
    t.expect("chat> ")
    t.send("/history\r")
    assert "half typed" in t.expect("chat> ")
    t.send("/quit\r")
    assert t.wait() == 0


def edit_until_reloaded(t: Terminal, bot_yaml: Path) -> None:
    """Edit the bot until the REPL says it reloaded: the watcher may not be watching yet when
    "(watching …)" is printed (its thread starts then), so a first edit can go unseen."""
    deadline = time.monotonic() + 90
    n = 0
    while True:
        n += 1
        bot_yaml.write_text(bot_yaml.read_text().replace("Answer in", "Answer, please, in", 1) if n == 1
                            else bot_yaml.read_text() + f"# edit {n}\n")
        try:
            t.expect("[reloaded hello:", timeout=5)
            t.expect(";")  # the file list: the rest of the notice follows
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


NOISY_SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("noisy")
print("NOISY: starting up, loading the world", file=sys.stderr, flush=True)


@server.tool()
def shout(word: str) -> dict:
    """Say a word loudly."""
    print(f"NOISY: shouting {word}", file=sys.stderr, flush=True)
    return {"said": word.upper()}


server.run()
'''


def test_an_mcp_servers_stderr_goes_to_a_log_file_not_over_the_prompt(term, tmp_path):
    pytest.importorskip("mcp", reason="the mcp SDK is not installed (pip install 'chatrun[mcp]')")
    bot = tmp_path / "loud"
    bot.mkdir()
    (bot / "noisy_server.py").write_text(NOISY_SERVER)
    (bot / "bot.yaml").write_text(
        "name: loud\nmcp_servers:\n  noisy: {command: [python, noisy_server.py]}\n"
        "routes:\n  main: {default: true, system: Shout., mcp: [noisy]}\n")
    t = term(str(bot), "--play-model")
    log = tmp_path / ".local" / "state" / "chatrun" / "mcp" / "loud.noisy.log"
    t.expect(f"(MCP servers' stderr goes to {log})")
    t.expect("main> ")
    t.send("shout hello\r")
    t.expect("tools: shout")  # the server started and listed its tool
    t.expect("model> ")
    t.send('/call shout {"word": "hello"}\r')
    t.expect('[tool shout → {"said": "HELLO"}]')
    t.expect("model> ")
    t.send("/say Done\r")
    t.expect("main> ")
    t.send("/quit\r")
    assert t.wait() == 0
    assert "NOISY" not in t.text
    logged = log.read_text()
    assert "started: python noisy_server.py" in logged
    assert "NOISY: starting up" in logged and "NOISY: shouting hello" in logged
