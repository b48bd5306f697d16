"""An operator's takeover of a session pinned to an older version of its bot is checked against
that version's `operator:` roles, as decisions are, not the primary's (docs/format.md, "Operator
takeover"). One app serving versions 1 and 2 (whose handovers name different roles) on SQLite,
the fake OpenAI server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server_support import app_for_testclient as create_app
from versions_support import write_versions

VERSION = """\
name: desk
version: "{label}"
on_change: pin
model: {{provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}}
routes:
  main: {{default: true, system: Hi., tools: [to_human]}}
tools:
  to_human:
    description: Hand the user to a person
    action: {{operator: {{role: {role}}}}}
"""
AUTH = """
tokens:
  ana-token-123: {principal: ana}
  dee-token-123: {principal: dee, roles: [desk_v1]}
  flo-token-123: {principal: flo, roles: [floor_v2]}
"""
ANA = {"Authorization": "Bearer ana-token-123"}
DEE = {"Authorization": "Bearer dee-token-123"}  # version 1's handover role
FLO = {"Authorization": "Bearer flo-token-123"}  # version 2's (the primary's) handover role


@pytest.fixture
def replica(tmp_path: Path, fake) -> Callable[[], TestClient]:
    """Makes an app on the bot's folder and one store (a new one: a replica that loads the session)."""
    fake.responder = lambda body: {"text": f"Noted: {body['messages'][-1]['content']}"}
    root = write_versions(tmp_path / "desk", {label: VERSION.format(label=label, role=role)
                                              for label, role in (("1", "desk_v1"), ("2", "floor_v2"))})
    (tmp_path / "auth.yaml").write_text(AUTH)
    return lambda: TestClient(create_app(str(root), f"sqlite:///{tmp_path / 's.db'}", auth=str(tmp_path / "auth.yaml")))


def test_a_takeover_of_a_pinned_session_is_checked_against_its_own_versions_operator_roles(replica):
    """Dee holds the role version 1's handover names: she takes over a session pinned to version 1
    (before: 404, checked against version 2's roles), the session live on the replica and loaded
    from the store by another. Flo holds only version 2's: refused."""
    with replica() as app:
        for session in ("s", "t"):
            started = app.post("/bots/desk/sessions", json={"id": session}, headers={**ANA, "Chatrun-Bot-Version": "1"})
            assert started.status_code == 201, started.text
            said = app.post(f"/bots/desk/sessions/{session}/messages", json={"userMessage": "hello"}, headers=ANA)
            assert said.json()["ok"] is True, said.text
        refused = app.post("/bots/desk/sessions/s/takeover", json={}, headers=FLO)
        assert refused.status_code in (403, 404), refused.text
        taken = app.post("/bots/desk/sessions/s/takeover", json={}, headers=DEE)
        assert taken.status_code == 200 and taken.json()["ok"] is True, taken.text
        said = app.post("/bots/desk/sessions/s/operator/messages", json={"text": "Dee here."}, headers=DEE)
        assert said.status_code == 200 and said.json()["ok"] is True, said.text
        released = app.post("/bots/desk/sessions/s/release", json={}, headers=DEE)
        assert released.status_code == 200 and released.json()["ok"] is True, released.text
        assert app.get("/bots/desk/sessions/s", headers=ANA).json()["botVersion"] == started.json()["botVersion"]
    with replica() as other:  # a replica that has not loaded session t, nobody ever took
        taken = other.post("/bots/desk/sessions/t/takeover", json={}, headers=DEE)
        assert taken.status_code == 200 and taken.json()["ok"] is True, taken.text
    with replica() as another:
        assert another.post("/bots/desk/sessions/t/takeover", json={}, headers=FLO).status_code in (403, 404)
