"""The embeddable widget in Chromium (issue 35; docs/widget.md): a shop's page on another origin
(its own HTTP server, on another port) with one <script> tag gets a launcher; opening it shows
the chat panel (the chat server's page in an iframe), a message gets the fake model's reply, a
reload brings the conversation back, a reply while closed is counted on the launcher, Esc
closes it and gives the launcher the focus; a page on an undeclared origin gets no widget and
the reason in its console; a signed identity the shop hands over is the session's principal.
Screenshots at 390 and 1280 px (CHATRUN_SCREENSHOTS=DIR keeps them)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

import chatrun
from browser_support import BROWSER_MARKS, chromium, shot
from chatrun.server import create_app
from chatrun.server.widget_identity import sign_identity
from server_support import ThreadServer, free_port

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

KEY = "widget-test-key-0123456789abcdef"

BOT = """\
name: travel
description: Plans trips.
model: {{name: gpt-4o-mini}}
widget:
  origins: ["{site}"]
  title: Travel help
  greeting: Where would you like to go?
  color: "#0b7a5f"
  logo: logo.svg
routes:
  main:
    default: true
    system: "You plan trips for {{{{ principal.display_name if principal and principal.display_name else 'a visitor' }}}}."
"""


LOGO = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><circle cx="16" cy="16" r="15" fill="#ffd43b"/>'
        '<path d="M6 20h20l-4-8-5 5-3-3z" fill="#0b7a5f"/></svg>')


# The host page's function that gives the widget a fresh identity (docs/widget.md): its backend's.
RENEW = ("<script>window.renewals = 0; window.chatIdentity = async () => { window.renewals += 1; "
         "return (await fetch('/identity')).text(); };</script>")


class ShopPages(BaseHTTPRequestHandler):
    """The host site: a page with the widget's tag (and the signed identity, on /signed; and the
    function that renews it, on /renewing); its backend's fresh identity at /identity."""

    chat = ""  # the chat server's URL
    identity = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/identity":  # an hour from now, as the chat server's clock reads it
            import chatrun.server.widget_identity as clock
            return self.reply(sign_identity(KEY.encode(), "cust-42", "Ana Lima", int(clock.time.time()) + 3600).encode(),
                              "text/plain")
        extra = f' data-identity="{self.identity}"' if self.path.startswith(("/signed", "/renewing")) else ""
        extra += ' data-identity-refresh="chatIdentity"' if self.path.startswith("/renewing") else ""
        body = ("<!doctype html><html lang=en><head><meta name=viewport content='width=device-width'><title>Shop</title>"
                "<style>button { background: red !important; } * { font-family: serif !important; }</style></head>"
                "<body><h1>Our shop</h1><p>Sunglasses, hats and sun cream.</p>"
                + (RENEW if self.path.startswith("/renewing") else "")
                + f'<script src="{self.chat}/widget.js" data-bot="travel"{extra}></script></body></html>').encode()
        self.reply(body, "text/html; charset=utf-8")

    def reply(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def shop_site(port: int, chat: str, identity: str) -> Iterator[str]:
    handler = type("Shop", (ShopPages,), {"chat": chat, "identity": identity})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def sites(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("CHATRUN_WIDGET_SECRET", KEY)
    shop_port = free_port()
    site = f"http://127.0.0.1:{shop_port}"
    (tmp_path / "bot.yaml").write_text(BOT.format(site=site))
    (tmp_path / "logo.svg").write_text(LOGO)
    app = create_app([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 'chat.db'}")
    identity = sign_identity(KEY.encode(), "cust-42", "Ana Lima", int(time.time()) + 3600)
    with ThreadServer(app) as chat, shop_site(shop_port, chat.url, identity) as shop:
        yield chat, shop, shop_port


@contextmanager
def shop_page(url: str | None, width: int, color_scheme: str = "light", locale: str | None = None) -> Iterator[Any]:
    """A tab on the shop's page (`url`; None: the test goes there itself); `locale`: the browser's language."""
    with chromium() as browser:
        options: dict[str, Any] = {"locale": locale} if locale else {}
        page = browser.new_context(viewport={"width": width, "height": 800}, color_scheme=color_scheme,
                                   **options).new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        if url is not None:
            page.goto(url)
        yield page
        assert not errors, f"JavaScript errors on the page: {errors}"


def panel_frame(page: Any, timeout: float = 10_000) -> Any:
    page.wait_for_selector("[data-chatrun-widget] >> .panel iframe", state="attached")
    frame = page.frame_locator("[data-chatrun-widget] >> .panel iframe")
    frame.locator("body[data-ready=true]").wait_for(timeout=timeout)
    return frame


def send(frame: Any, text: str, replies_before: int) -> None:
    frame.locator("#input").fill(text)
    frame.locator("#input").press("Enter")
    frame.locator(".msg.bot:not(.widget-greeting)").nth(replies_before).wait_for(timeout=10_000)


@pytest.mark.parametrize("width", [390, 1280])
def test_the_widget_chats_on_another_origin_and_keeps_the_conversation(sites, fake, width):
    chat, shop, _port = sites
    with shop_page(shop + "/", width) as page:
        launcher = page.locator("[data-chatrun-widget] >> .launcher")
        launcher.wait_for()
        assert launcher.get_attribute("aria-expanded") == "false"
        assert launcher.get_attribute("aria-label") == "Open chat: Travel help"
        # The host page's `button { background: red !important }` does not reach into the shadow root.
        assert launcher.evaluate("b => getComputedStyle(b).backgroundColor") == "rgb(11, 122, 95)"
        # The bot's logo, from the chat server, in the launcher (and the panel's header below).
        assert launcher.locator("img").evaluate("i => i.complete && i.naturalWidth > 0")
        shot(page, f"widget-closed-{width}")
        launcher.click()
        frame = panel_frame(page)
        assert frame.locator(".widget-greeting").inner_text() == "Where would you like to go?"
        assert frame.locator("#input").evaluate("e => e === document.activeElement")
        frame.locator(".widget-head img").wait_for()
        assert frame.locator(".widget-head img").evaluate("i => i.complete && i.naturalWidth > 0")
        shot(page, f"widget-greeting-{width}")
        # The keyboard stays in the panel while it is open (a dialog's focus trap).
        frame.locator(".widget-close").focus()
        frame.locator(".widget-close").press("Shift+Tab")
        assert frame.locator("#send").evaluate("e => e === document.activeElement")
        frame.locator("#send").press("Tab")
        assert frame.locator(".widget-close").evaluate("e => e === document.activeElement")
        fake.queue({"text": "Lisbon is lovely in **May**."})
        send(frame, "Where should I go?", 0)
        assert frame.locator(".msg.bot:not(.widget-greeting)").first.locator("strong").inner_text() == "May"
        assert frame.locator(".widget-greeting").is_hidden()
        assert "a visitor" in str(fake.requests[-1]["messages"][0])
        panel = page.locator("[data-chatrun-widget] >> .panel")
        box = panel.bounding_box()
        if width == 390:  # a phone: the panel is the whole screen
            assert (box["x"], box["y"], box["width"], box["height"]) == (0, 0, 390, 800)
        else:
            assert box["width"] == 380 and box["x"] + box["width"] == 1280 - 20
        shot(page, f"widget-open-{width}")

        # Esc closes the panel and gives the launcher the focus.
        frame.locator("#input").press("Escape")
        panel.wait_for(state="hidden")
        assert launcher.evaluate("b => b.getRootNode().activeElement === b")
        assert launcher.get_attribute("aria-expanded") == "false"

        # A reload brings the conversation back (the visitor's id and the session are kept).
        page.reload()
        launcher.wait_for()
        launcher.click()
        frame = panel_frame(page)
        frame.locator(".msg.user").first.wait_for()
        assert frame.locator(".msg.user").all_inner_texts() == ["Where should I go?"]

        # A reply that arrives while the panel is closed is counted on the launcher: the model
        # answers only once the panel is closed.
        closed = threading.Event()

        async def held_reply(_body: Any) -> dict[str, Any]:
            await asyncio.get_running_loop().run_in_executor(None, closed.wait, 10)
            return {"chunks": ["Also ", "Porto."], "chunk_delay": 0.05}  # streamed

        fake.responder = held_reply
        frame.locator("#input").fill("And?")
        frame.locator("#input").press("Enter")
        frame.locator(".widget-close").click()
        panel.wait_for(state="hidden")
        closed.set()
        page.locator("[data-chatrun-widget] >> .badge").wait_for(timeout=10_000)
        assert page.locator("[data-chatrun-widget] >> .badge").inner_text() == "1"
        assert launcher.get_attribute("aria-label") == "Open chat: Travel help (1 unread)"
        # Read out on the host page by the launcher's live region: the reply's words, once complete.
        page.wait_for_function("() => document.querySelector('[data-chatrun-widget]').shadowRoot"
                               ".querySelector('[aria-live]').textContent === 'Travel help: Also Porto.'")
        shot(page, f"widget-unread-{width}")
        launcher.click()
        assert page.locator("[data-chatrun-widget] >> .badge").is_hidden()


# Every frame a page's WebSockets send, kept in `window.sentFrames`.
KEEP_SENT_FRAMES = """window.sentFrames = [];
const sendFrame = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) { window.sentFrames.push(String(data)); return sendFrame.call(this, data); };"""


def test_the_widget_never_asks_to_play_the_model_and_keeps_its_greeting_out_of_the_conversation(sites, fake):
    """docs/protocol.md ("Who may play") and docs/widget.md (`greeting`)."""
    _chat, shop, _port = sites
    with shop_page(None, 1280) as page:
        page.add_init_script(KEEP_SENT_FRAMES)  # in the panel's frame too
        page.goto(shop + "/")
        page.locator("[data-chatrun-widget] >> .launcher").click()
        frame = panel_frame(page)
        fake.queue({"text": "Lisbon."})
        send(frame, "Where should I go?", 0)
        panel = next(f for f in page.frames if "/widget/travel/frame" in f.url)
        sent = [json.loads(text) for text in panel.evaluate("window.sentFrames")]
    turns = [f for f in sent if f.get("type") == "ChatRouteMessage"]
    assert turns and [f for f in turns if "playModel" in f] == [], turns
    assert "Where would you like to go?" not in json.dumps(fake.requests[-1]["messages"])


def test_a_page_on_an_undeclared_origin_gets_no_widget_and_the_reason(sites):
    _chat, _shop, port = sites
    with shop_page(None, 1280) as page:
        with page.expect_console_message(lambda m: "chatrun widget refused" in m.text, timeout=10_000) as refusal:
            page.goto(f"http://localhost:{port}/")  # the same shop, by another name: another origin
        assert f"may not be embedded on http://localhost:{port}: add it to `widget.origins`" in refusal.value.text
        assert page.locator("[data-chatrun-widget]").count() == 0


def test_a_signed_identity_is_the_sessions_principal(sites, fake):
    chat, shop, _port = sites
    with shop_page(shop + "/signed", 1280) as page:
        page.locator("[data-chatrun-widget] >> .launcher").click()
        frame = panel_frame(page)
        fake.queue({"text": "Hello Ana."})
        send(frame, "Hi", 0)
        assert "You plan trips for Ana Lima." in str(fake.requests[-1]["messages"][0])
        session = page.evaluate("() => Object.keys(localStorage)")  # the host's storage holds no chat id
        assert not any("chatId" in key for key in session)
        chat_id = frame.locator("body").evaluate(
            "() => localStorage.getItem(Object.keys(localStorage).find((k) => k.endsWith(':chatId')))")
    identity = sign_identity(KEY.encode(), "cust-42", "Ana Lima", int(time.time()) + 600)
    mine = httpx.get(f"{chat.url}/bots/travel/sessions/{chat_id}", headers={"Authorization": f"Bearer {identity}"})
    assert mine.status_code == 200  # the session is cust-42's ...
    visitor = httpx.get(f"{chat.url}/bots/travel/sessions/{chat_id}",
                        headers={"Authorization": "Bearer cwv." + "x" * 30})
    assert visitor.status_code == 404  # ... and nobody else's


def test_a_signed_identity_expiring_mid_conversation_tells_the_visitor_to_reload(sites, fake, monkeypatch):
    """The identity expires while the panel is open and its connection is lost: the visitor reads
    why the chat stopped and what to do, in the page's words (they read the author's page's
    notice: open the page with ?token=, tokens in the server's --auth file); what they typed
    stays in the box, and the server's reason is in the console for the site's developers."""
    import chatrun.server.widget_identity as identity_module

    chat, shop, _port = sites
    with shop_page(shop + "/signed", 390) as page:
        logged: list[str] = []
        page.on("console", lambda message: logged.append(message.text))
        page.locator("[data-chatrun-widget] >> .launcher").click()
        frame = panel_frame(page)
        fake.queue({"text": "Hello Ana."})
        send(frame, "Hi", 0)
        later = time.time() + 7200  # the identity (an hour) has expired
        monkeypatch.setattr(identity_module, "time", type("Later", (), {"time": staticmethod(lambda: later)}))
        frame.locator("#input").fill("and my booking?")
        frame.locator("body").evaluate("() => ChatrunPage.client().websocket.close()")  # the network drops
        notice = frame.locator("#unauthorized")
        notice.wait_for(timeout=30_000)
        assert notice.inner_text() == ("This chat cannot go on: its access has expired or was refused. "
                                       "Reload the page to continue.")
        assert frame.locator("#input").input_value() == "and my booking?"
        assert any("expired" in line for line in logged), logged
        shot(page, "widget-expired-390")


def test_an_expired_identity_is_renewed_by_the_host_page_and_the_chat_goes_on(sites, fake, monkeypatch):
    """The identity expires while the panel is open and its connection is lost; the host page
    names a function that gives a fresh one (data-identity-refresh): the panel asks it once, goes
    on in the same conversation with no reload and no notice, and what was typed is sent."""
    import chatrun.server.widget_identity as identity_module

    chat, shop, _port = sites
    with shop_page(shop + "/renewing", 390) as page:
        page.locator("[data-chatrun-widget] >> .launcher").click()
        frame = panel_frame(page)
        fake.queue({"text": "Hello Ana."})
        send(frame, "Hi", 0)
        frame.locator("body").evaluate("() => { window.notReloaded = true; }")
        later = time.time() + 7200  # the identity (an hour) has expired
        monkeypatch.setattr(identity_module, "time", type("Later", (), {"time": staticmethod(lambda: later)}))
        frame.locator("#input").fill("and my booking?")
        frame.locator("body").evaluate("() => ChatrunPage.client().websocket.close()")  # the network drops
        page.wait_for_function("() => window.renewals === 1", timeout=30_000)  # asked once ...
        frame.locator("#status[data-state=online]").wait_for(state="attached", timeout=30_000)  # ... and connected
        assert page.evaluate("() => window.renewals") == 1
        assert frame.locator("body").evaluate("() => window.notReloaded") is True
        assert frame.locator("#unauthorized").count() == 0
        assert frame.locator("#input").input_value() == "and my booking?"
        fake.queue({"text": "Your booking is confirmed."})
        frame.locator("#input").press("Enter")
        frame.locator(".msg.bot", has_text="Your booking is confirmed.").wait_for(timeout=10_000)
        sent = str(fake.requests[-1]["messages"])
        assert "Hi" in sent and "Hello Ana." in sent and "and my booking?" in sent  # the same conversation
        shot(page, "widget-renewed-390")


def test_a_panel_opened_with_an_expired_identity_gets_a_fresh_one_first(sites, fake, monkeypatch):
    """The page was rendered an hour ago (its identity has expired since): the panel's first
    request is refused, the host page's function gives a fresh identity, and the chat starts."""
    import chatrun.server.widget_identity as identity_module

    _chat, shop, _port = sites
    with shop_page(shop + "/renewing", 1280) as page:
        page.wait_for_selector("[data-chatrun-widget][data-ready=true]", state="attached")
        later = time.time() + 7200
        monkeypatch.setattr(identity_module, "time", type("Later", (), {"time": staticmethod(lambda: later)}))
        page.locator("[data-chatrun-widget] >> .launcher").click()
        # Refused, the host page asked, then connected again: three round trips and the page's
        # reconnect pause before it is ready (a busy machine took over 10 s).
        page.wait_for_function("() => window.renewals === 1", timeout=30_000)
        frame = panel_frame(page, timeout=30_000)
        assert page.evaluate("() => window.renewals") == 1
        fake.queue({"text": "Hello Ana."})
        send(frame, "Hi", 0)
        assert "You plan trips for Ana Lima." in str(fake.requests[-1]["messages"][0])


AXE = Path(__file__).parent / "vendor" / "axe.min.js"


def axe_problems(target: Any) -> list[str]:
    """axe-core's serious and critical violations in a page or a frame (open shadow roots included)."""
    target.add_script_tag(path=str(AXE))
    found = target.evaluate("axe.run(document).then((r) => r.violations.map((v) => "
                            "({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' '))})))")
    return [f"{v['id']} ({v['impact']}): {v['nodes'][:3]}" for v in found if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("width", [390, 1280])
def test_the_widget_in_dark_mode_has_no_serious_accessibility_problem(sites, fake, width):
    _chat, shop, _port = sites
    with shop_page(shop + "/", width, color_scheme="dark") as page:
        launcher = page.locator("[data-chatrun-widget] >> .launcher")
        launcher.wait_for()
        assert axe_problems(page) == []  # the host page with the launcher
        launcher.click()
        frame = panel_frame(page)
        fake.queue({"text": "Lisbon is lovely in **May**:\n\n| month | sun |\n|---|---|\n| May | 9 h |"})
        send(frame, "Where should I go?", 0)
        inner = next(f for f in page.frames if "/widget/" in f.url)
        assert inner.evaluate("matchMedia('(prefers-color-scheme: dark)').matches")
        background = inner.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background != "rgb(255, 255, 255)", "the panel follows the system's dark mode"
        assert axe_problems(inner) == []  # the chat in the panel, with a reply holding a table
        shot(page, f"widget-dark-{width}")
