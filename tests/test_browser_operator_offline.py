"""The operator page when its server goes away, at a phone's width (390 px) and WCAG's reflow
width (320 px) (docs/operators.md, "At any width, by keyboard"): the list and an open
conversation say the page is offline in the top bar, on screen, in its live region (role
status), said once, not again at every poll (it was rewritten every 3 s, read out again each
time); an open conversation stays shown, with its way back to the list (it was replaced by
"Failed to fetch", with no way back on a phone, and stayed so once the server was back); and
the page comes back by itself once the server is back: the conversation can be taken over. The
top bar keeps its height whatever the status says, at 320, 390 (its unread count shown) and 1280 px
(the words "server unreachable" wrapped it onto a second row, the page jumping ~58 px down): on a
phone Notify me and Sound show as icons, named by their words for a screen reader.
Chromium against a real `chatrun serve` (SQLite, an --auth file) killed (SIGKILL) and started
again on the same port, the fake OpenAI server as its model. CHATRUN_SCREENSHOTS=DIR keeps the
screenshots."""

from __future__ import annotations

import signal
import urllib.request
from typing import Any

import pytest

from browser_support import BROWSER_MARKS, chromium, shot
from hitl_support import SHOP, responder
from redis_support import Replica
from test_browser_inbox import AUTH, TOKENS, open_page, waiting_customer
from test_browser_operator_zoom import on_screen

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

STATE = "document.getElementById('status').dataset.state === '{}'"
# Counts the writes to the status line from now on (each one is read out by a screen reader).
COUNT_WRITES = """() => { window.statusWrites = 0;
  new MutationObserver((m) => { window.statusWrites += m.length; })
    .observe(document.getElementById('status'), {childList: true, characterData: true, subtree: true}); }"""


def bar_height(page: Any) -> float:
    return page.locator(".op-topbar").bounding_box()["height"]


def controls_reachable(page: Any) -> None:
    """The top bar's controls on screen, named for a screen reader (icons only on a phone)."""
    for selector in ("#notify", ".op-sound", "#status", "#count"):
        on_screen(page, selector)
    assert page.get_by_role("button", name="Notify me").count() == 1
    assert page.get_by_role("checkbox", name="Sound").count() == 1


def polls_fail(page: Any, times: int) -> None:
    """Wait until the page's poll of the inbox (GET /pending, every 3 s) failed `times` more times."""
    for _ in range(times):
        with page.expect_event("requestfailed", lambda r: "/pending?" in r.url, timeout=60_000):
            pass


@pytest.mark.parametrize("width", [1280, 390, 320])
@pytest.mark.parametrize("opened", [False, True], ids=["list", "conversation"])
def test_the_narrow_operator_page_says_it_is_offline_once_and_comes_back(fake, tmp_path, width, opened):
    fake.responder = responder
    (tmp_path / "auth.yaml").write_text(AUTH)
    replica = Replica(str(SHOP / "shop.yaml"), f"sqlite:///{tmp_path / 's.db'}", fake.base_url,
                      "--auth", str(tmp_path / "auth.yaml"))
    name = f"operator-offline-{'conversation' if opened else 'list'}-{width}"
    errors: list[str] = []
    with replica.served(), chromium() as browser:
        waiting_customer(replica.url, "ana", "human please, my order is late")
        page = open_page(browser, replica.url, "/operator", "sam", width, errors)
        page.set_viewport_size({"width": width, "height": 640})
        if opened:
            page.locator(".op-session").first.click()
            page.wait_for_selector("#take-over", timeout=30_000)
        shot(page, name + "-online")
        live = bar_height(page)
        controls_reachable(page)
        replica.signal(signal.SIGKILL)
        replica.proc.wait(timeout=30)
        page.wait_for_function(STATE.format("offline"), timeout=60_000)
        shot(page, name + "-offline")
        assert bar_height(page) == live  # the page does not jump down
        controls_reachable(page)
        assert page.get_by_role("status").filter(has_text="server unreachable").count() == 1
        page.evaluate(COUNT_WRITES)
        polls_fail(page, 2)
        assert page.evaluate("window.statusWrites") == 0  # said once, not at every poll
        if opened:  # still the conversation, and the way back to the list
            assert page.locator("#detail .notice.error").count() == 0
            on_screen(page, "#op-detail-title")
            if width <= 720:  # a phone's layout: the list is not beside it
                on_screen(page, ".op-back")
        replica.start()
        page.wait_for_function(STATE.format("online"), timeout=60_000)
        shot(page, name + "-back")
        if opened:
            page.click("#take-over")
            page.wait_for_selector("#operator-input", timeout=30_000)
        else:
            page.locator(".op-session").first.wait_for()
    assert errors == []


GONE = {"en-US": ("This conversation no longer exists.", "‹ List"),
        "de-DE": ("Dieses Gespräch gibt es nicht mehr.", "‹ Liste")}


@pytest.mark.parametrize("locale", list(GONE))
def test_a_conversation_deleted_under_a_phones_operator_says_so_with_the_way_back(fake, tmp_path, locale):
    """A refusal (the conversation was deleted: 404) still takes the conversation's place, now with
    its *‹ List* button: on a phone the list is not beside it, and there was no way back but a reload.
    It says so in the page's own words, in the operator's language (`op_gone`), not the server's
    message to developers ("...start it first (a WebSocket Connect, or POST ...)")."""
    fake.responder = responder
    (tmp_path / "auth.yaml").write_text(AUTH)
    replica = Replica(str(SHOP / "shop.yaml"), f"sqlite:///{tmp_path / 's.db'}", fake.base_url,
                      "--auth", str(tmp_path / "auth.yaml"))
    errors: list[str] = []
    with replica.served(), chromium() as browser:
        session = waiting_customer(replica.url, "ana", "human please, my order is late")
        page = open_page(browser, replica.url, "/operator", "sam", 390, errors, locale=locale)
        page.locator(".op-session").first.click()
        page.wait_for_selector("#take-over", timeout=30_000)
        request = urllib.request.Request(f"{replica.url}/bots/shop/sessions/{session}", method="DELETE",
                                         headers={"Authorization": f"Bearer {TOKENS['ana']}"})
        urllib.request.urlopen(request, timeout=60).close()
        page.locator("#detail .notice.error").wait_for(timeout=30_000)
        shot(page, f"operator-deleted-conversation-390-{locale}")
        gone, back = GONE[locale]
        assert page.inner_text("#detail .notice.error") == gone
        assert page.inner_text("#detail .op-back") == back
        on_screen(page, "#detail .op-back")
        page.click("#detail .op-back")
        page.locator("#sessions").wait_for()
        on_screen(page, "#sessions")
    assert errors == []
