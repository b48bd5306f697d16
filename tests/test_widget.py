"""The embeddable widget's server side (issue 35; docs/widget.md): `widget:` read and checked,
the config and frame refused to pages of undeclared origins (with the reason, logged), the frame
framable only by the declared origins, and the visitor's identity: a signed one (HMAC-SHA256)
becomes the principal, an anonymous visitor's token a principal of its own; bad, expired or
foreign tokens refused with the reason. The browser's side: tests/test_browser_widget.py."""

from __future__ import annotations

import html
import json
import logging
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import chatrun
from chatrun.cli import main
from chatrun.definition.config import WidgetConfig
from chatrun.definition.loader import check_bot
from chatrun.server import create_app
from chatrun.server.widget_identity import IdentityRefused, sign_identity, widget_principal
from server_support import app_for_testclient

KEY = "k" * 32
SITE = "https://shop.example"

BOT = """\
name: travel
description: Plans trips.
model: {name: gpt-4o-mini}
widget:
  origins: [https://shop.example, "http://127.0.0.1:9999"]
  title: Travel help
  greeting: Where to?
  color: "#0b5fff"
  position: left
  logo: logo.svg
routes:
  main:
    default: true
    system: "You plan trips for {{ principal.name if principal else 'someone' }}."
"""


@pytest.fixture
def bot_path(tmp_path):
    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "logo.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    return tmp_path / "bot.yaml"


@pytest.fixture
def client(bot_path, monkeypatch):
    monkeypatch.setenv("CHATRUN_WIDGET_SECRET", KEY)
    with TestClient(create_app([chatrun.load_bot(bot_path)]), base_url="http://127.0.0.1:8000") as c:
        yield c


def test_the_widget_block_is_read(bot_path):
    widget = chatrun.load_bot(bot_path).config.widget
    assert widget is not None
    assert widget.origins == ("https://shop.example", "http://127.0.0.1:9999")
    assert (widget.title, widget.greeting, widget.color, widget.position, widget.logo) == (
        "Travel help", "Where to?", "#0b5fff", "left", "logo.svg")
    assert (widget.identity, widget.secret_env) == ("either", "CHATRUN_WIDGET_SECRET")
    assert widget.allows("https://shop.example/") and not widget.allows("https://evil.example")


def test_origins_with_a_path_a_missing_logo_and_no_key_are_reported_at_their_line(tmp_path, monkeypatch):
    monkeypatch.delenv("CHATRUN_WIDGET_SECRET", raising=False)
    (tmp_path / "bot.yaml").write_text(BOT.replace("https://shop.example,", "https://shop.example/shop,")
                                       .replace("position: left", "identity: signed"))
    found = {d.message.split(":")[0]: d for d in check_bot(tmp_path / "bot.yaml")[1]}
    origin = found["`widget.origins`"]
    assert (origin.severity, origin.line) == ("error", 5)
    assert "write https://shop.example" in origin.message
    logo = found["`widget.logo`"]
    assert (logo.severity, logo.line) == ("error", 10) and "no file 'logo.svg'" in logo.message
    key = next(d for d in found.values() if "CHATRUN_WIDGET_SECRET" in d.message)
    assert (key.severity, key.line) == ("warning", 9) and "every visitor is refused" in key.message


