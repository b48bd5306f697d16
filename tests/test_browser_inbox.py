"""Issue 35, the operator inbox in Chromium: three customers wait; the inbox lists them newest
activity first with the customer, their last message, the wait and the kind, a title badge
"(3) Inbox", pushed by the server (GET /pending/stream: a new message reorders the list with no
GET /pending from the page); a notification (asked on a click) tells of it. The operator opens a
conversation (composer at the bottom), sees the user typing, takes over with a canned reply; the
user's page shows "sam joined / left the conversation". Screenshots at 390 and 1280 px, light
and dark (CHATRUN_SCREENSHOTS=DIR keeps them); axe-core reports no serious or critical violation.
A real `chatrun serve` (SQLite, an --auth file), the fake OpenAI server as its model."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from browser_support import BROWSER_MARKS, chromium, shot
from hitl_support import SHOP, responder
from redis_support import Replica

pytestmark = BROWSER_MARKS
AXE = Path(__file__).resolve().parent / "vendor" / "axe.min.js"
AUTH = """
tokens:
  ana-token-123: {principal: ana}
  ben-token-123: {principal: ben}
  chloe-token-12: {principal: chloe}
  sam-token-123: {principal: sam, roles: [supervisor, operators]}
  olga-token-12: {principal: olga, roles: [operators]}
"""
TOKENS = {"ana": "ana-token-123", "ben": "ben-token-123", "chloe": "chloe-token-12", "sam": "sam-token-123",
          "olga": "olga-token-12"}
# Counts what the page shows as notifications (headless Chromium shows none).
NOTIFICATIONS = """
window.__notes = [];
class Recorded { constructor(title, options) { window.__notes.push({title, body: (options || {}).body}); }
  close() {} static requestPermission() { return Promise.resolve("granted"); } }
Recorded.permission = "granted";
window.Notification = Recorded;
"""


@pytest.fixture
def server(fake, tmp_path):
    fake.responder = responder
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    replica = Replica(str(SHOP / "shop.yaml"), f"sqlite:///{tmp_path / 's.db'}", fake.base_url, "--auth", str(auth))
    with replica.served():
        yield replica.url


def post(url: str, path: str, who: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {TOKENS[who]}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read() or b"{}")


def get(url: str, path: str, who: str) -> dict[str, Any]:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {TOKENS[who]}"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def until(condition: Any, seconds: float = 30.0) -> None:
    """Wait for what another process does (the page's typing ping reaches the server)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within 30 s"
        time.sleep(0.2)


def waiting_customer(url: str, who: str, text: str) -> str:
    """`who` opens a conversation and asks for a person (the shop's `human` tool hands over)."""
    session = f"{who}-1"
    post(url, "/bots/shop/sessions", who, {"id": session})
    post(url, f"/bots/shop/sessions/{session}/messages", who, {"userMessage": text})
    return session


def no_serious_violations(page: Any, what: str) -> None:
    page.add_script_tag(path=str(AXE))
    found = page.evaluate("async () => (await axe.run(document)).violations.map(v => "
                          "({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 3)}))")
    bad = [v for v in found if v["impact"] in ("serious", "critical")]
    assert not bad, f"{what}: axe-core found {bad}"


def open_page(browser: Any, url: str, path: str, who: str, width: int, errors: list[str], dark: bool = False,
              locale: str = "en-US") -> Any:
    context = browser.new_context(viewport={"width": width, "height": 860}, color_scheme="dark" if dark else "light",
                                  locale=locale)
    context.add_init_script(NOTIFICATIONS)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}{path}?token={TOKENS[who]}")
    page.wait_for_selector("body[data-ready=true]", timeout=30_000)
    return page


