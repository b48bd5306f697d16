"""A widget's signed identity is the principal `widget:ID`, never another door's principal: a
host site whose user id is `olga` or `telegram:4242` does not reach the auth file's olga's
sessions or user memory, nor the roles `principals:` gives a channel's user; `principals:` gives
roles to `widget:ID` itself. And what happens to what a widget visitor had under the old name
(the bare id): not reached any more, erased with the bare name's erasure. A real app on a SQLite
file, the real `openai` client against the fake OpenAI server."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

from chatrun.errors import ChatrunError
from chatrun.server.auth import Auth
from chatrun.server.widget_identity import sign_identity
from server_support import app_for_testclient

KEY = "k" * 32
BOT = """
name: concierge
format: 3
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
widget: {origins: ["https://shop.example"]}
user_memory: {facts: [seat]}
routes:
  desk:
    default: true
    system: "For {{ principal.name }} (sub {{ principal.sub or '-' }}), roles [{{ principal.roles | join(',') }}]."
    context: "{% if user_memory.seat %}Prefers a {{ user_memory.seat }} seat.{% else %}Nothing known.{% endif %}"
    tools: [note_seat]
tools:
  note_seat:
    description: Remember the seat the user prefers
    parameters: {type: object, properties: {seat: {type: string}}, required: [seat]}
    action:
      remember: {seat: "{{ args.seat }}"}
      reply: Noted.
"""
AUTH = {
    "tokens": {"olga-token-123": {"principal": "olga", "roles": ["operators"]},
               "cust-token-123": {"principal": "cust-42"},  # stands for a widget visitor of before
               "dpo-token-1234": {"principal": "dpo", "roles": ["privacy"]}},
    "principals": {"telegram:4242": {"roles": ["approvers"]}, "widget:cust-42": {"roles": ["vip"]}},
}
OLGA, OLD_CUST, DPO = ({"Authorization": f"Bearer {t}"} for t in ("olga-token-123", "cust-token-123", "dpo-token-1234"))


def widget(sub: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {sign_identity(KEY.encode(), sub, sub.title(), int(time.time()) + 600)}"}


@pytest.fixture
def client(fake, write_bot, tmp_path, monkeypatch):
    monkeypatch.setenv("CHATRUN_WIDGET_SECRET", KEY)
    app = app_for_testclient([str(write_bot(BOT))], f"sqlite:///{tmp_path / 's.db'}", auth=Auth.from_mapping(AUTH))
    with TestClient(app) as c:
        yield c


def chat(client, fake, who: dict[str, str], sid: str, text: str, seat: str | None = None) -> list[str]:
    """A new session `sid` of `who` and one message; the system messages the model received."""
    assert client.post("/bots/concierge/sessions", json={"id": sid}, headers=who).status_code == 201
    fake.queue(*([{"tool_calls": [{"name": "note_seat", "arguments": {"seat": seat}}]}] if seat else []),
               {"text": "Hello."})
    answer = client.post(f"/bots/concierge/sessions/{sid}/messages", json={"userMessage": text}, headers=who)
    assert answer.status_code == 200, answer.text
    return [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "system"]


def test_a_host_sites_user_id_is_never_another_doors_principal(client, fake):
    chat(client, fake, OLGA, "o1", "Window, please", seat="window")
    assert client.get("/bots/concierge/sessions/o1", headers=widget("olga")).status_code == 404
    assert chat(client, fake, widget("olga"), "w1", "Hi") == ["For widget:olga (sub olga), roles [].", "Nothing known."]
    mine = client.get("/bots/concierge/user-memory", headers=widget("olga")).json()
    assert (mine["principal"], mine["facts"]) == ("widget:olga", [])
    assert client.get("/bots/concierge/sessions/w1", headers=OLGA).status_code == 404  # nor the other way round
    assert [f["value"] for f in client.get("/bots/concierge/user-memory", headers=OLGA).json()["facts"]] == ["window"]
    # A channel user's roles (principals: telegram:4242) are not a widget visitor's of that id ...
    said = chat(client, fake, widget("telegram:4242"), "w2", "Hi")
    assert said[0] == "For widget:telegram:4242 (sub telegram:4242), roles []."
    # ... and `principals:` names a widget visitor by its own name.
    assert chat(client, fake, widget("cust-42"), "w3", "Hi")[0] == "For widget:cust-42 (sub cust-42), roles [vip]."


def test_what_a_visitor_had_under_the_bare_id_is_not_reached_and_goes_with_its_erasure(client, fake):
    # Before this change a widget visitor `cust-42` was the principal `cust-42`: its session and
    # user memory are stored under that name (here made through a token of that name).
    chat(client, fake, OLD_CUST, "old", "Aisle, please", seat="aisle")
    assert client.get("/bots/concierge/sessions/old", headers=widget("cust-42")).status_code == 404
    assert chat(client, fake, widget("cust-42"), "new", "Hi again")[1] == "Nothing known."  # a new start
    # What the docs say to do: erase the bare name (DELETE /principals/ID or chatrun purge --principal ID).
    erased = client.delete("/principals/cust-42", headers=DPO).json()["erased"]
    assert erased["sessions"] == 1 and erased["user_memory"] == 1
    assert client.get("/bots/concierge/sessions/new", headers=widget("cust-42")).status_code == 200  # untouched


def test_no_token_of_the_auth_file_is_named_as_a_widget_identity():
    with pytest.raises(ChatrunError, match="may not be named widget:…: those are the widget's signed identities"):
        Auth.from_mapping({"tokens": {"some-token-123": {"principal": "widget:cust-42"}}})
