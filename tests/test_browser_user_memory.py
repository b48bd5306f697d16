"""The end-user page's memory control (issue 37): a signed-in guest ends a conversation on
/chat/{bot} (the model notes her name and room, then writes the summary), opens "What BOT
remembers about you" from the header with the keyboard, reads the facts and the summary, forgets
one fact, then erases everything — and the server keeps nothing of her. In English at 1280 px,
in Arabic (right to left) at 390 px; axe-core finds nothing serious or critical in the dialog.
Real Chromium against the real server (SQLite, --auth tokens), the model played by the fake
OpenAI server.

Set CHATRUN_SCREENSHOTS=DIR to keep screenshots."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chatrun.server import create_app
from chatrun.server.auth import Auth
from server_support import ThreadServer

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

AXE = Path(__file__).parent / "vendor" / "axe.min.js"
TOKEN = "ana-token-123"

BOT = """\
name: concierge
locales: [en, ar]
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
user_memory:
  facts: [name, room]
  summary: {when: end}
routes:
  desk:
    default: true
    system: You are a concierge.
    tools: [note, check_out]
tools:
  note:
    description: Remember the guest's name and room
    parameters: {type: object, properties: {name: {type: string}, room: {type: string}}}
    action: {remember: {name: "{{ args.name }}", room: "{{ args.room }}"}, reply: Noted.}
  check_out:
    description: End the conversation
    action: {message: "{{ t('bye') }}", end: true}
"""
CATALOGS = {"en": "bye: Safe travels!\n", "ar": "bye: رحلة سعيدة!\n"}
SUMMARY = "Ana likes a quiet room on a high floor; she booked the rooftop bar for Friday."

CASES = [  # width, the browser's locale, the texts the page shows in it
    (1280, "en-GB", {"title": "What concierge remembers about you", "summary": "From your earlier conversations",
                     "forget_room": "Forget: room", "erase": "Erase everything", "yes": "Erase",
                     "erased": "Erased.", "empty": "concierge remembers nothing about you.",
                     "confirm": "Erase everything concierge remembers about you? This cannot be undone."}),
    (390, "ar-EG", {"title": "ما يتذكره concierge عنك", "summary": "من محادثاتك السابقة", "forget_room": "حذف: room",
                    "erase": "محو كل شيء", "yes": "محو", "erased": "تم المحو.", "empty": "لا يتذكر concierge شيئًا عنك.",
                    "confirm": "هل تريد محو كل ما يتذكره concierge عنك؟ لا يمكن التراجع عن ذلك."}),
]


def axe_problems(page) -> list[str]:
    page.add_script_tag(path=str(AXE))
    found = page.evaluate("axe.run(document.getElementById('memory-dialog')).then((r) => r.violations.map((v) => "
                          "({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' '))})))")
    return [f"{v['id']} ({v['impact']}): {v['nodes'][:3]}" for v in found if v["impact"] in ("serious", "critical")]


def kept(url: str) -> list[dict]:
    request = urllib.request.Request(url + "/bots/concierge/user-memory", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["facts"]


def fits(page) -> bool:
    box = page.locator("#memory-dialog").bounding_box()
    viewport = page.viewport_size
    return box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"] and page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth")


@pytest.mark.parametrize(("width", "locale", "texts"), CASES)
def test_a_guest_reads_and_erases_what_the_bot_remembers_with_the_keyboard(fake, tmp_path, width, locale, texts):
    bot_dir = tmp_path / "concierge"
    (bot_dir / "locales").mkdir(parents=True)
    (bot_dir / "bot.yaml").write_text(BOT)
    for name, text in CATALOGS.items():
        (bot_dir / "locales" / f"{name}.yaml").write_text(text, encoding="utf-8")
    auth = Auth.from_mapping({"tokens": {TOKEN: {"principal": "ana"}}})
    app = create_app([chatrun.load_bot(bot_dir)], f"sqlite:///{tmp_path / 'chat.db'}", auth=auth)
    with ThreadServer(app) as server, chat_page(server.url, width=width, height=800, locale=locale,
                                                path=f"/chat/concierge?token={TOKEN}") as page:
        button = page.locator("#user-memory")
        button.wait_for(state="visible", timeout=10_000)  # signed in, and the bot remembers its users
        assert button.get_attribute("aria-label") == texts["title"]
        fake.queue({"tool_calls": [{"name": "note", "arguments": {"name": "Ana", "room": "a quiet room on a high floor"}},
                                   {"name": "check_out", "arguments": {}}]}, {"text": SUMMARY})
        send(page, "I'm Ana; a quiet room on a high floor, please. Goodbye!")
        page.wait_for_selector("#ended", timeout=30_000)
        assert {f["fact"] for f in kept(server.url)} == {"name", "room", "summary"}

        # Opened from the keyboard: focus goes into the dialog, on its heading.
        button.focus()
        page.keyboard.press("Enter")
        dialog = page.locator("#memory-dialog")
        dialog.wait_for(state="visible")
        assert page.evaluate("document.activeElement.id") == "memory-title"
        assert page.inner_text("#memory-title") == texts["title"]
        assert dialog.locator(".memory-summary h3").inner_text() == texts["summary"]
        assert dialog.locator(".memory-summary p").inner_text() == SUMMARY
        rows = dialog.locator(".memory-facts li")
        assert [rows.nth(i).locator(".value").inner_text() for i in range(rows.count())] == [
            "Ana", "a quiet room on a high floor"]
        assert fits(page)
        assert axe_problems(page) == []
        shot(page, f"user-memory-{locale}-{width}")

        # Tab to "Forget: room" and press it: the room goes, the live region says so.
        forget_room = dialog.get_by_role("button", name=texts["forget_room"])
        for _ in range(8):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.getAttribute('aria-label')") == texts["forget_room"]:
                break
        page.keyboard.press("Enter")
        forget_room.wait_for(state="detached")
        assert dialog.locator("[role=status]").inner_text() == texts["erased"]
        assert {f["fact"] for f in kept(server.url)} == {"name", "summary"}

        # Erase everything: asked once more, then nothing is left.
        dialog.get_by_role("button", name=texts["erase"]).click()
        assert dialog.locator(".memory-confirm p").inner_text() == texts["confirm"]
        assert page.evaluate("document.activeElement.textContent") == texts["yes"]
        shot(page, f"user-memory-confirm-{locale}-{width}")
        page.keyboard.press("Enter")  # the focus is on the confirming button
        dialog.locator(".memory-empty").wait_for()
        assert dialog.locator(".memory-empty").inner_text() == texts["empty"]
        assert kept(server.url) == []
        shot(page, f"user-memory-erased-{locale}-{width}")

        # Escape closes it, and the focus goes back to the header's button.
        page.keyboard.press("Escape")
        dialog.wait_for(state="hidden")
        assert page.evaluate("document.activeElement.id") == "user-memory"


def test_without_sign_in_there_is_no_memory_control(fake, tmp_path):
    bot_dir = tmp_path / "concierge"
    (bot_dir / "locales").mkdir(parents=True)
    (bot_dir / "bot.yaml").write_text(BOT)
    for name, text in CATALOGS.items():
        (bot_dir / "locales" / f"{name}.yaml").write_text(text, encoding="utf-8")
    app = create_app([chatrun.load_bot(bot_dir)], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, path="/chat/concierge") as page:
        page.wait_for_load_state("networkidle")
        assert page.locator("#user-memory").is_hidden()
