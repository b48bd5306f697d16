"""The page shows the bot in the session's locale (docs/i18n.md): a German browser gets the
bakery's German texts and the inspector names the locale; every bubble has dir="auto", so
right-to-left text renders right to left. Screenshots at a phone's width and a desktop's
(CHATRUN_SCREENSHOTS=DIR keeps them)."""

from __future__ import annotations

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chat_support import call
from chatrun.definition.loader import check_bot
from chatrun.server import create_app
from server_support import ThreadServer
from test_i18n_serve import BAKERY

pytestmark = [*BROWSER_MARKS]

ARABIC = "مرحبا، أريد رغيفين من الخبز"


@pytest.mark.parametrize("width", [390, 1280])
def test_a_german_browser_gets_the_german_bakery_and_rtl_text_renders_right_to_left(fake, tmp_path, width):
    app = create_app([chatrun.load_bot(BAKERY)], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=width, locale="de-DE") as page:
        fake.queue(call("add_loaves", count=2), {"text": "بكل سرور"})
        send(page, ARABIC)
        page.wait_for_function("document.getElementById('session-locale').textContent === '· locale de'",
                               timeout=30_000)
        bubbles = page.locator(".msg")
        texts = bubbles.all_inner_texts()
        assert ARABIC in texts[0] and "Ihre Bestellung hat jetzt 2 Brote." in "\n".join(texts)
        assert page.locator("button", has_text="Brot bestellen").count() >= 1 or "Brot bestellen" in page.content()
        assert all(d == "auto" for d in page.eval_on_selector_all(".msg", "els => els.map(e => e.dir)"))
        directions = page.eval_on_selector_all(".msg", "els => els.map(e => getComputedStyle(e).direction)")
        assert directions[0] == "rtl" and directions[-1] == "rtl"  # the user's Arabic, the model's Arabic
        assert "ltr" in directions  # the German message between them
        assert page.get_attribute("#input", "dir") == "auto"
        shot(page, f"i18n-{width}")


