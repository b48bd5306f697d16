"""The page shows the bot in the session's locale (docs/i18n.md): a German browser gets the
bakery's German texts and the inspector names the locale; every bubble has dir="auto", so
right-to-left text renders right to left. Screenshots at a phone's width and a desktop's
(CHATRUN_SCREENSHOTS=DIR keeps them)."""

from __future__ import annotations

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chat_support import call
from chatrun.server import create_app
from server_support import ThreadServer
from test_i18n_serve import BAKERY

pytestmark = [*BROWSER_MARKS]

ARABIC = "مرحبا، أريد رغيفين من الخبز"


@pytest.mark.parametrize("width", [390, 1280])
def test_a_german_browser_gets_the_german_bakery_and_rtl_text_renders_right_to_left(fake, tmp_path, width):
    app = create_app([chatrun.load_bot(BAKERY)], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=width, locale="de-DE") as page:
        fake.queue(call("add_loaves", count=2), {"text": "بكل سرور"})
        send(page, ARABIC)
        page.wait_for_function("document.getElementById('session-locale').textContent === '· locale de'",
                               timeout=30_000)
        bubbles = page.locator(".msg")
        texts = bubbles.all_inner_texts()
        assert ARABIC in texts[0] and "Ihre Bestellung hat jetzt 2 Brote." in "\n".join(texts)
        assert page.locator("button", has_text="Brot bestellen").count() >= 1 or "Brot bestellen" in page.content()
        assert all(d == "auto" for d in page.eval_on_selector_all(".msg", "els => els.map(e => e.dir)"))
        directions = page.eval_on_selector_all(".msg", "els => els.map(e => getComputedStyle(e).direction)")
        assert directions[0] == "rtl" and directions[-1] == "rtl"  # the user's Arabic, the model's Arabic
        assert "ltr" in directions  # the German message between them
        assert page.get_attribute("#input", "dir") == "auto"
        shot(page, f"i18n-{width}")
