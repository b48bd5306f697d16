"""A call of an `effect: once` tool done under one version of a bot, made again after a
migration renamed the tool, its arguments or a state path it `requires` (docs/versions.md, "What
a live session does"): it is the call done, answered from the record, and not run again. It ran
twice before: the record keeps hashed identities, and the old version's hash never matched the
new version's call. Real apps on a real SQLite file, the fake OpenAI server."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from chatrun import InMemoryStore, SQLiteStore, load_bot
from chatrun.server.openai_api import OpenAIOptions
from server_support import app_for_testclient as create_app
from versions_support import started_on_version_1, write_versions
from webhook_support import Receiver

V1 = """\
name: desk
version: "1"
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {refunded: 0, customer: ana}
routes:
  main: {default: true, system: Refund orders., tools: [refund]}
tools:
  refund:
    description: Refund an order
    effect: once
    requires: [state.customer]
    parameters: {type: object, properties: {order: {type: string}, amount: {type: number}}, required: [order, amount]}
    action: {set: {state.refunded: "{{ state.refunded + args.amount }}"}, reply: "Refunded {{ args.amount }} on {{ args.order }}"}
"""
V2 = """\
name: desk
version: "2"
on_change: migrate
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {refunded: 0, account: {customer: ana}}
migrations:
  - from: "1"
    tools: {refund: pay_back}
    arguments: {pay_back: {rename: {order: order_id}}}
    state: {rename: {customer: account.customer}}
routes:
  main: {default: true, system: Refund orders., tools: [pay_back]}
tools:
  pay_back:
    description: Refund an order
    effect: once
    requires: [state.account.customer]
    parameters: {type: object, properties: {order_id: {type: string}, amount: {type: number}}, required: [order_id, amount]}
    action: {set: {state.refunded: "{{ state.refunded + args.amount }}"}, reply: "Refunded {{ args.amount }} on {{ args.order_id }}"}
"""
DONE = ("Already done earlier in this conversation (turn 1): Refunded 30 on A1. "
        "It was not run again; do not call it again for the same thing.")


def responder(call: dict):
    """The model calls `call` once a turn, then answers."""
    def answer(body: dict) -> dict:
        if body["messages"][-1]["role"] == "tool":
            return {"text": "Done."}
        return {"tool_calls": [call]}
    return answer


def tool_results(fake) -> list[str]:
    return [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]


def test_a_once_call_done_under_version_1_is_not_run_again_after_a_migration_renamed_it(fake, tmp_path):
    root = write_versions(tmp_path / "desk", {"1": V1, "2": V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder({"name": "refund", "arguments": {"order": "A1", "amount": 30}})
    started_on_version_1(root, "desk", store, "refund 30 on A1")
    fake.responder = responder({"name": "pay_back", "arguments": {"order_id": "A1", "amount": 30}})
    with TestClient(create_app(str(root), store)) as both:
        said = both.post("/bots/desk/sessions/s/messages", json={"userMessage": "did it work? refund it please"})
        assert said.status_code == 200 and said.json()["ok"], said.text
        session = both.get("/bots/desk/sessions/s").json()
    assert tool_results(fake)[-1] == DONE
    assert session["state"]["refunded"] == 30 and session["state"]["account"] == {"customer": "ana"}
    moved = [h["moved"] for h in session["history"] if h.get("moved")]
    assert len(moved) == 1 and any("done once" in note for note in moved[0]["notes"]), moved


def test_the_same_refund_for_another_order_after_the_migration_still_runs(fake, tmp_path):
    """What the record matches is the same call: another order is another refund."""
    root = write_versions(tmp_path / "desk", {"1": V1, "2": V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder({"name": "refund", "arguments": {"order": "A1", "amount": 30}})
    started_on_version_1(root, "desk", store, "refund 30 on A1")
    fake.responder = responder({"name": "pay_back", "arguments": {"order_id": "B2", "amount": 30}})
    with TestClient(create_app(str(root), store)) as both:
        assert both.post("/bots/desk/sessions/s/messages", json={"userMessage": "and B2"}).json()["ok"]
        state = both.get("/bots/desk/sessions/s").json()["state"]
    assert tool_results(fake)[-1] == "Refunded 30 on B2" and state["refunded"] == 60


def sdk(http: TestClient) -> openai.OpenAI:
    """The real `openai` client, sending to the app `http` serves."""
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", max_retries=0, http_client=http)


def chat(client: openai.OpenAI, messages: list[dict]) -> dict:
    """One /v1 chat completion: its `chatrun` field (session, how it was found)."""
    return client.chat.completions.create(model="desk", messages=messages).model_extra["chatrun"]


def test_a_regenerated_answer_forked_from_before_a_migration_does_not_run_the_refund_again(fake, tmp_path):
    """A /v1 conversation refunds under version 1, is moved to version 2 by its next turn, then the
    user regenerates the refund's answer: the fork is of the state before the refund (version 1's),
    moves to version 2 as it opens, and carries what its original did since, under version 2's
    names: the model's `pay_back` of the same order is the refund done, not run again."""
    root = write_versions(tmp_path / "desk", {"1": V1, "2": V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.queue({"text": "Hello."}, {"tool_calls": [{"name": "refund", "arguments": {"order": "A1", "amount": 30}}]},
               {"text": "Refunded."})
    asked = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "refund 30 on A1"}]
    with TestClient(create_app(str(root / "versions" / "1"), store)) as v1, sdk(v1) as client:
        chat(client, asked[:1])
        original = chat(client, asked)
    with TestClient(create_app(str(root), store)) as both, sdk(both) as client:
        fake.queue({"text": "You are welcome."})
        went_on = chat(client, [*asked, {"role": "assistant", "content": "Refunded."},
                                 {"role": "user", "content": "thanks"}])
        assert went_on["session"] == original["session"] and went_on["how"] == "continued", went_on
        assert both.get(f"/bots/desk/sessions/{original['session']}").json()["state"]["refunded"] == 30
        fake.queue({"tool_calls": [{"name": "pay_back", "arguments": {"order_id": "A1", "amount": 30}}]},
                   {"text": "It was refunded already."})
        forked = chat(client, asked)
        assert forked["how"] == "forked", forked
        assert tool_results(fake)[-1] == DONE.replace("(turn 1)", "(turn 2)")  # the original's turn 2
        state = both.get(f"/bots/desk/sessions/{forked['session']}").json()["state"]
    assert state["refunded"] == 0  # the fork's state is of before the refund, and the call did not run in it


