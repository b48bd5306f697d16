"""What the user reads of a failed turn is in the session's locale on every door (docs/i18n.md,
"Titles, the description and the page"; docs/format.md, "When a turn fails"): the texts
`model_failed` and `turn_failed` were English constants whatever the session spoke. Through the
real server (the WebSocket's Connect locale, HTTP's Accept-Language, /v1's metadata.locale: its
error's `message` is that text alone) and the real model client against the fake, which fails."""

from __future__ import annotations

from fastapi.testclient import TestClient

import chatrun
from chatrun.definition.page_texts import BUILTIN
from server_support import app_for_testclient, until_done

BOT = """
name: shop
locales: [en, de]
routes:
  main:
    default: true
    tools: [crash]
tools:
  crash:
    handler: shop_tools:crash
    effect: read
"""

TOOLS = """
def crash(ctx):
    raise RuntimeError("a bug in the handler")
"""

MODEL_DOWN = {"status": 400, "body": {"error": {"message": "the model is down"}}}
CRASH = {"tool_calls": [{"name": "crash", "arguments": {}}]}
CATALOGS = {"locales/en.yaml": "x: y\n", "locales/de.yaml": "x: z\n", "shop_tools.py": TOOLS}


def _client(write_bot, tmp_path) -> TestClient:
    (tmp_path / "locales").mkdir()
    bot = chatrun.load_bot(write_bot(BOT, extra=CATALOGS))
    return TestClient(app_for_testclient([bot], f"sqlite:///{tmp_path / 'chat.db'}"))


def _ws_error(client: TestClient, chat_id: str) -> str:
    with client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": chat_id, "extensions": True, "locale": "de"})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": chat_id, "data": {"userMessage": "hallo"}})
        [error] = [f["data"] for f in until_done(ws) if f["type"] == "Error"]
    return error


def _http_error(client: TestClient, session: str) -> str:
    created = client.post("/bots/shop/sessions", json={"id": session}, headers={"Accept-Language": "de-DE,de;q=0.9"})
    assert created.status_code == 201
    reply = client.post(f"/bots/shop/sessions/{session}/messages", json={"userMessage": "hallo"})
    [error] = [e["data"] for e in reply.json()["events"] if e["type"] == "Error"]
    return error


def _v1_error(client: TestClient, session: str) -> str:
    failed = client.post("/v1/chat/completions", headers={"X-Chatrun-Session": session},
                         json={"model": "shop", "metadata": {"locale": "de"},
                               "messages": [{"role": "user", "content": "hallo"}]})
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "turn_failed"
    return failed.json()["error"]["message"]


def test_a_failed_turn_is_told_in_the_sessions_locale_on_the_websocket_http_and_v1(write_bot, tmp_path, fake):
    de = BUILTIN["de"]
    with _client(write_bot, tmp_path) as client:
        for door, read in (("ws", _ws_error), ("http", _http_error)):
            fake.queue(MODEL_DOWN)
            assert read(client, f"{door}-model") == de["model_failed"], door
            fake.queue(CRASH)
            assert read(client, f"{door}-crash") == de["turn_failed"], door
        fake.queue(MODEL_DOWN)
        assert _v1_error(client, "v1-model") == de["model_failed"]
        fake.queue(CRASH)
        assert _v1_error(client, "v1-crash") == de["turn_failed"]
        fake.queue(MODEL_DOWN)  # the Responses API: its error too
        failed = client.post("/v1/responses", json={"model": "shop", "metadata": {"locale": "de"}, "input": "hallo"})
        assert failed.status_code == 500 and failed.json()["error"]["message"] == de["model_failed"]
    assert de["turn_failed"] != chatrun.events.TURN_FAILED_TEXT
    assert BUILTIN["en"]["turn_failed"] == chatrun.events.TURN_FAILED_TEXT  # English as before


def test_a_bot_words_the_failed_turn_in_a_locale_chatrun_lacks(write_bot, tmp_path, fake):
    """`page.turn_failed` in the bot's catalog replaces chatrun's text, as every page text."""
    bot = BOT.replace("[en, de]", "[en, fr]")
    (tmp_path / "locales").mkdir()
    extra = CATALOGS | {"locales/de.yaml": None, "locales/fr.yaml": "x: w\npage:\n  turn_failed: Oups, réessayez.\n"}
    loaded = chatrun.load_bot(write_bot(bot, extra={k: v for k, v in extra.items() if v is not None}))
    fake.queue(CRASH)
    events = loaded.session(meta={"locale": "fr"}).chat("salut")
    assert [e.data for e in events if e.type == "Error"] == ["Oups, réessayez."]
