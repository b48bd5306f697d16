"""The operator page serving two bots (docs/operators.md, "The page's own texts"): the inbox is in
the operator's language (the browser's: English, or German); an open conversation's cards are in
its own bot's texts (a German bot's approval reads "Genehmigen", the English one's "Approve"). Chromium against a real
server on a loopback port (SQLite, an auth file), the fake OpenAI server as the model.
CHATRUN_SCREENSHOTS=DIR keeps the screenshots."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chromium, shot
from chatrun.server import create_app
from server_support import ThreadServer

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]
BOT = """\
name: {name}
{locales}model: {{provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}}
routes:
  main: {{default: true, system: Help with orders., tools: [refund]}}
tools:
  refund:
    description: Refund an order
    parameters: {{type: object, properties: {{order: {{type: string}}}}, required: [order]}}
    approval: {{by: [operators]}}
    action: {{message: refunded}}
"""
AUTH = """
tokens:
  ana-token-123: {principal: ana}
  ops-token-123: {principal: ops, roles: [operators]}
"""
ANA, OPS = "ana-token-123", "ops-token-123"


def responder(body: dict[str, Any]) -> dict[str, Any]:
    if body["messages"][-1]["role"] == "tool":
        return {"text": "Done."}
    return {"tool_calls": [{"name": "refund", "arguments": {"order": "A7"}}]}


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {ANA}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read() or b"{}")


def served(tmp_path: Path) -> Any:
    """The app serving `shop` (the default, English) and `laden` (German only)."""
    bots = []
    for name, locales in (("shop", ""), ("laden", "locales: [de]\n")):
        folder = tmp_path / name
        (folder / "locales").mkdir(parents=True)
        (folder / "bot.yaml").write_text(BOT.format(name=name, locales=locales))
        if locales:
            (folder / "locales" / "de.yaml").write_text("hello: Hallo\n")
        bots.append(chatrun.load_bot(folder))
    (tmp_path / "auth.yaml").write_text(AUTH)
    return create_app(bots, f"sqlite:///{tmp_path / 's.db'}", auth=str(tmp_path / "auth.yaml"))


@pytest.mark.parametrize("width", [1280, 390])
def test_each_conversations_cards_are_in_its_own_bots_texts(fake, tmp_path, width):
    fake.responder = responder
    with ThreadServer(served(tmp_path)) as server, chromium() as browser:
        for bot in ("shop", "laden"):
            post(server.url, f"/bots/{bot}/sessions", {"id": f"{bot}-1"})
            asked = post(server.url, f"/bots/{bot}/sessions/{bot}-1/messages", {"userMessage": "refund A7"})
            assert [e["type"] for e in asked["events"]].count("Pending") == 1, asked
        page = browser.new_context(viewport={"width": width, "height": 860}, locale="en-US").new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/operator?token={OPS}")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        for bot, approve, kind in (("laden", "Genehmigen", "Genehmigung"), ("shop", "Approve", "Approval")):
            page.locator(f".op-session[data-bot={bot}]").click()
            card = page.locator(f".op-detail[data-session={bot}-1] .pending-card")
            card.locator("button.approve").wait_for(timeout=30_000)
            assert card.locator("button.approve").inner_text() == approve
            assert card.locator("button.reject").inner_text() == ("Ablehnen" if bot == "laden" else "Reject")
            assert card.locator(".tag").text_content() == kind
            assert page.locator("#take-over").inner_text() == "Take over"  # the page's own: the operator's
            shot(page, f"operator-bots-{bot}-{width}")
            if width < 600:
                page.locator(".op-back").click()
        assert errors == []


def relative_now(locale: str) -> str:
    """How the browser's Intl writes "now" in `locale` (as the page's relative times do)."""
    return {"de-DE": "jetzt", "en-US": "now"}[locale]


@pytest.mark.parametrize("width", [1280, 390])
def test_the_pages_own_texts_are_in_the_operators_language_each_bots_cards_in_its_own(fake, tmp_path, width):
    """An operator whose browser reads German, serving the English `shop` (the default bot) and the
    German `laden`: the inbox, the head and the composer are German on both conversations (the
    page had them in the default bot's English, so a German operator read English chrome around
    German cards); `shop`'s cards stay in its English, `laden`'s in its German; no sentence of the
    page mixes in another language's time ("seit jetzt", not "since jetzt")."""
    fake.responder = responder
    with ThreadServer(served(tmp_path)) as server, chromium() as browser:
        for bot in ("shop", "laden"):
            post(server.url, f"/bots/{bot}/sessions", {"id": f"{bot}-1"})
            post(server.url, f"/bots/{bot}/sessions/{bot}-1/messages", {"userMessage": "refund A7"})
        page = browser.new_context(viewport={"width": width, "height": 860}, locale="de-DE").new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/operator?token={OPS}")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        assert page.locator("html").get_attribute("lang") == "de"
        assert page.locator(".op-title [data-page-text=op_inbox]").inner_text() == "Posteingang"
        for bot, approve in (("shop", "Approve"), ("laden", "Genehmigen")):
            page.locator(f".op-session[data-bot={bot}]").click()
            card = page.locator(f".op-detail[data-session={bot}-1] .pending-card")
            card.locator("button.approve").wait_for(timeout=30_000)
            assert card.locator("button.approve").inner_text() == approve  # the item: its bot's
            assert page.locator("#take-over").inner_text() == "Übernehmen"  # the page's own: the operator's
            page.locator("#take-over").click()
            page.locator("#release").wait_for(timeout=30_000)
            assert page.locator("#release").inner_text() == "Zurückgeben"
            held = page.locator(".op-composer .op-with").inner_text()
            assert held == f"Sie betreuen dieses Gespräch (seit {relative_now('de-DE')}): Der Bot schweigt."
            shot(page, f"operator-chrome-de-{bot}-{width}")
            if width < 600:
                page.locator(".op-back").click()
        assert errors == []


