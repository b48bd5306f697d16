"""The widget of an Arabic bot (`locales: [ar]`) in Chromium, on a right-to-left host page
(`<html dir="rtl" lang="ar">`) and on a left-to-right one (docs/widget.md, "Languages"): the
panel is the bot's page in Arabic, mirrored (its title at the right, the close button at the left),
and its message box, empty, is written from the right: the caret and the placeholder start at
the right edge, as the visitor will type. A box whose `dir="auto"` finds no letter to go by fell
back to left-to-right, its placeholder pushed to the left edge; typed Latin text still turns the
box left-to-right. The launcher and its panel sit at the end of the host page's line
(`widget.position`'s default, `end`): bottom-left on the right-to-left page, bottom-right once it
turns left to right. A real chat server and a host site on two loopback ports, the fake OpenAI
server as the model. Screenshots at 390 and 1280 px (CHATRUN_SCREENSHOTS=DIR keeps them)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import chatrun
from browser_support import BROWSER_MARKS, shot
from chatrun.server import create_app
from server_support import ThreadServer, free_port
from test_browser_widget import panel_frame, shop_page

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

BOT = """\
name: travel
locales: [ar]
model: {{name: gpt-4o-mini}}
widget:
  origins: ["{site}"]
  title: مساعد السفر
  greeting: إلى أين تريد أن تذهب؟
routes:
  main: {{default: true, system: You plan trips.}}
"""


@contextmanager
def host_site(port: int, chat: str, rtl: bool) -> Iterator[str]:
    """The host page, right to left in Arabic or left to right in English, with the widget's tag."""
    root = 'dir="rtl" lang="ar"' if rtl else 'lang="en"'
    page = (f"<!doctype html><html {root}><head><meta charset=utf-8><meta name=viewport content='width=device-width'>"
            f"<title>Shop</title></head><body><h1>{'متجرنا' if rtl else 'Our shop'}</h1>"
            f'<script src="{chat}/widget.js" data-bot="travel"></script></body></html>').encode()

    class Host(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Host)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


def box_side(frame: Any) -> str:
    """Where the empty box's placeholder starts: its computed direction and text alignment."""
    return frame.locator("#input").evaluate("e => getComputedStyle(e).direction")


@pytest.mark.parametrize("rtl", [True, False], ids=["rtl-host", "ltr-host"])
@pytest.mark.parametrize("width", [390, 1280])
def test_an_arabic_panel_is_mirrored_and_its_empty_box_starts_at_the_right(fake, tmp_path, rtl, width):
    port = free_port()
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "ar.yaml").write_text("hello: مرحبا\n")
    (tmp_path / "bot.yaml").write_text(BOT.format(site=f"http://127.0.0.1:{port}"))
    app = create_app([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 'chat.db'}")
    name = f"widget-ar-{'rtl' if rtl else 'ltr'}-host-{width}"
    with ThreadServer(app) as chat, host_site(port, chat.url, rtl) as site, shop_page(site + "/", width) as page:
        launcher = page.locator("[data-chatrun-widget] >> .launcher")
        launcher.wait_for()
        assert launcher.get_attribute("aria-label") == "فتح المحادثة: مساعد السفر"
        launcher.click()
        frame = panel_frame(page)
        assert frame.locator("html").get_attribute("dir") == "rtl"
        assert frame.locator("html").get_attribute("lang") == "ar"
        title, close = frame.locator("#widget-title").bounding_box(), frame.locator(".widget-close").bounding_box()
        assert close["x"] < title["x"]  # mirrored: the close button at the left, the title at the right
        assert box_side(frame) == "rtl"  # the empty box: its placeholder and caret at the right
        shot(page, name + "-empty")
        fake.queue({"text": "لشبونة جميلة في **مايو**."})
        frame.locator("#input").fill("Lisbon in May?")
        assert box_side(frame) == "ltr"  # Latin text typed: the box goes by it (dir="auto")
        frame.locator("#input").press("Enter")
        frame.locator(".msg.bot:not(.widget-greeting)").first.wait_for(timeout=10_000)
        assert frame.locator("#input").input_value() == ""
        assert box_side(frame) == "rtl"  # empty again: from the right
        frame.locator("#input").fill("شكرا")
        assert box_side(frame) == "rtl"
        shot(page, name + "-answered")


def box(page: Any, part: str) -> dict[str, float]:
    return page.locator(f"[data-chatrun-widget] >> {part}").bounding_box()


@pytest.mark.parametrize("width", [390, 1280])
def test_on_a_right_to_left_page_the_launcher_and_its_panel_sit_at_the_lines_end_bottom_left(fake, tmp_path, width):
    """`widget.position`'s default, `end`: the end of the host page's line, the left on a
    `<html dir="rtl">` page (it was the right); the panel opens on that side (the whole screen
    on a phone), and a page that turns left to right moves them to the right."""
    port = free_port()
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "ar.yaml").write_text("hello: مرحبا\n")
    (tmp_path / "bot.yaml").write_text(BOT.format(site=f"http://127.0.0.1:{port}"))
    app = create_app([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as chat, host_site(port, chat.url, True) as site, shop_page(site + "/", width) as page:
        page.locator("[data-chatrun-widget] >> .launcher").wait_for()
        launcher = box(page, ".launcher")
        assert launcher["x"] == 20 and launcher["y"] + launcher["height"] == 800 - 20  # bottom-left
        shot(page, f"widget-rtl-end-{width}-closed")
        page.locator("[data-chatrun-widget] >> .launcher").click()
        panel_frame(page)
        panel = box(page, ".panel")
        if width > 480:
            assert panel["x"] == 20 and panel["y"] + panel["height"] == 800 - 92  # above the launcher, at the left
        else:
            assert (panel["x"], panel["width"]) == (0, width)  # a phone: the whole screen
        shot(page, f"widget-rtl-end-{width}-open")
        page.keyboard.press("Escape")
        page.evaluate("document.documentElement.dir = 'ltr'")  # the page switches to a left-to-right language
        launcher = box(page, ".launcher")
        assert launcher["x"] + launcher["width"] == width - 20  # bottom-right now
        shot(page, f"widget-ltr-end-{width}-closed")
