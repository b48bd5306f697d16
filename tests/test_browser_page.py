"""The web page as end users meet it (issue 27): Markdown replies rendered safely, long words
that never widen the page, Object events as readable cards, the cause when no model is
configured, a phone's header and input, routes' display names, a user's confirmation as one
card with Yes and No, and a route graph whose
labels stay apart. Real Chromium against the real server, the model played by the fake OpenAI
server; each check at a phone's width (390 px) and a desktop's (1280 px).

Set CHATRUN_SCREENSHOTS=DIR to keep screenshots."""

from __future__ import annotations

import json

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chatrun.server import create_app
from server_support import REPO, ThreadServer, call

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

HOTELS = """\
name: hotels
description: Books hotel rooms.
model: {name: gpt-4o-mini}
routes:
  desk:
    default: true
    title: Front desk
    system: You book hotel rooms.
    tools: [book_room, quote, pay_deposit]
  booking:
    title: Your booking
    system: Book the room.
    tools: [confirm]
  quoting:
    system: Quote a price as JSON.
    tools: [book_room]
    output:
      schema:
        title: Price quote
        type: object
        properties:
          room_type: {type: string, title: Room}
          nightly_rate: {type: number, title: Price per night}
          breakfast: {type: boolean}
        required: [room_type, nightly_rate, breakfast]
tools:
  book_room:
    description: Start booking a room
    action: {push: booking, execute: true}
  pay_deposit:
    effect: once
    description: Pay the room's deposit (the user is asked to confirm)
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    confirm: "Pay a deposit of {{ args.amount }} EUR?"
    action: {reply: "Paid {{ args.amount }} EUR."}
  quote:
    description: Quote a price
    action: {route: quoting, execute: true}
  confirm:
    description: Confirm the booking
    parameters:
      type: object
      properties: {hotel: {type: string}, nights: {type: integer}}
      required: [hotel, nights]
    action:
      emit: {Booking: "{{ {'hotel': args.hotel, 'nights': args.nights, 'guest': {'first_name': 'Ada'}, 'notes': none} }}"}
      message: Booked.
"""

WIDTHS = [390, 1280]


