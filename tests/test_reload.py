"""Reloading a bot while it runs (issue 15): `chatrun serve --reload`, `chatrun repl --reload`,
`/reload`, and what the engine keeps across a reload (state, scopes, memories)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from chatrun import ScriptedModel, load_bot
from chatrun.engine.reload import BotReloader
from server_support import free_port

REPO = Path(__file__).resolve().parents[1]

BOT = """\
name: reloading
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
state: {mood: calm}
routes:
  main:
    default: true
    system: "PROMPT-ONE {{ state.mood }}"
    tools: [go_deep, set_mood]
  deep:
    system: "Deep down."
tools:
  go_deep:
    description: go deeper
    action: {push: deep}
  set_mood:
    description: set the mood
    parameters: {type: object, properties: {mood: {type: string}}, required: [mood]}
    action: {set: {state.mood: "{{ args.mood }}"}, reply: ok}
"""


def write(folder: Path, text: str = BOT) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    # Write then rename: an editor's save, never a half-written file for the watcher.
    tmp = folder / ".bot.yaml.tmp"
    tmp.write_text(text)
    tmp.replace(folder / "bot.yaml")
    return folder


# -- the engine: a session moved onto the reloaded bot ------------------------------------------


def test_a_valid_reload_keeps_state_scopes_and_memories(tmp_path):
    folder = write(tmp_path / "bot")
    bot = load_bot(folder)
    model = ScriptedModel([{"tool_calls": [{"name": "set_mood", "arguments": {"mood": "glad"}}]}, "Noted.", {"tool_calls": [{"name": "go_deep", "arguments": {}}]}, "Below."])
    session = bot.session(model=model)
    session.chat("be glad")
    session.chat("go down")
    assert session.stack == ["main", "deep"]
    memory_before = [m.to_dict() for m in session.memory()]

    write(folder, BOT.replace("Deep down.", "Deeper still."))
    outcome = BotReloader(folder, bot).reload()
    assert outcome.ok and outcome.bot is not bot
    session.use_bot(outcome.bot)
    assert session.stack == ["main", "deep"] and session.state["mood"] == "glad"
    assert [m.to_dict() for m in session.memory()] == memory_before
    assert session.preview_messages()[0].content == "Deeper still."


def _without_deep(folder: Path, bot):
    without_deep = BOT.replace('  deep:\n    system: "Deep down."\n', "").replace(
        "action: {push: deep}", "action: {reply: nowhere}")
    write(folder, without_deep)
    outcome = BotReloader(folder, bot).reload()
    assert outcome.ok, [d.format() for d in outcome.diagnostics]
    return outcome.bot


def test_a_session_on_a_route_the_edit_removed_goes_on_at_the_default_route_with_a_note(tmp_path):
    folder = write(tmp_path / "bot")
    bot = load_bot(folder)
    model = ScriptedModel([{"tool_calls": [{"name": "go_deep", "arguments": {}}]}])
    session = bot.session(model=model)
    model.add("Back on top.")
    session.chat("go down")
    first_scope = session.scopes[0].id
    new_bot = _without_deep(folder, bot)
    session.use_bot(new_bot)
    # restart_scope (the default): the scope on `deep` ended, a new one on `main` took over
    assert session.stack == ["main", "main"] and session.scopes[0].id == first_scope
    assert [e.data for e in session.chat("hello?") if e.type == "Message"] == ["Back on top."]
    sent = [m.to_openai() for m in model.requests[-1].messages]
    assert any("'deep'" in str(m["content"]) and "no longer exists" in str(m["content"]) for m in sent)
    entry = session.history[-1]
    assert entry["ok"] and entry["moved"]["from"] == bot.config.content_version
    assert entry["moved"]["to"] == new_bot.config.content_version != bot.config.content_version
    assert "restarted on 'main'" in entry["moved"]["notes"][0]
    assert session.snapshot()["bot_version"] == new_bot.config.content_version


def test_a_failed_turn_after_a_move_rolls_back_the_turn_but_not_the_bots_change(tmp_path):
    folder = write(tmp_path / "bot")
    bot = load_bot(folder)
    model = ScriptedModel([{"tool_calls": [{"name": "go_deep", "arguments": {}}]}])
    session = bot.session(model=model)
    session.chat("go down")
    new_bot = _without_deep(folder, bot)
    session.use_bot(new_bot)
    events = session.chat("hello?")  # the scripted model has no answer left: the turn fails
    assert [e.type for e in events if e.type == "Error"] == ["Error"]
    stored = session.store.load_session(session.id)
    assert [s["route"] for s in stored["scopes"]] == ["main", "deep"]  # as it was: nothing committed
    assert stored["bot_version"] == bot.config.content_version
    assert session.stack == ["main", "main"] and session.moved is not None  # moved again, for the next turn
    model.add("Now it works.")
    assert [e.data for e in session.chat("again") if e.type == "Message"] == ["Now it works."]
    assert session.store.load_session(session.id)["bot_version"] == new_bot.config.content_version


def test_a_stored_session_on_a_lost_route_resumes_on_a_bot_that_lacks_it(tmp_path):
    folder = write(tmp_path / "bot")
    bot = load_bot(folder)
    session = bot.session(model=ScriptedModel([{"tool_calls": [{"name": "go_deep", "arguments": {}}]}, "Below."]))
    session.chat("go down")
    new_bot = _without_deep(folder, bot)
    resumed = new_bot.session(session_id=session.id, store=bot.store, model=ScriptedModel(["Hello from main."]))
    assert resumed.stack == ["main", "main"]
    assert [e.data for e in resumed.chat("hi") if e.type == "Message"] == ["Hello from main."]
    # the old version was not at hand: the move names the one the session recorded
    assert resumed.history[-1]["moved"]["from"] == bot.config.content_version


def test_an_invalid_edit_keeps_the_old_bot_and_reports_where(tmp_path):
    folder = write(tmp_path / "bot")
    bot = load_bot(folder)
    reloader = BotReloader(folder, bot)
    write(folder, BOT.replace("tools: [go_deep, set_mood]", "tools: [go_deep, set_mod]"))
    outcome = reloader.reload()
    assert not outcome.ok and reloader.bot is bot
    assert any("set_mod" in d.message and d.line == 8 for d in outcome.diagnostics)
    assert bot.reload_problems == outcome.diagnostics  # what the inspector's banner shows
    write(folder)
    assert reloader.reload().ok


def test_a_renamed_bot_is_refused(tmp_path):
    folder = write(tmp_path / "bot")
    reloader = BotReloader(folder, load_bot(folder))
    write(folder, BOT.replace("name: reloading", "name: other"))
    outcome = reloader.reload()
    assert not outcome.ok and "name changed from 'reloading' to 'other'" in outcome.diagnostics[0].message


def test_only_the_bots_own_files_trigger_a_reload(tmp_path):
    folder = write(tmp_path / "bot")
    reloader = BotReloader(folder)
    assert reloader.relevant(folder / "bot.yaml")
    assert reloader.relevant(folder / "routes" / "more.yaml")
    assert reloader.relevant(folder / "handlers.py")
    assert not reloader.relevant(folder / "transcripts" / "golden.yaml")
    assert not reloader.relevant(folder / "__pycache__" / "handlers.cpython-311.pyc")
    assert not reloader.relevant(folder / "notes.txt")
    assert not reloader.relevant(tmp_path / "elsewhere.yaml")
    # .chatrun/ (the editor's schema copies, the knowledge index): an edit there is no edit of the bot
    assert not reloader.relevant(folder / ".chatrun" / "schemas" / "bot.schema.json")
    assert not reloader.relevant(folder / ".chatrun" / "notes.yaml")


# -- chatrun serve --reload, a real server process ---------------------------------------------


class Server:
    def __init__(self, bot: Path, fake) -> None:
        self.port = free_port()
        env = dict(os.environ, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="test-key")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "runner"), env.get("PYTHONPATH")]))
        env.pop("CHATRUN_AUTH_FILE", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chatrun", "serve", str(bot), "--reload", "--port", str(self.port),
             "--store", "memory://", "--log-level", "warning"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.port}"
        self.wait_for_output("watching", 30)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)

    def wait_for_output(self, text: str, timeout: float = 30, after: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.output[after:]):
                return
            if self.proc.poll() is not None:
                raise AssertionError("chatrun serve exited:\n" + "".join(self.output))
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} from chatrun serve in {timeout} s:\n" + "".join(self.output))

    def turn(self, session: str, text: str) -> dict:
        r = httpx.post(f"{self.base}/bots/reloading/sessions/{session}/messages", json={"userMessage": text}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.mark.subprocess
def test_serve_reload_sends_the_edited_prompt_and_survives_a_bad_edit(tmp_path, fake):
    folder = write(tmp_path / "bot")
    server = Server(folder, fake)
    try:
        while True:  # the server answers health once uvicorn listens
            try:
                httpx.get(f"{server.base}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert httpx.post(f"{server.base}/bots/reloading/sessions", json={"id": "s1"}).status_code == 201
        fake.queue({"tool_calls": [{"name": "set_mood", "arguments": {"mood": "glad"}}]}, {"text": "Noted."})
        server.turn("s1", "be glad")
        assert fake.requests[-1]["messages"][0]["content"] == "PROMPT-ONE glad"

        mark = len(server.output)
        write(folder, BOT.replace("PROMPT-ONE", "PROMPT-TWO"))
        server.wait_for_output("reloaded bot reloading", after=mark)
        fake.queue({"text": "Still glad."})
        assert server.turn("s1", "how are you?")["ok"]
        sent = fake.requests[-1]["messages"]
        assert sent[0]["content"] == "PROMPT-TWO glad"  # the new prompt, the session's state kept
        assert [m["content"] for m in sent if m["role"] == "user"] == ["be glad", "how are you?"]  # its memory too

        mark = len(server.output)
        write(folder, BOT.replace("PROMPT-ONE", "PROMPT-THREE").replace("tools: [go_deep, set_mood]", "tools: [nope]"))
        server.wait_for_output("is invalid; still serving the previous version", after=mark)
        assert any("tool `nope`" in line or "nope" in line for line in server.output[mark:])
        fake.queue({"text": "Unchanged."})
        assert server.turn("s1", "and now?")["ok"]
        assert fake.requests[-1]["messages"][0]["content"] == "PROMPT-TWO glad"
        inspected = httpx.get(f"{server.base}/bots/reloading/sessions/s1/inspect").json()
        assert any("nope" in d["message"] for d in inspected["reload_problems"])

        mark = len(server.output)
        write(folder, BOT.replace("PROMPT-ONE", "PROMPT-FOUR"))
        server.wait_for_output("reloaded bot reloading", after=mark)
        assert httpx.get(f"{server.base}/bots/reloading/sessions/s1/inspect").json()["reload_problems"] == []
    finally:
        server.stop()


# -- chatrun repl: /reload and --reload -------------------------------------------------------------


@pytest.mark.subprocess
def test_repl_reload_command_uses_the_edited_prompt_and_keeps_the_old_bot_on_a_bad_edit(tmp_path):
    folder = write(tmp_path / "bot")
    repl = Repl(folder)
    repl.send("hello")
    repl.wait_for("[system prompt: PROMPT-ONE calm]")
    repl.send("/say Hi.")
    write(folder, BOT.replace("PROMPT-ONE", "PROMPT-TWO"))
    repl.send("/reload")
    repl.wait_for("[reloaded reloading:")
    repl.send("again")
    repl.wait_for("[system prompt now: PROMPT-TWO calm]")
    repl.send("/say Hi again.")
    write(folder, BOT.replace("routes:", "routes: ["))
    repl.send("/reload")
    repl.wait_for("the bot is invalid; still running the previous version")
    repl.send("once more")
    repl.send("/say Still here.")
    out = repl.finish()
    assert "bot.yaml:" in out.split("still running the previous version")[1]
    assert "Still here." in out and "PROMPT-THREE" not in out


@pytest.mark.subprocess
def test_repl_reload_flag_watches_the_files(tmp_path):
    folder = write(tmp_path / "bot")
    repl = Repl(folder, "--reload")
    repl.wait_for("watching")
    repl.send("hello")
    repl.wait_for("[system prompt: PROMPT-ONE calm]")
    repl.send("/say Hi.")
    repl.wait_for("Hi.")
    write(folder, BOT.replace("PROMPT-ONE", "PROMPT-TWO"))
    repl.wait_for("[reloaded reloading:")  # printed by the watcher, at the prompt
    write(folder, BOT.replace("tools: [go_deep, set_mood]", "tools: [nope]"))
    repl.wait_for("still running the previous version")
    repl.send("again")
    repl.wait_for("[system prompt now: PROMPT-TWO calm]")
    repl.send("/say Bye.")
    out = repl.finish()
    assert "nope" in out.split("still running the previous version")[1]


class Repl:
    """`chatrun repl --play-model` in a subprocess, read line by line as it prints."""

    def __init__(self, folder: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
        env["PYTHONPATH"] = str(REPO / "runner")
        self.proc = subprocess.Popen([sys.executable, "-m", "chatrun", "repl", str(folder), "--play-model", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        self.output: list[str] = []
        self.seen = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_for(self, text: str, timeout: float = 30) -> None:
        """Until `text` is printed (after what an earlier wait found)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, line in enumerate(self.output[self.seen:], self.seen):
                if text in line:
                    self.seen = i + 1
                    return
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"the REPL did not print {text!r}:\n" + "".join(self.output))

    def finish(self) -> str:
        self.proc.stdin.close()
        self.proc.wait(30)
        time.sleep(0.2)
        out = "".join(self.output)
        assert self.proc.returncode == 0, out
        assert "Traceback" not in out
        return out