@pytest.mark.parametrize("width", [1280, 390])
def test_the_inbox_lists_pushes_notifies_and_the_operator_answers_at_the_bottom(server, width):
    errors: list[str] = []
    with chromium() as browser:
        user = open_page(browser, server, "/", "ana", width, errors)
        user.fill("#input", "human please, my parcel is two weeks late")
        user.press("#input", "Enter")
        user.locator(".msg.bot", has_text="Connecting you with a colleague.").wait_for(timeout=30_000)
        waiting_customer(server, "ben", "human please, the size is wrong")
        waiting_customer(server, "chloe", "human - I was charged twice")

        inbox = open_page(browser, server, "/operator", "sam", width, errors)
        inbox.wait_for_selector("body[data-channel=push]", timeout=30_000)
        rows = inbox.locator(".op-session")
        assert [rows.nth(i).locator(".op-who").inner_text() for i in range(3)] == ["chloe", "ben", "ana"]
        assert "I was charged twice" in rows.first.locator(".op-last").inner_text()
        assert rows.first.locator(".op-kind.takeover").count() == 1
        assert inbox.title() == "(3) Inbox · chatrun"
        inbox.click("#notify")
        assert inbox.get_attribute("#notify", "aria-pressed") == "true"
        shot(inbox, f"inbox-list-{width}")
        no_serious_violations(inbox, f"the inbox at {width} px")

        lists = []  # the page's own GET /pending: none while the stream pushes
        inbox.on("request", lambda r: lists.append(r.url) if "/pending?" in r.url else None)
        ana = [r.get_attribute("data-session") for r in rows.all()][2]
        post(server, f"/bots/shop/sessions/{ana}/messages", "ana", {"userMessage": "Hello? Anyone there?"})
        inbox.locator(".op-session").first.locator(".op-who", has_text="ana").wait_for(timeout=30_000)
        assert not lists, f"the page polled GET /pending while the stream was open: {lists}"
        notes = inbox.evaluate("() => window.__notes")
        assert notes and notes[-1]["title"].startswith("ana") and notes[-1]["body"] == "Hello? Anyone there?"

        inbox.locator(".op-session").first.click()
        inbox.wait_for_selector("#detail .op-detail-head", timeout=30_000)
        composer = inbox.locator(".op-composer").bounding_box()
        assert composer["y"] + composer["height"] >= inbox.viewport_size["height"] - 2  # at the bottom
        post(server, f"/bots/shop/sessions/{ana}/typing", "ana", {"typing": True})
        inbox.locator("#user-typing", has_text="ana is typing…").wait_for(timeout=30_000)
        inbox.click("#take-over")
        inbox.wait_for_selector("#operator-input", timeout=30_000)
        user.locator(".notice-line", has_text="sam joined the conversation").wait_for(timeout=30_000)
        inbox.fill("#operator-input", "One moment")  # the page pings "typing" as it fills
        until(lambda: get(server, f"/bots/shop/sessions/{ana}/typing", "ana")["operator"] == "sam")
        inbox.click("[data-canned='late parcel']")
        assert inbox.input_value("#operator-input") == "Parcels late by more than a week are refunded in full."
        inbox.click("#operator-say button[type=submit]")
        user.locator(".msg.operator", has_text="refunded in full").wait_for(timeout=30_000)
        inbox.locator("#op-history", has_text="refunded in full").wait_for(timeout=30_000)
        assert inbox.locator("#op-history .notice-line", has_text="sam joined the conversation").count() == 1
        shot(inbox, f"inbox-conversation-{width}")
        no_serious_violations(inbox, f"the conversation at {width} px")

        inbox.click("#release")
        user.locator(".notice-line", has_text="sam left the conversation").wait_for(timeout=30_000)
        shot(user, f"inbox-user-{width}")

        dark = open_page(browser, server, "/operator", "sam", width, errors, dark=True)
        dark.wait_for_selector(".op-session", timeout=30_000)
        shot(dark, f"inbox-list-dark-{width}")
        no_serious_violations(dark, f"the inbox in dark mode at {width} px")
    assert not errors, f"JavaScript errors: {errors}"


