"""The inspector's memory panel shows each message's token count, the total against a token
window's maximum, and the counter that made them (exact or estimated), in a real browser.

Set CHATRUN_SCREENSHOTS=DIR to keep the screenshot (1280 px wide)."""

from __future__ import annotations

import textwrap

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chatrun.memory.tokens import tiktoken_counter
from chatrun.messages import AssistantMessage, SystemMessage, UserMessage
from chatrun.server import create_app
from server_support import ThreadServer

pytestmark = [*BROWSER_MARKS, pytest.mark.needs_encodings]

TEXT = ("hello world " * 10).strip()
BOT = """\
name: window
model: {provider: openai, name: gpt-4o-mini}
routes:
  chat:
    default: true
    system: Be brief.
    memory: {type: token_window, max_tokens: 60}
"""


def test_the_inspector_shows_token_counts_per_message(fake, tmp_path):
    path = tmp_path / "bot.yaml"
    path.write_text(textwrap.dedent(BOT))
    app = create_app([chatrun.load_bot(path)], f"sqlite:///{tmp_path / 'chat.db'}")
    count = tiktoken_counter("o200k_base")
    system, user, ok = count(SystemMessage("Be brief.")), count(UserMessage(TEXT)), count(AssistantMessage("ok"))
    assert (system, user, ok) == (7, 24, 5)
    with ThreadServer(app) as server, chat_page(server.url) as page:
        fake.queue({"text": "ok"}, {"text": "ok"})
        send(page, TEXT)
        send(page, TEXT)  # 7 + 24 + 5 + 24 + 5 = 65 > 60: the first user message is evicted
        page.locator("#memory").scroll_into_view_if_needed()  # the inspector scrolls: show the panel
        shot(page, "inspector-tokens")
        roles = page.locator("#memory .mem .role").all_inner_texts()
        assert [r.lower() for r in roles] == ["system", "assistant", "user", "assistant"]
        items = page.locator("#memory .mem")
        counts = [items.nth(i).get_attribute("data-tokens") for i in range(items.count())]
        assert counts == ["7 tokens", "5 tokens", "24 tokens", "5 tokens"]  # drawn beside each role (CSS)
        assert items.last.inner_text().endswith("ok")  # not part of the message's text
        meta = page.locator("#memory-meta").inner_text()
        assert "4 messages · 41 of 60 tokens, o200k_base (exact) · token_window" in meta
