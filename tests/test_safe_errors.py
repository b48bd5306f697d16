"""What reaches the end user of a failed turn (issue 9, section 2): over the real server's
WebSocket the Error frame is the safe text — no file path, no exception name — while the
author's detail is in the session's history (HTTP API) and the server log."""

from __future__ import annotations

import logging

from fastapi.testclient import TestClient

import chatrun
from server_support import app_for_testclient, call, until_done

BOT = """
name: crashy
routes:
  main:
    default: true
    tools: [pay]
tools:
  pay:
    handler: pay_tools:pay
"""

TOOLS = """
def pay(ctx):
    raise KeyError("card_number")
"""


def test_the_error_frame_is_safe_and_the_history_has_the_detail(write_bot, tmp_path, fake, caplog):
    bot = chatrun.load_bot(write_bot(BOT, extra={"pay_tools.py": TOOLS}))
    app = app_for_testclient([bot], f"sqlite:///{tmp_path / 'chat.db'}")
    fake.queue(call("pay"))
    with TestClient(app) as client, caplog.at_level(logging.INFO, logger="chatrun"):
        with client.websocket_connect("/_chat/routes") as ws:
            ws.send_json({"type": "Connect", "chatId": "c1", "extensions": True})  # Error frames are an extension
            until_done(ws)
            ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "data": {"userMessage": "pay"}})
            frames = until_done(ws)
        session = client.get("/bots/crashy/sessions/c1").json()
    [error] = [f for f in frames if f["type"] == "Error"]
    assert error["data"] == chatrun.events.TURN_FAILED_TEXT
    for secret in (str(tmp_path), "bot.yaml", "KeyError", "pay_tools", "card_number"):
        assert secret not in error["data"]
        assert all(secret not in str(f.get("data")) for f in frames)
    detail = session["history"][-1]["error"]
    assert detail.startswith("tool pay (") and "bot.yaml:" in detail and "raised KeyError: 'card_number'" in detail
    assert any(detail in r.getMessage() for r in caplog.records if r.name == "chatrun")  # the server log