def refused(url: str, path: str, who: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    try:
        post(url, path, who, body)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    raise AssertionError(f"POST {path} by {who} was not refused")


@pytest.mark.parametrize("width", [1280, 390])
def test_a_held_conversation_is_taken_from_its_holder_on_the_operator_page(server, width):
    """olga took ana's conversation and went home without releasing it: sam's page says olga has
    it, offers no message box but "Take over from olga"; sam takes it, ana reads "olga left" then
    "sam joined", sam speaks, and olga's message is refused naming sam."""
    errors: list[str] = []
    with chromium() as browser:
        user = open_page(browser, server, "/", "ana", width, errors)
        user.fill("#input", "human please, my parcel is two weeks late")
        user.press("#input", "Enter")
        user.locator(".msg.bot", has_text="Connecting you with a colleague.").wait_for(timeout=30_000)
        ana = session_of(user)
        post(server, f"/bots/shop/sessions/{ana}/takeover", "olga", {})
        post(server, f"/bots/shop/sessions/{ana}/operator/messages", "olga", {"text": "Olga here, checking."})
        user.locator(".msg.operator", has_text="Olga here, checking.").wait_for(timeout=30_000)

        inbox = open_page(browser, server, "/operator", "sam", width, errors)
        inbox.locator(".op-session", has_text="ana").first.click()
        force = inbox.locator("#force-takeover")
        force.wait_for(timeout=30_000)  # sam reads who holds it, and no action the server would refuse
        assert force.inner_text() == "Take over from olga"
        assert inbox.inner_text("#held-by").startswith("olga has this conversation (since ")
        assert inbox.locator("#operator-input").count() == 0
        shot(inbox, f"inbox-held-by-another-{width}")
        no_serious_violations(inbox, f"the take over from choice at {width} px")
        force.click()
        user.locator(".notice-line", has_text="sam joined the conversation").wait_for(timeout=30_000)
        assert user.locator(".notice-line").all_inner_texts() == [
            "olga joined the conversation", "olga left the conversation", "sam joined the conversation"]
        inbox.wait_for_selector("#operator-input", timeout=30_000)
        assert inbox.inner_text(".op-with").startswith("You have this conversation (since ")
        assert inbox.locator("#force-takeover").count() == 0
        inbox.fill("#operator-input", "Sam here")
        inbox.click("#operator-say button[type=submit]")
        user.locator(".msg.operator", has_text="Sam here").wait_for(timeout=30_000)
        assert user.locator(".msg.operator", has_text="Olga here, checking.").count() == 1  # the talk stays
        shot(user, f"inbox-taken-from-user-{width}")
        status, body = refused(server, f"/bots/shop/sessions/{ana}/operator/messages", "olga", {"text": "back"})
        assert status == 409 and body["error"] == "HeldByAnother" and "the operator sam holds" in body["message"]
    assert not errors, f"JavaScript errors: {errors}"


def session_of(page: Any) -> str:
    return page.evaluate("ChatrunPage.session().chatId")


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [390, 1280])
def test_the_users_page_shows_the_operator_typing_and_joined_left_as_lines(server, width, scheme):
    """The end user's page while sam holds the conversation: "sam joined the conversation" as a
    divider line (not a reply of the bot), "sam is typing…" while sam types (read on the poll the
    page makes anyway while an operator holds the conversation), the user's own typing told to
    sam, and "sam left the conversation" on release, the typing line gone."""
    errors: list[str] = []
    with chromium() as browser:
        user = open_page(browser, server, "/chat/shop", "ana", width, errors, dark=scheme == "dark")
        user.fill("#input", "human please, my parcel is two weeks late")
        user.press("#input", "Enter")
        user.locator(".msg.bot", has_text="Connecting you with a colleague.").wait_for(timeout=30_000)
        ana = session_of(user)
        post(server, f"/bots/shop/sessions/{ana}/takeover", "sam", {})
        joined = user.locator(".notice-line", has_text="sam joined the conversation")
        joined.wait_for(timeout=30_000)
        assert user.locator(".msg", has_text="joined the conversation").count() == 0  # not a bubble
        assert user.locator("#takeover-banner").inner_text() == "You are talking to sam"

        post(server, f"/bots/shop/sessions/{ana}/typing", "sam", {"typing": True, "as": "operator"})
        user.locator("#operator-typing", has_text="sam is typing…").wait_for(timeout=30_000)
        user.fill("#input", "It was ordered on the 3rd")  # the page pings "typing" as it fills
        until(lambda: get(server, f"/bots/shop/sessions/{ana}/typing", "sam")["user"] is True)
        shot(user, f"presence-typing-{width}-{scheme}")
        no_serious_violations(user, f"the user's page with an operator typing at {width} px, {scheme}")
        user.press("#input", "Enter")  # sent: no longer typing
        until(lambda: get(server, f"/bots/shop/sessions/{ana}/typing", "sam")["user"] is False)

        post(server, f"/bots/shop/sessions/{ana}/typing", "sam", {"typing": False, "as": "operator"})
        post(server, f"/bots/shop/sessions/{ana}/operator/messages", "sam", {"text": "Refunded in full."})
        user.locator(".msg.operator", has_text="Refunded in full.").wait_for(timeout=30_000)
        user.locator("#operator-typing").wait_for(state="hidden", timeout=30_000)
        post(server, f"/bots/shop/sessions/{ana}/release", "sam", {})
        user.locator(".notice-line", has_text="sam left the conversation").wait_for(timeout=30_000)
        assert user.locator("#takeover-banner").is_hidden()
        assert user.locator(".notice-line").all_inner_texts() == ["sam joined the conversation", "sam left the conversation"]
        shot(user, f"presence-left-{width}-{scheme}")
        # Read again (a reload replays the history): the same two lines, no bubbles.
        user.reload()
        user.wait_for_selector("body[data-ready=true]", timeout=30_000)
        user.locator(".notice-line").nth(1).wait_for(timeout=30_000)
        assert user.locator(".notice-line").all_inner_texts() == ["sam joined the conversation", "sam left the conversation"]
    assert not errors, f"JavaScript errors: {errors}"


