"""A version move that strands an open item (issue: found by the scale-out hunt): a session
waits on an approval on a route the next version lacks; a replica serving that version moves
the session. The decision must not run a tool the version lacks (it failed with an internal
KeyError at every try, and the item waited forever): the item is withdrawn, the decision is
told NotPending, the conversation goes on. Real `chatrun serve` processes on one SQLite file,
one after the other (the old replica killed first), the fake OpenAI server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatrun.testing.fake_openai import FakeOpenAI
from redis_support import Replica
from versions_support import write_versions

pytestmark = pytest.mark.subprocess

V1 = """\
name: refunds
version: "1"
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {n: 0}
routes:
  main: {default: true, system: Hi., tools: [to_refund]}
  refunding: {system: Refund orders., tools: [refund]}
tools:
  to_refund:
    description: Go to refunds
    action: {push: refunding, execute: true, immediate: true}
  refund:
    description: Refund an order
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    action: {set: {state.n: "{{ state.n + 1 }}"}, message: refunded}
    approval: {by: [supervisor], timeout: 1d}
"""
V2 = """\
name: refunds
version: "2"
on_change: restart_scope
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {n: 0}
routes:
  main: {default: true, system: Hi again.}
"""
V2_RENAMED = """\
name: refunds
version: "2"
on_change: migrate
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {n: 0}
migrations:
  - from: "1"
    routes: {refunding: refunds}
    tools: {refund: give_refund}
routes:
  main: {default: true, system: Hi., tools: [to_refund]}
  refunds: {system: Refund orders., tools: [give_refund]}
tools:
  to_refund:
    description: Go to refunds
    action: {push: refunds, execute: true, immediate: true}
  give_refund:
    description: Refund an order
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    action: {set: {state.n: "{{ state.n + 1 }}"}, message: refunded}
    approval: {by: [supervisor], timeout: 1d}
"""
AUTH = """
tokens:
  ana-token-123: {principal: ana}
  ops-token-123: {principal: ops, roles: [operators, supervisor]}
  sue-token-123: {principal: sue, roles: [supervisor]}
"""
ANA, OPS = {"Authorization": "Bearer ana-token-123"}, {"Authorization": "Bearer ops-token-123"}
SUE = {"Authorization": "Bearer sue-token-123"}  # a decider of version 1's approvals, not an operator


def responder(body: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return {"text": "Done."}
    if "Refund orders" in messages[0]["content"]:
        return {"tool_calls": [{"name": "refund", "arguments": {"order": "A7"}}]}
    if "to_refund" in json.dumps(body.get("tools") or []):
        return {"tool_calls": [{"name": "to_refund", "arguments": {}}]}
    return {"text": f"Noted: {messages[-1]['content']}"}


def asked_on_version_1(tmp_path: Path, v2: str, fake: FakeOpenAI, http: httpx.Client) -> tuple[str, str]:
    """The session `s` waiting on approval p1 (on version 1, a replica that serves only it, then
    killed); the (store, auth) a replica serving versions 1 and `v2` then opens it with."""
    write_versions(tmp_path / "old", {"1": V1})
    write_versions(tmp_path / "new", {"1": V1, "2": v2})
    (tmp_path / "auth.yaml").write_text(AUTH)
    store, auth = f"sqlite:///{tmp_path / 's.db'}", str(tmp_path / "auth.yaml")
    old = Replica(str(tmp_path / "old"), store, fake.base_url, "--auth", auth).start()
    try:
        assert http.post(f"{old.url}/bots/refunds/sessions", json={"id": "s"}, headers=ANA).status_code == 201
        asked = http.post(f"{old.url}/bots/refunds/sessions/s/messages", json={"userMessage": "refund A7"},
                          headers=ANA).json()
        assert [e["data"]["id"] for e in asked["events"] if e["type"] == "Pending"] == ["p1"]
    finally:
        old.kill()
    return store, auth


def test_a_decision_on_an_item_a_version_move_stranded_is_not_pending_and_runs_nothing(tmp_path: Path):
    with FakeOpenAI() as fake, httpx.Client(timeout=60) as http:
        fake.responder = responder
        store, auth = asked_on_version_1(tmp_path, V2, fake, http)
        new = Replica(str(tmp_path / "new"), store, fake.base_url, "--auth", auth).start()
        try:
            decided = http.post(f"{new.url}/bots/refunds/sessions/s/pending/p1", json={"decision": "approve"},
                                headers=OPS)
            assert decided.status_code == 409, decided.text  # before: 200, ok false, "internal error ... KeyError"
            assert decided.json()["error"] == "NotPending" and "withdrawn" in decided.json()["message"]
            said = http.post(f"{new.url}/bots/refunds/sessions/s/messages", json={"userMessage": "hello"},
                             headers=ANA).json()
            assert said["ok"] is True and said["route"] == "main", said
            session = http.get(f"{new.url}/bots/refunds/sessions/s", headers=ANA).json()
            assert session["state"]["n"] == 0  # the refund never ran
            assert http.get(f"{new.url}/bots/refunds/sessions/s/pending", headers=ANA).json()["pending"] == []
            [moved] = [h["moved"] for h in session["history"] if h.get("moved")]
            assert any("p1" in note and "withdrawn" in note for note in moved["notes"]), moved
        finally:
            new.kill()


def test_an_item_whose_route_and_tool_a_migration_renames_is_decided_on_the_new_names(tmp_path: Path):
    with FakeOpenAI() as fake, httpx.Client(timeout=60) as http:
        fake.responder = responder
        store, auth = asked_on_version_1(tmp_path, V2_RENAMED, fake, http)
        new = Replica(str(tmp_path / "new"), store, fake.base_url, "--auth", auth).start()
        try:
            decided = http.post(f"{new.url}/bots/refunds/sessions/s/pending/p1", json={"decision": "approve"},
                                headers=OPS)
            assert decided.status_code == 200 and decided.json()["ok"] is True, decided.text
            assert [e["data"]["outcome"] for e in decided.json()["events"] if e["type"] == "Resolved"] == ["approved"]
            session = http.get(f"{new.url}/bots/refunds/sessions/s", headers=ANA).json()
            assert session["state"]["n"] == 1 and session["route"] == "refunds"  # give_refund ran, once
        finally:
            new.kill()


def test_a_decider_the_new_version_no_longer_names_is_told_withdrawn_not_not_found(tmp_path: Path):
    """The replica that moved the session (version 2 names no decider) answered the supervisor's
    late decision 404, as for a session they never could reach, where a replica still on version
    1 answered 409 withdrawn. Every replica holding version 1 now answers 409."""
    with FakeOpenAI() as fake, httpx.Client(timeout=60) as http:
        fake.responder = responder
        store, auth = asked_on_version_1(tmp_path, V2, fake, http)
        new = Replica(str(tmp_path / "new"), store, fake.base_url, "--auth", auth).start()
        try:
            said = http.post(f"{new.url}/bots/refunds/sessions/s/messages", json={"userMessage": "hello"},
                             headers=ANA).json()
            assert said["ok"] is True and said["route"] == "main", said  # moved: p1 withdrawn
            decided = http.post(f"{new.url}/bots/refunds/sessions/s/pending/p1", json={"decision": "approve"},
                                headers=SUE)
            assert decided.status_code == 409, decided.text
            assert decided.json()["error"] == "NotPending" and "withdrawn" in decided.json()["message"]
            # A decider reaches the pending items, not the session (the owner's alone).
            assert http.get(f"{new.url}/bots/refunds/sessions/s", headers=SUE).status_code == 404
        finally:
            new.kill()
