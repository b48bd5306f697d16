"""The web page shows the user's events only, and an ended conversation as ended: real Chromium
against the real server, the survey bot of tests/test_event_audiences_clients.py answered by the
fake OpenAI server, at a phone's width and a desktop's.

Set CHATRUN_SCREENSHOTS=DIR to keep screenshots of each step."""

from __future__ import annotations

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chatrun.server import create_app
from server_support import ThreadServer, call
from test_event_audiences_clients import write_survey

pytestmark = BROWSER_MARKS


@pytest.fixture
def server(fake, tmp_path):
    bot = chatrun.load_bot(write_survey(tmp_path / "survey"))
    app = create_app([bot], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as running:
        yield running


def fits_the_width(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")


@pytest.mark.parametrize("width", [390, 1280])
def test_the_page_shows_only_the_users_events_and_ends_the_conversation(server, fake, width):
    fake.queue(call("rate", score=2), call("bye"))
    with chat_page(server.url, width=width) as page:
        send(page, "2")
        chat = page.locator("#messages").inner_text()
        assert "Thanks for your score!" in chat and "Rated" in chat.title()
        assert "Detractor" not in chat and "Handoff" not in chat and "call the customer back" not in chat
        # The inspector (the author's view) lists all three, the others marked with their audience.
        rows = page.locator("#last-turn .turn-event")
        assert [rows.nth(i).get_attribute("data-audience") for i in range(rows.count())] == [
            "user", "backend", "operators", "user"]
        assert page.locator("#last-turn .turn-event.not-for-user").count() == 2
        if width > 900:  # the inspector is beside the chat: open the last turn for the screenshot
            page.click("#panel-turn summary")
            shot(page, "inspector-audiences")

        send(page, "bye")
        shot(page, f"ended-{width}")
        assert page.locator("#ended").is_visible()
        assert "This conversation has ended." in page.locator("#ended").inner_text()
        assert page.locator("#input").is_disabled() and page.locator("#send").is_disabled()
        assert page.locator("#start-new").is_visible()
        assert fits_the_width(page)

        # A reload resumes the session and replays it: still ended, still without the others' events.
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        page.wait_for_selector("#ended")
        assert page.locator("#input").is_disabled()
        assert "Detractor" not in page.locator("#messages").inner_text()
        shot(page, f"ended-resumed-{width}")

        page.click("#start-new")
        page.wait_for_function("!document.querySelector('#input').disabled")
        assert page.locator("#ended").count() == 0 and not page.locator("#send").is_disabled()
        fake.queue({"text": "Hello again"})
        send(page, "hello")
        assert page.locator(".msg.bot").last.inner_text() == "Hello again"