def test_the_inbox_names_the_operator_who_spoke_and_says_you_for_your_own(server):
    """olga took ana's conversation and spoke: sam's inbox shows her message as "olga: …", not
    "You: …"; olga's own inbox says "You: …". sam takes it over and speaks: the rows swap
    (pushed to both pages)."""
    errors: list[str] = []
    with chromium() as browser:
        ana = waiting_customer(server, "ana", "human please, my parcel is two weeks late")
        post(server, f"/bots/shop/sessions/{ana}/takeover", "olga", {})
        post(server, f"/bots/shop/sessions/{ana}/operator/messages", "olga", {"text": "Olga here, checking."})
        sam = open_page(browser, server, "/operator", "sam", 1280, errors)
        olga = open_page(browser, server, "/operator", "olga", 1280, errors)
        row = f".op-session[data-session='{ana}'] .op-last"
        sam.locator(row, has_text="Olga here").wait_for(timeout=30_000)
        olga.locator(row, has_text="Olga here").wait_for(timeout=30_000)
        assert sam.inner_text(row) == "olga: Olga here, checking."
        assert olga.inner_text(row) == "You: Olga here, checking."
        shot(sam, "inbox-another-operator-spoke")

        post(server, f"/bots/shop/sessions/{ana}/takeover", "sam", {"force": True})
        post(server, f"/bots/shop/sessions/{ana}/operator/messages", "sam", {"text": "Sam here."})
        sam.locator(row, has_text="Sam here.").wait_for(timeout=30_000)
        olga.locator(row, has_text="Sam here.").wait_for(timeout=30_000)
        assert sam.inner_text(row) == "You: Sam here."
        assert olga.inner_text(row) == "sam: Sam here."
    assert not errors, f"JavaScript errors: {errors}"


@pytest.fixture
def german_server(fake, tmp_path):
    """The shop, German only (`locales: [de]`), its catalog renaming one of the page's texts."""
    bot = tmp_path / "shop"
    shutil.copytree(SHOP, bot)
    yaml = (bot / "shop.yaml").read_text()
    (bot / "shop.yaml").write_text(yaml.replace("format: 3\n", "format: 3\nlocales: [de]\n", 1))
    (bot / "locales").mkdir()
    (bot / "locales" / "de.yaml").write_text("page:\n  op_take_over: Gespräch übernehmen\n")
    fake.responder = responder
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    replica = Replica(str(bot / "shop.yaml"), f"sqlite:///{tmp_path / 's.db'}", fake.base_url, "--auth", str(auth))
    with replica.served():
        yield replica.url


