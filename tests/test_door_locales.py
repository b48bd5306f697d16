"""Every door starts a session in the locale its client asks for. An AG-UI session speaks the locale its client asks for (docs/i18n.md, "The session's
locale"): the run's `forwardedProps.locale`, else the request's Accept-Language, as /v1's
`metadata.locale` and Accept-Language. It spoke the bot's first locale whatever the client
asked, so a German user read chatrun's texts (a failed turn's RUN_ERROR, a confirmation's Yes
and No) in English on AG-UI and in German on the page. Real parts: the app (TestClient), the
real model client against the fake OpenAI server, the protocol's own types reading the stream."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from chatrun.definition.page_texts import BUILTIN
from server_support import app_for_testclient

core = pytest.importorskip("ag_ui.core", reason="ag-ui-protocol is not installed (pip install -e '.[test]')")

BOT = """\
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
locales: [en, de]
routes:
  main:
    default: true
    system: "{{ t('prompt') }}"
"""

MODEL_DOWN = {"status": 400, "body": {"error": {"message": "the model is down"}}}


@pytest.fixture
def client(tmp_path, fake):
    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text("prompt: You sell tickets.\n")
    (tmp_path / "locales" / "de.yaml").write_text("prompt: Du verkaufst Karten.\n")
    with TestClient(app_for_testclient([str(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 's.db'}")) as c:
        yield c


def run(client, thread, forwarded=None, headers=None):
    body = {"threadId": thread, "runId": f"r-{thread}", "state": {}, "tools": [], "context": [],
            "forwardedProps": forwarded or {}, "messages": [{"id": f"u-{thread}", "role": "user", "content": "hallo"}]}
    response = client.post("/agui/shop", json=body, headers={"Accept": "text/event-stream", **(headers or {})})
    assert response.status_code == 200, response.text
    events = []
    for block in response.text.split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        if data:
            raw = json.loads("".join(data))
            events.append(getattr(core, "".join(p.title() for p in raw["type"].split("_")) + "Event").model_validate(raw))
    return events


@pytest.mark.parametrize(("thread", "forwarded", "headers", "locale"), [
    ("t-props", {"locale": "de"}, None, "de"),
    ("t-header", None, {"Accept-Language": "de-AT,de;q=0.9,en;q=0.5"}, "de"),
    ("t-both", {"locale": "en"}, {"Accept-Language": "de"}, "en"),  # the run's own word first
    ("t-none", None, None, "en"),  # the bot's first locale
])
def test_an_agui_session_speaks_the_locale_its_client_asks_for(client, fake, thread, forwarded, headers, locale):
    fake.queue(MODEL_DOWN)
    [error] = [e for e in run(client, thread, forwarded, headers) if e.type == core.EventType.RUN_ERROR]
    assert error.message == BUILTIN[locale]["model_failed"]
    assert client.get(f"/bots/shop/sessions/{thread}").json()["locale"] == locale
    assert fake.requests[-1]["messages"][0]["content"] == ("Du verkaufst Karten." if locale == "de" else "You sell tickets.")


def test_the_http_api_takes_the_locale_in_the_address_as_get_bot_does(client, fake):
    """`GET /bots/{bot}?locale=de` showed the bot in German while `POST /bots/{bot}/sessions?locale=de`
    started an English session (it read Accept-Language alone): both read `?locale=`, else
    Accept-Language (docs/i18n.md)."""
    assert client.get("/bots/shop?locale=de").json()["locale"] == "de"
    made = client.post("/bots/shop/sessions?locale=de", json={"id": "h-1"}, headers={"Accept-Language": "en"})
    assert made.status_code == 201 and made.json()["locale"] == "de"
    assert client.post("/bots/shop/sessions", json={"id": "h-2"}, headers={"Accept-Language": "de"}).json()["locale"] == "de"
    fake.queue(MODEL_DOWN)
    reply = client.post("/bots/shop/sessions/h-1/messages", json={"userMessage": "hallo"}).json()
    assert [e["data"] for e in reply["events"] if e["type"] == "Error"] == [BUILTIN["de"]["model_failed"]]