def test_a_widget_colour_too_light_for_white_text_is_a_warning_at_its_line(tmp_path):
    (tmp_path / "logo.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    (tmp_path / "bot.yaml").write_text(BOT.replace('color: "#0b5fff"', 'color: "#ffd43b"'))
    found = [d for d in check_bot(tmp_path / "bot.yaml")[1] if d.message.startswith("`widget.color`")]
    assert [(d.severity, d.line) for d in found] == [("warning", 8)]
    assert "a contrast of 1.4:1, under the 4.5:1" in found[0].message and "#2563eb" in found[0].message
    (tmp_path / "bot.yaml").write_text(BOT)  # #0b5fff: 5.1:1
    assert not [d for d in check_bot(tmp_path / "bot.yaml")[1] if "widget.color" in d.message]


def test_a_right_to_left_bot_without_a_position_is_told_that_its_default_corner_is_now_the_lines_end(tmp_path):
    (tmp_path / "logo.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "ar.yaml").write_text("hello: مرحبا\n")
    arabic = BOT.replace("name: travel\n", "name: travel\nlocales: [ar]\n")

    def told(bot: str) -> list[tuple[str, int]]:
        (tmp_path / "bot.yaml").write_text(bot)
        return [(d.severity, d.line) for d in check_bot(tmp_path / "bot.yaml")[1] if "has no `position`" in d.message]

    assert told(arabic.replace("  position: left\n", "")) == [("warning", 5)]  # at `widget:`
    assert chatrun.load_bot(tmp_path / "bot.yaml").config.widget.position == "end"
    for side in ("end", "start", "right"):  # a named corner: nothing to tell, and the schema takes it
        assert told(arabic.replace("position: left", f"position: {side}")) == []
        assert chatrun.load_bot(tmp_path / "bot.yaml").config.widget.position == side
    assert told(BOT.replace("  position: left\n", "")) == []  # no right-to-left locale


def test_the_config_is_given_to_a_declared_origin_only(client, caplog):
    answer = client.get("/widget/travel/config", headers={"Origin": SITE})
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == SITE
    config = answer.json()
    assert (config["title"], config["color"], config["position"]) == ("Travel help", "#0b5fff", "left")
    assert config["frame"] == "http://127.0.0.1:8000/widget/travel/frame"
    assert client.get(config["logo"]).headers["content-type"] == "image/svg+xml"
    with caplog.at_level(logging.WARNING, logger="chatrun.widget"):
        refused = client.get("/widget/travel/config", headers={"Origin": "https://evil.example"})
    assert refused.status_code == 403
    assert "may not be embedded on https://evil.example: add it to `widget.origins`" in refused.json()["message"]
    assert "bot.yaml:4" in refused.json()["message"]
    assert "https://evil.example" in caplog.text


def test_the_frame_is_framable_only_by_the_declared_origins(client, caplog):
    frame = client.get("/widget/travel/frame", params={"origin": SITE}, headers={"Referer": SITE + "/cart"})
    assert frame.status_code == 200
    assert frame.headers["content-security-policy"] == "frame-ancestors https://shop.example http://127.0.0.1:9999"
    assert "widget-frame.js" in frame.text and "data-widget=" in frame.text
    # A page that claims a declared origin is judged by where it is (its Referer).
    with caplog.at_level(logging.WARNING, logger="chatrun.widget"):
        lying = client.get("/widget/travel/frame", params={"origin": SITE}, headers={"Referer": "https://evil.example/"})
    assert lying.status_code == 403 and "https://evil.example" in lying.text
    assert "widget frame refused" in caplog.text
    assert client.get("/widget/nobot/config").status_code == 404


def test_a_signed_identity_is_the_principal_and_owns_its_sessions(client, fake):
    token = sign_identity(KEY.encode(), "cust-42", "Ana Lima", int(time.time()) + 600)
    bearer = {"Authorization": f"Bearer {token}"}
    created = client.post("/bots/travel/sessions", headers=bearer, json={})
    assert created.status_code in (200, 201), created.text
    session = created.json()["id"]
    fake.queue({"text": "Hello Ana."})
    turn = client.post(f"/bots/travel/sessions/{session}/messages", headers=bearer, json={"message": "hi"})
    assert turn.status_code == 200, turn.text
    assert "You plan trips for widget:cust-42." in str(fake.requests[-1]["messages"][0])
    assert client.get(f"/bots/travel/sessions/{session}", headers=bearer).status_code == 200
    visitor = {"Authorization": "Bearer cwv." + "v" * 30}
    assert client.get(f"/bots/travel/sessions/{session}", headers=visitor).status_code == 404


@pytest.mark.parametrize(("token", "reason"), [
    (lambda: sign_identity(b"another-key-of-32-bytes-xxxxxxxxx", "cust-42", "Ana", int(time.time()) + 60),
     "signature does not match"),
    (lambda: sign_identity(KEY.encode(), "cust-42", "Ana", int(time.time()) - 60), "expired"),
    (lambda: "cwv.short", "at least 22 random characters"),
])
def test_bad_widget_tokens_are_refused_with_the_reason(client, token, reason):
    answer = client.post("/bots/travel/sessions", headers={"Authorization": f"Bearer {token()}"}, json={})
    assert answer.status_code == 401
    assert reason in answer.json()["message"]


@pytest.mark.parametrize("carried", ["authorization", "x-api-key", "query"])
def test_with_auth_off_a_widget_token_is_read_wherever_a_token_is_carried(client, carried):
    # Auth off: a request with no token is anonymous without reading one (server/plumbing.py's
    # carries_token); a token in any of its three places is still read and checked.
    token = "cwv.short"
    headers = {"Authorization": f"Bearer {token}"} if carried == "authorization" else \
        {"X-API-Key": token} if carried == "x-api-key" else {}
    url = "/bots/travel/sessions" + (f"?lang=en&token={token}" if carried == "query" else "")
    answer = client.post(url, headers=headers, json={})
    assert answer.status_code == 401
    assert "at least 22 random characters" in answer.json()["message"]
    assert client.post("/bots/travel/sessions", json={}).status_code == 201  # no token: anonymous


def test_a_widget_token_is_good_only_on_its_bots_paths(client):
    answer = client.get("/bots", headers={"Authorization": "Bearer cwv." + "v" * 30})
    assert answer.status_code == 401
    assert "only on its bot's own paths" in answer.json()["message"]


def test_a_bots_websocket_path_serves_that_bot_only(bot_path, tmp_path, monkeypatch, fake):
    # A Connect's `bot` picked any bot on /bots/travel/_chat/routes too: a visitor's token, checked
    # for travel's widget at the upgrade, opened a session on a bot without `widget:` (auth on).
    monkeypatch.setenv("CHATRUN_WIDGET_SECRET", KEY)
    (tmp_path / "auth.yaml").write_text("tokens:\n  staff-token-123: {principal: staff}\n")
    (tmp_path / "internal.yaml").write_text(BOT.replace("name: travel", "name: internal"))
    app = app_for_testclient([chatrun.load_bot(bot_path), chatrun.load_bot(tmp_path / "internal.yaml")],
                             auth=str(tmp_path / "auth.yaml"))
    visitor = "cwv." + "v" * 30
    with TestClient(app) as client:
        with client.websocket_connect(f"/bots/travel/_chat/routes?token={visitor}") as ws:
            ws.send_json({"type": "Connect", "chatId": "v1", "extensions": True, "bot": "internal"})
            error = ws.receive_json()
            assert error["type"] == "Error" and "serves bot 'travel' only" in error["data"], error
            assert ws.receive_json()["data"] == "BotNotFound"
            ws.send_json({"type": "Connect", "chatId": "v2", "extensions": True, "bot": "travel"})
            assert ws.receive_json()["type"] == "Completed"  # its own bot, named or not
        staff = {"Authorization": "Bearer staff-token-123"}
        assert client.get("/bots/internal/sessions/v1", headers=staff).status_code == 404
        assert client.get("/bots/travel/sessions/v1", headers=staff).status_code == 404
    assert fake.requests == []


def test_the_backend_snippet_in_the_docs_signs_what_the_server_accepts(monkeypatch):
    page = (Path(__file__).resolve().parents[1] / "docs" / "widget.md").read_text()
    snippet = page.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("CHATRUN_WIDGET_SECRET", KEY)
    scope: dict[str, object] = {}
    exec(snippet, scope)  # noqa: S102 - the docs' own example, run as printed
    principal = widget_principal("travel", WidgetConfig(origins=(SITE,)), str(scope["token"]))
    assert (principal.name, dict(principal.claims)) == ("widget:cust-42", {"display_name": "Ana Lima", "sub": "cust-42"})
    with pytest.raises(IdentityRefused, match="signature does not match"):
        monkeypatch.setenv("CHATRUN_WIDGET_SECRET", "another-key-0123456789")
        widget_principal("travel", WidgetConfig(origins=(SITE,)), str(scope["token"]))


def test_an_auth_file_token_shaped_like_a_widget_token_is_refused_at_start():
    from chatrun.errors import ChatrunError
    from chatrun.server.auth import Auth

    with pytest.raises(ChatrunError, match="may not start with cw1. or cwv.: those are the widget's tokens"):
        Auth.from_mapping({"tokens": {"cwv.0123456789abcdef": {"principal": "ana"}}})


def test_a_signed_only_widget_shows_its_panel_to_signed_identities_only(bot_path, monkeypatch):
    monkeypatch.setenv("CHATRUN_WIDGET_SECRET", KEY)
    bot_path.write_text(BOT.replace("position: left", "identity: signed"))
    with TestClient(create_app([chatrun.load_bot(bot_path)]), base_url="http://127.0.0.1:8000") as client:
        frame = "/widget/travel/frame"
        anonymous = client.get(frame, params={"origin": SITE, "token": "cwv." + "v" * 30})
        assert anonymous.status_code == 403 and "for signed-in users: sign in on this site" in anonymous.text
        expired = sign_identity(KEY.encode(), "cust-42", "Ana", int(time.time()) - 5)
        assert "expired" in client.get(frame, params={"origin": SITE, "token": expired}).text
        signed = sign_identity(KEY.encode(), "cust-42", "Ana", int(time.time()) + 60)
        assert client.get(frame, params={"origin": SITE, "token": signed}).status_code == 200
        visitor = client.post("/bots/travel/sessions", headers={"Authorization": "Bearer cwv." + "v" * 30}, json={})
        assert visitor.status_code == 401 and "takes signed identities only" in visitor.json()["message"]


def test_an_anonymous_only_widget_never_takes_a_signed_identity(bot_path, monkeypatch):
    monkeypatch.setenv("CHATRUN_WIDGET_SECRET", KEY)
    bot_path.write_text(BOT.replace("position: left", "identity: anonymous"))
    with TestClient(create_app([chatrun.load_bot(bot_path)]), base_url="http://127.0.0.1:8000") as client:
        signed = sign_identity(KEY.encode(), "cust-42", "Ana", int(time.time()) + 60)  # good, and still refused
        refused = client.post("/bots/travel/sessions", headers={"Authorization": f"Bearer {signed}"}, json={})
        assert refused.status_code == 401 and "takes anonymous visitors only" in refused.json()["message"]
        visitor = client.post("/bots/travel/sessions", headers={"Authorization": "Bearer cwv." + "v" * 30}, json={})
        assert visitor.status_code == 201, visitor.text


def test_a_plain_widget_greeting_in_a_bot_with_locales_is_warned_of_and_a_translated_one_follows_the_visitor(tmp_path):
    """`widget.greeting` follows the rule of every text a bot with `locales:` shows (a channel's
    greeting, a route's `title:`): `chatrun validate` warns of a plain one at its line (it was shown
    as written in every locale, unwarned), and one written `{{ t('key') }}` is the visitor's
    language in the config and in the panel (the frame's data)."""
    (tmp_path / "logo.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text("greeting: Where to?\n")
    (tmp_path / "locales" / "de.yaml").write_text("greeting: Wohin soll es gehen?\n")
    bilingual = BOT.replace("name: travel\n", "name: travel\nlocales: [en, de]\n")
    path = tmp_path / "bot.yaml"
    path.write_text(bilingual)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert f"{path}:8:3: warning: `widget.greeting` is sent to the user untranslated: the bot declares " \
           "`locales:`, so write it as `{{ t('key') }}` with the key in each catalog (docs/i18n.md)" in result.output
    path.write_text(bilingual.replace("greeting: Where to?", "greeting: \"{{ t('greeting') }}\""))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0 and "widget.greeting" not in result.output and "t('greeting')" not in result.output
    with TestClient(create_app([chatrun.load_bot(path)]), base_url="http://127.0.0.1:8000") as client:
        for language, greeting in (("de-DE,de;q=0.9", "Wohin soll es gehen?"), ("en-US", "Where to?")):
            config = client.get("/widget/travel/config", headers={"Origin": SITE, "Accept-Language": language})
            assert config.json()["greeting"] == greeting
            frame = client.get("/widget/travel/frame", params={"origin": SITE},
                               headers={"Referer": SITE + "/", "Accept-Language": language})
            assert html.escape(json.dumps(greeting), quote=True) in frame.text


def test_a_plain_widget_title_in_a_bot_with_locales_is_warned_of_and_a_translated_one_follows_the_visitor(tmp_path):
    """`widget.title` (the panel's header, the launcher's label) follows the greeting's rule: in a
    bot with `locales:` `chatrun validate` warns of a plain one at its line (it was shown as written
    in every locale, unwarned), and one written `{{ t('key') }}` is the visitor's language in the
    config and in the panel; without a title, the bot's translated `description` is shown rendered
    (it was shown as its template source)."""
    (tmp_path / "logo.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    (tmp_path / "locales").mkdir()
    (tmp_path / "locales" / "en.yaml").write_text("title: Travel help\nabout: Plans trips.\ngreeting: Where to?\n")
    (tmp_path / "locales" / "de.yaml").write_text("title: Reisehilfe\nabout: Plant Reisen.\ngreeting: Wohin?\n")
    bilingual = (BOT.replace("name: travel\n", "name: travel\nlocales: [en, de]\n")
                 .replace("description: Plans trips.", "description: \"{{ t('about') }}\"")
                 .replace("greeting: Where to?", "greeting: \"{{ t('greeting') }}\""))
    path = tmp_path / "bot.yaml"
    path.write_text(bilingual)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert f"{path}:7:3: warning: `widget.title` is sent to the user untranslated: the bot declares " \
           "`locales:`, so write it as `{{ t('key') }}` with the key in each catalog (docs/i18n.md)" in result.output
    path.write_text(bilingual.replace("title: Travel help", "title: \"{{ t('title') }}\""))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    untitled = bilingual.replace("  title: Travel help\n", "")
    for text, titles in ((path.read_text(), ("Reisehilfe", "Travel help")), (untitled, ("Plant Reisen.", "Plans trips."))):
        path.write_text(text)
        with TestClient(create_app([chatrun.load_bot(path)]), base_url="http://127.0.0.1:8000") as client:
            for language, title in zip(("de-DE,de;q=0.9", "en-US"), titles, strict=True):
                config = client.get("/widget/travel/config", headers={"Origin": SITE, "Accept-Language": language})
                assert config.json()["title"] == title
                frame = client.get("/widget/travel/frame", params={"origin": SITE},
                                   headers={"Referer": SITE + "/", "Accept-Language": language})
                assert html.escape(json.dumps(title), quote=True) in frame.text