@pytest.mark.parametrize("width", [390, 1280])
def test_the_operator_page_speaks_the_bots_locale(german_server, width):
    """A German bot's operator page, read by an operator whose browser asks for German, is German
    (definition/page_texts.py's `op_*` texts, the catalog's `page.op_take_over` over the built-in
    one): the list, its chips, the conversation, the composer and the cards of pending items. (The
    page's own texts follow the operator's language: tests/test_browser_operator_bots.py.)"""
    url, errors = german_server, []
    with chromium() as browser:
        waiting_customer(url, "ben", "human please, the size is wrong")
        ana = "ana-1"
        post(url, "/bots/shop/sessions", "ana", {"id": ana})
        post(url, f"/bots/shop/sessions/{ana}/messages", "ana", {"userMessage": "refund A1 80"})
        inbox = open_page(browser, url, "/operator", "sam", width, errors, locale="de-DE")
        inbox.wait_for_selector(".op-session", timeout=30_000)
        assert inbox.get_attribute("html", "lang") == "de"
        assert inbox.inner_text(".op-title [data-page-text]") == "Posteingang"
        assert inbox.inner_text("#list-title") == "Wartend"
        assert inbox.title().endswith("Posteingang · chatrun")
        assert inbox.inner_text("#notify") == "Benachrichtigen"
        assert inbox.locator(".op-kind.takeover").first.inner_text().startswith("Übernahme · ")
        assert inbox.locator(".op-kind.approval").first.inner_text().startswith("Genehmigung · ")
        shot(inbox, f"inbox-de-list-{width}")
        no_serious_violations(inbox, f"the German inbox at {width} px")

        inbox.locator(f".op-session[data-session='{ana}']").click()
        card = inbox.locator(".pending-card[data-kind=approval]")
        card.wait_for(timeout=30_000)
        assert card.locator(".tag").text_content() == "Genehmigung"
        assert card.locator("button.approve").inner_text() == "Genehmigen"
        assert inbox.inner_text("#take-over") == "Gespräch übernehmen"  # the bot's own page.op_take_over
        assert inbox.inner_text(".op-takebar .op-sub") == "Der Bot antwortet, bis Sie übernehmen."
        inbox.click("#take-over")
        inbox.wait_for_selector("#operator-input", timeout=30_000)
        assert inbox.inner_text(".op-with").startswith("Sie betreuen dieses Gespräch (seit ")
        assert inbox.get_attribute("#operator-input", "placeholder") == "Als Mitarbeiter schreiben…"
        assert inbox.inner_text("#operator-say button[type=submit]") == "Senden"
        shot(inbox, f"inbox-de-conversation-{width}")
        no_serious_violations(inbox, f"the German conversation at {width} px")
    assert not errors, f"JavaScript errors: {errors}"


def test_an_operators_message_sent_again_after_a_lost_answer_reaches_the_user_once(server):
    """The operator's message reached the server, which committed it, but the answer was lost (the
    network failed): the page puts the text back in the box, and sending it again replays the
    committed message (the same Idempotency-Key) instead of telling the user twice."""
    errors: list[str] = []
    with chromium() as browser:
        ana = waiting_customer(server, "ana", "human please, my parcel is two weeks late")
        inbox = open_page(browser, server, "/operator", "sam", 1280, errors)
        inbox.locator(f".op-session[data-session='{ana}']").click()
        inbox.click("#take-over")
        inbox.wait_for_selector("#operator-input", timeout=30_000)
        lost = []

        def lose_the_first_answer(route: Any) -> None:
            if lost:
                route.continue_()
                return
            lost.append(route.fetch().status)  # the server got it and answered ...
            route.abort("connectionreset")  # ... and the page never read the answer

        inbox.route("**/operator/messages", lose_the_first_answer)
        inbox.fill("#operator-input", "Checking your parcel now.")
        inbox.click("#operator-say button[type=submit]")
        inbox.wait_for_function("document.querySelector('#operator-input').value === 'Checking your parcel now.'",
                                timeout=30_000)
        assert lost == [200]
        inbox.click("#operator-say button[type=submit]")
        inbox.wait_for_function("document.querySelector('#operator-input').value === ''", timeout=30_000)
        inbox.locator("#op-history", has_text="Checking your parcel now.").wait_for(timeout=30_000)
        history = get(server, f"/bots/shop/sessions/{ana}", "sam")["history"]
        said = [e["data"] for entry in history for e in entry.get("events", [])
                if e["type"] == "Message" and e["data"] == "Checking your parcel now."]
        assert said == ["Checking your parcel now."]
    assert not errors, f"JavaScript errors: {errors}"


