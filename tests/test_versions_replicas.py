"""A rolling deploy (issue 23): two `chatrun serve` replicas (real processes) on one real
Redis, one serving bots/shop version 1 only (not yet upgraded), the other versions 1 and 2.
100 sessions started on version 1 sit on a route version 2 deletes, one it renames and one
whose tool it changes, each with a state key it renames; then every session is sent turns
on both replicas alternately. Zero failed turns under `pin` and `migrate`; migrated state is
what version 2's migration says; no session ever goes back to version 1."""

from __future__ import annotations

import httpx
import pytest

import chatrun
from chatrun.testing.fake_openai import FakeOpenAI
from redis_support import Replica
from store_params import store_url
from test_versions import BUNDLE_KEY, sent_calls, shop_copy, shop_responder

pytestmark = pytest.mark.subprocess

SESSIONS = 100


@pytest.fixture(scope="module")
def shared_fake():
    with FakeOpenAI() as server:
        server.responder = shop_responder
        yield server


RETRIED: list[str] = []  # the 503s `turn` retried (session ids), for the test's bound


def turn(replica: Replica, sid: str, text: str) -> dict:
    """One turn on a replica; a 503 (a version it cannot load yet) is retried, as clients do,
    and counted in RETRIED."""
    for _ in range(20):
        r = httpx.post(f"{replica.url}/bots/shop/sessions/{sid}/messages", json={"userMessage": text}, timeout=60)
        if r.status_code != 503:
            break
        RETRIED.append(sid)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["ok"] and not [e for e in answer["events"] if e["type"] == "Error"], answer
    return answer


def resource(replica: Replica, sid: str) -> dict:
    r = httpx.get(f"{replica.url}/bots/shop/sessions/{sid}", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(params=["redis", "postgres"])
def shared_store(request, tmp_path):
    """An empty store both replicas share: a real Redis, a real PostgreSQL (issue 38)."""
    return store_url(request, tmp_path)


@pytest.mark.parametrize("policy", ["migrate", "pin"])
def test_two_replicas_on_different_versions_fail_no_turn(policy, shared_store, shared_fake, tmp_path):
    root = shop_copy(tmp_path, on_change=policy)
    v1_hash = chatrun.load_bot(root / "versions" / "1").config.content_version
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version
    store = shared_store
    RETRIED.clear()
    key = tmp_path / "bundle.key"  # the same on every replica: what one publishes, the others load
    key.write_text(BUNDLE_KEY)
    old = Replica(str(root / "versions" / "1"), store, shared_fake.base_url, "--bundle-key", str(key)).start(wait=False)
    new = Replica(str(root), store, shared_fake.base_url, "--bundle-key", str(key)).start(wait=False)
    try:
        old.wait_ready()
        new.wait_ready()
        where = {}
        for i in range(SESSIONS):  # started on version 1 (the old replica: all it has)
            sid = f"{policy}-{i}"
            assert httpx.post(f"{old.url}/bots/shop/sessions", json={"id": sid}, timeout=60).status_code == 201
            turn(old, sid, f"mail me at a{i}@example.com")
            where[sid] = ("gift_wrap", "checkout", "browse")[i % 3]
            turn(old, sid, {"gift_wrap": "wrap it", "checkout": "checkout now", "browse": "add tea"}[where[sid]])
        for i, (sid, was) in enumerate(where.items()):  # the deploy: both replicas serve every session
            turn(new, sid, "hello again")
            if policy == "migrate" and was == "browse":  # the call in memory meets the tool's new parameters
                assert ("add_to_basket", {"product": "T1", "quantity": 1}) in sent_calls(shared_fake)
                assert "add_item" not in [name for name, _ in sent_calls(shared_fake)]
            turn(old, sid, "still there?")
            session = resource(old, sid)
            if policy == "migrate":
                assert session["botVersion"] == v2_hash  # the old replica ran it on version 2 (from the store)
                assert session["state"]["contact"] == {"email": f"a{i}@example.com"}
                assert session["route"] == {"gift_wrap": "browse", "checkout": "payment", "browse": "browse"}[was]
            else:
                assert session["botVersion"] == v1_hash and session["route"] == was
                assert session["state"]["email"] == f"a{i}@example.com"
            assert all(h["ok"] for h in session["history"])
        created = httpx.post(f"{new.url}/bots/shop/sessions", json={"id": f"{policy}-fresh"}, timeout=60)
        assert created.json()["botVersion"] == v2_hash
        # Both replicas put their versions in the store before they serve, so the old one
        # loads version 2 at once: none of the 400 turns had to be sent again.
        assert RETRIED == [], f"{len(RETRIED)} turn(s) answered 503 and were retried: {sorted(set(RETRIED))[:5]}"
    finally:
        old.kill()
        new.kill()
