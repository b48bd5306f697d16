"""The web page shows a reply's Sources (issue 37) as links under it: the cited articles' titles,
each opening its `url` in a new tab; a link that is not http(s) is shown as text only."""

from __future__ import annotations

import shutil

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chatrun.server import create_app
from server_support import REPO, ThreadServer

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]


@pytest.fixture
def server(fake, tmp_path):
    bot = tmp_path / "helpcentre"
    shutil.copytree(REPO / "bots" / "helpcentre", bot, ignore=shutil.ignore_patterns(".chatrun"))
    (bot / "odd").mkdir()
    (bot / "odd" / "x.md").write_text("# Odd\n\nAn odd article.\n")
    text = (bot / "bot.yaml").read_text()
    (bot / "bot.yaml").write_text(text.replace("routes:", "  odd: {path: odd, url: 'javascript:alert(1)//{path}'}\nroutes:")
                                  .replace("sources: [help_centre]", "sources: [help_centre, odd]")
                                  .replace("top_k: 3", "top_k: 20"))  # every passage the question matches is given
    app = create_app([chatrun.load_bot(bot)], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as running:
        yield running


@pytest.mark.parametrize("width", [390, 1280])
def test_a_replys_sources_are_links_under_it(server, fake, width):
    with chat_page(server.url, width=width) as page:
        fake.queue({"text": "You have 30 days [returns.md#refund-window]; express costs 9.90 euros [shipping.md#costs] [x.md#odd]."})
        send(page, "How long can I return things, what does express cost, and the odd article?")
        shot(page, f"knowledge-sources-{width}")
        sources = page.locator(".sources").last
        assert sources.locator(".tag").inner_text() == "Sources"
        links = sources.locator("a")
        assert links.all_inner_texts()[:2] == ["Returns and refunds › Refund window", "Shipping › Shipping costs"]
        assert links.nth(0).get_attribute("href") == "https://help.acme.example/returns#refund-window"
        assert links.nth(0).get_attribute("target") == "_blank"
        assert links.nth(0).get_attribute("rel") == "noopener noreferrer"
        assert links.count() == 2  # the odd source's link is not http(s): its title shows as text
        assert sources.locator("li").nth(2).inner_text() == "Odd"
        box = sources.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
