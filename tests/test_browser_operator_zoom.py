"""The operator page at 200% browser zoom (a 1280 x 860 window: 640 x 430 CSS px, two device pixels
each) and at 320 CSS px wide (WCAG's reflow width), by keyboard only (docs/operators.md, "At any
width, by keyboard"): the conversation is opened, taken over, answered, released and its approval
decided with Tab, Shift+Tab and Enter, each control the focus reaches inside the window; Take
over puts the focus in the message box (the next thing an operator does), and the page's status
stays on screen (it was hidden under 720 px: at 200% zoom an operator could not see the page
go offline). Chromium against a real server on a
loopback port (SQLite, an auth file), the fake OpenAI server as the model. CHATRUN_SCREENSHOTS=DIR
keeps the screenshots."""

from __future__ import annotations

from typing import Any

import pytest

from browser_support import BROWSER_MARKS, chromium, shot
from server_support import ThreadServer
from test_browser_operator_bots import OPS, post, served

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

def responder(body: dict[str, Any]) -> dict[str, Any]:
    """The refund asked for once (one approval, p1); after that, words."""
    if any(m.get("tool_calls") for m in body["messages"]):
        return {"text": "Done."}
    return {"tool_calls": [{"name": "refund", "arguments": {"order": "A7"}}]}


FOCUSED = """() => { const a = document.activeElement; const r = a.getBoundingClientRect();
  return {id: a.id, cls: a.className, x: r.left, y: r.top, right: r.right, bottom: r.bottom,
          w: innerWidth, h: innerHeight}; }"""


def tab_to(page: Any, selector: str, key: str = "Tab", limit: int = 30) -> None:
    """Press `key` until the focus is on `selector`; every control it passes is inside the window."""
    for _ in range(limit):
        page.keyboard.press(key)
        at = page.evaluate(FOCUSED)
        if at["id"] or at["cls"]:
            assert at["x"] >= -1 and at["right"] <= at["w"] + 1, f"{at} sticks out of the window"
            assert at["y"] >= -1 and at["bottom"] <= at["h"] + 1, f"{at} is cut off"
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"{selector} not reached with {key} in {limit} presses")


def on_screen(page: Any, selector: str) -> None:
    box = page.locator(selector).bounding_box()
    size = page.viewport_size
    assert box and box["width"] > 0, f"{selector} is not shown"
    assert box["x"] >= 0 and box["x"] + box["width"] <= size["width"] and box["y"] + box["height"] <= size["height"]


@pytest.mark.parametrize("window", [(640, 430, 2), (320, 640, 1)], ids=["zoom-200", "width-320"])
def test_the_operator_takes_over_answers_decides_and_releases_by_keyboard(fake, tmp_path, window):
    width, height, scale = window
    fake.responder = responder
    with chromium() as browser, ThreadServer(served(tmp_path)) as server:
        post(server.url, "/bots/shop/sessions", {"id": "shop-1"})
        post(server.url, "/bots/shop/sessions/shop-1/messages", {"userMessage": "refund A7"})
        page = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=scale,
                                   locale="en-US").new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/operator?token={OPS}")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        on_screen(page, "#status")  # live: shown at any width (a dot at 320 px), its word read out
        assert page.locator("#status").text_content() == "live"
        shot(page, f"operator-keyboard-list-{width}")
        tab_to(page, ".op-session[data-bot=shop]")
        page.keyboard.press("Enter")
        page.wait_for_selector("#take-over", timeout=30_000)
        tab_to(page, "#take-over")
        page.keyboard.press("Enter")
        page.wait_for_selector("#operator-input", timeout=30_000)
        page.wait_for_function("document.activeElement && document.activeElement.id === 'operator-input'")
        page.keyboard.type("Hello, I am on it.")
        page.keyboard.press("Enter")
        page.locator(".msg.operator", has_text="Hello, I am on it.").wait_for(timeout=30_000)
        shot(page, f"operator-keyboard-taken-{width}")
        tab_to(page, "#release", key="Shift+Tab")
        page.keyboard.press("Enter")
        page.wait_for_selector("#take-over", timeout=30_000)
        tab_to(page, ".pending-card[data-item=p1] button.approve", key="Shift+Tab")
        page.keyboard.press("Enter")
        page.locator(".pending-card[data-item=p1] button.approve").wait_for(state="detached", timeout=30_000)
        shot(page, f"operator-keyboard-released-{width}")
        assert errors == []


def test_an_approval_decided_during_a_takeover_shows_it_is_held_not_open(fake, tmp_path):
    """An operator who holds the conversation approves its item: the decision is held until the
    release (docs/operators.md, "Whatever else happens while you hold the conversation"), and the
    card says so, "Approved by ops: applies when the conversation is released", without controls.
    (It showed Approve and Reject again, as if nothing had been decided, and a second click was
    refused: "it is decided already".) On release the held approval applies and the card goes."""
    fake.responder = responder
    with chromium() as browser, ThreadServer(served(tmp_path)) as server:
        post(server.url, "/bots/shop/sessions", {"id": "shop-1"})
        post(server.url, "/bots/shop/sessions/shop-1/messages", {"userMessage": "refund A7"})
        page = browser.new_context(viewport={"width": 1280, "height": 860}, locale="en-US").new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/operator?token={OPS}")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        page.locator(".op-session[data-bot=shop]").click()
        page.click("#take-over")
        page.wait_for_selector("#operator-input", timeout=30_000)
        page.click(".pending-card[data-item=p1] button.approve")
        card = page.locator(".pending-card[data-item=p1][data-state=held]")
        card.wait_for(timeout=30_000)
        assert card.locator(".pending-status").inner_text() == "Approved by ops: applies when the conversation is released"
        assert card.locator("button").count() == 0
        shot(page, "operator-held-approval-1280")
        page.click("#release")
        page.locator(".pending-card[data-item=p1]").wait_for(state="detached", timeout=30_000)
        assert errors == []
