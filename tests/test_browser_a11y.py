"""The chat page for a screen reader, a keyboard and a reader who asked for less motion (WCAG 2.2
AA basics): new replies, operator messages, errors and what a card asks are read out once from a
polite live region, never the history a reload or a reconnect draws again; a choice and a card's
Yes work by keyboard and leave the focus in the message box; the controls are named in the
session's language, Arabic mirrored (dir="rtl"); the Thinking dots stand still under
prefers-reduced-motion. Real Chromium against the real server, the model played by the fake
OpenAI server."""

from __future__ import annotations

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chatrun.definition.page_texts import BUILTIN
from chatrun.server import create_app
from server_support import ThreadServer, call
from test_browser_enduser import HOTELS

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

LIVE = "(el) => el.getAttribute('aria-live') || ({log: 'polite', status: 'polite', alert: 'assertive'})[el.getAttribute('role')] || ''"


def _server(tmp_path, locales: tuple[str, ...] = ()) -> ThreadServer:
    folder = tmp_path / "hotels"
    (folder / "locales").mkdir(parents=True)
    extra = f"locales: [{', '.join(locales)}]\n" if locales else ""
    (folder / "bot.yaml").write_text(HOTELS.replace("model:", extra + "model:", 1))
    for locale in locales:
        (folder / "locales" / f"{locale}.yaml").write_text("greeting: hi\n")
    app = create_app([chatrun.load_bot(folder)], f"sqlite:///{tmp_path / 'chat.db'}")
    return ThreadServer(app)


def _announced(page) -> str:
    return page.inner_text("#announce")


def test_a_new_reply_is_read_out_once_and_a_reload_reads_out_no_history(fake, tmp_path):
    with _server(tmp_path) as server, chat_page(server.url, width=390, height=640, path="/chat/hotels") as page:
        # The chat is no live region: drawing the history again would read all of it out.
        assert page.eval_on_selector("#messages", LIVE) == ""
        assert page.eval_on_selector("#announce", LIVE) == "polite"
        fake.queue({"text": "Room **12** is free."})
        send(page, "A room for tonight?")
        assert _announced(page) == "Room 12 is free."  # the reply, not the reader's own message
        fake.queue({"status": 400})
        send(page, "And breakfast?")
        error = page.locator("#messages .error").last.inner_text()
        assert error and _announced(page) == error  # the failed turn's note is read out too
        page.reload()
        page.wait_for_selector("body[data-ready=true]", timeout=10_000)
        page.wait_for_function("document.querySelectorAll('#messages .msg.bot').length === 1")
        assert page.locator("#messages .error").count() >= 1  # the history is drawn again...
        assert _announced(page) == ""  # ...and not read out


def test_an_arabic_session_names_its_controls_in_arabic_right_to_left(fake, tmp_path):
    texts = BUILTIN["ar"]
    with _server(tmp_path, ("en", "ar")) as server, \
            chat_page(server.url, width=390, height=640, locale="ar", path="/chat/hotels") as page:
        page.wait_for_function("document.documentElement.lang === 'ar'", timeout=30_000)
        assert page.evaluate("document.documentElement.dir") == "rtl"
        tree = page.locator("body").aria_snapshot()
        assert f'textbox "{texts["message_label"]}"' in tree, tree
        assert f'region "{texts["chat_title"]}"' in tree, tree
        assert f'button "{texts["send"]}"' in tree, tree
        # The route titles' bar (shown on a wider screen), not the author's "Route stack".
        assert page.get_attribute("#breadcrumb", "aria-label") == texts["breadcrumb"]
        # Mirrored: the send button is left of the box, the box fills the row without spilling.
        box = page.locator("#input").bounding_box()
        button = page.locator("#send").bounding_box()
        assert button["x"] + button["width"] <= box["x"]
        assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
        shot(page, "a11y-ar-390")


