"""--allow-origin in Chromium: a page of an allowed site calls the HTTP API with fetch (JSON,
a token), reads its answers and its refusals; a page of another site cannot. The WebSocket
honoured --allow-origin, but a browser's POST of JSON from an allowed site was preflighted and
the server answered the preflight 405 and no answer carried CORS headers: the page could neither
send nor read (tests/test_server_hardening.py tries the refusals without a browser)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chromium
from chatrun.server import create_app
from chatrun.server.auth import Auth
from chatrun.server.guard import EdgePolicy
from server_support import ThreadServer, free_port, write_travel

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]


class Blank(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"<!doctype html><title>site</title><p>a site"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Blank)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


CALLS = """async (chat) => {
  const call = async (path, init) => {
    try {
      const r = await fetch(chat + path, init);
      const text = await r.text();
      return {status: r.status, body: text ? JSON.parse(text) : null};
    } catch (e) { return {failed: String(e)}; }
  };
  const json = {"Content-Type": "application/json", "Authorization": "Bearer ana-token-0123"};
  return {
    created: await call("/bots/travel/sessions", {method: "POST", headers: json, body: JSON.stringify({id: "from-site"})}),
    read: await call("/bots/travel/sessions/from-site", {headers: {"Authorization": "Bearer ana-token-0123"}}),
    refused: await call("/bots/travel/sessions", {method: "POST", headers: json, body: JSON.stringify({id: "a/b"})}),
    deleted: await call("/bots/travel/sessions/from-site", {method: "DELETE", headers: json}),
  };
}"""


def test_a_page_of_an_allowed_site_calls_the_api_and_a_page_of_another_cannot(tmp_path, fake):
    travel = chatrun.load_bot(write_travel(tmp_path / "bot"))
    auth = Auth.from_mapping({"tokens": {"ana-token-0123": "ana"}})
    with site() as allowed, site() as other:
        app = create_app([travel], "memory://", auth=auth, edge=EdgePolicy(allowed_origins=(allowed,)))
        with ThreadServer(app) as chat, chromium() as browser:
            page = browser.new_page()
            page.goto(allowed + "/")
            calls = page.evaluate(CALLS, chat.url)
            assert calls["created"]["status"] == 201 and calls["created"]["body"]["id"] == "from-site", calls
            assert calls["read"]["status"] == 200 and calls["read"]["body"]["id"] == "from-site", calls
            assert calls["refused"]["status"] == 400 and calls["refused"]["body"]["error"] == "BadRequest", calls
            assert calls["deleted"] == {"status": 204, "body": None}, calls
            page.goto(other + "/")
            foreign = page.evaluate(CALLS, chat.url)
            assert all("failed" in foreign[name] for name in foreign), foreign
    assert fake.requests == []
