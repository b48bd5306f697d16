"""The widget's `greeting:` in the visitor's language (docs/widget.md, "Languages"): a bot with
`locales: [en, de]` writes it `"{{ t('greeting') }}"`, and the panel's first bubble is the German
text in a browser that asks for German, the English one in an English browser (it was shown as
written, in every locale). A real chat server and a host site on two loopback ports in Chromium.
Screenshots at 390 px (CHATRUN_SCREENSHOTS=DIR keeps them)."""

from __future__ import annotations

import pytest

import chatrun
from browser_support import BROWSER_MARKS, shot
from chatrun.server import create_app
from server_support import ThreadServer, free_port
from test_browser_widget import panel_frame, shop_page
from test_browser_widget_rtl import host_site

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

BOT = """\
name: travel
locales: [en, de]
model: {{name: gpt-4o-mini}}
widget:
  origins: ["{site}"]
  greeting: "{{{{ t('greeting') }}}}"
routes:
  main: {{default: true, system: You plan trips.}}
"""
GREETINGS = {"en-US": "Where would you like to go?", "de-DE": "Wohin möchten Sie reisen?"}


@pytest.mark.parametrize("locale", list(GREETINGS))
def test_the_panels_greeting_is_in_the_visitors_language(fake, tmp_path, locale):
    port = free_port()
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text(f"greeting: {GREETINGS['en-US']}\n")
    (tmp_path / "locales" / "de.yaml").write_text(f"greeting: {GREETINGS['de-DE']}\n")
    (tmp_path / "bot.yaml").write_text(BOT.format(site=f"http://127.0.0.1:{port}"))
    bot = chatrun.load_bot(tmp_path / "bot.yaml")
    app = create_app([bot], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as chat, host_site(port, chat.url, False) as site, \
            shop_page(site + "/", 390, locale=locale) as page:
        page.locator("[data-chatrun-widget] >> .launcher").click()
        frame = panel_frame(page)
        assert frame.locator(".widget-greeting").inner_text() == GREETINGS[locale]
        assert frame.locator("html").get_attribute("lang") == locale[:2]
        shot(page, f"widget-greeting-{locale}-390")
