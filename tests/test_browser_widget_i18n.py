"""The widget's `title:` and `greeting:` in the visitor's language (docs/widget.md, "Languages"): a
bot with `locales: [en, de]` writes them `"{{ t('title') }}"` and `"{{ t('greeting') }}"`, and the
launcher's label, the panel's header and its first bubble are the German texts in a browser that
asks for German, the English ones in an English browser (both were shown as written, in every
locale). A real chat server and a host site on two loopback ports in Chromium.
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
  title: "{{{{ t('title') }}}}"
  greeting: "{{{{ t('greeting') }}}}"
routes:
  main: {{default: true, system: You plan trips.}}
"""
GREETINGS = {"en-US": "Where would you like to go?", "de-DE": "Wohin möchten Sie reisen?"}
TITLES = {"en-US": ("Travel help", "Open chat: Travel help"), "de-DE": ("Reisehilfe", "Chat öffnen: Reisehilfe")}


@pytest.mark.parametrize("locale", list(GREETINGS))
def test_the_widgets_title_and_greeting_are_in_the_visitors_language(fake, tmp_path, locale):
    port = free_port()
    (tmp_path / "locales").mkdir()
    for language in ("en", "de"):
        tag = f"{language}-{'US' if language == 'en' else 'DE'}"
        (tmp_path / "locales" / f"{language}.yaml").write_text(
            f"greeting: {GREETINGS[tag]}\ntitle: {TITLES[tag][0]}\n")
    (tmp_path / "bot.yaml").write_text(BOT.format(site=f"http://127.0.0.1:{port}"))
    bot = chatrun.load_bot(tmp_path / "bot.yaml")
    app = create_app([bot], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as chat, host_site(port, chat.url, False) as site, \
            shop_page(site + "/", 390, locale=locale) as page:
        title, label = TITLES[locale]
        launcher = page.locator("[data-chatrun-widget] >> .launcher")
        launcher.wait_for()
        assert launcher.get_attribute("aria-label") == label
        launcher.click()
        frame = panel_frame(page)
        assert frame.locator("#widget-title").inner_text() == title
        assert frame.locator(".widget-greeting").inner_text() == GREETINGS[locale]
        assert frame.locator("html").get_attribute("lang") == locale[:2]
        shot(page, f"widget-title-greeting-{locale}-390")