@pytest.mark.slow
def test_a_pushed_list_keeps_the_keyboards_row_and_reads_out_only_what_is_new(server):
    """The list is drawn anew on each push: it is no live region (a screen reader would read all of
    it again each time), a hidden polite one says the news, and the focused row keeps the focus."""
    errors: list[str] = []
    with chromium() as browser:
        ana = waiting_customer(server, "ana", "human please, my parcel is two weeks late")
        waiting_customer(server, "ben", "human please, the size is wrong")
        inbox = open_page(browser, server, "/operator", "sam", 1280, errors)
        inbox.wait_for_selector("body[data-channel=push]", timeout=30_000)
        live = "(el) => el.getAttribute('aria-live') || ''"
        assert inbox.eval_on_selector("#sessions", live) == ""
        assert inbox.eval_on_selector("#op-announce", live) == "polite"
        assert inbox.inner_text("#op-announce") == ""  # the first list is no news
        row = inbox.locator(f".op-session[data-session='{ana}']")
        for _ in range(30):  # by keyboard, from the top of the page
            if inbox.evaluate("document.activeElement.dataset.session || ''") == ana:
                break
            inbox.keyboard.press("Tab")
        assert inbox.evaluate("document.activeElement.dataset.session || ''") == ana, "Tab never reached the row"
        post(server, f"/bots/shop/sessions/{ana}/messages", "ana", {"userMessage": "Hello? Anyone there?"})
        row.locator(".op-last", has_text="Hello? Anyone there?").wait_for(timeout=30_000)
        assert inbox.evaluate("document.activeElement.dataset.session || ''") == ana
        assert inbox.inner_text("#op-announce") == "ana · waiting: Hello? Anyone there?"
        inbox.keyboard.press("Enter")  # the focused row still opens its conversation
        inbox.wait_for_selector("#detail .op-detail-head", timeout=30_000)
    assert not errors, f"JavaScript errors: {errors}"


def _tab_to(page: Any, test: str, back: bool = False) -> None:
    """Press Tab (Shift+Tab when `back`) until `test` (JavaScript on document.activeElement, `a`) holds."""
    for _ in range(40):
        if page.evaluate(f"(a => Boolean({test}))(document.activeElement)"):
            return
        page.keyboard.press("Shift+Tab" if back else "Tab")
    raise AssertionError(f"Tab never reached {test}")


@pytest.mark.slow
def test_on_a_phone_the_keyboard_goes_into_a_conversation_and_back_to_its_row(server):
    """At 390 px the list and a conversation take turns on the screen: opening one by keyboard puts
    the focus on its name (the row it was on is hidden), a redraw leaves it on its control, and
    "‹ List" puts it back on the row."""
    errors: list[str] = []
    with chromium() as browser:
        ana = waiting_customer(server, "ana", "human please, my parcel is two weeks late")
        waiting_customer(server, "ben", "human please, the size is wrong")
        inbox = open_page(browser, server, "/operator", "sam", 390, errors)
        inbox.wait_for_selector("body[data-channel=push]", timeout=30_000)
        _tab_to(inbox, f"a.dataset.session === '{ana}'")
        inbox.keyboard.press("Enter")
        inbox.wait_for_selector("#detail .op-detail-head", timeout=30_000)
        inbox.wait_for_function("document.activeElement.id === 'op-detail-title'", timeout=30_000)
        assert inbox.evaluate("document.activeElement.textContent") == "ana"
        _tab_to(inbox, "a.id === 'take-over'")
        post(server, f"/bots/shop/sessions/{ana}/messages", "ana", {"userMessage": "Hello? Anyone there?"})
        inbox.locator("#op-history", has_text="Hello? Anyone there?").wait_for(timeout=30_000)  # drawn anew
        assert inbox.evaluate("document.activeElement.id") == "take-over"
        _tab_to(inbox, "a.classList.contains('op-back')", back=True)
        inbox.keyboard.press("Enter")
        inbox.wait_for_selector(".op-list", state="visible")
        assert inbox.evaluate("document.activeElement.dataset.session || ''") == ana
    assert not errors, f"JavaScript errors: {errors}"