def _fits(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")


def _texts(page) -> dict:
    return page.evaluate("""() => ({
        lang: document.documentElement.lang, dir: document.documentElement.dir,
        send: document.getElementById('send').textContent, status: document.getElementById('status').textContent, reset: document.getElementById('reset').textContent,
        placeholder: document.getElementById('input').placeholder,
        crumb: document.querySelector('#breadcrumb .crumb.current').textContent,
        description: document.getElementById('bot-description').textContent,
        empty: (document.querySelector('.messages .empty') || {}).textContent || ''})""")


@pytest.mark.parametrize("width", [390, 1280])
def test_a_german_browser_sees_the_pages_controls_in_german_until_the_bot_speaks_english(fake, tmp_path, width):
    app = create_app([chatrun.load_bot(BAKERY)], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=width, locale="de-DE") as page:
        page.wait_for_function("document.body.dataset.refreshes > 0", timeout=30_000)
        assert _texts(page) == {
            "lang": "de", "dir": "ltr", "send": "Senden", "reset": "Neu starten", "status": "verbunden",
            "placeholder": "Nachricht eingeben…", "crumb": "Theke",  # built in; the route's title: from de.yaml
            "description": "Nimmt Brotbestellungen auf Deutsch oder Englisch an.",
            "empty": "Willkommen in der Bäckerei! Was dürfen wir für Sie backen?"}  # the bakery's page.hello
        assert page.get_attribute("#reset", "title") == "Dieses Gespräch beenden und ein neues beginnen"
        fake.queue(call("goodbye"))
        send(page, "Das ist alles")
        page.wait_for_selector("#ended", timeout=30_000)
        assert page.inner_text("#ended").startswith("Dieses Gespräch ist beendet.")
        assert page.inner_text("#start-new") == "Neues Gespräch beginnen"
        assert page.get_attribute("#input", "placeholder") == "Dieses Gespräch ist beendet"
        assert _fits(page)
        shot(page, f"i18n-de-ended-{width}")
        page.click("#start-new")
        page.wait_for_selector("#ended", state="detached", timeout=30_000)
        page.wait_for_function("!document.getElementById('input').disabled", timeout=30_000)
        # The bot switches to English (its `speak` tool sets state.locale): the page follows.
        fake.queue(call("speak", language="en"), {"text": "**Sure.**"})
        send(page, "English please")
        page.wait_for_function("document.documentElement.lang === 'en'", timeout=30_000)
        assert page.locator(".msg.bot strong").last.inner_text() == "Sure."  # replies keep their Markdown
        texts = _texts(page)
        assert (texts["send"], texts["reset"], texts["placeholder"], texts["crumb"], texts["status"]) == (
            "Send", "Reset", "Type a message…", "Counter", "connected")
        assert texts["description"] == "Takes bread orders in English or German."


RTL_BOT = """\
name: maktab
description: "{{ t('about') }}"
locales: [ar, en]
routes:
  desk:
    default: true
    title: "{{ t('desk') }}"
    system: "{{ t('prompt') }}"
    tools: [cancel, bye]
tools:
  cancel:
    description: Cancel an order
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    approval: {ask: {text: "{{ t('cancel.ask', order=args.order) }}"}, rejected: "{{ t('cancel.kept') }}"}
    action: {message: "{{ t('cancel.done') }}"}
  bye:
    description: End the conversation
    action: {message: "{{ t('bye') }}", end: true}
"""
RTL_CATALOGS = {
    "ar": "about: مكتب خدمة العملاء\ndesk: الاستقبال\nprompt: أجب باختصار.\nbye: شكرًا لك، إلى اللقاء!\n"
          "cancel:\n  ask: هل تريد إلغاء الطلب {order}؟\n  kept: لم يُلغَ الطلب.\n  done: أُلغي الطلب.\n",
    "en": "about: Customer service\ndesk: Front desk\nprompt: Answer briefly.\nbye: Thank you, goodbye!\n"
          "cancel:\n  ask: Cancel order {order}?\n  kept: The order stays.\n  done: The order is cancelled.\n",
}


@pytest.mark.parametrize("width", [390, 1280])
def test_an_arabic_session_lays_the_page_out_right_to_left_and_fits(fake, tmp_path, width):
    bot_dir = tmp_path / "maktab"
    (bot_dir / "locales").mkdir(parents=True)
    (bot_dir / "bot.yaml").write_text(RTL_BOT)
    for locale, text in RTL_CATALOGS.items():
        (bot_dir / "locales" / f"{locale}.yaml").write_text(text, encoding="utf-8")
    assert check_bot(bot_dir)[1] == []  # no untranslated literal: titles and descriptions included
    app = create_app([chatrun.load_bot(bot_dir)], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=width, locale="ar-EG") as page:
        page.wait_for_function("document.body.dataset.refreshes > 0", timeout=30_000)
        texts = _texts(page)
        assert texts == {"lang": "ar", "dir": "rtl", "send": "إرسال", "reset": "بدء من جديد", "status": "متصل",
                         "placeholder": "اكتب رسالة…", "crumb": "الاستقبال", "description": "مكتب خدمة العملاء",
                         "empty": "ابدأ المحادثة مع maktab."}
        assert page.evaluate("getComputedStyle(document.getElementById('inspector')).direction") == "ltr"
        # Right to left: the Send button sits left of the input, the user's bubble on the left.
        send_box, input_box = page.locator("#send").bounding_box(), page.locator("#input").bounding_box()
        assert send_box["x"] + send_box["width"] <= input_box["x"] + 1
        fake.queue(call("cancel", order="A7"))
        send(page, "ألغِ الطلب A7")
        card = page.locator(".pending-card")
        card.wait_for(timeout=30_000)
        # the user's own approval is their confirmation: Yes and No, in Arabic, on the card alone
        assert card.locator("button.approve").inner_text() == "نعم"
        assert card.locator("button.reject").inner_text() == "لا"
        assert page.locator("#messages .choices").count() == 0
        assert "هل تريد إلغاء الطلب A7؟" in card.inner_text()
        user, chat = page.locator(".msg.user").last.bounding_box(), page.locator("#messages").bounding_box()
        assert user["x"] - chat["x"] < (chat["x"] + chat["width"]) - (user["x"] + user["width"])  # nearer the left
        assert _fits(page)
        shot(page, f"i18n-ar-{width}")
        seen = int(page.get_attribute("body", "data-refreshes"))
        fake.queue({"text": "حسنًا."})
        card.locator("button.reject").click()
        page.wait_for_function(f"Number(document.body.dataset.refreshes) > {seen}", timeout=30_000)
        assert card.locator(".pending-status").inner_text() == "لا"
        fake.queue(call("bye"))
        send(page, "شكرًا")
        page.wait_for_selector("#ended", timeout=30_000)
        assert page.inner_text("#ended").startswith("انتهت هذه المحادثة.")
        assert page.inner_text("#start-new") == "بدء محادثة جديدة"
        assert _fits(page)
        shot(page, f"i18n-ar-ended-{width}")


SCHADEN_BOT = """\
name: schaden
description: "{{ t('about') }}"
locales: [en, de]
routes:
  report:
    default: true
    title: "{{ t('report') }}"
    system: "{{ t('prompt') }}"
    attachments: {kinds: [image/png, application/pdf], max_bytes: 1000000, max_count: 2}
"""
SCHADEN_CATALOGS = {
    "en": "about: Claims for damaged parcels\nreport: Damaged parcel\nprompt: Ask for a photo.\n",
    "de": "about: Schadensmeldungen für Pakete\nreport: Beschädigtes Paket\nprompt: Bitte um ein Foto.\n",
}

# A File of `size` bytes made in the page and pasted into the message box, as a browser does.
PASTE = """([name, type, size]) => {
  const transfer = new DataTransfer();
  transfer.items.add(new File([new Uint8Array(size)], name, { type: type }));
  document.querySelector("#input").dispatchEvent(
    new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true }));
}"""


@pytest.mark.parametrize("width", [390, 1280])
def test_a_german_session_refuses_a_file_in_german_naming_the_setting(fake, tmp_path, width):
    bot_dir = tmp_path / "schaden"
    (bot_dir / "locales").mkdir(parents=True)
    (bot_dir / "bot.yaml").write_text(SCHADEN_BOT)
    for locale, text in SCHADEN_CATALOGS.items():
        (bot_dir / "locales" / f"{locale}.yaml").write_text(text, encoding="utf-8")
    assert check_bot(bot_dir)[1] == []
    app = create_app([chatrun.load_bot(bot_dir)], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=width, locale="de-DE") as page:
        page.wait_for_function("document.body.dataset.refreshes > 0", timeout=30_000)
        assert page.get_attribute("#attach", "aria-label") == "Dateien anhängen"
        assert page.get_attribute("#attach", "title") == "Dateien anhängen (oder einfügen oder in den Chat ziehen)"
        assert page.inner_text("#attach-limits") == (
            "Dateien pro Nachricht: bis zu 2, je höchstens 1 MB: image/png, application/pdf")
        page.evaluate(PASTE, ["riss.png", "image/png", 1_500_000])
        assert page.inner_text("#attach-problem") == (
            "riss.png ist 1,5 MB groß und überschreitet die Grenze dieses Chats von 1 MB pro Datei "
            "(attachments.max_bytes).")  # the setting's name stays: it is the bot's field
        shot(page, f"i18n-de-attach-refused-{width}")
        page.evaluate(PASTE, ["zeilen.csv", "text/csv", 10])
        assert page.inner_text("#attach-problem") == (
            "zeilen.csv hat den Typ text/csv; dieser Chat nimmt nur image/png, application/pdf an (attachments.kinds).")
        for name in ("a.pdf", "b.pdf", "c.pdf"):
            page.evaluate(PASTE, [name, "application/pdf", 1_000_000])  # exactly the limit: taken
        assert page.inner_text("#attach-problem") == (
            "Dateien pro Nachricht: höchstens 2 (attachments.max_count); c.pdf wurde nicht hinzugefügt.")
        labels = page.eval_on_selector_all("#attach-tray .attach-remove", "bs => bs.map(b => b.getAttribute('aria-label'))")
        assert labels == ["a.pdf entfernen", "b.pdf entfernen"]
        assert page.get_attribute("#attach-tray", "aria-label") == "Zu sendende Dateien"
        assert page.locator("#attach-tray .attachment-size").all_inner_texts() == ["1 MB", "1 MB"]
        assert _fits(page)
        shot(page, f"i18n-de-attach-tray-{width}")
        assert page.js_errors == []


@pytest.mark.parametrize("width", [390])
def test_a_german_user_waiting_for_the_baker_reads_only_german_from_chatrun(fake, tmp_path, width):
    """Issue 34: a big order waits for the baker; the German user's card and the reply to their
    next message are German (what they are told, never the baker's question), at a phone's width."""
    told = "Ihre Anfrage wartet auf eine Genehmigung."
    app = create_app([chatrun.load_bot(BAKERY)], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=width, locale="de-DE") as page:
        fake.queue(call("add_loaves", count=30))
        send(page, "Dreißig Brote bitte")
        card = page.locator(".pending-card").first
        card.wait_for(timeout=30_000)
        assert card.locator(".pending-ask").inner_text() == told
        assert card.locator(".tag").text_content() == "Genehmigung"  # shown in capitals (CSS)
        assert card.locator(".pending-status").inner_text() == "Warten auf Genehmigung…"
        assert card.locator("button").count() == 0  # the baker decides, not the customer
        send(page, "Und?")
        page.wait_for_function("[...document.querySelectorAll('.msg.bot')].some(e => e.innerText.includes("
                               "'Es wird noch gewartet'))", timeout=30_000)
        shown = page.inner_text(".messages")
        assert f"Es wird noch gewartet: {told}" in shown
        english = ["Still waiting", "Your request", "Approval", "Approve", "Reject", "Waiting for",
                   "Bake 30", "30 Brote für eine Bestellung backen"]  # the last: the baker's question
        assert [text for text in english if text in shown] == []
        assert _fits(page)
        shot(page, f"i18n-de-approval-{width}")
