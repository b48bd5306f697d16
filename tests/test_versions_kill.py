"""A replica killed (-9) in the middle of the turn that moves a session to version 2
(docs/versions.md: the move is part of the session's next turn, committed with it). Real
`chatrun serve` processes on a real Redis, the fake OpenAI server: the turn sent again with its
request id on another replica moves the session once, from version 1 as stored."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

import chatrun
from chatrun.testing.fake_openai import FakeOpenAI
from redis_support import Replica
from test_versions import BUNDLE_KEY, shop_copy, shop_responder

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]


def test_a_replica_killed_during_the_turn_that_migrates_a_session_leaves_the_move_to_the_retry(
        redis_server, tmp_path):
    root = shop_copy(tmp_path, on_change="migrate")
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version
    store = redis_server.url()
    key = tmp_path / "bundle.key"
    key.write_text(BUNDLE_KEY)
    held = threading.Event()  # the first model call of the migrated turn: answered late, after the kill

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        said = [m["content"] for m in body["messages"] if m["role"] == "user"]
        if said and "hello again" in str(said[-1]) and not held.is_set():
            held.set()
            return {"text": "too late", "delay": 60}
        return shop_responder(body)

    with FakeOpenAI() as fake, httpx.Client(timeout=120) as http:
        fake.responder = responder
        old = Replica(str(root / "versions" / "1"), store, fake.base_url, "--bundle-key", str(key)).start()
        try:
            assert http.post(f"{old.url}/bots/shop/sessions", json={"id": "s"}).status_code == 201
            for text in ("add tea", "mail me at a@example.com", "checkout now"):  # on `checkout`: renamed
                assert http.post(f"{old.url}/bots/shop/sessions/s/messages", json={"userMessage": text}).json()["ok"]
        finally:
            old.kill()
        first = Replica(str(root), store, fake.base_url, "--bundle-key", str(key)).start()
        second = Replica(str(root), store, fake.base_url, "--bundle-key", str(key)).start()
        try:
            lost: list[BaseException] = []
            send = {"json": {"userMessage": "hello again"}, "headers": {"Idempotency-Key": "turn-4"}}

            def doomed() -> None:
                try:
                    http.post(f"{first.url}/bots/shop/sessions/s/messages", **send)
                except httpx.HTTPError as exc:
                    lost.append(exc)

            thread = threading.Thread(target=doomed)
            thread.start()
            assert held.wait(60), "the migrated turn never called the model"
            first.kill()  # mid-turn: moved in its memory, nothing committed
            thread.join(60)
            assert lost, "the first replica answered before it was killed"
            retried = http.post(f"{second.url}/bots/shop/sessions/s/messages", **send)
            assert retried.status_code == 200 and retried.json()["ok"] is True, retried.text
            session = http.get(f"{second.url}/bots/shop/sessions/s").json()
        finally:
            first.kill()
            second.kill()
    assert session["botVersion"] == v2_hash and session["route"] == "payment"
    assert session["state"]["contact"] == {"email": "a@example.com"} and "email" not in session["state"]
    turns = [h for h in session["history"] if "turn" in h]
    assert [h["turn"] for h in turns] == [1, 2, 3, 4] and all(h["ok"] for h in turns), turns
    assert [h["moved"]["to"] for h in turns if h.get("moved")] == [v2_hash]  # moved once, with turn 4
