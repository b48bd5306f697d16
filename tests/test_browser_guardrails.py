"""Guardrails on the page (issue 37): the model (the fake OpenAI server) streams a card number and
a blocked phrase, slowly, to the end-user page in real Chromium; a MutationObserver records every
text the chat ever showed, chunk by chunk, and none of it holds the digits or the blocked words —
the engine held the guarded reply before the page got a chunk (engine/guardrails.py, OutputHold).
The other doors: tests/test_doors.py, tests/test_guardrails_server.py, the channel tests (docs/guardrails.md
lists them)."""

from __future__ import annotations

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send
from chatrun.server import create_app
from leak_support import card_leaked
from server_support import ThreadServer
from test_guardrails_server import BOT

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

# Each chunk 40 ms after the last: the page would show each as it came (engine/stream_chunks.py
# sends chunks on at most every 50 ms, so some go alone and some together).
CARD_REPLY = {"chunks": ["Thanks. Your card ", "4111 ", "1111 ", "1111 ", "1111 is ", "saved. Bye"], "chunk_delay": 0.04}
SECRET_REPLY = {"chunks": ["Sure. The price list ", "is for ", "internal ", "only. Ask me later."], "chunk_delay": 0.04}

# Every text #messages shows, after each change the page makes to it.
WATCH = """() => {
  window.shown = [];
  const box = document.getElementById("messages");
  new MutationObserver(() => window.shown.push(box.textContent))
    .observe(box, {childList: true, subtree: true, characterData: true});
}"""


@pytest.fixture
def server(fake, tmp_path):
    (tmp_path / "shop.yaml").write_text(BOT)
    with ThreadServer(create_app([chatrun.load_bot(tmp_path / "shop.yaml")], "memory://")) as running:
        yield running


@pytest.mark.parametrize("width", [390, 1280])
def test_the_page_never_shows_a_streamed_card_number_or_a_blocked_sentence(server, fake, width):
    fake.queue(CARD_REPLY, SECRET_REPLY)
    with chat_page(server.url, width=width, path="/chat/shop") as page:
        page.evaluate(WATCH)
        send(page, "save my card")
        send(page, "prices?")
        shown = page.evaluate("window.shown")
        replies = page.locator(".msg.bot .msg-body").all_inner_texts()
    assert len(shown) > 4  # the page changed the chat many times while the replies streamed
    assert not [text for text in shown if card_leaked(text) or "internal" in text.lower()]
    assert replies[-2:] == ["Thanks. Your card [card] is saved. Bye", "Sure. I cannot share that."]
