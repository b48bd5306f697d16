"""The page's two modes (issue 35): /chat/{bot} for end users, / and /bots/{bot}/ for the bot's author
(?view=user previews the end-user page), and the vendored Markdown libraries served with their licences."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import chatrun
from server_support import app_for_testclient

BOT = "name: shop\ndescription: Sells things.\nmodel: {name: gpt-4o-mini}\nroutes:\n  main: {default: true, system: Sell.}\n"


@pytest.fixture
def client(tmp_path):
    (tmp_path / "shop.yaml").write_text(BOT)
    with TestClient(app_for_testclient([chatrun.load_bot(tmp_path / "shop.yaml")], "memory://")) as c:
        yield c


def mode(page) -> str:
    assert page.status_code == 200, page.text
    return page.text.split('data-mode="', 1)[1].split('"', 1)[0]


def test_end_users_get_the_chat_page_and_authors_the_inspector(client):
    assert mode(client.get("/chat/shop")) == "user"
    assert mode(client.get("/")) == "author"
    assert mode(client.get("/bots/shop/")) == "author"
    assert mode(client.get("/bots/shop/?view=user")) == "user"
    assert client.get("/chat/nope").status_code == 404
    moved = client.get("/chat/shop/", follow_redirects=False)
    assert moved.status_code == 307 and moved.headers["location"] == "/chat/shop"


def test_the_markdown_libraries_are_served_with_their_licences(client):
    # DOMPurify is loaded by markdown.js, only in a browser without the HTML Sanitizer API.
    loaders = {"marked.min.js": client.get("/chat/shop").text, "purify.min.js": client.get("/_chat/static/markdown.js").text}
    for name, marker in (("marked.min.js", "marked v18.3.0"), ("purify.min.js", "DOMPurify 3.5.0")):
        assert f"/_chat/static/vendor/{name}" in loaders[name]
        script = client.get(f"/_chat/static/vendor/{name}")
        assert script.status_code == 200 and marker in script.text and "sourceMappingURL" not in script.text
    for licence in ("marked.LICENSE", "purify.LICENSE"):
        assert client.get(f"/_chat/static/vendor/{licence}").status_code == 200


def test_no_foreign_site_may_frame_the_pages(client):
    # The widget's panel carried `frame-ancestors` of its origins, but the same chat page at
    # /chat/{bot}, the author's page (which can play the model) and the operator's page (which
    # decides approvals) could be framed by any site: a click on a foreign page could land on them.
    for path in ("/", "/bots/shop/", "/chat/shop", "/bots/shop/?view=user", "/operator", "/docs", "/redoc"):
        page = client.get(path)
        assert page.headers["content-security-policy"] == "frame-ancestors 'self'", path
        assert page.headers["x-frame-options"] == "SAMEORIGIN", path