@pytest.fixture
def server(fake, tmp_path):
    (tmp_path / "hotels.yaml").write_text(HOTELS)
    app = create_app([chatrun.load_bot(tmp_path / "hotels.yaml")], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as running:
        yield running


def page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def inside_viewport(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    width = page.viewport_size["width"]
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width


MARKDOWN = """\
Here is **your plan**, with *care*:

- first `step`
- second, see [the docs](https://example.org/docs)

```python
print("<b>hi</b>")
```

<img src=x onerror="document.body.dataset.pwned=1"><script>document.body.dataset.pwned=2</script>
[click](javascript:document.body.dataset.pwned=3)"""


@pytest.mark.parametrize("width", WIDTHS)
def test_replies_are_markdown_rendered_safely(server, fake, width):
    with chat_page(server.url, width=width) as page:
        fake.queue({"text": MARKDOWN})
        send(page, "plan?")
        shot(page, f"markdown-{width}")
        reply = page.locator(".msg.bot").last
        assert reply.locator("strong").inner_text() == "your plan"
        assert reply.locator("em").inner_text() == "care"
        assert reply.locator("li").all_inner_texts() == ["first step", "second, see the docs"]
        assert reply.locator("li code").inner_text() == "step"
        assert reply.locator("pre code").inner_text().rstrip("\n") == 'print("<b>hi</b>")'  # GFM keeps the last newline
        assert reply.locator("pre b").count() == 0
        link = reply.locator("a")
        assert link.count() == 1  # the javascript: link is text, not a link
        assert link.get_attribute("href") == "https://example.org/docs"
        assert link.get_attribute("target") == "_blank"
        assert link.get_attribute("rel") == "noopener noreferrer"
        # Raw HTML shows as the text it is; nothing of it runs or becomes an element.
        assert reply.locator("img, script").count() == 0
        assert "<img src=x" in reply.inner_text() and reply.inner_text().endswith("click")
        assert page.evaluate("document.body.dataset.pwned") is None

        # A streamed reply is Markdown as it arrives, and after a reload (from the history).
        fake.queue({"chunks": ["Total: **12", "0 EUR**"], "chunk_delay": 0.02})
        send(page, "total?")
        assert page.locator(".msg.bot").last.locator("strong").inner_text() == "120 EUR"
        # Headings, numbered lists from their number, quotes; snake_case and 2 * 3 stay as written.
        fake.queue({"text": "## Steps\n3. call my_tool_name\n4. compute 2 * 3 * 4\n\n> quoted ~~old~~"})
        send(page, "steps?")
        reply = page.locator(".msg.bot").last
        assert reply.locator("h4").inner_text() == "Steps"
        assert reply.locator("ol").get_attribute("start") == "3"
        assert reply.locator("ol li").all_inner_texts() == ["call my_tool_name", "compute 2 * 3 * 4"]
        assert reply.locator("em").count() == 0
        assert reply.locator("blockquote del").inner_text() == "old"
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        page.wait_for_function("document.querySelectorAll('.msg.bot').length === 3")
        assert page.locator(".msg.bot").first.locator("pre code").inner_text().rstrip("\n") == 'print("<b>hi</b>")'
        assert page.locator(".msg.bot").nth(1).locator("strong").inner_text() == "120 EUR"


LONG_WORD = "Supercalifragilisticexpialidocious" * 8
LONG_URL = "https://example.org/" + "a-very-long-path-segment/" * 12 + "?q=" + "x" * 120


@pytest.mark.parametrize("width", WIDTHS)
def test_long_words_and_urls_never_widen_the_page(server, fake, width):
    with chat_page(server.url, width=width) as page:
        if width > 900:  # the chat alone, the whole width: the inspector hidden
            page.click("#toggle-inspector")
            page.wait_for_selector("#inspector", state="hidden")
        fake.queue({"text": f"Look: {LONG_WORD} at {LONG_URL}"},
                   {"text": f"{LONG_URL}\n\n```\n{LONG_WORD} = 1\n```"})  # a code block scrolls inside its bubble
        send(page, LONG_WORD)
        send(page, LONG_URL)
        shot(page, f"long-words-{width}")
        assert page_width(page) == width
        assert inside_viewport(page, "#send") and inside_viewport(page, "#input")
        rights = page.evaluate("[...document.querySelectorAll('#messages > :not(.end)')].map((n) => n.getBoundingClientRect().right)")
        assert len(rights) == 4 and max(rights) <= width


@pytest.mark.parametrize("width", WIDTHS)
def test_objects_are_readable_cards_with_json_on_demand(server, fake, width):
    with chat_page(server.url, width=width) as page:
        answer = {"room_type": "Double", "nightly_rate": 120, "breakfast": True}
        fake.queue(call("quote"), {"text": json.dumps(answer)})
        send(page, "how much?")
        card = page.locator(".object").last
        # The route's output schema names the card and its fields; a field without a title reads as words.
        assert card.locator(".tag").inner_text().lower() == "price quote"
        assert card.locator(":scope > .fields > dt").all_inner_texts() == ["Room", "Price per night", "Breakfast"]
        assert card.locator(":scope > .fields > dd").all_inner_texts() == ["Double", "120", "yes"]
        raw = card.locator("details.raw pre")
        assert not raw.is_visible()
        card.locator("details.raw summary").click()
        assert json.loads(raw.inner_text()) == answer

        # The bot's own type, no schema: key/value, nested objects nested.
        fake.queue(call("book_room"), call("confirm", hotel="Grand", nights=3), {"text": "Done."})
        send(page, "book it")
        booking = page.locator('.object[data-type="Booking"]')
        assert booking.locator(".tag").inner_text().lower() == "booking"
        assert booking.locator(":scope > .fields > dt").all_inner_texts() == ["Hotel", "Nights", "Guest", "Notes"]
        assert booking.locator(":scope > .fields > dd").last.inner_text() == "—"  # null, after later messages too
        assert booking.locator(".fields .fields dt").inner_text() == "First name"
        assert booking.locator(".fields .fields dd").inner_text() == "Ada"
        shot(page, f"objects-{width}")
        assert page_width(page) == width


@pytest.mark.parametrize("width", WIDTHS)
def test_a_confirmation_is_one_card_with_yes_and_no_also_after_a_reload(server, fake, width):
    """A `confirm:` item comes as a Pending event and a Choices event (quick replies, for clients
    without cards) with the same Yes and No: the page shows the card alone, its buttons Yes/No."""
    with chat_page(server.url, width=width) as page:
        fake.queue(call("pay_deposit", amount=50))
        send(page, "pay the deposit")
        card = page.locator('.pending-card[data-confirm="true"]')
        assert card.locator(".tag").inner_text().lower() == "question"  # the runtime asks; no one else approves
        assert card.locator(".pending-ask").inner_text() == "Pay a deposit of 50 EUR?"
        assert card.locator("button").all_inner_texts() == ["Yes", "No"]
        assert page.locator("#messages .choices").count() == 0  # not a second Yes/No below it
        assert inside_viewport(page, ".pending-card button.reject") and page_width(page) <= width
        shot(page, f"confirm-asked-{width}")
        fake.queue({"text": "Your deposit is paid."})
        card.locator("button.approve").click()
        card.locator('.pending-status').filter(has_text="Yes").wait_for(timeout=10_000)
        page.locator(".msg.bot", has_text="Your deposit is paid.").wait_for(timeout=10_000)
        assert card.locator(".pending-status").inner_text() == "Yes"  # what the user answered
        assert card.locator("button").count() == 0
        shot(page, f"confirm-answered-{width}")
        page.reload()  # the history replays Pending, Choices, Resolved: still one control
        page.wait_for_selector("body[data-ready=true]")
        page.locator(".msg.bot", has_text="Your deposit is paid.").wait_for(timeout=10_000)
        assert page.locator(".pending-card").count() == 1 and page.locator("#messages .choices").count() == 0
        assert page.locator(".pending-card .pending-status").inner_text() == "Yes"


def test_the_models_own_consent_is_no_yes_and_its_repeat_after_the_yes_asks_nothing(server, fake):
    """The unruly model (issue 32) on the page: it consents in its own arguments, and the user is
    asked all the same; after the user's Yes it calls again, consenting: the deposit is paid once,
    and no second card asks the question the user has answered."""
    with chat_page(server.url) as page:
        fake.queue({"unruly": "self_confirm", "call": {"name": "pay_deposit", "arguments": {"amount": 50}}})
        send(page, "pay the deposit")
        card = page.locator('.pending-card[data-confirm="true"]')
        assert card.locator(".pending-ask").inner_text() == "Pay a deposit of 50 EUR?"
        fake.queue({"unruly": ["repeat_call", "self_confirm"]}, {"text": "Your deposit is paid."})
        card.locator("button.approve").click()
        page.locator(".msg.bot", has_text="Your deposit is paid.").wait_for(timeout=10_000)
        assert page.locator(".pending-card").count() == 1 and card.locator(".pending-status").inner_text() == "Yes"
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told[0].startswith("Paid 50 EUR.") and told[1].startswith("Already done earlier"), told


@pytest.mark.parametrize("width", WIDTHS)
def test_no_model_configured_shows_the_cause(tmp_path, monkeypatch, width):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    (tmp_path / "hotels.yaml").write_text(HOTELS)
    app = create_app([chatrun.load_bot(tmp_path / "hotels.yaml")], "memory://")
    with ThreadServer(app) as server, chat_page(server.url, width=width) as page:
        banner = page.locator("#model-banner")
        banner.wait_for(state="visible", timeout=10_000)  # before anyone types
        text = banner.inner_text()
        assert "No model is configured" in text and "OPENAI_API_KEY" in text and "OPENAI_BASE_URL" in text
        shot(page, f"no-model-{width}")
        assert page_width(page) == width


def test_a_phone_gets_titles_big_targets_and_no_zoom(server, fake):
    with chat_page(server.url, width=390) as page:
        # The header is one row of at most 64 px, every control on screen.
        assert page.locator(".topbar").bounding_box()["height"] <= 64
        for control in ("#bot-name", "#status", "#theme", "#reset", "#play-always", "#toggle-inspector"):
            assert inside_viewport(page, control), control
        # Routes' display names for end users, not their internal names.
        assert page.locator("#breadcrumb .crumb").all_inner_texts() == ["Front desk"]
        fake.queue(call("book_room"), {"text": "Which hotel?"})
        send(page, "a room")
        assert page.locator("#breadcrumb .crumb").all_inner_texts() == ["Front desk", "Your booking"]
        assert page.locator("#breadcrumb .crumb.current").get_attribute("data-route") == "booking"
        assert page.locator(".route-change").last.inner_text() == "now in Front desk › Your booking"
        # iOS zooms into inputs under 16 px; fingers need 44 px.
        assert page.evaluate("parseFloat(getComputedStyle(document.getElementById('input')).fontSize)") >= 16
        for button in ("#reset", "#toggle-inspector"):
            box = page.locator(button).bounding_box()
            assert box["height"] >= 44 and box["width"] >= 44, (button, box)
        page.click("#toggle-inspector")
        page.wait_for_selector("#inspector", state="visible")
        # The scope's route and its id do not run together.
        for head in page.locator("#scopes .scope-head").all():
            name, ident = head.locator("span").first.bounding_box(), head.locator(".scope-id").bounding_box()
            apart = name["x"] + name["width"] + 6 <= ident["x"] or name["y"] + name["height"] <= ident["y"]
            assert apart, (name, ident)
        shot(page, "phone-inspector-390")
        assert page_width(page) == 390
        # The graph, drawn while the inspector was hidden, is laid out again when shown.
        assert_labels_apart(page.evaluate(GEOMETRY))


def overlaps(a: dict, b: dict, margin: float = 0) -> bool:
    return not (a["x"] + a["width"] + margin <= b["x"] or b["x"] + b["width"] + margin <= a["x"]
                or a["y"] + a["height"] + margin <= b["y"] or b["y"] + b["height"] + margin <= a["y"])


GEOMETRY = """() => {
  const svg = document.querySelector('#graph svg');
  const box = (n) => { const b = n.getBBox(); return {x: b.x, y: b.y, width: b.width, height: b.height}; };
  const labels = [...svg.querySelectorAll('text.edge-label')].map((t) => ({text: t.textContent, box: box(t)}));
  const nodes = [...svg.querySelectorAll('.node rect')].map(box);
  // Sample each edge's path: a point inside a label's box means the edge runs through it.
  const crossings = [];
  for (const path of svg.querySelectorAll('path.edge')) {
    const length = path.getTotalLength();
    for (let s = 0; s <= length; s += 2) {
      const p = path.getPointAtLength(s);
      for (const l of labels) {
        const b = l.box;
        if (p.x > b.x + 1 && p.x < b.x + b.width - 1 && p.y > b.y + 1 && p.y < b.y + b.height - 1) {
          crossings.push([path.querySelector('title').textContent, l.text]);
        }
      }
    }
  }
  return {labels, nodes, crossings: [...new Set(crossings.map(JSON.stringify))]};
}"""


@pytest.mark.parametrize("bot", ["travel", "support", "bank"])
def test_route_graph_labels_stay_apart_and_clear_of_edges(fake, bot):
    app = create_app([chatrun.load_bot(REPO / "bots" / bot)], "memory://")
    with ThreadServer(app) as server, chat_page(server.url, width=1280) as page:
        page.wait_for_selector("#graph svg text.edge-label")
        shot(page, f"graph-{bot}")
        assert_labels_apart(page.evaluate(GEOMETRY))


def assert_labels_apart(geometry: dict) -> None:
    labels = geometry["labels"]
    assert len(labels) >= 2
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            assert not overlaps(a["box"], b["box"]), (a, b)
        for node in geometry["nodes"]:
            assert not overlaps(a["box"], node), (a, node)
    assert geometry["crossings"] == []


@pytest.mark.parametrize("width", WIDTHS)
def test_a_message_sent_while_the_bot_replies_stays_in_the_box(server, fake, width):
    """Enter while a turn runs sends nothing (one turn at a time) and keeps what was typed: the
    box was emptied and the text lost. It goes once, when the reader sends it after the reply."""
    fake.queue({"text": "A slow reply.", "delay": 2.0}, {"text": "Got it."})
    with chat_page(server.url, width=width) as page:
        page.fill("#input", "first")
        page.press("#input", "Enter")
        page.wait_for_selector("#thinking", state="visible")
        page.fill("#input", "my second thought")
        page.press("#input", "Enter")
        assert page.input_value("#input") == "my second thought"
        page.wait_for_selector("#thinking", state="hidden", timeout=30_000)
        assert page.input_value("#input") == "my second thought"  # the reply did not take it either
        send(page, page.input_value("#input"))
        said = [m.inner_text() for m in page.locator(".msg.user").all()]
        assert said == ["first", "my second thought"]
        assert page.locator(".msg.bot").last.inner_text() == "Got it."
        sent = [r["messages"][-1]["content"] for r in fake.requests]
        assert sent.count("my second thought") == 1, sent
