"""The operator page when the browser blocks its notifications, at a phone's width (390 px), WCAG's
reflow width (320 px) and a desktop's (1280 px) (docs/operators.md, "At any width, by keyboard"):
Notify me, pressed in a browser that refuses notifications (Chromium's answer without a grant), shows
that no alert will come, on screen: a slashed bell in red and, on a phone where the button's word
is hidden, a short badge (*Blocked*, *Blockiert*, *محظورة* on a right-to-left page) in the operator's language. It was only the
button's hidden word: an operator on a phone who blocked notifications saw the same bell and never
learnt why no alert came. A screen reader hears the state once, as the button's name (the badge is
aria-hidden). A page loaded in a browser that already blocks them shows it from the start. The top
bar keeps its one row and its count of waiting conversations (the title's word gives way).
Chromium against a real server on a loopback port (SQLite, an auth file), the fake OpenAI server
as the model. CHATRUN_SCREENSHOTS=DIR keeps the screenshots."""

from __future__ import annotations

import pytest

from browser_support import BROWSER_MARKS, chromium, shot
from server_support import ThreadServer
from test_browser_operator_bots import OPS, post, served
from test_browser_operator_zoom import on_screen, responder

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

# The browser's language, the button's name once blocked and the badge a phone shows.
WORDS = {"en-US": ("Notify me", "Notifications blocked", "Blocked"),
         "de-DE": ("Benachrichtigen", "Benachrichtigungen blockiert", "Blockiert"),
         "ar-EG": ("نبّهني", "التنبيهات محظورة", "محظورة")}


@pytest.mark.parametrize(("width", "locale"), [(390, "en-US"), (390, "ar-EG"), (320, "de-DE"), (1280, "en-US")])
def test_blocked_notifications_show_on_the_operators_top_bar_at_any_width(fake, tmp_path, width, locale):
    fake.responder = responder
    ask, blocked, badge = WORDS[locale]
    with chromium() as browser, ThreadServer(served(tmp_path)) as server:
        post(server.url, "/bots/shop/sessions", {"id": "shop-1"})
        post(server.url, "/bots/shop/sessions/shop-1/messages", {"userMessage": "refund A7"})
        context = browser.new_context(viewport={"width": width, "height": 720}, locale=locale)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/operator?token={OPS}")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        page.locator(".op-session").first.wait_for(timeout=30_000)
        row = page.locator(".op-topbar").bounding_box()["height"]
        assert page.get_by_role("button", name=ask, exact=True).count() == 1
        assert not page.locator(".op-notify-badge").is_visible() and not page.locator("#notify .op-slash").is_visible()
        page.click("#notify")  # headless Chromium refuses: Notification.requestPermission() is "denied"
        page.get_by_role("button", name=blocked, exact=True).wait_for(timeout=10_000)
        shot(page, f"operator-notify-blocked-{locale}-{width}")
        shown(page, width, blocked, badge, row)
        page.reload()  # the browser still blocks them: said from the start
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        shown(page, width, blocked, badge, row)
    assert errors == []


def shown(page, width: int, blocked: str, badge: str, row: float) -> None:
    """The blocked state on screen at `width`, said once to a screen reader, the top bar one row."""
    assert page.get_by_role("button", name=blocked, exact=True).count() == 1
    button = page.locator("#notify")
    if width <= 560:  # the button's word is hidden: a badge says it
        assert button.get_by_text(badge, exact=True).is_visible(), button.inner_text()
        on_screen(page, ".op-notify-badge")
    else:
        on_screen(page, "#notify-word")
        assert not page.locator(".op-notify-badge").is_visible()
    assert button.evaluate("(b) => getComputedStyle(b).backgroundColor") == "rgb(91, 31, 31)"  # the offline red
    on_screen(page, "#notify .op-slash")
    said = page.locator(".op-topbar").aria_snapshot()
    assert said.lower().count(badge.lower()) == 1, said  # the button's name only, not the badge again
    for selector in ("#count", ".op-sound", "#status"):
        on_screen(page, selector)
    count, title = page.locator("#count").bounding_box(), page.locator(".op-title").bounding_box()
    assert title["x"] <= count["x"] and count["x"] + count["width"] <= title["x"] + title["width"]  # not cut off
    assert page.locator(".op-topbar").bounding_box()["height"] == row
