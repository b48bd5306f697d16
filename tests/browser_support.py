"""Debian's Chromium driven by playwright, for the tests of the web page and the JavaScript
clients. Importing this module skips the importing one when playwright is not installed.

Set CHATRUN_SCREENSHOTS=DIR to keep screenshots (shot)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The marks of a browser test module: `pytestmark = BROWSER_MARKS`.
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing (CI installs chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium, closed after the block."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (CI installs chromium)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def chat_page(base_url: str, width: int = 1280, height: int = 860, locale: str | None = None,
              path: str = "/", color_scheme: str | None = None, init_script: str | None = None) -> Iterator[Any]:
    """The server's chat page at `path` (the author's at /, the end-user page at /chat/BOT), loaded
    and ready; the block fails if the page threw a JavaScript error. The page carries `base_url` and
    `js_errors`. `locale`: the browser's language; `color_scheme`: "dark" or "light"; `init_script`:
    JavaScript run in the page before its own (to make it a browser without some API)."""
    with chromium() as browser:
        options: dict[str, Any] = {"locale": locale} if locale else {}
        if color_scheme:
            options["color_scheme"] = color_scheme
        tab = browser.new_context(viewport={"width": width, "height": height}, **options).new_page()
        if init_script:
            tab.add_init_script(init_script)
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(base_url + path)
        tab.wait_for_selector("body[data-ready=true]", timeout=10_000)
        tab.base_url = base_url
        tab.js_errors = errors
        yield tab
        assert not errors, f"JavaScript errors on the page: {errors}"


def send(page: Any, text: str, timeout: float = 10_000) -> None:
    """Type a message and wait for its turn to end (the inspector refreshes after every turn,
    failed ones too, and counts it on the body); `timeout` in milliseconds."""
    seen = int(page.get_attribute("body", "data-refreshes") or 0)
    page.fill("#input", text)
    page.press("#input", "Enter")
    page.wait_for_function(f"Number(document.body.dataset.refreshes || 0) > {seen}", timeout=timeout)
    page.wait_for_selector("#thinking", state="hidden")


def open_page(browser: Any, url: str, width: int, height: int = 860) -> tuple[Any, list[str]]:
    """A new page of `browser` at `url`, ready, and the list its JavaScript errors go to (for a
    test whose page outlives a server: chat_page makes the browser and the page at once)."""
    tab = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.goto(url)
    tab.wait_for_selector("body[data-ready=true]", timeout=30_000)
    return tab, errors


def send_while_the_model_thinks(tab: Any, fake: Any, text: str) -> None:
    """Type `text` and send it; return once its turn runs (the fake model was asked), its answer
    held back 30 seconds so the turn is still running."""
    fake.queue({"text": "Never sent.", "delay": 30.0})
    tab.fill("#input", text)
    tab.press("#input", "Enter")
    tab.wait_for_selector("#thinking", state="visible")
    deadline = time.monotonic() + 30
    while not fake.requests:  # the turn runs: the model was asked
        assert time.monotonic() < deadline, "the model was never asked"
        time.sleep(0.05)


def restarted_mid_turn(tab: Any, replica: Any, fake: Any) -> None:
    """kill -9 the replica (a `redis_support.Replica`) mid-turn, so nothing of the turn is
    committed; once the page shows it offline, forget the fake's held answer and its request
    (only what follows counts), start the replica again and wait until the page is online."""
    replica.signal(signal.SIGKILL)
    replica.proc.wait(timeout=30)
    tab.wait_for_function("document.getElementById('status').dataset.state === 'offline'")
    fake.reset()
    replica.start()
    tab.wait_for_function("document.getElementById('status').dataset.state === 'online'", timeout=60_000)


def shot(page: Any, name: str) -> None:
    """A full-page screenshot in $CHATRUN_SCREENSHOTS, when set."""
    directory = os.environ.get("CHATRUN_SCREENSHOTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(directory) / f"{name}.png"), full_page=True)