ORDER_V1 = """\
name: desk
version: "1"
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
routes:
  main: {default: true, system: Refund orders., tools: [refund]}
tools:
  refund:
    description: Refund an order (the shop's refund service)
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    http: {url: "RECEIVER/refunds", method: POST, json: {order: "{{ args.order }}"}}
"""
ORDER_V2 = """\
name: desk
version: "2"
on_change: migrate
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
migrations:
  - from: "1"
    tools: {refund: pay_back}
    arguments: {pay_back: {rename: {order: order_id}, default: {reason: none given}}}
routes:
  main: {default: true, system: Refund orders., tools: [pay_back]}
tools:
  pay_back:
    description: Refund an order (the shop's refund service)
    parameters: {type: object, properties: {order_id: {type: string}, reason: {type: string}}, required: [order_id]}
    http: {url: "RECEIVER/refunds", method: POST, json: {order: "{{ args.order_id }}"}}
"""


@pytest.mark.slow  # the shop's refund service: a server on a loopback port
def test_a_retry_after_the_deploy_of_a_version_that_renames_the_tool_sends_the_same_idempotency_key(fake, tmp_path):
    """The first attempt of a /v1 request runs under version 1: the refund is POSTed, then the
    model fails and the turn is rolled back (HTTP 500). Version 2, which renames the tool and its
    argument, is deployed; the client's retry (its Idempotency-Key) moves the session in the turn it
    runs again, and the model makes the same refund under the new names: it must carry the same
    Idempotency-Key, or the service that dedupes by it refunds twice. It carried another."""
    with Receiver() as receiver:
        root = write_versions(tmp_path / "desk", {label: text.replace("RECEIVER", receiver.url)
                                                  for label, text in (("1", ORDER_V1), ("2", ORDER_V2))})
        store = f"sqlite:///{tmp_path / 'sessions.db'}"
        asked, key = [{"role": "user", "content": "refund A1"}], {"Idempotency-Key": "refund-A1"}
        fake.queue({"tool_calls": [{"name": "refund", "arguments": {"order": "A1"}}]},
                   {"status": 400, "body": "the model broke"})
        with TestClient(create_app(str(root / "versions" / "1"), store)) as v1, sdk(v1) as client:
            with pytest.raises(openai.InternalServerError):
                client.chat.completions.create(model="desk", messages=asked, extra_headers=key)
        fake.queue({"tool_calls": [{"name": "pay_back", "arguments": {"order_id": "A1", "reason": "none given"}}]},
                   {"text": "Refunded."})
        with TestClient(create_app(str(root), store)) as both, sdk(both) as client:
            reply = client.chat.completions.create(model="desk", messages=asked, extra_headers=key)
            session = both.get(f"/bots/desk/sessions/{reply.model_extra['chatrun']['session']}").json()
    assert reply.choices[0].message.content == "Refunded."
    assert session["history"][-1]["moved"]["to"] == session["botVersion"]  # the retry's turn moved it
    keys = [d.headers["idempotency-key"] for d in receiver.seen()]
    assert len(keys) == 2 and keys[0] == keys[1], keys


