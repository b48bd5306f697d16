"""The author's page with no model (issue 35): the author plays the model. A message on the
author's page makes each model call a ModelRequest; the page shows "Answer as the model" (what the
model sees, a reply or a tool call with JSON arguments), and the author's answer is the bot's
reply; a tool call runs the tool (here: pushes a route, where the model is asked again). The
end-user page never offers it: its users read the plain explanation. Real Chromium against the
real server, no model endpoint at all. Set CHATRUN_SCREENSHOTS=DIR to keep the screenshots."""

from __future__ import annotations

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, shot
from chatrun.server import create_app
from server_support import ThreadServer

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

HOTELS = """\
name: hotels
description: Books hotel rooms.
model: {name: gpt-4o-mini}
routes:
  desk:
    default: true
    title: Front desk
    system: You book hotel rooms.
    tools: [book_room]
  booking:
    title: Your booking
    system: Book the room for the dates the guest gives.
tools:
  book_room:
    description: Start booking a room
    action: {push: booking, execute: true}
"""


@pytest.fixture
def server(tmp_path, monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "hotels.yaml").write_text(HOTELS)
    with ThreadServer(create_app([chatrun.load_bot(tmp_path / "hotels.yaml")], "memory://")) as running:
        yield running


def ask(page, text: str) -> None:
    """Send a user message; the page then asks the author for the model's answer."""
    page.fill("#input", text)
    page.press("#input", "Enter")
    page.locator("#play-model").wait_for(state="visible", timeout=10_000)


def bot_replies(page) -> list[str]:
    return [t.strip() for t in page.locator("#messages .msg.bot").all_inner_texts()]


@pytest.mark.parametrize("width", [390, 1280])
def test_the_author_answers_as_the_model_and_it_is_the_bots_reply(server, width):
    with chat_page(server.url, width=width, path="/bots/hotels/") as page:
        banner = page.locator("#model-banner")
        banner.wait_for(state="visible")
        assert "Answer in its place" in banner.inner_text()
        ask(page, "Hello")
        assert "route desk" in page.locator("#play-where").inner_text()
        page.locator(".play-sees summary").click()
        sees = page.locator("#play-sees").inner_text()
        assert "You book hotel rooms." in sees and "user: Hello" in sees and "book_room" in sees
        shot(page, f"play-model-{width}")
        page.fill("#play-text", "Welcome to the **front desk**! Shall I book a room?")
        page.press("#play-text", "Enter")
        page.wait_for_function("[...document.querySelectorAll('#messages .msg.bot')].some(b => b.innerText.includes('Shall I'))")
        page.wait_for_selector("#play-model", state="hidden")
        assert bot_replies(page)[-1].startswith("Welcome to the front desk! Shall I book a room?")
        assert page.locator("#messages .msg.bot strong").inner_text() == "front desk"  # Markdown, as a model's
        shot(page, f"play-model-answered-{width}")

        # A tool call: book_room pushes the booking route, where the model is asked again.
        ask(page, "Yes please")
        page.check("#play-kind-tool")
        page.select_option("#play-tool", "book_room")
        page.fill("#play-args", "{}")
        page.click("#play-send")
        page.wait_for_function("document.getElementById('play-where').textContent.includes('route booking')")
        page.fill("#play-text", "Which dates?")
        page.click("#play-send")
        page.wait_for_selector("#thinking", state="hidden")
        page.wait_for_function("document.getElementById('play-model').hidden")
        page.wait_for_function("[...document.querySelectorAll('#messages .msg.bot')].some(b => b.innerText.includes('Which dates?'))")


def test_bad_arguments_are_caught_on_the_page(server):
    with chat_page(server.url, width=1280, path="/bots/hotels/") as page:
        ask(page, "Hello")
        page.check("#play-kind-tool")
        page.fill("#play-args", "{not json")
        page.click("#play-send")
        problem = page.locator("#play-problem")
        problem.wait_for(state="visible")
        assert problem.inner_text().startswith("The arguments are not JSON")
        assert page.locator("#play-model").is_visible()  # still waiting for an answer


def test_the_end_user_page_keeps_its_plain_explanation_and_never_plays(server):
    with chat_page(server.url, width=390, path="/chat/hotels") as page:
        banner = page.locator("#model-banner")
        banner.wait_for(state="visible")
        assert banner.inner_text().startswith("This chat cannot answer yet")
        assert "Answer in its place" not in banner.inner_text()
        page.fill("#input", "Hello")
        page.press("#input", "Enter")
        page.locator("#messages .error").first.wait_for(state="visible", timeout=10_000)
        assert not page.locator("#play-model").is_visible()
        assert not page.locator("#play-always").is_visible()
        assert page.evaluate("window.ChatrunPage.session().playModel") is None


def test_stop_abandons_a_turn_waiting_for_the_author(server):
    with chat_page(server.url, width=1280, path="/bots/hotels/") as page:
        ask(page, "Hello")
        page.click("#stop")
        page.wait_for_selector("#play-model", state="hidden")
        page.wait_for_selector("#stop", state="hidden")
        # The session is free at once: the next message asks the author again.
        ask(page, "Hello again")
        page.fill("#play-text", "Here I am.")
        page.press("#play-text", "Enter")
        page.wait_for_function("[...document.querySelectorAll('#messages .msg.bot')].some(b => b.innerText.includes('Here I am.'))")
