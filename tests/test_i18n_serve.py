"""The session's locale on `chatrun serve` (docs/i18n.md): a WebSocket Connect's `locale` (else
the socket's Accept-Language), the HTTP API's Accept-Language, and `/v1`'s `metadata.locale`
or Accept-Language through the real openai SDK; the fake model answers, the bakery bot speaks."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.server import create_app
from server_support import ThreadServer, app_for_testclient, call, until_done

BAKERY = Path(__file__).resolve().parents[1] / "bots" / "bakery"


@pytest.fixture
def bakery():
    return chatrun.load_bot(BAKERY)


@pytest.fixture
def client(fake, bakery, tmp_path):
    with TestClient(app_for_testclient([bakery], f"sqlite:///{tmp_path / 'chat.db'}")) as c:
        yield c


def _messages(frames: list[dict]) -> list[str]:
    return [f["data"] for f in frames if f.get("type") == "Message"]


def test_a_websocket_connect_names_the_locale_and_the_session_speaks_it(client, fake):
    fake.queue(call("add_loaves", count=2), {"text": "Gern."})
    with client.websocket_connect("/_chat/routes", headers={"Accept-Language": "en"}) as ws:
        ws.send_json({"type": "Connect", "chatId": "c1", "extensions": True, "locale": "de-AT"})
        until_done(ws)
        ws.send_json({"type": "ChatRouteMessage", "chatId": "c1", "data": {"userMessage": "Zwei Brote"}})
        frames = until_done(ws)
    assert _messages(frames)[0] == "Ihre Bestellung hat jetzt 2 Brote."
    choices = [f["data"] for f in frames if f.get("type") == "Choices"][-1]["choices"]
    assert [c["label"] for c in choices] == ["Brot bestellen", "Das ist alles"]
    assert client.get("/bots/bakery/sessions/c1").json()["locale"] == "de"


def test_without_a_connect_locale_the_sockets_accept_language_decides(client, fake):
    with client.websocket_connect("/_chat/routes", headers={"Accept-Language": "fr, de;q=0.8"}) as ws:
        ws.send_json({"type": "Connect", "chatId": "c2", "extensions": True})
        until_done(ws)
        ws.send_json({"type": "Connect", "chatId": "c3", "extensions": True, "locale": 7})
        frames = until_done(ws)
    assert client.get("/bots/bakery/sessions/c2").json()["locale"] == "de"
    assert any("Connect.locale must be a string" in str(f.get("data")) for f in frames)


def test_the_http_api_reads_accept_language(client, fake):
    made = client.post("/bots/bakery/sessions", json={}, headers={"Accept-Language": "de-DE,de;q=0.9"})
    assert made.json()["locale"] == "de"
    assert client.post("/bots/bakery/sessions", json={}).json()["locale"] == "en"


@pytest.mark.slow
def test_v1_metadata_locale_and_accept_language_through_the_openai_sdk(fake, bakery, tmp_path):
    with ThreadServer(create_app([bakery], f"sqlite:///{tmp_path / 'chat.db'}")) as server, \
            openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as sdk:
        fake.queue(call("add_loaves", count=1), {"text": "Gern."})
        reply = sdk.chat.completions.create(model="bakery", messages=[{"role": "user", "content": "Ein Brot"}],
                                            metadata={"locale": "de"})
        assert "Ihre Bestellung hat jetzt 1 Brot." in reply.choices[0].message.content
        # Accept-Language alone (no metadata) asks for the non-default locale: without it the
        # session would speak English, the default.
        fake.queue(call("add_loaves", count=3), {"text": "Gut."})
        reply = sdk.chat.completions.create(model="bakery", messages=[{"role": "user", "content": "Drei"}],
                                            extra_headers={"Accept-Language": "fr-FR, de-AT;q=0.8, en;q=0.5"})
        assert "Ihre Bestellung hat jetzt 3 Brote." in reply.choices[0].message.content
        fake.queue(call("add_loaves", count=2), {"text": "Fine."})
        reply = sdk.chat.completions.create(model="bakery", messages=[{"role": "user", "content": "Two"}])
        assert "Your order now has 2 loaves." in reply.choices[0].message.content  # no locale asked: the default