@pytest.mark.parametrize("motion", ["reduce", "no-preference"])
def test_the_thinking_dots_stand_still_for_a_reader_who_asked_for_less_motion(fake, tmp_path, motion):
    with _server(tmp_path) as server, chat_page(server.url, path="/chat/hotels") as page:
        page.emulate_media(reduced_motion=motion)
        fake.queue({"text": "Done.", "delay": 30.0})
        page.fill("#input", "A room?")
        page.press("#input", "Enter")
        page.wait_for_selector("#thinking", state="visible")
        names = page.eval_on_selector_all("#thinking .dots i", "els => els.map((e) => getComputedStyle(e).animationName)")
        assert names == (["none"] * 3 if motion == "reduce" else ["bounce"] * 3)


DESK = """\
name: desk
model: {name: gpt-4o-mini}
routes:
  main:
    default: true
    system: You help hotel guests.
    choices: [{label: Breakfast, value: breakfast}, {label: Late checkout, value: late}]
    tools: [cancel]
tools:
  cancel:
    description: Cancel the booking
    confirm: Cancel booking 12?
    action: {message: Booking 12 is cancelled.}
"""


def _active(page) -> str:
    return page.evaluate("document.activeElement.id || document.activeElement.tagName")


def test_a_choice_and_a_cards_yes_work_by_keyboard_and_the_card_reads_out_its_question_alone(fake, tmp_path):
    (tmp_path / "bot.yaml").write_text(DESK)
    app = create_app([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=390, height=640, path="/chat/desk") as page:
        fake.queue({"text": "Welcome."})
        send(page, "hi")
        seen = int(page.get_attribute("body", "data-refreshes") or 0)
        fake.queue({"text": "Breakfast is at 7."})
        page.locator(".choices button", has_text="Breakfast").last.focus()
        page.keyboard.press("Enter")  # the choice is sent, and disabled with its row
        page.wait_for_function(f"Number(document.body.dataset.refreshes || 0) > {seen}")
        page.wait_for_selector("#stop", state="hidden")  # the turn ended
        assert _active(page) == "input"  # not the page's top, where a disabled button leaves it
        assert "Breakfast is at 7." in _announced(page)
        fake.queue(call("cancel"))
        send(page, "cancel my booking")
        yes = page.locator(".pending-card.for-user button:not([disabled])").first
        yes.focus()
        assert _announced(page) == "Cancel booking 12?"  # what the card asks was read out
        fake.queue({"text": "Anything else?"})  # the model's word after the tool ran
        page.keyboard.press("Enter")
        page.locator(".msg.bot", has_text="Anything else?").wait_for(timeout=30_000)
        page.wait_for_selector("#stop", state="hidden")
        assert _active(page) == "input"


# WCAG 2's contrast ratio of the focused control's ring (its outline, else its border) on what is
# behind it: the first ancestor with a background.
FOCUS_RING = """() => {
  const parse = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = (c) => { const [r, g, b] = parse(c).slice(0, 3).map((v) => v / 255)
    .map((v) => (v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4)); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const behind = (el) => { for (let n = el.parentElement; n; n = n.parentElement) {
    const c = getComputedStyle(n).backgroundColor; const p = parse(c); if (p.length === 3 || p[3] > 0) return c; }
    return "rgb(255, 255, 255)"; };
  const a = document.activeElement, s = getComputedStyle(a);
  if (s.outlineStyle === "auto") return [a.id || a.className, 99];  // the browser's own two-tone ring
  const ring = s.outlineStyle !== "none" ? s.outlineColor : s.borderTopColor;
  const [x, y] = [lum(ring), lum(behind(a))].sort((p, q) => q - p);
  return [a.id || a.className, (x + 0.05) / (y + 0.05)];
}"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_focus_ring_stands_out_three_to_one(fake, tmp_path, scheme):
    with _server(tmp_path) as server, chat_page(server.url, path="/chat/hotels", color_scheme=scheme) as page:
        fake.queue({"text": "Room **12** is free: [book it](https://example.com/book)."})
        send(page, "A room?")
        rings = {}
        for _ in range(12):  # round the page once by keyboard
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement !== document.body"):
                name, ratio = page.evaluate(FOCUS_RING)
                rings[name] = ratio
        assert {"theme", "reset", "input", "send"} <= set(rings), rings
        assert all(ratio >= 3 for ratio in rings.values()), rings
