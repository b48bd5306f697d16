"""The operator inbox, in Chromium, on a phone call's conversation: the caller asked for a person
and Twilio put them through to `handoff_to`; an operator who takes the conversation over and writes
to them is told at once that the caller cannot receive it (the server refuses it: a call has no
outbox, and its relay is over), and the message stays in the box. A real uvicorn server, the
`websockets` client playing Twilio's relay, the fake OpenAI server as the model.

Set CHATRUN_SCREENSHOTS=DIR to keep the screenshot."""

from __future__ import annotations

import json

import httpx
import pytest

from browser_support import BROWSER_MARKS, chromium, shot
from chatrun.server import create_app
from server_support import ThreadServer
from test_channel_twilio import AUTH_TOKEN, BOT, prompt, relay_path_at, setup

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]


@pytest.mark.parametrize("width", [390, 1280])
def test_the_inbox_says_a_phone_caller_cannot_receive_a_written_message(tmp_path, fake, monkeypatch, width):
    from websockets.sync.client import connect

    monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "auth.yaml").write_text("tokens:\n  olga-token-123: {principal: olga, roles: [operators]}\n")
    app = create_app([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}", auth=str(tmp_path / "auth.yaml"))
    fake.queue({"tool_calls": [{"name": "human", "arguments": {}}]})
    with ThreadServer(app) as server, httpx.Client(base_url=server.url) as http:
        with connect(server.ws_url + relay_path_at(http, server.url)) as ws:
            ws.send(json.dumps(setup()))
            ws.send(json.dumps(prompt("A person, please")))
            while json.loads(ws.recv(timeout=60))["type"] != "end":
                pass  # put through to handoff_to: the relay is over
        with chromium() as browser:
            inbox = browser.new_context(viewport={"width": width, "height": 860}).new_page()
            errors: list[str] = []
            inbox.on("pageerror", lambda exc: errors.append(str(exc)))
            inbox.goto(f"{server.url}/operator?token=olga-token-123")
            inbox.wait_for_selector("body[data-ready=true]", timeout=30_000)
            inbox.locator(".op-session").first.click()
            inbox.click("#take-over")
            inbox.wait_for_selector("#operator-input", timeout=30_000)
            inbox.fill("#operator-input", "Hi, Olga here.")
            inbox.click("#operator-say button[type=submit]")
            problem = inbox.locator("#action-problem", has_text="phone call")
            problem.wait_for(timeout=30_000)
            shot(inbox, f"inbox-phone-refused-{width}")
            assert "cannot receive a written message" in problem.inner_text()
            assert inbox.input_value("#operator-input") == "Hi, Olga here."  # not sent: still to hand
            assert inbox.locator("#op-history", has_text="Hi, Olga here.").count() == 0
            assert not errors, f"JavaScript errors: {errors}"