def test_a_chats_first_message_sent_again_after_a_deploy_does_not_run_the_refund_again(fake, tmp_path):
    """A front end's chat (its chat id header) refunds in its first answer under version 1; after
    version 2 is deployed, the user sends the first message again in that chat: a new session, on
    version 2, takes up the chat's start and the calls done there, under version 2's names."""
    root = write_versions(tmp_path / "desk", {"1": V1, "2": V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    asked, chat_id = [{"role": "user", "content": "refund 30 on A1"}], {"X-Chat-Id": "chat-1"}
    options = {"openai": OpenAIOptions(session_headers=("X-Chat-Id",))}
    fake.queue({"tool_calls": [{"name": "refund", "arguments": {"order": "A1", "amount": 30}}]}, {"text": "Refunded."})
    with TestClient(create_app(str(root / "versions" / "1"), store, **options)) as v1, sdk(v1) as client:
        client.chat.completions.create(model="desk", messages=asked, extra_headers=chat_id)
    fake.queue({"tool_calls": [{"name": "pay_back", "arguments": {"order_id": "A1", "amount": 30}}]},
               {"text": "It was refunded already."})
    with TestClient(create_app(str(root), store, **options)) as both, sdk(both) as client:
        again = client.chat.completions.create(model="desk", messages=asked, extra_headers=chat_id)
        assert again.model_extra["chatrun"]["how"] == "forked", again.model_extra
        state = both.get(f"/bots/desk/sessions/{again.model_extra['chatrun']['session']}").json()["state"]
    assert tool_results(fake)[-1] == DONE
    assert state["refunded"] == 0  # a new session: the refund was not run in it


@pytest.mark.slow  # the shop's refund service: a server on a loopback port
def test_a_chats_first_message_sent_again_after_a_deploy_sends_the_first_answers_idempotency_key(fake, tmp_path):
    """The same, for a call that runs again (`effect: idempotent`): the chat's first session POSTed
    `refund(order)` under version 1; the first message sent again after the deploy makes
    `pay_back(order_id)` in a new session on version 2, keyed as the chat's (docs/tools.md,
    "Idempotency keys"): the same key, so the shop that dedupes by it refunds once."""
    options = {"openai": OpenAIOptions(session_headers=("X-Chat-Id",))}
    asked, chat_id = [{"role": "user", "content": "refund A1"}], {"X-Chat-Id": "chat-1"}
    with Receiver() as receiver:
        texts = {label: text.replace("RECEIVER", receiver.url).replace("    http:", "    effect: idempotent\n    http:")
                 for label, text in (("1", ORDER_V1), ("2", ORDER_V2))}
        root = write_versions(tmp_path / "desk", texts)
        store = f"sqlite:///{tmp_path / 'sessions.db'}"
        fake.queue({"tool_calls": [{"name": "refund", "arguments": {"order": "A1"}}]}, {"text": "Refunded."})
        with TestClient(create_app(str(root / "versions" / "1"), store, **options)) as v1, sdk(v1) as client:
            client.chat.completions.create(model="desk", messages=asked, extra_headers=chat_id)
        fake.queue({"tool_calls": [{"name": "pay_back", "arguments": {"order_id": "A1", "reason": "none given"}}]},
                   {"text": "Refunded."})
        with TestClient(create_app(str(root), store, **options)) as both, sdk(both) as client:
            again = client.chat.completions.create(model="desk", messages=asked, extra_headers=chat_id)
    assert again.model_extra["chatrun"]["how"] == "forked", again.model_extra
    keys = [d.headers["idempotency-key"] for d in receiver.seen()]
    assert len(keys) == 2 and keys[0] == keys[1], keys


def as_the_last_release_wrote_it(db: Path, session: str) -> list[str]:
    """The session's record of calls done once rewritten as chatrun 0.x before this one wrote it:
    `<identity> <turn> <reply>`, without the version the identity is spelled in, without parts."""
    with sqlite3.connect(db) as raw:
        snapshot = json.loads(raw.execute("SELECT snapshot FROM sessions WHERE session_id = ?", (session,)).fetchone()[0])
        snapshot["calls_done"] = [re.sub(r"^([0-9a-f]{32})\S* ", r"\1 ", e).partition("\x1f")[0]
                                  for e in snapshot["calls_done"]]
        raw.execute("UPDATE sessions SET snapshot = ? WHERE session_id = ?", (json.dumps(snapshot), session))
    return snapshot["calls_done"]


def test_a_once_call_recorded_by_the_last_release_is_not_run_again_after_a_migration_renamed_it(fake, tmp_path):
    """The record of a session stored by the last release holds hashed identities alone (nothing to
    rename them by): the call the new version makes under its new names is spelled back by the
    migration (tool, argument, `requires` path) to find it. It ran again, the refund paid twice."""
    root = write_versions(tmp_path / "desk", {"1": V1, "2": V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder({"name": "refund", "arguments": {"order": "A1", "amount": 30}})
    started_on_version_1(root, "desk", store, "refund 30 on A1")
    old = as_the_last_release_wrote_it(tmp_path / "sessions.db", "s")
    assert len(old) == 1 and re.fullmatch(r"[0-9a-f]{32} 1 Refunded 30 on A1", old[0]), old
    fake.responder = responder({"name": "pay_back", "arguments": {"order_id": "A1", "amount": 30}})
    with TestClient(create_app(str(root), store)) as both:
        said = both.post("/bots/desk/sessions/s/messages", json={"userMessage": "refund it please"})
        assert said.status_code == 200 and said.json()["ok"], said.text
        state = both.get("/bots/desk/sessions/s").json()["state"]
    assert tool_results(fake)[-1] == DONE and state["refunded"] == 30


SWAP_V1 = """\
name: desk
version: "1"
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {refunded: 0, credited: 0}
routes:
  main: {default: true, system: Refund orders., tools: [refund, credit]}
tools:
  refund:
    description: Refund an order
    effect: once
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    action: {set: {state.refunded: "{{ state.refunded + 30 }}"}, reply: "Refunded 30 on {{ args.order }}"}
  credit:
    description: Give store credit for an order
    effect: once
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    action: {set: {state.credited: "{{ state.credited + 30 }}"}, reply: "Credited 30 on {{ args.order }}"}
"""
# Version 2 swaps the two names: its `credit` is version 1's refund, its `refund` version 1's credit.
SWAP_V2 = (SWAP_V1.replace('version: "1"', 'version: "2"\non_change: migrate\nmigrations:\n'
                           '  - {from: "1", tools: {refund: credit, credit: refund}}')
           .replace("  refund:\n", "  SWAPPED:\n").replace("  credit:\n", "  refund:\n").replace("  SWAPPED:\n", "  credit:\n"))


def test_a_fork_that_moves_after_its_original_moved_does_not_undo_a_swap_of_tool_names(fake, tmp_path):
    """A /v1 conversation refunds under version 1 and is moved to version 2 (which swaps `refund`
    and `credit`) by its next turn; the user regenerates the refund's answer: the fork, of version
    1's state, carries what its original did since and moves to version 2 as it opens. Version 2's
    `credit` of the order is the refund done; its `refund` (version 1's credit) was never done and
    runs. The fork's move renamed the carried record a second time: the swap undid itself, the
    refund ran again and the credit was answered as done."""
    root = write_versions(tmp_path / "desk", {"1": SWAP_V1, "2": SWAP_V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.queue({"text": "Hello."}, {"tool_calls": [{"name": "refund", "arguments": {"order": "A1"}}]},
               {"text": "Refunded."})
    asked = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hello."},
             {"role": "user", "content": "refund A1"}]
    with TestClient(create_app(str(root / "versions" / "1"), store)) as v1, sdk(v1) as client:
        chat(client, asked[:1])
        original = chat(client, asked)
    with TestClient(create_app(str(root), store)) as both, sdk(both) as client:
        fake.queue({"text": "You are welcome."})
        went_on = chat(client, [*asked, {"role": "assistant", "content": "Refunded."},
                                 {"role": "user", "content": "thanks"}])
        assert went_on["how"] == "continued", went_on
        fake.queue({"tool_calls": [{"name": "credit", "arguments": {"order": "A1"}}]},
                   {"tool_calls": [{"name": "refund", "arguments": {"order": "A1"}}]}, {"text": "Done."})
        forked = chat(client, asked)
        assert forked["how"] == "forked" and forked["session"] != original["session"], forked
        state = both.get(f"/bots/desk/sessions/{forked['session']}").json()["state"]
    assert tool_results(fake)[-2] == DONE.replace("(turn 1)", "(turn 2)")  # the original's refund, turn 2
    assert tool_results(fake)[-1] == "Credited 30 on A1"  # version 2's refund: version 1's credit, never done
    assert state == {**state, "refunded": 0, "credited": 30}  # the fork's own state: before the refund


V3 = (V2.replace('version: "2"', 'version: "3"').replace("routes:\n", '  - {from: "2", tools: {pay_back: reimburse}}\nroutes:\n', 1)
      .replace("tools: [pay_back]", "tools: [reimburse]").replace("  pay_back:\n    description", "  reimburse:\n    description"))


def test_a_once_call_done_two_versions_back_is_not_run_again_after_both_migrations(fake, tmp_path):
    """A session of version 1 opened by a server whose newest version is 3 goes through both
    migrations (refund -> pay_back -> reimburse, its argument and `requires` path renamed on the
    way): the call version 3 makes is spelled back through both to the entry version 1 recorded."""
    assert "tools: {refund: pay_back}" in V3 and "  reimburse:\n" in V3 and "  pay_back:\n" not in V3
    root = write_versions(tmp_path / "desk", {"1": V1, "2": V2, "3": V3})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder({"name": "refund", "arguments": {"order": "A1", "amount": 30}})
    started_on_version_1(root, "desk", store, "refund 30 on A1")
    fake.responder = responder({"name": "reimburse", "arguments": {"order_id": "A1", "amount": 30}})
    with TestClient(create_app(str(root), store)) as all_three:
        assert all_three.post("/bots/desk/sessions/s/messages", json={"userMessage": "refund it"}).json()["ok"]
        session = all_three.get("/bots/desk/sessions/s").json()
    assert tool_results(fake)[-1] == DONE  # `reimburse`: a tool of version 3 alone
    assert session["state"]["refunded"] == 30 and session["state"]["account"] == {"customer": "ana"}


def test_a_once_call_done_under_version_1_is_not_run_again_under_a_version_2_without_migrations(fake, tmp_path):
    """Version 2 changes only the prompt (no `migrations:`): the call done under version 1 has the
    same identity, recorded under version 1's name, and is still the call done."""
    v2 = V1.replace('version: "1"', 'version: "2"\non_change: migrate').replace("Refund orders.", "Refund orders kindly.")
    root = write_versions(tmp_path / "desk", {"1": V1, "2": v2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder({"name": "refund", "arguments": {"order": "A1", "amount": 30}})
    started_on_version_1(root, "desk", store, "refund 30 on A1")
    with TestClient(create_app(str(root), store)) as both:
        said = both.post("/bots/desk/sessions/s/messages", json={"userMessage": "refund it please"})
        assert said.status_code == 200 and said.json()["ok"], said.text
        state = both.get("/bots/desk/sessions/s").json()["state"]
    assert tool_results(fake)[-1] == DONE and state["refunded"] == 30


def test_a_once_call_recorded_untagged_by_the_last_release_is_not_run_again_by_the_same_version(fake, tmp_path):
    """A session of a versioned bot stored by the last release (entries without the version's tag),
    the same version served by this one: the call is still the call done."""
    root = write_versions(tmp_path / "desk", {"1": V1})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder({"name": "refund", "arguments": {"order": "A1", "amount": 30}})
    started_on_version_1(root, "desk", store, "refund 30 on A1")
    old = as_the_last_release_wrote_it(tmp_path / "sessions.db", "s")
    assert re.fullmatch(r"[0-9a-f]{32} 1 Refunded 30 on A1", old[0]), old
    with TestClient(create_app(str(root), store)) as same:
        said = same.post("/bots/desk/sessions/s/messages", json={"userMessage": "refund it please"})
        assert said.status_code == 200 and said.json()["ok"], said.text
        state = same.get("/bots/desk/sessions/s").json()["state"]
    assert tool_results(fake)[-1] == DONE and state["refunded"] == 30


def untagged(entries: list[str]) -> list[str]:
    """A record of calls done once as chatrun 0.x before this one wrote it (`<identity> <turn> <reply>`)."""
    return [re.sub(r"^([0-9a-f]{32})\S* ", r"\1 ", e).partition("\x1f")[0] for e in entries]


SWAPPED_DONE = [  # version 2's refund (version 1's credit, never done) runs; its credit (the refund done) does not
    "Credited 30 on A1", DONE]


def test_after_a_swap_the_other_tools_call_is_not_taken_for_a_call_the_last_release_recorded(fake, tmp_path):
    """A session stored by the last release (its record untagged) on version 1, opened after an
    upgrade by a server whose newest version swaps `refund` and `credit`: the move reads the record
    as of version 1, the version the session left. Version 2's `refund` of the order is version 1's
    credit, never done: it runs. It was answered "already done" (the untagged entry matched under
    every version's spelling, version 2's own included), and the credit was never given."""
    root = write_versions(tmp_path / "desk", {"1": SWAP_V1, "2": SWAP_V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder({"name": "refund", "arguments": {"order": "A1"}})
    started_on_version_1(root, "desk", store, "refund A1")
    old = as_the_last_release_wrote_it(tmp_path / "sessions.db", "s")
    assert len(old) == 1 and re.fullmatch(r"[0-9a-f]{32} 1 Refunded 30 on A1", old[0]), old
    fake.queue({"tool_calls": [{"name": "refund", "arguments": {"order": "A1"}}]},
               {"tool_calls": [{"name": "credit", "arguments": {"order": "A1"}}]}, {"text": "Done."})
    with TestClient(create_app(str(root), store)) as both:
        said = both.post("/bots/desk/sessions/s/messages", json={"userMessage": "refund A1 and credit A1"})
        assert said.status_code == 200 and said.json()["ok"], said.text
        session = both.get("/bots/desk/sessions/s").json()
    assert tool_results(fake)[-2:] == SWAPPED_DONE
    assert session["state"]["refunded"] == 30 and session["state"]["credited"] == 30
    assert session["history"][-1]["moved"]["to"] == session["botVersion"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_live_swap_of_an_open_session_reads_the_last_releases_record_as_of_the_version_it_left(fake, tmp_path, kind):
    """A session the last release stored on version 1 is resumed by this one on version 1 (a turn
    there keeps the record as written), then moved to version 2 while it is open (a reload, the
    REPL's `--reload`: Session.use_bot): version 2's `refund` (version 1's credit) runs, its `credit`
    (version 1's refund, done) is answered from the record."""
    root = write_versions(tmp_path / "desk", {"1": SWAP_V1, "2": SWAP_V2})
    v1, v2 = load_bot(root / "versions" / "1"), load_bot(root / "versions" / "2")
    store = InMemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "sessions.db")
    fake.queue({"tool_calls": [{"name": "refund", "arguments": {"order": "A1"}}]}, {"text": "Refunded."})
    v1.session(store=store, session_id="s").chat("refund A1")
    snapshot = store.load_session("s")
    assert snapshot is not None
    snapshot["calls_done"] = untagged(snapshot["calls_done"])
    store.commit_turn("s", snapshot, {}, [])  # as the last release left it
    session = v1.session(store=store, session_id="s")
    fake.queue({"text": "Hello."})
    session.chat("hello")
    assert untagged(session.snapshot()["calls_done"]) == session.snapshot()["calls_done"]
    session.use_bot(v2)
    fake.queue({"tool_calls": [{"name": "refund", "arguments": {"order": "A1"}}]},
               {"tool_calls": [{"name": "credit", "arguments": {"order": "A1"}}]}, {"text": "Done."})
    session.chat("refund A1 and credit A1")
    assert tool_results(fake)[-2:] == SWAPPED_DONE
    assert session.state["refunded"] == 30 and session.state["credited"] == 30
    stored = store.load_session("s")
    assert stored is not None and stored["calls_done"][0].split(" ", 1)[0].endswith("~<=1"), stored["calls_done"]


# Version 2 renames refund to pay_back; version 3 swaps pay_back and credit (its credit refunds).
CHAIN_V2 = (SWAP_V1.replace('version: "1"', 'version: "2"\non_change: migrate\nmigrations:\n'
                            '  - {from: "1", tools: {refund: pay_back}}')
            .replace("[refund, credit]", "[pay_back, credit]").replace("  refund:\n", "  pay_back:\n"))
CHAIN_V3 = (CHAIN_V2.replace('version: "2"', 'version: "3"')
            .replace("tools: {refund: pay_back}}", 'tools: {refund: pay_back}}\n  - {from: "2", tools: {pay_back: credit, credit: pay_back}}')
            .replace("  pay_back:\n", "  SWAPPED:\n").replace("  credit:\n", "  pay_back:\n").replace("  SWAPPED:\n", "  credit:\n"))


def test_a_call_the_last_release_recorded_before_it_moved_the_session_is_read_as_of_that_older_version(fake, tmp_path):
    """The last release moved the session from version 1 to 2 (`refund` renamed `pay_back`) and
    left its record as it was: an untagged entry spelled by version 1 in a session recorded on 2.
    Version 3 swaps `pay_back` and `credit`: the move marks the entry as of version 2 *or before*,
    so version 3's `credit` (version 1's refund) is the call done and its `pay_back` (a credit) runs.
    Read as of version 2 alone, the refund would run again."""
    root = write_versions(tmp_path / "desk", {"1": SWAP_V1, "2": CHAIN_V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder({"name": "refund", "arguments": {"order": "A1"}})
    started_on_version_1(root, "desk", store, "refund A1")
    fake.queue({"text": "Hello."})
    with TestClient(create_app(str(root), store)) as both:  # the move to version 2
        assert both.post("/bots/desk/sessions/s/messages", json={"userMessage": "hello"}).json()["ok"]
    old = as_the_last_release_wrote_it(tmp_path / "sessions.db", "s")
    assert len(old) == 1 and re.fullmatch(r"[0-9a-f]{32} 1 Refunded 30 on A1", old[0]), old
    (root / "versions" / "3").mkdir()
    (root / "versions" / "3" / "bot.yaml").write_text(CHAIN_V3)
    fake.queue({"tool_calls": [{"name": "credit", "arguments": {"order": "A1"}}]},
               {"tool_calls": [{"name": "pay_back", "arguments": {"order": "A1"}}]}, {"text": "Done."})
    with TestClient(create_app(str(root), store)) as all_three:
        said = all_three.post("/bots/desk/sessions/s/messages", json={"userMessage": "refund A1 and credit A1"})
        assert said.status_code == 200 and said.json()["ok"], said.text
        state = all_three.get("/bots/desk/sessions/s").json()["state"]
    assert tool_results(fake)[-2:] == [DONE, "Credited 30 on A1"]
    assert state["refunded"] == 30 and state["credited"] == 30


DROP_V1 = """\
name: desk
version: "1"
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {refunded: 0}
routes:
  main: {default: true, system: Refund orders., tools: [refund]}
tools:
  refund:
    description: Refund an order
    effect: once
    parameters:
      type: object
      properties: {order: {type: string}, amount: {type: number}, note: {type: string}}
      required: [order, amount]
    action: {set: {state.refunded: "{{ state.refunded + args.amount }}"}, reply: "Refunded {{ args.amount }} on {{ args.order }}"}
"""
# Version 2 renames the tool and `order`, drops `note`, gives old calls `reason: none given`, and
# adds `channel` without a default.
DROP_V2 = """\
name: desk
version: "2"
on_change: migrate
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
state: {refunded: 0}
migrations:
  - from: "1"
    tools: {refund: pay_back}
    arguments: {pay_back: {rename: {order: order_id}, drop: [note], default: {reason: none given}}}
routes:
  main: {default: true, system: Refund orders., tools: [pay_back]}
tools:
  pay_back:
    description: Refund an order
    effect: once
    parameters:
      type: object
      properties: {order_id: {type: string}, amount: {type: number}, reason: {type: string}, channel: {type: string}}
      required: [order_id, amount]
    action: {set: {state.refunded: "{{ state.refunded + args.amount }}"}, reply: "Refunded {{ args.amount }} on {{ args.order_id }}"}
"""
NOTED = {"name": "refund", "arguments": {"order": "A1", "amount": 30, "note": "the parcel came late"}}


def pay_back(**extra) -> dict:
    return {"tool_calls": [{"name": "pay_back", "arguments": {"order_id": "A1", "amount": 30, **extra}}]}


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_once_call_made_with_an_argument_a_migration_drops_is_not_run_again_after_it(fake, tmp_path, kind):
    """Version 1 refunds A1 with a `note`; version 2 drops `note` (and renames the tool and `order`,
    and gives old calls `reason: none given`). The session moves live (Session.use_bot): version 2's
    refund of A1 is version 1's call spelled forward, as the migration maps it — without the
    note, with the default reason, or with that reason left out — and is answered from the record.
    It ran again: spelled back, version 2's call could not give back the note it never had. A call
    with another reason, or with `channel` (added without a default), is a new call and runs."""
    root = write_versions(tmp_path / "desk", {"1": DROP_V1, "2": DROP_V2})
    v1, v2 = load_bot(root / "versions" / "1"), load_bot(root / "versions" / "2")
    store = InMemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "sessions.db")
    fake.queue({"tool_calls": [NOTED]}, {"text": "Refunded."})
    session = v1.session(store=store, session_id="s")
    session.chat("refund 30 on A1, the parcel came late")
    session.use_bot(v2)
    fake.queue(pay_back(), pay_back(reason="none given"), pay_back(reason="damaged"),
               pay_back(reason="none given", channel="email"), {"text": "Done."})
    session.chat("refund A1 again")
    assert tool_results(fake)[-4:] == [DONE, DONE, "Refunded 30 on A1", "Refunded 30 on A1"]
    assert session.state["refunded"] == 90


def test_a_once_call_with_a_dropped_argument_is_not_run_again_in_a_session_resumed_after_the_upgrade(fake, tmp_path):
    """The same through the server: the session refunded A1 with a note under version 1; a server
    serving both versions opens it, moves it to version 2 and answers version 2's refund of A1 from
    the record."""
    root = write_versions(tmp_path / "desk", {"1": DROP_V1, "2": DROP_V2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder(NOTED)
    started_on_version_1(root, "desk", store, "refund 30 on A1, the parcel came late")
    fake.responder = None
    fake.queue(pay_back(reason="none given"), {"text": "It was refunded already."})
    with TestClient(create_app(str(root), store)) as both:
        said = both.post("/bots/desk/sessions/s/messages", json={"userMessage": "refund A1 please"})
        assert said.status_code == 200 and said.json()["ok"], said.text
        session = both.get("/bots/desk/sessions/s").json()
    assert tool_results(fake)[-1] == DONE and session["state"]["refunded"] == 30
    assert session["history"][-1]["moved"]["to"] == session["botVersion"]


def test_a_dropped_argument_and_a_renamed_requires_path_together_are_spelled_forward(fake, tmp_path):
    """Version 1's refund with a `note`, acting on `state.customer`; version 2 renames the tool, the
    argument `order`, the path (`customer` -> `account.customer`) and drops `note`: the entry spelled
    forward acts on the renamed path with the value it had, and is version 2's call."""
    v1 = V1.replace("amount: {type: number}}", "amount: {type: number}, note: {type: string}}")
    v2 = V2.replace("rename: {order: order_id}}", "rename: {order: order_id}, drop: [note]}")
    assert v1 != V1 and v2 != V2
    root = write_versions(tmp_path / "desk", {"1": v1, "2": v2})
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    fake.responder = responder({"name": "refund", "arguments": {"order": "A1", "amount": 30, "note": "late"}})
    started_on_version_1(root, "desk", store, "refund 30 on A1, it came late")
    fake.responder = responder({"name": "pay_back", "arguments": {"order_id": "A1", "amount": 30}})
    with TestClient(create_app(str(root), store)) as both:
        assert both.post("/bots/desk/sessions/s/messages", json={"userMessage": "refund it"}).json()["ok"]
        state = both.get("/bots/desk/sessions/s").json()["state"]
    assert tool_results(fake)[-1] == DONE
    assert state["refunded"] == 30 and state["account"] == {"customer": "ana"}
