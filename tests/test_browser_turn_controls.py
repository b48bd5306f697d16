"""Stop and feedback on the page (issue 35): Stop cancels a streaming turn (the reply shown so
far stays, the session answers the next message at once, the history records the stop); thumbs
up/down on a committed reply, thumbs down with a comment, kept with the turn and counted.
Real Chromium against the real server, the model played by the fake OpenAI server (a stream
that stalls after its first chunks: only Stop can end that turn). At 390 and 1280 px.

Set CHATRUN_SCREENSHOTS=DIR to keep screenshots."""

from __future__ import annotations

import httpx
import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chatrun.server import create_app
from server_support import ThreadServer, write_travel

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]


@pytest.fixture
def server(fake, tmp_path):
    app = create_app([chatrun.load_bot(write_travel(tmp_path))], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as running:
        yield running


def history(server, page) -> list[dict]:
    chat_id = page.evaluate("window.ChatrunPage.session().chatId")
    return httpx.get(f"{server.url}/bots/travel/sessions/{chat_id}").json()["history"]


@pytest.mark.parametrize("width", [390, 1280])
def test_stop_cancels_a_streaming_turn_and_the_chat_goes_on(server, fake, width):
    with chat_page(server.url, width=width) as page:
        fake.queue({"chunks": ["Let me look ", "that up"], "stall": True})
        page.fill("#input", "Find me a flight")
        page.press("#input", "Enter")
        page.wait_for_selector(".msg.bot.streaming")
        assert page.is_visible("#stop") and not page.is_visible("#send")
        shot(page, f"stop-streaming-{width}")
        page.click("#stop")
        page.wait_for_selector("#thinking", state="hidden")
        page.wait_for_selector("#stop", state="hidden")
        assert page.is_visible("#send")
        assert page.locator(".msg.bot").last.inner_text().startswith("Let me look")  # what was shown stays
        assert page.locator(".msg.bot .rate").count() == 0  # a stopped turn has nothing to rate
        shot(page, f"stop-stopped-{width}")
        [entry] = history(server, page)
        assert entry["ok"] is False and entry["error"] == "cancelled"

        fake.queue({"text": "Where to?"})
        send(page, "Find me a flight")
        assert page.locator(".msg.bot").last.inner_text().startswith("Where to?")
        assert [(e["ok"], e.get("turn")) for e in history(server, page)] == [(False, 1), (True, 1)]


def test_thumbs_up_and_down_with_a_comment_are_kept_with_their_turns(server, fake):
    with chat_page(server.url, width=1280) as page:
        fake.queue({"text": "Where to?"}, {"text": "Dublin it is."})
        send(page, "A flight please")
        send(page, "Dublin")
        replies = page.locator(".msg.bot")
        replies.first.locator(".rate-up").wait_for()
        replies.nth(1).locator(".rate-down").wait_for()
        replies.first.locator(".rate-up").click()
        replies.first.locator(".feedback-thanks").wait_for()
        assert replies.first.locator(".rate-up").get_attribute("aria-pressed") == "true"
        replies.nth(1).locator(".rate-down").click()
        page.fill(".feedback-form textarea", "It did not ask for the date")
        shot(page, "feedback-comment-1280")
        page.emulate_media(color_scheme="dark")
        shot(page, "feedback-comment-1280-dark")
        page.press(".feedback-form textarea", "Enter")
        replies.nth(1).locator(".feedback-thanks").wait_for()
        rated = [e["feedback"] for e in history(server, page) if "feedback" in e]
        assert rated == [{"turn": 1, "rating": "up", "route": "main_menu"},
                         {"turn": 2, "rating": "down", "route": "main_menu", "comment": "It did not ask for the date"}]

        page.reload()  # replayed replies get their thumbs too, on the right turns
        page.wait_for_selector("body[data-ready=true]")
        page.locator(".msg.bot").nth(1).locator(".rate-down").wait_for()
        assert page.locator(".msg.bot .rate").count() == 4
        assert page.evaluate("document.querySelectorAll('.msg.bot')[1].dataset.turn") == "2"
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'chatrun_feedback_total{bot="travel",rating="down",route="main_menu"} 1.0' in metrics
