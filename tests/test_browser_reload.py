"""`chatrun serve --reload` in the web page (issue 15): an invalid edit shows a banner with
the diagnostics in the inspector, the old bot keeps answering; a valid edit removes it."""

from __future__ import annotations

import threading
import time

import uvicorn

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send
from chatrun.server import create_app
from server_support import free_port
from test_reload import BOT, write

pytestmark = BROWSER_MARKS


def wait_until(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_inspector_shows_a_banner_while_the_edited_bot_is_invalid(tmp_path, fake):
    folder = write(tmp_path / "bot")
    app = create_app([chatrun.load_bot(folder)], "memory://", reload=True, gc_tuning=False)
    registry = app.state.registry
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "uvicorn to start")
        time.sleep(0.5)  # the watcher's first scan
        with chat_page(f"http://127.0.0.1:{port}") as page:
            fake.queue({"text": "Hello."})
            send(page, "hi")
            assert page.is_hidden("#reload-banner")

            write(folder, BOT.replace("tools: [go_deep, set_mood]", "tools: [nope]"))
            wait_until(lambda: registry.bots["reloading"].reload_problems, "the invalid edit to be seen")
            fake.queue({"text": "Still the old bot."})
            send(page, "still there?")
            banner = page.inner_text("#reload-banner")
            assert "still running the previous version" in banner and "nope" in banner
            assert "bot.yaml:" in banner
            assert fake.requests[-1]["messages"][0]["content"] == "PROMPT-ONE calm"

            old = registry.bots["reloading"]
            write(folder, BOT.replace("PROMPT-ONE", "PROMPT-TWO"))
            wait_until(lambda: registry.bots["reloading"] is not old, "the valid edit to be loaded")
            fake.queue({"text": "New bot."})
            send(page, "and now?")
            assert page.is_hidden("#reload-banner")
            assert fake.requests[-1]["messages"][0]["content"] == "PROMPT-TWO calm"
    finally:
        server.should_exit = True
        thread.join(10)
