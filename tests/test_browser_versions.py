"""The inspector shows the bot version a session runs (issue 23), in a real browser, at a
phone's width and a desktop's. Set CHATRUN_SCREENSHOTS=DIR to keep the screenshots."""

from __future__ import annotations

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chatrun.server import create_app
from server_support import ThreadServer
from test_versions import SHOP

pytestmark = [*BROWSER_MARKS]


@pytest.mark.parametrize("width", [390, 1280])
def test_the_inspector_shows_the_sessions_bot_version(fake, tmp_path, width):
    v2 = chatrun.load_bot(SHOP / "versions" / "2").config
    app = create_app(str(SHOP), f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=width) as page:
        fake.queue({"text": "Hello, tea?"})
        send(page, "hi")
        page.wait_for_function(f"document.body.dataset.botVersion === '{v2.content_version}'", timeout=30_000)
        if not page.locator("#inspector").is_visible():  # a phone: the inspector opens on demand
            page.click("#toggle-inspector")
        shown = page.locator("#bot-version")
        shown.scroll_into_view_if_needed()
        shot(page, f"inspector-version-{width}")
        assert shown.inner_text() == f"· version 2 ({v2.content_version})"
        assert shown.is_visible()
