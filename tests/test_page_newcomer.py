"""What a newcomer sees in the browser (Chromium via playwright), with every request that is
not to the local server blocked: the API docs render offline, the page fits a phone, the
support bot's graph labels stay apart, counts read as English, a missing token is explained.

Set CHATRUN_SCREENSHOTS=DIR to keep screenshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chromium
from chatrun.server import create_app
from server_support import REPO, ThreadServer

pytestmark = BROWSER_MARKS


@pytest.fixture
def browse(fake):
    """browse(app, width) -> (page, server URL, blocked requests): loopback only, like a machine offline."""
    from chatrun.testing.fake_openai import echo

    fake.responder = echo
    with chromium() as browser:
        servers: list[ThreadServer] = []

        def open_page(app, width: int = 1280):
            server = ThreadServer(app).__enter__()
            servers.append(server)
            context = browser.new_context(viewport={"width": width, "height": 860})
            blocked: list[str] = []

            def only_local(route):
                if route.request.url.startswith(server.url):
                    route.continue_()
                else:
                    blocked.append((route.request.resource_type, route.request.url))
                    route.abort()

            context.route("**/*", only_local)
            return context.new_page(), server.url, blocked

        try:
            yield open_page
        finally:
            for server in servers:
                server.__exit__(None, None, None)


def shot(page, name: str) -> None:
    directory = os.environ.get("CHATRUN_SCREENSHOTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(directory) / f"{name}.png"), full_page=True)


def support_app():
    return create_app([chatrun.load_bot(REPO / "bots" / "support"), chatrun.load_bot(REPO / "bots" / "travel")],
                      "memory://")


def test_api_docs_render_offline_from_the_package(browse):
    page, url, blocked = browse(support_app())
    page.goto(url + "/docs")
    page.wait_for_selector(".swagger-ui .opblock", timeout=20_000)
    assert page.locator(".opblock-summary-path", has_text="/bots/{bot}/sessions").count() >= 1
    shot(page, "docs")
    page.goto(url + "/redoc")
    page.wait_for_selector("h1", timeout=20_000)
    assert "chatrun" in page.locator("h1").first.inner_text()
    assert page.get_by_text("/bots/{bot}/sessions").count() >= 1 or page.locator("[data-section-id]").count() > 3
    shot(page, "redoc")
    # Nothing needed from elsewhere: ReDoc's "by Redocly" footer logo is the one image it
    # still asks a CDN for, and it renders fine without it.
    assert [b for b in blocked if b[0] != "image"] == [], blocked
    favicon = page.request.get(url + "/favicon.ico")
    assert favicon.status == 200 and favicon.body().startswith(b"<svg")


def test_the_page_fits_a_phone_and_the_support_graph_labels_do_not_overlap(browse):
    for width in (390, 420):
        page, url, blocked = browse(support_app(), width)
        page.goto(url + "/")
        page.wait_for_selector("body[data-ready=true]", timeout=20_000)
        shot(page, f"phone_{width}")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        for button in ("#reset", "#toggle-inspector"):
            box = page.locator(button).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= width, (button, box)
        assert blocked == []

    page, url, _ = browse(support_app())
    page.goto(url + "/")
    page.wait_for_selector("body[data-ready=true]", timeout=20_000)
    shot(page, "support_graph")
    boxes = page.eval_on_selector_all("#graph text.edge-label", "els => els.map(e => { const b = e.getBBox(); "
                                      "return [e.textContent, b.x, b.y, b.width, b.height]; })")
    assert len(boxes) >= 3
    for i, (name_a, xa, ya, wa, ha) in enumerate(boxes):
        for name_b, xb, yb, wb, hb in boxes[i + 1:]:
            apart = xa + wa <= xb or xb + wb <= xa or ya + ha <= yb or yb + hb <= ya
            assert apart, f"edge labels {name_a!r} and {name_b!r} overlap"
    assert page.request.get(url + "/favicon.ico").status == 200
    assert page.locator("link[rel=icon]").count() == 1


def test_counts_read_as_english_and_the_turn_counts_agree(browse, fake):
    page, url, _ = browse(support_app())
    page.goto(url + "/")
    page.wait_for_selector("body[data-ready=true]", timeout=20_000)
    page.wait_for_function("document.querySelector('#session-id').textContent.endsWith('· 0 completed turns')",
                           timeout=20_000)  # filled in when the Connect completes
    fake.queue({"status": 500}, {"status": 500}, {"status": 500}, {"status": 500})  # the first turn fails
    page.fill("#input", "hello")
    page.press("#input", "Enter")
    page.wait_for_function("document.querySelector('#turn-meta').textContent.includes('failed')", timeout=60_000)
    assert page.inner_text("#session-id").endswith("· 0 completed turns")
    page.fill("#input", "hello again")
    page.press("#input", "Enter")
    page.wait_for_function("document.querySelector('#session-id').textContent.endsWith('1 completed turn')",
                           timeout=60_000)
    assert "1 messages" not in page.inner_text("body")
    meta = page.inner_text("#memory-meta")
    count = int(meta.split("·")[1].split()[0])
    assert meta.split("·")[1].strip() == f"{count} message{'' if count == 1 else 's'}"


def test_without_a_token_the_page_says_why_and_disables_the_input(browse, tmp_path):
    auth = tmp_path / "auth.yaml"
    auth.write_text("tokens:\n  s3cret-ana-token: {principal: ana}\n")
    app = create_app([chatrun.load_bot(REPO / "bots" / "hello")], "memory://", auth=str(auth))
    page, url, _ = browse(app, 400)
    page.goto(url + "/")
    notice = page.wait_for_selector("#unauthorized", timeout=20_000)
    assert "?token=" in notice.inner_text()
    assert page.is_disabled("#input") and page.is_disabled("#send")
    box = notice.bounding_box()
    assert box["width"] > 300 and box["x"] + box["width"] <= 400  # the whole text, not a cut pill
    shot(page, "unauthorized")