@pytest.mark.parametrize("width", [900, 390])
def test_an_arabic_operators_page_is_mirrored_and_each_card_keeps_its_bots_direction(fake, tmp_path, width):
    """An operator whose browser reads Arabic gets the page right to left (its built-in Arabic
    texts, though neither bot speaks Arabic); the English shop's card and the German laden's are
    left to right in their own language (`lang`, `dir`): the card's question reads "Approve refund
    ...?", not "?Approve refund ..." with its punctuation at the wrong end. Under 1100 px the
    inspector (Details) opens at the page's end, the left, not over the conversation's start; lying
    over the Details button that opened it, it has its own close button (it could not be closed
    by a click or a tap)."""
    fake.responder = responder
    with ThreadServer(served(tmp_path)) as server, chromium() as browser:
        for bot in ("shop", "laden"):
            post(server.url, f"/bots/{bot}/sessions", {"id": f"{bot}-1"})
            post(server.url, f"/bots/{bot}/sessions/{bot}-1/messages", {"userMessage": "refund A7"})
        page = browser.new_context(viewport={"width": width, "height": 860}, locale="ar").new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/operator?token={OPS}")
        page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        assert (page.locator("html").get_attribute("lang"), page.locator("html").get_attribute("dir")) == ("ar", "rtl")
        for bot, lang in (("shop", "en"), ("laden", "de")):
            page.locator(f".op-session[data-bot={bot}]").click()
            card = page.locator(f".op-detail[data-session={bot}-1] .pending-card")
            card.locator("button.approve").wait_for(timeout=30_000)
            assert card.evaluate("c => [c.closest('[lang]').lang, getComputedStyle(c).direction]") == [lang, "ltr"]
            page.locator(".op-aside-toggle").click()
            inspector = page.locator("#op-inspector").bounding_box()
            assert inspector and inspector["x"] == 0  # the end of a right-to-left page
            shot(page, f"operator-ar-{bot}-{width}")
            page.locator(".op-aside-close").click()  # it lies over its Details button: it closes itself
            page.locator("#op-inspector").wait_for(state="hidden")
            assert page.evaluate("document.activeElement.classList.contains('op-aside-toggle')")
            if width < 600:
                page.locator(".op-back").click()
        assert errors == []
