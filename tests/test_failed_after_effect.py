"""What the user reads of a failed turn in which a tool that may change something ran
(docs/format.md "When a turn fails"): not "nothing was kept", which is false about the tool's
effect, but that the message was not saved and the tool ran; the old text when nothing ran.
Through the real server's doors (the WebSocket, HTTP) and the real openai client against the
fake model, which fails after the tool ran."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

import chatrun
from chatrun.definition.page_texts import BUILTIN
from server_support import app_for_testclient, call, until_done

BOT = """
name: booking
routes:
  main:
    default: true
    tools: [book, look]
tools:
  book:
    handler: book_tools:book
    effect: once
  look:
    handler: book_tools:look
"""

TOOLS = """
from pathlib import Path

def book(ctx):
    with open(Path(__file__).parent / "booked.txt", "a") as f:
        f.write("booked\\n")
    return "booked"

def look(ctx):
    return "nothing changed"
"""

MODEL_DOWN = {"status": 400, "body": {"error": {"message": "the model is down"}}}
AFTER_BOOK = BUILTIN["en"]["failed_after_effect"].format(tools="book")


def _client(write_bot, tmp_path: Path) -> tuple[TestClient, Path]:
    folder = write_bot(BOT, extra={"book_tools.py": TOOLS})
    app = app_for_testclient([chatrun.load_bot(folder)], f"sqlite:///{tmp_path / 'chat.db'}")
    return TestClient(app), Path(folder).parent


def _ws_error(client: TestClient, text: str, chat_id: str) -> str:
    with client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": chat_id, "extensions": True})  # Error frames are an extension
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": chat_id, "data": {"userMessage": text}})
        [error] = [f["data"] for f in until_done(ws) if f["type"] == "Error"]
    return error


def _http_error(client: TestClient, text: str, session: str) -> str:
    assert client.post("/bots/booking/sessions", json={"id": session}).status_code == 201
    reply = client.post(f"/bots/booking/sessions/{session}/messages", json={"userMessage": text})
    [error] = [e["data"] for e in reply.json()["events"] if e["type"] == "Error"]
    return error


def test_a_failed_turn_after_a_once_tool_ran_says_so_on_the_websocket_and_http(write_bot, tmp_path, fake):
    client, folder = _client(write_bot, tmp_path)
    with client:
        fake.queue(call("book"), MODEL_DOWN)
        assert _ws_error(client, "book it", "w1") == AFTER_BOOK
        fake.queue(call("book"), MODEL_DOWN)
        assert _http_error(client, "book it", "h1") == AFTER_BOOK
        assert client.get("/bots/booking/sessions/h1").json()["turn"] == 0  # the turn was rolled back
    assert (folder / "booked.txt").read_text() == "booked\nbooked\n"  # and the tool did run, twice
    assert "Nothing" not in AFTER_BOOK and "book ran" in AFTER_BOOK


def test_a_failed_turn_after_only_a_read_tool_keeps_the_old_text(write_bot, tmp_path, fake):
    client, _ = _client(write_bot, tmp_path)
    with client:
        fake.queue(call("look"), MODEL_DOWN)
        assert _ws_error(client, "look", "w2") == chatrun.events.MODEL_FAILED_TEXT
        fake.queue(MODEL_DOWN)
        assert _http_error(client, "hi", "h2") == chatrun.events.MODEL_FAILED_TEXT


def test_the_text_is_in_the_sessions_locale_and_a_bot_may_word_it(write_bot, tmp_path, fake):
    """The real model client against the fake; the session's locale picks chatrun's German
    text, and a bot's `page.failed_after_effect` replaces it (as every page text)."""
    bot = BOT.replace("name: booking", "name: booking\nlocales: [en, de, fr]")
    (tmp_path / "locales").mkdir()
    path = write_bot(bot, extra={"book_tools.py": TOOLS, "locales/en.yaml": "x: y\n", "locales/de.yaml": "x: z\n",
                                 "locales/fr.yaml": "x: w\npage.failed_after_effect: \"{tools} a été fait.\"\n"})
    loaded = chatrun.load_bot(path)
    for locale, expected in (("de", BUILTIN["de"]["failed_after_effect"].format(tools="book")),
                             ("fr", "book a été fait.")):
        fake.queue(call("book"), MODEL_DOWN)
        events = loaded.session(meta={"locale": locale}).chat("book it")
        assert [e.data for e in events if e.type == "Error"] == [expected]


def _failed_frame(client: TestClient, text: str, chat_id: str, extensions: bool) -> dict:
    with client.websocket_connect("/_chat/routes") as ws:
        ws.send_json({"type": "Connect", "chatId": chat_id, "extensions": extensions})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": chat_id, "data": {"userMessage": text}})
        return until_done(ws)[-1]


def test_the_extended_failed_frame_names_the_tools_that_ran_so_a_page_does_not_resend(write_bot, tmp_path, fake):
    """The extended dialect's Failed carries `ran` (the page keeps the message out of the box:
    sending it again would book again); a plain failure's has none, nor has the Quarkus
    dialect's (exactly Quarkus' frame: the reason alone)."""
    client, _ = _client(write_bot, tmp_path)
    with client:
        fake.queue(call("book"), call("look"), MODEL_DOWN)
        assert _failed_frame(client, "book it", "e1", True) == {
            "chatId": "e1", "type": "Failed", "data": "ServerError", "ran": ["book"]}
        fake.queue(call("look"), MODEL_DOWN)
        assert "ran" not in _failed_frame(client, "look", "e2", True)
        fake.queue(call("book"), MODEL_DOWN)
        assert _failed_frame(client, "book it", "q1", False) == {"chatId": "q1", "type": "Failed", "data": "ServerError"}
        assert client.get("/bots/booking/sessions/e1").json()["history"][0]["ran"] == ["book"]
